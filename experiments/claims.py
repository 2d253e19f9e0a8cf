"""claims.py: how a sweep decides what its runs showed: checks of the code, tests of the papers.

Two kinds of record are written before the runs (experiments/designs_cancellation.py and
experiments/designs_fade.py; experiments/designs.py says what a sweep is):

  Check   an identity the implementation must satisfy whatever the training does. With
          whole groups and a zero-sum advantage the first optimizer step's cancellation
          residual is 0 to float rounding; asym with delta = 0.5 has m_F = 2 m_S exactly;
          random mini-batches split groups, so theirs is not 0. Measured on every run and
          compared with its exact expectation: pass or FAIL. No p-value: a check cannot
          come out otherwise unless the code is wrong, so it is no evidence for a paper.
  Claim   a paper's empirical statement, restated as one number per run and a predicted
          direction, quoting the source sentence it tests. It could have come out either
          way; an exact test decides.

The design is paired. Every run is keyed by (warmup_seed, seed): the warm-up seed fixes
the starting weights, the RL seed the training prompts, the held-out set and every
sample. Two arms' runs with the same key differ only in the arm's design choice, so a
claim is tested on the per-pair differences d_k = x_arm(k) - x_ref(k). What the two runs
share (start, prompts, held-out set) cancels in d_k; on countdown it was 59-72% of the
variance of final pass@1.

The tests. Pairs are few (10 by default) and the numbers bounded or skewed, so none
assumes a distribution; each is exact: every p below is a count over all 2^n equally
likely sign patterns, not an approximation.
  - mean (direction +1 or -1): the exact two-sided sign-flip test of mean(d) = 0. With no
    effect the two runs of a pair are exchangeable, so d_k is as likely +|d_k| as -|d_k|
    and all 2^n sign patterns are equally likely; p = the share of patterns whose |mean|
    is at least the observed one. Floor: 2 / 2^n (the observed pattern and its mirror),
    0.00195 for 10 pairs. With a margin m ("a share above 1%"): the same test of
    d_k - direction * m.
  - within a run (reference None): the same test on each run's own number (a difference
    inside the run, such as value b+ minus value s+).
  - equivalence (direction 0, margin m > 0: "similar"): TOST, two one-sided sign-flip
    tests, of mean(d) > -m and of mean(d) < m; p is the larger. Floor 1 / 2^n.
  - spread (statistic "spread": "seed spread" as stability): the exact paired swap test.
    Swapping the two runs of a pair is again one of 2^n equally likely patterns; the
    statistic is the difference of the two arms' standard deviations within a warm-up
    seed. Floor 2 / 2^n.
  - interaction (Claim.minus: does arm's gain over reference grow from one setting to
    another, e.g. from lr 1e-4 to 4e-4?): the same sign-flip test on the per-pair
    difference of differences d_k = (x_arm - x_ref)(k) - (x_c - x_d)(k), all four runs
    sharing the pair's start, prompts and samples.
  - every row (row a tuple, e.g. pass@k at every k): the intersection-union test (Berger
    1982). The claim holds only if it holds on each row, so its p is the largest of the
    rows' p-values; no correction across the rows is needed.
  - Holm's correction over the testable claims of ONE sweep on ONE task, its family:
    sort the m raw p-values, multiply the i-th smallest (i from 0) by m - i, take the
    running maximum, cap at 1. It keeps the chance of any false agrees/opposite in the
    family at 5% without assuming the tests independent (they share arms). 10 pairs'
    floor survives Holm over up to 25 claims (25 x 0.00195 = 0.049). A sweep may declare
    families of its own (Claim.family: its primary findings apart from its secondary
    ones); Holm then runs within each.
Verdicts (ALPHA = 0.05 on the Holm-adjusted p):
  agrees                  p_holm < ALPHA, predicted sign (equivalence: inside the margin)
  opposite                p_holm < ALPHA, the other sign (with a margin: short of it)
  no difference detected  direction +-1, otherwise; with the effect detectable at 80% power
  no equivalence shown    direction 0, otherwise
  not testable            the claim's own check says the runs cannot speak to it (with the
                          measured reason), or fewer than 2 pairs have a number.
The effect detectable at 80% power: the true mean difference delta such that, if the
per-pair differences were normal with the observed standard deviation s around delta,
the exact sign-flip test at level ALPHA / m would call it, with the predicted sign, in
80% of repetitions. ALPHA / m is Holm's strictest step: an effect this large is found
even when no other claim of the family is. delta = r(n, ALPHA / m) * s, where r comes
from a simulation of the exact test (power_ratio). It replaces the "minimum detectable
effect", the effect that would JUST reach significance, which a design finds only about
half of the time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

ALPHA = 0.05
POWER = 0.8
CORRECTION = "Holm"
CHUNK = 1 << 15          # sign patterns enumerated at a time (memory: CHUNK x n floats)


@dataclass
class Claim:
    """One claim of one paper, as a testable record written before the runs."""

    paper: str
    """Short name of the paper."""
    text: str
    """The claim restated in one short line (the README's row)."""
    quote: str
    """The source sentence it tests, verbatim."""
    row: str | tuple[str, ...]
    """The sweep table row that measures it (one number per run); a tuple: it must hold on every row."""
    arm: str
    """The arm the claim is about."""
    reference: str | tuple[str, ...] | None
    """The arm it is compared with, pair by pair; a tuple: the best of them by `best_by`; None: within a run."""
    direction: int
    """Predicted sign of arm - reference (or of the row): +1, -1, or 0 for "similar" (equivalence)."""
    margin: float = 0.0
    """direction +-1: the effect must exceed this; direction 0: the equivalence margin (> 0)."""
    statistic: str = "mean"
    """"mean" (sign-flip test of the mean difference), "spread" (paired swap test of the seed spread)
    or "not_lower" (one-sided: the arm is not lower than the reference by more than `margin`)."""
    best_by: str | None = None
    """With a tuple reference: the row whose highest mean over runs picks the reference arm."""
    testable: Callable[[dict], str | None] | None = None
    """Given {arm: [run series, ...]}: None if the runs can test the claim, else why not."""
    note: Callable[[dict], str] | None = None
    """Given {arm: [run series, ...]}: what the verdict must also say (e.g. how far a schedule moved)."""
    minus: tuple[str, str] | None = None
    """An interaction: the pair's difference is (arm - reference) - (minus[0] - minus[1]), all four
    runs of one (warm-up seed, RL seed); e.g. how much more query beats random at a large step
    size than at a small one. The same exact sign-flip test on that difference."""
    family: str = ""
    """Holm's family within the sweep ("primary", "secondary", "ours"); one family when all are ''."""
    posthoc: bool = False
    """Declared after its runs' data was public (a stricter restatement of an earlier claim, read
    again on the same runs): shown as a re-reading, not as a test declared before its data."""

    @property
    def rows(self) -> tuple[str, ...]:
        return self.row if isinstance(self.row, tuple) else (self.row,)

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm the claim reads."""
        refs = self.reference if isinstance(self.reference, tuple) else (self.reference,)
        return tuple(a for a in (self.arm, *refs, *(self.minus or ())) if a is not None)


@dataclass
class Check:
    """One identity the implementation must satisfy, measured on every run of some arms."""

    text: str
    """What must hold, and why, in one line."""
    row: str | tuple[str, ...]
    """The sweep table row(s) that measure it (one number per run); a tuple: every row must satisfy it."""
    arms: tuple[str, ...]
    """The arms whose every run must satisfy it."""

    @property
    def rows(self) -> tuple[str, ...]:
        return self.row if isinstance(self.row, tuple) else (self.row,)
    expect: str
    """"zero" (|x| <= tol), "positive" (x > tol), "equals" (|x - value| <= tol), "within" (value = (lo, hi))."""
    value: float | tuple[float, float] = 0.0
    tol: float = 0.0
    kind: str = "identity"
    """"identity": the code must satisfy it (pass / FAIL); "precondition": what a finding needs of
    the training (a manipulation check, e.g. "the clip was never reached"), measured and shown
    as met / NOT MET: the training, not the code, decides it."""


# ---------------------------------------------------------------------------------------
# 1. The exact tests
# ---------------------------------------------------------------------------------------

def pattern_sums(d: np.ndarray) -> np.ndarray:
    """sum_k eps_k d_k for every sign pattern eps, in chunks: yields arrays over patterns.

    Pattern i gives d_k the sign - if bit k of i is set: i = 0 is the observed pattern,
    i = 2^n - 1 its mirror. d: [n] (or [R, n]: then each chunk is [R, chunk]).
    """
    n = d.shape[-1]
    for start in range(0, 2 ** n, CHUNK):
        index = np.arange(start, min(start + CHUNK, 2 ** n))
        signs = 1.0 - 2.0 * ((index[:, None] >> np.arange(n)) & 1)       # [chunk, n] of +-1
        yield d @ signs.T


def _tolerance(d: np.ndarray) -> np.ndarray:
    """Sums that differ only by float rounding count as equal: 1e-9 of sum_k |d_k|."""
    return 1e-9 * np.abs(d).sum(axis=-1)


def sign_flip_p(d) -> float:
    """Two-sided exact sign-flip p-value of mean(d) = 0.

    p = #{patterns eps: |sum eps_k d_k| >= |sum d_k|} / 2^n. Examples:
    sign_flip_p([1, 2, 3, 4, 5]) == 2/32 (five pairs can never reach 0.05);
    sign_flip_p([0.3, 1.3]) == 0.5.
    """
    d = np.asarray(d, float)
    observed = abs(d.sum()) - _tolerance(d)
    count = sum(int((np.abs(s) >= observed).sum()) for s in pattern_sums(d))
    return count / 2 ** len(d)


def sign_flip_p_greater(d) -> float:
    """One-sided exact sign-flip p-value against mean(d) <= 0: #{sum eps d >= sum d} / 2^n.

    Example: sign_flip_p_greater([1, 2, 3]) == 1/8 (only the observed pattern reaches 6).
    """
    d = np.asarray(d, float)
    observed = d.sum() - _tolerance(d)
    return sum(int((s >= observed).sum()) for s in pattern_sums(d)) / 2 ** len(d)


def tost_p(d, margin: float) -> float:
    """Equivalence within +-margin (TOST): the larger of the two one-sided exact p-values.

        lower: H0 mean(d) <= -margin, tested on d + margin (is it above 0?)
        upper: H0 mean(d) >= +margin, tested on margin - d (is it above 0?)
    Each shifted sample is symmetric about 0 at its null's boundary, which is what the
    sign-flip test needs. Example: d = [0.1, -0.1, 0.05, 0, 0.02] with margin 1 -> 1/32,
    the floor of 5 pairs (every pattern of d + 1 and of 1 - d is below the observed one).
    """
    d = np.asarray(d, float)
    return max(sign_flip_p_greater(d + margin), sign_flip_p_greater(margin - d))


def within_block_sd(x, blocks) -> float:
    """Pooled standard deviation within blocks: sqrt(sum_k (x_k - mean of x in its block)^2 / (n - B)).

    blocks: one label per value (the warm-up seed), B distinct labels. The spread of the RL
    seeds from one start, pooled over the starts. NaN when n - B < 1.
    Example: x = [1, 3, 10, 14], blocks [0, 0, 1, 1] -> sqrt((1 + 1 + 4 + 4) / 2) = sqrt(5).
    """
    x, blocks = np.asarray(x, float), np.asarray(blocks)
    labels = np.unique(blocks)
    if len(x) - len(labels) < 1:
        return math.nan
    ss = sum(((x[blocks == b] - x[blocks == b].mean()) ** 2).sum() for b in labels)
    return math.sqrt(ss / (len(x) - len(labels)))


def paired_swap_p(x, y, blocks) -> float:
    """Two-sided exact paired swap p-value of within_block_sd(x) - within_block_sd(y) = 0.

    Pattern eps swaps x_k and y_k where eps_k = -1; with no difference between the arms
    every pattern is equally likely (as in the sign-flip test, whose statistic is the mean
    instead). T(all swapped) = -T(observed), so the floor is 2 / 2^n.
    """
    x, y, blocks = np.asarray(x, float), np.asarray(y, float), np.asarray(blocks)
    n = len(x)
    onehot = (blocks[:, None] == np.unique(blocks)[None, :]).astype(float)     # [n, B]
    dof = n - onehot.shape[1]

    def sd(values):                                                             # [P, n] -> [P]
        means = values @ onehot / onehot.sum(0)
        return np.sqrt(((values - means @ onehot.T) ** 2).sum(1) / dof)
    observed = within_block_sd(x, blocks) - within_block_sd(y, blocks)
    tol = 1e-9 * (np.abs(x).sum() + np.abs(y).sum())
    count = 0
    for start in range(0, 2 ** n, CHUNK):
        index = np.arange(start, min(start + CHUNK, 2 ** n))
        swap = ((index[:, None] >> np.arange(n)) & 1).astype(bool)             # [P, n]
        t = sd(np.where(swap, y, x)) - sd(np.where(swap, x, y))
        count += int((np.abs(t) >= abs(observed) - tol).sum())
    return count / 2 ** n


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


# ---------------------------------------------------------------------------------------
# 2. Power: the effect detectable at 80% power
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def power_ratio(n: int, level: float, power: float = POWER, draws: int = 2000, seed: int = 0,
                sided: str = "two") -> float:
    """r such that the exact two-sided sign-flip test at `level` detects, with the right
    sign, a shift r * s of n normal differences of standard deviation s with probability
    `power` (sided="greater": the one-sided test, #{sum eps d >= sum d} / 2^n). inf when
    the test's floor (2 / 2^n two-sided, 1 / 2^n one-sided) is not below the level.

    By simulation: `draws` samples z [draws, n] of N(0, 1), the same ones for every r
    (common random numbers make the simulated power a deterministic, increasing step
    function of r), then bisection on r. The test is scale-free (p does not change when
    every d_k is multiplied by s > 0), so r depends on n and the level only, and one
    simulation serves every claim of a family. Its Monte Carlo error is about 1% of r for
    2000 draws (tests/study/test_claims.py checks it against an independent simulation, and
    against the closed form r = Phi^-1(power^(1/n)) of levels below 4 / 2^n, where only
    the all-positive pattern is significant).
    """
    if n < 1 or (2 if sided == "two" else 1) / 2 ** n >= level:
        return math.inf
    z = np.random.default_rng(seed).standard_normal((draws, n))

    def detected(r: float) -> float:
        d = z + r
        if sided == "greater":
            observed = d.sum(1) - _tolerance(d)
            count = sum((s >= observed[:, None]).sum(1) for s in pattern_sums(d))
            return float(np.mean(count / 2 ** n < level))
        observed = np.abs(d.sum(1)) - _tolerance(d)                             # [draws]
        count = sum((np.abs(s) >= observed[:, None]).sum(1) for s in pattern_sums(d))
        return float(np.mean((count / 2 ** n < level) & (d.sum(1) > 0)))
    return _bisect(detected, power)


@functools.lru_cache(maxsize=None)
def tost_ratio(n: int, level: float, power: float = POWER, draws: int = 2000, seed: int = 0) -> float:
    """r0 such that TOST at `level` shows equivalence within a margin r0 * s, 4 times in 5
    (power), when the n differences are normal around a TRUE difference of 0 with SD s:
    the smallest margin this design could have shown. inf below the floor 1 / 2^n.
    Simulated as power_ratio (common random numbers, bisection on the margin)."""
    if n < 1 or 1 / 2 ** n >= level:
        return math.inf
    z = np.random.default_rng(seed).standard_normal((draws, n))

    def one_sided(d: np.ndarray) -> np.ndarray:
        observed = d.sum(1) - _tolerance(d)
        return sum((s >= observed[:, None]).sum(1) for s in pattern_sums(d)) / 2 ** n

    def shown(m: float) -> float:
        return float(np.mean(np.maximum(one_sided(z + m), one_sided(m - z)) < level))
    return _bisect(shown, power)


@functools.lru_cache(maxsize=None)
def spread_ratio(blocks: tuple, level: float, direction: int = -1, power: float = POWER, draws: int = 400,
                 seed: int = 0) -> float:
    """c such that the paired swap test of seed spread at `level` finds, with the predicted
    sign, an arm whose within-block SD is c times the reference's (c < 1 for direction -1),
    4 times in 5. blocks: the pairs' warm-up seeds, in order. inf if even c = 0 (or 10^3)
    is not found 4 times in 5.

    Simulated: per draw, each pair shares a block effect; the reference's runs add N(0, 1)
    noise, the arm's c N(0, 1); the test is scale- and shift-free, so c depends only on the
    blocks and the level. Fewer draws than power_ratio (each is a 2^n swap enumeration):
    Monte Carlo error a few % of c.
    """
    n = len(blocks)
    if n < 2 or 2 / 2 ** n >= level:
        return math.inf
    rng = np.random.default_rng(seed)
    labels = np.unique(blocks)
    shared = rng.standard_normal((draws, len(labels)))[:, np.searchsorted(labels, blocks)]
    ex, ey = rng.standard_normal((draws, n)), rng.standard_normal((draws, n))

    def found(c: float) -> float:
        hits = 0
        for k in range(draws):
            x, y = shared[k] + c * ex[k], shared[k] + ey[k]
            effect = within_block_sd(x, blocks) - within_block_sd(y, blocks)
            hits += paired_swap_p(x, y, blocks) < level and np.sign(effect) == direction
        return hits / draws
    if direction < 0:                       # shrink c from 1 toward 0
        if found(0.0) < power:
            return math.inf
        return 1 - _bisect(lambda t: found(1 - t), power, high=1.0, cap=1.0, steps=12)
    return 1 + _bisect(lambda t: found(1 + t), power, steps=12)


def _bisect(rate, power: float, high: float = 1.0, cap: float = 1e3, steps: int = 24) -> float:
    """The smallest x (to 2^-steps of the bracket) with rate(x) >= power; rate increases in x.
    Doubles the bracket up to `cap` first; inf if rate(cap) < power."""
    low = 0.0
    while rate(high) < power:
        low, high = high, 2 * high
        if high > cap:
            return math.inf
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (low, mid) if rate(mid) >= power else (mid, high)
    return high


# ---------------------------------------------------------------------------------------
# 3. Verdicts
# ---------------------------------------------------------------------------------------

def judge(claims: list[Claim], values: dict, series: dict) -> list[dict]:
    """One verdict record per claim, in order; Holm's family is the testable ones.

    values: {(row, arm): {(warmup_seed, seed): number}} (NaN or missing: no number);
    series: {arm: [each run's metric series]} for the testability checks and notes.
    Record: claim, reference (the arm actually compared: a tuple reference resolved), n
    (pairs, or runs within a run), effect (mean difference; spread: the difference of
    SDs; every row: the row with the weakest effect), se (the paired SE sd(d)/sqrt(n);
    spread: jackknife over pairs), p, p_holm, floor (the smallest p the test can give
    with n), family (m), verdict, detail, power80 (the effect detectable at 80% power,
    NaN where not computed).
    """
    records, testable = [], []
    for claim in claims:
        reference = _resolve_reference(claim, values)
        rec = {"claim": claim, "reference": reference, "n": 0, "effect": math.nan, "se": math.nan,
               "p": math.nan, "p_holm": math.nan, "floor": math.nan, "family": 0, "power80": math.nan}
        reason = claim.testable(series) if claim.testable else None
        tests = [] if reason else [_paired(values, row, claim.arm, reference, claim.minus) for row in claim.rows]
        if reason is None and min(len(t[0]) for t in tests) < 2:
            reason = f"fewer than 2 {'runs' if reference is None else 'pairs'} with a number " \
                     f"({min(len(t[0]) for t in tests)})"
        if reason is not None:
            rec.update(verdict="not testable", detail=reason)
        else:
            rec.update(_test(claim, tests))
            testable.append(rec)
        records.append(rec)
    for family in dict.fromkeys(r["claim"].family for r in testable):     # Holm within each family
        members = [r for r in testable if r["claim"].family == family]
        for rec, p_holm in zip(members, holm([r["p"] for r in members])):
            rec["p_holm"], rec["family"] = p_holm, len(members)
            rec.update(_verdict(rec))
    for rec in records:                     # e.g. how far FADE's delta and alpha moved, testable or not
        if rec["claim"].note is not None:
            rec["detail"] = "; ".join(x for x in (rec["detail"], rec["claim"].note(series)) if x)
    return records


def _resolve_reference(claim: Claim, values: dict) -> str | None:
    """The reference arm: itself, or the best of a tuple by the mean of claim.best_by (first on ties)."""
    if not isinstance(claim.reference, tuple):
        return claim.reference
    means = {arm: _nanmean(list(values.get((claim.best_by, arm), {}).values())) for arm in claim.reference}
    finite = {a: m for a, m in means.items() if math.isfinite(m)}
    return max(finite, key=lambda a: (finite[a], -claim.reference.index(a))) if finite else claim.reference[0]


def _paired(values: dict, row: str, arm: str, reference: str | None,
            minus: tuple[str, str] | None = None) -> tuple[np.ndarray, np.ndarray, list]:
    """(x, y, keys): the arm's and the reference's numbers on the keys both have (y = 0 within a run).

    An interaction (minus = (c, d)): x = arm - reference and y = c - d, on the keys all four have.
    """
    if minus is not None:
        x1, y1, k1 = _paired(values, row, arm, reference)
        x2, y2, k2 = _paired(values, row, *minus)
        first, second = dict(zip(k1, x1 - y1)), dict(zip(k2, x2 - y2))
        keys = sorted(set(first) & set(second))
        return np.array([first[k] for k in keys]), np.array([second[k] for k in keys]), keys
    a = {k: v for k, v in values.get((row, arm), {}).items() if _finite(v)}
    if reference is None:
        keys = sorted(a)
        return np.array([a[k] for k in keys]), np.zeros(len(keys)), keys
    b = {k: v for k, v in values.get((row, reference), {}).items() if _finite(v)}
    keys = sorted(set(a) & set(b))
    return np.array([a[k] for k in keys]), np.array([b[k] for k in keys]), keys


def _test(claim: Claim, tests: list) -> dict:
    """effect, se, p, floor and n of one claim from its rows' (x, y, keys)."""
    per_row = []
    for x, y, keys in tests:
        n, spread = len(x), {}
        if claim.statistic == "spread":
            blocks = [k[0] for k in keys]
            effect = within_block_sd(x, blocks) - within_block_sd(y, blocks)
            jack = [within_block_sd(np.delete(x, i), np.delete(blocks, i))
                    - within_block_sd(np.delete(y, i), np.delete(blocks, i)) for i in range(n)]
            se = math.sqrt((n - 1) / n * float(np.nansum((np.array(jack) - np.nanmean(jack)) ** 2)))
            p, floor = paired_swap_p(x, y, blocks), 2 / 2 ** n
            spread = {"blocks": blocks, "sd_reference": within_block_sd(y, blocks)}
        else:
            d = x - y
            effect, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
            if claim.statistic == "not_lower":              # H0: mean(d) <= -margin, one-sided
                p, floor = sign_flip_p_greater(d + claim.margin), 1 / 2 ** n
            elif claim.direction == 0:
                p, floor = tost_p(d, claim.margin), 1 / 2 ** n
            else:
                p, floor = sign_flip_p(d - claim.direction * claim.margin), 2 / 2 ** n
        per_row.append({"effect": effect, "se": se, "p": p, "floor": floor, "n": n,
                        "sd": float(np.std(x - y, ddof=1)), **spread})
    weakest = min(per_row, key=lambda r: (claim.direction or 1) * r["effect"]) if claim.direction \
        else max(per_row, key=lambda r: abs(r["effect"]))
    return {"effect": weakest["effect"], "se": weakest["se"], "n": weakest["n"], "sd": weakest["sd"],
            "p": max(r["p"] for r in per_row), "floor": max(r["floor"] for r in per_row),
            "row_effects": [r["effect"] for r in per_row],
            **{k: weakest[k] for k in ("blocks", "sd_reference") if k in weakest}}


def _verdict(rec: dict) -> dict:
    """agrees / opposite / no difference detected / no equivalence shown / no non-inferiority
    shown, with its detail, which always ends with the claim's power statement (power80)."""
    claim = rec["claim"]
    significant = rec["p_holm"] < ALPHA
    power80, power_text = power_statement(rec)
    out = {"power80": power80}

    def detail(*parts):
        return "; ".join(p for p in (*parts, power_text) if p)
    if claim.statistic == "not_lower":
        out.update(verdict="agrees" if significant else "no non-inferiority shown",
                   detail=detail(f"margin {_fmt(claim.margin)}"))
        return out
    if claim.direction == 0:
        inside = abs(rec["effect"]) < claim.margin
        out.update(verdict="agrees" if significant and inside else "no equivalence shown",
                   detail=detail(f"margin +-{_fmt(claim.margin)}"))
        return out
    signs = {np.sign(e - claim.direction * claim.margin) for e in rec["row_effects"]}
    margin = f"margin {_fmt(claim.margin)}" if claim.margin else ""
    if significant and signs == {claim.direction}:
        out.update(verdict="agrees", detail=detail(margin))
    elif significant and signs == {-claim.direction}:
        out.update(verdict="opposite", detail=detail(margin))
    else:
        out.update(verdict="no difference detected",
                   detail=detail("the rows disagree in sign" if len(signs) > 1 and significant else ""))
    return out


def power_statement(rec: dict) -> tuple[float, str]:
    """(the effect detectable at 80% power, how the page says it) for a testable claim.

    At level ALPHA / m (Holm's strictest step), given the observed SD s of the per-pair
    differences (every row: the weakest row's):
      mean, direction +-1   margin + r s: the true effect found, with the predicted sign, 4 times in 5;
      not_lower             r1 s - margin: a true difference at least this shows non-inferiority 4 times in 5;
      equivalence (TOST)    r0 s: the margin a true difference of 0 would be shown within, 4 times in 5;
      spread                (c - 1) x the reference's seed SD: the change in SD found 4 times in 5.
    r, r1, r0, c by simulation of the exact tests (power_ratio, tost_ratio, spread_ratio).
    """
    claim, n, level = rec["claim"], rec["n"], ALPHA / rec["family"]
    unit = "runs" if rec["reference"] is None else "pairs"
    none = (math.inf, f"no effect detectable at 80% power with {n} {unit} among {rec['family']} claims")
    if claim.statistic == "spread":
        c = spread_ratio(tuple(rec["blocks"]), level, claim.direction)
        if not math.isfinite(c):
            return none
        effect = (c - 1) * rec["sd_reference"]
        return effect, f"80%-power effect {_fmt(effect)} (an SD {c:.2f} x the reference's)"
    if claim.statistic == "not_lower":
        r = power_ratio(n, level, sided="greater")
        if not math.isfinite(r):
            return none
        effect = r * rec["sd"] - claim.margin
        return effect, f"shown 4 times in 5 if the true difference is {_fmt(effect)} or more"
    if claim.direction == 0:
        r = tost_ratio(n, level)
        if not math.isfinite(r):
            return none
        return r * rec["sd"], f"80%-power margin {_fmt(r * rec['sd'])} at a true difference of 0"
    r = power_ratio(n, level)
    if not math.isfinite(r):
        return none
    effect = claim.margin + r * rec["sd"]
    return effect, f"80%-power effect {_fmt(effect)}" + (" (weakest row)" if len(claim.rows) > 1 else "")


# ---------------------------------------------------------------------------------------
# 4. Checks
# ---------------------------------------------------------------------------------------

def run_checks(checks: list[Check], values: dict) -> list[dict]:
    """One record per check: runs (how many had a number), low and high (the measured
    range over them), result ("pass", "FAIL", or "not measured" when no run logged it; a
    precondition: "met" or "NOT MET")."""
    records = []
    for check in checks:
        per_row = [[v for arm in check.arms for v in values.get((row, arm), {}).values() if _finite(v)]
                   for row in check.rows]
        xs = [v for row in per_row for v in row]
        rec = {"check": check, "runs": max(map(len, per_row)), "low": min(xs, default=math.nan),
               "high": max(xs, default=math.nan)}
        holds = ("pass", "FAIL") if check.kind == "identity" else ("met", "NOT MET")
        if not xs:
            rec["result"] = "not measured"
        else:
            rec["result"] = holds[0] if _holds(check, rec["low"], rec["high"]) else holds[1]
        records.append(rec)
    return records


def _holds(check: Check, low: float, high: float) -> bool:
    """Does the measured range [low, high] satisfy the check's expectation?"""
    if check.expect == "zero":
        return max(abs(low), abs(high)) <= check.tol
    if check.expect == "positive":
        return low > check.tol
    if check.expect == "equals":
        return max(abs(low - check.value), abs(high - check.value)) <= check.tol
    lo, hi = check.value
    return lo - check.tol <= low and high <= hi + check.tol


def expectation(check: Check) -> str:
    """The check's expectation in words: '0 (|x| <= 1e-06)', '> 0.001', '= 0.333 (+- 1e-06)', 'in [0.3, 1]'."""
    if check.expect == "zero":
        return f"0 (|x| <= {_fmt(check.tol)})" if check.tol else "exactly 0"
    if check.expect == "positive":
        return f"> {_fmt(check.tol)}"
    if check.expect == "equals":
        return f"{_fmt(check.value)}" + (f" (+- {_fmt(check.tol)})" if check.tol else " exactly")
    return f"in [{_fmt(check.value[0])}, {_fmt(check.value[1])}]"


# ---------------------------------------------------------------------------------------
# 5. Tables (the sweep pages)
# ---------------------------------------------------------------------------------------

def verdict_table(rows: list[dict]) -> str:
    """The findings as a markdown table, then each claim's source sentence."""
    lines = ["| # | paper | claim [row] | arm vs reference | test | n | effect ± SE | p | p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        c = r["claim"]
        versus = f"{c.arm} vs {r['reference']}" if r["reference"] else f"{c.arm} (within run)"
        if c.minus:
            versus = f"({c.arm} - {r['reference']}) - ({c.minus[0]} - {c.minus[1]})"
        if isinstance(c.reference, tuple):
            versus += f" (best of {', '.join(c.reference)} by {c.best_by})"
        effect = "-" if math.isnan(r["effect"]) else f"{_fmt(r['effect'])} ± {_fmt(r['se'])}"
        p = "-" if math.isnan(r["p"]) else format_p(r["p"], r["floor"])
        ph = "-" if math.isnan(r["p_holm"]) else f"{r['p_holm']:.4f}"
        verdict = f"**{r['verdict']}**" + (f" ({r['detail']})" if r["detail"] else "")
        text = (f"({c.family}) " if c.family else "") + c.text + (" *re-read*" if c.posthoc else "")
        lines.append(f"| {i} | {c.paper} | {text} [{' / '.join(c.rows)}] | {versus} | {test_name(c)} | "
                     f"{r['n'] or '-'} | {effect} | {p} | {ph} | {verdict} |")
    lines += ["", "Sources, verbatim:", ""]
    lines += [f"{i}. \"{r['claim'].quote}\"" for i, r in enumerate(rows, 1)]
    return "\n".join(lines) + "\n"


def check_table(rows: list[dict]) -> str:
    """The checks as a markdown table: what, where, measured range, expectation, result."""
    lines = ["| check | row | arms | runs | measured | expected | result |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["check"]
        measured = "-" if not r["runs"] else (_fmt(r["low"]) if r["low"] == r["high"]
                                              else f"{_fmt(r['low'])} to {_fmt(r['high'])}")
        lines.append(f"| {c.text} | {' / '.join(c.rows)} | {', '.join(c.arms)} | {r['runs']} | {measured} | "
                     f"{expectation(c)} | **{r['result']}** |")
    return "\n".join(lines) + "\n"


def test_name(claim: Claim) -> str:
    """The test in a few words (the page's 'test' column)."""
    within = claim.reference is None
    if claim.statistic == "spread":
        return "paired swap, seed spread"
    if claim.statistic == "not_lower":
        return f"sign-flip one-sided, not lower by {_fmt(claim.margin)}" + (" (runs)" if within else " (pairs)")
    if claim.direction == 0:
        return f"TOST ±{_fmt(claim.margin)}" + (" (runs)" if within else " (pairs)")
    name = "sign-flip" + (" (runs)" if within else " (pairs)")
    if claim.minus:
        name = "sign-flip (pairs), interaction"
    if claim.margin:
        name += f", margin {_fmt(claim.margin)}"
    return name + (", every row" if len(claim.rows) > 1 else "")


def format_p(p: float, floor: float) -> str:
    """p with 4 decimals, marked when it is the smallest p the test can give ('0.0020, floor')."""
    return f"{p:.4f}" + (", floor" if abs(p - floor) <= 1e-12 else "")


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def _nanmean(xs) -> float:
    xs = [float(x) for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
