"""held_fixed.py: what a control arm holds equal to its reference, declared with the design and measured.

A control arm is meant to change one thing against its reference and leave the rest where
it was. "The rest" is easy to get wrong, because what matters is what carries gradient,
not what is present. random_recentred (batching.py) keeps random's split, so every prompt
random trains on in an optimizer step is present in random_recentred's too; but it gives
advantage 0 to each group's part of one rollout, and to each part whose rollouts share a
reward, so on the same batch it trains on about 0.6 of random's rollouts, 0.4 of its
prompts and 0.6 of its sum of |A|. A reading of random_recentred against random as
"cancellation, and nothing else" was therefore not testable, and nothing in the first
design could have said so: nothing measured what the control holds.

So a design declares, per control, what it holds (HeldFixed), and this file measures it on
every step of every run:
  - on the same batch: train.py logs what the run's own mode trains on per optimizer step
    (mb/rollouts_trained, mb/prompts_trained, mb/adv_abs_sum_trained) and what every mode
    that shares its split would train on in that batch (held/<mode>/...,
    machinery/metrics.py trained_metrics); the check compares the control's own figures
    with its reference's rule, step by step;
  - across the pair: at step 1 both runs of a pair saw the same batch, so the control's
    figure for the reference's rule must equal the reference run's own (with data from
    before the log: the batch's reward and entropy, which say whether they saw one batch);
  - or, for what the seed alone decides (the split of random's draws), the two runs
    themselves at every step (pairwise).
A claim that needs the check (experiments/claims.py Claim.needs, by the check's text) is
not testable unless it is met. The report shows each check on the sweep's page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from experiments.claims import _fmt


@dataclass
class HeldFixed:
    """What a control arm holds equal to another arm's: measured on every step, met or NOT MET."""

    text: str
    """What is held, in one line (a claim's `needs` names it by this text)."""
    arm: str
    """The control."""
    reference: str
    """The arm whose quantities it holds (its --minibatch_mode shares the control's split)."""
    mode: str
    """The reference arm's --minibatch_mode: the control's runs log its rule as held/<mode>/<q>."""
    quantities: tuple[str, ...] = ("rollouts_trained", "prompts_trained", "adv_abs_sum_trained")
    """Logged as mb/<q> (the run's own mode) and held/<mode>/<q> (the reference's, same batch)."""
    tol: float = 1e-5
    """The largest relative difference |x - y| / |y| allowed: float rounding of sums of |A|."""
    kind = "held fixed"          # what a claim's unmet need is called ("precondition" for a Check)
    pairwise: bool = False
    """Compare the control RUN's mb/<q> with the reference run's at every step of each pair,
    for what the seed alone decides whatever the training does (the split of random's draws:
    mb/split_groups), instead of the reference's rule on the control's batch."""




def run_held(held: list[HeldFixed], runs: dict) -> list[dict]:
    """One record per held-fixed check, measured on every step of every run of its control.

    runs: {(arm, (warmup_seed, seed)): the run's series {key: (steps, values)}}. Per check:
      gap        the largest |x - y| / |y| over the control's runs, steps and quantities,
                 x = mb/<q> (what the control trained on), y = held/<mode>/<q> (what the
                 reference's rule trains on in the same batch; 0/0 counts as 0);
      first_gap  the same between the control run's held/<mode>/<q> and the reference run's
                 own mb/<q> at step 1 of each pair, where both runs saw the same batch (with
                 data from before mb/<q> was logged: the batch's reward and entropy, which say
                 whether the pair saw one batch at all); NaN where no pair has both runs;
      ratios     {q: the control's mean of x over all its steps / the mean of y}: how far
                 from the reference it is (1 when held);
      result     "met" (both gaps <= tol), "NOT MET", or "not measured" (no run of the
                 control logged held/<mode>/: runs from before the log existed).
    """
    records = []
    for h in held:
        own = {key: s for (arm, key), s in runs.items() if arm == h.arm}
        needed = [f"mb/{q}" if h.pairwise else f"held/{h.mode}/{q}" for q in h.quantities]
        logged = {key: s for key, s in own.items() if all(k in s for k in needed)}
        rec = {"check": h, "runs": len(logged), "gap": math.nan, "first_gap": math.nan, "pairs": 0, "ratios": {}}
        if not logged:
            rec["result"] = "not measured"
            records.append(rec)
            continue
        gaps, firsts, sums = [], [], {q: [0.0, 0.0] for q in h.quantities}
        for key, s in logged.items():
            ref = runs.get((h.reference, key))
            for q in h.quantities:
                if h.pairwise and (ref is None or f"mb/{q}" not in ref):
                    continue
                x, y = _aligned(s, f"mb/{q}", *((ref, f"mb/{q}") if h.pairwise else (s, f"held/{h.mode}/{q}")))
                gaps += list(_relative_gap(x, y))
                sums[q][0] += float(np.nansum(x))
                sums[q][1] += float(np.nansum(y))
            if ref is None:
                continue
            pairs = [(f"mb/{q}" if h.pairwise else f"held/{h.mode}/{q}", f"mb/{q}") for q in h.quantities
                     if f"mb/{q}" in ref] or [("reward", "reward"), ("entropy", "entropy")]
            rec["pairs"] += 1
            for mine, theirs in pairs:
                x, y = _at_step(s, mine, 1), _at_step(ref, theirs, 1)
                firsts += list(_relative_gap(np.array([x]), np.array([y])))
        rec["gap"] = max(gaps, default=math.nan)
        rec["first_gap"] = max(firsts, default=math.nan)
        rec["ratios"] = {q: a / b if b else math.nan for q, (a, b) in sums.items()}
        worst = max(max(gaps, default=0.0), max(firsts, default=0.0))
        rec["result"] = "not measured" if not gaps else "met" if worst <= h.tol else "NOT MET"
        records.append(rec)
    return records


def _aligned(s: dict, key_x: str, t: dict, key_y: str) -> tuple[np.ndarray, np.ndarray]:
    """The values of s[key_x] and t[key_y] at the steps both logged."""
    (sx, vx), (sy, vy) = s[key_x], t[key_y]
    common = np.intersect1d(sx, sy)
    return vx[np.searchsorted(sx, common)], vy[np.searchsorted(sy, common)]


def _at_step(s: dict, key: str, step: int) -> float:
    """s[key] at `step`, NaN if it was not logged there."""
    steps, values = s.get(key, (np.array([]), np.array([])))
    hit = np.flatnonzero(steps == step)
    return float(values[hit[0]]) if len(hit) else math.nan


def _relative_gap(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x - y| / |y| elementwise (0 where both are 0; inf where only y is 0; NaN stays NaN, as a gap of inf)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.where((x == y), 0.0, np.abs(x - y) / np.abs(y))
    return np.where(np.isnan(gap), np.inf, gap)


def held_table(rows: list[dict]) -> str:
    """The held-fixed checks as a markdown table: what, control vs reference, runs, the
    gaps, the control's quantities as a multiple of the reference's, result."""
    lines = ["| held fixed | control vs reference | runs | largest gap, same batch | largest gap, pairs' first step "
             "| control / reference | result |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        h = r["check"]
        gap = lambda g: "-" if not math.isfinite(g) and not (g == math.inf) else _fmt(g)
        ratios = ", ".join(f"{q} {_fmt(v)}" for q, v in r["ratios"].items()) or "-"
        first = f"{gap(r['first_gap'])} ({r['pairs']} pairs)" if r["pairs"] else "-"
        lines.append(f"| {h.text} | {h.arm} vs {h.reference} | {r['runs']} | {gap(r['gap']) if r['runs'] else '-'} | "
                     f"{first} | {ratios} | **{r['result']}** (tolerance {_fmt(h.tol)}) |")
    return "\n".join(lines) + "\n"


