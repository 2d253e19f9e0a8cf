"""pages.py: a sweep's page, from the runs on disk and the committed data; `report` rebuilds them all.

    python -m experiments.sweep report      # rebuild experiments/results/: sweep_TASK_NAME.{md,png,jsonl.gz}, claims.md; the README's summary

Where the numbers come from. A run's metrics live in its run directory
(OUT/TASK/NAME/ARM/warmup_W/seed_S, machine-local, not committed) and, once `report` has
seen it, in experiments/results/sweep_TASK_NAME.jsonl.gz (the study's wing; docs/ is the
lesson's): per run, one line with its record (the
train.py flags it ran with, the hash of the weights it started from, its wall time,
when and where it finished), then its metrics lines (timings left out but the elapsed
time). `report` merges the two, run by run (the run directory wins for a run found in
both), so a sweep can be run in parts on different machines: each part's runs are
committed in the data file, and a fresh clone with an empty runs/ rebuilds every page,
the study's claims.md and the README byte for byte.

Which runs count. All the runs of a page must come from one design: the same train.py
flags but the run's own (directory, seeds) and its arm's. Runs whose flags differ from
the NEWEST run's (an earlier design of the sweep, changed since) are set aside: report
prints how many, and they leave the data file (git keeps them), so the page, rebuilt from
that file, stays the same from one rebuild to the next. Data committed before the
flags were recorded ("earlier design") is shown on its page with today's claims, but the
README gives it no verdict: it is not the test the claims were declared with.

What a page says (write_page): the command, dates, machine, run time, the flags of a
run, the arms, the hash of each warm-up seed's starting weights, the evaluation noise,
the implementation checks (measured against their exact expectation: pass or FAIL), the
findings (experiments/claims.py: paired exact tests, Holm's correction over this sweep
on this task), the sentences they test, the per-run numbers, and the curves.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import math
import os
import platform
import shlex
import time
from dataclasses import dataclass

import numpy as np

from experiments import claims as claims_lib
from experiments import held_fixed, quantities
from experiments.designs import TASKS, Sweep, eval_flags, runs_on, settings
from experiments.registry import SWEEPS
from experiments.summaries import CLAIMS_PAGE, write_claims_page, write_findings_block, write_readme_tables
from tools import plot_runs


@dataclass
class RunData:
    """One finished run of a sweep: its key, its metrics rows and its record."""

    arm: str
    warmup_seed: int
    seed: int
    rows: list[dict]
    """metrics.jsonl's lines (step and metrics), timings left out but time/elapsed."""
    record: dict
    """{"args": train.py's flags or None (not recorded), "start": {"sha256", "model_path"} or None,
    "seconds": wall time or None, "finished": ISO time or None, "machine": str or None}."""

    @property
    def key(self) -> tuple[int, int]:
        return self.warmup_seed, self.seed

    @property
    def label(self) -> str:
        return f"{self.arm}/warmup_{self.warmup_seed}/seed_{self.seed}"


def run_dir(out: str, task: str, name: str, arm: str, warmup_seed: int, seed: int) -> str:
    """OUT/TASK/NAME/ARM/warmup_W/seed_S: where train.py writes one run of a sweep."""
    return os.path.join(out, task, name, arm, f"warmup_{warmup_seed}", f"seed_{seed}")


# ---------------------------------------------------------------------------------------
# 1. Runs from disk, runs from the committed data, and the merge
# ---------------------------------------------------------------------------------------

def keep_metric(key: str) -> bool:
    """What the committed data keeps of a metrics line: everything but the timings (time/elapsed stays)."""
    return not key.startswith("time/") or key == "time/elapsed"


def local_runs(out: str, task: str, sweep: Sweep) -> list[RunData]:
    """The finished runs (done.json) of a sweep's arms under OUT/TASK/NAME, in plan order."""
    found = []
    root = os.path.join(out, task, sweep.name)
    for arm in sweep.arms:
        for w_dir in _numbered(os.path.join(root, arm), "warmup_"):
            for s_dir in _numbered(os.path.join(root, arm, w_dir), "seed_"):
                d = os.path.join(root, arm, w_dir, s_dir)
                done = read_json(os.path.join(d, "done.json"))
                if done is None:
                    continue
                with open(os.path.join(d, "metrics.jsonl")) as f:     # training steps; the start is in the record
                    rows = [{k: v for k, v in row.items() if keep_metric(k)}
                            for row in map(json.loads, filter(str.strip, f)) if row["step"] != 0]
                found.append(RunData(arm, int(w_dir[len("warmup_"):]), int(s_dir[len("seed_"):]), rows, {
                    "args": (read_json(os.path.join(d, "sweep_args.json")) or {}).get("args"),
                    "start": start_record(d), "seconds": done.get("seconds"),
                    "finished": done.get("finished") or now(os.path.getmtime(os.path.join(d, "done.json"))),
                    "machine": machine(with_load=False)}))
    return found


def start_record(d: str) -> dict | None:
    """What the run started from (train.py's start.json): {"sha256", "model_path"}, "code" (the
    commit that ran and whether its tree was clean) where train.py recorded it, and, when
    train.py evaluated the start, "eval" (its held-out pass@k); None without a start.json."""
    start = read_json(os.path.join(d, "start.json"))
    if not start:
        return None
    record = {"sha256": start.get("sha256") or start.get("weights_sha256"), "model_path": start.get("model_path")}
    if isinstance(start.get("code"), dict):
        record["code"] = start["code"]
    if isinstance(start.get("float_path"), str):
        record["float_path"] = start["float_path"]
    return {**record, "eval": start["eval"]} if isinstance(start.get("eval"), dict) else record


def read_run_data(path: str) -> list[RunData]:
    """The runs in a committed data file (write_run_data's format); [] if there is none.

    Data written before runs carried a record (no "run" lines, no warm-up seed) reads as
    warm-up seed 0 with an empty record: an earlier design.
    """
    if not os.path.isfile(path):
        return []
    runs: dict[tuple, RunData] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            obj = json.loads(line)
            arm, w, s = obj.pop("arm"), int(obj.pop("warmup_seed", 0)), int(obj.pop("seed"))
            run = runs.setdefault((arm, w, s), RunData(arm, w, s, [], dict(EMPTY_RECORD)))
            if "run" in obj:
                run.record = obj["run"]
            else:
                run.rows.append(obj)
    return list(runs.values())


EMPTY_RECORD = {"args": None, "start": None, "seconds": None, "finished": None, "machine": None}


def write_run_data(runs: list[RunData], path: str) -> str:
    """Write the runs as gzipped JSON lines: per run its record line, then its metrics lines.

    {"arm", "warmup_seed", "seed", "run": record} then {"arm", "warmup_seed", "seed", **row}
    per metrics line. The gzip header holds no time and no file name, and the order is
    the runs' order, so the same runs give the same bytes: a rebuilt page is no change in
    git. Atomic.
    """
    with open(path + ".tmp", "wb") as raw, io.TextIOWrapper(gzip.GzipFile("", "wb", fileobj=raw, mtime=0)) as out:
        for r in runs:
            head = {"arm": r.arm, "warmup_seed": r.warmup_seed, "seed": r.seed}
            out.write(json.dumps({**head, "run": r.record}) + "\n")
            for row in r.rows:
                out.write(json.dumps({**head, **row}) + "\n")
    os.replace(path + ".tmp", path)
    return path


def merge(committed: list[RunData], local: list[RunData], sweep: Sweep) -> list[RunData]:
    """One run per (arm, warm-up seed, seed), the run directory's over the committed one,
    in plan order (arms as the sweep lists them, then warm-up seed, then seed); runs of arms
    the sweep no longer has are left out."""
    by_key = {(r.arm, *r.key): r for r in committed}
    by_key.update({(r.arm, *r.key): r for r in local})
    order = {arm: i for i, arm in enumerate(sweep.arms)}
    return sorted((r for r in by_key.values() if r.arm in order), key=lambda r: (order[r.arm], r.key))


def design(run: RunData, sweep: Sweep) -> tuple | None:
    """What must be equal for two runs to be comparable: their flags without the run's own
    (--out_dir, --seed, --warmup_seed) and without its arm's flags. None: not recorded."""
    args = run.record.get("args")
    if args is None:
        return None
    args = list(args)
    for flag in ("--out_dir", "--seed", "--warmup_seed"):
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    arm_flags = sweep.arms.get(run.arm, [])
    for i in range(len(args) - len(arm_flags) + 1):
        if arm_flags and args[i:i + len(arm_flags)] == arm_flags:
            return tuple(args[:i] + args[i + len(arm_flags):])
    return tuple(args) if not arm_flags else ("arm flags changed", run.arm, *args)


def one_design(runs: list[RunData], sweep: Sweep) -> tuple[list[RunData], list[RunData], bool]:
    """(runs of the newest run's design, runs set aside, whether that design was recorded).

    Newest: the latest "finished" time among the runs with recorded flags; runs without a
    record count only when no run has one.
    """
    recorded = [r for r in runs if r.record.get("args") is not None]
    if not recorded:
        return runs, [], False
    newest = design(max(recorded, key=lambda r: r.record.get("finished") or ""), sweep)
    kept = [r for r in runs if design(r, sweep) == newest]
    return kept, [r for r in runs if design(r, sweep) != newest], True


# ---------------------------------------------------------------------------------------
# 2. A page: checks, findings, per-run numbers, curves
# ---------------------------------------------------------------------------------------

def judge_runs(sweep: Sweep, runs: list[RunData]) -> tuple[list[dict], list[dict], dict, dict]:
    """(verdicts, checks, values, series by arm) of a sweep's runs.

    values: {(row label, arm): {(warmup_seed, seed): number}}. Claims whose arms have no
    run are left out (a subset of arms was run).
    """
    series = {r.label: with_start(plot_runs.series_from_rows(r.rows), r.record) for r in runs}
    arms = [a for a in sweep.arms if any(r.arm == a for r in runs)]
    by_arm = {a: [r for r in runs if r.arm == a] for a in arms}
    values = {(label, a): {r.key: fn(series[r.label]) for r in by_arm[a]} for label, fn, _ in sweep.rows for a in arms}
    arm_series = {a: [series[r.label] for r in by_arm[a]] for a in arms}
    refs = lambda c: c.reference if isinstance(c.reference, tuple) else (c.reference,)
    claims = [c for c in sweep.claims if c.arm in arms and all(r is None or r in arms for r in refs(c))
              and all(m in arms for m in (c.minus or ()))]
    checks = claims_lib.run_checks([c for c in sweep.checks if any(a in arms for a in c.arms)], values)
    checks += held_fixed.run_held([h for h in sweep.held if h.arm in arms],
                                  {(r.arm, r.key): series[r.label] for r in runs})
    cpus = {(r.arm, r.key): cpu_model(r.record) for r in runs}
    verdicts = claims_lib.judge(claims, values, arm_series, checks, cpus, one_family=sweep.holm == "sweep")
    return verdicts, checks, values, arm_series


def cpu_model(record: dict) -> str | None:
    """What decides a run's float rounding: the CPU model of its record ('AMD EPYC' of 'nproc 2,
    AMD EPYC, Linux x86_64') and, where start.json recorded it, torch's CPU kernels ('AMD EPYC,
    AVX2'): one CPU model name covers EPYCs with and without AVX-512, whose sums round
    differently (a run of the recentred sweep, AVX-512, and the same run here, AVX2, part at
    step 1's gradient norm in the 6th digit). A run recorded without kernels is a different
    float path from one recorded with them: such a pair is never assumed to match. None if
    nothing is recorded."""
    parts = (record.get("machine") or "").split(", ")
    if len(parts) < 2:
        return None
    path = (record.get("start") or {}).get("float_path")
    return parts[1] + (f", {path}" if path else "")


def with_start(series: dict, record: dict) -> dict:
    """The run's series plus its start's held-out evaluation as "start/<key>" at step 0 (from
    the record's start.json), for the rows that compare the end with the start
    (quantities.at_start, collapsed). Separate keys: no curve or other row sees them."""
    start_eval = (record.get("start") or {}).get("eval") or {}
    extra = {quantities.START + k: (np.array([0]), np.array([float(v)])) for k, v in start_eval.items()
             if isinstance(v, (int, float))}
    return {**series, **extra}


def write_page(sweep: Sweep, task: str, runs: list[RunData], md_path: str, png_path: str, meta: dict) -> dict:
    """Write the page (markdown) and its curves (PNG) for a sweep's runs; returns
    {"verdicts", "checks", "planned", "done", "recorded"} for the README.

    meta: {"command": the sweep's command, "parts": how many parts it runs in (default 1),
    "note": extra lines (this invocation's timing, runs set aside), "recorded": whether the
    runs' flags were recorded (False: an earlier design)}.
    """
    verdicts, checks, values, arm_series = judge_runs(sweep, runs)
    arms = [a for a in sweep.arms if any(r.arm == a for r in runs)]
    planned = [(a, w, s) for a in sweep.arms for w in sweep.warmup_seeds for s in sweep.seeds]
    done = sum((r.arm, *r.key) in set(planned) for r in runs)
    finished = sorted(r.record["finished"] for r in runs if r.record.get("finished"))
    machines = sorted({r.record["machine"] + (f", {(r.record.get('start') or {}).get('float_path')} kernels"
                                               if (r.record.get("start") or {}).get("float_path") else "")
                       for r in runs if r.record.get("machine")})
    seconds = [r.record["seconds"] for r in runs if r.record.get("seconds") is not None]
    lines = [f"# Sweep `{sweep.name}` on {task}", "", f"About: {sweep.claim}", ""]
    if not meta["recorded"] and runs:
        lines += ["**Earlier design.** These runs were committed before each run's flags were recorded: one "
                  "warm-up, RL seeds only, the claims of that time. Their numbers are judged below with today's "
                  "checks and claims, but this is not the test the claims were declared with, and the README "
                  "shows no verdict for it.", ""]
    parts = meta.get("parts", 1)
    lines += [f"- Command: `{meta['command']}`" + (f" for K = 1..{parts}" if parts > 1 else "")
              + "; this page: `python -m experiments.sweep report`",
              (f"- Runs: {done} of {len(planned)} planned ({len(sweep.arms)} arms x warm-up seeds "
               f"{_list(sweep.warmup_seeds)} x RL seeds {_list(sweep.seeds)})"
               + ("" if done >= len(planned) else "; INCOMPLETE: the findings are not the declared test yet")
               + (f"; {len(runs) - done} more outside the plan" if len(runs) > done else ""))
              if meta["recorded"] else f"- Runs: {len(runs)}, of an earlier design",
              f"- Finished: {finished[0]} to {finished[-1]}" if finished else "- Finished: not recorded",
              f"- Machine: {'; '.join(machines) or 'not recorded'}",
              f"- Run time: {sum(seconds) / 60:.1f} process-minutes over {len(seconds)} runs (train.py start to exit)"
              if seconds else "- Run time: not recorded",
              *[f"- {line}" for line in meta.get("note", [])],
              "- Each run: " + run_command(sweep, task, runs, meta["recorded"]),
              "- Arms: " + "; ".join(f"**{a}** `{shlex.join(sweep.arms[a]) or '(sweep flags only)'}`"
                                     for a in sweep.arms),
              "- Starting weights (sha256 of each warm-up seed's, train.py's start.json): " + start_hashes(runs),
              "- Evaluation noise: " + eval_noise(task, sweep, values), ""]
    identities = [c for c in checks if c["check"].kind == "identity"]
    preconditions = [c for c in checks if c["check"].kind == "precondition"]
    held = [c for c in checks if c["check"].kind == "held fixed"]
    # A family's size for Holm is every finding declared in it (claims.judge's "family": a
    # not-testable one enters with p = 1), so the page gives it and how many were testable:
    # a reader can redo the correction from them.
    families = {}                                # family -> (declared, testable)
    for v in verdicts:
        family = "" if sweep.holm == "sweep" else v["claim"].family
        declared, testable = families.get(family, (v["family"], 0))
        families[family] = (declared, testable + (v["verdict"] != "not testable"))
    named = lambda f: f or ("the papers" if len(families) > 1 else "this sweep on this task")
    family_text = (("Holm's families: " if len(families) > 1 else "Holm's family: ")
                   + ", ".join(f"{named(f)} ({m} declared, {k} testable)" for f, (m, k) in families.items())
                   + (" (one family per sweep: the reading declared for these runs; the declared families' "
                      "in the last column)" if sweep.holm == "sweep" else "")
                   if verdicts else "No findings on these arms")
    posthoc = any(v["claim"].posthoc for v in verdicts)
    lines += ["## Implementation checks", "",
              "Identities the code must satisfy whatever the training does, measured on every run of the arms "
              "named and compared with the exact expectation. Not evidence for the papers.", "",
              claims_lib.check_table(identities) if identities else "None measured.\n"]
    if preconditions:
        lines += ["## Preconditions", "",
                  "What a finding needs of the training (manipulation checks), measured on every run of the arms "
                  "named: met or NOT MET. The training decides them, not the code; a finding whose precondition is "
                  "not met measures something else (its reading says what).", "",
                  claims_lib.check_table(preconditions)]
    if held:
        lines += ["## Held fixed", "",
                  "What a control arm holds equal to its reference, declared with the design and measured: what "
                  "carries gradient in each optimizer step (rollouts and prompts with an advantage not 0, and the "
                  "sum of |A|), the control's own against its reference's rule on the same batch at every step of "
                  "every run, and on each pair's first step (the same batch in both runs) against the reference "
                  "run itself. A finding that needs a check that is not met is not testable.", "",
                  held_fixed.held_table(held)]
    lines += ["## Findings", "",
              f"Each claim was written before the runs ({design_file(sweep)}), quoting the sentence it tests"
              + (", except those marked *re-read*: restated after their runs were public, read again on the same "
                 "runs (not a test declared before its data)" if posthoc else "") + ". "
              f"Runs are paired by (warm-up seed, RL seed); each test is exact (experiments/claims.py). "
              f"{family_text}; significant at p (Holm) < {claims_lib.ALPHA}. \"floor\": the smallest p the "
              f"test can give with n pairs (2/2^n two-sided, 1/2^n for TOST). 80%-power effect: the true effect "
              f"the test would find in 80% of repetitions at level {claims_lib.ALPHA}/m, given the observed "
              f"spread of the differences.", "",
              claims_lib.verdict_table(verdicts, other_reading(sweep, verdicts)) if verdicts
              else "None testable with these arms.\n",
              "## Per-run numbers", "",
              "Cells: mean ± SE over runs [per run, in the order of the header]; SE = std(ddof=1)/sqrt(n); "
              "(n=k): only k runs have a number.", ""]
    keys = {a: [r.key for r in runs if r.arm == a] for a in arms}
    header = ["quantity"] + [f"{a} ({_keys(keys[a])})" for a in arms]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, _, _ in sweep.rows:
        lines.append("| " + " | ".join([label] + [cell([values[label, a][k] for k in keys[a]]) for a in arms]) + " |")
    lines += ["", "Quantities:", *[f"- {label}: {how}" for label, _, how in sweep.rows], "",
              f"Curves (mean ± SE over runs): ![curves]({os.path.basename(png_path)})", ""]
    text = "\n".join(lines) + "\n"
    with open(md_path + ".tmp", "w") as f:
        f.write(text)
    os.replace(md_path + ".tmp", md_path)
    if runs:
        plot_curves(sweep, task, arms, arm_series, png_path)
    return {"verdicts": verdicts, "checks": checks, "planned": len(planned), "done": done,
            "recorded": meta["recorded"]}


def run_command(sweep: Sweep, task: str, runs: list[RunData], recorded: bool) -> str:
    """train.py's command of every run, the per-run flags as placeholders: the runs' own
    recorded flags (their design); for runs without recorded flags, only the budget their
    metrics show (today's plan may differ, so it is not printed as theirs)."""
    own = ["--out_dir", "OUT/TASK/NAME/ARM/warmup_W/seed_S", "--seed", "S", "--warmup_seed", "W"]
    if recorded and runs:
        flags = design(runs[0], sweep)
        return f"`python train.py {shlex.join([*own, *flags])} ARM-FLAGS`" + repeated_flags(flags)
    if not runs:
        s = settings(task, sweep.name)
        planned = [*own, "--steps", str(s["steps"]), *eval_flags(task, sweep.name), "--threads", "1", *sweep.flags]
        return f"`python train.py {shlex.join(planned)} ARM-FLAGS` (as planned; no run yet)"
    # Flags not recorded: today's plan may have another budget, so say only what the runs'
    # own metrics show (their last step and evaluation spacing), never today's flags.
    last = sorted({max(int(row["step"]) for row in r.rows) for r in runs})
    evals = sorted({int(row["step"]) for r in runs for row in r.rows if "eval/pass@1" in row})
    spacing = sorted({b - a for a, b in zip(evals, evals[1:])})
    return (f"flags not recorded; read from the runs' metrics: {_list(last)} steps, held-out evaluation every "
            f"{_list(spacing) or '?'} steps (today's plan: `python -m experiments.sweep plan`)")


def repeated_flags(flags) -> str:
    """' (--lr is given 2 times: train.py takes the last, 3e-5)' for each flag the command repeats, else ''.

    A sweep's flags are its task's recipe followed by its own, so a sweep that changes a
    recipe setting (the masked sweep's lr on SmolLM2) repeats that flag. The command is
    printed as the runs recorded it; this note says which value ran (argparse, which
    machinery/config.py's parse_args uses, keeps the last), so that a reader does not
    take the first one for the run's."""
    last, count = {}, {}
    for i, token in enumerate(flags):
        if token.startswith("--"):
            count[token] = count.get(token, 0) + 1
            following = flags[i + 1] if i + 1 < len(flags) else None
            last[token] = following if following is not None and not following.startswith("--") else "(set)"
    notes = [f"{flag} is given {count[flag]} times: train.py takes the last, {last[flag]}"
             for flag in count if count[flag] > 1]
    return f" ({'; '.join(notes)})" if notes else ""


def start_hashes(runs: list[RunData]) -> str:
    """One hash per warm-up seed ('warm-up 0: 3f2a9c01d4e5 (12 runs)'), all of them if the runs disagree."""
    parts = []
    for w in sorted({r.warmup_seed for r in runs}):
        hashes = [(r.record.get("start") or {}).get("sha256") for r in runs if r.warmup_seed == w]
        known = sorted({h for h in hashes if h})
        text = " / ".join(h[:12] for h in known) or "not recorded"
        if len(known) > 1:
            text += " (DIFFERENT STARTS)"
        parts.append(f"warm-up {w}: {text} ({len(hashes)} runs" +
                     (f", {hashes.count(None)} not recorded)" if known and None in hashes else ")"))
    return "; ".join(parts) or "no runs"


def eval_noise(task: str, sweep: Sweep, values: dict) -> str:
    """The sampling SE of held-out pass@1 given the held-out set: at most sqrt(p(1-p) / (prompts x samples)).

    p: the mean final pass@1 of the runs (0.5 if none). Also for a paired difference
    (x sqrt(2)) and for the mean over the design's pairs (x sqrt(2 / pairs)).
    """
    s = settings(task, sweep.name)
    finals = [v for (label, _), runs in values.items() if label == "final pass@1" for v in runs.values()
              if math.isfinite(v)]
    p = float(np.mean(finals)) if finals else 0.5
    samples = s["n_eval"] * s["eval_samples"]
    se = math.sqrt(p * (1 - p) / samples)
    pairs = len(sweep.warmup_seeds) * len(sweep.seeds)
    return (f"held-out pass@1 averages {s['n_eval']} prompts x {s['eval_samples']} samples; its sampling SE is at "
            f"most sqrt(p(1-p)/{samples}) = {fmt(se)} at p = {fmt(p)} (the runs' mean final pass@1), "
            f"{fmt(se * math.sqrt(2))} for a paired difference, {fmt(se * math.sqrt(2 / pairs))} for the mean "
            f"over {pairs} pairs")


def cell(values: list[float]) -> str:
    """"mean ± SE [v0 v1 ...]" (with "(n=k)" when only k of the values are numbers)."""
    m, se, n = mean_se(values)
    if n == 0:
        return "-"
    text = f"{fmt(m)} ± {fmt(se)} [{' '.join(fmt(v) for v in values)}]"
    return text + (f" (n={n})" if n < len(values) else "")


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


def fmt(x: float) -> str:
    """3 significant digits (whole numbers from 100 up), '-' for a missing number."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def curve_mean_se(runs_series: list[dict], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, SE) over runs of one key, on the steps that every run logged."""
    have = [s[key] for s in runs_series if key in s]
    if not have:
        return np.array([]), np.array([]), np.array([])
    steps = have[0][0]
    for st, _ in have[1:]:
        steps = np.intersect1d(steps, st)
    value_at = [dict(zip(st.tolist(), v)) for st, v in have]          # per run: step -> value, built once
    table = np.array([[run[x] for x in steps.tolist()] for run in value_at])
    stats = [mean_se(col) for col in table.T]
    return steps, np.array([s[0] for s in stats]), np.array([s[1] for s in stats])


def plot_curves(sweep: Sweep, task: str, arms: list[str], arm_series: dict, path: str) -> None:
    """One panel per curve of the sweep: each arm's mean over runs with a ± SE band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(sweep.curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 3.3 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, sweep.curves):
        for j, arm in enumerate(arms):
            steps, mean, se = curve_mean_se(arm_series[arm], key)
            if not len(steps):
                continue
            ax.plot(steps, mean, color=f"C{j}", lw=1.3, label=f"{arm} (n={len(arm_series[arm])})",
                    marker="o" if key.startswith("eval/") else None, ms=2.5)
            ax.fill_between(steps, mean - np.nan_to_num(se), mean + np.nan_to_num(se), color=f"C{j}", alpha=0.2, lw=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(sweep.curves):]:
        ax.axis("off")
    fig.suptitle(f"sweep {sweep.name} on {task}: mean ± SE over runs", y=0.998)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def verdict_record(r: dict) -> dict:
    """A verdict as plain JSON (verdicts.json)."""
    c = r["claim"]
    return {"paper": c.paper, "claim": c.text, "quote": c.quote, "row": c.row, "arm": c.arm,
            "reference": r["reference"], "direction": c.direction, "margin": c.margin, "n": r["n"],
            "effect": r["effect"], "se": r["se"], "p": r["p"], "p_holm": r["p_holm"], "floor": r["floor"],
            "family": r["family"], "power80": r["power80"], "verdict": r["verdict"], "detail": r["detail"]}


# ---------------------------------------------------------------------------------------
# 3. report: every page, the data files, the claims page, the README's summary
# ---------------------------------------------------------------------------------------

def report(out: str, results: str, readme: str, prose: str) -> list[str]:
    """Rebuild every sweep's page from its runs (committed data merged with OUT's finished
    runs), rewrite its data file, write claims.md beside them, replace the README's summary
    and the study prose's block of every finding's numbers (`prose`, docs/results.md,
    summaries.write_findings_block). Returns the paths written.

    Every path is an argument without a default (sweep.py's --readme and --prose hold the
    repository's): a caller that forgets one, a test in a temporary folder, gets a TypeError,
    not the repository's README or docs/results.md rewritten with its tiny sweep's numbers.

    A sweep with neither committed data nor finished runs is skipped (its README cells
    read "not run"). Pages are dated by their runs, not by the rebuild, so a rebuild with
    the same runs writes the same bytes.
    """
    written, outcomes = [], {}
    os.makedirs(results, exist_ok=True)
    for task in TASKS:
        for name, make in SWEEPS.items():
            if not runs_on(task, name):
                continue
            sweep, data_path = make(task), os.path.join(results, f"sweep_{task}_{name}.jsonl.gz")
            runs = merge(read_run_data(data_path), local_runs(out, task, sweep), sweep)
            if not runs:
                continue
            runs, set_aside, recorded = one_design(runs, sweep)
            if set_aside:   # said here, not on the page: they leave the data file, so a rebuild could not say it again
                print(f"{task}/{name}: set aside {len(set_aside)} runs whose flags differ from the newest run's "
                      f"({', '.join(r.label for r in set_aside[:4])}{', ...' if len(set_aside) > 4 else ''}); "
                      f"they leave {data_path} (git keeps them)")
            md, png = (os.path.join(results, f"sweep_{task}_{name}.{ext}") for ext in ("md", "png"))
            parts = settings(task, name)["parts"]
            outcomes[task, name] = write_page(sweep, task, runs, md, png, {
                "command": f"python -m experiments.sweep {name} --task {task}" + (f" --part K/{parts}" if parts > 1 else ""),
                "parts": parts, "recorded": recorded})
            written += [md, png, write_run_data(runs, data_path)]
    written.append(write_claims_page(os.path.join(results, CLAIMS_PAGE), outcomes))
    if os.path.isfile(readme):
        written.append(write_readme_tables(readme, outcomes, os.path.join(results, CLAIMS_PAGE)))
    if os.path.isfile(prose):
        written.append(write_findings_block(prose, outcomes))
    return written


def other_reading(sweep: Sweep, verdicts: list[dict]) -> str | None:
    """Which other reading of Holm the verdict table shows beside the primary one: "sweep"
    (one family per sweep, where the sweep declared several families), "declared" (the
    declared families, where the sweep reads one family per sweep), or None (they coincide)."""
    if sweep.holm == "sweep":
        return "declared" if len({v["claim"].family for v in verdicts}) > 1 else None
    return "sweep" if len({v["claim"].family for v in verdicts}) > 1 else None


def design_file(sweep: Sweep) -> str:
    """The file that declares the sweep: 'experiments/designs_fade.py'."""
    return sweep.declared_in or SWEEPS[sweep.name].__module__.replace(".", "/") + ".py"


# ---------------------------------------------------------------------------------------
# Helpers (sweep.py uses them too)
# ---------------------------------------------------------------------------------------

def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def now(timestamp: float | None = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if timestamp is None else timestamp).astimezone() \
        .isoformat(timespec="seconds")


def machine(with_load: bool = True) -> str:
    """'nproc N, CPU model, OS arch[, load average at start a b c]' (the box is shared: the load says how much)."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return f"nproc {os.cpu_count()}, {model}, {platform.system()} {platform.machine()}" \
        + (f", load average at start {load}" if with_load else "")


def _numbered(path: str, prefix: str) -> list[str]:
    """Entries of `path` named PREFIX<int>, in numeric order ([] if path is no directory)."""
    if not os.path.isdir(path):
        return []
    names = [d for d in os.listdir(path) if d.startswith(prefix) and d[len(prefix):].isdigit()]
    return sorted(names, key=lambda d: int(d[len(prefix):]))


def _list(xs) -> str:
    return ",".join(str(x) for x in xs)


def _keys(keys: list[tuple[int, int]]) -> str:
    """'w0: s0-4, w1: s0-4' for the runs of one arm."""
    by_w = {}
    for w, s in keys:
        by_w.setdefault(w, []).append(s)
    return ", ".join(f"w{w}: s{_list(ss)}" for w, ss in sorted(by_w.items())) or "-"
