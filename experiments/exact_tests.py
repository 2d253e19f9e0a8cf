"""exact_tests.py: the exact paired tests a finding is judged with, Holm's correction, and the effect each could detect.

experiments/claims.py says which test a claim gets and turns its p-value into a verdict;
this file is the statistics alone: numbers in, p-values and detectable effects out. No
claim, sweep or run appears here.

Why exact tests. A sweep has few pairs (10 by default: warm-up seeds x RL seeds) and its
numbers are bounded (pass@1) or skewed (seed spreads), so no test here assumes a
distribution. Each p-value is a count over equally likely sign patterns:

  sign flip   Under "no effect" the two runs of a pair are exchangeable, so the per-pair
              difference d_k is as likely +|d_k| as -|d_k|, and all 2^n patterns
              eps in {+1, -1}^n of sum_k eps_k d_k are equally likely.
                two-sided  p = #{eps: |sum eps d| >= |sum d|} / 2^n     floor 2 / 2^n
                one-sided  p = #{eps: sum eps d >= sum d} / 2^n         floor 1 / 2^n
              10 pairs: floors 0.00195 and 0.00098; 5 pairs never reach 0.05 two-sided.
  TOST        "similar within +-m": two one-sided sign-flip tests, of d + m (is the mean
              above -m?) and of m - d (below +m?); p is the larger. Each shifted sample is
              symmetric about 0 at its null's boundary, which is all the sign flip needs.
  paired swap for a statistic that is not a mean (the seed spread, a standard deviation
              within warm-up seeds): swap the two runs of each pair in every one of the
              2^n patterns and recompute the statistic. Floor 2 / 2^n.
  Holm        over the m tests of one family: the i-th smallest p (i from 0) times m - i,
              running maximum, capped at 1. Keeps the chance of any false rejection at
              the level without assuming the tests independent (they share arms).

Counting the patterns (count_at_least). Listing all 2^n sums costs 2^n per test: nothing for
10 pairs (1,024), a million for 20, and the power simulation below runs the test thousands
of times (2,000 draws x ~30 bisection steps: at 20 pairs that is 10^11 sums, hours). So the
sign-flip counts meet in the middle: split the n pairs in two halves, list the 2^(n/2) sums
of each half, sort one, and for each sum a of the other count the b with a + b >= t by a
binary search. The count is the same number; the cost is 2^(n/2) log 2^(n/2) per test (20
pairs: 1,024 x 10). Sums equal up to float rounding count as equal (_tolerance), so a pattern
and its mirror get the same p. The swap test's statistic is no sum, so it still lists its
2^n patterns, CHUNK at a time.

The effect detectable at 80% power (section 2). "No difference detected" says nothing
without the size of difference the design could have seen. For the sign-flip test: the
true mean difference delta = r(n, level) * s that the test at `level` calls, with the
right sign, in 80% of repetitions when the n differences are normal with standard
deviation s around delta. The test is scale-free, so r depends on n and the level only;
it comes from a simulation of the exact test (power_ratio), not from a normal formula,
which would be wrong near the floor. The same for TOST (the smallest margin the design
could have shown: tost_ratio) and the swap test (the smallest ratio of seed spreads:
spread_ratio). This replaces the "minimum detectable effect" (the effect that would just
reach significance), which a design finds only about half of the time.
"""

from __future__ import annotations

import functools
import math

import numpy as np

POWER = 0.8
CHUNK = 1 << 15          # swap patterns (or half sums) built at a time: memory CHUNK x n floats
LIST_ALL = 12            # up to this many pairs count_at_least lists all 2^n sums; above, it meets in the middle


# ---------------------------------------------------------------------------------------
# 1. The exact tests
# ---------------------------------------------------------------------------------------

def count_at_least(d: np.ndarray, threshold) -> np.ndarray:
    """#{eps in {+1, -1}^n: sum_k eps_k d_k >= threshold}, for each row of d.

    d: [R, n] (one test per row); threshold: a number or [R]. Returns [R] integer counts.
    Meet in the middle: with A the 2^h sums of the first h = n // 2 columns and B the
    2^(n-h) sums of the rest, every pattern is one pair (a, b) and its sum is a + b, so
        count = sum over a in A of #{b in B: b >= threshold - a}.
    Per row: sort B once, then one binary search per a (np.searchsorted: the index of the
    first b >= threshold - a, so V minus it counts them). h = 0 (one pair) leaves A = {0}.
    Rows are looped: a row is 2^h searches in 2^(n-h) sorted values (20 pairs: 1,024 in
    1,024), and the loop beat one sort of every row's keys together by 4x; the half sums are
    built for CHUNK / 2^(n-h) rows at a time, so memory stays bounded at any n (time does
    not: 2^(n/2) per row, so a power simulation at 30 pairs takes minutes where 20 take
    seconds). Up to LIST_ALL pairs the 2^n sums are listed instead, all rows in one matrix
    product: the same count, and for few pairs faster than a Python loop over many rows.
    """
    d = np.asarray(d, float)
    rows = d.shape[0]
    threshold = np.broadcast_to(np.asarray(threshold, float), (rows,))
    if d.shape[1] <= LIST_ALL:
        return (_half_sums(d) >= threshold[:, None]).sum(axis=1)
    h = d.shape[1] // 2
    block = max(1, CHUNK // 2 ** (d.shape[1] - h))                 # rows at a time: memory ~ CHUNK sums
    counts = []
    for start in range(0, rows, block):
        rows_here = slice(start, start + block)
        queries = threshold[rows_here, None] - _half_sums(d[rows_here, :h])             # [block, 2^h]
        values = np.sort(_half_sums(d[rows_here, h:]), axis=1)                          # [block, 2^(n-h)]
        size = queries.shape[1] * values.shape[1]                 # 2^n: every pattern is one (a, b)
        counts += [size - np.searchsorted(v, q).sum() for q, v in zip(queries, values)]
    return np.array(counts)


def _half_sums(x: np.ndarray) -> np.ndarray:
    """sum_k eps_k x_k for every sign pattern of x's m columns: [R, m] -> [R, 2^m] (m = 0: zeros [R, 1]).
    Pattern i gives x_k the sign - where bit k of i is set."""
    m = x.shape[1]
    signs = 1.0 - 2.0 * ((np.arange(2 ** m)[:, None] >> np.arange(m)) & 1)           # [2^m, m] of +-1
    return x @ signs.T


def _two_sided_count(d: np.ndarray, observed) -> np.ndarray:
    """#{eps: |sum eps d| >= observed} per row: the patterns at or above it plus those at or
    below -observed (the mirror of each: sum of eps (-d)); all 2^n where observed <= 0."""
    observed = np.broadcast_to(np.asarray(observed, float), d.shape[:1])
    both = count_at_least(d, observed) + count_at_least(-d, observed)
    return np.where(observed > 0, both, 2 ** d.shape[1])


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
    return int(_two_sided_count(d[None], observed)[0]) / 2 ** len(d)


def sign_flip_p_greater(d) -> float:
    """One-sided exact sign-flip p-value against mean(d) <= 0: #{sum eps d >= sum d} / 2^n.

    Example: sign_flip_p_greater([1, 2, 3]) == 1/8 (only the observed pattern reaches 6).
    """
    d = np.asarray(d, float)
    observed = d.sum() - _tolerance(d)
    return int(count_at_least(d[None], observed)[0]) / 2 ** len(d)


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
            count = count_at_least(d, d.sum(1) - _tolerance(d))
            return float(np.mean(count / 2 ** n < level))
        count = _two_sided_count(d, np.abs(d.sum(1)) - _tolerance(d))          # [draws]
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
        return count_at_least(d, d.sum(1) - _tolerance(d)) / 2 ** n

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

