"""experiments/claims.py: the exact tests on hand-made numbers, Holm's correction, the
minimum detectable effect, the four verdicts, and a sweep end to end with a planted
difference (detected) and a planted null (not detected): the test's own negative control."""

import gzip
import itertools
import json
import math
import os

import numpy as np
import pytest

from experiments import claims, sweep, sweeps
from experiments.claims import Claim
from machinery import tinymodel


# --- the exact tests ---------------------------------------------------------------------

def test_permutation_p_exact_values():
    assert claims.permutation_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == 2 / 252       # fully separated
    assert claims.permutation_p(list(range(6)), list(range(6, 12))) == 2 / 924
    assert claims.permutation_p([1, 2, 3], [1, 2, 3]) == 1.0                        # no difference at all
    # against a brute-force count over every relabelling
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=4), rng.normal(size=5) + 0.5
    pooled, obs = np.concatenate([a, b]), abs(a.mean() - b.mean())
    count = sum(abs(pooled[list(s)].mean() - np.delete(pooled, list(s)).mean()) >= obs - 1e-12
                for s in itertools.combinations(range(9), 4))
    assert claims.permutation_p(a, b) == pytest.approx(count / math.comb(9, 4))


def test_sign_flip_p_exact_values():
    assert claims.sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32          # five seeds can never reach 0.05
    assert claims.sign_flip_p([1, 2, 3, 4, 5, 6]) == 2 / 64
    assert claims.sign_flip_p([1, -1]) == 1.0
    assert claims.sign_flip_p([0.3, 1.3]) == 0.5


def test_holm_known_vectors():
    assert claims.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert claims.holm([0.02]) == [0.02]
    assert claims.holm([0.5, 0.001, 0.2, 0.01]) == pytest.approx([0.5, 0.004, 0.4, 0.03])
    assert claims.holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])                # capped running max


def test_minimum_detectable_effect_is_the_threshold():
    rng = np.random.default_rng(1)
    a, b = list(rng.normal(0, 1, 6)), list(rng.normal(0, 1, 6))
    others = [0.3, 0.001, 0.5]
    mde = claims.min_detectable_effect(a, b, +1, others, 0)
    assert math.isfinite(mde) and mde > 0
    centred = np.asarray(a) - np.mean(a) + np.mean(b)
    adjusted = lambda d: claims.holm([claims.permutation_p(centred + d, b), *others[1:]])[0]
    assert adjusted(mde * 1.001) < claims.ALPHA <= adjusted(mde * 0.9)
    # five seeds within a run cannot reach 0.05 at all: no detectable effect
    assert claims.min_detectable_effect([0.1, -0.2, 0.3, 0.0, 0.1], None, +1, [1.0], 0) == math.inf


def test_four_verdicts():
    values = {("x", "a"): [1, 2, 3, 4, 5, 6], ("x", "b"): [7, 8, 9, 10, 11, 12],
              ("y", "a"): [0.1, -0.2, 0.3, 0.05, -0.1, 0.0], ("y", "b"): [0.0, 0.1, -0.1, 0.2, 0.05, -0.05],
              ("z", "a"): [1.0, math.nan, math.nan], ("z", "b"): [1.0, 2.0, 3.0]}
    cl = [Claim("P", "b above a", "x", "b", "a", +1), Claim("P", "b below a", "x", "b", "a", -1),
          Claim("P", "a above b", "y", "a", "b", +1), Claim("P", "z", "z", "a", "b", +1),
          Claim("P", "checked", "x", "b", "a", +1, lambda series: "delta stayed in [0.98, 1.00]")]
    rows = claims.judge(cl, values, {})
    assert [r["verdict"] for r in rows] == ["agrees", "opposite", "no difference detected", "not testable",
                                            "not testable"]
    assert rows[0]["p"] == 2 / 924 and rows[0]["p_holm"] == pytest.approx(3 * 2 / 924)   # 3 testable claims
    assert rows[0]["effect"] == 6.0 and rows[2]["detail"].startswith("MDE ")
    assert rows[3]["detail"] == "fewer than 2 seeds with a value (1 vs 3)"
    assert rows[4]["detail"] == "delta stayed in [0.98, 1.00]"
    table = claims.verdict_table(rows)
    assert "| P | b above a [x] | b vs a | 6 ± " in table and "**agrees**" in table


def test_every_sweep_claim_names_a_row_and_arms_it_has():
    for task in sweeps.TASKS:
        for name, make in sweeps.SWEEPS.items():
            s = make(task)
            labels = {label for label, _, _ in s.rows}
            for c in s.claims:
                assert c.row in labels, (name, c.text)
                assert c.arm in s.arms and (c.reference is None or c.reference in s.arms), (name, c.text)
                assert c.direction in (-1, 0, 1)
            n_testable = len(s.claims)
            seeds = sweeps.TASKS[task]["seeds"][name]
            within = any(c.reference is None and c.direction != 0 for c in s.claims)
            # the design can reach significance after Holm for every claim at once
            best = 2 / (2 ** seeds) if within else 2 / math.comb(2 * seeds, seeds)
            assert best * n_testable < claims.ALPHA, (task, name)


# --- end to end: a planted difference is found, a planted null is not --------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tok = tinymodel.build_char_tokenizer()
    tinymodel.build_tiny_model(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def planted(task):
    """Three arms of an untrained model: 'long' samples 16 tokens where 'short' samples 8
    (an untrained model almost never stops early: a planted difference in response length);
    'short_mb' is 'short' with another micro-batch size, which changes nothing but float
    rounding (a planted null)."""
    return sweeps.Sweep(
        name="planted", claim="a planted difference and a planted null",
        flags=["--eval_every", "0"],
        arms={"short": ["--max_new_tokens", "8"], "long": ["--max_new_tokens", "16"],
              "short_mb": ["--max_new_tokens", "8", "--micro_batch", "3"]},
        rows=[("length", sweeps.mean_of("resp_len_mean"), "mean response length"),
              ("entropy", sweeps.mean_of("entropy"), "mean entropy")],
        curves=[("resp_len_mean", "length")],
        claims=[Claim("test", "longer budget, longer responses", "length", "long", "short", +1),
                Claim("test", "micro-batch size changes the entropy", "entropy", "short_mb", "short", +1)])


def test_sweep_end_to_end_detects_the_planted_difference_and_not_the_null(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sweep.SWEEPS, "planted", planted)
    sweep.main(["planted", "--task", "addition", "--seeds", "0,1,2,3,4", "--steps", "2", "--jobs", "2",
                "--out", str(tmp_path), "--", "--model", tiny_dir, "--digits", "1", "--prompts_per_step", "4",
                "--group_size", "4", "--flip_every", "0", "--save_every", "0"])
    root = tmp_path / "addition" / "planted"
    verdicts = {v["claim"]: v for v in json.load(open(root / "verdicts.json"))}
    found = verdicts["longer budget, longer responses"]
    assert found["verdict"] == "agrees" and found["p"] == 2 / 252 and found["p_holm"] == pytest.approx(4 / 252)
    null = verdicts["micro-batch size changes the entropy"]
    assert null["verdict"] == "no difference detected" and null["p"] > 0.5 and null["detail"].startswith("MDE ")
    assert "**agrees**" in (root / "summary.md").read_text()
    # `report` rebuilds it from disk: the docs page, the per-seed metrics, the README's table
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- claims:begin -->\nold table\n<!-- claims:end -->\nrest\n")
    written = sweep.report(str(tmp_path), str(tmp_path / "docs"), str(readme))
    assert {os.path.basename(p) for p in written} >= {"sweep_addition_planted.md", "sweep_addition_planted.png",
                                                     "sweep_addition_planted.jsonl.gz", "README.md"}
    text = readme.read_text()
    assert text.startswith("intro\n<!-- claims:begin -->") and text.endswith("<!-- claims:end -->\nrest\n")
    row = next(line for line in text.splitlines() if "longer budget, longer responses" in line)
    cells = [c.strip() for c in row.split("|")[-3:-1]]                 # the countdown and addition columns
    assert cells[0] == "not run" and cells[1].startswith("**agrees**") and "old table" not in text
    lines = gzip.open(tmp_path / "docs" / "sweep_addition_planted.jsonl.gz", "rt").read().splitlines()
    assert len(lines) == 3 * 5 * 2 and {json.loads(l)["arm"] for l in lines} == {"short", "long", "short_mb"}
    # A sweep planned with more seeds than have finished shows its progress, not a verdict
    monkeypatch.setitem(sweep.TASKS["addition"]["seeds"], "planted", 6)
    sweep.report(str(tmp_path), str(tmp_path / "docs"), str(readme))
    row = next(line for line in readme.read_text().splitlines() if "longer budget, longer responses" in line)
    assert row.split("|")[-2].strip() == "15 of 18 runs finished"
