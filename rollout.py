"""Rollouts: G sampled responses per prompt, and the log-probability of every token.

Critic-free RL (GRPO and its family, Shao et al. 2024) needs, for each prompt q, a group
of G responses o_1..o_G sampled from the current policy pi_old, and then, for every
response token o_{i,t}, the log-probability log pi(o_{i,t} | q, o_{i,<t}) under the
policy being trained. The policy gradient, the PPO ratio rho = exp(logp - logp_old),
the KL penalty and the entropy are all built from these per-token numbers. This file
produces them with Hugging Face transformers (`model.generate` to sample, one
teacher-forced forward pass to score); vllm_rollout.py does the sampling with vLLM.

Conventions (shared by the whole project):
- B = N * G rollouts, PROMPT-MAJOR: rollout b answers prompt b // G.
- Prompts are LEFT-padded ([B, P]) so that every response starts at column P; responses
  are RIGHT-padded ([B, T]) with the pad id. Per-token tensors are [B, T] over the
  response only, with a float mask that is 1 on real response tokens, including the
  EOS token when one was generated (the model chose to stop: that choice gets credit
  too), and 0 on padding.
- Natural logs; entropy in nats; log-probs and entropy are 0 on padding.

Why the old log-probs come from a teacher-forced pass and not from `generate`'s scores:
the trainer computes logp with token_logprobs (a full forward over prompt + response).
With one optimizer step per rollout batch the PPO ratio must then be EXACTLY 1 at the
first (only) step, so clipping never fires. `generate` decodes incrementally with a
KV cache, whose floating-point sums differ from a full forward by ~1e-6; using them as
logp_old would make rho = 1 +- 1e-6 instead of 1, and in bf16 on a GPU the gap is
large enough to clip. Scoring both sides with the same function removes the question
(verl's "recompute_log_prob" does the same). tests/test_rollout.py checks that the two
agree to float tolerance anyway, so the sampler really samples what we score.

Sampling settings that change the distribution: temperature T is applied on both sides
(log softmax(logits / T)), so logp is the log-probability of the distribution that
was sampled. top_p < 1 truncates the sampling distribution but NOT the scored one (as
in verl and TRL): the scored log-probs are then those of the tempered, untruncated
policy, which is the policy the gradient acts on. The default top_p = 1 keeps them
identical. Every other logits processor is switched off explicitly, because a hub
checkpoint's generation_config.json (e.g. Qwen2.5-Instruct: top_k=20, top_p=0.8,
repetition_penalty=1.05) would otherwise be merged in silently by `generate`.

Determinism: sampling draws from torch's global RNG (torch.multinomial inside
`generate`), so torch.manual_seed(s) before generate_rollouts reproduces it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rollouts:
    """One rollout batch: B = N * G responses, prompt-major. All tensors on the CPU."""

    prompts: list[str]
    """The N prompt strings, in order."""
    G: int
    """Rollouts per prompt."""
    prompt_ids: Tensor
    """[B, P] long, left-padded with the pad id (row b holds prompt b // G)."""
    prompt_mask: Tensor
    """[B, P] long, 1 on real prompt tokens, 0 on left padding."""
    response_ids: Tensor
    """[B, T] long, right-padded with the pad id after the first EOS."""
    response_mask: Tensor
    """[B, T] float, 1 on real response tokens (incl. a generated EOS), 0 on padding."""
    old_logp: Tensor
    """[B, T] float, log pi_old(token) under the sampling distribution (tempered); 0 on padding."""
    texts: list[str]
    """B decoded responses, special tokens (EOS) removed."""
    truncated: Tensor
    """[B] bool, True where max_new_tokens was reached without an EOS."""
    entropy: Tensor | None = None
    """[B, T] float, full-vocabulary entropy (nats) of the same distribution; 0 on padding."""


# ---------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------

def generate_rollouts(model, tokenizer, prompts: list[str], G: int, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0,
                      score_batch: int = 64) -> Rollouts:
    """Sample G responses per prompt and score their tokens.

    Steps: tokenize each prompt (with the tokenizer's own special tokens, e.g. a Llama
    BOS), left-pad to [N, P]; `model.generate(do_sample=True, num_return_sequences=G)`
    in eval mode without gradients (transformers repeats each prompt G times in place,
    which is exactly the prompt-major order); cut every response after its first EOS;
    then score with token_logprobs (old_logp and entropy) in chunks of score_batch
    rollouts. The model's train/eval mode is restored afterwards.

    prompts: N >= 1 strings. G >= 1. max_new_tokens >= 1. temperature > 0.
    0 < top_p <= 1 (see the module header for what top_p < 1 means for old_logp).
    T (the response width) is the longest response in the batch, <= max_new_tokens:
    `generate` stops early once every row has emitted EOS.
    Returns Rollouts with B = len(prompts) * G rows, all tensors on the CPU.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of str, got {prompts!r:.80}")
    _check_sampling(G, max_new_tokens, temperature, top_p)
    if score_batch < 1:
        raise ValueError(f"score_batch must be >= 1, got {score_batch}")
    pad_id, eos_ids = special_ids(model, tokenizer)
    device = next(model.parameters()).device
    ids, mask = left_pad([tokenizer(p)["input_ids"] for p in prompts], pad_id)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            seqs = sample(model, ids.to(device), mask.to(device), G, max_new_tokens, temperature, top_p,
                          pad_id, eos_ids)
            P = ids.shape[1]
            prompt_ids = ids.repeat_interleave(G, dim=0)
            prompt_mask = mask.repeat_interleave(G, dim=0)
            response_ids, response_mask, truncated = cut_at_eos(seqs[:, P:].cpu(), eos_ids, pad_id)
            logps, ents = [], []
            for idx in torch.arange(prompt_ids.shape[0]).split(score_batch):
                lp, ent = token_logprobs(model, prompt_ids[idx].to(device), prompt_mask[idx].to(device),
                                         response_ids[idx].to(device), response_mask[idx].to(device),
                                         temperature=temperature, with_entropy=True)
                logps.append(lp.float().cpu())
                ents.append(ent.float().cpu())
    finally:
        model.train(was_training)
    texts = [tokenizer.decode(row[: int(n)].tolist(), skip_special_tokens=True)
             for row, n in zip(response_ids, response_mask.sum(1))]
    return Rollouts(prompts=list(prompts), G=G, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                    response_ids=response_ids, response_mask=response_mask, old_logp=torch.cat(logps),
                    texts=texts, truncated=truncated, entropy=torch.cat(ents))


def sample(model, prompt_ids: Tensor, prompt_mask: Tensor, G: int, max_new_tokens: int,
           temperature: float, top_p: float, pad_id: int, eos_ids: list[int], **extra):
    """`model.generate` with pure ancestral sampling from softmax(logits / T) (top_p aside).

    prompt_ids, prompt_mask: [N, P] left-padded. Returns generate's output: a [N*G, P+T]
    tensor, or with extra={"output_scores": True, "return_dict_in_generate": True}
    the full output object (the tests use this to compare against token_logprobs).

    The model's own generation_config is swapped for a blank one during the call:
    `generate` fills every setting we leave unset from it, and a hub checkpoint's
    sampling defaults (top_k, repetition_penalty, min_p, ...) would change the sampled
    distribution without changing the one we score. top_k=0 is explicit because the
    library's global default is top_k=50. Sampling consumes torch's global RNG.
    """
    from transformers import GenerationConfig

    gen_cfg = GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                               max_new_tokens=max_new_tokens, num_return_sequences=G,
                               pad_token_id=pad_id, eos_token_id=list(eos_ids), **extra)
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        return model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=gen_cfg)
    finally:
        model.generation_config = saved


# ---------------------------------------------------------------------------------------
# Scoring: teacher-forced log-probs and entropy
# ---------------------------------------------------------------------------------------

def token_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                   response_mask: Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs of the response under `model`, in one forward pass.

        logp[b, t]    = log softmax(z_{b,t} / T)[response_ids[b, t]]
        entropy[b, t] = -sum_v p_v log p_v,   p = softmax(z_{b,t} / T)

    where z_{b,t} are the logits that predict response token t, i.e. the output at the
    position just before it (the last prompt token for t = 0). The entropy is that of
    the whole next-token distribution, not the surprisal -logp of the sampled token
    (the two agree only in expectation).

    Left padding: input = [prompt | response] with attention mask [prompt_mask |
    response_mask]; position ids are cumsum(mask) - 1 (clamped at 0 on padding), so a
    prompt's first real token sits at position 0 however much padding precedes it,
    exactly as `generate` numbers them. (For rotary models such as Llama and Qwen a
    constant shift of all positions changes nothing but rounding, since attention sees
    only position differences; for absolute position embeddings, GPT-2 style, it is
    essential.) The attention mask is what keeps the pads out: with it, a row's
    log-probs do not depend on the other rows of its batch (tested). Right padding
    after EOS needs nothing: a causal model never looks ahead, and those positions are
    zeroed.

    Shapes: prompt_ids/prompt_mask [B, P]; response_ids/response_mask [B, T].
    Returns (logp [B, T] float32, entropy [B, T] float32 or None), 0 where
    response_mask is 0. Differentiable: call under torch.no_grad() for old/ref
    log-probs, with gradients for the policy loss. Only the T + 1 last positions' logits
    are materialised (logits_to_keep), which matters for a 150k-token vocabulary.
    Memory: [B, T, V] floats for the log-softmax; micro-batch B for big vocabularies.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ValueError(f"shape mismatch: prompt_ids {tuple(prompt_ids.shape)} vs mask {tuple(prompt_mask.shape)}, "
                         f"response_ids {tuple(response_ids.shape)} vs mask {tuple(response_mask.shape)}")
    if prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(f"batch mismatch: {prompt_ids.shape[0]} prompts vs {response_ids.shape[0]} responses")
    T = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                use_cache=False, logits_to_keep=T + 1)
    # The last kept position predicts a token after the response: drop it.
    logits = out.logits[:, :-1, :].float() / temperature               # [B, T, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    mask = response_mask.to(logp_all.dtype)
    logp = logp_all.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, entropy


# ---------------------------------------------------------------------------------------
# Evaluation helper: correct counts for unbiased pass@k
# ---------------------------------------------------------------------------------------

def sample_eval(model, tokenizer, rows: list[dict], n: int, max_new_tokens: int,
                temperature: float = 1.0, *, check, prompts_per_batch: int = 64) -> list[int]:
    """c_j = number of correct responses among n samples for each row j.

    rows: dicts with at least "prompt" (the checker may read any other key).
    check(text, row) -> truthy if the decoded response `text` solves `row`; passing
    it in keeps this helper free of any particular task (the embedded warm-up passes
    tinymodel.addition_correct, train.py can pass a verify.py checker).
    The counts feed the unbiased pass@k estimator of Chen et al. 2021,
    pass@k = mean_j [1 - C(n - c_j, k) / C(n, k)]; with n = 1, mean(c) is pass@1.
    Sampling uses torch's global RNG: wrap the call in torch.random.fork_rng() to keep
    evaluation from shifting a training run's random stream.
    """
    if n < 1:
        raise ValueError(f"sample_eval needs n >= 1 samples per prompt, got {n}")
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch must be >= 1, got {prompts_per_batch}")
    counts = []
    for start in range(0, len(rows), prompts_per_batch):
        chunk = rows[start:start + prompts_per_batch]
        ro = generate_rollouts(model, tokenizer, [r["prompt"] for r in chunk], n, max_new_tokens,
                               temperature=temperature)
        for j, row in enumerate(chunk):
            counts.append(sum(bool(check(text, row)) for text in ro.texts[j * n:(j + 1) * n]))
    return counts


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def special_ids(model, tokenizer) -> tuple[int, list[int]]:
    """(pad id, list of EOS ids) for sampling and cutting.

    EOS ids: the tokenizer's eos_token_id plus any the model's generation_config lists
    (chat models often stop on several, e.g. Qwen's <|im_end|> and <|endoftext|>).
    The pad id falls back to the first EOS id (common for hub models without a pad);
    cut_at_eos finds the FIRST EOS, so pad == eos is not ambiguous.
    """
    eos = []
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for e in (source if isinstance(source, (list, tuple)) else [source]):
            if e is not None and int(e) not in eos:
                eos.append(int(e))
    if not eos:
        raise ValueError("neither the tokenizer nor the model's generation_config defines an EOS token")
    pad = tokenizer.pad_token_id
    return (eos[0] if pad is None else int(pad)), eos


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> (ids [N, P], mask [N, P]) left-padded to the longest (P >= 1)."""
    if any(len(s) == 0 for s in seqs):
        raise ValueError("a prompt tokenized to zero tokens; generation needs at least one")
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, P - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, P - len(s):] = 1
    return ids, mask


def cut_at_eos(response: Tensor, eos_ids: list[int], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Keep each row up to and including its first EOS; pad the rest.

    response: [B, T] raw generated tokens (after an EOS, `generate` writes pad ids,
    which may equal the EOS id). Returns (ids [B, T] with pad after the first EOS,
    mask [B, T] float, truncated [B] bool = no EOS anywhere in the row).
    """
    is_eos = torch.zeros_like(response, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= response == e
    # Tokens strictly after the first EOS: the running count of EOS seen BEFORE t is > 0.
    after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    mask = (~after).float()
    ids = response.masked_fill(after, pad_id)
    truncated = ~is_eos.any(dim=1)
    return ids, mask, truncated


def _check_sampling(G: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if not isinstance(G, int) or G < 1:
        raise ValueError(f"G (rollouts per prompt) must be an int >= 1, got {G!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
