"""sweep.py, designs.py, quantities.py and pages.py: the statistics on hand-made numbers, the
page on hand-made runs, the committed data (merge, designs, earlier designs, a fresh clone
that rebuilds every page with no diff), parts, and the whole sweep end to end on a tiny
untrained model (2 arms x 2 seeds x 3 steps): run directories, a table that equals a
recomputation from the metrics files, resume by directory (finished runs untouched, an
interrupted run continued), a failing arm, and the command line's bad-input contract."""

import gzip
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import diagnostics
from experiments import (claims, designs, designs_cancellation, designs_fade, pages, quantities, registry, summaries,
                         sweep, sweep_plan)
from tests.engine.helpers import popen_train_in_this_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_extra(model_dir):
    """Everything after `--`: a tiny model and batch, evaluation every step, checkpoints every 2."""
    return ["--", "--model", model_dir, "--digits", "1", "--prompts_per_step", "4", "--group_size", "4",
            "--max_new_tokens", "24", "--n_eval", "6", "--eval_samples", "4", "--eval_every", "1",
            "--save_every", "2"]


def read_rows(run_dir):
    """A run's training steps from its metrics.jsonl (step 0, the start's evaluation, left out:
    the sweep's data keeps the start in the run's record)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["step"] != 0]


def table_row(summary_text, label):
    """The cells of the table row whose first cell is `label`."""
    for line in summary_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in summary.md")


# ---------------------------------------------------------------------------------------
# Statistics on hand-made numbers
# ---------------------------------------------------------------------------------------

def test_mean_se_drops_missing_values():
    assert pages.mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / math.sqrt(3), 3))
    m, se, n = pages.mean_se([4.0, math.nan, 6.0])                  # NaN = a seed without a number
    assert (m, n) == (5.0, 2) and se == pytest.approx(1.0)         # std(ddof=1) = sqrt(2), / sqrt(2)
    m, se, n = pages.mean_se([7.0])
    assert m == 7.0 and math.isnan(se) and n == 1
    assert pages.mean_se([math.nan])[2] == 0 and math.isnan(pages.mean_se([])[0])


def test_steps_to_threshold_and_peak():
    steps, values = [10, 20, 30, 40], [0.5, 0.8, 0.7, 0.8]
    assert quantities.steps_to_threshold(steps, values, 0.75) == 20
    assert quantities.steps_to_threshold(steps, values, 0.8) == 20      # >=, not >
    assert math.isnan(quantities.steps_to_threshold(steps, values, 0.9))
    assert quantities.peak(steps, values) == (20, 0.8)                  # the first of two equal peaks
    assert quantities.peak([1, 2, 3], [math.nan, 0.2, 0.1]) == (2, 0.2)
    assert all(math.isnan(x) for x in quantities.peak([1], [math.nan]))


def test_at_level_interpolates_at_the_first_crossing():
    series = {"eval/pass@1": ([25, 50, 75, 100], [0.30, 0.38, 0.44, 0.36]),
              "eval/solution_entropy": ([25, 50, 75, 100], [0.50, 0.40, 0.10, 0.05])}
    # 0.40 is first crossed between steps 50 (0.38) and 75 (0.44): a third of the way
    assert quantities.at_level("eval/solution_entropy", "eval/pass@1", 0.40)(series) == pytest.approx(0.30)
    assert quantities.at_level("eval/solution_entropy", "eval/pass@1", 0.44)(series) == pytest.approx(0.10)   # <=
    assert math.isnan(quantities.at_level("eval/solution_entropy", "eval/pass@1", 0.30)(series))   # at the first
    assert math.isnan(quantities.at_level("eval/solution_entropy", "eval/pass@1", 0.50)(series))   # never
    assert math.isnan(quantities.at_level("eval/missing", "eval/pass@1", 0.40)(series))


def test_pool_cells_equals_the_concatenated_sample():
    steps = [np.array([1.0, 2.0, 3.0]), np.array([4.0, 6.0]), np.array([5.0])]     # n = 1: no SE
    means = [s.mean() for s in steps]
    ses = [s.std(ddof=1) / math.sqrt(len(s)) if len(s) > 1 else math.nan for s in steps]
    all_ = np.concatenate(steps)
    m, se, n = quantities.pool_cells(means, ses, [len(s) for s in steps])
    assert n == 6 and m == pytest.approx(all_.mean()) and se == pytest.approx(all_.std(ddof=1) / math.sqrt(6))
    assert quantities.pool_cells([1.0, 2.0], [0.1, 0.1], [0, 0])[2] == 0     # no position at all
    m, se, n = quantities.pool_cells([0.25], [math.nan], [1])
    assert (m, n) == (0.25, 1) and math.isnan(se)


def test_cell_and_number_format():
    assert pages.fmt(0.81234) == "0.812" and pages.fmt(112.4) == "112" and pages.fmt(3.4e-5) == "3.4e-05"
    assert pages.fmt(math.nan) == "-"
    assert pages.cell([0.5, 0.7]) == "0.6 ± 0.1 [0.5 0.7]"
    assert pages.cell([100.0, math.nan, 120.0]) == "110 ± 10 [100 - 120] (n=2)"
    assert pages.cell([math.nan]) == "-"


def test_template_drift_key_by_hand():
    """diagnostics.where_updates_go's mean |Δ log π| per token of each class (the drift the
    batching sweep reports); the case of tests/lesson/test_diagnostics.py's hand example."""
    template = torch.tensor([[True, True, False, False], [True, False, False, True], [False, False, True, True]])
    new = torch.tensor([[0.3, -0.1, 0.2, 7.0], [-0.2, -0.4, 0.1, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).float()
    out = diagnostics.where_updates_go(new, torch.zeros(3, 4), mask, torch.tensor([0.5, -0.5, 0.0]), template)
    assert out["where/abs_dlogp_template"] == pytest.approx(2.6 / 6)      # 0.3 0.1 0.2 0.0 1 1 (padding out)
    assert out["where/abs_dlogp_reasoning"] == pytest.approx(2.7 / 5)
    still = diagnostics.where_updates_go(torch.zeros(3, 4), torch.zeros(3, 4), mask, torch.ones(3), template)
    assert still["where/abs_dlogp_template"] == 0.0                        # nothing moved: drift 0


# ---------------------------------------------------------------------------------------
# The report on hand-made runs (no training): the credit sweep's pooled value cells
# ---------------------------------------------------------------------------------------

def hand_made_credit_runs():
    """grpo and psr, the design's two warm-up seeds, RL seed 0: two value steps each, b+ values
    [0.2, 0.4] then [0.6], s+ [0.0, 0.1] then [0.1, 0.2], shifted by the arm and the block."""
    runs, pooled = [], {}
    for arm, shift in (("grpo", 0.0), ("psr", 0.1)):
        for i, w in enumerate(designs.WARMUP_SEEDS):
            b1, b2 = np.array([0.2, 0.4]) + shift + 2 * i, np.array([0.6]) + shift + 2 * i
            s1, s2 = np.array([0.0, 0.1]) + i, np.array([0.1, 0.2]) + i
            rows = [{"step": 1, "reward": 0.5, "where/template_share": 0.3 + shift},
                    {"step": 10, "reward": 0.5, "value/boosted_pos": b1.mean(), "value/n_boosted_pos": 2,
                     "value/se_boosted_pos": b1.std(ddof=1) / math.sqrt(2), "value/suppressed_pos": s1.mean(),
                     "value/n_suppressed_pos": 2, "value/se_suppressed_pos": s1.std(ddof=1) / math.sqrt(2),
                     "value/n_boosted_neg": 0, "value/n_suppressed_neg": 0},
                    {"step": 20, "reward": 0.5, "value/boosted_pos": b2.mean(), "value/n_boosted_pos": 1,
                     "value/suppressed_pos": s2.mean(), "value/n_suppressed_pos": 2,
                     "value/se_suppressed_pos": s2.std(ddof=1) / math.sqrt(2),
                     "value/n_boosted_neg": 0, "value/n_suppressed_neg": 0, "eval/pass@1": 0.5}]
            record = {"args": ["--out_dir", "x", "--seed", "0", "--warmup_seed", str(w), "--steps", "20",
                               *designs_cancellation.credit("addition").arms[arm]], "start": {"sha256": f"{w}" * 64, "model_path": "m"},
                      "seconds": 60.0, "finished": f"2026-01-0{i + 1}T00:00:00+00:00", "machine": "test box"}
            runs.append(pages.RunData(arm, w, 0, json.loads(json.dumps(rows)), record))
            pooled[arm, w] = (np.concatenate([b1, b2]).mean(), np.concatenate([s1, s2]).mean())
    return runs, pooled


def test_credit_page_pools_value_cells_over_steps(tmp_path):
    runs, pooled = hand_made_credit_runs()
    page = pages.write_page(designs_cancellation.credit("addition"), "addition", runs, str(tmp_path / "p.md"), str(tmp_path / "p.png"),
                            {"command": "python -m experiments.sweep credit", "note": [], "recorded": True})
    text = (tmp_path / "p.md").read_text()
    for k, arm in enumerate(("grpo", "psr")):
        b = [pooled[arm, w][0] for w in designs.WARMUP_SEEDS]
        s_ = [pooled[arm, w][1] for w in designs.WARMUP_SEEDS]
        assert table_row(text, "value b+")[k] == pages.cell(b)
        assert table_row(text, "value s+")[k] == pages.cell(s_)
        assert table_row(text, "value b+ - s+")[k] == pages.cell([x - y for x, y in zip(b, s_)])
        assert table_row(text, "value n b+")[k] == pages.cell([3.0, 3.0])
        assert table_row(text, "value n s+")[k] == pages.cell([4.0, 4.0])
    assert table_row(text, "value b-") == ["-", "-"]                       # no negative rollouts: no number
    # Two runs are too few for any exact test to reach 0.05 ("no difference detected", no
    # effect detectable), and the b- - s- claim has no number at all.
    verdicts = {v["claim"].text: v for v in page["verdicts"]}
    b_minus_s = verdicts["boosted tokens of positive rollouts: higher value than suppressed"]
    assert b_minus_s["effect"] == pytest.approx(0.8) and b_minus_s["p"] == 0.5          # signs of [0.3, 1.3]
    assert b_minus_s["verdict"] == "no difference detected" and "no effect detectable" in b_minus_s["detail"]
    assert verdicts["boosted tokens of negative rollouts: higher value than suppressed"]["verdict"] == "not testable"
    assert "## Implementation checks" in text and "## Findings" in text and "Sources, verbatim:" in text
    w0, w1 = designs.WARMUP_SEEDS
    assert "- Starting weights (sha256 of each warm-up seed's, train.py's start.json): " \
           f"warm-up {w0}: {str(w0) * 12} (2 runs); warm-up {w1}: {str(w1) * 12} (2 runs)" in text
    assert "- Finished: 2026-01-01T00:00:00+00:00 to 2026-01-02T00:00:00+00:00" in text
    assert "- Run time: 4.0 process-minutes over 4 runs" in text and "- Machine: test box" in text
    assert "![curves](p.png)" in text and os.path.getsize(tmp_path / "p.png") > 1000
    assert page["done"] == 4 and page["planned"] == 20


def test_the_report_leaves_out_pairs_whose_runs_ran_on_different_cpus(tmp_path):
    """The report hands each run's recorded CPU to the verdicts: psr's run from warm-up seed 1
    on another CPU model takes that pair out of every grpo-vs-psr finding, and says so on the
    page; the same runs on one CPU (the negative control) leave nothing out."""
    def page_text(machine_of):
        runs, _ = hand_made_credit_runs()
        runs = [dataclasses.replace(r, record={**r.record, "machine": machine_of(r)}) for r in runs]
        page = pages.write_page(designs_cancellation.credit("addition"), "addition", runs, str(tmp_path / "p.md"),
                                str(tmp_path / "p.png"), {"command": "c", "note": [], "recorded": True})
        return (tmp_path / "p.md").read_text(), page["verdicts"]

    amd, intel = "nproc 2, AMD EPYC, Linux x86_64", "nproc 2, Intel(R) Xeon(R) Processor, Linux x86_64"
    w1 = designs.WARMUP_SEEDS[1]
    mixed, verdicts = page_text(lambda r: intel if (r.arm, r.warmup_seed) == ("psr", w1) else amd)
    across = [v for v in verdicts if "psr" in (v["claim"].arm, v["claim"].reference)]
    assert across and all(v["n"] <= 1 and "1 pair left out: its runs ran on different CPUs" in v["detail"]
                          for v in across)
    assert "1 pair left out: its runs ran on different CPUs" in mixed
    same, verdicts = page_text(lambda r: amd)
    assert "left out" not in same and any(v["n"] == 2 for v in verdicts)
    # Holm's family is every declared finding; the page gives declared and testable counts
    testable = sum(v["verdict"] != "not testable" for v in verdicts)
    assert len(verdicts) == 5 and testable < 5           # b- vs s- has no number: not testable
    assert f"Holm's family: this sweep on this task (5 declared, {testable} testable)" in same


# ---------------------------------------------------------------------------------------
# The committed data: round trip, merge, designs, an earlier design, a fresh clone
# ---------------------------------------------------------------------------------------

def test_run_data_round_trip_is_byte_identical(tmp_path):
    runs, _ = hand_made_credit_runs()
    path = pages.write_run_data(runs, str(tmp_path / "a.jsonl.gz"))
    again = pages.read_run_data(path)
    assert [(r.arm, r.key, r.rows, r.record) for r in again] == [(r.arm, r.key, r.rows, r.record) for r in runs]
    pages.write_run_data(again, str(tmp_path / "b.jsonl.gz"))
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    # data committed before runs carried a record: warm-up seed 0, an empty record
    with gzip.open(tmp_path / "old.jsonl.gz", "wt") as f:
        f.write(json.dumps({"arm": "grpo", "seed": 3, "step": 1, "reward": 0.5}) + "\n")
    (old,) = pages.read_run_data(str(tmp_path / "old.jsonl.gz"))
    assert (old.arm, old.key, old.rows, old.record["args"]) == ("grpo", (0, 3), [{"step": 1, "reward": 0.5}], None)


def test_merge_prefers_the_run_directory_and_keeps_one_design():
    spec = designs_cancellation.credit("addition")
    committed, _ = hand_made_credit_runs()
    local = [pages.RunData("grpo", 0, 0, [{"step": 1, "reward": 1.0}], dict(committed[0].record, finished="2026-02"))]
    merged = pages.merge(committed, local, spec)
    assert len(merged) == 4 and merged[0].rows == [{"step": 1, "reward": 1.0}]      # the run directory's
    w0, w1 = designs.WARMUP_SEEDS
    assert [(r.arm, r.key) for r in merged] == [("grpo", (w0, 0)), ("grpo", (w1, 0)), ("psr", (w0, 0)), ("psr", (w1, 0))]
    kept, aside, recorded = pages.one_design(merged, spec)
    assert recorded and len(kept) == 4 and not aside                 # seeds and arm flags are the run's own
    # a run with another --steps is another design: the newest run's design wins
    newer = pages.RunData("psr", 1, 1, [], dict(committed[0].record, finished="2026-03",
                                                args=["--seed", "1", "--steps", "40", *spec.arms["psr"]]))
    kept, aside, _ = pages.one_design([*merged, newer], spec)
    assert kept == [newer] and len(aside) == 4
    # an arm whose flags changed since its runs is another design too
    changed = pages.RunData("grpo", 0, 2, [], dict(committed[0].record, args=["--steps", "20", "--advantage", "rloo"]))
    assert pages.design(changed, spec) != pages.design(committed[0], spec)
    # runs without a record (an earlier design) count only when no run has one
    legacy = [pages.RunData("grpo", 0, s, [], dict(pages.EMPTY_RECORD)) for s in range(3)]
    assert pages.one_design(legacy, spec) == (legacy, [], False)
    assert pages.one_design([*legacy, newer], spec)[0] == [newer]


def test_runs_without_recorded_flags_show_their_own_budget_not_todays_plan():
    # Such runs predate the record; printing today's plan as their command would be false
    # (and would change the page whenever the plan changes, breaking report's fresh-clone identity).
    spec = designs_cancellation.credit("addition")
    rows = lambda last: [{"step": s, **({"eval/pass@1": 0.5} if s % 10 == 0 else {})} for s in range(1, last + 1)]
    legacy = [pages.RunData("grpo", 0, s, rows(120), dict(pages.EMPTY_RECORD)) for s in range(2)]
    text = pages.run_command(spec, "addition", legacy, recorded=False)
    assert "120 steps" in text and "every 10 steps" in text
    planned = str(designs.settings("addition", spec.name)["steps"])
    assert f"--steps {planned}" not in text                            # today's plan is not theirs
    mixed = pages.run_command(spec, "addition", [*legacy, pages.RunData("psr", 0, 0, rows(90), {})], recorded=False)
    assert "90,120 steps" in mixed                                     # disagreeing runs: both budgets


@pytest.mark.slow
def test_report_merges_committed_data_with_new_runs_and_never_says_not_run(tmp_path, monkeypatch):
    docs, out, readme = tmp_path / "docs", tmp_path / "runs", tmp_path / "README.md"
    os.makedirs(docs)
    readme.write_text("<!-- claims:begin -->\n<!-- claims:end -->\n")
    committed, _ = hand_made_credit_runs()
    pages.write_run_data(committed[:2], str(docs / "sweep_addition_credit.jsonl.gz"))           # grpo, part 1
    # part 2 ran on another machine: psr's runs, in runs/
    for r in committed[2:]:
        d = pages.run_dir(str(out), "addition", "credit", r.arm, r.warmup_seed, r.seed)
        os.makedirs(d)
        (open(os.path.join(d, "metrics.jsonl"), "w")).write("".join(json.dumps(row) + "\n" for row in r.rows))
        json.dump({"args": r.record["args"]}, open(os.path.join(d, "sweep_args.json"), "w"))
        json.dump({"seconds": 60.0, "finished": r.record["finished"]}, open(os.path.join(d, "done.json"), "w"))
        json.dump({"model_path": "m", "weights_sha256": r.record["start"]["sha256"]}, open(os.path.join(d, "start.json"), "w"))
    credit = registry.SWEEPS["credit"]
    monkeypatch.setitem(registry.SWEEPS, "credit", lambda task: dataclasses.replace(credit(task), seeds=(0,)))
    pages.report(str(out), str(docs), str(readme), str(tmp_path / "results.md"))
    merged = pages.read_run_data(str(docs / "sweep_addition_credit.jsonl.gz"))
    w0, w1 = designs.WARMUP_SEEDS
    assert [(r.arm, r.key) for r in merged] == [("grpo", (w0, 0)), ("grpo", (w1, 0)), ("psr", (w0, 0)), ("psr", (w1, 0))]
    assert merged[3].record["start"]["sha256"] == str(w1) * 64
    every_sweep, every_claim = (docs / "claims.md").read_text().split("## Every claim")
    column = {task: 3 + i for i, task in enumerate(designs.TASKS)}        # | sweep | claim | countdown | addition | ...
    row = next(line for line in every_claim.splitlines() if "less of the update on template tokens" in line)
    assert row.split("|")[column["addition"]].strip() == "[no difference detected](sweep_addition_credit.md)"  # 4 of 4
    assert row.split("|")[column["countdown"]].strip() == "not run"                   # countdown: no data at all
    assert row.split("|")[column["smollm2"]].strip() == "-"                           # not declared there
    summary = next(line for line in every_sweep.splitlines() if line.startswith("| credit |"))
    cells = [line.split("|")[column["addition"]].strip() for line in every_claim.splitlines()
             if line.startswith("| credit |")]
    assert (cells.count("[no difference detected](sweep_addition_credit.md)"),
            cells.count("[not testable](sweep_addition_credit.md)"),
            cells.count("[not testable](sweep_addition_credit.md) *re-read*")) == (2, 1, 2)
    # *re-read* is per cell: the flips margins were restated after addition's runs, but
    # declared before smollm2's (its cell, "not run" here, carries no label)
    flips = next(line for line in every_claim.splitlines() if "boosted shares of negative and positive" in line)
    assert flips.split("|")[column["addition"]].strip().endswith("*re-read*")
    assert flips.split("|")[column["smollm2"]].strip() == "not run"
    assert "*re-read*" not in flips.split("|")[2]                     # not on the claim's own cell
    assert summary.split("|")[column["addition"]].strip() == \
        "[2 no difference detected, 3 not testable](sweep_addition_credit.md); checks: 5 not measured"   # counted
    assert summary.split("|")[column["countdown"]].strip() == "not run"
    # the README: one line per task, the fully run sweeps' findings counted
    text = readme.read_text()
    line = next(line for line in text.splitlines() if line.startswith("| addition: "))
    assert line.split("|")[2].strip().startswith("1 (") and line.split("|")[3].strip() == \
        "2 no difference detected, 3 not testable"
    # a fresh machine: no runs/, the same page from the committed data alone
    before = {f: (docs / f).read_bytes() for f in os.listdir(docs)}
    shutil.rmtree(out)
    pages.report(str(out), str(docs), str(readme), str(tmp_path / "results.md"))
    assert {f: (docs / f).read_bytes() for f in os.listdir(docs)} == before and readme.read_text() == text


def test_a_sweep_with_different_claims_per_task_shows_each_claim_once_with_dash_where_undeclared(tmp_path):
    # the dose sweep: lr doses on addition, mini-batch doses on countdown; nothing run here
    docs, readme = tmp_path / "docs", tmp_path / "README.md"
    readme.write_text("<!-- claims:begin -->\n<!-- claims:end -->\n")
    pages.report(str(tmp_path / "runs"), str(docs), str(readme), str(tmp_path / "results.md"))
    page = (docs / "claims.md").read_text()
    every_sweep, every_claim = page.split("## Every claim")
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in every_claim.splitlines()
            if line.startswith("| dose |") and line.count("|") == 3 + len(designs.TASKS)}   # findings, not checks
    assert list(designs.TASKS) == ["countdown", "addition", "smollm2"]
    assert rows["8 mini-batches: query higher final pass@1 than random"] == ["not run", "-", "-"]
    assert rows["lr 4e-4: query higher final pass@1 than random"] == ["-", "not run", "-"]
    counts = {task: len(designs_cancellation.dose(task).claims) for task in designs.TASKS if designs.runs_on(task, "dose")}
    assert len(rows) == sum(counts.values()) and counts == {"countdown": 10, "addition": 14}
    summary = next(line for line in every_sweep.splitlines() if line.startswith("| dose |"))
    assert summary.split("|")[2].strip() == "10 / 14 / -"
    credit = next(line for line in every_sweep.splitlines() if line.startswith("| credit |"))
    assert credit.split("|")[2].strip() == "5 / 5 / 6"
    dfpo = next(line for line in every_sweep.splitlines() if line.startswith("| dfpo |"))
    assert dfpo.split("|")[2].strip() == "6"            # the same claims on both tasks it runs on: one count
    # the README keeps a short summary, one line per task, and the link to the study's page
    text = readme.read_text()
    assert "[docs/claims.md](docs/claims.md)" in text and "| dose |" not in text
    assert sum(line.startswith(f"| {task}: ") for task in designs.TASKS for line in text.splitlines()) == 3


@pytest.mark.slow
def test_a_report_that_sets_runs_aside_is_rebuilt_byte_for_byte(tmp_path, monkeypatch, capsys):
    # Committed data of an older design (other --steps) plus a newer design's runs: the
    # older leave the data file, so the page must not depend on them, or the next rebuild
    # (from the data file alone, as in a fresh clone) would write other bytes.
    docs, out, readme = tmp_path / "docs", tmp_path / "runs", tmp_path / "README.md"
    os.makedirs(docs)
    readme.write_text("<!-- claims:begin -->\n<!-- claims:end -->\n")
    committed, _ = hand_made_credit_runs()
    old = [pages.RunData(r.arm, r.warmup_seed, 1, r.rows, dict(r.record, finished="2025-12-01T00:00:00+00:00",
                                                                 args=[a if a != "20" else "10" for a in r.record["args"]]))
           for r in committed]
    pages.write_run_data([*committed, *old], str(docs / "sweep_addition_credit.jsonl.gz"))
    credit = registry.SWEEPS["credit"]
    monkeypatch.setitem(registry.SWEEPS, "credit", lambda task: dataclasses.replace(credit(task), seeds=(0, 1)))
    pages.report(str(out), str(docs), str(readme), str(tmp_path / "results.md"))
    assert "set aside 4 runs" in capsys.readouterr().out                # said once, where it happens
    first = {f: (docs / f).read_bytes() for f in os.listdir(docs)}
    assert len(pages.read_run_data(str(docs / "sweep_addition_credit.jsonl.gz"))) == 4
    pages.report(str(out), str(docs), str(readme), str(tmp_path / "results.md"))
    assert {f: (docs / f).read_bytes() for f in os.listdir(docs)} == first


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.slow
def test_report_in_a_fresh_clone_changes_no_tracked_file(tmp_path):
    """What a new reader does: clone, run report. Every page, data file and the README's tables
    come back byte for byte from the committed data (the tested state is the last commit)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", repo, str(clone)], check=True)
    # Damage what report must rebuild, so a clean status means it rebuilt them: the README's
    # tables, a page and its curves.
    readme = (clone / "README.md").read_text()
    head, rest = readme.split(summaries.TABLES_BEGIN, 1)
    (clone / "README.md").write_text(head + summaries.TABLES_BEGIN + "\nstale\n" + summaries.TABLES_END
                                     + rest.split(summaries.TABLES_END, 1)[1])
    prose = (clone / "docs" / "results.md").read_text()          # and the study prose's block of every finding
    head, rest = prose.split(summaries.FINDINGS_BEGIN, 1)
    (clone / "docs" / "results.md").write_text(head + summaries.FINDINGS_BEGIN + "\nstale\n" + summaries.FINDINGS_END
                                               + rest.split(summaries.FINDINGS_END, 1)[1])
    pages_md = sorted((clone / "experiments" / "results").glob("sweep_*.md"))
    assert pages_md, "no sweep page committed"
    pages_md[0].unlink()
    pages_md[0].with_suffix(".png").write_bytes(b"stale")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    subprocess.run([sys.executable, "-m", "experiments.sweep", "report"], cwd=clone, env=env, check=True,
                   capture_output=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", status


# ---------------------------------------------------------------------------------------
# End to end: train.py processes on a tiny untrained model
# ---------------------------------------------------------------------------------------

ARGV = ["advantages", "--task", "addition", "--arms", "grpo,nsr", "--warmup_seeds", "0", "--seeds", "0,1", "--steps", "3",
        "--jobs", "2"]
LABELS = [f"{arm}/warmup_0/seed_{seed}" for arm in ("grpo", "nsr") for seed in (0, 1)]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory, tiny_dir):
    """ARGV's 4 runs, finished, their weights kept (the resume test needs them). The runs are
    train.main in this process (tests/engine/helpers.TrainInThisProcess), one at a time: what
    they hold is the subject here; the processes are the killed and failing sweeps' tests'."""
    out = tmp_path_factory.mktemp("sweeps")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep.subprocess, "Popen", popen_train_in_this_process(sweep.subprocess.Popen))
        argv = [*ARGV, "--keep_weights", "--out", str(out), *train_extra(tiny_dir)]
        argv[argv.index("--jobs") + 1] = "1"
        sweep.main(argv)
    return out


@pytest.mark.slow
def test_a_part_whose_runs_are_all_committed_runs_nothing_elsewhere(finished_sweep, tiny_dir, tmp_path, capsys):
    """On another machine (a new --out) with the finished runs committed: no train.py starts,
    and no summary of zero runs is written."""
    docs = tmp_path / "docs"
    pages.report(str(finished_sweep), str(docs), str(tmp_path / "no_readme.md"), str(tmp_path / "results.md"))
    elsewhere = tmp_path / "elsewhere"
    sweep.main([*ARGV, "--out", str(elsewhere), "--results", str(docs), *train_extra(tiny_dir)])
    out = capsys.readouterr()
    assert "its runs are in the committed data" in out.out + out.err
    assert sum(line.count("skipped (its data is committed") for line in (out.out + out.err).splitlines()) == 4
    assert not (elsewhere / "addition" / "advantages" / "grpo").exists()
    assert not (elsewhere / "addition" / "advantages" / "summary.md").exists()


@pytest.mark.slow
def test_end_to_end_run_dirs_and_table_equal_the_metrics_files(finished_sweep):
    root = finished_sweep / "addition" / "advantages"
    for label in LABELS:
        d = root / label
        assert {"metrics.jsonl", "config.json", "start.json", "train.log", "done.json", "sweep_args.json"} <= \
            set(os.listdir(d))
        assert [r["step"] for r in read_rows(d)] == [1, 2, 3]
        assert json.load(open(d / "config.json"))["seed"] == int(label[-1])
        assert json.load(open(d / "config.json"))["warmup_seed"] == 0
    text = (root / "summary.md").read_text()
    assert "python -m experiments.sweep advantages --task addition --arms grpo,nsr --warmup_seeds 0 --seeds 0,1 " \
           "--steps 3" in text
    assert "nproc" in text and "INCOMPLETE" in text                          # 4 of the 60 planned runs
    header = table_row(text, "quantity")
    assert header == ["grpo (w0: s0,1)", "nsr (w0: s0,1)"]
    for k, arm in enumerate(("grpo", "nsr")):
        rows = [read_rows(root / arm / "warmup_0" / f"seed_{s}") for s in (0, 1)]
        entropy = [np.mean([r["entropy"] for r in rs]) for rs in rows]             # 3 steps < 10: all of them
        m_F = [np.mean([r["m_F"] for r in rs]) for rs in rows]
        final = [rs[-1]["eval/pass@1"] for rs in rows]
        pass4 = [rs[-1]["eval/pass@4"] for rs in rows]
        minutes = [rs[-1]["time/elapsed"] / 60 for rs in rows]
        assert table_row(text, "entropy, last 10 steps")[k] == pages.cell(entropy)
        assert table_row(text, "m_F (mean)")[k] == pages.cell(m_F)
        assert table_row(text, "final pass@1")[k] == pages.cell(final)
        assert table_row(text, "final pass@k")[k] == pages.cell(pass4)
        assert table_row(text, "minutes")[k] == pages.cell(minutes)
    # nsr pushes every (wrong) rollout down: m_F = 1 per rollout; grpo on an all-wrong model: 0
    assert table_row(text, "m_F (mean)") == ["0 ± 0 [0 0]", "1 ± 0 [1 1]"]
    # the checks of these arms are measured (nsr gives successes no mass), those of others are not
    assert "| nsr gives successes no mass | m_S (mean) | nsr | 2 | 0 | exactly 0 | **pass** |" in text
    verdicts = {v["claim"]: v for v in json.load(open(root / "verdicts.json"))}
    assert set(verdicts) == set()                 # every finding compares with mean, which did not run
    assert (root / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_resume_skips_finished_runs_and_continues_an_interrupted_one(finished_sweep, tiny_dir, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(finished_sweep, out)                   # leave the module's sweep as it was
    root = out / "addition" / "advantages"
    before = read_rows(root / "nsr" / "warmup_0" / "seed_1")
    # Make nsr/warmup_0/seed_1 look killed after its step-2 checkpoint: no done.json, no
    # step-3 checkpoint, metrics up to step 2.
    killed = root / "nsr" / "warmup_0" / "seed_1"
    os.remove(killed / "done.json")
    shutil.rmtree(killed / "checkpoints" / "step_000003")
    (killed / "checkpoints" / "latest").write_text("step_000002")
    (killed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in before[:2]))
    untouched = {label: {f: os.stat(root / label / f).st_mtime_ns for f in ("metrics.jsonl", "train.log", "done.json")}
                 for label in LABELS if label != "nsr/warmup_0/seed_1"}
    capsys.readouterr()

    sweep.main([*ARGV, "--out", str(out), *train_extra(tiny_dir)])
    for label, mtimes in untouched.items():
        assert {f: os.stat(root / label / f).st_mtime_ns for f in mtimes} == mtimes, label
    log = (root / "sweep.log").read_text().splitlines()
    second = log[max(i for i, line in enumerate(log) if "python -m experiments.sweep" in line) + 1:]   # this invocation
    assert len(second) == 5                                # 3 skipped, 1 resumed, 1 done
    assert sum("skipped (finished before)" in line for line in second) == 3
    assert any("advantages/nsr/warmup_0/seed_1: resumed" in line for line in second)
    assert "--resume" in (killed / "train.log").read_text().split("=== sweep.py")[-1].splitlines()[0]
    drop = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert drop(read_rows(killed)) == drop(before)         # continued exactly (train.py's resume)
    assert os.path.isfile(killed / "done.json")
    # Without --keep_weights the run it finished keeps no weights; the skipped ones keep theirs.
    assert not any((killed / name).exists() for name in sweep.WEIGHT_DIRS)
    for label in untouched:
        assert all((root / label / name).is_dir() for name in sweep.WEIGHT_DIRS), label

    # Other flags on a finished directory: an error naming it, nothing run.
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        sweep.main([*ARGV[:-4], "--steps", "4", "--jobs", "2", "--out", str(out), *train_extra(tiny_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "holds a run with other train.py flags" in err[0]
    assert [r["step"] for r in read_rows(root / "grpo" / "warmup_0" / "seed_0")] == [1, 2, 3]


@pytest.mark.slow
def test_failing_arm_exits_nonzero_naming_the_run_and_its_log(tiny_dir, tmp_path, capsys, monkeypatch):
    def broken(task):
        spec = designs_fade.advantages(task)
        spec.arms = {"grpo": spec.arms["grpo"], "broken": ["--data", str(tmp_path / "missing.jsonl")]}
        return spec
    monkeypatch.setitem(sweep.SWEEPS, "advantages", broken)
    with pytest.raises(SystemExit) as e:
        sweep.main(["advantages", "--task", "addition", "--arms", "grpo,broken", "--warmup_seeds", "0", "--seeds", "0",
                    "--steps", "2", "--out", str(tmp_path), *train_extra(tiny_dir)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep.py:")]
    log = tmp_path / "addition" / "advantages" / "broken" / "warmup_0" / "seed_0" / "train.log"
    assert e.value.code == 1
    assert err == [f"sweep.py: run advantages/broken/warmup_0/seed_0 failed (exit code 2); log: {log}"]
    assert "missing.jsonl" in log.read_text()
    root = tmp_path / "addition" / "advantages"
    assert os.path.isfile(root / "grpo" / "warmup_0" / "seed_0" / "done.json")      # the other one finished
    assert not os.path.exists(root / "broken" / "warmup_0" / "seed_0" / "done.json")
    assert "INCOMPLETE" in (root / "summary.md").read_text()


def test_a_part_whose_runs_all_failed_says_so_not_that_its_data_is_committed(tiny_dir, tmp_path, capsys,
                                                                              monkeypatch):
    def broken(task):
        spec = designs_fade.advantages(task)
        spec.arms = {"broken": ["--data", str(tmp_path / "missing.jsonl")]}
        return spec
    monkeypatch.setitem(sweep.SWEEPS, "advantages", broken)
    with pytest.raises(SystemExit) as e:
        sweep.main(["advantages", "--task", "addition", "--arms", "broken", "--warmup_seeds", "0", "--seeds", "0",
                    "--steps", "2", "--out", str(tmp_path), *train_extra(tiny_dir)])
    out = capsys.readouterr()
    assert e.value.code == 1
    assert "advantages: no finished run under" in out.out + out.err and "1 failed (below)" in out.out + out.err
    assert "its runs are in the committed data" not in out.out + out.err


@pytest.mark.parametrize("argv, needle", [
    (["nope"], "invalid choice: 'nope'"),
    (["advantages", "--arms", "grpo,gpro"], "--arms: gpro not in sweep advantages"),
    (["all", "--arms", "grpo"], "--arms needs one sweep"),
    (["dfpo", "--seeds", "0,x"], "--seeds must be comma-separated integers"),
    (["dfpo", "--seeds", "1,1"], "--seeds must name distinct seeds"),
    (["dfpo", "--warmup_seeds", "-1"], "--warmup_seeds must name distinct seeds >= 0"),
    (["dfpo", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["dfpo", "--part", "3/2"], "--part K/N needs 1 <= K <= N, got '3/2'"),
    (["dfpo", "--part", "half"], "--part must read K/N"),
    (["all", "--part", "1/2"], "--part needs one sweep"),
    (["dfpo", "--part", "1/2", "--seeds", "0"], "--part picks its own runs"),
    (["dfpo", "--", "--lr", "-1"], "dfpo/grpo/warmup_0/seed_0: train.py: error: --lr must be in (0, 1.0], got -1.0"),
])
def test_cli_bad_input_is_one_line_and_exit_code_2(argv, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main([*argv[:1], "--out", str(tmp_path), *argv[1:]])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("sweep.py: error:") and needle in err[0], err
    assert not os.path.exists(tmp_path / "countdown" / "dfpo" / "grpo")     # nothing was run


@pytest.mark.slow
def test_parts_slice_the_plan_by_warm_up_seed_and_cover_it_once(tmp_path):
    spec = designs_cancellation.credit("addition")
    runs = sweep.plan_runs(spec, list(spec.arms), [0, 1], [0, 1, 2, 3, 4], 10, str(tmp_path), [], "addition")
    assert len(runs) == 20 and runs[0].args[:6] == ["--out_dir", runs[0].dir, "--seed", "0", "--warmup_seed", "0"]
    halves = [sweep_plan.select_part(runs, k, 2) for k in (1, 2)]
    assert [{r.warmup_seed for r in h} for h in halves] == [{0}, {1}]             # K = 2: one warm-up seed each
    for parts in (3, 6, 7):
        slices = [sweep_plan.select_part(runs, k, parts) for k in range(1, parts + 1)]
        assert [r.label for s in slices for r in s] == [r.label for r in runs]  # each run once, in order
        assert max(map(len, slices)) - min(map(len, slices)) <= 1
    assert runs[0].dir.endswith(os.path.join("addition", "credit", "grpo", "warmup_0", "seed_0"))


def test_a_run_committed_with_the_same_flags_is_not_run_again_on_another_machine(tmp_path):
    """A part stopped before it finished goes on elsewhere with an empty runs/: the
    runs whose data is committed with the same flags are skipped, from any --out; a run
    committed with other flags (here --steps), with no flags recorded, or in another sweep's
    file (the same arm and seeds) is run again."""
    spec = designs_cancellation.credit("addition")
    here = sweep.plan_runs(spec, list(spec.arms), [0], [0, 1], 10, str(tmp_path / "there"), [], "addition")
    docs = tmp_path / "docs"
    docs.mkdir()
    committed = [pages.RunData(r.arm, r.warmup_seed, r.seed, [{"step": 10}], dict(pages.EMPTY_RECORD, args=r.args))
                 for r in here[:2]]
    committed[1].record["args"] = [a if a != "10" else "12" for a in here[1].args]        # other --steps
    committed.append(pages.RunData(here[2].arm, here[2].warmup_seed, here[2].seed, [{"step": 10}],
                                   dict(pages.EMPTY_RECORD)))                             # data with no flags
    pages.write_run_data(committed, str(docs / "sweep_addition_credit.jsonl.gz"))
    pages.write_run_data([pages.RunData(here[3].arm, here[3].warmup_seed, here[3].seed, [{"step": 10}],
                                        dict(pages.EMPTY_RECORD, args=here[3].args))],
                         str(docs / "sweep_addition_advantages.jsonl.gz"))                # another sweep's file
    elsewhere = sweep.plan_runs(spec, list(spec.arms), [0], [0, 1], 10, str(tmp_path / "new_out"), [], "addition")
    adv = designs_fade.advantages("addition")
    others = sweep.plan_runs(adv, ["psr"], [0], [0, 1], 10, str(tmp_path / "new_out"), [], "addition")
    assert set(sweep_plan.committed_records(elsewhere + others, str(docs), "addition")) == {here[0].label}
    assert sweep_plan.committed_records(elsewhere, str(tmp_path / "no_docs"), "addition") == {}


def test_plan_marks_a_part_done_only_when_its_runs_are_committed_with_todays_flags(tmp_path):
    """credit on addition is one part of 20 runs: with all 20 committed with the design's
    flags, plan says "done" and their mean minutes (90 s each: 1.5); with one of them
    committed with other flags (--steps), it counts 19 and leaves its 300 s out of the mean;
    with no data, nothing."""
    spec, steps = designs_cancellation.credit("addition"), designs.settings("addition", "credit")["steps"]
    keys = [(arm, w, seed) for w in designs.WARMUP_SEEDS for arm in spec.arms for seed in designs.SEEDS]
    data = [pages.RunData(*key, [{"step": steps}],
                          dict(pages.EMPTY_RECORD, args=sweep_plan.run_args(spec, *key, steps, "/x", [], "addition"),
                               seconds=90.0))
            for key in keys]
    docs = tmp_path / "docs"
    docs.mkdir()
    pages.write_run_data(data, str(docs / "sweep_addition_credit.jsonl.gz"))
    assert sweep_plan.committed_per_part("addition", "credit", str(docs)) == ([(20, 20)], 1.5)
    text = sweep_plan.plan_text(["addition"], str(docs))
    assert "    credit      addition     20 of 20       1.0       1.5" in text
    assert "python -m experiments.sweep credit --task addition" in text
    assert [line for line in text.splitlines()
            if line.strip().startswith("python -m experiments.sweep credit --task addition")][0].endswith("# done")
    data[5].record["args"] = [a if a != str(steps) else str(steps + 1) for a in data[5].record["args"]]
    data[5].record["seconds"] = 300.0
    pages.write_run_data(data, str(docs / "sweep_addition_credit.jsonl.gz"))
    assert sweep_plan.committed_per_part("addition", "credit", str(docs)) == ([(19, 20)], 1.5)
    assert sweep_plan.committed_per_part("addition", "credit", str(tmp_path / "none")) == ([(0, 20)], None)


def test_plan_prints_the_budget_and_every_part_command(capsys):
    sweep.main(["plan"])
    out = capsys.readouterr().out
    assert registry.budget_table() in out
    for task in designs.TASKS:
        for name in registry.SWEEPS:
            base = f"python -m experiments.sweep {name} --task {task}"
            if not designs.runs_on(task, name):
                assert base not in out
                continue
            parts = designs.settings(task, name)["parts"]
            assert (f"{base} --part {parts}/{parts}" if parts > 1 else base) in out


def test_pilot_costs_from_a_runs_step_times(tmp_path):
    # 7 steps of 1 s, two of them with an evaluation that adds 1.5 s (at steps 4 and 7)
    elapsed = [1.0, 2.0, 3.0, 5.5, 6.5, 7.5, 10.0]
    rows = [{"step": i + 1, "time/elapsed": t, **({"eval/pass@1": 0.5} if i + 1 in (4, 7) else {})}
            for i, t in enumerate(elapsed)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = sweep_plan.RunSpec("credit", "grpo", 0, 0, str(tmp_path), ["--n_eval", "100", "--eval_samples", "16"], 7, None)
    costs = sweep_plan.pilot_costs([run], {run.label: {"seconds": 22.0}})["credit"]
    assert costs == {"step_s": 1.0, "sample_s": pytest.approx(1.5 / 1600), "start_s": 12.0}


# ---------------------------------------------------------------------------------------
# One sweep per --out, no orphans, and a rerun that finishes each run once
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_with_complete_metrics_but_no_done_json_is_finished_not_rerun(finished_sweep, tiny_dir, tmp_path):
    """The sweep was killed after the run's last step and before done.json. Before, the rerun
    resumed it, train.py found nothing to do, and the run failed on every rerun."""
    out = tmp_path / "copy"
    shutil.copytree(finished_sweep, out)
    run = out / "addition" / "advantages" / "grpo" / "warmup_0" / "seed_1"
    os.remove(run / "done.json")
    log_before = (run / "train.log").read_text()
    sweep.main([*ARGV, "--out", str(out), *train_extra(tiny_dir)])     # exits normally: nothing failed
    assert (run / "train.log").read_text() == log_before              # train.py was not started again
    assert json.load(open(run / "done.json"))["steps"] == 3
    assert [r["step"] for r in read_rows(run)] == [1, 2, 3]
    assert not any((run / name).exists() for name in sweep.WEIGHT_DIRS)          # no --keep_weights


def train_processes(marker: str) -> list[int]:
    """PIDs of live train.py processes whose command line mentions `marker`."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if "train.py" in cmd and marker in cmd and state != "Z":
            pids.append(int(pid))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc: Linux")
@pytest.mark.slow
def test_killed_sweep_leaves_no_orphans_and_its_rerun_finishes_each_run_once(tiny_dir, tmp_path, capsys):
    """kill -9 of the sweep mid-run: its train.py processes die with it (before, they kept
    writing); a second sweep on the same --out is refused while the first runs; the rerun
    finishes every run, each step logged exactly once."""
    out = tmp_path / "out"
    argv = ["advantages", "--task", "addition", "--arms", "grpo,nsr", "--warmup_seeds", "0", "--seeds", "0", "--steps", "12", "--jobs", "2",
            "--out", str(out), *train_extra(tiny_dir)[:-4], "--eval_every", "4", "--save_every", "2"]
    labels = ["grpo/warmup_0/seed_0", "nsr/warmup_0/seed_0"]
    first = subprocess.Popen([sys.executable, "-m", "experiments.sweep", *argv], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = out / "addition" / "advantages"
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        if any(os.path.exists(p) and len(read_rows(os.path.dirname(p))) >= 2
               for p in (root / label / "metrics.jsonl" for label in labels)):
            break
        time.sleep(0.2)
    assert first.poll() is None, "the sweep ended before it could be killed"

    with pytest.raises(SystemExit) as e:                    # a second sweep on the same --out
        sweep.main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and f"is in use by another process (PID {first.pid})" in err[0], err

    running = train_processes(str(out))
    assert running, "no train.py was running"
    first.kill()
    first.wait()
    deadline = time.time() + 60
    while train_processes(str(out)) and time.time() < deadline:
        time.sleep(0.2)
    assert train_processes(str(out)) == []
    # ... and they died with the sweep, mid-run, rather than running to their end:
    logged = [len(read_rows(root / label)) for label in labels if (root / label / "metrics.jsonl").exists()]
    assert logged and max(logged) < 12, logged

    sweep.main(argv)
    for label in labels:
        assert os.path.isfile(root / label / "done.json"), label
        assert [r["step"] for r in read_rows(root / label)] == list(range(1, 13)), label



def test_the_float_path_is_part_of_what_a_pair_must_share():
    """One CPU model name covers EPYCs with and without AVX-512: start.json's float_path
    (torch's kernels) is part of the pairing key, and a run recorded without it is never
    assumed to match one recorded with it."""
    machine = "nproc 2, AMD EPYC, Linux x86_64"
    avx2 = {"machine": machine, "start": {"sha256": "x", "float_path": "AVX2"}}
    avx512 = {"machine": machine, "start": {"sha256": "x", "float_path": "AVX512"}}
    unrecorded = {"machine": machine, "start": {"sha256": "x"}}
    assert pages.cpu_model(avx2) == "AMD EPYC, AVX2" and pages.cpu_model(unrecorded) == "AMD EPYC"
    assert len({pages.cpu_model(r) for r in (avx2, avx512, unrecorded)}) == 3
    assert pages.cpu_model({"machine": None}) is None
    # the pairing rule reads it: a pair of an AVX2 and an AVX-512 run is left out
    values = {("x", arm): {(0, s): float(s + (arm == "a")) for s in range(4)} for arm in ("a", "b")}
    cpus = {(arm, (0, s)): pages.cpu_model(avx512 if (arm, s) == ("b", 0) else avx2) for arm in "ab" for s in range(4)}
    rec = claims.judge([claims.Claim("P", "a above b", "q", "x", "a", "b", +1)], values, {}, cpus=cpus)[0]
    assert rec["n"] == 3 and "1 pair left out" in rec["detail"]


def test_a_repeated_flag_is_noted_with_the_value_train_py_runs():
    # The masked sweep on SmolLM2 gives the recipe's --lr 1e-05 and then its own --lr 3e-5:
    # the page prints the command as recorded and says which value ran.
    flags = ("--lr", "1e-05", "--steps", "40", "--share_prompts", "--lr", "3e-5")
    assert pages.repeated_flags(flags) == " (--lr is given 2 times: train.py takes the last, 3e-5)"
    assert pages.repeated_flags(("--lr", "3e-5", "--steps", "40", "--share_prompts")) == ""
    assert pages.repeated_flags(("--share_prompts", "--share_prompts")) == \
        " (--share_prompts is given 2 times: train.py takes the last, (set))"
    # and the note is true of train.py's parser: the last value is the run's
    from machinery.config import parse_args
    assert parse_args(["--lr", "1e-05", "--lr", "3e-5", "--steps", "3"]).lr == 3e-5
