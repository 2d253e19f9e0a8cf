"""smollm2.py: our step against TRL's on a real model, every configuration in a process of its own.

    python -m bench --model smollm2-135m-instruct --threads 1   # the table (bench/__main__.py's command line)

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
zero-advantage skip, merging identical rollouts, shared prompts; bench/__main__.py's
header says what each leaves out); ours with none of them; TRL's GRPOTrainer configured as
trl_trainer.py says. --rounds runs them all again in the reverse order, so a neighbour's load
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

from bench.ours import Work, measure_ours, med, mean, pool, work_rows
from bench.trl_trainer import UPDATE_STAGES, events_between, measure_trl, stage_clock
from machinery import logprobs, rollout

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
            (forward, "backward_prompts", "prompt backward"), (logprobs, "token_logprobs", "forward")]


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
        cmd = [sys.executable, "-m", "bench", "--model", args.model, "--one", name, "--json", path,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
               "--threads", str(args.threads), "--micro_batch", str(args.micro_batch)]
        t = time.perf_counter()
        done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True,
                              text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if done.returncode != 0:
            sys.exit(f"python -m bench: {CONFIGS[name][0]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
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


def lm_head_paths(args) -> None:
    """One micro-batch's forward and backward, timed four ways on the same tensors: where
    TRL's update spends more than ours when both run every rollout (no skip, no merge, no
    shared prompts).

    The batch: args.micro_batch rows of the first step's prompts through the chat template
    (left-padded, as the sampler gives them) and responses of SMOLLM2.max_new_tokens tokens
    drawn at random from the vocabulary (the time depends on the shapes only; real responses
    are often shorter). The four ways:
      ours            logprobs.token_logprobs: the backbone over every position, the LM head
                      over the response positions only (logits_to_keep), log_softmax, gather;
      backbone only   the transformer without its LM head (what every way pays);
      TRL fused head  TRL's add_fused_lm_head as GRPOTrainer sets it (log-probs and entropy):
                      without Triton (any CPU) it projects EVERY position through the LM
                      head, prompt included, in tiles it does not keep, so its backward
                      projects them again;
      full logits     the model's own forward, logits at every position, then log_softmax.
    Each: one untimed call, then args.steps timed ones; medians of forward and backward.
    """
    from trl.trainer.utils import add_fused_lm_head
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machinery import hub_models
    from machinery.sampler import format_prompts

    work, T, B = SMOLLM2, SMOLLM2.max_new_tokens, args.micro_batch
    model_dir = hub_models.ensure(work.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    rows = work_rows(1, args.seed, work)[0]
    texts = format_prompts([rows[i % len(rows)]["prompt"] for i in range(B)], tokenizer, work.chat_template)
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
    gen = torch.Generator().manual_seed(args.seed)
    response_ids = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
    response_mask = torch.ones(B, T, dtype=torch.long)
    adv = torch.randn(B, 1, generator=gen)
    ids, mask = torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-T] = -100

    def ours():
        logp, _ = logprobs.token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                          temperature=work.temperature)
        return (logp * adv).sum()

    def backbone():
        hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        return hidden[:, -T - 1:-1].sum()

    def fused():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return (out.log_probs[:, -T:] * adv).sum() + 0.0 * out.entropy[:, -T:].sum()

    def full_logits():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -T - 1:-1]
        logp = torch.log_softmax(logits / work.temperature, -1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
        return (logp * adv).sum()

    def timed(fn) -> tuple[float, float]:
        fw, bw = [], []
        for _ in range(args.steps + 1):
            t0 = time.perf_counter()
            loss = fn()
            t1 = time.perf_counter()
            loss.backward()
            fw.append(t1 - t0)
            bw.append(time.perf_counter() - t1)
            model.zero_grad(set_to_none=True)
        return statistics.median(fw[1:]), statistics.median(bw[1:])

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"one micro-batch of {B} rollouts: prompts of {prompt_ids.shape[1]} columns (chat template, left-padded), "
          f"responses of {T} tokens; {args.steps} timed calls each after one untimed; torch {torch.__version__}, "
          f"{args.threads} thread(s), load average {load:.2f} on {os.cpu_count()} CPUs")
    results = {"ours (LM head on the response positions)": timed(ours),
               "backbone only (no LM head)": timed(backbone)}
    add_fused_lm_head(model, temperature=work.temperature, outputs=("log_probs", "entropy"))   # as GRPOTrainer does
    results["TRL's fused LM head (every position, recomputed)"] = timed(fused)
    results["full logits at every position"] = timed(full_logits)
    base = sum(results["ours (LM head on the response positions)"])
    print(f"\n{'way':<50} {'forward':>8} {'backward':>9} {'total':>7} {'/ ours':>7}")
    for name, (f, b) in results.items():
        print(f"{name:<50} {f:>6.2f} s {b:>7.2f} s {f + b:>5.2f} s {(f + b) / base:>7.2f}")
