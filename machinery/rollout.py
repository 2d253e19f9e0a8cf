"""Rollouts: G sampled responses per prompt, from our own KV-cached sampling loop.

Critic-free RL (GRPO and its family, Shao et al. 2024) needs, for each prompt q, a group
of G responses o_1..o_G sampled from the current policy pi_old; the update then scores
every response token under the policy being trained (machinery/logprobs.py). This file
draws them with any Hugging Face causal LM: our own KV-cached sampling loop (`sample`),
and Rollouts, the batch every later stage reads. The run calls it through its sampler
(machinery/sampler.py), which also knows the other engine, vLLM (vllm_rollout.py).

Conventions (shared by the whole project):
- B = N * G rollouts, PROMPT-MAJOR: rollout b answers prompt b // G.
- Prompts are LEFT-padded ([B, P]) so that every response starts at column P; responses
  are RIGHT-padded ([B, T]) with the pad id. Per-token tensors are [B, T] over the
  response only, with a float mask that is 1 on real response tokens, including the
  EOS token when one was generated (the model chose to stop: that choice gets credit
  too), and 0 on padding.
- Natural logs; entropy in nats; log-probs and entropy are 0 on padding.

Why our own sampling loop and not `model.generate`: `generate` prefills each prompt G
times, keeps every row in the batch until the last one stops, and runs its logits
processors and stopping criteria at every step. The loop in `sample` is plain ancestral
sampling, x_t ~ softmax(z_t / T), with a KV cache, in which the G rollouts of a prompt
share one forward for as long as they have drawn the same tokens (the prompt's prefill,
then every shared prefix of the responses), and a row leaves the batch as soon as it
has emitted EOS. Each row still draws its own token from its own history's
distribution, so this changes the work, never the distribution. In the default run (256
rollouts, mean length ~30) `generate` runs B * max_i |o_i| ~ 12,000 token-steps, a loop
that drops finished rows sum_i |o_i| ~ 7,500, and this one ~2,400-2,800 (the branches of
each prompt's trie of responses, at a warmed policy); on countdown, whose responses
differ early, ~6,900 for ~7,500 tokens. What a decoding step costs beyond its
arithmetic (the model call's bookkeeping, moving cache rows when nodes end or split) is
machinery/decoding.py's subject; docs/results.md has the measured times.

What the sampler returns besides the tokens: the log-probability and the full-vocabulary
entropy of every drawn token, as its own KV-cached forward computed them
(Rollouts.engine_logp / engine_entropy; vllm_rollout.py fills engine_logp from vLLM).
They agree with a teacher-forced pass (logprobs.token_logprobs) to ~1e-6 (tested: the sampler
really samples what we score), but NOT bit for bit: incremental decoding sums in
another order than one full forward. So the trainer never uses them as logp_old
where the PPO ratio must be exact. With one optimizer step per rollout batch it takes
logp_old = logp.detach() of its own training forward (ratio exactly 1 by construction,
as TRL's GRPOTrainer does when on-policy) and skips a scoring pass altogether; with
several steps per batch it runs a teacher-forced "old policy" pass (verl's
recompute_log_prob). The sampler's entropy is what the scheduler reads either way.

Sampling settings that change the distribution: temperature T is applied on both sides
(log softmax(logits / T)), so logp is the log-probability of the distribution that
was sampled. A truncation (`truncate`: the run's top_p, built by machinery/sampler.py)
cuts the sampling distribution but NOT the scored one (as in verl and TRL): the scored
log-probs are then those of the tempered, untruncated policy, which is the policy the
gradient acts on. Without one they are identical. Nothing else touches the
distribution: the loop reads no generation_config.json, so a hub checkpoint's sampling defaults (e.g. Qwen2.5-Instruct:
top_k=20, top_p=0.8, repetition_penalty=1.05) cannot leak in; only its EOS ids are used.

Determinism: every draw is one torch.rand call per decoding step on torch's
global RNG, so torch.manual_seed(s) before generate_rollouts reproduces it exactly.
(The draws are not those `model.generate` would make with the same seed: finished rows
leave the batch, which changes which random numbers each row consumes, not the
distribution each token is drawn from.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from machinery import decoding


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
    texts: list[str]
    """B decoded responses, special tokens (EOS) removed."""
    truncated: Tensor
    """[B] bool, True where max_new_tokens was reached without an EOS."""
    engine_logp: Tensor
    """[B, T] float, log-prob of each sampled token under the tempered sampling distribution,
    as the sampling engine computed it (our KV-cached loop, or vLLM); 0 on padding. Equal
    to a teacher-forced logprobs.token_logprobs pass up to float rounding, not bit for bit."""
    engine_entropy: Tensor | None = None
    """[B, T] float, full-vocabulary entropy (nats) of the same distributions, from the
    sampler; 0 on padding. None from vLLM, which does not return it."""


# ---------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------

def generate_rollouts(model, tokenizer, prompts: list[str], G: int, max_new_tokens: int,
                      temperature: float = 1.0, chat_template: bool = False, truncate=None) -> Rollouts:
    """Sample G responses per prompt: tokens, masks, texts and the sampler's log-probs.

    Steps: tokenize each prompt (`tokenize_prompts`: the tokenizer's own special tokens,
    e.g. a Llama BOS, unless the prompts were rendered by a chat template), left-pad to
    [N, P]; `sample` G responses per prompt in eval mode without gradients
    (prompt-major); cut every response after its first EOS; decode. No teacher-forced
    pass here: the trainer decides whether it needs one (module header). The model's
    train/eval mode is restored afterwards.

    prompts: N >= 1 strings. G >= 1. max_new_tokens >= 1 and temperature in [0.01, 2]: the
    run's settings, whose ranges SamplingConfig checked (machinery/sampler.py). truncate:
    which tokens may be drawn (see `sample`; None: all of them). T (the response width) is
    the longest response in the batch, <= max_new_tokens: sampling stops early once every
    row has emitted EOS. Returns Rollouts with B = len(prompts) * G rows, all tensors on the CPU.
    """
    check_request(prompts, G)
    pad_id, eos_ids = special_ids(model, tokenizer)
    device = next(model.parameters()).device
    ids, mask = pad_rows(tokenize_prompts(tokenizer, prompts, chat_template), pad_id, left=True)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():       # no autograd bookkeeping at all (cheaper than no_grad)
            tokens, logp, entropy = sample(model, ids.to(device), mask.to(device), G, max_new_tokens,
                                           temperature, truncate, pad_id, eos_ids)
    finally:
        model.train(was_training)
    response_ids, response_mask, truncated = cut_at_eos(tokens.cpu(), eos_ids, pad_id)
    texts = tokenizer.batch_decode([row[:n] for row, n in zip(response_ids.tolist(), response_mask.sum(1).long().tolist())],
                                   skip_special_tokens=True)
    return Rollouts(prompts=list(prompts), G=G, prompt_ids=ids.repeat_interleave(G, dim=0),
                    prompt_mask=mask.repeat_interleave(G, dim=0), response_ids=response_ids,
                    response_mask=response_mask, texts=texts, truncated=truncated,
                    # clone(): a tensor made under inference_mode cannot be saved for backward
                    # later (the loss may use it); its clone made out here is an ordinary tensor
                    engine_logp=logp.float().cpu().clone(), engine_entropy=entropy.float().cpu().clone())


def sample(model, prompt_ids: Tensor, prompt_mask: Tensor, G: int, max_new_tokens: int,
           temperature: float, truncate, pad_id: int, eos_ids: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """Ancestral sampling with a KV cache: G responses to each of N left-padded prompts.

        z_t = logits of the next token given prompt + o_{<t};   o_t ~ softmax(z_t / T)
        (with a truncation: drawn in proportion to truncate(softmax(z_t / T)), e.g. the
        nucleus of top_p, top_p_filter)

    Rows that have drawn the same tokens so far share one forward: a *node* is a distinct
    history; the G rows of a prompt start in one, and a node splits when its rows draw
    different tokens. Each step every live row draws from its node's distribution (`draw`),
    rows that drew EOS leave, and one decoding step (machinery/decoding.py) feeds each new
    node its token. A node's rows have identical inputs: sharing changes no bit (docs/sampler.md).
    prompt_ids, prompt_mask: [N, P], each row with >= 1 real token. truncate: None (every
    token may be drawn) or a function probs [U, V] -> weights [U, V] >= 0, zero on the
    tokens it cuts, every row with a positive sum (the sampler's: machinery/sampler.py).
    Returns (tokens [N*G, T] long, pad after EOS; logp [N*G, T]: log softmax(z_t / T) at
    the drawn token, untruncated; entropy [N*G, T]: full vocabulary), 0 after EOS;
    T <= max_new_tokens.
    Consumes torch's global RNG; call under torch.no_grad() in eval mode.
    """
    N, P = prompt_ids.shape
    B, device = N * G, prompt_ids.device
    eos = torch.tensor(eos_ids, device=device)
    decoder = decoding.make_decoder(model, prompt_ids, prompt_mask, G, max_new_tokens)
    logits = decoder.prefill()                                         # [U, V]: one row per node
    rows = torch.arange(B, device=device)                              # the live rows
    node = torch.arange(N, device=device).repeat_interleave(G)         # live row -> its node
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros(B, max_new_tokens, device=device)
    entropy = torch.zeros(B, max_new_tokens, device=device)
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)   # [U, V]
        probs = logp_all.exp()
        draw_from = probs if truncate is None else truncate(probs)
        nxt = draw(draw_from[node])                                     # [B_live]: each row its own draw
        tokens[rows, t] = nxt
        logp[rows, t] = logp_all[node, nxt]
        entropy[rows, t] = -(probs * logp_all).sum(-1)[node]
        live = ~torch.isin(nxt, eos)
        if t + 1 == max_new_tokens or not live.any():
            break
        rows, node, nxt = rows[live], node[live], nxt[live]
        V = logits.shape[-1]                                            # next nodes: distinct (node, token)
        pairs, node = torch.unique(node * V + nxt, return_inverse=True)
        logits = decoder.step(pairs // V, pairs % V)
    T = t + 1
    return tokens[:, :T], logp[:, :T], entropy[:, :T]


def draw(weights: Tensor) -> Tensor:
    """One index per row, drawn with probability proportional to the row's weights.

        u ~ U[0, 1);   x = the first v with c_v > u * c_V,   c_v = sum_{w <= v} weights_w

    Inverse-CDF sampling: the same distribution as torch.multinomial(weights, 1), with one
    uniform number per row from torch's global RNG (so torch.manual_seed reproduces it),
    and about 10x cheaper per call on a CPU for small batches (0.04 vs 0.47 ms measured
    here; ~20 ms per training step). A zero-weight token is never drawn: c_x > u c_V >=
    c_{x-1} forces weights_x > 0 (right=True searchsorted; u < 1 keeps u c_V < c_V).
    weights: [B, V] >= 0, every row with a positive sum. Returns [B] long.
    """
    cdf = weights.cumsum(dim=-1)
    u = torch.rand(weights.shape[0], 1, device=weights.device, dtype=cdf.dtype)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp(max=weights.shape[1] - 1)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Nucleus truncation (Holtzman et al. 2020): zero every token outside the nucleus.

    A token is kept iff the probability of the tokens ranked strictly above it is
    < top_p, i.e. the smallest set of most probable tokens whose mass reaches top_p
    (the most probable token is always kept). This is the rule of transformers'
    TopPLogitsWarper (which removes tokens whose ascending cumulative mass is
    <= 1 - top_p). Example: p = (0.5, 0.3, 0.2), top_p = 0.7 keeps the first two
    (masses above them: 0, 0.5; the third has 0.8 above it).
    probs: [B, V], rows summing to 1. Returns [B, V], NOT renormalised (`draw` does not
    need it).
    """
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_above = sorted_p.cumsum(dim=-1) - sorted_p
    drop_sorted = mass_above >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)


# ---------------------------------------------------------------------------------------
# Evaluation helper: correct counts for unbiased pass@k
# ---------------------------------------------------------------------------------------

def sample_eval(sample_texts, rows: list[dict], n: int, check, prompts_per_batch: int = 64) -> list[int]:
    """c_j = number of correct responses among n samples for each row j.

    sample_texts(prompts, n) -> the N*n decoded responses, prompt-major: any sampler
    (generate_rollouts(...).texts, or the run's: sampler.py's sample_texts). check(texts,
    rows) -> one truthy value per text (rows repeated n times, in the same order), so a
    verifier can score a whole chunk at once (verify.score runs math-verify in worker
    processes). rows: dicts with at least "prompt". Prompts go to the sampler in chunks
    of prompts_per_batch. The counts feed the unbiased pass@k estimator of Chen et al.
    2021, pass@k = mean_j [1 - C(n - c_j, k) / C(n, k)]; with n = 1, mean(c) is pass@1.
    A sampler that draws from torch's global RNG should be wrapped in
    torch.random.fork_rng() to keep evaluation from shifting a training run's stream.
    """
    if n < 1:
        raise ValueError(f"sample_eval needs n >= 1 samples per prompt, got {n}")
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch must be >= 1, got {prompts_per_batch}")
    counts = []
    for start in range(0, len(rows), prompts_per_batch):
        chunk = rows[start:start + prompts_per_batch]
        ok = check(sample_texts([r["prompt"] for r in chunk], n), [r for r in chunk for _ in range(n)])
        counts += [sum(bool(x) for x in ok[j * n:(j + 1) * n]) for j in range(len(chunk))]
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


def tokenize_prompts(tokenizer, prompts: list[str], chat_template: bool) -> list[list[int]]:
    """Token ids of each prompt, the same for both rollout backends.

        chat_template=False: tokenizer(p)                            (adds e.g. a Llama BOS)
        chat_template=True:  tokenizer(p, add_special_tokens=False)  (the template wrote them)

    A chat template renders its own special tokens into the text: Llama 3's starts with
    <|begin_of_text|>, which its tokenizer also prepends by default, so tokenizing the
    rendered text normally gives TWO BOS tokens, a prompt the model never saw in
    training. (Qwen2.5 adds no BOS, so there the flag changes nothing.) TRL's
    GRPOTrainer tokenizes templated prompts with add_special_tokens=False for the same
    reason. Raises ValueError for a prompt that tokenizes to nothing.
    """
    ids = [list(tokenizer(p, add_special_tokens=not chat_template)["input_ids"]) for p in prompts]
    for p, row in zip(prompts, ids):
        if not row:
            raise ValueError(f"prompt {p!r} tokenized to zero tokens; generation needs at least one")
    return ids


def pad_rows(rows: list[list], pad_value, left: bool, dtype: torch.dtype = torch.long,
             width: int | None = None) -> tuple[Tensor, Tensor]:
    """Ragged rows -> (values [R, W], mask [R, W] long), padded on the left or the right.

    Prompts are left-padded (every response then starts at the same column), responses
    right-padded. W = width if given, else max(1, longest row). Rows longer than W raise
    ValueError.
    """
    W = width if width is not None else max(1, max((len(r) for r in rows), default=0))
    values = torch.full((len(rows), W), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), W), dtype=torch.long)
    for b, row in enumerate(rows):
        n = len(row)
        if n > W:
            raise ValueError(f"row {b} has {n} entries, more than the width {W}")
        if n:
            cols = slice(W - n, W) if left else slice(0, n)
            values[b, cols] = torch.tensor(row, dtype=dtype)
            mask[b, cols] = 1
    return values, mask


def cut_at_eos(response: Tensor, eos_ids: list[int], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Keep each row up to and including its first EOS; pad the rest.

    response: [B, T] raw generated tokens (after an EOS the sampler writes pad ids,
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


def check_request(prompts, G: int) -> None:
    """What a sampling call brings (rollout.py and vllm_rollout.py): N >= 1 prompt strings, G >= 1.

    The settings' ranges (temperature, top_p, max_new_tokens) are SamplingConfig's,
    checked once where they are declared (machinery/sampler.py), not at every call.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of str, got {prompts!r:.80}")
    if not isinstance(G, int) or G < 1:
        raise ValueError(f"G (rollouts per prompt) must be an int >= 1, got {G!r}")
