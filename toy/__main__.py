"""python -m toy: run the seven experiments, print their tables, write one PNG each and summary.md.

    python -m toy                          # everything, into toy_out/ (git-ignored)
    python -m toy --out /tmp/t --only 1 3  # a subset, elsewhere

Prints, per experiment, its numbers and the papers' claims with the analog's verdict (one
of report.LABELS: agrees / not reproduced / depends on the optimizer / depends on the step
size / not testable in this analog, decided from the numbers of this run), then the total
wall time.
Writes OUT/expN_*.png, OUT/summary.md (the same, as markdown) and OUT/results.json.

This file only runs them. The method is in the chapters, to be read in this order:
toy/bandit.py (the analog: a three-token "LM" whose only trainable weights are a
shared output layer, and the exact sum over all 5985 groups of G = 4), toy/cancellation.py (experiments 1, 2, 5: the
cancellation identity, where updates go, token flips), toy/breakers.py (3, 4: what
breaks exchangeability, and mini-batching), toy/answers.py (the second analog: one
softmax over final answers), toy/fade.py (6, 7 on it: the sign and difficulty axes, and
FADE's schedule), toy/plots.py (the seven figures), toy/report.py (verdicts and the summary).

Each experiment N is three steps, and the function in EXPERIMENTS only chains them:
expN_compute() returns a plain dict of numbers (data), expN_judge(data) turns it into the
papers' claims with their verdicts, and plots.expN(data, out_dir) draws the figure.
The first two live in the experiment's chapter, the figure in toy/plots.py, so a verdict
can be read, or tested on numbers made by hand, without any plotting code.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

import torch

# Tiny tensors: one thread. With two, OpenMP spin-waiting made small ops up to ~70x
# slower on a busy 2-core machine (tests/conftest.py does the same).
torch.set_num_threads(1)

from toy import breakers, cancellation, fade, report  # noqa: E402

EXPERIMENTS = {
    1: ("The cancellation identity", cancellation.exp1_cancellation_identity),
    2: ("Positive-only vs critic-free: where the update goes", cancellation.exp2_where_updates_go),
    3: ("Exchangeability breakers and the DFPO fixes", breakers.exp3_exchangeability),
    4: ("Mini-batching and template drift", breakers.exp4_minibatching),
    5: ("Token flips and coupling", cancellation.exp5_flips_and_coupling),
    6: ("Sign and difficulty axes, entropy: Adam vs SGD", fade.exp6_sign_and_difficulty),
    7: ("FADE's schedule vs static baselines", fade.exp7_fade_schedule),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toy", description=__doc__.split("\n")[0])
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")   # one line, exit 2
    parser.add_argument("--out", default="toy_out", help="folder for the PNGs and summary.md (default: toy_out)")
    parser.add_argument("--only", type=int, nargs="+", metavar="N", help="experiment numbers to run (default: all)")
    args = parser.parse_args(argv)
    chosen = sorted(set(args.only)) if args.only else list(EXPERIMENTS)
    bad = [n for n in chosen if n not in EXPERIMENTS]
    if bad:
        parser.error(f"unknown experiment {bad[0]}; choose from 1..{len(EXPERIMENTS)}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out!r} exists and is not a folder")
    if problem := out_problem(args.out):       # under a file, read-only, ...
        parser.error(f"--out {args.out!r}: {problem}")

    start = time.perf_counter()
    sections = []
    for n in chosen:
        title, run = EXPERIMENTS[n]
        t = time.perf_counter()
        result = run(args.out)
        report.print_result(n, title, result, time.perf_counter() - t)
        sections.append((n, title, inspect.cleandoc(run.__doc__), result))
    total = time.perf_counter() - start
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(report.summary_markdown(sections, total))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({str(n): {"numbers": r["numbers"], "claims": r["claims"]} for n, _, _, r in sections}, f,
                  indent=1, default=str)
    claims = [c for *_, r in sections for c in r["claims"]]
    print(f"\nVerdicts on {len(claims)} claims: {report.label_counts(claims)}. Wrote {args.out}/summary.md and "
          f"{len(sections)} PNGs; the experiments took {total:.1f} s.")
    return 0


def out_problem(path: str) -> str | None:
    """None once `path` is a folder this process can write in (made if needed); else what is wrong.

    Asked before the first experiment runs, so a bad --out is one line, not a traceback
    after seconds of work: a file above it ("X (above it) is a file"), or a folder the
    process may not write in (a read-only mount: tested by writing, not with os.access,
    which says yes to root there). The toy imports only the chapters, so it asks here
    itself rather than through the engine's checks at the door (machinery/checks.py).
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} (above it) is a file, not a folder"
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        return f"cannot write in it ({e.strerror})"
    return None


if __name__ == "__main__":
    sys.exit(main())
