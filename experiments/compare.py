"""compare.py: does my change help? Two sets of train.py flags, run from the same seeds, judged by the study's exact paired test.

    python -m experiments.compare --a "--advantage mean" --b "--advantage rloo" --seeds 0-5 --steps 60
    python -m experiments.compare --a "" --b "--clip_high 0.28" --seeds 0-9 --steps 100 --direction 'b>a'
    python -m experiments.compare --a "--advantage grpo" --b "--advantage mean" --seeds 0-5 --steps 60 \\
        --metric mean_pass@1 --margin 0.02 -- --data countdown          # after --: flags both arms share

Why. Two runs, one per arm, give two numbers, and on the default run three seeds of ONE
arm end 0.896 to 0.970 apart (docs/results.md): a single pair cannot tell a real 0.03
from the seed. RL results are known for this (Henderson et al. 2018, "Deep RL that
matters": five seeds of one algorithm split into two groups looked like two algorithms),
and what to report with few seeds has been argued since (Agarwal et al. 2021, "Deep RL at
the edge of the statistical precipice": intervals, not point estimates). TRL, verl,
OpenRLHF and cleanrl leave seeds and statistics to the user; cleanrl's benchmark is a
shell loop over seeds and a plot.

What this does instead, with the study's own machinery (experiments/claims.py, the code
that judges every sweep's findings; nothing of it is copied here):

  pairs     each seed s runs both arms with --seed s: the seed fixes train.py's training
            prompts, its held-out set and every sampling stream, so the two runs of a seed
            see the same batches until their updates differ, and d_s = x_b(s) - x_a(s) is
            the arm's difference and what it did to the chance that followed. What a
            seed's two runs share cancels in d_s (59-72% of the variance of final pass@1 on
            the study's countdown runs). Both runs of a pair must round floats alike:
            pairs whose runs ran on different CPU models or torch kernels are left out,
            as the study leaves them out.
  the test  the exact sign-flip test of mean(d) = 0 (experiments/exact_tests.py): under
            "no difference" each d_s is as likely +|d_s| as -|d_s|, and p counts, among the
            2^n sign patterns, those at least as far from 0 as the one seen. No
            distribution assumed, and a floor: p >= 2/2^n two-sided (1/2^n with a direction
            declared before the runs, --direction 'b>a'), so 5 pairs can never give a
            two-sided p below 0.05 and 6 give at least 0.031. Said before the runs start.
  power     "no difference detected" means nothing without the effect that would have been
            detected: the true mean difference this many pairs would find 4 times in 5 at
            the spread of the d seen (exact_tests.power_ratio), printed as each pair
            finishes and on the page.
  margin    --margin m adds the equivalence test (TOST): is b - a inside +-m? the only way
            to say "no worse", which "no difference detected" never says.

Before the runs: the plan (runs, flags, the metric, the test and its floor: whether a
verdict at 0.05 is possible with this many pairs; with too few it says so and runs anyway,
and the page gives the numbers without a verdict). Every arm's full flag list is checked
with train.parse_args and the door checks that read no more than files (the --data file,
the --reward function, the --model directory) before any run starts: a bad arm is one line
naming it, exit code 2, and no run directory is made. Then the cost, from the first new
run's own clock: its start, its first step, then its first evaluation interval.

Running (experiments/sweep.py's machinery, reused): one train.py process per run, one
torch thread each, --jobs at a time (2), a progress bar over runs; each run dies with this
process (TOKENCREDIT_PARENT_PID). Resume by directory: a run with done.json and the same
flags and config is reused, a broken one continues with train.py --resume, and a
directory holding a run of other flags or another config is an error naming it (another
--out, or remove it). The metric is read from the runs afterwards, so asking again with
another --metric, --direction or --margin reruns nothing (the direction's p is only a
declared test the first time you ask).

Files, under --out (default runs/compare/A_vs_B):
    ARM/seed_S/                train.py's run directory, train.log, sweep_args.json, done.json,
                               machines.json (the machine of each start or resume)
    compare.md, compare.png    the page and its plot (experiments/compare_page.py)
    compare.json               the pairs and the verdicts as data
    compare.log, invocations.jsonl   each run's events; each invocation's time and load
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import resource
import shlex
import signal
import sys
import threading
import time

from tqdm import tqdm

from experiments import compare_page
from experiments.compare_page import ALPHA, ARMS, DIRECTIONS, ROW, Question, fewest_pairs, floor, parse_metric, run_dir
from experiments.pages import machine, now, read_json
from experiments.sweep import _check_train_args as check_train_args, ensure_warmup, execute, run_state, write_done
from experiments.sweep_plan import JOBS, RunSpec
from machinery import checks

OUT = os.path.join("runs", "compare")     # default --out: OUT/<a's flags>_vs_<b's flags>
OWN_FLAGS = ("--seed", "--out_dir", "--steps", "--resume", "--overwrite")   # compare.py sets these, per run
LOAD_EVERY = 20                           # seconds between samples of the load average while runs go
POLL = 1.0                                # seconds between looks at the first new run's metrics.jsonl


# ---------------------------------------------------------------------------------------
# 1. The arms and their runs, checked before any run
# ---------------------------------------------------------------------------------------

def parse_seeds(text: str) -> list[int]:
    """'0-5' -> [0, ..., 5]; '0,2,7' and '0-3,9' too. ValueError (one line) for anything else,
    a repeated seed or a negative one."""
    seeds = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ValueError(f"--seeds {text!r}: expected seeds >= 0 as 0-5, 0,2,7 or 0-3,9")
        seeds += range(int(m[1]), int(m[2] or m[1]) + 1)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r} names a seed twice")
    return seeds


def arm_flags(text: str, where: str) -> list[str]:
    """One arm's flags (--a "...", --b "...") or the shared ones, split as a shell would.

    Refused, one line naming where: a flag compare.py sets itself for every run (OWN_FLAGS:
    each run's --seed is its pair's, --steps and --out_dir are the comparison's, and resume
    is decided per run directory), in either spelling (--seed 3, --seed=3).
    """
    try:
        flags = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"{where} {text!r}: {e}") from None
    for token in flags:
        name = token.split("=", 1)[0]
        if name in OWN_FLAGS:
            raise ValueError(f"{where} sets {name}: compare.py gives every run its own --seed (the pair's), --steps "
                             "and --out_dir, and resumes by run directory; use --seeds, --steps and --out")
    return flags


def run_args(out: str, arm: str, seed: int, steps: int, shared: list[str], flags: list[str]) -> list[str]:
    """One run's train.py arguments: its own, then the shared flags, then the arm's (which win)."""
    return ["--out_dir", run_dir(out, arm, seed), "--seed", str(seed), "--steps", str(steps), "--threads", "1",
            *shared, *flags]


def plan_runs(out: str, seeds: list[int], steps: int, shared: list[str], arms: dict, metric) -> list[RunSpec]:
    """Every run of the comparison, pair by pair (seed, then a, b), each checked at the door.

    train.parse_args on the full flag list (the checks of every value and combination),
    then what setup's door reads without writing (door_problem), then whether the metric
    can have a number (an eval/ metric needs --eval_every > 0). ValueError naming the arm.
    """
    from machinery.config import embedded_warmup         # imported late, like train itself (its import is heavy)
    runs = []
    for seed in seeds:
        for arm in ARMS:
            args = run_args(out, arm, seed, steps, shared, arms[arm])
            label = f"arm {arm} ({compare_page._flags(arms[arm])})"      # the error's first words
            cfg = check_train_args(label, args)
            if seed == seeds[0]:
                if problem := door_problem(cfg):
                    raise ValueError(f"{label}: {problem}")
                if metric.needs_eval and not cfg.evaluation.eval_every:
                    raise ValueError(f"{label}: --metric {metric.name} reads {metric.key}, and --eval_every 0 "
                                     "evaluates nothing")
            warmup = embedded_warmup(cfg) if cfg.model == "tiny" else cfg.model
            runs.append(RunSpec("compare", arm, cfg.warmup_seed, seed, cfg.out_dir, args, cfg.steps, warmup))
    return runs


def door_problem(cfg) -> str | None:
    """What setup.check_inputs would refuse that only reading can tell, without touching the run
    directory: a --data or --eval_data source that does not exist, a --model that is no model,
    a --reward function that does not import. None if all are fine."""
    import tasks
    from tasks import user_reward
    try:
        for flag, source in (("--data", cfg.data), ("--eval_data", cfg.evaluation.eval_data)):
            if source is not None:
                tasks.check_source(source, flag=flag)
        checks.check_model(cfg.model)
        if cfg.reward:
            user_reward.load(cfg.reward)
    except (ValueError, OSError, checks.UsageError) as e:
        return str(e)
    return None


def states_of(runs: list[RunSpec]) -> dict[str, str]:
    """{label: 'new' | 'resume' | 'finished' | 'complete'} (sweep.run_state: by the flags in
    sweep_args.json), and for a run already started, by its config too: the same flags can
    mean another run when a recipe (--config) or a default changed since. ValueError naming
    the directory and the first fields that differ."""
    from machinery import resume
    from machinery.config import Config, resume_rules
    states = {}
    for r in runs:
        states[r.label] = state = run_state(r)
        saved = read_json(os.path.join(r.dir, "config.json"))
        if state == "new" or saved is None:
            continue
        cfg = check_train_args(r.label, r.args)
        changed = resume.config_changes(saved, dataclasses.asdict(cfg), resume_rules(cfg)[1],
                                        dataclasses.asdict(Config()))
        if changed:
            raise ValueError(f"{r.dir} holds a run of the same flags but another config ({'; '.join(changed[:3])}): "
                             "a recipe or a default changed since; use another --out or remove that directory")
    return states


def default_out(a: list[str], b: list[str]) -> str:
    """runs/compare/<a>_vs_<b>, each side its flags made a file name ('advantage-mean'; 'default' for none)."""
    def slug(flags):
        return re.sub(r"[^A-Za-z0-9_.@]+", "-", " ".join(flags)).strip("-")[:60] or "default"
    return os.path.join(OUT, f"{slug(a)}_vs_{slug(b)}")


# ---------------------------------------------------------------------------------------
# 2. What will run, and what the test can say with this many pairs
# ---------------------------------------------------------------------------------------

def plan_text(runs: list[RunSpec], states: dict, question: Question, arms: dict, shared: list[str],
              seeds: list[int], steps: int, jobs: int, out: str) -> str:
    """The plan, printed before any run: runs, flags, the metric, the test and its floor."""
    n, sided = len(seeds), question.sided
    lowest = floor(n, sided)
    counts = {s: sum(v == s for v in states.values()) for s in ("finished", "resume", "new")}
    lines = [f"compare: 2 arms x {n} seeds ({compare_page._seeds(seeds)}) = {len(runs)} train.py runs of {steps} steps, "
             f"{jobs} at a time, under {out}",
             f"  a     {compare_page._flags(arms['a'])}",
             f"  b     {compare_page._flags(arms['b'])}",
             f"  both  {compare_page._flags(shared, '(no shared flags)')}",
             f"  each run: python train.py --out_dir {os.path.join(out, 'ARM', 'seed_S')} --seed S --steps {steps} "
             "--threads 1 SHARED ARM",
             f"  metric: {question.metric.name}: {question.metric.text}; per seed d = b - a",
             f"  test: {compare_page._test_text(question)}"]
    need = fewest_pairs(sided)
    if lowest < ALPHA:
        lines.append(f"  with {n} pairs the smallest p is {'2' if sided == 'two' else '1'}/2^{n} = {lowest:.4g}: "
                     f"a verdict at {ALPHA} is possible")
    else:
        lines.append(f"  with {n} pairs the smallest p is {'2' if sided == 'two' else '1'}/2^{n} = {lowest:.4g}, not "
                     f"below {ALPHA}: NO verdict is possible, whatever the runs show ({need} pairs are the fewest "
                     f"for a {sided}-sided test). Running anyway: the page gives the numbers without a verdict.")
    if question.margin:
        lines.append(f"  equivalence within ±{question.margin:g}: smallest p 1/2^{n} = {floor(n, 'one'):.4g}")
    lines.append("  runs: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                 + ("; finished runs are reused (same flags, same config)" if counts["finished"] else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# 3. While the runs go: the cost from the first new run's clock, the load, each pair
# ---------------------------------------------------------------------------------------

class Watch:
    """A thread that samples the load average and times the first new run, printing the cost.

    The cost model is the sweeps' (experiments/sweep_plan.py): a start (process, model,
    the start's evaluation) and a time per step. Both from the first new run of this
    invocation, under whatever else the machine runs: its start is the wall time from its
    launch to its step-1 line minus the loop's own time (time/elapsed); its time per step
    is step 1's at first (no evaluation in it), then time/elapsed / e at its first
    evaluation step e (one evaluation interval, evaluations included). The estimate is for
    the runs still to do: their remaining steps at that rate, plus a start each.
    """

    def __init__(self, todo: list[tuple[RunSpec, str]], jobs: int, say):
        self.todo, self.jobs, self.say = todo, jobs, say
        self.launched: dict[str, float] = {}
        self.loads: list[float] = []
        self.stop = threading.Event()
        self.first = next((r for r, state in todo if state == "new"), None)
        self.done_steps = {r.label: _last_step(r.dir) if state == "resume" else 0 for r, state in todo}
        self.said: set = set()
        self.start_s: float | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def close(self) -> dict:
        """Stop; the load average's samples as {"min", "mean", "max", "samples"}."""
        self.stop.set()
        self.thread.join(timeout=5)
        if not self.loads:
            self.loads.append(os.getloadavg()[0])
        return {"min": min(self.loads), "mean": sum(self.loads) / len(self.loads), "max": max(self.loads),
                "samples": len(self.loads)}

    def _loop(self):
        last_load = 0.0
        while not self.stop.wait(POLL):
            if time.time() - last_load >= LOAD_EVERY:
                self.loads.append(os.getloadavg()[0])
                last_load = time.time()
            if self.first is not None and self.first.label in self.launched and "eval" not in self.said:
                self._cost()

    def _cost(self) -> None:
        """Say the cost once at the first new run's step 1, and again at its first evaluation."""
        path = os.path.join(self.first.dir, "metrics.jsonl")
        rows = [r for r in compare_page.read_rows(self.first.dir) if r.get("step", 0) >= 1 and "time/elapsed" in r]
        if not rows:
            return
        if self.start_s is None:       # the line was written start + elapsed after the launch
            self.start_s = max(0.0, os.path.getmtime(path) - self.launched[self.first.label] - rows[-1]["time/elapsed"])
        evals = [r for r in rows if "time/evaluate" in r]
        if evals:
            step, elapsed = evals[0]["step"], evals[0]["time/elapsed"]
            rate, how = elapsed / step, (f"{elapsed / step:.2f} s a step over its first {step} steps, the evaluation "
                                         f"at step {step} included" if step > 1 else
                                         f"{elapsed:.2f} s for step 1, its evaluation included")
            self.said |= {"step", "eval"}
        elif "step" not in self.said:
            rate, how = rows[0]["time/elapsed"], f"{rows[0]['time/elapsed']:.2f} s for step 1 (no evaluation in it)"
            self.said.add("step")
        else:
            return
        left = [r.steps - self.done_steps.get(r.label, 0) for r, _ in self.todo]
        process_min = sum(self.start_s + n * rate for n in left) / 60
        at_once = max(1, min(self.jobs, len(self.todo)))
        self.say(f"cost, timed on {self.first.arm}/seed_{self.first.seed} on this machine as loaded now: a start of "
                 f"{self.start_s:.0f} s, then {how}: ~{process_min:.1f} process-minutes for the {len(self.todo)} runs "
                 f"to do, ~{process_min / at_once:.0f} min wall at {at_once} at a time")


# ---------------------------------------------------------------------------------------
# 4. The command line
# ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, shared_argv = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    # "--a '--advantage mean'": a value that starts with -- would read as a flag; bind it to its option
    own = _bind_values(own, ("--a", "--b"))
    parser = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Anything after -- goes to both arms' train.py runs, before each arm's "
                                            "own flags (an arm's flag wins).")
    parser.error = lambda message: parser.exit(2, f"compare.py: error: {message}\n")
    parser.add_argument("--a", required=True, metavar="FLAGS", help="arm a's train.py flags, in quotes ('' for the defaults)")
    parser.add_argument("--b", required=True, metavar="FLAGS", help="arm b's train.py flags, in quotes")
    parser.add_argument("--seeds", default="0-5", help="the seeds, one pair each: 0-5, 0,2,7 or 0-3,9")
    parser.add_argument("--steps", type=int, required=True, help="training steps of every run")
    parser.add_argument("--metric", default="final_pass@1",
                        help=f"one number per run: {', '.join(compare_page.NAMED)}, final/KEY or mean/KEY "
                             "(any metrics.jsonl key: docs/metrics.md)")
    parser.add_argument("--direction", default="two-sided", choices=DIRECTIONS,
                        help="declared before the runs: 'b>a' or 'a>b' (quote them) tests one-sided, floor 1/2^n")
    parser.add_argument("--margin", type=float, default=0.0, help="> 0: also test b - a within +-MARGIN (TOST)")
    parser.add_argument("--out", help="the comparison's directory (default runs/compare/<a>_vs_<b>)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="train.py processes at a time (one torch thread each)")
    parser.add_argument("--keep_weights", action="store_true", help="keep each finished run's weights (deleted by "
                                                                    "default: the comparison reads metrics.jsonl)")
    args = parser.parse_args(own)
    try:
        seeds = parse_seeds(args.seeds)
        question = Question(parse_metric(args.metric), args.direction, args.margin)
        arms = {"a": arm_flags(args.a, "--a"), "b": arm_flags(args.b, "--b")}
        shared = arm_flags(shlex.join(shared_argv), "the flags after --")
    except ValueError as e:
        parser.error(str(e))
    if args.steps < 1 or args.jobs < 1:
        parser.error(f"--steps and --jobs must be >= 1, got {args.steps} and {args.jobs}")
    if not (args.margin >= 0 and math.isfinite(args.margin)):
        parser.error(f"--margin must be a number > 0 (or 0: no equivalence test), got {args.margin}")
    if arms["a"] == arms["b"]:
        parser.error(f"--a and --b are the same flags ({compare_page._flags(arms['a'])}): nothing to compare")
    out = args.out or default_out(arms["a"], arms["b"])
    try:
        runs = plan_runs(out, seeds, args.steps, shared, arms, question.metric)       # no directory made yet
    except ValueError as e:
        parser.error(str(e))
    if problem := checks.writable_dir_problem(out):
        parser.error(f"--out {out!r}: {problem}")
    try:
        out_lock = checks.lock_dir(out, "--out")            # one comparison per --out at a time
    except ValueError as e:
        parser.error(str(e))
    try:                                                    # the lock is let go however this ends
        try:
            states = states_of(runs)
            unknown_metric(question.metric, out, seeds, raise_if_absent=True)
        except ValueError as e:
            parser.error(str(e))
        print(plan_text(runs, states, question, arms, shared, seeds, args.steps, args.jobs, out), flush=True)
        command = "python -m experiments.compare " + shlex.join(argv)
        code = run(runs, states, question, seeds, out, args.jobs, args.keep_weights, command)
        meta = {"command": command, "a": arms["a"], "b": arms["b"], "shared": shared, "steps": args.steps,
                "invocations": _invocations(out)}
        judged = compare_page.write_page(out, seeds, question, meta)
    finally:
        out_lock.close()
    print(compare_page.summary_line(judged["difference"], question))
    print("difference: " + compare_page.reading(judged["difference"], question).replace("**", ""))
    if judged["equivalence"] is not None:
        print("equivalence: " + compare_page.reading(judged["equivalence"], question).replace("**", ""))
    print(f"wrote {compare_page.page_path(out)} and {compare_page.png_path(out)}")
    if code:
        sys.exit(code)


def run(runs: list[RunSpec], states: dict, question: Question, seeds: list[int], out: str, jobs: int,
        keep_weights: bool, command: str) -> int:
    """Run what is not finished (sweep.execute), saying each event, each finished pair and the
    cost; returns 0, or 1 if a run failed (each named with its log). An unknown metric found
    when the first run finishes stops the runs (they resume next time) and exits 2."""
    log = open(os.path.join(out, "compare.log"), "a")
    log.write(f"{now()} {command}\n")
    lock, problem, announced = threading.Lock(), [], set()

    def say_text(text: str) -> None:
        with lock:
            tqdm.write(text)
            log.write(f"{now()} {text}\n")
            log.flush()

    for r in runs:
        if states[r.label] == "complete":          # killed after its last step, before done.json
            write_done(r, (compare_page.read_rows(r.dir)[-1:] or [{}])[0].get("time/elapsed", 0.0), keep_weights)
            states[r.label] = "finished"
    todo = [(r, states[r.label]) for r in runs if states[r.label] != "finished"]
    watch = Watch(todo, jobs, say_text)

    def say(r: RunSpec, event: str) -> None:
        name = f"{r.arm}/seed_{r.seed}"
        if event in ("started", "resumed"):
            watch.launched[r.label] = time.time()
            _note_machine(r.dir)
        say_text(f"{name}: {event}")
        if event.startswith("done"):
            if not problem and unknown_metric(question.metric, out, seeds) is not None:
                problem.append(unknown_metric(question.metric, out, seeds))
                os.kill(os.getpid(), signal.SIGINT)         # sweep.execute stops the runs; they resume next time
            elif compare_page.finished(run_dir(out, "b" if r.arm == "a" else "a", r.seed)):
                with lock:                                  # both runs of a pair may end at once: say it once
                    first = r.seed not in announced
                    announced.add(r.seed)
                if first:
                    say_text(f"pair seed {r.seed} done; " + compare_page.progress_line(out, seeds, question))

    if todo:
        ensure_warmup([r for r, _ in todo], say_text)
    started, children = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    watch.start()
    code = 0
    try:
        results = execute(todo, jobs, len(runs) - len(todo), say, keep_weights)
        failed = [res["error"] for res in results.values() if not res["ok"]]
        for line in failed:
            print(f"compare.py: {line}", file=sys.stderr)
        code = 1 if failed else 0
    except SystemExit:
        if problem:
            print(f"compare.py: error: {problem[0]}", file=sys.stderr)
            sys.exit(2)
        raise
    finally:
        load = watch.close()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)     # the train.py processes' CPU time, waited for
        cpu_s = used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime
        record = {"command": command, "started": now(started), "ended": now(), "wall_s": time.time() - started,
                  "cpu_s": cpu_s, "jobs": jobs, "ran": len(todo), "load": load, "machine": machine(with_load=False),
                  "cores": os.cpu_count(), "question": question.record()}
        with open(os.path.join(out, "invocations.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        log.close()
    if not todo:
        print(f"every run was finished before: nothing to run; " + compare_page.progress_line(out, seeds, question))
    return code


def unknown_metric(metric, out: str, seeds: list[int], raise_if_absent: bool = False) -> str | None:
    """Why --metric cannot be read: no finished run logged its key (the keys a run logs depend
    on its flags, so this is known once one has finished); None while it may be read.

    raise_if_absent: ValueError instead of returning the reason (before any run)."""
    keys, any_finished = set(), False
    for arm in ARMS:
        for seed in seeds:
            d = run_dir(out, arm, seed)
            if compare_page.finished(d):
                any_finished = True
                for row in compare_page.read_rows(d):
                    keys |= set(row)
    if not any_finished or metric.key in keys:
        return None
    import difflib
    close = difflib.get_close_matches(metric.key, sorted(keys), n=3) or sorted(k for k in keys if k != "step")[:6]
    reason = (f"--metric {metric.name}: no finished run logged {metric.key!r} (they log e.g. {', '.join(close)}; "
              "every key: docs/metrics.md); the runs are kept: ask again with another --metric and nothing reruns")
    if raise_if_absent:
        raise ValueError(reason)
    return reason


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _bind_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """['--a', '--advantage mean'] -> ['--a=--advantage mean']: argparse takes a value that starts
    with '-' and holds no space for an option of its own, and an arm may be one flag ('--no-skip_zero_adv')."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in options and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _note_machine(d: str) -> None:
    """Append this machine to the run's machines.json (each start and resume): the page's pairing key."""
    path = os.path.join(d, "machines.json")
    starts = read_json(path) or []
    starts.append({"at": now(), "machine": machine(with_load=False)})
    with open(path + ".tmp", "w") as f:
        json.dump(starts, f, indent=1)
    os.replace(path + ".tmp", path)


def _last_step(d: str) -> int:
    rows = compare_page.read_rows(d)
    return int(rows[-1]["step"]) if rows else 0


def _invocations(out: str) -> list[dict]:
    try:
        with open(os.path.join(out, "invocations.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


if __name__ == "__main__":
    main()
