"""metrics.py: the numbers a training step logs, and where they go.

Every key is listed, with its meaning and its source, in docs/metrics.md. A step's line
of metrics.jsonl is built from three calls in train.py's stage 7: step_metrics (rewards,
masses, entropy, lengths, schedule), update_metrics (mini-batches, the loss's statistics,
the work left out, gradient norms) and the diagnostics' probe; `timed` adds one
"time/<stage>" per stage of the loop. The helpers take keywords, so a call names what
it hands over.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time

import numpy as np
import torch

import batching
import mass
import tasks
from aggregation import masked_mean
from machinery import checkpoint
from machinery import forward


@contextlib.contextmanager
def timed(stage: str, times: dict):
    """Add the wall time of the `with` block to times["time/<stage>"] (as verl's _timer).

    One stopwatch per stage of the loop, named like the stage, keeps timing out of the
    loop's lines. A stage timed twice in a step adds up.
    """
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[f"time/{stage}"] = times.get(f"time/{stage}", 0.0) + time.perf_counter() - t0


def add_stats(loss_sums: dict, stats: dict) -> None:
    """Running sums of policy_loss's per-micro-batch stats: the "n_*" counts (n_tokens,
    DFPO's rollout and group counts) add up; every other stat is a token-mean of its
    micro-batch and is summed weighted by the micro-batch's n_tokens."""
    w = stats["n_tokens"]
    for key, value in stats.items():
        loss_sums[key] = loss_sums.get(key, 0.0) + (value if key.startswith("n_") else value * w)


def stat_means(loss_sums: dict, skipped_all: bool = False) -> dict:
    """The step's token-weighted means, from add_stats' sums, and DFPO's two fractions.

    With a DFPO transform, from exchangeability.dfpo_group_counts over the whole step:
      dfpo_dropped    rollouts GSPO's clip dropped / rollouts
      dfpo_one_sided  groups with both signs whose kept rollouts were left with one /
                      groups with both signs (NaN when no group had both signs)
    skipped_all: forward.carries_gradient left out every rollout (all advantages 0, one
    optimizer step per batch), so nothing was tallied; the clip fractions and approx_kl
    the full update would have logged are then exactly 0 (rho = 1), and are logged as such.
    """
    if skipped_all:
        return {"clip_frac_low": 0.0, "clip_frac_high": 0.0, "clip_frac_dual": 0.0, "approx_kl": 0.0}
    out = {key: value / loss_sums["n_tokens"] for key, value in loss_sums.items() if not key.startswith("n_")}
    if "n_groups_mixed" in loss_sums:
        out["dfpo_dropped"] = loss_sums["n_dropped"] / loss_sums["n_rollouts"]
        out["dfpo_one_sided"] = loss_sums["n_groups_one_sided"] / loss_sums["n_groups_mixed"] if loss_sums["n_groups_mixed"] \
            else math.nan
    return out


def step_metrics(*, rewards, scores, adv, entropy, mask, truncated, template, sched, hyper) -> dict:
    """The per-step numbers of docs/math.md §7: rewards, masses, entropy, lengths, schedule.

    rewards: [N, G]; scores: the checker's dicts, one per rollout; adv: [N, G]; entropy,
    mask: [B, T]; truncated: [B] bool; template: [B, T] bool (tasks.template_token_mask)
    or None for a task without one; sched: this step's scheduler output; hyper: the
    advantage's keyword arguments this step. sched/alpha and sched/delta are the alpha
    and delta the advantage used, and 1, Dr. GRPO's point, for an advantage that takes
    neither. With a template the mean entropy is also split into template tokens (the
    wording, shared by right and wrong rollouts) and reasoning tokens.
    """
    G = rewards.shape[1]
    lengths = mask.sum(1)
    split = {} if template is None else {"entropy/template": masked_mean(entropy, template.float()),
                                         "entropy/reasoning": masked_mean(entropy, mask * ~template)}
    m_S, m_F = mass.gradient_mass(adv)
    const = (rewards.max(1).values == rewards.min(1).values).float()
    return {
        "reward": float(rewards.mean()),
        **{f"reward/{key}": float(np.mean([s[key] for s in scores])) for key in scores[0] if key != "reward"},
        "solve_rate": float(rewards.mean()), "frac_all_equal": float(const.mean()),
        "adv_mean": float(adv.mean()), "adv_abs_mean": float(adv.abs().mean()),
        "m_S": float(m_S.mean() / G), "m_F": float(m_F.mean() / G),
        "entropy": masked_mean(entropy, mask), **split,
        "resp_len_mean": float(lengths.mean()), "resp_len_max": float(lengths.max()),
        "truncation_rate": float(truncated.float().mean()),
        "sched/alpha": float(hyper.get("alpha", 1.0)), "sched/delta": float(hyper.get("delta", 1.0)),
        **{f"sched/{key}": float(value) for key, value in sched.items() if key not in ("alpha", "delta")},
    }


def update_metrics(*, opt_steps, adv, lengths, mode, loss_sums, has_grad, grad_norms, duplicate_share, lr,
                   sampler_metrics) -> dict:
    """What the update did: mini-batch composition, what carried gradient (trained_metrics),
    the loss's statistics, the work left out (frac_skipped: advantage exactly 0;
    frac_duplicate: run once as a copy), the gradient norm (mean over optimizer steps), the
    learning rate, and the sampler's own metrics (vLLM's staleness check; none for ours)."""
    comps = batching.minibatch_stats(opt_steps, adv, lengths)
    return {"mb/max_pos_neg_gap": float(max(abs(c["n_pos"] - c["n_neg"]) for c in comps)),
            **trained_metrics(opt_steps, adv, mode),
            # groups only partly inside an optimizer step (their updates cannot cancel there), mean over steps
            "mb/split_groups": float(np.mean([c["n_groups"] - c["n_whole_groups"] for c in comps])),
            **stat_means(loss_sums, skipped_all=not has_grad.any()),
            "frac_skipped": 1.0 - float(has_grad.float().mean()),
            "frac_duplicate": duplicate_share,
            "grad_norm": float(np.mean(grad_norms)), "lr": lr, **sampler_metrics}


def trained_metrics(opt_steps: list[torch.Tensor], adv: torch.Tensor, mode: str) -> dict:
    """What the optimizer steps trained on, as batching.step_advantages gave it to each.

    mb/adv_abs_trained      mean |A| over every rollout of every optimizer step (below
                            adv_abs_mean only under the RECENTRED modes);
    mb/rollouts_trained     rollouts whose advantage is not 0, per optimizer step (mean over
                            the batch's optimizer steps): what carries gradient, not what is present;
    mb/prompts_trained      prompts with at least one such rollout, per optimizer step;
    mb/adv_abs_sum_trained  sum of |A| per optimizer step.
    And for every other mode that draws the same split (batching.RANDOM_SPLIT: random,
    random_recentred, random_masked), what IT would have trained on in this batch's steps:
    held/<mode>/rollouts_trained, .../prompts_trained, .../adv_abs_sum_trained. A control's
    held-fixed check (experiments/held_fixed.py HeldFixed) compares its own numbers with its
    reference's on the same batch, at every step: random_masked holds random_recentred's
    three (to rounding), random_recentred holds none of random's.
    """
    flat, G = adv.reshape(-1), adv.shape[1]
    trained = [batching.step_advantages(flat, idx, G, mode) for idx in opt_steps]
    out = {"mb/adv_abs_trained": float(torch.cat([a[idx].abs() for a, idx in zip(trained, opt_steps)]).mean())}
    others = [m for m in batching.RANDOM_SPLIT if m != mode] if mode in batching.RANDOM_SPLIT else []
    for prefix, m in [("mb/", mode)] + [(f"held/{m}/", m) for m in others]:
        counts = [batching.trained_counts(batching.step_advantages(flat, idx, G, m) if m != mode else a, idx, G)
                  for a, idx in zip(trained, opt_steps)]
        for key in ("rollouts", "prompts", "adv_abs_sum"):
            out[f"{prefix}{key}_trained"] = float(np.mean([c[key] for c in counts]))
    return out


def step_record(run, step: int, rows: list[dict], rollouts, scores: list[dict], rewards: torch.Tensor,
                entropy: torch.Tensor, schedule: dict, hyper: dict, A: torch.Tensor, opt_steps: list[torch.Tensor],
                loss_sums: dict, has_grad: torch.Tensor, grad_norms: list[float], diag, mode: str) -> dict:
    """One training step's line of metrics.jsonl: {"step", then every key of docs/metrics.md}.

    step_metrics (the batch: rewards, masses, entropy, lengths, template, schedule),
    update_metrics (the optimizer steps: mini-batches, the loss's statistics, the work left
    out, gradient norms, the learning rate, vLLM's staleness check) and the token
    diagnostics' report (nothing off a diagnostic step). rows: the step's N data rows;
    A: [N, G] advantages; diag: the step's token_diagnostics recorder; mode: --minibatch_mode.
    """
    mask = rollouts.response_mask.float()
    N, G = rewards.shape
    template = tasks.template_token_mask(run.task, run.tokenizer, rollouts.response_ids, rollouts.response_mask)
    return {"step": step,
            **step_metrics(rewards=rewards, scores=scores, adv=A, entropy=entropy, mask=mask,
                           truncated=rollouts.truncated, template=template, sched=schedule, hyper=hyper),
            **update_metrics(opt_steps=opt_steps, adv=A, lengths=mask.sum(1).view(N, G), mode=mode, loss_sums=loss_sums,
                             has_grad=has_grad, grad_norms=grad_norms,
                             duplicate_share=forward.duplicate_share(rollouts, has_grad),
                             lr=run.optimizer.param_groups[0]["lr"], sampler_metrics=run.sampler.metrics()),
            **diag.report(run.sampler, run.task, run.update, rollouts, A, rows, rewards)}


def sandbox_counts(*task_list) -> dict:
    """What the scorer sandbox did since the previous line (tasks/sandbox.py, take_counts),
    when one of the run's tasks scores there; {} otherwise (the addition run's lines have no
    such key). Keys:
      sandbox/worker_starts            worker processes started (each imports its library:
                                       seconds); a run starts one per worker and library,
                                       and one more per worker an answer broke
      sandbox/no_score                 answers that got no score (they score 0), and
      sandbox/no_score/<reason>        each reason that occurred (sandbox_reply.REASONS:
                                       timeout, crash, too_long, not_utf8, too_deep, ...)
      sandbox/missing_module           answers whose scorer needed a module the sandbox's
                                       user cannot read (said by name, once per library)
    Counted per process, so a resumed run's first line counts its workers' starts again:
    these keys, like time/*, are not part of what a resume reproduces."""
    from tasks import sandbox

    counts = sandbox.take_counts()
    if not any(task.sandboxed for task in task_list):
        return {}
    return {"sandbox/worker_starts": counts.pop("worker_starts", 0), "sandbox/no_score": counts.pop("no_score", 0),
            "sandbox/missing_module": counts.pop("missing_module", 0),
            **{f"sandbox/{name}": n for name, n in sorted(counts.items())}}


def log_metrics(out_dir: str, tracker, metrics: dict, bar) -> None:
    """Append one line to metrics.jsonl, send the same numbers to the tracker (--report_to),
    and show the headline numbers on the progress bar."""
    path = os.path.join(out_dir, "metrics.jsonl")
    try:
        with open(path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
    except OSError as e:            # a full disk: one line; a resume drops the torn last line
        checkpoint.refuse_write(e, path, f"the run stopped at step {metrics['step']}, and its checkpoints are "
                                "intact: free some space, then --resume")
    if tracker is not None:
        tracker.log(metrics, step=metrics["step"])
    if bar is not None:
        bar.set_postfix(reward=f"{metrics['reward']:.2f}", H=f"{metrics['entropy']:.2f}",
                        **({"pass@1": f"{metrics['eval/pass@1']:.2f}"} if "eval/pass@1" in metrics else {}))


NOTHING_TO_LEARN_STEPS = 10     # steps in a row with every group all-equal before the warning


def nothing_to_learn(history: list[dict], steps: int = NOTHING_TO_LEARN_STEPS) -> str | None:
    """The warning of a run that trains nothing, once, at the `steps`-th step in a row on
    which every group's rollouts had equal rewards (frac_all_equal = 1): then every
    group-relative advantage is 0 and no update happens (GRPO learns only from groups with
    both outcomes). Usually the task is out of the model's reach (all wrong: a task the
    embedded model was never warmed up on, a checker that never matches) or mastered (all
    right). None on every other step.
    """
    streak = 0
    for m in reversed(history):
        if m.get("frac_all_equal") != 1.0:
            break
        streak += 1
    if streak != steps:
        return None
    reward = history[-1].get("reward", float("nan"))
    why = ("all wrong: is the task within the model's reach, and does the checker read its answers? "
           "(RUN/samples.jsonl shows what it wrote)" if reward == 0 else
           "all right: the task is mastered" if reward == 1 else "rewards equal within each group")
    return (f"nothing to learn: every group's rollouts have had equal rewards for {steps} steps in a row "
            f"(reward {reward:.2f}, {why}), so every advantage is 0 and no update happens")


def start_line(start_eval: dict) -> dict:
    """metrics.jsonl's step 0: the starting model's held-out evaluation (train.py evaluates it
    before step 1, --eval_before_train), so every curve, TensorBoard's included, starts where
    RL starts. Only "eval/*" keys: no training happened at step 0. Readers that count training
    steps skip it (experiments/pages.py keeps the start in the run's record instead)."""
    return {"step": 0, **{k: v for k, v in start_eval.items() if k.startswith("eval/")}, "time/elapsed": 0.0}


RUN_FILES = ("config.json", "start.json", "metrics.jsonl", "samples.jsonl", "checkpoints/")
"""What a run writes into its directory besides its models (final/, best/) and its tracker's
files: the closing summary names those that exist."""


def closing_summary(out_dir: str, steps: int, minutes: float, start_eval: dict | None, last: dict | None,
                    best: dict | None, final_dir: str, tracker: str | None = None) -> str:
    """What a run says when it ends: held-out pass@1 at the start, at the end and at its best
    (with the step), every output (the run's files, its models, its tracker's files) and the
    command that plots it.

    start_eval: the step-0 evaluation (None if off); last: the last evaluation's metrics;
    best: RUN/best's info.json ({"step", "eval/pass@1"}); tracker: where --report_to keeps
    the run and how to open it (trackers.open_tracker's `where`), None for none. Example
    (the default run):
        train.py: done: 300 steps in 1.3 min; held-out pass@1 0.511 at the start, 0.896 at step 300,
          best 0.956 at step 175
          run:   runs/addition_s0 (config.json, start.json, metrics.jsonl, samples.jsonl, checkpoints/)
          model: runs/addition_s0/final (step 300) and runs/addition_s0/best (step 175):
                 AutoModelForCausalLM.from_pretrained(DIR), AutoTokenizer.from_pretrained(DIR)
          plot:  python -m tools.plot_runs runs/addition_s0 (its plots.png: pass@1, reward, entropy,
                 the cancellation residual; --dashboard: every panel)
    With --report_to tensorboard a line before the plot's names it:
          tensorboard: runs/addition_s0/tensorboard (tensorboard --logdir runs/addition_s0/tensorboard)
    """
    fmt = lambda m: f"{m['eval/pass@1']:.3f}"
    parts = []
    if start_eval and "eval/pass@1" in start_eval:
        parts.append(f"{fmt(start_eval)} at the start")
    if last and "eval/pass@1" in last:
        parts.append(f"{fmt(last)} at step {last['step']}")
    if best and "eval/pass@1" in best:
        parts.append(f"best {fmt(best)} at step {best['step']}")
    if last and "final/pass@1" in last:
        parts.append(f"{last['final/pass@1']:.3f} on the final evaluation (--final_eval)")
    scores = "held-out pass@1 " + ", ".join(parts) if parts else "no held-out evaluation (--eval_every 0)"
    best_dir = os.path.join(out_dir, checkpoint.BEST_DIR)
    model = f"{final_dir} (step {steps})" + (f" and {best_dir} (step {best['step']})" if best else "")
    files = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    return "\n".join([f"train.py: done: {steps} steps in {minutes:.1f} min; {scores}",
                      f"  run:   {out_dir} ({', '.join(files)})",
                      f"  model: {model}:",
                      "         AutoModelForCausalLM.from_pretrained(DIR), AutoTokenizer.from_pretrained(DIR)",
                      *([f"  {tracker}"] if tracker else []),
                      f"  plot:  python -m tools.plot_runs {out_dir} (its plots.png: pass@1, reward, entropy, "
                      "the cancellation residual; --dashboard: every panel)"])
