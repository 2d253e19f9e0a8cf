"""quantities.py: one number per run, the rows of a sweep's table (experiments/designs_*.py).

Each function here takes a metric name (and a level, a cell, ...) and returns a function
of one run's series, {key: (steps, values)} as tools/plot_runs.py's load_metrics gives it,
with NaN where a step logged null, that gives one number: the value at the last step, a
mean over steps, the first step a curve reached a level, a pooled token-value cell, a
within-run difference or ratio. Each returns NaN when the run never logged the key. The
sweeps declare rows as (label, quantity, how it is computed); the claims and checks name
the rows. A row more than one sweep reads is declared once, at the end of this file (ROWS),
and a sweep takes it by name (row, rows).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

def final(key: str, scale: float = 1.0) -> Callable[[dict], float]:
    """The key's value at its last logged step (for eval/pass@k: the evaluation at the last step)."""
    return lambda series: float(series[key][1][-1]) * scale if key in series else math.nan


def mean_of(key: str) -> Callable[[dict], float]:
    """Mean of the key over the steps that logged it (NaNs skipped)."""
    return lambda series: nanmean(series[key][1]) if key in series else math.nan


def value_at(key: str, step: int) -> Callable[[dict], float]:
    """The key's value at one step (NaN where it was not logged there): pass@1 after 10 steps."""
    def at(series: dict) -> float:
        if key not in series:
            return math.nan
        steps, values = series[key]
        hit = np.flatnonzero(np.asarray(steps) == step)
        return float(values[hit[0]]) if len(hit) else math.nan
    return at


def head_mean(key: str, n: int) -> Callable[[dict], float]:
    """Mean of the key over its first n logged steps."""
    return lambda series: nanmean(series[key][1][:n]) if key in series else math.nan


def tail_mean(key: str, n: int) -> Callable[[dict], float]:
    """Mean of the key over its last n logged steps."""
    return lambda series: nanmean(series[key][1][-n:]) if key in series else math.nan


def first_reach(key: str, level: float) -> Callable[[dict], float]:
    """steps_to_threshold of the key's curve, censored: a run that never reaches the level
    counts as reaching it one logging interval after its last point (later than any run
    that did, which is all a paired sign test needs; its size is a lower bound)."""
    def value(series: dict) -> float:
        if key not in series:
            return math.nan
        steps, values = series[key]
        reached = steps_to_threshold(steps, values, level)
        if math.isfinite(reached) or not len(steps):
            return reached
        interval = steps[-1] - steps[-2] if len(steps) > 1 else steps[-1]
        return float(steps[-1] + interval)
    return value


def at_level(key: str, level_key: str, level: float) -> Callable[[dict], float]:
    """The key's value where level_key first reaches `level`, for comparing runs at equal progress.

    Both keys logged at the same steps (the evaluations); linear interpolation between the
    two evaluations around the first crossing. NaN when level_key never reaches the level,
    or is already at it on the first evaluation (the crossing was not observed).
    """
    def value(series: dict) -> float:
        if key not in series or level_key not in series:
            return math.nan
        at = dict(zip(*series[key]))
        points = [(s, x, at[s]) for s, x in zip(*series[level_key]) if s in at]
        for (_, x0, y0), (_, x1, y1) in zip(points, points[1:]):
            if x0 < level <= x1:
                return float(y0 + (level - x0) / (x1 - x0) * (y1 - y0))
        return math.nan
    return value


def peak_of(key: str) -> Callable[[dict], float]:
    return lambda series: peak(*series[key])[1] if key in series else math.nan


def peak_step_of(key: str) -> Callable[[dict], float]:
    return lambda series: peak(*series[key])[0] if key in series else math.nan


def pooled_value(cell: str) -> Callable[[dict], float]:
    """One value cell pooled over the run's value steps (pool_cells' mean)."""
    return lambda series: _pool_run(series, cell)[0]


def pooled_n(cell: str) -> Callable[[dict], float]:
    """Positions of one value cell, summed over the run's value steps."""
    return lambda series: float(_pool_run(series, cell)[2])


def difference(f: Callable[[dict], float], g: Callable[[dict], float]) -> Callable[[dict], float]:
    """f - g on the same run (a within-run contrast; its spread over seeds is the test's SE)."""
    return lambda series: f(series) - g(series)


def total(f: Callable[[dict], float], g: Callable[[dict], float]) -> Callable[[dict], float]:
    """f + g on the same run."""
    return lambda series: f(series) + g(series)


def ratio(f: Callable[[dict], float], g: Callable[[dict], float]) -> Callable[[dict], float]:
    """f / g on the same run; NaN where g is 0."""
    def value(series: dict) -> float:
        num, den = f(series), g(series)
        return num / den if den != 0 else math.nan
    return value


def log_ratio(f: Callable[[dict], float], g: Callable[[dict], float]) -> Callable[[dict], float]:
    """log(f / g) on the same run: 0 for equal shares, log 2 for twice; NaN unless both are > 0."""
    def value(series: dict) -> float:
        num, den = f(series), g(series)
        return math.log(num / den) if num > 0 and den > 0 else math.nan
    return value


def peaked_at_end(key: str) -> Callable[[dict], float]:
    """1.0 if the run's best value of `key` is at its last logged step, else 0.0."""
    def value(series: dict) -> float:
        if key not in series or not len(series[key][0]):
            return math.nan
        return float(peak(*series[key])[0] == series[key][0][-1])
    return value


def _pool_run(series: dict, cell: str) -> tuple[float, float, int]:
    """pool_cells over the steps that logged value/<cell> (steps with n = 0 log no mean)."""
    if f"value/{cell}" not in series:
        return math.nan, math.nan, 0
    steps, means = series[f"value/{cell}"]
    n_at = dict(zip(*series[f"value/n_{cell}"]))
    se_at = dict(zip(*series.get(f"value/se_{cell}", ([], []))))
    return pool_cells(means, [se_at.get(s, math.nan) for s in steps], [n_at[s] for s in steps])


def nanmean(values) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else math.nan


def steps_to_threshold(steps, values, threshold: float) -> float:
    """The first step whose value is >= threshold; NaN if none is.

    Resolution is the logging interval (eval/pass@1: every EVAL_EVERY steps).
    Example: steps [10, 20, 30], values [0.5, 0.8, 0.7], threshold 0.75 -> 20.
    """
    hit = np.nonzero(np.asarray(values, dtype=float) >= threshold)[0]
    return float(np.asarray(steps)[hit[0]]) if len(hit) else math.nan


def peak(steps, values) -> tuple[float, float]:
    """(step, value) of the largest finite value, the first one on ties; (NaN, NaN) if none."""
    v = np.asarray(values, dtype=float)
    if not np.isfinite(v).any():
        return math.nan, math.nan
    i = int(np.nanargmax(v))
    return float(np.asarray(steps)[i]), float(v[i])


def pool_cells(means, ses, ns) -> tuple[float, float, int]:
    """Pool per-step summaries (mean m_i, SE s_i, size n_i) into one sample's (mean, SE, N).

        N = sum n_i     M = sum n_i m_i / N
        var = (sum (n_i - 1) sd_i^2 + sum n_i (m_i - M)^2) / (N - 1),  sd_i^2 = s_i^2 n_i
        SE = sqrt(var / N)

    exactly the mean and SE of all the positions concatenated (the within-step and
    between-step sums of squares). A step with n_i = 1 logs no SE (sd_i unknown): its
    within part is 0, which it is. Steps with n_i = 0 are skipped. Returns (NaN, NaN, 0)
    for no position, SE NaN for N = 1. Example: steps {1, 2, 3} and {4, 6} -> (3.2,
    SE of [1, 2, 3, 4, 6] = 0.860, 5).
    """
    m, s, n = (np.asarray(a, dtype=float) for a in (means, ses, ns))
    keep = n > 0
    m, s, n = m[keep], np.nan_to_num(s[keep]), n[keep]
    N = int(n.sum())
    if N == 0:
        return math.nan, math.nan, 0
    M = float((n * m).sum() / N)
    if N == 1:
        return M, math.nan, 1
    var = float(((n - 1) * s ** 2 * n).sum() + (n * (m - M) ** 2).sum()) / (N - 1)
    return M, math.sqrt(var / N), N


def final_max_pass() -> Callable[[dict], float]:
    """Held-out pass@k at the last evaluation for the largest k the run evaluated."""
    def f(series: dict) -> float:
        ks = [int(key.split("@")[1]) for key in series if key.startswith("eval/pass@")]
        return float(series[f"eval/pass@{max(ks)}"][1][-1]) if ks else math.nan
    return f


def min_of(key: str) -> Callable[[dict], float]:
    """Smallest logged value of the key."""
    return lambda series: float(np.nanmin(series[key][1])) if key in series else math.nan


def max_of(key: str) -> Callable[[dict], float]:
    """Largest logged value of the key."""
    return lambda series: float(np.nanmax(series[key][1])) if key in series else math.nan


START = "start/"
"""Prefix of the start's held-out evaluation in a run's series (pages.judge_runs adds it from
the run's record: train.py's start.json), e.g. "start/eval/pass@1" at step 0."""


def at_start(key: str) -> Callable[[dict], float]:
    """The key's value when the run started (the start's evaluation, before step 1); NaN if not recorded."""
    return lambda series: float(series[START + key][1][0]) if START + key in series else math.nan


def collapsed(key: str = "eval/pass@1", share: float = 0.5) -> Callable[[dict], float]:
    """1.0 if the run ended below `share` of where it started (final < share x start), else 0.0.

    A flag per run, so the paired differences are -1, 0 or +1 and the sign-flip test counts
    the pairs where one arm collapsed and the other did not. NaN without a start or a final.
    Example: start 0.51, final 0.20 -> 1.0 (0.20 < 0.255); final 0.30 -> 0.0.
    """
    def value(series: dict) -> float:
        start, end = at_start(key)(series), final(key)(series)
        return float(end < share * start) if math.isfinite(start) and math.isfinite(end) else math.nan
    return value


def smoothed(values) -> np.ndarray:
    """A centred 3-point moving average of a curve (the two ends: the mean of 2 points).

    The peak of a noisy curve sampled every 20-25 steps is mostly noise: the argmax of
    its raw points jumps between evaluations that differ by less than their own SE.
    Averaging each point with its neighbours cuts that SE by sqrt(3) (sqrt(2) at the ends)
    at the cost of one evaluation interval of resolution. NaNs count as missing.
    Example: [0.2, 0.5, 0.2, 0.8] -> [0.35, 0.3, 0.5, 0.5].
    """
    v = np.asarray(values, dtype=float)
    out = np.full(len(v), math.nan)
    for i in range(len(v)):
        window = v[max(i - 1, 0):i + 2]
        window = window[np.isfinite(window)]
        if len(window):
            out[i] = window.mean()
    return out


def smoothed_peak(key: str) -> Callable[[dict], float]:
    """The largest value of the key's smoothed curve (smoothed)."""
    return lambda series: peak(series[key][0], smoothed(series[key][1]))[1] if key in series else math.nan


def smoothed_peak_step(key: str) -> Callable[[dict], float]:
    """The step where the key's smoothed curve peaks, censored at the end of the run.

    A run whose smoothed curve peaks at its LAST evaluation had not peaked yet (it was
    still climbing, or flat): its peak step is unknown and later than the run. It counts
    as one evaluation interval past the last step, later than any run that did peak,
    which is all a paired sign test needs (the size of such a difference is a lower bound).
    Two censored runs of a pair tie. NaN if the key was never logged.
    """
    def value(series: dict) -> float:
        if key not in series or not len(series[key][0]):
            return math.nan
        steps = series[key][0]
        step = peak(steps, smoothed(series[key][1]))[0]
        if step == steps[-1]:
            interval = steps[-1] - steps[-2] if len(steps) > 1 else steps[-1]
            return float(steps[-1] + interval)
        return step
    return value


def censored(key: str) -> Callable[[dict], float]:
    """1.0 if the key's smoothed curve peaks at the run's last evaluation (smoothed_peak_step's censoring)."""
    def value(series: dict) -> float:
        if key not in series or not len(series[key][0]):
            return math.nan
        steps = series[key][0]
        return float(peak(steps, smoothed(series[key][1]))[0] == steps[-1])
    return value


# ---------------------------------------------------------------------------------------
# The rows the sweeps share, declared once: a label, its quantity, how it is computed
# ---------------------------------------------------------------------------------------
# A claim or a check names its row by label (Claim.row, Check.row), and a page prints each
# row's label and description (pages.write_page's "Quantities"), so a label means one
# quantity in every sweep. A row that more than one sweep declares is declared here; a sweep
# takes it by name (row, rows) and keeps only its own rows inline. Where a sweep's committed
# page words a shared row's description otherwise, the sweep passes that wording (row's
# `how`): the same quantity, the page unchanged.

VALUE_CELLS = {"boosted_pos": "b+", "suppressed_pos": "s+", "boosted_neg": "b-", "suppressed_neg": "s-"}
"""The token-value cells (diagnostics.token_values [recon]) and their short names in the rows."""


def _table(*rows: tuple[str, Callable[[dict], float], str]) -> dict[str, tuple[str, Callable[[dict], float], str]]:
    return {label: (label, quantity, how) for label, quantity, how in rows}


ROWS = _table(
    # held-out pass@1 and pass@k: the end, the best, the worst, the start, the way there
    *[(f"final pass@{k}", final(f"eval/pass@{k}"), f"held-out pass@{k} at the last step") for k in (1, 2, 4, 8, 16)],
    ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
    ("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
    ("min pass@1", min_of("eval/pass@1"), "worst held-out pass@1 over the run's evaluations"),
    ("mean pass@1", mean_of("eval/pass@1"), "held-out pass@1, mean over the run's evaluations"),
    ("start pass@1", at_start("eval/pass@1"), "held-out pass@1 of the starting weights (start.json)"),
    ("pass@1 at step 10", value_at("eval/pass@1", 10), "held-out pass@1 after the first 10 batches"),
    ("gain lost", difference(peak_of("eval/pass@1"), final("eval/pass@1")), "peak minus final pass@1"),
    ("collapsed", collapsed(), "1 if final pass@1 < half of start pass@1, else 0"),
    ("final solution entropy", final("eval/solution_entropy"),
     "entropy over distinct correct solutions (countdown), last evaluation"),
    # the policy's entropy
    ("entropy, first 10 steps", head_mean("entropy", 10), "mean token entropy, nats"),
    ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
    # cancellation, and what the mini-batches hold
    ("cancellation residual", mean_of("cancellation_residual"), "mean over diagnostic steps of R_g"),
    ("first-step residual", mean_of("cancellation_residual_first"),
     "R_g of the first optimizer step of each batch (ratio 1), mean over diagnostic steps"),
    ("split groups / step", mean_of("mb/split_groups"),
     "groups cut across optimizer steps, per optimizer step, mean over steps"),
    ("mean |A| of the batch", mean_of("adv_abs_mean"), "mean |advantage| per rollout, mean over steps"),
    ("mean |A| trained", mean_of("mb/adv_abs_trained"),
     "mean |advantage| the optimizer steps trained on (random_recentred's re-centring lowers it)"),
    # where the update went
    ("template drift", mean_of("where/abs_dlogp_template"),
     "mean |Δ log π| per template token, mean over diagnostic steps"),
    ("template share", mean_of("where/template_share"),
     "template tokens' share of sum |Δ log π|, mean over diagnostic steps"),
    ("template tokens", mean_of("where/template_tokens"),
     "template tokens' share of the tokens (the even-spread reference)"),
    # the size of the update, and GSPO's clip
    ("approx kl", mean_of("approx_kl"), "mean over steps of the sampling policy's KL to the updated one"),
    ("grad norm", mean_of("grad_norm"), "mean over steps of the gradient norm before clipping"),
    ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
    ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
    ("clip frac (both)", total(mean_of("clip_frac_low"), mean_of("clip_frac_high")),
     "clip fraction low + high, mean over steps"),
    ("dropped rollouts", mean_of("dfpo_dropped"),
     "share of rollouts GSPO's clip dropped, mean over steps (DFPO path arms only)"),
    # FADE's masses: the sign axis
    ("m_S (mean)", mean_of("m_S"), "success mass per rollout, mean over steps"),
    ("m_F (mean)", mean_of("m_F"), "failure mass per rollout, mean over steps"),
    ("m_S - m_F", difference(mean_of("m_S"), mean_of("m_F")), "the sign axis' imbalance"),
    ("m_F / m_S", ratio(mean_of("m_F"), mean_of("m_S")), "failure mass per unit of success mass"),
    # the Cancellation Hypothesis' token diagnostics: flips, specificity, token values
    *[(f"flip {k} {s}", mean_of(f"flip/{k}_{s}"), "share of the rollouts' tokens, mean over diagnostic steps")
      for s in ("pos", "neg") for k in ("boost", "suppress")],
    ("flip log(b- / b+)", log_ratio(mean_of("flip/boost_neg"), mean_of("flip/boost_pos")),
     "log of the boosted share in negative rollouts over that in positive ones (naive view: -inf)"),
    ("flip log(s+ / s-)", log_ratio(mean_of("flip/suppress_pos"), mean_of("flip/suppress_neg")),
     "log of the suppressed share in positive rollouts over that in negative ones (naive view: -inf)"),
    ("specificity corr", mean_of("credit/specificity_corr"),
     "correlation of a token's specificity with its Δ log π, mean over diagnostic steps"),
    ("specificity cells", mean_of("credit/specificity_cells"), "(group, token) cells per diagnostic step"),
    *[(f"value {short}", pooled_value(cell), f"value of {cell} tokens, pooled over value steps")
      for cell, short in VALUE_CELLS.items()],
    *[(f"value n {short}", pooled_n(cell), "positions in that cell, summed over value steps")
      for cell, short in VALUE_CELLS.items()],
    ("value b+ - s+", difference(pooled_value("boosted_pos"), pooled_value("suppressed_pos")),
     "pooled value boosted minus suppressed, positive rollouts"),
    ("value b- - s-", difference(pooled_value("boosted_neg"), pooled_value("suppressed_neg")),
     "pooled value boosted minus suppressed, negative rollouts"),
    # the cost
    ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run"),
)

# Other wordings of shared rows that more than one sweep's committed page gives (the same
# quantity; each sweep's own page keeps its words): passed as row's `how`.
PER_GROUP_RESIDUAL = "mean over diagnostic steps of the per-group residual R_g"           # dfpo, dose
RESIDUAL_PER_STEP = "R_g per optimizer step, mean over diagnostic steps"                  # recentred, smollm2 batching
FIRST_STEP_AFTER_RESIDUAL = "the same, first optimizer step of each batch only (ratio 1)"  # the row after the residual
REACH_THE_THRESHOLD = "first evaluation step at or above the threshold (one evaluation past the end if never)"

FLIP_SHARES = tuple(f"flip {k} {s}" for s in ("pos", "neg") for k in ("boost", "suppress"))
"""The four flip rows: the boosted and suppressed shares of positive, then negative rollouts."""
TOKEN_VALUES = (*(f"value {short}" for short in VALUE_CELLS.values()),
                *(f"value n {short}" for short in VALUE_CELLS.values()), "value b+ - s+", "value b- - s-")
"""The token-value rows: each cell's pooled value, its positions, and the two within-run contrasts."""


def row(label: str, how: str | None = None) -> tuple[str, Callable[[dict], float], str]:
    """The shared row `label` of ROWS, as a sweep's rows hold it: (label, quantity, how).

    how: the description its sweep's page gives, where that page words it otherwise (the same
    quantity). A label that is not in ROWS is a KeyError naming it: a sweep's own row is declared
    inline, as (label, quantity, how).
    """
    label, quantity, default = ROWS[label]
    return label, quantity, how or default


def rows(*labels: str) -> list[tuple[str, Callable[[dict], float], str]]:
    """Several shared rows, in the order given: rows("final pass@1", "minutes")."""
    return [row(label) for label in labels]


def reach_row(level: float, how: str = "first evaluation step at or above the task's threshold (one evaluation "
                                     "past the end if never)") -> tuple[str, Callable[[dict], float], str]:
    """The row "steps to pass@1 >= LEVEL": first_reach of held-out pass@1 at the task's threshold
    (designs.threshold, which is the task's: the label carries the level)."""
    return f"steps to pass@1 >= {level}", first_reach("eval/pass@1", level), how
