"""Tests of rollout.py: shapes and masks, exact agreement of the sampler and the scorer,
left-padding invariance, entropy in closed form, determinism by seed.

The model is the embedded tiny Llama, shrunk and trained for a few dozen steps on
1-digit addition so that it emits EOS at varied positions (a random model almost never
stops, which would leave the mask logic untested).
"""

import math
import types

import pytest
import torch

import data
import rollout
import tinymodel
from rollout import cut_at_eos, generate_rollouts, left_pad, sample, sample_eval, special_ids, token_logprobs

PROMPTS = ["3+4\n", "12+7\n", "5+55\n"]          # three lengths: left padding is exercised


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A d=32, 2-layer model after 30 supervised steps on 1-digit problems (~1 s)."""
    m = tinymodel.build_tiny_model(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    rows = data.make_addition_rows(256, digits=1, seed=0)
    inputs, labels = tinymodel._encode_rows(tok, rows)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-2)
    gen = torch.Generator().manual_seed(0)
    m.train()
    for _ in range(30):
        idx = torch.randint(len(rows), (32,), generator=gen)
        loss = tinymodel._response_loss(m, inputs[idx], labels[idx], tok.pad_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


@pytest.fixture(scope="module")
def ro(model, tok):
    torch.manual_seed(0)
    return generate_rollouts(model, tok, PROMPTS * 4, G=4, max_new_tokens=14)


# ---------------------------------------------------------------------------------------
# Shapes, masks, texts
# ---------------------------------------------------------------------------------------

def test_shapes_prompt_major_and_left_padding(ro, tok):
    N, G = 12, 4
    B = N * G
    P = max(len(p) for p in PROMPTS)
    assert ro.G == G and ro.prompts == PROMPTS * 4
    assert ro.prompt_ids.shape == ro.prompt_mask.shape == (B, P)
    T = ro.response_ids.shape[1]
    assert 1 <= T <= 14
    for t in (ro.response_mask, ro.old_logp, ro.entropy):
        assert t.shape == (B, T)
    assert ro.truncated.shape == (B,) and ro.truncated.dtype == torch.bool
    assert len(ro.texts) == B
    for b in range(B):
        prompt = ro.prompts[b // G]                      # prompt-major
        ids = tok(prompt)["input_ids"]
        pad = P - len(ids)
        assert ro.prompt_ids[b, pad:].tolist() == ids
        assert ro.prompt_ids[b, :pad].tolist() == [tok.pad_token_id] * pad
        assert ro.prompt_mask[b].tolist() == [0] * pad + [1] * len(ids)


def test_response_mask_cuts_after_first_eos(ro, tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    n_stopped = 0
    for b in range(ro.response_ids.shape[0]):
        ids, m = ro.response_ids[b].tolist(), ro.response_mask[b].tolist()
        L = int(sum(m))
        assert m == [1.0] * L + [0.0] * (len(m) - L)      # a prefix of ones
        assert ids[L:] == [pad] * (len(ids) - L)
        if eos in ids[:L]:
            assert ids.index(eos) == L - 1                 # the EOS is the last real token
            assert not ro.truncated[b]
            n_stopped += 1
        else:
            assert ro.truncated[b] and L == 14             # ran out of budget
        # texts: the real tokens decoded, EOS dropped
        assert ro.texts[b] == tok.decode([i for i in ids[:L] if i != eos])
        assert "<eos>" not in ro.texts[b] and "<pad>" not in ro.texts[b]
    # the fixture must exercise both cases, or the loop above proves little
    assert 0 < n_stopped < len(ro.texts)
    assert (ro.response_mask == 0).any()


def test_logp_and_entropy_zero_on_padding_and_valid_elsewhere(ro):
    m = ro.response_mask.bool()
    assert (ro.old_logp[~m] == 0).all() and (ro.entropy[~m] == 0).all()
    assert (ro.old_logp[m] <= 0).all() and (ro.old_logp[m] > -30).all()
    assert (ro.entropy[m] >= 0).all() and (ro.entropy[m] <= math.log(99) + 1e-5).all()


# ---------------------------------------------------------------------------------------
# Sampler and scorer agree
# ---------------------------------------------------------------------------------------

def test_old_logp_equals_token_logprobs_recomputed(ro, model):
    assert (ro.prompt_mask == 0).any() and (ro.response_mask == 0).any()   # padding on both sides
    logp, ent = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask,
                               temperature=1.0, with_entropy=True)
    torch.testing.assert_close(logp, ro.old_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ro.entropy, atol=1e-6, rtol=0)
    # negative control: another temperature scores a different distribution
    other, _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask,
                              temperature=0.7)
    assert (other - ro.old_logp).abs().max() > 1e-2


def test_logp_matches_generate_scores_at_temperature_07(model, tok):
    """generate's processed scores are exactly logits / T (no other processor), and their
    log-softmax at the sampled tokens is old_logp. The model's generation_config is
    polluted with hub-style sampling defaults, which must NOT leak into sampling."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(top_k=3, repetition_penalty=1.5, min_p=0.2,
                                               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    try:
        pad, eos = special_ids(model, tok)
        ids, mask = left_pad([tok(p)["input_ids"] for p in PROMPTS], pad)
        torch.manual_seed(3)
        out = sample(model, ids, mask, 4, 14, 0.7, 1.0, pad, eos, output_scores=True, output_logits=True,
                     return_dict_in_generate=True)
        torch.manual_seed(3)
        ro = generate_rollouts(model, tok, PROMPTS, 4, 14, temperature=0.7)
    finally:
        model.generation_config = saved
    P, T = ids.shape[1], ro.response_ids.shape[1]
    m = ro.response_mask
    assert torch.equal(out.sequences[:, :P], ids.repeat_interleave(4, dim=0))   # prompt-major copies
    # same draws: output_scores does not change what is sampled
    assert torch.equal(out.sequences[:, P:P + T].masked_fill(m == 0, pad), ro.response_ids)
    scores = torch.stack(out.scores, 1)[:, :T]                      # [B, T, V], processed
    raw = torch.stack(out.logits, 1)[:, :T]                         # [B, T, V], raw
    torch.testing.assert_close(scores, raw / 0.7)                  # temperature only: no top_k, penalty, min_p
    gathered = scores.log_softmax(-1).gather(-1, ro.response_ids.unsqueeze(-1)).squeeze(-1) * m
    torch.testing.assert_close(gathered, ro.old_logp, atol=2e-5, rtol=0)
    # negative control: the untempered distribution is a different one
    untempered = raw.log_softmax(-1).gather(-1, ro.response_ids.unsqueeze(-1)).squeeze(-1) * m
    assert (untempered - ro.old_logp).abs().max() > 1e-2


def test_left_padding_invariance(model, tok):
    """A prompt's log-probs do not depend on the longer prompts it is batched with."""
    short, long_ = tok("3+4\n")["input_ids"], tok("123+456\n")["input_ids"]
    resp = tok("4+3+0=07\nA:7\n")["input_ids"] + [tok.eos_token_id]
    r_ids = torch.tensor([resp, resp])
    r_mask = torch.ones_like(r_ids, dtype=torch.float)
    ids, mask = left_pad([short, long_], tok.pad_token_id)
    assert mask[0].sum() < mask.shape[1]                         # row 0 really is padded
    batched, _ = token_logprobs(model, ids, mask, r_ids, r_mask)
    alone, _ = token_logprobs(model, torch.tensor([short]), torch.ones(1, len(short), dtype=torch.long),
                              r_ids[:1], r_mask[:1])
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=0)
    # negative control: without the padding mask the pads are attended to, and it shows.
    # (Naive positions 0..L-1 would NOT be a negative control: rotary embeddings depend
    # only on position differences, so a constant shift changes nothing but rounding.)
    unmasked, _ = token_logprobs(model, ids, torch.ones_like(mask), r_ids, r_mask)
    assert (unmasked[0] - alone[0]).abs().max() > 1e-3


def test_token_logprobs_is_differentiable(model, ro):
    logp, _ = token_logprobs(model, ro.prompt_ids[:4], ro.prompt_mask[:4], ro.response_ids[:4],
                             ro.response_mask[:4])
    logp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------
# Entropy and alignment in closed form, with a stub model of known logits
# ---------------------------------------------------------------------------------------

class StubLM(torch.nn.Module):
    """Logits at position j are table[j % len(table)] (V = 4), whatever the tokens."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float)
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=0):
        B, L = input_ids.shape
        logits = self.table[torch.arange(L) % len(self.table)].expand(B, L, -1) + self.w
        return types.SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_entropy_and_logp_closed_form():
    NEG = -1e4                                           # exp(NEG) is exactly 0 in float32
    table = [[0.0, 0.0, 0.0, 0.0],                       # uniform over 4: H = ln 4
             [math.log(3.0), 0.0, NEG, NEG]]             # p = (3/4, 1/4, 0, 0)
    stub = StubLM(table)
    prompt = torch.tensor([[7, 7, 7]])                   # positions 0, 1, 2
    mask_p = torch.ones_like(prompt)
    resp = torch.tensor([[1, 0, 2]])                     # predicted at positions 2, 3, 4
    mask_r = torch.tensor([[1.0, 1.0, 0.0]])
    logp, ent = token_logprobs(stub, prompt, mask_p, resp, mask_r, with_entropy=True)
    # position 2 -> table[0] (uniform), position 3 -> table[1]; the third token is padding
    h2 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    torch.testing.assert_close(ent, torch.tensor([[math.log(4.0), h2, 0.0]]))
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.25), math.log(0.75), 0.0]]))
    # temperature 2 on table[1]: p proportional to (sqrt 3, 1)
    logp_t, ent_t = token_logprobs(stub, prompt, mask_p, resp, mask_r, temperature=2.0, with_entropy=True)
    q = math.sqrt(3) / (math.sqrt(3) + 1)
    assert ent_t[0, 1].item() == pytest.approx(-(q * math.log(q) + (1 - q) * math.log(1 - q)), abs=1e-6)
    assert logp_t[0, 1].item() == pytest.approx(math.log(q), abs=1e-6)
    # entropy is the full distribution's, not the sampled token's surprisal
    assert ent[0, 1].item() != pytest.approx(-logp[0, 1].item(), abs=1e-3)


def test_entropy_matches_hand_sum_on_the_real_model(model, ro):
    b = int(ro.response_mask.sum(1).argmax())
    ids = torch.cat([ro.prompt_ids[b:b + 1], ro.response_ids[b:b + 1]], 1)
    attn = torch.cat([ro.prompt_mask[b:b + 1], ro.response_mask[b:b + 1].long()], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[0].double()
    P = ro.prompt_ids.shape[1]
    for t in range(int(ro.response_mask[b].sum())):
        p = torch.softmax(logits[P - 1 + t], -1).tolist()
        h = -sum(x * math.log(x) for x in p if x > 0)
        assert ro.entropy[b, t].item() == pytest.approx(h, abs=1e-5)


# ---------------------------------------------------------------------------------------
# Determinism, helpers, errors
# ---------------------------------------------------------------------------------------

def test_determinism_by_seed(model, tok):
    def run(seed):
        torch.manual_seed(seed)
        return generate_rollouts(model, tok, PROMPTS, 4, 14)
    a, b, c = run(11), run(11), run(12)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert torch.equal(a.old_logp, b.old_logp)
    assert not torch.equal(a.response_ids, c.response_ids)     # negative control


def test_train_mode_is_restored(model, tok):
    model.train()
    generate_rollouts(model, tok, PROMPTS[:1], 2, 4)
    assert model.training
    model.eval()
    generate_rollouts(model, tok, PROMPTS[:1], 2, 4)
    assert not model.training


def test_cut_at_eos_including_pad_equal_to_eos():
    EOS = 1
    resp = torch.tensor([[5, 6, 1, 1, 1],      # generate pads with EOS when pad == eos
                         [5, 1, 7, 1, 8],      # only the FIRST EOS counts
                         [5, 6, 7, 8, 9]])     # no EOS: truncated
    ids, mask, trunc = cut_at_eos(resp, [EOS], pad_id=1)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert ids.tolist() == [[5, 6, 1, 1, 1], [5, 1, 1, 1, 1], [5, 6, 7, 8, 9]]
    assert trunc.tolist() == [False, False, True]
    # several EOS ids (chat models): whichever comes first
    ids, mask, trunc = cut_at_eos(torch.tensor([[5, 9, 6, 1]]), [1, 9], pad_id=0)
    assert mask.tolist() == [[1, 1, 0, 0]] and ids.tolist() == [[5, 9, 0, 0]] and not trunc[0]


def test_special_ids_fallbacks(model, tok):
    assert special_ids(model, tok) == (0, [1])
    no_pad = types.SimpleNamespace(eos_token_id=1, pad_token_id=None)
    chat = types.SimpleNamespace(generation_config=types.SimpleNamespace(eos_token_id=[1, 5]))
    assert special_ids(chat, no_pad) == (1, [1, 5])        # pad falls back to the first EOS
    with pytest.raises(ValueError, match="EOS"):
        special_ids(types.SimpleNamespace(generation_config=types.SimpleNamespace(eos_token_id=None)),
                    types.SimpleNamespace(eos_token_id=None, pad_token_id=0))


def test_sample_eval_counts(model, tok):
    rows = [{"prompt": p, "answer": "x"} for p in PROMPTS]
    assert sample_eval(model, tok, rows, 3, 6, check=lambda t, r: True) == [3, 3, 3]
    assert sample_eval(model, tok, rows, 3, 6, check=lambda t, r: False) == [0, 0, 0]
    # the checker sees each row's own texts: count samples whose text contains "+"
    torch.manual_seed(0)
    counts = sample_eval(model, tok, rows, 4, 14, check=lambda t, r: "+" in t, prompts_per_batch=2)
    torch.manual_seed(0)
    ro = generate_rollouts(model, tok, PROMPTS[:2], 4, 14)
    assert counts[:2] == [sum("+" in t for t in ro.texts[j * 4:(j + 1) * 4]) for j in range(2)]
    with pytest.raises(ValueError, match="n >= 1"):
        sample_eval(model, tok, rows, 0, 6, check=lambda t, r: True)


@pytest.mark.parametrize("kwargs, match", [
    ({"G": 0}, "G"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": 0.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"prompts": []}, "prompts"),
])
def test_bad_arguments_raise(model, tok, kwargs, match):
    args = {"prompts": PROMPTS, "G": 2, "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        generate_rollouts(model, tok, **args)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long),
                       torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), temperature=-1.0)
