"""Advantages: how one scalar reward per rollout becomes a weight on its gradient.

Critic-free RL (GRPO and its family) samples G rollouts per prompt and scores each with a
verifier. An *advantage* turns those G rewards into G weights; the policy gradient is

    g = sum_i A_i * grad log pi(o_i)          (one group; a batch sums over groups)

Everything in this file is a different answer to one question: how much should a success
push up, and a failure push down, and on which prompts?

Two numbers summarise any answer, per group: the success mass m_S = sum_{A_i > 0} A_i
and the failure mass m_F = sum_{A_i < 0} |A_i| (the FADE paper's decomposition). Their
ratio is the SIGN axis, where their total peaks over the solve rate the DIFFICULTY axis;
mass.py measures both for every advantage here, and docs/math.md §2 derives them.

Why mean-centring matters (the Cancellation Hypothesis, arXiv 2605.08666, and the
"design conditions" paper, arXiv 2604.13088): if sum_i A_i = 0 inside a group and every
rollout gives a shared token (a template prefix) the same weight, that token's gradient
is (sum_i A_i) * g_shared = 0. Zero-sum advantages are what make the cancellation exact;
each is registered with zero_sum=True (`register`, beside its definition).

Conventions (pinned here, tested in tests/lesson/test_advantages.py):
- rewards are a float tensor [N, G]: N prompts, G rollouts each, prompt-major;
- p = mean_i r_i is the group's solve rate (for binary rewards, c/G with c correct);
- std is the sample std with Bessel's correction (ddof=1), as torch.std, TRL and verl;
- an all-equal group gives EXACTLY 0 for every mean-centred method (never 1e-17, never
  NaN): we zero such groups explicitly instead of trusting float arithmetic;
- NaN or inf rewards raise ValueError; an unscorable rollout must be scored before here;
- G = 1: mean-centred methods give 0 (a lone rollout has nothing to compare with; use
  `reinforce`, `psr`, `nsr` or `w_reinforce` for single-rollout training); `rloo` and
  the pass@k methods need more rollouts and raise ValueError.
- input is checked once, by `compute_advantages` (the tables of reward domains and
  hyper-parameter ranges sit next to it); the formula functions assume valid input.

Usage:
    A = compute_advantages("grpo", rewards)            # validated entry point
    python mass.py --table [--G 8]                     # every advantage's value for a success
                                                       # and a failure at each c correct
"""

from __future__ import annotations

import inspect
import math
import numbers

import torch
from torch import Tensor


# ---------------------------------------------------------------------------------------
# The registry: each advantage is registered where it is defined, with its properties
# ---------------------------------------------------------------------------------------

ADVANTAGES: dict = {}
"""name -> function, in the order defined below. train.py picks one with --advantage NAME."""

REWARD_DOMAINS = {
    # Binary: defined by "correct or not" (psr keeps the rewards as weights; passk and pkpo
    # count c). Unit interval: it weights by 1 - p, which must be >= 0. Non-negative: maxrl
    # divides by p + eps, which must be > 0.
    "real": (lambda r: torch.isfinite(r), "finite rewards"),
    "binary": (lambda r: (r == 0) | (r == 1), "needs binary 0/1 rewards"),
    "unit": (lambda r: (r >= 0) & (r <= 1), "needs rewards in [0, 1] (it weights by 1 - p)"),
    "nonnegative": (lambda r: r >= 0, "needs rewards >= 0 (it divides by p)"),
}


def register(zero_sum: bool = False, rewards: str = "real", min_group_size: int = 1, reads_lengths: bool = False):
    """Add the decorated function to ADVANTAGES under its name, its properties beside it
    (verl's register_adv_est does the same), read by compute_advantages and the trainer:

      zero_sum        its advantages sum to zero inside every group (with default
                      hyper-parameters; fade only while delta = 1): the ones under which a
                      token shared by the whole group cancels (module header).
      rewards         its reward domain, REWARD_DOMAINS' name: compute_advantages refuses
                      other rewards with the first offending value and its position.
      min_group_size  the smallest G it is defined for: rloo's baseline is the mean of the
                      OTHER G - 1; pass@k of one sample is its own reward, so passk's
                      advantage is 0 for every group of one and pkpo's is psr's: both
                      refuse G = 1 rather than train nothing or something else unsaid.
      reads_lengths   it takes the rollouts' response lengths in tokens, [N, G], as its
                      keyword `lengths` (verl's estimators get the response mask likewise):
                      data, not a hyper-parameter, so no flag. compute_advantages checks
                      and passes them (None where the caller has none), and the function
                      says when it needs them (reinforce_pp's whiten="token").
    Example: @register(zero_sum=True) above `def mean(rewards)`.
    """
    if rewards not in REWARD_DOMAINS:
        raise ValueError(f"register: rewards must be one of {list(REWARD_DOMAINS)}, got {rewards!r}")

    def add(fn):
        fn.zero_sum, fn.rewards, fn.min_group_size = zero_sum, rewards, min_group_size
        fn.reads_lengths = reads_lengths
        ADVANTAGES[fn.__name__] = fn
        return fn
    return add


# ---------------------------------------------------------------------------------------
# Helpers used by every advantage (exact mean-centring)
# ---------------------------------------------------------------------------------------

def _constant_groups(rewards: Tensor) -> Tensor:
    """[N, 1] bool: True where every rollout of the group has the same reward."""
    return (rewards.max(dim=1, keepdim=True).values == rewards.min(dim=1, keepdim=True).values)


def _centred(rewards: Tensor) -> Tensor:
    """r_i - mean_j r_j per group, with all-equal groups set to exactly 0.

    Why the explicit zero: mean([0.1] * 3) is 0.10000000000000002 in float64, so r - mean
    would leave a 1e-17 residue that a later division by a tiny std blows up to O(1).
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred.masked_fill(_constant_groups(rewards), 0.0)


def _solve_rate(rewards: Tensor) -> Tensor:
    """[N, 1] group solve rate p = mean_i r_i (for binary rewards, c / G)."""
    return rewards.mean(dim=1, keepdim=True)


# ---------------------------------------------------------------------------------------
# The advantages (docs/math.md §1). Each: rewards [N, G] -> advantages [N, G].
# Called through compute_advantages, which validates: each function below receives a
# finite float [N, G] tensor inside its reward domain, with hyper-parameters in range, so
# it is only the math. The "Needs ..." lines are the checks compute_advantages makes.
# ---------------------------------------------------------------------------------------

@register()
def reinforce(rewards: Tensor) -> Tensor:
    """Plain REINFORCE, no baseline (Williams 1992).

    A_i = r_i.   Binary: correct 1, wrong 0.   Masses (per rollout): m_S = p, m_F = 0.
    Not zero-sum: every success is pushed up, failures are ignored, and an all-correct
    group gets the full push (its updates never cancel). All-wrong groups give 0.
    Works with G = 1. The high-variance baseline every other method improves on.
    """
    return rewards.clone()


@register(zero_sum=True)
def mean(rewards: Tensor) -> Tensor:
    """Mean-centred advantage, Dr. GRPO (Liu et al. 2025, arXiv 2503.20783).

    A_i = r_i - mean_j r_j.   Binary: correct 1 - p, wrong -p.
    Masses per rollout: m_S = m_F = p(1 - p) (peak at p = 1/2, exactly balanced).
    Zero-sum, so shared tokens cancel exactly. All-equal groups: exactly 0. G = 1: 0.
    Dr. GRPO change 1: drop GRPO's division by the std, which up-weights groups that are
    almost all-correct or all-wrong (a difficulty bias, see `grpo`).
    Example: G = 8, c = 2 -> success +0.75, failure -0.25.
    """
    return _centred(rewards)


@register(zero_sum=True, min_group_size=2)
def rloo(rewards: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024).

    A_i = r_i - mean_{j != i} r_j  =  G/(G-1) * (r_i - mean_j r_j)

    The baseline for rollout i excludes rollout i itself, so it is independent of o_i and
    the gradient estimate stays unbiased. Binary: success G(1-p)/(G-1), failure
    -Gp/(G-1). Masses per rollout: G/(G-1) p(1-p) each. Zero-sum; all-equal groups 0.
    Example: G = 8, c = 2 -> success +0.857, failure -0.286.
    Needs G >= 2 (ValueError otherwise: there is no "other" rollout to form a baseline).
    """
    G = rewards.shape[1]
    return _centred(rewards) * (G / (G - 1))


@register(zero_sum=True)
def grpo(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO's group-normalised advantage (Shao et al. 2024, arXiv 2402.03300).

    A_i = (r_i - mean_j r_j) / (std_j r_j + eps),   std with Bessel's correction.

    Binary, with c correct of G (p = c/G): the sample std is sqrt(G/(G-1) p(1-p)), so
        success  +sqrt((G-1)/G) sqrt((1-p)/p)       failure  -sqrt((G-1)/G) sqrt(p/(1-p))
    Masses per rollout: m_S = m_F = sqrt((G-1)/G) sqrt(p(1-p)) (peak at p = 1/2, but much
    flatter than Dr. GRPO's p(1-p): dividing by the std boosts near-solved and
    near-unsolved groups, the "difficulty bias" Dr. GRPO removes).
    Zero-sum. All-equal groups: exactly 0 (std = 0 there, we never divide 0 by eps and
    call it a signal). G = 1: torch.std of one element is NaN; we return 0 instead.
    Example: G = 8, c = 2 -> success +1.620, failure -0.540.
    eps = 1e-6 (TRL uses 1e-4, verl 1e-6; it only matters for near-constant rewards).
    """
    centred = _centred(rewards)
    if rewards.shape[1] == 1:
        return centred  # zeros
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


@register(rewards="binary")
def psr(rewards: Tensor) -> Tensor:
    """Positive sample reinforcement (Zhu et al. 2025, arXiv 2506.01347).

    A_i = 1 on correct rollouts; wrong rollouts are dropped (A_i = 0).
    Binary only. Masses per rollout: m_S = p, m_F = 0: maximally success-biased, the
    "positive-only" training the Cancellation Hypothesis paper compares critic-free RL
    with. Nothing cancels: a template token is pushed up in every correct rollout.
    All-correct groups get 1 everywhere, all-wrong 0. Works with G = 1.
    """
    return rewards.clone()


@register(rewards="binary")
def nsr(rewards: Tensor) -> Tensor:
    """Negative sample reinforcement (Zhu et al. 2025, arXiv 2506.01347).

    A_i = -1 on wrong rollouts, 0 on correct ones. Binary only.
    Masses per rollout: m_S = 0, m_F = 1 - p: purely failure-driven. The paper finds it
    keeps entropy (and pass@k at large k) up in real training; its explanation is that
    pushing down a wrong answer spreads its probability over all alternatives instead of
    onto one. (Under SGD on logits the mass imbalance has no first-order effect on
    entropy in expectation, docs/math.md §2.3: the effect is an optimizer-level one.)
    All-wrong groups get -1 everywhere, all-correct 0. Works with G = 1.
    """
    return rewards - 1.0


@register(rewards="binary")
def w_reinforce(rewards: Tensor, lam: float = 0.1) -> Tensor:
    """Weighted REINFORCE (Zhu et al. 2025, arXiv 2506.01347): mostly-negative training.

    A_i = +lam on correct rollouts, -1 on wrong ones; lam = 0.1 as in the paper.
    Binary only. Masses per rollout: m_S = lam p, m_F = 1 - p.
    Not zero-sum; all-correct groups get +lam, all-wrong -1. Works with G = 1.
    Needs lam >= 0.
    """
    return torch.where(rewards > 0, torch.full_like(rewards, lam), torch.full_like(rewards, -1.0))


@register()
def asymre(rewards: Tensor, dV: float = -0.1) -> Tensor:
    """Asymmetric REINFORCE (Arnal et al. 2025, arXiv 2506.20520).

    A_i = r_i - (mean_j r_j + dV).   Binary: correct 1 - p - dV, wrong -p - dV.
    [recon] The paper shifts the baseline by dV; its choice of baseline for LLMs is not
    public, so we use the group mean (as Dr. GRPO) and dV = -0.1 (docs/math.md §1).
    A negative dV lowers the baseline: every rollout gets +0.1 extra, so the update is
    success-biased (m_S > m_F) and NOT zero-sum: an all-equal group gets -dV = +0.1 on
    every rollout, and shared tokens no longer cancel (by G * |dV| per group).
    """
    return _centred(rewards) - dV


@register(zero_sum=True, rewards="unit")
def focal(rewards: Tensor, gamma: float = 1.0, eps: float = 1e-6) -> Tensor:
    """Focal GRPO, F-GRPO (Plyusov et al. 2026, arXiv 2602.06717).

    A_i = (1 - p)^gamma * grpo_i, with p the group solve rate.
    Down-weights easy prompts (p near 1) like the focal loss of object detection
    (Lin et al. 2017). Binary masses per rollout: (1-p)^gamma sqrt((G-1)/G) sqrt(p(1-p))
    each. gamma = 1 by default: the paper's default is not in the abstract we have.
    Zero-sum (a per-group scale of a zero-sum advantage). All-equal groups: 0.
    Needs rewards in [0, 1] and gamma >= 0.
    """
    return (1.0 - _solve_rate(rewards)) ** gamma * grpo(rewards, eps=eps)


@register(zero_sum=True, rewards="unit")
def power(rewards: Tensor, alpha: float = 2.0) -> Tensor:
    """The FADE paper's difficulty probe: a power of (1 - p) on Dr. GRPO's advantage.

    A_i = (1 - p)^(alpha - 1) * (r_i - p).
    Binary: correct (1-p)^alpha, wrong -p (1-p)^(alpha-1).
    Masses per rollout: m_S = m_F = p (1-p)^alpha; the total peaks at p = 1/(1 + alpha)
    (d/dp [p (1-p)^alpha] = 0). alpha = 1 is Dr. GRPO (peak 1/2); alpha = 2 focuses on
    hard prompts (peak 1/3), sharper signal but fewer prompts carry it (lower effective
    sample size). Zero-sum; all-equal groups 0. Needs rewards in [0, 1] and alpha > 0.
    The paper reports alpha = 2 beats GRPO on LiveCodeBench (40.3 vs 37.4 pass@1 at 7B).
    """
    # alpha < 1 makes (1 - p)^(alpha - 1) infinite on all-correct groups (inf * 0 = NaN):
    # those groups carry no signal, so they are zeroed after the product.
    scaled = (1.0 - _solve_rate(rewards)) ** (alpha - 1.0) * _centred(rewards)
    return scaled.masked_fill(_constant_groups(rewards), 0.0)


@register()
def asym(rewards: Tensor, delta: float = 0.5) -> Tensor:
    """The FADE paper's sign probe: Dr. GRPO with failures scaled by 1/delta.

    A_i = (r_i - p) if r_i > p, (r_i - p) / delta if r_i < p.
    Masses per rollout: m_S = p(1-p), m_F = p(1-p)/delta. delta < 1 is failure-biased
    (the FADE paper: keeps entropy up), delta > 1 success-biased. delta = 0.5 here is an
    arbitrary probe value (FADE's own delta lives in [0.3, 1]). Whether the bias moves
    entropy depends on the optimizer (docs/math.md §2.3: not at first order under SGD).
    NOT zero-sum unless delta = 1: the group sums to p(1-p) G (1 - 1/delta), so a shared
    token gets a net push down when delta < 1. This is the price FADE pays, on purpose,
    for its entropy control. All-equal groups: 0. Needs delta > 0.
    """
    centred = _centred(rewards)
    return torch.where(centred < 0, centred / delta, centred)


@register(zero_sum=True, rewards="unit")
def fade(rewards: Tensor, alpha: float = 1.0, delta: float = 1.0) -> Tensor:
    """FADE: Focal Advantage with Dynamic Entropy (Decugis et al. 2026, arXiv 2607.01490).

    A_i = (1 - p)^(alpha - 1) * (r_i - p), divided by delta where r_i < p.
    Binary: correct (1-p)^alpha, wrong -p(1-p)^(alpha-1) / delta.
    Masses per rollout: m_S = p(1-p)^alpha, m_F = p(1-p)^alpha / delta.
    It is `power` on the difficulty axis and `asym` on the sign axis; scheduler.py sets
    alpha (hard focus while prompts are hard: alpha = 3 at p_hat <= 1/3, 1 from 0.6) and
    delta (amplify failures when entropy falls below its target) every step.
    alpha = delta = 1 is exactly Dr. GRPO (`mean`). With delta < 1 the group no longer
    sums to zero: FADE trades some cancellation for entropy control (docs/math.md §4).
    All-equal groups: 0. Needs rewards in [0, 1], alpha > 0, delta > 0.
    """
    centred = (1.0 - _solve_rate(rewards)) ** (alpha - 1.0) * _centred(rewards)
    centred = centred.masked_fill(_constant_groups(rewards), 0.0)   # alpha < 1: inf * 0
    return torch.where(centred < 0, centred / delta, centred)


@register(zero_sum=True, rewards="binary", min_group_size=2)
def passk(rewards: Tensor, k: int = 4) -> Tensor:
    """Analytic pass@k advantage (Chen et al. 2025, arXiv 2508.10751).

    Train for pass@k instead of pass@1: a group's reward is the unbiased pass@k of its
    c correct out of G, R = 1 - C(G-c, k) / C(G, k), and each rollout gets the analytic
    advantage of its membership in the k-subsets, normalised by s = sqrt(R (1 - R)):
        correct   (1 - R) / s
        wrong     (1 - R - C(G-c-1, k-1) / C(G-1, k-1)) / s
    Zero-sum: (G-c) C(G-c-1, k-1)/C(G-1, k-1) = G (1 - R). When G - c < k every k-subset
    already contains a success (R = 1, s = 0) and we return 0; c = 0 gives R = 0 and 0.
    k = 1 reduces to GRPO with a population (ddof=0) std. Binary only; needs G >= 2 and
    1 <= k <= G.
    """
    G = rewards.shape[1]
    out = torch.zeros_like(rewards)
    for n, c in enumerate(rewards.sum(dim=1).round().long().tolist()):
        if c == 0 or G - c < k:
            continue
        R = 1.0 - math.comb(G - c, k) / math.comb(G, k)
        s = math.sqrt(R * (1.0 - R))
        a_pos = (1.0 - R) / s
        a_neg = (1.0 - R - math.comb(G - c - 1, k - 1) / math.comb(G - 1, k - 1)) / s
        out[n] = torch.where(rewards[n] > 0, rewards.new_tensor(a_pos), rewards.new_tensor(a_neg))
    return out


@register(rewards="binary", min_group_size=2)
def pkpo(rewards: Tensor, k: int = 4) -> Tensor:
    """Unbiased pass@k gradient weights, PKPO (Walder & Karkhanis 2025, arXiv 2505.15201).

    Binary rewards, leave-one-out-minus-one form: a correct rollout gets
        C(G - c, k - 1) / C(G, k)
    the share of k-subsets in which it is the ONLY success (so it alone decides
    pass@k there); a wrong rollout gets 0. Not zero-sum; masses per rollout
    m_S = p C(G-c, k-1)/C(G, k), m_F = 0. The weight falls fast as c grows: PKPO spends
    its signal on prompts with few successes. All-correct groups get 0 for k >= 2 (every
    subset has another success), all-wrong groups 0. k = 1: every success gets 1/G.
    Binary only; needs G >= 2 and 1 <= k <= G.
    """
    G = rewards.shape[1]
    c = rewards.sum(dim=1).round().long().tolist()
    w = torch.tensor([math.comb(G - ci, k - 1) / math.comb(G, k) for ci in c],
                     dtype=rewards.dtype).unsqueeze(1)
    return rewards * w


@register(zero_sum=True, rewards="nonnegative")
def maxrl(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Maximum-likelihood RL, MaxRL (Tajwar et al. 2026, arXiv 2602.02710).

    A_i = (r_i - p) / (p + eps).   Binary: correct (1 - p)/p, wrong -1.
    Dividing by p turns the expected update into the gradient of log p (the
    log-likelihood of success) instead of p: hard prompts (small p) get large weights.
    Masses per rollout: m_S = m_F = 1 - p (monotone in difficulty: peak at p -> 0).
    Zero-sum; all-equal groups 0 (all-wrong: 0, not 0/eps). Needs rewards >= 0.
    """
    return _centred(rewards) / (_solve_rate(rewards) + eps)


@register(zero_sum=True)
def risk(rewards: Tensor, beta: float = 2.0) -> Tensor:
    """Risk-sensitive advantage (Jiang et al. 2025, arXiv 2509.24261).

    A_i = (exp(beta r_i) / mean_j exp(beta r_j) - 1) / beta.
    The exponential utility's gradient: beta > 0 is risk-seeking (it rewards rare
    successes on hard prompts more, as pass@k methods do); beta -> 0 recovers r_i - p.
    Binary, with Z = p e^beta + (1 - p):  correct (e^beta / Z - 1)/beta,
    wrong (1/Z - 1)/beta. Zero-sum (sum_i exp/mean = G). All-equal groups: 0.
    beta = 2 (docs/math.md §1). Needs beta != 0.
    """
    # Subtract the group max before exp: same ratio, no overflow for large beta * r.
    z = beta * rewards
    e = torch.exp(z - z.max(dim=1, keepdim=True).values)
    adv = (e / e.mean(dim=1, keepdim=True) - 1.0) / beta
    return adv.masked_fill(_constant_groups(rewards), 0.0)


WHITENINGS = ("rollout", "token")
"""reinforce_pp's whitening: over the batch's rollouts (ours, the default) or over its tokens (the paper's)."""


@register(zero_sum=True, reads_lengths=True)
def reinforce_pp(rewards: Tensor, eps: float = 1e-6, whiten: str = "rollout", lengths: Tensor | None = None) -> Tensor:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv 2501.03262).

    x_i = r_i - mean_group(r), then whitened over the whole batch (std with ddof=1), either
      whiten="rollout"  every rollout counts once (our default, a choice against the paper):
                        A = (x - mean_i x) / (std_i x + eps)
      whiten="token"    every TOKEN counts once, as the REINFORCE++ equation normalises over
                        the batch's tokens and verl's reinforce_plus_plus_baseline does
                        (masked_whiten): rollout i counts L_i = lengths[n, g] times,
                        m = sum_i L_i x_i / sum_i L_i,  s^2 = sum_i L_i (x_i - m)^2 / (sum_i L_i - 1),
                        A = (x - m) / (s + eps)
    One global scale instead of GRPO's per-group std: groups keep their relative weight
    (a 4/8 group outweighs a 1/8 group, unlike GRPO).
    Why per rollout by default: (1) mean_i x is 0 up to rounding, every group's x summing
    to 0, so each group stays zero-sum and a shared token cancels (module header); per
    token, m != 0 once lengths differ, every advantage moves by -m/s and a group sums to
    -G m/s (zero-sum only at equal lengths); (2) a rollout's weight does not depend on how
    long the OTHER rollouts ran; (3) it is what this project's runs used. At equal lengths
    T the two differ only in scale, exactly (eps = 0): A_token / A_rollout =
    sqrt((BT - 1) / (T (B - 1))), B = N G (a token std of BT - 1 degrees of freedom over
    T copies of each x_i). All-equal groups: exactly 0 under both (verl's per-token leaves
    them at -m/s, the other groups' shift). A batch whose groups are all constant, or
    whose rollouts hold fewer than 2 tokens: 0.
    Caution: the result depends on the whole batch, so compute it once per rollout batch,
    never per micro-batch. lengths: [N, G], tokens per rollout, read only by "token"
    (ValueError without them); a rollout of 0 tokens counts for nothing in m and s.
    """
    x = _centred(rewards)
    if whiten == "token" and lengths is None:
        raise ValueError("reinforce_pp: whiten='token' weighs each rollout by its tokens: it needs the rollouts' "
                         "lengths ([N, G], compute_advantages' `lengths`)")
    if whiten == "rollout":
        if x.numel() < 2 or not bool((x != 0).any()):
            return torch.zeros_like(x)
        adv = (x - x.mean()) / (x.std() + eps)
        return adv.masked_fill(_constant_groups(rewards), 0.0)
    L = lengths.to(x)                         # the rewards' dtype and device
    n = L.sum()
    if n < 2 or not bool((x != 0).any()):
        return torch.zeros_like(x)
    mean = (L * x).sum() / n
    std = ((L * (x - mean) ** 2).sum() / (n - 1)).sqrt()
    adv = (x - mean) / (std + eps)
    return adv.masked_fill(_constant_groups(rewards), 0.0)


# ---------------------------------------------------------------------------------------
# The registry and the door: compute_advantages is the one place that checks input
# ---------------------------------------------------------------------------------------

# Hyper-parameter ranges: name -> (test(value, G), what it needs, what it is). Every
# hyper-parameter of the chosen method is checked, defaults included (passk's default k = 4
# fails at G = 3). "What it is" is the help of its train.py flag, which machinery/config.py
# makes from the signatures above and this table: a new hyper-parameter needs only its
# function's keyword argument and its row here.
# The upper bounds catch a slip (1e30, a lost decimal point) before it trains nothing:
# each sits a round factor past the published values, where the weights have collapsed
# onto one kind of group or rollout, or into another method that exists under its own
# name, and well before they underflow to 0 (no update) or overflow to inf (a gradient
# norm of inf). Under Adam an advantage's overall scale hardly matters; its shape does.
HYPER_RANGES = {
    # A guard added to a denominator: the group's std (grpo, focal, reinforce_pp: >= 0.35
    # for binary rewards at G = 8) or solve rate (maxrl: >= 1/G). At 0.01 it moves a
    # 1-in-8 group's maxrl weight by 7%; at 1e30 it divides every advantage to ~0.
    "eps": (lambda v, G: is_finite_number(v) and 0 < v <= 0.01, "a finite eps (--adv_eps) in (0, 0.01]",
            "the guard eps added to a denominator"),
    # (1 - p)^(alpha - 1): FADE moves alpha in [1, 3], the power probe uses 2. At 10 a
    # success in a group solved 1 in 8 already weighs 5x one in a group solved 2 in 8 and
    # 3e8x one solved 7 in 8; near 775 every float32 weight underflows to 0 (G = 8; 1e30:
    # grad_norm 0, nothing trained).
    "alpha": (lambda v, G: is_finite_number(v) and 0 < v <= 10, "a finite alpha in (0, 10]",
              "difficulty exponent, A = (1-p)^(alpha-1) (r - p) (--schedule fade moves it)"),
    # Failures are divided by delta (asym, fade; FADE keeps it in [0.3, 1]): past 1000 or
    # below 0.001 one side carries under 0.1% of the update, and the method is psr or nsr.
    "delta": (lambda v, G: is_finite_number(v) and 1e-3 <= v <= 1e3, "a finite delta in [0.001, 1000]",
              "a failure's advantage is divided by delta (--schedule fade moves it)"),
    # A success's weight against a failure's -1 (the paper: 0.1). Past 100 a failure
    # carries under 1% of a success's push, and the method is psr.
    "lam": (lambda v, G: is_finite_number(v) and 0 <= v <= 100, "a finite lam in [0, 100]",
            "the advantage of a success, failures get -1"),
    # focal's (1 - p)^gamma, the focal loss's exponent (Lin et al. use 2): at 10 a
    # success's weight spans 1e9 between a group solved 1 in 8 and one solved 7 in 8.
    "gamma": (lambda v, G: is_finite_number(v) and 0 <= v <= 10, "a finite gamma in [0, 10]",
              "the exponent of (1 - p) on GRPO's advantage"),
    # risk's utility exp(beta r): past |beta| ~ 20 e^-|beta| is ~0 and the weights are
    # maxrl's divided by |beta| (risk-seeking) or its mirror; larger only shrinks them,
    # and past ~1e8 they sink under Adam's eps (1e30: grad_norm 0). beta = 0 divides by 0.
    "beta": (lambda v, G: is_finite_number(v) and 0 < abs(v) <= 100,
             "a finite beta (--risk_beta) with 0 < |beta| <= 100", "the exponential utility's beta, > 0 risk-seeking"),
    # asymre's shift of the baseline: a success gets 1 - p - dV, a failure -p - dV. At
    # dV <= -1 every failure is pushed UP, in every group; at dV >= 1 every success down.
    "dV": (lambda v, G: is_finite_number(v) and -1 < v < 1, "a finite dV in (-1, 1)",
           "the shift of the baseline, A = r - (mean r + dV)"),
    "k": (lambda v, G: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= G,
          "an integer k in [1, G={G}]", "the k of pass@k (at most --group_size)"),
    # Not a number: which of REINFORCE++'s two normalisations (reinforce_pp says why two).
    "whiten": (lambda v, G: isinstance(v, str) and v in WHITENINGS, "whiten one of " + ", ".join(WHITENINGS),
               "whiten the group-centred rewards over the batch's rollouts (ours) or its tokens (the paper's, verl's)"),
}


def hyper_parameters(fn) -> list[inspect.Parameter]:
    """The hyper-parameters of an advantage function: its keyword arguments but `lengths`
    (data its reads_lengths property says it takes). Each is a flag (machinery/config.py)."""
    return [p for p in list(inspect.signature(fn).parameters.values())[1:] if p.name != "lengths"]


def compute_advantages(name: str, rewards: Tensor, lengths: Tensor | None = None, **hyper) -> Tensor:
    """The validated entry point: ADVANTAGES[name](rewards, **hyper), with `lengths` for one that reads them.

    The one place that checks input; each check raises a one-line ValueError naming the
    bad value, in this order:
      1. an unknown name, or a hyper-parameter the method does not take (naming the
         accepted ones), instead of a TypeError deep inside a training step;
      2. rewards: a torch.Tensor [N, G], non-empty, finite; NaN/inf reported with the first
         position (a NaN reward almost always means a crashed verifier: never train on 0);
      3. the method's reward domain (its `rewards` property, REWARD_DOMAINS), with the
         first offending value and position;
      4. its group size (its `min_group_size`);
      5. every hyper-parameter, defaults included, against HYPER_RANGES;
      6. lengths, if given: [N, G] like rewards, finite, >= 0 (the rollouts' response tokens).
         Passed on to an advantage whose reads_lengths is set, ignored by the others (a
         trainer may always pass them).
    Integer rewards become float (torch's default float dtype); float32 stays float32.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage {name!r}; choose from {', '.join(ADVANTAGES)}")
    fn = ADVANTAGES[name]
    params = hyper_parameters(fn)
    accepted = [p.name for p in params]
    for key in hyper:
        if key not in accepted:
            raise ValueError(f"advantage {name!r} takes no hyper-parameter {key!r}; it takes {accepted or 'none'}")
    rewards = _check_rewards(rewards, name)
    if fn.rewards != "real":
        ok, what = REWARD_DOMAINS[fn.rewards]
        _require_rewards(ok(rewards), rewards, name, what)
    G = rewards.shape[1]
    if G < fn.min_group_size:
        raise ValueError(f"{name}: needs G >= {fn.min_group_size} rollouts per prompt, got G={G}")
    for p in params:
        value = hyper.get(p.name, p.default)
        if p.name not in HYPER_RANGES:                  # a new advantage's new hyper-parameter
            raise ValueError(f"{name}: its hyper-parameter {p.name!r} has no range in advantages.HYPER_RANGES "
                             "(docs/extending.md, 'Add an advantage')")
        ok, what, _ = HYPER_RANGES[p.name]
        if not ok(value, G):
            raise ValueError(f"{name}: needs {what.format(G=G)}, got {value!r}")
    if lengths is not None:
        if not (isinstance(lengths, Tensor) and lengths.shape == rewards.shape):
            raise ValueError(f"{name}: lengths must be a tensor shaped like rewards {tuple(rewards.shape)}, got "
                             f"{tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__}")
        _require_rewards(torch.isfinite(lengths) & (lengths >= 0), lengths, name, "lengths must be finite and >= 0")
    if fn.reads_lengths:
        hyper = {**hyper, "lengths": lengths}
    return fn(rewards, **hyper)


def _check_rewards(rewards: Tensor, name: str) -> Tensor:
    """Validate a [N, G] reward tensor and return it as float (float32 stays float32)."""
    if not isinstance(rewards, Tensor):
        raise ValueError(f"{name}: rewards must be a torch.Tensor of shape [N, G], got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"{name}: rewards must have shape [N, G], got shape {tuple(rewards.shape)}")
    if rewards.numel() == 0:
        raise ValueError(f"{name}: rewards is empty, shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    _require_rewards(torch.isfinite(rewards), rewards, name, "rewards must be finite")
    return rewards


def _require_rewards(ok: Tensor, rewards: Tensor, name: str, what: str) -> None:
    """Raise "{name}: {what}, got {value} at [n, g]" at the first reward where ok is False."""
    if not ok.all():
        n, g = (int(v) for v in (~ok).nonzero()[0])
        raise ValueError(f"{name}: {what}, got {rewards[n, g].item()} at [{n}, {g}]")


def is_finite_number(v) -> bool:
    """A finite real number, not a bool: the base of every float range in HYPER_RANGES (and
    in scheduler.py's CONFIG_RANGES)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
