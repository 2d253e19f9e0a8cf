"""plot_runs.py: one or several run directories into one PNG of panels and a summary table.

    python -m tools.plot_runs runs/addition_s0                    # -> runs/addition_s0/plots.png
    python -m tools.plot_runs runs/grpo runs/fade --smooth 5      # -> runs/grpo/compare.png
    python -m tools.plot_runs runs/addition_s0 --dashboard        # -> runs/addition_s0/dashboard.png

Two figures. The first a run draws (plots.png, compare.png) is the lesson in four panels
(LESSON): did the policy learn (held-out pass@1, from the start at step 0), what it was
trained on (the training reward), what the learning cost (the token entropy), and
whether the updates of the tokens every rollout shares cancelled (the cancellation
residual). --dashboard draws every logged metric instead (PANELS: ~20 panels, the
diagnostics and the plumbing), into dashboard.png (compare_dashboard.png for several).

What a run leaves behind. train.py appends one JSON object per training step to
RUN_DIR/metrics.jsonl: {"step": 12, "reward": 0.61, "entropy": 0.07, ...}, with the keys of
docs/math.md §7. Not every key is on every line: held-out evaluation (eval/pass@K) runs
every few steps, token flips (flip/*) too, vLLM's canary only with --backend vllm. A value
may be null (or NaN) when it was undefined on that step. RUN_DIR/config.json holds the
run's Config, whose "advantage" (or an explicit "name") labels the run in legends.

What is drawn. PANELS below is the whole layout: a list of (title, keys). A panel draws
every key it names that appears in at least one run and is skipped when none does, so a
run without token-flip logging draws no flip panel. One run: one colour per key. Several
runs: the same panels, one colour per run (named once, at the top) and one line style per
key (named in each panel), so "grpo vs fade" is read panel by panel. Each panel's comment says what to look for in it.

What is printed. A Markdown table with one row per run (steps, final training reward,
last and best held-out pass@1, wall-clock minutes): the numbers the README quotes.

Conventions: the x axis is the training step (one rollout batch = one step); entropy and
KL are in nats; --smooth N averages over the last N *steps* (not the last N logged
points), so sparse keys such as eval/pass@K are left alone unless N spans several
evaluations. Matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")                      # files only; works on a headless machine
import matplotlib.pyplot as plt            # noqa: E402  (must follow matplotlib.use)
from matplotlib.lines import Line2D        # noqa: E402
import numpy as np                         # noqa: E402

from machinery import checks              # noqa: E402  (the shared checks at the door)

# ---------------------------------------------------------------------------------------
# The layout: (panel title, [(key, legend label), ...]).
# A key ending in "/" or "@" is a prefix: every logged key starting with it is drawn,
# labelled by the rest of its name ("eval/pass@" -> pass@1, pass@2, ...).
# ---------------------------------------------------------------------------------------
PANELS = [
    # The lesson first: did it learn (held-out pass@1 from step 0, the start), where did the
    # updates go, and did the shared tokens' updates cancel. The plumbing after.
    # Unbiased pass@k on held-out prompts (Chen et al. 2021). Comparing runs: only pass@1
    # and the largest k, or the panel drowns. pass@k rising while pass@1 stalls is the
    # "exploration kept" signature; pass@1 up and pass@k flat is sharpening.
    ("held-out pass@k", [("eval/pass@", None)]),
    # Where the step's change in log-prob went (diagnostics.where_updates_go, [recon]):
    # template tokens' and reasoning tokens' shares of sum |Δ log π|, next to the template's
    # share of the tokens themselves (a share equal to it = change spread evenly). The
    # paper: critic-free RL moves the share toward reasoning tokens, compared with psr.
    ("where updates go (share of |Δ log π|)", [("where/template_share", "template"),
                                               ("where/reasoning_share", "reasoning"),
                                               ("where/template_tokens", "template's share of tokens")]),
    # Cancellation Hypothesis paper (loss.py): R_g = |sum_i w_i A_i| / sum_i |w_i A_i| per
    # group, 0 when a token shared by the whole group gets updates that cancel exactly
    # (per-rollout weights w, e.g. GSPO's, break it). Also: the share of groups with no
    # signal at all (all rollouts equal, so all advantages 0).
    ("cancellation", [("cancellation_residual", "residual R_g"), ("frac_all_equal", "all-equal groups")]),
    # Mean 0/1 reward of each training batch and its parts (verify.py's score dict).
    # solve_rate equals reward for 0/1 rewards; it differs once reward is shaped.
    ("reward (training batches)", [("reward", "reward"), ("solve_rate", "solve rate"),
                                   ("reward/", None)]),
    # Token entropy of the sampling policy, with FADE's smoothed estimate H_hat and the
    # target H_target its delta steers toward (docs/math.md §4). These two are scheduler
    # state, but they are only readable next to the entropy they track.
    ("entropy (nats / token)", [("entropy", "entropy"), ("sched/H_hat", "H_hat (EMA)"),
                                ("sched/H_target", "H_target")]),
    # The same entropy split by token kind (tasks.template_token_mask): the wording, shared
    # by right and wrong rollouts and worth nothing, against the arithmetic that decides.
    ("entropy by token kind", [("entropy/template", "template tokens"), ("entropy/reasoning", "reasoning tokens")]),
    # Countdown: how many distinct right answers the model's correct samples give per
    # prompt, and the entropy of their distribution (our reading [recon] of the
    # design-conditions paper's "solution probability drift": unequal sequence weights drive it to 0).
    ("solutions among correct samples", [("eval/distinct_solutions", "distinct per solved prompt"),
                                         ("eval/solution_entropy", "entropy (nats)")]),
    # Per-rollout success and failure mass (FADE paper, docs/math.md §2). mean A is exactly
    # m_S - m_F: zero for every zero-sum advantage (GRPO, RLOO, ...); positive means the
    # tokens shared by a whole group are pushed up on net. (Not an entropy gauge: under SGD
    # the imbalance has no first-order effect on entropy in expectation, docs/math.md §2.3.)
    ("gradient mass per rollout", [("m_S", "m_S"), ("m_F", "m_F"), ("adv_mean", "mean A = m_S - m_F")]),
    # The rest of FADE's scheduler state: difficulty exponent alpha, failure scale delta,
    # EMA solve rate p_hat. A constant schedule logs them too (flat alpha and delta).
    ("FADE schedule", [("sched/alpha", "alpha"), ("sched/delta", "delta"), ("sched/p_hat", "p_hat")]),
    # approx_kl: k3 estimate of KL(old || new) over one batch's optimizer steps (0 when
    # on-policy with one optimizer step per batch); kl_ref: to the frozen reference. Clip
    # fractions: share of tokens whose gradient PPO's clip removed, low and high side
    # (CISPO removes none: there, tokens whose importance weight its clamp changed).
    # clip dual: share of A < 0 tokens whose loss the dual clip capped (0 with --dual_clip off).
    ("KL and clipping", [("approx_kl", "KL(old||new)"), ("kl_ref", "KL to ref"),
                         ("clip_frac_low", "clip low"), ("clip_frac_high", "clip high"),
                         ("clip_frac_dual", "clip dual")]),
    # How optimizer steps cut the batch (batching.py): groups split across steps cannot
    # cancel inside one step; the largest |#positive - #negative| rollouts in one step.
    ("mini-batch composition", [("mb/split_groups", "split groups / step"),
                                ("mb/max_pos_neg_gap", "max |pos - neg|")]),
    # Share of response tokens whose log-prob rose (boost) or fell (suppress) by more than
    # a threshold after the update, in positive and negative rollouts. [recon] definition.
    ("token flips", [("flip/", None)]),
    # Mean |Δ log π| per token of each class: the template's is the "template drift" that
    # splitting groups across mini-batches should raise (sweep.py batching).
    ("mean |Δ log π| per token", [("where/abs_dlogp_template", "template"),
                                  ("where/abs_dlogp_reasoning", "reasoning")]),
    # Mean signed Δ log π per class, in positive (A > 0) and negative (A < 0) rollouts.
    ("mean Δ log π per token, by sign", [("where/dlogp_template_pos", "template +"),
                                         ("where/dlogp_reasoning_pos", "reasoning +"),
                                         ("where/dlogp_template_neg", "template -"),
                                         ("where/dlogp_reasoning_neg", "reasoning -")]),
    # Monte Carlo token value V(with token) - V(without) (token_diagnostics.token_values, [recon]).
    # The paper: boosted > suppressed, in positive and in negative rollouts alike.
    ("token value (success prob. with - without)", [("value/boosted_pos", "boosted +"),
                                                     ("value/suppressed_pos", "suppressed +"),
                                                     ("value/boosted_neg", "boosted -"),
                                                     ("value/suppressed_neg", "suppressed -")]),
    # Output-layer coupling of two occurrences per unit learning rate ([recon], one term of
    # the full gradient inner product). The paper: identical low-confidence tokens couple most.
    ("token coupling (output layer)", [("coupling/same_low", "same token, both p < 0.5"),
                                       ("coupling/same_high", "same token, both p >= 0.5"),
                                       ("coupling/different", "different tokens")]),
    ("response length (tokens)", [("resp_len_mean", "mean"), ("resp_len_max", "max")]),
    # Responses that hit max_new_tokens: a rising curve means the budget is too small.
    ("truncation rate", [("truncation_rate", "truncated")]),
    ("gradient norm (before clipping)", [("grad_norm", "grad norm")]),
    ("learning rate", [("lr", "lr")]),
    # Mean |vLLM log-prob - trainer log-prob| of the sampled tokens: large = stale weights.
    ("vLLM canary (nats)", [("vllm/canary_gap", "canary gap")]),
    ("seconds per phase", [("time/", None)]),
]

# Logged but not drawn: cumulative wall clock (a different scale; summarize() reports it).
NOT_DRAWN = {"time/elapsed"}

# The first figure: (title, key, what to read in it, the flag that logs it). Four panels, one
# number each, at a size that reads from across a room.
LESSON = [
    ("held-out pass@1", "eval/pass@1", "did it learn? share solved, held-out prompts; step 0 = the start",
     "--eval_every"),
    ("training reward", "reward", "mean reward of each step's N x G rollouts", None),
    ("token entropy (nats)", "entropy", "how sure the policy is; near 0, it stops exploring", None),
    ("cancellation residual R_g", "cancellation_residual", "0: shared tokens' updates cancel; 1: none do",
     "--flip_every"),
]
UNIT_RANGE = {"eval/pass@1", "reward", "cancellation_residual"}   # shares in [0, 1]: drawn on [0, 1]
DENSE_WINDOW = 10      # a curve of 50+ steps, logged every step, gets a 10-step moving average over its raw line


def load_metrics(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read RUN_DIR/metrics.jsonl into {key: (steps, values)}.

    steps: int array, increasing; values: float array of the same length, NaN where the
    line had null (or NaN). A key missing on a line is simply absent from that key's
    arrays, so eval/pass@1 logged every 25 steps has 1/25 as many points as reward.
    Non-numeric values (strings, lists, booleans) are ignored: they are not curves.
    If a step appears twice (a resumed run appended without truncating), the later line
    wins; train.py truncates on resume, so this should not happen, but it should not
    draw a zig-zag either.

    Raises FileNotFoundError if there is no metrics.jsonl, and ValueError naming the file
    and the 1-based line number for a line that is not a JSON object with an integer-like
    "step". Blank lines are skipped (an editor's trailing newline is not an error).
    """
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir!r}")
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                int(row["step"])
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise ValueError(f"{path}:{lineno}: not a metrics row ({type(e).__name__}: {e})") from None
            rows.append(row)
    return series_from_rows(rows)


def series_from_rows(rows: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{key: (steps, values)} from metrics rows (dicts with an integer-like "step"), as load_metrics.

    The committed per-run data of the sweeps (experiments/results/sweep_*.jsonl.gz) is read through here
    too, so a page rebuilt from it and one built from the run directories agree.
    """
    by_key: dict[str, dict[int, float]] = {}
    for row in rows:
        step = int(row["step"])
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
                continue
            by_key.setdefault(key, {})[step] = math.nan if value is None else float(value)
    out = {}
    for key, points in by_key.items():
        steps = sorted(points)                    # Python ints: a numpy int as a dict key is a slow lookup
        out[key] = (np.array(steps, dtype=np.int64), np.array([points[s] for s in steps], dtype=float))
    return out


def smooth(steps: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Trailing moving average over a window of n steps, skipping NaNs.

    out[i] = mean{ values[j] : steps[i] - n < steps[j] <= steps[i], values[j] not NaN }
    (NaN if the window holds no number). The window is in steps, not in logged points,
    so a key logged every 10 steps is not averaged over 10x the span of one logged every
    step. n = 1 returns the values unchanged (NaNs stay NaN: a gap stays a gap).

    Example: steps [1, 2, 3, 5], values [1, 2, NaN, 4], n = 2 -> [1, 1.5, 2, 4]:
    step 3 averages steps 2-3 (the NaN skipped), step 5's window (3, 5] holds only itself.

    steps: [L] increasing ints; values: [L] floats. Returns [L] floats.
    """
    if n < 1:
        raise ValueError(f"smoothing window must be >= 1 step, got {n}")
    if n == 1:
        return values
    ok = ~np.isnan(values)
    # Prefix sums of the numbers and of their count, with a leading 0: the window
    # (lo, i] sums to csum[i + 1] - csum[lo] in O(1), however long the run. The numbers
    # are first shifted by the first one: a constant curve (lr, H_target) then sums to
    # exact zeros and stays exactly constant, instead of wobbling by the rounding error
    # of a long running sum (which matplotlib would blow up into a noisy axis).
    shift = values[ok][0] if ok.any() else 0.0
    csum = np.concatenate([[0.0], np.cumsum(np.where(ok, values - shift, 0.0))])
    ccnt = np.concatenate([[0], np.cumsum(ok)])
    lo = np.searchsorted(steps, steps - n, side="right")     # first index inside the window
    idx = np.arange(len(steps))
    count = ccnt[idx + 1] - ccnt[lo]
    total = csum[idx + 1] - csum[lo]
    return np.where(count > 0, shift + total / np.maximum(count, 1), np.nan)


def run_label(run_dir: str) -> str:
    """Legend name: config's "name" if set, else '<advantage>[+<schedule>] (<directory>)'.

    The schedule is shown only when it is not "constant" (fade with a FADE schedule reads
    "fade+fade"). No or unreadable config.json: the directory name alone.
    """
    dirname = os.path.basename(os.path.normpath(run_dir))
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return dirname
    if not isinstance(cfg, dict):
        return dirname
    if cfg.get("name"):
        return str(cfg["name"])
    if not cfg.get("advantage"):
        return dirname
    sched = cfg.get("sched")                # a run's config.json nests it (cfg.sched); a hand-written one may not
    schedule = cfg.get("schedule") or (sched.get("schedule") if isinstance(sched, dict) else None)
    tag = cfg["advantage"] + (f"+{schedule}" if schedule and schedule != "constant" else "")
    return f"{tag} ({dirname})"


def select_panels(runs: list[tuple[str, dict]]) -> list[tuple[str, list]]:
    """Which lines each panel draws: [(title, [(run index, key, label), ...]), ...].

    runs: [(run label, load_metrics(...))]. Panels with no line are left out. With several
    runs a prefix group of more than two keys is cut to its first and last key in
    numeric order (for pass@k: pass@1 and the largest k).
    """
    panels = []
    for title, spec in PANELS:
        lines = []
        for r, (_, series) in enumerate(runs):
            for key, label in spec:
                if key.endswith(("/", "@")):
                    found = sorted((k for k in series if k.startswith(key) and k not in NOT_DRAWN),
                                   key=_numeric_suffix)
                    if len(runs) > 1 and key == "eval/pass@" and len(found) > 2:
                        found = [found[0], found[-1]]
                    lines += [(r, k, k[len(key):] if key.endswith("/") else k.split("/")[-1]) for k in found]
                elif key in series:
                    lines.append((r, key, label))
        if lines:
            panels.append((title, lines))
    return panels


def plot_runs(run_dirs: list[str], out: str, smooth_n: int = 1) -> list[str]:
    """Draw every panel with data into the PNG `out`; returns the drawn panels' titles.

    Raises ValueError if no run has anything to draw (e.g. an empty metrics.jsonl), and
    whatever load_metrics raises for a missing or malformed file.
    """
    runs = [(run_label(d), load_metrics(d)) for d in run_dirs]
    panels = select_panels(runs)
    if not panels:
        raise ValueError(f"nothing to plot: no known metric in {', '.join(map(repr, run_dirs))}")
    compare = len(runs) > 1
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 3.4 * rows), squeeze=False)
    line_styles = ["-", "--", ":", "-."]
    for ax, (title, lines) in zip(axes.flat, panels):
        # One style per key of this panel, the same in every run. A different dash per
        # key even for a single run: curves that coincide (m_S = m_F under GRPO, reward =
        # correct) then stay visible as two.
        labels = list(dict.fromkeys(label for _, _, label in lines))
        for r, key, label in lines:
            j = labels.index(label)
            steps, values = runs[r][1][key]
            ax.plot(steps, smooth(steps, values, smooth_n), color=f"C{r}" if compare else f"C{j}",
                    ls=line_styles[j % len(line_styles)], lw=1.3,
                    marker="o" if key.startswith("eval/") else None, ms=3, label=label)
        if compare:
            # The panel's legend names the keys by line style (grey); the figure's legend
            # at the top names the runs by colour, once.
            ax.legend([Line2D([], [], color="0.35", ls=line_styles[j % len(line_styles)]) for j in range(len(labels))],
                      labels, fontsize=7)
        else:
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if compare:
        fig.legend([Line2D([], [], color=f"C{r}", lw=3) for r in range(len(runs))], [label for label, _ in runs],
                   loc="upper center", ncol=min(len(runs), 4), bbox_to_anchor=(0.5, 0.985), frameon=False)
    suffix = f"   (moving average over {smooth_n} steps)" if smooth_n > 1 else ""
    fig.suptitle((f"{len(runs)} runs" if compare else runs[0][0]) + suffix, y=0.998)
    fig.tight_layout(rect=(0, 0, 1, 0.975 if compare else 0.985))  # room for title (and run legend)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [title for title, _ in panels]


def plot_lesson(run_dirs: list[str], out: str, smooth_n: int = 1) -> list[str]:
    """The first figure of a run (or of runs side by side): the four LESSON panels, 2 x 2.

    Every panel is drawn, always in the same place; a metric no run logged says which
    flag logs it instead of leaving the panel out. A key logged on every step (reward,
    entropy) is drawn raw and thin, with a bold moving average over max(DENSE_WINDOW,
    smooth_n) steps on top, so the trend reads through one batch's noise; a sparse one
    (pass@1 every --eval_every steps, the residual every --flip_every) as points joined by
    lines, smoothed only by --smooth. One run: its result in the figure's title and each
    curve's last value right of its panel's title. Several runs: one colour per run, named
    once at the top. Returns the titles of the panels that hold data. ValueError if none does.
    """
    runs = [(run_label(d), load_metrics(d)) for d in run_dirs]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    drawn = []
    # One step axis for the four panels: a metric logged once (the residual at a single
    # --flip_every step) would otherwise get an axis of its own around that one step.
    logged = [s for _, series in runs for _, key, _, _ in LESSON if key in series for s in series[key][0]]
    span = (min(logged), max(logged)) if logged else None
    for ax, (title, key, reading, flag) in zip(axes.flat, LESSON):
        have = [(r, series[key]) for r, (_, series) in enumerate(runs) if key in series]
        last = None
        for r, (steps, values) in have:
            colour = f"C{r}"
            every_step = len(steps) > 1 and int(np.median(np.diff(steps))) == 1
            dense = every_step and len(steps) >= 5 * DENSE_WINDOW
            if dense:
                ax.plot(steps, values, color=colour, lw=0.6, alpha=0.35)
                line = smooth(steps, values, max(DENSE_WINDOW, smooth_n))
                ax.plot(steps, line, color=colour, lw=2.2)
            else:
                line = smooth(steps, values, smooth_n)
                ax.plot(steps, line, color=colour, lw=2, marker=None if every_step else "o", ms=4)
            if len(runs) == 1 and np.isfinite(line[-1]):        # the last value, right of the title
                last = (f"last {max(DENSE_WINDOW, smooth_n)} steps: " if dense else f"step {steps[-1]}: ") + \
                    f"{line[-1]:.3g}"
        if have:
            drawn.append(title)
        else:
            ax.text(0.5, 0.5, f"not logged\n({flag} > 0 logs it)" if flag else "not logged", ha="center",
                    va="center", fontsize=12, color="0.4", transform=ax.transAxes)
        if key in UNIT_RANGE:
            ax.set_ylim(-0.02, 1.05)
        ax.set_title(title, fontsize=14, loc="left", fontweight="bold", pad=20)
        if last:
            ax.set_title(last, fontsize=12, loc="right", pad=20, color="C0")
        ax.text(0, 1.015, reading, fontsize=10, color="0.3", transform=ax.transAxes, va="bottom", ha="left")
        ax.set_xlabel("training step", fontsize=11)
        if span and span[1] > span[0]:
            pad = 0.05 * (span[1] - span[0])          # matplotlib's own margin: full panels unchanged
            ax.set_xlim(span[0] - pad, span[1] + pad)
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
    if not drawn:
        raise ValueError(f"nothing to plot: none of {', '.join(k for _, k, _, _ in LESSON)} in "
                         f"{', '.join(map(repr, run_dirs))}")
    if len(runs) > 1:
        fig.legend([Line2D([], [], color=f"C{r}", lw=3) for r in range(len(runs))], [label for label, _ in runs],
                   loc="upper center", ncol=min(len(runs), 4), bbox_to_anchor=(0.5, 0.985), frameon=False,
                   fontsize=11)
    else:
        fig.suptitle(f"{runs[0][0]}: {headline(summarize(run_dirs[0]))}", fontsize=13, y=0.99)
    fig.tight_layout(rect=(0, 0, 1, 0.94 if len(runs) > 1 else 0.96), h_pad=2.5)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn


def headline(summary: dict) -> str:
    """One run's result in words: 'held-out pass@1 0.511 -> 0.896 in 300 steps (best 0.956 at step 175)'."""
    if "last_pass@1" not in summary:
        return f"{summary['steps']} steps, no held-out evaluation"
    start = f"{summary['start_pass@1']:.3f} -> " if "start_pass@1" in summary else ""
    best = (f" (best {summary['best_pass@1']:.3f} at step {summary['best_step']})"
            if "best_pass@1" in summary else "")
    return f"held-out pass@1 {start}{summary['last_pass@1']:.3f} in {summary['steps']} steps{best}"


def summarize(run_dir: str) -> dict:
    """Headline numbers of one run, for the table and the README.

    {"run": label, "steps": last logged step (0 if none), "final_reward": reward of the
    last batch, "start_pass@1": held-out pass@1 of the starting model (metrics.jsonl's step
    0), "last_pass@1", "best_pass@1", "best_step": at the last evaluation and at the best
    one (the start included), "minutes": wall clock}. Keys without data are left
    out. Minutes come from time/elapsed (train.py's clock since the run started); a run
    without it gets the sum of its per-phase times, which misses time between phases.
    final_reward is one batch (N x G rollouts), so it is noisy; pass@1 is the number to
    compare.
    """
    series = load_metrics(run_dir)
    out = {"run": run_label(run_dir),
           "steps": max((int(s[-1]) for s, _ in series.values() if len(s)), default=0)}
    if "reward" in series:
        out["final_reward"] = float(series["reward"][1][-1])
    if "eval/pass@1" in series:
        steps, values = series["eval/pass@1"]
        if steps[0] == 0:
            out["start_pass@1"] = float(values[0])
        out["last_pass@1"] = float(values[-1])
        if np.isfinite(values).any():
            best = int(np.nanargmax(values))
            out["best_pass@1"], out["best_step"] = float(values[best]), int(steps[best])
    if "time/elapsed" in series:
        out["minutes"] = float(series["time/elapsed"][1][-1]) / 60
    else:
        phases = [v for k, (_, v) in series.items() if k.startswith("time/")]
        if phases:
            out["minutes"] = float(sum(np.nansum(v) for v in phases)) / 60
    return out


SUMMARY_COLUMNS = ["run", "steps", "final_reward", "start_pass@1", "last_pass@1", "best_pass@1", "best_step",
                   "minutes"]


def format_table(rows: list[dict]) -> str:
    """summarize() rows as a Markdown table (floats to 3 decimals, '-' where missing)."""
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else ("-" if value is None else str(value))
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in SUMMARY_COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Helpers and the command line
# ---------------------------------------------------------------------------------------

def _numeric_suffix(key: str) -> tuple[int, str]:
    """Sort key: eval/pass@8 after eval/pass@4 (not after pass@16, as strings would)."""
    digits = key.rsplit("@", 1)[-1]
    return (int(digits), key) if "@" in key and digits.isdigit() else (0, key)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plot train.py run directories into one PNG: the lesson's four "
                                                 "panels, or every metric with --dashboard.")
    # argparse's own error() prints the usage block too; one line is easier to read in a
    # log. Same exit code (2) and the same "prog: error: message" form.
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")
    parser.add_argument("runs", nargs="+", help="run directories, each holding metrics.jsonl")
    parser.add_argument("--out", help="PNG path (default: RUN/plots.png for one run, FIRST_RUN/compare.png for "
                                      "several; with --dashboard RUN/dashboard.png, FIRST_RUN/compare_dashboard.png)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps (1 = off)")
    parser.add_argument("--dashboard", action="store_true",
                        help="every logged metric (~20 panels: diagnostics, schedule, plumbing) instead of the four "
                             "panels of the lesson (held-out pass@1, reward, entropy, cancellation residual)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth must be >= 1, got {args.smooth}")
    for d in args.runs:
        if not os.path.isdir(d):
            parser.error(f"run directory {d!r} does not exist")
        if not os.path.isfile(os.path.join(d, "metrics.jsonl")):
            parser.error(f"no metrics.jsonl in {d!r}")
    # Never the current directory (in a clone, the repository root): the first run's directory.
    name = ("plots.png" if len(args.runs) == 1 else "compare.png") if not args.dashboard else \
        ("dashboard.png" if len(args.runs) == 1 else "compare_dashboard.png")
    out = args.out or os.path.join(args.runs[0], name)
    if problem := checks.writable_file_problem(out):
        parser.error(f"--out {out!r}: {problem}")
    try:
        titles = (plot_runs if args.dashboard else plot_lesson)(args.runs, out, args.smooth)
        rows = [summarize(d) for d in args.runs]
    except ValueError as e:                   # malformed line or nothing to plot
        parser.error(str(e))
    print(f"wrote {out} ({len(titles)} panels)")
    print(format_table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
