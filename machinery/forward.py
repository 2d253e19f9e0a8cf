"""forward.py: the update's forward and backward passes. Which rollouts go through the
model, and in which chunks (the update's math is loss.py's), and UpdateConfig, the
settings of how the update runs (train.py's flags of its fields).

The update of one optimizer step computes one fixed quantity: the gradient of the step's
loss (loss.py) over the step's rollouts. How much work that takes is a separate question,
and this file holds its answers. None of them changes the gradient beyond float
rounding, and each is tested against the plain computation (tests/engine/test_train.py):

  - micro_batches: the step is cut into forward/backward chunks of <= micro_batch
    rollouts, sorted by length so that each chunk carries little padding. The step's
    normaliser is fixed before the cut (aggregation.step_normaliser), so the chunking changes
    memory, never the result.
  - carries_gradient: a rollout whose advantage is exactly 0 contributes exactly 0, so
    its forward and backward are skipped. zero_gradients keeps AdamW stepping when a
    whole step is skipped.
  - identical rollouts (the same prompt and, word for word, the same response) are run
    once: logprobs.token_logprobs(merge_duplicates=True) does it, duplicate_share
    measures it, and active_dropout says when it must be off.
  - shared prompts: each prompt of an optimizer step runs through the forward once, and
    its rollouts' responses run on its keys and values (share_prompts, backward_prompts);
    the prompt's backward runs once too, with the gradient of all its rollouts.
  - compile_for_update: torch.compile for the update's forward and backward (opt-in).

train.py's loop calls them in order, per optimizer step: micro_batches, share_prompts,
then per micro-batch `forward` and the loss's backward, then backward_prompts (the shared
prompts' backward): every backward of the update is a line of the loop. With the
speed-ups off (--no-skip_zero_adv --no-merge_duplicates, a --micro_batch as large as the
step, no --share_prompts) that is the plain update, one forward and one backward over
the whole step: the same gradient to float rounding (tests/engine/test_train.py).

TRL's GRPOTrainer and verl run every rollout through the update, copies and
zero-advantage groups included, each with its prompt. Over this project's default run
the skip and the merge together leave ~80% of the rollouts out of the forward
(frac_skipped ~0.38 plus frac_duplicate ~0.42, mean over three seeds' 300 steps;
README); on countdown nothing is merged, and sharing the prompts takes a quarter off
the token positions the update runs (docs/results.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import loss
from machinery import logprobs, rollout
from machinery.flags import FIXED, MAY_CHANGE, check_counts, refuse_nonfinite, require

MIN_GRAD_CLIP = 1e-3      # --grad_clip below this (and not 0) is refused (UpdateConfig says why)


@dataclass
class UpdateConfig:
    """How one optimizer step's update runs: its chunks, its speed-ups, its gradient clip.

    train.py's Config nests it as cfg.update; each field is the flag of its name, its
    docstring the --help. Every field but grad_clip changes memory and speed only (the
    update is the same to float rounding, tested), so --resume may change it; grad_clip
    is the run's math. The no-grad passes (the old policy's, the reference's, the
    diagnostics') read micro_batch and merge_duplicates too. Checked here, once.
    """

    micro_batch: int = field(default=32, metadata=MAY_CHANGE)
    """Rollouts per forward/backward, grouped by length (memory and speed only: the result does not depend on it)."""
    gradient_checkpointing: bool = field(default=False, metadata=MAY_CHANGE)
    """Recompute each layer's activations in the backward instead of keeping them (memory only; TRL's and verl's default for hub models)."""
    compile: bool = field(default=False, metadata=MAY_CHANGE)
    """torch.compile the policy for the update's forward and backward (verl's use_torch_compile, TRL's torch_compile); see forward.compile_for_update."""
    skip_zero_adv: bool = field(default=True, metadata=MAY_CHANGE)
    """Skip the forward/backward of rollouts whose advantage is exactly 0 (their gradient is exactly 0; speed only, see forward.carries_gradient)."""
    merge_duplicates: bool = field(default=True, metadata=MAY_CHANGE)
    """Run the forward/backward of identical rollouts (same prompt, same response) once and copy the result (exact; speed only, see logprobs.token_logprobs)."""
    share_prompts: bool = field(default=False, metadata=MAY_CHANGE)
    """Run each prompt of an optimizer step through the update's forward/backward once, not once per rollout (exact to float rounding; speed only, see forward.share_prompts). Off by default: rounding can change a later sampled token, so the default run would no longer reproduce its published numbers bit for bit; the benchmark turns it on."""
    grad_clip: float = field(default=1.0, metadata=FIXED)
    """Max global gradient norm (0 = no clipping)."""

    def __post_init__(self):
        refuse_nonfinite(self)
        check_counts(self, {"micro_batch": 1, "grad_clip": 0},
                     {"micro_batch": (2 ** 22, "a step holds at most 2**22 rollouts, and a larger micro-batch is "
                                               "the whole step")})
        # Adam divides each gradient by its root mean square plus eps = 1e-8. Clipped to a
        # global norm c, a typical weight's gradient is c / sqrt(parameters), and once that
        # nears eps the step shrinks toward nothing (--grad_clip 1e-30 trained nothing).
        # c = 1e-3 keeps it above eps up to ~10^9 parameters.
        require(self.grad_clip == 0 or self.grad_clip >= MIN_GRAD_CLIP,
                f"--grad_clip must be 0 (off) or at least {MIN_GRAD_CLIP} (a smaller norm sinks under Adam's eps "
                f"and nothing moves), got {self.grad_clip}")


# ---------------------------------------------------------------------------------------
# What the loss allows the update to leave out or cut (the predicates of the speed-ups)
# ---------------------------------------------------------------------------------------

def needs_whole_groups(cfg) -> bool:
    """True iff the loss must see each group's rollouts together: its surrogate's whole_groups
    property (loss.SURROGATES; DFPO's weight transforms).

    A transform (exchangeability.dfpo_transform) re-weights a rollout by the other rollouts of its group,
    so it only sees the part of a group that is in its call. Every place that cuts a
    batch asks this one function (cfg: loss.LossConfig): the door (an optimizer step holds whole groups:
    --minibatch_mode query or query_balanced), the micro-batching (cut at group
    boundaries, forward.micro_batches) and the zero-advantage skip (below).
    """
    return loss.SURROGATES[cfg.surrogate].whole_groups


def zero_advantage_adds_nothing(cfg) -> bool:
    """True iff a rollout with advantage exactly 0 adds exactly 0 to the loss and its gradient.

    Every surrogate multiplies a rollout's tokens by its advantage (PPO's min(rho A,
    clip(rho) A), CISPO's sg(clip(rho)) A log pi, GSPO's s_i A_i), and every aggregation
    is linear in those per-token terms with a normaliser fixed for the whole optimizer
    step (aggregation.step_normaliser): so A_i = 0 contributes exactly 0, whatever its log-probs.
    Not so with a KL penalty or an entropy bonus (those terms do not vanish with A_i),
    nor with a DFPO transform (it mixes the weights of a group). The trainer skips such
    rollouts' forward and backward (carries_gradient).
    """
    return cfg.kl_coef == 0 and cfg.entropy_coef == 0 and not needs_whole_groups(cfg)


def micro_batches(step_idx: torch.Tensor, has_grad: torch.Tensor, group_index: torch.Tensor,
                  lengths: torch.Tensor, micro_batch: int, whole_groups: bool) -> list[torch.Tensor]:
    """Split one optimizer step's rollouts into forward/backward chunks of <= micro_batch.

    step_idx: [S] the step's rollout indices (from batching); has_grad: [B] bool, the
    rollouts whose forward and backward must run (carries_gradient): the others are left
    out here, so the loop never sees them. An empty list when the step has none left.
    Rollouts are ordered by response length first (lengths: [B]), so each chunk holds
    similar lengths and token_logprobs cuts more padding columns: the same sum of
    per-rollout losses, less work (the bench measures the saving). whole_groups
    (needs_whole_groups: a DFPO transform only sees the rollouts of a group that
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
    zero_advantage_adds_nothing says so: its forward and backward are wasted work.
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


def duplicate_share(rollouts: rollout.Rollouts, has_grad: torch.Tensor) -> float:
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
    first, _ = logprobs.distinct_rows(rollouts.prompt_ids[idx], rollouts.prompt_mask[idx], rollouts.response_ids[idx],
                                      rollouts.response_mask[idx])
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


def batch_inputs(rollouts: rollout.Rollouts, idx: torch.Tensor, device) -> tuple:
    """(prompt_ids, prompt_mask, response_ids, response_mask) of rollouts idx, on `device`."""
    return tuple(t[idx].to(device) for t in (rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask))


def forward(model, rollouts: rollout.Rollouts, idx: torch.Tensor, update: UpdateConfig, temperature: float,
            with_entropy: bool = False, prompts: SharedPrompts | None = None):
    """(logp [b, T], entropy [b, T] or None) of rollouts idx under the policy, WITH grad.

    The update's forward: `model` is the (possibly compiled) training model, on the
    device of its parameters; log-probs at the sampling temperature (the distribution
    that sampled); the full-vocabulary entropy only when the loss has an entropy bonus
    (with_entropy); identical rollouts once (update.merge_duplicates). With `prompts`
    (share_prompts) the forward runs over the responses only, on the keys and values
    their prompts left.
    """
    device = _device(model)
    if prompts is None:
        inputs, prompt_kv = batch_inputs(rollouts, idx, device), None
    else:
        rows = prompts.row_of[idx.to(device)]
        inputs = (prompts.prompt_ids[rows], prompts.prompt_mask[rows], rollouts.response_ids[idx].to(device),
                  rollouts.response_mask[idx].to(device))
        prompt_kv = ([k[rows] for k in prompts.key_leaves], [v[rows] for v in prompts.value_leaves])
    with autocast(model):
        return logprobs.token_logprobs(model, *inputs, temperature=temperature, with_entropy=with_entropy,
                                       merge_duplicates=update.merge_duplicates, prompt_kv=prompt_kv)


def no_grad_pass(model, rollouts: rollout.Rollouts, update: UpdateConfig, temperature: float,
                 with_entropy: bool = False):
    """(logp [B, T], entropy [B, T] or None) of every rollout under `model`, no grad, on the CPU.

    For the sampling policy's log-probs (off-policy steps), the reference model's (KL),
    and the updated policy's (diagnostics). Chunks of update.micro_batch rollouts, at the
    sampling temperature.
    """
    B = rollouts.response_ids.shape[0]
    logps, ents = [], []
    with torch.no_grad(), autocast(model):
        for idx in torch.arange(B).split(update.micro_batch):
            lp, ent = logprobs.token_logprobs(model, *batch_inputs(rollouts, idx, _device(model)),
                                              temperature=temperature, with_entropy=with_entropy,
                                              merge_duplicates=update.merge_duplicates)
            logps.append(lp.float().cpu())
            ents.append(ent.float().cpu() if ent is not None else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


# ---------------------------------------------------------------------------------------
# Shared prompts: each prompt of an optimizer step runs through the model once
# ---------------------------------------------------------------------------------------

@dataclass
class SharedPrompts:
    """The prompts of one optimizer step, run once: their keys and values in every layer.

    n distinct prompts, P columns (the batch's prompt width less the leading columns
    that are padding in all n), the last column left out of the cache (it runs with the
    responses, so that its logits, which predict each response's first token, are
    computed in the micro-batch).
    """

    row_of: torch.Tensor
    """[B] long: rollout b's prompt is row row_of[b] (-1: not in this optimizer step)."""
    prompt_ids: torch.Tensor
    """[n, P] the distinct prompts, left-padded."""
    prompt_mask: torch.Tensor
    """[n, P] 1 on real prompt tokens."""
    keys: list
    """Per layer [n, H_kv, P - 1, D]: keys of columns 0..P-2, attached to the prompts' graph."""
    values: list
    """Per layer, the values, likewise."""
    key_leaves: list
    """keys, detached and requiring grad: each micro-batch's backward stops here and adds
    into their .grad; backward_prompts carries the sum through the prompts' graph."""
    value_leaves: list
    """values, likewise."""


def prompt_sharing_off(model, share_prompts: bool, compiled: bool, gradient_checkpointing: bool) -> str | None:
    """Why the prompts cannot be shared in this run, or None when they can.

    Off unless --share_prompts (off by default: it changes the update by float rounding,
    which can change a later sampled token); with --compile (the compiled graph is traced
    without a cache); and under gradient checkpointing, where transformers drops the cache passed
    to each layer (the responses would then not see their prompts at all).
    """
    if not share_prompts:
        return "--share_prompts is off"
    if compiled:
        return "--compile"
    if gradient_checkpointing or getattr(model, "is_gradient_checkpointing", False):
        return "gradient checkpointing"
    return None


def share_prompts(model, rollouts: rollout.Rollouts, micro: list[torch.Tensor], micro_batch: int,
                  off: str | None = None) -> SharedPrompts | None:
    """The keys and values of this optimizer step's prompts, computed once, with grad.

    The G rollouts of a prompt share its P tokens, and a causal model computes those
    positions from the prompt alone. So each distinct prompt of the step runs once (chunks of
    micro_batch prompts, without its last token), and the micro-batches run their responses
    on top of its keys and values (logprobs.token_logprobs' prompt_kv). The gradient is the
    same sum: the micro-batches' backward stops at detached copies of the keys and values
    (key_leaves) and adds up there; backward_prompts runs the prompts' backward once with
    those sums. Exact to float rounding (~1e-6 relative on the update, tested). The
    derivation and what it saves: docs/sampler.md, "Shared prompts in the update".
    model: the training model (as `forward` gets it); micro: the step's micro-batches
    (micro_batches); off: prompt_sharing_off's answer for the run. None when there is
    nothing to share (no micro-batch, every prompt one column wide) or sharing is off.
    """
    if not micro or off is not None:
        return None
    device = _device(model)
    rows = torch.cat(micro)
    ids, mask = rollouts.prompt_ids[rows], rollouts.prompt_mask[rows]
    distinct, inverse = torch.unique(torch.cat([ids, mask], dim=1), dim=0, return_inverse=True)
    P_full = ids.shape[1]
    ids, mask = distinct[:, :P_full], distinct[:, P_full:]
    p0 = int((mask != 0).any(dim=0).nonzero()[0])                 # columns padding in every prompt: cut
    ids, mask = ids[:, p0:].to(device), mask[:, p0:].to(device)
    if ids.shape[1] < 2:
        return None
    row_of = torch.full((rollouts.prompt_ids.shape[0],), -1, dtype=torch.long)
    row_of[rows] = inverse
    keys, values = [], []
    with autocast(model):
        for chunk in torch.arange(len(ids)).split(micro_batch):
            cache = DynamicCache(config=model.config)
            m = mask[chunk, :-1]
            model(input_ids=ids[chunk, :-1], attention_mask=m, position_ids=(m.cumsum(1) - 1).clamp(min=0),
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
            if any(type(layer) is not DynamicLayer for layer in cache.layers):
                return None                         # sliding windows and the like: run prompts per rollout
            keys.append([layer.keys for layer in cache.layers])
            values.append([layer.values for layer in cache.layers])
    keys = [torch.cat(per_layer) for per_layer in zip(*keys)]
    values = [torch.cat(per_layer) for per_layer in zip(*values)]
    return SharedPrompts(row_of=row_of.to(device), prompt_ids=ids, prompt_mask=mask, keys=keys, values=values,
                         key_leaves=[k.detach().requires_grad_() for k in keys],
                         value_leaves=[v.detach().requires_grad_() for v in values])


def backward_prompts(prompts: SharedPrompts | None) -> None:
    """The prompts' backward, once per optimizer step, after every micro-batch's.

    Carries the gradient the micro-batches left on the prompts' keys and values (the
    leaves' .grad, summed over every rollout of each prompt) back through the prompts'
    forward into the parameters: torch.autograd.backward(keys, grad_tensors=leaf grads).
    A no-op for None (nothing shared).
    """
    if prompts is None:
        return
    pairs = [(t, leaf.grad) for t, leaf in zip(prompts.keys + prompts.values, prompts.key_leaves + prompts.value_leaves)
             if leaf.grad is not None]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], grad_tensors=[g for _, g in pairs])


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _device(model) -> torch.device:
    """The device of a model's parameters (a compiled wrapper has no .device of its own)."""
    return next(model.parameters()).device
