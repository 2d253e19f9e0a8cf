"""Experiment 6: the sign and difficulty axes of an advantage, and what they do to entropy (FADE).

The FADE paper (Decugis et al. 2026, arXiv 2607.01490) splits any advantage into a
success mass m_S = sum_{A_i > 0} A_i and a failure mass m_F = sum_{A_i < 0} |A_i|
(advantages.gradient_mass). The DIFFICULTY axis is where m_S(p) + m_F(p) peaks over the
solve rate p; the SIGN axis is m_S versus m_F. Its claims: success-biased updates
(m_S > m_F) collapse entropy, failure-biased ones keep it up, and a schedule that
amplifies failures once entropy falls below a target (scheduler.py) tracks the target.

For these we use the simplest model that has entropy to lose: a prompt is ONE softmax
over K = 8 final answers, some of them correct (logits z, pi = softmax(z); no tokens, no
shared parameters). A group is G = 4 answers. For one-token answers loss.policy_loss
(PPO on-policy, token-mean) has the gradient

    Delta z = (lr / G) sum_i A_i (e_{o_i} - pi)          (e_o: one-hot of answer o)

Two facts about it explain most of what follows:
1. In expectation over the group, E[Delta z] = lr (a_1 - a_0) grad_z p, where a_r is a
   rollout's expected advantage given its reward r. Every advantage moves along the
   SAME direction; the sign axis only changes the speed. psr (A = r) and nsr (A = r - 1)
   have identical expected updates. Whatever the sign axis does to entropy beyond speed,
   it does through the group-to-group variation of the update.
2. The normalisation term -(sum_i A_i) pi. For a zero-sum advantage it vanishes. When
   failures dominate (sum_i A_i < 0) it ADDS |sum A| pi to the logits, more to the likely
   answers: that sharpens pi. When successes dominate it flattens pi. (Spec section 2's
   first-order dH ~ eta [(m_S - m_F) H - Cov(A, log pi)] [recon] has the same sign: a
   success surplus RAISES entropy through its first term.)
And one fact about groups: an all-correct group carries no information about which
answers are correct, yet psr still pushes up whatever it sampled (pure drift, a
non-cancelling update); nsr does the same on all-wrong groups. Zero-sum advantages give
such groups exactly 0 (advantages.py zeroes them explicitly).

6a and 6b are exact (closed forms; sums over all C(11, 4) = 330 groups). 6c is a learning
simulation with sampled groups: one fixed-seed draw over 192 prompts, labelled as such.
"""

from __future__ import annotations

import itertools
import math

import torch

import advantages as adv_lib
import loss as loss_lib
import scheduler as sched_lib
from toy import report

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
MATCH_P = 0.95       # 6c compares entropies at equal progress: when the solve rate first reaches this


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
                                   loss_lib.step_normaliser(torch.ones(G, 1, dtype=DTYPE)), with_residual=False)
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


def simulate(name: str, steps: int = 100, lr: float = 1.5, M: int = 192, seed: int = 0,
             schedule: bool = False, **hyper) -> dict:
    """Train a population of M prompts of mixed difficulty with SAMPLED groups (one fixed draw).

    Prompt j: n_correct in {1, 2, 3, 4} (cycling) and an initial solve rate spread over
    [0.05, 0.8]; G = 4 answers per prompt per step; Delta z from the closed form in the
    module header (equal to loss.policy_loss's gradient, tested). schedule=True: the
    `fade` advantage with alpha, delta from scheduler.AdvantageScheduler (FADE defaults,
    H_target = 0.5 H0), fed each step the batch's solve rate and mean entropy.
    Returns per-step mean entropy and solve rate (and the schedule's knobs).
    """
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.linspace(0.05, 0.8, M, dtype=DTYPE)[torch.randperm(M, generator=gen)]
    z, correct = population_logits(p0, n_correct=1 + torch.arange(M) % 4)
    sched = sched_lib.AdvantageScheduler(sched_lib.SchedulerConfig()) if schedule else None
    out = {"entropy": [], "solve_rate": [], "delta": [], "alpha": [], "H_target": None}
    for _ in range(steps):
        pi = torch.softmax(z, -1)
        H = float(entropy(z).mean())
        out["entropy"].append(H)
        out["solve_rate"].append(float((pi * correct).sum(1).mean()))
        answers = torch.multinomial(pi, G, replacement=True, generator=gen)             # [M, G]
        rewards = correct.gather(1, answers).to(DTYPE)
        if sched is not None:
            knobs = sched.step(float(rewards.mean()), H)
            hyper = {"alpha": knobs["alpha"], "delta": knobs["delta"]}
            out["alpha"].append(knobs["alpha"])
            out["delta"].append(knobs["delta"])
            out["H_target"] = knobs["H_target"]
        A = adv_lib.compute_advantages(name, rewards, **hyper)
        onehot = torch.nn.functional.one_hot(answers, K_ANS).to(DTYPE)
        z = z + lr * (A.unsqueeze(-1) * (onehot - pi.unsqueeze(1))).mean(1)
    return out


def entropy_at_solve_rate(run: dict, p: float) -> float:
    """Mean entropy at the first step whose mean solve rate is >= p (NaN if never reached).

    Methods learn at different speeds (their masses differ), and entropy falls as the
    solve rate rises, so comparing them at the same STEP mostly compares speeds. At the
    same solve rate the remaining difference is what the sign axis does to entropy.
    """
    for H, solved in zip(run["entropy"], run["solve_rate"]):
        if solved >= p:
            return H
    return float("nan")      # every comparison with NaN is False: a claim cannot pass by default


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


def exp6_sign_and_difficulty(out_dir: str) -> dict:
    """Masses of every advantage (exact), one-step entropy change (exact), a learning simulation (sampled).

    The model: a prompt is one softmax over 8 answers, some correct; a group is G = 4
    answers; the update is loss.policy_loss's gradient (module header).
    6a: advantages.mass_curve for every registered advantage and where its total mass
    peaks, and a cross-check of advantages.expected_mass_curve against the enumeration of
    all 330 answer groups. 6b: the exact expected entropy change of ONE step (lr 1) at
    solve rate p, for psr, asym delta=2, mean, asym delta=0.5 and nsr; the part of it that
    comes from all-equal groups; and the entropy spent per unit of solve rate gained.
    6c: 192 prompts of mixed difficulty trained for 100 steps with sampled groups (one
    fixed-seed draw; seeds 1 gives the same ordering, tested), compared at equal progress
    (the step where the mean solve rate first reaches 0.95); FADE runs the `fade`
    advantage with scheduler.AdvantageScheduler's alpha and delta.
    """
    peaks = mass_peaks()
    step = {label: [one_step(p, name, **hyper) for p in ONE_STEP_PS] for label, name, hyper in METHODS}
    runs = {label: simulate(name, **hyper) for label, name, hyper in METHODS}
    runs["fade + FADE schedule"] = simulate("fade", schedule=True)
    fade = runs["fade + FADE schedule"]
    H_final = {label: r["entropy"][-1] for label, r in runs.items()}
    H_match = {label: entropy_at_solve_rate(r, MATCH_P) for label, r in runs.items()}
    numbers = {
        "6a peak of (m_S+m_F)(p), G=64": {k: v for k, v in peaks.items() if v is not None},
        "6a max |enumeration - expected_mass_curve|": mass_crosscheck(),
    }
    for label, rows in step.items():
        numbers[f"6b E[ΔH] per step at p={ONE_STEP_PS}, {label}"] = [r["dH"] for r in rows]
    for label, rows in step.items():
        numbers[f"6b   ... of it from all-equal groups, {label}"] = [r["dH_all_equal_groups"] for r in rows]
    for label, rows in step.items():
        numbers[f"6b E[ΔH] / E[Δp] (entropy per unit of progress), {label}"] = [r["dH"] / r["dp"] for r in rows]
    numbers["6c H0 (mean entropy at step 0)"] = runs["mean (balanced)"]["entropy"][0]
    numbers["6c final entropy (100 steps, lr 1.5)"] = H_final
    numbers[f"6c entropy when the solve rate first reaches {MATCH_P}"] = H_match
    numbers["6c final solve rate"] = {label: r["solve_rate"][-1] for label, r in runs.items()}
    numbers["6c FADE: H_target, final delta, final alpha"] = [fade["H_target"], fade["delta"][-1], fade["alpha"][-1]]
    psr, asym2, mean, asym05, nsr = (H_match[m[0]] for m in METHODS)
    psr_high, nsr_low = step["psr (success only)"][-1], step["nsr (failure only)"][0]    # p = 0.99, p = 0.05
    at_08 = ONE_STEP_PS.index(0.8)
    cost = lambda label: step[label][at_08]["dH"] / step[label][at_08]["dp"]          # entropy per unit progress
    claims = [
        report.claim("Mean-centred GRPO's mass peaks at p = 1/2; `power` with alpha = 2 at p = 1/(1+alpha)",
                     peaks["mean"] == 0.5 and abs(peaks["power"] - 1 / 3) <= 1 / 64,
                     f"peaks: mean {peaks['mean']}, grpo {peaks['grpo']}, power(alpha=2) {peaks['power']:.3f}, "
                     f"maxrl {peaks['maxrl']}; enumeration = expected_mass_curve to "
                     f"{numbers['6a max |enumeration - expected_mass_curve|']:.0e}"),
        report.claim("Success-biased updates collapse entropy: psr (success only)",
                     psr < mean,
                     f"entropy at solve rate {MATCH_P}: psr {psr:.3f} vs mean {mean:.3f}. psr does not cancel "
                     f"all-correct groups: one step at p=0.99 costs E[ΔH] {psr_high['dH']:+.4f}, of which "
                     f"{psr_high['dH_all_equal_groups']:+.4f} comes from all-equal groups"),
        report.claim("Success-biased updates collapse entropy: asym δ=2 (mean-centred, successes weigh 2x failures)",
                     asym2 < mean,
                     f"entropy at solve rate {MATCH_P}: asym δ=2 {asym2:.3f} vs mean {mean:.3f}. Its all-correct "
                     "groups get 0, and the -(ΣA)π term flattens π when successes dominate; exact entropy per "
                     f"unit of progress at p=0.8: {cost('asym δ=2 (success-biased)'):.2f} vs "
                     f"{cost('mean (balanced)'):.2f}"),
        report.claim("Failure-biased updates keep entropy up: nsr (failure only)",
                     nsr > mean,
                     f"entropy at solve rate {MATCH_P}: nsr {nsr:.3f} vs mean {mean:.3f}. nsr does not cancel "
                     f"all-wrong groups: one step at p=0.05 costs E[ΔH] {nsr_low['dH']:+.4f}, of which "
                     f"{nsr_low['dH_all_equal_groups']:+.4f} comes from all-equal groups"),
        report.claim("Failure-biased updates keep entropy up: asym δ=0.5 (failures weigh 2x successes)",
                     asym05 > mean,
                     f"entropy at solve rate {MATCH_P}: asym δ=0.5 {asym05:.3f} vs mean {mean:.3f}. The -(ΣA)π "
                     "term adds |ΣA| π to the logits when failures dominate, which sharpens π; exact entropy per "
                     f"unit of progress at p=0.8: {cost('asym δ=0.5 (failure-biased)'):.2f} vs "
                     f"{cost('mean (balanced)'):.2f}"),
        report.claim("The FADE schedule tracks its target entropy (within 25%)",
                     abs(H_final["fade + FADE schedule"] - fade["H_target"]) < 0.25 * fade["H_target"],
                     f"H_target {fade['H_target']:.3f}, final entropy {H_final['fade + FADE schedule']:.3f} with delta "
                     f"at {fade['delta'][-1]:.2f}: amplifying failures does not raise entropy here"),
    ]

    fig, (ax0, ax1, ax2) = report.figure(3, width=16, height=4.6)
    fig.subplots_adjust(right=0.86)
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
        ax2.plot(runs[label]["entropy"], color=color, label=label)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="6b. exact E[ΔH] of one step (dotted: all-equal groups)", xlabel="solve rate p", ylabel="nats")
    ax1.legend(fontsize=7)
    ax2.plot(fade["entropy"], color="k", label="fade + FADE schedule")
    ax2.axhline(fade["H_target"], color="k", ls=":", label="FADE H_target = 0.5 H0")
    ax2.set(title="6c. mean entropy, 192 prompts (one seeded draw)", xlabel="step", ylabel="nats")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    png = report.save(fig, out_dir, "exp6_sign_difficulty.png")
    return {"numbers": numbers, "claims": claims, "png": png.split("/")[-1], "runs": runs}
