"""logprobs.py: the log-probability of every token of given responses, in one forward.

Critic-free RL (GRPO and its family, Shao et al. 2024) samples G responses o_1..o_G per
prompt q (machinery/sampler.py), and then every quantity of the update is built from one
number per response token, its log-probability under a policy:

    logp[b, t] = log pi(o_{b,t} | q_b, o_{b,<t})

under the policy being trained (the update's forward: the policy gradient, the PPO ratio
rho = exp(logp - logp_old)), under the weights that sampled (the "old policy" pass, verl's
recompute_log_prob, when several optimizer steps share a batch), under a frozen reference
(the KL penalty), and under the updated weights (the token diagnostics). The vLLM
staleness canary compares the trainer's with the engine's. All of them are this file's
`token_logprobs`: teacher-forced, the responses given, with the full-vocabulary entropy
of each next-token distribution beside it when asked.

Conventions as machinery/rollout.py's: B rollouts; prompts LEFT-padded [B, P], responses
RIGHT-padded [B, T]; a float response mask, 1 on real tokens (a generated EOS included);
natural logs, entropy in nats; outputs 0 on padding.

Temperature T is applied as the sampler applies it, log softmax(z / T), so logp is the
log-probability of the distribution that was sampled. A truncation of the sampling
(top_p < 1) is NOT applied: the scored log-probs are those of the tempered, untruncated
policy, the policy the gradient acts on (as in verl and TRL).

Exactness, and what each speed-up saves (padding columns not run, identical rows run
once, prompts run once per group): docs/sampler.md, "Log-probs of given responses". The
sampler's own log-probs (Rollouts.engine_logp) agree with these to ~1e-6, not bit for
bit (incremental decoding sums in another order), so the trainer takes logp_old from
here, or from its own update's forward, never from the sampler.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache


def token_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                   response_mask: Tensor, temperature: float = 1.0, with_entropy: bool = False,
                   merge_duplicates: bool = False, prompt_kv: tuple | None = None) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and entropies) of the responses under `model`, in one forward.

        logp[b, t] = log softmax(z_{b,t} / T)[response_ids[b, t]];   entropy[b, t] = -sum_v p_v log p_v

    z_{b,t}: the logits that predict response token t (the output one position earlier).
    prompt_ids/prompt_mask [B, P] left-padded, response_ids/response_mask [B, T]; position ids
    cumsum(mask) - 1, as rollout.sample numbers them; columns padded in every row are not run.
    Returns (logp [B, T], entropy [B, T] or None), float32, 0 where response_mask is 0;
    differentiable (call under no_grad for old and reference log-probs). The same rows give
    the same bits; a row in another set of rows agrees to ~1e-6 (the width sets the rounding).
    merge_duplicates: each distinct row computed once, its outputs and gradients shared (not
    with active dropout). prompt_kv: per layer (keys, values) [B, H_kv, P - 1, D] of the
    prompts (forward.share_prompts); the forward then runs from the last prompt column.
    Why each choice is exact, and what it saves: docs/sampler.md, "Log-probs of given responses".
    temperature: the run's, whose range SamplingConfig checked (machinery/sampler.py).
    """
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ValueError(f"shape mismatch: prompt_ids {tuple(prompt_ids.shape)} vs mask {tuple(prompt_mask.shape)}, "
                         f"response_ids {tuple(response_ids.shape)} vs mask {tuple(response_mask.shape)}")
    if prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(f"batch mismatch: {prompt_ids.shape[0]} prompts vs {response_ids.shape[0]} responses")
    if merge_duplicates:
        first, copy_of = distinct_rows(prompt_ids, prompt_mask, response_ids, response_mask)
        kv = None if prompt_kv is None else tuple([t[first] for t in part] for part in prompt_kv)
        logp, entropy = token_logprobs(model, prompt_ids[first], prompt_mask[first], response_ids[first],
                                       response_mask[first], temperature, with_entropy, prompt_kv=kv)
        return logp[copy_of], (None if entropy is None else entropy[copy_of])
    if prompt_kv is not None:
        return _after_prompts(model, prompt_kv, prompt_ids, prompt_mask, response_ids, response_mask, temperature,
                              with_entropy)
    T = response_ids.shape[1]
    p0, t1 = _real_span(prompt_mask, response_mask)
    prompt_ids, prompt_mask = prompt_ids[:, p0:], prompt_mask[:, p0:]
    ids_kept, mask_kept = response_ids[:, :t1], response_mask[:, :t1]
    input_ids = torch.cat([prompt_ids, ids_kept], dim=1)
    attn = torch.cat([prompt_mask.long(), mask_kept.long()], dim=1)
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                use_cache=False, logits_to_keep=t1 + 1)
    return response_logprobs(out.logits, ids_kept, mask_kept, T, temperature, with_entropy)


def response_logprobs(logits: Tensor, ids: Tensor, mask: Tensor, T: int, temperature: float,
                      with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """(logp [B, T], entropy [B, T] or None) from the logits of a forward over the response.

    logits: [B, t1 + 1, V], position s predicting response token s (the first is the last
    prompt token's); the last position predicts a token after the kept response and is
    dropped. ids, mask: [B, t1], the kept response columns; the outputs are padded with
    zeros to T columns. logp = log softmax(z / T)[token] and the full-vocabulary entropy,
    both times the mask.
    """
    t1 = ids.shape[1]
    logp_all = torch.log_softmax(logits[:, :-1, :].float() / temperature, dim=-1)    # [B, t1, V]
    mask = mask.to(logp_all.dtype)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        entropy = torch.nn.functional.pad(-(logp_all.exp() * logp_all).sum(-1) * mask, (0, T - t1))
    return torch.nn.functional.pad(logp, (0, T - t1)), entropy


def _after_prompts(model, prompt_kv: tuple, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                   response_mask: Tensor, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """token_logprobs for rollouts whose prompts already ran: prompt_kv holds their keys
    and values for prompt columns 0..P-2.

    The forward's input is each rollout's last prompt token and its response,
    [B, 1 + t1] (t1: 1 + the last column real in some row), with prompt_kv as the cache;
    the attention mask spans [prompt | response] and the positions continue the prompt's
    count, exactly as the full forward numbers them. Its logits predict response tokens
    0..t1-1 (plus one more, dropped by response_logprobs).
    """
    T, P = response_ids.shape[1], prompt_ids.shape[1]
    real = (response_mask != 0).any(dim=0).nonzero()
    t1 = int(real[-1]) + 1 if len(real) else min(T, 1)
    ids_kept, mask_kept = response_ids[:, :t1], response_mask[:, :t1]
    cache = DynamicCache(config=model.config)
    for layer, (k, v) in enumerate(zip(*prompt_kv)):
        cache.update(k, v, layer)
    attn = torch.cat([prompt_mask.long(), mask_kept.long()], dim=1)                # [B, P + t1]
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)[:, P - 1:]
    out = model(input_ids=torch.cat([prompt_ids[:, -1:], ids_kept], dim=1), attention_mask=attn,
                position_ids=position_ids, past_key_values=cache, use_cache=True, logits_to_keep=t1 + 1)
    return response_logprobs(out.logits, ids_kept, mask_kept, T, temperature, with_entropy)


def distinct_rows(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                  response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(first [U], copy_of [B]): the distinct rollouts of a batch, and which one each row is.

        rows b and b' are the same  <=>  prompt ids, prompt mask, response ids and
                                         response mask are equal, column by column
        first[u]   = the lowest b whose row is distinct row u
        copy_of[b] = u such that row b equals row first[u];  so  x[first][copy_of] == x

    Example: rows (a, b, a, a) -> first = (0, 1), copy_of = (0, 1, 0, 0).
    torch.unique sorts the rows, so U rows come out in sorted order, not batch order;
    nothing depends on it (the rows of a forward never see each other). Cost: one sort
    of a [B, 2P + 2T] integer tensor, ~0.2 ms for 32 rows here.
    """
    key = torch.cat([prompt_ids, prompt_mask.long(), response_ids, response_mask.long()], dim=1)
    unique, copy_of = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(key), device=key.device)
    first = torch.full((len(unique),), len(key), device=key.device).scatter_reduce(0, copy_of, rows, "amin")
    return first, copy_of


def _real_span(prompt_mask: Tensor, response_mask: Tensor) -> tuple[int, int]:
    """(p0, t1): the first prompt column that is real in some row, and 1 + the last
    response column that is real in some row, so that prompt[:, p0:] + response[:, :t1]
    holds every real token. At least one column of each is kept (the last prompt
    column predicts response token 0), so an all-padding batch still runs."""
    P, T = prompt_mask.shape[1], response_mask.shape[1]
    real_p = (prompt_mask != 0).any(dim=0).nonzero()
    real_t = (response_mask != 0).any(dim=0).nonzero()
    p0 = min(int(real_p[0]), P - 1) if len(real_p) else P - 1
    t1 = int(real_t[-1]) + 1 if len(real_t) else min(T, 1)
    return p0, t1
