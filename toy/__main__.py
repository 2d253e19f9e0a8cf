"""python -m toy: run the six experiments, print their tables, write PNGs and summary.md.

    python -m toy                      # everything, into toy_out/ (git-ignored)
    python -m toy --out /tmp/t --only 1 3

What to read first, if you came here to understand cancellation:
  1. toy/bandit.py's header: why, in a model whose output layer is shared by every
     position and response, the update of token a's logit in a group is sum_i A_i n_a(o_i)
     = G Cov(A, n_a), so a token every rollout shares gets nothing.
  2. experiment 3 (experiments.exp3_exchangeability): the same shared token under nine
     objectives; the ones that give rollouts unequal weights (1/|o_i|, GSPO ratios,
     one-sided clipping) leave it a net update, DFPO's min/orth remove it again.
  3. experiment 4: splitting a group across optimizer steps breaks the cancellation
     even when every objective is exchangeable, and Adam turns the residual into steps.
The other experiments (credit, flips, coupling, masses, entropy) test the papers' other
claims; READING below says what each paper claims, and summary.md what the analog shows,
including where it does NOT agree.

Output: one PNG per experiment, summary.md (tables + the READING text) and results.json
(every number, for scripts). The exit code is 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

# Tiny tensors: one thread. With two, OpenMP spin-waiting made the toy ~70x slower on a
# busy 2-core machine (measured: compute_advantages on [6, 8], 10 ms vs 0.15 ms per call).
torch.set_num_threads(1)

from toy import experiments as E  # noqa: E402

EXPERIMENTS = {
    1: ("cancellation identity", E.exp1_cancellation_identity),
    2: ("positive-only vs critic-free: where updates go", E.exp2_where_updates_go),
    3: ("exchangeability breakers and DFPO fixes", E.exp3_exchangeability),
    4: ("mini-batching and template drift", E.exp4_minibatching),
    5: ("token flips and coupling", E.exp5_flips_and_coupling),
    6: ("sign and difficulty axes", E.exp6_sign_and_difficulty),
}

# What each experiment is expected to show (from the papers) and how to read our numbers.
READING = {
    1: "Papers: a token's update is G*Cov(A, n_a); shared templates get 0. Analog: the identity holds to float "
       "precision in every group, and templates get exactly 0 wherever every rollout has them.",
    2: "Paper (Cancellation Hypothesis): critic-free RL moves update mass from template to reasoning tokens "
       "compared with positive-only (psr). Analog: see template_share; if psr's share is NOT larger, the analog "
       "does not reproduce the claim (our templates are already at ~97%, so a success pushes them up by only "
       "1 - p = 0.03 each, while psr's updates also lack the baseline that makes mean's reasoning updates larger).",
    3: "Design-conditions paper: 1/|o_i| with unequal lengths, GSPO weights and one-sided clipping leave a net "
       "update on a shared token; token-sum aggregation and DFPO min/orth restore exactly 0.",
    4: "Cancellation Hypothesis: query-preserved (and reward-balanced) mini-batches keep cancellation alive. "
       "Analog: template-logit drift per mode after one epoch of Adam steps.",
    5: "Paper: boosted-token fractions are similar in positive and negative rollouts; coupling is largest for "
       "identical low-confidence tokens. Analog: see the fractions and coupling means; the closed form matches "
       "autograd to float precision.",
    6: "FADE paper: success-biased updates collapse entropy, failure-biased keep it up, FADE tracks its target. "
       "Analog (vanilla softmax gradient, sampled groups): compare H_final; where the ordering differs from the "
       "claim, the analog does not reproduce it.",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toy", description=__doc__.split("\n")[0])
    parser.error = lambda message: parser.exit(2, f"python -m toy: error: {message}\n")
    parser.add_argument("--out", default="toy_out", help="output folder for PNGs and summary.md")
    parser.add_argument("--only", type=int, nargs="*", help="experiment numbers to run (default: all)")
    args = parser.parse_args(argv)
    chosen = args.only or list(EXPERIMENTS)
    bad = [n for n in chosen if n not in EXPERIMENTS]
    if bad:
        parser.error(f"unknown experiment {bad[0]}; choose from 1..6")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    lines = ["# toy: token gradient cancellation, computed on a bandit analog", ""]
    results = {}
    for n in chosen:
        title, fn = EXPERIMENTS[n]
        t = time.perf_counter()
        result = fn(args.out)
        results[n] = result
        print(f"\n== {n}. {title}  ({time.perf_counter() - t:.2f}s)")
        for key, value in result.items():
            print(f"  {key:55s} {_fmt(value)}")
        lines += [f"## {n}. {title}", "", READING[n], "", "| quantity | value |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in result.items()]
        lines += ["", f"![]({os.path.basename(_png(n))})", ""]
    total = time.perf_counter() - t0
    lines.append(f"Total wall time of the experiments: {total:.1f} s.")
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nwrote {args.out}/summary.md and {len(chosen)} PNGs; experiments took {total:.1f}s")
    return 0


def _png(n: int) -> str:
    return {1: "exp1_cancellation_identity.png", 2: "exp2_where_updates_go.png", 3: "exp3_exchangeability.png",
            4: "exp4_minibatching.png", 5: "exp5_flips_coupling.png", 6: "exp6_sign_difficulty.png"}[n]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
