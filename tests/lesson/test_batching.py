"""Tests for batching.py: partitions, group preservation, balance, determinism, stats."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from batching import (MODES, RANDOM_SPLIT, minibatch_indices, minibatch_stats, split_groups,  # noqa: E402
                      step_advantages, trained_counts)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def mean_centred(rewards):
    """Dr. GRPO advantages r - mean(r) (kept local: advantages.py is written elsewhere)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def random_batch(n=12, g=8, seed=0):
    """Binary rewards with varied solve rates, including all-equal (neutral) groups."""
    torch.manual_seed(seed)
    p = torch.rand(n, 1)
    rewards = (torch.rand(n, g) < p).float()
    rewards[0] = 0.0       # an all-wrong group
    rewards[1] = 1.0       # an all-correct group
    return mean_centred(rewards)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_mode_partitions_exactly(mode, k):
    adv = random_batch()
    lengths = torch.randint(1, 40, adv.shape)
    steps = minibatch_indices(adv, k, mode, gen(k), lengths=lengths)
    assert len(steps) == k
    flat = torch.cat(steps)
    assert flat.dtype == torch.long
    assert torch.equal(torch.sort(flat).values, torch.arange(adv.numel()))
    for s in steps:
        assert torch.equal(s, torch.sort(s).values)      # sorted inside a step


@pytest.mark.parametrize("mode", ["random", "query", "mass_balanced"])
def test_near_equal_sizes(mode):
    adv = random_batch(n=10, g=4)                         # 40 rollouts, 10 groups
    sizes = sorted(len(s) for s in minibatch_indices(adv, 4, mode, gen()))
    assert sizes == ([8, 8, 12, 12] if mode == "query" else [10, 10, 10, 10])


@pytest.mark.parametrize("mode", ["query", "query_balanced"])
def test_group_preserving_modes_never_split(mode):
    adv = random_batch(n=12, g=8)
    g = gen(3)
    for _ in range(20):                                   # 20 epochs of one generator
        steps = minibatch_indices(adv, 4, mode, g)
        assert split_groups(steps, 8) == 0
        assert all(st["n_whole_groups"] == st["n_groups"] == 3
                   for st in minibatch_stats(steps, adv))


def test_random_splits_groups_negative_control():
    adv = random_batch(n=4, g=8)
    steps = minibatch_indices(adv, 2, "random", gen(0))
    # P(a given group stays whole) = 2*C(24,8)/C(32,16) = 0.24%: all four get split.
    assert split_groups(steps, 8) == 4
    assert all(st["n_whole_groups"] == 0 for st in minibatch_stats(steps, adv))


def test_balanced_meets_count_bound():
    # 5 groups of G=8 with 1, 2, 3, 5, 7 correct -> P = 18 positives, Q = 22 negatives;
    # plus one all-wrong group (8 neutrals). k = 4 steps.
    correct = [1, 2, 3, 5, 7, 0]
    rewards = torch.zeros(6, 8)
    for n, c in enumerate(correct):
        rewards[n, :c] = 1.0
    adv = mean_centred(rewards)
    n_pos, n_neg = int((adv > 0).sum()), int((adv < 0).sum())
    assert (n_pos, n_neg) == (18, 22)
    k = 4
    bound = math.ceil(abs(n_pos - n_neg) / k)             # = 1
    for seed in range(5):
        stats = minibatch_stats(minibatch_indices(adv, k, "balanced", gen(seed)), adv)
        diffs = [st["n_pos"] - st["n_neg"] for st in stats]
        assert sum(diffs) == n_pos - n_neg
        assert max(abs(d) for d in diffs) == bound
        # every step's difference is floor or ceil of (P - Q)/k = -1 exactly here
        assert diffs == [-1, -1, -1, -1]
        sizes = [st["n_rollouts"] for st in stats]
        assert max(sizes) - min(sizes) <= 1               # neutrals evened the sizes


def test_balanced_beats_random_on_balance():
    # Negative control for the balance property: random mode on the same batch usually
    # leaves some step far from balanced.
    rewards = torch.zeros(8, 8)
    for n, c in enumerate([1, 1, 2, 3, 5, 6, 7, 7]):
        rewards[n, :c] = 1.0
    adv = mean_centred(rewards)                           # P = Q = 32
    worst_random = max(max(abs(st["n_pos"] - st["n_neg"]) for st in
                           minibatch_stats(minibatch_indices(adv, 4, "random", gen(s)), adv))
                       for s in range(5))
    worst_balanced = max(max(abs(st["n_pos"] - st["n_neg"]) for st in
                             minibatch_stats(minibatch_indices(adv, 4, "balanced", gen(s)), adv))
                         for s in range(5))
    assert worst_balanced == 0
    assert worst_random >= 2


def test_balanced_aligned_tradeoff_documented_example():
    # P = Q = 3, k = 2, no neutrals: balance first -> sizes 4 and 2, both steps d = 0.
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])
    stats = minibatch_stats(minibatch_indices(adv, 2, "balanced", gen()), adv)
    assert [st["n_pos"] - st["n_neg"] for st in stats] == [0, 0]
    assert sorted(st["n_rollouts"] for st in stats) == [2, 4]


def test_query_balanced_pairs_hard_and_easy_groups():
    g = 8
    rewards = torch.zeros(8, g)
    for n in range(8):
        rewards[n, : (1 if n % 2 == 0 else 7)] = 1.0      # solve rates 1/8 and 7/8
    adv = mean_centred(rewards)
    for seed in range(10):
        steps = minibatch_indices(adv, 4, "query_balanced", gen(seed))
        for st in minibatch_stats(steps, adv):
            assert (st["n_groups"], st["n_pos"], st["n_neg"]) == (2, 8, 8)
    # negative control: plain query mode puts two same-rate groups together on some seed
    unbalanced = 0
    for seed in range(10):
        stats = minibatch_stats(minibatch_indices(adv, 4, "query", gen(seed)), adv)
        unbalanced += sum(st["n_pos"] != st["n_neg"] for st in stats)
    assert unbalanced > 0


def test_query_balanced_token_weighted():
    # Four groups, each 1 positive and 1 negative: counts are balanced in any packing.
    # Token lengths: groups 0 and 2 have the long positive (imbalance +10 tokens), groups
    # 1 and 3 the long negative (-10). Token balancing must pair a +10 with a -10 group,
    # so every step has pos_tokens == neg_tokens == 30.
    adv = torch.tensor([[0.5, -0.5]] * 4)
    lengths = torch.tensor([[20, 10], [10, 20], [20, 10], [10, 20]])
    for seed in range(10):
        steps = minibatch_indices(adv, 2, "query_balanced", gen(seed), lengths=lengths)
        for st in minibatch_stats(steps, adv, lengths):
            assert st["pos_tokens"] == st["neg_tokens"] == 30.0
    # Without lengths the packing is count-based and does not see the token imbalance.
    seen_unbalanced = False
    for seed in range(30):                                # 5 of these 30 pair {0,2}, {1,3}
        steps = minibatch_indices(adv, 2, "query_balanced", gen(seed))
        stats = minibatch_stats(steps, adv, lengths)
        seen_unbalanced |= any(st["pos_tokens"] != st["neg_tokens"] for st in stats)
    assert seen_unbalanced


def step_sums(adv, steps):
    return [float(adv.reshape(-1)[s].sum()) for s in steps]


def test_mass_balanced_zeroes_every_step_documented_example():
    # G = 4, mean-centred groups solved 1/4, 2/4, 3/4, 0/4: values are exact in binary
    # (+.75, -.25 x3 | +.5 x2, -.5 x2 | +.25 x3, -.75 | 0 x4), so sums are exact too.
    rewards = torch.zeros(4, 4)
    for n, c in enumerate([1, 2, 3, 0]):
        rewards[n, :c] = 1.0
    adv = mean_centred(rewards)
    worst = {}
    for mode in ("random", "balanced", "mass_balanced"):
        worst[mode] = max(max(abs(s) for s in step_sums(adv, minibatch_indices(adv, 4, mode, gen(seed))))
                          for seed in range(10))
    assert worst["mass_balanced"] == 0.0
    for seed in range(10):                                 # equal sizes, groups split
        steps = minibatch_indices(adv, 4, "mass_balanced", gen(seed))
        assert [len(s) for s in steps] == [4, 4, 4, 4]
    # negative controls: equal counts are not equal mass; random is worse still
    assert worst["balanced"] == 0.5 and worst["random"] == 1.5


def test_mass_balanced_equalises_steps_of_non_zero_sum_advantages():
    # psr-like advantages (A = r >= 0): no split can make a step sum to 0; the best is
    # total / k in every step. 8 groups of 4 with 16 successes, k = 4 -> 4.0 each.
    rewards = torch.zeros(8, 4)
    for n, c in enumerate([1, 3, 0, 4, 2, 2, 1, 3]):
        rewards[n, :c] = 1.0
    for seed in range(10):
        assert step_sums(rewards, minibatch_indices(rewards, 4, "mass_balanced", gen(seed))) == [4.0] * 4
    assert any(step_sums(rewards, minibatch_indices(rewards, 4, "query", gen(seed))) != [4.0] * 4
               for seed in range(10))                      # query cannot balance these


def test_mass_balanced_on_grpo_advantages_beats_count_balancing():
    # GRPO values are irrational, so exact zeros are out of reach; the per-step |sum A|
    # is still ~20x smaller than count balancing's, ~60x smaller than random's (measured:
    # means of the worst step over 10 seeds 0.078, 1.81, 5.03).
    adv = random_batch(n=12, g=8).double()
    adv = adv / (adv.std(dim=1, keepdim=True) + 1e-6)
    mean_worst = {}
    for mode in ("random", "balanced", "mass_balanced"):
        mean_worst[mode] = sum(max(abs(s) for s in step_sums(adv, minibatch_indices(adv, 4, mode, gen(seed))))
                               for seed in range(10)) / 10
    assert mean_worst["mass_balanced"] < 0.1
    assert mean_worst["balanced"] > 10 * mean_worst["mass_balanced"]
    assert mean_worst["random"] > 2 * mean_worst["balanced"]


@pytest.mark.parametrize("mode", MODES)
def test_deterministic_given_generator_state_and_epochs_differ(mode):
    adv = random_batch(n=12, g=8)
    a = minibatch_indices(adv, 3, mode, gen(7))
    b = minibatch_indices(adv, 3, mode, gen(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    g = gen(7)
    epoch1 = minibatch_indices(adv, 3, mode, g)
    epoch2 = minibatch_indices(adv, 3, mode, g)           # generator advanced
    assert all(torch.equal(x, y) for x, y in zip(epoch1, a))
    assert not all(torch.equal(x, y) for x, y in zip(epoch1, epoch2))


def test_one_minibatch_is_the_whole_batch():
    adv = random_batch(n=3, g=4)
    for mode in MODES:
        (only,) = minibatch_indices(adv, 1, mode, gen())
        assert torch.equal(only, torch.arange(12))


def test_stats_hand_built_example():
    adv = torch.tensor([[0.5, -0.5], [0.0, 0.0], [0.75, -0.25]])
    lengths = torch.tensor([[3, 5], [2, 2], [7, 1]])
    steps = [torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5])]
    s0, s1 = minibatch_stats(steps, adv, lengths)
    assert s0 == {"n_rollouts": 3, "n_groups": 3, "n_whole_groups": 0, "n_pos": 2,
                  "n_neg": 0, "n_neutral": 1, "pos_tokens": 10.0, "neg_tokens": 0.0,
                  "pos_mass": 1.25, "neg_mass": 0.0}
    assert s1 == {"n_rollouts": 3, "n_groups": 3, "n_whole_groups": 0, "n_pos": 0,
                  "n_neg": 2, "n_neutral": 1, "pos_tokens": 0.0, "neg_tokens": 6.0,
                  "pos_mass": 0.0, "neg_mass": 0.75}
    (whole,) = minibatch_stats([torch.tensor([0, 1, 4, 5])], adv)
    assert whole["n_groups"] == whole["n_whole_groups"] == 2
    assert whole["pos_tokens"] is None and whole["neg_tokens"] is None
    assert whole["pos_mass"] == 1.25 and whole["neg_mass"] == 0.75
    assert split_groups(steps, 2) == 3
    assert split_groups([torch.tensor([0, 1, 4, 5]), torch.tensor([2, 3])], 2) == 0


def test_bad_inputs_raise_naming_the_value():
    adv = random_batch(n=3, g=4)
    with pytest.raises(ValueError, match="bogus"):
        minibatch_indices(adv, 2, "bogus", gen())
    with pytest.raises(ValueError, match="got 0"):
        minibatch_indices(adv, 0, "random", gen())
    with pytest.raises(ValueError, match="got 13"):
        minibatch_indices(adv, 13, "random", gen())
    with pytest.raises(ValueError, match="N=3"):
        minibatch_indices(adv, 4, "query", gen())
    with pytest.raises(ValueError, match="N=3"):
        minibatch_indices(adv, 4, "query_balanced", gen())
    with pytest.raises(ValueError, match=r"\(12,\)"):
        minibatch_indices(adv.reshape(-1), 2, "random", gen())
    with pytest.raises(ValueError, match=r"\(3, 5\)"):
        minibatch_indices(adv, 2, "query_balanced", gen(), lengths=torch.ones(3, 5))
    with pytest.raises(ValueError, match="NaN"):
        minibatch_indices(torch.full((2, 2), float("nan")), 1, "random", gen())
    with pytest.raises(ValueError, match="2.0"):
        minibatch_indices(adv, 2.0, "random", gen())
    with pytest.raises(ValueError, match="out of range"):
        minibatch_stats([torch.tensor([12])], adv)
    # 12 steps over 12 rollouts (more steps than groups) is fine when groups may be split
    assert len(minibatch_indices(adv, 12, "balanced", gen())) == 12


# --- random_recentred: random's split, each group's part of a step re-centred ------------

def part_sums(A, step, g):
    """{group: sum of A over the group's rollouts inside the step}."""
    sums = {}
    for b in step.tolist():
        sums[b // g] = sums.get(b // g, 0.0) + float(A[b])
    return sums


def test_recentred_uses_randoms_split_and_zeroes_every_part():
    adv, g = random_batch(), 8
    flat = adv.reshape(-1)
    recentred = minibatch_indices(adv, 4, "random_recentred", gen(3))
    plain = minibatch_indices(adv, 4, "random", gen(3))
    assert all(torch.equal(a, b) for a, b in zip(recentred, plain))       # the same draws, the same steps
    assert split_groups(recentred, g) > 0
    # float32 sums of a part's advantages: measured up to 6.0e-8 (AVX-512 and AVX2); the
    # control, the batch's own advantages, 0.75-1.25
    for step in recentred:
        trained = step_advantages(flat, step, g, "random_recentred")
        assert max(abs(v) for v in part_sums(trained, step, g).values()) < 1e-6
        # negative control: random trains on the batch's advantages, whose parts do not sum to 0
        assert step_advantages(flat, step, g, "random") is flat
        assert max(abs(v) for v in part_sums(flat, step, g).values()) > 0.1


def test_recentred_documented_example_and_edge_cases():
    # G = 4, A = [+1.5, -0.5, -0.5, -0.5]; the step holds rollouts 0, 1, 2 and rollout 4 of
    # the next group alone: mean of the first part +1/6, the lone rollout gets 0.
    flat = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.75, -0.75, 0.75, -0.75])
    out = step_advantages(flat, torch.tensor([0, 1, 2, 4]), 4, "random_recentred")
    assert torch.allclose(out[[0, 1, 2]], torch.tensor([4 / 3, -2 / 3, -2 / 3]))
    assert out[4] == 0
    assert torch.equal(out[[3, 5, 6, 7]], flat[[3, 5, 6, 7]])            # outside the step: untouched
    assert torch.equal(flat, torch.tensor([1.5, -0.5, -0.5, -0.5, 0.75, -0.75, 0.75, -0.75]))   # not in place
    # a whole zero-sum group keeps its advantages: one step per batch changes nothing. These
    # are sums of multiples of 1/4, exact in float32 (measured 0, AVX-512 and AVX2); a group
    # the step cuts moves by 1/6 (above)
    whole = step_advantages(flat, torch.arange(8), 4, "random_recentred")
    assert torch.allclose(whole, flat, atol=1e-7)


def test_a_part_of_one_reward_trains_on_exactly_zero():
    # Six rollouts of one group share the advantage 0.3 (float32): their mean, a float32 sum
    # divided by 6, is not always 0.3 to the last bit, and A - mean(A) left ~3e-8 (AVX-512);
    # such a part has nothing to cancel and trains on exactly 0, so "the rollouts it trains
    # on" is a set. The other two rollouts of the group carry the rest of its mass.
    flat = torch.tensor([0.3] * 6 + [-0.9, -0.9])
    step = torch.arange(6)
    assert torch.equal(step_advantages(flat, step, 8, "random_recentred")[step], torch.zeros(6))
    assert torch.equal(step_advantages(flat, step, 8, "random_masked")[step], torch.zeros(6))
    assert trained_counts(step_advantages(flat, step, 8, "random_recentred"), step, 8)["rollouts"] == 0
    # negative control: a part with two values is re-centred, not zeroed
    mixed = step_advantages(flat, torch.tensor([0, 1, 6]), 8, "random_recentred")[[0, 1, 6]]
    assert torch.allclose(mixed, torch.tensor([0.4, 0.4, -0.8]))


# --- random_masked: recentred's rollouts and mass, without its zero-sum parts -------------

def test_masked_trains_on_recentreds_rollouts_prompts_and_mass_every_step_but_not_zero_sum():
    g = 8
    for seed in range(5):
        adv = random_batch(n=16, g=g, seed=seed)
        flat = adv.reshape(-1)
        split = {mode: minibatch_indices(adv, 4, mode, gen(seed)) for mode in RANDOM_SPLIT}
        assert all(torch.equal(a, b) for a, b in zip(split["random_masked"], split["random"]))    # the same draws
        unbalanced = 0
        for step in split["random_masked"]:
            masked = step_advantages(flat, step, g, "random_masked")
            recentred = step_advantages(flat, step, g, "random_recentred")
            m, r = trained_counts(masked, step, g), trained_counts(recentred, step, g)
            assert (m["rollouts"], m["prompts"]) == (r["rollouts"], r["prompts"])
            assert torch.equal(masked[step] != 0, recentred[step] != 0)                 # the same rollouts
            # sums of |A| over <= 32 rollouts in float32: equal to 2.4e-7 relative (AVX-512 and
            # AVX2); the control below (random's mass) differs by 20-60%
            assert m["adv_abs_sum"] == pytest.approx(r["adv_abs_sum"], rel=1e-5)
            # every kept rollout keeps its sign and its batch advantage, scaled by one number per step
            kept = masked[step] != 0
            scale = masked[step][kept] / flat[step][kept]
            assert torch.allclose(scale, scale[0].expand_as(scale)) and scale[0] > 0
            unbalanced = max(unbalanced, max(abs(v) for v in part_sums(masked, step, g).values()))
            # negative control: random trains on more rollouts and more mass in the same step
            plain = trained_counts(flat, step, g)
            assert plain["rollouts"] > m["rollouts"] and plain["adv_abs_sum"] > 1.1 * m["adv_abs_sum"]
        assert unbalanced > 0.1          # masked parts do not cancel (recentred's sum to < 1e-6, above)


def test_masked_documented_example():
    # the docstring's step: A' = [4/3, -2/3, -2/3] (sum |A'| = 8/3), kept [1.5, -0.5, -0.5]
    # (sum 2.5), s = 16/15, A'' = [1.6, -0.533, -0.533]; the lone rollout 4 gets 0
    flat = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.75, -0.75, 0.75, -0.75])
    step = torch.tensor([0, 1, 2, 4])
    out = step_advantages(flat, step, 4, "random_masked")
    assert torch.allclose(out[[0, 1, 2, 4]], torch.tensor([1.6, -8 / 15, -8 / 15, 0.0]))
    assert torch.equal(out[[3, 5, 6, 7]], flat[[3, 5, 6, 7]])            # outside the step: untouched
    assert trained_counts(out, step, 4) == {"rollouts": 3, "prompts": 1, "adv_abs_sum": pytest.approx(8 / 3)}
    # a step where every part is of one reward trains on nothing, without dividing by 0
    lone = step_advantages(flat, torch.tensor([0, 4]), 4, "random_masked")
    assert torch.equal(lone[[0, 4]], torch.zeros(2))
    # a whole group keeps its zero-sum advantages (s = 1): one step per batch is random's
    assert torch.allclose(step_advantages(flat, torch.arange(8), 4, "random_masked"), flat, atol=1e-7)
