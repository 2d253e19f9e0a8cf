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

What plain SGD on these logits can and cannot show (spec section 2, corrected):
1. In expectation over the group, E[Delta z] = lr (a_1 - a_0) grad_z p, where a_r is a
   rollout's expected advantage given its reward r. Every advantage moves along the
   SAME direction; the sign axis only changes the speed. psr (A = r) and nsr (A = r - 1)
   have identical expected updates, and to first order in lr every advantage spends the
   same entropy per unit of solve rate gained (6b computes it exactly).
2. Per group, a mass imbalance does move entropy: the term -(sum_i A_i) pi of Delta z is
   the (m_S - m_F) kappa term of spec section 2's formula. But over on-policy samples a
   constant shift of the advantages has no first-order effect (E_pi[e_o - pi] = 0), so
   in expectation the imbalance drops out. (An earlier reading of the formula gave a
   success surplus a first-order entropy effect; it is withdrawn.)
So under SGD the sign axis reaches entropy only through second-order effects: the step
size, and finite groups (psr pushes up whatever an all-correct group sampled, nsr down
whatever an all-wrong group sampled; zero-sum advantages give such groups exactly 0).
Real training adds Adam's per-coordinate normalisation, clipping and function
approximation. Adam is the one the papers use (train.py too), and it changes the
picture: it divides each logit's step by that logit's own running gradient scale, so a
small but consistent push moves a logit as fast as a large one. Under nsr every correct
answer's logit gets the small consistent push +(#wrong / G) pi_a, and with Adam all of
them rise at the same speed, the rare ones included; under psr a correct answer that is
not sampled gets -(#correct / G) pi_a and falls at full speed. So 6c trains with Adam
and keeps SGD beside it as the control, and experiment 7 runs FADE with Adam.

Diversity is measured three ways, always at EQUAL solve rate (methods learn at different
speeds, and entropy falls as the solve rate rises, so equal steps would mostly compare
speeds): total entropy; entropy among the correct answers (H of pi restricted to the
correct answers and renormalised, over prompts with >= 2 of them); and coverage@16, the
expected fraction of a prompt's correct answers that 16 samples find,
(1/n_correct) sum_{a correct} (1 - (1 - pi_a)^16), a pass@k-style measure of the distinct
correct answers the policy keeps.

6a and 6b are exact (closed forms; sums over all C(11, 4) = 330 groups). 6c and 7 are
learning simulations with sampled groups: 96 prompts of mixed difficulty, 5 seeds (each
its own population order and sampling stream), mean ± standard error over seeds.
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
# The sign-axis probes of 6b/6c: (label, advantage name, hyper-parameters).
METHODS = (("psr (success only)", "psr", {}),
           ("asym δ=2 (success-biased)", "asym", {"delta": 2.0}),
           ("mean (balanced)", "mean", {}),
           ("asym δ=0.5 (failure-biased)", "asym", {"delta": 0.5}),
           ("nsr (failure only)", "nsr", {}))
ONE_STEP_PS = (0.05, 0.2, 0.5, 0.8, 0.95, 0.99)
MATCH_P = 0.9        # 6c and 7 compare diversity at this mean solve rate (every run reaches it)
SEEDS = 5
PROMPTS = 96
COVERAGE_K = 16
SGD_LR, SGD_STEPS = 1.5, 45             # the control (lr of the toy's earlier runs; all reach 0.9 by ~31)
ADAM_LR, ADAM_STEPS = 0.05, 150         # train.py's optimizer (betas 0.9/0.999, eps 1e-8, no decay, no clip)
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
    and asym: the sign axis has no first-order effect on entropy at equal progress.
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
    """
    lp = _log_softmax(z)
    pi = lp.exp()
    solve = (pi * correct).sum(-1)                                           # [..., M]
    H = -(pi * lp).sum(-1)
    pc = torch.where(correct, pi, torch.zeros_like(pi)) / solve.unsqueeze(-1)
    H_correct = -(pc * torch.log(pc.clamp_min(1e-300))).sum(-1)
    n_correct = correct.sum(-1)
    coverage = torch.where(correct, 1 - (1 - pi) ** COVERAGE_K, torch.zeros_like(pi)).sum(-1) / n_correct
    multi = (n_correct >= 2).to(DTYPE)
    among = lambda x: (x * multi).sum(-1) / multi.sum(-1)
    return torch.stack([solve.mean(-1), H.mean(-1), among(H_correct), among(coverage)])


def simulate(configs: tuple, optimizer: str, lr: float, steps: int, seeds: int = SEEDS,
             M: int = PROMPTS) -> dict:
    """Train every config on `seeds` populations of M prompts at once; return the trajectories.

    configs: tuple of (label, advantage name, hyper-parameters as a tuple of (key, value)),
    or (label, "FADE", SchedulerConfig) for the `fade` advantage with alpha, delta from
    scheduler.AdvantageScheduler, one scheduler per seed, fed each step that seed's batch
    solve rate and mean entropy. optimizer: "sgd" (z += lr Delta z) or "adam"
    (breakers.adam_step on the loss gradient -Delta z, torch.optim.Adam's defaults).
    Seed s: population(s), the same initial prompts for every config; the answers are
    drawn by inverse-CDF sampling from one stream (seeded 1000). Delta z is
    `logit_update`, equal to loss.policy_loss's gradient (tested).
    Returns {"hist": [steps + 1, C, 4, seeds] `diversity` before each step and at the end,
    "alpha", "delta": {label: [steps, seeds]} for scheduled configs}.
    """
    C = len(configs)
    z0, correct = zip(*(population(s, M) for s in range(seeds)))
    z = torch.stack(z0).expand(C, seeds, M, K_ANS).clone()                  # [C, S, M, K]
    correct = torch.stack(correct).expand(C, seeds, M, K_ANS)
    scheds = {c: [sched_lib.AdvantageScheduler(cfg[2]) for _ in range(seeds)]
              for c, cfg in enumerate(configs) if cfg[1] == "FADE"}
    gen = torch.Generator().manual_seed(1000)
    state, hist = {}, []
    knobs_log = {key: {configs[c][0]: [] for c in scheds} for key in ("alpha", "delta")}
    for _ in range(steps):
        hist.append(diversity(z, correct).transpose(0, 1))                  # [C, 4, S]
        pi = _log_softmax(z).exp()
        cdf = pi.cumsum(-1)
        u = torch.rand((C, seeds, M, G), generator=gen, dtype=DTYPE) * cdf[..., -1:]
        answers = torch.searchsorted(cdf, u).clamp_max(K_ANS - 1)            # [C, S, M, G]
        rewards = correct.gather(3, answers).to(DTYPE)
        A = torch.empty_like(rewards)
        for c, (label, name, hyper) in enumerate(configs):
            if c not in scheds:
                A[c] = adv_lib.compute_advantages(name, rewards[c].reshape(-1, G), **dict(hyper)).view(seeds, M, G)
                continue
            knobs = [scheds[c][s].step(float(rewards[c, s].mean()), float(hist[-1][c, 1, s])) for s in range(seeds)]
            for key in ("alpha", "delta"):
                knobs_log[key][label].append([k[key] for k in knobs])
            for pair in {(k["alpha"], k["delta"]) for k in knobs}:          # one call per distinct knob pair
                same = [s for s, k in enumerate(knobs) if (k["alpha"], k["delta"]) == pair]
                A[c, same] = adv_lib.compute_advantages("fade", rewards[c, same].reshape(-1, G), alpha=pair[0],
                                                        delta=pair[1]).view(len(same), M, G)
        dz = logit_update(A, answers, pi)
        if optimizer == "sgd":
            z = z + lr * dz
        else:
            breakers.adam_step(z, -dz, state, lr)
    hist.append(diversity(z, correct).transpose(0, 1))
    return {"hist": torch.stack(hist),
            **{key: {k: torch.tensor(v, dtype=DTYPE) for k, v in log.items()} for key, log in knobs_log.items()}}


def logit_update(adv: torch.Tensor, answers: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """Delta z at lr 1 for groups of one-token answers: (sum_i A_i e_{o_i} - (sum_i A_i) pi) / G.

    adv, answers: [..., G]; pi: [..., K]. Returns [..., K]. The module header's closed
    form, which is loss.policy_loss's gradient (PPO on-policy, token-mean; tested).
    """
    onehot = (answers.unsqueeze(-1) == torch.arange(pi.shape[-1])).to(pi.dtype)      # [..., G, K]
    return ((adv.unsqueeze(-1) * onehot).sum(-2) - adv.sum(-1, keepdim=True) * pi) / adv.shape[-1]


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """log softmax over the last (short) dimension, written out: torch's kernel is ~10x slower at K = 8."""
    shifted = z - z.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def sign_configs() -> tuple:
    """6c's configs: METHODS in simulate's format."""
    return tuple((label, name, tuple(hyper.items())) for label, name, hyper in METHODS)


@functools.lru_cache(maxsize=2)
def runs(optimizer: str) -> dict:
    """The shared simulations: SGD runs METHODS; Adam runs METHODS, the static baselines, FADE.

    Cached: experiments 6 and 7 use the same Adam batch. Returns {label: {"hist":
    [T+1, 4, seeds], "alpha", "delta": [T, seeds] or None}}.
    """
    configs = sign_configs()
    if optimizer == "sgd":
        out = simulate(configs, "sgd", SGD_LR, SGD_STEPS)
    else:
        configs += tuple((f"static α={a:g} δ={d:g}", "fade", (("alpha", a), ("delta", d)))
                         for a, d in STATIC if (a, d) not in ((1.0, 1.0), (1.0, 0.5)))
        configs += (("FADE schedule", "FADE", sched_lib.SchedulerConfig(beta=FADE_BETA, h_target=FADE_TARGET)),)
        out = simulate(configs, "adam", ADAM_LR, ADAM_STEPS)
    return {label: {"hist": out["hist"][:, c], "alpha": out["alpha"].get(label), "delta": out["delta"].get(label)}
            for c, (label, _, _) in enumerate(configs)}


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
    at solve rate p for psr, asym delta=2, mean, asym delta=0.5 and nsr; the part of it
    from all-equal groups; and the entropy spent per unit of solve rate gained, to first
    order in lr (identical for all five: module header, fact 1) and at lr 1.5 (where it
    is not). 6c: 96 prompts of mixed difficulty, 5 seeds, trained with Adam (train.py's
    optimizer; lr 0.05 on logits, 150 steps) and with SGD (lr 1.5, 45 steps, the
    control); at the step where the mean solve rate reaches 0.9: total entropy, entropy
    among correct answers, coverage@16, each method minus `mean` paired by seed (mean ±
    SE). A claim holds for an optimizer when total entropy AND entropy among correct
    answers move the claimed way by more than 2 SE; the label compares the two
    optimizers (report.LABELS).
    """
    peaks = mass_peaks()
    step = {label: [one_step(p, name, **hyper) for p in ONE_STEP_PS] for label, name, hyper in METHODS}
    first = {label: first_order_cost(0.5, name, **hyper) for label, name, hyper in METHODS}
    at_lr = {label: (lambda r: r["dH"] / r["dp"])(one_step(0.5, name, lr=SGD_LR, **hyper))
             for label, name, hyper in METHODS}
    sims = {opt: runs(opt) for opt in ("adam", "sgd")}
    matched = {opt: {label: at_solve_rate(r["hist"], MATCH_P) for label, r in sims[opt].items()} for opt in sims}
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
    names = ("solve rate", "entropy", "entropy among correct", f"coverage@{COVERAGE_K}")
    for opt, what in (("adam", f"Adam lr {ADAM_LR}"), ("sgd", f"SGD lr {SGD_LR}")):
        base = matched[opt]["mean (balanced)"]
        for label, _, _ in METHODS:
            m = matched[opt][label]
            numbers[f"6c {what}, at solve rate {MATCH_P}: {label} (mean ± SE; minus mean's, paired)"] = {
                names[i]: f"{mean_se(m[i])[0]:.3f} ± {mean_se(m[i])[1]:.3f}; "
                          f"{mean_se(m[i] - base[i])[0]:+.3f} ± {mean_se(m[i] - base[i])[1]:.3f}" for i in (1, 2, 3)}
    numbers["6c steps to solve rate 0.9, Adam / SGD (mean over seeds)"] = {
        label: [mean_se(steps_to(sims[o][label]["hist"], MATCH_P))[0] for o in ("adam", "sgd")] for label, _, _ in METHODS}

    def verdict(label: str, sign: int) -> tuple[str, str]:
        holds, parts = {}, []
        for opt, what in (("adam", "Adam"), ("sgd", "SGD (control)")):
            d = matched[opt][label] - matched[opt]["mean (balanced)"]
            holds[opt] = differs(d[1], sign) and differs(d[2], sign)
            parts.append(f"{what}: entropy {mean_se(d[1])[0]:+.3f} ± {mean_se(d[1])[1]:.3f}, among correct "
                         f"{mean_se(d[2])[0]:+.3f} ± {mean_se(d[2])[1]:.3f}, coverage@{COVERAGE_K} "
                         f"{mean_se(d[3])[0]:+.3f} ± {mean_se(d[3])[1]:.3f}")
        label_out = ("agrees" if holds["adam"] and holds["sgd"] else "not reproduced" if not (holds["adam"] or holds["sgd"])
                     else "depends on the optimizer")
        which = {(True, True): "holds with Adam and SGD", (False, False): "holds with neither optimizer",
                 (True, False): "holds with Adam, not with SGD", (False, True): "holds with SGD, not with Adam"}
        return label_out, (f"{which[holds['adam'], holds['sgd']]}; vs mean at solve rate {MATCH_P}, {SEEDS} seeds: "
                           + "; ".join(parts))

    psr_high, nsr_low = step["psr (success only)"][-1], step["nsr (failure only)"][0]    # p = 0.99, p = 0.05
    spread = lambda d: max(d.values()) - min(d.values())
    claims = [
        report.claim("Mean-centred GRPO's mass peaks at p = 1/2; `power` with alpha = 2 at p = 1/(1+alpha)",
                     report.agrees_if(peaks["mean"] == 0.5 and abs(peaks["power"] - 1 / 3) <= 1 / 64),
                     f"peaks: mean {peaks['mean']}, grpo {peaks['grpo']}, power(alpha=2) {peaks['power']:.3f}, "
                     f"maxrl {peaks['maxrl']}; enumeration = expected_mass_curve to "
                     f"{numbers['6a max |enumeration - expected_mass_curve|']:.0e}"),
    ]
    texts = (("psr (success only)", -1, "Success-biased updates collapse entropy: psr (success only)",
              f" psr does not cancel all-correct groups: one SGD step at p=0.99 costs E[ΔH] {psr_high['dH']:+.4f}, "
              f"of which {psr_high['dH_all_equal_groups']:+.4f} from all-equal groups."),
             ("asym δ=2 (success-biased)", -1, "Success-biased updates collapse entropy: asym δ=2 (mean-centred, "
              "successes weigh 2x failures)", ""),
             ("asym δ=0.5 (failure-biased)", +1, "Failure-biased updates keep entropy up: asym δ=0.5 (failures "
              "weigh 2x successes)", ""),
             ("nsr (failure only)", +1, "Failure-biased updates keep entropy up: nsr (failure only)",
              f" nsr does not cancel all-wrong groups: one SGD step at p=0.05 costs E[ΔH] {nsr_low['dH']:+.4f}, "
              f"of which {nsr_low['dH_all_equal_groups']:+.4f} from all-equal groups."))
    second = (f" Under SGD the sign axis is second-order: to first order in lr every method spends "
              f"{first['mean (balanced)']:.3f} nats per unit of solve rate at p=0.5 (spread {spread(first):.0e}); "
              f"one step at lr {SGD_LR}: spread {spread(at_lr):.3f}.")
    for label, sign, text, extra in texts:
        lab, evidence = verdict(label, sign)
        claims.append(report.claim(text, lab, evidence + "." + extra + (second if lab != "agrees" else "")))

    fig, (ax0, ax1, ax2) = report.figure(3, width=16, height=4.6)
    fig.subplots_adjust(right=0.86, top=0.86)
    for name in adv_lib.ADVANTAGES:
        p, m_S, m_F = adv_lib.mass_curve(name, G=64)
        total = m_S + m_F
        if float(total.max()) > 0:
            ax0.plot(p, total / total.max(), lw=1.1, label=name)
    ax0.set(title="6a. difficulty axis: (m_S+m_F)(p) / max", xlabel="group solve rate p")
    ax0.legend(fontsize=6, ncol=2)
    for (label, _, _), color in zip(METHODS, ("C3", "C1", "C0", "C2", "C4")):
        ax1.plot(ONE_STEP_PS, [r["dH"] for r in step[label]], "o-", color=color, label=label)
        ax1.plot(ONE_STEP_PS, [r["dH_all_equal_groups"] for r in step[label]], ":", color=color)
        for opt, style in (("adam", "-"), ("sgd", "--")):
            h = sims[opt][label]["hist"].mean(-1)                               # [T, 4]
            ax2.plot(h[:, 0], h[:, 2], style, color=color, label=f"{label}, {opt}" if opt == "adam" else None)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="6b. exact E[ΔH] of one SGD step\n(dotted: the part from all-equal groups)", xlabel="solve rate p",
            ylabel="nats")
    ax1.legend(fontsize=7)
    ax2.axvline(MATCH_P, color="0.6", lw=0.8)
    ax2.set(title=f"6c. entropy among correct answers\n(solid: Adam, dashed: SGD; {SEEDS} seeds)", xlabel="mean solve rate",
            ylabel="nats", xlim=(0.4, 1.0))
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    png = report.save(fig, out_dir, "exp6_sign_difficulty.png")
    return {"numbers": numbers, "claims": claims, "png": png.split("/")[-1], "runs": sims, "matched": matched}


# ---------------------------------------------------------------------------------------
# Experiment 7: FADE's schedule against static (alpha, delta)
# ---------------------------------------------------------------------------------------

def exp7_fade_schedule(out_dir: str) -> dict:
    """FADE (scheduled alpha, delta) vs static (alpha, delta) baselines, with Adam, 5 seeds.

    The paper's claim for FADE is about speed and diversity: peak accuracy sooner than
    the best static baseline, and a better accuracy-diversity trade-off (pass@k). It is
    not "entropy is held at the target". Same model and populations as 6c (96 prompts,
    5 seeds, Adam lr 0.05, 150 steps). FADE: the `fade` advantage with knobs from
    scheduler.AdvantageScheduler, beta 0.1 and an absolute target of 0.8 nats (the
    constants FADE_BETA, FADE_TARGET say why). Static baselines fade(alpha, delta) with
    (alpha, delta) in (1, 1) (= Dr. GRPO's mean), (2, 1) (`power`) and (1, 0.5).
    Speed: the (interpolated) step at which the mean solve rate reaches 0.9; this
    analog's solve rate rises monotonically, so "steps to peak" becomes "steps to a fixed
    level". Diversity: entropy among correct answers and coverage@16 at the end.
    Claim 1 holds if FADE reaches 0.9 sooner than the fastest static baseline by more
    than 2 SE (paired by seed). Claim 2 holds if no static baseline that ends at least as
    accurate (final solve rate >= FADE's - 0.005) ends with coverage@16 more than 2 SE
    above FADE's.
    """
    sims = runs("adam")
    labels = [static_label(a, d) for a, d in STATIC]
    fade = sims["FADE schedule"]
    t90 = {label: steps_to(sims[label]["hist"], MATCH_P) for label in labels + ["FADE schedule"]}
    final = {label: sims[label]["hist"][-1] for label in labels + ["FADE schedule"]}            # [4, seeds]
    fastest = min(labels, key=lambda label: mean_se(t90[label])[0])
    delta = fade["delta"]                                                                      # [T, seeds]
    engaged = (delta < 1).any(1).nonzero().flatten()
    n_correct = 1 + torch.arange(PROMPTS) % 4
    reach = max_entropy(mean_se(final["FADE schedule"][0])[0], n_correct)
    names = ("solve rate", "entropy", "entropy among correct", f"coverage@{COVERAGE_K}")
    numbers = {
        f"steps to solve rate {MATCH_P} (mean ± SE over {SEEDS} seeds)":
            {label: f"{mean_se(t90[label])[0]:.1f} ± {mean_se(t90[label])[1]:.1f}" for label in t90},
        f"at step {ADAM_STEPS}: " + ", ".join(names): {
            label: ", ".join(f"{mean_se(final[label][i])[0]:.3f}" for i in range(4)) for label in final},
        "FADE: H_target, most entropy possible at its final solve rate, H0": [FADE_TARGET, reach,
                                                                              mean_se(fade["hist"][0, 1])[0]],
        "FADE: first step with delta < 1, final delta (mean over seeds)": [
            int(engaged[0]) if len(engaged) else None, float(delta[-1].mean())],
        "FADE: alpha at step 0, first step with alpha = 1 (p_hat >= 0.6)": [
            float(fade["alpha"][0].mean()), int((fade["alpha"] == 1).all(1).nonzero()[0])],
    }
    gain = t90["FADE schedule"] - t90[fastest]
    rivals = [label for label in labels
              if mean_se(final[label][0])[0] >= mean_se(final["FADE schedule"][0])[0] - 0.005
              and differs(final[label][3] - final["FADE schedule"][3], +1)]
    fin = lambda label, i: mean_se(final[label][i])[0]
    claims = [
        report.claim("FADE reaches peak accuracy sooner than the best static baseline",
                     report.agrees_if(differs(gain, -1)),
                     f"steps to solve rate {MATCH_P}: FADE {mean_se(t90['FADE schedule'])[0]:.1f}, fastest static "
                     f"({fastest}) {mean_se(t90[fastest])[0]:.1f}; paired difference {mean_se(gain)[0]:+.1f} ± "
                     f"{mean_se(gain)[1]:.1f} steps (Adam, {SEEDS} seeds). FADE's alpha starts at "
                     f"{sched_lib.fade_alpha(0.5):.1f} and is 1 from p_hat >= 0.6 on"),
        report.claim("FADE ends with a better accuracy-diversity trade-off than static baselines",
                     report.agrees_if(not rivals),
                     f"at step {ADAM_STEPS}, solve rate / entropy among correct / coverage@{COVERAGE_K}: FADE "
                     f"{fin('FADE schedule', 0):.3f} / {fin('FADE schedule', 2):.3f} / {fin('FADE schedule', 3):.3f}; "
                     + "; ".join(f"{label} {fin(label, 0):.3f} / {fin(label, 2):.3f} / {fin(label, 3):.3f}"
                                 for label in labels)
                     + (f". As accurate and more coverage: {', '.join(rivals)}" if rivals else "")
                     + f". FADE's delta first drops below 1 at step "
                       f"{numbers['FADE: first step with delta < 1, final delta (mean over seeds)'][0]} and ends at "
                       f"{float(delta[-1].mean()):.2f}: delta = 1 + H_hat - H_target moves by the entropy deficit in "
                       f"nats, so it bites late and softly"),
    ]
    fig, (ax0, ax1) = report.figure(2, height=4.4)
    for label, color in zip(labels + ["FADE schedule"], [f"C{i}" for i in range(len(labels))] + ["k"]):
        h = sims[label]["hist"].mean(-1)
        ax0.plot(h[:, 0], color=color, label=label)
        ax1.plot(h[:, 0], h[:, 3], color=color, label=label)
    ax0.axhline(MATCH_P, color="0.6", lw=0.8)
    ax0.set(title=f"7a. mean solve rate (Adam, mean of {SEEDS} seeds)", xlabel="step", ylabel="solve rate")
    ax0.legend(fontsize=7)
    ax1.set(title=f"7b. coverage@{COVERAGE_K} of correct answers vs solve rate", xlabel="mean solve rate",
            ylabel=f"coverage@{COVERAGE_K}", xlim=(0.6, 1.0))
    png = report.save(fig, out_dir, "exp7_fade_schedule.png")
    return {"numbers": numbers, "claims": claims, "png": png.split("/")[-1], "runs": sims}
