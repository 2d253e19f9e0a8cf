"""Tests of diagnostics.py (and tasks.template_token_mask): the token-level diagnostics of
the Cancellation Hypothesis paper, on cases whose answers are known by hand.

- flips and "where updates go": hand-made Δ log π tensors, every number computed by hand;
- the template classifier on a real addition response;
- token value: a tiny Llama whose weights make it an exactly known Markov chain over
  characters, so every success probability is known; the Monte Carlo estimates must be
  within 4 binomial standard errors of it, and a token that does not affect success
  must get value ~0 (negative control);
- coupling: the closed form against autograd on a softmax layer (float64, 1e-10), the
  three classes on a constructed case, uniform pair sampling, and the hook that reads
  the real model's output layer;
- the entry point: keys, determinism by (seed, step), and the global RNG left untouched.
"""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tasks
from tasks import addition
import diagnostics as D
from machinery import token_diagnostics as TD
from machinery import logprobs
from machinery import rollout
from machinery import tinymodel
from machinery.sampler import KVCacheSampler, SamplingConfig


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_char_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


def rollouts_by_hand(tok, prompt: str, responses: list[str], eos: bool = True) -> rollout.Rollouts:
    """One prompt, G = len(responses) hand-written responses (+ EOS), right-padded."""
    eos_id, pad = tok.eos_token_id, tok.pad_token_id
    rows = [ids_of(tok, r) + ([eos_id] if eos else []) for r in responses]
    T = max(len(r) for r in rows)
    resp = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        resp[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    p = torch.tensor([ids_of(tok, prompt)] * len(rows))
    return rollout.Rollouts(prompts=[prompt], G=len(rows), prompt_ids=p, prompt_mask=torch.ones_like(p),
                            response_ids=resp, response_mask=mask, texts=list(responses),
                            truncated=torch.zeros(len(rows), dtype=torch.bool), engine_logp=torch.zeros_like(mask))


# ---------------------------------------------------------------------------------------
# 1. Token flips, on a constructed Δ
# ---------------------------------------------------------------------------------------

def test_residual_metrics_mean_and_first_optimizer_step():
    out = D.residual_metrics([1e-9, 0.3, math.nan])
    assert out["cancellation_residual"] == pytest.approx(0.15) and out["cancellation_residual_first"] == 1e-9
    nan = D.residual_metrics([])
    assert math.isnan(nan["cancellation_residual"]) and math.isnan(nan["cancellation_residual_first"])


def test_token_flips_fractions_by_hand():
    old = torch.zeros(3, 4)
    new = torch.tensor([[0.01, -0.01, 0.0, 0.0005],       # A > 0: 1 boosted, 1 suppressed of 4
                        [0.002, 0.002, -0.5, 9.0],        # A < 0: the 9.0 is padding
                        [5.0, 5.0, 5.0, 5.0]])            # A = 0: in neither sign
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]).float()
    out = D.token_flips(new, old, mask, torch.tensor([1.0, -1.0, 0.0]))
    assert out == {"flip/boost_pos": 0.25, "flip/suppress_pos": 0.25,
                   "flip/boost_neg": pytest.approx(2 / 3), "flip/suppress_neg": pytest.approx(1 / 3)}
    # |Δ| = tau exactly is neither; no negative rollout -> no neg keys
    out = D.token_flips(torch.tensor([[1e-3, -1e-3]]), torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([2.0]),
                        tau=1e-3)
    assert out == {"flip/boost_pos": 0.0, "flip/suppress_pos": 0.0}


# ---------------------------------------------------------------------------------------
# 2. Where updates go
# ---------------------------------------------------------------------------------------

def test_specificity_cells_and_correlation_by_hand():
    # group 0 (rewards 1, 0): token 1 in both rollouts (spec 0), 2 only in the success (+1),
    # 3 only in the failure (-1); token 1's reinforcement is the mean over its 3 occurrences
    delta = torch.tensor([[0.1, 0.5, 0.1], [0.4, -0.3, 0.0]])
    ids = torch.tensor([[1, 2, 1], [1, 3, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = D.specificity(delta, torch.zeros(2, 3), mask, ids, torch.tensor([1.0, 0.0]), 2)
    spec, reinf = torch.tensor([0.0, 1.0, -1.0]), torch.tensor([0.2, 0.5, -0.3])
    assert out["credit/specificity_cells"] == 3
    assert out["credit/specificity_corr"] == pytest.approx(float(torch.corrcoef(torch.stack([spec, reinf]))[0, 1]))
    # a group of equal rewards adds no cell; a reinforcement that ignores specificity gives 0
    flat = D.specificity(torch.tensor([[0.2, 0.1, 0.2], [0.2, 0.1, 0.0]]), torch.zeros(2, 3), mask, ids,
                                   torch.tensor([1.0, 0.0]), 2)
    assert flat["credit/specificity_corr"] == pytest.approx(0.0, abs=1e-12)
    assert D.specificity(delta, torch.zeros(2, 3), mask, ids, torch.tensor([1.0, 1.0]), 2) == {}


def test_template_token_that_did_not_move_has_share_zero():
    template = torch.tensor([[True, False, True, False]])
    delta = torch.tensor([[0.0, 0.2, 0.0, -0.1]])
    out = D.where_updates_go(delta, torch.zeros(1, 4), torch.ones(1, 4), torch.tensor([1.0]), template)
    assert out["where/template_share"] == 0.0 and out["where/reasoning_share"] == 1.0
    assert out["where/template_tokens"] == 0.5
    assert out["where/dlogp_template_pos"] == 0.0
    assert out["where/dlogp_reasoning_pos"] == pytest.approx(0.05)
    assert not any(k.endswith("_neg") for k in out)                      # no A < 0 rollout


def test_where_shares_and_signed_means_by_hand():
    template = torch.tensor([[True, True, False, False],
                             [True, False, False, True],
                             [False, False, True, True]])
    new = torch.tensor([[0.3, -0.1, 0.2, 7.0],          # the 7.0 is padding
                        [-0.2, -0.4, 0.1, 0.0],
                        [1.0, 1.0, 1.0, 1.0]])          # A = 0: counts in the shares only
    old = torch.zeros(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).float()
    out = D.where_updates_go(new, old, mask, torch.tensor([0.5, -0.5, 0.0]), template)
    # |Δ|: template 0.3 + 0.1 + 0.2 + 0.0 + 1 + 1 = 2.6; reasoning 0.2 + 0.4 + 0.1 + 1 + 1 = 2.7
    assert out["where/template_share"] == pytest.approx(2.6 / 5.3)
    assert out["where/reasoning_share"] == pytest.approx(2.7 / 5.3)
    assert out["where/template_tokens"] == pytest.approx(6 / 11)
    assert out["where/dlogp_template_pos"] == pytest.approx((0.3 - 0.1) / 2)
    assert out["where/dlogp_reasoning_pos"] == pytest.approx(0.2)
    assert out["where/dlogp_template_neg"] == pytest.approx((-0.2 + 0.0) / 2)
    assert out["where/dlogp_reasoning_neg"] == pytest.approx((-0.4 + 0.1) / 2)
    # nothing moved: no shares (0/0), the signed means are 0
    still = D.where_updates_go(old, old, mask, torch.tensor([0.5, -0.5, 0.0]), template)
    assert "where/template_share" not in still and still["where/dlogp_reasoning_neg"] == 0.0


def test_template_classifier_on_a_real_addition_response(tok):
    text = addition.addition_response(347, 85)                     # "7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n"
    rollouts = rollouts_by_hand(tok, addition.addition_prompt(347, 85), [text, "1+1+0=02\nA:2\n"])
    template = tasks.template_token_mask(addition.TASK, tok, rollouts.response_ids, rollouts.response_mask)
    expected = [c not in "0123456789" for c in text] + [True]  # + EOS: template
    assert template[0].tolist() == expected
    short = [c not in "0123456789" for c in "1+1+0=02\nA:2\n"] + [True]
    assert template[1].tolist() == short + [False] * (len(expected) - len(short))   # padding: neither
    assert sum(expected) == 3 * 4 + 3 + 1                      # "++=\n" per column, "A:\n", EOS
    assert tasks.template_token_mask(tasks.get("math"), tok, rollouts.response_ids, rollouts.response_mask) is None


def test_template_classifier_counts_a_mixed_bpe_token_as_reasoning():
    class Pieces:                                               # a BPE-like tokenizer's decode
        table = {0: "=1", 1: "+", 2: "A:", 3: "", 4: "²"}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(self.table[i] for i in ids)

    template = tasks.template_token_mask(addition.TASK, Pieces(), torch.tensor([[0, 1, 2, 3, 4]]), torch.ones(1, 5))
    assert template.tolist() == [[False, True, True, True, True]]   # "²" is not an ASCII digit


# ---------------------------------------------------------------------------------------
# 3. Token value on a model whose success probability is known
# ---------------------------------------------------------------------------------------

Q = 0.3     # P(":" -> "1"): the one token that decides success

# Prompt "Z". Responses: a filler x or y (irrelevant), then "A:", then "1" (success, answer
# "1") with probability Q or "2", then "\n" and EOS. P(success) from any prefix is known.
CHAIN = {"Z": {"x": 0.5, "y": 0.5}, "x": {"A": 1.0}, "y": {"A": 1.0}, "A": {":": 1.0},
         ":": {"1": Q, "2": 1 - Q}, "1": {"\n": 1.0}, "2": {"\n": 1.0}, "\n": {"<eos>": 1.0}}


def markov_llama(tok, chain: dict) -> LlamaForCausalLM:
    """A 1-layer Llama that IS a Markov chain: P(next | ..., x) = chain[x][next] exactly.

    One-hot embeddings (d = 128 >= V = 99); attention and MLP write nothing to the
    residual stream (o_proj = down_proj = 0), so the final hidden state is
    RMSNorm(e_x) = e_x / sqrt(1/d + eps), and the (untied) head maps it to the logits
    log chain[x][.] (-50 for impossible tokens).
    """
    V, d = len(tok), 128
    cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    scale = 1.0 / math.sqrt(1.0 / d + cfg.rms_norm_eps)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(V, d))
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        model.model.layers[0].mlp.down_proj.weight.zero_()
        head = torch.zeros(V, d)
        for x, nxt in chain.items():
            col = torch.full((V,), -50.0)
            for y, p in nxt.items():
                col[tok.convert_tokens_to_ids(y)] = math.log(p)
            head[:, tok.convert_tokens_to_ids(x)] = col / scale
        model.lm_head.weight.copy_(head)
    return model


@pytest.fixture(scope="module")
def chain_model(tok):
    return markov_llama(tok, CHAIN)


def sampler(model, tok, max_new_tokens: int) -> KVCacheSampler:
    """Our sampler on `model` at temperature 1, no truncation, with this budget."""
    return KVCacheSampler(SamplingConfig(max_new_tokens=max_new_tokens), model, tok)


def test_the_markov_model_has_the_designed_probabilities(chain_model, tok):
    rollouts = rollouts_by_hand(tok, "Z", ["xA:1\n", "yA:2\n"])
    logp, _ = logprobs.token_logprobs(chain_model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask)
    l = math.log
    expected = torch.tensor([[l(.5), 0, 0, l(Q), 0, 0], [l(.5), 0, 0, l(1 - Q), 0, 0]])
    # float32 log_softmax of the designed logits (the -50s leak 99 e^-50 ~ 2e-20): measured
    # 3.0e-8 (AVX-512 and AVX2); a chain with Q and 1 - Q swapped is ln(0.7 / 0.3) = 0.85 off
    assert torch.allclose(logp, expected, atol=1e-4, rtol=0)


def test_value_estimates_match_the_known_success_probabilities(chain_model, tok):
    rollouts = rollouts_by_hand(tok, "Z", ["xA:1\n", "yA:2\n"])
    # positions: x (irrelevant filler), "1" (decides: success), "2" (decides: failure), EOS
    rows, cols = torch.tensor([0, 0, 1, 0]), torch.tensor([0, 3, 3, 5])
    k = 600
    torch.manual_seed(0)
    v_with, v_without = TD.token_values(sampler(chain_model, tok, 8), rollouts, rows, cols, ["1"], addition.TASK, k)
    se = math.sqrt(Q * (1 - Q) / k)
    # exact values: with the token / without it
    exact_with, exact_without = [Q, 1.0, 0.0, 1.0], [Q, Q, Q, 1.0]
    for got, want in zip(v_with.tolist() + v_without.tolist(), exact_with + exact_without):
        assert abs(got - want) <= 4 * se, (got, want)
    value = v_with - v_without
    assert abs(value[0]) <= 4 * math.sqrt(2) * se                 # negative control: the filler has value ~0
    assert abs(value[1] - (1 - Q)) <= 4 * se                      # the success digit: +0.7
    assert abs(value[2] - (-Q)) <= 4 * se                         # the failure digit: -0.3
    # deterministic cases are exact, not estimated: "1" and "2" decide, EOS ends the response
    assert v_with[1] == 1.0 and v_with[2] == 0.0 and v_with[3] == 1.0 and v_without[3] == 1.0


def test_value_continuations_get_the_budget_the_rollout_had_left(chain_model, tok):
    rollouts = rollouts_by_hand(tok, "Z", ["xA:1\n"])
    k = 600
    torch.manual_seed(1)
    # max_new_tokens = 3: from "x" (2 tokens left) and from "xA" (1 left) every continuation
    # stops at "xA:", which has no answer: both values are exactly 0 (Q with room to finish)
    v_with, v_without = TD.token_values(sampler(chain_model, tok, 3), rollouts, torch.tensor([0]), torch.tensor([1]),
                                        ["1"], addition.TASK, k)
    assert v_with.item() == 0.0 and v_without.item() == 0.0
    # max_new_tokens = 4: "xA:1" used the whole budget, so it is scored as it is (exactly 1);
    # from "xA:" the one token left is "1" with probability Q
    v_with, v_without = TD.token_values(sampler(chain_model, tok, 4), rollouts, torch.tensor([0]), torch.tensor([3]),
                                        ["1"], addition.TASK, k)
    assert v_with.item() == 1.0
    assert abs(v_without.item() - Q) <= 4 * math.sqrt(Q * (1 - Q) / k)


def test_value_positions_are_stratified_by_flip_and_sign():
    delta = torch.tensor([[0.1, 0.1, 0.1, -0.1, 0.0],
                          [-0.1, -0.1, 0.1, 0.0, 0.0],
                          [0.5, 0.5, 0.5, 0.5, 0.5]])              # A = 0: never sampled
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).float()
    adv = torch.tensor([1.0, -1.0, 0.0])
    rows, cols, cells = D.sample_value_positions(delta, mask, adv, 8, torch.Generator().manual_seed(0))
    # quotas 2 each: boosted_pos has 3 tokens -> 2; suppressed_pos has 1 -> 1; boosted_neg 1; suppressed_neg 2
    assert [cells.count(c) for c in D.VALUE_CELLS] == [2, 1, 1, 2]
    for b, t, cell in zip(rows.tolist(), cols.tolist(), cells):
        kind, sign = cell.split("_")
        assert (adv[b] > 0) == (sign == "pos") and adv[b] != 0 and mask[b, t] == 1
        assert (delta[b, t] > 1e-3) if kind == "boosted" else (delta[b, t] < -1e-3)
    assert len(set(zip(rows.tolist(), cols.tolist()))) == len(cells)   # without replacement


def test_value_stats_by_hand():
    out = D.value_stats(torch.tensor([1.0, 0.0, 0.5, -0.5]), ["boosted_pos", "boosted_pos", "suppressed_neg",
                                                              "boosted_neg"])
    assert out["value/boosted_pos"] == 0.5 and out["value/n_boosted_pos"] == 2
    assert out["value/se_boosted_pos"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))
    assert out["value/n_suppressed_pos"] == 0 and "value/suppressed_pos" not in out
    assert out["value/boosted_neg"] == -0.5 and "value/se_boosted_neg" not in out


# ---------------------------------------------------------------------------------------
# 4. Coupling
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [False, True])
def test_coupling_closed_form_equals_autograd_on_a_softmax_layer(bias):
    g = torch.Generator().manual_seed(0)
    V, d, T, M = 7, 5, 0.7, 12
    W = torch.randn(V, d, generator=g, dtype=torch.float64)
    c = torch.randn(V, generator=g, dtype=torch.float64) if bias else torch.zeros(V, dtype=torch.float64)
    h1, h2 = torch.randn(M, d, generator=g, dtype=torch.float64), torch.randn(M, d, generator=g, dtype=torch.float64)
    a, b = torch.randint(V, (M,), generator=g), torch.randint(V, (M,), generator=g)
    a[:4] = b[:4]                                                  # some identical-token pairs

    def grad(h, tokid):
        Wg, cg = W.clone().requires_grad_(True), c.clone().requires_grad_(True)
        lp = torch.log_softmax((Wg @ h + cg) / T, dim=-1)[tokid]
        gw, gc = torch.autograd.grad(lp, (Wg, cg))
        return torch.cat([gw.flatten(), gc.flatten()]) if bias else gw.flatten()

    auto = torch.stack([grad(h1[m], a[m]) @ grad(h2[m], b[m]) for m in range(M)])
    p1 = torch.softmax((h1 @ W.T + c) / T, dim=-1)
    p2 = torch.softmax((h2 @ W.T + c) / T, dim=-1)
    closed = D.output_layer_coupling(p1, p2, a, b, h1, h2, T, bias=bias)
    assert (closed - auto).abs().max() < 1e-10
    assert auto.abs().max() > 0.1                                   # not a vacuous comparison


def test_coupling_identical_low_beats_identical_high_beats_different():
    V, h = 10, torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    uniform = torch.full((1, V), 0.1, dtype=torch.float64)
    confident = torch.full((1, V), 0.1 / 9, dtype=torch.float64)
    confident[0, 0] = 0.9
    a0, a1 = torch.tensor([0]), torch.tensor([1])
    same_low = D.output_layer_coupling(uniform, uniform, a0, a0, h, h)
    same_high = D.output_layer_coupling(confident, confident, a0, a0, h, h)
    different = D.output_layer_coupling(uniform, uniform, a0, a1, h, h)
    assert float(same_low) == pytest.approx(1 - 0.2 + 0.1)                       # 0.9
    assert float(same_high) == pytest.approx(1 - 1.8 + 0.81 + 9 * (0.1 / 9) ** 2)  # 0.0111
    assert float(different) == pytest.approx(-0.1 - 0.1 + 0.1)                  # -0.1
    assert same_low > same_high > different
    # the feature factor scales it; orthogonal contexts do not couple at all
    assert float(D.output_layer_coupling(uniform, uniform, a0, a0, h, torch.tensor([[0.0, 3.0]],
                                                                                     dtype=torch.float64))) == 0.0


def test_coupling_pairs_follow_their_class_and_are_uniform():
    # token 5 twice with low confidence, token 6 three times with low confidence, token 7 high twice
    ids = torch.tensor([[5, 6, 7, 5], [6, 6, 7, 9]])
    conf = torch.tensor([[0.1, 0.2, 0.9, 0.3], [0.4, 0.2, 0.8, 0.5]])   # the lone 9 is high, alone
    mask = torch.ones(2, 4)
    n = 8000
    pairs = D.sample_coupling_pairs(ids, mask, conf.log(), n, torch.Generator().manual_seed(0))
    flat_ids, flat_conf = ids.flatten(), conf.flatten()
    for cls, (i, j) in pairs.items():
        assert len(i) == n and (i != j).all()
        if cls == "different":
            assert (flat_ids[i] != flat_ids[j]).all()
        else:
            assert (flat_ids[i] == flat_ids[j]).all()
            low = flat_conf[i] < 0.5
            assert (low == (flat_conf[j] < 0.5)).all() and bool(low.all()) == (cls == "same_low")
    # same_low has 2*1 + 3*2 = 8 ordered pairs: each should get n/8 = 1000 (binomial sd ~31)
    i, j = pairs["same_low"]
    counts = torch.bincount(i * 8 + j, minlength=64)
    assert (counts > 0).sum() == 8 and (counts[counts > 0] - 1000).abs().max() < 5 * 31
    # a class with no pair is empty, not an error
    none = D.sample_coupling_pairs(ids, mask, torch.zeros(2, 4), 5, torch.Generator().manual_seed(0))
    assert len(none["same_low"][0]) == 0 and len(none["same_high"][0]) == 5


def test_output_layer_features_read_the_real_models_head(tok):
    model = tinymodel.build_tiny_model(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    rollouts = rollout.generate_rollouts(model, tok, ["3+4\n", "12+77\n"], G=3, max_new_tokens=10, temperature=1.3)
    rows, cols = rollouts.response_mask.nonzero().unbind(1)
    h, logp_all = TD.output_layer_features(model, rollouts, rows, cols, temperature=1.3, chunk=4)
    tokens = rollouts.response_ids[rows, cols]
    # the captured distribution is the one token_logprobs scores (float64 against float32
    # log_softmax of the same logits: measured 4.8e-7, AVX-512 and AVX2); the control, each
    # token read at the next position's distribution, is 0.70 off ...
    with torch.no_grad():
        scored, _ = logprobs.token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask,
                                            temperature=1.3)
    captured = logp_all.gather(1, tokens.unsqueeze(1)).squeeze(1).float()
    assert torch.allclose(captured, scored[rows, cols], atol=1e-5, rtol=0)
    same_row = rows[1:] == rows[:-1]
    next_position = logp_all[1:].gather(1, tokens[:-1].unsqueeze(1)).squeeze(1).float()
    assert (next_position - scored[rows[:-1], cols[:-1]])[same_row].abs().max() > 1e-4
    # ... and the captured h is the head's input: log_softmax(W h / T) reproduces it (W h
    # in float64 here, float32 in the model: measured 8.5e-8, AVX-512 and AVX2); the
    # control, the temperature left out, is 0.18 off
    W = model.get_output_embeddings().weight.double()
    assert torch.allclose(torch.log_softmax(h @ W.T / 1.3, dim=-1), logp_all, atol=2e-6, rtol=0)
    assert (torch.log_softmax(h @ W.T, dim=-1) - logp_all).abs().max() > 2e-5


def test_output_layer_features_come_back_where_the_features_are(tok, default_device):
    # h and logp_all are filled from the hooked activations moved to the CPU; they must be
    # made there too, not on torch's default device. Inputs (model, rollouts) on the CPU,
    # "meta" as the default device (conftest): a bare torch.zeros would come back on "meta".
    model = tinymodel.build_tiny_model(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    rollouts = rollout.generate_rollouts(model, tok, ["3+4\n", "12+77\n"], G=2, max_new_tokens=6, temperature=1.3)
    rows, cols = rollouts.response_mask.nonzero().unbind(1)
    expected = TD.output_layer_features(model, rollouts, rows, cols, temperature=1.3, chunk=2)
    with default_device("meta"):
        got = TD.output_layer_features(model, rollouts, rows, cols, temperature=1.3, chunk=2)
    for x, ref in zip(got, expected):
        assert x.device.type == "cpu" and torch.equal(x, ref)


# ---------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------

def test_after_update_keys_determinism_and_untouched_rng(chain_model, tok):
    torch.manual_seed(3)
    rollouts = rollout.generate_rollouts(chain_model, tok, ["Z", "Z"], G=4, max_new_tokens=8)
    adv = torch.tensor([1.0, -1.0] * 4)
    delta = torch.randn(rollouts.response_ids.shape, generator=torch.Generator().manual_seed(0)) * 0.01
    new_logp = rollouts.engine_logp + delta * rollouts.response_mask
    kwargs = dict(value_samples=8, value_k=16, coupling_pairs=20, seed=5, step=40)
    state = torch.get_rng_state()
    out = TD.after_update(sampler(chain_model, tok, 8), rollouts, rollouts.engine_logp, new_logp, adv, addition.TASK,
                          ["1", "1"], **kwargs)
    assert torch.equal(state, torch.get_rng_state())                 # the training stream did not move
    again = TD.after_update(sampler(chain_model, tok, 8), rollouts, rollouts.engine_logp, new_logp, adv, addition.TASK,
                            ["1", "1"], **kwargs)
    strip = lambda d: {k: v for k, v in d.items() if not k.startswith("time/")}
    assert strip(out) == strip(again)                                   # reproducible from (seed, step)
    assert {k: v for k, v in out.items() if k.startswith("flip/")} == D.token_flips(
        new_logp, rollouts.engine_logp, rollouts.response_mask, adv)
    assert out["where/template_share"] + out["where/reasoning_share"] == pytest.approx(1.0)
    assert 0 < sum(out[f"value/n_{c}"] for c in D.VALUE_CELLS) <= 8
    # pi_old < 0.5 only for "1" (0.3): same_low exists iff "1" was drawn twice or more
    n_ones = int((rollouts.response_ids == tok.convert_tokens_to_ids("1")).sum())
    assert out["coupling/n_same_low"] == (20 if n_ones >= 2 else 0)
    assert out["coupling/n_same_high"] == out["coupling/n_different"] == 20
    # the cheap part alone; math has no template classes: the split is skipped, not guessed
    cheap = TD.after_update(sampler(chain_model, tok, 8), rollouts, rollouts.engine_logp, new_logp, adv,
                            tasks.get("math"), ["1", "1"])
    assert not any(k.startswith(("where/", "value/", "coupling/")) for k in cheap) and "flip/boost_pos" in cheap


@pytest.mark.parametrize("change, match", [
    ({"answers": ["1", "1"]}, "2 answers x G=4"),
    ({"value_k": 0}, "value_k must be >= 1"),
    ({"max_new_tokens": 2}, "max_new_tokens must be >= 6"),
    ({"adv_flat": torch.zeros(3)}, "adv_flat has shape"),
])
def test_after_update_bad_arguments_raise(chain_model, tok, change, match):
    rollouts = rollouts_by_hand(tok, "Z", ["xA:1\n", "yA:2\n", "xA:2\n", "yA:1\n"])
    args = {"adv_flat": torch.tensor([1.0, -1.0, -1.0, 1.0]), "answers": ["1"], "value_samples": 4, "value_k": 4,
            "max_new_tokens": 8, **change}
    z = torch.zeros(rollouts.response_ids.shape)
    with pytest.raises(ValueError, match=match):
        TD.after_update(sampler(chain_model, tok, args.pop("max_new_tokens")), rollouts, z, z, args.pop("adv_flat"),
                        addition.TASK, args.pop("answers"), **args)
