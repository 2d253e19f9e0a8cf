"""Rollouts from vLLM running inside the trainer's process (one GPU). UNTESTED ON A GPU.

Why vLLM at all. Sampling G rollouts per prompt is most of an RL step's wall time, and
transformers' `generate` is slow at it. vLLM batches the requests continuously, shares
one prompt's keys and values between its G samples (prefix caching) and returns the
log-probability of every sampled token. The price is a SECOND copy of the policy, the
engine's, which must be overwritten with the trainer's weights after every optimizer
step. Every trap below is a way for the two copies to drift apart silently: the run
keeps going, the loss looks fine, and the rollouts come from a policy you are not
training. This file is small on purpose and keeps the traps next to the lines they
concern. rollout.py (transformers, CPU, tested end to end) stays the default path.

The recipe (../shared/vllm.md, read against vLLM's own source and against how TRL,
verl and OpenRLHF sync weights):

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"    # engine lives in this process
    llm = LLM(model=path, dtype="bfloat16", enable_prefix_caching=True, enforce_eager=True,
              gpu_memory_utilization=0.3, logprobs_mode="processed_logprobs",
              generation_config="vllm", seed=0, max_model_len=P + T)
    torch.manual_seed(...)                                # AFTER LLM(): it reseeds
    ... every step:  generate -> score -> optimizer step(s) -> push_weights(llm, policy)

The traps (numbered as in vllm.md):
1. Stale prefix cache. vLLM keys cached blocks by token ids, not by weights, and does
   not flush them when weights change. GRPO groups re-send the same prompts, so the
   next batch would reuse keys/values computed by the OLD weights. push_weights calls
   reset_prefix_cache() and refuses to continue if it returns False.
2. Sleep mode. reload_weights with no weights_iterator reloads the ORIGINAL checkpoint
   from disk ("Use path of original model if neither is provided", vLLM's
   gpu_model_runner.py); combined with sleep level 2 this trained TRL users on
   base-model rollouts. We never sleep and never call reload_weights without weights.
3. Tied embeddings and fused layers. Send all parameters in ONE reload_weights call:
   each call runs vLLM's layer-wise reload (initialise, load, finalise per layer), which
   cannot finish a fused layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj) from a
   partial set of its weights (its documented limitation), and a tied lm_head must
   see the embedding pushed in the same reload.
4. Names. Hugging Face names unchanged (vLLM fuses q/k/v itself); wrapper prefixes
   (`_orig_mod.` from torch.compile, `module.` from DDP) stripped. FSDP/DeepSpeed-sharded
   or PEFT-wrapped models need gathering/merging first: out of scope here.
5. dtype. Cast to the engine's dtype before pushing; bf16 engine vs fp32 trainer leaves
   ~1e-2 nats of honest disagreement in every log-prob.
6. Memory. gpu_memory_utilization is a share of the WHOLE card reserved at start-up
   for vLLM's weights + KV cache; the trainer's weights, gradients, Adam state and
   activations must fit in the rest.
7. The canary: after each push, mean |vLLM log-prob - trainer log-prob| over the
   sampled tokens (canary_gap). ~0.01 nats is normal in bf16; far above means the two
   copies differ (trap 1, 2 or a missed push).
8. A GPU smoke test (gpu_smoke_test) for the day a GPU is available.

What is tested without a GPU (tests/test_vllm_rollout.py): everything that does not
need vLLM itself. The glue (`generate_rollouts_vllm`, `push_weights`, `make_engine`) is
run against fake engine objects that mimic vLLM's documented call signatures, including
a CPU replay of trap 8 in which the "engine" is a second copy of the tiny model. What
is NOT tested: that vLLM 0.33 really behaves as those fakes do. vLLM is imported only
inside functions; importing this module never needs it.

Conventions: the same as rollout.py (B = N*G rollouts, prompt-major; prompts left-padded,
responses right-padded; masks 1 on real response tokens incl. a generated EOS; natural
logs).
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch
from torch import Tensor

WRAPPER_PREFIXES = ("_orig_mod.", "module.")
CANARY_OK_NATS = 0.05
"""Above this mean |gap| (nats) the engine is almost surely not sampling the trained
policy; bf16 rounding alone gives ~0.01 (vllm.md trap 7). A rule of thumb, not a bound."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------------------------
# 1. The engine
# ---------------------------------------------------------------------------------------

def vllm_available() -> bool:
    """True if the `vllm` package is installed (never on this project's CPU machines).

    Uses importlib.util.find_spec, so asking does not import vLLM (a multi-second import
    that touches CUDA); make_engine does the real import.
    """
    return importlib.util.find_spec("vllm") is not None


def make_engine(model_path: str, max_model_len: int, gpu_memory_utilization: float = 0.3, seed: int = 0,
                dtype: str = "bfloat16"):
    """An in-process vLLM engine for rollouts: `vllm.LLM` with the recipe's settings.

    model_path: the checkpoint directory the trainer loaded (same weights, same tokenizer).
    max_model_len: must cover the longest prompt + max_new_tokens (vLLM rejects longer).
    gpu_memory_utilization: share of the whole card vLLM reserves at start-up (trap 6);
      0.3 leaves ~70% of the card for training a 0.5B model.
    dtype: the engine's dtype, "bfloat16" | "float16" | "float32"; push_weights casts to it.

    Settings and why:
    - VLLM_ENABLE_V1_MULTIPROCESSING=0 before constructing: vLLM's default runs the
      engine core in a background process reached over ZMQ; then collective_rpc would
      have to pickle the weights generator push_weights sends (it cannot). With 0 the
      engine, its worker and its model live in this Python process.
    - enable_prefix_caching=True: the G samples of a prompt share its keys/values.
    - enforce_eager=True: no CUDA graph capture (less memory and start-up time, and one
      moving part fewer while the weights are rewritten in place every step).
    - logprobs_mode="processed_logprobs": returned log-probs are those of the
      distribution actually sampled, after temperature (and top-p if used), i.e.
      log softmax(z / T) like rollout.token_logprobs. The default "raw_logprobs" would
      return log softmax(z), which differs whenever T != 1.
    - generation_config="vllm": ignore the checkpoint's generation_config.json sampling
      defaults (Qwen2.5-Instruct ships top_k=20, top_p=0.8, repetition_penalty=1.05);
      its EOS ids are still used to stop.

    Seeding: constructing the engine calls vLLM's set_random_seed(seed), which reseeds
    Python's random, numpy and torch IN THIS PROCESS. The caller must seed its own RNGs
    AFTER this call (train.py does). Raises ImportError when vLLM is not installed.
    """
    if not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if not vllm_available():
        raise ImportError("the vLLM rollout backend needs vLLM on a CUDA machine: "
                          "pip install -r requirements-gpu.txt (vllm 0.33.0; it brings its own torch)")
    # Must be set before LLM() builds its engine client (vLLM reads it then).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    return LLM(model=model_path, dtype=dtype, max_model_len=max_model_len,
               gpu_memory_utilization=gpu_memory_utilization, seed=seed,
               enable_prefix_caching=True, enforce_eager=True,
               logprobs_mode="processed_logprobs", generation_config="vllm")


# ---------------------------------------------------------------------------------------
# 2. Pushing the trainer's weights into the engine
# ---------------------------------------------------------------------------------------

def push_weights(llm, model, dtype: torch.dtype | None = None) -> int:
    """Overwrite the engine's weights with `model`'s, then reset the prefix cache.

        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": it,
                                                     "is_checkpoint_format": True})
        llm.reset_prefix_cache() must return True

    `it` streams (name, tensor) for every entry of model.named_parameters(), one tensor
    cast at a time, so at most one extra parameter-sized copy exists while pushing (a
    bf16 model is not copied at all: .to(bf16) returns the tensor itself).
    - Names: Hugging Face names with wrapper prefixes stripped (trap 4).
    - Tied embeddings (trap 3): named_parameters() lists a tied weight once, under
      model.embed_tokens.weight; vLLM's Qwen2/Llama loaders skip lm_head.* when
      tie_word_embeddings is set, so the engine receives each distinct tensor once.
    - dtype: the engine's (trap 5), read from llm.model_config.dtype; pass `dtype` to
      override. Falls back to bfloat16 (make_engine's default) if it cannot be read.
    - is_checkpoint_format=True: the tensors are in checkpoint layout (unfused, unsharded);
      vLLM's model.load_weights fuses and processes them as at start-up.

    In-process only: the generator is consumed inside collective_rpc, in this process.
    If nothing was consumed (e.g. multiprocessing left on), raises RuntimeError rather
    than training against stale weights. Raises RuntimeError if reset_prefix_cache()
    returns False (vLLM refuses while requests are running; after a finished
    llm.generate none are). Returns the number of tensors pushed.
    """
    dtype = dtype if dtype is not None else engine_dtype(llm)
    sent: list[str] = []

    def stream():
        seen = set()
        for name, param in model.named_parameters():
            clean = strip_wrapper_prefix(name)
            if clean in seen:
                raise ValueError(f"two parameters map to the engine name {clean!r} after stripping wrappers")
            seen.add(clean)
            sent.append(clean)
            yield clean, param.detach().to(dtype)

    with torch.no_grad():
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream(), "is_checkpoint_format": True})
    if not sent:
        raise RuntimeError("the engine did not read any weights during reload_weights; is it running in this "
                           "process (VLLM_ENABLE_V1_MULTIPROCESSING=0, see make_engine)?")
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache after a weight push; the next rollouts "
                           "would reuse keys/values of the old weights (trap 1)")
    return len(sent)


def strip_wrapper_prefix(name: str) -> str:
    """'_orig_mod.module.model.norm.weight' -> 'model.norm.weight' (any order, repeated)."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def engine_dtype(llm) -> torch.dtype:
    """The engine's weight dtype: llm.model_config.dtype (vLLM resolves it to a torch.dtype
    at start-up), else llm.llm_engine.model_config.dtype, else bfloat16."""
    for owner in (llm, getattr(llm, "llm_engine", None)):
        value = getattr(getattr(owner, "model_config", None), "dtype", None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and value in _DTYPES:
            return _DTYPES[value]
    return torch.bfloat16


# ---------------------------------------------------------------------------------------
# 3. Sampling G rollouts per prompt
# ---------------------------------------------------------------------------------------

def generate_rollouts_vllm(llm, tokenizer, prompts: list[str], G: int, max_new_tokens: int,
                           temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None):
    """G rollouts per prompt from the engine, as rollout.Rollouts plus `.vllm_logp`.

    Steps: tokenize each prompt with the trainer's tokenizer (the same ids rollout.py
    feeds `generate`, special tokens included); one request per prompt,
    {"prompt_token_ids": ids} with SamplingParams(n=G, temperature, top_p, top_k=0,
    max_tokens=max_new_tokens, logprobs=0, seed); read each completion's token_ids, the
    log-prob of each sampled token (logprobs=0 asks for the sampled token only) and
    finish_reason ("length" = truncated); pad into tensors (assemble_rollout_tensors).

    top_k=0 means "off" (vLLM: "Set to 0 (or -1) to consider all tokens"; 0 is the
    default). The EOS token, when generated, is the last entry of token_ids and keeps
    its log-prob, matching rollout.py's mask convention.

    old_logp and vllm_logp: both hold vLLM's log-probs here. The trainer does NOT use
    them as logp_old: train.py recomputes logp_old with its own teacher-forced forward
    (as verl's recompute_log_prob does), so the PPO ratio starts at exactly 1, and logs
    canary_gap(vllm_logp, recomputed) as the staleness canary. entropy is None (vLLM
    does not return full-vocabulary entropies; train.py computes them in that pass).
    With top_p < 1 vLLM's processed log-probs are those of the truncated distribution,
    while the trainer scores the untruncated one (rollout.py's convention), so the
    canary then also measures the truncation; keep top_p = 1 for a clean canary.

    seed: None (default, right for training) draws from the engine's generator, seeded
    once by LLM(seed=...), so each step gets fresh noise. An int makes the batch
    reproducible: rollout b gets its own seed + b (request_seeds). Do not pass the SAME
    int every step: the same noise would be reused every step. Per-request seeds also
    take a slower per-row sampling path in vLLM.

    prompts: N >= 1 strings; G >= 1; max_new_tokens >= 1; temperature > 0; 0 < top_p <= 1.
    Returns Rollouts (B = N*G rows, CPU tensors) with an extra attribute vllm_logp [B, T].
    """
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of str, got {prompts!r:.80}")
    if not isinstance(G, int) or G < 1:
        raise ValueError(f"G (rollouts per prompt) must be an int >= 1, got {G!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (vLLM treats ~0 as greedy, which forbids n > 1), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer defines neither a pad nor an EOS token")

    from vllm import SamplingParams

    from rollout import Rollouts

    prompt_ids = [list(tokenizer(p)["input_ids"]) for p in prompts]
    for p, ids in zip(prompts, prompt_ids):
        if not ids:
            raise ValueError(f"prompt {p!r} tokenized to zero tokens")
    params = [SamplingParams(n=G, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_new_tokens,
                             logprobs=0, seed=s)
              for s in request_seeds(seed, len(prompts), G)]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    t = assemble_rollout_tensors(prompt_ids, [list(o.outputs) for o in outputs], G, pad_id)
    texts = [tokenizer.decode(row[: int(n)].tolist(), skip_special_tokens=True)
             for row, n in zip(t["response_ids"], t["response_mask"].sum(1))]
    ro = Rollouts(prompts=list(prompts), G=G, prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"],
                  response_ids=t["response_ids"], response_mask=t["response_mask"], old_logp=t["logp"].clone(),
                  texts=texts, truncated=t["truncated"], entropy=None)
    ro.vllm_logp = t["logp"]
    return ro


def request_seeds(seed: int | None, N: int, G: int) -> list[int | None]:
    """Per-request seeds so that every rollout of the batch has its own random stream.

    vLLM splits a request with n = G into G child requests and gives child j the seed
    s + j (vllm/v1/engine/parallel_sampling.py). One shared SamplingParams(seed=s) for
    all prompts would therefore give rollout j of EVERY prompt the same seed s + j:
    the same noise behind different prompts. Prompt i gets s + i*G instead, so rollout
    b = i*G + j gets s + b, all distinct. seed=None -> [None] * N (engine's generator).
    """
    if seed is None:
        return [None] * N
    return [seed + i * G for i in range(N)]


# ---------------------------------------------------------------------------------------
# 4. Pure assembly: vLLM's per-request outputs -> padded tensors (tested without vLLM)
# ---------------------------------------------------------------------------------------

def assemble_rollout_tensors(prompt_token_ids: list[list[int]], completions: list[list], G: int,
                             pad_id: int) -> dict[str, Tensor]:
    """Padded rollout tensors from lists of token ids and log-probs.

    prompt_token_ids: N lists of ints. completions: N lists of G objects shaped like
    vLLM's CompletionOutput: .token_ids (list[int]), .logprobs (one dict per position,
    {token_id: Logprob(logprob=...)}, see sampled_token_logprobs) and .finish_reason
    ("stop": EOS or stop token generated; "length": max_tokens reached).

    Returns, with B = N*G rows in prompt-major order (row b = prompt b // G):
      prompt_ids [B, P] long, left-padded with pad_id; prompt_mask [B, P] long;
      response_ids [B, T] long, right-padded; response_mask [B, T] float;
      logp [B, T] float32, log-prob of each sampled token, 0 on padding;
      truncated [B] bool (finish_reason == "length").
    P = longest prompt, T = longest response (at least 1 so tensors are never empty).
    Raises ValueError on a count mismatch, a missing/misaligned log-prob, or a
    finish_reason other than "stop"/"length" (e.g. "abort": a rollout vLLM gave up on
    must not be trained on as if it were complete).
    """
    if len(prompt_token_ids) != len(completions):
        raise ValueError(f"{len(prompt_token_ids)} prompts but {len(completions)} request outputs")
    prompts, responses, logps, truncated = [], [], [], []
    for i, (ids, outs) in enumerate(zip(prompt_token_ids, completions)):
        if len(outs) != G:
            raise ValueError(f"expected G={G} completions for prompt {i}, got {len(outs)}")
        for c in outs:
            if c.finish_reason not in ("stop", "length"):
                raise ValueError(f"prompt {i}: unexpected finish_reason {c.finish_reason!r} (want 'stop' or 'length')")
            prompts.append(list(ids))
            responses.append(list(c.token_ids))
            logps.append(sampled_token_logprobs(c))
            truncated.append(c.finish_reason == "length")
    prompt_ids, prompt_mask = pad_rows(prompts, pad_id, left=True)
    response_ids, response_mask = pad_rows(responses, pad_id, left=False)
    logp, _ = pad_rows(logps, 0.0, left=False, dtype=torch.float32, width=response_ids.shape[1])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "response_ids": response_ids,
            "response_mask": response_mask.float(), "logp": logp, "truncated": torch.tensor(truncated, dtype=torch.bool)}


def sampled_token_logprobs(completion) -> list[float]:
    """[log pi(token_t | prefix) for t in range(len(token_ids))] from one completion.

    vLLM's CompletionOutput.logprobs (default layout, flat_logprobs=False) is a list with
    one dict per generated position mapping token id -> Logprob(logprob, rank,
    decoded_token). With SamplingParams(logprobs=k) each dict holds the top-k tokens
    PLUS the sampled one; k = 0 leaves exactly the sampled token. We look the sampled
    token up by id rather than taking "the only entry", so k > 0 also works.
    """
    tokens, per_position = list(completion.token_ids), completion.logprobs
    if per_position is None:
        raise ValueError("completion carries no logprobs: request them with SamplingParams(logprobs=0)")
    if len(per_position) != len(tokens):
        raise ValueError(f"{len(tokens)} sampled tokens but {len(per_position)} log-prob entries")
    out = []
    for t, (token, entries) in enumerate(zip(tokens, per_position)):
        entry = entries.get(token) if entries is not None else None
        if entry is None:
            raise ValueError(f"position {t}: sampled token {token} has no log-prob entry")
        value = float(entry.logprob)
        if not math.isfinite(value):
            raise ValueError(f"position {t}: sampled token {token} has log-prob {value}")
        out.append(value)
    return out


def pad_rows(rows: list[list], pad_value, left: bool, dtype: torch.dtype = torch.long,
             width: int | None = None) -> tuple[Tensor, Tensor]:
    """Ragged rows -> (values [R, W], mask [R, W] long), padded on the left or the right.

    W = width if given, else max(1, longest row). Rows longer than W raise ValueError.
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


# ---------------------------------------------------------------------------------------
# 5. The canary (trap 7)
# ---------------------------------------------------------------------------------------

def canary_gap(vllm_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> float:
    """Mean absolute log-prob gap over real response tokens, in nats.

        gap = sum_{b,t} m_{b,t} |lp_vllm - lp_trainer| / sum_{b,t} m_{b,t}

    Both sides score the SAME sampled tokens: vLLM while sampling, the trainer in its
    teacher-forced "old policy" pass right after. With identical weights the only
    differences are numerics: ~1e-6 in float32, ~0.01 nats with a bf16 engine (rounded
    weights, different kernels, incremental decoding vs one forward pass). A gap well
    above that (CANARY_OK_NATS = 0.05 as a rule of thumb, typically 0.1-1 nats) means
    the engine samples from other weights than the trainer scores with: a missed push,
    a stale prefix cache (trap 1) or a reload from disk (trap 2). It is also a first
    sign of a mismatched sampling setup (temperature or top_p not applied alike).

    Shapes [B, T] (equal); padding values are ignored even if NaN. Returns 0.0 when the
    mask is empty.
    """
    if vllm_logp.shape != trainer_logp.shape or vllm_logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: vllm_logp {tuple(vllm_logp.shape)}, trainer_logp "
                         f"{tuple(trainer_logp.shape)}, mask {tuple(mask.shape)}")
    real = mask > 0
    diff = torch.where(real, (vllm_logp.float() - trainer_logp.float()).abs(), torch.zeros((), dtype=torch.float32))
    return float(diff.sum() / real.sum().clamp(min=1))


# ---------------------------------------------------------------------------------------
# 6. GPU smoke test (trap 8). UNTESTED: no GPU was available when this was written.
# ---------------------------------------------------------------------------------------

def gpu_smoke_test(model_path: str, G: int = 4, max_new_tokens: int = 32, seed: int = 1234) -> dict:  # pragma: no cover
    """Check on a real GPU that pushes reach the engine. Never run by the test suite.

    UNTESTED: no GPU was available when this was written; expect to debug it once.
    (tests/test_vllm_rollout.py replays the same steps on CPU against a fake engine.)

      A. true weights pushed; sample with a fixed seed; canary vs the trainer small.
      B. perturb the trainer's weights, push; sample again with the same seed: the
         samples must change, and the canary vs the PERTURBED trainer must be small
         (the engine really holds the new weights, not just "something else").
      C. negative control: restore the trainer's weights WITHOUT pushing; the canary of
         B's rollouts vs the restored trainer must be large (the canary detects staleness).
      D. push the restored weights; sample with the seed of A; canary small again, and
         report whether the samples equal A's (they should, up to GPU nondeterminism).
    Returns the measured numbers; raises AssertionError on a failed check.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rollout

    llm = make_engine(model_path, max_model_len=512, gpu_memory_utilization=0.3)
    torch.manual_seed(0)                                           # after make_engine (it reseeds)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda().eval()
    prompts = ["12+35=", "The capital of France is", "def fib(n):"]

    def sample_and_gap():
        ro = generate_rollouts_vllm(llm, tok, prompts, G, max_new_tokens, seed=seed)
        with torch.no_grad():
            lp, _ = rollout.token_logprobs(model, ro.prompt_ids.cuda(), ro.prompt_mask.cuda(),
                                           ro.response_ids.cuda(), ro.response_mask.cuda())
        return ro, canary_gap(ro.vllm_logp, lp.float().cpu(), ro.response_mask)

    push_weights(llm, model)
    ro_a, gap_a = sample_and_gap()
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1 * p.float().std().to(p.dtype))
    push_weights(llm, model)
    ro_b, gap_b = sample_and_gap()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved[n])
        lp, _ = rollout.token_logprobs(model, ro_b.prompt_ids.cuda(), ro_b.prompt_mask.cuda(),
                                       ro_b.response_ids.cuda(), ro_b.response_mask.cuda())
    gap_stale = canary_gap(ro_b.vllm_logp, lp.float().cpu(), ro_b.response_mask)
    push_weights(llm, model)
    ro_d, gap_d = sample_and_gap()
    result = {"gap_true": gap_a, "gap_perturbed": gap_b, "gap_stale_control": gap_stale, "gap_restored": gap_d,
              "samples_changed_after_perturb": not torch.equal(ro_a.response_ids, ro_b.response_ids),
              "samples_restored_exactly": torch.equal(ro_a.response_ids, ro_d.response_ids)}
    print("vLLM smoke test:", result)
    assert result["samples_changed_after_perturb"], "samples did not change after pushing perturbed weights"
    for key in ("gap_true", "gap_perturbed", "gap_restored"):
        assert result[key] < CANARY_OK_NATS, f"{key} = {result[key]:.4f} nats: the engine is not sampling the policy"
    assert gap_stale > CANARY_OK_NATS, f"stale control gap {gap_stale:.4f} nats: the canary cannot see staleness"
    return result
