"""sweeps.py: the papers' training-level claims, as sweeps and claim records.

    python -m experiments.sweep advantages                  # countdown (the default task), 6 seeds per arm
    python -m experiments.sweep advantages --task addition  # the same arms on the addition task

A sweep is a set of ARMS (train.py flag sets that differ in one design choice), each run
with several RL seeds from the same warmed checkpoint, a table of quantities (one number
per run, computed from its metrics.jsonl), curves, and the CLAIMS it tests, written here
before the runs as `claims.Claim` records: the paper, the sentence, the row that measures
it, the arms compared, the predicted direction. experiments/sweep.py runs the sweeps and
judges the claims (experiments/claims.py: exact permutation / sign-flip tests, Holm's
correction across a sweep's claims).

The four sweeps:
  batching    4 mini-batches per rollout batch, split five ways (batching.py): does keeping
              a group's rollouts in one optimizer step keep the updates of the tokens they
              share cancelling, and the template from drifting?
  advantages  seven advantages from GRPO to FADE: where pass@1 peaks, what happens to
              pass@k and entropy (psr and nsr: the sign axis), the range FADE's schedule
              actually takes.
  dfpo        GSPO against DFPO's two transforms (and GRPO), with 4 query mini-batches so
              that the ratios leave 1: the residual, and the design-conditions paper's
              Cor. 3.2 (unequal sequence weights collapse the entropy among equivalent
              correct solutions; orth should not).
  credit      GRPO against positive-only training, token diagnostics on: flips, where
              updates go, token values, coupling.

Tasks. Countdown (machinery/countdown.py) is the default: its held-out pass@1 starts at
~0.23 with pass@16 ~0.83, its tokens have entropy (template 0.64 nats), and most prompts
have several correct answers, so claims about pass@k, entropy, templates and diversity
can show. Addition (the embedded default of train.py) is kept for comparison; several of
those claims are not testable there (its template is near-certain before RL, pass@4 is
at the ceiling, every prompt has one answer).

Budget (countdown; 2 cores, 2 runs at a time): an RL step costs ~0.4 s and an evaluation
(100 prompts x 16 samples) ~1.5 s, so a 150-step run with an evaluation every 25 steps
takes ~70 s, ~100 s with 4 mini-batches, ~130 s with the token values. advantages: 7 arms
x 6 seeds x 70 s / 2 = ~25 min; batching: 5 x 6 x 100 s / 2 = ~25 min; dfpo: 4 x 6 x
100 s / 2 = ~20 min; credit: 2 x 8 x 130 s / 2 = ~17 min. Why 6 seeds (8 for credit):
with 6 vs 6 the smallest exact two-sided p is 2/924 = 0.0022, which survives Holm's
correction over up to 22 claims; 5 vs 5 (2/252) would survive only 6, and a within-run
sign-flip test needs 8 seeds to survive a correction over 4 (2/256 = 0.0078).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from experiments.claims import Claim

CANCELLATION = "Cancellation Hypothesis"
DESIGN = "Token Gradient Cancellation (design conditions)"
FADE = "FADE"
PSR_NSR = "psr / nsr (sign of the advantage)"

THRESHOLD = 0.75                  # "steps to pass@1 >= THRESHOLD" (batching sweep, addition)

# Per task: the flags every run gets, its evaluation, steps per sweep, seeds per sweep.
TASKS = {
    "countdown": {"flags": ["--data", "countdown"], "eval_every": 25, "n_eval": 100, "eval_samples": 16,
                  "steps": {"batching": 150, "advantages": 150, "dfpo": 150, "credit": 120},
                  "seeds": {"batching": 6, "advantages": 6, "dfpo": 6, "credit": 8}},
    "addition": {"flags": [], "eval_every": 10, "n_eval": 200, "eval_samples": 4,
                 "steps": {"batching": 200, "advantages": 200, "dfpo": 150, "credit": 120},
                 "seeds": {"batching": 6, "advantages": 6, "dfpo": 6, "credit": 8}},
}


@dataclass
class Sweep:
    """What one named sweep runs and reports."""

    name: str
    claim: str
    """What the sweep is about, in one or two sentences (summary.md's header)."""
    flags: list[str]
    """train.py flags every arm shares (the task's flags included)."""
    arms: dict[str, list[str]]
    """Arm name -> its own train.py flags (after `flags`)."""
    rows: list[tuple[str, Callable[[dict], float], str]]
    """The table's quantities: (label, f(load_metrics of one run) -> one number, how it is computed)."""
    curves: list[tuple[str, str]]
    """(metrics key, panel title): drawn as mean ± SE over seeds, one line per arm."""
    claims: list[Claim] = field(default_factory=list)
    """The claims the sweep tests, judged by experiments/claims.py."""


# ---------------------------------------------------------------------------------------
# 1. Testability checks (a claim's runs may not be able to speak to it)
# ---------------------------------------------------------------------------------------

def schedule_moved(arm: str, key: str, low: float, high: float) -> Callable[[dict], str | None]:
    """Not testable if `key` (a schedule value) stayed inside [low, high] in every run of `arm`."""
    def check(series: dict) -> str | None:
        values = [v for s in series.get(arm, []) if key in s for v in s[key][1] if math.isfinite(v)]
        if not values:
            return f"{key} was not logged"
        lo, hi = min(values), max(values)
        if low <= lo and hi <= high:
            return f"{key.split('/')[-1]} stayed in [{lo:.2f}, {hi:.2f}]"
        return None
    return check


def logged(key: str, arm: str) -> Callable[[dict], str | None]:
    """Not testable if no run of `arm` logged `key` (e.g. no template on the task)."""
    def check(series: dict) -> str | None:
        return None if any(key in s for s in series.get(arm, [])) else f"{key} is not logged on this task"
    return check


# ---------------------------------------------------------------------------------------
# 2. The sweeps (task: 'countdown' or 'addition')
# ---------------------------------------------------------------------------------------

def batching(task: str = "countdown") -> Sweep:
    """Mini-batch formation with 4 optimizer steps per rollout batch (batching.py).

    With one optimizer step per batch every group's positive and negative rollouts are
    in the same step, so the updates of the tokens they share cancel for a zero-sum
    advantage. With 4 mini-batches that holds only if a group stays whole in one of
    them: 'random' splits groups, 'query' and 'query_balanced' never do, 'balanced' and
    'mass_balanced' balance positives and negatives (counts or advantage mass) per
    mini-batch. Template drift = mean |Δ log π| per template token after the step
    (diagnostics.where_updates_go, every 10th step); the cancellation residual is taken
    per optimizer step over its whole groups.
    """
    arms = {mode: ["--minibatch_mode", mode] for mode in ("random", "query", "balanced", "query_balanced",
                                                          "mass_balanced")}
    claims = [Claim(CANCELLATION, "keeping groups whole in an optimizer step keeps shared tokens' updates cancelling",
                    "cancellation residual", "query", "random", -1),
              *[Claim(CANCELLATION, f"{mode} mini-batches let the template drift less than random ones",
                      "template drift", mode, "random", -1, logged("where/abs_dlogp_template", mode))
                for mode in ("query", "balanced", "query_balanced", "mass_balanced")],
              *[Claim(CANCELLATION, f"{mode} mini-batches learn better than random ones", "final pass@1", mode,
                      "random", +1) for mode in ("query", "balanced")]]
    return Sweep(
        name="batching",
        claim="Keeping each group's rollouts in one optimizer step keeps the updates of shared "
              "(template) tokens cancelling (Cancellation Hypothesis paper); splitting groups "
              "(random mini-batches) leaves them to drift.",
        flags=[*TASKS[task]["flags"], "--minibatches", "4", "--coupling_pairs", "0"],
        arms=arms,
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              (f"steps to pass@1 >= {THRESHOLD}", first_reach("eval/pass@1", THRESHOLD),
               f"first evaluation step with pass@1 >= {THRESHOLD} (missing if never)"),
              ("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of R_g per optimizer step"),
              ("template drift", mean_of("where/abs_dlogp_template"),
               "mean |Δ log π| per template token, mean over diagnostic steps"),
              ("reasoning drift", mean_of("where/abs_dlogp_reasoning"),
               "mean |Δ log π| per reasoning token, mean over diagnostic steps"),
              ("template entropy, last 10 steps", tail_mean("entropy/template", 10), "nats per template token"),
              ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
              ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
              ("split groups / step", mean_of("mb/split_groups"),
               "groups cut across optimizer steps, per optimizer step, mean over steps"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("entropy/template", "template-token entropy"),
                ("where/abs_dlogp_template", "template drift: mean |Δ log π| per template token"),
                ("cancellation_residual", "cancellation residual R_g"),
                ("mb/split_groups", "split groups per optimizer step")],
        claims=claims)


def advantages(task: str = "countdown") -> Sweep:
    """Seven advantages on the same task (advantages.py, scheduler.py).

    grpo (group z-score), mean (Dr. GRPO: r - mean), psr (successes only), nsr (failures
    only), power alpha=2 and asym delta=0.5 (FADE paper's static baselines, through the
    constant schedule's --alpha/--delta), fade with its own schedule. The FADE paper's
    decomposition: m_S and m_F, the per-rollout success and failure masses. Peak = the
    best held-out pass@1 of the run; "gain lost" = peak minus final.
    """
    fade_moved = schedule_moved("fade", "sched/delta", 0.98, 1.0)
    claims = [Claim(FADE, "FADE keeps the gains GRPO loses after its peak (higher final pass@1)",
                    "final pass@1", "fade", "grpo", +1, fade_moved),
              Claim(FADE, "FADE loses less from its peak than GRPO", "gain lost", "fade", "grpo", -1, fade_moved),
              Claim(FADE, "weighting hard prompts more (power, alpha = 2) improves pass@1", "final pass@1",
                    "power", "grpo", +1),
              Claim(FADE, "more failure mass (asym, delta = 0.5) keeps entropy up", "entropy, last 10 steps",
                    "asym", "grpo", +1),
              Claim(PSR_NSR, "positive-only training (psr) collapses entropy", "entropy, last 10 steps", "psr",
                    "grpo", -1),
              Claim(PSR_NSR, "psr sharpens pass@1", "final pass@1", "psr", "grpo", +1),
              Claim(PSR_NSR, "psr costs pass@k", "final pass@k", "psr", "grpo", -1),
              Claim(PSR_NSR, "negative-only training (nsr) keeps entropy", "entropy, last 10 steps", "nsr",
                    "grpo", +1),
              Claim(PSR_NSR, "nsr has a lower pass@1", "final pass@1", "nsr", "grpo", -1),
              Claim(PSR_NSR, "nsr keeps pass@k", "final pass@k", "nsr", "grpo", +1)]
    return Sweep(
        name="advantages",
        claim="How much a success pushes up and a failure pushes down (m_S vs m_F) decides where "
              "pass@1 peaks, whether pass@k survives and how entropy moves (FADE paper; psr/nsr: "
              "positive- vs negative-only training).",
        flags=[*TASKS[task]["flags"], "--coupling_pairs", "0"],
        arms={"grpo": ["--advantage", "grpo"], "mean": ["--advantage", "mean"], "psr": ["--advantage", "psr"],
              "nsr": ["--advantage", "nsr"], "power": ["--advantage", "power", "--alpha", "2"],
              "asym": ["--advantage", "asym", "--delta", "0.5"],
              "fade": ["--advantage", "fade", "--schedule", "fade"]},
        rows=[("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("step of peak", peak_step_of("eval/pass@1"), "its step (the first, on ties)"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("gain lost", difference(peak_of("eval/pass@1"), final("eval/pass@1")), "peak minus final pass@1"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              ("entropy, first 10 steps", head_mean("entropy", 10), "mean token entropy, nats"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions (countdown), last evaluation"),
              ("m_S (mean)", mean_of("m_S"), "success mass per rollout, mean over steps"),
              ("m_F (mean)", mean_of("m_F"), "failure mass per rollout, mean over steps"),
              ("alpha min", min_of("sched/alpha"), "smallest alpha the schedule took"),
              ("alpha max", max_of("sched/alpha"), "largest alpha the schedule took"),
              ("delta min", min_of("sched/delta"), "smallest delta the schedule took"),
              ("delta max", max_of("sched/delta"), "largest delta the schedule took"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("m_S", "success mass m_S per rollout"), ("m_F", "failure mass m_F per rollout"),
                ("sched/alpha", "alpha"), ("sched/delta", "delta")],
        claims=claims)


def dfpo(task: str = "countdown") -> Sweep:
    """GSPO vs DFPO's transforms of GSPO's sequence weights (loss.py), 4 query mini-batches, and GRPO.

    GSPO weighs each rollout by its own (clipped) sequence ratio, so after the first
    mini-batch the weights differ within a group and a token shared by the group no
    longer cancels: the residual R_g leaves 0. DFPO's 'min' and 'orth' make sum_i w_i A_i
    = 0 again. The grpo arm (PPO's token ratios, token-mean) is the reference for the
    design-conditions paper's Cor. 3.2: when equal-reward rollouts get different sequence
    weights, the log-odds between two equivalent correct solutions drift and the entropy
    among them goes to 0. Countdown has equivalent solutions by construction, so the
    evaluation's solution entropy measures it.
    Clip range: GSPO's own, eps_low 3e-4 and eps_high 4e-4 (GSPO paper, Zheng et al.
    2025), in the GSPO arms; PPO's 0.2 in the grpo arm. A sequence ratio is a geometric
    mean of token ratios and stays much closer to 1, and with 0.2 GSPO collapsed on the
    embedded model (docs/LOG.md).
    """
    gspo = ["--loss_type", "gspo", "--eps_low", "3e-4", "--eps_high", "4e-4"]
    claims = [Claim(DESIGN, "GSPO's per-rollout sequence weights break cancellation (residual above GRPO's)",
                    "cancellation residual", "gspo", "grpo", +1),
              Claim(DESIGN, "DFPO orth restores cancellation", "cancellation residual", "dfpo_orth", "gspo", -1),
              Claim(DESIGN, "DFPO min restores cancellation", "cancellation residual", "dfpo_min", "gspo", -1),
              Claim(DESIGN, "orth does not cost pass@1", "final pass@1", "dfpo_orth", "gspo", 0),
              Claim(DESIGN, "Cor. 3.2: unequal sequence weights collapse the entropy among equivalent "
                    "correct solutions (GSPO below GRPO)", "final solution entropy", "gspo", "grpo", -1,
                    logged("eval/solution_entropy", "gspo")),
              Claim(DESIGN, "Cor. 3.2: orth keeps it (orth above GSPO)", "final solution entropy", "dfpo_orth",
                    "gspo", +1, logged("eval/solution_entropy", "gspo"))]
    return Sweep(
        name="dfpo",
        claim="Per-rollout sequence weights (GSPO) break the cancellation of shared tokens and collapse the "
              "entropy among equivalent solutions; DFPO's min/orth transforms restore it (design-conditions paper).",
        flags=[*TASKS[task]["flags"], "--minibatches", "4", "--minibatch_mode", "query", "--coupling_pairs", "0"],
        arms={"grpo": [], "gspo": gspo, "dfpo_min": [*gspo, "--weight_transform", "min"],
              "dfpo_orth": [*gspo, "--weight_transform", "orth"]},
        rows=[("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of the per-group residual R_g"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions (countdown), last evaluation"),
              ("final distinct solutions", final("eval/distinct_solutions"),
               "distinct correct solutions per solved prompt, last evaluation"),
              *[(f"solution entropy at pass@1 {level}", at_level("eval/solution_entropy", "eval/pass@1", level),
                 f"the same, where held-out pass@1 first crosses {level} between two evaluations (equal "
                 "progress; runs that cross before the first evaluation or never have no number)")
                for level in (0.40, 0.42)],
              ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
              ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
              ("dropped rollouts", mean_of("dfpo_dropped"),
               "share of rollouts GSPO's clip dropped, mean over steps (DFPO arms only)"),
              ("one-sided groups", mean_of("dfpo_one_sided"),
               "share of groups with both signs left with kept rollouts of one sign by the clip "
               "(orth zeroes them, min cannot cancel them), mean over steps (DFPO arms only)"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("cancellation_residual", "cancellation residual R_g"),
                ("eval/solution_entropy", "entropy over distinct correct solutions"),
                ("clip_frac_low", "clip fraction (low)"), ("clip_frac_high", "clip fraction (high)")],
        claims=claims)


def credit(task: str = "countdown") -> Sweep:
    """GRPO vs positive-only training (psr), with the token diagnostics on (diagnostics.py).

    Diagnostics every 5th step (flips, where updates go, coupling), the token value every
    10th step on 128 stratified positions (32 per cell: boosted/suppressed x positive/
    negative rollouts, 8 continuations each). A value cell is pooled over the run's value
    steps. Under psr failures get A = 0, so there are no negative rollouts and the '-'
    cells are absent by construction.
    """
    cells = {"boosted_pos": "b+", "suppressed_pos": "s+", "boosted_neg": "b-", "suppressed_neg": "s-"}
    claims = [Claim(CANCELLATION, "negative rollouts have boosted tokens and positive rollouts suppressed ones "
                    "in similar shares", "flip b- minus s+", "grpo", None, 0),
              Claim(CANCELLATION, "critic-free RL puts less of the update on template tokens than positive-only "
                    "training", "template share", "grpo", "psr", -1, logged("where/template_share", "grpo")),
              Claim(CANCELLATION, "boosted tokens have higher value than suppressed ones in positive rollouts",
                    "value b+ - s+", "grpo", None, +1),
              Claim(CANCELLATION, "... and in negative rollouts", "value b- - s-", "grpo", None, +1),
              Claim(CANCELLATION, "identical low-confidence tokens couple more than different tokens",
                    "coupling same_low - different", "grpo", None, +1)]
    return Sweep(
        name="credit",
        claim="Tokens flip both ways in positive and negative rollouts; critic-free RL moves the "
              "|Δ log π| share toward reasoning tokens compared with positive-only training; boosted "
              "tokens have higher value than suppressed ones in positive and negative rollouts alike "
              "(Cancellation Hypothesis paper).",
        flags=[*TASKS[task]["flags"], "--flip_every", "5", "--value_every", "10", "--value_samples", "128"],
        arms={"grpo": ["--advantage", "grpo"], "psr": ["--advantage", "psr"]},
        rows=[*[(f"flip {k} {s}", mean_of(f"flip/{k}_{s}"), "share of the rollouts' tokens, mean over "
                 "diagnostic steps") for s in ("pos", "neg") for k in ("boost", "suppress")],
              ("flip b- minus s+", difference(mean_of("flip/boost_neg"), mean_of("flip/suppress_pos")),
               "boosted share in negative rollouts minus suppressed share in positive ones"),
              ("template share", mean_of("where/template_share"),
               "template tokens' share of sum |Δ log π|, mean over diagnostic steps"),
              ("template tokens", mean_of("where/template_tokens"),
               "template tokens' share of the tokens (the even-spread reference)"),
              *[(f"value {short}", pooled_value(cell), f"value of {cell} tokens, pooled over value steps")
                for cell, short in cells.items()],
              *[(f"value n {short}", pooled_n(cell), "positions in that cell, summed over value steps")
                for cell, short in cells.items()],
              ("value b+ - s+", difference(pooled_value("boosted_pos"), pooled_value("suppressed_pos")),
               "pooled value boosted minus suppressed, positive rollouts"),
              ("value b- - s-", difference(pooled_value("boosted_neg"), pooled_value("suppressed_neg")),
               "pooled value boosted minus suppressed, negative rollouts"),
              ("coupling same_low - different", difference(mean_of("coupling/same_low"),
                                                           mean_of("coupling/different")),
               "output-layer coupling, identical low-confidence pairs minus different tokens [recon]"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("flip/boost_pos", "boosted share, positive rollouts"),
                ("flip/suppress_pos", "suppressed share, positive rollouts"),
                ("flip/boost_neg", "boosted share, negative rollouts"),
                ("flip/suppress_neg", "suppressed share, negative rollouts"),
                ("where/template_share", "template share of |Δ log π|"),
                ("value/boosted_pos", "value, boosted tokens of positive rollouts")],
        claims=claims)


SWEEPS = {"batching": batching, "advantages": advantages, "dfpo": dfpo, "credit": credit}


# ---------------------------------------------------------------------------------------
# 3. One number per run: the table's quantities, from plot_runs.load_metrics' series
#    ({key: (steps, values)}, NaN where a step logged null). Each returns NaN when the
#    run never logged the key.
# ---------------------------------------------------------------------------------------

def final(key: str, scale: float = 1.0) -> Callable[[dict], float]:
    """The key's value at its last logged step (for eval/pass@k: the evaluation at the last step)."""
    return lambda series: float(series[key][1][-1]) * scale if key in series else math.nan


def mean_of(key: str) -> Callable[[dict], float]:
    """Mean of the key over the steps that logged it (NaNs skipped)."""
    return lambda series: _nanmean(series[key][1]) if key in series else math.nan


def head_mean(key: str, n: int) -> Callable[[dict], float]:
    """Mean of the key over its first n logged steps."""
    return lambda series: _nanmean(series[key][1][:n]) if key in series else math.nan


def tail_mean(key: str, n: int) -> Callable[[dict], float]:
    """Mean of the key over its last n logged steps."""
    return lambda series: _nanmean(series[key][1][-n:]) if key in series else math.nan


def first_reach(key: str, threshold: float) -> Callable[[dict], float]:
    """steps_to_threshold of the key's curve."""
    return lambda series: steps_to_threshold(*series[key], threshold) if key in series else math.nan


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


def _pool_run(series: dict, cell: str) -> tuple[float, float, int]:
    """pool_cells over the steps that logged value/<cell> (steps with n = 0 log no mean)."""
    if f"value/{cell}" not in series:
        return math.nan, math.nan, 0
    steps, means = series[f"value/{cell}"]
    n_at = dict(zip(*series[f"value/n_{cell}"]))
    se_at = dict(zip(*series.get(f"value/se_{cell}", ([], []))))
    return pool_cells(means, [se_at.get(s, math.nan) for s in steps], [n_at[s] for s in steps])


def _nanmean(values) -> float:
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
