"""plot_runs.py on synthetic metrics files: loading, smoothing, panel selection, CLI."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import plot_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_run(path, rows, config=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    if config is not None:
        json.dump(config, open(os.path.join(path, "config.json"), "w"))
    return str(path)


ROWS = [{"step": 1, "reward": 0.2, "entropy": 1.0, "time/elapsed": 30.0},
        {"step": 2, "reward": 0.4, "entropy": None, "eval/pass@1": 0.3, "eval/pass@4": 0.6, "time/elapsed": 60.0},
        {"step": 3, "reward": 0.5, "entropy": 0.8, "time/elapsed": 90.0},
        {"step": 4, "reward": 0.7, "entropy": 0.7, "eval/pass@1": 0.25, "eval/pass@4": 0.7, "time/elapsed": 120.0}]


def test_load_metrics_with_gaps_and_nulls(tmp_path):
    m = plot_runs.load_metrics(write_run(tmp_path / "r", ROWS))
    assert m["eval/pass@1"][0].tolist() == [2, 4] and m["eval/pass@1"][1].tolist() == [0.3, 0.25]
    assert math.isnan(m["entropy"][1][1]) and m["entropy"][0].tolist() == [1, 2, 3, 4]


def test_malformed_line_names_file_and_line(tmp_path):
    d = write_run(tmp_path / "r", [ROWS[0], "{not json", ROWS[2]])
    with pytest.raises(ValueError, match=r"metrics.jsonl:2:"):
        plot_runs.load_metrics(d)


def test_smoothing_skips_nans():
    out = plot_runs.smooth(np.array([1.0, 2.0, np.nan, 4.0]), 2)
    assert out.tolist() == [1.0, 1.5, 2.0, 4.0]
    assert plot_runs.smooth(np.array([1.0, 5.0]), 1).tolist() == [1.0, 5.0]


def test_panels_without_data_are_skipped_and_png_written(tmp_path):
    d = write_run(tmp_path / "r", ROWS, {"advantage": "fade"})
    out = tmp_path / "p.png"
    titles = plot_runs.plot_runs([d], str(out))
    assert titles == ["reward (train batches)", "held-out pass@k", "entropy (nats / token)"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_runs.run_label(d) == "fade (r)"


def test_summarize(tmp_path):
    s = plot_runs.summarize(write_run(tmp_path / "r", ROWS))
    assert s["steps"] == 4 and s["final_reward"] == 0.7
    assert s["last_pass@1"] == 0.25 and s["best_pass@1"] == 0.3 and s["best_step"] == 2
    assert s["minutes"] == 2.0


def test_cli_compares_runs_and_rejects_missing_dir(tmp_path):
    a, b = write_run(tmp_path / "a", ROWS), write_run(tmp_path / "b", ROWS[:2])
    out = tmp_path / "c.png"
    proc = subprocess.run([sys.executable, "plot_runs.py", a, b, "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and out.exists() and "0.250" in proc.stdout
    proc = subprocess.run([sys.executable, "plot_runs.py", str(tmp_path / "missing")], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "missing" in proc.stderr
