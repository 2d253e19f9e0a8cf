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

The tests. Every p-value is exact, a count over the 2^n equally likely sign patterns of n
pairs (experiments/exact_tests.py: why, the floors, the power). Which test a claim gets:
  - mean (direction +1 or -1): the two-sided sign-flip test of mean(d) = 0 on the per-pair
    differences. Floor 2 / 2^n, 0.00195 for 10 pairs. With a margin m ("a share above
    1%"): the same test of d_k - direction * m. One-sided (Claim.sided "one") only where the
    claim's paper states the direction: the test of mean(d) <= 0 against the predicted
    sign, floor 1 / 2^n (6 pairs: 0.016, where two-sided gives 0.031); it cannot say
    "opposite", so an effect of the other sign is named in the verdict's detail.
  - within a run (reference None): the same test on each run's own number (a difference
    inside the run, such as value b+ minus value s+).
  - equivalence (direction 0, margin m > 0: "similar"): TOST within +-m. Floor 1 / 2^n.
  - not lower (statistic "not_lower"): the one-sided test of d + m, that the arm is not
    lower than the reference by m or more. Floor 1 / 2^n.
  - spread (statistic "spread": "seed spread" as stability): the paired swap test of the
    difference of the two arms' standard deviations within a warm-up seed. Floor 2 / 2^n.
  - interaction (Claim.minus: does arm's gain over reference grow from one setting to
    another, e.g. from lr 1e-4 to 4e-4?): the sign-flip test on the per-pair difference
    of differences d_k = (x_arm - x_ref)(k) - (x_c - x_d)(k), all four runs sharing the
    pair's start, prompts and samples.
  - every row (row a tuple, e.g. pass@k at every k): the intersection-union test (Berger
    1982). The claim holds only if it holds on each row, so its p is the largest of the
    rows' p-values; no correction across the rows is needed.
  - Holm's correction within a family DECLARED with the claims (Claim.family; all of a
    sweep's claims on one task when none is named): its size m is the number of claims
    declared in it, whatever the runs show, so a claim found not testable enters with
    p = 1 instead of leaving the family (which would make the correction depend on the
    data). 10 pairs' floor survives Holm over up to 25 claims (25 x 0.00195 = 0.049); 6
    pairs' two-sided floor 0.031 survives only a family of 1, its one-sided floor 0.016 a
    family of up to 3: the designs on 6 pairs declare families that small.
  - Preconditions (Check with kind "precondition", e.g. "the clip was never reached"): a
    claim that needs one (Claim.needs) is not testable unless it is met on every run of
    its arms: it would measure something else.
  - Held fixed (experiments/held_fixed.py): what a CONTROL arm holds equal to another arm's, declared with
    the design and measured, not assumed. A control that changes "one thing" must leave
    the rest where it was, and "the rest" is what carries gradient, not what is present:
    random_recentred keeps random's prompts in each optimizer step, but gives 0 to every
    part of one rollout or one reward, so it trains on fewer of them. train.py logs, for
    each run, what its own mode trains on per optimizer step and what every mode sharing
    its split would train on in the same batch (machinery/metrics.py trained_metrics);
    the check compares the two on every step of every run of the control, and on each
    pair's first step (the same batch in both runs) the control's figure for the
    reference with the reference run's own. A claim that needs it (Claim.needs, by its
    text) is not testable unless it is met.
  - One family per sweep (rec["p_holm_sweep"]): every claim's p is also corrected over all
    the claims of its sweep on its task, whatever families they declare, and the pages give
    both; a sweep may declare that reading its primary one (Sweep.holm = "sweep").
  - Pairs whose runs ran on different CPUs (the CPU model and torch's kernels of the runs' records) are left
    out of a claim and counted in its detail: another CPU rounds float sums differently,
    so the two runs of such a pair differ in more than the arm.
Verdicts (ALPHA = 0.05 on the Holm-adjusted p):
  agrees                  p_holm < ALPHA, predicted sign (equivalence: inside the margin)
  opposite                p_holm < ALPHA, the other sign (with a margin: short of it)
  no difference detected  direction +-1, otherwise; with the effect detectable at 80% power
  no equivalence shown    direction 0, otherwise
  not testable            the claim's own check says the runs cannot speak to it (with the
                          measured reason), a precondition it needs is not met, or fewer
                          than 2 pairs have a number.
The effect detectable at 80% power: the true mean difference delta that the exact test at
level ALPHA / m would call, with the predicted sign, in 80% of repetitions (ALPHA / m is
Holm's strictest step: an effect this large is found even when no other claim of the family
is); delta = r(n, ALPHA / m) * s with s the observed SD of the differences. The tests, Holm's
correction and r, simulated from the exact test: experiments/exact_tests.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from experiments.exact_tests import (holm, paired_swap_p, power_ratio, sign_flip_p, sign_flip_p_greater,
                                     spread_ratio, tost_p, tost_ratio, within_block_sd)

ALPHA = 0.05


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
    """Holm's family within the sweep ("primary", "secondary", "ours"), declared with the claim:
    its size is the number of claims declared in it; one family when all are ''."""
    sided: str = "two"
    """"two", or "one" (the test against the predicted sign alone) where the paper states the direction."""
    needs: tuple[str, ...] = ()
    """The texts of the sweep's preconditions (Check, kind "precondition") and held-fixed checks
    (HeldFixed) the claim needs: not testable unless each is met."""
    isolates: str = ""
    """What the arm changes against its reference, when it changes one thing (the rest held
    fixed by the HeldFixed checks in `needs`): the one cause an agreeing verdict may name in
    prose (tests/study/test_cause_words.py). Empty: the arms differ in more than one thing."""
    min_n: int = 2
    """The fewest pairs (or runs, within a run) with a number for the claim to be testable,
    declared with it (value b+ - s+ on SmolLM2: 8 runs); below it: not testable."""
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
    expect: str
    """"zero" (|x| <= tol), "positive" (x > tol), "equals" (|x - value| <= tol), "within" (value = (lo, hi))."""
    value: float | tuple[float, float] = 0.0
    tol: float = 0.0
    kind: str = "identity"
    """"identity": the code must satisfy it (pass / FAIL); "precondition": what a finding needs of
    the training (a manipulation check, e.g. "the clip was never reached"), measured and shown
    as met / NOT MET: the training, not the code, decides it."""

    @property
    def rows(self) -> tuple[str, ...]:
        return self.row if isinstance(self.row, tuple) else (self.row,)


# ---------------------------------------------------------------------------------------
# 1. Verdicts
# ---------------------------------------------------------------------------------------

def judge(claims: list[Claim], values: dict, series: dict, checks: list[dict] | None = None,
          cpus: dict | None = None, one_family: bool = False) -> list[dict]:
    """One verdict record per claim, in order; Holm's families as declared (Claim.family), or
    one family for all of them (one_family: the sweep's declared reading, Sweep.holm).

    values: {(row, arm): {(warmup_seed, seed): number}} (NaN or missing: no number);
    series: {arm: [each run's metric series]} for the testability checks and notes;
    checks: run_checks' records (a claim's `needs` read their results); cpus: {(arm,
    (warmup_seed, seed)): the run's CPU model} (pairs across CPUs are left out).
    Record: claim, reference (the arm actually compared: a tuple reference resolved), n
    (pairs, or runs within a run), effect (mean difference; spread: the difference of
    SDs; every row: the row with the weakest effect), se (the paired SE sd(d)/sqrt(n);
    spread: jackknife over pairs), p, p_holm, floor (the smallest p the test can give
    with n), family (m), verdict, detail, power80 (the effect detectable at 80% power,
    NaN where not computed); and the other reading of Holm beside it: p_holm_sweep,
    verdict_sweep and family_sweep (every claim in one family), or, when one_family,
    p_holm_declared, verdict_declared and family_declared (the declared families).
    checks: run_checks' and run_held's records (a claim's `needs` reads their results).
    """
    records = []
    results = {c["check"].text: c["result"] for c in checks or []}
    kinds = {c["check"].text: c["check"].kind for c in checks or []}
    for claim in claims:
        reference = _resolve_reference(claim, values)
        rec = {"claim": claim, "reference": reference, "n": 0, "effect": math.nan, "se": math.nan,
               "p": math.nan, "p_holm": math.nan, "floor": math.nan, "family": 0, "power80": math.nan}
        unmet = [text for text in claim.needs if results.get(text, "not measured") != "met"]
        reason = (f"{kinds.get(unmet[0], 'precondition')} {results.get(unmet[0], 'not measured')}: {unmet[0]}"
                  if unmet else
                  claim.testable(series) if claim.testable else None)
        tests, mixed = [], 0
        if reason is None:
            for row in claim.rows:
                x, y, keys = _paired(values, row, claim.arm, reference, claim.minus)
                same = [i for i, k in enumerate(keys) if _one_cpu(cpus, claim, reference, k)]
                mixed = max(mixed, len(keys) - len(same))
                tests.append((x[same], y[same], [keys[i] for i in same]))
        if reason is None and min(len(t[0]) for t in tests) < max(claim.min_n, 2):
            reason = f"fewer than {max(claim.min_n, 2)} {'runs' if reference is None else 'pairs'} with a number " \
                     f"({min(len(t[0]) for t in tests)})"
        if reason is not None:
            rec.update(verdict="not testable", detail=reason + (f"; {_mixed_text(mixed)}" if mixed else ""))
        else:
            rec.update(_test(claim, tests), mixed=mixed)
        records.append(rec)
    declared, one = [r["claim"].family for r in records], [""] * len(records)
    # (suffix of the record's keys, each record's family): the primary reading first
    readings = [("", one), ("_declared", declared)] if one_family else [("", declared), ("_sweep", one)]
    for suffix, families in readings:
        for family in dict.fromkeys(families):                     # Holm within each family of the reading
            members = [r for r, f in zip(records, families) if f == family]
            # every declared member counts; a claim not testable enters with p = 1 (it rejects nothing)
            adjusted = holm([1.0 if r.get("verdict") == "not testable" else r["p"] for r in members])
            for rec, p_holm in zip(members, adjusted):
                rec["family" + suffix] = len(members)
                if rec.get("verdict") == "not testable":
                    rec["verdict" + suffix] = "not testable"
                elif suffix:                   # the other reading, beside the primary one
                    other = _verdict({**rec, "p_holm": p_holm, "family": len(members)})
                    rec.update({"p_holm" + suffix: p_holm, "verdict" + suffix: other["verdict"]})
                else:
                    rec["p_holm"] = p_holm
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
            elif claim.sided == "one":                      # H0: the effect is not of the predicted sign
                p, floor = sign_flip_p_greater(claim.direction * (d - claim.direction * claim.margin)), 1 / 2 ** n
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
        mixed = _mixed_text(rec["mixed"]) if rec.get("mixed") else ""
        return "; ".join(p for p in (*parts, mixed, power_text) if p)
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
    elif claim.sided == "one" and signs == {-claim.direction}:       # a one-sided test cannot call it
        out.update(verdict="no difference detected",
                   detail=detail(margin, "the effect has the other sign (one-sided test: not tested that way)"))
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
    r = power_ratio(n, level, sided="greater" if claim.sided == "one" else "two")
    if not math.isfinite(r):
        return none
    effect = claim.margin + r * rec["sd"]
    return effect, f"80%-power effect {_fmt(effect)}" + (" (weakest row)" if len(claim.rows) > 1 else "")


# ---------------------------------------------------------------------------------------
# 2. Checks
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
# 3. Tables (the sweep pages)
# ---------------------------------------------------------------------------------------

def verdict_table(rows: list[dict], other: str | None = None) -> str:
    """The findings as a markdown table, then each claim's source sentence.

    other: "sweep" or "declared": a last column with the other reading of Holm's correction
    (judge's p_holm_sweep / p_holm_declared, its family's size and its verdict)."""
    extra = {"sweep": " one family per sweep: p (Holm), verdict |", "declared": " declared families: p (Holm), verdict |"}
    lines = ["| # | paper | claim [row] | arm vs reference | test | n | effect ± SE | p | p (Holm) | verdict |"
             + extra.get(other, ""), "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if other else "")]
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
        line = (f"| {i} | {c.paper} | {text} [{' / '.join(c.rows)}] | {versus} | {test_name(c)} | "
                f"{r['n'] or '-'} | {effect} | {p} | {ph} | {verdict} |")
        if other:
            p_other = r.get(f"p_holm_{other}", math.nan)
            line += (f" {'-' if math.isnan(p_other) else f'{p_other:.4f}'} (m = {r[f'family_{other}']}), "
                     f"{r[f'verdict_{other}']} |")
        lines.append(line)
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
    name = ("sign-flip one-sided" if claim.sided == "one" else "sign-flip") + (" (runs)" if within else " (pairs)")
    if claim.minus:
        name = "sign-flip (pairs), interaction"
    if claim.margin:
        name += f", margin {_fmt(claim.margin)}"
    return name + (", every row" if len(claim.rows) > 1 else "")


def format_p(p: float, floor: float) -> str:
    """p with 4 decimals, marked when it is the smallest p the test can give ('0.0020, floor')."""
    return f"{p:.4f}" + (", floor" if abs(p - floor) <= 1e-12 else "")


def _one_cpu(cpus: dict | None, claim: Claim, reference: str | None, key) -> bool:
    """Whether every run the claim reads at this (warm-up seed, seed) ran on one CPU model
    (True where the CPUs are not recorded: data from before they were)."""
    if not cpus:
        return True
    arms = (claim.arm, reference, *(claim.minus or ()))
    models = {cpus.get((arm, key)) for arm in arms if arm is not None} - {None}
    return len(models) <= 1


def _mixed_text(n: int) -> str:
    return f"{n} pair{'s' if n > 1 else ''} left out: {'their' if n > 1 else 'its'} runs ran on different CPUs"


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def _nanmean(xs) -> float:
    xs = [float(x) for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
