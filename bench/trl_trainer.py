"""trl_trainer.py: TRL's GRPOTrainer doing our step's work, and the clocks both trainers are timed with.

bench/__main__.py runs it beside train.py on the same prompts (python -m bench), bench/smollm2.py
on the real model. `work` is ours.Work (model, data, prompts_per_step, group_size,
max_new_tokens, temperature, lr, chat_template), `rows` ours.work_rows' prompts.

How TRL is configured, and why (read from TRL 1.16.0's GRPOConfig / GRPOTrainer):
- per_device_train_batch_size=32, gradient_accumulation_steps=8, steps_per_generation=8
  (with --micro_batch 32, the default of both; in general 256 / micro_batch): one
  generate() of 8 x 32 = 256 completions = 32 prompts x num_generations=8, then eight
  forward/backward micro-batches of 32 and ONE optimizer step, like ours with
  --micro_batch 32.
  Because gradient_accumulation_steps is a multiple of steps_per_generation x
  num_iterations, TRL skips its old-log-prob pass and uses logp.detach() (on-policy).
- beta=0 (no reference model), num_iterations=1, epsilon=0.2, loss_type="dapo" (token
  sum over the whole accumulated batch / its token count = our "token-mean"),
  scale_rewards="group" (std-normalised advantage = our "grpo"), max_grad_norm=1.
- the work's temperature (1; the real model's 0.7), top_p=1, top_k=0 (pure sampling, like
  ours), no vLLM.
- the work's learning rate with lr_scheduler_type="constant" (Trainer's default is a
  linear decay to 0), weight_decay=0, AdamW: the Trainer's default optim, PyTorch's fused
  AdamW kernel ("adamw_torch_fused"), where train.py takes torch.optim.AdamW's default
  (the same update, other rounding; the real model's profile times both). bf16=False and
  gradient_checkpointing=False:
  GRPOConfig turns both ON by default. bf16 autocast would change what is computed
  (ours runs in float32); checkpointing recomputes activations in the backward, which
  costs time that our loop does not spend.
- use_cpu, report_to="none", logging_strategy="no", save_strategy="no", no tqdm.

The clocks. stage_clock wraps the functions that do a step's stages (the update's forward
and backward, the gradient clip, AdamW's step; train.py's sampler and prompt sharing for
ours) so that every call adds its wall seconds to a named stage; events_between sums them
per step. The process's peak resident set size (VmHWM) comes from ours.peak_rss_mb.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time

import torch

import tasks
import verify
from bench.ours import Work, peak_rss_mb, reset_peak_rss


# ---------------------------------------------------------------------------------------
# TRL's side
# ---------------------------------------------------------------------------------------

def measure_trl(model_dir: str, work: Work, rows: list[list[dict]], warmup: int, steps: int, seed: int,
                micro_batch: int, compiled: bool = False, stages: bool = False) -> dict:
    """TRL 1.16.0's GRPOTrainer on the same prompts; per-step numbers of the measured steps.

    rows: work_rows' [step][prompt]. A chat work gives TRL conversational prompts
    ([{"role": "user", ...}]), which it renders with the tokenizer's chat template as ours
    does; "prompt_ids" holds the first step's prompt tokens TRL gave generate(), one row
    per prompt, for the identical-work check. stages: also time each step's forward,
    backward and AdamW step outside generate() (stage_clock), as split["..."].
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from machinery.sampler import format_prompts

    n, G = warmup + steps, work.group_size
    as_prompt = (lambda p: [{"role": "user", "content": p}]) if work.chat_template else (lambda p: p)
    text = lambda x: x if isinstance(x, str) else x[-1]["content"]      # a conversational turn's text
    dataset = Dataset.from_list([{"prompt": as_prompt(r["prompt"]), "answer": r["answer"]} for step in rows[:n]
                                 for r in step])
    calls = []

    def exact_reward(prompts, completions, answer, completion_ids, **_):
        """verify.py's exact checker of the task, the same reward train.py uses ("reward" = "correct")."""
        prompts, completions = [text(p) for p in prompts], [text(c) for c in completions]
        rewards = [s["reward"] for s in verify.score(completions, list(answer), tasks.get(work.data), prompts)]
        calls.append({"prompts": list(prompts[::G]), "reward": sum(rewards) / len(rewards),
                      "tokens": float(sum(len(ids) for ids in completion_ids))})
        return rewards

    clock = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kwargs):
            clock.append((time.perf_counter(), time.process_time()))

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen_seconds, prompt_ids, generating = [], [], [False]
    generate = model.generate

    def timed_generate(*args, **kwargs):          # TRL samples with the model's own generate
        if not prompt_ids:                        # the first call's prompts, left padding removed
            ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
            prompt_ids.extend(row[m.bool()].tolist() for row, m in zip(ids[::G], mask[::G]))
        t, generating[0] = time.perf_counter(), True
        try:
            return generate(*args, **kwargs)
        finally:
            generating[0] = False
            gen_seconds.append(time.perf_counter() - t)

    model.generate = timed_generate
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, report_to="none", seed=seed,
        max_steps=n, learning_rate=work.lr, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=work.prompts_per_step * G // micro_batch,
        steps_per_generation=work.prompts_per_step * G // micro_batch,
        num_generations=G, max_completion_length=work.max_new_tokens, temperature=work.temperature, top_p=1.0,
        top_k=0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        shuffle_dataset=False, bf16=False, gradient_checkpointing=False, use_vllm=False, torch_compile=compiled,
        logging_strategy="no", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_reward, args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[StepClock()])
    # the update's forward: the model's forward outside generate() (generate calls it too)
    forward_outside = [(model, "forward", "forward", lambda: not generating[0])] if stages else []
    reset_peak_rss()
    with contextlib.redirect_stdout(io.StringIO()), \
            stage_clock(forward_outside + (UPDATE_STAGES if stages else [])) as events:   # the Trainer prints a summary
        trainer.train()
    out = {"peak_rss_mb": peak_rss_mb(), "steps": [], "threads": torch.get_num_threads(),
           "prompts": [format_prompts(c["prompts"], trainer.processing_class, work.chat_template) for c in calls],
           "prompt_ids": prompt_ids}
    for k in range(warmup, n):
        step = {"wall": clock[k + 1][0] - clock[k][0], "cpu": clock[k + 1][1] - clock[k][1],
                "reward": calls[k]["reward"], "tokens": calls[k]["tokens"], "sample": gen_seconds[k]}
        if stages:
            step["split"] = {"generate": gen_seconds[k], **events_between(events, clock[k][0], clock[k + 1][0])}
        out["steps"].append(step)
    return out


# ---------------------------------------------------------------------------------------
# Clocks: each call of a stage's function timed; the process's peak memory
# ---------------------------------------------------------------------------------------

# What stage_clock times, as (owner, attribute, name): a call of owner.attribute adds its wall
# seconds to `name`. Both trainers: the update's backward, the gradient clip and AdamW's step.
UPDATE_STAGES = [(torch.Tensor, "backward", "backward"), (torch.nn.utils, "clip_grad_norm_", "clip"),
                 (torch.optim.AdamW, "step", "AdamW step")]


@contextlib.contextmanager
def stage_clock(targets: list[tuple]):
    """Wrap each target's function so that each call is timed; yields the list of events.

    targets: (owner, attribute, name) or (owner, attribute, name, when): when() False at the
    call leaves it untimed (TRL's forward inside generate). An event is (start, seconds,
    name); a call inside a call of the same name (token_logprobs calling itself to merge
    copies) counts once. Everything is restored on exit.
    """
    events, saved, inside = [], [], set()
    for owner, attr, name, *when in targets:
        original = getattr(owner, attr)

        def timed(*a, _original=original, _name=name, _when=(when[0] if when else None), **k):
            if _name in inside or (_when is not None and not _when()):
                return _original(*a, **k)
            inside.add(_name)
            t = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                inside.discard(_name)
                events.append((t, time.perf_counter() - t, _name))
        saved.append((owner, attr, original, attr in vars(owner)))
        setattr(owner, attr, timed)
    try:
        yield events
    finally:
        for owner, attr, original, own in reversed(saved):
            if own:
                setattr(owner, attr, original)
            else:                       # an instance's attribute that came from its class: remove ours
                delattr(owner, attr)


def events_between(events: list[tuple], t0: float, t1: float) -> dict:
    """Seconds per stage name of the events that started in [t0, t1)."""
    out = {}
    for start, seconds, name in events:
        if t0 <= start < t1:
            out[name] = out.get(name, 0.0) + seconds
    return out
