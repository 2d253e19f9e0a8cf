"""designs_fade.py: the sweeps of FADE (the sign and difficulty axes of the advantage).

Any advantage splits into positive and negative gradient mass along a sign axis
(successes against failures) and a difficulty axis (easy against hard prompts); FADE
schedules both from the solve rate and the entropy. Each function returns one Sweep
(experiments/designs.py says what a sweep is, its budget on each task and how its claims
are judged); experiments/registry.py lists them by name:
  advantages  the sign axis (psr, nsr, asym) and the static arms FADE is measured against
  fade        FADE's schedule against mean, FADE with its schedule off
  tradeoff    hard-prompt focus (power, alpha 2) against mean, on fresh RL seeds
"""

from __future__ import annotations

import math
from typing import Callable

from experiments import designs_pretrained
from experiments.claims import Check, Claim
from experiments.designs import (FADE, FRESH_SEEDS, Q_DIFFICULTY, Q_FADE, Q_PHASES, Q_SIGN, RESIDUAL_TOL, TASKS, Sweep,
                                 settings)
from experiments.quantities import (censored, final, head_mean, max_of, min_of, peak_step_of, peaked_at_end, row, rows,
                                    smoothed_peak, smoothed_peak_step)


# ---------------------------------------------------------------------------------------
# Testability checks and notes of the scheduled arms (a claim's runs may not speak to it)
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


def reference_peaked(arm: str, key: str = "eval/pass@1") -> Callable[[dict], str | None]:
    """Not testable if the reference arm's smoothed curve peaked at its last evaluation
    (censored) in more than half of its runs: the runs ended before it peaked."""
    def check(series: dict) -> str | None:
        flags = [censored(key)(s) for s in series.get(arm, []) if key in s]
        if not flags:
            return f"{key} was not logged"
        if sum(flags) > len(flags) / 2:
            return f"{arm}'s smoothed {key.split('/')[-1]} peaked at its last evaluation in {int(sum(flags))} of " \
                   f"{len(flags)} runs"
        return None
    return check


def first_reason(*checks: Callable[[dict], str | None]) -> Callable[[dict], str | None]:
    """The first of several testability checks that finds a reason."""
    return lambda series: next((r for c in checks if (r := c(series))), None)


def schedule_range(arm: str) -> Callable[[dict], str]:
    """How far the arm's schedule moved: 'delta moved over [0.55, 1.00], alpha over [1.31, 2.40]'."""
    def note(series: dict) -> str:
        parts = []
        for key in ("sched/delta", "sched/alpha"):
            v = [x for s in series.get(arm, []) if key in s for x in s[key][1] if math.isfinite(x)]
            if v:
                parts.append(f"{key.split('/')[1]} over [{min(v):.2f}, {max(v):.2f}]")
        return f"{arm}'s " + " and ".join(parts) if parts else ""
    return note


# The rows of the two sweeps whose arms run at a set or scheduled alpha and delta: the
# checks read them (power at alpha 2, asym at delta 0.5, FADE inside its clip), and the wall clock.
SCHEDULE_ROWS = [("alpha min", min_of("sched/alpha"), "smallest alpha of the run"),
                 ("alpha max", max_of("sched/alpha"), "largest alpha of the run"),
                 ("delta min", min_of("sched/delta"), "smallest delta of the run"),
                 ("delta max", max_of("sched/delta"), "largest delta of the run"),
                 row("minutes")]


def advantages(task: str = "countdown") -> Sweep:
    """The FADE paper's two axes, each against mean (Dr. GRPO), on the same task.

    The sign axis: psr (successes only), nsr (failures only) and asym (failures x 1/delta,
    delta = 0.5); the difficulty axis: power (alpha = 2). At alpha = delta = 1 both probes
    ARE mean, so mean is the reference that changes one thing (grpo also divides by the
    group's std, a difficulty reweighting of its own; it is run as a descriptive arm).
    Every arm passes only the hyper-parameter its advantage reads.
    """
    if TASKS[task].get("recipe"):                     # a pretrained model: the sign axis alone
        return designs_pretrained.advantages(task)
    zero_sum = ("grpo", "mean", "power")
    # power (alpha 2) is no finding here: the source states a trade-off ("sharpens signal but
    # costs sample size"), not a higher pass@1; the trade-off is declared in the tradeoff
    # sweep, on runs of its own. The power arm stays for its checks and the page's rows.
    claims = [Claim(FADE, "more failure mass (asym, delta 0.5): higher entropy than mean", Q_SIGN,
                    "entropy, last 10 steps", "asym", "mean", +1),
              Claim(FADE, "success mass only (psr): entropy collapses below mean's", Q_SIGN,
                    "entropy, last 10 steps", "psr", "mean", -1),
              Claim(FADE, "failure mass only (nsr): entropy stays above mean's", Q_SIGN,
                    "entropy, last 10 steps", "nsr", "mean", +1)]
    checks = [Check("zero-sum advantage, one optimizer step: residual 0 to rounding", "cancellation residual",
                    zero_sum, "zero", tol=RESIDUAL_TOL),
              Check("one-signed advantage cannot cancel: residual exactly 1", "cancellation residual",
                    ("psr", "nsr"), "equals", 1.0, tol=RESIDUAL_TOL),
              Check("asym, delta 0.5: residual (2 - 1) / (2 + 1) = 1/3 in every mixed group",
                    "cancellation residual", ("asym",), "equals", 1 / 3, tol=RESIDUAL_TOL),
              Check("zero-sum advantage: success mass = failure mass", "m_S - m_F", zero_sum, "zero", tol=1e-6),
              Check("asym: failure mass = success mass / delta = 2 m_S", "m_F / m_S", ("asym",), "equals", 2.0,
                    tol=1e-6),
              Check("psr gives failures no mass", "m_F (mean)", ("psr",), "zero"),
              Check("nsr gives successes no mass", "m_S (mean)", ("nsr",), "zero"),
              Check("power runs at alpha = 2 on every step", ("alpha min", "alpha max"), ("power",), "equals", 2.0),
              Check("asym runs at delta = 0.5 on every step", ("delta min", "delta max"), ("asym",), "equals", 0.5)]
    return Sweep(
        name="advantages",
        claim="How much a success pushes up and a failure pushes down (m_S vs m_F, the sign axis) and which "
              "solve rates get the weight (the difficulty axis) move entropy and pass@1 (FADE paper).",
        flags=[*TASKS[task]["flags"], "--coupling_pairs", "0"],
        arms={"grpo": ["--advantage", "grpo"], "mean": ["--advantage", "mean"], "psr": ["--advantage", "psr"],
              "nsr": ["--advantage", "nsr"], "power": ["--advantage", "power", "--alpha", "2"],
              "asym": ["--advantage", "asym", "--delta", "0.5"]},
        rows=[*rows("peak pass@1", "final pass@1", "final pass@k", "entropy, first 10 steps", "entropy, last 10 steps",
                    "final solution entropy", "m_S (mean)", "m_F (mean)", "m_S - m_F", "m_F / m_S",
                    "cancellation residual"),
              *SCHEDULE_ROWS],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("m_S", "success mass m_S per rollout"), ("m_F", "failure mass m_F per rollout"),
                (f"eval/pass@{settings(task, 'advantages')['eval_samples']}", "held-out pass@k, largest k")],
        claims=claims, checks=checks)


STATIC = ("grpo", "mean", "power", "asym")       # the fade sweep's static arms
PEAK_MARGIN = 0.02      # "not lower": FADE's smoothed peak pass@1 at most 0.02 below mean's (about 3
                        # evaluation SEs of a 10-pair mean on countdown, 0.006; 8 on addition)


def fade(task: str = "countdown") -> Sweep:
    """FADE against the same advantage with its schedule off, in runs meant to be long enough
    that the reference peaks: "earlier" needs a reference that has peaked.

    Two FADE arms: the paper's rule delta = clip(1 + H_hat - H_target, 0.3, 1) with the
    paper's best target 0.5 H0, and the [recon] relative rule delta = clip(H_hat /
    H_target, 0.3, 1) (scheduler.py, docs/math.md §4) with target 0.8 H0: the mean token
    entropy of countdown keeps its free template wording (~0.6 nats) and fell to ~70% of
    H0 in 300 steps of GRPO, so a target of half of H0 is never reached and delta never
    moves. The reference is `mean`, declared, not chosen on the runs: FADE's advantage at
    alpha = delta = 1 IS mean, so mean is FADE with one change, its schedule off (the paper's
    "best static baseline" is chosen among arms that differ in more than that; grpo, power
    and asym stay as descriptive arms, their numbers on the page).

    The peak, made testable: the step where the 3-point moving average of held-out pass@1
    peaks (quantities.smoothed_peak_step), censored when that is the last evaluation (the
    run ended before the peak: it counts as later than any observed peak); "earlier" is
    only half of the claim, so a second finding asks that FADE's smoothed peak be not
    lower than mean's by more than PEAK_MARGIN (a non-inferiority test). Not testable when
    mean's smoothed peak is censored in more than half of its runs (the runs were too
    short to say when the reference peaks), or when delta never moved. Each FADE verdict
    says how far delta and alpha moved. pass@k at every k = 1..16 needs 16 evaluation
    samples on both tasks. These findings restate earlier ones (best static baseline, raw
    argmax) after their runs were public: re-readings (posthoc), not tests declared first.
    """
    ks = (1, 2, 4, 8, 16)
    fade_arms = {"fade": ["--advantage", "fade", "--schedule", "fade"],
                 "fade_rel": ["--advantage", "fade", "--schedule", "fade_rel", "--target_rel", "0.8"]}
    claims = []
    for arm in fade_arms:
        moved = schedule_moved(arm, "sched/delta", 0.98, 1.0)
        claims += [Claim(FADE, f"{arm}: smoothed pass@1 peaks at an earlier step than with the schedule off (mean)",
                         Q_FADE, "step of smoothed peak", arm, "mean", -1, posthoc=True,
                         testable=first_reason(moved, reference_peaked("mean")), note=schedule_range(arm)),
                   Claim(FADE, f"{arm}: smoothed peak pass@1 not lower than mean's (margin {PEAK_MARGIN})", Q_FADE,
                         "smoothed peak pass@1", arm, "mean", +1, margin=PEAK_MARGIN, statistic="not_lower",
                         posthoc=True, testable=moved, note=schedule_range(arm)),
                   Claim(FADE, f"{arm}: higher final pass@k than mean at every k = 1..16", Q_FADE,
                         tuple(f"final pass@{k}" for k in ks), arm, "mean", +1, posthoc=True,
                         testable=moved, note=schedule_range(arm))]
    checks = [Check("FADE's alpha stays in its clip [1, 3]", ("alpha min", "alpha max"), tuple(fade_arms), "within",
                    (1.0, 3.0)),
              Check("FADE's delta stays in its clip [0.3, 1]", ("delta min", "delta max"), tuple(fade_arms), "within",
                    (0.3, 1.0)),
              Check("power runs at alpha = 2 on every step", ("alpha min", "alpha max"), ("power",), "equals", 2.0),
              Check("asym runs at delta = 0.5 on every step", ("delta min", "delta max"), ("asym",), "equals", 0.5)]
    return Sweep(
        name="fade",
        claim="FADE reads the solve rate and the entropy to set its difficulty focus (alpha) and failure "
              "weight (delta); it should peak earlier than the best static advantage and keep the best pass@k "
              "at every k (FADE paper).",
        flags=[*TASKS[task]["flags"], "--coupling_pairs", "0"],
        arms={**fade_arms, "grpo": ["--advantage", "grpo"], "mean": ["--advantage", "mean"],
              "power": ["--advantage", "power", "--alpha", "2"], "asym": ["--advantage", "asym", "--delta", "0.5"]},
        rows=[row("peak pass@1"),
              ("step of peak", peak_step_of("eval/pass@1"), "its step (the first, on ties)"),
              ("peak at the last evaluation", peaked_at_end("eval/pass@1"), "1 if the run peaked at its end"),
              ("smoothed peak pass@1", smoothed_peak("eval/pass@1"),
               "largest value of the 3-point moving average of held-out pass@1"),
              ("step of smoothed peak", smoothed_peak_step("eval/pass@1"),
               "its step; one evaluation past the end when it is the last evaluation (censored)"),
              ("smoothed peak censored", censored("eval/pass@1"), "1 if the smoothed curve peaks at the run's end"),
              *rows("gain lost", *[f"final pass@{k}" for k in ks], "entropy, last 10 steps", "final solution entropy"),
              # What the schedule read: whether delta could move (H_hat against H_target),
              # and where alpha's solve rate p_hat (which starts at 0.5) went.
              ("solve rate, first 50 steps", head_mean("solve_rate", 50), "mean training solve rate"),
              ("p_hat min", min_of("sched/p_hat"), "smallest smoothed solve rate (alpha reads it)"),
              ("p_hat final", final("sched/p_hat"), "smoothed solve rate at the last step"),
              ("H_hat first", head_mean("sched/H_hat", 1), "smoothed entropy at the first step, nats"),
              ("H_hat final", final("sched/H_hat"), "smoothed entropy at the last step, nats"),
              ("H_target", final("sched/H_target"), "the entropy target (delta reads H_hat against it)"),
              *SCHEDULE_ROWS],
        curves=[("eval/pass@1", "held-out pass@1"), ("eval/pass@16", "held-out pass@16"),
                ("entropy", "entropy (nats/token)"), ("sched/alpha", "alpha"), ("sched/delta", "delta"),
                ("sched/H_hat", "smoothed entropy H_hat")],
        claims=claims, checks=checks)


def tradeoff(task: str = "countdown") -> Sweep:
    """Hard-prompt focus as a trade-off, on runs that did not suggest it (countdown only).

    In the fade sweep on countdown, static power (alpha 2, weight on hard prompts) ended
    with pass@8 and pass@16 about 0.05 above grpo in 9 of 10 pairs and pass@1 about 0.036
    below: the accuracy-diversity trade-off the FADE paper describes ("hard-problem focus
    sharpens signal but costs sample size"; "exploration favors ... hard focus while
    exploitation favors ... medium focus"). Seen there, not declared there; declared here
    before fresh runs (FRESH_SEEDS: the same warm-ups, RL seeds no sweep has run), against
    the one-change reference mean (power at alpha 1 IS mean), at the fade sweep's length.
    """
    return Sweep(
        name="tradeoff",
        claim="Weight on hard prompts (power, alpha 2) trades pass@1 for pass@k: more distinct problems solved "
              "in 16 tries, fewer in one (FADE paper's difficulty axis).",
        flags=[*TASKS[task]["flags"], "--coupling_pairs", "0"],
        arms={"mean": ["--advantage", "mean"], "power": ["--advantage", "power", "--alpha", "2"]},
        rows=[*rows("final pass@1", "final pass@8", "final pass@16", "peak pass@1"),
              row("final solution entropy", how="entropy over distinct correct solutions, last evaluation"),
              row("entropy, last 10 steps"), *SCHEDULE_ROWS],
        curves=[("eval/pass@1", "held-out pass@1"), ("eval/pass@16", "held-out pass@16"),
                ("entropy", "entropy (nats/token)"), ("eval/solution_entropy", "entropy over correct solutions")],
        claims=[Claim(FADE, "power (alpha 2): higher final pass@16 than mean", Q_PHASES, "final pass@16", "power",
                      "mean", +1),
                Claim(FADE, "power (alpha 2): lower final pass@1 than mean", Q_DIFFICULTY, "final pass@1", "power",
                      "mean", -1)],
        checks=[Check("power runs at alpha = 2 on every step", ("alpha min", "alpha max"), ("power",), "equals", 2.0)],
        seeds=FRESH_SEEDS)
