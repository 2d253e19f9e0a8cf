"""Gradient exchangeability: when the update of a token every rollout shares is zero.

From the design conditions paper ("Design Conditions for Intra-Group Learning of
Sequence-Level Rewards: Token Gradient Cancellation", arXiv 2604.13088; its method is
DFPO). loss.py gives rollout i of a group the coefficient w_i A_i on the gradient of
each of its tokens (w_i: whatever weight the surrogate and the aggregation put on it;
A_i: its advantage). This file is about one consequence of that product.

1. The condition. A token every rollout of a group emits at the same context (a template
   prefix) has the same gradient g in every rollout, so the group moves it by

       sum_i w_i A_i g.

   With a zero-sum advantage (sum_i A_i = 0: GRPO's, RLOO's, ...) and equal weights it
   is w (sum_i A_i) g = 0, whatever the rewards; and it is zero for EVERY zero-sum A
   only if every rollout gives the token the SAME weight w_i: "gradient exchangeability".
   Then the shared token, which carries no credit, does not drift; what survives is
   credit for tokens that occur unequally in successes and failures (docs/math.md §3.7).

2. What breaks it. Three common choices make w_i differ within a group:
     - GSPO's sequence ratio s_i = exp(mean_t log rho_{i,t}), different in every rollout
       once the policy has moved;
     - asymmetric clipping, which zeroes some rollouts' weights and not others' (PPO's
       clip acts on A > 0 above 1 + eps_high and on A < 0 below 1 - eps_low; GSPO's
       clip drops whole rollouts);
     - [derived] per-sequence length normalisation 1/|o_i| with unequal lengths
       (seq-mean-token-mean: the original GRPO, and GSPO's own aggregation). Example:
       G = 2, A = (+0.5, -0.5), a success of 10 tokens and a failure of 40: the shared
       token gets 0.5/10 - 0.5/40 = +0.0375 (times the step's 1/n_seqs), a net push up.
   loss.py registers each surrogate with `keeps_cancellation`, whether it keeps the
   condition, and tests/lesson/test_loss.py measures it on a real (tiny) model.

3. The fixes, `dfpo_transform`. The paper's two transforms act on detached per-rollout
   weights w, per group, before the gradient:
       min:   w~_i = min_j w_j over the group;     orth:  w~ = w - (A.w / A.A) A.
   Both make sum_i w~_i A_i = 0 again (orth always, min whenever sum_i A_i = 0). Two
   controls on the same path take GSPO apart, one mechanism at a time: `keep` (w~ = w:
   GSPO's sequence weights, untransformed) and `equal` (w~ = 1: only GSPO's clip, which
   drops rollouts). Example: G = 4, A = (+1, +1, -1, -1), w = (1.2, 1.0, 0.9, 0.9):
   sum_i w_i A_i = 0.4; min gives w~ = 0.9 for all and orth w~ = w - 0.1 A =
   (1.1, 0.9, 1.0, 1.0), both with sum_i w~_i A_i = 0 (to float rounding).
   [recon] Which weights they act on (GSPO's ratio with a length normaliser shared by
   the group) and what happens to a rollout GSPO's clip drops are our reading: the
   `dfpo` surrogate in loss.py builds w and calls dfpo_transform; docs/math.md §3.8, §3.11.
   `dfpo_group_counts` counts what that clip did, for the logs.

4. The measurement, `cancellation_residual`: R_g = |sum_i m_i| / sum_i |m_i| per group,
   m_i = w_i A_i; 0 when a shared token's updates cancel exactly, 1 when every rollout
   pushes it the same way (the example above: 0.4 / 4.0 = 0.1 before the transform).
   loss.py's rollout_coefficients reads m_i off the loss's own gradient, so one
   diagnostic covers every surrogate and aggregation (docs/math.md §3.9).

Layers: this file imports torch only. loss.py imports it (its `dfpo` surrogate, its
statistics and its residual diagnostics), never the reverse, which is why the
diagnostics that need the loss, rollout_coefficients and cancellation_residual_of_loss,
live in loss.py.
Shapes: B rollouts in this call; w, adv, m, kept, dropped, group_index: [B]
(group_index long: which prompt, i.e. group, each rollout belongs to). A group is the
rollouts of one group_index value that are IN THE CALL: pass whole groups.
Devices: every tensor made here is made on its inputs' device (`new_zeros`,
`zeros_like`, `full_like`); tests/lesson/test_loss.py's device test runs these functions
with the default device "meta" and the inputs on the CPU.
Tests: tests/lesson/test_exchangeability.py (the identities, the residual's values);
tests/lesson/test_loss.py (the same functions through the loss, on a tiny model).
"""

from __future__ import annotations

import torch
from torch import Tensor


# ---------------------------------------------------------------------------------------
# The fixes: DFPO's weight transforms, and what GSPO's clip did
# ---------------------------------------------------------------------------------------

def dfpo_transform(w: Tensor, adv: Tensor, group_index: Tensor, mode: str, kept: Tensor | None = None) -> Tensor:
    """The DFPO weight transforms (arXiv 2604.13088) that restore exchangeability, and two controls.

    w: [B] detached per-rollout weights; adv: [B]; group_index: [B]; kept: [B] bool (default
    all). Per group, over its kept rollouts K, and M = those of K with A != 0:
        min:   w~_i = min_{j in M} w_j                  every kept rollout the same weight
        orth:  w~_K = w_K - (A_K.w_K / A_K.A_K) A_K     remove w's component along A
        keep:  w~_i = w_i                               control: GSPO's sequence weights as they are
        equal: w~_i = 1                                 control: GSPO's clip alone
    and w~_i = 0 off K. After orth sum_K w~_i A_i = 0; after min, whenever sum_K A_i = 0.
    Edge cases: no kept rollout -> zeros; all kept A = 0 -> w kept; orth's one-sided rule
    [recon]: kept A != 0 all of one sign (incl. a single one) -> zeros. Pass whole groups:
    only rollouts in this call form a group. Why min skips A = 0, the one-sided rule, and
    orth re-centring non-zero-sum advantages (refused by loss.policy_loss): docs/math.md §3.8, §3.11.
    mode: 'min' | 'orth' | 'keep' | 'equal', checked at the door (loss.LossConfig), not here.
    """
    kept = torch.ones_like(w, dtype=torch.bool) if kept is None else kept
    out = torch.zeros_like(w)
    for g in torch.unique(group_index):
        idx = ((group_index == g) & kept).nonzero().squeeze(1)
        if len(idx) == 0:
            continue
        wg, ag = w[idx], adv[idx]
        moving = ag != 0
        if mode == "keep":
            out[idx] = wg
        elif mode == "equal":
            out[idx] = 1.0
        elif not bool(moving.any()):
            out[idx] = wg
        elif mode == "min":
            out[idx] = wg[moving].min()
        elif not (bool((ag > 0).any()) and bool((ag < 0).any())):
            out[idx] = 0.0                      # orth's one-sided rule (docstring)
        else:  # orth
            out[idx] = wg - (ag * wg).sum() / (ag * ag).sum() * ag
    return out


def dfpo_group_counts(adv: Tensor, dropped: Tensor, group_index: Tensor) -> dict:
    """What DFPO's clip did to the groups of this call, as counts (loss.policy_loss's stats).

        n_rollouts          rollouts in the call
        n_dropped           rollouts the clip dropped (exactly zero gradient)
        n_groups_mixed      groups whose advantages have both signs (something to cancel)
        n_groups_one_sided  of those, groups whose kept rollouts with A != 0 have one
                            sign only: orth zeroes them, min cannot cancel them
                            (dfpo_transform); a group the clip emptied is not one of them
    Counts, not fractions, so that micro-batches add up; the fractions of a whole step
    are n_dropped / n_rollouts and n_groups_one_sided / n_groups_mixed (train.py's
    dfpo_dropped and dfpo_one_sided). adv, dropped (bool), group_index: [B].
    """
    _, inverse = torch.unique(group_index, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if len(inverse) else 0
    any_in_group = lambda flags: adv.new_zeros(n_groups).index_add_(0, inverse, flags.to(adv.dtype)) > 0
    mixed = any_in_group(adv > 0) & any_in_group(adv < 0)
    kept_pos, kept_neg = any_in_group((adv > 0) & ~dropped), any_in_group((adv < 0) & ~dropped)
    return {"n_rollouts": float(len(adv)), "n_dropped": float(dropped.sum()),
            "n_groups_mixed": float(mixed.sum()), "n_groups_one_sided": float((mixed & (kept_pos ^ kept_neg)).sum())}


# ---------------------------------------------------------------------------------------
# The measurement: the cancellation residual
# ---------------------------------------------------------------------------------------

RESIDUAL_REL_TOL = 1e-6
"""A rollout whose effective weight |w_i| is below this is float rounding, not a weight
(loss.rollout_coefficients sets its m_i to 0)."""


def cancellation_residual(m: Tensor, group_index: Tensor) -> Tensor:
    """Per-group residual R_g = |sum_i m_i| / sum_i |m_i|, with m_i = w_i A_i.

    0 means a shared token's updates cancel exactly in that group, 1 that they all push
    the same way. m: [B] per-rollout effective coefficients; group_index: [B]. Returns
    [n_groups] in the order of torch.unique(group_index).
    A "group" is the rollouts of one group_index value that are in m. Pass the rollouts
    of ONE optimizer step (one update of the weights): if mini-batching cut a group
    across steps, R_g is then the residual of that step's part of the group, which is
    what that update does to a shared token; the part applied in another step, at other
    weights, cancels nothing here (that is why query batching keeps groups whole).
    train.py does exactly this. To get the residual of whole groups, concatenate the m
    of all their rollouts (loss.rollout_coefficients' m add across micro-batches).
    Groups whose coefficients are all 0 (nothing to cancel) get NaN, so callers drop them
    with nanmean.
    """
    groups, inverse = torch.unique(group_index, return_inverse=True)
    num = m.new_zeros(len(groups)).index_add_(0, inverse, m).abs()
    den = m.new_zeros(len(groups)).index_add_(0, inverse, m.abs())
    return torch.where(den > 0, num / den.clamp(min=1e-30), torch.full_like(den, float("nan")))
