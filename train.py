"""train.py: critic-free RL (GRPO and its family) end to end: one GRPO step, on one screen.

    python train.py                        # embedded CPU default: tiny model, synthetic task
    python train.py --advantage fade --schedule fade --minibatches 4 --minibatch_mode query
    python train.py --config recipes/qwen2.5-0.5b-gsm8k.yaml     # one GPU: Qwen2.5-0.5B-Instruct, vLLM

`train(cfg)` is the lesson: a loop of STEPS (one rollout batch each) whose seven commented
stages are each a call into a chapter (the top-level files) or into one named helper of
the engine (machinery/), each timed as time/<stage>:

  1. sample       N prompts, G rollouts each             machinery/sampler.py (our sampler or vLLM)
  2. score        one reward per rollout                  verify.score: the task's checker (tasks/)
  3. old policy   the sampling policy's log-probs and     machinery/run.py old_policy_pass;
                  entropy; the schedule reads the solve   scheduler.py (FADE, or constant)
                  rate and the entropy
  4. advantages   one weight per rollout, per group       advantages.py (any registered name)
  5. split        the batch into optimizer steps, each    batching.py; aggregation.step_normaliser
                  with its normaliser
  6. update       per micro-batch: policy loss, backward; loss.py (PPO/CISPO/GSPO/DFPO, KL,
                  one Adam step per optimizer step        entropy), aggregation.py (four modes)
  7. log          metrics, token diagnostics, held-out    machinery/metrics.py, diagnostics.py,
                  evaluation, the best model, checkpoint  machinery/evaluation.py

The default run differs from textbook GRPO (Shao et al. 2024) in five ways, each a flag:
  1. token-mean aggregation (DAPO; --agg seq-mean-token-mean is GRPO's 1/|o_i|), which
     keeps a token shared by every rollout at the same weight in each (docs/math.md §3.7);
  2. no KL penalty (--kl_coef 0, as DAPO and Dr. GRPO; GRPO used 0.04 with the k3
     estimator, --kl_estimator k3);
  3. one optimizer step per rollout batch (--epochs 1 --minibatches 1), so the ratio is 1
     and the clip is inert; GRPO took several;
  4. rollouts whose advantage is exactly 0, and word-for-word copies, skip the forward
     (--skip_zero_adv, --merge_duplicates), and with --share_prompts a group's prompt runs
     once: the same gradient, less work (machinery/forward.py). Every backward is a line
     of the loop: each micro-batch's, then the shared prompts' (forward.backward_prompts).
     With --no-skip_zero_adv --no-merge_duplicates and a --micro_batch as large as the
     batch it is the plain update, equal to float rounding (tested);
  5. a tiny model trained from scratch on synthetic addition on a CPU, not a 7B model on
     math: the defaults (lr 4e-4, 32 prompts x 8 rollouts) suit that model.

The settings are machinery/config.py's Config, nesting one part per room of the engine
(cfg.sampling, cfg.update, cfg.evaluation, cfg.diagnostics, each defined in the file that
reads it) and the chapters' (cfg.loss, cfg.sched, cfg.adv): every field a flag, its
docstring the help; `--config FILE` reads a run's config.json or a YAML recipe, flags
winning; checks at the door: a bad value, or a flag that would change nothing, is one
line and exit code 2. The set-up is machinery/setup.py's (it also derives, once, what
the loop reads off the run: run.on_policy, run.may_skip, run.group_index, ...), the
plumbing (checkpoints, sampling, metrics) machinery/'s. The loop's stages are marked `# ALGO LOGIC`, the plumbing around them
`# TRY NOT TO MODIFY` (as cleanrl marks them). Every random draw comes from one of four
seeded streams, all in each checkpoint: a run killed and resumed reproduces the
uninterrupted run exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import torch
from tqdm import tqdm

import advantages
import aggregation
import batching
import loss
import verify
from aggregation import masked_mean
from machinery import checkpoint, checks, evaluation, forward
from machinery import token_diagnostics
from machinery.config import Config, advantage_hyper, hyper_defaults, parse_args, warn  # noqa: F401
from machinery.metrics import add_stats, log_metrics, nothing_to_learn, sandbox_counts, step_record, timed
from machinery.run import Run, close, keep_best, keep_final, old_policy_pass, on_device, open_run_dir, optimizer_step
from machinery.run import repeat, save_checkpoint, take
from machinery.setup import setup
from tasks.user_reward import RewardError


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------

def train(cfg: Config, run: Run | None = None) -> list[dict]:
    """Train for cfg.steps rollout batches; every step's metrics. `run`: from setup, to keep the model."""
    # TRY NOT TO MODIFY: set-up, resume, the start, the clock and the progress bar
    run = run or setup(cfg)                 # also what the loop derives: run.on_policy, run.may_skip, ...
    start = open_run_dir(run, cfg.out_dir, dataclasses.asdict(cfg), cfg.resume, cfg.overwrite, cfg.report_to,
                         cfg.project, cfg.run_name)
    ev, up = cfg.evaluation, cfg.update
    if not start:                  # start.json, and with its evaluation metrics.jsonl's step 0 and RUN/best
        evaluation.record_start(run, cfg.out_dir, cfg.model, (lambda: evaluate(run, cfg, step=0))
                                if ev.eval_before_train and ev.eval_every else None,
                                evaluation.eval_budget(ev, cfg.data)[1])
    best = checkpoint.model_info(os.path.join(cfg.out_dir, checkpoint.BEST_DIR))   # the model at its best held-out pass@1
    N, G = cfg.prompts_per_step, cfg.group_size
    history, t_start = [], time.perf_counter()
    minutes = lambda: (time.perf_counter() - t_start) / 60
    bar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, desc="RL", dynamic_ncols=True)
    for step in bar:
        times = {}                                                  # "time/<stage>" -> seconds, filled by timed()
        # ALGO LOGIC
        # 1. sample: N prompts, G rollouts each, from the current policy
        with timed("sample", times):
            rows = [run.train_rows[run.py_rng.randrange(len(run.train_rows))] for _ in range(N)]
            rollouts = run.sampler.sample([r["prompt"] for r in rows], G, step)
        mask = rollouts.response_mask.float()
        diag = token_diagnostics.diagnostics_for_step(cfg.diagnostics, step, mask, cfg.seed)  # no-op off its steps

        # 2. score: one reward per rollout, from the task's checker
        with timed("score", times):
            scores = verify.score(rollouts.texts, repeat([r["answer"] for r in rows], G), run.task,
                                  repeat([r["prompt"] for r in rows], G))
            rewards = verify.reward_tensor(scores).view(N, G)

        # 3. old policy: log-probs (None on-policy: the update's own) and entropy; the schedule reads them
        with timed("old_policy", times):
            old_logp, entropy = old_policy_pass(run, rollouts)
            ref_logp = (forward.no_grad_pass(run.ref_model, rollouts, up, cfg.sampling.temperature)[0]
                        if run.ref_model else None)
            schedule = run.scheduler.step(float(rewards.mean()), masked_mean(entropy, mask))

        # 4. advantages: G rewards -> G weights, per group (hyper-parameters: the flags', or the schedule's)
        with timed("advantages", times):
            hyper = advantage_hyper(cfg, schedule)
            A = advantages.compute_advantages(cfg.advantage, rewards, lengths=mask.sum(1).view(N, G), **hyper)

        # 5. split: epochs x minibatches optimizer steps, each with its normaliser fixed for the step
        with timed("split", times):
            lengths = mask.sum(1).view(N, G)
            opt_steps = [idx for _ in range(cfg.epochs) for idx in batching.minibatch_indices(
                A, cfg.minibatches, cfg.minibatch_mode, run.mb_generator, lengths)]
            norms = [aggregation.step_normaliser(mask[idx], max_len=cfg.sampling.max_new_tokens) for idx in opt_steps]
            has_grad = forward.carries_gradient(A.reshape(-1), may_skip=run.may_skip and not diag.active)  # A=0: no work
            batch = on_device(run.model.device, A=A.reshape(-1).float(), mask=mask, group=run.group_index,
                              old=old_logp, ref=ref_logp)           # per-rollout tensors, indexed per micro-batch

        # 6. update: per micro-batch the policy loss and its backward; one Adam step per optimizer step
        with timed("update", times):
            loss_sums, grad_norms = {}, []
            set_learning_rate(run.optimizer, cfg, step)             # --lr_warmup_steps
            run.model.train()
            for step_idx, norm in zip(opt_steps, norms):
                A_step = batching.step_advantages(batch.A, step_idx, G, cfg.minibatch_mode)  # random_recentred re-centres
                micro = forward.micro_batches(step_idx, has_grad, run.group_index, lengths.reshape(-1),
                                              up.micro_batch, run.whole_groups)     # A = 0 left out; by length
                prompts = forward.share_prompts(run.train_model, rollouts, micro, up.micro_batch, run.sharing_off)
                for idx in micro:
                    logp, ent = forward.forward(run.train_model, rollouts, idx, up, cfg.sampling.temperature,
                                                with_entropy=cfg.loss.entropy_coef > 0, prompts=prompts)
                    old = logp.detach() if batch.old is None else batch.old[idx]    # on-policy: the ratio is exactly 1
                    A_i, mask_i, group_i = A_step[idx], batch.mask[idx], batch.group[idx]
                    l, stats = loss.policy_loss(logp, old, A_i, mask_i, cfg=cfg.loss, norm=norm, group_index=group_i,
                                                ref_logp=take(batch.ref, idx), entropy=ent)
                    l.backward()
                    add_stats(loss_sums, stats)
                    diag.micro_batch(idx, logp, old, A_i, mask_i, group_i, cfg.loss, norm)   # the residual's m_i
                forward.backward_prompts(prompts)                  # the shared prompts' backward (None: a no-op)
                diag.optimizer_step(step_idx, run.group_index)                       # the residual of whole groups
                grad_norms.append(optimizer_step(run, up.grad_clip))
            run.model.eval()
        stop_if_not_finite(run, cfg, step, grad_norms)             # inf or NaN: nothing applied, one line

        # 7. log: metrics, token diagnostics, evaluation, the best model, checkpoint
        with timed("log", times):
            metrics = step_record(run, step, rows, rollouts, scores, rewards, entropy, schedule, hyper, A, opt_steps,
                                  loss_sums, has_grad, grad_norms, diag, cfg.minibatch_mode)   # every key
            run.sampler.sync()                          # a sampler keeping its own copy of the policy: updated
        last = step == cfg.steps or bool(cfg.max_minutes and minutes() > cfg.max_minutes)
        if ev.eval_every and (step % ev.eval_every == 0 or last):
            with timed("evaluate", times):
                metrics.update(evaluate(run, cfg, step, last))
            best = keep_best(run, cfg.out_dir, metrics, best)       # RUN/best: a new high of held-out pass@1
        metrics.update(times, **{"time/elapsed": 60 * minutes()}, **sandbox_counts(run.task, run.eval_task))
        log_metrics(cfg.out_dir, run.tracker, metrics, bar)
        history.append(metrics)
        if note := nothing_to_learn(history):                      # every group all-equal, step after step
            warn(note)
        if (cfg.save_every and step % cfg.save_every == 0) or last:
            save_checkpoint(run, cfg.out_dir, step, config=dataclasses.asdict(cfg))
        if last:
            break
    keep_final(run, cfg.out_dir, history[-1]["step"] if history else start, best, minutes())   # RUN/final, the summary
    close(run)                                                      # another process may write here now
    return history


# ---------------------------------------------------------------------------------------
# The loop's own helpers: evaluation, the learning rate, a step that diverged
# ---------------------------------------------------------------------------------------

def evaluate(run: Run, cfg: Config, step: int, last: bool = False) -> dict:
    """Held-out pass@k (machinery/evaluation.py) at --eval_temperature, by default the training
    one; after the last step also the final evaluation (--final_eval: final/pass@k)."""
    settings = (cfg.evaluation, cfg.data, cfg.sampling.temperature, cfg.seed, cfg.out_dir)
    out = evaluation.evaluate(run, step, *settings)
    if last and run.final_eval_rows is not None:
        out.update(evaluation.evaluate(run, step, *settings, rows=run.final_eval_rows, prefix="final/"))
    return out


def set_learning_rate(optimizer: torch.optim.Optimizer, cfg: Config, step: int) -> None:
    """lr_t = lr x min(1, t / W) for training step t = 1, 2, ... (W = --lr_warmup_steps; 0: lr).

    A linear warm-up, then constant: verl's default schedule (lr_scheduler_type constant
    with lr_warmup_steps), counted in training steps as verl counts them. Step 1 trains at
    lr / W, not at 0 as transformers' and verl's schedulers start (a step spent on
    nothing). A function of the step alone, so a resumed run sets the same rates.
    """
    if cfg.lr_warmup_steps:
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * min(1.0, step / cfg.lr_warmup_steps)


class NotFinite(checks.UsageError):
    """A step whose gradient norm is inf or NaN: the run stops, in one line (exit code 2).

    Its cause is nearly always a setting, a coefficient or learning rate far too large,
    so the remedy is a flag, and a traceback would point at the optimizer, not at it; a
    type of its own so that a caller (a sweep) can tell a run that diverged from one
    refused at the checks. Before, such a run went on: every step's update was inf * 0 or
    NaN, the weights never changed (or became NaN), and it exited 0.
    """


def stop_if_not_finite(run: Run, cfg: Config, step: int, grad_norms: list[float]) -> None:
    """Raise NotFinite if a gradient norm of this step is inf or NaN, naming the likely flag.

    optimizer_step did not apply the optimizer step whose norm it was (no NaN reaches the
    weights), and nothing of this training step is logged or saved: metrics.jsonl and the
    checkpoints end at the last good step. A NaN or inf loss always shows here too, since its gradient is NaN or inf.
    The likely flag: of the coefficients that scale the gradient or the weights, the one
    farthest above its usual value (in powers of ten).
    """
    bad = next((norm for norm in grad_norms if not math.isfinite(norm)), None)
    if bad is None:
        return
    usual = {"kl_coef": 0.04, "entropy_coef": 0.01, "lr": Config.lr, "weight_decay": 0.1}
    value = {"kl_coef": cfg.loss.kl_coef, "entropy_coef": cfg.loss.entropy_coef, "lr": cfg.lr,
             "weight_decay": cfg.weight_decay}
    for name, default in hyper_defaults(cfg.advantage).items():     # the advantage's own, vs its defaults
        if isinstance(default, float) and default and getattr(cfg.adv, name) is not None:
            usual[name], value[name] = abs(default), abs(getattr(cfg.adv, name))
    above = [(math.log10(value[n] / usual[n]), f"--{n} {value[n]:g}") for n in usual if value[n] > usual[n]]
    cause = (f"{max(above)[1]} is the likely cause" if above else
             "no coefficient is above its usual value: lower --lr" + (", or clip with --grad_clip" if not
                                                                      cfg.update.grad_clip else ""))
    close(run)                                                  # the tracker, and out_dir's lock
    raise NotFinite(f"step {step}: gradient norm is {bad}; {cause} (nothing of this step was logged or saved)")


def main(argv: list[str] | None = None) -> None:
    checks.exit_with_parent()
    cfg = parse_args(argv)
    try:
        train(cfg)
    except (checks.UsageError, RewardError) as e:
        # What the user gave was found wrong at the door (a data file, a model path, a run
        # directory), or their --reward function returned no reward or did not return in
        # time: one line, exit code 2 (metrics.jsonl and the checkpoints keep every step
        # before). Any other exception is a bug, the user's or ours, and keeps its
        # traceback, which says where it is.
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
