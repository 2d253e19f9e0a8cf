"""forward.py: the update's forward and backward passes. Which rollouts go through the
model, and in which chunks (the update's math is loss.py's).

The update of one optimizer step computes one fixed quantity: the gradient of the step's
loss (loss.py) over the step's rollouts. How much work that takes is a separate question,
and this file holds its answers. None of them changes the gradient beyond float
rounding, and each is tested against the plain computation (tests/test_train.py):

  - micro_batches: the step is cut into forward/backward chunks of <= micro_batch
    rollouts, sorted by length so that each chunk carries little padding. The step's
    normaliser is fixed before the cut (loss.step_normaliser), so the chunking changes
    memory, never the result.
  - carries_gradient: a rollout whose advantage is exactly 0 contributes exactly 0, so
    its forward and backward are skipped. zero_gradients keeps AdamW stepping when a
    whole step is skipped.
  - identical rollouts (the same prompt and, word for word, the same response) are run
    once: rollout.token_logprobs(merge_duplicates=True) does it, duplicate_share
    measures it, and active_dropout says when it must be off.
  - compile_for_update: torch.compile for the update's forward and backward (opt-in).

TRL's GRPOTrainer and verl run every rollout through the update, copies and
zero-advantage groups included. Over this project's default run the skip and the merge
together leave ~80% of the rollouts out of the forward (frac_skipped ~0.38 plus
frac_duplicate ~0.42, mean over three seeds' 300 steps; README).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from machinery import rollout


@dataclass(frozen=True)
class Passes:
    """How every forward pass over rollouts runs: the same for the update and the no-grad passes."""

    temperature: float = 1.0
    """The sampling temperature: log-probs are taken under the distribution that sampled."""
    micro_batch: int = 32
    """Rollouts per forward (memory and speed only)."""
    merge_duplicates: bool = True
    """Run identical rollouts once and copy the result (rollout.token_logprobs)."""


def micro_batches(step_idx: torch.Tensor, has_grad: torch.Tensor, group_index: torch.Tensor,
                  lengths: torch.Tensor, micro_batch: int, whole_groups: bool) -> list[torch.Tensor]:
    """Split one optimizer step's rollouts into forward/backward chunks of <= micro_batch.

    step_idx: [S] the step's rollout indices (from batching); has_grad: [B] bool, the
    rollouts whose forward and backward must run (carries_gradient): the others are left
    out here, so the loop never sees them. An empty list when the step has none left.
    Rollouts are ordered by response length first (lengths: [B]), so each chunk holds
    similar lengths and token_logprobs cuts more padding columns: the same sum of
    per-rollout losses, less work (the bench measures the saving). whole_groups
    (loss.needs_whole_groups: a DFPO transform only sees the rollouts of a group that
    are in its call): the chunks are cut at group boundaries instead, so a group larger
    than micro_batch stays whole in one chunk.
    """
    step_idx = step_idx[has_grad[step_idx]]
    if len(step_idx) == 0:                     # every rollout of the step skipped (carries_gradient)
        return []
    if not whole_groups:
        return list(step_idx[lengths[step_idx].argsort(stable=True)].split(micro_batch))
    chunks, current = [], []
    chunk = lambda rows: torch.tensor(rows, dtype=torch.long, device=step_idx.device)   # where step_idx is
    for g in torch.unique_consecutive(group_index[step_idx]).tolist():
        members = step_idx[group_index[step_idx] == g].tolist()
        if current and len(current) + len(members) > micro_batch:
            chunks.append(chunk(current))
            current = []
        current += members
    if current:
        chunks.append(chunk(current))
    return chunks


def carries_gradient(adv: torch.Tensor, may_skip: bool) -> torch.Tensor:
    """[B] bool: the rollouts whose forward and backward the update must run.

    A rollout with A_i = 0 exactly adds exactly 0 to the loss and to its gradient when
    loss.zero_advantage_adds_nothing says so: its forward and backward are wasted work.
    In GRPO these are the groups that all succeeded or all failed: ~20% of the rollouts
    at the start of the default run, more as the solve rate climbs. Skipping them
    changes the update only by float rounding (tested), and is NOT DAPO's dynamic
    sampling, which drops such groups from the normaliser too. The trainer allows it
    (may_skip) only with ONE optimizer step per batch, where the logged clip fractions
    and approx_kl are 0 for every rollout anyway, and not on diagnostic steps, which
    need every rollout's log-probs. adv: [B]. Returns [B] bool (all True: no skip).
    """
    if not may_skip:
        return torch.ones_like(adv, dtype=torch.bool)      # on adv's device, like `adv != 0` below
    return adv != 0


def zero_gradients(model) -> None:
    """Zero (not None) gradients: what backward would have left if every rollout had run.

    When carries_gradient skips every rollout of an optimizer step, no backward runs and
    the gradients are None; AdamW then skips those parameters entirely, whereas a zero
    gradient still moves them (the momentum m keeps going, m / sqrt(v) != 0). Setting
    zeros keeps the skip exact for every parameter the forward uses (all of a causal LM's).
    A trainable parameter the forward never touches would get None from a real backward
    and a zero here: different only with weight decay, which then shrinks it.
    """
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def duplicate_share(ro: rollout.Rollouts, has_grad: torch.Tensor) -> float:
    """Share of the batch's rollouts that go through the update as a copy of another one.

    Among the rollouts the update runs (has_grad: [B] bool), those that repeat another
    one word for word (same prompt, same response): the work merge_duplicates saves,
    roughly (it merges within a micro-batch, and a cut between micro-batches can separate
    two copies). Returned as a share of all B rollouts, so with merge_duplicates on (the
    default) frac_skipped + frac_duplicate is about the share of the batch the update's
    forward does not run. Logged either way: it also measures how much a policy repeats
    itself.
    """
    idx = has_grad.nonzero().squeeze(1)
    if len(idx) == 0:
        return 0.0
    first, _ = rollout.distinct_rows(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.response_ids[idx],
                                     ro.response_mask[idx])
    return (len(idx) - len(first)) / len(has_grad)


def active_dropout(model) -> list[str]:
    """The model's dropout settings that are > 0: config fields (attention_dropout,
    hidden_dropout, resid_pdrop, ...) and torch.nn.Dropout modules. Llama and Qwen configs
    have 0 everywhere; GPT-2's have 0.1. Empty list: the training forward is deterministic."""
    found = [f"{key}={value}" for key, value in model.config.to_dict().items()
             if ("dropout" in key or "pdrop" in key) and type(value) in (int, float) and value > 0]
    return found + [f"{name} p={m.p}" for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Dropout) and m.p > 0]


def compile_for_update(model) -> torch.nn.Module:
    """torch.compile(model, dynamic=True): the module the update's forward and backward call.

    The compiled wrapper shares the model's parameters (the optimizer, checkpoints and
    weight pushes keep using `model`). dynamic=True: one graph for every micro-batch
    width and length, instead of a recompile per shape. Only the update is compiled:
    the sampler's KV-cached loop changes its batch and cache shapes every few tokens,
    and the no-grad passes are a small share of a step. On a CPU the
    update's fused element-wise ops (RMSNorm, rotary, SwiGLU) make it faster per step,
    but the first compile costs about as much as a whole default run: a gain only for
    runs long enough to pay it back (the bench's numbers: docs/results.md). Off-policy, the old-policy pass stays eager,
    so the first ratio of a batch is 1 only to float rounding (~1e-6), not exactly.
    """
    return torch.compile(model, dynamic=True)


# ---------------------------------------------------------------------------------------
# Forward passes: the update's, and the no-grad passes around it
# ---------------------------------------------------------------------------------------

def autocast(model):
    """bf16 autocast on CUDA, a no-op on CPU.

    The weights stay fp32 ("master weights") and AdamW updates them in fp32: at RL
    learning rates (~1e-6) a pure-bf16 update falls below bf16's resolution (8 bits of
    mantissa) and is rounded away. Forwards run in bf16 under autocast; the weights pushed
    to a vLLM engine are cast to its dtype there. Not run on a GPU here.
    """
    device = _device(model)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def batch_inputs(ro: rollout.Rollouts, idx: torch.Tensor, device) -> tuple:
    """(prompt_ids, prompt_mask, response_ids, response_mask) of rollouts idx, on `device`."""
    return tuple(t[idx].to(device) for t in (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask))


def forward(model, ro: rollout.Rollouts, idx: torch.Tensor, passes: Passes, with_entropy: bool = False):
    """(logp [b, T], entropy [b, T] or None) of rollouts idx under the policy, WITH grad.

    The update's forward: `model` is the (possibly compiled) training model, on the
    device of its parameters; the full-vocabulary entropy only when the loss has an
    entropy bonus (with_entropy).
    """
    with autocast(model):
        return rollout.token_logprobs(model, *batch_inputs(ro, idx, _device(model)), temperature=passes.temperature,
                                      with_entropy=with_entropy, merge_duplicates=passes.merge_duplicates)


def no_grad_pass(model, ro: rollout.Rollouts, passes: Passes, with_entropy: bool = False):
    """(logp [B, T], entropy [B, T] or None) of every rollout under `model`, no grad, on the CPU.

    For the sampling policy's log-probs (off-policy steps), the reference model's (KL),
    and the updated policy's (diagnostics). Chunks of passes.micro_batch rollouts.
    """
    B = ro.response_ids.shape[0]
    logps, ents = [], []
    with torch.no_grad(), autocast(model):
        for idx in torch.arange(B).split(passes.micro_batch):
            lp, ent = rollout.token_logprobs(model, *batch_inputs(ro, idx, _device(model)),
                                             temperature=passes.temperature, with_entropy=with_entropy,
                                             merge_duplicates=passes.merge_duplicates)
            logps.append(lp.float().cpu())
            ents.append(ent.float().cpu() if ent is not None else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def _device(model) -> torch.device:
    """The device of a model's parameters (a compiled wrapper has no .device of its own)."""
    return next(model.parameters()).device
