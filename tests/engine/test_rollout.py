"""Tests of rollout.py and logprobs.py: shapes and masks, agreement of the sampler and the scorer, the
sampler's token distribution (chi-square against softmax(z / T), top_p), padding columns
trimmed without changing results, left-padding invariance, entropy in closed form,
determinism by seed.

The model is the embedded tiny Llama, shrunk and trained for a few dozen steps on
1-digit addition so that it emits EOS at varied positions (a random model almost never
stops, which would leave the mask logic untested).
"""

import math
import types

import pytest
import torch

from machinery import decoding
from machinery import logprobs
from machinery import rollout
from machinery import tinymodel
from machinery.logprobs import token_logprobs
from machinery.rollout import cut_at_eos, generate_rollouts, pad_rows, sample, sample_eval, special_ids, top_p_filter
from machinery.sampler import SamplingConfig, truncate

PROMPTS = ["3+4\n", "12+7\n", "5+55\n"]          # three lengths: left padding is exercised


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_char_tokenizer()


@pytest.fixture(scope="module")
def model(addition_tiny_model):
    """A d=32, 2-layer model after 30 supervised steps on 1-digit problems (conftest)."""
    return addition_tiny_model[0]


@pytest.fixture(scope="module")
def rollouts(model, tok):
    torch.manual_seed(0)
    return generate_rollouts(model, tok, PROMPTS * 4, G=4, max_new_tokens=14)


# ---------------------------------------------------------------------------------------
# Shapes, masks, texts
# ---------------------------------------------------------------------------------------

def test_shapes_prompt_major_and_left_padding(rollouts, tok):
    N, G = 12, 4
    B = N * G
    P = max(len(p) for p in PROMPTS)
    assert rollouts.G == G and rollouts.prompts == PROMPTS * 4
    assert rollouts.prompt_ids.shape == rollouts.prompt_mask.shape == (B, P)
    T = rollouts.response_ids.shape[1]
    assert 1 <= T <= 14
    for t in (rollouts.response_mask, rollouts.engine_logp, rollouts.engine_entropy):
        assert t.shape == (B, T)
    assert rollouts.truncated.shape == (B,) and rollouts.truncated.dtype == torch.bool
    assert len(rollouts.texts) == B
    for b in range(B):
        prompt = rollouts.prompts[b // G]                      # prompt-major
        ids = tok(prompt)["input_ids"]
        pad = P - len(ids)
        assert rollouts.prompt_ids[b, pad:].tolist() == ids
        assert rollouts.prompt_ids[b, :pad].tolist() == [tok.pad_token_id] * pad
        assert rollouts.prompt_mask[b].tolist() == [0] * pad + [1] * len(ids)


def test_response_mask_cuts_after_first_eos(rollouts, tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    n_stopped = 0
    for b in range(rollouts.response_ids.shape[0]):
        ids, m = rollouts.response_ids[b].tolist(), rollouts.response_mask[b].tolist()
        L = int(sum(m))
        assert m == [1.0] * L + [0.0] * (len(m) - L)      # a prefix of ones
        assert ids[L:] == [pad] * (len(ids) - L)
        if eos in ids[:L]:
            assert ids.index(eos) == L - 1                 # the EOS is the last real token
            assert not rollouts.truncated[b]
            n_stopped += 1
        else:
            assert rollouts.truncated[b] and L == 14             # ran out of budget
        # texts: the real tokens decoded, EOS dropped
        assert rollouts.texts[b] == tok.decode([i for i in ids[:L] if i != eos])
        assert "<eos>" not in rollouts.texts[b] and "<pad>" not in rollouts.texts[b]
    # the fixture must exercise both cases, or the loop above proves little
    assert 0 < n_stopped < len(rollouts.texts)
    assert (rollouts.response_mask == 0).any()


def test_logp_and_entropy_zero_on_padding_and_valid_elsewhere(rollouts):
    m = rollouts.response_mask.bool()
    assert (rollouts.engine_logp[~m] == 0).all() and (rollouts.engine_entropy[~m] == 0).all()
    assert (rollouts.engine_logp[m] <= 0).all() and (rollouts.engine_logp[m] > -30).all()
    assert (rollouts.engine_entropy[m] >= 0).all() and (rollouts.engine_entropy[m] <= math.log(99) + 1e-5).all()


# ---------------------------------------------------------------------------------------
# Sampler and scorer agree
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logp_and_entropy_match_the_teacher_forced_pass(model, tok, temperature):
    """The KV-cached sampler's own log-probs of the tokens it drew (at the sampling
    temperature) and its entropies equal a full teacher-forced pass to float tolerance,
    for every row, including rows that left the batch early (EOS) and left-padded ones."""
    torch.manual_seed(5)
    rollouts = generate_rollouts(model, tok, PROMPTS * 4, 4, 14, temperature=temperature)
    m = rollouts.response_mask
    assert (m == 0).any() and (m.sum(1) < m.shape[1]).any()           # rows stopped at different times
    logp, ent = token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, m,
                               temperature=temperature, with_entropy=True)
    # The same float32 logits computed twice (KV-cached decode steps, one full pass): measured
    # up to 1.3e-6 (AVX-512) and 1.9e-6 (AVX2) nats apart; control below (the same tokens
    # scored at 1.5 T) 1.6-1.9 nats.
    torch.testing.assert_close(rollouts.engine_logp, logp, atol=5e-5, rtol=0)
    torch.testing.assert_close(rollouts.engine_entropy, ent, atol=5e-5, rtol=0)
    assert (rollouts.engine_logp[m == 0] == 0).all() and (rollouts.engine_entropy[m == 0] == 0).all()
    # negative control: the same tokens scored at another temperature
    other, _ = token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, m,
                              temperature=temperature * 1.5)
    assert (other - rollouts.engine_logp).abs().max() > 1e-2


def test_hub_generation_config_does_not_leak_into_sampling(model, tok):
    """A hub checkpoint's sampling defaults (top_k, repetition_penalty, min_p, top_p) in
    generation_config must not change the draws: the loop applies T and top_p only."""
    from transformers import GenerationConfig

    torch.manual_seed(3)
    clean = generate_rollouts(model, tok, PROMPTS, 4, 14, temperature=0.7)
    saved = model.generation_config
    model.generation_config = GenerationConfig(top_k=3, top_p=0.5, repetition_penalty=1.5, min_p=0.2,
                                               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    try:
        torch.manual_seed(3)
        polluted = generate_rollouts(model, tok, PROMPTS, 4, 14, temperature=0.7)
    finally:
        model.generation_config = saved
    assert torch.equal(clean.response_ids, polluted.response_ids)
    # negative control: the seed does decide the draws
    torch.manual_seed(4)
    assert not torch.equal(generate_rollouts(model, tok, PROMPTS, 4, 14, temperature=0.7).response_ids,
                           clean.response_ids)


def test_left_padding_invariance(model, tok):
    """A prompt's log-probs do not depend on the longer prompts it is batched with."""
    short, long_ = tok("3+4\n")["input_ids"], tok("123+456\n")["input_ids"]
    resp = tok("4+3+0=07\nA:7\n")["input_ids"] + [tok.eos_token_id]
    r_ids = torch.tensor([resp, resp])
    r_mask = torch.ones_like(r_ids, dtype=torch.float)
    ids, mask = pad_rows([short, long_], tok.pad_token_id, left=True)
    assert mask[0].sum() < mask.shape[1]                         # row 0 really is padded
    batched, _ = token_logprobs(model, ids, mask, r_ids, r_mask)
    alone, _ = token_logprobs(model, torch.tensor([short]), torch.ones(1, len(short), dtype=torch.long),
                              r_ids[:1], r_mask[:1])
    # measured 0 (AVX-512 and AVX2: the masked pads get attention weight exactly 0); the
    # control below (pads attended) moves a log-prob by 3.6 nats
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=0)
    # negative control: without the padding mask the pads are attended to, and it shows.
    # (Naive positions 0..L-1 would NOT be a negative control: rotary embeddings depend
    # only on position differences, so a constant shift changes nothing but rounding.)
    unmasked, _ = token_logprobs(model, ids, torch.ones_like(mask), r_ids, r_mask)
    assert (unmasked[0] - alone[0]).abs().max() > 1e-3


def test_token_logprobs_is_differentiable(model, rollouts):
    logp, _ = token_logprobs(model, rollouts.prompt_ids[:4], rollouts.prompt_mask[:4], rollouts.response_ids[:4],
                             rollouts.response_mask[:4])
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


def test_entropy_matches_hand_sum_on_the_real_model(model, rollouts):
    b = int(rollouts.response_mask.sum(1).argmax())
    ids = torch.cat([rollouts.prompt_ids[b:b + 1], rollouts.response_ids[b:b + 1]], 1)
    attn = torch.cat([rollouts.prompt_mask[b:b + 1], rollouts.response_mask[b:b + 1].long()], 1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[0].double()
    P = rollouts.prompt_ids.shape[1]
    # The sampler's float32 entropy against a float64 sum: measured up to 3.4e-7 (AVX-512)
    # and 4.1e-7 (AVX2) nats apart; the control below (each entropy against the next
    # position's sum, an off-by-one) is off by 0.53 nats.
    hand = []
    for t in range(int(rollouts.response_mask[b].sum())):
        p = torch.softmax(logits[P - 1 + t], -1).tolist()
        hand.append(-sum(x * math.log(x) for x in p if x > 0))
        assert rollouts.engine_entropy[b, t].item() == pytest.approx(hand[t], abs=1e-5)
    assert max(abs(rollouts.engine_entropy[b, t].item() - hand[t + 1]) for t in range(len(hand) - 1)) > 1e-3


# ---------------------------------------------------------------------------------------
# The sampler's distribution: chi-square against softmax(z / T), stub models
# ---------------------------------------------------------------------------------------

def chi_square(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of counts [V] against probabilities p [V], cells with an
    expected count < 5 pooled into one. Returns (statistic, degrees of freedom)."""
    n = float(counts.sum())
    expected = p.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] < 5:                       # too little mass to pool: fold it into the largest cell
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
        obs[exp.argmax()] += counts[~big].double().sum()
        exp[exp.argmax()] += expected[~big].sum()
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def chi_square_bound(df: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of chi-square(df) (Wilson-Hilferty: z = 3.719 is the normal
    1e-4 quantile). A correct sampler exceeds it with probability 1e-4; the seeds are fixed."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def test_sampler_token_distribution_is_softmax_z_over_T(model, tok):
    """20000 rollouts of one prompt: the first token's counts fit softmax(z / T) of a
    teacher-forced forward, and so do the second token's among rows whose first token
    was "+" (a KV-cache decode step, after the rows that drew EOS left the batch).
    Negative controls: the same counts against T * 0.8 and T * 1.25 fail the bound."""
    T, n = 0.8, 20000
    ids = tok("3+4\n")["input_ids"]
    torch.manual_seed(0)
    with torch.no_grad():
        tokens, _, _ = sample(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), n, 2, T, None,
                              tok.pad_token_id, [tok.eos_token_id])
        z1 = model(input_ids=torch.tensor([ids])).logits[0, -1]
        plus = tok("+")["input_ids"][0]
        z2 = model(input_ids=torch.tensor([ids + [plus]])).logits[0, -1]
    V = z1.shape[0]
    assert (tokens[:, 0] == tok.eos_token_id).any()                   # some rows did leave the batch
    first = torch.bincount(tokens[:, 0], minlength=V)
    stat, df = chi_square(first, torch.softmax(z1 / T, -1))
    assert df >= 8 and stat < chi_square_bound(df)
    for wrong in (T * 0.8, T * 1.25):
        bad, bad_df = chi_square(first, torch.softmax(z1 / wrong, -1))
        assert bad > chi_square_bound(bad_df)
    rows = tokens[:, 0] == plus
    assert rows.sum() > 2000
    second = torch.bincount(tokens[rows, 1], minlength=V)
    stat, df = chi_square(second, torch.softmax(z2 / T, -1))
    assert df >= 5 and stat < chi_square_bound(df)
    bad, bad_df = chi_square(second, torch.softmax(z1 / T, -1))        # the wrong context
    assert bad > chi_square_bound(bad_df)


class PositionStub(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the position of the token
    they are computed at: table[position % len(table)], V = len(table[0]). With it the
    log-prob of every sampled token is known in closed form, given its position."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float)
        self.config = tinymodel.tiny_config(self.table.shape[1], hidden_size=8, num_layers=1, num_heads=2,
                                            intermediate_size=8)
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                logits_to_keep=0):
        logits = self.table[position_ids % len(self.table)] + self.w
        return types.SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_sampler_positions_rows_and_early_exit_with_a_stub():
    """Left-padded prompts of different lengths, rows stopping at different steps: every
    token's sampler log-prob is log softmax(table[(L_b - 1 + t) % K] / T)[token], where
    L_b is row b's real prompt length, so positions continue each row's own count and
    results land in the right rows after finished rows leave the batch."""
    NEG = -1e4
    PAD, EOS = 0, 1
    table = [[NEG, 0.0, 0.5, 1.0, 0.0],        # EOS possible
             [NEG, NEG, 0.0, 2.0, 1.0],         # no EOS at these positions
             [NEG, 1.0, 0.0, 0.0, 0.5]]
    stub, T = PositionStub(table), 1.3
    prompts = [[2, 3], [4, 2, 3, 4], [3]]
    ids, mask = pad_rows(prompts, PAD, left=True)
    torch.manual_seed(0)
    tokens, logp, ent = sample(stub, ids, mask, 5, 12, T, None, PAD, [EOS])
    B, Tw = tokens.shape
    resp, rmask, trunc = cut_at_eos(tokens, [EOS], PAD)
    lengths = rmask.sum(1)
    assert B == 15 and Tw == int(lengths.max())                        # width = the longest response
    assert lengths.min() < lengths.max() and (~trunc).any()
    logp_table = torch.log_softmax(torch.tensor(table) / T, -1)
    ent_table = -(logp_table.exp() * logp_table).sum(-1)
    # The sampler and logp_table take the same float32 log_softmax of the same table row:
    # measured 0 (AVX-512 and AVX2). A token scored at another position's row would be off
    # by >= 0.056 nats (the closest pair of rows, token 4 in rows 1 and 2).
    for b in range(B):
        L = len(prompts[b // 5])
        for t in range(int(lengths[b])):
            row = (L - 1 + t) % len(table)
            assert logp[b, t].item() == pytest.approx(logp_table[row, tokens[b, t]].item(), abs=1e-6)
            assert ent[b, t].item() == pytest.approx(ent_table[row].item(), abs=1e-6)
        assert (tokens[b, int(lengths[b]):] == PAD).all() and (logp[b, int(lengths[b]):] == 0).all()
    # all rows stop at once: the loop ends there, not at max_new_tokens
    stop = PositionStub([[NEG, 0.0, NEG, NEG, NEG]])
    tokens, _, _ = sample(stop, ids, mask, 2, 12, 1.0, None, PAD, [EOS])
    assert tokens.tolist() == [[EOS]] * 6


def test_sampler_runs_one_forward_row_per_distinct_prefix():
    """Rows that drew the same tokens so far share a forward: each decode step's batch is
    the number of distinct (prompt, tokens so far) among the rows still live, counted
    here from the returned tokens alone. A certain next token (one logit, the others
    -1e4) keeps all G rows of a prompt in one node for the whole response."""
    NEG = -1e4
    PAD, EOS = 0, 1
    batches = []

    class Spy(PositionStub):
        def forward(self, input_ids, **kwargs):
            batches.append(input_ids.shape[0])
            return super().forward(input_ids, **kwargs)

    def distinct_prefixes(tokens):
        """[3 (the prefill: one row per prompt), then per step t >= 1 the number of distinct
        (prompt, first t tokens) among the rows that have not emitted EOS by then]."""
        resp, rmask, _ = cut_at_eos(tokens, [EOS], PAD)
        counts = [3]
        for t in range(1, tokens.shape[1]):
            live = [b for b in range(18) if rmask[b, :t].sum() == t and resp[b, t - 1] != EOS]
            counts.append(len({(b // 6, tuple(resp[b, :t].tolist())) for b in live}))
        return counts, int(rmask.sum())

    prompts = [[2, 3], [4, 2, 3, 4], [3]]
    ids, mask = pad_rows(prompts, PAD, left=True)
    torch.manual_seed(0)
    tokens, _, _ = sample(Spy([[NEG, 0.2, 0.5, 1.0, 0.0], [NEG, NEG, 0.0, 1.5, 1.0]]), ids, mask, 6, 10, 1.0, None,
                          PAD, [EOS])
    expected, n_tokens = distinct_prefixes(tokens)
    assert batches == expected and max(expected) > 3                   # nodes split ...
    assert sum(expected[1:]) < n_tokens - 18                            # ... and still save forwards
    batches.clear()
    certain = [[NEG, NEG, 0.0, NEG, NEG]] * 3 + [[NEG, 0.0, NEG, NEG, NEG]]   # 2, 2, 2, then EOS, by position
    tokens, _, _ = sample(Spy(certain), ids, mask, 6, 10, 1.0, None, PAD, [EOS])
    assert (tokens == tokens[0::6].repeat_interleave(6, 0)).all()       # G identical responses per prompt
    assert batches == distinct_prefixes(tokens)[0] and max(batches) == 3   # one node per prompt throughout


def test_sampler_refuses_cache_layers_it_cannot_reindex(model, tok, monkeypatch):
    # Cache layers with state beyond keys and values (linear attention, compressed or
    # quantized caches) would be re-indexed wrongly by batch_select_indices: refused. Here
    # the plain layer is struck from the allowed list to see the door close.
    monkeypatch.setattr(decoding, "DynamicLayer", type("NotTheLayer", (), {}))
    with pytest.raises(ValueError, match="DynamicLayer cache layers"):
        generate_rollouts(model, tok, PROMPTS, G=2, max_new_tokens=4)


def test_top_p_truncates_sampling_but_not_the_log_probs():
    """p = (0.5, 0.3, 0.2) over tokens 2, 3, 4 and top_p = 0.7 (the run's setting, as the
    sampler truncates with it): only tokens 2 and 3 are drawn, in proportion 5:3, and the
    returned log-prob is the untruncated log p."""
    NEG = -1e4
    stub = PositionStub([[NEG, NEG, math.log(0.5), math.log(0.3), math.log(0.2)]])
    n = 16000
    torch.manual_seed(0)
    nucleus = lambda probs: truncate(SamplingConfig(top_p=0.7), probs)
    tokens, logp, _ = sample(stub, torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.long), n, 1, 1.0, nucleus, 0, [1])
    counts = torch.bincount(tokens[:, 0], minlength=5)
    assert counts[4] == 0 and counts[:2].sum() == 0
    stat, df = chi_square(counts[2:4], torch.tensor([0.5, 0.3]) / 0.8)
    assert df == 1 and stat < chi_square_bound(df)
    torch.testing.assert_close(logp[tokens[:, 0] == 2, 0], torch.full(((tokens[:, 0] == 2).sum(),), math.log(0.5)))
    # top_p = 1: the third token appears at its own rate
    torch.manual_seed(0)
    tokens, _, _ = sample(stub, torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.long), n, 1, 1.0,
                          lambda probs: truncate(SamplingConfig(), probs), 0, [1])
    stat, df = chi_square(torch.bincount(tokens[:, 0], minlength=5)[2:], torch.tensor([0.5, 0.3, 0.2]))
    assert stat < chi_square_bound(df)


def test_top_p_filter_closed_form():
    p = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.25, 0.25, 0.5]])
    out = top_p_filter(p, 0.7)
    # row 0: 0.5 (0 above), 0.3 (0.5 above) kept; 0.2 has 0.8 above. row 1: 0.9 alone reaches 0.7.
    # row 2: 0.5 kept; the two 0.25s have 0.5 and 0.75 above them: the first (in sort order) is kept.
    assert torch.equal(out[0], p[0] * torch.tensor([0.0, 1.0, 1.0]))
    assert torch.equal(out[1], p[1] * torch.tensor([1.0, 0.0, 0.0]))
    assert out[2, 2] == p[2, 2] and (out[2, :2] > 0).sum() == 1
    assert torch.equal(top_p_filter(p, 1.0), p)


# ---------------------------------------------------------------------------------------
# Padding columns are not computed
# ---------------------------------------------------------------------------------------

def test_token_logprobs_trims_padding_columns_with_identical_results(model, rollouts):
    """Extra all-padding columns (2 on the prompt's left, 5 after the responses) are cut
    before the forward (the spy sees the narrow width) and change nothing: log-probs,
    entropies and gradients equal those of the unpadded batch, the extra columns are 0."""
    short = rollouts.response_mask.sum(1) < rollouts.response_mask.shape[1]
    idx = short.nonzero().squeeze(1)[:8]
    p_ids, p_mask = rollouts.prompt_ids[idx], rollouts.prompt_mask[idx]
    r_ids, r_mask = rollouts.response_ids[idx], rollouts.response_mask[idx]
    widths = []

    def spy(**kwargs):
        widths.append(kwargs["input_ids"].shape[1])
        return model(**kwargs)

    real_p = int(p_mask.sum(1).max())
    real_t = int(r_mask.sum(1).max())
    zeros = torch.zeros(8, 2, dtype=torch.long)
    padded = (torch.cat([zeros, p_ids], 1), torch.cat([zeros, p_mask], 1),
              torch.cat([r_ids, torch.zeros(8, 5, dtype=torch.long)], 1), torch.cat([r_mask, torch.zeros(8, 5)], 1))
    results = []
    for args in ((p_ids, p_mask, r_ids, r_mask), padded):
        model.zero_grad(set_to_none=True)
        logp, ent = token_logprobs(spy, *args, with_entropy=True)
        logp.sum().backward()
        results.append((logp, ent, [p.grad.clone() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    # P columns of prompt (the longest is real everywhere) + the longest response: no more
    assert widths[1] == p_ids.shape[1] + real_t and real_t < r_ids.shape[1] and real_p == p_ids.shape[1]
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    T = r_ids.shape[1]
    assert lp_b.shape == (8, T + 5) and (lp_b[:, T:] == 0).all() and (ent_b[:, T:] == 0).all()
    # measured 0 (bit-identical, AVX-512 and AVX2): the trimmed batch is the unpadded one.
    # Control below: a trim that cut one real column too many moves log-probs by 0.042 nats.
    torch.testing.assert_close(lp_b[:, :T], lp_a, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_b[:, :T], ent_a, atol=1e-6, rtol=0)
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # negative control: the longest prompt's first token cut off, as an off-by-one trim would
    with torch.no_grad():
        cut, _ = token_logprobs(model, p_ids[:, 1:], p_mask[:, 1:], r_ids, r_mask)
    assert (cut - lp_a).abs().max() > 1e-3


def test_token_logprobs_same_rows_give_identical_bits(model, rollouts):
    """The PPO ratio is exactly 1 on-policy only if logp_old (no grad, eval mode) and logp
    (grad, train mode) of the same chunk are bit-identical."""
    idx = torch.arange(0, rollouts.response_ids.shape[0], 3)
    args = (rollouts.prompt_ids[idx], rollouts.prompt_mask[idx], rollouts.response_ids[idx], rollouts.response_mask[idx])
    model.eval()
    with torch.no_grad():
        old, _ = token_logprobs(model, *args, temperature=0.7)
    model.train()
    new, _ = token_logprobs(model, *args, temperature=0.7)
    model.eval()
    assert new.requires_grad and torch.equal(new.detach(), old)


def test_token_logprobs_all_padding_response_is_zero(model):
    logp, ent = token_logprobs(model, torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long),
                               torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4), with_entropy=True)
    assert logp.shape == ent.shape == (1, 4) and (logp == 0).all() and (ent == 0).all()


# ---------------------------------------------------------------------------------------
# Identical rollouts are computed once (merge_duplicates)
# ---------------------------------------------------------------------------------------

def test_distinct_rows_closed_form():
    # rows (a, b, a, a, c): c has a's ids but another response mask, so it is not a copy
    ids = torch.tensor([[5, 6], [5, 7], [5, 6], [5, 6], [5, 6]])
    ones = torch.ones(5, 2, dtype=torch.long)
    r_mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    first, copy_of = logprobs.distinct_rows(ones, ones, ids, r_mask)
    assert sorted(first.tolist()) == [0, 1, 4]
    assert torch.equal(first[copy_of], torch.tensor([0, 1, 0, 0, 4]))       # each row's first occurrence
    for x in (ids, r_mask):
        assert torch.equal(x[first][copy_of], x)                             # x[first][copy_of] == x


def copies_batch(rollouts):
    """Rows of `rollouts` with copies: (0, 1, 0, 2, 1, 0, 3, 0) -> 4 distinct rows of 8, and weights
    that give every copy a different share of a loss (as different advantages would)."""
    assert len({tuple(r) for r in rollouts.response_ids[:4].tolist()}) == 4       # rows 0..3 really differ
    idx = torch.tensor([0, 1, 0, 2, 1, 0, 3, 0])
    args = (rollouts.prompt_ids[idx], rollouts.prompt_mask[idx], rollouts.response_ids[idx], rollouts.response_mask[idx])
    weights = torch.linspace(-1.0, 2.0, len(idx)).unsqueeze(1)
    return args, weights


def logp_and_grads(model, args, weights, forward=None, **kwargs):
    """(logp, entropy, gradients) of sum_b weights_b (logp_b + 0.1 entropy_b); `forward`
    (default: the model) is what token_logprobs calls."""
    model.zero_grad(set_to_none=True)
    logp, ent = token_logprobs(forward or model, *args, with_entropy=True, **kwargs)
    (weights * (logp + 0.1 * ent)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return logp, ent, grads


GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4          # the merged gradient's bound: |a - b| <= atol + rtol |b|


def test_merge_duplicates_runs_each_distinct_row_once_with_the_same_values_and_gradient(model, rollouts):
    """The forward sees only the 4 distinct rows; log-probs, entropies and the gradient of a
    loss that weights every copy differently equal those of computing all 8 rows."""
    args, weights = copies_batch(rollouts)
    rows_seen = []

    def spy(**kwargs):
        rows_seen.append(kwargs["input_ids"].shape[0])
        return model(**kwargs)

    lp_all, ent_all, g_all = logp_and_grads(model, args, weights, spy)
    lp_m, ent_m, g_m = logp_and_grads(model, args, weights, spy, merge_duplicates=True)
    assert rows_seen == [8, 4]
    # Each distinct row's forward, in a 4-row batch or an 8-row one: measured 0 (AVX-512 and
    # AVX2). A copy given another row's values (each row its neighbour's) is off by 4.7 nats.
    torch.testing.assert_close(lp_m, lp_all, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_m, ent_all, atol=1e-6, rtol=0)
    assert (lp_all.roll(1, 0) - lp_all).detach().abs().max() > 1e-3
    # The gradient sums the copies' shares in another order (a 4-row batch, not 8): float32
    # rounding of up to 3.3e-6 at gradients of up to 16 (AVX-512 and AVX2 kernels), 21x
    # inside the bound; the copies' share left out (the test below) moves them by 0.58 max |g|.
    for a, b in zip(g_m, g_all):
        torch.testing.assert_close(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)


def test_dropping_the_copies_instead_of_merging_them_would_be_caught(model, rollouts):
    # Negative control for the test above: a merge that forgot the copies' share of the
    # gradient (only the first occurrence of each row kept) is far outside its tolerance:
    # measured 0.58 max |g|; 1e-2 max |g| is over 10x the bound at the largest gradient.
    args, weights = copies_batch(rollouts)
    _, _, g_all = logp_and_grads(model, args, weights)
    first, _ = logprobs.distinct_rows(*args)
    _, _, g_dropped = logp_and_grads(model, tuple(a[first] for a in args), weights[first])
    gap = max(float((a - b).abs().max()) for a, b in zip(g_dropped, g_all))
    g_max = max(float(g.abs().max()) for g in g_all)
    assert gap > 1e-2 * g_max >= 10 * (GRAD_ATOL + GRAD_RTOL * g_max)


# ---------------------------------------------------------------------------------------
# Determinism, helpers, errors
# ---------------------------------------------------------------------------------------

def test_determinism_by_seed(model, tok):
    def run(seed):
        torch.manual_seed(seed)
        return generate_rollouts(model, tok, PROMPTS, 4, 14)
    a, b, c = run(11), run(11), run(12)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert torch.equal(a.engine_logp, b.engine_logp)
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
    texts = lambda prompts, n: generate_rollouts(model, tok, prompts, n, 6).texts
    assert sample_eval(texts, rows, 3, lambda ts, rs: [True] * len(ts)) == [3, 3, 3]
    assert sample_eval(texts, rows, 3, lambda ts, rs: [False] * len(ts)) == [0, 0, 0]
    # the checker sees each row's own texts, rows repeated n times in the same order
    seen = []
    sample_eval(texts, rows, 2, lambda ts, rs: seen.extend(r["prompt"] for r in rs) or [True] * len(ts),
                prompts_per_batch=2)
    assert seen == [p for p in PROMPTS for _ in range(2)]
    # count samples whose text contains "+", against the same draws made directly
    torch.manual_seed(0)
    counts = sample_eval(lambda ps, n: generate_rollouts(model, tok, ps, n, 14).texts, rows, 4,
                         lambda ts, rs: ["+" in t for t in ts], prompts_per_batch=2)
    torch.manual_seed(0)
    rollouts = generate_rollouts(model, tok, PROMPTS[:2], 4, 14)
    assert counts[:2] == [sum("+" in t for t in rollouts.texts[j * 4:(j + 1) * 4]) for j in range(2)]
    with pytest.raises(ValueError, match="n >= 1"):
        sample_eval(texts, rows, 0, lambda ts, rs: [True] * len(ts))


def test_pad_rows_left_right_and_overflow():
    values, mask = pad_rows([[1, 2], [3]], 9, left=True)
    assert values.tolist() == [[1, 2], [9, 3]] and mask.tolist() == [[1, 1], [0, 1]]
    values, mask = pad_rows([[1, 2], [3]], 9, left=False)
    assert values.tolist() == [[1, 2], [3, 9]] and mask.tolist() == [[1, 1], [1, 0]]
    with pytest.raises(ValueError, match="more than the width"):
        pad_rows([[1, 2]], 0, left=False, width=1)


@pytest.mark.parametrize("kwargs, match", [({"G": 0}, "G"), ({"prompts": []}, "prompts")])
def test_bad_arguments_raise(model, tok, kwargs, match):
    args = {"prompts": PROMPTS, "G": 2, "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        generate_rollouts(model, tok, **args)


@pytest.mark.parametrize("setting, match", [
    ({"max_new_tokens": 0}, "--max_new_tokens must be >= 1, got 0"),
    ({"temperature": 0.0}, r"--temperature must be in \[0.01, 2.0\]"),
    ({"temperature": 2.5}, r"--temperature must be in \[0.01, 2.0\] .*got 2.5"),
    ({"top_p": 0.0}, r"--top_p must be in \(0, 1\], got 0.0"), ({"top_p": 1.5}, "--top_p"),
])
def test_a_sampling_setting_out_of_range_is_refused_where_it_is_declared(setting, match):
    # once, for both engines: the samplers trust SamplingConfig (machinery/sampler.py)
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**setting)


def test_draw_matches_the_weights_and_never_draws_a_zero_weight():
    """machinery.rollout.draw (inverse-CDF sampling): empirical frequencies of 200,000 draws equal the
    normalised weights within 5 standard errors; zero-weight entries never come up."""
    w = torch.tensor([[0.0, 1.0, 0.0, 3.0, 6.0, 0.0]]).expand(200_000, 6)
    torch.manual_seed(0)
    x = rollout.draw(w)
    freq = torch.bincount(x, minlength=6).double() / len(x)
    p = w[0].double() / w[0].sum()
    se = (p * (1 - p) / len(x)).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), freq
    assert freq[[0, 2, 5]].sum() == 0
    # negative control: a biased sampler (weights squared) is far outside that band
    assert ((torch.tensor([0.0, 1, 0, 9, 36, 0]) / 46 - p).abs() > 5 * se).any()
