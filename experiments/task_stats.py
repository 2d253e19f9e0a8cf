"""task_stats.py: what RL starts from. The embedded model's numbers on held-out prompts.

    python -m experiments.task_stats                      # countdown, 100 prompts x 16 samples
    python -m experiments.task_stats --data addition --samples 4

A task gives RL something to do only if the model that starts RL is unsure in the right
ways. This prints, for the embedded model right after its warm-up (the model
`python train.py --data TASK` starts from), on the task's held-out prompts:

  pass@1, pass@k          unbiased estimates from k samples per prompt (verify.pass_at_k):
                          room to improve (pass@1 low) and something to find (pass@k high);
  entropy                 mean token entropy of the sampled responses (nats), and split
                          into template tokens (the wording) and reasoning tokens
                          (tasks.template_token_mask);
  solutions per prompt    share of prompts with >= 2 distinct valid solutions (countdown:
                          countdown.distinct_solutions), and among the prompts the model
                          solves, the share where its own correct samples show >= 2 of
                          them, and their mean number;
  response length         mean tokens per response (EOS included).

The sampling is train.py's evaluation sampler (temperature 1, the run's max_new_tokens),
seeded, so the numbers repeat exactly on the same machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

import train
import tasks
import verify
from machinery import metrics, warmups
from tasks import countdown


def task_stats(task: str, n_prompts: int, samples: int, seed: int = 0) -> dict:
    """The numbers in the header, as a dict, for the embedded model on `task`."""
    with tempfile.TemporaryDirectory() as out:
        cfg = train.parse_args(["--data", task, "--out_dir", os.path.join(out, "run"), "--n_eval", str(n_prompts),
                                "--eval_samples", str(samples), "--seed", str(seed)])
        run = train.setup(cfg)
    rows = run.eval_rows
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rollouts = run.sampler.sample([r["prompt"] for r in rows], samples, step=0)
    answers = [r["answer"] for r in rows for _ in range(samples)]
    prompts = [r["prompt"] for r in rows for _ in range(samples)]
    correct = [s["correct"] for s in train.verify.score(rollouts.texts, answers, run.task, prompts)]
    counts = [int(sum(correct[j * samples:(j + 1) * samples])) for j in range(len(rows))]
    mask = rollouts.response_mask.float()
    entropy = rollouts.engine_entropy
    template = tasks.template_token_mask(run.task, run.tokenizer, rollouts.response_ids, rollouts.response_mask)
    out = {"task": task, "prompts": len(rows), "samples": samples,
           "pass@1": sum(verify.pass_at_k(samples, c, 1) for c in counts) / len(rows),
           f"pass@{samples}": sum(verify.pass_at_k(samples, c, samples) for c in counts) / len(rows),
           "entropy": metrics.masked_mean(entropy, mask),
           "resp_len_mean": float(mask.sum(1).mean())}
    if template is not None:
        out["entropy/template"] = metrics.masked_mean(entropy, template.float())
        out["entropy/reasoning"] = metrics.masked_mean(entropy, mask * ~template)
    if run.task.solution_of is not None:          # countdown: several solutions per prompt
        numbers = [[int(x) for x in r["prompt"].split("->")[0].split()] for r in rows]
        out["share with >= 2 valid solutions"] = sum(
            len(countdown.distinct_solutions(ns, int(r["answer"]))) >= 2 for ns, r in zip(numbers, rows)) / len(rows)
        found = [{run.task.solution_of(rollouts.texts[j * samples + i]) for i in range(samples) if correct[j * samples + i]}
                 for j in range(len(rows))]
        solved = [f for f in found if f]
        out["share of solved prompts with >= 2 own solutions"] = sum(len(f) >= 2 for f in solved) / max(1, len(solved))
        out["own distinct solutions per solved prompt"] = sum(len(f) for f in solved) / max(1, len(solved))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.task_stats", description=__doc__.split("\n")[0])
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")   # one line, exit 2
    parser.add_argument("--data", default="countdown", choices=warmups.TASKS,
                        help="the task (one with an embedded-model warm-up)")
    parser.add_argument("--prompts", type=int, default=100, help="held-out prompts (default 100)")
    parser.add_argument("--samples", type=int, default=16, help="samples per prompt: pass@1 .. pass@samples")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.samples < 1:
        parser.error(f"--prompts and --samples must be >= 1, got {args.prompts}, {args.samples}")
    torch.set_num_threads(1)
    for key, value in task_stats(args.data, args.prompts, args.samples, args.seed).items():
        print(f"{key:48s} {value:.3f}" if isinstance(value, float) else f"{key:48s} {value}")


if __name__ == "__main__":
    sys.exit(main())
