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
import loss as loss_lib
from toy import bandit as B
from toy import breakers, cancellation, fade

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _direct_group_gradient(bandit, W, combo, adv, cfg, old_W=None):
    """The obvious way: one group, one policy_loss call, autograd on a plain W leaf."""
    leaf = W.detach().clone().requires_grad_(True)
    resp, mask = bandit.responses[combo], bandit.mask[combo]
    logp = B.token_logp(bandit, leaf, resp, mask)
    old = B.token_logp(bandit, W if old_W is None else old_W, resp, mask).detach()
    loss, _ = loss_lib.policy_loss(logp, old, adv, mask, cfg, loss_lib.step_normaliser(torch.ones(B.G, bandit.L)),
                                   group_index=torch.zeros(B.G, dtype=torch.long), with_residual=False)
    (grad,) = torch.autograd.grad(loss, leaf)
    return -grad


@pytest.mark.parametrize("cfg", [loss_lib.LossConfig(), loss_lib.LossConfig(agg="seq-mean-token-mean"),
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
        assert torch.allclose(chain, B.group_updates(bandit, W, pick[g:g + 1], adv[g:g + 1])[0], atol=1e-16, rtol=0)


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
    assert n["max |measured - G Cov/(G L)| over groups x tokens"] < 1e-15
    assert n["max |predicted| (scale)"] > 0.1
    assert n["mean: max |update of W[Let]| in slip-free groups"] < 1e-17
    assert n["psr:  max |update of W[Let]| in slip-free groups"] > 1e-2     # negative control: not zero-sum
    credit = n["expected credit E[G Cov(A, n_a)]"]
    assert credit["3"] > 0.2 and credit["6"] < -0.2 and credit["7"] < 0     # 7 is as frequent in wrong answers
    assert abs(credit["Let"]) < 1e-15 and abs(credit["let"]) < 1e-15
    assert all(c["holds"] for c in exp1["claims"])
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
    assert [c["holds"] for c in exp2["claims"]] == [True, True]


def test_exp5_flips_and_coupling(exp5):
    n = exp5["numbers"]
    assert n["coupling: max |closed form - autograd|"] < 1e-14
    assert n["mean |coupling|, identical tokens, p < 0.5"] > 2 * n["mean |coupling|, identical tokens, p >= 0.5"]
    assert n["mean |coupling|, identical tokens, p < 0.5"] > 2 * n["mean |coupling|, different tokens"]
    # negative rollouts do contain boosted tokens, but the fractions are NOT similar here
    assert 0.05 < n["boost_neg_all"] < n["boost_pos_all"] - 0.1
    assert n["suppress_neg_all"] > n["suppress_pos_all"] + 0.1
    assert [c["holds"] for c in exp5["claims"]] == [False, True, True]


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
    for label in ("token-mean (DAPO, TRL default)", "seq-mean-token-sum", "seq-mean-token-sum-norm (Dr. GRPO)",
                  "GSPO + DFPO min", "GSPO + DFPO orth"):
        assert n[label]["E|nu|"] < 1e-16 and n[label]["E[R_g]"] < 1e-15, label
    seq = n["seq-mean-token-mean (GRPO), 1/|o_i|"]
    assert seq["E[nu]"] < -1e-3 and seq["max|nu|, equal-length groups"] < 1e-16 and seq["E[R_g]"] > 0.01
    assert n["GSPO sequence ratio s_i, off-policy"]["E|nu|"] > 1e-3
    low, one, high, higher = n["PPO clip 0.2/0.2: E[nu] at rho = 0.7, 1.0, 1.25, 1.4"]
    assert low > 1e-3 and abs(one) < 1e-16 and high < -1e-3 and higher < -1e-3   # restoring toward rho = 1
    inside, outside = n["PPO clip 0.2/0.28 (DAPO): E[nu] at rho = 1.25, 1.4"]
    assert abs(inside) < 1e-16 and outside < -1e-3
    assert all(c["holds"] for c in exp3["claims"])


def test_exp3_dfpo_cancels_in_every_single_group():
    bandit, W = B.make_bandit(early_stop=True)
    combos, _ = breakers._slip_free_groups(bandit, W)
    rewards = bandit.reward[combos]
    adv = adv_lib.compute_advantages("grpo", rewards)
    old = B.token_logp(bandit, W)[combos].detach()
    new = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    new = new * bandit.mask[combos]
    for mode in ("min", "orth"):
        cfg = loss_lib.LossConfig(loss_type="gspo", weight_transform=mode, agg="seq-mean-token-sum")
        nu, _ = breakers.net_template_weight(bandit, combos, new, old, adv, cfg)
        assert nu.abs().max() < 1e-15, mode
    nu, _ = breakers.net_template_weight(bandit, combos, new, old, adv, loss_lib.LossConfig(loss_type="gspo"))
    assert nu.abs().max() > 1e-3


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
    assert torch.allclose(W, ref.detach(), atol=1e-15, rtol=0)


def test_exp4_whole_groups_per_step_stop_the_drift(exp4):
    n = exp4["numbers"]
    random, query = n["random"]["E|drift|"], n["query"]["E|drift|"]
    assert random > 1e-3 and query < 0.01 * random and n["query_balanced"]["E|drift|"] < 0.01 * random
    assert n["balanced"]["E|drift|"] < random                          # a little, not much
    assert n["random"]["split groups"] == 4 and n["query"]["split groups"] == 0
    assert all(n[m]["E[d solve]"] > 0.01 for m in breakers.MODES)      # every split still learns
    slippy_random, slippy_query = n["p(Let) = 0.9, 8 seeds: E|drift| random, query"]
    assert 0.2 * slippy_random < slippy_query < slippy_random          # slips: drift even without splitting
    assert [c["holds"] for c in exp4["claims"]] == [True, True]


# ---------------------------------------------------------------------------------------
# Experiment 6: sign and difficulty
# ---------------------------------------------------------------------------------------

def test_exp6_masses_and_exact_one_step(exp6):
    n = exp6["numbers"]
    assert n["6a max |enumeration - expected_mass_curve|"] < 1e-15
    psr_dH = n["6b E[ΔH] per step at p=(0.05, 0.2, 0.5, 0.8, 0.95, 0.99), psr (success only)"]
    psr_eq = n["6b   ... of it from all-equal groups, psr (success only)"]
    assert psr_dH[-1] < -0.01 and psr_eq[-1] / psr_dH[-1] > 0.9       # psr's loss at p=0.99: all-correct groups
    nsr_dH = n["6b E[ΔH] per step at p=(0.05, 0.2, 0.5, 0.8, 0.95, 0.99), nsr (failure only)"]
    nsr_eq = n["6b   ... of it from all-equal groups, nsr (failure only)"]
    assert nsr_dH[0] < -0.01 and nsr_eq[0] / nsr_dH[0] > 0.8          # nsr's loss at p=0.05: all-wrong groups
    for label in ("mean (balanced)", "asym δ=2 (success-biased)", "asym δ=0.5 (failure-biased)"):
        assert all(v == 0 for v in n[f"6b   ... of it from all-equal groups, {label}"])
        assert abs(n[f"6b E[ΔH] per step at p=(0.05, 0.2, 0.5, 0.8, 0.95, 0.99), {label}"][-1]) < 0.002


def test_exp6_simulation_findings_pinned(exp6):
    H = exp6["numbers"][f"6c entropy when the solve rate first reaches {fade.MATCH_P}"]
    psr, asym2, mean, asym05, nsr = (H[m[0]] for m in fade.METHODS)
    assert psr < mean - 0.05                        # agrees: success-only collapses entropy
    assert asym2 > mean and asym05 < mean           # disagrees: the sign of ΣA acts the other way
    assert nsr < mean
    target, delta, _ = exp6["numbers"]["6c FADE: H_target, final delta, final alpha"]
    assert exp6["numbers"]["6c final entropy (100 steps, lr 1.5)"]["fade + FADE schedule"] < 0.5 * target
    assert delta < 1.0                              # the schedule did react (amplified failures)
    assert [c["holds"] for c in exp6["claims"]] == [True, True, False, False, False, False]


def test_simulation_ordering_is_not_one_lucky_seed():
    H = {label: fade.entropy_at_solve_rate(fade.simulate(name, seed=1, **hyper), fade.MATCH_P)
         for label, name, hyper in fade.METHODS}
    psr, asym2, mean, asym05, nsr = (H[m[0]] for m in fade.METHODS)
    assert psr < min(asym05, nsr) and max(asym05, nsr) < mean < asym2


def test_psr_and_nsr_have_identical_expected_updates_exactly():
    """Module header fact 1: E[Delta z] = (a_1 - a_0) grad p for every advantage."""
    z, correct = fade.prompt_logits(0.3)
    combos, log_coef = fade.answer_groups()
    prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
    rewards = correct[combos].to(torch.float64)
    expected = {name: (prob.unsqueeze(1) * fade.group_logit_updates(
        z, combos, adv_lib.compute_advantages(name, rewards))).sum(0) for name in ("psr", "nsr", "mean")}
    assert torch.allclose(expected["psr"], expected["nsr"], atol=1e-15, rtol=0)
    pi = torch.softmax(z, 0)
    grad_p = pi * (correct.double() - 0.3)                                  # d p / d z
    assert torch.allclose(expected["psr"], grad_p, atol=1e-15, rtol=0)    # psr: a_1 - a_0 = 1
    assert torch.allclose(expected["mean"], grad_p * (fade.G - 1) / fade.G, atol=1e-15, rtol=0)


def test_simulation_update_is_the_loss_gradient():
    z, correct = fade.prompt_logits(0.4)
    combos, _ = fade.answer_groups()
    adv = adv_lib.compute_advantages("grpo", correct[combos].double())
    pi = torch.softmax(z, 0)
    closed = (adv.unsqueeze(-1) * (torch.nn.functional.one_hot(combos, fade.K_ANS).double() - pi)).mean(1)
    assert torch.allclose(fade.group_logit_updates(z, combos, adv), closed, atol=1e-15, rtol=0)
    with pytest.raises(ValueError, match="1.2"):
        fade.prompt_logits(1.2)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def test_cli_writes_pngs_and_summary(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toy", "--out", str(tmp_path), "--only", "5", "1"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "## 1. The cancellation identity" in summary and "## 5. Token flips" in summary
    assert summary.index("## 1.") < summary.index("## 5.")
    assert "does not agree" in summary                                  # exp 5's flip fractions
    assert (tmp_path / "exp1_cancellation_identity.png").exists() and (tmp_path / "exp5_flips_coupling.png").exists()
    assert "AGREES" in proc.stdout and "claims" in proc.stdout


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
