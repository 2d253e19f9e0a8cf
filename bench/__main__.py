"""python -m bench: our GRPO step against TRL's GRPOTrainer on identical work, in one process.

    python -m bench                     # 2 rounds x (2 warm-up + 10 measured steps) of each trainer
    python -m bench --skip_trl          # ours only (TRL not installed)
    python -m bench --scaling           # + how our step time grows with G and max new tokens
    python -m bench --data countdown    # the same comparison on the countdown task
    python -m bench --skip_trl --profile   # + where our step's time goes (torch.profiler)
    python -m bench --ablate            # + each step replayed without the decoder / shared prompts
    python -m bench --model smollm2-135m-instruct --threads 2   # a real model (bench/smollm2.py)
    python -m bench --model smollm2-135m-instruct --lm_head    # one micro-batch's update, four ways
    pip install -r requirements/bench.txt     # TRL 1.16.0 and what it needs, for the comparison

The work: the warmed embedded model (tinymodel.py), the synthetic addition task
(3 digits; --data countdown: the countdown task and its own warm-up), 32 prompts x 8 rollouts per step, at most 48 new tokens, temperature 1, one
optimizer step per rollout batch, no KL, lr 4e-4, CPU, one torch thread. Both trainers
see the SAME prompts in the same order: the bench replays train.py's prompt stream
(random.Random(seed).randrange over tasks.load's rows, N draws per step), gives
that exact list to TRL as an unshuffled dataset, and checks afterwards that both saw the
same prompts at every step. Sampling draws differ (different code consumes the RNG
differently), so the mean rewards agree only within sampling noise. How TRL is
configured to do the same step, and why: bench/trl_trainer.py. The real model
(--model smollm2-135m-instruct), each configuration in a process of its own:
bench/smollm2.py.

Three differences in work that are not differences in the update, all exact (tested)
and all printed or counted:
- our update skips the forward and backward of rollouts whose advantage is exactly 0
  (groups that all passed or all failed: their gradient is exactly 0,
  forward.carries_gradient), which TRL runs: ~20-30% of the rollouts on this work, more
  as the solve rate climbs;
- it runs identical rollouts (same prompt, same response, word for word) once and
  copies the result (logprobs.token_logprobs' merge_duplicates; autograd sums the
  copies' gradients), where TRL computes every copy: ~40% of the rollouts on the
  addition work, whose policy has a low entropy, none on countdown;
- it runs each prompt of an optimizer step once, and the responses on top of its keys
  and values (forward.share_prompts), where TRL runs the prompt with every rollout.
And one in how the tokens are drawn, which changes no bit of them: our sampler shares
a forward among rollouts that drew the same tokens so far and drops finished rows
(rollout.sample, machinery/decoding.py); TRL calls model.generate.

The lower bound. Beside our step the bench times the minimum work of the same step on
its own rollouts (lower_bound): one teacher-forced no-grad forward over every rollout
(what drawing the tokens costs at least: every token's distribution must be computed)
plus one forward and backward over the rollouts that carry gradient, each distinct one
once. "ours / lower bound" above 1 is what sampling token by token, scoring, the
optimizer and bookkeeping add; below 1 is possible only by doing less than a forward
per rollout (shared prompts: train.py's --share_prompts, off by default, on here).

What is timed. A step is the wall time of one loop iteration, from one step's start to
the next (ours: consecutive calls of rollout.generate_rollouts, so the run takes one
extra step to close the last interval; TRL: consecutive on_step_end callbacks). The
medians are over the measured steps of all rounds; CPU time (process_time) is printed
beside wall time because on a shared machine wall time also measures the neighbours.
Our split comes from train.py's per-step "time/*" metrics, one per stage of the loop
(sample, score, schedule, advantages, split, update, log; "other" is the rest: writing
metrics.jsonl, bookkeeping).
Peak memory is the process's peak resident set size (VmHWM), reset before each
trainer runs; it includes what the process already holds (torch, transformers, and once
imported, TRL and datasets: ~100 MB), so it compares the trainers only roughly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

from bench import smollm2
from bench.ours import (G_DEFAULT, MAX_NEW_DEFAULT, N_PROMPTS, Work, measure_ours, med, mean, pool, run_ours,
                        train_seconds, work_rows)
from bench.trl_trainer import measure_trl
from machinery import warmups


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------

def print_ours(steps: list[dict], peak: float) -> None:
    wall = med(steps, "wall")
    print(f"ours: median {wall:.3f} s/step wall, {med(steps, 'cpu'):.3f} s CPU; "
          f"mean reward {mean(steps, 'reward'):.3f}; peak RSS {peak:.0f} MB")
    print("  split (median s/step):  " + "  ".join(
        f"{key} {statistics.median(s['split'][key] for s in steps):.3f}" for key in steps[0]["split"]))
    train_s = statistics.median(train_seconds(s) for s in steps)
    print(f"  tokens/s: generation {med(steps, 'tokens') / med(steps, 'sample'):.0f} (response tokens per second "
          f"of sampling), training {med(steps, 'tokens') / train_s:.0f} (the batch's response tokens per second "
          f"of the update)")
    print(f"  rollouts the update skipped (advantage exactly 0, forward.carries_gradient): "
          f"{100 * mean(steps, 'skipped'):.0f}% on average; merged into an identical rollout "
          f"(forward.duplicate_share): {100 * mean(steps, 'duplicate'):.0f}%")
    bound = [s["bound"] for s in steps]
    print(f"  lower bound (lower_bound: a no-grad forward over all tokens + a forward/backward over the rollouts "
          f"with gradient): median {med(bound, 'wall'):.3f} s/step wall ({med(bound, 'forward'):.3f} + "
          f"{med(bound, 'update'):.3f}), {med(bound, 'cpu'):.3f} s CPU")
    print(f"ratio ours/lower bound: {wall / med(bound, 'wall'):.2f} (wall), {med(steps, 'cpu') / med(bound, 'cpu'):.2f} (CPU)")
    nodes, tokens = sum(b["tree_nodes"] for b in bound), sum(b["tree_tokens"] for b in bound)
    print(f"  shared response prefixes (prefix_tree_size, rollouts with gradient): {nodes} tree nodes for {tokens} "
          f"response tokens ({nodes / max(tokens, 1):.2f}); {100 * (1 - nodes / max(tokens, 1)):.0f}% of the "
          f"update's response positions repeat a prefix")


def print_ablation(ablations: list[dict]) -> None:
    """Median and quartiles of the paired ratios, over the measured steps."""
    def ratio(new, old):
        r = [a[new] / a[old] for a in ablations]
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
        return f"{statistics.median(r):.2f} (quartiles {q[0]:.2f}-{q[2]:.2f})"
    print(f"ablation, each measured step replayed both ways (CPU s, paired, {len(ablations)} steps): sampler with the "
          f"Llama decoder / with the transformers decoder {ratio('llama', 'transformers')}; update with shared "
          f"prompts / with each rollout's own {ratio('shared', 'plain')}; median seconds "
          + ", ".join(f"{k} {statistics.median(a[k] for a in ablations):.3f}" for k in ablations[0]))


def compare(ours: dict, trl: dict) -> None:
    """Ratio, rewards, memory, and the identical-work check."""
    same = ours["prompts"][:len(trl["prompts"])] == trl["prompts"]
    print(f"identical prompts at every step: {'yes' if same else 'NO: the comparison is invalid'}")
    o, t = ours["steps"], trl["steps"]
    print(f"TRL:  median {med(t, 'wall'):.3f} s/step wall, {med(t, 'cpu'):.3f} s CPU; mean reward "
          f"{mean(t, 'reward'):.3f}; peak RSS {trl['peak_rss_mb']:.0f} MB; generate() {med(t, 'sample'):.3f} s/step, "
          f"{med(t, 'tokens') / med(t, 'sample'):.0f} tokens/s; torch threads {trl['threads']}")
    print(f"ratio ours/TRL: {med(o, 'wall') / med(t, 'wall'):.2f} (wall), {med(o, 'cpu') / med(t, 'cpu'):.2f} (CPU)")


# ---------------------------------------------------------------------------------------
# Profile: where our step's time goes, stage by stage and kernel by kernel
# ---------------------------------------------------------------------------------------

KERNELS = {   # aten op name -> what it is (anything else: "element-wise and other ops")
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "copies (cache, gathers)": ("aten::cat", "aten::index", "aten::index_put_", "aten::_index_put_impl_",
                                "aten::copy_", "aten::index_select", "aten::clone", "aten::embedding_dense_backward",
                                "aten::index_add_"),
}


def profile(args) -> None:
    """Our step under torch.profiler: for each of train.py's stages, its share of the time
    and how that splits into kernels (KERNELS) and the rest (Python, dispatch, bookkeeping).

    Each stage's wall time comes from train.py's own timer (train.timed, wrapped here so
    that it also opens a profiler range); an op's self time counts toward the stage whose
    range encloses it. The profiler adds a few microseconds per op, so the "Python and
    dispatch" share is an upper bound. Steps: args.warmup + args.steps of ours, the
    warm-up steps left out.
    """
    import train
    from torch.profiler import ProfilerActivity, profile as torch_profile, record_function

    saved = train.timed

    @contextlib.contextmanager
    def timed(stage, times):
        with record_function(f"stage/{stage}"), saved(stage, times):
            yield
    train.timed = timed
    try:
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            history, _, _ = run_ours(args.warmup + args.steps, Work(data=args.data), args.seed, args.threads,
                                     args.micro_batch, args.compile)
    finally:
        train.timed = saved
    per_stage = {}                                  # stage -> {kind: self seconds}
    for event in prof.events():
        stage, up = None, event
        while up is not None and stage is None:
            stage = up.name[len("stage/"):] if up.name.startswith("stage/") else None
            up = up.cpu_parent
        if stage is None or event.name.startswith("stage/"):
            continue
        kind = next((k for k, names in KERNELS.items() if event.name in names), "element-wise and other ops")
        per_stage.setdefault(stage, {}).setdefault(kind, 0.0)
        per_stage[stage][kind] += event.self_cpu_time_total / 1e6
    measured = history[args.warmup:]
    step = sum(sum(m[f"time/{s}"] for s in per_stage) for m in measured) / len(measured)
    print(f"\nprofile of our step ({args.data}; {len(measured)} steps under torch.profiler, means; "
          f"the profiler itself slows small ops): {step:.3f} s/step in train.py's stages")
    n_all = len(history)
    for stage in per_stage:
        wall = sum(m[f"time/{stage}"] for m in measured) / len(measured)
        kinds = per_stage[stage]
        total = sum(m[f"time/{stage}"] for m in history)
        rest = max(0.0, total - sum(kinds.values()))
        parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
                          if v / total >= 0.005)
        print(f"  {stage:<12} {wall:.3f} s ({100 * wall / step:4.1f}%): {parts}, Python and dispatch "
              f"{100 * rest / total:.0f}%  [{n_all} steps' ops]")


def scaling(args) -> None:
    """Our median step time (and its two big parts) against G and max new tokens."""
    print("\nscaling of our step (median over the measured steps; wall s, CPU s in brackets):")
    print(f"  {'G':>3} {'max_new':>7} {'step':>14} {'sample':>9} {'train':>7} {'resp len':>8} {'gen tok/s':>9}")
    for G, max_new in [(4, 48), (8, 48), (16, 48), (8, 24), (8, 96)]:
        r = measure_ours(args.warmup, args.scaling_steps, Work(data=args.data, group_size=G, max_new_tokens=max_new),
                         args.seed, args.threads, min(args.micro_batch, N_PROMPTS * G), args.compile)
        s = r["steps"]
        print(f"  {G:>3} {max_new:>7} {med(s, 'wall'):>7.3f} ({med(s, 'cpu'):.3f}) "
              f"{statistics.median(x['split']['sample'] for x in s):>9.3f} "
              f"{statistics.median(train_seconds(x) for x in s):>7.3f} "
              f"{med(s, 'tokens') / (N_PROMPTS * G):>8.1f} {med(s, 'tokens') / med(s, 'sample'):>9.0f}")


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")   # one line, exit 2
    parser.add_argument("--model", default="tiny", choices=("tiny", "smollm2-135m-instruct"),
                        help="the embedded model (its addition or countdown work), or SmolLM2-135M-Instruct on "
                             "chat-worded addition, every configuration in its own process (bench/smollm2.py)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps of each trainer (K; default 10, "
                                                                "the real model 4)")
    parser.add_argument("--warmup", type=int, default=None, help="steps run first and not measured (default 2, "
                                                                 "the real model 1)")
    parser.add_argument("--skip_trl", action="store_true", help="measure ours only (TRL not needed)")
    parser.add_argument("--scaling", action="store_true",
                        help="also print our step time for G = 4, 8, 16 and max new tokens = 24, 48, 96")
    parser.add_argument("--scaling_steps", type=int, default=4, help="measured steps per row of the scaling table")
    parser.add_argument("--rounds", type=int, default=2,
                        help="repeat the pair of runs this many times, alternating which goes first, and pool "
                             "the measured steps (a shared machine's load drifts)")
    parser.add_argument("--micro_batch", type=int, default=32,
                        help="rollouts per forward/backward, for both trainers (TRL: per_device_train_batch_size, "
                             "with N x G / micro_batch accumulation steps); must divide N x G (256, the real model 64)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for both trainers")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile both trainers' update (ours: train.py --compile; TRL: torch_compile=True); "
                             "the compile falls in the warm-up steps")
    parser.add_argument("--ablate", action="store_true",
                        help="replay each of our measured steps with and without the Llama decoder and shared "
                             "prompts, paired (what those two speed-ups buy)")
    parser.add_argument("--profile", action="store_true",
                        help="also run ours under torch.profiler and print each stage's time by kind of kernel")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts, the sampling and both trainers")
    parser.add_argument("--data", default=None, choices=warmups.TASKS,
                        help="the embedded model's task (default addition)")
    parser.add_argument("--lm_head", action="store_true",
                        help="the real model only, instead of its table: one micro-batch's forward and backward "
                             "four ways (ours, the backbone alone, TRL's fused LM head, full logits; "
                             "smollm2.lm_head_paths)")
    parser.add_argument("--one", help=argparse.SUPPRESS)        # smollm2.run_one's child: one configuration
    parser.add_argument("--json", help=argparse.SUPPRESS)                          # ... writing its numbers here
    args = parser.parse_args(argv)
    real = args.model != "tiny"
    if args.lm_head and (not real or args.skip_trl):
        parser.error("--lm_head times TRL's fused LM head on the real model: it needs --model "
                     "smollm2-135m-instruct and TRL (no --skip_trl)")
    if real:
        given = [f"--{k}" for k in ("data", "compile", "ablate", "profile", "scaling") if getattr(args, k)]
        if given:
            parser.error(f"{', '.join(given)}: the embedded model's options; --model {args.model} has one work "
                         f"(SMOLLM2) and times every stage of every configuration itself")
    args.data = args.data or "addition"
    args.steps = args.steps if args.steps is not None else (4 if real else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if real else 2)
    for name in ("steps", "scaling_steps", "threads", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if real:
        if args.one is not None and args.one not in smollm2.CONFIGS:
            parser.error(f"--one must be one of {', '.join(smollm2.CONFIGS)}, got {args.one}")
    work = smollm2.SMOLLM2 if real else Work()
    B = work.prompts_per_step * work.group_size
    if args.micro_batch < 1 or B % args.micro_batch:
        parser.error(f"--micro_batch must divide {B}, got {args.micro_batch}")
    if args.warmup < 1:
        parser.error(f"--warmup must be >= 1 (the first step pays one-time costs), got {args.warmup}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    trl = None
    if not args.skip_trl:              # before the warm-up (up to a minute), not after it
        try:
            import trl
        except ImportError:
            print("python -m bench: error: TRL is not installed (pip install -r requirements/bench.txt, or --skip_trl)",
                  file=sys.stderr)
            sys.exit(2)
    if args.model != "tiny":
        if args.one:                   # smollm2.run_one's child
            out = smollm2.measure_one(args.one, args)
            with open(args.json, "w") as f:
                json.dump(out, f)
        elif args.lm_head:
            smollm2.lm_head_paths(args)
        else:
            smollm2.main_real(args)
        return
    model_dir = warmups.load_or_warmup(warmups.warmup_config(args.data, digits=3))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"work: {args.data}, {N_PROMPTS} prompts x {G_DEFAULT} rollouts, <= {MAX_NEW_DEFAULT} new tokens, T=1, lr 4e-4, "
          f"no KL, 1 optimizer step/batch; {args.warmup} warm-up + {args.steps} measured steps; "
          f"torch {torch.__version__}, {args.threads} thread(s), load average {load:.2f} on {os.cpu_count()} CPUs"
          + (", torch.compile on (both trainers)" if args.compile else ""))
    if trl is not None:
        print(f"TRL {trl.__version__}, {args.rounds} round(s) of both trainers, alternating which runs first")
    runs = {"ours": [], "trl": []}
    for r in range(args.rounds):
        order = ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
        for who in order:
            if who == "ours":
                runs["ours"].append(measure_ours(args.warmup, args.steps, Work(data=args.data), args.seed,
                                                 args.threads, args.micro_batch, args.compile, args.ablate))
            elif not args.skip_trl:
                work = Work(data=args.data)
                runs["trl"].append(measure_trl(model_dir, work, work_rows(args.warmup + args.steps, args.seed, work),
                                               args.warmup, args.steps, args.seed, args.micro_batch, args.compile))
    ours = pool(runs["ours"])
    print_ours(ours["steps"], ours["peak_rss_mb"])
    if runs["trl"]:
        compare(ours, pool(runs["trl"]))
    if args.ablate:
        print_ablation([s["ablation"] for s in ours["steps"]])
    if args.scaling:
        scaling(args)
    if args.profile:
        profile(args)


if __name__ == "__main__":
    main()
