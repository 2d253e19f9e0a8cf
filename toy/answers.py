"""The softmax-over-answers analog: a prompt is ONE softmax over its final answers (experiments 6, 7).

The second analog of the toy, beside bandit.py's three-token "LM": it has no tokens and no
shared parameters, so it cannot show cancellation, but it has entropy to lose, which is what
the FADE paper's claims are about.

Experiments 6 and 7 (toy/fade.py) need the simplest model that has entropy to lose: a
prompt is ONE softmax over K = 8 final answers, some of them correct (logits z,
pi = softmax(z); no tokens, no shared parameters). A group is G = 4 answers. For one-token answers loss.policy_loss
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


Here: the exact pieces (one prompt, every group: 6a, 6b), the learning simulations with
sampled groups (SGD or Adam, many prompts: 6c, 7), and the exact lr -> 0 path of SGD.

The configs of `simulate`. A static advantage is (label, advantage name, hyper-parameters
as a tuple of (key, value)). (label, "FADE", SchedulerConfig) is the `fade` advantage with
alpha, delta from scheduler.AdvantageScheduler, one scheduler per seed, fed each step that
seed's batch solve rate and mean entropy. Two controls split what FADE changes into its
two parts: (label, "FADE scale", FADE label) is Dr. GRPO's `mean` on its own rewards,
multiplied each step (per seed) so that its batch sum |A| equals the FADE run's at that
step (FADE's step size with mean's shape); (label, "FADE shape", FADE label) is `fade` with
the FADE run's (alpha, delta) of the step, multiplied so that its sum |A| equals `mean`'s
on the same rewards (FADE's shape at mean's step size). A scalar factor on a step's
advantages is a step size: under SGD it scales the update directly; under Adam it cancels
out in the long run, but not while Adam's second moment (beta2 = 0.999, a memory of ~1000
steps) still remembers smaller gradients, so a GROWING scale is a growing effective step
(experiment 7). Every config gets the SAME uniform numbers for its draws (common random
numbers, one stream seeded 1000): two configs whose policies agree draw the same answers,
so their paired difference carries less sampling noise, and adding a config changes
nobody else's run.
"""

from __future__ import annotations

import itertools
import math

import torch

import advantages as adv_lib
import aggregation
import loss as loss_lib
import scheduler as sched_lib
from toy import breakers

K_ANS = 8            # answers per prompt
G = 4
DTYPE = torch.float64
MATCH_P = 0.9        # 6c and 7 compare diversity at this mean solve rate (every run reaches it)
SEEDS = 5
PROMPTS = 96
COVERAGE_K = 16     # a power of two (`diversity` squares its way there)


# ---------------------------------------------------------------------------------------
# One prompt, exactly (6a, 6b): its logits, every group of G answers, one step
# ---------------------------------------------------------------------------------------

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
                                   aggregation.step_normaliser(torch.ones(G, 1, dtype=DTYPE)))
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

    configs: tuple of (label, kind, parameters): a static advantage (kind = its name), "FADE",
    or its two controls "FADE scale" and "FADE shape" (the module header says what each is).
    optimizer: "sgd" (z += lr Delta z) or "adam" (breakers.adam_step on the loss gradient
    -Delta z, torch.optim.Adam's defaults). lr: one float, or a tuple with one per config.
    Seed s: population(s), the same initial prompts for every config; every config draws its
    answers from the same uniform numbers (common random numbers). Delta z is
    `logit_update`, equal to loss.policy_loss's gradient (tested).
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


def rollout_gap(name: str, p: torch.Tensor, **hyper) -> torch.Tensor:
    """a_1(p) - a_0(p): a correct rollout's expected advantage minus a wrong one's, exactly.

        a_1(p) = sum_k B(k; G-1, p) A_correct(k + 1 correct of G)
        a_0(p) = sum_k B(k; G-1, p) A_wrong(k correct of G)

    A rollout's advantage depends on its own reward and on the other G - 1 rewards of its
    group, Binomial(G - 1, p); A_correct(c), A_wrong(c) are read off the advantage function
    itself (advantages.compute_advantages; no second formula). By fact 1 of the module
    header E[Delta z] = lr (a_1 - a_0) grad_z p: the SPEED at which a prompt of solve rate p
    moves. psr and nsr give 1, w_reinforce 1 + lam, mean (G-1)/G, all independent of p; asym
    delta gives (G-1)/G (1 - p + p/delta), which is not (tested). p: any shape; returns the
    same shape. Advantages that look beyond their group (reinforce_pp) have no closed form.
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
