"""tools/plot_runs.py on synthetic metrics.jsonl files: loading, smoothing, panel choice, summary, CLI."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tools import plot_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path, rows, config=None):
    """A run directory with metrics.jsonl (dict rows as JSON, str rows verbatim)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    if config is not None:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    return str(path)


# Four steps; evaluation on steps 2 and 4 only; entropy null on step 2.
ROWS = [{"step": 1, "reward": 0.2, "entropy": 1.0, "time/elapsed": 30.0},
        {"step": 2, "reward": 0.4, "entropy": None, "eval/pass@1": 0.3, "eval/pass@4": 0.6, "time/elapsed": 60.0},
        {"step": 3, "reward": 0.5, "entropy": 0.8, "time/elapsed": 90.0},
        {"step": 4, "reward": 0.7, "entropy": 0.7, "eval/pass@1": 0.25, "eval/pass@4": 0.7, "time/elapsed": 120.0}]


def test_load_metrics_gaps_nulls_duplicates(tmp_path):
    rows = ROWS + ["", {"step": 4, "reward": 0.9, "note": "text", "done": True}]   # blank line, re-logged step 4
    m = plot_runs.load_metrics(write_run(tmp_path / "r", rows))
    steps, values = m["eval/pass@1"]
    assert steps.tolist() == [2, 4] and values.tolist() == [0.3, 0.25]       # sparse key keeps its own steps
    assert m["entropy"][0].tolist() == [1, 2, 3, 4] and math.isnan(m["entropy"][1][1])
    assert m["reward"][1].tolist() == [0.2, 0.4, 0.5, 0.9]                  # the later line wins
    assert "note" not in m and "done" not in m and "step" not in m          # not curves


@pytest.mark.parametrize("bad", ["{not json", '{"reward": 0.5}', "[1, 2]", '{"step": null}'])
def test_malformed_line_names_file_and_line(tmp_path, bad):
    d = write_run(tmp_path / "r", [ROWS[0], ROWS[1], bad, ROWS[3]])
    with pytest.raises(ValueError, match=r"metrics\.jsonl:3: not a metrics row"):
        plot_runs.load_metrics(d)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_runs.load_metrics(str(tmp_path))


def test_smoothing_hand_examples():
    steps = np.array([1, 2, 3, 5])
    values = np.array([1.0, 2.0, np.nan, 4.0])
    # n=2: step 3 averages steps 2..3 skipping the NaN; step 5's window (3, 5] is itself.
    assert plot_runs.smooth(steps, values, 2).tolist() == [1.0, 1.5, 2.0, 4.0]
    # n=3: step 5's window (2, 5] holds steps 3 (NaN) and 5 only: 4, not the mean of the
    # last three logged points (a window counted in points would give 3.0).
    assert plot_runs.smooth(steps, values, 3).tolist() == [1.0, 1.5, 1.5, 4.0]
    out = plot_runs.smooth(steps, values, 1)                                 # off: NaN stays a gap
    assert out[:2].tolist() == [1.0, 2.0] and math.isnan(out[2]) and out[3] == 4.0
    assert np.isnan(plot_runs.smooth(np.array([1, 2]), np.array([np.nan, np.nan]), 3)).all()
    lr = np.full(5000, 4e-4)                                                 # constant stays exactly constant
    assert (plot_runs.smooth(np.arange(5000), lr, 7) == 4e-4).all()
    with pytest.raises(ValueError, match="got 0"):
        plot_runs.smooth(steps, values, 0)


def test_panels_skipped_when_keys_absent_and_png_written(tmp_path):
    out = tmp_path / "p.png"
    titles = plot_runs.plot_runs([write_run(tmp_path / "r", ROWS)], str(out))
    # time/elapsed is the only time key and is not drawn: no "seconds per phase" panel.
    assert titles == ["held-out pass@k", "reward (training batches)", "entropy (nats / token)"]   # the lesson first
    assert out.read_bytes()[:8] == PNG_MAGIC
    # Negative control: the same run with scheduler state and a phase time gains exactly
    # those panels (H_hat joins the existing entropy panel).
    sched = [dict(r, **{"sched/alpha": 1.0, "sched/delta": 0.9, "sched/H_hat": 0.8, "time/train": 0.1})
             for r in ROWS]
    titles = plot_runs.plot_runs([write_run(tmp_path / "s", sched)], str(out), smooth_n=2)
    assert titles == ["held-out pass@k", "reward (training batches)", "entropy (nats / token)",
                      "FADE schedule", "seconds per phase"]


def test_the_first_figure_is_the_lesson_and_the_dashboard_is_behind_a_flag(tmp_path, capsys):
    import matplotlib.image
    full = [dict(r, cancellation_residual=0.0) for r in ROWS] + [{"step": s, "reward": 0.5, "entropy": 0.5,
                                                                  "sched/alpha": 1.0} for s in range(5, 60)]
    a = write_run(tmp_path / "a", full)
    plot_runs.main([a])                                                   # RUN/plots.png: four panels, 1200 x 800
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'a' / 'plots.png'} (4 panels)")
    assert matplotlib.image.imread(tmp_path / "a" / "plots.png").shape[:2] == (800, 1200)
    assert plot_runs.plot_lesson([a], str(tmp_path / "l.png")) == [t for t, *_ in plot_runs.LESSON] == [
        "held-out pass@1", "training reward", "token entropy (nats)", "cancellation residual R_g"]
    # A metric not logged keeps its panel (saying which flag logs it) and is not counted as drawn.
    assert plot_runs.plot_lesson([write_run(tmp_path / "r", ROWS)], str(tmp_path / "m.png")) == [
        "held-out pass@1", "training reward", "token entropy (nats)"]
    plot_runs.main([a, "--dashboard"])                                    # every panel, into a second file
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'a' / 'dashboard.png'} (5 panels)")
    assert matplotlib.image.imread(tmp_path / "a" / "dashboard.png").shape[:2] == (680, 1680)
    plot_runs.main([a, a, "--dashboard"])
    assert (tmp_path / "a" / "compare_dashboard.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs.plot_lesson([write_run(tmp_path / "n", [{"step": 1, "grad_norm": 1.0}])], str(tmp_path / "n.png"))


def test_every_lesson_panel_shares_the_runs_step_axis(tmp_path, monkeypatch):
    """A residual logged at one step (--flip_every 10 in a 40-step run) is drawn on the
    run's step axis, 1..40, like the other panels, not on an axis of its own around step 10."""
    rows = [dict({"step": s, "reward": 0.5, "entropy": 0.5}, **({"cancellation_residual": 0.01} if s == 10 else {}))
            for s in range(1, 41)]
    figures = []
    monkeypatch.setattr(plot_runs.plt, "close", figures.append)
    plot_runs.plot_lesson([write_run(tmp_path / "r", rows)], str(tmp_path / "l.png"))
    limits = [ax.get_xlim() for ax in figures[0].axes]
    assert len(limits) == 4 and len(set(limits)) == 1
    assert limits[0][0] < 1 and limits[0][1] > 40 and limits[0][1] - limits[0][0] < 45


def test_pass_at_k_lines_single_run_vs_comparison(tmp_path):
    rows = [{"step": 1, "reward": 0.5, **{f"eval/pass@{k}": 0.1 * k for k in (1, 2, 4, 8, 16)}}]
    series = plot_runs.load_metrics(write_run(tmp_path / "r", rows))
    keys = lambda panels: [key for title, lines in panels if title == "held-out pass@k" for _, key, _ in lines]
    # One run: every k, in numeric order (pass@16 last, not after pass@1 as strings sort).
    assert keys(plot_runs.select_panels([("a", series)])) == [f"eval/pass@{k}" for k in (1, 2, 4, 8, 16)]
    # Two runs: pass@1 and the largest k per run.
    assert keys(plot_runs.select_panels([("a", series), ("b", series)])) == ["eval/pass@1", "eval/pass@16"] * 2


def test_nothing_to_plot_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs.plot_runs([write_run(tmp_path / "r", [{"step": 1, "unknown_key": 1.0}])], str(tmp_path / "x.png"))


def test_run_label(tmp_path):
    assert plot_runs.run_label(write_run(tmp_path / "a", ROWS)) == "a"
    assert plot_runs.run_label(write_run(tmp_path / "b", ROWS, {"advantage": "grpo", "schedule": "constant"})) == "grpo (b)"
    assert plot_runs.run_label(write_run(tmp_path / "c", ROWS, {"advantage": "fade", "schedule": "fade"})) == "fade+fade (c)"
    nested = {"advantage": "fade", "sched": {"schedule": "fade_rel"}}                     # as train.py writes it
    assert plot_runs.run_label(write_run(tmp_path / "e", ROWS, nested)) == "fade+fade_rel (e)"
    assert plot_runs.run_label(write_run(tmp_path / "d", ROWS, {"advantage": "fade", "name": "mine"})) == "mine"


def test_summarize(tmp_path):
    s = plot_runs.summarize(write_run(tmp_path / "r", ROWS, {"advantage": "grpo"}))
    assert s == {"run": "grpo (r)", "steps": 4, "final_reward": 0.7, "last_pass@1": 0.25,
                 "best_pass@1": 0.3, "best_step": 2, "minutes": 2.0}
    # No time/elapsed: the per-phase times are summed (0.5 + 1.0 + 1.5 s), no eval: no pass@1.
    rows = [{"step": s, "reward": 0.1, "time/generate": 0.5 * s} for s in (1, 2, 3)]
    s = plot_runs.summarize(write_run(tmp_path / "t", rows))
    assert s["minutes"] == pytest.approx(3.0 / 60) and "last_pass@1" not in s and s["steps"] == 3
    table = plot_runs.format_table([plot_runs.summarize(str(tmp_path / "r")), s])
    assert table.splitlines()[2] == "| grpo (r) | 4 | 0.700 | - | 0.250 | 0.300 | 2 | 2.000 |"   # no step 0: no start
    assert table.splitlines()[3] == "| t | 3 | 0.100 | - | - | - | - | 0.050 |"


def test_cli_in_process(tmp_path, capsys, monkeypatch):
    a = write_run(tmp_path / "a", ROWS)
    b = write_run(tmp_path / "b", ROWS[:2])
    plot_runs.main([a])                                                      # default: RUN/plots.png
    assert (tmp_path / "a" / "plots.png").read_bytes()[:8] == PNG_MAGIC
    monkeypatch.chdir(tmp_path)
    plot_runs.main([a, b, "--smooth", "3"])                   # default: FIRST_RUN/compare.png, not ./
    assert (tmp_path / "a" / "compare.png").read_bytes()[:8] == PNG_MAGIC and not (tmp_path / "compare.png").exists()
    assert "| b | 2 | 0.400 | - | 0.300 | 0.300 | 2 | 1.000 |" in capsys.readouterr().out
    bad = write_run(tmp_path / "bad", [ROWS[0], "{oops"])
    for argv, message in [([str(tmp_path)], "no metrics.jsonl"), ([bad], "metrics.jsonl:2:"),
                          ([a, "--smooth", "0"], "--smooth must be >= 1, got 0"),
                          ([a, "--out", str(tmp_path / "nodir" / "x.png")], "directory does not exist"),
                          ([a, "--out", str(tmp_path / "a" / "metrics.jsonl" / "x.png")], "directory does not exist"),
                          ([a, "--out", str(tmp_path / "a")], "is a directory; expected a file name")]:
        with pytest.raises(SystemExit) as e:
            plot_runs.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, (argv, err)


def test_cli_missing_directory_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.plot_runs", str(tmp_path / "missing")], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"plot_runs.py: error: run directory {str(tmp_path / 'missing')!r} does not exist\n"
