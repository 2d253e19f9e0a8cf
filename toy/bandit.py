"""The bandit analog of an LLM: a tiny token model where cancellation is computable exactly.

A prompt's response is L tokens. Position t offers a small MENU of tokens:

    position   0        1          2        3          4
    menu       Let|let  2|3|5|7    so|So    2|3|5|7    ans|Ans
               template reasoning  template reasoning  template

Template positions almost always emit their template token ("Let", "so", "ans"); the
capitalised variant is a rare, harmless format slip. Reasoning positions choose digits,
and the reward is 1 iff the two digits are a correct pair (CORRECT_PAIRS). So the
reward never depends on a template token: any net update a template token receives is
reward-irrelevant drift, which is exactly what the Cancellation Hypothesis and the
design-conditions papers are about.

The policy is an LM's output layer in miniature. At position t the logit of token a is

    z_t(a) = b[a] + W[a] . h_t + beta_t(a)

- b [V] a per-token bias and W [V, d] a low-rank output layer: SHARED across positions
  and responses, so two occurrences of the same token are coupled through b[a] and W[a]
  exactly as they are through an LM's unembedding matrix;
- h_t [d] a fixed feature of position t (the "hidden state"; context-free on purpose, so
  identical tokens at the same position share their context across rollouts);
- beta_t fixed per-position offsets (how strongly the template is expected there).
p_t = softmax of z_t over the menu of position t. Positions are independent, so the
probability of a response is a product and all 2*4*2*4*2 = 128 responses can be
enumerated: every expectation in this folder is an exact sum, not a sample mean.

Why context-free positions make the cancellation identity exact: d log pi(o) / d b[a] =
n_a(o) - sum_t p_t(a), and the second term is the same for every response (it does not
depend on which tokens were sampled). Multiply by A_i and sum over a group with
sum_i A_i = 0: the update of b[a] is sum_i A_i n_a(o_i) = G Cov(A, n_a). A token every
rollout contains equally often (a template) gets exactly 0; a token more frequent in
successes gets positive credit. (Spec section 6, "implicit token credit".)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

import advantages as adv_lib

TOKENS = ["Let", "let", "so", "So", "ans", "Ans", "2", "3", "5", "7"]
IDX = {t: i for i, t in enumerate(TOKENS)}
V = len(TOKENS)
MENUS = [["Let", "let"], ["2", "3", "5", "7"], ["so", "So"], ["2", "3", "5", "7"], ["ans", "Ans"]]
L = len(MENUS)
TEMPLATE_POSITIONS = (0, 2, 4)
TEMPLATE_TOKENS = ("Let", "so", "ans")
REASONING_TOKENS = ("2", "3", "5", "7")
# "x + y = 10" with the digits on the menu: 3+7, 7+3, 5+5 are correct (3 of 16 pairs).
CORRECT_PAIRS = {("3", "7"), ("7", "3"), ("5", "5")}
D = 3   # width of the low-rank output layer


@dataclass
class Policy:
    """Trainable b [V], W [V, D]; fixed position features H [L, D] and offsets beta [L, V]."""

    b: Tensor
    W: Tensor
    H: Tensor
    beta: Tensor

    def parameters(self) -> list[Tensor]:
        return [self.b, self.W]

    def clone(self) -> "Policy":
        return Policy(self.b.detach().clone().requires_grad_(True), self.W.detach().clone().requires_grad_(True),
                      self.H, self.beta)


def make_policy(seed: int = 0, template_logit: float = 3.5) -> Policy:
    """Initial policy: template tokens at ~97% on their positions, digits near-uniform.

    Deterministic in seed. float64 throughout, so identities hold to ~1e-15.
    """
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(L, D, generator=g, dtype=torch.float64)
    H = H / H.norm(dim=1, keepdim=True)
    beta = torch.full((L, V), -math.inf, dtype=torch.float64)
    for t, menu in enumerate(MENUS):
        for tok in menu:
            beta[t, IDX[tok]] = template_logit if tok in TEMPLATE_TOKENS else 0.0
    b = (0.3 * torch.randn(V, generator=g, dtype=torch.float64)).requires_grad_(True)
    W = (0.3 * torch.randn(V, D, generator=g, dtype=torch.float64)).requires_grad_(True)
    return Policy(b, W, H, beta)


def position_logprobs(policy: Policy) -> Tensor:
    """[L, V] log p_t(a); -inf off the menu. Differentiable in b and W."""
    z = policy.b.unsqueeze(0) + policy.H @ policy.W.T + policy.beta
    return torch.log_softmax(z, dim=1)


def all_responses() -> Tensor:
    """[128, L] token ids of every response (the whole sample space)."""
    return torch.tensor([[IDX[t] for t in combo] for combo in itertools.product(*MENUS)])


def reward(responses: Tensor) -> Tensor:
    """[R] 1.0 iff the two reasoning digits are a correct pair; templates never matter."""
    return torch.tensor([float((TOKENS[r[1]], TOKENS[r[3]]) in CORRECT_PAIRS) for r in responses.tolist()],
                        dtype=torch.float64)


def token_logprobs(policy: Policy, responses: Tensor) -> Tensor:
    """[R, L] log p_t(o_t) of each response's tokens (the per-token logp loss.py takes)."""
    lp = position_logprobs(policy)
    return lp[torch.arange(L).unsqueeze(0), responses]


def response_probs(policy: Policy, responses: Tensor | None = None) -> Tensor:
    """[R] pi(o) of each response (default: all 128; they sum to 1)."""
    responses = all_responses() if responses is None else responses
    return token_logprobs(policy, responses).sum(1).exp()


def solve_rate(policy: Policy) -> float:
    """p = P(reward = 1) under the policy, exactly."""
    with torch.no_grad():
        return float((response_probs(policy) * reward(all_responses())).sum())


def token_counts(responses: Tensor) -> Tensor:
    """[R, V] n_a(o): how often token a occurs in each response."""
    return torch.nn.functional.one_hot(responses, V).sum(1).double()


def sample_groups(policy: Policy, n_groups: int, G: int, seed: int) -> Tensor:
    """[n_groups * G, L] responses sampled from the policy (one deterministic draw)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        probs = position_logprobs(policy).exp()
    cols = [torch.multinomial(probs[t], n_groups * G, replacement=True, generator=g) for t in range(L)]
    return torch.stack(cols, dim=1)


def expected_advantage_by_reward(name: str, p: float, G: int, **hyper) -> tuple[float, float]:
    """(a_1, a_0): the expected advantage of a success and of a failure at solve rate p.

    In a group of G independent rollouts, rollout i's advantage depends on its own reward
    r_i and on the c' successes among the other G-1 (c' ~ Binomial(G-1, p)), so

        E[A_i grad log pi(o_i)] = a_1 E[grad log pi 1(r=1)] + a_0 E[grad log pi 1(r=0)]
        a_r = sum_{c'} Binom(c'; G-1, p) * A(reward r in a group with c' + r successes)

    The A values come from CALLING the project's advantage on synthetic groups, so this
    is exact for every registered advantage of binary rewards.
    """
    rewards = (torch.arange(G).unsqueeze(0) < torch.arange(G + 1).unsqueeze(1)).double()   # row c: c ones
    A = adv_lib.compute_advantages(name, rewards, **hyper)
    a1 = a0 = 0.0
    for c in range(G):   # c = successes among the other G - 1
        w = math.comb(G - 1, c) * p ** c * (1 - p) ** (G - 1 - c)
        a1 += w * float(A[c + 1, 0])          # a success in a group with c + 1 successes
        a0 += w * float(A[c, G - 1])          # a failure in a group with c successes
    return a1, a0


def expected_update(policy: Policy, name: str, G: int = 8, **hyper) -> list[Tensor]:
    """Exact expected per-rollout policy-gradient E[A_i grad log pi(o_i)] w.r.t. (b, W).

    Sums over all 128 responses, weighted by pi(o), using expected_advantage_by_reward.
    Returns [grad_b [V], grad_W [V, D]] (an ascent direction).
    """
    responses = all_responses()
    r = reward(responses)
    probs = response_probs(policy, responses).detach()
    a1, a0 = expected_advantage_by_reward(name, float((probs * r).sum()), G, **hyper)
    weight = probs * torch.where(r > 0, torch.tensor(a1, dtype=torch.float64), torch.tensor(a0, dtype=torch.float64))
    objective = (weight * token_logprobs(policy, responses).sum(1)).sum()
    return list(torch.autograd.grad(objective, policy.parameters()))


def entropy_per_position(policy: Policy) -> Tensor:
    """[L] entropy of each position's distribution (nats)."""
    with torch.no_grad():
        lp = position_logprobs(policy)
        p = lp.exp()
        return -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(1)
