"""The toy's identities to float tolerance, its qualitative claims as inequalities."""

import os
import subprocess
import sys

import pytest
import torch

from toy import bandit as B
from toy import experiments as E

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sample_space_is_a_distribution_and_reward_ignores_templates():
    policy = B.make_policy(0)
    assert abs(float(B.response_probs(policy).detach().sum()) - 1) < 1e-12
    r = B.all_responses()
    flipped = r.clone()
    flipped[:, 0] = torch.where(r[:, 0] == B.IDX["Let"], B.IDX["let"], B.IDX["Let"])   # swap a template
    assert torch.equal(B.reward(r), B.reward(flipped))
    assert 0.1 < B.solve_rate(policy) < 0.3


def test_expected_advantage_by_reward_matches_brute_force():
    # G = 3, p = 0.3: enumerate the other two rollouts' rewards by hand for grpo
    import itertools
    import advantages as adv_lib
    p, G = 0.3, 3
    a1 = a0 = 0.0
    for others in itertools.product([0.0, 1.0], repeat=G - 1):
        w = 1.0
        for o in others:
            w *= p if o else 1 - p
        A1 = adv_lib.compute_advantages("grpo", torch.tensor([[1.0, *others]], dtype=torch.float64))[0, 0]
        A0 = adv_lib.compute_advantages("grpo", torch.tensor([[0.0, *others]], dtype=torch.float64))[0, 0]
        a1 += w * float(A1)
        a0 += w * float(A0)
    got = B.expected_advantage_by_reward("grpo", p, G)
    assert abs(got[0] - a1) < 1e-12 and abs(got[1] - a0) < 1e-12


def test_expected_update_of_templates_is_zero_and_psr_equals_nsr_in_expectation():
    policy = B.make_policy(0)
    for name in ("mean", "psr", "grpo"):
        gb, _ = B.expected_update(policy, name)
        for t in B.TEMPLATE_TOKENS:
            assert abs(float(gb[B.IDX[t]])) < 1e-15, (name, t)
    # E[grad log pi] = 0: a(r) and a(r) - 1 give the same expected update
    psr, nsr = B.expected_update(policy, "psr"), B.expected_update(policy, "nsr")
    assert torch.allclose(psr[0], nsr[0], atol=1e-15) and torch.allclose(psr[1], nsr[1], atol=1e-15)


def test_exp1_identity_and_template_zero(tmp_path):
    r = E.exp1_cancellation_identity(str(tmp_path))
    assert r["max_abs_error_vs_G_cov"] < 1e-14
    assert r["groups_with_all_templates"] > 5 and r["max_abs_template_update_in_those"] < 1e-16
    credit = r["mean_credit"]
    assert credit["3"] > 0 and credit["7"] > 0 and credit["2"] < 0   # 2 is in no correct pair
    assert (tmp_path / "exp1_cancellation_identity.png").exists()


def test_exp3_breakers_and_fixes(tmp_path):
    r = E.exp3_exchangeability(str(tmp_path))
    zero = ["token-mean, on-policy", "seq-mean-token-sum-norm (Dr. GRPO)", "seq-mean-token-mean, equal lengths",
            "GSPO + DFPO min", "GSPO + DFPO orth", "PPO 0.2/0.28, ratio 1.25 on 'Let' (inside the range)"]
    broken = ["seq-mean-token-mean, unequal lengths", "GSPO sequence ratio (raw weights)",
              "PPO 0.2/0.2, ratio 1.25 on 'Let' (A>0 clipped, A<0 not)",
              "PPO 0.2/0.28, ratio 1.35 on 'Let' (A>0 clipped, A<0 not)"]
    for k in zero:
        assert abs(r[k]) < 1e-16, k
    for k in broken:
        assert abs(r[k]) > 1e-6, k


def test_exp4_query_preserved_drifts_less_than_random(tmp_path):
    r = E.exp4_minibatching(str(tmp_path), seeds=range(4))
    assert r["query"]["mean"] < r["random"]["mean"]
    assert r["query_balanced"]["mean"] < r["random"]["mean"]


def test_exp5_coupling_closed_form_and_ordering(tmp_path):
    r = E.exp5_flips_and_coupling(str(tmp_path))
    assert r["coupling_max_error_closed_vs_autograd"] < 1e-14
    assert r["coupling_identical_low_conf"] > r["coupling_different_tokens"]
    assert r["coupling_identical_low_conf"] > r["coupling_identical_high_conf"]
    # negative rollouts contain boosted tokens too (the ones they share with successes)
    assert r["boost_neg"] > 0.1 and r["boost_pos"] > 0.1


def test_exp2_and_exp6_run_and_report_finite_numbers(tmp_path):
    r2 = E.exp2_where_updates_go(str(tmp_path))
    assert all(0 < v["template_share"] < 0.5 for v in r2.values())
    r6 = E.exp6_sign_and_difficulty(str(tmp_path))
    assert 0 < r6["fade_H_target"] < r6["psr (success only)"]["H0"]
    assert all(r6[k]["p_final"] > 0.9 for k in r6 if isinstance(r6[k], dict))


def test_cli_writes_summary_and_rejects_bad_experiment(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toy", "--out", str(tmp_path), "--only", "1", "3"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "cancellation identity" in (tmp_path / "summary.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "toy", "--only", "9"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown experiment 9" in proc.stderr
