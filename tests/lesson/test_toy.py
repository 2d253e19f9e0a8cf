"""toy/: every identity to float tolerance, every qualitative finding as an inequality.

The experiments run once per module (fixtures); the findings pinned here include the ones
where the analog does NOT agree with a paper, so a change that flips a verdict fails a
test instead of silently changing summary.md.
"""

import itertools
import math
import os
import subprocess
import sys

import pytest
import torch

import advantages as adv_lib
import aggregation
import loss as loss_lib
from toy import bandit as B
from toy import answers, breakers, cancellation, fade, report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Float64 identities: two routes to one number round differently, and where they sum or
# multiply matrices, how differently depends on the CPU (the order its vector sums and
# BLAS products add in). So a bound is a few dozen spacings of the values compared (the
# spacing is 2.2e-16 at 1), not the one or two its first CPU showed: >= 10x over what was
# measured with AVX-512 and AVX2 kernels, while a wrong formula is off by far more.


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return str(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def exp1(out):
    return cancellation.exp1_cancellation_identity(out)


@pytest.fixture(scope="module")
def exp2(out):
    return cancellation.exp2_where_updates_go(out)


@pytest.fixture(scope="module")
def exp3(out):
    return breakers.exp3_exchangeability(out)


@pytest.fixture(scope="module")
def exp4(out):
    return breakers.exp4_minibatching(out)


@pytest.fixture(scope="module")
def exp5(out):
    return cancellation.exp5_flips_and_coupling(out)


@pytest.fixture(scope="module")
def exp6(out):
    return fade.exp6_sign_and_difficulty(out)


@pytest.fixture(scope="module")
def exp7(out, exp6):                      # after exp6: they share fade.runs("adam") (cached)
    return fade.exp7_fade_schedule(out)


def labels(result):
    return [c["label"] for c in result["claims"]]


# ---------------------------------------------------------------------------------------
# The analog itself
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("early_stop", [False, True])
def test_responses_and_groups_are_probability_distributions(early_stop):
    bandit, W = B.make_bandit(early_stop=early_stop)
    pi = B.response_probs(bandit, W)
    assert abs(float(pi.sum()) - 1) < 1e-14
    combos, log_coef = B.enumerate_groups(bandit.K)
    assert combos.shape == (math.comb(bandit.K + B.G - 1, B.G), B.G)
    prob = B.group_probs(bandit, W, combos, log_coef)
    assert abs(float(prob.sum()) - 1) < 1e-13
    # E[successes in a group] = G * solve rate, a linear check of the multinomial weights
    assert abs(float((prob * bandit.reward[combos].sum(1)).sum()) - B.G * B.solve_rate(bandit, W)) < 1e-13
    assert set(bandit.mask.sum(1).tolist()) == ({3.0, 4.0} if early_stop else {3.0})


def test_multisets_match_ordered_tuples_by_brute_force():
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    combos, log_coef = B.enumerate_groups(3, 3)
    multiset = {tuple(c): float(torch.exp(lc + pi[c].log().sum())) for c, lc in zip(combos.tolist(), log_coef)}
    brute = {}
    for t in itertools.product(range(3), repeat=3):
        key = tuple(sorted(t))
        brute[key] = brute.get(key, 0.0) + float(pi[list(t)].prod())
    assert multiset.keys() == brute.keys()
    assert all(abs(multiset[k] - brute[k]) < 1e-15 for k in brute)


def test_make_bandit_template_probability_reward_and_bad_input():
    bandit, W = B.make_bandit(template_prob=0.95)
    assert abs(float(B.logp_table(bandit, W)[0, B.IDX["Let"]].exp()) - 0.95) < 1e-14
    swapped = bandit.responses.clone()
    swapped[:, 0] = torch.where(swapped[:, 0] == B.IDX["Let"], B.IDX["let"], B.IDX["Let"])
    order = [bandit.responses.tolist().index(row) for row in swapped.tolist()]
    assert torch.equal(bandit.reward, bandit.reward[order])           # the reward never reads the template
    assert sorted(bandit.reward.nonzero().flatten().tolist()) == [i for i, r in enumerate(bandit.responses.tolist())
                                                                  if {B.VOCAB[r[1]], B.VOCAB[r[2]]} == {"3", "7"}]
    with pytest.raises(ValueError, match="1.5"):
        B.make_bandit(template_prob=1.5)
    with pytest.raises(ValueError, match="K=0"):
        B.enumerate_groups(0)
    with pytest.raises(ValueError, match="-1"):
        B.make_bandit(n_filler=-1)
    with pytest.raises(ValueError, match="early_stop"):
        B.make_bandit(n_filler=2, early_stop=True)


def test_filler_variant_leaves_the_base_analog_unchanged_and_samples_exactly():
    base, W = B.make_bandit()
    filler, W_f = B.make_bandit(n_filler=3)
    assert torch.equal(B.reward_of(base.responses), base.reward)                 # the reward, re-derived
    assert filler.L == 6 and filler.menus[1:4] == (B.FILLERS,) * 3 and filler.responses is None
    with pytest.raises(ValueError, match="sample"):
        filler.K
    # the filler rows of W are drawn last: the base analog is what it was before fillers existed
    assert B.solve_rate(base, W) == pytest.approx(0.29946146558949965, abs=1e-15)
    assert abs(float(B.logp_table(filler, W_f)[0, B.IDX["Let"]].exp()) - 0.9) < 1e-14
    tokens = B.sample_tokens(filler, W_f, 40000, seed=3)
    freq = torch.nn.functional.one_hot(tokens, B.V).double().mean(0)              # [L, V]
    assert (freq - B.logp_table(filler, W_f).exp()).abs().max() < 0.01             # position by position = pi
    assert torch.equal(tokens, B.sample_tokens(filler, W_f, 40000, seed=3))
    with pytest.raises(ValueError, match="early-stop"):
        B.sample_tokens(*B.make_bandit(early_stop=True), 4, seed=0)


def test_one_step_over_many_groups_is_the_mean_of_their_own_steps():
    # token-mean over a step of k groups divides by k*G*L: exactly the average of the k
    # one-group updates (on-policy). The identity behind experiment 5's two designs.
    bandit, W = B.make_bandit(n_filler=2)
    tokens = B.sample_tokens(bandit, W, 6 * B.G, seed=0).view(6, B.G, bandit.L)
    mask = torch.ones(tokens.shape, dtype=torch.float64)
    adv = adv_lib.compute_advantages("grpo", B.reward_of(tokens))
    per_group = B.step_updates(bandit, W, tokens, mask, adv)
    one_step = B.step_updates(bandit, W, tokens.reshape(1, -1, bandit.L), mask.reshape(1, -1, bandit.L),
                              adv.reshape(1, -1))
    assert torch.allclose(one_step[0], per_group.mean(0), atol=1e-15, rtol=0)     # measured 1.4e-17 (1 spacing)
    assert per_group.abs().max() > 1e-3


def _direct_group_gradient(bandit, W, combo, adv, cfg, old_W=None):
    """The obvious way: one group, one policy_loss call, autograd on a plain W leaf."""
    leaf = W.detach().clone().requires_grad_(True)
    resp, mask = bandit.responses[combo], bandit.mask[combo]
    logp = B.token_logp(bandit, leaf, resp, mask)
    old = B.token_logp(bandit, W if old_W is None else old_W, resp, mask).detach()
    loss, _ = loss_lib.policy_loss(logp, old, adv, mask, cfg, aggregation.step_normaliser(torch.ones(B.G, bandit.L)),
                                   group_index=torch.zeros(B.G, dtype=torch.long))
    (grad,) = torch.autograd.grad(loss, leaf)
    return -grad


@pytest.mark.parametrize("cfg", [loss_lib.LossConfig(), loss_lib.LossConfig(agg="seq-mean-token-mean"),
                                 loss_lib.LossConfig(loss_type="gspo", agg="seq-mean-token-mean"),
                                 loss_lib.LossConfig(loss_type="gspo", weight_transform="orth",
                                                     agg="seq-mean-token-sum")])
def test_batched_group_updates_equal_one_group_at_a_time(cfg):
    bandit, W = B.make_bandit(early_stop=True)
    old_W = W + 0.2 * torch.randn(W.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    combos, _ = B.enumerate_groups(bandit.K)
    pick = combos[::997][:12]
    adv = adv_lib.compute_advantages("grpo", bandit.reward[pick])
    batched = B.group_updates(bandit, W, pick, adv, cfg, old_W=old_W)
    for g in range(len(pick)):
        direct = _direct_group_gradient(bandit, W, pick[g], adv[g], cfg, old_W)
        assert torch.allclose(batched[g], direct, atol=1e-15, rtol=0), g


def test_token_coefficients_times_softmax_scores_give_the_update():
    bandit, W = B.make_bandit()
    combos, _ = B.enumerate_groups(bandit.K)
    pick = combos[::401]
    adv = adv_lib.compute_advantages("mean", bandit.reward[pick])
    logp = B.token_logp(bandit, W)[pick].detach()
    c = B.token_coefficients(logp, logp, adv, bandit.mask[pick], loss_lib.LossConfig())
    resp = bandit.responses[pick]
    for g in range(len(pick)):
        chain = sum(c[g, i, t] * B.score_W(bandit, W, t, int(resp[g, i, t])) for i in range(B.G) for t in range(3))
        assert torch.allclose(chain, B.group_updates(bandit, W, pick[g:g + 1], adv[g:g + 1])[0], atol=1e-15,
                              rtol=0)                                      # measured 2.8e-17 (1 spacing)


def test_logp_change_first_order_is_the_derivative_of_the_exact_change():
    bandit, W = B.make_bandit()
    dW = torch.randn(2, B.V, B.D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    first = B.logp_change(bandit, W, dW)
    eps = 1e-6
    numeric = (B.logp_change(bandit, W, dW, lr=eps) - B.logp_change(bandit, W, dW, lr=-eps)) / (2 * eps)
    assert (first - numeric).abs().max() < 1e-8
    assert first[:, :, B.IDX["<eos>"]].abs().max() == 0          # off the menu: no change, no NaN


# ---------------------------------------------------------------------------------------
# Experiments 1, 2, 5: cancellation, where updates go, flips and coupling
# ---------------------------------------------------------------------------------------

def test_exp1_identity_template_zero_and_credit(exp1, out):
    n = exp1["numbers"]
    # float64 closed forms, rounding ~1e-16 x terms: measured 1.4e-17 (the identity, on a
    # scale of 0.17), 7.5e-19 (mean's template update; psr's, not zero-sum, 0.036) and
    # 3.9e-18 (the template's credit; a digit's 0.037-0.39), AVX-512 and AVX2
    assert n["max |measured - G Cov/(G L)| over groups x tokens"] < 1e-15
    assert n["max |predicted| (scale)"] > 0.1
    assert n["mean: max |update of W[Let]| in slip-free groups"] < 1e-17
    assert n["psr:  max |update of W[Let]| in slip-free groups"] > 1e-2     # negative control: not zero-sum
    credit = n["expected credit E[G Cov(A, n_a)]"]
    assert credit["3"] > 0.2 and credit["6"] < -0.2 and credit["7"] < 0     # 7 is as frequent in wrong answers
    assert abs(credit["Let"]) < 1e-15 and abs(credit["let"]) < 1e-15
    assert labels(exp1) == ["agrees"] * 3
    assert os.path.exists(os.path.join(out, exp1["png"]))


def test_exp2_positive_only_spends_more_on_templates(exp2):
    table = exp2["table"]
    for j in range(len(cancellation.TEMPLATE_PROBS)):
        assert table["psr"][j]["share"] > table["mean"][j]["share"] > 0
        assert table["psr"][j]["share"] > table["grpo"][j]["share"]
        assert table["mean"][j]["share_slip_free"] < 1e-12 and table["grpo"][j]["share_slip_free"] < 1e-12
        assert table["psr"][j]["share_slip_free"] > 1e-5
    shares = [r["share"] for r in table["psr"]]
    assert shares == sorted(shares, reverse=True)                      # fades as the template becomes certain
    assert labels(exp2) == ["agrees"] * 2


def test_exp2_judge_reads_only_its_numbers_and_flips_with_them():
    """The judge on a hand-made numbers dict: a psr share below mean's, or a non-zero slip-free share, flips a verdict."""
    probs = (0.5, 0.9, 0.99)
    row = lambda share, free: [{"share": share, "share_slip_free": free} for _ in probs]
    data = {"template_probs": probs,
            "table": {"psr": row(0.3, 0.01), "mean": row(0.1, 0.0), "grpo": row(0.1, 0.0), "nsr": row(0.2, 0.0)}}
    claims = cancellation.exp2_judge(data)
    assert [c["label"] for c in claims] == ["agrees", "agrees"]
    assert "template share psr / mean = 3.00, 3.00, 3.00" in claims[0]["evidence"]
    data["table"]["mean"][2] = {"share": 0.4, "share_slip_free": 0.0}      # mean spends MORE on the template at 0.99
    assert [c["label"] for c in cancellation.exp2_judge(data)] == ["not reproduced", "agrees"]
    data["table"]["mean"][2] = {"share": 0.1, "share_slip_free": 1e-6}     # a shared template no longer cancels
    assert [c["label"] for c in cancellation.exp2_judge(data)] == ["agrees", "not reproduced"]


def test_exp5_flips_old_and_new_design(exp5):
    n, runs = exp5["numbers"], exp5["runs"]
    mean = lambda xs: sum(xs) / len(xs)
    gap = lambda run, kind, part="all": mean(run[f"{kind}_pos_{part}"]) - mean(run[f"{kind}_neg_{part}"])
    old = runs["old"]                                                    # exact, 3 tokens, 1 group per step
    assert old["boost_pos_all"] - old["boost_neg_all"] > 0.3 and old["suppress_neg_all"] - old["suppress_pos_all"] > 0.3
    new = runs["new"]                                                    # fillers, one step over 64 groups
    assert abs(gap(new, "boost")) < 0.1 and abs(gap(new, "suppress")) < 0.1
    assert mean(new["boost_neg_all"]) > 0.4 and mean(new["suppress_pos_all"]) > 0.3
    # each change alone leaves a large gap: the two causes
    assert gap(runs["one_group"], "boost") > 0.2 and gap(runs["no_filler"], "boost") > 0.15
    # the mechanism: reward-irrelevant tokens follow their rollout's sign only in a one-group step
    assert gap(runs["one_group"], "boost", "irrelevant") > 0.15 > 0.05 > abs(gap(new, "boost", "irrelevant"))
    # decisive tokens keep a sign-dependent change (negative control inside the new design)
    assert gap(new, "boost", "decisive") > 0.3
    assert n["5d coupling: max |closed form - autograd| (both policies)"] < 1e-14
    assert labels(exp5) == ["agrees"] * 3


def test_exp5_coupling_counts_only_pairs_of_different_occurrences(exp5):
    """Self-pairs (an occurrence with itself, |grad log p|^2) are not couplings: on the
    16-filler bandit the mean over identical low-confidence pairs is 0.673 without them."""
    bandit, W = B.make_bandit(n_filler=cancellation.N_FILLER)
    occ = B.occurrences(bandit)
    assert len(occ) == 2 + 3 * cancellation.N_FILLER + 6
    P = B.logp_table(bandit, W).exp()
    low = [float(P[t, a]) < 0.5 for t, a in occ]
    identical = lambda include_self: [abs(B.coupling(bandit, W, *occ[i], *occ[j])) for i in range(len(occ))
                                      for j in range(i if include_self else i + 1, len(occ))
                                      if occ[i][1] == occ[j][1] and low[i] and low[j]]
    off, with_self = identical(False), identical(True)
    kinds = exp5["numbers"]["5d mean |coupling| over pairs of different occurrences, 16-filler bandit (mean, pairs)"]
    assert kinds["identical, p < 0.5"] == (pytest.approx(sum(off) / len(off), abs=1e-12), len(off)) and len(off) == 363
    assert sum(with_self) / len(with_self) > sum(off) / len(off) + 0.05         # the self-pairs would inflate it
    # with few occurrences they dominate: the 3-token bandit has 2 identical low-confidence
    # pairs (a digit at positions 1 and 2), mean 1.60; its 6 self-pairs would make it 2.40
    small, W3 = B.make_bandit()
    occ3 = B.occurrences(small)
    three = cancellation.coupling_classes(small, W3, B.coupling_table(small, W3, occ3), occ3)
    assert three["identical, p < 0.5"][1] == 2 and three["identical, p < 0.5"][0] == pytest.approx(1.601, abs=1e-3)
    assert kinds["identical, p >= 0.5"][1] == 0                                 # no confident token repeats here ...
    confident = exp5["numbers"]["5d   ... with 'so' made confident (p 0.77-0.92 at every filler position)"]
    low, high, different = (confident[k][0] for k in ("identical, p < 0.5", "identical, p >= 0.5", "different"))
    assert confident["identical, p >= 0.5"][1] == 120 and low > 10 * high and low > 5 * different   # ... here they do


def test_coupling_table_is_the_scalar_formula_everywhere():
    bandit, W = B.make_bandit(n_filler=2)
    occ = B.occurrences(bandit)
    table = B.coupling_table(bandit, W, occ)
    scalar = torch.tensor([[B.coupling(bandit, W, *o, *o2) for o2 in occ] for o in occ], dtype=torch.float64)
    # entries up to 4.1 (spacing 8.9e-16): measured 8.9e-16, one spacing
    assert torch.allclose(table, scalar, atol=2e-14, rtol=0) and torch.allclose(table, table.T, atol=2e-14, rtol=0)


def test_exp5_flips_verdict_sensitivity_table(exp5):
    n = exp5["numbers"]
    by_fillers = n["5e flips gap by filler positions, 64 groups per step (verdict: <= 0.1)"]
    by_groups = n["5e flips gap by groups per step, 16 filler positions"]
    assert list(by_fillers) == [4, 8, 12, 16, 32] and list(by_groups) == [1, 4, 16, 64]
    assert [by_fillers[F] for F in (4, 8, 12, 16, 32)] == pytest.approx([0.200, 0.135, 0.112, 0.072, 0.050], abs=2e-3)
    assert by_groups[16] == pytest.approx(0.104, abs=2e-3) and by_groups[64] == by_fillers[16]
    assert list(by_fillers.values()) == sorted(by_fillers.values(), reverse=True)     # longer responses: smaller gap
    assert list(by_groups.values()) == sorted(by_groups.values(), reverse=True)       # bigger steps: smaller gap
    assert "it holds with 16, 32 fillers and 64 groups per step" in exp5["claims"][0]["evidence"]


def test_sampled_flips_rejects_a_step_size_that_does_not_divide_the_batch():
    with pytest.raises(ValueError, match="divide 64"):
        cancellation.sampled_flips(groups_per_step=5)


def test_coupling_formula_limits():
    bandit, W = B.make_bandit(template_prob=0.999)
    h0 = float(bandit.H[0] @ bandit.H[0])
    let = B.IDX["Let"]
    assert abs(B.coupling(bandit, W, 0, let, 0, let)) < 1e-5 * h0          # confident: (1 - p)^2-ish, tiny
    slip = B.IDX["let"]
    assert B.coupling(bandit, W, 0, slip, 0, slip) > 0.99 * h0             # improbable: ~ |h|^2


# ---------------------------------------------------------------------------------------
# Experiments 3, 4: breakers and mini-batching
# ---------------------------------------------------------------------------------------

def test_exp3_breakers_and_fixes(exp3):
    n = exp3["numbers"]
    # float64 exact zeros, rounding ~1e-16 x terms: measured R_g <= 3.7e-17 and |E[nu]| <=
    # 4.6e-18 (AVX-512 and AVX2); where the claims expect no cancellation, E[R_g] is
    # 0.039-0.12 and |E[nu]| 0.0045-0.074
    for label in ("token-mean (DAPO, TRL default)", "seq-mean-token-sum", "seq-mean-token-sum-norm (Dr. GRPO)"):
        assert n[label]["max R_g"] < 1e-15 and abs(n[label]["E[nu]"]) < 1e-16, label
    seq = n["seq-mean-token-mean (GRPO), 1/|o_i|"]
    assert seq["E[nu]"] < -1e-3 and seq["max R_g, equal length, nothing dropped"] < 1e-15 and seq["E[R_g]"] > 0.01
    gspo = n["GSPO sequence ratio s_i, off-policy"]
    assert gspo["E[R_g]"] > 0.1 and gspo["max R_g, equal length, nothing dropped"] > 0.1     # s_i alone breaks it
    low, one, high, higher = n["PPO clip 0.2/0.2: E[nu] at rho = 0.7, 1.0, 1.25, 1.4"]
    assert low > 1e-3 and abs(one) < 1e-16 and high < -1e-3 and higher < -1e-3   # restoring toward rho = 1
    inside, outside = n["PPO clip 0.2/0.28 (DAPO): E[nu] at rho = 1.25, 1.4"]
    assert abs(inside) < 1e-16 and outside < -1e-3
    assert labels(exp3) == ["agrees"] * 4 + ["not reproduced"]


def test_exp3_claim_4_split_and_judged_by_the_residual(exp3):
    """orth and token sums: exact zero (R_g at float rounding in every group). DFPO min under
    GSPO's clip: not exact, E[R_g] 0.067 (plain GSPO 0.118), as in the training sweep."""
    n, claims = exp3["numbers"], exp3["claims"]
    assert [c["claim"] for c in claims[3:]] == ["Token-sum aggregation and DFPO orth bring it back to exactly zero",
                                               "DFPO min brings it back to exactly zero (under GSPO's clip)"]
    orth, dmin = n["GSPO + DFPO orth"], n["GSPO + DFPO min"]
    # float64 exact zeros: measured 2.0e-16 (orth) and 4.4e-17 (min, nothing dropped), AVX-512
    # and AVX2; min with a rollout dropped reaches R_g = 1
    assert orth["max R_g"] < 1e-14 and orth["P(a rollout dropped)"] == dmin["P(a rollout dropped)"] > 0.05
    assert 0 < orth["P(no gradient)"] < 0.01          # groups orth leaves without a template gradient: not R_g = 1
    assert dmin["max R_g, nothing dropped"] < 1e-15 and dmin["max R_g"] > 0.5
    assert dmin["E[R_g]"] == pytest.approx(0.0675, abs=5e-4)
    assert n["GSPO sequence ratio s_i, off-policy"]["E[R_g]"] == pytest.approx(0.118, abs=1e-3)
    assert [c["label"] for c in claims[3:]] == ["agrees", "not reproduced"]
    assert "E|nu|" not in str(n)                      # no cross-objective comparison in normaliser-dependent units


def test_exp3_dfpo_cancels_in_every_single_group():
    bandit, W = B.make_bandit(early_stop=True)
    combos, _ = breakers._slip_free_groups(bandit, W)
    rewards = bandit.reward[combos]
    adv = adv_lib.compute_advantages("grpo", rewards)
    old = B.token_logp(bandit, W)[combos].detach()
    new = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    new = new * bandit.mask[combos]
    gspo = dict(loss_type="gspo", eps_low=0.05, eps_high=0.05)          # narrow: some rollouts get dropped
    # float64 exact zeros: measured 1.7e-16 (orth) and 5.6e-17 (min, kept groups), AVX-512 and
    # AVX2; plain GSPO (the control at the end) leaves 0.13
    nu, _, dropped = breakers.net_template_weight(bandit, combos, new, old, adv, loss_lib.LossConfig(
        weight_transform="orth", agg="seq-mean-token-sum", **gspo))
    assert nu.abs().max() < 1e-14 and dropped.any()
    nu, _, dropped = breakers.net_template_weight(bandit, combos, new, old, adv, loss_lib.LossConfig(
        weight_transform="min", agg="seq-mean-token-sum", **gspo))
    assert nu[~dropped].abs().max() < 1e-15
    mixed = rewards.max(1).values > rewards.min(1).values
    # min cannot pair a dropped rollout: the rest no longer cancel (unless what is kept
    # happens to sum to 0, e.g. nothing kept, or one + and one - of equal size dropped)
    assert (nu[dropped & mixed].abs() > 1e-3).double().mean() > 0.5
    nu, _, _ = breakers.net_template_weight(bandit, combos, new, old, adv, loss_lib.LossConfig(
        agg="seq-mean-token-mean", **gspo))
    assert nu.abs().max() > 1e-3                                           # negative control: plain GSPO


def test_adam_step_matches_torch_adam():
    W = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = W.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.05)
    state = {}
    for k in range(3):
        grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 + k), dtype=torch.float64) * 10 ** -k
        ref.grad = grad.clone()
        opt.step()
        breakers.adam_step(W, grad, state, 0.05)
    # float64, the same update in another order of operations: measured 5.6e-17 at |W| <= 2.1
    # (AVX-512 and AVX2)
    assert torch.allclose(W, ref.detach(), atol=1e-15, rtol=0)


@pytest.mark.slow
def test_exp4_whole_groups_or_balanced_mass_per_step_stop_the_drift(exp4):
    n = exp4["numbers"]
    random, query = n["random"]["E|drift|"], n["query"]["E|drift|"]
    assert random > 1e-3 and query < 0.01 * random and n["query_balanced"]["E|drift|"] < 0.01 * random
    assert 0.5 * random < n["balanced"]["E|drift|"] < random                 # equal counts: a little, not much
    assert n["mass_balanced"]["E|drift|"] < 0.2 * random                     # equal mass: most of the way
    assert n["mass_balanced"]["E[max over steps |sum A|]"] < 0.05 < 0.5 < n["balanced"]["E[max over steps |sum A|]"]
    assert n["random"]["split groups"] == 4 and n["query"]["split groups"] == 0
    assert n["mass_balanced"]["split groups"] > 2                            # it gets there with groups split
    assert all(n[m]["E[d solve]"] > 0.01 for m in breakers.MODES)           # every split still learns


def test_exp4_one_verdict_per_mode_and_the_slippy_template(exp4):
    """Count balancing, the cancellation paper's rule, does not reduce drift; mass_balanced, query and
    query_balanced do. At p(Let) = 0.9 query-preserved batching still drifts at twice a
    single step's level: slips carry real covariance that Adam inflates step by step."""
    texts = [c["claim"] for c in exp4["claims"]]
    assert len(texts) == 4 and texts[0].startswith("Query-preserved")
    assert all(f"`{mode}`" in text for mode, text in zip(("balanced", "mass_balanced", "query_balanced"), texts[1:]))
    assert labels(exp4) == ["agrees", "not reproduced", "agrees", "agrees"]
    drift = exp4["drift"]
    assert sorted(drift) == [0.9, 0.99] and all(len(v) == 12 for v in drift[0.9].values())
    slippy = {mode: float(v.mean()) for mode, v in drift[0.9].items()}
    assert slippy["query"] < slippy["random"] and slippy["query"] > 1.5 * slippy["one step"]
    assert abs(slippy["balanced"] / slippy["random"] - 1) < 0.1                # counts: no help with slips either
    assert "at p(Let) = 0.9" in exp4["claims"][0]["evidence"]


# ---------------------------------------------------------------------------------------
# Experiment 6: sign and difficulty
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_exp6_masses_and_exact_one_step(exp6):
    n = exp6["numbers"]
    assert n["6a max |enumeration - expected_mass_curve|"] < 1e-14      # sums of 330 terms: measured 5.6e-16, 6.7e-16
    key = "6b E[ΔH] of one SGD step (lr 1) at p=(0.05, 0.2, 0.5, 0.8, 0.95, 0.99), "
    psr_dH, psr_eq = n[key + "psr (success only)"], n["6b   ... of it from all-equal groups, psr (success only)"]
    assert psr_dH[-1] < -0.01 and psr_eq[-1] / psr_dH[-1] > 0.9       # psr's loss at p=0.99: all-correct groups
    nsr_dH, nsr_eq = n[key + "nsr (failure only)"], n["6b   ... of it from all-equal groups, nsr (failure only)"]
    assert nsr_dH[0] < -0.01 and nsr_eq[0] / nsr_dH[0] > 0.8          # nsr's loss at p=0.05: all-wrong groups
    for label in ("mean (balanced)", "asym δ=2 (success-biased)", "asym δ=0.5 (failure-biased)"):
        assert all(v == 0 for v in n[f"6b   ... of it from all-equal groups, {label}"])
        assert abs(n[key + label][-1]) < 0.002
    first = n["6b entropy per unit of progress at p=0.5, first order in lr (exact)"]
    assert max(first.values()) - min(first.values()) < 1e-12           # no first-order sign effect
    at_lr = n["6b the same at lr 1.5 (exact, one step)"]
    assert max(at_lr.values()) - min(at_lr.values()) > 0.1            # second order: it appears with lr


def test_first_order_entropy_cost_is_one_number_for_every_sign_axis_probe():
    """Spec section 2 (corrected): in expectation, under SGD on logits, the mass imbalance
    has no first-order effect on entropy; psr, nsr, mean, asym all spend the same."""
    for p in (0.2, 0.7):
        costs = [answers.first_order_cost(p, name, **hyper) for _, name, hyper in fade.METHODS]
        costs.append(answers.first_order_cost(p, "grpo"))
        assert max(costs) - min(costs) < 1e-12 * max(abs(c) for c in costs)
        assert abs(costs[0]) > 1e-3
    # the limit is a derivative: one tiny step reproduces it (psr at p = 0.7)
    small = answers.one_step(0.7, "psr", lr=1e-5)
    assert small["dH"] / small["dp"] == pytest.approx(answers.first_order_cost(0.7, "psr"), rel=1e-3)


def test_exp6_adam_vs_sgd_verdicts_pinned(exp6):
    matched = exp6["matched"]
    gap = lambda runs, label: runs[label] - runs["mean (balanced)"]
    adam = matched["adam"][fade.ADAM_LR]
    # Adam lr 0.05: every sign-axis claim holds (rows: 1 entropy, 2 among correct, 3 coverage)
    for label, sign in (("psr (success only)", -1), ("asym δ=2 (success-biased)", -1),
                        ("asym δ=0.5 (failure-biased)", +1), ("w_reinforce λ=0.1 (failure-biased)", +1),
                        ("nsr (failure only)", +1)):
        assert all(fade.differs(gap(adam, label)[i], sign) for i in (1, 2, 3)), label
    assert float(gap(adam, "nsr (failure only)")[2].mean()) > 0.08
    # SGD, the control: beyond its first-order path only psr (all-correct groups it never
    # cancels) collapses entropy; nsr and w_reinforce lose entropy like psr, not gain it
    beyond = lambda label: gap(matched["sgd"], label) - gap(matched["path"], label)
    assert fade.differs(beyond("psr (success only)")[1], -1) and fade.differs(beyond("psr (success only)")[2], -1)
    for label in ("nsr (failure only)", "w_reinforce λ=0.1 (failure-biased)", "asym δ=0.5 (failure-biased)"):
        assert float(beyond(label)[1].mean()) < 0.01, label
    assert labels(exp6) == ["agrees", "depends on the step size"] + ["depends on the optimizer"] * 4


def test_exp6_sign_claims_must_hold_at_every_adam_step_size(exp6):
    """psr 'collapses entropy' at Adam lr 0.05 and 0.1, but at 0.02 its entropy among correct
    answers ends ABOVE mean's: the verdict says the step size decides, not "agrees"."""
    adam = exp6["matched"]["adam"]
    assert fade.ADAM_LRS == (0.02, 0.05, 0.1) and sorted(adam) == list(fade.ADAM_LRS)
    gap = lambda lr, label: adam[lr][label] - adam[lr]["mean (balanced)"]
    psr = "psr (success only)"
    assert fade.differs(gap(0.02, psr)[2], +1) and fade.differs(gap(0.02, psr)[1], -1)
    assert fade.differs(gap(0.05, psr)[2], -1) and fade.differs(gap(0.1, psr)[2], -1)
    for label, sign in (("asym δ=2 (success-biased)", -1), ("asym δ=0.5 (failure-biased)", +1),
                        ("w_reinforce λ=0.1 (failure-biased)", +1), ("nsr (failure only)", +1)):
        assert all(fade.differs(gap(lr, label)[i], sign) for lr in fade.ADAM_LRS for i in (1, 2)), label
    claim = next(c for c in exp6["claims"] if c["claim"].endswith("psr (success only)"))
    assert claim["label"] == "depends on the step size" and "lr 0.05, 0.1 of 0.02, 0.05, 0.1" in claim["evidence"]
    steps = exp6["numbers"]["6c steps to solve rate 0.9: Adam lr 0.02, 0.05, 0.1; SGD lr 1.5"]
    assert max(v[0] for v in steps.values()) < fade.ADAM_RUN_STEPS          # every lr-0.02 run reached 0.9


def test_sign_axis_label_rule():
    rule = fade.sign_axis_label
    assert rule([True] * 3, True) == "agrees"
    assert rule([True] * 3, False) == "depends on the optimizer"
    assert rule([False, True, True], True) == rule([True, False, False], False) == "depends on the step size"
    assert rule([False] * 3, True) == "depends on the optimizer"
    assert rule([False] * 3, False) == "not reproduced"
    assert "depends on the step size" in report.LABELS


def test_rollout_gap_is_exact_and_only_asym_depends_on_p():
    ps = torch.tensor([0.05, 0.3, 0.5, 0.8, 0.97], dtype=torch.float64)
    for name, hyper, speed in (("psr", {}, 1.0), ("nsr", {}, 1.0), ("w_reinforce", {"lam": 0.1}, 1.1),
                               ("mean", {}, 0.75)):
        assert torch.allclose(answers.rollout_gap(name, ps, **hyper), torch.full_like(ps, speed), atol=1e-14,
                              rtol=0)                              # measured 2.2e-16 (1 spacing at 1.1)
    for delta in (2.0, 0.5):                                   # (G-1)/G (1 - p + p/delta)
        assert torch.allclose(answers.rollout_gap("asym", ps, delta=delta), 0.75 * (1 - ps + ps / delta),
                              atol=1e-14, rtol=0)                  # measured 1.1e-16
    # it is the speed of the exact expected update (all 330 groups), here for asym, whose speed varies
    z, correct = answers.prompt_logits(0.3, n_correct=2)
    combos, log_coef = answers.answer_groups()
    prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
    adv = adv_lib.compute_advantages("asym", correct[combos].double(), delta=2.0)
    expected = (prob.unsqueeze(1) * answers.group_logit_updates(z, combos, adv)).sum(0)
    grad_p = torch.softmax(z, 0) * (correct.double() - 0.3)
    speed = answers.rollout_gap("asym", torch.tensor(0.3, dtype=torch.float64), delta=2.0)
    assert torch.allclose(expected, speed * grad_p, atol=1e-15, rtol=0)


def test_exp6_sgd_control_separates_asym_difficulty_effect(exp6):
    """Under SGD the sign axis is second order for psr, nsr, w_reinforce (their exact
    lr -> 0 path is mean's), but asym reweights prompts by difficulty: first order."""
    path = exp6["matched"]["path"]
    gap = lambda label: path[label] - path["mean (balanced)"]
    for label in ("psr (success only)", "nsr (failure only)", "w_reinforce λ=0.1 (failure-biased)"):
        assert gap(label)[1:].abs().max() < 1e-4, label
    assert float(path["mean (balanced)"][1].mean()) == pytest.approx(0.8167, abs=5e-4)
    assert float(gap("asym δ=2 (success-biased)")[1].mean()) > 0.04          # toward hard prompts: more entropy
    assert float(gap("asym δ=0.5 (failure-biased)")[1].mean()) < -0.06       # toward easy ones: less
    # sampled SGD at lr 1.5 shows most of asym's difference already on the exact path
    sgd = exp6["matched"]["sgd"]
    sgd_gap = float((sgd["asym δ=0.5 (failure-biased)"] - sgd["mean (balanced)"])[1].mean())
    assert 0.7 < sgd_gap / float(gap("asym δ=0.5 (failure-biased)")[1].mean()) < 1.3
    asym = next(c for c in exp6["claims"] if "asym δ=2" in c["claim"])
    assert "first-order difficulty effect" in asym["evidence"] and "beyond first order" in asym["evidence"]


def test_simulate_draws_the_same_numbers_whatever_else_is_in_the_batch():
    configs = fade.sign_configs()
    alone = answers.simulate(configs[2:3], "adam", 0.05, 6, seeds=2, M=8)
    together = answers.simulate(configs[:3], "adam", 0.05, 6, seeds=2, M=8)
    assert torch.equal(alone["hist"][:, 0], together["hist"][:, 2])         # common random numbers
    assert not torch.equal(together["hist"][:, 0], together["hist"][:, 2])
    # one lr per config: the same run as that config alone at its lr
    mixed = answers.simulate(configs[:3], "adam", (0.1, 0.02, 0.05), 6, seeds=2, M=8)
    assert torch.equal(alone["hist"][:, 0], mixed["hist"][:, 2])
    assert torch.equal(answers.simulate(configs[:1], "adam", 0.1, 6, seeds=2, M=8)["hist"][:, 0], mixed["hist"][:, 0])


def test_step_advantages_scale_and_shape_controls():
    sched = answers.sched_lib.SchedulerConfig(ema_beta=0.1, h_target=0.8)
    configs = (("F", "FADE", sched), ("scale", "FADE scale", "F"), ("shape", "FADE shape", "F"),
               ("m", "mean", ()))
    rewards = (torch.rand(4, 2, 6, answers.G, generator=torch.Generator().manual_seed(3)) < 0.5).double()
    knobs = {0: [{"alpha": 1.5, "delta": 0.7}, {"alpha": 1.2, "delta": 1.0}]}
    A = answers.step_advantages(configs, rewards, knobs)
    batch_abs = lambda x: x.abs().sum((-2, -1))
    mean = lambda r: adv_lib.compute_advantages("mean", r.reshape(-1, answers.G)).view(r.shape)
    # float64: measured 0, 1.1e-16, 0 and 0 below (AVX-512 and AVX2); the control at the end
    # (no rescaling) is 2.4 off
    for s, k in enumerate(knobs[0]):
        f = adv_lib.compute_advantages("fade", rewards[0, s], **k)
        assert torch.allclose(A[0, s], f, atol=1e-15, rtol=0)                       # FADE: its knobs
        shape = adv_lib.compute_advantages("fade", rewards[2, s], **k)               # shape: FADE's knobs, own rewards
        assert torch.allclose(A[2, s], shape * batch_abs(mean(rewards[2, s])) / batch_abs(shape), atol=1e-14,
                              rtol=0)                              # measured 1.1e-16
        # scale: mean's shape on its own rewards, at the FADE run's sum |A|
        own = mean(rewards[1, s])
        assert torch.allclose(A[1, s], own * batch_abs(A[0, s]) / batch_abs(own), atol=1e-15, rtol=0)
    assert torch.allclose(batch_abs(A[1]), batch_abs(A[0]), atol=1e-14, rtol=0)
    assert not torch.allclose(batch_abs(A[1]), batch_abs(mean(rewards[1])))      # the rescaling did something
    assert torch.equal(A[3], mean(rewards[3]))


def test_exp7_fade_vs_static_pinned(exp7):
    n = exp7["numbers"]
    target, reach, H0 = n["FADE: H_target, most entropy possible at its final solve rate, H0"]
    assert target < reach < 0.5 * H0                  # the paper's 0.5 H0 is out of reach, ours is not
    first, final_delta = n["FADE: first step with delta < 1, final delta (mean over seeds)"]
    assert first is not None and final_delta < 0.95   # the controller engaged
    final = {label: exp7["runs"][label]["hist"][fade.ADAM_STEPS] for label in ("FADE schedule",
                                                                                "asym δ=0.5 (failure-biased)")}
    assert fade.differs(final["asym δ=0.5 (failure-biased)"][3] - final["FADE schedule"][3], +1)
    assert labels(exp7) == ["not reproduced", "not reproduced"]


def test_exp7_fade_is_faster_through_its_step_size_not_its_schedule(exp7):
    t = lambda runs, label: fade.steps_to(runs[label]["hist"][:fade.ADAM_STEPS + 1], answers.MATCH_P)
    adam, sgd = exp7["runs"], exp7["sgd"]
    mean, fade_t = t(adam, "mean (balanced)"), t(adam, fade.FADE_RUN)
    scale, shape = t(adam, fade.SCALE_CONTROL), t(adam, fade.SHAPE_CONTROL)
    assert fade.differs(fade_t - mean, -1) and float((mean - fade_t).mean()) < 5       # sooner than the best static
    assert fade.differs(scale - fade_t, -1)          # mean at FADE's sum|A| is sooner still
    assert fade.differs(shape - mean, +1)            # FADE's (alpha, delta) at mean's scale is slower than mean
    assert fade.differs(t(sgd, fade.FADE_RUN) - t(sgd, "mean (balanced)"), +1)   # SGD: FADE is slower
    scale_log = adam[fade.FADE_RUN]["scale"].mean(1)
    assert scale_log[0] < 0.8 and abs(float(scale_log[30]) - 1) < 1e-12   # grows to mean's once alpha = 1
    claim = exp7["claims"][0]
    assert claim["label"] == "not reproduced" and "the step size explains it" in claim["evidence"]


def test_fade_speed_label_rule():
    sooner, later, tie = (torch.tensor(v, dtype=torch.float64) for v in ([-3.0, -3.1, -2.9], [1.0, 1.1, 0.9],
                                                                        [0.5, -0.5, 0.1]))
    assert fade.fade_speed_label(sooner, sooner, sooner) == "agrees"
    assert fade.fade_speed_label(sooner, sooner, later) == "depends on the optimizer"
    assert fade.fade_speed_label(sooner, later, sooner) == "not reproduced"     # the step size explains it
    assert fade.fade_speed_label(sooner, tie, sooner) == "not reproduced"
    assert fade.fade_speed_label(later, sooner, sooner) == "not reproduced"


def test_static_baselines_are_the_shared_runs_exactly():
    rewards = (torch.rand(50, answers.G, generator=torch.Generator().manual_seed(0)) < 0.4).double()
    assert torch.equal(adv_lib.compute_advantages("fade", rewards, alpha=1.0, delta=1.0),
                       adv_lib.compute_advantages("mean", rewards))
    assert torch.equal(adv_lib.compute_advantages("fade", rewards, alpha=1.0, delta=0.5),
                       adv_lib.compute_advantages("asym", rewards, delta=0.5))
    assert fade.static_label(1.0, 1.0) == "mean (balanced)" and fade.static_label(2.0, 1.0) == "static α=2 δ=1"


def test_max_entropy_is_attained_and_not_exceeded():
    n_correct = torch.tensor([1, 2, 3, 4])
    z, correct = answers.population_logits(torch.full((4,), 0.9, dtype=torch.float64), n_correct)
    n = n_correct.unsqueeze(1).double()
    uniform = torch.where(correct, math.log(0.9) - n.log(), math.log(0.1) - (answers.K_ANS - n).log())
    assert float(answers.entropy(uniform).mean()) == pytest.approx(answers.max_entropy(0.9, n_correct), abs=1e-14)
    assert float(answers.entropy(z).mean()) < answers.max_entropy(0.9, n_correct)


def test_interpolation_to_equal_solve_rate_and_never_reached():
    hist = torch.zeros(4, 4, 2, dtype=torch.float64)
    hist[:, 0, 0] = torch.tensor([0.5, 0.8, 0.95, 0.99], dtype=torch.float64)
    hist[:, 0, 1] = torch.tensor([0.5, 0.6, 0.7, 0.8], dtype=torch.float64)           # never reaches 0.9
    hist[:, 2, 0] = torch.tensor([2.0, 1.5, 1.0, 0.9], dtype=torch.float64)
    m = fade.at_solve_rate(hist, 0.9)
    assert float(m[2, 0]) == pytest.approx(1.5 - 0.5 * (0.1 / 0.15), abs=1e-15) and torch.isnan(m[:, 1]).all()
    t = fade.steps_to(hist, 0.9)
    assert float(t[0]) == pytest.approx(1 + 0.1 / 0.15, abs=1e-15) and torch.isnan(t[1])
    assert not fade.differs(torch.tensor([float("nan")] * 3, dtype=torch.float64), +1)   # NaN never passes


def test_psr_and_nsr_have_identical_expected_updates_exactly():
    """Module header fact 1: E[Delta z] = (a_1 - a_0) grad p for every advantage."""
    z, correct = answers.prompt_logits(0.3)
    combos, log_coef = answers.answer_groups()
    prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
    rewards = correct[combos].to(torch.float64)
    expected = {name: (prob.unsqueeze(1) * answers.group_logit_updates(
        z, combos, adv_lib.compute_advantages(name, rewards))).sum(0) for name in ("psr", "nsr", "mean")}
    # float64 sums over the answer groups: measured <= 5.6e-17 (AVX-512 and AVX2) on values
    # <= 0.087; mean's, (G - 1)/G of psr's, differs from it by up to 0.022
    assert torch.allclose(expected["psr"], expected["nsr"], atol=1e-15, rtol=0)
    pi = torch.softmax(z, 0)
    grad_p = pi * (correct.double() - 0.3)                                  # d p / d z
    assert torch.allclose(expected["psr"], grad_p, atol=1e-15, rtol=0)    # psr: a_1 - a_0 = 1
    assert torch.allclose(expected["mean"], grad_p * (answers.G - 1) / answers.G, atol=1e-15, rtol=0)


def test_simulation_update_is_the_loss_gradient():
    z, correct = answers.prompt_logits(0.4)
    combos, _ = answers.answer_groups()
    adv = adv_lib.compute_advantages("grpo", correct[combos].double())
    pi = torch.softmax(z, 0)
    closed = answers.logit_update(adv, combos, pi.expand(len(combos), answers.K_ANS))
    # float64 closed forms: measured 6.4e-18 and 0 (AVX-512 and AVX2)
    assert torch.allclose(answers.group_logit_updates(z, combos, adv), closed, atol=1e-15, rtol=0)
    assert torch.allclose(answers._log_softmax(z), torch.log_softmax(z, 0), atol=1e-15, rtol=0)
    with pytest.raises(ValueError, match="1.2"):
        answers.prompt_logits(1.2)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_writes_pngs_and_summary(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toy", "--out", str(tmp_path), "--only", "5", "1"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "## 1. The cancellation identity" in summary and "## 5. Token flips" in summary
    assert summary.index("## 1.") < summary.index("## 5.")
    assert "Verdicts on 6 claims: 6 agree." in summary and "| agrees |" in summary
    assert (tmp_path / "exp1_cancellation_identity.png").exists() and (tmp_path / "exp5_flips_coupling.png").exists()
    assert "[AGREES]" in proc.stdout and "Verdicts on 6 claims" in proc.stdout


@pytest.mark.parametrize("argv, message", [(["--only", "9"], "unknown experiment 9"),
                                           (["--only", "x"], "invalid int value: 'x'")])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    from toy.__main__ import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_cli_rejects_an_out_path_that_is_a_file(tmp_path, capsys):
    from toy.__main__ import main
    a_file = tmp_path / "taken"
    a_file.write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(a_file)])
    assert stop.value.code == 2 and "is not a folder" in capsys.readouterr().err


def test_cli_rejects_an_out_path_under_a_file_before_running(tmp_path, capsys):
    from toy.__main__ import main
    a_file = tmp_path / "taken"
    a_file.write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(a_file / "sub"), "--only", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "(above it) is a file" in err and err.count("\n") == 1, err


def test_claim_labels_are_the_four_and_counted():
    with pytest.raises(ValueError, match="'holds'"):
        report.claim("x", "holds", "y")
    claims = [report.claim("a", "agrees", ""), report.claim("b", "depends on the optimizer", ""),
              report.claim("c", "agrees", "")]
    assert report.label_counts(claims) == "2 agree, 1 depends on the optimizer"
    assert report.agrees_if(True) == "agrees" and report.agrees_if(False) == "not reproduced"
