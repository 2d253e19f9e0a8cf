"""sampler.py: the run's sampler, built once at set-up: the only file of the engine that knows which engine samples.

Critic-free RL (GRPO and its family, Shao et al. 2024) samples, at every step, G responses
to each of N prompts from the current policy; evaluation samples n responses per
held-out prompt; the token diagnostics sample continuations of a response's prefixes.
All of it goes through one object, made once from SamplingConfig (the settings, below),
the model and its tokenizer, the way nanochat builds one Engine(model, tokenizer) whose
generate its RL script calls. Two engines can stand behind it, with the same methods:

  KVCacheSampler   our KV-cached sampling loop (machinery/rollout.py) on the trainer's own
                   model: what it samples is exactly the policy being trained.
  VllmSampler      an in-process vLLM engine (machinery/vllm_rollout.py): a second copy of
                   the policy, overwritten with the trainer's weights after every optimizer
                   step (sync), whose log-probs are compared with the trainer's at every
                   step (check_old_policy: the staleness canary, machinery/vllm_staleness.py).

    sample(prompts, G, step)              the step's rollouts (rollout.Rollouts)
    sample_texts(prompts, n, T, step)     n decoded responses per prompt (evaluation)
    continuations(ids, mask, k, budget)   k continuations of each token prefix (token values)
    sync()                                after the step's optimizer steps: the engine's weights
    check_old_policy(rollouts, old_logp)  the canary, on the old policy's teacher-forced pass
    metrics()                             the sampler's own numbers of the step (vllm/...)

make_sampler reads --backend, and so does memory_problem (only our loop's cache lives in
the trainer's memory); nothing else in the engine does but set-up's question whether vLLM
is installed, so train.py's loop names no engine (tests/engine/test_editing_the_source.py
checks both). A sampling setting is declared, checked and applied here only: its field
and check in SamplingConfig, and what it does to the distribution in `truncate` (our
loop) and `vllm_truncation` (vLLM's request). Elsewhere a setting is read for what it
means there (the temperature the update scores at, the budget it normalises by, set-up's
chat-template check), never to sample (docs/extending.md, "Add a sampling setting"; the
editing test adds top_k so and samples with it on both engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from machinery import forward, rollout, vllm_rollout, vllm_staleness
from machinery.flags import FIXED, MAY_CHANGE, check_counts, refuse_nonfinite, require
from machinery.usage_error import size_text

MIN_TEMPERATURE = 1e-2
"""vLLM silently raises any 0 < temperature < 0.01 to 0.01 (its sampling_params.py, _MAX_TEMP);
its log-probs would then be of another distribution than the trainer's."""
MAX_TEMPERATURE = 2.0
"""vLLM's SamplingParams rejects temperature > 2."""
EVAL_ROLLOUTS_PER_CALL = 256
"""Our loop samples an evaluation in calls of at most this many rollouts (vLLM batches itself)."""


@dataclass
class SamplingConfig:
    """How rollouts are sampled: the engine, the budget and the distribution.

    train.py's Config nests it as cfg.sampling; each field is the flag of its name, its
    docstring the --help. Read by this file only (the samplers below), and by the update
    for the temperature it scores at and the budget it normalises by. Every field is the
    run's math but the engine's memory share (a resume may change only that). Checked
    here, once, when it is built: one line naming the value.
    """

    backend: str = field(default="transformers", metadata=FIXED)
    """Rollout engine: 'transformers' (our KV-cached sampler; CPU, tested) or 'vllm' (in-process engine)."""
    max_new_tokens: int = field(default=48, metadata=FIXED)
    """Generation budget per rollout (also Dr. GRPO's constant normaliser)."""
    temperature: float = field(default=1.0, metadata=FIXED)
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = field(default=1.0, metadata=FIXED)
    """Nucleus sampling of rollouts and evaluation (1 = off; < 1 samples a truncated distribution the update does not score: machinery/logprobs.py)."""
    chat_template: bool = field(default=False, metadata=FIXED)
    """Wrap prompts in the tokenizer's chat template (instruct hub models)."""
    gpu_memory_utilization: float = field(default=0.3, metadata=MAY_CHANGE)
    """vLLM: share of the GPU's memory the engine takes at start-up."""

    def __post_init__(self):
        refuse_nonfinite(self)
        require(self.backend in ("transformers", "vllm"),
                f"--backend must be 'transformers' or 'vllm', got {self.backend!r}")
        check_counts(self, {"max_new_tokens": 1},
                     {"max_new_tokens": (2 ** 17, "128k tokens, the longest context of today's open models; every "
                                                  "rollout holds a key/value cache for its prompt and this many tokens")})
        # One range for both engines: vLLM's (it refuses T > 2 and silently raises T < 0.01
        # to 0.01). The same flags then mean the same sampling distribution on either
        # engine, and T = 1e-40 (logits / T overflow to inf, softmax to nan) never reaches
        # the sampler. evaluation.EvalConfig checks --eval_temperature against it too.
        require(MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE,
                f"--temperature must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] "
                f"(vLLM's limits, used for both backends), got {self.temperature}")
        require(0 < self.top_p <= 1, f"--top_p must be in (0, 1], got {self.top_p}")
        require(0 < self.gpu_memory_utilization <= 1,
                f"--gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


# ---------------------------------------------------------------------------------------
# What the settings do to the distribution, on each engine
# ---------------------------------------------------------------------------------------
#
# The temperature is the one setting the update reads too (it scores log softmax(z / T),
# machinery/logprobs.py), so both engines take it as an argument. Every other setting
# that changes what is drawn truncates the tempered distribution, and is read in these two
# functions only: a new one (top_k, say) is a line in each.

def truncate(cfg: SamplingConfig, probs: Tensor) -> Tensor:
    """Which tokens our loop may draw: probs [U, V] (softmax(z / T), rows summing to 1) ->
    weights [U, V], zero on the tokens cut, each row with a positive sum (not renormalised:
    rollout.draw does not need it).

    top_p < 1: the nucleus (rollout.top_p_filter, transformers' rule). The update still
    scores the untruncated distribution (as verl and TRL do: machinery/logprobs.py).
    """
    if cfg.top_p < 1:
        probs = rollout.top_p_filter(probs, cfg.top_p)
    return probs


def vllm_truncation(cfg: SamplingConfig) -> dict:
    """The same truncation in vLLM's words: SamplingParams' top_p, and top_k = 0 (off).

    Everything else the engine could apply stays at vLLM's neutral value, and the engine
    reads no generation_config.json (vllm_rollout.make_engine: generation_config="vllm").
    """
    return {"top_p": cfg.top_p, "top_k": 0}


# ---------------------------------------------------------------------------------------
# Building the sampler (set-up), and its memory (set-up's door)
# ---------------------------------------------------------------------------------------

def make_sampler(cfg: SamplingConfig, model, tokenizer, seed: int, prompts: list[str] | None = None,
                 model_path: str | None = None):
    """The run's sampler: KVCacheSampler, or for --backend vllm a VllmSampler and its engine.

    model, tokenizer: the trainer's policy (fp32) and its tokenizer. seed: the run's (the
    vLLM engine's per-batch seeds derive from it: vllm_rollout.batch_seed). For vLLM only:
    prompts, every prompt text the engine will see, training and evaluation (its
    max_model_len must hold the longest, vllm_rollout.engine_max_model_len); model_path,
    the checkpoint the trainer loaded. Building the engine reseeds Python's, numpy's and
    torch's RNGs in this process: seed the trainer's AFTER this call (setup.py does).
    """
    if cfg.backend == "transformers":
        return KVCacheSampler(cfg, model, tokenizer)
    ids = rollout.tokenize_prompts(tokenizer, format_prompts(prompts, tokenizer, cfg.chat_template), cfg.chat_template)
    device = next(model.parameters()).device
    engine = vllm_rollout.make_engine(model_path, model, vllm_rollout.engine_max_model_len(
        model.config, ids, cfg.max_new_tokens), cfg.gpu_memory_utilization, seed,
        "bfloat16" if device.type == "cuda" else "float32")
    return VllmSampler(cfg, model, tokenizer, engine, seed)


def memory_problem(cfg: SamplingConfig, model, tokenizer, longest_prompt: str, rollouts: int, what: str,
                   memory_bytes: int | None) -> str | None:
    """What is wrong if our loop's largest call cannot fit in memory, else None (and None for vLLM,
    whose cache --gpu_memory_utilization sizes at start-up).

    Every rollout of one call keeps keys and values for its prompt and up to
    max_new_tokens tokens: 2 x layers x kv heads x head size numbers per token (4 bytes
    each on a CPU, 2 under CUDA's bf16), plus its token, log-prob and entropy buffers.
    rollouts: the largest call's rollouts (set-up's: a step's N x G, an evaluation's, a
    token-value call's), `what`: the flags that set it; memory_bytes: the machine's
    (checks.memory_bytes; None: unknown, nothing refused). More than the machine's memory
    could not run: --max_new_tokens 10^8 was killed by the kernel, larger values died in C++.
    """
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or getattr(c, "num_attention_heads", None)
    head_dim = getattr(c, "head_dim", None) or (c.hidden_size // c.num_attention_heads
                                                if getattr(c, "hidden_size", None) and heads else None)
    if cfg.backend != "transformers" or not (getattr(c, "num_hidden_layers", None) and heads and head_dim):
        return None
    cuda = next(model.parameters()).device.type == "cuda"
    per_token = 2 * c.num_hidden_layers * heads * head_dim * (2 if cuda else 4)
    prompt = len(rollout.tokenize_prompts(tokenizer, format_prompts([longest_prompt], tokenizer, cfg.chat_template),
                                          cfg.chat_template)[0])
    need = rollouts * ((prompt + cfg.max_new_tokens) * per_token + cfg.max_new_tokens * 16)
    if not memory_bytes or need <= memory_bytes:
        return None
    return (f"sampling {rollouts:,} rollouts at once ({what}) of up to {prompt:,} prompt tokens + "
            f"--max_new_tokens {cfg.max_new_tokens:,} could need {size_text(need)} of key/value cache, "
            f"more than this machine's {size_text(memory_bytes)} of memory: lower --max_new_tokens or "
            f"{what.split(' ')[0]}")


def format_prompts(prompts: list[str], tokenizer, chat_template: bool) -> list[str]:
    """Optionally wrap each prompt as a user turn of the tokenizer's chat template."""
    if not chat_template:
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


# ---------------------------------------------------------------------------------------
# The two samplers
# ---------------------------------------------------------------------------------------

class KVCacheSampler:
    """Our KV-cached loop (rollout.generate_rollouts, rollout.sample) on the trainer's own model.

    Draws from torch's global RNG, which set-up seeds and every checkpoint saves, so a
    resumed run draws what the uninterrupted one drew; `step` is not needed. What it
    samples is the policy being trained at that moment: sync has nothing to do, there is no
    second copy to check, and on-policy its own entropies are the trainer's
    (separate_copy False: machinery/run.py old_policy_pass skips the old policy's pass).
    """

    separate_copy = False

    def __init__(self, cfg: SamplingConfig, model, tokenizer):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer

    def sample(self, prompts: list[str], G: int, step: int) -> rollout.Rollouts:
        """G rollouts per prompt at the run's settings: B = N * G rows, prompt-major."""
        return self._rollouts(prompts, G, self.cfg.temperature)

    def sample_texts(self, prompts: list[str], n: int, temperature: float, step: int) -> list[str]:
        """n decoded responses per prompt, N * n strings prompt-major, at `temperature`, in
        calls of at most EVAL_ROLLOUTS_PER_CALL rollouts."""
        per_call = max(1, EVAL_ROLLOUTS_PER_CALL // n)
        return [text for i in range(0, len(prompts), per_call)
                for text in self._rollouts(prompts[i:i + per_call], n, temperature).texts]

    def continuations(self, prompt_ids: Tensor, prompt_mask: Tensor, k: int, budget: int) -> Tensor:
        """k continuations of each left-padded token prefix [R, P]: tokens [R * k, <= budget]
        on the CPU, pad after EOS (rollout.sample, at the run's settings). Call under no_grad."""
        pad_id, eos_ids = rollout.special_ids(self.model, self.tokenizer)
        device = next(self.model.parameters()).device
        return rollout.sample(self.model, prompt_ids.to(device), prompt_mask.to(device), k, budget,
                              self.cfg.temperature, lambda probs: truncate(self.cfg, probs), pad_id, eos_ids)[0].cpu()

    def sync(self) -> None:
        """Nothing: the loop samples with the trainer's model itself."""

    def check_old_policy(self, rollouts: rollout.Rollouts, old_logp: Tensor) -> None:
        """Nothing: there is no second copy of the policy to compare."""

    def metrics(self) -> dict:
        """None of its own."""
        return {}

    def _rollouts(self, prompts: list[str], G: int, temperature: float) -> rollout.Rollouts:
        s = self.cfg
        with forward.autocast(self.model):
            return rollout.generate_rollouts(self.model, self.tokenizer, format_prompts(prompts, self.tokenizer,
                                                                                        s.chat_template),
                                             G, s.max_new_tokens, temperature=temperature,
                                             chat_template=s.chat_template, truncate=lambda p: truncate(s, p))


class VllmSampler:
    """An in-process vLLM engine (vllm_rollout.py), a second copy of the policy.

    Each batch's requests get seeds from (the run's seed, the step, a stream: 0 training,
    1 evaluation: vllm_rollout.batch_seed), so a run and its resume send the same requests.
    sync pushes the trainer's weights after the step's optimizer steps (and after a
    resume's load); check_old_policy compares the engine's log-probs of the tokens it drew
    with the trainer's old-policy pass (the staleness canary: a push that never arrived,
    a stale prefix cache, a stale tied head), so that pass always runs (separate_copy).
    The token diagnostics' continuations come from the trainer's model through our loop:
    they are of the weights just updated, which the engine gets only at sync.
    """

    separate_copy = True

    def __init__(self, cfg: SamplingConfig, model, tokenizer, engine, seed: int):
        self.cfg, self.model, self.tokenizer, self.engine, self.seed = cfg, model, tokenizer, engine, seed
        self.staleness = vllm_staleness.StalenessCheck()
        self.ours = KVCacheSampler(cfg, model, tokenizer)

    def sample(self, prompts: list[str], G: int, step: int) -> rollout.Rollouts:
        """G rollouts per prompt from the engine, seeded by (the run's seed, step, stream 0)."""
        s = self.cfg
        return vllm_rollout.generate_rollouts_vllm(self.engine, self.tokenizer,
                                                   format_prompts(prompts, self.tokenizer, s.chat_template), G,
                                                   s.max_new_tokens, s.temperature,
                                                   seed=vllm_rollout.batch_seed(self.seed, step, 0),
                                                   chat_template=s.chat_template, truncation=vllm_truncation(s))

    def sample_texts(self, prompts: list[str], n: int, temperature: float, step: int) -> list[str]:
        """One call for every prompt: the engine batches internally, one seed range."""
        s = self.cfg
        return vllm_rollout.sample_texts_vllm(self.engine, self.tokenizer,
                                              format_prompts(prompts, self.tokenizer, s.chat_template), n,
                                              s.max_new_tokens, temperature,
                                              seed=vllm_rollout.batch_seed(self.seed, step, 1),
                                              chat_template=s.chat_template, truncation=vllm_truncation(s))

    def continuations(self, prompt_ids: Tensor, prompt_mask: Tensor, k: int, budget: int) -> Tensor:
        """Our loop's, on the trainer's model (the class docstring says why)."""
        return self.ours.continuations(prompt_ids, prompt_mask, k, budget)

    def sync(self) -> None:
        """The engine gets the trainer's weights (vllm_rollout.push_weights; its traps 1-5)."""
        vllm_rollout.push_weights(self.engine, self.model)

    def check_old_policy(self, rollouts: rollout.Rollouts, old_logp: Tensor) -> None:
        """The canary: the engine's log-probs of the drawn tokens against the trainer's."""
        self.staleness.measure(rollouts.engine_logp, old_logp, rollouts.response_mask.float())

    def metrics(self) -> dict:
        """vllm/canary_gap and vllm/canary_bound of the last check."""
        return self.staleness.last
