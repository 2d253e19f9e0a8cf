"""TRL's GRPOTrainer with FADE and query batching, on the embedded model, on the CPU.

    pip install -r requirements.txt -r requirements/trl.txt
    python -m integrations.trl_example --steps 3

Each step is one generation batch (--prompts x --group_size rollouts of the synthetic
addition task, scored by exact match of the answer line) that feeds --minibatches
optimizer steps, formed by batching.minibatch_indices (default "query": every group in
one step). The advantage is `fade`, its alpha and delta set by scheduler.py from the
solve rate and TRL's logged entropy (integrations/trl_grpo.py says why one batch of
lag is fine). The embedded model is tinymodel's warmed-up Llama (trained once, ~45 s,
then cached in .cache/tinymodel/). Prints one line per generation batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trl_example.py", description=__doc__.split("\n")[0])
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")   # one line, exit 2
    parser.add_argument("--steps", type=int, default=3, help="generation batches (default 3)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per generation batch (default 8)")
    parser.add_argument("--group_size", type=int, default=8, help="rollouts per prompt, G (default 8)")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps per batch (default 2)")
    parser.add_argument("--minibatch_mode", default="query", help="batching.MODES entry (default query)")
    parser.add_argument("--lr", type=float, default=4e-4, help="learning rate (default 4e-4)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "prompts", "group_size", "minibatches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.prompts * args.group_size % args.minibatches:
        parser.error(f"--prompts x --group_size ({args.prompts * args.group_size}) must split into "
                     f"--minibatches={args.minibatches} equal optimizer steps")
    torch.set_num_threads(1)
    try:                                      # before the warm-up, not after it
        from datasets import Dataset
        from trl import GRPOConfig
    except ImportError as e:
        parser.exit(2, f"{parser.prog}: error: {e.name or 'trl'} is not installed: pip install -r "
                       "requirements/trl.txt\n")
    from transformers import PrinterCallback

    from tasks import addition
    from machinery import warmups
    from integrations.trl_grpo import TokencreditGRPOTrainer
    from scheduler import SchedulerConfig

    model_dir = warmups.load_or_warmup()
    rows = addition.addition_split_rows(args.prompts * args.steps * 4, split="train", seed=args.seed)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])

    def correct(prompts, completions, answer, **kwargs):
        return [addition.TASK.check(c, a, p)["correct"] for p, c, a in zip(prompts, completions, answer)]

    out_dir = tempfile.mkdtemp(prefix="trl_example_")
    # How TRL's knobs make "one generation batch, --minibatches optimizer steps":
    # - TRL generates once every steps_per_generation optimizer steps, and each step takes
    #   per_device_train_batch_size of the rollouts (gradient_accumulation_steps=1: one
    #   micro-batch per step), so prompts x G rollouts feed `minibatches` steps.
    # - Which rollouts go together in a step is TokencreditGRPOTrainer's choice
    #   (minibatch_mode; "query" keeps every group whole, so its updates can cancel).
    # - loss_type="dapo": the token sum over the step divided by its token count, our
    #   "token-mean" aggregation. num_iterations stays 1: each rollout is used once.
    config = GRPOConfig(
        output_dir=out_dir, use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
        seed=args.seed, learning_rate=args.lr, temperature=1.0, logging_steps=1, dataloader_num_workers=0,
        num_generations=args.group_size, max_completion_length=warmups.max_response_tokens(warmups.WarmupConfig(digits=3)),
        per_device_train_batch_size=args.prompts * args.group_size // args.minibatches,
        steps_per_generation=args.minibatches, gradient_accumulation_steps=1,
        max_steps=args.steps * args.minibatches, loss_type="dapo")
    trainer = TokencreditGRPOTrainer(model=model_dir, reward_funcs=correct, args=config, train_dataset=dataset,
                                     advantage="fade", schedule=SchedulerConfig(),
                                     minibatch_mode=args.minibatch_mode)
    trainer.remove_callback(PrinterCallback)     # TRL's per-step log dicts; we print our own table
    trainer.train()

    logs = [h for h in trainer.state.log_history if "reward" in h]
    print(f"model {os.path.relpath(model_dir)}, {args.prompts} prompts x G={args.group_size} per batch, "
          f"{args.minibatches} optimizer steps per batch ({args.minibatch_mode}), output in {out_dir}")
    print("batch  reward  entropy_in  alpha  delta   p_hat  H_hat  H_target  split_groups")
    for k, (sched, log) in enumerate(zip(trainer.tokencredit_log, logs)):
        print(f"{k:5d}  {sched['solve_rate']:6.3f}  {sched['entropy']:10.4f}  {sched['alpha']:5.3f}  "
              f"{sched['delta']:5.3f}  {sched['p_hat']:6.4f}  {sched['H_hat']:5.3f}  {sched['H_target']:8.3f}  "
              f"{int(log.get('tokencredit/split_groups', 0)):12d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
