"""Experiments 6 and 7: the sign and difficulty axes of an advantage, entropy, and FADE's schedule.

The FADE paper (Decugis et al. 2026, arXiv 2607.01490) splits any advantage into a
success mass m_S = sum_{A_i > 0} A_i and a failure mass m_F = sum_{A_i < 0} |A_i|
(mass.gradient_mass). The DIFFICULTY axis is where m_S(p) + m_F(p) peaks over the
solve rate p; the SIGN axis is m_S versus m_F. Its claims, and those of Zhu et al. 2025
(psr / nsr): success-biased updates (m_S > m_F) collapse entropy, failure-biased ones keep
it up; and a schedule of both axes (scheduler.py) reaches peak accuracy sooner and keeps
more diversity than any static choice.

The model, and what plain SGD and Adam can and cannot show on it, is toy/answers.py (the
softmax-over-answers analog); this file holds the experiments' settings, computes their
numbers and judges them (expN_compute, expN_judge); their figures are in toy/plots.py.

6a and 6b are exact (closed forms; sums over all C(11, 4) = 330 groups), and so is 6c's
lr -> 0 path. 6c and 7 are otherwise learning simulations with sampled groups: 96 prompts
of mixed difficulty, 5 seeds (each its own population order and sampling stream, shared
by every method), mean ± standard error over seeds.
"""

from __future__ import annotations

import functools
import math

import torch

import advantages as adv_lib
import mass
import scheduler as sched_lib
from toy import plots, report
from toy.answers import (COVERAGE_K, DTYPE, G, MATCH_P, PROMPTS, SEEDS, answer_groups, expected_path,
                          first_order_cost, max_entropy, one_step, prompt_logits, rollout_gap, simulate)

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
SGD_LR, SGD_STEPS = 1.5, 45             # the control (lr of the toy's earlier runs; every run reaches 0.9 by ~33)
ADAM_LR, ADAM_STEPS = 0.05, 150         # train.py's optimizer (betas 0.9/0.999, eps 1e-8, no decay, no clip)
# 6c runs the sign probes at three Adam step sizes, 2.5x apart around ADAM_LR: a sign-axis
# claim "agrees" only if it holds at all three (with Adam the step size is not a detail:
# the sign effect comes from Adam's normalisation, toy/answers.py's header). The slowest, 0.02,
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


def vs_mean(runs_at: dict, label: str) -> torch.Tensor:
    """label's seed-paired difference from mean (balanced): runs_at[label] - runs_at["mean (balanced)"]."""
    return runs_at[label] - runs_at["mean (balanced)"]


def pm(x: torch.Tensor, digits: int = 3) -> str:
    """"+m ± se" of a [seeds] tensor, to `digits` decimals."""
    m, se = mean_se(x)
    return f"{m:+.{digits}f} ± {se:.{digits}f}"


def mass_curves() -> dict:
    """{advantage: (p, m_S, m_F)}: mass.mass_curve of every registered advantage at G = 64."""
    return {name: mass.mass_curve(name, G=64) for name in adv_lib.ADVANTAGES}


def mass_peaks(curves: dict) -> dict:
    """Where each advantage's total mass (m_S + m_F)(p) peaks (None if it is 0 everywhere); curves from mass_curves."""
    peaks = {}
    for name, (p, m_S, m_F) in curves.items():
        total = m_S + m_F
        peaks[name] = float(p[int(total.argmax())]) if float(total.max()) > 0 else None
    return peaks


def mass_crosscheck() -> float:
    """max |E_groups[gradient_mass / G] - mass.expected_mass_curve| over advantages and p.

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
            m_S, m_F = mass.gradient_mass(adv_lib.compute_advantages(name, rewards))
            e_S, e_F = mass.expected_mass_curve(name, torch.tensor([p], dtype=DTYPE), G=G)
            worst = max(worst, abs(float((prob * m_S).sum() / G - e_S[0])), abs(float((prob * m_F).sum() / G - e_F[0])))
    return worst


# ---------------------------------------------------------------------------------------
# Experiment 6: the two axes, entropy, Adam vs SGD
# ---------------------------------------------------------------------------------------

def exp6_sign_and_difficulty(out_dir: str) -> dict:
    """Masses of every advantage (exact), one-step entropy change (exact), learning with Adam and SGD (sampled).

    The model: a prompt is one softmax over 8 answers, some correct; a group is G = 4
    answers; the update is loss.policy_loss's gradient (module header).
    6a: mass.mass_curve for every registered advantage and where its total mass
    peaks, and a cross-check of mass.expected_mass_curve against the enumeration of
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
    data = exp6_compute()
    claims = exp6_judge(data)
    png = plots.exp6(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1],
            "runs": {"adam": data["adam"], "sgd": data["sgd"]}, "matched": data["matched"]}


def exp6_compute() -> dict:
    """Experiment 6's numbers: masses (6a), exact one-step entropy changes (6b), the runs matched at MATCH_P (6c).

    Returns {"numbers": the printed table; "curves" (mass_curves), "peaks"; "step": {method:
    [one_step per ONE_STEP_PS]}; "adam" {lr: {label: run}}, "sgd" {label: run}, "path"
    [T, methods, 4, seeds] (expected_path); "matched": {"adam": {lr: {label: [4, seeds]}},
    "sgd", "path": {label: [4, seeds]}} (at_solve_rate MATCH_P); "beyond": {label: SGD's
    gap to mean minus the exact path's, [4, seeds]}; "speed": {label: a_1 - a_0 at p =
    0.1, 0.5, 0.9}; "adam_correct_vs_mean": {label: [(mean, SE) of entropy among correct
    minus mean's, per lr]}; the settings "labels", "one_step_ps", "adam_lrs", "adam_lr",
    "sgd_lr", "match_p", "seeds"}.
    """
    curves = mass_curves()
    peaks = mass_peaks(curves)
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
    beyond = {label: vs_mean(matched["sgd"], label) - vs_mean(matched["path"], label) for label in labels}
    ps = torch.tensor([0.1, 0.5, 0.9], dtype=DTYPE)
    speed = {label: rollout_gap(name, ps, **hyper).tolist() for label, name, hyper in METHODS}
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
        label: three(vs_mean(matched["path"], label)) for label in others}
    numbers[f"6c SGD lr {SGD_LR}, at solve rate {MATCH_P}, minus mean's (paired): entropy, among correct, "
            f"coverage@{COVERAGE_K}"] = {label: three(vs_mean(matched["sgd"], label)) for label in others}
    numbers["6c   ... minus the exact path's difference: the sign axis under SGD beyond first order"] = {
        label: three(beyond[label]) for label in others}
    for lr in ADAM_LRS:
        numbers[f"6c Adam lr {lr:g}, at solve rate {MATCH_P}, minus mean's (paired): entropy, among correct, "
                f"coverage@{COVERAGE_K}"] = {label: three(vs_mean(matched["adam"][lr], label)) for label in others}
    numbers[f"6c Adam lr {ADAM_LR}, at solve rate {MATCH_P}: entropy, among correct, coverage@{COVERAGE_K}"] = {
        label: ", ".join(f"{mean_se(matched['adam'][ADAM_LR][label][i])[0]:.3f}" for i in (1, 2, 3))
        for label in labels}
    numbers[f"6c steps to solve rate {MATCH_P}: Adam lr {', '.join(f'{lr:g}' for lr in ADAM_LRS)}; SGD lr {SGD_LR}"] = {
        label: [round(mean_se(steps_to(adam[lr][label]["hist"], MATCH_P))[0], 1) for lr in ADAM_LRS]
        + [round(mean_se(steps_to(sgd[label]["hist"], MATCH_P))[0], 1)] for label in labels}
    adam_correct = {label: [mean_se(vs_mean(matched["adam"][lr], label)[2]) for lr in ADAM_LRS] for label in labels}
    return {"numbers": numbers, "curves": curves, "peaks": peaks, "step": step, "adam": adam, "sgd": sgd,
            "path": path, "matched": matched, "beyond": beyond, "speed": speed, "adam_correct_vs_mean": adam_correct,
            "labels": labels, "one_step_ps": ONE_STEP_PS, "adam_lrs": ADAM_LRS, "adam_lr": ADAM_LR, "sgd_lr": SGD_LR,
            "match_p": MATCH_P, "seeds": SEEDS}


def exp6_judge(data: dict) -> list[dict]:
    """Experiment 6's six claims, from exp6_compute's dict: 6a's peaks, then one sign-axis claim per method but mean."""
    numbers, peaks, step, matched = data["numbers"], data["peaks"], data["step"], data["matched"]
    beyond, speed = data["beyond"], data["speed"]
    adam_lrs, sgd_lr, match_p = data["adam_lrs"], data["sgd_lr"], data["match_p"]

    def verdict(label: str, sign: int) -> tuple[str, str]:
        holds = lambda d: differs(d[1], sign) and differs(d[2], sign)
        on_adam = [holds(vs_mean(matched["adam"][lr], label)) for lr in adam_lrs]
        on_sgd = holds(beyond[label])
        where = [f"{lr:g}" for lr, h in zip(adam_lrs, on_adam) if h]
        first_gap = vs_mean(matched["path"], label)
        constant = max(speed[label]) - min(speed[label]) < 1e-12
        why = ("0 up to the integration: a_1 - a_0 does not depend on p, so it follows mean's path" if constant else
               f"a first-order difficulty effect: a_1 - a_0 = {speed[label][0]:.3f} / {speed[label][1]:.3f} / "
               f"{speed[label][2]:.3f} at p = 0.1 / 0.5 / 0.9 shifts the update toward "
               f"{'hard' if speed[label][0] > speed[label][2] else 'easy'} prompts")
        text = (f"Adam: holds at lr {', '.join(where) if where else 'none'} of {', '.join(f'{lr:g}' for lr in adam_lrs)} "
                f"(vs mean at solve rate {match_p}, entropy / among correct: "
                + "; ".join(f"lr {lr:g} {pm(vs_mean(matched['adam'][lr], label)[1])} / {pm(vs_mean(matched['adam'][lr], label)[2])}"
                            for lr in adam_lrs)
                + f"). SGD lr {sgd_lr}: {pm(vs_mean(matched['sgd'], label)[1])} / {pm(vs_mean(matched['sgd'], label)[2])}, of "
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
    for label in data["labels"]:                      # METHODS' order
        if label in texts:
            sign, text, extra = texts[label]
            lab, evidence = verdict(label, sign)
            claims.append(report.claim(text, lab, evidence + "." + extra))
    return claims


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
    data = exp7_compute()
    claims = exp7_judge(data)
    png = plots.exp7(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1], "runs": data["runs"],
            "sgd": data["sgd"]}


def exp7_compute() -> dict:
    """Experiment 7's numbers: steps to MATCH_P and the final state of every arm, FADE's knobs and scale.

    Returns {"numbers": the printed table; "runs" (Adam at ADAM_LR, {label: run}), "sgd"
    ({label: run} at SGD_LR); "hist" {label: [ADAM_STEPS+1, 4, seeds]}; "t90", "t90_sgd"
    {label: steps to MATCH_P [seeds]}; "final" {label: [4, seeds]} at ADAM_STEPS for the
    static baselines and FADE; "fastest" static label; "statics", "arms" (labels); FADE's
    "alpha" [T+1, seeds], "delta" [ADAM_STEPS, seeds], "scale" [ADAM_STEPS] (mean over
    seeds) of its sum|A| relative to mean's; the settings "match_p", "seeds", "coverage_k",
    "adam_lr", "adam_steps"}.
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
    numbers = {
        f"steps to solve rate {MATCH_P}, Adam (mean ± SE over {SEEDS} seeds)":
            {label: f"{mean_se(t90[label])[0]:.1f} ± {mean_se(t90[label])[1]:.1f}" for label in arms},
        "  ... minus mean's, paired": {label: pm(vs_mean(t90, label), 1) for label in arms if label != "mean (balanced)"},
        f"steps to solve rate {MATCH_P}, SGD lr {SGD_LR}, minus mean's (mean's own: "
        f"{mean_se(t90_sgd['mean (balanced)'])[0]:.1f})": {label: pm(vs_mean(t90_sgd, label), 1) for label in t90_sgd
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
    return {"numbers": numbers, "runs": sims, "sgd": sgd, "hist": hist, "t90": t90, "t90_sgd": t90_sgd,
            "final": final, "fastest": fastest, "statics": labels, "arms": arms, "alpha": fade["alpha"],
            "delta": delta, "scale": scale, "match_p": MATCH_P, "seeds": SEEDS, "coverage_k": COVERAGE_K,
            "adam_lr": ADAM_LR, "adam_steps": ADAM_STEPS}


def exp7_judge(data: dict) -> list[dict]:
    """Experiment 7's two claims, from exp7_compute's dict: FADE's speed (fade_speed_label) and its final trade-off."""
    numbers, t90, t90_sgd, final, fastest = data["numbers"], data["t90"], data["t90_sgd"], data["final"], data["fastest"]
    labels, alpha, delta, scale = data["statics"], data["alpha"], data["delta"], data["scale"]
    match_p, seeds, coverage_k = data["match_p"], data["seeds"], data["coverage_k"]
    adam_lr, adam_steps = data["adam_lr"], data["adam_steps"]
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
                     f"{reading}. Steps to solve rate {match_p} (Adam lr {adam_lr}, {seeds} seeds, paired): FADE "
                     f"{mean_se(t90[FADE_RUN])[0]:.1f}, {pm(gain, 1)} vs the fastest static ({fastest}); mean at FADE's "
                     f"sum|A| {pm(vs_mean(t90, SCALE_CONTROL), 1)} vs mean, FADE {pm(vs_mean(t90, FADE_RUN), 1)}, FADE minus "
                     f"the scale-matched control {pm(vs_scale, 1)}; FADE's (alpha, delta) at mean's scale "
                     f"{pm(vs_mean(t90, SHAPE_CONTROL), 1)}. Why: alpha starts at {float(alpha[0].mean()):.2f}, "
                     f"so FADE's sum|A| starts at {float(scale[0]):.2f}x mean's and grows to "
                     f"{float(scale[30]):.2f}x by step 30 as alpha anneals to 1; Adam's second moment still remembers "
                     f"the small early gradients, so the effective step grows. Under SGD, where the scale is the step, "
                     f"FADE is {pm(sgd_gain, 1)} steps vs mean"),
        report.claim("FADE ends with a better accuracy-diversity trade-off than static baselines",
                     report.agrees_if(not rivals),
                     f"at step {adam_steps}, solve rate / entropy among correct / coverage@{coverage_k}: FADE "
                     f"{fin(FADE_RUN, 0):.3f} / {fin(FADE_RUN, 2):.3f} / {fin(FADE_RUN, 3):.3f}; "
                     + "; ".join(f"{label} {fin(label, 0):.3f} / {fin(label, 2):.3f} / {fin(label, 3):.3f}"
                                 for label in labels)
                     + (f". As accurate and more coverage: {', '.join(rivals)}" if rivals else "")
                     + f". FADE's delta first drops below 1 at step "
                       f"{numbers['FADE: first step with delta < 1, final delta (mean over seeds)'][0]} and ends at "
                       f"{float(delta[-1].mean()):.2f}: delta = 1 + H_hat - H_target moves by the entropy deficit in "
                       f"nats, so it bites late and softly"),
    ]
    return claims


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
