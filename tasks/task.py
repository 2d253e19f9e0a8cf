"""What a task is: a source of prompts with reference answers, and a checker.

Critic-free RL needs only two things from a task: prompts with a reference answer each,
and a program that turns a response into a reward (verify.py teaches how). The trainer
also asks a task a few smaller questions, and a Task record holds every answer, so that
nothing outside tasks/ ever tests a task's name:

  rows                 (n, split, seed, digits) -> [{"prompt", "answer", ...}]
  check                (response, answer, prompt) -> {"reward", "correct", "format", ...}
  is_reasoning_text    which response tokens carry the answer (the rest is template,
                       the Cancellation Hypothesis paper's split); None = no template
  eval_prompts,        the evaluation budget: held-out prompts, samples per prompt
  eval_samples
  warmup               the embedded model's warm-up (WarmupConfig fields), None = none
  solution_of          the solution a correct response gives (diversity metrics), or None
  bare_wording         a chat-worded task's bare twin, the one the embedded model reads

The held-out split is one rule for every generated task (is_held_out, split_seed): a
problem is held out iff the crc32 of its canonical text falls in one bucket of
HELD_OUT_BUCKETS, so train and test never share a problem, for any n and seed, on any
machine; and the test split draws from its own stream, not a re-filtered training one.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

SPLITS = ("train", "test")
HELD_OUT_BUCKETS = 10          # 1 problem in 10 (by hash) is held out
EVAL_SEED_OFFSET = 1_000_003   # the test split draws from its own random stream


@dataclass(frozen=True)
class Task:
    """One task: its rows, its checker, and the answers the trainer asks of it."""

    name: str
    """The verifier's name, as logged: "addition", "countdown", "math", "reasoning_gym:NAME"."""
    rows: Callable[..., list[dict]]
    """(n, split, seed, digits) -> rows; n None = the task's default (all rows of a file)."""
    check: Callable[[object, str, str | None], dict]
    """(response, answer, prompt) -> score dict with "reward" (== "correct"); never raises on a response."""
    needs_prompt: bool = False
    """The checker reads the prompt (countdown's numbers): verify.score refuses prompts=None."""
    sandboxed: bool = False
    """The checker runs scorers in tasks/sandbox.py (it takes a timeout): verify.score spreads a batch over `workers` threads."""
    workers: int = 1
    """Threads verify.score scores a sandboxed checker's batch on: one per sandbox worker (sandbox.POOL_SIZE)."""
    is_reasoning_text: Callable[[str], bool] | None = None
    """Token text -> True if it carries the answer (template_token_mask); None: no fixed template."""
    eval_prompts: int = 200
    """Held-out prompts of an evaluation (--n_eval 0)."""
    eval_samples: int = 4
    """Samples per held-out prompt (--eval_samples 0): pass@1 .. pass@eval_samples."""
    warmup: Callable[[int], dict] | None = None
    """digits -> the embedded model's WarmupConfig fields for this task; None: no warm-up."""
    max_response_tokens: Callable[[int], int] | None = None
    """digits -> tokens of the longest reference response plus EOS (the warm-up's budget)."""
    solution_of: Callable[[str], object] | None = None
    """A correct response -> its solution's key (evaluation's solution diversity); None: one answer."""
    bare_wording: str | None = None
    """For a task worded for chat models: the --data of the same problems, worded bare, that the
    embedded model (warmed up on bare prompts) reads instead; train.py refuses the pair."""


def is_held_out(key: str) -> bool:
    """True iff the problem whose canonical text is `key` belongs to the test side.

    crc32, not Python's hash() (salted per process): the same partition on every
    machine and run. `key` must name the problem, not one way of writing it (addition
    sorts its operands, countdown its numbers), so no test problem has a training twin.
    """
    return zlib.crc32(key.encode()) % HELD_OUT_BUCKETS == 0


def split_seed(seed: int, split: str) -> int:
    """The seed of a split's random stream: seed for train, seed + EVAL_SEED_OFFSET for test."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return seed + EVAL_SEED_OFFSET if split == "test" else seed


def template_token_mask(task: Task, tokenizer, response_ids, response_mask):
    """Which response tokens are template (format) tokens: [B, T] bool, or None.

    The "where do updates go" diagnostic (diagnostics.where_updates_go) splits the change
    in log-prob between template tokens, which right and wrong rollouts share, and
    reasoning tokens, which decide the reward. Only the task knows which is which
    (task.is_reasoning_text, by token TYPE, not by decision); free text has no fixed
    template, and any rule would give a silently wrong split, so it returns None there.

    response_ids: [B, T] long; response_mask: [B, T] (1 on real tokens, incl. EOS).
    Returns [B, T] bool, False on padding (reasoning = response_mask & ~template). Each
    distinct id is decoded once (skip_special_tokens: EOS decodes to "", a template token).
    """
    import torch

    if task.is_reasoning_text is None:
        return None
    ids = torch.as_tensor(response_ids)
    distinct, where = torch.unique(ids, return_inverse=True)
    texts = [tokenizer.decode([i], skip_special_tokens=True) for i in distinct.tolist()]
    template_kind = torch.tensor([not task.is_reasoning_text(text) for text in texts], dtype=torch.bool)
    return template_kind[where] & (torch.as_tensor(response_mask) != 0)


def solution_diversity(solutions: dict) -> dict:
    """How spread the model's correct answers are over a prompt's distinct solutions.

    solutions: prompt -> [the solution key of each correct sample] (evaluation, n samples
    per prompt). Returns
      eval/distinct_solutions  mean, over prompts with >= 1 correct sample, of the number
                               of distinct solutions among them;
      eval/solution_entropy    mean, over prompts with >= 2 correct samples, of the entropy
                               (nats) of those solutions' empirical distribution: 0 when all
                               agree, log 2 for an even split of two. [recon] Our reading of
                               the design-conditions paper's "solution probability drift":
                               unequal sequence weights drive it to 0 (docs/math.md §3.7).
    NaN when no prompt qualifies. The entropy grows with the number of correct samples:
    compare runs with the same evaluation settings only.
    """
    counts = [[keys.count(k) for k in set(keys)] for keys in solutions.values() if keys]
    entropies = [-sum(c / sum(cs) * math.log(c / sum(cs)) for c in cs) for cs in counts if sum(cs) >= 2]
    return {"eval/distinct_solutions": sum(len(cs) for cs in counts) / len(counts) if counts else math.nan,
            "eval/solution_entropy": sum(entropies) / len(entropies) if entropies else math.nan}
