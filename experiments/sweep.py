"""sweep.py: run the papers' claims as sweeps (arms x seeds), judge them, write the reports.

    python -m experiments.sweep advantages                       # countdown, 7 arms x 6 seeds
    python -m experiments.sweep batching --task addition         # the same on the addition task
    python -m experiments.sweep advantages --seeds 0,1 --steps 60 --arms grpo,psr
    python -m experiments.sweep all --jobs 2                     # the four sweeps in one pool of processes
    python -m experiments.sweep report                           # docs/sweep_*.md and the README's claim table

The sweeps themselves (arms, table rows, curves, and the claims written before the
runs) are in experiments/sweeps.py; how a claim is judged (exact tests, Holm's
correction, the minimum detectable effect) in experiments/claims.py. This file runs them.

A sweep is a set of ARMS, train.py flag sets that differ in one design choice, each run
with several SEEDS. The seed is the RL seed (prompt order, token sampling, mini-batch
shuffles, evaluation samples); the starting checkpoint is the SAME for every run: the
embedded model's cached warm-up for the task (tinymodel.py), trained once with its own
fixed seed. So the spread over seeds is the spread of RL from one checkpoint.

Running. Each run is one `train.py` process with one torch thread (OMP_NUM_THREADS=1,
--threads 1); --jobs of them run at a time (2 for the 2-core machine). Before any run
starts, this process makes sure the embedded model's warm-up is cached, so no two runs
ever warm up at once. Files:
    OUT/TASK/NAME/ARM/seed_S/  train.py's run directory (config.json, metrics.jsonl,
                               checkpoints/), plus train.log (the run's stdout and stderr),
                               sweep_args.json (the flags it was started with) and
                               done.json (written last, atomically, when the run finished)
    OUT/TASK/NAME/sweep.log     one line per run event (started, skipped, done, failed)
    OUT/TASK/NAME/summary.md    the verdicts, the table, the command, date and machine
    OUT/TASK/NAME/verdicts.json the verdicts as data (the README's table reads them)
    OUT/TASK/NAME/curves.png    mean ± SE over seeds of each curve of the sweep
Resume by directory: a run with done.json and the same flags is skipped, and so is a run
whose metrics.jsonl has every step (the sweep was killed after the run ended and before
it wrote done.json, which is then written); any other run without done.json (killed,
rebooted) restarts with train.py --resume, which continues exactly from its last
checkpoint (or from step 0 if there is none); a directory holding a run with OTHER flags
is an error (choose another --out, or remove it), never overwritten and never mixed into
a table. A failing run does not stop the others: sweep.py lets them finish, writes the
reports from the runs that did, then exits 1 with one line per failed run naming its log.
A sweep may so be finished over several sessions; `report` rebuilds every report from
whatever has finished.

One sweep per --out at a time: the sweep locks --out (config.lock_dir; a second sweep
is refused in one line naming the first one's PID), and each train.py locks its own run
directory. A train.py dies with the sweep that started it, however the sweep dies
(kill -9 included): the sweep passes its PID in TOKENCREDIT_PARENT_PID, and train.py asks
the kernel for a signal when its parent exits (train.exit_with_parent). So a killed
sweep leaves no run writing behind it, and its rerun resumes each one once.

The table (summary.md): one row per quantity, one column per arm. A cell reads
"mean ± SE [seed 0, seed 1, ...]" over the arm's finished seeds, with SE = std(ddof=1) /
sqrt(n); "(n=k)" when only k seeds have a number (e.g. steps to a threshold some seeds
never reached). The verdicts above it come from experiments/claims.py.

For tests: everything after `--` goes to every train.py run, after the sweep's own flags
(so it wins), e.g. a tiny untrained model instead of the warm-up:
    python -m experiments.sweep credit --steps 3 --seeds 0 -- --model DIR --digits 1
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import io
import json
import math
import os
import platform
import shlex
import shutil
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

from experiments import claims as claims_lib
from experiments import plot_runs
from experiments.sweeps import SWEEPS, TASKS, Sweep
from machinery import config

# ---------------------------------------------------------------------------------------
# The defaults: change them here.
# ---------------------------------------------------------------------------------------
JOBS = 2                          # train.py processes at a time (one torch thread each)
OUT = os.path.join("runs", "sweeps")   # runs go to OUT/TASK/SWEEP/ARM/seed_S
DOCS = "docs"                     # `report` writes docs/sweep_TASK_SWEEP.md and .png here
TASK = "countdown"                # the default task (experiments/sweeps.py TASKS: steps, seeds, evaluation)
# Budget: experiments/sweeps.py's header has the arithmetic per sweep. One run costs about
# start-up + steps x step + steps / eval_every x evaluation + diagnostics. On a busy box,
# raise the evaluation interval first: it is the cost that does not change what is measured.

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
TRAIN_PY = os.path.join(REPO_DIR, "train.py")


# ---------------------------------------------------------------------------------------
# 1. Statistics for the table (the claims' tests: experiments/claims.py)
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


# ---------------------------------------------------------------------------------------
# 2. Planning the runs, and resume by directory
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


def plan_runs(sweep: Sweep, arms: list[str], seeds: list[int], steps: int, out: str, extra: list[str],
              task: str = TASK) -> list[RunSpec]:
    """Every (arm, seed) run's train.py arguments, each checked by train.parse_args.

    Runs go to out/TASK/SWEEP/ARM/seed_S. Order: the task's evaluation, sweep flags, arm
    flags, then `extra` (so a test's --model wins). Raises ValueError naming the run and
    train.py's complaint for a bad flag set.
    """
    settings, runs = TASKS[task], []
    for arm in arms:
        for seed in seeds:
            d = os.path.join(out, task, sweep.name, arm, f"seed_{seed}")
            args = ["--out_dir", d, "--seed", str(seed), "--steps", str(steps),
                    "--eval_every", str(settings["eval_every"]), "--n_eval", str(settings["n_eval"]),
                    "--eval_samples", str(settings["eval_samples"]), "--threads", "1",
                    *sweep.flags, *sweep.arms[arm], *extra]
            cfg = _check_train_args(f"{sweep.name}/{arm}/seed_{seed}", args)
            warmup = _embedded_warmup(cfg) if cfg.model == "tiny" else None
            runs.append(RunSpec(sweep.name, arm, seed, cfg.out_dir, args, cfg.steps, warmup))
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
# 3. Running: a pool of train.py processes
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
            write_done(run, end - start)
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
# 4. The report: summary.md, curves.png and the verdicts per sweep
# ---------------------------------------------------------------------------------------

def write_report(sweep: Sweep, runs: list[RunSpec], results: dict, meta: dict) -> str:
    """Write ROOT/summary.md (table and verdicts) and curves.png from the finished runs.

    ROOT is the sweep's directory (OUT/TASK/SWEEP). Returns summary.md's path.
    """
    root = os.path.dirname(os.path.dirname(runs[0].dir))
    arms = list(dict.fromkeys(r.arm for r in runs))
    done = [r for r in runs if os.path.isfile(os.path.join(r.dir, "done.json"))]
    series = {r.label: plot_runs.load_metrics(r.dir) for r in done}
    by_arm = {arm: [r for r in done if r.arm == arm] for arm in arms}
    values = {(label, arm): [fn(series[r.label]) for r in by_arm[arm]] for label, fn, _ in sweep.rows for arm in arms}
    verdicts = claims_lib.judge([c for c in sweep.claims if c.arm in arms and c.reference in (None, *arms)],
                                values, {arm: [series[r.label] for r in by_arm[arm]] for arm in arms})

    lines = [f"# Sweep `{sweep.name}`", "", f"About: {sweep.claim}", "",
             f"- Command: `{meta['command']}` (in `{meta['cwd']}`)",
             f"- Date: {meta['date']}; machine: {meta['machine']}",
             f"- {_timing(runs, results, meta['jobs'])}",
             f"- Runs: {len(done)} of {len(runs)} finished"
             + ("" if len(done) == len(runs) else " (INCOMPLETE: the missing runs failed or were not run yet)"),
             "- Each run: `python train.py " + shlex.join(_shared_args(runs, sweep)) + " ARM-FLAGS`; the seeds are RL "
             "seeds, every run starts from the same checkpoint (--model; 'tiny' = the cached warm-up, tinymodel.py).",
             "- Arms: " + "; ".join(f"**{a}** `{shlex.join(sweep.arms[a]) or '(sweep flags only)'}`" for a in arms),
             "", "## Verdicts", "",
             f"Each claim was written before the runs (experiments/sweeps.py). Test: exact two-sided permutation "
             f"test of the difference of means (arm vs reference), or exact sign-flip test of a within-run "
             f"difference against 0; {claims_lib.CORRECTION}'s correction over this sweep's "
             f"{sum(r['verdict'] != 'not testable' for r in verdicts)} testable claims; significant at "
             f"p (Holm) < {claims_lib.ALPHA}. MDE: the smallest effect in the predicted direction this design "
             "would have detected (experiments/claims.py).", "",
             claims_lib.verdict_table(verdicts),
             "## Per-seed numbers", "",
             "Cells: mean ± SE over seeds [per seed, in the seed order of the header]; SE = std(ddof=1)/sqrt(n); "
             "(n=k): only k seeds have a number.", ""]
    header = ["quantity"] + [f"{a} (seeds {','.join(str(r.seed) for r in by_arm[a]) or '-'})" for a in arms]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, _, _ in sweep.rows:
        lines.append("| " + " | ".join([label] + [cell(values[label, a]) for a in arms]) + " |")
    lines += ["", "Quantities:", *[f"- {label}: {how}" for label, _, how in sweep.rows],
              "", f"Curves (mean ± SE over seeds): `{os.path.basename(_png_path(root))}`.", ""]
    path = os.path.join(root, "summary.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    _atomic_json(os.path.join(root, "verdicts.json"), [_verdict_record(r) for r in verdicts])
    if done:
        plot_curves(sweep, arms, by_arm, series, _png_path(root))
    return path


def _verdict_record(r: dict) -> dict:
    """A verdict as plain JSON (for the README's table across tasks)."""
    c = r["claim"]
    return {"paper": c.paper, "claim": c.text, "row": c.row, "arm": c.arm, "reference": c.reference,
            "direction": c.direction, "effect": r["effect"], "se": r["se"], "p": r["p"], "p_holm": r["p_holm"],
            "verdict": r["verdict"], "detail": r["detail"], "n": r["n"]}


def cell(values: list[float]) -> str:
    """"mean ± SE [v0 v1 ...]" (with "(n=k)" when only k of the values are numbers)."""
    m, se, n = mean_se(values)
    if n == 0:
        return "-"
    text = f"{fmt(m)} ± {fmt(se)} [{' '.join(fmt(v) for v in values)}]"
    return text + (f" (n={n})" if n < len(values) else "")


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
# 5. The command line
# ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n")[0],
                                     epilog="Anything after -- is passed to every train.py run (tests: a tiny model).")
    parser.error = lambda message: parser.exit(2, f"sweep.py: error: {message}\n")
    parser.add_argument("name", choices=[*SWEEPS, "all", "report"],
                        help="which sweep ('all': the four, one pool; 'report': rebuild every report and the "
                             "README's claim table from the finished runs)")
    parser.add_argument("--task", default=TASK, choices=list(TASKS), help="the task every run trains on")
    parser.add_argument("--seeds", help="comma-separated RL seeds (default: 0..n-1, n per sweep in sweeps.TASKS)")
    parser.add_argument("--steps", type=int, help="training steps per run (default per sweep: sweeps.TASKS)")
    parser.add_argument("--arms", help="comma-separated subset of the sweep's arms (one sweep only)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="train.py processes at a time")
    parser.add_argument("--out", default=OUT, help="root directory of the sweeps")
    parser.add_argument("--docs", default=DOCS, help="report: where the pages go")
    parser.add_argument("--readme", default="README.md", help="report: the README whose claim table is rewritten")
    args = parser.parse_args(own)
    if args.name == "report":
        for path in report(args.out, args.docs, args.readme):
            print(f"wrote {path}")
        return
    if problem := config.writable_dir_problem(args.out):
        parser.error(f"--out {args.out!r}: {problem}")
    seeds = None
    if args.seeds is not None:
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
    settings = TASKS[args.task]
    sweeps = [SWEEPS[n](args.task) for n in names]
    if args.arms:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in sweeps[0].arms]
        if unknown or not arms:
            parser.error(f"--arms: {', '.join(unknown) or repr(args.arms)} not in sweep {names[0]} "
                         f"(arms: {', '.join(sweeps[0].arms)})")
    try:
        out_lock = config.lock_dir(args.out, "--out")       # held until this process exits
        plans = {s.name: plan_runs(s, arms if args.arms else list(s.arms),
                                   seeds or list(range(settings["seeds"][s.name])),
                                   args.steps or settings["steps"][s.name], args.out, extra, args.task)
                 for s in sweeps}
        every = [r for runs in plans.values() for r in runs]
        states = {r.label: run_state(r) for r in every}
    except ValueError as e:
        parser.error(str(e))

    meta = {"command": "python -m experiments.sweep " + shlex.join(argv), "cwd": os.getcwd(), "date": _now(),
            "machine": _machine(), "jobs": args.jobs}
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
            write_done(r, (_read_last(os.path.join(r.dir, "metrics.jsonl")) or {}).get("time/elapsed", 0.0))
            say(r, "done.json written (its metrics were complete; the sweep had been stopped)")
            states[r.label] = "finished"
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
    out_lock.close()
    if failed:
        sys.exit(1)


def write_done(run: RunSpec, seconds: float) -> None:
    """done.json, written last and atomically: the run is finished and will be skipped."""
    _atomic_json(os.path.join(run.dir, "done.json"),
                 {"args": run.args, "steps": run.steps, "seconds": seconds, "finished": _now()})


def report(out: str, docs: str, readme: str) -> list[str]:
    """Rebuild every sweep's report from its finished runs, copy it to docs/, rewrite the README's table.

    Finds the runs on disk (OUT/TASK/SWEEP/ARM/seed_S with done.json), judges the claims
    again (write_report), copies summary.md and curves.png to docs/sweep_TASK_SWEEP.md
    and .png, writes the runs' per-seed metrics to docs/sweep_TASK_SWEEP.jsonl.gz, and
    replaces the README's text between CLAIMS_BEGIN and CLAIMS_END with one table of
    every claim: its verdict on each task ("not run" where a task has no runs, "k of n
    runs finished" where the sweep is not done).
    Returns the paths written.
    """
    written, verdicts, progress = [], {}, {}
    for task in TASKS:
        for name, make in SWEEPS.items():
            root = os.path.join(out, task, name)
            sweep = make(task)
            runs = [RunSpec(name, arm, int(d[len("seed_"):]), os.path.join(root, arm, d),
                            (_read_json(os.path.join(root, arm, d, "sweep_args.json")) or {}).get("args", []), 0, None)
                    for arm in sweep.arms if os.path.isdir(os.path.join(root, arm))
                    for d in sorted(os.listdir(os.path.join(root, arm)), key=lambda d: (len(d), d))
                    if d.startswith("seed_") and os.path.isfile(os.path.join(root, arm, d, "done.json"))]
            if not runs:
                continue
            progress[(task, name)] = (len(runs), len(sweep.arms) * TASKS[task]["seeds"].get(name, 0))
            # The runs' dates, not the rebuild's: a rebuilt page changes only when its runs do.
            finished = [os.path.getmtime(os.path.join(r.dir, "done.json")) for r in runs]
            meta = {"command": f"python -m experiments.sweep {name} --task {task} (report rebuilt by "
                               "`python -m experiments.sweep report`)", "cwd": "the repository's root",
                    "date": f"runs finished {_now(min(finished))} to {_now(max(finished))}",
                    "machine": _machine(with_load=False), "jobs": JOBS}
            summary = write_report(sweep, runs, {}, meta)
            os.makedirs(docs, exist_ok=True)
            for src, ext in ((summary, "md"), (_png_path(root), "png")):
                if os.path.isfile(src):
                    dst = os.path.join(docs, f"sweep_{task}_{name}.{ext}")
                    shutil.copyfile(src, dst + ".tmp")
                    os.replace(dst + ".tmp", dst)
                    written.append(dst)
            written.append(_write_per_seed_metrics(runs, os.path.join(docs, f"sweep_{task}_{name}.jsonl.gz")))
            for rec in _read_json(os.path.join(root, "verdicts.json")) or []:
                verdicts.setdefault((name, rec["claim"], rec["row"], rec["arm"], rec["reference"]), {})[task] = rec
    if os.path.isfile(readme):
        written.append(_write_claim_table(readme, verdicts, progress))
    return written


def _write_per_seed_metrics(runs: list[RunSpec], path: str) -> str:
    """Every finished run's metrics.jsonl lines (timings left out), tagged with arm and seed, gzipped.

    What the verdicts were computed from, small enough to commit: one JSON object per
    line, {"arm", "seed", **the step's metrics}. Written atomically, with the gzip header's
    time set to 0, so the same runs give the same bytes (a rebuilt report is no change in git).
    """
    with io.TextIOWrapper(gzip.GzipFile(path + ".tmp", "wb", mtime=0)) as out:
        for r in runs:
            with open(os.path.join(r.dir, "metrics.jsonl")) as f:
                for line in f:
                    if line.strip():
                        row = {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                        out.write(json.dumps({"arm": r.arm, "seed": r.seed, **row}) + "\n")
    os.replace(path + ".tmp", path)
    return path


CLAIMS_BEGIN, CLAIMS_END = "<!-- claims:begin -->", "<!-- claims:end -->"


def _write_claim_table(readme: str, verdicts: dict, progress: dict) -> str:
    """Replace the README's text between the claim markers with the table of every claim.

    progress: (task, sweep) -> (finished runs, planned runs: arms x the task's seeds). A
    sweep with runs still missing shows "k of n runs finished" and no verdict: a verdict
    from part of the seeds (or arms) is not the test the claim was declared with.
    """
    lines = [CLAIMS_BEGIN, "",
             "| sweep | paper | claim | " + " | ".join(TASKS) + " |",
             "|---|---|---|" + "---|" * len(TASKS)]
    for name in SWEEPS:
        sweep = SWEEPS[name](TASK)
        for c in sweep.claims:
            recs = verdicts.get((name, c.text, c.row, c.arm, c.reference), {})
            cells = []
            for task in TASKS:
                r = recs.get(task)
                done, planned = progress.get((task, name), (0, 0))
                if done < planned:
                    cells.append(f"{done} of {planned} runs finished")
                elif r is None:
                    cells.append("not run")
                elif r["verdict"] == "not testable":
                    cells.append(f"not testable: {r['detail']}")
                else:
                    cells.append(f"**{r['verdict']}** ({r['effect']:+.3g}, p {r['p_holm']:.3f} Holm"
                                 + (f"; {r['detail']}" if r["detail"] else "") + ")")
            versus = f"{c.arm} vs {c.reference}" if c.reference else f"{c.arm}"
            pages = ", ".join(f"[{task}](docs/sweep_{task}_{name}.md)" for task in TASKS if (task, name) in progress)
            lines.append(f"| {name}" + (f" ({pages})" if pages else "")
                         + f" | {c.paper} | {c.text} ({versus}, {c.row}) | " + " | ".join(cells) + " |")
    lines += ["", CLAIMS_END]
    text = open(readme).read()
    if CLAIMS_BEGIN in text and CLAIMS_END in text:
        head, rest = text.split(CLAIMS_BEGIN, 1)
        text = head + "\n".join(lines) + rest.split(CLAIMS_END, 1)[1]
        with open(readme + ".tmp", "w") as f:
            f.write(text)
        os.replace(readme + ".tmp", readme)
    return readme


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


def _shared_args(runs: list[RunSpec], sweep: Sweep) -> list[str]:
    """The train.py flags of the sweep with the per-run ones shown as placeholders."""
    args = list(runs[0].args)
    for flag, placeholder in (("--out_dir", "OUT/TASK/NAME/ARM/seed_S"), ("--seed", "S")):
        args[args.index(flag) + 1] = placeholder
    arm_flags = sweep.arms[runs[0].arm]
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


def _metrics_complete(path: str, steps: int) -> bool:
    """True iff metrics.jsonl holds exactly one record for each step 1..steps, in order."""
    try:
        with open(path) as f:
            logged = [json.loads(line)["step"] for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return logged == list(range(1, steps + 1))


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


def _now(timestamp: float | None = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if timestamp is None else timestamp).astimezone() \
        .isoformat(timespec="seconds")


def _machine(with_load: bool = True) -> str:
    """'nproc N, CPU model, load average a b c' (the box is shared: the load says how much).

    with_load False: without the load (a rebuilt report describes runs made earlier)."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return f"nproc {os.cpu_count()}, {model}, {platform.system()} {platform.machine()}" \
        + (f", load average at start {load}" if with_load else "")


if __name__ == "__main__":
    main()
