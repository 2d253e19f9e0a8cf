"""scorer_sandbox.py: what scoring one answer in the scorer sandbox costs, and that it changes no score.

    python -m bench.scorer_sandbox                 # 5 rounds x 40 answers of each kind
    python -m bench.scorer_sandbox --vs OLD/tasks/sandbox.py   # interleaved with another sandbox
    TOKENCREDIT_SANDBOX=builtin python -m bench.scorer_sandbox   # the built-in path, not bubblewrap
    python -m bench.scorer_sandbox --check         # every scorer, in and out of the sandbox

Every answer a sandboxed scorer sees costs a fork of a warm worker, the child's
lock-down (rlimits, Landlock, the seccomp allow-list) and its reply; the scorer's own
work comes on top. This prints that cost per answer (sandbox.run_scorer's wall time),
for the kinds a run sends:
  math        math-verify through sympy: "\\frac{k}{7}" against str(k) (right for k = 7)
  puzzle24    reasoning-gym's puzzle24 scorer (sympy's parse_expr): its entry's own
              answer and a wrong one, alternately
  n_queens    reasoning-gym's n_queens scorer (eval), the same way
  batch       n_queens answers from 2 threads at once, as train.py scores a step on the
              pool's two workers (per answer: the batch's wall time / its answers)
Each kind is timed after its workers have started (two untimed calls; start-up printed
beside, once): what a run pays at every step. Per answer: the median over rounds of (a
round's time / its answers), with the fastest and slowest round; wall time, and CPU
time: this process's (sending, reading, checking the reply) plus the sandbox's (its
workers and their children, from /proc/PID/stat: each live process's own and what it
reaped), which a busy machine disturbs much less than wall time, where every wake-up
waits for a core.

--vs FILE loads another version of tasks/sandbox.py (the code before a change, from a
checkout of it: `git worktree add` or `git archive`; a file that imports only the
standard library, as the single-file sandbox did) and sends every answer to both, in
the order A B B A, so a shared machine's drifting load falls on both alike; it prints
both times and the median of the per-answer ratios (this checkout / FILE).

--check scores every reasoning-gym dataset (each one's scorer runs in the sandbox, not
only the eight that evaluate their answer) and math-verify, in the sandbox and directly
in this process, on each dataset's three first reference answers (all scored against
the first entry: one right, two most likely wrong) and six wrong ones of other shapes,
and prints every answer whose two scores differ; exit code 1 if any does. A scorer
that needs a system call the child's allow-list refuses (tasks/sandbox_filter.py)
shows here: the call fails with EPERM and its score drops. Rerun it after upgrading
reasoning-gym or math-verify. 4-8 minutes on the 2-core machine, by its load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tasks import reasoning_gym, sandbox


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind (the median is over them)")
    parser.add_argument("--answers", type=int, default=40, help="answers in each round")
    parser.add_argument("--vs", metavar="FILE", help="another tasks/sandbox.py, sent every answer too")
    parser.add_argument("--check", action="store_true", help="every scorer, sandboxed and direct: the same scores")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.answers < 2:
        parser.error("--rounds must be >= 1 and --answers >= 2")
    if args.check:
        sys.exit(check_every_scorer())
    arms = {"this": sandbox}
    if args.vs:
        spec = importlib.util.spec_from_file_location("sandbox_vs", args.vs)
        arms["vs"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(arms["vs"])
    kinds = answer_kinds()
    print(f"sandbox cost per answer: {args.rounds} rounds x {args.answers} answers of each kind, warm workers"
          + (f"; A = this checkout, B = {args.vs}, in the order A B B A" if args.vs else ""))
    for kind, (library, answer, warmup, threads) in kinds.items():
        starts = {}
        for name, module in arms.items():
            t0 = time.perf_counter()
            _calls(module, library, [answer(0), answer(1)], warmup, threads)     # both workers start
            starts[name] = time.perf_counter() - t0
        times = {name: [] for name in arms}
        cpus = {name: [] for name in arms}
        for _ in range(args.rounds):
            spent = dict.fromkeys(arms, 0.0)
            cpu = {name: -sandbox_cpu(module) for name, module in arms.items()}
            for i in range(args.answers):
                order = ["this", "vs"] if i % 2 == 0 else ["vs", "this"]
                for name in (n for n in order if n in arms):
                    t0, c0 = time.perf_counter(), time.process_time()
                    _calls(arms[name], library, [answer(i)] * threads, warmup, threads)
                    spent[name] += time.perf_counter() - t0
                    cpu[name] += time.process_time() - c0
            for name, module in arms.items():
                times[name].append(spent[name] / (args.answers * threads))
                cpus[name].append((cpu[name] + sandbox_cpu(module)) / (args.answers * threads))
        for name in arms:
            ms, cpu_ms = [1000 * t for t in times[name]], [1000 * c for c in cpus[name]]
            print(f"  {kind:9s} {'A' if name == 'this' else 'B'} {statistics.median(ms):7.2f} ms/answer wall "
                  f"(rounds {min(ms):.2f}-{max(ms):.2f}), {statistics.median(cpu_ms):6.2f} ms CPU "
                  f"({min(cpu_ms):.2f}-{max(cpu_ms):.2f}); start-up and first calls {starts[name]:.2f} s", flush=True)
        if args.vs:
            for label, values in (("wall", times), ("CPU", cpus)):
                ratios = [a / b for a, b in zip(values["this"], values["vs"])]
                print(f"  {kind:9s} A/B {label:4s} {statistics.median(ratios):.3f}  "
                      f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
    for module in arms.values():
        module.shutdown()


def answer_kinds() -> dict:
    """kind -> (library, i -> the i-th answer's arguments, warm-up, threads)."""
    kinds = {"math": ("math", lambda i: [f"\\frac{{{i % 7 + 1}}}{{7}}", str(i % 7 + 1)], None, 1)}
    wrong = {"puzzle24": "1 + 2 + 3", "n_queens": "[[0, 1], [1, 0]]"}
    for name in ("puzzle24", "n_queens"):
        entry = reasoning_gym.rows(name, 1, "train", seed=0)[0]["answer"]
        right = json.loads(entry)["answer"]
        answer = (lambda right, wrong, entry: lambda i: [right if i % 2 else wrong, entry])(right, wrong[name], entry)
        kinds[name] = (f"reasoning_gym:{name}", answer, [[right, entry]], 1)
    kinds["batch"] = (*kinds["n_queens"][:3], 2)
    return kinds


def sandbox_cpu(module) -> float:
    """CPU seconds (user + system) spent so far by a sandbox module's workers and everything
    below them: each live process's own time and its reaped children's (/proc/PID/stat
    fields 14-17), so a child that scored and was reaped counts once, in its worker's."""
    workers = [w.proc.pid for pool in list(module._pools.values()) for w in list(pool.queue) if w is not None]
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                table[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
            except (OSError, ValueError, IndexError):
                pass
    total, frontier = 0, [pid for pid in workers if pid in table]
    while frontier:
        total += sum(table[pid][1] for pid in frontier)
        frontier = [pid for pid, (parent, _) in table.items() if parent in frontier]
    return total / os.sysconf("SC_CLK_TCK")


def _calls(module, library: str, answers: list, warmup, threads: int) -> None:
    """Score `answers` with module.run_scorer, from `threads` threads at once."""
    if threads == 1:
        for args in answers:
            module.run_scorer(library, args, 10.0, warmup=warmup)
        return
    with ThreadPoolExecutor(max_workers=threads) as ex:
        list(ex.map(lambda args: module.run_scorer(library, args, 10.0, warmup=warmup), answers))


WRONG_SHAPES = ["", "42", "[[1, 2], [3, 4]]", "x**2 + C", "hello world", "1/0"]


def check_every_scorer() -> int:
    """Sandboxed and direct scores of every scorer on right and wrong answers; 1 if any differ."""
    import reasoning_gym as rg

    from tasks.sandbox_worker import MATH_WARMUP, prepare_scorer
    t0, differ, answers, right = time.perf_counter(), [], 0, 0
    equal = prepare_scorer("math", [])
    for pred, ref in [("3", "4"), ("x^2", "x^2+1"), ("\\sqrt{2}", "1.41"), ("", "1"), ("abc", "\\pi")] + MATH_WARMUP:
        direct, boxed = equal(pred, ref), sandbox.run_scorer("math", [pred, ref], 10.0)
        answers, right = answers + 1, right + (direct is True)
        if direct != boxed:
            differ.append(("math", pred, direct, boxed))
    sandbox.shutdown()
    for name in sorted(rg.factory.DATASETS):
        try:
            entries = [json.dumps(e, default=str) for e in rg.create_dataset(name, size=3, seed=0)]
        except Exception as e:                # a dataset that needs a configuration (composite)
            print(f"  {name}: not generated ({type(e).__name__}: {str(e)[:80]})")
            continue
        references = [a for a in (json.loads(e).get("answer") for e in entries) if isinstance(a, str)]
        score = prepare_scorer(f"reasoning_gym:{name}", [])
        warmup = [[references[0], entries[0]]] if references else []
        for text in references + WRONG_SHAPES:
            direct = score(text, entries[0])
            boxed = sandbox.run_scorer(f"reasoning_gym:{name}", [text, entries[0]], 10.0, warmup=warmup)
            answers, right = answers + 1, right + (direct == 1.0)
            if direct != boxed:
                differ.append((name, text[:40], direct, boxed))
        sandbox.shutdown()
    print(f"{answers} answers ({right} scored 1 directly), {len(differ)} scored differently in the sandbox, "
          f"{time.perf_counter() - t0:.0f} s")
    for row in differ:
        print("  differs:", row)
    return 1 if differ else 0


if __name__ == "__main__":
    main()
