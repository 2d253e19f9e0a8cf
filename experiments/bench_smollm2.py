"""bench_smollm2.py: our step against TRL's on a real model, every configuration in a process of its own.

    python -m experiments.bench --model smollm2-135m-instruct --threads 1   # the table (bench.py's command line)

The real model (--model smollm2-135m-instruct; SMOLLM2): SmolLM2-135M-Instruct on
chat-worded addition ("What is 23 + 48? Answer with just the number.", 1-2 digit
operands) through its chat template, 8 prompts x 8 rollouts of at most 16 new tokens,
temperature 0.7, lr 1e-5: the CPU recipe's step. Each configuration runs in a fresh
process (run_one), so that its peak memory (ru_maxrss) is its own: ours, ours without
each of the three speed-ups below in turn, ours with none of them, and TRL; each
configuration's stages are timed by wrapping the functions that do them (stage_clock:
the sampler's prefill and decoding loop, the update's forwards and backwards, the
gradient clip, AdamW's step). TRL gets the prompts as conversations and renders them
with the same chat template; the bench checks that both saw the same prompt tokens.

Each configuration: ours; ours without each of train.py's three update speed-ups (the
zero-advantage skip, merging identical rollouts, shared prompts; experiments/bench.py's
header says what each leaves out); ours with none of them; TRL's GRPOTrainer configured as
bench_trl.py says. --rounds runs them all again in the reverse order, so a neighbour's load
drifting over the run hits every configuration alike.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from experiments.bench import Work, measure_ours, med, mean, pool, work_rows
from experiments.bench_trl import UPDATE_STAGES, events_between, measure_trl, stage_clock
from machinery import rollout

# The real model's work: chat-worded addition of 1-2 digit numbers (tasks/addition_instruct.py)
# at the budgets of the CPU recipe (recipes/smollm2-135m-addition-cpu.yaml): answers of ~11
# tokens, prompts of ~40 tokens that are mostly SmolLM2's default system turn.
SMOLLM2 = Work(model="smollm2-135m-instruct", data="addition_instruct", digits=2, prompts_per_step=8, group_size=8,
               max_new_tokens=16, temperature=0.7, lr=1e-5, chat_template=True)


CONFIGS = {   # name -> (what it is, train.py's flags on top of the work's; None: TRL)
    "ours": ("ours (skip, merge, shared prompts)", ()),
    "no_skip": ("ours without the zero-advantage skip", ("--no-skip_zero_adv",)),
    "no_merge": ("ours without merging copies", ("--no-merge_duplicates",)),
    "no_share": ("ours without shared prompts", ("--no-share_prompts",)),
    "plain": ("ours with none of the three", ("--no-skip_zero_adv", "--no-merge_duplicates", "--no-share_prompts")),
    "trl": ("TRL 1.16.0's GRPOTrainer", None),
}


def ours_stages() -> list[tuple]:
    """Ours, besides UPDATE_STAGES: the sampler's prefill and whole loop, the shared prompts'
    forward and backward, and the rollouts' teacher-forced forward (token_logprobs)."""
    from machinery import decoding, forward
    return [(decoding.LlamaDecoder, "prefill", "prefill"), (decoding.TransformersDecoder, "prefill", "prefill"),
            (rollout, "sample", "sampler"), (forward, "share_prompts", "prompt forward"),
            (forward, "backward_prompts", "prompt backward"), (rollout, "token_logprobs", "forward")]


def measure_one(name: str, args) -> dict:
    """One configuration of the real model's work (CONFIGS[name]), in this process: the
    measured steps with their stage split, the first step's prompt tokens, and the peak
    resident set size of the whole process (ru_maxrss: the model's load included)."""
    from machinery import hub_models

    work, G = SMOLLM2, SMOLLM2.group_size
    if name == "trl":
        out = measure_trl(hub_models.ensure(work.model), work, work_rows(args.warmup + args.steps, args.seed, work),
                          args.warmup, args.steps, args.seed, args.micro_batch, stages=True)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-ours-") as out_dir, \
                stage_clock(ours_stages() + UPDATE_STAGES) as events:
            out = measure_ours(args.warmup, args.steps, work, args.seed, args.threads, args.micro_batch, bound=False,
                               extra=CONFIGS[name][1], out_dir=out_dir)
        recs = out.pop("records")
        first = recs[0]["rollouts"]
        out["prompt_ids"] = [row[m.bool()].tolist() for row, m in zip(first.prompt_ids[::G], first.prompt_mask[::G])]
        for k, step in enumerate(out["steps"], start=args.warmup):
            step["split"].update(events_between(events, recs[k]["wall"], recs[k + 1]["wall"]))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # Linux: KB
    return out


def run_one(name: str, args) -> dict:
    """measure_one(name) in a fresh Python process (its own peak memory); its numbers."""
    with tempfile.TemporaryDirectory(prefix="bench-one-") as tmp:
        path = os.path.join(tmp, "out.json")
        cmd = [sys.executable, "-m", "experiments.bench", "--model", args.model, "--one", name, "--json", path,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
               "--threads", str(args.threads), "--micro_batch", str(args.micro_batch)]
        t = time.perf_counter()
        done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True,
                              text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if done.returncode != 0:
            sys.exit(f"bench.py: {CONFIGS[name][0]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        print(f"  ran {CONFIGS[name][0]}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        with open(path) as f:
            return json.load(f)


def main_real(args) -> None:
    """The real model's table: every configuration of CONFIGS, args.rounds times, alternating the order."""
    work, names = SMOLLM2, [n for n in CONFIGS if not (args.skip_trl and n == "trl")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"work: {work.model}, {work.data} (--digits {work.digits}, chat template), {work.prompts_per_step} prompts x "
          f"{work.group_size} rollouts, <= {work.max_new_tokens} new tokens, T={work.temperature}, lr {work.lr:g}, "
          f"no KL, 1 optimizer step/batch, {args.micro_batch} rollouts per forward/backward; {args.warmup} warm-up + "
          f"{args.steps} measured steps per process, {args.rounds} round(s), each configuration in its own process; "
          f"torch {torch.__version__}, {args.threads} thread(s), load average {load:.2f} on {os.cpu_count()} CPUs")
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            results[name].append(run_one(name, args))
    print_real({n: pool(rs) for n, rs in results.items()}, args)


def print_real(runs: dict, args) -> None:
    """The identical-work checks, the step table and where each configuration's time goes."""
    names = list(runs)
    prompts = [runs[n]["prompts"][:args.warmup + args.steps] for n in names]
    print(f"identical prompts at every step, all configurations: {'yes' if all(p == prompts[0] for p in prompts) else 'NO'}; "
          f"identical prompt tokens at the first step: "
          f"{'yes' if all(runs[n]['prompt_ids'] == runs[names[0]]['prompt_ids'] for n in names) else 'NO'} "
          f"({statistics.mean(len(r) for r in runs[names[0]]['prompt_ids']):.1f} tokens per prompt)")
    trl = med(runs["trl"]["steps"], "wall") if "trl" in runs else None
    print(f"\n{'configuration':<40} {'step, wall (CPU)':>17} {'sample':>7} {'update':>7} {'skipped':>8} {'merged':>7} "
          f"{'reward':>7} {'peak RSS':>9} {'/ TRL':>6}")
    for n in names:
        steps = runs[n]["steps"]
        sample = statistics.median(s["sample"] for s in steps)
        update = statistics.median(s["split"].get("update", float("nan")) for s in steps) if n != "trl" else \
            statistics.median(s["wall"] - s["sample"] for s in steps)
        skipped = f"{100 * mean(steps, 'skipped'):.0f}%" if n != "trl" else "-"
        merged = f"{100 * mean(steps, 'duplicate'):.0f}%" if n != "trl" else "-"
        ratio = f"{med(steps, 'wall') / trl:.2f}" if trl else "-"
        print(f"{CONFIGS[n][0]:<40} {med(steps, 'wall'):>7.2f} s ({med(steps, 'cpu'):>5.2f}) {sample:>7.2f} {update:>7.2f} "
              f"{skipped:>8} {merged:>7} {mean(steps, 'reward'):>7.3f} {runs[n]['peak_rss_mb']:>6.0f} MB {ratio:>6}")
    print("(update: train.py's time/update; for TRL its step less generate(): scoring, forward, backward, AdamW)")
    print(f"\nwhere the time goes (median s per step over {len(runs[names[0]]['steps'])} measured steps; stage_clock):")
    for n in names:
        steps = runs[n]["steps"]
        m = lambda key: statistics.median(s["split"].get(key, 0.0) for s in steps)
        if n == "trl":
            parts = {"generate()": m("generate"), "forward": m("forward"), "backward": m("backward"),
                     "clip": m("clip"), "AdamW step": m("AdamW step")}
            parts["rest (scoring, TRL's bookkeeping)"] = med(steps, "wall") - sum(parts.values())
        else:
            parts = {"prefill": m("prefill"), "decode": m("sampler") - m("prefill"),
                     "sample, rest": m("sample") - m("sampler"),
                     "prompt forward": m("prompt forward"), "forward": m("forward"), "backward": m("backward"),
                     "prompt backward": m("prompt backward"), "clip": m("clip"), "AdamW step": m("AdamW step")}
            parts["update, rest"] = m("update") - sum(parts[k] for k in ("prompt forward", "forward", "backward",
                                                                          "prompt backward", "clip", "AdamW step"))
            parts["other stages"] = med(steps, "wall") - m("sample") - m("update")
        print(f"  {CONFIGS[n][0]}: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
