"""train.py: critic-free RL (GRPO and its family) end to end, in one readable loop.

    python train.py                        # embedded CPU default: tiny model, synthetic task
    python train.py --advantage fade --schedule fade --minibatches 4 --minibatch_mode query
    python train.py --model Qwen/Qwen2.5-0.5B-Instruct --data gsm8k --backend vllm   # one GPU

One training STEP consumes one rollout batch:

  1. sample N prompts, G rollouts each           rollout.py (transformers) / vllm_rollout.py
  2. score them                                  verify.py
  3. measure solve rate and entropy, update the  scheduler.py (FADE or constant)
     advantage schedule
  4. advantages per group                        advantages.py (any registered name)
  5. split the batch into optimizer steps        batching.py (random/query/balanced/...)
  6. for each optimizer step: policy loss over   loss.py (PPO/CISPO/GSPO, 4 aggregations,
     micro-batches, one Adam step                DFPO transforms, KL, entropy)
  7. diagnostics, metrics, checkpoint

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

The config is one dataclass; every field is a command-line flag with its docstring as
help. Invalid values exit with code 2 and one line naming the value.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import advantages as adv_lib
import batching
import data
import loss as loss_lib
import scheduler as sched_lib
import checkpoint
import verify
from loss import LossConfig


@dataclass
class Config:
    """One training run. Defaults: the embedded CPU run (tiny model, synthetic addition)."""

    # --- run ---
    out_dir: str = "runs/default"
    """Run directory: config.json, metrics.jsonl, checkpoints/ and plots go here."""
    seed: int = 0
    """Seed of every random stream (prompts, sampling, mini-batch shuffles, evaluation)."""
    resume: bool = False
    """Continue from the last checkpoint in out_dir (exactly, including RNG states)."""
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
    data: str = "addition"
    """'addition' (synthetic), 'gsm8k', 'math', or a {prompt, answer} .jsonl file."""
    digits: int = 3
    """Operand digits of the synthetic addition task."""
    n_train: int = 0
    """Training prompts to draw (0 = the loader's default / all)."""
    n_eval: int = 200
    """Held-out prompts for evaluation."""
    chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct hub models)."""

    # --- rollouts ---
    backend: str = "transformers"
    """Rollout engine: 'transformers' (generate; CPU, tested) or 'vllm' (one GPU, untested here)."""
    prompts_per_step: int = 32
    """N: prompts per rollout batch."""
    group_size: int = 8
    """G: rollouts per prompt."""
    max_new_tokens: int = 48
    """Generation budget per rollout (also Dr. GRPO's constant normaliser)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of the GPU's memory the engine takes at start-up."""

    # --- advantage and its schedule ---
    advantage: str = "grpo"
    """Advantage name from advantages.ADVANTAGES."""
    schedule: str = "constant"
    """'constant', 'fade' (reads solve rate and entropy) or 'decay'; fade/decay need --advantage fade."""
    alpha: float = 1.0
    """Difficulty exponent for fade/power under the constant schedule."""
    delta: float = 1.0
    """Failure scale for fade/asym under the constant schedule (<1 amplifies failures)."""
    h_target: float = -1.0
    """FADE entropy target in nats (<0 = relative: 0.5 x the first measured entropy)."""
    k: int = 4
    """k of the passk / pkpo advantages."""

    # --- objective (loss.py) ---
    loss_type: str = "ppo"
    """'ppo', 'cispo' or 'gspo'."""
    eps_low: float = 0.2
    """Lower clip range."""
    eps_high: float = 0.2
    """Upper clip range (DAPO clip-higher: 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip constant c for A < 0 (0 = off; typical 3)."""
    agg: str = "auto"
    """auto (the surrogate's own: token-mean; GSPO seq-mean-token-mean; DFPO seq-mean-token-sum-norm) | token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm."""
    weight_transform: str = "none"
    """DFPO transform of GSPO weights: 'none', 'min' or 'orth' (needs whole groups per step)."""
    kl_coef: float = 0.0
    """KL-to-reference coefficient (0 = off, no reference model kept)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    neg_filter_frac: float = 0.0
    """Negative token filtering fraction (0 = off; 0.1 in the paper)."""

    # --- optimisation ---
    lr: float = 4e-4
    """Adam learning rate (4e-4 suits the embedded model; 1e-3 collapsed it, 2e-4 is slow)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = no clipping)."""
    epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    minibatch_mode: str = "query"
    """How to split: random | query | balanced | query_balanced (batching.py)."""
    micro_batch: int = 64
    """Rollouts per forward/backward (memory only: the result does not depend on it)."""

    # --- evaluation, diagnostics, checkpoints ---
    eval_every: int = 25
    """Evaluate held-out pass@k every this many steps (and at the end; 0 = never)."""
    eval_samples: int = 4
    """Samples per held-out prompt; pass@k is reported for k = 1, 2, 4, ... up to this."""
    flip_every: int = 10
    """Token flips and cancellation residual every this many steps (one extra forward; 0 = off)."""
    save_every: int = 25
    """Checkpoint every this many steps (atomically; 0 = only at the end)."""


# ---------------------------------------------------------------------------------------
# Command line: every Config field is a flag; bad values exit 2 with one line
# ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> Config:
    """Build a Config from the command line, using each field's docstring as its help."""
    docs = _field_docs()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # One line and exit code 2 for any bad flag, not argparse's usage dump.
    parser.error = lambda message: parser.exit(2, f"train.py: error: {message}\n")
    for f in dataclasses.fields(Config):
        if f.type in ("bool", bool):
            parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default,
                                help=docs.get(f.name, ""))
        else:
            typ = {"int": int, "float": float, "str": str}[str(f.type)]
            parser.add_argument(f"--{f.name}", type=typ, default=f.default, help=docs.get(f.name, ""))
    cfg = Config(**vars(parser.parse_args(argv)))
    try:
        validate(cfg)
    except ValueError as e:
        parser.exit(2, f"train.py: error: {e}\n")
    return cfg


def validate(cfg: Config) -> None:
    """Raise ValueError (one line, naming the value) for any invalid setting."""
    def need(cond, msg):
        if not cond:
            raise ValueError(msg)
    need(cfg.steps >= 1, f"--steps must be >= 1, got {cfg.steps}")
    need(cfg.prompts_per_step >= 1, f"--prompts_per_step must be >= 1, got {cfg.prompts_per_step}")
    need(cfg.group_size >= 1, f"--group_size must be >= 1, got {cfg.group_size}")
    need(cfg.max_new_tokens >= 1, f"--max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    need(cfg.temperature > 0, f"--temperature must be > 0, got {cfg.temperature}")
    need(cfg.advantage in adv_lib.ADVANTAGES,
         f"--advantage {cfg.advantage!r} is unknown; choose from {', '.join(adv_lib.ADVANTAGES)}")
    need(cfg.schedule in sched_lib.SCHEDULES, f"--schedule must be one of {sched_lib.SCHEDULES}, got {cfg.schedule!r}")
    need(cfg.schedule == "constant" or cfg.advantage == "fade",
         f"--schedule {cfg.schedule} drives the fade advantage; got --advantage {cfg.advantage!r}")
    need(cfg.backend in ("transformers", "vllm"), f"--backend must be 'transformers' or 'vllm', got {cfg.backend!r}")
    need(cfg.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    need(cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}")
    need(cfg.epochs >= 1, f"--epochs must be >= 1, got {cfg.epochs}")
    need(cfg.minibatches >= 1, f"--minibatches must be >= 1, got {cfg.minibatches}")
    need(cfg.minibatches <= cfg.prompts_per_step * cfg.group_size,
         f"--minibatches {cfg.minibatches} exceeds the {cfg.prompts_per_step * cfg.group_size} rollouts per batch")
    need(cfg.minibatch_mode in batching.MODES, f"--minibatch_mode must be one of {batching.MODES}, got {cfg.minibatch_mode!r}")
    need(cfg.micro_batch >= 1, f"--micro_batch must be >= 1, got {cfg.micro_batch}")
    need(cfg.weight_transform in ("none", "min", "orth"),
         f"--weight_transform must be none, min or orth, got {cfg.weight_transform!r}")
    need(cfg.weight_transform == "none" or cfg.minibatches == 1 or cfg.minibatch_mode in ("query", "query_balanced"),
         f"--weight_transform {cfg.weight_transform} needs whole groups per optimizer step: "
         f"use --minibatch_mode query or query_balanced, got {cfg.minibatch_mode!r}")
    zero_sum = cfg.advantage in adv_lib.ZERO_SUM and not (cfg.advantage == "fade" and
                                                           (cfg.schedule != "constant" or cfg.delta != 1))
    need(cfg.weight_transform != "orth" or zero_sum,
         f"--weight_transform orth re-centres advantages that do not sum to zero per group (it would undo "
         f"--advantage {cfg.advantage}'s imbalance); use a zero-sum advantage or --weight_transform min")
    need(cfg.eval_samples >= 1, f"--eval_samples must be >= 1, got {cfg.eval_samples}")
    for name in ("eval_every", "flip_every", "save_every", "n_train", "threads"):
        need(getattr(cfg, name) >= 0, f"--{name} must be >= 0, got {getattr(cfg, name)}")
    need(cfg.n_eval >= 1, f"--n_eval must be >= 1, got {cfg.n_eval}")
    need(cfg.max_minutes >= 0, f"--max_minutes must be >= 0, got {cfg.max_minutes}")
    need(cfg.dual_clip == 0 or cfg.dual_clip > 1, f"--dual_clip must be 0 (off) or > 1, got {cfg.dual_clip}")
    need(0 <= cfg.neg_filter_frac <= 1, f"--neg_filter_frac must be in [0, 1], got {cfg.neg_filter_frac}")
    need(cfg.digits >= 1, f"--digits must be >= 1, got {cfg.digits}")
    loss_config(cfg)                                      # LossConfig validates the rest
    adv_lib.compute_advantages(cfg.advantage, torch.tensor([[0.0, 1.0] * max(1, cfg.group_size // 2)]),
                               **advantage_hyper(cfg, alpha=cfg.alpha, delta=cfg.delta))


def loss_config(cfg: Config) -> LossConfig:
    """The loss.py view of the config (LossConfig raises on invalid combinations)."""
    return LossConfig(loss_type=cfg.loss_type, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                      dual_clip=cfg.dual_clip or None, agg=None if cfg.agg == "auto" else cfg.agg,
                      weight_transform=None if cfg.weight_transform == "none" else cfg.weight_transform,
                      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator, entropy_coef=cfg.entropy_coef,
                      neg_filter_frac=cfg.neg_filter_frac or None)


def advantage_hyper(cfg: Config, alpha: float, delta: float) -> dict:
    """The hyper-parameters this run's advantage takes (alpha/delta come from the schedule)."""
    hyper = {"fade": {"alpha": alpha, "delta": delta}, "power": {"alpha": alpha},
             "asym": {"delta": delta}, "passk": {"k": cfg.k}, "pkpo": {"k": cfg.k}}
    return hyper.get(cfg.advantage, {})


def _field_docs() -> dict:
    """Field name -> the one-line docstring under it (read from this file's source)."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(Config))
    body, docs = tree.body[0].body, {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = b.value.value
    return docs


# ---------------------------------------------------------------------------------------
# Set-up: model, reference, optimizer, schedule, data
# ---------------------------------------------------------------------------------------

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
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if cfg.model == "tiny":
        import tinymodel
        path = tinymodel.load_or_warmup(tinymodel.WarmupConfig(digits=cfg.digits))
    else:
        path = cfg.model
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return str(path), model, tokenizer


def format_prompts(prompts: list[str], tokenizer, cfg: Config) -> list[str]:
    """Optionally wrap each prompt as a user turn of the tokenizer's chat template."""
    if not cfg.chat_template:
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def make_scheduler(cfg: Config) -> sched_lib.AdvantageScheduler:
    return sched_lib.AdvantageScheduler(sched_lib.SchedulerConfig(
        schedule=cfg.schedule, alpha=max(cfg.alpha, 1.0) if cfg.schedule != "constant" else cfg.alpha,
        delta=cfg.delta, h_target=None if cfg.h_target < 0 else cfg.h_target, total_steps=max(cfg.steps, 2)))


# ---------------------------------------------------------------------------------------
# One training step
# ---------------------------------------------------------------------------------------

def sample_rollouts(model, tokenizer, prompts, G: int, cfg: Config, llm=None):
    """G rollouts per prompt from transformers' generate (CPU, tested) or vLLM (GPU)."""
    if llm is not None:
        import vllm_rollout
        return vllm_rollout.generate_rollouts_vllm(llm, tokenizer, prompts, G, cfg.max_new_tokens,
                                                   temperature=cfg.temperature)
    import rollout
    return rollout.generate_rollouts(model, tokenizer, prompts, G, cfg.max_new_tokens,
                                     temperature=cfg.temperature)


def score_logprobs(model, ro, idx, cfg: Config, with_entropy: bool = False):
    """Teacher-forced log-probs (and entropy) of rollouts `idx` under `model`. [b, T]."""
    import rollout
    device = next(model.parameters()).device
    return rollout.token_logprobs(model, ro.prompt_ids[idx].to(device), ro.prompt_mask[idx].to(device),
                                  ro.response_ids[idx].to(device), ro.response_mask[idx].to(device),
                                  temperature=cfg.temperature, with_entropy=with_entropy)


def no_grad_pass(model, ro, cfg: Config, with_entropy: bool):
    """(logp [B, T], entropy [B, T] or None) of every rollout, in micro-batches, no grad."""
    B = ro.response_ids.shape[0]
    logps, ents = [], []
    with torch.no_grad():
        for idx in torch.arange(B).split(cfg.micro_batch):
            lp, ent = score_logprobs(model, ro, idx, cfg, with_entropy)
            logps.append(lp.float().cpu())
            ents.append(ent.float().cpu() if ent is not None else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def optimizer_steps(model, optimizer, ro, old_logp, ref_logp, advantages, cfg: Config,
                    mb_generator: torch.Generator, with_residual: bool = False) -> tuple[dict, list[dict]]:
    """epochs x minibatches Adam steps on one rollout batch. Returns (stats, mb composition).

    The normaliser of each optimizer step is computed from that step's whole mask BEFORE
    it is cut into micro-batches (loss.step_normaliser), so --micro_batch changes memory,
    never the result. Micro-batches keep whole groups when a DFPO transform needs them.
    """
    lcfg = loss_config(cfg)
    N, G = cfg.prompts_per_step, cfg.group_size
    mask = ro.response_mask.float()
    adv_flat = advantages.reshape(-1).float()
    group_index = torch.arange(N * G) // G
    lengths = mask.sum(1).view(N, G)
    device = next(model.parameters()).device
    sums, weight, compositions, grad_norms = {}, 0.0, [], []
    model.train()
    for _ in range(cfg.epochs):
        steps = batching.minibatch_indices(advantages, cfg.minibatches, cfg.minibatch_mode, mb_generator, lengths)
        compositions += batching.minibatch_stats(steps, advantages, lengths)
        for step_idx in steps:
            norm = loss_lib.step_normaliser(mask[step_idx], max_len=cfg.max_new_tokens)
            optimizer.zero_grad(set_to_none=True)
            for idx in _micro_batches(step_idx, group_index, cfg):
                logp, ent = score_logprobs(model, ro, idx, cfg, with_entropy=cfg.entropy_coef > 0)
                loss, stats = loss_lib.policy_loss(
                    logp.float(), old_logp[idx].to(device), adv_flat[idx].to(device), mask[idx].to(device), lcfg,
                    norm, group_index=group_index[idx].to(device),
                    ref_logp=None if ref_logp is None else ref_logp[idx].to(device), entropy=ent)
                loss.backward()
                if with_residual:   # diagnostic steps only: one extra backward through the loss head
                    stats["cancellation_residual"] = loss_lib.cancellation_residual_of_loss(
                        logp, old_logp[idx].to(device), adv_flat[idx].to(device), mask[idx].to(device), lcfg,
                        norm, group_index[idx].to(device))
                w = stats.pop("n_tokens")
                for key, value in stats.items():
                    if not (isinstance(value, float) and math.isnan(value)):
                        sums[key] = sums.get(key, 0.0) + value * w
                weight += w
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            grad_norms.append(float(total))
            optimizer.step()
    model.eval()
    stats = {key: value / weight for key, value in sums.items()}
    stats["grad_norm"] = float(np.mean(grad_norms))
    return stats, compositions


def _micro_batches(step_idx: torch.Tensor, group_index: torch.Tensor, cfg: Config) -> list[torch.Tensor]:
    """Split one optimizer step's rollouts into forward/backward chunks of <= micro_batch.

    With a DFPO transform the chunks are cut at group boundaries (a transform only sees
    the rollouts of a group that are in its call), so a group larger than micro_batch
    stays whole in one chunk.
    """
    if cfg.weight_transform == "none":
        return list(step_idx.split(cfg.micro_batch))
    chunks, current = [], []
    for g in torch.unique_consecutive(group_index[step_idx]).tolist():
        members = step_idx[group_index[step_idx] == g].tolist()
        if current and len(current) + len(members) > cfg.micro_batch:
            chunks.append(torch.tensor(current))
            current = []
        current += members
    if current:
        chunks.append(torch.tensor(current))
    return chunks


def token_flips(new_logp, old_logp, mask, adv_flat, tau: float = 1e-3) -> dict:
    """Token flips (Cancellation Hypothesis paper; [recon] its exact definition is not public).

    Rescore the same sampled tokens after the update: a token is boosted if its log-prob
    rose by more than tau, suppressed if it fell by more than tau. Fractions are reported
    separately for positive (A > 0) and negative (A < 0) rollouts. The paper's finding:
    the fractions are remarkably similar, i.e. a negative rollout has many boosted tokens
    (the ones it shares with successes) and a positive rollout many suppressed ones.
    """
    diff = new_logp - old_logp
    out = {}
    for name, rows in (("pos", adv_flat > 0), ("neg", adv_flat < 0)):
        m = mask[rows]
        n = float(m.sum())
        if n == 0:
            continue
        out[f"flip/boost_{name}"] = float(((diff[rows] > tau).float() * m).sum()) / n
        out[f"flip/suppress_{name}"] = float(((diff[rows] < -tau).float() * m).sum()) / n
    return out


def evaluate(model, tokenizer, rows, task, cfg: Config, step: int) -> dict:
    """Held-out pass@k (unbiased estimator, advantages.pass_at_k) for k = 1, 2, 4, ... n.

    Sampling runs in a forked RNG seeded by (seed, step): evaluation never perturbs the
    training streams, so evaluating more or less often does not change training.
    """
    n = cfg.eval_samples
    correct = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 100003 + step)
        for start in range(0, len(rows), max(1, 256 // n)):
            chunk = rows[start:start + max(1, 256 // n)]
            ro = sample_rollouts(model, tokenizer, format_prompts([r["prompt"] for r in chunk], tokenizer, cfg), n, cfg)
            scores = verify.score(ro.texts, [r["answer"] for r in chunk for _ in range(n)], task,
                                  [r["prompt"] for r in chunk for _ in range(n)])
            c = verify.reward_tensor(scores, "correct").view(len(chunk), n).sum(1)
            correct += [int(x) for x in c.round().tolist()]
    out, k = {}, 1
    while k <= n:
        out[f"eval/pass@{k}"] = float(np.mean([adv_lib.pass_at_k(n, c, k) for c in correct]))
        k *= 2
    return out


def train_step(step: int, state: dict, cfg: Config) -> dict:
    """One rollout batch: sample, score, schedule, advantages, optimizer steps, metrics."""
    model, tokenizer = state["model"], state["tokenizer"]
    N, G = cfg.prompts_per_step, cfg.group_size
    metrics = {"step": step}

    t0 = time.perf_counter()
    rows = [state["train_rows"][state["py_rng"].randrange(len(state["train_rows"]))] for _ in range(N)]
    prompts = format_prompts([r["prompt"] for r in rows], tokenizer, cfg)
    model.eval()
    ro = sample_rollouts(model, tokenizer, prompts, G, cfg, llm=state.get("llm"))
    t1 = time.perf_counter()

    scores = verify.score(ro.texts, [r["answer"] for r in rows for _ in range(G)], state["task"],
                          [r["prompt"] for r in rows for _ in range(G)])
    rewards = verify.reward_tensor(scores).view(N, G)
    t2 = time.perf_counter()

    # The "old policy" pass (as verl's recompute_log_prob): log-probs of the sampled tokens
    # and the full-vocabulary entropy at every response position, under the weights that
    # sampled. For vLLM rollouts the gap to vLLM's own log-probs is the staleness canary.
    # rollout.generate_rollouts already ran this pass (same model, same weights); vLLM
    # rollouts need it from the trainer's model.
    mask = ro.response_mask.float()
    if getattr(ro, "vllm_logp", None) is None and ro.entropy is not None:
        old_logp, entropy = ro.old_logp, ro.entropy
    else:
        old_logp, entropy = no_grad_pass(model, ro, cfg, with_entropy=True)
    if getattr(ro, "vllm_logp", None) is not None:
        import vllm_rollout
        metrics["vllm/canary_gap"] = gap = vllm_rollout.canary_gap(ro.vllm_logp, old_logp, mask)
        if gap > vllm_rollout.CANARY_OK_NATS:
            print(f"warning: step {step}: vLLM and trainer log-probs differ by {gap:.3f} nats on average; "
                  "the engine may be sampling from stale weights", file=sys.stderr)
    ref_logp = no_grad_pass(state["ref_model"], ro, cfg, with_entropy=False)[0] if state["ref_model"] else None
    mean_entropy = float((entropy * mask).sum() / mask.sum().clamp(min=1))

    sched = state["scheduler"].step(float(rewards.mean()), mean_entropy)
    advantages = adv_lib.compute_advantages(cfg.advantage, rewards, **advantage_hyper(cfg, sched["alpha"], sched["delta"]))
    m_S, m_F = adv_lib.gradient_mass(advantages)

    diagnose = bool(cfg.flip_every) and step % cfg.flip_every == 0
    train_stats, comps = optimizer_steps(model, state["optimizer"], ro, old_logp, ref_logp, advantages, cfg,
                                         state["mb_generator"], with_residual=diagnose)
    t3 = time.perf_counter()

    lengths = mask.sum(1)
    const = (rewards.max(1).values == rewards.min(1).values).float()
    metrics.update({
        "reward": float(rewards.mean()),
        **{f"reward/{key}": float(np.mean([s[key] for s in scores])) for key in scores[0] if key != "reward"},
        "solve_rate": float(rewards.mean()), "frac_all_equal": float(const.mean()),
        "adv_mean": float(advantages.mean()), "adv_abs_mean": float(advantages.abs().mean()),
        "m_S": float(m_S.mean() / G), "m_F": float(m_F.mean() / G), "entropy": mean_entropy,
        "resp_len_mean": float(lengths.mean()), "resp_len_max": float(lengths.max()),
        "truncation_rate": float(ro.truncated.float().mean()),
        **{f"sched/{key}": float(value) for key, value in sched.items()},
        "mb/max_pos_neg_gap": float(max(abs(c["n_pos"] - c["n_neg"]) for c in comps)),
        # groups only partly inside an optimizer step: their updates cannot cancel there
        "mb/split_groups": float(np.mean([c["n_groups"] - c["n_whole_groups"] for c in comps])),
        **train_stats,
        "lr": state["optimizer"].param_groups[0]["lr"],
    })
    if diagnose:
        new_logp, _ = no_grad_pass(model, ro, cfg, with_entropy=False)
        metrics.update(token_flips(new_logp, old_logp, mask, advantages.reshape(-1)))
    if state.get("llm") is not None:
        import vllm_rollout
        vllm_rollout.push_weights(state["llm"], model)
    t4 = time.perf_counter()
    metrics.update({"time/generate": t1 - t0, "time/score": t2 - t1, "time/train": t3 - t2,
                    "time/diagnostics": t4 - t3})
    return metrics


def make_optimizer(model, cfg: Config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)



# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def setup(cfg: Config) -> dict:
    """Everything a run needs, in a plain dict (no trainer class: read it top to bottom)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()         # one progress bar (ours), not one per save
    device = pick_device(cfg)
    train_rows, task = data.load_task(cfg.data, "train", n=cfg.n_train or None, seed=cfg.seed, digits=cfg.digits)
    eval_rows, _ = data.load_task(cfg.data, "test", n=cfg.n_eval, seed=cfg.seed, digits=cfg.digits)
    path, model, tokenizer = load_model(cfg, device)
    llm = None
    if cfg.backend == "vllm":
        import vllm_rollout
        llm = vllm_rollout.make_engine(path, max_model_len=2048 + cfg.max_new_tokens,
                                       gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed)
    # Seed AFTER constructing vLLM: an in-process engine reseeds random/numpy/torch.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ref_model = None
    if cfg.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        ref_model.requires_grad_(False)
    model.eval()
    return {
        "model": model, "tokenizer": tokenizer, "ref_model": ref_model, "llm": llm,
        "optimizer": make_optimizer(model, cfg), "scheduler": make_scheduler(cfg),
        "train_rows": train_rows, "eval_rows": eval_rows, "task": task,
        "py_rng": random.Random(cfg.seed),
        "mb_generator": torch.Generator().manual_seed(cfg.seed),
        "model_path": path,
    }


def run(cfg: Config) -> list[dict]:
    """Train for cfg.steps rollout batches; returns every step's metrics."""
    from tqdm import tqdm
    os.makedirs(cfg.out_dir, exist_ok=True)
    state = setup(cfg)
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    start = 0
    if cfg.resume:
        start = checkpoint.load_checkpoint(state, cfg.out_dir)
        checkpoint.truncate_metrics(metrics_path, start)
        if start and state["llm"] is not None:
            # The engine was built from the base model: give it the checkpoint's weights,
            # or the first resumed step samples from the wrong policy.
            import vllm_rollout
            vllm_rollout.push_weights(state["llm"], state["model"])
    elif os.path.exists(metrics_path):
        os.remove(metrics_path)               # a fresh run in an old directory starts clean
    checkpoint.atomic_write(os.path.join(cfg.out_dir, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=1))

    history, t_start = [], time.perf_counter()
    bar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, desc="RL", dynamic_ncols=True)
    for step in bar:
        metrics = train_step(step, state, cfg)
        last = step == cfg.steps or (cfg.max_minutes and time.perf_counter() - t_start > 60 * cfg.max_minutes)
        if cfg.eval_every and (step % cfg.eval_every == 0 or last):
            metrics.update(evaluate(state["model"], state["tokenizer"], state["eval_rows"], state["task"], cfg, step))
        metrics["time/elapsed"] = time.perf_counter() - t_start
        with open(metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        history.append(metrics)
        bar.set_postfix(reward=f"{metrics['reward']:.2f}", H=f"{metrics['entropy']:.2f}",
                        **({"pass@1": f"{metrics['eval/pass@1']:.2f}"} if "eval/pass@1" in metrics else {}))
        if (cfg.save_every and step % cfg.save_every == 0) or last:
            checkpoint.save_checkpoint(state, cfg.out_dir, step)
        if last:
            break
    return history


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    try:
        run(cfg)
    except (ValueError, FileNotFoundError) as e:
        # Bad data files, a missing model path, ...: one line, exit code 2.
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
