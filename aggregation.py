"""Aggregation: how a [B, T] per-token loss becomes one number, and so how much each token weighs.

loss.py gives every response token a loss l_{i,t} (rollout i, position t) whose gradient is
a weight (the surrogate's: a ratio, clipped or not) times A_i grad log pi(o_{i,t}). The
step's loss is their sum divided by something, and that divisor is a design choice: it
sets how much one token weighs against another, and implementations of GRPO differ on it.
Four divisors are in use; the names are verl's (train.py --agg, LossConfig.agg):

    token-mean               sum_{i,t} l / n_tokens              DAPO (Yu et al. 2025), TRL's "dapo"
    seq-mean-token-mean      sum_i (sum_t l / |o_i|) / n_seqs    the original GRPO (Shao et al. 2024); GSPO
    seq-mean-token-sum       sum_{i,t} l / n_seqs
    seq-mean-token-sum-norm  sum_{i,t} l / (n_seqs L_max)        Dr. GRPO (Liu et al. 2025)

(DAPO: arXiv 2503.14476; GRPO, in DeepSeekMath: arXiv 2402.03300; Dr. GRPO: arXiv 2503.20783.)

n_tokens and n_seqs count the WHOLE optimizer step, L_max is a fixed length (train.py: the
generation budget). Three of the four divide every token of the step by the same constant;
only seq-mean-token-mean divides by the token's own rollout's length |o_i| (the mean per
rollout GRPO wrote, then a mean over rollouts). TOKEN_SUMS lists the other three.

1. Length. Dr. GRPO named GRPO's 1/|o_i| a length bias: among correct responses a short
   one's tokens each get a larger push up; among wrong ones a long one's tokens each get a
   smaller push down, so the objective punishes a wrong answer less the longer it runs.
   Its fix divides the token sum by a constant (seq-mean-token-sum-norm). DAPO divides by
   the step's token count (token-mean), so a long response's tokens count as much as a
   short one's.

2. Exchangeability. The design conditions paper (arXiv 2604.13088; its method is DFPO)
   states the condition: "intra-group objectives must maintain gradient exchangeability
   across token updates, enabling gradient cancellation on weak-credit/high-frequency
   tokens". A token that every rollout of a zero-sum group emits at the same context (a
   template token) moves by (sum_i c_i A_i) g, zero for every reward pattern iff every
   rollout gives it the same coefficient c_i (exchangeability.py). A step-constant divisor
   keeps c_i equal; 1/|o_i| with unequal lengths does not. [derived] The condition is the
   paper's; that the length normaliser breaks it is our consequence of it, not a claim
   quoted from the paper. Example: G = 2, A = (+0.5, -0.5), a success of 10 tokens and a
   failure of 40: the shared token gets 0.5/10 - 0.5/40 = +0.0375 (times 1/n_seqs), a net
   push up for a token that is in both. So DFPO's surrogate accepts only TOKEN_SUMS, and
   GSPO, whose objective IS a mean over sequences, only seq-mean-token-mean (loss.py's
   register, docs/math.md §3.4, §3.7).

3. Micro-batch invariance. The normaliser (how many tokens / sequences the whole optimizer
   step has) is computed ONCE from the whole step by `step_normaliser` and passed to every
   call. Every mode is a sum over rollouts divided by step constants, so summing the losses
   of any split of the step into micro-batches gives exactly the loss (and the gradient)
   of the whole step. Averaging per micro-batch instead, the naive way, weights short
   micro-batches' tokens more: the objective would change with a memory setting
   (tests/lesson/test_loss.py shows both).

Shapes: per_token, mask: [B, T], B rollouts in this call (a micro-batch), T response
positions, mask 1 on response tokens. Layers: this file imports torch only; loss.py
imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TOKEN_SUMS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")   # no per-rollout 1/|o_i|


@dataclass
class StepNorm:
    """The normaliser of one optimizer step, fixed before micro-batching."""

    n_tokens: float
    """Response tokens in the whole step (token-mean divides by this)."""
    n_seqs: float
    """Rollouts in the whole step (the seq-mean-* modes divide by this)."""
    max_len: float
    """The fixed length constant of seq-mean-token-sum-norm (Dr. GRPO uses the generation budget)."""


def step_normaliser(mask: Tensor, max_len: int | None = None) -> StepNorm:
    """Compute the step's normaliser from the mask of EVERY rollout in the step.

    mask: [B_step, T] (1 on response tokens). max_len: Dr. GRPO's constant; default is
    the mask's width T. Call this once per optimizer step, before splitting the step into
    micro-batches, and pass the result to every loss.policy_loss call of that step.
    """
    if mask.dim() != 2:
        raise ValueError(f"step_normaliser: mask must be [B, T], got {tuple(mask.shape)}")
    n_tokens = float(mask.sum())
    if n_tokens <= 0:
        raise ValueError("step_normaliser: the step has no response tokens (mask is all zero)")
    max_len = mask.shape[1] if max_len is None else max_len
    if max_len < mask.shape[1]:
        raise ValueError(f"step_normaliser: max_len={max_len} is shorter than the responses (T={mask.shape[1]})")
    return StepNorm(n_tokens=n_tokens, n_seqs=float(mask.shape[0]), max_len=float(max_len))


def aggregate(per_token: Tensor, mask: Tensor, agg: str, norm: StepNorm) -> Tensor:
    """Reduce a [B, T] per-token loss to this micro-batch's share of the step's scalar.

        token-mean               sum_{i,t} l / n_tokens(step)             (DAPO, TRL "dapo")
        seq-mean-token-mean      sum_i (sum_t l / |o_i|) / n_seqs(step)   (original GRPO, GSPO)
        seq-mean-token-sum       sum_{i,t} l / n_seqs(step)
        seq-mean-token-sum-norm  sum_{i,t} l / (n_seqs(step) * max_len)   (Dr. GRPO)

    Only seq-mean-token-mean weights a token by its own rollout's length, 1/|o_i|: a shared
    template token then weighs more in short rollouts and its updates stop cancelling
    (Dr. GRPO's length bias; docs/math.md §3.7). Every mode is a sum over rollouts divided
    by step constants, so micro-batch losses add up to the step's loss exactly (§3.4).
    Names are verl's; seq-mean-token-sum-norm is Dr. GRPO's formula, which older verl did
    not follow (docs/math.md §9).
    """
    masked = per_token * mask
    if agg == "token-mean":
        return masked.sum() / norm.n_tokens
    if agg == "seq-mean-token-mean":
        lengths = mask.sum(dim=1).clamp(min=1)  # an empty rollout contributes 0, not NaN
        return (masked.sum(dim=1) / lengths).sum() / norm.n_seqs
    if agg == "seq-mean-token-sum":
        return masked.sum() / norm.n_seqs
    return masked.sum() / (norm.n_seqs * norm.max_len)   # seq-mean-token-sum-norm


def masked_mean(values: Tensor, mask: Tensor) -> float:
    """sum(values * mask) / sum(mask): a token-mean over the masked tokens, as a number.

    The token-mean above without a step normaliser: the mean of a per-token statistic over
    the real response tokens of one batch (the loss's clip fractions and KL, the logged
    entropy). values: [B, T], any dtype (bool counts as 0/1: cast to the mask's); mask:
    [B, T] float, 1 on real tokens. 0.0 for an empty mask (not NaN).
    """
    return float((values.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1))
