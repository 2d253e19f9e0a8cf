"""Token-level diagnostics of the Cancellation Hypothesis paper: where an update goes.

A critic-free update (GRPO and its family) gives every token of rollout i the same
weight A_i. The Cancellation Hypothesis paper ("The Cancellation Hypothesis in
Critic-Free RL: From Outcome Rewards to Token Credits") asks what that does token by
token, and answers with four measurements, all taken right after an optimizer step by
rescoring the SAME sampled tokens under the new weights (docs/math.md §6):

  1. token flips      a token is boosted if its log-prob rose by more than tau, suppressed
                      if it fell by more. Finding: positive and negative rollouts have
                      remarkably similar boosted and suppressed fractions, because a
                      token's change is not fixed by its own advantage.
  2. where updates go the share of the total |Δ log π| on template (format) tokens
                      versus reasoning tokens. Finding: compared with positive-only
                      training, critic-free RL moves the share toward reasoning tokens
                      (the template tokens, shared by rights and wrongs, cancel).
  3. token value      the Monte Carlo success probability of continuations with the token
                      minus without it. Finding: boosted tokens have higher value than
                      suppressed ones, in positive and in negative rollouts alike.
  4. token coupling   how much a step on one occurrence's log-prob moves another's.
                      Finding: identical tokens predicted with low confidence couple most,
                      which is how a token in a failed rollout can rise.

All four are [recon]: the paper's exact definitions are not public; each function
says what we chose. Conventions: natural logs; Δ log π = logp_new - logp_old per
sampled token, [B, T] like every per-token tensor of rollout.py (B = N * G rollouts,
prompt-major, a float response mask that is 1 on real tokens including EOS);
"positive" and "negative" rollouts are those with A > 0 and A < 0 (A = 0 rollouts
count in the totals of 1-2 but in neither sign). Every number is a function of the
current step's batch. This file holds the formulas, on tensors; what a training step
needs around them (rescoring under the new weights, sampling the token values'
continuations, the coupling's forward, the step's record) is the engine's,
machinery/token_diagnostics.py, whose after_update the trainer calls every few steps
(train.py, stage 7) and logs to metrics.jsonl.

The toy version of the same claims, with exact expectations instead of samples, is in
toy/cancellation.py; this file measures them on the real task and the real model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TAU = 1e-3                  # flip threshold in nats (docs/math.md §6.1)
VALUE_CELLS = ("boosted_pos", "suppressed_pos", "boosted_neg", "suppressed_neg")
COUPLING_CLASSES = ("same_low", "same_high", "different")
# Seeds of the diagnostics' own random streams, derived from (seed, step) and offset so
# that they differ from evaluation.evaluate's seed * 100_003 + step.
SEED_OFFSET = 7_000_003


def residual_metrics(residuals: list[float]) -> dict:
    """The step's residual keys from the R_g means of its optimizer steps, in order.

    "cancellation_residual": their mean (NaN steps, with no group to cancel, skipped);
    "cancellation_residual_first": the first optimizer step's alone (ratio 1 there).
    Example: [1e-9, 0.3, NaN] -> 0.15, 1e-9.
    """
    return {"cancellation_residual": nanmean(residuals),
            "cancellation_residual_first": residuals[0] if residuals else math.nan}


def nanmean(values: list[float]) -> float:
    """Mean of the non-NaN values (NaN if there are none: no group had both signs)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


# ---------------------------------------------------------------------------------------
# 1. Token flips
# ---------------------------------------------------------------------------------------

def token_flips(new_logp: Tensor, old_logp: Tensor, mask: Tensor, adv_flat: Tensor, tau: float = TAU) -> dict:
    """Token flips (Cancellation Hypothesis paper; [recon] its exact definition is not public).

        Δ_{b,t} = logp_new - logp_old      boosted: Δ > tau      suppressed: Δ < -tau

    Fractions of the real tokens of the positive (A > 0) rollouts, and of the negative
    (A < 0) rollouts: "flip/boost_pos", "flip/suppress_pos", "flip/boost_neg",
    "flip/suppress_neg". A sign with no rollout (an all-zero batch) has no keys.
    The paper's finding: the four fractions are remarkably similar, i.e. a negative
    rollout has many boosted tokens (those it shares with successes) and a positive
    rollout many suppressed ones. tau = 1e-3 nats by default (docs/math.md §6.1); the
    rest (|Δ| <= tau) is neither.
    new_logp, old_logp, mask: [B, T]; adv_flat: [B]. Example: one positive rollout with
    Δ = (+0.01, -0.01, 0) on three real tokens -> boost_pos = suppress_pos = 1/3.
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


def specificity(new_logp: Tensor, old_logp: Tensor, mask: Tensor, token_ids: Tensor, rewards: Tensor,
                G: int) -> dict:
    """[recon] Are tokens specific to successful rollouts reinforced more than shared ones?

    The Cancellation Hypothesis paper's central sentence: "opposing signals cancel out for
    tokens shared by positive and negative rollouts, while tokens more specific to
    successful rollouts receive stronger reinforcement". Measured per (group, token id)
    cell, in the groups whose rewards differ (a group of equal rewards has no "specific"):

        spec(g, a)  = #{successes of g containing a} / |S_g|  -  #{failures containing a} / |F_g|
        reinf(g, a) = mean of Δ log π = logp_new - logp_old over a's occurrences in g's rollouts

    successes: the rollouts with the group's highest reward, failures: its lowest (binary
    rewards: right and wrong). spec is +1 for a token only successes contain, 0 for one
    every rollout contains, -1 for one only failures contain. Under the paper's view reinf
    rises with spec; the first-order update of a token every rollout weighs alike is G
    Cov(A, n(a)) (docs/math.md), but what is measured here is the change after an Adam
    step through shared parameters, with coupling, so it could come out either way.
    Keys: "credit/specificity_corr" (Pearson correlation of spec and reinf over the step's
    cells; absent with fewer than 3 cells or no spread) and "credit/specificity_cells".
    [recon]: the paper's own measure is not public. Shapes: new_logp, old_logp, mask,
    token_ids [B, T]; rewards [B], prompt-major groups of G.
    Example: G = 2, one success with tokens (x, y), one failure with (x, z): spec(x) = 0,
    spec(y) = 1, spec(z) = -1.
    """
    delta = (new_logp - old_logp).double()
    real = mask != 0
    specs, reinf = [], []
    for g in range(len(rewards) // G):
        rows = slice(g * G, (g + 1) * G)
        r = rewards[rows]
        if r.max() == r.min():
            continue
        member = real[rows]
        ids, uniq_inverse = torch.unique(token_ids[rows][member], return_inverse=True)
        rollout = torch.arange(G).unsqueeze(1).expand(G, member.shape[1])[member]
        present = torch.zeros(G, len(ids), dtype=torch.float64)
        present[rollout, uniq_inverse] = 1.0
        specs.append(present[r == r.max()].mean(0) - present[r == r.min()].mean(0))
        total = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, uniq_inverse, delta[rows][member])
        count = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, uniq_inverse,
                                                                      torch.ones_like(delta[rows][member]))
        reinf.append(total / count)
    if not specs:
        return {}
    x, y = torch.cat(specs), torch.cat(reinf)
    out = {"credit/specificity_cells": float(len(x))}
    if len(x) >= 3 and float(x.std()) > 0 and float(y.std()) > 0:
        out["credit/specificity_corr"] = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
    return out


# ---------------------------------------------------------------------------------------
# 2. Where updates go: template versus reasoning tokens
# ---------------------------------------------------------------------------------------

def where_updates_go(new_logp: Tensor, old_logp: Tensor, mask: Tensor, adv_flat: Tensor, template: Tensor) -> dict:
    """[recon] How the step's change in log-prob splits between template and reasoning tokens.

        share(c)        = sum_{tokens of class c} |Δ|  /  sum_{all real tokens} |Δ|
        dlogp(c, sign)  = mean of Δ over the tokens of class c in the rollouts of that sign

    Δ = logp_new - logp_old; template = `template & mask`, reasoning = `mask & ~template`
    (tasks.template_token_mask). Shares and mean |Δ| per class use every real token, A = 0
    rollouts included (they move through shared parameters too); signed means use A > 0 or
    A < 0 rollouts only. Keys: docs/metrics.md; why (template pushes cancel under critic-free
    RL, not under psr): docs/math.md §6.4. [recon]: the paper's classes and normalisation
    are not public; ours are by token type.
    Edge cases: sum |Δ| = 0 -> no share keys; a class with no token in a sign -> no key.
    Shapes: new_logp, old_logp, mask, template [B, T]; adv_flat [B].
    """
    real = mask != 0
    is_template = template.bool() & real
    is_reasoning = real & ~template.bool()
    delta = (new_logp - old_logp).double() * real
    total = float(delta.abs().sum())
    out = {"where/template_tokens": float(is_template.sum()) / max(float(real.sum()), 1.0)}
    if total > 0:
        out["where/template_share"] = float(delta.abs()[is_template].sum()) / total
        out["where/reasoning_share"] = float(delta.abs()[is_reasoning].sum()) / total
    for cls, members in (("template", is_template), ("reasoning", is_reasoning)):
        if members.any():
            out[f"where/abs_dlogp_{cls}"] = float(delta.abs()[members].mean())
    for name, rows in (("pos", adv_flat > 0), ("neg", adv_flat < 0)):
        for cls, members in (("template", is_template), ("reasoning", is_reasoning)):
            sel = members & rows.unsqueeze(1)
            if sel.any():
                out[f"where/dlogp_{cls}_{name}"] = float(delta[sel].mean())
    return out


# ---------------------------------------------------------------------------------------
# 3. Token value: Monte Carlo success probability with and without the token
# ---------------------------------------------------------------------------------------

def sample_value_positions(delta: Tensor, mask: Tensor, adv_flat: Tensor, n: int, generator: torch.Generator,
                           tau: float = TAU) -> tuple[Tensor, Tensor, list[str]]:
    """[recon] n response positions for the value estimate, stratified by flip and sign.

    Four cells: boosted_pos, suppressed_pos, boosted_neg, suppressed_neg (boosted:
    Δ > tau, suppressed: Δ < -tau, as token_flips; pos/neg: the rollout's A > 0 / A < 0).
    Each cell gets n // 4 positions (the first n % 4 cells one more), drawn uniformly
    WITHOUT replacement among its real tokens; a cell with fewer tokens gives all it has
    and the rest of its quota is not moved elsewhere (so a cell's mean is always an
    unbiased estimate for that cell, and the sample sizes say how much to trust it).
    Why stratified: the claim compares boosted with suppressed tokens in each sign,
    and a uniform sample would spend most of its budget on tokens that moved less than
    tau, which answer nothing.
    delta, mask: [B, T]; adv_flat: [B]. Returns (rows [S] long, cols [S] long, cells:
    S names), S <= n. Deterministic in the generator's state.
    """
    real = mask != 0
    sign = {"pos": (adv_flat > 0).unsqueeze(1), "neg": (adv_flat < 0).unsqueeze(1)}
    flip = {"boosted": delta > tau, "suppressed": delta < -tau}
    rows, cols, cells = [], [], []
    for k, cell in enumerate(VALUE_CELLS):
        kind, s = cell.split("_")
        where = (real & flip[kind] & sign[s]).nonzero()                  # [M, 2] (b, t)
        quota = n // len(VALUE_CELLS) + (1 if k < n % len(VALUE_CELLS) else 0)
        pick = where[torch.randperm(len(where), generator=generator)[:quota]]
        rows.append(pick[:, 0])
        cols.append(pick[:, 1])
        cells += [cell] * len(pick)
    return torch.cat(rows), torch.cat(cols), cells


def value_stats(value: Tensor, cells: list[str]) -> dict:
    """Mean token value per cell, with sample size and standard error.

    Keys, for each cell of VALUE_CELLS: "value/<cell>" (mean of V_with - V_without),
    "value/n_<cell>" (positions) and "value/se_<cell>" (std (ddof=1) / sqrt(n): it
    includes both the spread of values across tokens and the Monte Carlo noise). The
    mean is absent when n = 0, the standard error when n < 2.
    The paper's claim, in these keys: value/boosted_pos > value/suppressed_pos and
    value/boosted_neg > value/suppressed_neg.
    """
    out = {}
    for cell in VALUE_CELLS:
        v = value[[i for i, c in enumerate(cells) if c == cell]].double()
        out[f"value/n_{cell}"] = len(v)
        if len(v):
            out[f"value/{cell}"] = float(v.mean())
        if len(v) > 1:
            out[f"value/se_{cell}"] = float(v.std() / len(v) ** 0.5)
    return out


# ---------------------------------------------------------------------------------------
# 4. Token coupling through the output layer
# ---------------------------------------------------------------------------------------

def output_layer_coupling(p1: Tensor, p2: Tensor, a: Tensor, b: Tensor, h1: Tensor, h2: Tensor,
                          temperature: float = 1.0, bias: bool = False) -> Tensor:
    """[recon] Output-layer coupling of two token occurrences (docs/math.md §6.3).

    Occurrence 1 is token a from final hidden state h (p = softmax(W h / T)), occurrence 2
    token b from h' (p'). Through W alone, grad_W log p_a = (e_a - p) h^T / T, so

        <grad_W log p_a, grad_W log p'_b> = ([a == b] - p'_a - p_b + p . p') (h . h') / T^2

    (with an output bias, h . h' + 1). An SGD step lr on occurrence 1's log-prob moves
    occurrence 2's by lr times this, to first order. ~1 for the same token predicted
    improbably at both places, ~0 when both are confident, small or negative for different
    tokens. Partial: the output layer's term only, and Adam rescales per coordinate.
    Shapes: p1, p2 [M, V]; a, b [M] long; h1, h2 [M, d]. Returns [M] (dtype of p1).
    """
    bracket = ((a == b).to(p1.dtype) - p2.gather(1, a.unsqueeze(1)).squeeze(1)
               - p1.gather(1, b.unsqueeze(1)).squeeze(1) + (p1 * p2).sum(1))
    features = (h1 * h2).sum(1) + (1.0 if bias else 0.0)
    return bracket * features / temperature ** 2


def sample_coupling_pairs(token_ids: Tensor, mask: Tensor, old_logp: Tensor, n: int,
                          generator: torch.Generator) -> dict[str, tuple[Tensor, Tensor]]:
    """[recon] n pairs of distinct token occurrences per class, uniformly among the class's pairs.

    Occurrences: the real response tokens, by flat index b * T + t; confidence = pi_old =
    exp(old_logp) of the sampled token. Classes:
      same_low   the same token id, both occurrences with pi_old < 0.5
      same_high  the same token id, both with pi_old >= 0.5
      different  different token ids, any confidence (the control)
    Mixed low/high pairs are in no class. Every ordered pair of distinct occurrences in a
    class is equally likely, drawn with replacement (how: docs/math.md §6.3).
    token_ids, mask, old_logp: [B, T]. Returns {class: (first [n'], second [n'])}, n' = n,
    or fewer (down to 0) when the class has no pair (or, for different, when 32 rounds of
    redrawing found fewer than n).
    """
    flat = (mask.flatten() != 0).nonzero().squeeze(1)
    tok = token_ids.flatten()[flat]
    low = old_logp.flatten()[flat].exp() < 0.5
    return {"same_low": _same_token_pairs(flat[low], tok[low], n, generator),
            "same_high": _same_token_pairs(flat[~low], tok[~low], n, generator),
            "different": _different_token_pairs(flat, tok, n, generator)}


# ---------------------------------------------------------------------------------------
# Helpers of section 4
# ---------------------------------------------------------------------------------------

def _same_token_pairs(occ: Tensor, tok: Tensor, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """n ordered pairs of distinct occurrences with the same token, uniform over such pairs."""
    empty = (occ.new_zeros(0), occ.new_zeros(0))
    if n == 0 or len(occ) < 2:
        return empty
    order = torch.argsort(tok, stable=True)
    occ, tok = occ[order], tok[order]
    _, counts = torch.unique_consecutive(tok, return_counts=True)
    starts = counts.cumsum(0) - counts
    weight = (counts * (counts - 1)).double()
    if weight.sum() == 0:
        return empty
    kind = torch.multinomial(weight, n, replacement=True, generator=generator)
    c = counts[kind].double()
    i = (torch.rand(n, generator=generator, dtype=torch.float64) * c).long()
    j = (torch.rand(n, generator=generator, dtype=torch.float64) * (c - 1)).long()
    j = j + (j >= i).long()                      # skip i: j is uniform over the other c - 1
    return occ[starts[kind] + i], occ[starts[kind] + j]


def _different_token_pairs(occ: Tensor, tok: Tensor, n: int, generator: torch.Generator,
                           rounds: int = 32) -> tuple[Tensor, Tensor]:
    """n ordered pairs of occurrences with different tokens (uniform: rejection sampling)."""
    first, second = [], []
    have = 0
    for _ in range(rounds):
        if have >= n or len(occ) < 2:
            break
        i = torch.randint(len(occ), (2 * n,), generator=generator)
        j = torch.randint(len(occ), (2 * n,), generator=generator)
        keep = tok[i] != tok[j]                  # different tokens are never the same occurrence
        first.append(occ[i[keep]])
        second.append(occ[j[keep]])
        have += int(keep.sum())
    if not first:
        return occ.new_zeros(0), occ.new_zeros(0)
    return torch.cat(first)[:n], torch.cat(second)[:n]
