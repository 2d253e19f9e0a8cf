"""The vLLM path's pure parts on CPU, with fake engine outputs (vLLM is not installed)."""

from types import SimpleNamespace as NS

import pytest
import torch

import vllm_rollout as V


def completion(tokens, logps, finish="stop"):
    # vLLM: one dict per position {token_id: Logprob(logprob=...)}; logprobs=0 -> sampled only
    return NS(token_ids=tokens, logprobs=[{t: NS(logprob=lp)} for t, lp in zip(tokens, logps)],
              finish_reason=finish)


def test_vllm_is_absent_here_and_engine_says_how_to_get_it():
    assert V.vllm_available() is False
    with pytest.raises(ImportError, match="requirements-gpu.txt"):
        V.make_engine("some/model", max_model_len=128)


def test_assemble_pads_masks_and_places_logprobs():
    prompts = [[5, 6, 7], [8]]
    outs = [[completion([1, 2], [-0.1, -0.2]), completion([3], [-0.3], "length")],
            [completion([4, 4, 4], [-1.0, -2.0, -3.0], "length"), completion([], [])]]
    t = V.assemble(prompts, outs, G=2, pad_id=0)
    assert t["prompt_ids"].tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert t["prompt_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert t["response_ids"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 4, 4], [0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert torch.allclose(t["logp"], torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-1, -2, -3], [0, 0, 0.0]]))
    assert t["truncated"].tolist() == [False, True, True, False]
    with pytest.raises(ValueError, match="expected G=3"):
        V.assemble(prompts, outs, G=3, pad_id=0)


def test_strip_wrapper_prefix():
    assert V.strip_wrapper_prefix("_orig_mod.module.model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert V.strip_wrapper_prefix("lm_head.weight") == "lm_head.weight"


class FakeLLM:
    def __init__(self, reset_ok=True):
        self.calls, self.reset_ok, self.order = [], reset_ok, []

    def collective_rpc(self, method, kwargs):
        self.order.append("push")
        self.calls.append((method, list(kwargs["weights_iterator"]), kwargs["is_checkpoint_format"]))

    def reset_prefix_cache(self):
        self.order.append("reset")
        return self.reset_ok


def test_push_weights_sends_everything_in_one_call_in_engine_dtype_then_resets():
    emb = torch.nn.Embedding(5, 3)
    model = torch.nn.Module()
    model.embed = emb
    model.head = torch.nn.Linear(3, 5, bias=False)
    model.head.weight = emb.weight                      # tied, like Qwen2.5-0.5B
    llm = FakeLLM()
    n = V.push_weights(llm, model)
    assert llm.order == ["push", "reset"] and len(llm.calls) == 1
    method, weights, ckpt = llm.calls[0]
    assert method == "reload_weights" and ckpt is True and n == len(weights) == 1
    assert weights[0][0] == "embed.weight" and weights[0][1].dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="prefix cache"):
        V.push_weights(FakeLLM(reset_ok=False), model)


def test_canary_gap_hand_example():
    v = torch.tensor([[-1.0, -2.0, 0.0]])
    t = torch.tensor([[-1.1, -1.8, -9.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    assert V.canary_gap(v, t, m) == pytest.approx(0.15)
