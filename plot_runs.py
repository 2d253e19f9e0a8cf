"""plot_runs.py: turn one or several run directories into one PNG of panels.

    python plot_runs.py runs/default                      # -> runs/default/plots.png
    python plot_runs.py runs/grpo runs/fade --out compare.png --smooth 5

train.py appends one JSON object per step to RUN_DIR/metrics.jsonl (keys in spec section
7: reward, entropy, m_S, m_F, sched/*, eval/pass@K, flip/*, time/*, ...). Each panel
below draws the keys it knows; a panel none of whose keys appear in any run is skipped,
so a run without a FADE schedule draws no scheduler panel. With several runs every
panel has one colour per run, labelled by the run's advantage and directory name.

Also prints a one-row-per-run summary table (final reward, last and best held-out
pass@1, steps, wall time): the numbers the README quotes come from it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

# (panel title, [(key, line label), ...]); keys ending in "*" match a prefix.
PANELS = [
    ("reward (train batches)", [("reward", "reward"), ("reward/format", "format"), ("reward/correct", "correct")]),
    ("held-out pass@k", [("eval/pass@*", None)]),
    ("entropy (nats / token)", [("entropy", "entropy"), ("sched/H_hat", "H_hat"), ("sched/H_target", "H_target")]),
    ("gradient mass per rollout", [("m_S", "m_S"), ("m_F", "m_F")]),
    ("FADE schedule", [("sched/alpha", "alpha"), ("sched/delta", "delta"), ("sched/p_hat", "p_hat")]),
    ("KL and clipping", [("approx_kl", "approx KL(old||new)"), ("kl_ref", "KL to ref"),
                         ("clip_frac_low", "clip low"), ("clip_frac_high", "clip high")]),
    ("cancellation", [("cancellation_residual", "residual R_g"), ("frac_all_equal", "all-equal groups"),
                      ("mb/split_groups", "split groups / step")]),
    ("token flips", [("flip/boost_pos", "boost pos"), ("flip/suppress_pos", "suppress pos"),
                     ("flip/boost_neg", "boost neg"), ("flip/suppress_neg", "suppress neg")]),
    ("response length", [("resp_len_mean", "mean"), ("resp_len_max", "max"), ("truncation_rate", "truncated")]),
    ("seconds per phase", [("time/generate", "generate"), ("time/score", "score"), ("time/train", "train")]),
]


def load_metrics(run_dir: str) -> dict:
    """{key: (steps ndarray, values ndarray)} from RUN_DIR/metrics.jsonl.

    Missing keys on a step are simply absent from that key's arrays; null becomes NaN.
    A malformed line raises ValueError naming the file and the 1-based line number.
    """
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir!r}")
    series: dict[str, tuple[list, list]] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = int(row["step"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a metrics row ({e})") from None
            for key, value in row.items():
                if key == "step" or isinstance(value, (str, list, dict, bool)):
                    continue
                s, v = series.setdefault(key, ([], []))
                s.append(step)
                v.append(float("nan") if value is None else float(value))
    return {k: (np.asarray(s), np.asarray(v, dtype=float)) for k, (s, v) in series.items()}


def smooth(values: np.ndarray, n: int) -> np.ndarray:
    """Trailing moving average over the last n points, ignoring NaNs (n = 1: unchanged).

    Example: smooth([1, 2, nan, 4], 2) = [1, 1.5, 2, 4]: a NaN is skipped, not spread.
    """
    if n <= 1:
        return values
    out = np.empty_like(values)
    for i in range(len(values)):
        window = values[max(0, i - n + 1): i + 1]
        window = window[~np.isnan(window)]
        out[i] = window.mean() if len(window) else np.nan
    return out


def run_label(run_dir: str) -> str:
    """'<advantage> (<dir name>)' from config.json when present, else the dir name."""
    name = os.path.basename(os.path.normpath(run_dir))
    try:
        cfg = json.load(open(os.path.join(run_dir, "config.json")))
        return f"{cfg.get('advantage', '?')} ({name})"
    except (OSError, ValueError):
        return name


def plot_runs(run_dirs: list[str], out: str, smooth_n: int = 1) -> list[str]:
    """Draw every panel that has data into `out`; returns the drawn panels' titles."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(run_label(d), load_metrics(d)) for d in run_dirs]
    drawn = []
    for title, keys in PANELS:
        lines = []
        for r, (label, series) in enumerate(runs):
            for key, name in keys:
                matches = sorted((k for k in series if k.startswith(key[:-1])), key=_pass_k_order) \
                    if key.endswith("*") else ([key] if key in series else [])
                if len(runs) > 1 and key.endswith("*") and len(matches) > 2:
                    matches = [matches[0], matches[-1]]          # pass@1 and the largest k
                for k in matches:
                    lines.append((r, label, name or k.split("/")[-1], k, series[k]))
        if lines:
            drawn.append((title, lines))

    cols = 3
    rows = max(1, math.ceil(len(drawn) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (title, lines) in zip(axes.flat, drawn):
        seen = {}
        for r, label, name, key, (steps, values) in lines:
            j = seen.setdefault((r,), 0)
            seen[(r,)] = j + 1
            color = f"C{r}" if len(runs) > 1 else f"C{j}"
            ls = styles[j % len(styles)] if len(runs) > 1 else "-"
            text = f"{name} · {label}" if len(runs) > 1 else name
            ax.plot(steps, smooth(values, smooth_n), color=color, ls=ls, lw=1.4, label=text,
                    marker="o" if key.startswith("eval/") else None, ms=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(drawn):]:
        ax.axis("off")
    fig.suptitle(" vs ".join(label for label, _ in runs))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [title for title, _ in drawn]


def summarize(run_dir: str) -> dict:
    """Headline numbers of a run: steps, final reward, last/best held-out pass@1, minutes."""
    series = load_metrics(run_dir)
    out = {"run": run_label(run_dir), "steps": int(series["reward"][0][-1]) if "reward" in series else 0}
    if "reward" in series:
        out["final_reward"] = float(series["reward"][1][-1])
    if "eval/pass@1" in series:
        steps, values = series["eval/pass@1"]
        out["last_pass@1"] = float(values[-1])
        out["best_pass@1"] = float(np.nanmax(values))
        out["best_step"] = int(steps[int(np.nanargmax(values))])
    if "time/elapsed" in series:
        out["minutes"] = float(series["time/elapsed"][1][-1]) / 60
    return out


def _pass_k_order(key: str) -> int:
    try:
        return int(key.rsplit("@", 1)[1])
    except (IndexError, ValueError):
        return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plot train.py run directories.")
    parser.error = lambda message: parser.exit(2, f"plot_runs.py: error: {message}\n")
    parser.add_argument("runs", nargs="+", help="run directories (each holds metrics.jsonl)")
    parser.add_argument("--out", help="PNG path (default RUN/plots.png for one run, compare.png for several)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps (1 = off)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth must be >= 1, got {args.smooth}")
    for d in args.runs:
        if not os.path.isfile(os.path.join(d, "metrics.jsonl")):
            parser.error(f"no metrics.jsonl in {d!r}")
    out = args.out or (os.path.join(args.runs[0], "plots.png") if len(args.runs) == 1 else "compare.png")
    try:
        titles = plot_runs(args.runs, out, args.smooth)
        rows = [summarize(d) for d in args.runs]
    except ValueError as e:
        parser.error(str(e))
    print(f"wrote {out} ({len(titles)} panels)")
    cols = ["run", "steps", "final_reward", "last_pass@1", "best_pass@1", "best_step", "minutes"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in cols))


if __name__ == "__main__":
    main(sys.argv[1:])
