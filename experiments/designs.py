"""designs.py: what a sweep is, what each one asks and costs, and the words its claims share.

    python -m experiments.sweep plan                              # every sweep's arms, runs, parts, times, commands
    python -m experiments.sweep advantages --task countdown --part 1/2

A sweep is a set of ARMS (train.py flag sets that differ in one design choice), each run
from every (warm-up seed, RL seed) pair of the design, a table of quantities (one number
per run, computed from its metrics.jsonl), curves, and two kinds of record written
before the runs (experiments/claims.py), in the file of the sweep's papers
(experiments/designs_cancellation.py, experiments/designs_fade.py; by name:
experiments/registry.py):
  - CHECKS: identities the code must satisfy (a residual 0 to rounding, a mass ratio of
    exactly 2). Measured, compared with the exact expectation: pass or FAIL.
  - CLAIMS: a paper's empirical statement that could have come out either way, quoting
    the sentence it tests; the row that measures it, the arms compared pair by pair, the
    predicted direction (or "similar", with a declared margin). Judged by exact paired
    tests with Holm's correction within each family the claims declare (Claim.family).

The design. Every arm runs from the same 2 x 5 pairs (WARMUP_SEEDS x SEEDS; a sweep that
retests what earlier runs suggested uses FRESH_SEEDS, RL seeds no earlier sweep ran): the
warm-up seed picks the embedded model's starting weights (train.py --warmup_seed), the
RL seed the training prompts, the held-out set and every sample. So arm A's run (w, s)
and arm B's run (w, s) differ only in the design choice, and each claim is tested on 10
per-pair differences: an exact sign-flip test, whose floor 2/2^10 = 0.00195 survives
Holm's correction over up to 25 claims.

The sweeps (the two cancellation papers' in designs_cancellation.py, FADE's in designs_fade.py):
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
  recentred   the dose result's confound (addition, lr 4e-4): random mini-batches
              re-centred per group part (cancellation with random's prompts per step)
              against random and query (ours).
On a pretrained model (task smollm2: SmolLM2-135M-Instruct from its CPU recipe, pairs by
RL seed from its one start; experiments/designs_pretrained.py): batching (random, query,
random_recentred at the edge lr), advantages (the sign axis: psr, nsr against mean on
entropy), credit (grpo vs psr: flips, value, specificity), and edge, the pilot that picks
the batching sweep's lr by a rule declared before it ran.

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
`plan` shows at most ~90 min per part (a sitting). The numbers in TASKS: the pilot with the current
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
    recentred   addition      3    30    100      3.0        45      2        22
    masked      addition      4    80    100      3.0       119      2        60
    batching    smollm2       3    18     40     25.7       232      3        77
    advantages  smollm2       3    30     50     17.6       264      3        88
    credit      smollm2       2    20     30     17.9       179      2        90
    masked      smollm2       4    32     40     25.7       412      8        51
    edge        smollm2       3     6     20     13.9        42      1        42
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

from experiments.claims import Check, Claim
from experiments.held_fixed import HeldFixed
from machinery import warmups

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # recipes are read from here
CANCELLATION = "Cancellation Hypothesis"
OURS = "ours (no paper)"      # a question this project added: on the pages, outside the papers' tables
DESIGN = "Token Gradient Cancellation (design conditions)"
FADE = "FADE"

# The design: every arm of every sweep runs from each of these pairs.
WARMUP_SEEDS = warmups.SHIPPED_SEEDS   # starting checkpoints (train.py --warmup_seed), the blocks:
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
            # the dose sweep's lr 4e-4 arms' budget and step cost; 2 parts: one warm-up seed each
            "recentred": {"steps": 100, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 1.6,
                          "parts": 2},
            # the recentred sweep's settings exactly; its runs took 1.0 process-minute each on AMD
            # EPYC, two at a time
            "masked": {"steps": 100, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 1.6, "parts": 2},
        }},
}

# A pretrained model: SmolLM2-135M-Instruct on chat-worded addition, its CPU recipe's
# settings (recipe_flags) with each sweep's budget and arms on top; the sweeps themselves,
# their pairs (RL seeds from the model's one set of weights) and the edge-lr pilot:
# experiments/designs_pretrained.py. Costs, for `plan`: one step with one optimizer step per
# batch from the recipe's committed seed runs (docs/runs/smollm2-135m-addition-cpu/: 10-11 s,
# two at a time on a quiet 2-core machine) x 1.5, the slowdown a busy machine gives; with 4
# mini-batches, the evaluation and the start from the edge pilot's 6 runs (AMD EPYC, two at a
# time, other work on the machine at a lower priority): 24-35 s a step over its last 10
# steps, 41-82 s for 800 evaluation samples, 85-240 s before the first step (the model's load
# and the start's evaluation); token diagnostics and token values cost more (credit's step_s).
SMOLLM2_RECIPE = "recipes/smollm2-135m-addition-cpu.yaml"
# The batching sweep's lr, from the edge pilot by its declared rule (designs_pretrained.edge): at
# 1e-4 both pilot runs collapsed (held-out pass@1 0.114 -> 0.001, 0.119 -> 0.000 by step 10),
# at 3e-5 one of two ended below its start (0.119 -> 0.409 -> 0.069; the other 0.114 -> 0.318),
# at 1e-5 both ended above it (0.444, 0.606): the largest lr of the grid where both learned.
EDGE_LR = "1e-5"
# What the rule selected (a note beside it, not a change to it): at 1e-5 no arm collapsed, and
# the model sharpens fast (mean token entropy 0.67 -> 0.10 nats, pass@1 flat from step 10-20,
# about 2 of 8 groups carrying signal after step 20). The character model's arms parted at lr
# 4e-4, where 4 of 10 random runs ended above their start; the rule's "both pilot runs above
# their start" picks the analogue of its 2e-4. So the dose question cannot show at 1e-5: the
# masked sweep asks it at 3e-5 (experiments/designs_masked.py), declared before its runs.
TASKS["smollm2"] = {
    "recipe": SMOLLM2_RECIPE, "threshold": 0.5,
    "cost": {"start_s": 120.0, "sample_s": 0.07},
    "sweeps": {
        "edge": {"steps": 20, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 30.0, "parts": 1},
        **({"batching": {"steps": 40, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 30.0,
                         "parts": 3, "flags": ["--lr", EDGE_LR]}} if EDGE_LR else {}),
        "advantages": {"steps": 50, "eval_every": 25, "n_eval": 200, "eval_samples": 4, "step_s": 16.5, "parts": 3},
        "credit": {"steps": 30, "eval_every": 30, "n_eval": 200, "eval_samples": 4, "step_s": 30.0, "parts": 2},
        # the batching sweep's budget at the lr where the edge pilot's random runs parted (3e-5);
        # its runs at 1e-5 took 13.6-42.4 process-minutes (mean 23.6), two at a time beside other work
        "masked": {"steps": 40, "eval_every": 10, "n_eval": 200, "eval_samples": 4, "step_s": 30.0, "parts": 8,
                   "flags": ["--lr", "3e-5"]},
    }}


def recipe_flags(path: str) -> list[str]:
    """A YAML recipe's settings as explicit train.py flags, but those a sweep sets itself.

    'lr: 1.0e-5' -> ['--lr', '1e-05']; 'chat_template: true' -> ['--chat_template'] (false:
    '--no-chat_template'). Left out: the budget and evaluation (steps, eval_every, n_eval,
    eval_samples: each sweep's own, TASKS) and threads (the sweep's --threads 1). Explicit
    flags rather than `--config PATH`: each run's recorded flags are then the whole design,
    so a recipe edited later shows as another design (its runs set aside), never as the same.
    """
    import yaml
    with open(os.path.join(REPO_DIR, path)) as f:
        recipe = yaml.safe_load(f)
    flags = []
    for key, value in recipe.items():
        if key in ("steps", "eval_every", "n_eval", "eval_samples", "threads"):
            continue
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        else:
            flags += [f"--{key}", str(value)]
    return flags


def task_flags(task: str) -> list[str]:
    """The flags every run on the task gets: its recipe's (recipe_flags) or TASKS[task]["flags"]."""
    recipe = TASKS[task].get("recipe")
    return recipe_flags(recipe) if recipe else list(TASKS[task]["flags"])


def task_seeds(task: str) -> dict:
    """The pairs' seeds on the task: {"seeds", "warmup_seeds"} for a pretrained model's recipe
    (6 RL seeds from its one start: with 6 pairs the exact two-sided test reaches 0.031, with
    5 it cannot), {} for the embedded model (the Sweep's defaults)."""
    return {"seeds": PRETRAINED_SEEDS, "warmup_seeds": (0,)} if TASKS[task].get("recipe") else {}


PRETRAINED_SEEDS = (0, 1, 2, 3, 4, 5)


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
    held: list[HeldFixed] = field(default_factory=list)
    """What each control arm holds equal to another arm's, measured on every step (claims.py run_held)."""
    holm: str = "declared"
    """Holm's primary reading: "declared" (each Claim.family) or "sweep" (one family for the
    sweep's claims on a task); the pages give the other beside it."""
    seeds: tuple[int, ...] = SEEDS
    """The RL seeds of its pairs: SEEDS, or FRESH_SEEDS for a sweep that retests on runs no
    earlier claim has seen (with the same warm-up seeds)."""
    warmup_seeds: tuple[int, ...] = WARMUP_SEEDS
    """The warm-up seeds of its pairs (the embedded model's starting weights); (0,) on a
    pretrained model, whose runs all start from its one set of weights."""
    declared_in: str = ""
    """The file that declares it, when it is not its registry function's (the pages name it)."""


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


# ---------------------------------------------------------------------------------------
# What every sweep's checks and claims share
# ---------------------------------------------------------------------------------------

# What a control arm holds equal to another's (held_fixed.HeldFixed), by the text a claim's `needs`
# names. random_recentred was declared (recentred sweep, SmolLM2's batching) as "random's
# prompts per step with cancellation"; what it holds was not measured then. Measured since on
# every step (train.py logs what carries gradient), it is declared here to be checked, not
# assumed: the claims that read random_recentred as changing only cancellation need it.
HOLDS_TRAINED = "random_masked trains on random_recentred's rollouts, prompts and sum of |A| in every optimizer step"
HOLDS_SPLIT = "random_masked draws random's split: the same groups cut in every optimizer step"
RECENTRED_HOLDS = "random_recentred trains on random's rollouts, prompts and sum of |A| in every optimizer step"
RECENTRED_HELD = HeldFixed(RECENTRED_HOLDS, "random_recentred", "random", "random")

RESIDUAL_TOL = 1e-6     # float rounding of a residual whose exact value is 0 (or 1, 1/3)
FIRST_STEP_TOL = 1e-5   # the first optimizer step reads pi_old from a separate pass: ratio 1 +- 1e-7


def threshold(task: str) -> float:
    """The task's pass@1 level for "steps to threshold" (TASKS)."""
    return TASKS[task]["threshold"]


def logged(key: str, arm: str) -> Callable[[dict], str | None]:
    """Not testable if no run of `arm` logged `key` (e.g. no template on the task)."""
    def check(series: dict) -> str | None:
        return None if any(key in s for s in series.get(arm, [])) else f"{key} is not logged on this task"
    return check
