"""designs.py: every sweep's arms and budgets, and the checks and claims declared before its runs.

    python -m experiments.sweep plan                              # every sweep's arms, runs, parts, times, commands
    python -m experiments.sweep advantages --task countdown --part 1/2

A sweep is a set of ARMS (train.py flag sets that differ in one design choice), each run
from every (warm-up seed, RL seed) pair of the design, a table of quantities (one number
per run, computed from its metrics.jsonl), curves, and two kinds of record written here
before the runs (experiments/claims.py):
  - CHECKS: identities the code must satisfy (a residual 0 to rounding, a mass ratio of
    exactly 2). Measured, compared with the exact expectation: pass or FAIL.
  - CLAIMS: a paper's empirical statement that could have come out either way, quoting
    the sentence it tests; the row that measures it, the arms compared pair by pair, the
    predicted direction (or "similar", with a declared margin). Judged by exact paired
    tests with Holm's correction per sweep per task.

The design. Every arm runs from the same 2 x 5 pairs (WARMUP_SEEDS x SEEDS; a sweep that
retests what earlier runs suggested uses FRESH_SEEDS, RL seeds no earlier sweep ran): the
warm-up seed picks the embedded model's starting weights (train.py --warmup_seed), the
RL seed the training prompts, the held-out set and every sample. So arm A's run (w, s)
and arm B's run (w, s) differ only in the design choice, and each claim is tested on 10
per-pair differences: an exact sign-flip test, whose floor 2/2^10 = 0.00195 survives
Holm's correction over up to 25 claims.

The sweeps:
  batching    4 mini-batches per rollout batch, split five ways (batching.py): does
              keeping a group in one optimizer step keep the template from drifting, and
              does it learn better (Cancellation Hypothesis)?
  advantages  the sign axis and the difficulty axis against mean (Dr. GRPO; power and
              asym at alpha = delta = 1 ARE mean): psr, nsr, asym on entropy (FADE
              paper); power's arm for its checks and rows (its claim: tradeoff).
  fade        FADE (the paper's delta rule, and the [recon] relative rule of scheduler.py)
              against mean, FADE with its schedule off: the step of the smoothed peak of
              pass@1 (censored at the run's end), that peak not lower, and pass@k at every
              k = 1..16; meant to be long enough that the reference peaks.
  dfpo        GSPO taken apart (equal weights and its sequence weights, the clip out of
              reach; its clip with equal weights) and DFPO's orth against GSPO on sample
              efficiency, stability, final pass@1 and drift (design-conditions paper).
  credit      GRPO against positive-only training with the token diagnostics: flips,
              where updates go, token values, coupling (Cancellation Hypothesis).
  tradeoff    power (alpha 2) against mean on pass@16 and pass@1, on fresh RL seeds: the
              trade-off the fade sweep's runs suggested (FADE paper), countdown only.
  specificity are tokens specific to successes reinforced more, under GRPO than psr, and
              the flips' factor 2, declared before fresh runs (Cancellation Hypothesis).
  dose        the update size as a dose: on addition lr 1e-4, 2e-4, 4e-4, on countdown 4
              or 8 optimizer steps per batch at lr 4e-4, x {random, query} mini-batches
              and {GSPO, orth}: does what keeps cancellation alive matter more as updates
              grow (both cancellation papers' stability claims)?

Tasks. Countdown (tasks/countdown.py, the default) starts at held-out pass@1 ~0.23
with pass@16 ~0.83, its tokens have entropy, and most prompts have several correct
answers, so claims about pass@k, entropy and diversity can show. Addition, the default
of train.py, has a near-certain template and one answer per prompt: its solution-entropy
claim is not testable (its own testability check says so). Its warm-up converges on a
noisy teacher, and GRPO lifts held-out pass@1 from ~0.5 to ~0.9 within 25-75 steps, so its
sweeps are short and evaluate often.

Evaluation noise. Held-out pass@1 averages n_eval prompts x eval_samples samples; for a
fixed held-out set its sampling SE is at most sqrt(p(1-p) / (n_eval eval_samples)):
0.0125 for countdown's 100 x 16 and 0.018 for addition's 200 x 4 at p = 0.5. A paired
difference has sqrt(2) times that, the mean over 10 pairs sqrt(2/10) times: 0.0056 and
0.008, below the pass@1 effects the claims test (0.02-0.1). Every page states it for its
own runs.

Budget (2 cores, 2 runs at a time). Per run: start + steps x step_s + evaluations x n_eval
x eval_samples x sample_s (TASKS' "cost" and "step_s", and `plan`). The costs come from
    python -m experiments.sweep pilot --task TASK
which runs one 12-step run per sweep here, two at a time as a sweep does, and prints them.
Re-run it before starting the sweeps (the embedded model may have changed since; on another
machine the costs differ), paste its numbers into TASKS, and set each sweep's parts so that
`plan` shows at most ~40 min per part. The numbers in TASKS: the pilot with the current
embedded model (addition at width 128, countdown at 64) on a box shared with other jobs
(load average 7.5-8.6 on 2 cores), divided by 3.35, the slowdown that load gave on
countdown (whose model is unchanged: the earlier countdown sweeps' own loop time, two runs
sharing the 2 cores, was 0.43 s per step against the pilot's 1.44). A warm-up not yet
cached or shipped costs more, once per warm-up seed and machine (~10 min each under that
load for the current models). `plan` prints, beside each estimate, the minutes per run
measured on the committed runs (their records' wall seconds): how far the estimate is off
on the machines that ran them, with whatever else those machines ran. Each part is
committed (`report`, then git add docs/ README.md) before the next, so the work can
continue on another machine with an empty runs/:

    sweep       task       arms  runs  steps  min/run  wall min  parts  min/part
    batching    countdown     5    50    150      1.7        42      2        21
    advantages  countdown     6    60    150      1.3        40      2        20
    fade        countdown     6    60    600      5.9       176      5        35
    dfpo        countdown     7    70    150      2.2        76      2        38
    credit      countdown     2    20    120      1.1        11      1        11
    tradeoff    countdown     2    20    600      5.9        59      2        29
    specificity countdown     2    20    120      1.1        11      1        11
    dose        countdown     8    80    150      1.7        70      2        35
    batching    addition      5    50    100      2.1        52      2        26
    advantages  addition      6    60    120      1.5        46      2        23
    fade        addition      6    60    300      4.1       124      4        31
    dfpo        addition      7    70    100      1.9        68      2        34
    credit      addition      2    20    100      1.0        10      1        10
    specificity addition      2    20    100      1.0        10      1        10
    dose        addition     12   120    100      3.0       179      5        36
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from experiments.claims import Check, Claim
from machinery import tinymodel
from experiments.quantities import (at_start, censored, collapsed, difference, final, final_max_pass, first_reach,
                                    head_mean, log_ratio, max_of, mean_of, min_of, peak_of, peak_step_of, peaked_at_end,
                                    pooled_n, pooled_value, ratio, smoothed_peak, smoothed_peak_step, tail_mean, total)

CANCELLATION = "Cancellation Hypothesis"
OURS = "ours (no paper)"      # a question this project added: on the pages, outside the papers' tables
DESIGN = "Token Gradient Cancellation (design conditions)"
FADE = "FADE"

# The design: every arm of every sweep runs from each of these pairs.
WARMUP_SEEDS = tinymodel.SHIPPED_SEEDS   # starting checkpoints (train.py --warmup_seed), the blocks:
                                        # the shipped ones, so every machine starts from the same bytes
SEEDS = (0, 1, 2, 3, 4)      # RL seeds per warm-up seed: 2 x 5 = 10 pairs per comparison
FRESH_SEEDS = (5, 6, 7, 8, 9)   # RL seeds no earlier sweep ran: claims suggested by earlier runs are tested here

# Per task: the flags every run gets, the pass@1 level of "steps to threshold" (set
# before the runs, about halfway between the start of RL and where the default run ends:
# docs/results.md), the cost model of the budget (seconds: process start-up and model
# load, per evaluation sample; measured by a pilot, see `cost`), and per sweep: steps,
# evaluation (every, prompts, samples per prompt), seconds per training step (pilot),
# the number of parts it runs in, and any flags of its own on that task.
TASKS = {
    "countdown": {
        "flags": ["--data", "countdown"], "threshold": 0.40,
        "cost": {"start_s": 8.3, "sample_s": 0.00068},
        "sweeps": {
            "batching": {"steps": 150, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.57, "parts": 2},
            "advantages": {"steps": 150, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.43,
                           "parts": 2},
            "fade": {"steps": 600, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.53, "parts": 5},
            "dfpo": {"steps": 150, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.77, "parts": 2},
            "credit": {"steps": 120, "eval_every": 30, "n_eval": 100, "eval_samples": 16, "step_s": 0.45, "parts": 1},
            # fresh RL seeds (FRESH_SEEDS); step costs from the fade and credit sweeps' own arms
            "tradeoff": {"steps": 600, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.53, "parts": 2},
            "specificity": {"steps": 120, "eval_every": 30, "n_eval": 100, "eval_samples": 16, "step_s": 0.45,
                            "parts": 1},
            # step_s: one 12-step run of its gspo arm at 8 mini-batches took 0.37 s a step alone on
            # a quiet box; two at a time, and diagnostics every 10th step, make it about 0.6.
            "dose": {"steps": 150, "eval_every": 25, "n_eval": 100, "eval_samples": 16, "step_s": 0.6, "parts": 2},
        }},
    "addition": {
        "flags": [], "threshold": 0.75,
        "cost": {"start_s": 10.7, "sample_s": 0.00099},
        "sweeps": {
            # lr 1e-4: 4 Adam steps per batch at the default 4e-4 collapse some addition runs
            # (dfpo's, and a pilot: seed 1 fell from 0.50 to 0.02 in 15 steps, grpo, random
            # mini-batches); at 1e-4 the pilot's 3 seeds all learned (0.84-0.88 by step 15).
            # Set before the batching runs of this design, not after them.
            "batching": {"steps": 100, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 1.07, "parts": 2,
                         "flags": ["--lr", "1e-4"]},
            "advantages": {"steps": 120, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 0.59,
                           "parts": 2},
            "fade": {"steps": 300, "eval_every": 20, "n_eval": 200, "eval_samples": 16, "step_s": 0.63, "parts": 4},
            "dfpo": {"steps": 100, "eval_every": 5, "n_eval": 200, "eval_samples": 4, "step_s": 0.90, "parts": 2},
            "credit": {"steps": 100, "eval_every": 20, "n_eval": 200, "eval_samples": 4, "step_s": 0.46, "parts": 1},
            # step_s from the committed addition dfpo runs (4 mini-batches, the same budget but
            # evaluation every 5): 2.5-3.8 process-minutes a run, two at a time on 2 cores.
            "specificity": {"steps": 100, "eval_every": 20, "n_eval": 200, "eval_samples": 4, "step_s": 0.46,
                            "parts": 1},
            "dose": {"steps": 100, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 1.6, "parts": 5},
        }},
}

# The sources' sentences each claim tests, verbatim (the papers' abstracts).
Q_FLIPS = ("In contrast, we study critic-free RL from a token-level perspective, revealing the token-flipping "
           "phenomenon: positive and negative rollouts exhibit remarkably similar proportions of tokens whose "
           "probabilities are boosted or suppressed during RL training.")
Q_TEMPLATE = ("(1) Compared with training on only positive rollouts, critic-free RL shifts updates from template "
              "and formatting tokens toward reasoning tokens;")
Q_VALUE = ("(2) Tokens boosted by critic-free RL consistently demonstrate higher value than suppressed tokens, "
           "regardless of whether they originate from positive or negative rollouts.")
Q_BATCHING = ("Guided by this view, we implement two batching interventions to encourage or preserve cancellation "
              "in critic-free RL training: query-preserved mini-batching and reward-balanced batching.")
Q_BATCHING_GAIN = ("Despite their simplicity, these interventions improve RLVR training across multiple model "
                   "scales, supporting cancellation as both an explanatory principle and a practical design "
                   "criterion for critic-free RL training.")
Q_MECHANISMS = 'We show that two common mechanisms disrupting exchangeability make "non-cancellation" a structural norm.'
Q_DFPO = ("Experimental results demonstrate that these transformations stabilize training, improve sample "
          "efficiency, and enhance final performance, validating the value of this design condition.")
Q_EXCHANGE = ("This paper presents a necessary condition for algorithm design from a token-level credit assignment "
              "perspective: to prevent reward-irrelevant drift, intra-group objectives must maintain gradient "
              "exchangeability across token updates, enabling gradient cancellation on weak-credit/high-frequency "
              "tokens.")
Q_DRIFT = ("However, long-term training often leads to issues like ineffective update accumulation (learning tax), "
           "solution probability drift, and entropy collapse.")
Q_SIGN = "On the sign axis, imbalanced updates collapse either entropy or weight geometry."
Q_DIFFICULTY = "On the difficulty axis, hard-problem focus sharpens signal but costs sample size."
Q_PHASES = ("These trade-offs shift during training: exploration favors balance and hard focus while exploitation "
            "favors suppression and medium focus.")
Q_SPECIFIC = ("Building upon this analysis, we propose the cancellation hypothesis: as a result of coupling, opposing "
              "signals cancel out for tokens shared by positive and negative rollouts, while tokens more specific to "
              "successful rollouts receive stronger reinforcement, thereby inducing hidden token-level credit "
              "assignment from rollout-level rewards.")
Q_FADE = ("FADE reaches peak pass@1 20k steps earlier than the best static baseline at the 7B scale and 2k steps "
          "earlier at the 32B , while achieving the best accuracy-diversity trade-off across all pass@k on "
          "LiveCodeBench and AIME.")


@dataclass
class Sweep:
    """What one named sweep runs and reports."""

    name: str
    claim: str
    """What the sweep is about, in one or two sentences (the page's header)."""
    flags: list[str]
    """train.py flags every arm shares (the task's flags included)."""
    arms: dict[str, list[str]]
    """Arm name -> its own train.py flags (after `flags`)."""
    rows: list[tuple[str, Callable[[dict], float], str]]
    """The table's quantities: (label, f(load_metrics of one run) -> one number, how it is computed)."""
    curves: list[tuple[str, str]]
    """(metrics key, panel title): drawn as mean ± SE over runs, one line per arm."""
    claims: list[Claim] = field(default_factory=list)
    """The findings the sweep tests, judged by experiments/claims.py."""
    checks: list[Check] = field(default_factory=list)
    """The identities its runs must satisfy (experiments/claims.py run_checks)."""
    seeds: tuple[int, ...] = SEEDS
    """The RL seeds of its pairs: SEEDS, or FRESH_SEEDS for a sweep that retests on runs no
    earlier claim has seen (with the same warm-up seeds)."""


def settings(task: str, name: str) -> dict:
    """TASKS[task]["sweeps"][name]: steps, evaluation, step cost and parts of one sweep on one task."""
    return TASKS[task]["sweeps"][name]


def runs_on(task: str, name: str) -> bool:
    """Whether the sweep is declared on the task (TASKS lists each task's sweeps)."""
    return name in TASKS[task]["sweeps"]


def estimate_minutes(task: str, name: str) -> float:
    """Estimated minutes of one run: start + steps x step_s + evaluations x samples x sample_s."""
    s, cost = settings(task, name), TASKS[task]["cost"]
    evaluations = math.ceil(s["steps"] / s["eval_every"])
    return (cost["start_s"] + s["steps"] * s["step_s"]
            + evaluations * s["n_eval"] * s["eval_samples"] * cost["sample_s"]) / 60


def eval_flags(task: str, name: str) -> list[str]:
    """The evaluation flags of one sweep's runs."""
    s = settings(task, name)
    return ["--eval_every", str(s["eval_every"]), "--n_eval", str(s["n_eval"]), "--eval_samples", str(s["eval_samples"])]


def budget_table(jobs: int = 2) -> str:
    """Every sweep's estimate on each task: runs, minutes per run, wall minutes with `jobs`
    runs at a time, its parts and the wall minutes of each (the header's table; `plan`)."""
    lines = ["    sweep       task       arms  runs  steps  min/run  wall min  parts  min/part"]
    for task in TASKS:
        for name, make in SWEEPS.items():
            if not runs_on(task, name):
                continue
            arms, s = len(make(task).arms), settings(task, name)
            runs = arms * len(WARMUP_SEEDS) * len(make(task).seeds)
            wall = runs * estimate_minutes(task, name) / jobs
            lines.append(f"    {name:<11} {task:<10} {arms:>4} {runs:>5} {s['steps']:>6} "
                         f"{estimate_minutes(task, name):>8.1f} {wall:>9.0f} {s['parts']:>6} {wall / s['parts']:>9.0f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# 1. Testability checks and notes (a claim's runs may not be able to speak to it)
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


# ---------------------------------------------------------------------------------------
# 2. The sweeps (task: 'countdown' or 'addition')
# ---------------------------------------------------------------------------------------

RESIDUAL_TOL = 1e-6     # float rounding of a residual whose exact value is 0 (or 1, 1/3)
FIRST_STEP_TOL = 1e-5   # the first optimizer step reads pi_old from a separate pass: ratio 1 +- 1e-7


def batching(task: str = "countdown") -> Sweep:
    """Mini-batch formation with 4 optimizer steps per rollout batch (batching.py).

    With one optimizer step per batch every group's positive and negative rollouts are
    in the same step, so the updates of the tokens they share cancel for a zero-sum
    advantage. With 4 mini-batches that holds only if a group stays whole in one of
    them: 'random' splits groups, 'query' and 'query_balanced' never do, 'balanced' and
    'mass_balanced' balance positives and negatives (counts or advantage mass) per
    mini-batch. Checks: the first optimizer step's residual (ratio 1 there) is 0 to
    rounding with whole groups and above 0 with split ones. Findings: template drift =
    mean |Δ log π| per template token after the step (diagnostics.where_updates_go,
    every 10th step), and final pass@1, each against random.
    """
    modes = ("random", "query", "balanced", "query_balanced", "mass_balanced")
    claims = [*[Claim(CANCELLATION, f"{mode} mini-batches: less template drift than random", Q_BATCHING,
                      "template drift", mode, "random", -1, testable=logged("where/abs_dlogp_template", mode))
                for mode in modes[1:4]],
              # mass_balanced balances advantage MASS, not counts: a mode this project added
              # (docs/math.md), so its question is ours, in a family of its own.
              Claim(OURS, "mass_balanced mini-batches: less template drift than random", Q_BATCHING,
                    "template drift", "mass_balanced", "random", -1, family="ours",
                    testable=logged("where/abs_dlogp_template", "mass_balanced")),
              *[Claim(CANCELLATION, f"{mode} mini-batches: higher final pass@1 than random", Q_BATCHING_GAIN,
                      "final pass@1", mode, "random", +1) for mode in ("query", "balanced")]]
    checks = [Check("whole groups, zero-sum advantage: the first optimizer step's residual is 0 to rounding",
                    "first-step residual", ("query", "query_balanced"), "zero", tol=FIRST_STEP_TOL),
              Check("split groups cannot cancel: the first optimizer step's residual is above 0",
                    "first-step residual", ("random", "balanced", "mass_balanced"), "positive", tol=1e-3),
              Check("query modes never split a group", "split groups / step", ("query", "query_balanced"), "zero")]
    return Sweep(
        name="batching",
        claim="Keeping each group's rollouts in one optimizer step keeps the updates of shared "
              "(template) tokens cancelling (Cancellation Hypothesis paper); splitting groups "
              "(random mini-batches) leaves them to drift.",
        flags=[*TASKS[task]["flags"], "--minibatches", "4", *settings(task, "batching").get("flags", []),
               "--coupling_pairs", "0"],
        arms={mode: ["--minibatch_mode", mode] for mode in modes},
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              (f"steps to pass@1 >= {threshold(task)}", first_reach("eval/pass@1", threshold(task)),
               "first evaluation step at or above the task's threshold (one evaluation past the end if never)"),
              ("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of R_g per optimizer step"),
              ("first-step residual", mean_of("cancellation_residual_first"),
               "the same, first optimizer step of each batch only (ratio 1)"),
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
        claims=claims, checks=checks)


# The rows of the two sweeps whose arms run at a set or scheduled alpha and delta: the
# checks read them (power at alpha 2, asym at delta 0.5, FADE inside its clip), and the wall clock.
SCHEDULE_ROWS = [("alpha min", min_of("sched/alpha"), "smallest alpha of the run"),
                 ("alpha max", max_of("sched/alpha"), "largest alpha of the run"),
                 ("delta min", min_of("sched/delta"), "smallest delta of the run"),
                 ("delta max", max_of("sched/delta"), "largest delta of the run"),
                 ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")]


def advantages(task: str = "countdown") -> Sweep:
    """The FADE paper's two axes, each against mean (Dr. GRPO), on the same task.

    The sign axis: psr (successes only), nsr (failures only) and asym (failures x 1/delta,
    delta = 0.5); the difficulty axis: power (alpha = 2). At alpha = delta = 1 both probes
    ARE mean, so mean is the reference that changes one thing (grpo also divides by the
    group's std, a difficulty reweighting of its own; it is run as a descriptive arm).
    Every arm passes only the hyper-parameter its advantage reads.
    """
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
        rows=[("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              ("entropy, first 10 steps", head_mean("entropy", 10), "mean token entropy, nats"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions (countdown), last evaluation"),
              ("m_S (mean)", mean_of("m_S"), "success mass per rollout, mean over steps"),
              ("m_F (mean)", mean_of("m_F"), "failure mass per rollout, mean over steps"),
              ("m_S - m_F", difference(mean_of("m_S"), mean_of("m_F")), "the sign axis' imbalance"),
              ("m_F / m_S", ratio(mean_of("m_F"), mean_of("m_S")), "failure mass per unit of success mass"),
              ("cancellation residual", mean_of("cancellation_residual"), "mean over diagnostic steps of R_g"),
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
        rows=[("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("step of peak", peak_step_of("eval/pass@1"), "its step (the first, on ties)"),
              ("peak at the last evaluation", peaked_at_end("eval/pass@1"), "1 if the run peaked at its end"),
              ("smoothed peak pass@1", smoothed_peak("eval/pass@1"),
               "largest value of the 3-point moving average of held-out pass@1"),
              ("step of smoothed peak", smoothed_peak_step("eval/pass@1"),
               "its step; one evaluation past the end when it is the last evaluation (censored)"),
              ("smoothed peak censored", censored("eval/pass@1"), "1 if the smoothed curve peaks at the run's end"),
              ("gain lost", difference(peak_of("eval/pass@1"), final("eval/pass@1")), "peak minus final pass@1"),
              *[(f"final pass@{k}", final(f"eval/pass@{k}"), f"held-out pass@{k} at the last step") for k in ks],
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions (countdown), last evaluation"),
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


def dfpo(task: str = "countdown") -> Sweep:
    """GSPO taken apart, and DFPO's orth against GSPO (loss.py), 4 query mini-batches.

    GSPO weighs each rollout by its own (clipped) sequence ratio, so after the first
    mini-batch a token shared by the group no longer cancels. The design-conditions
    paper names two mechanisms; our reading [recon] of GSPO's are its sequence weights and
    its clip (which drops rollouts), and GSPO has a third, undeclared by the paper: its
    per-sequence length normalisation 1/|o_i| (a check: it alone leaves a residual on the
    first optimizer step, where every weight is 1). Three arms take them apart on DFPO's
    token-sum path (loss.dfpo_transform's controls), each one change from the next:
      equal_noclip  weight 1 for every rollout, a clip range the sequence ratio never
                    reaches (--eps_low 0.5 --eps_high 1): GSPO's surrogate with neither mechanism;
      seq_weights   GSPO's sequence weights, the same unreachable clip (the one change: the weights);
      clip_only     GSPO's clip (3e-4 / 4e-4, GSPO paper) with weight 1 for every rollout it
                    keeps: dropping rollouts breaks zero-sum by construction, so its residual
                    is a check, not a finding.
    That the clip is never reached is what the first two need of the training: a
    precondition (manipulation check), measured, met or not. GSPO and the DFPO arms use
    GSPO's own clip range; grpo PPO's 0.2. orth against GSPO: sample efficiency (steps to
    the task's pass@1 threshold), stability (the seed spread of final pass@1 within a
    warm-up seed, the gain lost after the peak), final pass@1, template drift, and
    (countdown) the entropy among equivalent correct solutions.
    """
    gspo_clip = ["--eps_low", "3e-4", "--eps_high", "4e-4"]
    no_clip = ["--eps_low", "0.5", "--eps_high", "1"]                  # a range the sequence ratio never reaches
    claims = [Claim(DESIGN, "GSPO's sequence weights alone (clip out of reach): more residual than equal weights",
                    Q_MECHANISMS, "cancellation residual", "seq_weights", "equal_noclip", +1, posthoc=True),
              Claim(DESIGN, "orth reaches the task's pass@1 threshold in fewer steps than GSPO", Q_DFPO,
                    f"steps to pass@1 >= {threshold(task)}", "dfpo_orth", "gspo", -1),
              Claim(DESIGN, "orth: smaller seed spread of final pass@1 than GSPO", Q_DFPO, "final pass@1",
                    "dfpo_orth", "gspo", -1, statistic="spread"),
              Claim(DESIGN, "orth loses less pass@1 after its peak than GSPO", Q_DFPO, "gain lost", "dfpo_orth", "gspo",
                    -1),
              Claim(DESIGN, "orth: higher final pass@1 than GSPO", Q_DFPO, "final pass@1", "dfpo_orth", "gspo", +1),
              Claim(DESIGN, "orth: more entropy among equivalent correct solutions than GSPO", Q_DRIFT,
                    "final solution entropy", "dfpo_orth", "gspo", +1,
                    testable=logged("eval/solution_entropy", "dfpo_orth")),
              Claim(DESIGN, "orth: less template drift than GSPO", Q_EXCHANGE, "template drift", "dfpo_orth", "gspo",
                    -1, posthoc=True, testable=logged("where/abs_dlogp_template", "dfpo_orth"))]
    checks = [Check("orth: the kept rollouts' weights cancel in every group", "cancellation residual", ("dfpo_orth",),
                    "zero", tol=RESIDUAL_TOL),
              Check("equal weights on-policy: the first optimizer step's residual is 0 to rounding",
                    "first-step residual", ("grpo", "equal_noclip", "seq_weights", "clip_only", "dfpo_min", "dfpo_orth"),
                    "zero", tol=FIRST_STEP_TOL),
              Check("GSPO's 1/|o_i| length normalisation weighs a shared token apart in each rollout: first-step "
                    "residual above 0", "first-step residual", ("gspo",), "positive", tol=1e-3),
              Check("GSPO's clip drops rollouts, so what is left of a group no longer sums to zero: residual above 0",
                    "cancellation residual", ("clip_only",), "positive", tol=1e-3),
              Check("seq_weights and equal_noclip: their clip range is never reached", "clip frac (both)",
                    ("seq_weights", "equal_noclip"), "zero", kind="precondition")]
    return Sweep(
        name="dfpo",
        claim="Per-rollout weights (GSPO's sequence ratios, its clip) break the cancellation of shared tokens; "
              "DFPO's orth transform restores it and should train better than GSPO (design-conditions paper).",
        flags=[*TASKS[task]["flags"], "--minibatches", "4", "--minibatch_mode", "query", "--coupling_pairs", "0"],
        arms={"grpo": [], "gspo": ["--loss_type", "gspo", *gspo_clip],
              "seq_weights": ["--loss_type", "gspo", "--weight_transform", "keep", "--eps_low", "0.5", "--eps_high", "1"],
              "equal_noclip": ["--loss_type", "gspo", "--weight_transform", "equal", *no_clip],
              "clip_only": ["--loss_type", "gspo", "--weight_transform", "equal", *gspo_clip],
              "dfpo_min": ["--loss_type", "gspo", *gspo_clip, "--weight_transform", "min"],
              "dfpo_orth": ["--loss_type", "gspo", *gspo_clip, "--weight_transform", "orth"]},
        rows=[("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of the per-group residual R_g"),
              ("first-step residual", mean_of("cancellation_residual_first"),
               "the same, first optimizer step of each batch only (ratio 1)"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("gain lost", difference(peak_of("eval/pass@1"), final("eval/pass@1")), "peak minus final pass@1"),
              (f"steps to pass@1 >= {threshold(task)}", first_reach("eval/pass@1", threshold(task)),
               "first evaluation step at or above the task's threshold (one evaluation past the end if never)"),
              ("final pass@k", final_max_pass(), "held-out pass@k at the last step, the largest k evaluated"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions (countdown), last evaluation"),
              ("template drift", mean_of("where/abs_dlogp_template"),
               "mean |Δ log π| per template token, mean over diagnostic steps"),
              ("final distinct solutions", final("eval/distinct_solutions"),
               "distinct correct solutions per solved prompt, last evaluation"),
              ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
              ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
              ("clip frac (both)", total(mean_of("clip_frac_low"), mean_of("clip_frac_high")), "low + high"),
              ("dropped rollouts", mean_of("dfpo_dropped"),
               "share of rollouts GSPO's clip dropped, mean over steps (DFPO path arms only)"),
              ("one-sided groups", mean_of("dfpo_one_sided"),
               "share of groups with both signs left with kept rollouts of one sign by the clip "
               "(orth zeroes them, min cannot cancel them), mean over steps (DFPO path arms only)"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("cancellation_residual", "cancellation residual R_g"),
                ("eval/solution_entropy", "entropy over distinct correct solutions"),
                ("clip_frac_low", "clip fraction (low)"), ("clip_frac_high", "clip fraction (high)")],
        claims=claims, checks=checks)


FLIP_MARGIN = math.log(2)   # "similar": the two shares within a factor of 2


def credit(task: str = "countdown") -> Sweep:
    """GRPO vs positive-only training (psr), with the token diagnostics on (diagnostics.py).

    Diagnostics every 5th step (flips, where updates go, coupling), the token value every
    10th step on 128 stratified positions (32 per cell: boosted/suppressed x positive/
    negative rollouts, 8 continuations each), a value cell pooled over the run's value
    steps. Under psr failures get A = 0, so there are no negative rollouts.
    Flips separate the paper from the naive view (each token follows its own rollout's
    advantage): the two shares are tested as equivalent within a factor of 2, a margin set
    after earlier runs were public (re-readings here; the specificity sweep declares it
    before fresh runs). Coupling: the output-layer bracket is ~1 for identical
    low-confidence tokens and ~0 for confident ones whatever the training, so both of its
    orderings are checks (psr shows them too), not findings.
    """
    cells = {"boosted_pos": "b+", "suppressed_pos": "s+", "boosted_neg": "b-", "suppressed_neg": "s-"}
    # The factor-2 margins were set after earlier runs' shares were public: re-readings here;
    # the specificity sweep tests them again on fresh RL seeds, declared before its runs.
    claims = [Claim(CANCELLATION, "boosted shares of negative and positive rollouts within a factor 2", Q_FLIPS,
                    "flip log(b- / b+)", "grpo", None, 0, margin=FLIP_MARGIN, posthoc=True),
              Claim(CANCELLATION, "suppressed shares of positive and negative rollouts within a factor 2", Q_FLIPS,
                    "flip log(s+ / s-)", "grpo", None, 0, margin=FLIP_MARGIN, posthoc=True),
              Claim(CANCELLATION, "less of the update on template tokens than psr", Q_TEMPLATE, "template share",
                    "grpo", "psr", -1, testable=logged("where/template_share", "grpo")),
              Claim(CANCELLATION, "boosted tokens of positive rollouts: higher value than suppressed", Q_VALUE,
                    "value b+ - s+", "grpo", None, +1),
              Claim(CANCELLATION, "boosted tokens of negative rollouts: higher value than suppressed", Q_VALUE,
                    "value b- - s-", "grpo", None, +1)]
    # Not findings: "psr still suppresses >1% of its tokens" is near-certain under Adam (any
    # shared parameter's normalised step moves other tokens) and does not isolate coupling;
    # "identical low-confidence tokens couple more than identical confident ones" is the
    # output-layer formula itself ((1 - p)^2 |h|^2 for identical tokens): psr shows the same
    # gap. The second is a check below; the first stays a row of the page.
    checks = [Check("zero-sum advantage, one optimizer step: residual 0 to rounding", "cancellation residual",
                    ("grpo",), "zero", tol=RESIDUAL_TOL),
              Check("psr's one-signed advantage cannot cancel: residual exactly 1", "cancellation residual", ("psr",),
                    "equals", 1.0, tol=RESIDUAL_TOL),
              Check("psr gives failures no mass", "m_F (mean)", ("psr",), "zero"),
              Check("the coupling formula's bracket: same_low - different > 0 in every run, psr too",
                    "coupling same_low - different", ("grpo", "psr"), "positive"),
              Check("the coupling formula's bracket: identical low-confidence pairs above identical confident ones "
                    "in every run, psr too", "coupling same_low - same_high", ("grpo", "psr"), "positive")]
    return Sweep(
        name="credit",
        claim="Tokens flip both ways in positive and negative rollouts; critic-free RL moves the "
              "|Δ log π| share toward reasoning tokens compared with positive-only training; boosted "
              "tokens have higher value than suppressed ones in positive and negative rollouts alike; "
              "coupling is strongest between identical low-confidence tokens (Cancellation Hypothesis paper).",
        flags=[*TASKS[task]["flags"], "--flip_every", "5", "--value_every", "10", "--value_samples", "128"],
        arms={"grpo": ["--advantage", "grpo"], "psr": ["--advantage", "psr"]},
        rows=[*[(f"flip {k} {s}", mean_of(f"flip/{k}_{s}"), "share of the rollouts' tokens, mean over "
                 "diagnostic steps") for s in ("pos", "neg") for k in ("boost", "suppress")],
              ("flip log(b- / b+)", log_ratio(mean_of("flip/boost_neg"), mean_of("flip/boost_pos")),
               "log of the boosted share in negative rollouts over that in positive ones (naive view: -inf)"),
              ("flip log(s+ / s-)", log_ratio(mean_of("flip/suppress_pos"), mean_of("flip/suppress_neg")),
               "log of the suppressed share in positive rollouts over that in negative ones (naive view: -inf)"),
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
              *[(f"coupling {cls}", mean_of(f"coupling/{cls}"), "output-layer coupling per unit lr [recon]")
                for cls in ("same_low", "same_high", "different")],
              ("coupling same_low - same_high", difference(mean_of("coupling/same_low"), mean_of("coupling/same_high")),
               "identical low-confidence pairs minus identical confident pairs [recon]"),
              ("coupling same_low - different", difference(mean_of("coupling/same_low"), mean_of("coupling/different")),
               "identical low-confidence pairs minus different tokens [recon]"),
              ("cancellation residual", mean_of("cancellation_residual"), "mean over diagnostic steps of R_g"),
              ("m_F (mean)", mean_of("m_F"), "failure mass per rollout, mean over steps"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("flip/boost_pos", "boosted share, positive rollouts"),
                ("flip/suppress_pos", "suppressed share, positive rollouts"),
                ("flip/boost_neg", "boosted share, negative rollouts"),
                ("flip/suppress_neg", "suppressed share, negative rollouts"),
                ("where/template_share", "template share of |Δ log π|"),
                ("value/boosted_pos", "value, boosted tokens of positive rollouts")],
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
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@8", final("eval/pass@8"), "held-out pass@8 at the last step"),
              ("final pass@16", final("eval/pass@16"), "held-out pass@16 at the last step"),
              ("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("final solution entropy", final("eval/solution_entropy"),
               "entropy over distinct correct solutions, last evaluation"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              *SCHEDULE_ROWS],
        curves=[("eval/pass@1", "held-out pass@1"), ("eval/pass@16", "held-out pass@16"),
                ("entropy", "entropy (nats/token)"), ("eval/solution_entropy", "entropy over correct solutions")],
        claims=[Claim(FADE, "power (alpha 2): higher final pass@16 than mean", Q_PHASES, "final pass@16", "power",
                      "mean", +1),
                Claim(FADE, "power (alpha 2): lower final pass@1 than mean", Q_DIFFICULTY, "final pass@1", "power",
                      "mean", -1)],
        checks=[Check("power runs at alpha = 2 on every step", ("alpha min", "alpha max"), ("power",), "equals", 2.0)],
        seeds=FRESH_SEEDS)


def specificity(task: str = "countdown") -> Sweep:
    """The Cancellation Hypothesis' central sentence, and its flips, on fresh runs.

    "tokens more specific to successful rollouts receive stronger reinforcement": on each
    diagnostic step, for every token id in a group with both successes and failures, its
    specificity (the share of the group's successes that contain it minus the share of its
    failures) against its reinforcement (the mean Δ log π of its occurrences after the
    update); per step the correlation over the (group, token) cells (diagnostics.specificity).
    Two findings: it is positive under GRPO, and larger than under positive-only training
    (psr, the one change: failures get A = 0 instead of a negative advantage), which is what
    cancellation adds: a token shared with failures is pushed up by psr and cancelled by GRPO.
    The flips' factor-2 equivalence and the template share, declared again here, before runs
    on FRESH_SEEDS. Diagnostics every 5th step, no token values (costly) and no coupling
    (its orderings are checks of the formula, in the credit sweep).
    """
    return Sweep(
        name="specificity",
        claim="Tokens specific to successful rollouts are reinforced more than tokens shared with failures, and "
              "more so under critic-free RL than under positive-only training (Cancellation Hypothesis paper).",
        flags=[*TASKS[task]["flags"], "--flip_every", "5", "--coupling_pairs", "0"],
        arms={"grpo": ["--advantage", "grpo"], "psr": ["--advantage", "psr"]},
        rows=[("specificity corr", mean_of("credit/specificity_corr"),
               "correlation of a token's specificity with its Δ log π, mean over diagnostic steps"),
              ("specificity cells", mean_of("credit/specificity_cells"), "(group, token) cells per diagnostic step"),
              ("flip log(b- / b+)", log_ratio(mean_of("flip/boost_neg"), mean_of("flip/boost_pos")),
               "log of the boosted share in negative rollouts over that in positive ones (naive view: -inf)"),
              ("flip log(s+ / s-)", log_ratio(mean_of("flip/suppress_pos"), mean_of("flip/suppress_neg")),
               "log of the suppressed share in positive rollouts over that in negative ones (naive view: -inf)"),
              *[(f"flip {k} {s}", mean_of(f"flip/{k}_{s}"), "share of the rollouts' tokens, mean over "
                 "diagnostic steps") for s in ("pos", "neg") for k in ("boost", "suppress")],
              ("template share", mean_of("where/template_share"),
               "template tokens' share of sum |Δ log π|, mean over diagnostic steps"),
              ("template tokens", mean_of("where/template_tokens"),
               "template tokens' share of the tokens (the even-spread reference)"),
              ("cancellation residual", mean_of("cancellation_residual"), "mean over diagnostic steps of R_g"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("credit/specificity_corr", "specificity vs Δ log π"),
                ("flip/boost_neg", "boosted share, negative rollouts"),
                ("where/template_share", "template share of |Δ log π|")],
        claims=[Claim(CANCELLATION, "tokens more specific to successes are reinforced more (correlation above 0)",
                      Q_SPECIFIC, "specificity corr", "grpo", None, +1),
                Claim(CANCELLATION, "specificity and reinforcement correlate more than under psr", Q_SPECIFIC,
                      "specificity corr", "grpo", "psr", +1),
                Claim(CANCELLATION, "boosted shares of negative and positive rollouts within a factor 2", Q_FLIPS,
                      "flip log(b- / b+)", "grpo", None, 0, margin=FLIP_MARGIN),
                Claim(CANCELLATION, "suppressed shares of positive and negative rollouts within a factor 2", Q_FLIPS,
                      "flip log(s+ / s-)", "grpo", None, 0, margin=FLIP_MARGIN),
                Claim(CANCELLATION, "less of the update on template tokens than psr", Q_TEMPLATE, "template share",
                      "grpo", "psr", -1, testable=logged("where/template_share", "grpo"))],
        checks=[Check("zero-sum advantage, one optimizer step: residual 0 to rounding", "cancellation residual",
                      ("grpo",), "zero", tol=RESIDUAL_TOL),
                Check("psr's one-signed advantage cannot cancel: residual exactly 1", "cancellation residual",
                      ("psr",), "equals", 1.0, tol=RESIDUAL_TOL)],
        seeds=FRESH_SEEDS)


GSPO_CLIP = ["--eps_low", "3e-4", "--eps_high", "4e-4"]       # GSPO paper's sequence-ratio clip range

# The dose on each task: the flags every arm shares, then the doses from smallest to
# largest as (arm suffix, words for the findings, that dose's flags). Addition: Adam's lr
# with 4 optimizer steps per rollout batch (the step size that collapsed its dfpo runs).
# Countdown, where lr 4e-4 with 4 mini-batches trains well in the batching and dfpo
# sweeps: the number of optimizer steps per batch at that lr, 4 then 8 (each step after the
# first moves the policy further from the one that sampled the batch).
DOSES = {"addition": (["--minibatches", "4"],
                      [("lr1e-4", "lr 1e-4", ["--lr", "1e-4"]), ("lr2e-4", "lr 2e-4", ["--lr", "2e-4"]),
                       ("lr4e-4", "lr 4e-4", ["--lr", "4e-4"])]),
         "countdown": (["--lr", "4e-4"],
                       [("mb4", "4 mini-batches", ["--minibatches", "4"]),
                        ("mb8", "8 mini-batches", ["--minibatches", "8"])])}


def dose_arm(method: str, dose: str) -> str:
    """The dose sweep's arm name: method and dose suffix, 'query_lr4e-4' or 'query_mb8'."""
    return f"{method}_{dose}"


def no_collapse(*arms: str) -> Callable[[dict], str | None]:
    """Not testable if no run of these arms collapsed (every pair's flag difference is 0)."""
    def check(series: dict) -> str | None:
        flags = [collapsed()(s) for a in arms for s in series.get(a, [])]
        return None if any(f == 1.0 for f in flags) else f"no run of {' or '.join(arms)} collapsed"
    return check


def dose(task: str = "addition") -> Sweep:
    """Update size as a dose: does keeping cancellation alive matter more as steps grow?

    The only large differences of the earlier sweeps came where updates were large: on
    addition at lr 4e-4 with 4 mini-batches grpo (query mini-batches), GSPO's sequence
    weights alone and orth collapsed, while GSPO, its clip alone and min learned. The
    papers' practical claims are about exactly that regime: keeping training stable when a
    group's rollouts are split across optimizer steps (query-preserved mini-batching) or
    weighted apart (DFPO's orth against GSPO). So the update size is the dose (DOSES):
    on addition Adam's lr in {1e-4, 2e-4, 4e-4} with 4 mini-batches per rollout batch (the
    first optimizer step on policy, the next three off it); on countdown 4 or 8 mini-batches
    at lr 4e-4. At each dose four arms that differ in one choice each:
      random  grpo, groups split at random across the optimizer steps;
      query   grpo, each group whole in one optimizer step (the one change: the split);
      gspo    GSPO (sequence ratio, its clip 3e-4 / 4e-4), query mini-batches;
      orth    GSPO with DFPO's orth transform (the one change: the transform).
    Primary findings, declared before any run: the INTERACTIONS, query's gain over random
    at the largest dose minus its gain at the smallest (and orth's over gspo), per pair on
    final pass@1: the papers predict the gain grows with the dose. Secondary: final pass@1
    and a collapse flag (final pass@1 below half the start) at each dose. Two Holm families.
    The countdown doses were declared after the addition runs had shown both interactions
    opposite to the papers, and before any countdown dose run: a test on a second task.
    """
    shared, doses = DOSES[task]
    methods = {"random": ["--minibatch_mode", "random"], "query": ["--minibatch_mode", "query"],
               "gspo": ["--minibatch_mode", "query", "--loss_type", "gspo", *GSPO_CLIP],
               "orth": ["--minibatch_mode", "query", "--loss_type", "gspo", *GSPO_CLIP, "--weight_transform", "orth"]}
    arms = {dose_arm(m, d): [*flags, *dose_flags] for d, _, dose_flags in doses for m, flags in methods.items()}
    (low, low_words, _), (high, high_words, _) = doses[0], doses[-1]
    pairs = (("query", "random", CANCELLATION, Q_BATCHING_GAIN), ("orth", "gspo", DESIGN, Q_DFPO))
    larger = f"at {high_words} than at {low_words}" if task == "addition" else f"with {high_words} than with {low_words}"
    claims = [Claim(paper, f"{arm}'s gain over {ref} in final pass@1 is larger {larger}",
                    quote, "final pass@1", dose_arm(arm, high), dose_arm(ref, high), +1,
                    minus=(dose_arm(arm, low), dose_arm(ref, low)), family="primary")
              for arm, ref, paper, quote in pairs]
    claims += [Claim(paper, f"{words}: {arm} higher final pass@1 than {ref}", quote, "final pass@1",
                     dose_arm(arm, d), dose_arm(ref, d), +1, family="secondary")
               for arm, ref, paper, quote in pairs for d, words, _ in doses]
    claims += [Claim(paper, f"{words}: {arm} collapses less often than {ref}", quote, "collapsed",
                     dose_arm(arm, d), dose_arm(ref, d), -1, family="secondary",
                     testable=no_collapse(dose_arm(arm, d), dose_arm(ref, d)))
               for arm, ref, paper, quote in pairs for d, words, _ in doses]
    whole = tuple(dose_arm(m, d) for d, _, _ in doses for m in ("query", "gspo", "orth"))
    checks = [Check("query mini-batches never split a group", "split groups / step", whole, "zero"),
              Check("random mini-batches split groups", "split groups / step",
                    tuple(dose_arm("random", d) for d, _, _ in doses), "positive"),
              Check("whole groups, equal weights on-policy: the first optimizer step's residual is 0 to rounding",
                    "first-step residual", tuple(dose_arm(m, d) for d, _, _ in doses for m in ("query", "orth")),
                    "zero", tol=FIRST_STEP_TOL),
              Check("orth: the kept rollouts' weights cancel in every group", "cancellation residual",
                    tuple(dose_arm("orth", d) for d, _, _ in doses), "zero", tol=RESIDUAL_TOL)]
    claim = ("The step size as a dose: with 4 optimizer steps per rollout batch, keeping each group whole "
             "(Cancellation Hypothesis paper) and DFPO's orth transform (design-conditions paper) should matter "
             "more as Adam's lr grows from 1e-4 to 4e-4." if task == "addition" else
             "The number of optimizer steps per rollout batch as a dose: at lr 4e-4, keeping each group whole "
             "(Cancellation Hypothesis paper) and DFPO's orth transform (design-conditions paper) should matter "
             "more with 8 mini-batches than with 4.")
    return Sweep(
        name="dose",
        claim=claim,
        flags=[*TASKS[task]["flags"], *shared, "--coupling_pairs", "0"],
        arms=arms,
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("start pass@1", at_start("eval/pass@1"), "held-out pass@1 of the starting weights (start.json)"),
              ("collapsed", collapsed(), "1 if final pass@1 < half of start pass@1, else 0"),
              ("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("min pass@1", min_of("eval/pass@1"), "worst held-out pass@1 over the run's evaluations"),
              ("gain lost", difference(peak_of("eval/pass@1"), final("eval/pass@1")), "peak minus final pass@1"),
              ("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of the per-group residual R_g"),
              ("first-step residual", mean_of("cancellation_residual_first"),
               "the same, first optimizer step of each batch only (ratio 1)"),
              ("split groups / step", mean_of("mb/split_groups"),
               "groups cut across optimizer steps, per optimizer step, mean over steps"),
              ("clip frac (both)", total(mean_of("clip_frac_low"), mean_of("clip_frac_high")),
               "clip fraction low + high, mean over steps"),
              ("dropped rollouts", mean_of("dfpo_dropped"),
               "share of rollouts GSPO's clip dropped, mean over steps (DFPO path arms only)"),
              ("approx kl", mean_of("approx_kl"), "mean over steps of the sampling policy's KL to the updated one"),
              ("grad norm", mean_of("grad_norm"), "mean over steps of the gradient norm before clipping"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("approx_kl", "approx KL to the sampling policy"), ("grad_norm", "gradient norm"),
                ("cancellation_residual", "cancellation residual R_g")],
        claims=claims, checks=checks)


SWEEPS = {"batching": batching, "advantages": advantages, "fade": fade, "dfpo": dfpo, "credit": credit,
          "tradeoff": tradeoff, "specificity": specificity, "dose": dose}


def threshold(task: str) -> float:
    """The task's pass@1 level for "steps to threshold" (TASKS)."""
    return TASKS[task]["threshold"]
