"""sweep.py: the papers' training-level claims as named sweeps (arms x seeds), with tables.

    python -m experiments.sweep batching                         # 5 arms x 3 seeds at the defaults below
    python -m experiments.sweep advantages --seeds 0,1 --steps 60 --arms grpo,psr
    python -m experiments.sweep all --jobs 2                     # the four sweeps in one pool of processes

A sweep is a set of ARMS, train.py flag sets that differ in one design choice, each run
with several SEEDS. The seed is the RL seed (prompt order, token sampling, mini-batch
shuffles, evaluation samples); the starting checkpoint is the SAME for every run: the
embedded model's cached warm-up (tinymodel.py), trained once with its own fixed seed. So
the spread over seeds is the spread of RL from one checkpoint, not over checkpoints.

The four sweeps, one function each (section 1), and what each one tests:
  batching    4 mini-batches per rollout batch, split five ways (batching.py): does keeping
              a group's rollouts in one optimizer step (so that the updates of the tokens
              they share cancel) change learning and the drift of the template tokens?
  advantages  seven advantages (advantages.py), from GRPO to FADE: where does pass@1 peak,
              what happens to pass@4 and to entropy, how do the success and failure masses
              m_S, m_F move?
  dfpo        GSPO against DFPO's two weight transforms, with 4 mini-batches so that the
              importance ratios leave 1: do the transforms restore cancellation (residual
              ~0) without costing pass@1?
  credit      GRPO against positive-only training (psr), token diagnostics on
              (diagnostics.py): token flips in positive and negative rollouts, the share
              of |Δ log π| on template tokens, and the Monte Carlo value of boosted versus
              suppressed tokens.
Each function returns a `Sweep`: its arms, the quantities its table reports (each a
function of one run's metrics.jsonl), the curves it draws and the comparisons it tests.

Running. Each run is one `train.py` process with one torch thread (OMP_NUM_THREADS=1,
--threads 1); --jobs of them run at a time (2 for the 2-core machine). Before any run
starts, this process makes sure the embedded model's warm-up is cached, so no two runs
ever warm up at once. Files:
    OUT/NAME/ARM/seed_S/   train.py's run directory (config.json, metrics.jsonl,
                           checkpoints/), plus train.log (the run's stdout and stderr),
                           sweep_args.json (the flags it was started with) and
                           done.json (written last, atomically, when the run finished)
    OUT/NAME/sweep.log     one line per run event (started, skipped, done, failed)
    OUT/NAME/summary.md    the table (below), the command, date and machine
    OUT/NAME/curves.png    mean ± SE over seeds of each curve of the sweep
Resume by directory: a run with done.json and the same flags is skipped; a run without
done.json (killed, rebooted) restarts with train.py --resume, which continues exactly
from its last checkpoint (or from step 0 if there is none); a directory holding a run
with OTHER flags is an error (choose another --out, or remove it), never overwritten and
never mixed into a table. A failing run does not stop the others: sweep.py lets them
finish, writes the tables from the runs that did, then exits 1 with one line per failed
run naming its log.

The table (summary.md): one row per quantity, one column per arm. A cell reads
"mean ± SE [seed 0, seed 1, ...]" over the arm's finished seeds, with SE = std(ddof=1) /
sqrt(n), the standard error of the mean over seeds; "(n=k)" when only k seeds have a
number (e.g. steps to a threshold some seeds never reached). The test rows use one
rule, named in the file: the 2-SE rule. Against a reference arm: the difference of the
means divided by its standard error sqrt(SE_a^2 + SE_ref^2) (Welch's t statistic); a
within-arm difference (boosted minus suppressed value, per seed): its mean over its SE.
|t| > 2 reads "differs", else "within noise". With 3 seeds per arm that is lenient: at
Welch's 2-4 degrees of freedom, |t| = 2 is a two-sided p of about 0.12-0.18. We print t
so a reader can apply a stricter cut; the verdicts in the README use this one.

Budget. All four sweeps at the defaults (3 seeds, 17 arms, 51 runs) are meant to fit
in 90 minutes of wall time on 2 cores; the arithmetic is next to the defaults below.
`python -m experiments.sweep all` runs the 51 runs in one pool, longest first, so no core idles at
the end of one sweep while the next waits.

For tests: everything after `--` goes to every train.py run, after the sweep's own flags
(so it wins), e.g. a tiny untrained model instead of the warm-up:
    python -m experiments.sweep credit --steps 3 --seeds 0 -- --model DIR --digits 1
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tqdm import tqdm

from experiments import plot_runs

# ---------------------------------------------------------------------------------------
# The defaults: change them here.
# ---------------------------------------------------------------------------------------
SEEDS = (0, 1, 2)                 # RL seeds per arm
JOBS = 2                          # train.py processes at a time (one torch thread each)
OUT = os.path.join("runs", "sweeps")
STEPS = {"batching": 200, "advantages": 200, "dfpo": 150, "credit": 120}   # training steps per run
EVAL_EVERY = 10                   # held-out evaluation every this many steps (and at the last)
N_EVAL = 200                      # held-out prompts per evaluation
EVAL_SAMPLES = 4                  # samples per prompt: pass@1, pass@2, pass@4
THRESHOLD = 0.75                  # "steps to pass@1 >= THRESHOLD" (batching sweep)
T_RULE = 2.0                      # the 2-SE rule: |t| > T_RULE reads "differs"
# Budget: one run costs about start-up + STEPS x step + STEPS / EVAL_EVERY x eval +
# diagnostics; with these defaults `all` fits in an hour on 2 idle cores (measured:
# docs/results.md). On a busy box, raise EVAL_EVERY first: evaluation is the cost that
# does not change what the sweep measures.

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
TRAIN_PY = os.path.join(REPO_DIR, "train.py")


@dataclass
class Sweep:
    """What one named sweep runs and reports."""

    name: str
    claim: str
    """The papers' claims this sweep tests, in one or two sentences (summary.md's header)."""
    flags: list[str]
    """train.py flags every arm shares."""
    arms: dict[str, list[str]]
    """Arm name -> its own train.py flags (after `flags`)."""
    rows: list[tuple[str, Callable[[dict], float], str]]
    """The table's quantities: (label, f(load_metrics of one run) -> one number, how it is computed)."""
    curves: list[tuple[str, str]]
    """(metrics key, panel title): drawn as mean ± SE over seeds, one line per arm."""
    tests: list[tuple[str, str | None]]
    """(row label, reference arm): the 2-SE rule against that arm, or (None) against 0."""


# ---------------------------------------------------------------------------------------
# 1. The sweeps
# ---------------------------------------------------------------------------------------

def batching() -> Sweep:
    """Mini-batch formation with 4 optimizer steps per rollout batch (batching.py).

    With one optimizer step per batch every group's positive and negative rollouts are
    in the same step, so the updates of the tokens they share (the template) cancel for
    a zero-sum advantage. With 4 mini-batches that holds only if a group stays whole in
    one of them: 'random' splits groups, 'query' and 'query_balanced' never do,
    'balanced' and 'mass_balanced' balance positives and negatives (counts or advantage
    mass) per mini-batch. Template drift = mean |Δ log π| per template token after the
    step (diagnostics.where_updates_go, every 10th step): the uncancelled part shows
    there. Clipping can fire here (ratios leave 1 after the first mini-batch); the dual
    clip is off in every arm, so its fraction is 0 by construction.
    """
    return Sweep(
        name="batching",
        claim="Keeping each group's rollouts in one optimizer step keeps the updates of shared "
              "(template) tokens cancelling (Cancellation Hypothesis paper); splitting groups "
              "(random mini-batches) leaves them to drift.",
        flags=["--minibatches", "4", "--coupling_pairs", "0"],
        arms={mode: ["--minibatch_mode", mode] for mode in
              ("random", "query", "balanced", "query_balanced", "mass_balanced")},
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@4", final("eval/pass@4"), "held-out pass@4 at the last step"),
              (f"steps to pass@1 >= {THRESHOLD}", first_reach("eval/pass@1", THRESHOLD),
               f"first evaluation step with pass@1 >= {THRESHOLD} (missing if never)"),
              ("template drift", mean_of("where/abs_dlogp_template"),
               "mean |Δ log π| per template token, mean over diagnostic steps"),
              ("reasoning drift", mean_of("where/abs_dlogp_reasoning"),
               "mean |Δ log π| per reasoning token, mean over diagnostic steps"),
              ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
              ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
              ("clip frac dual", mean_of("clip_frac_dual"), "mean over steps (dual clip off: 0)"),
              ("split groups / step", mean_of("mb/split_groups"),
               "groups cut across optimizer steps, per optimizer step, mean over steps"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("where/abs_dlogp_template", "template drift: mean |Δ log π| per template token"),
                ("clip_frac_low", "clip fraction (low)"), ("clip_frac_high", "clip fraction (high)"),
                ("mb/split_groups", "split groups per optimizer step")],
        tests=[("final pass@1", "random"), ("template drift", "random")])


def advantages() -> Sweep:
    """Seven advantages on the same task (advantages.py, scheduler.py).

    grpo (group z-score), mean (Dr. GRPO: r - mean), psr (successes only), nsr (failures
    only), power alpha=2 and asym delta=0.5 (FADE paper's static baselines, through the
    constant schedule's --alpha/--delta), fade with its own schedule. The FADE paper's
    decomposition: m_S and m_F, the per-rollout success and failure masses (train.py
    logs them every step). Peak = the best held-out pass@1 of the run and its step.
    """
    return Sweep(
        name="advantages",
        claim="How much a success pushes up and a failure pushes down (m_S vs m_F) decides where "
              "pass@1 peaks, whether pass@k survives and how entropy moves (FADE paper; psr/nsr: "
              "positive- vs negative-only training).",
        flags=["--coupling_pairs", "0"],
        arms={"grpo": ["--advantage", "grpo"], "mean": ["--advantage", "mean"], "psr": ["--advantage", "psr"],
              "nsr": ["--advantage", "nsr"], "power": ["--advantage", "power", "--alpha", "2"],
              "asym": ["--advantage", "asym", "--delta", "0.5"],
              "fade": ["--advantage", "fade", "--schedule", "fade"]},
        rows=[("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("step of peak", peak_step_of("eval/pass@1"), "its step (the first, on ties)"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@4", final("eval/pass@4"), "held-out pass@4 at the last step"),
              ("entropy, first 10 steps", head_mean("entropy", 10), "mean token entropy, nats"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("m_S (mean)", mean_of("m_S"), "success mass per rollout, mean over steps"),
              ("m_F (mean)", mean_of("m_F"), "failure mass per rollout, mean over steps"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("eval/pass@4", "held-out pass@4"),
                ("entropy", "entropy (nats/token)"), ("m_S", "success mass m_S per rollout"),
                ("m_F", "failure mass m_F per rollout"), ("reward", "training reward")],
        tests=[("final pass@1", "grpo"), ("peak pass@1", "grpo")])


def dfpo() -> Sweep:
    """GSPO vs DFPO's transforms of GSPO's sequence weights (loss.py), 4 query mini-batches.

    GSPO weighs each rollout by its own (clipped) sequence ratio, so after the first
    mini-batch the weights differ within a group and a token shared by the group no
    longer cancels: the cancellation residual R_g = |sum_i w_i A_i| / sum_i |w_i A_i|
    leaves 0. DFPO's 'min' and 'orth' transforms make sum_i w_i A_i = 0 again. Query
    mini-batches keep groups whole (the transforms need it). GSPO runs with its own
    aggregation (seq-mean-token-mean), DFPO with seq-mean-token-sum-norm (loss.py's
    OWN_AGGREGATION); the residual is logged on the diagnostic steps (every 10th).
    How often the clip leaves a group with kept rollouts of one sign only (orth then
    zeroes the group, min cannot cancel it: loss.dfpo_transform) is the "one-sided
    groups" row, logged every step as dfpo_one_sided.
    Clip range: GSPO's own, eps_low 3e-4 and eps_high 4e-4 (GSPO paper, Zheng et al.
    2025), in every arm. The sequence ratio is a geometric mean of token ratios, so it
    stays much closer to 1 than a token ratio, and the PPO default 0.2 almost never
    clips it: with 0.2 on the embedded model GSPO's reward collapsed after the first
    step, with 3e-4/4e-4 it held and about 30% of tokens clipped (docs/LOG.md).
    """
    return Sweep(
        name="dfpo",
        claim="Per-rollout sequence weights (GSPO) break the cancellation of shared tokens; "
              "DFPO's min/orth transforms restore it (residual ~0) (Cancellation Hypothesis paper).",
        flags=["--minibatches", "4", "--minibatch_mode", "query", "--loss_type", "gspo",
               "--eps_low", "3e-4", "--eps_high", "4e-4", "--coupling_pairs", "0"],
        arms={"gspo": [], "dfpo_min": ["--weight_transform", "min"], "dfpo_orth": ["--weight_transform", "orth"]},
        rows=[("cancellation residual", mean_of("cancellation_residual"),
               "mean over diagnostic steps of the per-group residual R_g"),
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("final pass@4", final("eval/pass@4"), "held-out pass@4 at the last step"),
              ("clip frac low", mean_of("clip_frac_low"), "mean over steps"),
              ("clip frac high", mean_of("clip_frac_high"), "mean over steps"),
              ("clip frac dual", mean_of("clip_frac_dual"), "mean over steps (dual clip off: 0)"),
              ("dropped rollouts", mean_of("dfpo_dropped"),
               "share of rollouts GSPO's clip dropped, mean over steps (DFPO arms only)"),
              ("one-sided groups", mean_of("dfpo_one_sided"),
               "share of groups with both signs left with kept rollouts of one sign by the clip "
               "(orth zeroes them, min cannot cancel them), mean over steps (DFPO arms only)"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("cancellation_residual", "cancellation residual R_g"),
                ("clip_frac_low", "clip fraction (low)"), ("clip_frac_high", "clip fraction (high)"),
                ("approx_kl", "KL(old || new) over the batch's optimizer steps")],
        tests=[("cancellation residual", "gspo"), ("final pass@1", "gspo")])


def credit() -> Sweep:
    """GRPO vs positive-only training (psr), with the token diagnostics on (diagnostics.py).

    Diagnostics every 5th step (flips, where updates go, coupling), the token value every
    10th step on 128 stratified positions (32 per cell: boosted/suppressed x positive/
    negative rollouts, 8 continuations each). A value cell is pooled over the run's value
    steps: mean of all its positions (weighted by positions per step), and the positions
    counted. Under psr failures get A = 0, so there are no negative rollouts and the
    '-' cells are absent by construction.
    """
    cells = {"boosted_pos": "b+", "suppressed_pos": "s+", "boosted_neg": "b-", "suppressed_neg": "s-"}
    return Sweep(
        name="credit",
        claim="Tokens flip both ways in positive and negative rollouts; critic-free RL moves the "
              "|Δ log π| share toward reasoning tokens compared with positive-only training; boosted "
              "tokens have higher value than suppressed ones in positive and negative rollouts alike "
              "(Cancellation Hypothesis paper).",
        flags=["--flip_every", "5", "--value_every", "10", "--value_samples", "128"],
        arms={"grpo": ["--advantage", "grpo"], "psr": ["--advantage", "psr"]},
        rows=[*[(f"flip {k} {s}", mean_of(f"flip/{k}_{s}"), "share of the rollouts' tokens, mean over "
                 "diagnostic steps") for s in ("pos", "neg") for k in ("boost", "suppress")],
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
              ("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("flip/boost_pos", "boosted share, positive rollouts"),
                ("flip/suppress_pos", "suppressed share, positive rollouts"),
                ("flip/boost_neg", "boosted share, negative rollouts"),
                ("flip/suppress_neg", "suppressed share, negative rollouts"),
                ("where/template_share", "template share of |Δ log π|"),
                ("value/boosted_pos", "value, boosted tokens of positive rollouts"),
                ("value/suppressed_pos", "value, suppressed tokens of positive rollouts")],
        tests=[("template share", "grpo"), ("value b+ - s+", None), ("value b- - s-", None)])


SWEEPS = {"batching": batching, "advantages": advantages, "dfpo": dfpo, "credit": credit}


# ---------------------------------------------------------------------------------------
# 2. One number per run: the table's quantities, from plot_runs.load_metrics' series
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


# ---------------------------------------------------------------------------------------
# 3. Statistics (numpy only; SE = std(ddof=1) / sqrt(n))
# ---------------------------------------------------------------------------------------

def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the finite values; NaNs (missing) are dropped.

    SE = std(ddof=1) / sqrt(n): NaN for n = 1, and (NaN, NaN, 0) for no value.
    Example: [1, 2, 3] -> (2, 1/sqrt(3) = 0.577, 3).
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return math.nan, math.nan, 0
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan
    return float(x.mean()), se, len(x)


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


def welch_t(a, b) -> tuple[float, float, float]:
    """(difference of means, its SE, t) of two samples: (mean_a - mean_b) / sqrt(SE_a^2 + SE_b^2).

    Welch's t statistic (unequal variances). NaNs are dropped; t is NaN when either
    sample has fewer than 2 values. Example: [1, 2, 3] vs [0, 0, 0]: difference 2,
    SE 0.577, t = 3.46.
    """
    ma, sa, _ = mean_se(a)
    mb, sb, _ = mean_se(b)
    se = math.sqrt(sa ** 2 + sb ** 2)
    return ma - mb, se, (ma - mb) / se if se > 0 else math.nan


def verdict(t: float) -> str:
    """The 2-SE rule: "differs" if |t| > T_RULE, else "within noise"."""
    return "differs" if abs(t) > T_RULE else "within noise"


# ---------------------------------------------------------------------------------------
# 4. Planning the runs, and resume by directory
# ---------------------------------------------------------------------------------------

@dataclass
class RunSpec:
    """One train.py run of a sweep."""

    sweep: str
    arm: str
    seed: int
    dir: str
    args: list[str]
    """train.py's arguments (without --resume)."""
    steps: int
    warmup: object | None
    """The embedded model's tinymodel.WarmupConfig when the run uses it (--model tiny), else None."""

    @property
    def label(self) -> str:
        return f"{self.sweep}/{self.arm}/seed_{self.seed}"


def plan_runs(sweep: Sweep, arms: list[str], seeds: list[int], steps: int, out: str, extra: list[str]) -> list[RunSpec]:
    """Every (arm, seed) run's train.py arguments, each checked by train.parse_args.

    Order: sweep flags, arm flags, then `extra` (so a test's --model wins). Raises
    ValueError naming the run and train.py's complaint for a bad flag set.
    """
    runs = []
    for arm in arms:
        for seed in seeds:
            d = os.path.join(out, sweep.name, arm, f"seed_{seed}")
            args = ["--out_dir", d, "--seed", str(seed), "--steps", str(steps), "--eval_every", str(EVAL_EVERY),
                    "--n_eval", str(N_EVAL), "--eval_samples", str(EVAL_SAMPLES), "--threads", "1",
                    *sweep.flags, *sweep.arms[arm], *extra]
            cfg = _check_train_args(f"{sweep.name}/{arm}/seed_{seed}", args)
            warmup = _embedded_warmup(cfg) if cfg.model == "tiny" else None
            runs.append(RunSpec(sweep.name, arm, seed, cfg.out_dir, args, cfg.steps, warmup))
    return runs


def run_state(run: RunSpec) -> str:
    """'finished' (skip), 'resume' (started before with these flags) or 'new'.

    Raises ValueError when the directory holds a run started with other flags.
    """
    started = _read_json(os.path.join(run.dir, "sweep_args.json"))
    if started is None:
        return "new"
    if _but_out_dir(started.get("args", [])) != _but_out_dir(run.args):     # a moved sweep directory still resumes
        raise ValueError(f"{run.dir} holds a run with other train.py flags ({shlex.join(started.get('args', []))}); "
                         "use another --out or remove that directory")
    return "finished" if os.path.isfile(os.path.join(run.dir, "done.json")) else "resume"


def ensure_warmup(runs: list[RunSpec], say: Callable[[str], None]) -> None:
    """Warm up the embedded model here, once per warm-up (task, digits), before any run starts.

    Each train.py with --model tiny would otherwise find no cache and warm up itself,
    several at a time, on the same cores (each ~50 s) and race for the same cache entry.
    """
    import torch
    from machinery import tinymodel
    torch.set_num_threads(1)                   # this process warms up while no run is going
    configs = {tinymodel.cache_key(r.warmup): r.warmup for r in runs if r.warmup is not None}
    for key, cfg in sorted(configs.items()):
        path = os.path.join(tinymodel.DEFAULT_CACHE_DIR, key)
        if not os.path.isfile(os.path.join(path, "warmup.json")):
            say(f"warm-up of the embedded model ({cfg.task}; 1-3 min, once): {path}")
        tinymodel.load_or_warmup(cfg)


# ---------------------------------------------------------------------------------------
# 5. Running: a pool of train.py processes
# ---------------------------------------------------------------------------------------

def execute(todo: list[tuple[RunSpec, str]], jobs: int, n_skipped: int, say: Callable[[RunSpec, str], None]) -> dict:
    """Run each (run, state) in a train.py process, `jobs` at a time; returns {label: result}.

    result: {"ok": bool, "rc": exit code, "seconds": wall, "start", "end": epoch seconds,
    "error": one line}. A run is ok when train.py exited 0 AND its metrics.jsonl reached
    the final step; then done.json is written (atomically, last). Ctrl-C / SIGTERM stop
    the running processes and start no new one.
    """
    results, running, lock, stopping = {}, {}, threading.Lock(), threading.Event()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TQDM_MININTERVAL": "30"}          # train.py's progress bar: a line per 30 s in train.log

    def one(run: RunSpec, state: str) -> dict:
        os.makedirs(run.dir, exist_ok=True)
        _atomic_json(os.path.join(run.dir, "sweep_args.json"), {"args": run.args})
        cmd = [sys.executable, TRAIN_PY, *run.args, *(["--resume"] if state == "resume" else [])]
        log_path = os.path.join(run.dir, "train.log")
        say(run, "resumed" if state == "resume" else "started")
        start = time.time()
        with open(log_path, "a") as log:
            log.write(f"=== sweep.py {_now()}: {shlex.join(cmd)}\n")
            log.flush()
            with lock:                          # no new process once a stop was asked for
                if stopping.is_set():
                    return {"ok": False, "rc": None, "error": f"run {run.label} not started (interrupted)"}
                proc = running[run.label] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            rc = proc.wait()
            with lock:
                running.pop(run.label, None)
        end = time.time()
        last = _last_step(os.path.join(run.dir, "metrics.jsonl"))
        result = {"ok": rc == 0 and last == run.steps, "rc": rc, "seconds": end - start, "start": start, "end": end}
        if result["ok"]:
            _atomic_json(os.path.join(run.dir, "done.json"),
                         {"args": run.args, "steps": run.steps, "seconds": end - start, "finished": _now()})
        else:
            why = f"exit code {rc}" if rc != 0 else f"metrics.jsonl ends at step {last}, not {run.steps}"
            result["error"] = f"run {run.label} failed ({why}); log: {log_path}"
        say(run, f"done in {(end - start) / 60:.1f} min" if result["ok"] else
            "stopped" if stopping.is_set() else "FAILED")
        return result

    def stop(signum, frame):
        raise KeyboardInterrupt
    old_handler = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    bar = tqdm(total=len(todo) + n_skipped, initial=n_skipped, desc="runs", unit="run", dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(one, run, state): run for run, state in todo}
        for future in as_completed(futures):
            results[futures[future].label] = future.result()
            bar.update(1)
            bar.set_postfix(failed=sum(not r["ok"] for r in results.values()))
    except KeyboardInterrupt:
        with lock:
            stopping.set()
            for proc in running.values():
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
        print("sweep.py: interrupted; the stopped runs resume from their last checkpoint next time", file=sys.stderr)
        sys.exit(130)
    finally:
        pool.shutdown(wait=True)
        bar.close()
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
    return results


# ---------------------------------------------------------------------------------------
# 6. The report: summary.md and curves.png per sweep
# ---------------------------------------------------------------------------------------

def write_report(sweep: Sweep, runs: list[RunSpec], results: dict, meta: dict) -> str:
    """Write OUT/NAME/summary.md and curves.png from the finished runs; returns summary.md's path."""
    root = os.path.dirname(os.path.dirname(runs[0].dir))
    arms = list(dict.fromkeys(r.arm for r in runs))
    done = [r for r in runs if os.path.isfile(os.path.join(r.dir, "done.json"))]
    series = {r.label: plot_runs.load_metrics(r.dir) for r in done}
    by_arm = {arm: [r for r in done if r.arm == arm] for arm in arms}
    values = {(label, arm): [fn(series[r.label]) for r in by_arm[arm]] for label, fn, _ in sweep.rows for arm in arms}

    lines = [f"# Sweep `{sweep.name}`", "", f"Claim tested: {sweep.claim}", "",
             f"- Command: `{meta['command']}` (in `{meta['cwd']}`)",
             f"- Date: {meta['date']}; machine: {meta['machine']}",
             f"- {_timing(runs, results, meta['jobs'])}",
             f"- Runs: {len(done)} of {len(runs)} finished"
             + ("" if len(done) == len(runs) else " (INCOMPLETE: the missing runs failed or were not run)"),
             "- Each run: `python train.py " + shlex.join(_shared_args(runs)) + " ARM-FLAGS`; the seeds are RL "
             "seeds, every run starts from the same checkpoint (--model; 'tiny' = the cached warm-up, tinymodel.py).",
             "- Arms: " + "; ".join(f"**{a}** `{shlex.join(sweep.arms[a]) or '(sweep flags only)'}`" for a in arms),
             "", "Cells: mean ± SE over seeds [per seed, in the seed order of the header]; SE = std(ddof=1)/sqrt(n); "
             "(n=k): only k seeds have a number. Test rows: the 2-SE rule (Welch t = difference / "
             f"sqrt(SE_a^2 + SE_ref^2), or mean / SE for a within-run contrast; |t| > {T_RULE:g}: \"differs\"). "
             "With 3 seeds this is a lenient test (two-sided p ~0.12-0.18 at |t| = 2).", ""]
    header = ["quantity"] + [f"{a} (seeds {','.join(str(r.seed) for r in by_arm[a]) or '-'})" for a in arms]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, _, _ in sweep.rows:
        lines.append("| " + " | ".join([label] + [cell(values[label, a]) for a in arms]) + " |")
    for label, ref in sweep.tests:
        name = f"test: {label} vs {ref}" if ref else f"test: {label} != 0"
        row = []
        for a in arms:
            if ref is not None and ref not in arms:
                row.append(f"- ({ref} not in this sweep)")
            elif a == ref:
                row.append("(reference)")
            else:
                row.append(test_cell(values[label, a], values[label, ref] if ref else None))
        lines.append("| " + " | ".join([name] + row) + " |")
    lines += ["", "Quantities:", *[f"- {label}: {how}" for label, _, how in sweep.rows],
              "", f"Curves (mean ± SE over seeds): `{os.path.basename(_png_path(root))}`.", ""]
    path = os.path.join(root, "summary.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    if done:
        plot_curves(sweep, arms, by_arm, series, _png_path(root))
    return path


def cell(values: list[float]) -> str:
    """"mean ± SE [v0 v1 ...]" (with "(n=k)" when only k of the values are numbers)."""
    m, se, n = mean_se(values)
    if n == 0:
        return "-"
    text = f"{fmt(m)} ± {fmt(se)} [{' '.join(fmt(v) for v in values)}]"
    return text + (f" (n={n})" if n < len(values) else "")


def test_cell(values: list[float], reference: list[float] | None) -> str:
    """The 2-SE rule against the reference arm's values, or against 0 when reference is None.

    "Δ d, t t: verdict"; without two seeds on each side there is no SE and no verdict,
    and with an SE of exactly 0 (every seed gave the same number) t is undefined: the
    cell then says whether the difference is 0.
    """
    if reference is None:
        diff, se, _ = mean_se(values)
    else:
        diff, se, _ = welch_t(values, reference)
    if not math.isfinite(diff):
        return "-"
    if not math.isfinite(se):
        return f"Δ {diff:+.3g}: n/a (needs 2 seeds per arm)"
    if se == 0:
        return f"Δ {diff:+.3g}, SE 0: " + ("no difference" if diff == 0 else "differs (no spread over seeds)")
    return f"Δ {diff:+.3g}, t {diff / se:+.2f}: {verdict(diff / se)}"


def fmt(x: float) -> str:
    """3 significant digits (whole numbers from 100 up), '-' for a missing number."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def curve_mean_se(runs_series: list[dict], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, SE) over runs of one key, on the steps that every run logged.

    Seeds of one arm log the same steps (same flags), so this drops nothing unless a
    run logged a NaN-free key on different steps. SE is NaN with one run.
    """
    have = [s[key] for s in runs_series if key in s]
    if not have:
        return np.array([]), np.array([]), np.array([])
    steps = have[0][0]
    for st, _ in have[1:]:
        steps = np.intersect1d(steps, st)
    table = np.array([[dict(zip(st.tolist(), v))[x] for x in steps.tolist()] for st, v in have])
    stats = [mean_se(col) for col in table.T]
    return steps, np.array([s[0] for s in stats]), np.array([s[1] for s in stats])


def plot_curves(sweep: Sweep, arms: list[str], by_arm: dict, series: dict, path: str) -> None:
    """One panel per curve of the sweep: each arm's mean over seeds with a ± SE band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(sweep.curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 3.3 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, sweep.curves):
        for j, arm in enumerate(arms):
            steps, mean, se = curve_mean_se([series[r.label] for r in by_arm[arm]], key)
            if not len(steps):
                continue
            ax.plot(steps, mean, color=f"C{j}", lw=1.3, label=f"{arm} (n={len(by_arm[arm])})",
                    marker="o" if key.startswith("eval/") else None, ms=2.5)
            ax.fill_between(steps, mean - np.nan_to_num(se), mean + np.nan_to_num(se), color=f"C{j}", alpha=0.2, lw=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(sweep.curves):]:
        ax.axis("off")
    fig.suptitle(f"sweep {sweep.name}: mean ± SE over seeds", y=0.998)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# 7. The command line
# ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n")[0],
                                     epilog="Anything after -- is passed to every train.py run (tests: a tiny model).")
    parser.error = lambda message: parser.exit(2, f"sweep.py: error: {message}\n")
    parser.add_argument("name", choices=[*SWEEPS, "all"], help="which sweep ('all': the four, one pool)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated RL seeds")
    parser.add_argument("--steps", type=int, help=f"training steps per run (default per sweep: {STEPS})")
    parser.add_argument("--arms", help="comma-separated subset of the sweep's arms (one sweep only)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="train.py processes at a time")
    parser.add_argument("--out", default=OUT, help="root directory of the sweeps")
    args = parser.parse_args(own)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must name distinct seeds, got {args.seeds!r}")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    names = list(SWEEPS) if args.name == "all" else [args.name]
    if args.arms and len(names) > 1:
        parser.error("--arms needs one sweep, not 'all'")
    sweeps = [SWEEPS[n]() for n in names]
    if args.arms:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in sweeps[0].arms]
        if unknown or not arms:
            parser.error(f"--arms: {', '.join(unknown) or repr(args.arms)} not in sweep {names[0]} "
                         f"(arms: {', '.join(sweeps[0].arms)})")
    try:
        plans = {s.name: plan_runs(s, arms if args.arms else list(s.arms), seeds,
                                   args.steps or STEPS[s.name], args.out, extra) for s in sweeps}
        every = [r for runs in plans.values() for r in runs]
        states = {r.label: run_state(r) for r in every}
    except ValueError as e:
        parser.error(str(e))

    meta = {"command": "python -m experiments.sweep " + shlex.join(argv), "cwd": os.getcwd(), "date": _now(),
            "machine": _machine(), "jobs": args.jobs}
    logs = {}
    for name in names:
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        logs[name] = open(os.path.join(args.out, name, "sweep.log"), "a")
        logs[name].write(f"{_now()} {meta['command']}\n")

    def say(run: RunSpec, event: str) -> None:
        tqdm.write(f"{run.label}: {event}")
        logs[run.sweep].write(f"{_now()} {run.label}: {event}\n")
        logs[run.sweep].flush()

    skipped = [r for r in every if states[r.label] == "finished"]
    for r in skipped:
        say(r, "skipped (finished before)")
    todo = [(r, states[r.label]) for r in every if states[r.label] != "finished"]
    todo.sort(key=lambda item: -item[0].steps)          # longest first: the pool's tail stays short
    if todo:
        ensure_warmup([r for r, _ in todo], lambda text: tqdm.write(text))
    results = execute(todo, args.jobs, len(skipped), say)
    for s in sweeps:
        path = write_report(s, plans[s.name], results, meta)
        tqdm.write(f"wrote {path}")
    for f in logs.values():
        f.close()
    failed = [res["error"] for res in results.values() if not res["ok"]]
    for line in failed:
        print(f"sweep.py: {line}", file=sys.stderr)
    if failed:
        sys.exit(1)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _embedded_warmup(cfg):
    """train.embedded_warmup(cfg), imported late like train itself (its import is heavy)."""
    import train
    return train.embedded_warmup(cfg)


def _check_train_args(label: str, args: list[str]):
    """train.parse_args(args), with its one-line error turned into a ValueError naming the run."""
    import train
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return train.parse_args(args)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        raise ValueError(f"{label}: {lines[-1] if lines else 'train.py rejected its flags'}") from None


def _but_out_dir(args: list[str]) -> list[str]:
    """train.py arguments without '--out_dir DIR'."""
    i = args.index("--out_dir") if "--out_dir" in args else len(args)
    return args[:i] + args[i + 2:]


def _shared_args(runs: list[RunSpec]) -> list[str]:
    """The train.py flags of the sweep with the per-run ones shown as placeholders."""
    args = list(runs[0].args)
    for flag, placeholder in (("--out_dir", "OUT/NAME/ARM/seed_S"), ("--seed", "S")):
        args[args.index(flag) + 1] = placeholder
    arm_flags = SWEEPS[runs[0].sweep]().arms[runs[0].arm]
    n = len(arm_flags)
    for i in range(len(args) - n + 1):          # drop the first arm's own flags
        if n and args[i:i + n] == arm_flags:
            return args[:i] + args[i + n:]
    return args


def _timing(runs: list[RunSpec], results: dict, jobs: int) -> str:
    """Wall time of this invocation's runs of the sweep, and the runs' own times (done.json)."""
    mine = [results[r.label] for r in runs if r.label in results and "start" in results[r.label]]
    total = sum(d["seconds"] for r in runs if (d := _read_json(os.path.join(r.dir, "done.json"))))
    text = f"Run time: {total / 60:.1f} process-minutes summed over the finished runs (train.py start to exit)"
    if mine:
        wall = max(m["end"] for m in mine) - min(m["start"] for m in mine)
        text += (f"; this invocation ran {len(mine)} of them in {wall / 60:.1f} min wall, {jobs} at a time "
                 "(first start to last end; with 'all' the pool was shared with the other sweeps)")
    return text


def _png_path(root: str) -> str:
    return os.path.join(root, "curves.png")


def _last_step(path: str) -> int | None:
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError):
        return None


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _atomic_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _machine() -> str:
    """'nproc N, CPU model, load average a b c' (the box is shared: the load says how much)."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return f"nproc {os.cpu_count()}, {model}, {platform.system()} {platform.machine()}, load average at start {load}"


if __name__ == "__main__":
    main()
