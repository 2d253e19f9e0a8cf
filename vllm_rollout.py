"""Rollouts from vLLM running inside the trainer's process (one GPU). UNTESTED ON A GPU.

Why vLLM at all: sampling G rollouts per prompt is most of an RL step's wall time, and
transformers' `generate` is slow for it. vLLM batches the requests, shares the prompt's
KV cache between the G samples (prefix caching) and returns each sampled token's
log-prob. The price is a second copy of the weights that must be kept in sync with the
trainer's after every optimizer step, which is where the traps are.

The recipe (vLLM 0.33, from ../shared/vllm.md, itself read from the vLLM release and from
how TRL, OpenRLHF and verl do it):

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # engine in this process
    llm = LLM(model=path, gpu_memory_utilization=0.3, enable_prefix_caching=True,
              enforce_eager=True, logprobs_mode="processed_logprobs", generation_config="vllm")
    ... after every optimizer step:
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_params,
                                                 "is_checkpoint_format": True})
    llm.reset_prefix_cache()

Traps this file guards against (numbers from vllm.md):
1. Stale prefix cache: vLLM does not reset it when weights change; GRPO groups share
   prompts, so without the reset the next batch reuses keys/values of the OLD weights.
2. Sleep mode level 2 + argument-less reload_weights reloads the ORIGINAL checkpoint
   from disk (it silently trained on base-model rollouts in TRL): we never sleep.
3. Tied embeddings (Qwen2.5-0.5B): all parameters go in ONE call.
4. Names: Hugging Face names unchanged (vLLM fuses q/k/v itself), wrapper prefixes
   such as `_orig_mod.` (torch.compile) and `module.` (DDP) stripped.
5. dtype: cast to the engine's dtype (bf16) before pushing.
7. The canary: after each push, the mean |vLLM log-prob - trainer log-prob| of the sampled
   tokens. About 0.01 nats is normal in bf16; far above means stale weights.

Everything that does not need vLLM itself (assembling padded tensors from token lists,
name stripping, the canary) is a small pure function, tested on CPU with fake engine
outputs in tests/test_vllm_rollout.py. vLLM is imported only inside functions.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def vllm_available() -> bool:
    """True if `import vllm` works (never on the CPU machines this was written on)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def make_engine(model_path: str, max_model_len: int, gpu_memory_utilization: float = 0.3, seed: int = 0,
                dtype: str = "bfloat16"):
    """An in-process vLLM engine for rollouts. The caller seeds torch AFTER this call.

    gpu_memory_utilization is a share of the WHOLE card taken at start-up (weights + KV
    cache); the trainer's weights, gradients, Adam state and activations live in the rest,
    so 0.3 leaves ~70% for training a 0.5B model. In-process vLLM reseeds python, numpy
    and torch while constructing, hence "seed after".
    """
    if not vllm_available():
        raise ImportError("--backend vllm needs vLLM on a CUDA machine: pip install -r requirements-gpu.txt")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # must be set before LLM() is built
    from vllm import LLM
    return LLM(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
               max_model_len=max_model_len, enable_prefix_caching=True, enforce_eager=True, seed=seed,
               logprobs_mode="processed_logprobs",   # log-probs after temperature, like the trainer's
               generation_config="vllm")             # ignore the checkpoint's sampling defaults


def strip_wrapper_prefix(name: str) -> str:
    """'_orig_mod.model.layers.0...' -> 'model.layers.0...' (trap 4)."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def push_weights(llm, model, dtype: torch.dtype = torch.bfloat16) -> int:
    """Copy the trainer's weights into the engine, then reset the prefix cache.

    One iterator over every named parameter (tied embeddings included, trap 3), cast to
    the engine's dtype (trap 5), names stripped of wrapper prefixes (trap 4). Returns the
    number of tensors pushed. Raises if the prefix-cache reset fails (trap 1): continuing
    would sample from a mix of old and new weights.
    """
    with torch.no_grad():
        weights = [(strip_wrapper_prefix(n), p.detach().to(dtype)) for n, p in model.named_parameters()]
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                     "is_checkpoint_format": True})
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache after a weight push; rollouts would be stale")
    return len(weights)


def assemble(prompt_token_ids: list[list[int]], completions: list[list], G: int, pad_id: int) -> dict:
    """Padded tensors from vLLM's per-request outputs (pure; tested without vLLM).

    prompt_token_ids: N lists. completions: N lists of G objects with `.token_ids`
    (list[int]), `.logprobs` (a list, one dict per position, mapping token id to an
    object with `.logprob`; logprobs=0 in SamplingParams returns just the sampled token)
    and `.finish_reason` ('stop' or 'length'). Returns prompt_ids [B, P] left-padded,
    prompt_mask, response_ids [B, T] right-padded, response_mask, logp [B, T] (0 on
    padding) and truncated [B], with B = N * G in prompt-major order.
    """
    if len(prompt_token_ids) != len(completions):
        raise ValueError(f"{len(prompt_token_ids)} prompts but {len(completions)} outputs")
    rows_prompt, rows_resp, rows_logp, truncated = [], [], [], []
    for ids, outs in zip(prompt_token_ids, completions):
        if len(outs) != G:
            raise ValueError(f"expected G={G} completions per prompt, got {len(outs)}")
        for c in outs:
            rows_prompt.append(list(ids))
            rows_resp.append(list(c.token_ids))
            rows_logp.append([c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)])
            truncated.append(c.finish_reason == "length")
    B, P = len(rows_prompt), max(len(r) for r in rows_prompt)
    T = max(1, max(len(r) for r in rows_resp))
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    response_ids = torch.full((B, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros(B, T)
    logp = torch.zeros(B, T)
    for b, (p, r, lp) in enumerate(zip(rows_prompt, rows_resp, rows_logp)):
        prompt_ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long)
        prompt_mask[b, P - len(p):] = 1
        if r:
            response_ids[b, :len(r)] = torch.tensor(r, dtype=torch.long)
            response_mask[b, :len(r)] = 1.0
            logp[b, :len(r)] = torch.tensor(lp)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "response_ids": response_ids,
            "response_mask": response_mask, "logp": logp, "truncated": torch.tensor(truncated)}


def generate_rollouts_vllm(llm, tokenizer, prompts: list[str], G: int, max_new_tokens: int,
                           temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None):
    """G rollouts per prompt from the engine, as rollout.Rollouts (+ `vllm_logp`).

    old_logp is left as vLLM's log-probs here; train.py recomputes the trainer's own
    teacher-forced log-probs (the "old policy" pass) and logs the gap as the canary.
    top_k=-1 disables top-k sampling (vLLM's "off" value; top_k=0 is also accepted as
    "off" by recent releases).
    """
    from vllm import SamplingParams

    from rollout import Rollouts
    prompt_token_ids = [tokenizer(p)["input_ids"] for p in prompts]
    params = SamplingParams(n=G, temperature=temperature, top_p=top_p, top_k=-1, max_tokens=max_new_tokens,
                            logprobs=0, seed=seed)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_token_ids], params, use_tqdm=False)
    t = assemble(prompt_token_ids, [o.outputs for o in outs], G, tokenizer.pad_token_id)
    texts = [tokenizer.decode(row[: int(n)].tolist(), skip_special_tokens=True)
             for row, n in zip(t["response_ids"], t["response_mask"].sum(1))]
    ro = Rollouts(prompts=list(prompts), G=G, prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"],
                  response_ids=t["response_ids"], response_mask=t["response_mask"], old_logp=t["logp"],
                  texts=texts, truncated=t["truncated"], entropy=None)
    ro.vllm_logp = t["logp"]
    return ro


def canary_gap(vllm_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> float:
    """Mean |vLLM log-prob - trainer log-prob| over real response tokens (trap 7).

    ~0.01 nats is normal (bf16 engine vs fp32/bf16 trainer, different kernels); 0.1 and
    up means the engine is sampling from other weights than the trainer scores with
    (a missed push, a stale prefix cache, or a reload from disk).
    """
    m = mask.float()
    return float(((vllm_logp.float() - trainer_logp.float()).abs() * m).sum() / m.sum().clamp(min=1))


def gpu_smoke_test(model_path: str) -> None:  # pragma: no cover - needs a GPU
    """Trap 8, for the day a GPU is available. UNTESTED: no GPU existed when written.

    Push perturbed weights and check the samples change; push the true weights back and
    check the canary is small (< 5e-2 nats).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rollout
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda()
    llm = make_engine(model_path, max_model_len=1024)
    prompts = ["1+1=", "The capital of France is"]
    before = generate_rollouts_vllm(llm, tok, prompts, 2, 16, temperature=1e-3, seed=0).texts
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    push_weights(llm, model)
    perturbed = generate_rollouts_vllm(llm, tok, prompts, 2, 16, temperature=1e-3, seed=0).texts
    assert perturbed != before, "outputs did not change after pushing perturbed weights"
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved[n])
    push_weights(llm, model)
    ro = generate_rollouts_vllm(llm, tok, prompts, 2, 16, seed=0)
    with torch.no_grad():
        lp, _ = rollout.token_logprobs(model, ro.prompt_ids.cuda(), ro.prompt_mask.cuda(),
                                       ro.response_ids.cuda(), ro.response_mask.cuda())
    gap = canary_gap(ro.vllm_logp, lp.cpu(), ro.response_mask)
    assert gap < 5e-2, f"canary gap {gap:.3f} nats after pushing the true weights back"
    print(f"vLLM smoke test passed; canary gap {gap:.4f} nats")
