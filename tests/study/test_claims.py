"""experiments/exact_tests.py and claims.py: the exact tests against brute-force enumeration, Holm's
correction, the effect detectable at 80% power against its closed form and an independent simulation,
the verdicts on planted paired effects and planted nulls, the checks, and a sweep end to
end on a tiny model with a planted difference (detected) and a planted null (not)."""

import itertools
import json
import math
import os
import statistics

import numpy as np
import pytest

from experiments import claims, designs, designs_pretrained, exact_tests, held_fixed, pages, quantities, registry, sweep
from experiments.claims import Check, Claim

from tests.engine.helpers import popen_train_in_this_process


def brute(d, keep):
    """Share of the 2^n sign patterns eps with keep(sum eps d), enumerated with itertools."""
    d = np.asarray(d, float)
    return np.mean([keep(np.dot(eps, d)) for eps in itertools.product((1.0, -1.0), repeat=len(d))])


# --- the exact tests ---------------------------------------------------------------------

def test_sign_flip_p_exact_values_and_brute_force():
    assert exact_tests.sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32          # five pairs can never reach 0.05
    assert exact_tests.sign_flip_p(list(range(1, 11))) == 2 / 1024     # the design's floor: 10 pairs
    assert exact_tests.sign_flip_p([1, -1]) == 1.0 and exact_tests.sign_flip_p([0.3, 1.3]) == 0.5
    assert exact_tests.sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    rng = np.random.default_rng(0)
    for _ in range(5):
        d = rng.normal(0.3, 1, 9)
        assert exact_tests.sign_flip_p(d) == pytest.approx(brute(d, lambda s: abs(s) >= abs(d.sum()) - 1e-12))
        assert exact_tests.sign_flip_p_greater(d) == pytest.approx(brute(d, lambda s: s >= d.sum() - 1e-12))
    # more pairs than count_at_least lists (LIST_ALL): the meet-in-the-middle count, against a listing
    d = rng.normal(0.5, 1, 17)
    half = np.mean([abs(np.dot(1 - 2 * ((i >> np.arange(17)) & 1), d)) >= abs(d.sum()) - 1e-9
                    for i in range(0, 2 ** 17, 2)])              # the patterns with d_0 positive: |sum| is
    assert exact_tests.sign_flip_p(d) == pytest.approx(half)          # the same for a pattern and its mirror


@pytest.mark.parametrize("list_all", [0, 64])
def test_count_at_least_equals_a_listing_of_every_pattern_on_both_of_its_paths(monkeypatch, list_all):
    """count_at_least meets in the middle above LIST_ALL pairs and lists all 2^n sums up to it;
    both must give the listing's count, on ties too (integer d: sums land exactly on the threshold)."""
    monkeypatch.setattr(exact_tests, "LIST_ALL", list_all)
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = 1 + trial % 11
        d = rng.integers(-3, 4, n).astype(float) if trial % 2 else rng.normal(size=n)
        exact = trial % 2 == 1                     # integer sums are exact: thresholds ON a pattern's sum
        for t in (d.sum(), 0.0, 1.0, -d.sum(), np.abs(d).sum(), np.abs(d).sum() + 1):
            t = t if exact else t - 1e-9 * np.abs(d).sum()     # floats: off by the tests' tolerance
            expected = 2 ** n * brute(d, lambda s: s >= t)
            assert exact_tests.count_at_least(d[None], t)[0] == round(expected), (d, t)
    monkeypatch.setattr(exact_tests, "CHUNK", 4)                        # several rows, one threshold each,
    rows = rng.normal(size=(5, 7))                                      # a block of rows at a time
    t = rows.sum(1) - 1e-9
    assert list(exact_tests.count_at_least(rows, t)) == [round(2 ** 7 * brute(r, lambda s: s >= x)) for r, x in zip(rows, t)]


def test_tost_p_is_the_larger_one_sided_p():
    d = np.array([0.1, -0.1, 0.05, 0.0, 0.02])
    assert exact_tests.tost_p(d, 1.0) == 1 / 32                        # far inside the margin: the floor of 5 pairs
    assert exact_tests.tost_p(d, 0.01) > 0.4                           # the margin is smaller than the spread
    rng = np.random.default_rng(1)
    d = rng.normal(0.2, 0.3, 8)
    lower = brute(d + 0.5, lambda s: s >= (d + 0.5).sum() - 1e-12)
    upper = brute(0.5 - d, lambda s: s >= (0.5 - d).sum() - 1e-12)
    assert exact_tests.tost_p(d, 0.5) == pytest.approx(max(lower, upper))


def test_within_block_sd_and_paired_swap_p_by_enumeration():
    assert exact_tests.within_block_sd([1, 3, 10, 14], [0, 0, 1, 1]) == pytest.approx(math.sqrt(5))
    assert math.isnan(exact_tests.within_block_sd([1, 2], [0, 1]))     # no degree of freedom left
    rng = np.random.default_rng(2)
    blocks = [0] * 4 + [1] * 4
    x, y = rng.normal(0, 2, 8), rng.normal(0, 1, 8)
    observed = exact_tests.within_block_sd(x, blocks) - exact_tests.within_block_sd(y, blocks)
    count = 0
    for swap in itertools.product((False, True), repeat=8):
        a, b = np.where(swap, y, x), np.where(swap, x, y)
        count += abs(exact_tests.within_block_sd(a, blocks) - exact_tests.within_block_sd(b, blocks)) >= abs(observed) - 1e-9
    assert exact_tests.paired_swap_p(x, y, blocks) == pytest.approx(count / 256)


def test_holm_known_vectors():
    assert exact_tests.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert exact_tests.holm([0.02]) == [0.02]
    assert exact_tests.holm([0.5, 0.001, 0.2, 0.01]) == pytest.approx([0.5, 0.004, 0.4, 0.03])
    assert exact_tests.holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])                # capped running max


# --- the effect detectable at 80% power --------------------------------------------------

def simulated_power(r, n, level, draws=4000, seed=12345):
    """An independent simulation: fresh normal draws shifted by r, the exact test on each one."""
    z = np.random.default_rng(seed).standard_normal((draws, n)) + r
    return np.mean([exact_tests.sign_flip_p(d) < level and d.sum() > 0 for d in z])


def test_power_ratio_closed_form_where_only_the_all_positive_pattern_is_significant():
    # 10 pairs at a level in [2/1024, 4/1024): significant iff all 10 differences are positive,
    # so power = Phi(r)^10 and r = Phi^-1(0.8^(1/10)) = 2.013
    r = exact_tests.power_ratio(10, 0.003)
    assert r == pytest.approx(statistics.NormalDist().inv_cdf(0.8 ** 0.1), rel=0.03)
    assert exact_tests.power_ratio(5, 0.05) == math.inf                # floor 2/32 = 0.0625: never significant
    assert exact_tests.power_ratio(10, 0.0019) == math.inf              # below the floor 2/1024


@pytest.mark.parametrize("n, level", [(10, 0.01), (12, 0.05 / 6)])
@pytest.mark.slow
def test_power_ratio_matches_an_independent_simulation_within_10_percent(n, level):
    r = exact_tests.power_ratio(n, level)
    assert simulated_power(0.9 * r, n, level) < exact_tests.POWER < simulated_power(1.1 * r, n, level)


# --- verdicts ----------------------------------------------------------------------------

KEYS = [(w, s) for w in (0, 1) for s in range(5)]                  # 2 warm-up seeds x 5 RL seeds


def design_values(shift, rng, spread=0.01, block=0.3):
    """Two arms on 10 paired runs: a large shared effect of the pair (start, prompts,
    held-out set) plus small noise; the arm adds `shift`."""
    shared = {k: block * rng.normal() for k in KEYS}
    ref = {k: 0.5 + shared[k] + spread * rng.normal() for k in KEYS}
    arm = {k: 0.5 + shared[k] + shift + spread * rng.normal() for k in KEYS}
    return arm, ref


def test_a_planted_paired_effect_is_detected_and_a_planted_null_is_not():
    rng = np.random.default_rng(3)
    arm, ref = design_values(0.02, rng)                            # effect 0.02, pair effects ~0.3
    null_arm, null_ref = design_values(0.0, rng)
    values = {("x", "a"): arm, ("x", "b"): ref, ("y", "a"): null_arm, ("y", "b"): null_ref}
    rows = claims.judge([Claim("P", "a above b", "q", "x", "a", "b", +1),
                         Claim("P", "null", "q", "y", "a", "b", +1)], values, {})
    found, null = rows
    assert found["verdict"] == "agrees" and found["p"] == 2 / 1024 and found["n"] == 10
    assert found["p_holm"] == pytest.approx(4 / 1024)
    d = np.array([arm[k] - ref[k] for k in KEYS])
    assert found["effect"] == pytest.approx(d.mean()) and found["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(10))
    # unpaired, the pairs' own spread (0.3) would hide the 0.02: the pairing is what finds it
    assert np.std([arm[k] for k in KEYS]) > 10 * found["effect"]
    assert null["verdict"] == "no difference detected" and null["p"] > 0.05
    dn = np.array([null_arm[k] - null_ref[k] for k in KEYS])
    power80 = exact_tests.power_ratio(10, 0.05 / 2) * dn.std(ddof=1)
    assert null["power80"] == pytest.approx(power80) and f"80%-power effect {claims._fmt(power80)}" in null["detail"]


def test_opposite_margin_equivalence_spread_and_not_testable():
    rng = np.random.default_rng(4)
    values = {}
    values["down", "a"], values["down", "b"] = design_values(-0.05, rng)
    values["share", "a"] = {k: 0.05 + 0.002 * rng.normal() for k in KEYS}           # a share of ~5%
    values["ratio", "a"] = {k: 0.1 + 0.05 * rng.normal() for k in KEYS}             # log ratio near 0
    values["far", "a"] = {k: 1.5 + 0.05 * rng.normal() for k in KEYS}               # a factor e^1.5 apart
    values["final", "wide"] = {k: 0.5 + (0.2 if k[1] % 2 else -0.2) + 0.01 * rng.normal() for k in KEYS}
    values["final", "tight"] = {k: 0.5 + 0.01 * rng.normal() for k in KEYS}
    cl = [Claim("P", "a above b", "q", "down", "a", "b", +1),
          Claim("P", "share above 1%", "q", "share", "a", None, +1, margin=0.01),
          Claim("P", "share above 10%", "q", "share", "a", None, +1, margin=0.10),
          Claim("P", "similar", "q", "ratio", "a", None, 0, margin=math.log(2)),
          Claim("P", "not similar", "q", "far", "a", None, 0, margin=math.log(2)),
          Claim("P", "tight spreads less", "q", "final", "tight", "wide", -1, statistic="spread"),
          Claim("P", "checked", "q", "down", "a", "b", +1, testable=lambda series: "delta stayed in [0.98, 1.00]"),
          Claim("P", "missing", "q", "nothing", "a", "b", +1)]
    rows = {r["claim"].text: r for r in claims.judge(cl, values, {})}
    assert rows["a above b"]["verdict"] == "opposite"
    assert rows["share above 1%"]["verdict"] == "agrees" and rows["share above 1%"]["p"] == 2 / 1024
    assert rows["share above 10%"]["verdict"] == "opposite"          # significantly short of the margin
    assert rows["similar"]["verdict"] == "agrees" and rows["similar"]["p"] == 1 / 1024 == rows["similar"]["floor"]
    assert rows["not similar"]["verdict"] == "no equivalence shown"
    spread = rows["tight spreads less"]
    assert spread["verdict"] == "agrees" and spread["effect"] < -0.15 and spread["p"] == 2 / 1024
    assert rows["checked"]["verdict"] == "not testable" and rows["checked"]["detail"] == "delta stayed in [0.98, 1.00]"
    assert rows["missing"]["verdict"] == "not testable" and "fewer than 2 pairs" in rows["missing"]["detail"]
    # the family is the 8 claims declared, the two not testable included (each with p = 1)
    assert all(r["family"] == 8 for r in rows.values())
    assert rows["similar"]["p_holm"] == pytest.approx(8 / 1024)
    table = claims.verdict_table(list(rows.values()))
    assert "0.0010, floor" in table and "TOST ±0.693 (runs)" in table and '"q"' in table


def test_every_row_best_reference_and_note():
    rng = np.random.default_rng(5)
    values = {}
    for row, shift in (("k1", 0.03), ("k2", 0.03), ("k3", 0.0)):
        values[row, "f"], values[row, "good"] = design_values(shift, rng)
        values[row, "bad"] = {k: v - 0.2 for k, v in values[row, "good"].items()}
    values["peak", "good"], values["peak", "bad"] = {k: 0.8 for k in KEYS}, {k: 0.6 for k in KEYS}
    every = Claim("P", "every k", "q", ("k1", "k2", "k3"), "f", ("bad", "good"), +1, best_by="peak",
                  note=lambda series: "delta over [0.50, 1.00]")
    two = Claim("P", "two k", "q", ("k1", "k2"), "f", ("bad", "good"), +1, best_by="peak")
    r_every, r_two = claims.judge([every, two], values, {})
    assert r_every["reference"] == r_two["reference"] == "good"          # the best by peak, not the tested row
    assert r_two["verdict"] == "agrees" and r_two["p"] == 2 / 1024        # every row significant: the largest p
    assert r_every["verdict"] == "no difference detected"                 # k3 has no effect: the claim fails
    assert r_every["effect"] == pytest.approx(np.mean([values["k3", "f"][k] - values["k3", "good"][k] for k in KEYS]))
    assert r_every["detail"].endswith("delta over [0.50, 1.00]")


def test_interaction_is_the_difference_of_two_paired_gaps_and_families_take_holm_apart():
    rng = np.random.default_rng(6)
    shared = {k: rng.normal() for k in KEYS}                  # each pair's own start: cancels in every gap
    values = {("x", "q_hi"): {k: shared[k] + 0.10 + 0.01 * rng.normal() for k in KEYS},
              ("x", "r_hi"): {k: shared[k] for k in KEYS},
              ("x", "q_lo"): {k: shared[k] + 0.02 + 0.01 * rng.normal() for k in KEYS},
              ("x", "r_lo"): {k: shared[k] for k in KEYS}}
    interaction = Claim("P", "gap grows", "q", "x", "q_hi", "r_hi", +1, minus=("q_lo", "r_lo"), family="primary")
    gap_hi = Claim("P", "hi", "q", "x", "q_hi", "r_hi", +1, family="secondary")
    gap_lo = Claim("P", "lo", "q", "x", "q_lo", "r_lo", +1, family="secondary")
    r_int, r_hi, r_lo = claims.judge([interaction, gap_hi, gap_lo], values, {})
    d = np.array([(values["x", "q_hi"][k] - values["x", "r_hi"][k]) - (values["x", "q_lo"][k] - values["x", "r_lo"][k])
                  for k in KEYS])
    assert r_int["effect"] == pytest.approx(d.mean()) and r_int["effect"] == pytest.approx(0.08, abs=0.02)
    assert r_int["p"] == exact_tests.sign_flip_p(d) == 2 / 1024 and r_int["verdict"] == "agrees"
    assert r_int["family"] == 1 and r_int["p_holm"] == r_int["p"]       # alone in its family: no Holm factor
    assert r_hi["family"] == r_lo["family"] == 2 and r_hi["p_holm"] == pytest.approx(2 * r_hi["p"])
    assert interaction.arms == ("q_hi", "r_hi", "q_lo", "r_lo")
    table = claims.verdict_table([r_int, r_hi])
    assert "(q_hi - r_hi) - (q_lo - r_lo)" in table and "sign-flip (pairs), interaction" in table
    assert "| (primary) gap grows [x]" in table
    # a pair missing one of the four runs drops out of the interaction
    del values["x", "r_lo"][KEYS[0]]
    assert claims.judge([interaction], values, {})[0]["n"] == 9


def test_start_and_collapse_flag_read_the_start_evaluation():
    from experiments import quantities as Q
    series = pages.with_start({"eval/pass@1": (np.array([10, 20]), np.array([0.6, 0.2]))},
                              {"start": {"eval": {"eval/pass@1": 0.51, "eval/pass@2": 0.7}}})
    assert Q.at_start("eval/pass@1")(series) == 0.51 and Q.collapsed()(series) == 1.0      # 0.2 < 0.255
    series["eval/pass@1"] = (np.array([10, 20]), np.array([0.6, 0.3]))
    assert Q.collapsed()(series) == 0.0
    assert math.isnan(Q.collapsed()(pages.with_start({"eval/pass@1": (np.array([10]), np.array([0.1]))},
                                                     {"start": None})))                  # no start: no flag
    assert Q.peak_of("eval/pass@1")(series) == 0.6          # the start is no point of the curve the other rows read


def test_not_lower_is_one_sided_with_its_margin_and_every_verdict_has_a_power_statement():
    rng = np.random.default_rng(7)
    values = {}
    values["peak", "f"], values["peak", "m"] = design_values(-0.005, rng)       # a little lower, within 0.02
    values["peak", "bad"] = {k: v - 0.1 for k, v in values["peak", "m"].items()}   # far lower
    close = Claim("P", "close", "q", "peak", "f", "m", +1, margin=0.02, statistic="not_lower")
    far = Claim("P", "far", "q", "peak", "bad", "m", +1, margin=0.02, statistic="not_lower")
    r_close, r_far = claims.judge([close, far], values, {})
    d = np.array([values["peak", "f"][k] - values["peak", "m"][k] for k in KEYS])
    assert r_close["p"] == exact_tests.sign_flip_p_greater(d + 0.02) < 0.025 and r_close["verdict"] == "agrees"
    assert r_close["floor"] == 1 / 1024
    assert r_far["verdict"] == "no non-inferiority shown" and r_far["p"] == 1.0
    r1 = exact_tests.power_ratio(10, 0.05 / 2, sided="greater")
    assert r_close["power80"] == pytest.approx(r1 * d.std(ddof=1) - 0.02)
    assert "shown 4 times in 5 if the true difference is" in r_close["detail"]
    assert "sign-flip one-sided, not lower by 0.02 (pairs)" in claims.verdict_table([r_close])
    # agrees, opposite, equivalence and spread verdicts say their power too
    rows = {r["claim"].text: r for r in claims.judge(
        [Claim("P", "eq", "q", "peak", "f", None, 0, margin=5.0),
         Claim("P", "spread", "q", "peak", "f", "m", -1, statistic="spread")], values, {})}
    assert "80%-power margin" in rows["eq"]["detail"] and math.isfinite(rows["eq"]["power80"])
    assert "80%-power effect" in rows["spread"]["detail"] and "x the reference's" in rows["spread"]["detail"]


def test_one_sided_tost_and_spread_power_against_direct_simulation():
    # one-sided at a level in [1/1024, 2/1024): significant iff all 10 are positive: r = Phi^-1(0.8^(1/10))
    assert exact_tests.power_ratio(10, 0.0015, sided="greater") == pytest.approx(
        statistics.NormalDist().inv_cdf(0.8 ** 0.1), rel=0.03)
    r0 = exact_tests.tost_ratio(10, 0.05)
    z = np.random.default_rng(11).standard_normal((400, 10))
    shown = np.mean([exact_tests.tost_p(row, r0) < 0.05 for row in z])
    assert shown == pytest.approx(0.8, abs=0.06)            # an independent simulation at the found margin
    assert exact_tests.tost_ratio(10, 0.0009) == math.inf        # below TOST's floor 1/1024
    blocks = (0,) * 5 + (5,) * 5
    c = exact_tests.spread_ratio(blocks, 0.05, -1)
    assert 0 < c < 1
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(600):
        shared = np.repeat(rng.standard_normal(2), 5)
        x, y = shared + c * rng.standard_normal(10), shared + rng.standard_normal(10)
        hits += exact_tests.paired_swap_p(x, y, list(blocks)) < 0.05 and \
            exact_tests.within_block_sd(x, list(blocks)) < exact_tests.within_block_sd(y, list(blocks))
    assert hits / 600 == pytest.approx(0.8, abs=0.06)


def test_preconditions_read_met_or_not_met_and_stay_apart_from_identities():
    values = {("clip", "a"): {(0, 0): 0.0, (0, 1): 7e-4}, ("clip", "b"): {(0, 0): 0.0}}
    checks = [Check("never clipped", "clip", ("a",), "zero", kind="precondition"),
              Check("never clipped", "clip", ("b",), "zero", kind="precondition")]
    assert [r["result"] for r in claims.run_checks(checks, values)] == ["NOT MET", "met"]


def test_smoothed_peak_and_its_censoring():
    from experiments import quantities as Q
    steps = np.array([25, 50, 75, 100])
    assert Q.smoothed([0.2, 0.5, 0.2, 0.8]).tolist() == pytest.approx([0.35, 0.3, 0.5, 0.5])
    climbing = {"eval/pass@1": (steps, np.array([0.2, 0.3, 0.4, 0.5]))}
    assert Q.smoothed_peak_step("eval/pass@1")(climbing) == 125.0 and Q.censored("eval/pass@1")(climbing) == 1.0
    peaked = {"eval/pass@1": (np.array([25, 50, 75, 100, 125]), np.array([0.2, 0.6, 0.6, 0.2, 0.1]))}
    assert Q.smoothed_peak_step("eval/pass@1")(peaked) == 50.0 and Q.censored("eval/pass@1")(peaked) == 0.0
    assert Q.smoothed_peak("eval/pass@1")(peaked) == pytest.approx((0.2 + 0.6 + 0.6) / 3)
    # a raw argmax would pick the one noisy point: the smoothed curve does not
    spike = {"eval/pass@1": (steps, np.array([0.5, 0.9, 0.5, 0.5]))}
    assert Q.peak_step_of("eval/pass@1")(spike) == 50.0
    assert Q.smoothed_peak_step("eval/pass@1")(spike) in (25.0, 50.0, 75.0)


def test_checks_pass_fail_and_not_measured():
    values = {("res", "q"): {(0, 0): 3e-8, (0, 1): -2e-8}, ("res", "r"): {(0, 0): 0.7, (0, 1): 0.8},
              ("a", "p"): {(0, 0): 2.0}, ("b", "p"): {(0, 0): 2.0}, ("d", "f"): {(0, 0): 0.29}}
    checks = [Check("zero", "res", ("q",), "zero", tol=1e-6), Check("not zero", "res", ("q",), "zero", tol=1e-9),
              Check("positive", "res", ("r",), "positive", tol=1e-3), Check("equals", ("a", "b"), ("p",), "equals", 2.0),
              Check("within", "d", ("f",), "within", (0.3, 1.0)), Check("missing", "res", ("nobody",), "zero")]
    results = [r["result"] for r in claims.run_checks(checks, values)]
    assert results == ["pass", "FAIL", "pass", "pass", "FAIL", "not measured"]
    table = claims.check_table(claims.run_checks(checks, values))
    assert "| zero | res | q | 2 | -2.00e-08 to 3.00e-08 | 0 (|x| <= 1.00e-06) | **pass** |" in table


# --- the declared sweeps -----------------------------------------------------------------

def test_every_sweep_declares_rows_arms_quotes_and_a_design_that_can_survive_holm():
    assert len(designs.WARMUP_SEEDS) >= 2 and len(designs.SEEDS) >= 5 and len(designs.PRETRAINED_SEEDS) >= 6
    declared = [(task, make(task)) for task in designs.TASKS for name, make in registry.SWEEPS.items()
                if designs.runs_on(task, name)]
    declared.append(("smollm2", designs_pretrained.batching("smollm2")))   # declared before its lr is set
    for task, s in declared:
        name = s.name
        pairs = len(s.warmup_seeds) * len(s.seeds)
        labels = {label for label, _, _ in s.rows}
        assert len({c.text for c in s.claims}) == len(s.claims), (task, name)     # the README matches by text
        for c in s.claims:
            assert set(c.rows) <= labels, (name, c.text)
            assert set(c.arms) <= set(s.arms) and c.arm in c.arms, (name, c.text)    # arms: the references too
            assert c.direction in (-1, 0, 1) and (c.direction != 0 or c.margin > 0)
            assert (c.quote[0].isupper() or c.quote[0] == "(") and c.quote[-1] in ".;", c.quote
            assert not isinstance(c.reference, tuple) or c.best_by in labels
            assert c.sided in ("one", "two") and (c.sided == "two" or c.direction != 0), (name, c.text)
            preconditions = {k.text for k in s.checks if k.kind == "precondition"} | {h.text for h in s.held}
            assert set(c.needs) <= preconditions, (name, c.text)        # a need names a declared check
            # a claim that may name one cause in prose holds the rest fixed by a measured check
            assert not c.isolates or any(n in {h.text for h in s.held} for n in c.needs), (name, c.text)
        for h in s.held:
            assert {h.arm, h.reference} <= set(s.arms), (name, h.text)
        for c in s.checks:
            assert set(c.rows) <= labels and set(c.arms) <= set(s.arms), (name, c.text)
        # Holm runs per declared family, its size the claims declared in it: the smallest p
        # a claim's test can give (one-sided, TOST, not-lower: 1/2^n; two-sided 2/2^n)
        # times that size must be below ALPHA, or the family could never find anything
        family_of = (lambda c: "") if s.holm == "sweep" else (lambda c: c.family)     # the primary reading
        for family in {family_of(c) for c in s.claims}:
            members = [c for c in s.claims if family_of(c) == family]
            floor = max(1 if c.direction == 0 or c.sided == "one" or c.statistic == "not_lower" else 2
                        for c in members) / 2 ** pairs
            assert floor * len(members) < claims.ALPHA, (task, name, family)
    # FADE's pass@k at every k needs 16 samples per held-out prompt on every task that runs it
    assert all(designs.settings(t, "fade")["eval_samples"] == 16 for t in designs.TASKS if designs.runs_on(t, "fade"))
    # the negative control: two two-sided claims in one family of 6 pairs cannot survive Holm
    assert 2 * (2 / 2 ** 6) >= claims.ALPHA


def test_the_budget_is_the_cost_models_each_part_a_sitting_and_no_copy_of_it_is_kept():
    # `plan` prints the budget from TASKS as it stands: one line per declared (sweep, task).
    # The header says where it is and keeps no copy (a pasted table went stale silently).
    table = registry.budget_table().splitlines()
    declared = [(name, task) for task in designs.TASKS for name in registry.SWEEPS if designs.runs_on(task, name)]
    assert [tuple(line.split()[:2]) for line in table[1:]] == declared and len(declared) >= 20
    assert "python -m experiments.sweep plan" in designs.__doc__ and table[0].strip() not in designs.__doc__
    for task in designs.TASKS:
        for name in registry.SWEEPS:
            if not designs.runs_on(task, name):
                continue
            s, spec = designs.settings(task, name), registry.SWEEPS[name](task)
            runs = len(spec.arms) * len(spec.warmup_seeds) * len(spec.seeds)
            assert runs * designs.estimate_minutes(task, name) / 2 / s["parts"] <= 90, (task, name)


# --- end to end: a planted difference is found, a planted null is not --------------------

def planted(task):
    """Three arms of an untrained model: 'long' samples 16 tokens where 'short' samples 8
    (an untrained model almost never stops early: a planted difference in response length);
    'short_mb' is 'short' with another micro-batch size, which changes nothing but float
    rounding (a planted null)."""
    return designs.Sweep(
        name="planted", claim="a planted difference and a planted null",
        flags=["--eval_every", "0"],
        arms={"short": ["--max_new_tokens", "8"], "long": ["--max_new_tokens", "16"],
              "short_mb": ["--max_new_tokens", "8", "--micro_batch", "3"]},
        rows=[("length", quantities.mean_of("resp_len_mean"), "mean response length"),
              ("entropy", quantities.mean_of("entropy"), "mean entropy")],
        curves=[("resp_len_mean", "length")],
        claims=[Claim("test", "longer budget, longer responses", "q", "length", "long", "short", +1),
                Claim("test", "micro-batch size changes the entropy", "q", "entropy", "short_mb", "short", +1)],
        checks=[Check("an untrained model fills its budget", "length", ("short", "short_mb"), "equals", 8.0,
                      tol=0.5)])


@pytest.mark.slow
def test_sweep_end_to_end_detects_the_planted_difference_and_not_the_null(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sweep.SWEEPS, "planted", planted)
    monkeypatch.setitem(sweep.TASKS["addition"]["sweeps"], "planted", dict(designs.settings("addition", "credit")))
    monkeypatch.setattr(sweep.subprocess, "Popen", popen_train_in_this_process(sweep.subprocess.Popen))  # 21 runs
    sweep.main(["planted", "--task", "addition", "--warmup_seeds", "0", "--seeds", "0,1,2,3,4,5,6", "--steps", "2",
                "--jobs", "1", "--out", str(tmp_path), "--", "--model", tiny_dir, "--digits", "1",
                "--prompts_per_step", "4", "--group_size", "4", "--flip_every", "0", "--save_every", "0",
                "--eval_every", "0"])
    root = tmp_path / "addition" / "planted"
    verdicts = {v["claim"]: v for v in json.load(open(root / "verdicts.json"))}
    found = verdicts["longer budget, longer responses"]
    assert found["verdict"] == "agrees" and found["p"] == 2 / 128 and found["p_holm"] == pytest.approx(4 / 128)
    assert found["n"] == 7 and found["family"] == 2
    null = verdicts["micro-batch size changes the entropy"]
    assert null["verdict"] == "no difference detected" and null["p"] > 0.5 and "80%-power effect" in null["detail"]
    text = (root / "summary.md").read_text()
    assert "**agrees**" in text and "| an untrained model fills its budget | length | short, short_mb | 14 |" in text
    assert "![curves](curves.png)" in text and os.path.isfile(root / "curves.png")
    # `report` writes the docs page, the committed data and the README's tables from the runs
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- claims:begin -->\nold table\n<!-- claims:end -->\nrest\n")
    written = pages.report(str(tmp_path), str(tmp_path / "docs"), str(readme), str(tmp_path / "results.md"))
    assert {os.path.basename(p) for p in written} >= {"sweep_addition_planted.md", "sweep_addition_planted.png",
                                                     "sweep_addition_planted.jsonl.gz", "claims.md", "README.md"}
    page = (tmp_path / "docs" / "sweep_addition_planted.md").read_text()
    assert "![curves](sweep_addition_planted.png)" in page
    assert "- Command: `python -m experiments.sweep planted --task addition`; this page:" in page
    text = readme.read_text()
    assert text.startswith("intro\n<!-- claims:begin -->") and text.endswith("<!-- claims:end -->\nrest\n")
    # the plan is 3 arms x 2 warm-up seeds x 5 RL seeds: warm-up seed 0 alone is not the declared test
    every_sweep, every_claim = (tmp_path / "docs" / "claims.md").read_text().split("## Every claim")
    addition, countdown = 3 + list(designs.TASKS).index("addition"), 3 + list(designs.TASKS).index("countdown")
    summary = next(line for line in every_sweep.splitlines() if line.startswith("| planted |"))  # one line per sweep
    assert summary.split("|")[addition].strip().startswith("[15 of 30 runs](sweep_addition_planted.md); checks: ")
    assert summary.split("|")[countdown].strip() == "-"          # not declared on countdown
    row = next(line for line in every_claim.splitlines() if "longer budget, longer responses" in line)  # one per claim
    assert row.split("|")[addition].strip() == "[15 of 30 runs](sweep_addition_planted.md)"
    assert row.split("|")[countdown].strip() == "-"
    # the README counts only fully run sweeps: this one is pending on addition
    assert next(line for line in text.splitlines() if line.startswith("| addition: ")).split("|")[2].strip() \
        .endswith("pending)")


# --- declared families, one-sided tests, preconditions, pairs across CPUs ---------------

def test_holm_family_size_is_declared_not_found_in_the_data():
    # The same significant claim beside a claim that turns out not testable: its Holm p is
    # doubled all the same, because its family was declared with two members. Negative
    # control: declared alone (a family of its own), it keeps its raw p.
    rng = np.random.default_rng(6)
    values = {}
    values["x", "a"], values["x", "b"] = design_values(0.05, rng)
    sig = Claim("P", "a above b", "q", "x", "a", "b", +1)
    dropped = Claim("P", "untestable", "q", "x", "a", "b", +1, testable=lambda series: "no run collapsed")
    together = claims.judge([sig, dropped], values, {})
    assert together[1]["verdict"] == "not testable" and together[0]["family"] == 2
    assert together[0]["p_holm"] == pytest.approx(2 * together[0]["p"])
    apart = claims.judge([sig, Claim("P", "untestable", "q", "x", "a", "b", +1, family="other",
                                     testable=lambda series: "no run collapsed")], values, {})
    assert apart[0]["family"] == 1 and apart[0]["p_holm"] == apart[0]["p"]


def test_one_sided_claims_have_half_the_floor_and_name_an_effect_of_the_other_sign():
    six = [(0, s) for s in range(6)]
    up = {("x", "a"): {k: 1.0 + 0.1 * i for i, k in enumerate(six)}, ("x", "b"): {k: 0.0 for k in six}}
    two = claims.judge([Claim("P", "up", "q", "x", "a", "b", +1)], up, {})[0]
    one = claims.judge([Claim("P", "up", "q", "x", "a", "b", +1, sided="one")], up, {})[0]
    assert two["p"] == two["floor"] == 2 / 64 and one["p"] == one["floor"] == 1 / 64
    assert one["verdict"] == two["verdict"] == "agrees"
    # three one-sided claims in one family still reach 0.05 with 6 pairs; two two-sided ones cannot
    fam_one = claims.judge([Claim("P", f"up {i}", "q", "x", "a", "b", +1, sided="one") for i in range(3)], up, {})
    assert all(r["verdict"] == "agrees" and r["p_holm"] == pytest.approx(3 / 64) for r in fam_one)
    fam_two = claims.judge([Claim("P", f"up {i}", "q", "x", "a", "b", +1) for i in range(2)], up, {})
    assert all(r["verdict"] == "no difference detected" for r in fam_two)
    # the other sign: a one-sided test does not call it, and says so
    down = claims.judge([Claim("P", "down", "q", "x", "a", "b", -1, sided="one")], up, {})[0]
    assert down["verdict"] == "no difference detected" and down["p"] == 1.0
    assert "the effect has the other sign" in down["detail"]
    assert claims.test_name(Claim("P", "up", "q", "x", "a", "b", +1, sided="one")) == "sign-flip one-sided (pairs)"


def test_a_claim_whose_precondition_is_not_met_is_not_testable():
    rng = np.random.default_rng(7)
    values = {}
    values["x", "a"], values["x", "b"] = design_values(0.05, rng)
    values["clip", "a"] = {k: 0.0 for k in KEYS}
    values["clip", "b"] = {k: (0.02 if k == KEYS[0] else 0.0) for k in KEYS}     # one run reached the clip
    pre = claims.Check("the clip is never reached", "clip", ("a", "b"), "zero", kind="precondition")
    needing = Claim("P", "needs it", "q", "x", "a", "b", +1, needs=(pre.text,))
    free = Claim("P", "does not", "q", "x", "a", "b", +1)
    checks = claims.run_checks([pre], values)
    assert checks[0]["result"] == "NOT MET"
    rows = claims.judge([needing, free], values, {}, checks)
    assert rows[0]["verdict"] == "not testable" and rows[0]["detail"] == "precondition NOT MET: the clip is never reached"
    assert rows[1]["verdict"] == "agrees"
    # negative control: met, the same claim is judged
    met = claims.run_checks([pre], {**values, ("clip", "b"): {k: 0.0 for k in KEYS}})
    assert met[0]["result"] == "met" and claims.judge([needing], values, {}, met)[0]["verdict"] == "agrees"
    # never measured is not met either
    assert claims.judge([needing], values, {}, [])[0]["detail"] == "precondition not measured: the clip is never reached"


def test_pairs_whose_runs_ran_on_different_cpus_are_left_out():
    rng = np.random.default_rng(8)
    values = {}
    values["x", "a"], values["x", "b"] = design_values(0.05, rng)
    cpus = {(arm, k): "AMD EPYC" for arm in ("a", "b") for k in KEYS}
    cpus["b", KEYS[0]] = cpus["b", KEYS[1]] = "Intel(R) Xeon(R) Processor"
    claim = Claim("P", "a above b", "q", "x", "a", "b", +1)
    rec = claims.judge([claim], values, {}, cpus=cpus)[0]
    assert rec["n"] == 8 and "2 pairs left out: their runs ran on different CPUs" in rec["detail"]
    assert claims.judge([claim], values, {})[0]["n"] == 10          # no CPUs recorded: every pair
    every_b_intel = {(arm, k): ("Intel" if arm == "b" else "AMD") for arm in ("a", "b") for k in KEYS}
    none = claims.judge([claim], values, {}, cpus=every_b_intel)[0]
    assert none["verdict"] == "not testable" and "fewer than 2 pairs" in none["detail"] and "10 pairs left out" in none["detail"]


# --- held fixed: what a control holds, measured on every step -----------------------------

def held_runs(control_rollouts=(40.0, 30.0), reference_rollouts=(40.0, 30.0), entropy=(0.5, 0.5)):
    """Two pairs of runs, 2 steps each: a control ("c") whose runs log mb/<q> and, for the
    reference's rule on the same batch, held/r_mode/<q>; and the reference ("r")."""
    steps = np.array([1, 2])
    runs = {}
    for key in KEYS[:2]:
        own = {q: np.array(control_rollouts) * (2 if q == "adv_abs_sum_trained" else 1)
               for q in ("rollouts_trained", "prompts_trained", "adv_abs_sum_trained")}
        ref = {q: np.array(reference_rollouts) * (2 if q == "adv_abs_sum_trained" else 1) for q in own}
        runs["c", key] = {**{f"mb/{q}": (steps, v) for q, v in own.items()},
                          **{f"held/r_mode/{q}": (steps, v) for q, v in ref.items()},
                          "reward": (steps, np.array([0.5, 0.6])), "entropy": (steps, np.array(entropy))}
        runs["r", key] = {**{f"mb/{q}": (steps, v) for q, v in ref.items()},
                          "reward": (steps, np.array([0.5, 0.7])), "entropy": (steps, np.array([0.5, 0.4]))}
    return runs


def test_held_fixed_is_met_when_the_control_trains_on_what_its_reference_would_and_not_otherwise():
    h = held_fixed.HeldFixed("c holds r's trained rollouts", "c", "r", "r_mode")
    met = held_fixed.run_held([h], held_runs())[0]
    assert met["result"] == "met" and met["runs"] == 2 and met["pairs"] == 2 and met["gap"] == 0.0
    assert met["ratios"] == {"rollouts_trained": 1.0, "prompts_trained": 1.0, "adv_abs_sum_trained": 1.0}
    # the reference's rule trains on more in the same batch (random_recentred against random): NOT MET,
    # and the ratio says how far (35 / 50 rollouts over the two steps)
    fewer = held_fixed.run_held([h], held_runs(control_rollouts=(40.0, 30.0), reference_rollouts=(60.0, 40.0)))[0]
    assert fewer["result"] == "NOT MET" and fewer["ratios"]["rollouts_trained"] == pytest.approx(70 / 100)
    assert fewer["gap"] == pytest.approx(1 / 3)                     # |40 - 60| / 60 at step 1
    # a gap at one step only, below and above the tolerance
    runs = held_runs()
    for key in KEYS[:2]:
        steps, v = runs["c", key]["mb/adv_abs_sum_trained"]
        runs["c", key]["mb/adv_abs_sum_trained"] = (steps, v * np.array([1.0, 1 + 1e-7]))
    assert held_fixed.run_held([h], runs)[0]["result"] == "met"
    for key in KEYS[:2]:
        steps, v = runs["c", key]["mb/adv_abs_sum_trained"]
        runs["c", key]["mb/adv_abs_sum_trained"] = (steps, v * np.array([1.0, 1.01]))
    assert held_fixed.run_held([h], runs)[0]["result"] == "NOT MET"
    # runs from before the log existed: not measured (and so not met, for a claim that needs it)
    bare = {k: {key: s for key, s in v.items() if not key.startswith("held/")} for k, v in held_runs().items()}
    assert held_fixed.run_held([h], bare)[0]["result"] == "not measured"


def test_held_fixed_checks_each_pairs_first_step_against_the_reference_run_itself():
    h = held_fixed.HeldFixed("c holds r's trained rollouts", "c", "r", "r_mode")
    runs = held_runs()
    # the control's own log of the reference's rule agrees with itself, but the reference RUN
    # trained on something else at step 1, where the two saw one batch: the log is wrong
    for key in KEYS[:2]:
        steps, v = runs["r", key]["mb/rollouts_trained"]
        runs["r", key]["mb/rollouts_trained"] = (steps, v + np.array([1.0, 0.0]))
    rec = held_fixed.run_held([h], runs)[0]
    assert rec["gap"] == 0.0 and rec["first_gap"] == pytest.approx(1 / 41) and rec["result"] == "NOT MET"
    # reference runs from before the log: their first batch is compared by reward and entropy
    old = held_runs()
    for key in KEYS[:2]:
        old["r", key] = {k: v for k, v in old["r", key].items() if not k.startswith("mb/")}
    assert held_fixed.run_held([h], old)[0]["result"] == "met"
    other_batch = held_runs(entropy=(0.51, 0.5))         # the pair did not see one batch at step 1
    for key in KEYS[:2]:
        other_batch["r", key] = {k: v for k, v in other_batch["r", key].items() if not k.startswith("mb/")}
    assert held_fixed.run_held([h], other_batch)[0]["result"] == "NOT MET"


def test_held_fixed_pairwise_compares_the_two_runs_at_every_step():
    h = held_fixed.HeldFixed("c draws r's split", "c", "r", "r_mode", quantities=("split_groups",), pairwise=True)
    steps = np.array([1, 2, 3])
    runs = {}
    for key in KEYS[:2]:
        runs["c", key] = {"mb/split_groups": (steps, np.array([29.0, 28.0, 30.0]))}
        runs["r", key] = {"mb/split_groups": (steps, np.array([29.0, 28.0, 30.0]))}
    assert held_fixed.run_held([h], runs)[0]["result"] == "met"
    runs["r", KEYS[1]] = {"mb/split_groups": (steps, np.array([29.0, 28.0, 31.0]))}      # step 3 differs
    assert held_fixed.run_held([h], runs)[0]["result"] == "NOT MET"
    assert held_fixed.run_held([h], {k: v for k, v in runs.items() if k[0] == "c"})[0]["result"] == "not measured"


def test_a_claim_that_needs_a_held_fixed_check_is_not_testable_unless_it_is_met():
    rng = np.random.default_rng(11)
    values = {}
    values["x", "c"], values["x", "r"] = design_values(0.05, rng)
    h = held_fixed.HeldFixed("c holds r's trained rollouts", "c", "r", "r_mode")
    needing = Claim("P", "c above r: the one change", "q", "x", "c", "r", +1, needs=(h.text,), isolates="one thing")
    not_met = held_fixed.run_held([h], held_runs(reference_rollouts=(60.0, 40.0)))
    rec = claims.judge([needing], values, {}, not_met)[0]
    assert rec["verdict"] == "not testable" and rec["detail"] == f"held fixed NOT MET: {h.text}"
    assert claims.judge([needing], values, {}, held_fixed.run_held([h], held_runs()))[0]["verdict"] == "agrees"
    # negative control: without the need, the same runs give a verdict although nothing was held
    free = Claim("P", "c above r", "q", "x", "c", "r", +1)
    assert claims.judge([free], values, {}, not_met)[0]["verdict"] == "agrees"


def test_one_family_per_sweep_is_computed_beside_the_declared_families_and_may_be_the_primary():
    rng = np.random.default_rng(12)
    values = {}
    for arm, shift in (("a", 0.03), ("b", 0.03), ("c", 0.0)):
        values["x", arm], values["x", "ref"] = design_values(shift, rng)
    cs = [Claim("P", f"{arm} above ref", "q", "x", arm, "ref", +1, family=arm) for arm in ("a", "b", "c")]
    declared = claims.judge(cs, values, {})
    p = [r["p"] for r in declared]
    assert [r["p_holm"] for r in declared] == p                            # families of one: no correction
    assert [r["p_holm_sweep"] for r in declared] == exact_tests.holm(p)    # one family of 3
    assert all(r["family"] == 1 and r["family_sweep"] == 3 for r in declared)
    one = claims.judge(cs, values, {}, one_family=True)
    assert [r["p_holm"] for r in one] == exact_tests.holm(p) and [r["p_holm_declared"] for r in one] == p
    assert [r["verdict"] for r in one] == [r["verdict_sweep"] for r in declared]
    assert [r["verdict_declared"] for r in one] == [r["verdict"] for r in declared]


def test_a_declared_minimum_of_runs_makes_a_claim_with_fewer_not_testable():
    values = {("v", "a"): {k: (0.1 + 0.01 * i if i < 7 else math.nan) for i, k in enumerate(KEYS)}}
    claim = Claim("P", "within", "q", "v", "a", None, +1, sided="one", min_n=8)
    rec = claims.judge([claim], values, {})[0]
    assert rec["verdict"] == "not testable" and rec["detail"] == "fewer than 8 runs with a number (7)"
    values["v", "a"][KEYS[7]] = 0.2
    assert claims.judge([claim], values, {})[0]["verdict"] == "agrees"
    # negative control: the default minimum (2) tests the 7 runs
    values["v", "a"][KEYS[7]] = math.nan
    assert claims.judge([Claim("P", "within", "q", "v", "a", None, +1, sided="one")], values, {})[0]["n"] == 7
