"""The bandit analog of an LLM: a three-token "language model" whose every expectation is a finite sum.

A prompt asks for two digits that sum to 10. A response is three tokens,

    position   0            1             2
    menu       Let | let    3 | 6 | 7     3 | 6 | 7
    role       template     reasoning     reasoning

and its reward is 1 iff the two digits sum to 10 (3+7 or 7+3; "6" is in no correct
response, 6+6 = 12). "Let" is the TEMPLATE: almost every response starts with it, and
the reward never reads it. "let" is a harmless format slip; it exists only so that the
template's probability is below 1 (a token the model emits with probability 1 has
gradient 0 and nothing to cancel). Any net update "Let" receives is reward-irrelevant
drift, which is what the cancellation papers are about.

The policy is an LM's output layer in miniature. The logit of token a at position t is

    z_t(a) = W[a] . h_t + beta_t(a)            p_t = softmax over the menu of position t

- W [V, D] is the only trainable tensor, SHARED across positions and responses: two
  occurrences of the same token are coupled through W[a] exactly as in an LM's
  unembedding matrix (docs/math.md §6.3, "coupling").
- h_t [D] is a fixed "hidden state" of position t with h_t[0] = 1, so W[a, 0] acts as
  token a's own logit offset, the same at every position ("the token's logit").
  The context is position-only on purpose: the same token at the same position has
  the same gradient in every rollout, which is the premise of exact cancellation.
- beta_t [V] is fixed: -inf off the menu, and the template's offset, chosen so the
  template has exactly the probability you ask for at initialisation.

Positions are independent, so pi(o) = prod_t p_t(o_t) and all K = 2*3*3 = 18 responses
can be listed. A group of G = 4 rollouts is a multiset of responses; there are
C(K+G-1, G) = 5985 of them, each with probability

    P(group) = G! / prod_k m_k!  *  prod_k pi(o_k)^m_k        (m_k = copies of response k)

(the multinomial law; ordered 4-tuples would be 18^4 = 104,976, the same sums). The
expectations of experiments 1, 2, 3 and 5a are sums over these groups, exact to float
rounding; experiments 4 and 5b-c sample, with fixed seeds.

Early-stop variant (`make_bandit(early_stop=True)`, experiment 3): the second digit's menu
also holds "<eos>", which ends the response after one digit (a short response, always
wrong); complete responses end with "<eos>" too. Lengths are then 3 or 4 tokens, which
is what per-sequence length normalisation needs to misbehave.

Filler variant (`make_bandit(n_filler=F)`, experiment 5): F positions between the template
and the digits, each choosing among the filler words "so" | "we" | "then", near-uniformly
(low confidence). The reward never reads them, every rollout has F of them, and the same
word at two filler positions shares its row W[a]. That is what an LLM response mostly
consists of: reward-irrelevant tokens that positive and negative rollouts share, coupled
through the output layer, around a few decisive ones (here 2 of F + 3). Its 2 * 3^F * 9
responses are too many to list (6e8 at F = 16), so this variant is SAMPLED token by
token (`sample_tokens`; positions are independent, so that is exact sampling from pi)
and its `responses`, `mask` and `reward` are None.

Conventions: float64 everywhere (identities then hold to ~1e-16); natural log; G = 4.
Functions over classes: a `Bandit` is a frozen description, `W` a plain tensor.

The toy's two analogs: this one (tokens and a shared output layer: cancellation,
coupling, flips; experiments 1-5), and toy/answers.py (a prompt as one softmax over its
final answers: no tokens, but entropy to lose; FADE's experiments 6 and 7).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

import aggregation
import loss as loss_lib

VOCAB = ("Let", "let", "3", "6", "7", "<eos>", "so", "we", "then")
IDX = {tok: i for i, tok in enumerate(VOCAB)}
V = len(VOCAB)
TEMPLATE, SLIP, EOS = "Let", "let", "<eos>"
DIGITS = ("3", "6", "7")
FILLERS = ("so", "we", "then")     # used only by the filler variant; their rows of W are idle otherwise
TARGET_SUM = 10
G = 4            # rollouts per group, everywhere in the toy
D = 3            # width of the output layer (h_t[0] = 1 is the bias coordinate)
DTYPE = torch.float64


@dataclass(frozen=True)
class Bandit:
    """The fixed part of the analog. Shapes: L positions, K responses, V tokens, D features."""

    menus: tuple            # per position, the tokens that position may emit
    H: Tensor               # [L, D] position features, H[:, 0] = 1
    beta: Tensor            # [L, V] fixed logit offsets, -inf off the menu
    responses: Tensor | None  # [K, L] token ids, padded with <eos> after the end (None: filler variant)
    mask: Tensor | None       # [K, L] 1.0 on real response tokens (incl. a final <eos>)
    reward: Tensor | None     # [K] 1.0 iff the two digits sum to 10

    @property
    def L(self) -> int:
        return self.H.shape[0]

    @property
    def K(self) -> int:
        if self.responses is None:
            raise ValueError("the filler variant does not list its responses; sample them with sample_tokens")
        return self.responses.shape[0]


def make_bandit(template_prob: float = 0.9, early_stop: bool = False, seed: int = 0,
                n_filler: int = 0) -> tuple[Bandit, Tensor]:
    """The analog and its initial weights W [V, D] (float64, deterministic in seed).

    template_prob: the probability of "Let" at position 0 under the initial W, exactly
    (beta_0("Let") absorbs whatever the random W gives). Must be in (0, 1).
    n_filler: reward-irrelevant filler positions after the template (module header), >= 0;
    with n_filler > 0 the responses are not listed (sample them) and early_stop is refused.
    Digits start near uniform (W is small): the solve rate is 0.30 at seed 0 (2/9 if uniform).
    The random draws are ordered so that n_filler = 0 gives the same analog as before
    the filler variant existed (the filler rows of W are drawn last).
    """
    if not 0.0 < template_prob < 1.0:
        raise ValueError(f"template_prob must be in (0, 1), got {template_prob}")
    if isinstance(n_filler, bool) or not isinstance(n_filler, int) or n_filler < 0:
        raise ValueError(f"n_filler must be an int >= 0, got {n_filler!r}")
    if n_filler and early_stop:
        raise ValueError("the filler variant is sampled position by position; early_stop=True cannot be")
    gen = torch.Generator().manual_seed(seed)
    menus = [(TEMPLATE, SLIP)] + [FILLERS] * n_filler + [DIGITS, DIGITS + ((EOS,) if early_stop else ())]
    if early_stop:
        menus.append((EOS,))          # a complete response ends here; p = 1, no gradient
    L = len(menus)
    H = torch.cat([torch.ones(L, 1, dtype=DTYPE), 0.7 * torch.randn(L, D - 1, generator=gen, dtype=DTYPE)], dim=1)
    n_base = VOCAB.index(FILLERS[0])
    W = 0.3 * torch.cat([torch.randn(n_base, D, generator=gen, dtype=DTYPE),
                         torch.randn(V - n_base, D, generator=gen, dtype=DTYPE)])
    beta = torch.full((L, V), -math.inf, dtype=DTYPE)
    for t, menu in enumerate(menus):
        beta[t, [IDX[tok] for tok in menu]] = 0.0
    # Choose beta_0(Let) so that p_0(Let) = template_prob exactly: the logit gap to "let"
    # must be log(q / (1 - q)), and W already contributes (W[Let] - W[let]) . h_0.
    gap_from_W = float((W[IDX[TEMPLATE]] - W[IDX[SLIP]]) @ H[0])
    beta[0, IDX[TEMPLATE]] = math.log(template_prob / (1 - template_prob)) - gap_from_W
    if n_filler:
        return Bandit(tuple(menus), H, beta, None, None, None), W
    responses, mask = _enumerate_responses(menus)
    return Bandit(tuple(menus), H, beta, responses, mask, reward_of(responses)), W


def reward_of(tokens: Tensor) -> Tensor:
    """[...] 1.0 iff a response [..., L] holds exactly two digits and they sum to 10 (float64)."""
    value = torch.tensor([float(tok) if tok in DIGITS else 0.0 for tok in VOCAB], dtype=DTYPE)
    is_digit = torch.tensor([tok in DIGITS for tok in VOCAB])
    two = is_digit[tokens].sum(-1) == 2
    return (two & (value[tokens].sum(-1) == TARGET_SUM)).to(DTYPE)


def _enumerate_responses(menus: list) -> tuple[Tensor, Tensor]:
    """Walk the tree of menus: every path is a response; "<eos>" ends a path early."""
    L = len(menus)
    open_paths, finished = [[]], []
    for menu in menus:
        open_paths = [path + [tok] for path in open_paths for tok in menu]
        finished += [p for p in open_paths if p[-1] == EOS]
        open_paths = [p for p in open_paths if p[-1] != EOS]
    finished += open_paths                        # paths that used every position
    ids = [[IDX[tok] for tok in p] + [IDX[EOS]] * (L - len(p)) for p in finished]
    mask = [[1.0] * len(p) + [0.0] * (L - len(p)) for p in finished]
    return torch.tensor(ids), torch.tensor(mask, dtype=DTYPE)


# ---------------------------------------------------------------------------------------
# The policy: log-probabilities, response and group probabilities
# ---------------------------------------------------------------------------------------

def logp_table(bandit: Bandit, W: Tensor) -> Tensor:
    """log p_t(a) for every position and token: [L, V], or [n, L, V] for a batch W [n, V, D].

    -inf off the menu. Differentiable in W. A batch of weights is how we get one
    gradient PER GROUP from a single backward pass (see `group_updates`).
    """
    z = W @ bandit.H.T                               # [..., V, L]
    return torch.log_softmax(z.transpose(-1, -2) + bandit.beta, dim=-1)


def token_logp(bandit: Bandit, W: Tensor, responses: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    """[R, L] log p_t(o_t) of each response's tokens, 0 on padding (the `logp` loss.py takes)."""
    responses = bandit.responses if responses is None else responses
    mask = bandit.mask if mask is None else mask
    lp = logp_table(bandit, W)
    picked = lp[torch.arange(bandit.L).unsqueeze(0), responses]
    return torch.where(mask > 0, picked, torch.zeros_like(picked))


def response_probs(bandit: Bandit, W: Tensor) -> Tensor:
    """[K] pi(o) = prod_t p_t(o_t) of every response; sums to 1 (tested)."""
    return token_logp(bandit, W).sum(dim=1).exp()


def solve_rate(bandit: Bandit, W: Tensor) -> float:
    """p = P(reward = 1) under the policy, exactly."""
    with torch.no_grad():
        return float((response_probs(bandit, W) * bandit.reward).sum())


@functools.lru_cache(maxsize=8)
def enumerate_groups(K: int, G: int = G) -> tuple[Tensor, Tensor]:
    """Every multiset of G responses out of K: (combos [n, G] sorted ids, log multinomial coef [n]).

    n = C(K + G - 1, G). log coef = log G! - sum_k log m_k!, the number of orderings.
    Cached (the same K comes back in every experiment); do not modify the returned tensors.
    """
    if K < 1 or G < 1:
        raise ValueError(f"enumerate_groups needs K >= 1 and G >= 1, got K={K}, G={G}")
    combos = torch.tensor(list(itertools.combinations_with_replacement(range(K), G)))
    counts = torch.nn.functional.one_hot(combos, K).sum(dim=1).to(DTYPE)
    log_coef = math.lgamma(G + 1) - torch.lgamma(counts + 1).sum(dim=1)
    return combos, log_coef


def group_probs(bandit: Bandit, W: Tensor, combos: Tensor, log_coef: Tensor) -> Tensor:
    """[n] P(group) under the policy W (the multinomial law above); sums to 1."""
    with torch.no_grad():
        log_pi = token_logp(bandit, W).sum(dim=1)
        return (log_coef + log_pi[combos].sum(dim=1)).exp()


# ---------------------------------------------------------------------------------------
# Updates through the project's loss
# ---------------------------------------------------------------------------------------

def group_updates(bandit: Bandit, W: Tensor, combos: Tensor, adv: Tensor,
                  cfg: loss_lib.LossConfig | None = None, old_W: Tensor | None = None) -> Tensor:
    """The update each group would make on its own, as one optimizer step: [n, V, D].

    combos: [n, G] response ids; adv: [n, G] advantages (advantages.compute_advantages on
    the groups' rewards). `step_updates` with every group a step of its own.
    """
    return step_updates(bandit, W, bandit.responses[combos], bandit.mask[combos], adv, cfg, old_W)


def step_updates(bandit: Bandit, W: Tensor, tokens: Tensor, mask: Tensor, adv: Tensor,
                 cfg: loss_lib.LossConfig | None = None, old_W: Tensor | None = None) -> Tensor:
    """The update each step would make on its own: Delta W_s = -dLoss_s/dW, [n, V, D].

    tokens, mask: [n, R, L]. Row s is ONE optimizer step of R rollouts: one group (R = G,
    experiments 1-3) or many side by side (R = k*G, experiment 5; rollout r in group r // G).
    Its loss is the project's loss.policy_loss on per-token log-probs of the toy policy;
    autograd does the rest. Trick: every step gets its own copy W_s of the weights, so the
    summed loss of all steps, differentiated once, gives each step's gradient separately.
    adv: [n, R]. cfg: LossConfig (default: PPO, token-mean). old_W: the sampling policy
    (default W: on-policy, every ratio 1). The step normaliser is aggregation.step_normaliser
    of R full-length responses, so token-mean divides by R*L, one constant for every rollout
    (a real step divides by its token count, also one constant per step).
    Returns the ASCENT direction (what an SGD step with lr=1 adds to W).
    """
    cfg = loss_lib.LossConfig() if cfg is None else cfg
    n, R, L = tokens.shape
    if adv.shape != (n, R):
        raise ValueError(f"adv must have the steps' shape {(n, R)}, got {tuple(adv.shape)}")
    W_g = W.detach().expand(n, V, D).clone().requires_grad_(True)
    logp = _group_token_logp(bandit, W_g, tokens, mask)
    with torch.no_grad():
        old = logp if old_W is None else _group_token_logp(bandit, old_W.detach().expand(n, V, D), tokens, mask)
    norm = aggregation.step_normaliser(torch.ones(R, L, dtype=DTYPE))
    loss, _ = loss_lib.policy_loss(logp.reshape(n * R, L), old.reshape(n * R, L).detach(), adv.reshape(-1),
                                   mask.reshape(n * R, L), cfg, norm, group_index=torch.arange(n * R) // G)
    (grad,) = torch.autograd.grad(loss, W_g)
    return -grad


def token_coefficients(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                       cfg: loss_lib.LossConfig) -> Tensor:
    """c_{i,t} = -dLoss/d logp_{i,t}: the weight each token's gradient gets from the loss.

    logp, old_logp, mask: [n, G, L]; adv: [n, G]. Returns [n, G, L]. The parameter update
    is sum_{i,t} c_{i,t} grad log p_t(o_{i,t}), so a token that every rollout of a group
    shares at the same context moves by (sum_i c_{i,t}) times ONE common gradient: that
    sum is the "net weight" whose zero is cancellation (loss.py's
    cancellation_residual_of_loss uses the same trick). Groups are steps of G rollouts as
    in `group_updates`.
    """
    n, g, T = logp.shape
    leaf = logp.detach().reshape(n * g, T).clone().requires_grad_(True)
    norm = aggregation.step_normaliser(torch.ones(g, T, dtype=DTYPE))
    loss, _ = loss_lib.policy_loss(leaf, old_logp.reshape(n * g, T).detach(), adv.reshape(-1),
                                   mask.reshape(n * g, T), cfg, norm,
                                   group_index=torch.arange(n).repeat_interleave(g))
    (grad,) = torch.autograd.grad(loss, leaf)
    return -grad.reshape(n, g, T)


def _group_token_logp(bandit: Bandit, W_g: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """[n, R, L] token log-probs of every step's rollouts under per-step weights W_g [n, V, D]."""
    n, R, L = tokens.shape
    lp = logp_table(bandit, W_g)                                   # [n, L, V]
    picked = lp.unsqueeze(1).expand(n, R, L, V).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(mask > 0, picked, torch.zeros_like(picked))


def logp_change(bandit: Bandit, W: Tensor, dW: Tensor, lr: float | None = None) -> Tensor:
    """Change of log p_t(a) at every position and token when W moves along dW [n, V, D].

    lr=None: first order, d/d(lr) at lr=0:  dz_t(a) - sum_b p_t(b) dz_t(b), with
    dz_t(a) = dW[a] . h_t (the direction of the update, independent of its size).
    lr given: exact, log_softmax(z + lr dz) - log_softmax(z) ("rescore before and after").
    Returns [n, L, V]; 0 off the menu.
    """
    with torch.no_grad():
        lp = logp_table(bandit, W)
        on_menu = torch.isfinite(lp)
        if lr is None:
            dz = (dW @ bandit.H.T).transpose(-1, -2)                   # [n, L, V]
            dz = torch.where(on_menu, dz, torch.zeros_like(dz))
            change = dz - (lp.exp() * dz).sum(dim=-1, keepdim=True)
        else:
            change = logp_table(bandit, W + lr * dW) - lp
        return torch.where(on_menu, change, torch.zeros_like(change))


def sampled_token_values(table: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """Pick [n, L, V] per-step values at each rollout's own tokens [n, R, L]: [n, R, L] (0 on padding)."""
    n, R, L = tokens.shape
    vals = table.unsqueeze(1).expand(n, R, L, V).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return vals * mask


def sample_groups(bandit: Bandit, W: Tensor, n_groups: int, seed: int) -> Tensor:
    """[n_groups, G] response ids drawn from pi (one deterministic draw, experiments 4 and 5)."""
    gen = torch.Generator().manual_seed(seed)
    probs = response_probs(bandit, W).detach()
    return torch.multinomial(probs, n_groups * G, replacement=True, generator=gen).view(n_groups, G)


def sample_tokens(bandit: Bandit, W: Tensor, n: int, seed: int) -> Tensor:
    """[n, L] responses drawn from pi token by token (any variant without early stop).

    Positions are independent (pi(o) = prod_t p_t(o_t)), so drawing each position from
    its own p_t IS drawing a response from pi. One deterministic draw per seed.
    """
    if bool((bandit.beta[:, IDX[EOS]] > -math.inf).any()):
        raise ValueError("sample_tokens: an early-stop bandit ends responses at <eos>; use sample_groups")
    with torch.no_grad():
        p = logp_table(bandit, W).exp()                                  # [L, V]
    gen = torch.Generator().manual_seed(seed)
    return torch.multinomial(p, n, replacement=True, generator=gen).T


# ---------------------------------------------------------------------------------------
# Coupling: how one token occurrence's gradient moves another's log-probability
# ---------------------------------------------------------------------------------------

def score_W(bandit: Bandit, W: Tensor, t: int, a: int) -> Tensor:
    """Closed form of grad_W log p_t(a): (e_a - p_t) outer h_t, [V, D] (softmax score)."""
    with torch.no_grad():
        p = logp_table(bandit, W)[t].exp()
        e = torch.zeros(V, dtype=DTYPE)
        e[a] = 1.0
        return torch.outer(e - p, bandit.H[t])


def coupling(bandit: Bandit, W: Tensor, t: int, a: int, t2: int, b: int) -> float:
    """[recon] Output-layer coupling of occurrence (t, a) with (t2, b), docs/math.md §6.3:

        grad_W log p_t(a) . grad_W log p_t2(b) = ([a == b] - p_t2(a) - p_t(b) + p_t . p_t2) (h_t . h_t2)

    A step along the first occurrence's gradient changes the second one's log-prob by lr
    times this. For the same token at the same position the bracket is
    1 - 2 p_t(a) + |p_t|^2: close to 1 when the token is improbable and the rest of the
    distribution is spread (LOW confidence), and exactly 0 when p_t(a) = 1. Different
    tokens at one position couple NEGATIVELY (-p(a) - p(b) + |p|^2): pushing one up pushes
    the other down. Tokens on disjoint menus do not couple at all.
    (Derivation: expand (e_a - p)(e_b - p') and use h_t . h_t2 for the feature factor.)
    """
    with torch.no_grad():
        P = logp_table(bandit, W).exp()
        p, p2 = P[t], P[t2]
        return float((float(a == b) - p2[a] - p[b] + (p * p2).sum()) * (bandit.H[t] @ bandit.H[t2]))



def occurrences(bandit: Bandit) -> list:
    """Every (position, token) the policy can vary: the tokens of each menu with more than one choice."""
    return [(t, IDX[tok]) for t, menu in enumerate(bandit.menus) for tok in menu if len(menu) > 1]


def coupling_table(bandit: Bandit, W: Tensor, occ: list) -> Tensor:
    """`coupling` of every pair of occurrences at once: [M, M] for occ = [(t, a), ...].

    The same bracket ([a == b] - p_t2(a) - p_t(b) + p_t . p_t2) (h_t . h_t2), as tensors:
    the filler variant has 56 occurrences, and 3136 scalar calls would cost a third of
    a second. Symmetric; the diagonal holds each occurrence's coupling with itself,
    |grad log p_t(a)|^2, which is not a coupling between two different tokens.
    """
    with torch.no_grad():
        P = logp_table(bandit, W).exp()
        t = torch.tensor([o[0] for o in occ])
        a = torch.tensor([o[1] for o in occ])
        same = (a.unsqueeze(1) == a.unsqueeze(0)).to(DTYPE)
        bracket = same - P[t.unsqueeze(0), a.unsqueeze(1)] - P[t.unsqueeze(1), a.unsqueeze(0)] + P[t] @ P[t].T
        return bracket * (bandit.H[t] @ bandit.H[t].T)
