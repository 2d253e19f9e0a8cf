"""claims.py: how a sweep decides whether a paper's claim held on real training.

A claim is written down BEFORE its runs, as data (`Claim`): the paper, the claim in one
sentence, the number that measures it (a row of the sweep's table, one value per run),
the arm it is about, the arm it is compared with (or none: a within-run difference
tested against 0), and the predicted direction. After the runs, `judge` turns the
claims and the per-seed numbers into verdicts. Nothing in a verdict table is typed by
hand.

The test. Seeds are few (5-8 per arm) and the numbers are not normal (pass@k is bounded,
residuals are skewed), so no t-distribution is assumed:
  - arm vs reference: the exact two-sided permutation test of the difference of means.
    Under "no difference" the seed labels are exchangeable, so every split of the pooled
    values into groups of the two sizes is equally likely; p is the share of splits whose
    |difference of means| is at least the observed one. With 6 vs 6 seeds there are
    C(12, 6) = 924 splits, and the smallest possible p is 2/924 = 0.0022 (the observed
    split and its mirror image); with 5 vs 5 it is 2/252 = 0.0079.
  - within-run (reference None): the exact two-sided sign-flip test of the mean of the
    per-seed values (under "no effect" each value's sign is a coin flip): 2^n sign
    patterns, smallest p 2/2^n, so 5 seeds can never reach 0.05 (2/32 = 0.0625): such
    claims need 6 seeds at least (2/64 = 0.031), 8 to survive a correction (2/256).
  - multiple comparisons: Holm's step-down correction over the testable claims of one
    sweep. Sort the m raw p-values; the i-th smallest (i from 0) is multiplied by m - i,
    and each adjusted p is the running maximum, capped at 1. It controls the chance of
    any false "agrees" or "opposite" among the sweep's claims at 5%, without assuming the
    tests are independent (they are not: they share arms).
Verdicts (ALPHA = 0.05 on the Holm-adjusted p):
  agrees                  p_holm < 0.05 and the difference has the predicted sign;
  opposite                p_holm < 0.05 and the other sign;
  no difference detected  otherwise; with the minimum detectable effect (MDE): the smallest
                          shift of the arm's values in the predicted direction, from no
                          effect at all, that this design (these seeds' spread, this many
                          seeds, this many claims) would have called significant;
  not testable            the claim's own check says the runs cannot speak to it, with the
                          measured reason (e.g. "delta stayed in [0.98, 1.00]"), or fewer
                          than 2 seeds carry a number.
A claim may also predict NO difference (direction 0, e.g. "orth does not cost pass@1"):
it is then tested two-sided, reads *no difference detected* (with the MDE: the claim is
supported only down to that size) or *opposite* (a difference was found).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

ALPHA = 0.05
CORRECTION = "Holm"


@dataclass
class Claim:
    """One claim of one paper, as a testable record written before the runs."""

    paper: str
    """Short name of the paper (the README's claim table groups by it)."""
    text: str
    """The claim in one sentence."""
    row: str
    """The sweep table row that measures it (one number per run)."""
    arm: str
    """The arm the claim is about."""
    reference: str | None
    """The arm it is compared with; None: the row is itself a difference, tested against 0."""
    direction: int
    """Predicted sign of arm - reference (or of the row): +1, -1, or 0 for "no difference"."""
    testable: Callable[[dict], str | None] | None = None
    """Given {arm: [run series, ...]}: None if the runs can test the claim, else why not."""


# ---------------------------------------------------------------------------------------
# The exact tests
# ---------------------------------------------------------------------------------------

def permutation_p(a, b) -> float:
    """Two-sided exact permutation p-value of mean(a) - mean(b): every split of a + b.

    p = #{splits with |mean diff| >= |observed| (to 1e-12 relative)} / #splits. All
    C(n_a + n_b, n_a) splits are enumerated (924 for 6 + 6, 12870 for 8 + 8).
    Example: permutation_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == 2 / 252.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    pooled, k = np.concatenate([a, b]), len(a)
    n = len(pooled)
    splits = np.array(list(itertools.combinations(range(n), k)))          # [S, k]
    sums = pooled[splits].sum(1)
    diffs = np.abs(sums / k - (pooled.sum() - sums) / (n - k))
    observed = abs(a.mean() - b.mean())
    return float(np.mean(diffs >= observed - 1e-12 * max(1.0, observed)))


def sign_flip_p(d) -> float:
    """Two-sided exact sign-flip p-value of mean(d) = 0: every pattern of signs.

    Example: sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32.
    """
    d = np.asarray(d, float)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))   # [2^n, n]
    means = np.abs((signs * d).mean(1))
    observed = abs(d.mean())
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: p_(i) (m - i), running max, capped at 1.

    Example: holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06].
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def raw_p(values: list[float], reference: list[float] | None) -> float:
    """The claim's raw p: permutation test against the reference, or sign flips against 0."""
    return sign_flip_p(values) if reference is None else permutation_p(values, reference)


def min_detectable_effect(values, reference, direction: int, others: list[float], index: int) -> float:
    """The smallest effect this design would have called significant (Holm, ALPHA).

    The observed effect is removed first (the arm's values are shifted so that their mean
    equals the reference's, or 0 within a run), keeping the seeds' spread; then the
    smallest shift delta in the predicted direction (either, for direction 0) whose
    Holm-adjusted p, with the sweep's other raw p-values `others` (this claim at `index`),
    falls below ALPHA, found by bisection (p only falls as delta grows). inf when even a
    huge shift cannot get there: too few seeds for this many claims.
    """
    v = np.asarray(values, float)
    centre = 0.0 if reference is None else float(np.mean(reference))
    v = v - v.mean() + centre
    sign = direction or 1

    def adjusted(delta):
        ps = list(others)
        ps[index] = raw_p(v + sign * delta, reference)
        return holm(ps)[index]
    spread = float(np.ptp(np.concatenate([v, np.asarray(reference or [0.0], float)]))) + 1e-12
    high = 1e3 * spread
    if adjusted(high) >= ALPHA:
        return math.inf
    low = 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if adjusted(mid) < ALPHA else (mid, high)
    return high


# ---------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------

def judge(claims: list[Claim], values: dict, series: dict) -> list[dict]:
    """One verdict record per claim, in order.

    values: {(row, arm): [one number per seed, NaN where a run has none]}; series:
    {arm: [each run's metric series]} for the testability checks. Each record: the claim,
    n (seeds per side), effect (mean difference, or the row's mean within a run), se (its
    standard error: Welch's for two arms), p (raw), p_holm, verdict, and detail (the MDE
    or the reason it is not testable).
    """
    rows, testable = [], []
    for claim in claims:
        a = _finite(values.get((claim.row, claim.arm), []))
        b = None if claim.reference is None else _finite(values.get((claim.row, claim.reference), []))
        reason = claim.testable(series) if claim.testable else None
        if reason is None and (len(a) < 2 or (b is not None and len(b) < 2)):
            reason = f"fewer than 2 seeds with a value ({len(a)}" + ("" if b is None else f" vs {len(b)}") + ")"
        rec = {"claim": claim, "n": (len(a), None if b is None else len(b)), "p": math.nan, "p_holm": math.nan}
        if reason is None:
            effect = float(np.mean(a)) - (0.0 if b is None else float(np.mean(b)))
            se = _se(a) if b is None else math.sqrt(_se(a) ** 2 + _se(b) ** 2)
            rec.update(effect=effect, se=se, p=raw_p(a, b), values=(a, b))
            testable.append(rec)
        else:
            rec.update(effect=math.nan, se=math.nan, verdict="not testable", detail=reason)
        rows.append(rec)
    adjusted = holm([r["p"] for r in testable])
    for i, rec in enumerate(testable):
        rec["p_holm"] = adjusted[i]
        claim, (a, b) = rec["claim"], rec["values"]
        significant, mde = rec["p_holm"] < ALPHA, None
        same_sign = claim.direction != 0 and np.sign(rec["effect"]) == claim.direction
        if significant:
            rec["verdict"] = "agrees" if same_sign else "opposite"
            rec["detail"] = ""
        else:
            mde = min_detectable_effect(a, b, claim.direction, [r["p"] for r in testable], i)
            rec["verdict"] = "no difference detected"
            rec["detail"] = f"MDE {_fmt(mde)}" if math.isfinite(mde) else \
                f"no effect detectable with {len(a)} seeds among {len(testable)} claims"
        rec["mde"] = mde
    return rows


def verdict_table(rows: list[dict]) -> str:
    """The verdicts as a markdown table: claim, arms, effect (± SE), p, p (Holm), verdict."""
    lines = ["| paper | claim | arm vs reference | effect ± SE | p | p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["claim"]
        versus = f"{c.arm} vs {c.reference}" if c.reference else f"{c.arm} (within run)"
        effect = "-" if math.isnan(r["effect"]) else f"{_fmt(r['effect'])} ± {_fmt(r['se'])}"
        p = "-" if math.isnan(r["p"]) else f"{r['p']:.4f}"
        ph = "-" if math.isnan(r["p_holm"]) else f"{r['p_holm']:.4f}"
        verdict = f"**{r['verdict']}**" + (f" ({r['detail']})" if r["detail"] else "")
        lines.append(f"| {c.paper} | {c.text} [{c.row}] | {versus} | {effect} | {p} | {ph} | {verdict} |")
    return "\n".join(lines) + "\n"


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _se(xs) -> float:
    return float(np.std(xs, ddof=1) / math.sqrt(len(xs))) if len(xs) > 1 else math.nan


def _fmt(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
