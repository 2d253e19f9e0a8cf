"""Closed forms, conventions and mass curves of every advantage in advantages.py."""

import inspect
import itertools
import math
import re

import pytest
import torch

import advantages as adv
from advantages import ADVANTAGES, HYPER_RANGES, compute_advantages, hyper_parameters

# Each advantage's properties are registered beside its definition (advantages.register).
ZERO_SUM = tuple(n for n, fn in ADVANTAGES.items() if fn.zero_sum)
BINARY_REWARDS = tuple(n for n, fn in ADVANTAGES.items() if fn.rewards == "binary")
UNIT_REWARDS = tuple(n for n, fn in ADVANTAGES.items() if fn.rewards == "unit")
NONNEGATIVE_REWARDS = tuple(n for n, fn in ADVANTAGES.items() if fn.rewards == "nonnegative")
import mass
from mass import gradient_mass, mass_curve

G = 8


def binary_groups(G=G, cs=range(1, G)):
    """One row per c: the first c rollouts correct. float64 so closed forms match to 1e-12."""
    cs = list(cs)
    return (torch.arange(G).unsqueeze(0) < torch.tensor(cs).unsqueeze(1)).double(), cs


def closed_form(name, c, G=G):
    """(success, failure) value from docs/math.md §1's table, written independently."""
    p = c / G
    e = math.exp(2.0)
    C = math.comb
    R = 1 - C(G - c, 4) / C(G, 4)
    s = math.sqrt(R * (1 - R)) if 0 < R < 1 else None
    return {
        "reinforce": (1.0, 0.0),
        "mean": (1 - p, -p),
        "rloo": (G * (1 - p) / (G - 1), -G * p / (G - 1)),
        "grpo": (math.sqrt((G - 1) / G) * math.sqrt((1 - p) / p), -math.sqrt((G - 1) / G) * math.sqrt(p / (1 - p))),
        "psr": (1.0, 0.0),
        "nsr": (0.0, -1.0),
        "w_reinforce": (0.1, -1.0),
        "asymre": (1 - p + 0.1, -p + 0.1),
        "focal": ((1 - p) * math.sqrt((G - 1) / G) * math.sqrt((1 - p) / p),
                  -(1 - p) * math.sqrt((G - 1) / G) * math.sqrt(p / (1 - p))),
        "power": ((1 - p) ** 2, -p * (1 - p)),                      # alpha = 2
        "asym": (1 - p, -p / 0.5),                                  # delta = 0.5
        "fade": (1 - p, -p),                                        # alpha = delta = 1
        "passk": ((1 - R) / s, (1 - R - C(G - c - 1, 3) / C(G - 1, 3)) / s) if s else (0.0, 0.0),
        "pkpo": (C(G - c, 3) / C(G, 4), 0.0),
        "maxrl": ((1 - p) / p, -1.0),
        "risk": ((e / (p * e + 1 - p) - 1) / 2, (1 / (p * e + 1 - p) - 1) / 2),
    }[name]


@pytest.mark.parametrize("name", [n for n in ADVANTAGES if n != "reinforce_pp"])
def test_closed_forms_at_G8(name):
    rewards, cs = binary_groups()
    A = compute_advantages(name, rewards)
    for row, c in enumerate(cs):
        succ, fail = closed_form(name, c)
        # eps = 1e-6 in grpo/focal/maxrl denominators, an exact offset: relative error eps / p
        # = 8e-6 for maxrl at c = 1 (measured; grpo and focal, eps / std: 2.8e-6); the float64
        # rounding of the other methods, <= 4.6e-16 relative, is far below atol + rtol |A|
        assert torch.allclose(A[row, :c], torch.full((c,), succ, dtype=torch.float64), rtol=2e-5, atol=1e-12), (name, c)
        assert torch.allclose(A[row, c:], torch.full((G - c,), fail, dtype=torch.float64), rtol=2e-5, atol=1e-12), (name, c)


def test_reinforce_pp_is_group_centring_over_batch_std():
    torch.manual_seed(0)
    rewards = torch.rand(5, 6).double()
    x = rewards - rewards.mean(1, keepdim=True)
    expected = x / (x.std() + 1e-6)   # mean of x over the batch is 0 up to rounding
    # float64, two orders of the same operations: measured 6.9e-18 (AVX-512 and AVX2)
    assert torch.allclose(compute_advantages("reinforce_pp", rewards), expected, atol=1e-12, rtol=0)


def tokenwise_whitening(rewards, lengths, eps):
    """The REINFORCE++ equation written over tokens, independently: every token of rollout i
    carries x_i = r_i - its group's mean; whiten the batch's token values (ddof = 1)."""
    x = rewards - rewards.mean(1, keepdim=True)
    tokens = torch.cat([x.reshape(-1)[i].repeat(int(n)) for i, n in enumerate(lengths.reshape(-1))])
    return (x - tokens.mean()) / (tokens.std() + eps)


def test_reinforce_pp_token_whitening_is_the_papers_equation():
    """whiten="token" = whitening over the batch's tokens (the REINFORCE++ equation, verl's
    masked_whiten) at unequal lengths; the default stays per rollout, bit for bit as before."""
    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(6, 4, generator=gen) < 0.5).double()
    rewards[0] = 1.0                                                          # an all-equal group
    lengths = torch.randint(1, 30, (6, 4), generator=gen).double()
    got = compute_advantages("reinforce_pp", rewards, lengths=lengths, whiten="token")
    want = tokenwise_whitening(rewards, lengths, 1e-6).masked_fill(rewards.max(1, keepdim=True).values ==
                                                                    rewards.min(1, keepdim=True).values, 0.0)
    # float64, the same sums in another order (weights vs repeated tokens): measured 3.1e-15
    # (AVX-512 and AVX2); per rollout instead, the control below, is 0.11 away
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    assert (got[0] == 0).all()                                               # all-equal: exactly 0
    # not zero-sum at unequal lengths: every group moves by -m/s (the token mean m != 0)
    mixed = rewards.max(1).values != rewards.min(1).values
    assert mixed.sum() >= 3 and got[mixed].sum(1).abs().min() > 1e-3
    default = compute_advantages("reinforce_pp", rewards, lengths=lengths)
    assert (default - got).abs().max() > 1e-2                                # the two are different methods
    x = rewards - rewards.mean(1, keepdim=True)
    old = ((x - x.mean()) / (x.std() + 1e-6)).masked_fill(rewards.max(1, keepdim=True).values ==
                                                           rewards.min(1, keepdim=True).values, 0.0)
    assert torch.equal(default, old) and torch.equal(default, compute_advantages("reinforce_pp", rewards))


@pytest.mark.parametrize("N,G,T", [(2, 2, 1), (3, 4, 5), (8, 8, 64), (16, 2, 300)])
def test_reinforce_pp_token_over_rollout_at_equal_lengths_is_a_closed_form(N, G, T):
    """Equal lengths T: the token std counts each x_i T times with BT - 1 degrees of freedom, so
    A_token / A_rollout = sqrt((BT - 1) / (T (B - 1))) exactly (eps -> 0), B = N G."""
    gen = torch.Generator().manual_seed(N * G * T)
    rewards = torch.rand(N, G, generator=gen, dtype=torch.float64)
    lengths = torch.full((N, G), float(T), dtype=torch.float64)
    tok = compute_advantages("reinforce_pp", rewards, lengths=lengths, whiten="token", eps=1e-12)
    roll = compute_advantages("reinforce_pp", rewards, eps=1e-12)
    B = N * G
    ratio = math.sqrt((B * T - 1) / (T * (B - 1)))
    # float64, and eps = 1e-12 added to stds of ~0.3 (the formula has eps = 0): measured
    # <= 1.1e-13 relative (AVX-512 and AVX2); T = 1 is the identity (ratio 1), and the ratio
    # differs from 1 by >= 0.0078 at the other shapes
    assert torch.allclose(tok, roll * ratio, rtol=1e-10, atol=0)
    assert (T == 1) == (abs(ratio - 1) < 1e-12)


def test_reinforce_pp_lengths_are_checked_at_the_door():
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match=r"^reinforce_pp: whiten='token' weighs each rollout by its tokens"):
        compute_advantages("reinforce_pp", r, whiten="token")
    with pytest.raises(ValueError, match=r"^reinforce_pp: lengths must be a tensor shaped like rewards \(2, 2\), got \(4,\)$"):
        compute_advantages("reinforce_pp", r, lengths=torch.ones(4), whiten="token")
    with pytest.raises(ValueError, match=r"^reinforce_pp: lengths must be finite and >= 0, got -1.0 at \[1, 0\]$"):
        compute_advantages("reinforce_pp", r, lengths=torch.tensor([[3.0, 2.0], [-1.0, 2.0]]), whiten="token")
    assert torch.equal(compute_advantages("grpo", r, lengths=torch.ones(2, 2)), compute_advantages("grpo", r))


@pytest.mark.parametrize("name", ZERO_SUM)
def test_zero_sum_methods_sum_to_zero_per_group(name):
    rewards, _ = binary_groups()
    torch.manual_seed(1)
    cont = torch.rand(6, G).double()      # also non-binary rewards where the method allows
    for r in [rewards] + ([cont] if name not in ("passk",) else []):
        A = compute_advantages(name, r)
        # float64 sums of G = 8 terms of O(1): measured <= 3.4e-15 (AVX-512 and AVX2); the
        # methods that are not zero-sum (the test below) miss by 0.57-6.0 on a 2/8 group
        assert torch.allclose(A.sum(1), torch.zeros(A.shape[0], dtype=A.dtype), atol=1e-9), name


@pytest.mark.parametrize("name", ["asym", "asymre", "psr", "nsr", "w_reinforce", "reinforce", "pkpo"])
def test_non_zero_sum_methods_really_are_not(name):
    # negative control for the test above: these do NOT sum to zero on a 2/8 group
    rewards, _ = binary_groups(cs=[2])
    assert abs(compute_advantages(name, rewards).sum().item()) > 1e-3


@pytest.mark.parametrize("name", list(ADVANTAGES))
@pytest.mark.parametrize("value", [0.0, 1.0])
def test_all_equal_groups(name, value):
    rewards = torch.full((3, G), value)
    A = compute_advantages(name, rewards)
    assert not torch.isnan(A).any()
    if name in ZERO_SUM:
        assert (A == 0).all(), name   # exactly 0, not 1e-17
    # documented non-zero values of the others
    expected = {"reinforce": value, "psr": value, "nsr": value - 1, "w_reinforce": 0.1 if value else -1.0,
                "asymre": 0.1, "asym": 0.0, "pkpo": 0.0}
    if name in expected:
        assert torch.allclose(A, torch.full_like(A, expected[name])), name


def test_all_equal_non_dyadic_rewards_give_exact_zero():
    # mean([0.1]*3) != 0.1 in float; the explicit zeroing must still give exactly 0
    rewards = torch.full((2, 3), 0.1, dtype=torch.float64)
    for name in ("mean", "grpo", "rloo", "maxrl", "risk", "reinforce_pp", "power", "fade", "focal"):
        assert (compute_advantages(name, rewards) == 0).all(), name


def test_power_and_fade_with_alpha_below_one_stay_finite_on_all_correct_groups():
    r = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    for name in ("power", "fade"):
        A = compute_advantages(name, r, alpha=0.5)
        assert (A[0] == 0).all() and torch.isfinite(A).all(), name
        assert A[1, 0].item() == pytest.approx((2 / 3) ** -0.5 * (2 / 3)), name


def test_group_of_one():
    r = torch.tensor([[1.0], [0.0]])
    for name in ("mean", "grpo", "maxrl", "risk", "power", "fade", "asym", "focal"):
        assert (compute_advantages(name, r) == 0).all(), name
    assert torch.equal(compute_advantages("reinforce", r), r)
    assert torch.equal(compute_advantages("nsr", r), torch.tensor([[0.0], [-1.0]]))
    for name, msg in [("rloo", "G >= 2"), ("passk", "G >= 2"), ("pkpo", "G >= 2")]:
        with pytest.raises(ValueError, match=msg):
            compute_advantages(name, r)


@pytest.mark.parametrize("name", list(ADVANTAGES))
def test_nan_reward_is_a_clear_error(name):
    r = torch.ones(2, 4)
    r[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"finite, got nan at \[1, 2\]"):
        compute_advantages(name, r)


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="unknown advantage 'gpro'"):
        compute_advantages("gpro", torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"shape \[N, G\], got shape \(8,\)"):
        compute_advantages("grpo", torch.ones(8))
    with pytest.raises(ValueError, match="no hyper-parameter 'alpha'"):
        compute_advantages("grpo", torch.ones(1, 4), alpha=2)
    with pytest.raises(ValueError, match=r"alpha in \(0, 10\], got -1"):
        compute_advantages("power", torch.ones(1, 4), alpha=-1)
    with pytest.raises(ValueError, match=r"delta in \[0.001, 1000\], got 0"):
        compute_advantages("fade", torch.ones(1, 4), delta=0)
    with pytest.raises(ValueError, match="binary 0/1 rewards, got 0.5"):
        compute_advantages("psr", torch.tensor([[0.5, 1.0]]))
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\].*got 2.0"):
        compute_advantages("fade", torch.tensor([[2.0, 0.0]]))
    with pytest.raises(ValueError, match=r"k in \[1, G=4\], got 5"):
        compute_advantages("passk", torch.tensor([[1.0, 0, 0, 0]]), k=5)


# ---- checks at the door: compute_advantages is the one place that validates -------------

def test_rloo_with_one_rollout_per_prompt_names_G():
    with pytest.raises(ValueError, match=r"^rloo: needs G >= 2 rollouts per prompt, got G=1$"):
        compute_advantages("rloo", torch.zeros(3, 1))
    assert (compute_advantages("rloo", torch.zeros(3, 2)) == 0).all()     # G = 2 is enough


def test_reward_tensor_checks_name_the_value():
    for bad, msg in [([[1.0, 0.0]], r"torch\.Tensor of shape \[N, G\], got list"),
                     (torch.ones(2, 3, 1), r"shape \[N, G\], got shape \(2, 3, 1\)"),
                     (torch.ones(0, 4), r"empty, shape \(0, 4\)"),
                     (torch.ones(3, 0), r"empty, shape \(3, 0\)"),
                     (torch.tensor([[0.0, 1.0], [float("-inf"), 0.0]]), r"finite, got -inf at \[1, 0\]")]:
        for name in ADVANTAGES:
            with pytest.raises(ValueError, match=f"^{name}: .*{msg}"):
                compute_advantages(name, bad)


@pytest.mark.parametrize("domain,bad,good", [
    (BINARY_REWARDS, 0.5, 1.0),
    (UNIT_REWARDS, 1.5, 0.5),
    (NONNEGATIVE_REWARDS, -0.5, 2.0),
])
def test_reward_domains_reject_the_first_bad_reward_with_its_position(domain, bad, good):
    r = torch.tensor([[0.0, 1.0, good, 1.0], [1.0, 0.0, bad, bad]])
    for name in domain:
        with pytest.raises(ValueError, match=rf"^{name}: needs .*rewards.*, got {bad} at \[1, 2\]$"):
            compute_advantages(name, r)
        r_ok = r.clone()
        r_ok[1, 2:] = good
        assert torch.isfinite(compute_advantages(name, r_ok)).all(), name      # negative control


def test_reward_domains_are_exactly_the_restricted_methods():
    # every other method takes any finite reward, e.g. partial credit outside [0, 1]
    r = torch.tensor([[-1.0, 2.5, 0.5], [3.0, 3.0, -2.0]])
    restricted = set(BINARY_REWARDS) | set(UNIT_REWARDS) | set(NONNEGATIVE_REWARDS)
    free = [name for name in ADVANTAGES if name not in restricted]
    assert {"reinforce", "mean", "rloo", "grpo", "asym", "risk"} <= set(free)     # a new method lands in one or the other
    for name in free:
        assert torch.isfinite(compute_advantages(name, r)).all(), name


def test_every_hyper_parameter_has_a_range():
    for name, fn in ADVANTAGES.items():
        for p in hyper_parameters(fn):
            assert p.name in HYPER_RANGES, (name, p.name)
            ok = HYPER_RANGES[p.name][0]
            assert ok(p.default, 8), (name, p.name, p.default)   # the defaults are in range at G = 8


# (advantage, hyper-parameter, values that must fail, values at the edge that must pass)
RANGE_CASES = [
    ("grpo", "eps", [0.0, -1e-6, float("nan"), float("inf"), 0.011, 1e30], [1e-12, 0.01]),
    ("focal", "eps", [0.0, 1e30], [1e-12, 0.01]),
    ("maxrl", "eps", [0.0, 1e30], [1e-12, 0.01]),
    ("reinforce_pp", "eps", [0.0, 1e30], [1e-12, 0.01]),
    ("power", "alpha", [0.0, -1.0, float("nan"), float("inf"), 10.5, 1e30], [1e-3, 10.0]),
    ("fade", "alpha", [0.0, 1e30], [1e-3, 10.0]),
    ("asym", "delta", [0.0, -0.5, float("inf"), 9e-4, 1e-30, 1001.0, 1e30], [1e-3, 1e3]),
    ("fade", "delta", [0.0, 1e-30, 1e30], [1e-3, 1e3]),
    ("w_reinforce", "lam", [-0.1, float("nan"), 100.5, 1e30], [0.0, 100.0]),
    ("focal", "gamma", [-1.0, float("inf"), 10.5, 1e30], [0.0, 10.0]),
    ("risk", "beta", [0.0, float("nan"), float("inf"), 100.5, -100.5, 1e30, -1e30], [-1.0, 1e-3, 100.0, -100.0]),
    ("asymre", "dV", [float("nan"), float("inf"), 1.0, -1.0, 1e30, -1e30], [0.0, 0.7, -0.99]),
    ("passk", "k", [0, 5, 2.0, True, "2"], [1, 4]),
    ("reinforce_pp", "whiten", ["tokens", "Token", 1, None], ["rollout", "token"]),
    ("pkpo", "k", [0, 5, 2.0, True], [1, 4]),
]


@pytest.mark.parametrize("name,key,bad,edge", RANGE_CASES)
def test_hyper_parameter_ranges_name_the_value(name, key, bad, edge):
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])            # G = 4
    for value in bad:
        with pytest.raises(ValueError, match=rf"^{name}: needs .*{key}.*, got {re.escape(repr(value))}$"):
            compute_advantages(name, r, **{key: value})
    for value in edge:
        got = compute_advantages(name, r, lengths=torch.full_like(r, 3.0), **{key: value})
        assert torch.isfinite(got).all(), (name, key, value)


def test_every_range_is_exercised():
    assert {key for _, key, _, _ in RANGE_CASES} == set(HYPER_RANGES)
    assert {(n, k) for n, k, _, _ in RANGE_CASES} >= {
        (name, p.name) for name, fn in ADVANTAGES.items() for p in hyper_parameters(fn)}


def test_default_k_is_checked_against_G():
    with pytest.raises(ValueError, match=r"^passk: needs an integer k in \[1, G=3\], got 4$"):
        compute_advantages("passk", torch.tensor([[1.0, 0.0, 0.0]]))


def test_dtypes_ints_become_float_float32_stays():
    r = torch.tensor([[1, 0, 0, 1], [0, 1, 1, 1]])
    for name in ADVANTAGES:
        assert compute_advantages(name, r).dtype == torch.get_default_dtype(), name
        assert compute_advantages(name, r.float()).dtype == torch.float32, name
        assert compute_advantages(name, r.double()).dtype == torch.float64, name
        assert torch.equal(compute_advantages(name, r), compute_advantages(name, r.float())), name


def test_fade_reduces_to_mean_and_power():
    rewards, _ = binary_groups()
    assert torch.allclose(compute_advantages("fade", rewards, alpha=1.0, delta=1.0), compute_advantages("mean", rewards))
    assert torch.allclose(compute_advantages("fade", rewards, alpha=2.5, delta=1.0),
                          compute_advantages("power", rewards, alpha=2.5))
    assert torch.allclose(compute_advantages("fade", rewards, alpha=1.0, delta=0.4),
                          compute_advantages("asym", rewards, delta=0.4))


def test_passk_with_k1_is_grpo_with_population_std():
    rewards, _ = binary_groups()
    x = rewards - rewards.mean(1, keepdim=True)
    assert torch.allclose(compute_advantages("passk", rewards, k=1), x / x.std(1, unbiased=False, keepdim=True))


# ---- gradient mass ------------------------------------------------------------------

def test_gradient_mass_hand_example():
    A = torch.tensor([[0.5, -0.25, -0.25, 0.0], [1.0, 2.0, -4.0, 0.0]])
    m_S, m_F = gradient_mass(A)
    assert m_S.tolist() == [0.5, 3.0] and m_F.tolist() == [0.5, 4.0]


def test_grpo_mass_balanced_and_peaks_at_half():
    p, m_S, m_F = mass_curve("grpo", G=200)
    assert torch.allclose(m_S, m_F, atol=1e-9, rtol=0)    # float64: measured 3.1e-16
    inner = (p > 0) & (p < 1)
    Gv = 200
    assert torch.allclose(m_S[inner], math.sqrt((Gv - 1) / Gv) * torch.sqrt(p * (1 - p))[inner], rtol=1e-4)  # eps=1e-6 over std>=0.07
    assert p[torch.argmax(m_S + m_F)].item() == 0.5


@pytest.mark.parametrize("alpha", [1.0, 2.0, 3.0])
def test_power_mass_peaks_at_one_over_one_plus_alpha(alpha):
    Gv = 600
    p, m_S, m_F = mass_curve("power", G=Gv, alpha=alpha)
    # float64 closed forms (this test and the next): measured <= 1.4e-16 (AVX-512 and AVX2)
    assert torch.allclose(m_S, p * (1 - p) ** alpha, atol=1e-12, rtol=0)
    assert abs(p[torch.argmax(m_S + m_F)].item() - 1 / (1 + alpha)) <= 1.0 / Gv


@pytest.mark.parametrize("alpha,delta", [(1.0, 1.0), (2.0, 0.5), (3.0, 0.3)])
def test_fade_masses(alpha, delta):
    p, m_S, m_F = mass_curve("fade", G=100, alpha=alpha, delta=delta)
    assert torch.allclose(m_S, p * (1 - p) ** alpha, atol=1e-12, rtol=0)
    assert torch.allclose(m_F, p * (1 - p) ** alpha / delta, atol=1e-12, rtol=0)


def test_sign_axis_of_positive_and_negative_only_methods():
    _, m_S, m_F = mass_curve("psr", G=16)
    assert (m_F == 0).all() and m_S.max() > 0
    _, m_S, m_F = mass_curve("nsr", G=16)
    assert (m_S == 0).all() and m_F.max() > 0


def test_expected_mass_curve_matches_brute_force_binomial():
    ps = torch.tensor([0.1, 0.5, 0.8])
    eS, eF = mass.expected_mass_curve("grpo", ps, G=4)
    for j, p in enumerate(ps.tolist()):
        tot_S = tot_F = 0.0
        for bits in itertools.product([0.0, 1.0], repeat=4):
            prob = math.prod(p if b else 1 - p for b in bits)
            m_S, m_F = gradient_mass(compute_advantages("grpo", torch.tensor([bits], dtype=torch.float64)))
            tot_S += prob * m_S.item() / 4
            tot_F += prob * m_F.item() / 4
        # float64 sums of 16 terms: measured <= 2.8e-17 (AVX-512 and AVX2)
        assert abs(eS[j].item() - tot_S) < 1e-12 and abs(eF[j].item() - tot_F) < 1e-12


def test_plot_writes_png(tmp_path):
    out = tmp_path / "m.png"
    mass.plot_masses(str(out), G=16)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table_follows_G_and_plot_path_is_checked_first(tmp_path, capsys):
    mass.main(["--table", "--G", "3"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("G=3, c correct") and out[1].split() == ["name", "c=1", "c=2"]   # c = 1..G-1
    assert any(line.startswith("passk") and "not at G=3" in line for line in out)   # default k = 4 > G
    mass.main(["--table"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("G=8, c correct") and out[1].split()[-1] == "c=7"     # the table's own default G
    grpo_row = next(line.split() for line in out if line.split()[0] == "grpo")
    assert grpo_row[4] == "+0.935/-0.935"            # c = 4 of 8: +-(1/2) / std, std = sqrt(8/7 * 1/4) = 0.5345
    for argv in ([], ["--table", "--plot", str(tmp_path / "m.png")], ["--table", "--G", "1"]):   # one of the two, G >= 2
        with pytest.raises(SystemExit) as stop:
            mass.main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, (argv, err)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(SystemExit) as stop:
        mass.main(["--plot", str(a_file / "masses.png")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--plot" in err, err


@pytest.mark.parametrize("name", ["passk", "pkpo"])
def test_pass_at_k_methods_refuse_groups_of_one(name):
    with pytest.raises(ValueError, match=f"{name}: needs G >= 2 rollouts per prompt, got G=1"):
        adv.compute_advantages(name, torch.tensor([[1.0]]), k=1)
