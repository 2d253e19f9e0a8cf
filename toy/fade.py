"""Experiments 6 and 7: the sign and difficulty axes of an advantage, entropy, and FADE's schedule.

The FADE paper (Decugis et al. 2026, arXiv 2607.01490) splits any advantage into a
success mass m_S = sum_{A_i > 0} A_i and a failure mass m_F = sum_{A_i < 0} |A_i|
(advantages.gradient_mass). The DIFFICULTY axis is where m_S(p) + m_F(p) peaks over the
solve rate p; the SIGN axis is m_S versus m_F. Its claims, and those of Zhu et al. 2025
(psr / nsr): success-biased updates (m_S > m_F) collapse entropy, failure-biased ones keep
it up; and a schedule of both axes (scheduler.py) reaches peak accuracy sooner and keeps
more diversity than any static choice.

For these we use the simplest model that has entropy to lose: a prompt is ONE softmax
over K = 8 final answers, some of them correct (logits z, pi = softmax(z); no tokens, no
shared parameters). A group is G = 4 answers. For one-token answers loss.policy_loss
(PPO on-policy, token-mean) has the gradient

    Delta z = (lr / G) sum_i A_i (e_{o_i} - pi)          (e_o: one-hot of answer o)

What plain SGD on these logits can and cannot show (docs/math.md §2.3, corrected):
1. In expectation over the group, E[Delta z] = lr (a_1 - a_0) grad_z p, where a_r is a
   rollout's expected advantage given its reward r. On ONE prompt every advantage moves
   the logits along the SAME direction, grad_z p; the advantage only sets the speed
   a_1 - a_0. psr (A = r) and nsr (A = r - 1) have identical expected updates, and to
   first order in lr every advantage spends the same entropy per unit of solve rate
   gained on a prompt (6b computes it exactly).
2. Across prompts of mixed difficulty the speed matters where it depends on p
   (`rollout_gap`). For psr, nsr, w_reinforce (+lam / -1) and mean it does not (1, 1,
   1 + lam, (G-1)/G): the four follow one path, mean's, at different speeds. The FADE
   paper's sign probe asym delta does not: its a_1 - a_0 = (G-1)/G (1 - p + p/delta)
   leans toward hard prompts when delta > 1 and toward easy ones when delta < 1. That is
   a first-order DIFFICULTY effect that comes bundled with the sign: along the exact
   lr -> 0 path of SGD (`expected_path`) asym delta=2 reaches solve rate 0.9 with about
   0.05 nats more entropy than mean, delta=0.5 with about 0.07 less, and sampled SGD at
   lr 1.5 shows nearly the same differences (6c prints both).
3. Per group, a mass imbalance does move entropy: the term -(sum_i A_i) pi of Delta z is
   the (m_S - m_F) kappa term of docs/math.md §2.3's formula. But over on-policy samples a
   constant shift of the advantages has no first-order effect (E_pi[e_o - pi] = 0), so
   in expectation the imbalance drops out. (An earlier reading of the formula gave a
   success surplus a first-order entropy effect; it is withdrawn.)
So under SGD the sign axis itself reaches entropy only through second-order effects: the
step size, and finite groups (psr pushes up whatever an all-correct group sampled, nsr
down whatever an all-wrong group sampled; zero-sum advantages give such groups exactly
0). To see it, compare sampled SGD with its own exact lr -> 0 path: for psr, nsr and
w_reinforce that path is mean's, and for asym subtracting it removes the difficulty
effect of fact 2.
Real training adds Adam's per-coordinate normalisation, clipping and function
approximation. Adam is the one the papers use (train.py too), and it changes the
picture: it divides each logit's step by that logit's own running gradient scale, so a
small but consistent push moves a logit as fast as a large one. Under nsr every correct
answer's logit gets the small consistent push +(#wrong / G) pi_a, and with Adam all of
them rise at the same speed, the rare ones included; under psr a correct answer that is
not sampled gets -(#correct / G) pi_a and falls at full speed. How far that goes depends
on the step size (Adam's step is about lr per coordinate whatever the gradient), so 6c
trains with Adam at three step sizes, keeps SGD and its exact path beside it as the
control, and experiment 7 runs FADE with Adam.

Diversity is measured three ways, always at EQUAL solve rate (methods learn at different
speeds, and entropy falls as the solve rate rises, so equal steps would mostly compare
speeds): total entropy; entropy among the correct answers (H of pi restricted to the
correct answers and renormalised, over prompts with >= 2 of them); and coverage@16, the
expected fraction of a prompt's correct answers that 16 samples find,
(1/n_correct) sum_{a correct} (1 - (1 - pi_a)^16), a pass@k-style measure of the distinct
correct answers the policy keeps.

6a and 6b are exact (closed forms; sums over all C(11, 4) = 330 groups), and so is 6c's
lr -> 0 path. 6c and 7 are otherwise learning simulations with sampled groups: 96 prompts
of mixed difficulty, 5 seeds (each its own population order and sampling stream, shared
by every method), mean ± standard error over seeds.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch

import advantages as adv_lib
import loss as loss_lib
import scheduler as sched_lib
from toy import breakers, report

K_ANS = 8            # answers per prompt
G = 4
DTYPE = torch.float64
# The sign-axis probes of 6b/6c: (label, advantage name, hyper-parameters), from the most
# success-biased to the most failure-biased. w_reinforce is Zhu et al.'s own proposal
# (successes +0.1, failures -1).
METHODS = (("psr (success only)", "psr", {}),
           ("asym δ=2 (success-biased)", "asym", {"delta": 2.0}),
           ("mean (balanced)", "mean", {}),
           ("asym δ=0.5 (failure-biased)", "asym", {"delta": 0.5}),
           ("w_reinforce λ=0.1 (failure-biased)", "w_reinforce", {"lam": 0.1}),
           ("nsr (failure only)", "nsr", {}))
ONE_STEP_PS = (0.05, 0.2, 0.5, 0.8, 0.95, 0.99)
MATCH_P = 0.9        # 6c and 7 compare diversity at this mean solve rate (every run reaches it)
SEEDS = 5
PROMPTS = 96
COVERAGE_K = 16     # a power of two (`diversity` squares its way there)
SGD_LR, SGD_STEPS = 1.5, 45             # the control (lr of the toy's earlier runs; every run reaches 0.9 by ~33)
ADAM_LR, ADAM_STEPS = 0.05, 150         # train.py's optimizer (betas 0.9/0.999, eps 1e-8, no decay, no clip)
# 6c runs the sign probes at three Adam step sizes, 2.5x apart around ADAM_LR: a sign-axis
# claim "agrees" only if it holds at all three (with Adam the step size is not a detail:
# the sign effect comes from Adam's normalisation, module header). The slowest, 0.02,
# needs up to ~155 steps to reach solve rate 0.9, so the Adam batch runs ADAM_RUN_STEPS; experiment 7
# reads its runs at step ADAM_STEPS (later steps cannot change earlier ones).
ADAM_LRS = (0.02, 0.05, 0.1)
ADAM_RUN_STEPS = 165
# Experiment 7. The static baselines are fade(alpha, delta) with fixed knobs; (1, 1) is
# exactly `mean` and (1, 0.5) exactly `asym` delta=0.5, so those two runs are shared with 6c.
STATIC = ((1.0, 1.0), (2.0, 1.0), (1.0, 0.5))
# FADE's knobs for a 150-step run. [ours] The paper's beta = 0.02 remembers ~50 steps of
# runs thousands of steps long; here that would be a third of the run, so beta is scaled
# to 0.1 (~10 steps). The paper's target 0.5 H0 = 0.91 nats cannot be reached at the
# solve rate these runs end at (~0.98, where no policy has more than 0.89 nats, see
# `max_entropy`), so the controller would end at its floor for reasons that have nothing
# to do with collapse. 0.8 nats lies between that ceiling and the ~0.66 nats the balanced
# baseline ends at, so delta has something to do and a target it can reach. (Chosen
# from those two numbers, before FADE's own results were looked at.)
FADE_BETA, FADE_TARGET = 0.1, 0.8


def entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(z) over the last dimension."""
    lp = torch.log_softmax(z, dim=-1)
    return -(lp.exp() * lp).sum(-1)


def prompt_logits(p: float, n_correct: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """One prompt with solve rate exactly p: (z [K], correct [K] bool).

    Fixed uneven base logits; the correct answers' logits are shifted by the closed form
    s = logit(p) + log sum_wrong e^z - log sum_correct e^z.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"solve rate p must be in (0, 1), got {p}")
    z = torch.tensor([0.6, 0.2, -0.2, -0.6, 0.5, 0.1, -0.1, -0.5], dtype=DTYPE)
    correct = torch.arange(K_ANS) < n_correct
    shift = math.log(p / (1 - p)) + torch.logsumexp(z[~correct], 0) - torch.logsumexp(z[correct], 0)
    return z + shift * correct, correct


def population_logits(p: torch.Tensor, n_correct: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`prompt_logits` for many prompts at once: p [M], n_correct [M] -> (z [M, K], correct [M, K])."""
    z = torch.tensor([0.6, 0.2, -0.2, -0.6, 0.5, 0.1, -0.1, -0.5], dtype=DTYPE).expand(len(p), K_ANS)
    correct = torch.arange(K_ANS).unsqueeze(0) < n_correct.unsqueeze(1)
    neg_inf = torch.tensor(-math.inf, dtype=DTYPE)
    shift = (torch.log(p / (1 - p)) + torch.logsumexp(torch.where(correct, neg_inf, z), 1)
             - torch.logsumexp(torch.where(correct, z, neg_inf), 1))
    return z + shift.unsqueeze(1) * correct, correct


def answer_groups() -> tuple[torch.Tensor, torch.Tensor]:
    """Every multiset of G answers: (combos [330, G], log multinomial coefficient [330])."""
    combos = torch.tensor(list(itertools.combinations_with_replacement(range(K_ANS), G)))
    counts = torch.nn.functional.one_hot(combos, K_ANS).sum(1).to(DTYPE)
    return combos, math.lgamma(G + 1) - torch.lgamma(counts + 1).sum(1)


def group_logit_updates(z: torch.Tensor, combos: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """[n, K] Delta z of each group (lr = 1), by autograd through loss.policy_loss.

    Each group's own copy of the logits, as in toy/bandit.group_updates; one-token
    answers, so logp is [n*G, 1] and token-mean divides by G.
    """
    n = combos.shape[0]
    z_g = z.detach().expand(n, K_ANS).clone().requires_grad_(True)
    logp = torch.log_softmax(z_g, -1).gather(1, combos).reshape(n * G, 1)
    mask = torch.ones_like(logp)
    loss, _ = loss_lib.policy_loss(logp, logp.detach(), adv.reshape(-1), mask, loss_lib.LossConfig(),
                                   loss_lib.step_normaliser(torch.ones(G, 1, dtype=DTYPE)))
    (grad,) = torch.autograd.grad(loss, z_g)
    return -grad


def one_step(p: float, name: str, lr: float = 1.0, **hyper) -> dict:
    """Exact expected one-step change of entropy and solve rate at solve rate p.

    E over all 330 groups of H(z + lr Delta z_g) - H(z), and the same for p; plus the
    part of E[Delta H] that comes from all-equal groups (all correct or all wrong),
    which carry no information about WHICH answers are right.
    """
    z, correct = prompt_logits(p)
    combos, log_coef = answer_groups()
    prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
    rewards = correct[combos].to(DTYPE)
    adv = adv_lib.compute_advantages(name, rewards, **hyper)
    z_new = z + lr * group_logit_updates(z, combos, adv)
    dH = entropy(z_new) - entropy(z)
    dp = (torch.softmax(z_new, -1) * correct).sum(-1) - p
    equal = rewards.max(1).values == rewards.min(1).values
    return {"dH": float((prob * dH).sum()), "dp": float((prob * dp).sum()),
            "dH_all_equal_groups": float((prob * dH)[equal].sum())}


def first_order_cost(p: float, name: str, **hyper) -> float:
    """Entropy spent per unit of solve rate gained, to first order in lr: exact.

        d E[Delta H] / d E[Delta p]  at lr -> 0  =  (grad_z H . E[Delta z]) / (grad_z p . E[Delta z])

    E[Delta z] over all 330 groups (lr = 1). By fact 1 of the module header E[Delta z] is
    the same direction for every advantage, so this number is the SAME for psr, nsr, mean
    and asym: on one prompt, the sign axis has no first-order effect on entropy at equal
    progress. (Across prompts of mixed difficulty asym's speed varies with p, which is a
    first-order effect of a different kind: fact 2.)
    """
    z, correct = prompt_logits(p)
    combos, log_coef = answer_groups()
    prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
    adv = adv_lib.compute_advantages(name, correct[combos].to(DTYPE), **hyper)
    mean_dz = (prob.unsqueeze(1) * group_logit_updates(z, combos, adv)).sum(0)
    leaf = z.clone().requires_grad_(True)
    (grad_H,) = torch.autograd.grad(entropy(leaf), leaf)
    pi = torch.softmax(z, 0)
    grad_p = pi * (correct.to(DTYPE) - p)                   # d p / d z_a = pi_a ([a correct] - p)
    return float(grad_H @ mean_dz / (grad_p @ mean_dz))


def max_entropy(p: float, n_correct: torch.Tensor) -> float:
    """The most mean entropy prompts with n_correct [M] correct answers can have at solve rate p.

    Spread p evenly over the correct answers and 1 - p over the wrong ones:
    H = h(p) + p log n_c + (1 - p) log (K - n_c), h the binary entropy; averaged over prompts.
    Used to check that FADE's entropy target is reachable at the solve rate a run reaches.
    """
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    n = n_correct.to(DTYPE)
    return float((h + p * torch.log(n) + (1 - p) * torch.log(K_ANS - n)).mean())


# ---------------------------------------------------------------------------------------
# Learning simulations (6c, 7): many prompts, sampled groups, SGD or Adam
# ---------------------------------------------------------------------------------------

def population(seed: int, M: int = PROMPTS) -> tuple[torch.Tensor, torch.Tensor]:
    """M prompts of mixed difficulty: (z [M, K], correct [M, K]).

    Prompt j has n_correct = 1 + j mod 4 correct answers and an initial solve rate from
    an even grid over [0.05, 0.8], shuffled by the seed.
    """
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.linspace(0.05, 0.8, M, dtype=DTYPE)[torch.randperm(M, generator=gen)]
    return population_logits(p0, n_correct=1 + torch.arange(M) % 4)


def diversity(z: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """[4, ...] mean over prompts of: solve rate, entropy, entropy among correct answers, coverage@16.

    z, correct: [..., M, K]. The last two are averaged over the prompts with >= 2 correct
    answers only (with one, both are trivially 0 and 1). See the module header.
    Written for speed (it runs on every config at every step of the simulations): the
    entropy among correct answers, H of pi_c = pi / s on the correct set (s the solve
    rate), is log s - sum_{a correct} pi_a log pi_a / s; (1 - pi)^16 is four squarings.
    """
    return _diversity(_log_softmax(z), correct.to(z.dtype))


def _diversity(lp: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """`diversity` from log pi and the correct answers as 0/1 floats (simulate has both at hand)."""
    pi = lp.exp()
    solve = (pi * right).sum(-1)                                             # [..., M]
    H = -(pi * lp).sum(-1)
    H_correct = solve.log() - (pi * right * lp).sum(-1) / solve
    miss = 1 - pi
    for _ in range(COVERAGE_K.bit_length() - 1):                             # (1 - pi)^16, COVERAGE_K = 2^4
        miss = miss * miss
    n_correct = right.sum(-1)
    coverage = ((1 - miss) * right).sum(-1) / n_correct
    multi = (n_correct >= 2).to(lp.dtype)
    among = lambda x: (x * multi).sum(-1) / multi.sum(-1)
    return torch.stack([solve.mean(-1), H.mean(-1), among(H_correct), among(coverage)])


def simulate(configs: tuple, optimizer: str, lr, steps: int, seeds: int = SEEDS, M: int = PROMPTS) -> dict:
    """Train every config on `seeds` populations of M prompts at once; return the trajectories.

    configs: tuple of (label, kind, parameters), one of
      (label, advantage name, hyper-parameters as a tuple of (key, value)): a static advantage;
      (label, "FADE", SchedulerConfig): the `fade` advantage with alpha, delta from
          scheduler.AdvantageScheduler, one scheduler per seed, fed each step that seed's
          batch solve rate and mean entropy;
      (label, "FADE scale", label of a FADE config): the scale-matched control. Dr. GRPO's
          `mean` advantage on this config's own rewards, multiplied each step (per seed)
          by one number so that its batch sum |A| equals the FADE run's sum |A| at the
          same step: FADE's step size with mean's shape;
      (label, "FADE shape", label of a FADE config): the shape-only control. `fade` with
          the FADE run's (alpha, delta) of the same step, multiplied by one number so that
          its sum |A| equals `mean`'s on the same rewards: FADE's shape at mean's step size.
    The two controls split what FADE changes into its two parts. A scalar factor on a
    step's advantages is a step size: under SGD it scales the update directly; under Adam
    it cancels out in the long run, but not while Adam's second moment (beta2 = 0.999, a
    memory of ~1000 steps) still remembers smaller gradients, so a GROWING scale is a
    growing effective step (experiment 7).
    optimizer: "sgd" (z += lr Delta z) or "adam" (breakers.adam_step on the loss gradient
    -Delta z, torch.optim.Adam's defaults). lr: one float, or a tuple with one per config
    (experiment 6 runs the same advantages at several Adam step sizes in one batch).
    Seed s: population(s), the same initial prompts for every config. The answers are
    drawn by inverse-CDF sampling, and every config gets the SAME uniform numbers
    (common random numbers, one stream seeded 1000): two configs whose policies agree
    draw the same answers, so their paired difference carries less sampling noise, and
    adding a config to the batch changes nobody else's run. Delta z is `logit_update`,
    equal to loss.policy_loss's gradient (tested).
    Returns {"hist": [steps + 1, C, 4, seeds] `diversity` before each step and at the end,
    "alpha", "delta": {label: [steps, seeds]} for FADE configs, "scale": {label: [steps,
    seeds]} the FADE run's batch sum |A| divided by what `mean` would give its rewards}.
    """
    C = len(configs)
    index = {cfg[0]: c for c, cfg in enumerate(configs)}
    fades = [c for c, cfg in enumerate(configs) if cfg[1] == "FADE"]
    controls = [c for c, cfg in enumerate(configs) if cfg[1] in ("FADE scale", "FADE shape")]
    for c in controls:
        if configs[index.get(configs[c][2], c)][1] != "FADE":
            raise ValueError(f"{configs[c][0]!r} follows {configs[c][2]!r}, which is not a FADE config of this batch")
    lrs = torch.tensor(lr if isinstance(lr, (tuple, list)) else [lr] * C, dtype=DTYPE).view(C, 1, 1, 1)
    z0, correct = zip(*(population(s, M) for s in range(seeds)))
    z = torch.stack(z0).expand(C, seeds, M, K_ANS).clone()                  # [C, S, M, K]
    correct = torch.stack(correct).expand(C, seeds, M, K_ANS)
    scheds = {c: [sched_lib.AdvantageScheduler(configs[c][2]) for _ in range(seeds)] for c in fades}
    gen = torch.Generator().manual_seed(1000)
    state, hist = {}, []
    logs = {key: {configs[c][0]: [] for c in fades} for key in ("alpha", "delta", "scale")}
    right = correct.to(DTYPE)
    for _ in range(steps):
        lp = _log_softmax(z)
        hist.append(_diversity(lp, right).transpose(0, 1))                  # [C, 4, S]
        pi = lp.exp()
        cdf = pi.cumsum(-1)
        u = torch.rand((seeds, M, G), generator=gen, dtype=DTYPE) * cdf[..., -1:]   # the same u for every config
        answers = torch.searchsorted(cdf, u).clamp_max(K_ANS - 1)                    # [C, S, M, G]
        rewards = right.gather(3, answers)
        knobs = {f: [scheds[f][s].step(float(rewards[f, s].mean()), float(hist[-1][f, 1, s])) for s in range(seeds)]
                 for f in fades}
        A = step_advantages(configs, rewards, knobs)
        for f in fades:
            for key in ("alpha", "delta"):
                logs[key][configs[f][0]].append([k[key] for k in knobs[f]])
            mean_abs = adv_lib.compute_advantages("mean", rewards[f].reshape(-1, G)).abs().view(seeds, -1).sum(1)
            logs["scale"][configs[f][0]].append((A[f].abs().sum((1, 2)) / mean_abs).tolist())
        dz = logit_update(A, answers, pi)
        if optimizer == "sgd":
            z = z + lrs * dz
        else:
            breakers.adam_step(z, -dz, state, lrs)
    hist.append(_diversity(_log_softmax(z), right).transpose(0, 1))
    return {"hist": torch.stack(hist),
            **{key: {k: torch.tensor(v, dtype=DTYPE) for k, v in log.items()} for key, log in logs.items()}}


def step_advantages(configs: tuple, rewards: torch.Tensor, knobs: dict) -> torch.Tensor:
    """The advantages of one simulation step: [C, S, M, G] from rewards [C, S, M, G].

    configs: simulate's configs; knobs: {index of a FADE config: its per-seed
    {"alpha", "delta"} of this step}. Static advantages that appear at several step sizes
    are computed in one call (an advantage of one group depends only on that group's
    rewards). The controls, per seed s (sums over the seed's whole batch of M x G):
      "FADE scale":  A = A_mean * sum|A_FADE| / sum|A_mean|      (A_FADE: the FADE run's own)
      "FADE shape":  A = A_fade(knobs) * sum|A_mean| / sum|A_fade(knobs)|
    with A_mean and A_fade(knobs) computed on the control's own rewards; a batch whose
    sum is 0 (every group all-equal) gets A = 0.
    """
    C, seeds, M, _ = rewards.shape
    index = {cfg[0]: c for c, cfg in enumerate(configs)}
    kinds = ("FADE", "FADE scale", "FADE shape")
    A = torch.empty_like(rewards)
    static = {}
    for c, (label, name, hyper) in enumerate(configs):
        if name not in kinds:
            static.setdefault((name, hyper), []).append(c)
    for (name, hyper), cs in static.items():
        A[cs] = adv_lib.compute_advantages(name, rewards[cs].reshape(-1, G), **dict(hyper)).view(len(cs), seeds, M, G)
    controls = [c for c, cfg in enumerate(configs) if cfg[1] in kinds[1:]]
    for f, per_seed in knobs.items():       # each FADE run, with the shape controls that follow it, one call per knob pair
        rows = [f] + [c for c in controls if configs[c][1] == "FADE shape" and index[configs[c][2]] == f]
        A[rows] = _fade_advantages(rewards[rows], per_seed)
    if controls:
        mean_adv = adv_lib.compute_advantages("mean", rewards[controls].reshape(-1, G)).view(len(controls), seeds, M, G)
        batch_abs = lambda x: x.abs().sum((-2, -1))                                    # [S, M, G] -> [S]
        rescale = lambda x, target: x * torch.where(batch_abs(x) > 0, target / batch_abs(x).clamp_min(1e-300),
                                                    torch.zeros_like(target)).view(seeds, 1, 1)
        for j, c in enumerate(controls):
            if configs[c][1] == "FADE scale":       # mean's shape, the FADE run's sum |A|
                A[c] = rescale(mean_adv[j], batch_abs(A[index[configs[c][2]]]))
            else:                                   # FADE's shape (already in A[c]), mean's sum |A|
                A[c] = rescale(A[c], batch_abs(mean_adv[j]))
    return A


def _fade_advantages(rewards: torch.Tensor, knobs: list) -> torch.Tensor:
    """`fade` advantages of rewards [n, S, M, G], seed s with knobs[s] = {"alpha", "delta"}; one call per distinct pair."""
    n, seeds, M, _ = rewards.shape
    A = torch.empty_like(rewards)
    for pair in {(k["alpha"], k["delta"]) for k in knobs}:
        same = [s for s, k in enumerate(knobs) if (k["alpha"], k["delta"]) == pair]
        A[:, same] = adv_lib.compute_advantages("fade", rewards[:, same].reshape(-1, G), alpha=pair[0],
                                                delta=pair[1]).view(n, len(same), M, G)
    return A


def logit_update(adv: torch.Tensor, answers: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """Delta z at lr 1 for groups of one-token answers: (sum_i A_i e_{o_i} - (sum_i A_i) pi) / G.

    adv, answers: [..., G]; pi: [..., K]. Returns [..., K]. The module header's closed
    form, which is loss.policy_loss's gradient (PPO on-policy, token-mean; tested).
    """
    pushed = torch.zeros_like(pi).scatter_add_(-1, answers, adv)                      # sum_i A_i e_{o_i}
    return (pushed - adv.sum(-1, keepdim=True) * pi) / adv.shape[-1]


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """log softmax over the last (short) dimension, written out: torch's kernel is ~10x slower at K = 8."""
    shifted = z - z.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def sign_configs() -> tuple:
    """6c's configs: METHODS in simulate's format."""
    return tuple((label, name, tuple(hyper.items())) for label, name, hyper in METHODS)


FADE_RUN = "FADE schedule"
SCALE_CONTROL = "mean at FADE's scale"          # simulate's "FADE scale": FADE's step size, mean's shape
SHAPE_CONTROL = "FADE's shape at mean's scale"  # simulate's "FADE shape": FADE's (alpha, delta), mean's step size


def fade_configs() -> tuple:
    """Experiment 7's FADE run and its two controls, in simulate's format."""
    return ((FADE_RUN, "FADE", sched_lib.SchedulerConfig(ema_beta=FADE_BETA, h_target=FADE_TARGET)),
            (SCALE_CONTROL, "FADE scale", FADE_RUN), (SHAPE_CONTROL, "FADE shape", FADE_RUN))


@functools.lru_cache(maxsize=2)
def runs(optimizer: str) -> dict:
    """The shared simulations, one batch per optimizer: {lr: {label: run}}.

    Adam: METHODS at every step size of ADAM_LRS, and at ADAM_LR also the static baseline
    (alpha, delta) = (2, 1), FADE and its two controls; ADAM_RUN_STEPS steps.
    SGD: METHODS, FADE and its two controls at SGD_LR; SGD_STEPS steps.
    A run is {"hist": [T+1, 4, seeds], "alpha", "delta", "scale": [T, seeds] (FADE) or None}.
    Cached: experiments 6 and 7 read the same batches.
    """
    if optimizer == "sgd":
        groups, steps = {SGD_LR: sign_configs() + fade_configs()}, SGD_STEPS
    else:
        groups, steps = {lr: sign_configs() for lr in ADAM_LRS}, ADAM_RUN_STEPS
        groups[ADAM_LR] += tuple((static_label(a, d), "fade", (("alpha", a), ("delta", d)))
                                 for a, d in STATIC if (a, d) not in ((1.0, 1.0), (1.0, 0.5)))
        groups[ADAM_LR] += fade_configs()
    # simulate needs labels unique within the batch: tag each with its step size.
    tag = lambda label, lr: f"{label} @ lr {lr:g}"
    configs, lrs = [], []
    for lr, cfgs in groups.items():
        for label, name, params in cfgs:
            configs.append((tag(label, lr), name, tag(params, lr) if name in ("FADE scale", "FADE shape") else params))
            lrs.append(lr)
    out = simulate(tuple(configs), optimizer, tuple(lrs), steps)
    result, c = {}, 0
    for lr, cfgs in groups.items():
        result[lr] = {}
        for label, _, _ in cfgs:
            result[lr][label] = {"hist": out["hist"][:, c],
                                 **{key: out[key].get(tag(label, lr)) for key in ("alpha", "delta", "scale")}}
            c += 1
    return result


def rollout_gap(name: str, p: torch.Tensor, **hyper) -> torch.Tensor:
    """a_1(p) - a_0(p): a correct rollout's expected advantage minus a wrong one's, exactly.

    A rollout's advantage depends on its own reward and on the other G - 1 rewards of its
    group, which for a prompt of solve rate p are Binomial(G - 1, p). So

        a_1(p) = sum_k B(k; G-1, p) A_correct(k + 1 correct of G)
        a_0(p) = sum_k B(k; G-1, p) A_wrong(k correct of G)

    with A_correct(c), A_wrong(c) read off the advantage function itself on a group with c
    correct rollouts (advantages.compute_advantages; no second formula). By fact 1 of the
    module header E[Delta z] = lr (a_1 - a_0) grad_z p: this is the SPEED at which a prompt
    of solve rate p moves along its one direction. psr and nsr give 1, w_reinforce 1 + lam,
    mean (G-1)/G, all independent of p; asym delta gives (G-1)/G (1 - p + p/delta), which
    is not (tested). p: a tensor of any shape; returns the same shape. Advantages that
    look beyond their group (reinforce_pp's batch whitening) have no such closed form.
    """
    return _binomial_mix(p, _gap_by_others(name, **hyper))


def _gap_by_others(name: str, **hyper) -> torch.Tensor:
    """[G] A_correct(k + 1 of G) - A_wrong(k of G) for k = 0 .. G-1 other rollouts correct."""
    rows = (torch.arange(G).unsqueeze(0) < torch.arange(G + 1).unsqueeze(1)).to(DTYPE)   # row c: c correct, first
    A = adv_lib.compute_advantages(name, rows, **hyper)
    return A[1:, 0] - A[:-1, G - 1]


def _binomial_mix(p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """sum_k B(k; G-1, p) d[..., k] for p [...] (d broadcasts against [..., G])."""
    k = torch.arange(G, dtype=DTYPE)
    binom = torch.tensor([math.comb(G - 1, i) for i in range(G)], dtype=DTYPE)
    p = p.unsqueeze(-1)
    return (binom * p ** k * (1 - p) ** (G - 1 - k) * d).sum(-1)


def expected_path(configs: tuple, seeds: int = SEEDS, M: int = PROMPTS, dt: float = 0.5, until: float = MATCH_P,
                  max_steps: int = 400) -> torch.Tensor:
    """The lr -> 0 limit of SGD: every prompt's logits follow their expected update exactly.

        dz/dt = E[Delta z] = (a_1(p) - a_0(p)) grad_z p,   grad_z p = pi * ([a correct] - p)

    (fact 1 of the module header; t counts lr x steps, so SGD with a small lr follows this
    path with t = lr x step.) No sampling, so no finite-group or second-order effects:
    what remains is the first-order effect of an advantage, which for a mixed population
    is how its speed a_1 - a_0 varies with the solve rate (`rollout_gap`). Integrated with
    the classical Runge-Kutta scheme (RK4), step dt, on the same populations as simulate,
    until every config and seed has mean solve rate >= until (max_steps at most).
    configs: METHODS-style (label, name, hyper) tuples. Returns hist [T, C, 4, seeds] like
    simulate's, so at_solve_rate reads it the same way.
    """
    C = len(configs)
    z0, correct = zip(*(population(s, M) for s in range(seeds)))
    z = torch.stack(z0).expand(C, seeds, M, K_ANS).clone()
    correct = torch.stack(correct).expand(C, seeds, M, K_ANS)
    right = correct.to(DTYPE)
    d = torch.stack([_gap_by_others(name, **dict(hyper)) for _, name, hyper in configs]).view(C, 1, 1, G)

    def velocity(z):
        pi = _log_softmax(z).exp()
        p = (pi * right).sum(-1)                                                 # [C, S, M]
        return _binomial_mix(p, d).unsqueeze(-1) * pi * (right - p.unsqueeze(-1))

    hist = [diversity(z, correct).transpose(0, 1)]
    for _ in range(max_steps):
        k1 = velocity(z)
        k2 = velocity(z + 0.5 * dt * k1)
        k3 = velocity(z + 0.5 * dt * k2)
        k4 = velocity(z + dt * k3)
        z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        hist.append(diversity(z, correct).transpose(0, 1))
        if float(hist[-1][:, 0].min()) >= until:
            break
    return torch.stack(hist)


@functools.lru_cache(maxsize=1)
def exact_paths() -> torch.Tensor:
    """expected_path of METHODS (cached; experiment 6 and the tests read it)."""
    return expected_path(sign_configs())


def static_label(alpha: float, delta: float) -> str:
    """Label of a static baseline's run (the two that equal 6c's methods reuse them)."""
    return {(1.0, 1.0): "mean (balanced)", (1.0, 0.5): "asym δ=0.5 (failure-biased)"}.get(
        (alpha, delta), f"static α={alpha:g} δ={delta:g}")


def at_solve_rate(hist: torch.Tensor, p: float) -> torch.Tensor:
    """[4, seeds] `diversity` interpolated linearly to the step where the mean solve rate crosses p.

    hist: [T, 4, seeds]. NaN for a seed that never reaches p (every comparison with NaN
    is False, so a claim cannot pass by default).
    """
    out = torch.full(hist.shape[1:], float("nan"), dtype=DTYPE)
    for s in range(hist.shape[2]):
        solve = hist[:, 0, s]
        above = (solve >= p).nonzero().flatten()
        if len(above) == 0:
            continue
        t = int(above[0])
        if t == 0:
            out[:, s] = hist[0, :, s]
            continue
        f = (p - solve[t - 1]) / (solve[t] - solve[t - 1])
        out[:, s] = hist[t - 1, :, s] + f * (hist[t, :, s] - hist[t - 1, :, s])
    return out


def steps_to(hist: torch.Tensor, p: float) -> torch.Tensor:
    """[seeds] the (interpolated, fractional) step at which the mean solve rate first reaches p; NaN if never."""
    out = torch.full((hist.shape[2],), float("nan"), dtype=DTYPE)
    for s in range(hist.shape[2]):
        solve = hist[:, 0, s]
        above = (solve >= p).nonzero().flatten()
        if len(above):
            t = int(above[0])
            out[s] = t if t == 0 else t - 1 + (p - solve[t - 1]) / (solve[t] - solve[t - 1])
    return out


def mean_se(x: torch.Tensor) -> tuple[float, float]:
    """(mean, standard error) over seeds of a [seeds] tensor."""
    return float(x.mean()), float(x.std() / math.sqrt(len(x)))


def differs(x: torch.Tensor, sign: int) -> bool:
    """True if the seed-paired differences x [seeds] have the given sign beyond 2 standard errors."""
    m, se = mean_se(x)
    return sign * m > 2 * se


def mass_peaks() -> dict:
    """Where each advantage's total mass (m_S + m_F)(p) peaks, from advantages.mass_curve (G = 64)."""
    peaks = {}
    for name in adv_lib.ADVANTAGES:
        p, m_S, m_F = adv_lib.mass_curve(name, G=64)
        total = m_S + m_F
        peaks[name] = float(p[int(total.argmax())]) if float(total.max()) > 0 else None
    return peaks


def mass_crosscheck() -> float:
    """max |E_groups[gradient_mass / G] - advantages.expected_mass_curve| over advantages and p.

    Two independent routes to the expected masses of a prompt with solve rate p: the
    enumeration of all answer groups with their probabilities, and expected_mass_curve's
    Binomial(G, p) sum over the number of successes. They must agree exactly.
    """
    combos, log_coef = answer_groups()
    worst = 0.0
    # reinforce_pp whitens over the whole batch, so its masses depend on which groups share
    # the batch (the 330 groups here vs expected_mass_curve's G+1): not comparable, skipped.
    names = [name for name in adv_lib.ADVANTAGES if name != "reinforce_pp"]
    for p in (0.1, 0.35, 0.7):
        z, correct = prompt_logits(p)
        prob = (log_coef + torch.log_softmax(z, 0)[combos].sum(1)).exp()
        rewards = correct[combos].to(DTYPE)
        for name in names:
            m_S, m_F = adv_lib.gradient_mass(adv_lib.compute_advantages(name, rewards))
            e_S, e_F = adv_lib.expected_mass_curve(name, torch.tensor([p], dtype=DTYPE), G=G)
            worst = max(worst, abs(float((prob * m_S).sum() / G - e_S[0])), abs(float((prob * m_F).sum() / G - e_F[0])))
    return worst


# ---------------------------------------------------------------------------------------
# Experiment 6: the two axes, entropy, Adam vs SGD
# ---------------------------------------------------------------------------------------

def exp6_sign_and_difficulty(out_dir: str) -> dict:
    """Masses of every advantage (exact), one-step entropy change (exact), learning with Adam and SGD (sampled).

    The model: a prompt is one softmax over 8 answers, some correct; a group is G = 4
    answers; the update is loss.policy_loss's gradient (module header).
    6a: advantages.mass_curve for every registered advantage and where its total mass
    peaks, and a cross-check of advantages.expected_mass_curve against the enumeration of
    all 330 answer groups. 6b: the exact expected entropy change of ONE SGD step (lr 1)
    at solve rate p for psr, asym delta=2, mean, asym delta=0.5, w_reinforce and nsr; the
    part of it from all-equal groups; and the entropy spent per unit of solve rate gained
    on one prompt, to first order in lr (identical for all: module header, fact 1) and at
    lr 1.5 (where it is not). 6c: 96 prompts of mixed difficulty, 5 seeds, trained with
    Adam (train.py's optimizer) at lr 0.02, 0.05 and 0.1, with SGD (lr 1.5, the control),
    and along the exact lr -> 0 path of SGD (`expected_path`); at the step where the mean
    solve rate reaches 0.9: total entropy, entropy among correct answers, coverage@16,
    each method minus `mean` paired by seed (mean ± SE).
    A claim holds for a run when total entropy AND entropy among correct answers move the
    claimed way by more than 2 SE. With Adam it must hold at every step size tried. The
    SGD control is what the sampled SGD run adds BEYOND its exact first-order path: for
    psr, nsr and w_reinforce that path is mean's own (a_1 - a_0 does not depend on p), so
    the control is their plain SGD difference; asym's path is not mean's (it reweights
    prompts by difficulty, a first-order effect that has nothing to do with the sign
    axis), and subtracting it leaves the sign axis. `sign_axis_label` turns the two into
    the verdict.
    """
    peaks = mass_peaks()
    step = {label: [one_step(p, name, **hyper) for p in ONE_STEP_PS] for label, name, hyper in METHODS}
    first = {label: first_order_cost(0.5, name, **hyper) for label, name, hyper in METHODS}
    at_lr = {label: (lambda r: r["dH"] / r["dp"])(one_step(0.5, name, lr=SGD_LR, **hyper))
             for label, name, hyper in METHODS}
    adam, sgd, path = runs("adam"), runs("sgd")[SGD_LR], exact_paths()
    labels = [label for label, _, _ in METHODS]
    base = "mean (balanced)"
    matched = {"adam": {lr: {label: at_solve_rate(adam[lr][label]["hist"], MATCH_P) for label in labels}
                        for lr in ADAM_LRS},
               "sgd": {label: at_solve_rate(sgd[label]["hist"], MATCH_P) for label in labels},
               "path": {label: at_solve_rate(path[:, c], MATCH_P) for c, label in enumerate(labels)}}
    gap = lambda runs_at, label: runs_at[label] - runs_at[base]          # [4, seeds], paired by seed
    beyond = {label: gap(matched["sgd"], label) - gap(matched["path"], label) for label in labels}
    ps = torch.tensor([0.1, 0.5, 0.9], dtype=DTYPE)
    speed = {label: rollout_gap(name, ps, **hyper).tolist() for label, name, hyper in METHODS}
    pm = lambda x: f"{mean_se(x)[0]:+.3f} ± {mean_se(x)[1]:.3f}"
    three = lambda d: f"{pm(d[1])}, {pm(d[2])}, {pm(d[3])}"
    others = [label for label in labels if label != base]
    numbers = {
        "6a peak of (m_S+m_F)(p), G=64": {k: v for k, v in peaks.items() if v is not None},
        "6a max |enumeration - expected_mass_curve|": mass_crosscheck(),
    }
    for label, rows in step.items():
        numbers[f"6b E[ΔH] of one SGD step (lr 1) at p={ONE_STEP_PS}, {label}"] = [r["dH"] for r in rows]
    for label, rows in step.items():
        numbers[f"6b   ... of it from all-equal groups, {label}"] = [r["dH_all_equal_groups"] for r in rows]
    numbers["6b entropy per unit of progress at p=0.5, first order in lr (exact)"] = first
    numbers[f"6b the same at lr {SGD_LR} (exact, one step)"] = at_lr
    numbers["6c a_1 - a_0 at p = 0.1, 0.5, 0.9 (exact): each prompt's speed along its one direction"] = speed
    numbers[f"6c exact lr → 0 path of SGD, at solve rate {MATCH_P}: entropy (mean over {SEEDS} populations)"] = {
        label: round(mean_se(matched["path"][label][1])[0], 4) for label in labels}
    numbers["6c   ... minus mean's: entropy, entropy among correct, coverage@16 (mean ± SE)"] = {
        label: three(gap(matched["path"], label)) for label in others}
    numbers[f"6c SGD lr {SGD_LR}, at solve rate {MATCH_P}, minus mean's (paired): entropy, among correct, "
            f"coverage@{COVERAGE_K}"] = {label: three(gap(matched["sgd"], label)) for label in others}
    numbers["6c   ... minus the exact path's difference: the sign axis under SGD beyond first order"] = {
        label: three(beyond[label]) for label in others}
    for lr in ADAM_LRS:
        numbers[f"6c Adam lr {lr:g}, at solve rate {MATCH_P}, minus mean's (paired): entropy, among correct, "
                f"coverage@{COVERAGE_K}"] = {label: three(gap(matched["adam"][lr], label)) for label in others}
    numbers[f"6c Adam lr {ADAM_LR}, at solve rate {MATCH_P}: entropy, among correct, coverage@{COVERAGE_K}"] = {
        label: ", ".join(f"{mean_se(matched['adam'][ADAM_LR][label][i])[0]:.3f}" for i in (1, 2, 3))
        for label in labels}
    numbers[f"6c steps to solve rate {MATCH_P}: Adam lr {', '.join(f'{lr:g}' for lr in ADAM_LRS)}; SGD lr {SGD_LR}"] = {
        label: [round(mean_se(steps_to(adam[lr][label]["hist"], MATCH_P))[0], 1) for lr in ADAM_LRS]
        + [round(mean_se(steps_to(sgd[label]["hist"], MATCH_P))[0], 1)] for label in labels}

    def verdict(label: str, sign: int, name: str, hyper: dict) -> tuple[str, str]:
        holds = lambda d: differs(d[1], sign) and differs(d[2], sign)
        on_adam = [holds(gap(matched["adam"][lr], label)) for lr in ADAM_LRS]
        on_sgd = holds(beyond[label])
        where = [f"{lr:g}" for lr, h in zip(ADAM_LRS, on_adam) if h]
        first_gap = gap(matched["path"], label)
        constant = max(speed[label]) - min(speed[label]) < 1e-12
        why = ("0 up to the integration: a_1 - a_0 does not depend on p, so it follows mean's path" if constant else
               f"a first-order difficulty effect: a_1 - a_0 = {speed[label][0]:.3f} / {speed[label][1]:.3f} / "
               f"{speed[label][2]:.3f} at p = 0.1 / 0.5 / 0.9 shifts the update toward "
               f"{'hard' if speed[label][0] > speed[label][2] else 'easy'} prompts")
        text = (f"Adam: holds at lr {', '.join(where) if where else 'none'} of {', '.join(f'{lr:g}' for lr in ADAM_LRS)} "
                f"(vs mean at solve rate {MATCH_P}, entropy / among correct: "
                + "; ".join(f"lr {lr:g} {pm(gap(matched['adam'][lr], label)[1])} / {pm(gap(matched['adam'][lr], label)[2])}"
                            for lr in ADAM_LRS)
                + f"). SGD lr {SGD_LR}: {pm(gap(matched['sgd'], label)[1])} / {pm(gap(matched['sgd'], label)[2])}, of "
                f"which the exact lr → 0 path gives {mean_se(first_gap[1])[0]:+.3f} / {mean_se(first_gap[2])[0]:+.3f} "
                f"({why}); beyond first order {pm(beyond[label][1])} / {pm(beyond[label][2])}: "
                f"{'holds' if on_sgd else 'does not hold'}")
        return sign_axis_label(on_adam, on_sgd), text

    psr_high, nsr_low = step["psr (success only)"][-1], step["nsr (failure only)"][0]    # p = 0.99, p = 0.05
    claims = [
        report.claim("Mean-centred GRPO's mass peaks at p = 1/2; `power` with alpha = 2 at p = 1/(1+alpha)",
                     report.agrees_if(peaks["mean"] == 0.5 and abs(peaks["power"] - 1 / 3) <= 1 / 64),
                     f"peaks: mean {peaks['mean']}, grpo {peaks['grpo']}, power(alpha=2) {peaks['power']:.3f}, "
                     f"maxrl {peaks['maxrl']}; enumeration = expected_mass_curve to "
                     f"{numbers['6a max |enumeration - expected_mass_curve|']:.0e}"),
    ]
    texts = {"psr (success only)": (-1, "Success-biased updates collapse entropy: psr (success only)",
                                    f" psr does not cancel all-correct groups: one SGD step at p=0.99 costs E[ΔH] "
                                    f"{psr_high['dH']:+.4f}, of which {psr_high['dH_all_equal_groups']:+.4f} from "
                                    "all-equal groups."),
             "asym δ=2 (success-biased)": (-1, "Success-biased updates collapse entropy: asym δ=2 (mean-centred, "
                                           "successes weigh 2x failures)", ""),
             "asym δ=0.5 (failure-biased)": (+1, "Failure-biased updates keep entropy up: asym δ=0.5 (failures "
                                             "weigh 2x successes)", ""),
             "w_reinforce λ=0.1 (failure-biased)": (+1, "Failure-biased updates keep entropy up: w_reinforce "
                                                    "(successes +0.1, failures -1; Zhu et al.'s proposal)", ""),
             "nsr (failure only)": (+1, "Failure-biased updates keep entropy up: nsr (failure only)",
                                    f" nsr does not cancel all-wrong groups: one SGD step at p=0.05 costs E[ΔH] "
                                    f"{nsr_low['dH']:+.4f}, of which {nsr_low['dH_all_equal_groups']:+.4f} from "
                                    "all-equal groups.")}
    for label, name, hyper in METHODS:
        if label in texts:
            sign, text, extra = texts[label]
            lab, evidence = verdict(label, sign, name, hyper)
            claims.append(report.claim(text, lab, evidence + "." + extra))

    fig, (ax0, ax1, ax2, ax3) = report.figure(4, width=21, height=4.6)
    fig.subplots_adjust(left=0.04, right=0.99, top=0.86, wspace=0.3)
    for name in adv_lib.ADVANTAGES:
        p, m_S, m_F = adv_lib.mass_curve(name, G=64)
        total = m_S + m_F
        if float(total.max()) > 0:
            ax0.plot(p, total / total.max(), lw=1.1, label=name)
    ax0.set(title="6a. difficulty axis: (m_S+m_F)(p) / max", xlabel="group solve rate p")
    ax0.legend(fontsize=6, ncol=2)
    colors = ("C3", "C1", "C0", "C2", "C5", "C4")
    lrs = torch.tensor(ADAM_LRS)
    for c, (label, color) in enumerate(zip(labels, colors)):
        ax1.plot(ONE_STEP_PS, [r["dH"] for r in step[label]], "o-", color=color, label=label)
        ax1.plot(ONE_STEP_PS, [r["dH_all_equal_groups"] for r in step[label]], ":", color=color)
        for hist, style in ((adam[ADAM_LR][label]["hist"], "-"), (sgd[label]["hist"], "--"), (path[:, c], ":")):
            h = hist.mean(-1)                                                    # [T, 4]
            ax2.plot(h[:, 0], h[:, 2], style, color=color)
        stats = [mean_se(gap(matched["adam"][lr], label)[2]) for lr in ADAM_LRS]
        ax3.errorbar(lrs, [m for m, _ in stats], yerr=[2 * se for _, se in stats], fmt="o-", color=color, capsize=3,
                     label=label)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="6b. exact E[ΔH] of one SGD step\n(dotted: the part from all-equal groups)", xlabel="solve rate p",
            ylabel="nats")
    ax1.legend(fontsize=7)
    ax2.axvline(MATCH_P, color="0.6", lw=0.8)
    ax2.set(title=f"6c. entropy among correct answers (solid: Adam lr {ADAM_LR},\ndashed: SGD lr {SGD_LR}, "
                  f"dotted: exact lr → 0 path; {SEEDS} seeds)", xlabel="mean solve rate", ylabel="nats", xlim=(0.4, 1.0))
    ax3.axhline(0, color="k", lw=0.8)
    report.log_axis(ax3, "x")
    ax3.set_xticks(list(ADAM_LRS))
    ax3.set(title=f"6c. Adam: entropy among correct minus mean's\nat solve rate {MATCH_P} (± 2 SE) vs step size",
            xlabel="Adam lr", ylabel="nats")
    ax3.legend(fontsize=7)
    png = report.save(fig, out_dir, "exp6_sign_difficulty.png")
    return {"numbers": numbers, "claims": claims, "png": png.split("/")[-1], "runs": {"adam": adam, "sgd": sgd},
            "matched": matched}


def sign_axis_label(adam: list, sgd: bool) -> str:
    """The verdict on a sign-axis claim (report.LABELS) from where it holds.

    adam: one bool per Adam step size tried (ADAM_LRS); sgd: whether it holds under SGD
    beyond first order (exp6's control).
      at every Adam step size:  "agrees" if it also holds under SGD, else "depends on the optimizer"
      at some of them only:     "depends on the step size" (whatever SGD says: the analog
                                cannot settle it with Adam, the papers' optimizer)
      at none:                  "depends on the optimizer" if it holds under SGD, else "not reproduced"
    """
    if all(adam):
        return "agrees" if sgd else "depends on the optimizer"
    if any(adam):
        return "depends on the step size"
    return "depends on the optimizer" if sgd else "not reproduced"


# ---------------------------------------------------------------------------------------
# Experiment 7: FADE's schedule against static (alpha, delta)
# ---------------------------------------------------------------------------------------

def exp7_fade_schedule(out_dir: str) -> dict:
    """FADE (scheduled alpha, delta) vs static (alpha, delta) baselines, with Adam, 5 seeds; what its speed comes from.

    The paper's claim for FADE is about speed and diversity: peak accuracy sooner than
    the best static baseline, and a better accuracy-diversity trade-off (pass@k). It is
    not "entropy is held at the target". Same model and populations as 6c (96 prompts,
    5 seeds, Adam lr 0.05, 150 steps). FADE: the `fade` advantage with knobs from
    scheduler.AdvantageScheduler, ema_beta 0.1 and an absolute target of 0.8 nats (the
    constants FADE_BETA, FADE_TARGET say why). Static baselines fade(alpha, delta) with
    (alpha, delta) in (1, 1) (= Dr. GRPO's mean), (2, 1) (`power`) and (1, 0.5).
    Speed: the (interpolated) step at which the mean solve rate reaches 0.9; this
    analog's solve rate rises monotonically, so "steps to peak" becomes "steps to a fixed
    level". Diversity: entropy among correct answers and coverage@16 at step 150.
    FADE changes two things at once: the SHAPE of the advantage (alpha > 1 leans on hard
    prompts, delta < 1 on failures) and its SCALE (alpha = 1.5 at the start multiplies
    every advantage by (1 - p)^0.5 < 1; as alpha anneals to 1 the scale grows back). Two
    controls separate them (`simulate`): `mean` rescaled every step to FADE's batch
    sum |A| (FADE's step size, mean's shape) and FADE's own (alpha, delta) rescaled to
    mean's sum |A| (FADE's shape, mean's step size). A third control runs FADE, mean and
    both controls with plain SGD (lr 1.5), where a scale IS a step size.
    Claim 1 agrees if FADE reaches 0.9 sooner than the fastest static baseline AND sooner
    than the scale-matched control, each by more than 2 SE (paired by seed): only then is
    the schedule, not the step size, what makes it faster. If it does and SGD reverses
    it, the label is "depends on the optimizer". Claim 2 holds if no static baseline that
    ends at least as accurate (final solve rate >= FADE's - 0.005) ends with coverage@16
    more than 2 SE above FADE's.
    """
    sims = runs("adam")[ADAM_LR]
    sgd = runs("sgd")[SGD_LR]
    hist = {label: run["hist"][:ADAM_STEPS + 1] for label, run in sims.items()}          # the 150-step runs
    labels = [static_label(a, d) for a, d in STATIC]
    fade = sims[FADE_RUN]
    arms = labels + [FADE_RUN, SCALE_CONTROL, SHAPE_CONTROL]
    t90 = {label: steps_to(hist[label], MATCH_P) for label in arms}
    t90_sgd = {label: steps_to(sgd[label]["hist"], MATCH_P) for label in ("mean (balanced)", FADE_RUN, SCALE_CONTROL,
                                                                          SHAPE_CONTROL)}
    final = {label: hist[label][-1] for label in labels + [FADE_RUN]}                       # [4, seeds]
    fastest = min(labels, key=lambda label: mean_se(t90[label])[0])
    delta = fade["delta"][:ADAM_STEPS]                                                     # [T, seeds]
    scale = fade["scale"][:ADAM_STEPS].mean(1)                                             # [T], mean over seeds
    engaged = (delta < 1).any(1).nonzero().flatten()
    n_correct = 1 + torch.arange(PROMPTS) % 4
    reach = max_entropy(mean_se(final[FADE_RUN][0])[0], n_correct)
    names = ("solve rate", "entropy", "entropy among correct", f"coverage@{COVERAGE_K}")
    pm = lambda x: f"{mean_se(x)[0]:+.1f} ± {mean_se(x)[1]:.1f}"
    vs_mean = lambda t, label: t[label] - t["mean (balanced)"]
    numbers = {
        f"steps to solve rate {MATCH_P}, Adam (mean ± SE over {SEEDS} seeds)":
            {label: f"{mean_se(t90[label])[0]:.1f} ± {mean_se(t90[label])[1]:.1f}" for label in arms},
        "  ... minus mean's, paired": {label: pm(vs_mean(t90, label)) for label in arms if label != "mean (balanced)"},
        f"steps to solve rate {MATCH_P}, SGD lr {SGD_LR}, minus mean's (mean's own: "
        f"{mean_se(t90_sgd['mean (balanced)'])[0]:.1f})": {label: pm(vs_mean(t90_sgd, label)) for label in t90_sgd
                                                            if label != "mean (balanced)"},
        "FADE's batch sum|A| / mean's on the same rewards, at steps 0, 10, 20, 30, 60, 100, 149": [
            round(float(scale[t]), 3) for t in (0, 10, 20, 30, 60, 100, ADAM_STEPS - 1)],
        f"at step {ADAM_STEPS}: " + ", ".join(names): {
            label: ", ".join(f"{mean_se(final[label][i])[0]:.3f}" for i in range(4)) for label in final},
        "FADE: H_target, most entropy possible at its final solve rate, H0": [FADE_TARGET, reach,
                                                                              mean_se(fade["hist"][0, 1])[0]],
        "FADE: first step with delta < 1, final delta (mean over seeds)": [
            int(engaged[0]) if len(engaged) else None, float(delta[-1].mean())],
        "FADE: alpha at step 0, first step with alpha = 1 (p_hat >= 0.6)": [
            float(fade["alpha"][0].mean()), int((fade["alpha"] == 1).all(1).nonzero()[0])],
    }
    gain = t90[FADE_RUN] - t90[fastest]
    vs_scale = t90[FADE_RUN] - t90[SCALE_CONTROL]
    sgd_gain = vs_mean(t90_sgd, FADE_RUN)
    label_1 = fade_speed_label(gain, vs_scale, sgd_gain)
    if not differs(gain, -1):
        reading = "FADE is not faster than the fastest static baseline"
    elif not differs(vs_scale, -1):
        shape = vs_mean(t90, SHAPE_CONTROL)
        reading = ("FADE is faster than every static baseline, but the step size explains it: mean at FADE's scale "
                   "is as fast or faster, and FADE's shape at mean's scale is "
                   + ("slower than" if differs(shape, +1) else "faster than" if differs(shape, -1) else "as fast as")
                   + " mean")
    else:
        reading = "FADE beats the scale-matched control too: the schedule itself makes it faster"
    rivals = [label for label in labels
              if mean_se(final[label][0])[0] >= mean_se(final[FADE_RUN][0])[0] - 0.005
              and differs(final[label][3] - final[FADE_RUN][3], +1)]
    fin = lambda label, i: mean_se(final[label][i])[0]
    claims = [
        report.claim("FADE reaches peak accuracy sooner than the best static baseline",
                     label_1,
                     f"{reading}. Steps to solve rate {MATCH_P} (Adam lr {ADAM_LR}, {SEEDS} seeds, paired): FADE "
                     f"{mean_se(t90[FADE_RUN])[0]:.1f}, {pm(gain)} vs the fastest static ({fastest}); mean at FADE's "
                     f"sum|A| {pm(vs_mean(t90, SCALE_CONTROL))} vs mean, FADE {pm(vs_mean(t90, FADE_RUN))}, FADE minus "
                     f"the scale-matched control {pm(vs_scale)}; FADE's (alpha, delta) at mean's scale "
                     f"{pm(vs_mean(t90, SHAPE_CONTROL))}. Why: alpha starts at {float(fade['alpha'][0].mean()):.2f}, "
                     f"so FADE's sum|A| starts at {float(scale[0]):.2f}x mean's and grows to "
                     f"{float(scale[30]):.2f}x by step 30 as alpha anneals to 1; Adam's second moment still remembers "
                     f"the small early gradients, so the effective step grows. Under SGD, where the scale is the step, "
                     f"FADE is {pm(sgd_gain)} steps vs mean"),
        report.claim("FADE ends with a better accuracy-diversity trade-off than static baselines",
                     report.agrees_if(not rivals),
                     f"at step {ADAM_STEPS}, solve rate / entropy among correct / coverage@{COVERAGE_K}: FADE "
                     f"{fin(FADE_RUN, 0):.3f} / {fin(FADE_RUN, 2):.3f} / {fin(FADE_RUN, 3):.3f}; "
                     + "; ".join(f"{label} {fin(label, 0):.3f} / {fin(label, 2):.3f} / {fin(label, 3):.3f}"
                                 for label in labels)
                     + (f". As accurate and more coverage: {', '.join(rivals)}" if rivals else "")
                     + f". FADE's delta first drops below 1 at step "
                       f"{numbers['FADE: first step with delta < 1, final delta (mean over seeds)'][0]} and ends at "
                       f"{float(delta[-1].mean()):.2f}: delta = 1 + H_hat - H_target moves by the entropy deficit in "
                       f"nats, so it bites late and softly"),
    ]
    fig, (ax0, ax1, ax2) = report.figure(3, width=16, height=4.4)
    for label, color in zip(arms, [f"C{i}" for i in range(len(labels))] + ["k", "C4", "C5"]):
        h = hist[label].mean(-1)
        style = ":" if label in (SCALE_CONTROL, SHAPE_CONTROL) else "-"
        ax0.plot(h[:, 0], style, color=color, label=label)
        if label in final:
            ax1.plot(h[:, 0], h[:, 3], color=color, label=label)
    ax0.axhline(MATCH_P, color="0.6", lw=0.8)
    ax0.set(title=f"7a. mean solve rate (Adam, mean of {SEEDS} seeds;\ndotted: the two controls)", xlabel="step",
            ylabel="solve rate", xlim=(0, 100))
    ax0.legend(fontsize=7)
    ax1.set(title=f"7b. coverage@{COVERAGE_K} of correct answers vs solve rate", xlabel="mean solve rate",
            ylabel=f"coverage@{COVERAGE_K}", xlim=(0.6, 1.0))
    ax2.plot(range(ADAM_STEPS), fade["scale"][:ADAM_STEPS].mean(1), color="k", label="sum|A|: FADE / mean")
    ax2.plot(range(ADAM_STEPS), fade["alpha"][:ADAM_STEPS].mean(1), color="C1", label="alpha")
    ax2.plot(range(ADAM_STEPS), delta.mean(1), color="C2", label="delta")
    ax2.axhline(1, color="0.6", lw=0.8)
    ax2.set(title="7c. FADE's knobs and its advantage scale\nrelative to mean's (mean of seeds)", xlabel="step")
    ax2.legend(fontsize=7)
    png = report.save(fig, out_dir, "exp7_fade_schedule.png")
    return {"numbers": numbers, "claims": claims, "png": png.split("/")[-1], "runs": sims, "sgd": sgd}


def fade_speed_label(vs_static: torch.Tensor, vs_scale: torch.Tensor, vs_mean_sgd: torch.Tensor) -> str:
    """The verdict on "FADE reaches peak accuracy sooner" from seed-paired step differences [seeds].

    vs_static: FADE minus the fastest static baseline (Adam); vs_scale: FADE minus the
    scale-matched control, mean at FADE's sum |A| (Adam); vs_mean_sgd: FADE minus mean
    under SGD. Negative = FADE sooner. The schedule gets the credit only if FADE beats
    both the static baselines AND its own step size on mean's shape, each by more than
    2 SE: "agrees" if it also beats mean under SGD, "depends on the optimizer" if not.
    Otherwise "not reproduced" (the evidence says whether the static baselines or the
    scale-matched control were the faster).
    """
    if not (differs(vs_static, -1) and differs(vs_scale, -1)):
        return "not reproduced"
    return "agrees" if differs(vs_mean_sgd, -1) else "depends on the optimizer"
