"""The policy-gradient objective: cancellation on a real (tiny) model, micro-batch
invariance, KL direction, entropy, filtering, clipping, DFPO's trust region and one-sided
rule, bad input, and every tensor on its inputs' device."""

import itertools
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import aggregation
import exchangeability as E
import loss as L
from advantages import compute_advantages
from aggregation import step_normaliser
from loss import LossConfig, policy_loss
from machinery import metrics

V = 12           # vocabulary of the tiny model
TEMPLATE = 3     # the shared template token id


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return Qwen2ForCausalLM(cfg).double()


def group_batch(lengths, seed=0):
    """One group: prompt [1, 2], then every response starts with TEMPLATE (same context in
    every rollout), then random tokens, right-padded. Returns input_ids, response mask."""
    g = torch.Generator().manual_seed(seed)
    P, T = 2, max(lengths)
    ids = torch.zeros(len(lengths), P + T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        ids[i, :P] = torch.tensor([1, 2])
        ids[i, P] = TEMPLATE
        ids[i, P + 1:P + n] = torch.randint(4, V, (n - 1,), generator=g)
        mask[i, :n] = 1
    return ids, mask, P


def response_logp(model, ids, P):
    logits = model(ids).logits[:, P - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)


def template_token_grad(cfg, lengths, adv, old_shift=None, seed=0, shared_unmoved=False):
    """Parameter gradient that flows ONLY through the shared template token's log-prob.

    The other positions are detached, so the result is sum_i c_i * grad log pi(TEMPLATE |
    prompt): zero iff the rollouts' coefficients c_i on the shared token cancel.
    old_shift [B]: per-rollout offset added to the old log-probs (a moved policy);
    shared_unmoved: added to every token but the template (position 0), whose old
    log-prob then stays the same in every rollout, as it is at one shared context.
    """
    model = tiny_model(seed)
    ids, mask, P = group_batch(lengths, seed)
    logp = response_logp(model, ids, P)
    logp = torch.cat([logp[:, :1], logp[:, 1:].detach()], dim=1)
    old = logp.detach().clone()
    if old_shift is not None:
        old = old + old_shift.unsqueeze(1) * (torch.arange(old.shape[1]) > 0 if shared_unmoved else 1)
    gi = torch.zeros(len(lengths), dtype=torch.long)
    loss, stats = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask), group_index=gi)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    stats["cancellation_residual"] = L.cancellation_residual_of_loss(logp, old, adv, mask, cfg,
                                                                     step_normaliser(mask), gi)
    return grad, stats


# "Zero" for a parameter gradient: the model runs in float64, but transformers' RMSNorm
# computes in float32, so identical rows' backward passes agree only to ~1e-7 relative:
# measured <= 3.6e-8 (AVX-512 and AVX2). A gradient that does not cancel is 6.4e-4 to 0.057
# here (asserted > 1e-4 below).
ZERO = 1e-6

# The other bounds of 1e-12 to 1e-15 below (absolute, or relative to O(1) values) are float64
# closed forms and float64 sums of at most ~100 terms, so rounding is ~1e-16 x terms: measured
# <= 1.7e-16 absolute and <= 7.0e-16 relative, AVX-512 and AVX2 alike, >= 58x inside every
# bound; their controls (a residual that should not cancel) assert > 1e-3 and more.

ADV = compute_advantages("mean", torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64))[0]
UNEQUAL = [3, 7, 4, 9, 5]
EQUAL = [6] * 5


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("loss_type", ["ppo", "cispo"])
def test_shared_token_cancels_under_token_sum_aggregation(agg, loss_type):
    grad, stats = template_token_grad(LossConfig(loss_type=loss_type, agg=agg), UNEQUAL, ADV)
    assert grad.abs().max().item() < ZERO
    assert stats["cancellation_residual"] < 1e-12


def test_shared_token_does_not_cancel_with_per_sequence_length_normalisation():
    grad, stats = template_token_grad(LossConfig(agg="seq-mean-token-mean"), UNEQUAL, ADV)
    assert grad.abs().max().item() > 1e-4
    assert stats["cancellation_residual"] > 0.05
    # ...but with equal lengths 1/|o_i| is the same for everyone, and it cancels again
    grad, _ = template_token_grad(LossConfig(agg="seq-mean-token-mean"), EQUAL, ADV)
    assert grad.abs().max().item() < ZERO


SHIFT = torch.tensor([0.3, -0.2, 0.1, 0.25, -0.15], dtype=torch.float64) / 5  # moved policy


def test_shared_token_does_not_cancel_under_raw_gspo_weights():
    # equal lengths, so GSPO's own 1/|o_i| is the same for all: the breaker is s_i alone
    grad, stats = template_token_grad(LossConfig(loss_type="gspo", eps_low=0.9, eps_high=9.0),
                                      EQUAL, ADV, old_shift=SHIFT)
    assert grad.abs().max().item() > 1e-4
    assert stats["cancellation_residual"] > 0.01


@pytest.mark.parametrize("transform", ["min", "orth"])
def test_dfpo_transforms_restore_cancellation(transform):
    cfg = LossConfig(loss_type="gspo", agg="token-mean", weight_transform=transform, eps_low=0.9, eps_high=9.0)
    grad, stats = template_token_grad(cfg, UNEQUAL, ADV, old_shift=SHIFT)
    assert grad.abs().max().item() < ZERO
    assert stats["cancellation_residual"] < 1e-12


def test_gspo_controls_separate_the_weights_from_the_clip():
    # keep: GSPO's sequence weights, a clip range they never reach -> the weights alone break it
    wide = dict(loss_type="gspo", eps_low=0.9, eps_high=9.0)
    grad, stats = template_token_grad(LossConfig(weight_transform="keep", **wide), UNEQUAL, ADV, old_shift=SHIFT)
    assert grad.abs().max().item() > 1e-4 and stats["cancellation_residual"] > 1e-3     # rounding: 1e-12
    assert stats["clip_frac_low"] == stats["clip_frac_high"] == 0.0          # the clip never acted
    # ...and on-policy (every weight 1) the same control cancels: the break was the weights' spread
    grad, stats = template_token_grad(LossConfig(weight_transform="keep", **wide), UNEQUAL, ADV)
    assert grad.abs().max().item() < ZERO and stats["cancellation_residual"] < 1e-12
    # equal: weight 1 for every kept rollout -> with nothing dropped it cancels, moved policy or not
    grad, stats = template_token_grad(LossConfig(weight_transform="equal", **wide), UNEQUAL, ADV, old_shift=SHIFT)
    assert grad.abs().max().item() < ZERO and stats["cancellation_residual"] < 1e-12


def test_equal_control_residual_is_the_kept_advantages_imbalance():
    # the clip drops rollout 0 (A = 1.5): the kept rollouts get weight 1 each, so a shared
    # token gets sum_kept A_i = 0.5 - 1 - 1 = -1.5, and R_g = 1.5 / 2.5 = 0.6 exactly
    coef, adv, stats = dfpo_group_with_a_dropped_rollout("equal")
    assert torch.equal(coef[0], torch.zeros(3, dtype=torch.float64))
    ratio = coef[1:, 0] / adv[1:]
    assert torch.allclose(ratio, ratio[0].expand(3), rtol=1e-12)             # one weight for the kept
    assert (coef[1:, 0].sum().abs() / coef[1:, 0].abs().sum()).item() == pytest.approx(0.6, rel=1e-12)
    # keep: the kept rollouts carry their own w_i = e^(shift_i) (equal lengths: L_g = |o_i|)
    coef, adv, _ = dfpo_group_with_a_dropped_rollout("keep")
    w = coef[1:, 0] / adv[1:]
    assert torch.allclose(w / w[0], torch.exp(torch.tensor([0.02, -0.03, 0.01], dtype=torch.float64) - 0.02),
                          rtol=1e-12)


# ---- the surrogate registry: what each surrogate declares holds --------------------------

def surrogate_config(name, transform="orth", **kw):
    """The LossConfig that runs surrogate `name` (dfpo: GSPO's weights under a transform)."""
    if name == "dfpo":
        return LossConfig(loss_type="gspo", weight_transform=transform, **kw)
    return LossConfig(loss_type=name, **kw)


@pytest.mark.parametrize("name", list(L.SURROGATES))
def test_each_surrogate_keeps_cancellation_exactly_when_it_says(name):
    # A policy that moved on every token but the shared one, a clip range it never reaches,
    # equal lengths (so GSPO's own 1/|o_i| is no breaker) and the surrogate's own
    # aggregation: one that keeps cancellation leaves the shared token no net gradient;
    # one that does not (GSPO: each rollout's own sequence ratio) pushes it. (The residual
    # R_g is not the measure here: it reads a rollout's typical token, and the other
    # tokens' ratios differ from rollout to rollout by construction.)
    cfg = surrogate_config(name, eps_low=0.9, eps_high=9.0)
    grad, _ = template_token_grad(cfg, EQUAL, ADV, old_shift=SHIFT, shared_unmoved=True)
    if L.SURROGATES[name].keeps_cancellation:
        assert grad.abs().max().item() < ZERO
    else:
        assert grad.abs().max().item() > 1e-4


def test_the_registry_is_what_lossconfig_and_the_loss_read():
    assert set(L.LOSS_TYPES) == set(L.SURROGATES) - {"dfpo"} and {"ppo", "cispo", "gspo", "dfpo"} <= set(L.SURROGATES)
    theta, old, adv, mask = random_step()
    logp, gi = old + 0.3 * torch.tanh(theta), torch.arange(8) // 2
    for name, fn in L.SURROGATES.items():
        cfg = surrogate_config(name, transform="min")
        assert cfg.surrogate == name and cfg.aggregation == fn.own_aggregation, name
        for agg in aggregation.AGGREGATIONS:     # exactly the aggregations it declares are accepted
            if agg in fn.aggregations:
                surrogate_config(name, transform="min", agg=agg)
            else:
                with pytest.raises(ValueError, match=f"got agg='{agg}'"):
                    surrogate_config(name, transform="min", agg=agg)
        per_token_adv = adv.unsqueeze(1).expand_as(mask).contiguous()
        if fn.per_sequence:                  # one weight per rollout: [B, T] advantages are refused
            with pytest.raises(ValueError, match="one advantage per rollout"):
                policy_loss(logp, old, per_token_adv, mask, cfg, step_normaliser(mask), group_index=gi)
        else:
            policy_loss(logp, old, per_token_adv, mask, cfg, step_normaliser(mask), group_index=gi)
        if fn.whole_groups:                  # it reads whole groups: without them it is refused
            with pytest.raises(ValueError, match="reads whole groups"):
                policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask))
        else:
            policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask))
    with pytest.raises(ValueError, match="own_aggregation"):      # a registration that contradicts itself
        L.register(own_aggregation="token-mean", keeps_cancellation=True, aggregations=("seq-mean-token-mean",))


@pytest.mark.parametrize("name", list(L.SURROGATES))
def test_every_surrogate_is_micro_batch_invariant(name):
    # micro-batches with the step's normaliser sum to the whole step, loss and gradient;
    # a surrogate that reads whole groups is cut at group boundaries (as the trainer cuts)
    theta, old, adv, mask = random_step()
    cfg, gi = surrogate_config(name, transform="min", eps_low=0.2, eps_high=0.28), torch.arange(8) // 2
    logp_of = lambda th: old + 0.3 * torch.tanh(th)
    norm = step_normaliser(mask)
    th_whole = theta.clone().requires_grad_(True)
    whole, _ = policy_loss(logp_of(th_whole), old, adv, mask, cfg, norm, group_index=gi)
    whole.backward()
    th_split, total = theta.clone().requires_grad_(True), 0.0
    for idx in torch.arange(8).split([2, 2, 4] if L.SURROGATES[name].whole_groups else SPLITS[4]):
        part, _ = policy_loss(logp_of(th_split)[idx], old[idx], adv[idx], mask[idx], cfg, norm, group_index=gi[idx])
        part.backward()
        total = total + part.detach()
    assert abs(total.item() - whole.item()) < 1e-12
    assert torch.allclose(th_split.grad, th_whole.grad, atol=1e-14)


def test_asymmetric_clipping_breaks_cancellation():
    # The shared token has the same ratio in every rollout. Make it 1.25: rollouts with
    # A > 0 are clipped at 1 + 0.2 (no gradient) while those with A < 0 are not.
    shift = torch.full((5,), -math.log(1.25), dtype=torch.float64)
    grad, _ = template_token_grad(LossConfig(eps_low=0.2, eps_high=0.2), EQUAL, ADV, old_shift=shift)
    assert grad.abs().max().item() > 1e-4
    # with clip-higher 0.28 the same ratio is inside the range on both sides: cancels
    grad, _ = template_token_grad(LossConfig(eps_low=0.2, eps_high=0.28), EQUAL, ADV, old_shift=shift)
    assert grad.abs().max().item() < ZERO


def orth_formula_everywhere(w, adv, group_index, mode, kept=None):
    """orth's formula w - (A.w / A.A) A in every group, one-sided ones included (what
    dfpo_transform did before its one-sided rule), to make rounding-level weights."""
    out = torch.zeros_like(w)
    for g in torch.unique(group_index):
        i = ((group_index == g) & kept).nonzero().squeeze(1)
        out[i] = w[i] - (adv[i] * w[i]).sum() / (adv[i] * adv[i]).sum() * adv[i]
    return out


def test_float_rounding_weights_are_no_weights_in_the_residual(monkeypatch):
    # orth's formula on a group whose rollouts all share one advantage gives w - mean(w),
    # 0 in exact arithmetic (dfpo_transform now zeroes such groups exactly, so the formula
    # is patched in here). Make w differ by float32 rounding only (s_i = 1 + ~1e-7): such
    # a group has nothing to cancel (NaN), not R_g = 1. Group 1 is a real group.
    monkeypatch.setattr(E, "dfpo_transform", orth_formula_everywhere)
    T = 6
    mask = torch.ones(8, T)
    adv = torch.tensor([-0.5, -0.5, -0.5, -0.5, 1.0, -1.0, 1.0, -1.0])
    old = torch.zeros(8, T)
    logp = old.clone()
    logp[:4, 0] = torch.tensor([0.0, 3e-7, -2e-7, 1e-7])        # rounding-level ratios
    logp[4:, 0] = torch.tensor([0.01, -0.02, 0.015, 0.005])     # a policy that moved
    gi = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    cfg = LossConfig(loss_type="gspo", weight_transform="orth", eps_low=0.9, eps_high=9.0)
    m = L.rollout_coefficients(logp, old, adv, mask, cfg, step_normaliser(mask, max_len=T), gi)
    assert torch.equal(m[:4], torch.zeros(4, dtype=torch.float64))
    r = E.cancellation_residual(m, gi)
    assert math.isnan(r[0].item()) and r[1].item() < 1e-6 and m[4:].abs().min().item() > 1e-4


def test_residual_of_micro_batches_that_cut_groups_equals_the_whole_step():
    # train.py cuts an optimizer step into length-sorted micro-batches, which split groups.
    # The per-rollout coefficients do not depend on the cut (step-fixed normaliser), so
    # concatenating them gives the whole step's residual: 0 for token-mean on-policy with
    # zero-sum advantages. Negative control: the residual of each micro-batch alone is not 0.
    g = torch.Generator().manual_seed(3)
    B, T = 8, 9
    lengths = torch.tensor([3, 9, 5, 7, 4, 8, 6, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64)
    adv = compute_advantages("mean", torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]],
                                                  dtype=torch.float64)).reshape(-1)
    gi = torch.arange(B) // 4
    cfg = LossConfig(agg="token-mean")
    norm = step_normaliser(mask)
    whole = L.rollout_coefficients(logp, logp, adv, mask, cfg, norm, gi)
    cut = torch.zeros(B, dtype=torch.float64)
    parts = [torch.tensor([0, 1, 4, 5]), torch.tensor([2, 3, 6, 7])]
    for idx in parts:
        cut[idx] = L.rollout_coefficients(logp[idx], logp[idx], adv[idx], mask[idx], cfg, norm, gi[idx])
        assert L.cancellation_residual_of_loss(logp[idx], logp[idx], adv[idx], mask[idx], cfg, norm, gi[idx]) > 0.05
    assert torch.allclose(cut, whole, rtol=0, atol=1e-15)
    assert E.cancellation_residual(cut, gi).max().item() < 1e-12


# ---- micro-batch invariance ---------------------------------------------------------

def random_step(seed=0, B=8, T=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()
    theta = torch.randn(B, T, generator=g, dtype=torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return theta, old, adv, mask


SPLITS = {2: [2, 6], 4: [1, 2, 2, 3]}     # unequal micro-batches (rollouts and tokens) of the 8 rollouts


@pytest.mark.parametrize("agg", aggregation.AGGREGATIONS)
@pytest.mark.parametrize("n_micro", [2, 4])
def test_micro_batch_invariance(agg, n_micro):
    theta, old, adv, mask = random_step()
    cfg = LossConfig(agg=agg, eps_low=0.2, eps_high=0.28)
    logp_of = lambda th: old + 0.3 * torch.tanh(th)      # a policy near the old one

    th_whole = theta.clone().requires_grad_(True)
    norm = step_normaliser(mask)
    whole, _ = policy_loss(logp_of(th_whole), old, adv, mask, cfg, norm)
    whole.backward()

    th_split = theta.clone().requires_grad_(True)
    total = 0.0
    for idx in torch.arange(8).split(SPLITS[n_micro]):
        part, _ = policy_loss(logp_of(th_split)[idx], old[idx], adv[idx], mask[idx], cfg, norm)
        part.backward()
        total = total + part.detach()
    assert abs(total.item() - whole.item()) < 1e-12
    assert torch.allclose(th_split.grad, th_whole.grad, atol=1e-14)

    # negative control, every mode: normalising each micro-batch by itself and averaging
    # differs (the split is unequal: with equal micro-batches the seq-mean modes' naive
    # mean of means happens to be right, see the next test)
    naive = sum(policy_loss(logp_of(theta)[idx], old[idx], adv[idx], mask[idx], cfg,
                            step_normaliser(mask[idx]))[0]
                for idx in torch.arange(8).split(SPLITS[n_micro])) / n_micro
    assert abs(naive.item() - whole.item()) > 1e-3 * abs(whole.item())


def test_naive_micro_batch_averaging_differs_for_seq_modes_with_unequal_split():
    # seq-mean modes: equal-size micro-batches average correctly by accident; an unequal
    # split (3 + 5 rollouts) exposes the naive mean-of-means.
    theta, old, adv, mask = random_step(seed=3)
    cfg = LossConfig(agg="seq-mean-token-mean")
    logp = old + 0.3 * torch.tanh(theta)
    whole = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask))[0]
    parts = [torch.arange(3), torch.arange(3, 8)]
    fixed = sum(policy_loss(logp[i], old[i], adv[i], mask[i], cfg, step_normaliser(mask))[0] for i in parts)
    naive = sum(policy_loss(logp[i], old[i], adv[i], mask[i], cfg, step_normaliser(mask[i]))[0] for i in parts) / 2
    assert abs(fixed.item() - whole.item()) < 1e-12
    assert abs(naive.item() - whole.item()) > 1e-4


# ---- aggregation closed forms and clipping ---------------------------------------------

def test_aggregation_closed_forms():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = step_normaliser(mask, max_len=10)
    assert aggregation.aggregate(per_token, mask, "token-mean", norm).item() == pytest.approx(10 / 4)
    assert aggregation.aggregate(per_token, mask, "seq-mean-token-mean", norm).item() == pytest.approx((2 + 4) / 2)
    assert aggregation.aggregate(per_token, mask, "seq-mean-token-sum", norm).item() == pytest.approx(10 / 2)
    assert aggregation.aggregate(per_token, mask, "seq-mean-token-sum-norm", norm).item() == pytest.approx(10 / 20)


def test_on_policy_ppo_is_vanilla_policy_gradient_and_never_clips():
    theta, old, adv, mask = random_step()
    logp = old.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, old, adv, mask, LossConfig(), step_normaliser(mask))
    loss.backward()
    expected = -adv.unsqueeze(1) * mask / mask.sum()
    assert torch.allclose(logp.grad, expected, atol=1e-15)
    assert stats["clip_frac_low"] == 0 and stats["clip_frac_high"] == 0 and abs(stats["approx_kl"]) < 1e-15


def test_clip_fractions_and_dual_clip_values():
    ratio = torch.tensor([[0.5, 1.5, 5.0, 1.0]])
    adv = torch.tensor([[-1.0, 1.0, -1.0, 1.0]])
    loss, low, high, dual = L.ppo_clip(ratio, adv, 0.2, 0.28)
    assert loss.tolist()[0] == pytest.approx([0.8, -1.28, 5.0, -1.0])
    assert low.tolist() == [[True, False, False, False]] and high.tolist() == [[False, True, False, False]]
    assert not dual.any()
    loss, _, _, dual = L.ppo_clip(ratio, adv, 0.2, 0.28, dual_clip=3.0)
    assert loss.tolist()[0] == pytest.approx([0.8, -1.28, 3.0, -1.0])   # capped at -c A = 3
    assert dual.tolist() == [[False, False, True, False]]


def test_cispo_keeps_gradient_where_ppo_drops_it():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)   # ratio 2 on token 0
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    for loss_type, expect in (("ppo", 0.0), ("cispo", -1.2 / 2)):
        lp = logp.detach().clone().requires_grad_(True)
        loss, _ = policy_loss(lp, old, adv, mask, LossConfig(loss_type=loss_type), step_normaliser(mask))
        loss.backward()
        assert lp.grad[0, 0].item() == pytest.approx(expect)


def test_cispo_clip_fractions_count_clamped_weights_of_either_sign():
    # CISPO removes no gradient: its clip fractions count the tokens whose importance
    # weight the clamp changed, whatever the sign of A. Ratios 1.5 (capped at 1.2) and 0.5
    # (raised to 0.8) in a rollout with A = +1 and one with A = -1.
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]])).requires_grad_(True)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    loss, stats = policy_loss(logp, old, adv, mask, LossConfig(loss_type="cispo"), step_normaliser(mask))
    loss.backward()
    assert stats["clip_frac_high"] == 0.5 and stats["clip_frac_low"] == 0.5 and stats["clip_frac_dual"] == 0
    assert logp.grad.tolist() == [pytest.approx([-1.2 / 4, -0.8 / 4]), pytest.approx([1.2 / 4, 0.8 / 4])]
    # PPO on the same tokens counts only the two whose gradient it removes
    _, ppo = policy_loss(logp, old, adv, mask, LossConfig(), step_normaliser(mask))
    assert ppo["clip_frac_high"] == 0.25 and ppo["clip_frac_low"] == 0.25


# ---- KL, entropy, negative filtering ---------------------------------------------------

def exact_kl(logits, ref_logits):
    lp, lq = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    return (lp.exp() * (lp - lq)).sum()


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_one_step_on_kl_term_lowers_kl(estimator):
    torch.manual_seed(0)
    ref = torch.randn(20).double()
    theta = (ref + torch.randn(20).double()).requires_grad_(True)
    before = exact_kl(theta.detach(), ref).item()
    # the on-policy expectation over sampled tokens, written exactly: sum_x sg(pi(x)) k(x)
    logp = torch.log_softmax(theta, -1)
    per_token = L.kl_penalty(logp, torch.log_softmax(ref, -1), estimator)
    (logp.exp().detach() * per_token).sum().backward()
    with torch.no_grad():
        theta -= 0.5 * theta.grad
    after = exact_kl(theta.detach(), ref).item()
    assert after < before - 1e-3


def test_k1_as_a_loss_has_zero_expected_gradient():
    torch.manual_seed(0)
    ref = torch.randn(20).double()
    theta = (ref + torch.randn(20).double()).requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    (logp.exp().detach() * L.kl_penalty(logp, torch.log_softmax(ref, -1), "k1")).sum().backward()
    assert theta.grad.abs().max().item() < 1e-14


def test_kl_estimator_values():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert L.kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert L.kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5)
    assert L.kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1) - 1 + 1)


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]])
    p = torch.tensor([0.25, 0.75])
    assert L.entropy_from_logits(logits)[0].item() == pytest.approx(-(p * p.log()).sum().item())
    assert L.entropy_from_logits(logits)[1].item() == pytest.approx(math.log(2))
    # robust where a probability underflows to 0
    assert torch.isfinite(L.entropy_from_logits(torch.tensor([[0.0, -1e4, 1e4]]))).all()


def test_negative_token_filter_keeps_lowest_probability_tokens():
    old = torch.log(torch.tensor([[0.9, 0.1, 0.5, 0.05, 0.8, 0.7, 0.6, 0.9, 0.9, 0.9, 0.0 + 1e-9, 0.5]]))
    mask = torch.ones(1, 12)
    mask[0, 10] = 0   # padding: never chosen, even though its old log-prob is the lowest
    keep = L.negative_token_filter(old.repeat(2, 1), mask.repeat(2, 1), torch.tensor([-1.0, 1.0]), 0.1)
    assert keep[0].nonzero().squeeze(1).tolist() == [1, 3]      # ceil(0.1 * 11) = 2 lowest
    assert torch.equal(keep[1], mask[0])                         # positive rollout untouched
    # masked tokens still count in the normaliser: loss uses n_tokens of the full mask
    logp = old.repeat(2, 1).clone().requires_grad_(True)
    cfg = LossConfig(neg_filter_frac=0.1)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([-1.0, 1.0]), mask.repeat(2, 1), cfg,
                          step_normaliser(mask.repeat(2, 1)))
    loss.backward()
    assert logp.grad[0].nonzero().squeeze(1).tolist() == [1, 3]
    assert logp.grad[0, 1].item() == pytest.approx(1 / 22)


# ---- bad input ------------------------------------------------------------------------

def test_bad_config_and_shapes_name_the_value():
    with pytest.raises(ValueError, match="agg must be one of .* got 'mean'"):
        LossConfig(agg="mean")
    with pytest.raises(ValueError, match="loss_type .* got 'trpo'"):
        LossConfig(loss_type="trpo")
    with pytest.raises(ValueError, match="eps_low .* got 1.5"):
        LossConfig(eps_low=1.5)
    with pytest.raises(ValueError, match="needs loss_type='gspo', got 'ppo'"):
        LossConfig(weight_transform="min")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        LossConfig(dual_clip=0.5)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"advantages must be \[B\]=2"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), mask, LossConfig(), step_normaliser(mask))
    with pytest.raises(ValueError, match="NaN"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0.0, float("nan")]), mask,
                    LossConfig(), step_normaliser(mask))
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), mask, LossConfig(kl_coef=0.1),
                    step_normaliser(mask))
    with pytest.raises(ValueError, match="no response tokens"):
        step_normaliser(torch.zeros(2, 3))


def test_dual_clip_is_refused_where_it_would_do_nothing(tmp_path, capsys):
    # GSPO with A < 0 and a sequence ratio of 7.4 took the full gradient and logged
    # clip_frac_dual 0 when dual_clip=3 was accepted: refuse it for every surrogate but PPO.
    for kw in (dict(loss_type="cispo"), dict(loss_type="gspo"), dict(loss_type="gspo", weight_transform="min")):
        with pytest.raises(ValueError, match=r"^dual_clip=3.0 applies to loss_type='ppo' only; (cispo|gspo|dfpo) "):
            LossConfig(dual_clip=3.0, **kw)
    assert LossConfig(dual_clip=3.0).dual_clip == 3.0          # PPO applies it (test_dual_clip_counts_...)
    # train.py: one line on stderr and exit code 2, before any model is loaded
    import train
    with pytest.raises(SystemExit) as stop:
        train.main(["--loss_type", "gspo", "--dual_clip", "3", "--out_dir", str(tmp_path / "run")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(lines) == 1
    assert lines[0].startswith("train.py: error: dual_clip=3.0 applies to loss_type='ppo' only; gspo")
    assert not (tmp_path / "run").exists()


# ---- GSPO is GSPO; DFPO under clipping; dual clip counted; residual off the hot path ----

def gspo_reference(logp, old, adv, mask, eps_low, eps_high):
    """GSPO's sequence objective written independently, at the sequence level:
    J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log rho_{i,t}); loss = -J."""
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    J = torch.minimum(s * adv, s.clamp(1 - eps_low, 1 + eps_high) * adv)
    return -J.mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_equals_the_sequence_objective(seed):
    theta, old, adv, mask = random_step(seed=seed, B=10, T=9)
    logp0 = old + 0.4 * torch.tanh(theta)          # ratios spread enough that some sequences clip
    eps_low, eps_high = 0.05, 0.04
    cfg = LossConfig(loss_type="gspo", eps_low=eps_low, eps_high=eps_high)
    assert cfg.aggregation == "seq-mean-token-mean"       # GSPO's own aggregation, chosen for it
    ours = logp0.clone().requires_grad_(True)
    loss, stats = policy_loss(ours, old, adv, mask, cfg, step_normaliser(mask))
    loss.backward()
    ref = logp0.clone().requires_grad_(True)
    ref_loss = gspo_reference(ref, old, adv, mask, eps_low, eps_high)
    ref_loss.backward()
    # float64, two orders of the same sums: measured 5.6e-17 (loss) and 6.9e-18 (gradient),
    # AVX-512 and AVX2 alike. Negative control: PPO's token ratio under the same clip and
    # aggregation is 0.033-0.075 (loss) and 0.024-0.037 (gradient) away.
    assert abs(loss.item() - ref_loss.item()) < 1e-12
    assert torch.allclose(ours.grad, ref.grad, atol=1e-12, rtol=0)
    assert 0 < stats["clip_frac_low"] + stats["clip_frac_high"] < 1   # the test exercises the clip
    token = logp0.clone().requires_grad_(True)
    token_loss, _ = policy_loss(token, old, adv, mask, LossConfig(eps_low=eps_low, eps_high=eps_high,
                                                                  agg="seq-mean-token-mean"), step_normaliser(mask))
    token_loss.backward()
    assert abs(token_loss.item() - ref_loss.item()) > 1e-2 and (token.grad - ref.grad).abs().max() > 1e-2


def test_gspo_refuses_any_other_aggregation():
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        with pytest.raises(ValueError, match=f"GSPO.*seq-mean-token-mean.*got agg='{agg}'"):
            LossConfig(loss_type="gspo", agg=agg)
    # DFPO needs a token-sum aggregation: it refuses GSPO's 1/|o_i|, and picks Dr. GRPO's by default
    with pytest.raises(ValueError, match="token-sum aggregation"):
        LossConfig(loss_type="gspo", weight_transform="min", agg="seq-mean-token-mean")
    assert LossConfig(loss_type="gspo", weight_transform="orth").aggregation == "seq-mean-token-sum-norm"
    assert LossConfig().aggregation == "token-mean" and LossConfig(loss_type="cispo").aggregation == "token-mean"


def dfpo_group_with_a_dropped_rollout(transform):
    """One zero-sum group of 4; rollout 0 (A > 0) has ratio e^0.5 on every token, far above
    1 + eps_high, so GSPO's clip drops it; the other three moved a little. Returns the
    gradient coefficient of every token (-dLoss/dlogp) and the stats."""
    adv = torch.tensor([1.5, 0.5, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(4, 3, dtype=torch.float64)
    old = torch.full((4, 3), -1.0, dtype=torch.float64)
    shift = torch.tensor([0.5, 0.02, -0.03, 0.01], dtype=torch.float64)
    logp = (old + shift.unsqueeze(1)).requires_grad_(True)
    cfg = LossConfig(loss_type="gspo", weight_transform=transform, eps_low=0.2, eps_high=0.2)
    loss, stats = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask), group_index=torch.zeros(4, dtype=torch.long))
    loss.backward()
    return -logp.grad, adv, stats


@pytest.mark.parametrize("transform", ["min", "orth"])
def test_dfpo_dropped_rollout_stays_dropped(transform):
    coef, adv, stats = dfpo_group_with_a_dropped_rollout(transform)
    assert torch.equal(coef[0], torch.zeros(3, dtype=torch.float64))   # exactly zero: dropped stays dropped
    assert (coef[1:].abs() > 1e-3).all()                               # the kept rollouts still learn
    assert stats["clip_frac_high"] == pytest.approx(0.25)
    if transform == "orth":
        # over the kept rollouts the effective coefficients cancel exactly
        assert abs(coef[1:, 0].sum().item()) < 1e-15
    else:
        # min: every kept rollout has the same weight w, so coef_i / A_i is one number
        w = coef[1:, 0] / adv[1:]
        assert torch.allclose(w, w[0].expand(3), rtol=1e-12)


def test_dfpo_keeps_or_drops_on_gspos_own_sequence_ratio_with_unequal_lengths():
    # Two groups of lengths 2, 100, 60, 40, advantages +1, +1, -1, -1. Group 0: the 2-token
    # rollout has per-token log-ratio 1, so GSPO's s = e (far above 1 + 0.2): dropped,
    # although its group-length weight w = e^(2/100) = 1.02 is inside the range. Group 1
    # (positive control): its 2-token rollout has log-ratio 0.15 (s = 1.16) and its
    # 40-token one -0.1 (s = 0.905): both inside the range, so nothing is dropped, and min
    # gives every rollout the group's smallest w, e^(-0.1 * 40 / 100).
    T, lengths = 100, [2, 100, 60, 40] * 2
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).double()
    per_token = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.15, 0.0, 0.0, -0.1], dtype=torch.float64)
    old = torch.full((8, T), -1.0, dtype=torch.float64)
    logp = (old + per_token[:, None] * mask).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0] * 2, dtype=torch.float64)
    cfg = LossConfig(loss_type="gspo", weight_transform="min", eps_low=0.2, eps_high=0.2)
    loss, stats = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask), group_index=torch.arange(8) // 4)
    loss.backward()
    coef = -logp.grad * (8 * T)                # w~_i A_i on each response token (Dr. GRPO's 1 / (B L))
    w_min = math.exp(-0.1 * 40 / 100)
    expected = torch.tensor([0.0, 1.0, -1.0, -1.0] + [w_min, w_min, -w_min, -w_min], dtype=torch.float64)
    assert torch.allclose(coef, expected[:, None] * mask, rtol=1e-12, atol=0)
    assert stats["clip_frac_high"] == pytest.approx(2 / 404) and stats["clip_frac_low"] == 0   # its 2 tokens


def dfpo_two_groups(transform):
    """Two groups of 4, equal lengths 3; rollout 0 of each (A > 0) has per-token log-ratio
    0.5, far above 1 + 0.2, and is dropped. Group 0, A = (1.5, -0.5, -0.5, -0.5): its only
    success is dropped, the kept rollouts are one-sided. Group 1, A = (1.5, 0.5, -1, -1):
    kept rollouts of both signs. Returns (w~_i A_i per token [8, 3], stats, per-token shifts)."""
    shift = torch.tensor([0.5, 0.02, -0.03, 0.01] * 2, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5, 1.5, 0.5, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(8, 3, dtype=torch.float64)
    old = torch.full((8, 3), -1.0, dtype=torch.float64)
    logp = (old + shift[:, None]).requires_grad_(True)
    cfg = LossConfig(loss_type="gspo", weight_transform=transform, eps_low=0.2, eps_high=0.2)
    gi = torch.arange(8) // 4
    loss, stats = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask), group_index=gi)
    loss.backward()
    return -logp.grad * (8 * 3), stats, shift, adv, gi     # x (n_seqs * max_len): w~_i A_i


def test_orth_zeroes_a_group_the_clip_left_one_sided():
    coef, stats, shift, adv, gi = dfpo_two_groups("orth")
    # group 0: nothing of the other sign to cancel against -> the whole group is zero
    assert torch.equal(coef[:4], torch.zeros(4, 3, dtype=torch.float64))
    # group 1: orth over the kept (both signs), w_i = e^shift_i (equal lengths): exact values
    w, a = shift[5:].exp(), adv[5:]
    expected = (w - (a * w).sum() / (a * a).sum() * a) * a
    assert torch.allclose(coef[5:, 0], expected, rtol=1e-12, atol=0) and (coef[5:, 0].abs() > 0.1).all()
    assert coef[4].abs().max() == 0 and abs(coef[5:, 0].sum().item()) < 1e-14     # measured 1.1e-16
    assert (stats["n_rollouts"], stats["n_dropped"], stats["n_groups_mixed"], stats["n_groups_one_sided"]) == (8, 2, 2, 1)
    # why not orth's formula on group 0: w - mean(w) pushes the failure with the smallest
    # weight (rollout 2, shift -0.03) UP, and the other two down
    formula = orth_formula_everywhere(shift.exp(), adv, gi, "orth", kept=torch.arange(8) % 4 != 0)
    assert (formula[1:4] * adv[1:4]).tolist()[1] > 1e-3 and (formula[1:4] * adv[1:4] < 0).sum() == 2
    # min on the same groups: group 0 moves at its smallest kept weight (min cannot cancel it)
    coef, stats, _, _, _ = dfpo_two_groups("min")
    assert torch.allclose(coef[1:4, 0], math.exp(-0.03) * adv[1:4], rtol=1e-12, atol=0)
    assert stats["n_groups_one_sided"] == 1


def test_dfpo_min_ignores_zero_advantage_rollouts():
    # A = (1, -1, 0): the A = 0 rollout is far off-policy (per-token log-ratio -2, w = e^-2)
    # but carries no gradient; it must not set the group's weight. min = e^-0.01.
    shift = torch.tensor([0.01, -0.01, -2.0], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.float64)
    old = torch.zeros(3, 4, dtype=torch.float64)
    logp = (old + shift[:, None]).requires_grad_(True)
    cfg = LossConfig(loss_type="gspo", weight_transform="min", eps_low=0.2, eps_high=0.2)
    loss, stats = policy_loss(logp, old, adv, mask, cfg, step_normaliser(mask), group_index=torch.zeros(3, dtype=torch.long))
    loss.backward()
    coef = -logp.grad * (3 * 4)
    expected = math.exp(-0.01) * adv
    assert torch.allclose(coef, expected[:, None].expand(3, 4), rtol=1e-12, atol=0)
    assert stats["n_dropped"] == 0       # A = 0 is never dropped, whatever its ratio


def test_train_tallies_dfpo_counts_over_micro_batches_into_fractions():
    # The two groups of dfpo_two_groups, one micro-batch each (as train.py cuts DFPO at
    # group boundaries): counts add, fractions come out of the sums, token stats stay
    # token-weighted, and no "n_*" count leaks into the metrics.
    import train
    shift = torch.tensor([0.5, 0.02, -0.03, 0.01] * 2, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5, 1.5, 0.5, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(8, 3, dtype=torch.float64)
    mask[4, 2] = 0                                    # unequal token counts between micro-batches
    old = torch.full((8, 3), -1.0, dtype=torch.float64)
    logp, gi = old + shift[:, None], torch.arange(8) // 4
    cfg = LossConfig(loss_type="gspo", weight_transform="orth", eps_low=0.2, eps_high=0.2)
    norm, loss_sums = step_normaliser(mask), {}
    for idx in (torch.arange(4), torch.arange(4, 8)):
        metrics.add_stats(loss_sums, policy_loss(logp[idx], old[idx], adv[idx], mask[idx], cfg, norm, gi[idx])[1])
    means = metrics.stat_means(loss_sums)
    assert means["dfpo_one_sided"] == 0.5 and means["dfpo_dropped"] == 0.25
    assert means["clip_frac_high"] == pytest.approx(5 / 23)         # 3 + 2 tokens of 23
    assert not [key for key in means if key.startswith("n_")]
    whole = policy_loss(logp, old, adv, mask, cfg, norm, gi)[1]
    assert means["approx_kl"] == pytest.approx(whole["approx_kl"], rel=1e-12)


def test_orth_refuses_advantages_that_do_not_sum_to_zero():
    from advantages import compute_advantages as ca
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    fade = ca("fade", rewards, alpha=1.0, delta=0.5)[0]           # delta < 1: sums to 2 * (0.5 - 1) != 0
    mask = torch.ones(4, 3)
    cfg = LossConfig(loss_type="gspo", weight_transform="orth")
    with pytest.raises(ValueError, match="orth.*sum to zero.*group 0 sums to"):
        policy_loss(torch.zeros(4, 3), torch.zeros(4, 3), fade, mask, cfg, step_normaliser(mask),
                    group_index=torch.zeros(4, dtype=torch.long))
    # what orth would have done: on-policy w = 1, and w~ A sums to zero, undoing delta
    w = E.dfpo_transform(torch.ones(4), fade, torch.zeros(4, dtype=torch.long), "orth")
    # float32 (here and below): measured 0, against the imbalance of 1 that FADE's delta makes
    assert abs((w * fade).sum().item()) < 1e-6 and abs(fade.sum().item()) > 0.5
    # min keeps FADE's imbalance: on-policy every rollout has w = 1, so every token's
    # coefficient is A_i / (n_seqs * max_len) and the group still sums to sum A != 0
    cfg_min = LossConfig(loss_type="gspo", weight_transform="min")
    logp = torch.zeros(4, 3, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(4, 3), fade, mask, cfg_min, step_normaliser(mask),
                          group_index=torch.zeros(4, dtype=torch.long))
    loss.backward()
    coef = -logp.grad * (4 * 3)
    assert torch.allclose(coef, fade[:, None].expand(4, 3), rtol=1e-6, atol=0)
    assert abs(coef[:, 0].sum().item() - fade.sum().item()) < 1e-6


def test_dual_clip_counts_the_tokens_it_silences():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[5.0, 2.0, 1.0, 4.0]])).requires_grad_(True)   # ratios 5, 2, 1, 4
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logp, old, adv, mask, LossConfig(dual_clip=3.0), step_normaliser(mask))
    loss.backward()
    assert stats["clip_frac_dual"] == pytest.approx(0.5)           # ratios 5 and 4 exceed c = 3
    assert logp.grad[0, 0].item() == 0 and logp.grad[0, 3].item() == 0
    assert logp.grad[0, 1].item() == pytest.approx(2.0 / 4)        # -A rho / n_tokens, not clipped
    _, stats = policy_loss(logp, old, adv, mask, LossConfig(), step_normaliser(mask))
    assert stats["clip_frac_dual"] == 0


# ---- every tensor follows its inputs' device ---------------------------------------------
# The inputs stay on the CPU while "meta" is the default device (conftest's
# default_device): a tensor loss.py makes without following its inputs lands on "meta",
# and fails to mix with them or comes back without values, as a CPU tensor would next to
# CUDA inputs on a GPU.

def accepted_configs():
    """Every loss type x aggregation x transform LossConfig accepts, with KL, entropy and
    negative filtering on (so their code runs too) and dual clip where it applies."""
    configs = []
    for loss_type, agg, transform in itertools.product(L.LOSS_TYPES, (None,) + aggregation.AGGREGATIONS, L.WEIGHT_TRANSFORMS):
        try:
            configs.append(LossConfig(loss_type=loss_type, agg=agg, weight_transform=transform, kl_coef=0.1,
                                      entropy_coef=0.01, neg_filter_frac=0.5,
                                      dual_clip=3.0 if loss_type == "ppo" else None))
        except ValueError:
            continue
    return configs


CONFIGS = accepted_configs()


def device_batch():
    """Two zero-sum groups of 4 (orth accepts them), unequal lengths, ratios far enough
    from 1 that every clip and DFPO's drop fire."""
    g = torch.Generator().manual_seed(5)
    B, T = 8, 6
    lengths = torch.tensor([2, 6, 4, 5, 3, 6, 1, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logp = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5, 1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    ref = old - 0.1
    ent = torch.rand(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, torch.arange(B) // 4, ref, ent


def run_on_inputs(fn, cfg, logp, old, adv, mask, gi, ref, ent):
    norm = step_normaliser(mask)
    if fn == "policy_loss":
        loss, stats = policy_loss(logp, old, adv, mask, cfg, norm, gi, ref, ent)
        return loss, stats
    m = L.rollout_coefficients(logp, old, adv, mask, cfg, norm, gi)
    return m if fn == "rollout_coefficients" else E.cancellation_residual(m, gi)


@pytest.mark.parametrize("fn", ["policy_loss", "rollout_coefficients", "cancellation_residual"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"{c.loss_type}-{c.agg or 'own'}-{c.weight_transform}" for c in CONFIGS])
def test_every_tensor_loss_makes_follows_its_inputs_device(cfg, fn, default_device):
    inputs = device_batch()
    expected = run_on_inputs(fn, cfg, *inputs)
    with default_device("meta"):
        got = run_on_inputs(fn, cfg, *inputs)
    if fn == "policy_loss":
        (loss, stats), (loss_ref, stats_ref) = got, expected
        assert loss.device.type == "cpu" and loss.item() == loss_ref.item()
        assert stats == stats_ref
    else:
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def test_policy_loss_runs_no_extra_backward(monkeypatch):
    """The residual is a diagnostic: the training path must not pay an extra backward,
    neither autograd.grad nor a backward of its own, in any accepted configuration."""
    def forbidden(*args, **kwargs):
        raise AssertionError("policy_loss ran a backward")
    logp, old, adv, mask, gi, ref, ent = device_batch()
    monkeypatch.setattr(torch.autograd, "grad", forbidden)
    monkeypatch.setattr(torch.autograd, "backward", forbidden)
    monkeypatch.setattr(torch.Tensor, "backward", forbidden)
    for cfg in CONFIGS:
        loss, stats = policy_loss(logp.clone().requires_grad_(True), old, adv, mask, cfg, step_normaliser(mask),
                                  gi, ref, ent.clone().requires_grad_(True))
        assert loss.requires_grad and "cancellation_residual" not in stats


# ---- an overflowing ratio: finite loss and gradient, the clamp acting only past every clip ----

# The smallest log ratio whose exp overflows, per dtype (log of the largest float: 88.72
# in float32, 709.78 in float64), and log ratios around it, both signs.
OVERFLOW = {torch.float32: 88.8, torch.float64: 709.9}


# Every accepted configuration (PPO with its dual clip), and PPO without one.
EXTREME = CONFIGS + [LossConfig(agg=agg) for agg in aggregation.AGGREGATIONS]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cfg", EXTREME, ids=[f"{c.loss_type}-{c.agg or 'own'}-{c.weight_transform}-"
                                              f"{'dual' if c.dual_clip else 'plain'}" for c in EXTREME])
def test_any_log_ratio_gives_a_finite_loss_and_gradient(cfg, dtype):
    """Log ratios at and past exp's overflow (88.8 f32, 709.9 f64, 1e4), and as far below,
    in rollouts of either sign, token ratios and sequence ratios (GSPO, DFPO) alike: the
    loss and its gradient are finite. Before the clamp: a NaN gradient with a finite loss
    (A > 0, or A < 0 under the dual clip), or an inf loss."""
    logp, old, adv, mask, gi, ref, ent = (x.to(dtype) if x.is_floating_point() else x for x in device_batch())
    big = OVERFLOW[dtype]
    old = old.clone()
    old[:, 0] = old[:, 0] - big            # log rho = +big on every rollout's first token,
    old[0::2, 1] = old[0::2, 1] + 1e4      # -1e4 on the second of the even rollouts (sequence ratio ~ 0)
    old[1::2, 1:] = old[1::2, 1:] - 1e4    # +1e4 on the rest of the odd ones (sequence ratio overflows)
    leaf = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(leaf, old, adv, mask, cfg, step_normaliser(mask), gi, ref, ent)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(leaf.grad).all()


def test_the_clamp_acts_only_past_every_clip():
    """PPO per token at log rho = 100 and -100 (past the clamp) and 15 (inside it), float32.

    Past it: a token a clip removes keeps its clipped value and zero gradient (A > 0 above
    1 + eps_high: -1.28 A; A < 0 under the dual clip: -3 A); an A < 0 token without a dual
    clip gets -A e^20 and no gradient. Inside it: the exact -A rho and its gradient
    -A rho (negative control: the clamp is the identity there)."""
    # float32 exp near e^15 and e^20: measured 3.7e-8 and 2.4e-8 relative (AVX-512 and AVX2),
    # 27x inside rel=1e-6; the clamp's e^20 against the exact e^100 is no near miss
    lr = torch.tensor([[100.0, 100.0, -100.0, 15.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
    for dual, second in ((None, math.exp(20.0)), (3.0, 3.0)):
        leaf = lr.clone().requires_grad_(True)
        loss, low, high, clipped_dual = L.ppo_clip(torch.exp(L.token_log_ratio(leaf, torch.zeros(1, 4))), adv,
                                                   0.2, 0.28, dual)
        loss.sum().backward()
        assert loss[0, :3].tolist() == pytest.approx([-1.28, second, 0.8], rel=1e-6)
        assert leaf.grad[0, :3].tolist() == [0.0, 0.0, 0.0]
        assert (high[0, 0], low[0, 2], bool(clipped_dual[0, 1])) == (True, True, dual is not None)
        inside = math.exp(15.0) if dual is None else 3.0                         # -A rho, or the dual clip
        assert loss[0, 3].item() == pytest.approx(inside, rel=1e-6)
        assert leaf.grad[0, 3].item() == pytest.approx(inside if dual is None else 0.0, rel=1e-6)


def test_clip_bounds_must_lie_inside_the_clamp():
    for kw, name in ((dict(eps_high=5e8), "1 \\+ eps_high"), (dict(dual_clip=5e8), "dual_clip"),
                     (dict(eps_low=1 - 1e-9), "1 - eps_low")):
        with pytest.raises(ValueError, match=rf"^{name} must lie strictly between e\^-20 and e\^20"):
            LossConfig(**kw)
    assert LossConfig(eps_high=4.8e8, dual_clip=4.8e8, eps_low=1 - 3e-9).eps_high == 4.8e8     # just inside
