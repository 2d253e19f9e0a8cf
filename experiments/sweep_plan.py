"""sweep_plan.py: what a sweep will cost before it runs, and how much of it is already done.

    python -m experiments.sweep plan    # plan_text(): the budget, minutes per run estimated and
                                        # measured, every part's command and how much of it is committed
    python -m experiments.sweep pilot   # a short run per sweep (sweep.py runs it); pilot_costs turns
                                        # its step times into the costs designs.TASKS holds

A sweep's plan is its runs: one RunSpec per (arm, warm-up seed, RL seed), with the train.py
flags run_args gives it, in the order (warm-up seed, RL seed, arm) in which sweep.plan_runs
lists them and select_part cuts them into the parts designs.TASKS declares (a part is one sitting on one machine, and holds whole
pairs: every arm of its seeds). Before any run starts, this file says what those runs cost
and which of them are done, from three sources:

The estimate (designs.TASKS). Minutes per run from the cost model, designs.estimate_minutes:
    start_s + steps x step_s + evaluations x n_eval x eval_samples x sample_s
and a part's wall minutes, its runs x minutes per run / JOBS (JOBS runs at a time).
registry.budget_table prints both for every sweep and task; plan_text adds a warning for a
part estimated over 90 minutes (longer than a sitting: raise its parts in TASKS).

The pilot (this machine, once). The cost model's numbers come from a pilot: `pilot`
(sweep.py) runs one short run per sweep, two at a time as a sweep runs them, and
pilot_costs reads the time each logged after every step (metrics.jsonl's time/elapsed)
into step_s, sample_s and start_s, to paste into TASKS (designs.py's header says how the
numbers there were taken from one). They hold for that machine under its load at the
time; on another machine, or beside other work, the same runs take longer or shorter.

The committed runs (experiments/results/). Each run `report` committed keeps its train.py
flags and the wall seconds train.py took, start to exit (sweep_TASK_NAME.jsonl.gz).
committed_records matches the plan against them (the same flags, --out_dir aside), so
plan_text marks each part's command with how many of its runs are committed ("done" when
all are), and a sweep skips those runs: a part cut short goes on elsewhere with an empty
runs/. committed_per_part averages their minutes, printed beside the estimate: how far the
estimate was off on the machines that ran them, with whatever else those machines ran.

sweep.py runs the plan and imports this file; this file imports nothing of sweep.py.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from experiments import pages
from experiments.designs import Sweep, estimate_minutes, eval_flags, settings
from experiments.registry import SWEEPS, budget_table, declared, wall_minutes

# ---------------------------------------------------------------------------------------
# The defaults the plan reads (sweep.py's --jobs and --results default to them): change them here.
# ---------------------------------------------------------------------------------------
JOBS = 2                          # train.py processes at a time (one torch thread each)
RESULTS = os.path.join("experiments", "results")   # `report` writes sweep_TASK_SWEEP.{md,png,jsonl.gz} and claims.md here


# ---------------------------------------------------------------------------------------
# 1. The runs of a sweep, its parts, and which runs are committed
# ---------------------------------------------------------------------------------------

@dataclass
class RunSpec:
    """One train.py run of a sweep."""

    sweep: str
    arm: str
    warmup_seed: int
    seed: int
    dir: str
    args: list[str]
    """train.py's arguments (without --resume)."""
    steps: int
    warmup: object | None
    """What the run starts from and must exist before it does: the embedded model's
    warmups.WarmupConfig (--model tiny), or --model's name or path (a hub model's is fetched
    and converted once, sweep.ensure_warmup), or None in tests that build specs by hand."""

    @property
    def label(self) -> str:
        return f"{self.sweep}/{self.arm}/warmup_{self.warmup_seed}/seed_{self.seed}"


def run_args(sweep: Sweep, arm: str, warmup_seed: int, seed: int, steps: int, out: str, extra: list[str],
             task: str) -> list[str]:
    """One run's train.py arguments, unchecked (sweep.plan_runs checks them)."""
    return ["--out_dir", pages.run_dir(out, task, sweep.name, arm, warmup_seed, seed), "--seed", str(seed),
            "--warmup_seed", str(warmup_seed), "--steps", str(steps), *eval_flags(task, sweep.name), "--threads", "1",
            *sweep.flags, *sweep.arms[arm], *extra]


def committed_records(runs: list[RunSpec], results: str, task: str) -> dict[str, dict]:
    """{label: its committed record} for the runs whose data is already committed
    (RESULTS/sweep_TASK_NAME.jsonl.gz) with the same train.py flags, --out_dir aside.

    A part stopped before it finished goes on later, on any machine and with an empty
    runs/, without running those again: `report` takes their numbers from the
    committed data. A run whose flags changed since is run again. The record carries the
    run's wall seconds, which `plan` reports beside its estimate.
    """
    records = {}
    for name in {r.sweep for r in runs}:
        committed = {(c.arm, c.warmup_seed, c.seed): c.record
                     for c in pages.read_run_data(os.path.join(results, f"sweep_{task}_{name}.jsonl.gz"))}
        for r in runs:
            record = committed.get((r.arm, r.warmup_seed, r.seed)) if r.sweep == name else None
            if record is not None and record.get("args") is not None \
                    and but_out_dir(record["args"]) == but_out_dir(r.args):
                records[r.label] = record
    return records


def select_part(runs: list[RunSpec], part: int, parts: int) -> list[RunSpec]:
    """The part-th (from 1) of `parts` contiguous, near-equal slices of the plan.

    The plan is ordered (warm-up seed, seed, arm), so a slice holds one warm-up seed's runs
    (or part of them): parts = 2 with 2 warm-up seeds is one warm-up seed each; a design's
    parts are sized so that each holds whole pairs (every arm of a seed), which then run
    on one machine. Sizes differ by at most one run. Example: 10 runs in 3 parts -> 4, 3, 3.
    """
    size, extra = divmod(len(runs), parts)
    start = (part - 1) * size + min(part - 1, extra)
    return runs[start:start + size + (part <= extra)]


# ---------------------------------------------------------------------------------------
# 2. The cost model's numbers, from a pilot
# ---------------------------------------------------------------------------------------

def pilot_costs(runs: list[RunSpec], results: dict) -> dict:
    """The cost model's numbers from short pilot runs (one per sweep, two at a time, as a sweep runs).

    From each run's metrics.jsonl (time/elapsed after every step): step_s = the mean
    step-to-step time of the steps without an evaluation but the first (which pays one-time
    costs), so the token diagnostics' steps count at the rate they have in a full run; an
    evaluation costs the extra time of the steps with one over step_s, per sample (n_eval x
    eval_samples); start_s = the process's wall time minus the loop's.
    runs: the pilot's RunSpecs, finished; results: sweep.execute's {label: result} for them
    (its "seconds", train.py's start to exit). Returns {sweep: {"step_s", "sample_s", "start_s"}}.
    """
    costs = {}
    for run in runs:
        rows = [json.loads(line) for line in open(os.path.join(run.dir, "metrics.jsonl")) if line.strip()]
        elapsed = [r["time/elapsed"] for r in rows]
        times = [b - a for a, b in zip([0.0, *elapsed], elapsed)]
        plain = [t for t, r in zip(times[1:], rows[1:]) if "eval/pass@1" not in r]
        step_s = sum(plain) / len(plain)
        evals = [t - step_s for t, r in zip(times, rows) if "eval/pass@1" in r]
        samples = int(run.args[run.args.index("--n_eval") + 1]) * int(run.args[run.args.index("--eval_samples") + 1])
        costs[run.sweep] = {"step_s": step_s, "sample_s": sum(evals) / len(evals) / samples if evals else math.nan,
                            "start_s": results[run.label]["seconds"] - elapsed[-1]}
    return costs


# ---------------------------------------------------------------------------------------
# 3. The plan: the estimate, the measurement beside it, and what is done
# ---------------------------------------------------------------------------------------

def committed_per_part(task: str, name: str, results: str) -> tuple[list[tuple[int, int]], float | None]:
    """([(committed, runs)] for each part of a sweep, the mean minutes of a committed run).

    A run counts when its data is committed in `results` with the flags the design gives it
    today (committed_records, on the runs' arguments unchecked: planning every run through
    train.py's checks would take half a minute). Its minutes are train.py's start to exit
    as the record holds them; None when no committed run has them.
    """
    spec, steps, parts = SWEEPS[name](task), settings(task, name)["steps"], settings(task, name)["parts"]
    runs = [RunSpec(name, arm, w, seed, "", run_args(spec, arm, w, seed, steps, "OUT", [], task), steps, None)
            for w in spec.warmup_seeds for seed in spec.seeds for arm in spec.arms]
    committed = committed_records(runs, results, task)
    seconds = [rec["seconds"] for rec in committed.values() if rec.get("seconds")]
    counts = [(sum(r.label in committed for r in part), len(part))
              for part in (select_part(runs, k, parts) for k in range(1, parts + 1))]
    return counts, (sum(seconds) / len(seconds) / 60 if seconds else None)


def plan_text(tasks: list[str], results: str = RESULTS) -> str:
    """The budget table (registry.budget_table), the minutes per run measured on the
    committed runs beside their estimate, and the command of every part, per task, each
    with how many of its runs are committed in `results` (a finished part says "done")."""
    lines = [budget_table(), ""]
    long = [f"{name} on {task}" for task, name in declared(tasks)
            if wall_minutes(task, name, JOBS) / settings(task, name)["parts"] > 90]
    if long:
        lines += [f"WARNING: parts estimated over 90 min ({', '.join(long)}): raise their parts in designs.TASKS", ""]
    committed = {(task, name): committed_per_part(task, name, results) for task, name in declared(tasks)}
    lines += ["Minutes per run, estimated and measured (the committed runs, train.py start to exit; "
              f"{JOBS} at a time):",
              "    sweep       task       committed  estimate  measured"]
    for (task, name), (counts, minutes) in committed.items():
        measured = f"{minutes:>9.1f}" if minutes is not None else f"{'-':>9}"
        lines.append(f"    {name:<11} {task:<10} {sum(c for c, _ in counts):>4} of {sum(n for _, n in counts):<3}"
                     f"{estimate_minutes(task, name):>9.1f} {measured}")
    lines += ["", "Commands, one sitting each; after each: python -m experiments.sweep report, then commit "
              "experiments/results/, README.md and docs/results.md:"]
    for task, name in committed:
        parts = settings(task, name)["parts"]
        base = f"python -m experiments.sweep {name} --task {task}"
        for k, (done, n) in enumerate(committed[task, name][0], start=1):
            status = "done" if done == n else f"{done} of {n} runs committed" if done else ""
            command = base + (f" --part {k}/{parts}" if parts > 1 else "")
            lines.append(f"    {command:<66}  # {status}" if status else f"    {command}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def but_out_dir(args: list[str]) -> list[str]:
    """train.py arguments without '--out_dir DIR': the same run moved to another directory or
    machine is still the same run (committed_records here, sweep.run_state for a run directory)."""
    i = args.index("--out_dir") if "--out_dir" in args else len(args)
    return args[:i] + args[i + 2:]
