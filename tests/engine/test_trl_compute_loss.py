"""TRL 1.16.0's own loss, `GRPOTrainer._compute_loss`, against loss.policy_loss, many seeds.

tests/engine/test_integration_trl.py runs TRL's whole loop on a tiny model (a few batches
each). This file calls TRL's loss function itself, unbound, on a stub trainer: an object
with the attributes `_compute_loss` reads, whose `_get_per_token_logps_and_entropies`
returns the log-probs the test hands it. No model, so each comparison takes about a
millisecond and every mapping of docs/trl_verl.md is checked on hundreds of random
batches and on the edge cases: all-equal rewards (advantages exactly 0), G = 2, rows
with no response token, long sequences, ratios far from 1. A TRL upgrade that changes
its loss fails here first.

What maps (TRL's arguments -> ours), the value and the gradient with respect to the
log-probs equal to float64 rounding:
  loss_type dapo / bnpo        -> --agg token-mean        (one optimizer step per batch)
  loss_type grpo               -> --agg seq-mean-token-mean
  loss_type dr_grpo            -> --agg seq-mean-token-sum-norm with max_len = max_completion_length
  epsilon, epsilon_high        -> --eps_low, --eps_high
  delta > 1 + epsilon_high     -> --dual_clip delta
  1 < delta <= 1 + epsilon_high -> --eps_high delta - 1, --dual_clip 1 + epsilon_high
  loss_type cispo, epsilon_high -> --loss_type cispo, --eps_high epsilon_high - 1, --eps_low 1 - 1e-8
  importance_sampling_level sequence, loss_type grpo -> --loss_type gspo
  beta, use_bias_correction_kl False -> --kl_coef beta, --kl_estimator k3
Known differences, each asserted as one: TRL's default use_bias_correction_kl=True
multiplies k3 by the ratio; TRL leaves the log ratio unclamped, so past exp's overflow
its gradient is NaN where ours is finite (loss.token_log_ratio).
"""

from __future__ import annotations

import collections
import math
import os
import types

import pytest
import torch

from tests.engine.helpers import skip_unless_trl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

skip_unless_trl()

from trl import GRPOTrainer  # noqa: E402

import aggregation  # noqa: E402
import loss as loss_lib  # noqa: E402

SEEDS = range(150)
# No lower bound in TRL's CISPO: ours at 1 - 1e-8 (a ratio of 1e-8 is a log ratio of -18.4,
# which the random batches below never reach: |log ratio| <= 4.5 by construction).
CISPO_NO_LOWER = 1 - 1e-8


# ---------------------------------------------------------------------------------------
# The stub trainer: what TRL's _compute_loss reads, and nothing else
# ---------------------------------------------------------------------------------------

class Accelerator:
    """One process: gather and reduce return their input."""
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def stub_trainer(loss_type="dapo", epsilon=0.2, epsilon_high=None, delta=None, beta=0.0,
                 importance_sampling_level="token", max_completion_length=None, use_bias_correction_kl=False):
    """The attributes _compute_loss reads, set as GRPOTrainer.__init__ sets them from a GRPOConfig
    (epsilon_low = epsilon; epsilon_high defaults to epsilon), for one optimizer step per
    batch on one process, no entropy bonus, no vLLM, no masks of TRL's own."""
    args = types.SimpleNamespace(delta=delta, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=1)
    stub = types.SimpleNamespace(
        args=args, loss_type=loss_type, epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high, beta=beta,
        importance_sampling_level=importance_sampling_level, max_completion_length=max_completion_length,
        top_entropy_quantile=1.0, aux_loss_enabled=False, off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False, current_gradient_accumulation_steps=1,
        model=types.SimpleNamespace(training=True), accelerator=Accelerator(),
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)})
    return stub


def trl_loss(stub, logp, old, adv, mask, ref=None):
    """(value, d value / d logp) of TRL's own _compute_loss on these log-probs."""
    leaf = logp.clone().requires_grad_(True)
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(leaf), None)
    B, T = mask.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    value = GRPOTrainer._compute_loss(stub, None, inputs)
    (grad,) = torch.autograd.grad(value, leaf)
    return float(value.detach()), grad


def our_loss(cfg, logp, old, adv, mask, max_len=None, ref=None):
    """(value, d value / d logp) of loss.policy_loss, the whole batch one optimizer step."""
    leaf = logp.clone().requires_grad_(True)
    value, _ = loss_lib.policy_loss(leaf, old, adv, mask.to(logp.dtype), cfg,
                                    aggregation.step_normaliser(mask, max_len=max_len), ref_logp=ref)
    (grad,) = torch.autograd.grad(value, leaf)
    return float(value.detach()), grad


# ---------------------------------------------------------------------------------------
# The batches: random, and the edge cases
# ---------------------------------------------------------------------------------------

def batch(seed: int):
    """One random batch in float64: G in {2, 4, 8}, T up to 300, rows with no token now and then,
    advantages from binary rewards (GRPO's, with all-equal groups at exactly 0) or Gaussian,
    log ratios up to +-4.5 (so every clip, the dual clip and CISPO's cap act)."""
    gen = torch.Generator().manual_seed(seed)
    G = (2, 4, 8)[seed % 3]
    N = 1 + int(torch.randint(1, 4, (1,), generator=gen))
    T = int(torch.randint(1, 300 if seed % 5 == 0 else 12, (1,), generator=gen))
    B = N * G
    lengths = torch.randint(0 if seed % 4 == 0 else 1, T + 1, (B,), generator=gen)
    lengths[0] = max(int(lengths[0]), 1)                           # a step has at least one token
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()
    if seed % 2:
        rewards = (torch.rand(N, G, generator=gen, dtype=torch.float64) < 0.5).double()
        rewards[0] = rewards[0, 0]                                 # one all-equal group
        centred = rewards - rewards.mean(1, keepdim=True)
        adv = (centred / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    else:
        adv = torch.randn(B, generator=gen, dtype=torch.float64)
    old = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    scale = (0.05, 0.5, 1.5)[seed % 3]
    logp = old + (scale * torch.randn(B, T, generator=gen, dtype=torch.float64)).clamp(-4.5, 4.5)
    ref = old - 0.3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    return logp, old, adv, mask, ref


# float64 on both sides, the same operations in another order: measured up to 4.4e-16
# (value) and 1.4e-17 (gradient) over the 1,350 comparisons, AVX-512 and AVX2 alike; the
# bound leaves >= 2000x. The near-misses below (the old CISPO hint, delta read as a dual
# clip below 1 + epsilon_high) are told apart at 1e3 x SAME = 1e-9, and measured >= 2.6e-4
# apart in the gradient where they differ.
SAME = 1e-12


def same(a, b) -> bool:
    return abs(a[0] - b[0]) <= SAME and float((a[1] - b[1]).abs().max()) <= SAME


MAPPINGS = {
    "dapo": (dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28),
             dict(loss_type="ppo", eps_low=0.2, eps_high=0.28, agg="token-mean")),
    "bnpo": (dict(loss_type="bnpo"), dict(loss_type="ppo", agg="token-mean")),
    "grpo": (dict(loss_type="grpo"), dict(loss_type="ppo", agg="seq-mean-token-mean")),
    "dr_grpo": (dict(loss_type="dr_grpo", max_completion_length=400),
                dict(loss_type="ppo", agg="seq-mean-token-sum-norm")),
    "delta_above": (dict(loss_type="dapo", epsilon_high=0.28, delta=3.0),
                    dict(loss_type="ppo", eps_high=0.28, dual_clip=3.0, agg="token-mean")),
    "delta_below": (dict(loss_type="dapo", epsilon_high=0.28, delta=1.1),
                    dict(loss_type="ppo", eps_high=0.1, dual_clip=1.28, agg="token-mean")),
    "cispo": (dict(loss_type="cispo", epsilon_high=5.0),
              dict(loss_type="cispo", eps_low=CISPO_NO_LOWER, eps_high=4.0, agg="token-mean")),
    "gspo": (dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
             dict(loss_type="gspo", eps_low=3e-4, eps_high=4e-4)),
    "kl": (dict(loss_type="dapo", beta=0.04), dict(loss_type="ppo", agg="token-mean", kl_coef=0.04)),
}


def compare(name: str, seed: int):
    """(TRL's (value, grad), ours) for one mapping on one batch."""
    trl_args, ours = MAPPINGS[name]
    logp, old, adv, mask, ref = batch(seed)
    ref = ref if trl_args.get("beta") else None
    max_len = trl_args.get("max_completion_length")
    return (trl_loss(stub_trainer(**trl_args), logp, old, adv, mask, ref),
            our_loss(loss_lib.LossConfig(**ours), logp, old, adv, mask, max_len, ref))


# ---------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MAPPINGS))
def test_trl_compute_loss_equals_ours_on_many_batches(name):
    for seed in SEEDS:
        theirs, ours = compare(name, seed)
        assert same(theirs, ours), (name, seed, theirs[0], ours[0])
    # The cases are not vacuous: across the seeds the gradients are real, and the clip acted.
    assert max(float(compare(name, s)[1][1].abs().max()) for s in range(6)) > 1e-3


def test_the_edge_cases_are_in_the_batches():
    """Among the seeds: G = 2, all-equal groups, rows with no token, T >= 100, ratios past 1 + 4.0."""
    seen = collections.Counter()
    for seed in SEEDS:
        logp, old, adv, mask, _ = batch(seed)
        seen["G2"] += seed % 3 == 0
        seen["all_equal"] += bool(seed % 2 and (adv[:(2, 4, 8)[seed % 3]] == 0).all())
        seen["empty_row"] += bool((mask.sum(1) == 0).any())
        seen["long"] += mask.shape[1] >= 100
        seen["ratio_past_5"] += bool((((logp - old).exp() > 5) & (mask > 0)).any())
    assert min(seen.values()) >= 5 and len(seen) == 5, seen


def test_trl_cispo_epsilon_high_is_the_cap_itself():
    """TRL's recommended epsilon_high = 5.0 for CISPO is --eps_high 4 here; read as --eps_high 5
    (what the hint said) it is a cap of 6, another loss on every batch with a ratio past 5."""
    trl_args, ours = MAPPINGS["cispo"]
    differs = 0
    for seed in range(40):
        logp, old, adv, mask, _ = batch(seed)
        theirs = trl_loss(stub_trainer(**trl_args), logp, old, adv, mask)
        assert same(theirs, our_loss(loss_lib.LossConfig(**ours), logp, old, adv, mask))
        misread = our_loss(loss_lib.LossConfig(**{**ours, "eps_high": 5.0}), logp, old, adv, mask)
        past = bool((((logp - old).exp() > 5) & (mask > 0)).any())
        assert (float((theirs[1] - misread[1]).abs().max()) > 1e3 * SAME) == past, seed
        differs += past
    assert differs >= 5
    from machinery.flags import OTHER_NAMES
    assert "epsilon_high - 1" in OTHER_NAMES["epsilon_high"] and "--eps_high 4" in OTHER_NAMES["epsilon_high"]
    assert "`--eps_high epsilon_high - 1`" in trl_verl_md()


def test_trl_delta_is_a_dual_clip_only_above_one_plus_epsilon_high():
    """delta > 1 + epsilon_high: exactly --dual_clip delta (A > 0 tokens untouched), 0 difference.
    1 < delta <= 1 + epsilon_high: --dual_clip delta is another loss (A > 0 tokens between
    delta and 1 + epsilon_high keep their gradient there, TRL caps them); --eps_high delta - 1
    with --dual_clip 1 + epsilon_high is TRL's."""
    wrong = 0
    for seed in range(40):
        logp, old, adv, mask, _ = batch(seed)
        for delta in (1.5, 3.0):                                     # above 1.28
            theirs = trl_loss(stub_trainer(epsilon_high=0.28, delta=delta), logp, old, adv, mask)
            assert same(theirs, our_loss(loss_lib.LossConfig(eps_high=0.28, dual_clip=delta), logp, old, adv, mask))
        theirs = trl_loss(stub_trainer(epsilon_high=0.28, delta=1.1), logp, old, adv, mask)
        assert same(theirs, our_loss(loss_lib.LossConfig(eps_high=0.1, dual_clip=1.28), logp, old, adv, mask))
        as_dual = our_loss(loss_lib.LossConfig(eps_high=0.28, dual_clip=1.1), logp, old, adv, mask)
        wrong += float((theirs[1] - as_dual[1]).abs().max()) > 1e3 * SAME
    assert wrong >= 20
    from machinery.flags import OTHER_NAMES
    assert "--dual_clip here at TRL's recommended delta > 1 + epsilon_high" in OTHER_NAMES["delta"]
    assert "--eps_high delta - 1 with --dual_clip 1 + epsilon_high" in OTHER_NAMES["delta"]
    doc = trl_verl_md()
    assert "`--dual_clip delta`" in doc and "`--eps_high delta - 1` with\n  `--dual_clip 1 + epsilon_high`" in doc
    assert "two-sided: caps A > 0 tokens too" not in doc


def trl_verl_md() -> str:
    with open(os.path.join(REPO, "docs", "trl_verl.md"), encoding="utf-8") as f:
        return f.read()


def test_trl_default_kl_and_an_overflowing_ratio_are_known_differences():
    """TRL's default use_bias_correction_kl=True weighs k3 by the ratio: not our k3. And TRL
    leaves the log ratio unclamped: at a log ratio of 800 (float64) its gradient is NaN, ours finite."""
    logp, old, adv, mask, ref = batch(1)
    theirs = trl_loss(stub_trainer(beta=0.04, use_bias_correction_kl=True), logp, old, adv, mask, ref)
    ours = our_loss(loss_lib.LossConfig(kl_coef=0.04), logp, old, adv, mask, ref=ref)
    assert abs(theirs[0] - ours[0]) > 1e-3
    far = old.clone()
    far[:, 0] -= 800.0                       # log ratio +800 on every first token: exp overflows (> 709.8)
    adv = adv.abs() + 0.1                    # A > 0: the clip takes the token, exp(800) = inf its gradient
    theirs = trl_loss(stub_trainer(), logp, far, adv, mask)
    ours = our_loss(loss_lib.LossConfig(), logp, far, adv, mask)
    assert torch.isnan(theirs[1]).any() and torch.isfinite(ours[1]).all()
    assert math.isfinite(theirs[0]) and theirs[0] == pytest.approx(ours[0], abs=SAME)
