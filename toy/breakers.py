"""Experiments 3 and 4: what breaks cancellation inside a training step, and what restores it.

Cancellation needs two things (the "design conditions" paper, arXiv 2604.13088, and the
Cancellation Hypothesis paper, arXiv 2605.08666):

1. Gradient EXCHANGEABILITY (experiment 3). A token that every rollout of a group shares
   at the same context has the same gradient g in every rollout, so the group moves it by
   (sum_i c_i) g, where c_i is the weight the loss gives that token in rollout i. With
   token-sum aggregation and an on-policy step c_i is proportional to A_i and the sum is
   sum_i A_i = 0. Anything that makes c_i depend on the rollout other than through A_i
   leaves a net push on a token the reward never looked at ("reward-irrelevant drift"):
     - seq-mean-token-mean (the original GRPO): c_i = A_i / |o_i|, unequal lengths;
     - GSPO: c_i = A_i s_i with a sequence ratio s_i that differs between rollouts;
     - PPO clipping: a rollout whose ratio left the trust region loses its gradient, and
       which rollouts lose it depends on the SIGN of A_i, so the survivors do not cancel.
   Token-sum aggregations (token-mean over a step, seq-mean-token-sum, Dr. GRPO's
   seq-mean-token-sum-norm) and DFPO's `min` / `orth` transforms of the GSPO weights
   restore sum_i c_i = 0 (`min` only where GSPO's clip dropped no rollout: a dropped
   rollout keeps zero gradient [recon], and equal weights on the others do not cancel).
2. The whole group in ONE optimizer step (experiment 4). Split a group across two Adam
   steps and the template is pushed up in one and down in the other; Adam normalises
   each step separately, so the two pushes are both full-sized and do not cancel.

The "net weight" nu_g = sum_i c_{i,0} on the shared first token "Let" is the template's
update in units of its common gradient. Its size depends on each objective's normaliser
(1/|o_i|, 1/(G L), ...), so objectives are compared by loss.py's scale-free
`cancellation_residual` R_g = |sum_i c_i| / sum_i |c_i| instead: 0 when the group's pushes
on the template cancel exactly, 1 when they all point the same way.

As in toy/cancellation.py, each experiment is expN_compute and expN_judge here and
plots.expN in toy/plots.py, chained by expN_*.
"""

from __future__ import annotations


import torch

import advantages as adv_lib
import aggregation
import batching
import exchangeability
import loss as loss_lib
from toy import bandit as B
from toy import plots, report

RATIOS = tuple(round(0.6 + 0.05 * k, 2) for k in range(19))    # 0.6 .. 1.5, the PPO scan


def _slip_free_groups(bandit: B.Bandit, W_sampler: torch.Tensor):
    """Every group of G rollouts that all start with "Let", and P(group | no slip in it).

    The claim is about a token shared by EVERY rollout, so we condition on that event:
    the responses that start with "Let", each with probability pi(o) / p_0(Let).
    Returns (combos [n, G] response ids, prob [n], summing to 1).
    """
    keep = (bandit.responses[:, 0] == B.IDX[B.TEMPLATE]).nonzero().squeeze(1)
    local, log_coef = B.enumerate_groups(len(keep))
    combos = keep[local]
    with torch.no_grad():
        log_pi = B.token_logp(bandit, W_sampler).sum(1) - B.logp_table(bandit, W_sampler)[0, B.IDX[B.TEMPLATE]]
    return combos, (log_coef + log_pi[combos].sum(1)).exp()


NO_GRADIENT = 1e-12   # sum_i |c_i| below this: the template gets no gradient at all (0 up to rounding)


def net_template_weight(bandit, combos, logp, old_logp, adv, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nu [n], residual [n], dropped [n]) for one objective.

    nu: the net weight on "Let"; residual: loss.py's R_g of the template's coefficients,
    NaN where the objective gives the template no gradient at all (sum_i |c_i| <
    NO_GRADIENT: e.g. DFPO orth with a single kept rollout, whose weights are 0 up to a
    1e-17 rounding residue that would otherwise read as R_g ~ 1); dropped: True where the
    loss gives some rollout with A != 0 no gradient at all (a clip dropped it).
    """
    mask = bandit.mask[combos]
    c = B.token_coefficients(logp, old_logp, adv, mask, cfg)[:, :, 0]       # [n, G]
    n = combos.shape[0]
    residual = exchangeability.cancellation_residual(c.reshape(-1), torch.arange(n).repeat_interleave(B.G))
    residual = torch.where(c.abs().sum(1) < NO_GRADIENT, torch.full_like(residual, float("nan")), residual)
    return c.sum(1), residual, ((c == 0) & (adv != 0)).any(1)


def exp3_exchangeability(out_dir: str) -> dict:
    """Net update on the shared template "Let", exactly, over every slip-free group.

    The early-stop bandit: responses are "Let d <eos>" (3 tokens, always wrong) or
    "Let d d <eos>" (4 tokens). Groups are drawn by the sampling policy W_old; the
    learner W_new is W_old after a small change of the digit and <eos> rows only (the
    policy moved since sampling), so GSPO's sequence ratios differ between rollouts while
    the template's own ratio is exactly 1. GRPO advantages. For PPO's clip we instead set
    the template's ratio rho directly (every rollout shares it) and scan it.
    GSPO is run as GSPO (its own seq-mean-token-mean aggregation, the only one loss.py
    accepts for it) with a 0.2 clip range (the paper's is ~4e-4), so that the breakage
    shown is the weights s_i themselves; its equal-length groups isolate s_i from 1/|o_i|.
    [recon] DFPO's per-rollout weights are GSPO's detached sequence ratios with a
    group-constant length normaliser, transformed over the rollouts GSPO's clip keeps
    (loss.py's reading). Reported per objective: E[R_g] and max R_g over the groups where
    the template gets a gradient (the probability of the others is P(no gradient)), the
    largest R_g among groups where no rollout was dropped, and among those whose
    rollouts also all have the same length, the probability that a group has a dropped
    rollout, and E[nu], the signed drift in the objective's own units.
    "Exactly zero" means R_g < 1e-12 in every group, i.e. float rounding.
    """
    data = exp3_compute()
    claims = exp3_judge(data)
    png = plots.exp3(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1]}


# The objectives of exp3 whose residual on the template must be 0 (to rounding) in EVERY
# group: the three token-sum aggregations and DFPO orth. (DFPO min is exact only where
# GSPO's clip drops no rollout, so it has a claim of its own.)
EXACT = ("token-mean (DAPO, TRL default)", "seq-mean-token-sum", "seq-mean-token-sum-norm (Dr. GRPO)",
         "GSPO + DFPO orth")


def exp3_compute() -> dict:
    """Experiment 3's numbers: per objective the residual R_g and net weight nu over the slip-free groups; the PPO scan.

    Returns {"numbers": the printed table (one row of statistics per objective, then the
    PPO rows), "bars": {objective: (E[R_g], should it be exactly 0)}, "scan": {(eps_low,
    eps_high): [E[nu] per ratio in RATIOS]}, "ratios": RATIOS}.
    """
    bandit, W_old = B.make_bandit(early_stop=True)
    W_new = W_old.clone()
    moved = [B.IDX[t] for t in B.DIGITS + (B.EOS,)]
    W_new[moved] += 0.25 * torch.randn(len(moved), B.D, generator=torch.Generator().manual_seed(1), dtype=B.DTYPE)
    combos, prob = _slip_free_groups(bandit, W_old)
    n_all = combos.shape[0]
    # A group whose rewards are all equal has A = 0 and contributes exactly 0 under every
    # objective below, so only the mixed groups are computed (it halves the cost).
    rewards = bandit.reward[combos]
    mixed = rewards.max(1).values > rewards.min(1).values
    combos, prob = combos[mixed], prob[mixed]
    adv = adv_lib.compute_advantages("grpo", rewards[mixed])
    with torch.no_grad():
        old = B.token_logp(bandit, W_old)[combos]                                    # [n, G, L]
        new = B.token_logp(bandit, W_new)[combos]
    lengths = bandit.mask[combos].sum(2)
    equal = (lengths == lengths[:, :1]).all(1)
    C = loss_lib.LossConfig
    gspo = dict(loss_type="gspo", eps_low=0.2, eps_high=0.2)
    cases = [  # label, config, learner log-probs, should the net weight be exactly 0?
        ("token-mean (DAPO, TRL default)", C(agg="token-mean"), old, True),
        ("seq-mean-token-sum", C(agg="seq-mean-token-sum"), old, True),
        ("seq-mean-token-sum-norm (Dr. GRPO)", C(agg="seq-mean-token-sum-norm"), old, True),
        ("seq-mean-token-mean (GRPO), 1/|o_i|", C(agg="seq-mean-token-mean"), old, False),
        ("GSPO sequence ratio s_i, off-policy", C(agg="seq-mean-token-mean", **gspo), new, False),
        ("GSPO + DFPO min", C(agg="seq-mean-token-sum", weight_transform="min", **gspo), new, True),
        ("GSPO + DFPO orth", C(agg="seq-mean-token-sum", weight_transform="orth", **gspo), new, True),
    ]
    numbers, bars = {}, {}
    for label, cfg, logp, zero in cases:
        nu, residual, dropped = net_template_weight(bandit, combos, logp, old, adv, cfg)
        ok = torch.isfinite(residual)
        largest = lambda where: float(residual[ok & where].max()) if bool((ok & where).any()) else 0.0
        numbers[label] = {"E[R_g]": float((prob[ok] * residual[ok]).sum() / prob[ok].sum()),
                          "max R_g": largest(torch.ones_like(ok)),
                          "max R_g, equal length, nothing dropped": largest(equal & ~dropped),
                          "max R_g, nothing dropped": largest(~dropped),
                          "P(a rollout dropped)": float(prob[dropped].sum() / prob.sum()),
                          "P(no gradient)": float(prob[~ok].sum() / prob.sum()),
                          "E[nu]": float((prob * nu).sum())}
        bars[label] = (numbers[label]["E[R_g]"], zero)

    # PPO clip: the template's ratio rho is the same in every rollout (same token, same
    # context), so set it directly: old log p_0(Let) = log p_0(Let) - log rho.
    scan = {}
    n, R = combos.shape[0], len(RATIOS)
    log_rho = torch.log(torch.tensor(RATIOS, dtype=B.DTYPE)).repeat_interleave(n)     # [R * n]
    shifted = old.repeat(R, 1, 1).clone()
    shifted[:, :, 0] -= log_rho.unsqueeze(1)             # every ratio value, as R copies of the groups
    for eps_low, eps_high in ((0.2, 0.2), (0.2, 0.28)):
        nu, _, _ = net_template_weight(bandit, combos.repeat(R, 1), old.repeat(R, 1, 1), shifted, adv.repeat(R, 1),
                                    C(eps_low=eps_low, eps_high=eps_high))
        scan[(eps_low, eps_high)] = (prob.repeat(R) * nu).view(R, n).sum(1).tolist()
    at = lambda rho: min(range(len(RATIOS)), key=lambda i: abs(RATIOS[i] - rho))
    numbers["PPO clip 0.2/0.2: E[nu] at rho = 0.7, 1.0, 1.25, 1.4"] = [scan[(0.2, 0.2)][at(r)]
                                                                       for r in (0.7, 1.0, 1.25, 1.4)]
    numbers["PPO clip 0.2/0.28 (DAPO): E[nu] at rho = 1.25, 1.4"] = [scan[(0.2, 0.28)][at(r)] for r in (1.25, 1.4)]
    numbers["groups (slip-free, early-stop bandit; mixed rewards)"] = f"{n_all}; {combos.shape[0]}"
    numbers["P(unequal lengths | mixed group)"] = float(prob[~equal].sum() / prob.sum())
    return {"numbers": numbers, "bars": bars, "scan": scan, "ratios": RATIOS}


def exp3_judge(data: dict) -> list[dict]:
    """Experiment 3's five claims, from exp3_compute's dict."""
    numbers, bars, scan, ratios = data["numbers"], data["bars"], data["scan"], data["ratios"]
    max_zero = max(numbers[label]["max R_g"] for label in EXACT)
    min_broken = min(residual for residual, zero in bars.values() if not zero)
    dfpo_min, orth = numbers["GSPO + DFPO min"], numbers["GSPO + DFPO orth"]
    # The clip leaves the template alone strictly inside both clip ranges (0.8, 1.2), and
    # must push it outside the wider one (below 0.8 or above 1.28).
    inside = [i for i, r in enumerate(ratios) if 0.8 + 1e-9 < r < 1.2 - 1e-9]
    outside = [i for i, r in enumerate(ratios) if r < 0.8 - 1e-9 or r > 1.28 + 1e-9]
    seq = numbers["seq-mean-token-mean (GRPO), 1/|o_i|"]
    gspo_row = numbers["GSPO sequence ratio s_i, off-policy"]
    return [
        report.claim("1/|o_i| length normalisation with unequal lengths leaves a net update on a shared token",
                     report.agrees_if(seq["E[R_g]"] > 0.01 and seq["max R_g, equal length, nothing dropped"] < 1e-12),
                     f"E[R_g] = {seq['E[R_g]']:.3g}, E[nu] = {seq['E[nu]']:+.3g} (short answers are wrong here, so "
                     f"the template is pushed DOWN on average); R_g <= {seq['max R_g, equal length, nothing dropped']:.0e} in "
                     "every equal-length group"),
        report.claim("GSPO's sequence weights leave a net update on a shared token",
                     report.agrees_if(gspo_row["E[R_g]"] > 0.01
                                      and gspo_row["max R_g, equal length, nothing dropped"] > 0.01),
                     f"E[R_g] = {gspo_row['E[R_g]']:.3g} although the template's own ratio is exactly 1; up to "
                     f"{gspo_row['max R_g, equal length, nothing dropped']:.3g} in equal-length groups where the clip "
                     "drops nothing, so 1/|o_i| and the clip are the same for every rollout: the weights s_i alone "
                     "break it"),
        report.claim("Clipping leaves a net update on a shared token once the ratio leaves the clip range",
                     report.agrees_if(all(abs(scan[k][i]) < 1e-15 for k in scan for i in inside)
                                      and all(abs(scan[(0.2, 0.28)][i]) > 1e-3 for i in outside)),
                     "E[nu] is 0 for rho inside [1-eps_low, 1+eps_high] and non-zero outside; its sign pulls "
                     "rho back toward 1 (only the rollouts whose advantage points back keep their gradient)"),
        report.claim("Token-sum aggregation and DFPO orth bring it back to exactly zero",
                     report.agrees_if(max_zero < 1e-12),
                     f"largest R_g in any group, over token-mean, seq-mean-token-sum, seq-mean-token-sum-norm and orth: "
                     f"{max_zero:.0e} (float rounding; the breakers' E[R_g] start at {min_broken:.2g}). orth "
                     f"re-balances the rollouts GSPO's clip keeps, also in the {orth['P(a rollout dropped)']:.0%} of "
                     f"groups where it drops one; in {orth['P(no gradient)']:.2%} of groups it leaves the template no "
                     "gradient at all (a single kept rollout, or kept weights that orth re-centres to 0)"),
        report.claim("DFPO min brings it back to exactly zero (under GSPO's clip)",
                     report.agrees_if(dfpo_min["max R_g"] < 1e-12),
                     f"E[R_g] = {dfpo_min['E[R_g]']:.3g}, vs {gspo_row['E[R_g]']:.3g} for plain GSPO: min reduces the "
                     f"residual but does not remove it. It is exact (R_g <= {dfpo_min['max R_g, nothing dropped']:.0e}) "
                     f"where GSPO's clip drops no rollout; in the {dfpo_min['P(a rollout dropped)']:.0%} of groups where "
                     "it drops one, the dropped rollout keeps zero gradient ([recon]) and equal weights on the others "
                     f"cancel only if their advantages happen to sum to 0 (R_g up to {dfpo_min['max R_g']:.2g}). The "
                     "training sweep (sweep.py dfpo) finds the same"),
    ]


# ---------------------------------------------------------------------------------------
# 4. Mini-batching
# ---------------------------------------------------------------------------------------

MODES = ("one step",) + batching.MODES


def adam_step(W: torch.Tensor, grad: torch.Tensor, state: dict, lr: float,
              betas: tuple = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step in place (Kingma & Ba 2015; torch.optim.Adam's defaults, tested equal).

        m <- b1 m + (1 - b1) g        v <- b2 v + (1 - b2) g^2        t <- t + 1
        W <- W - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    Written out because it is the point of experiment 4: on the first step the update is
    lr * g / (|g| + eps), i.e. about lr * sign(g) for ANY non-zero g. A template gradient of
    1e-4 left over from a split group moves as far as a reasoning gradient of 1.
    (torch.optim would also do, but its first step imports torch._dynamo: +2 s.)
    """
    b1, b2 = betas
    state["t"] = state.get("t", 0) + 1
    state["m"] = b1 * state.get("m", torch.zeros_like(W)) + (1 - b1) * grad
    state["v"] = b2 * state.get("v", torch.zeros_like(W)) + (1 - b2) * grad * grad
    m_hat = state["m"] / (1 - b1 ** state["t"])
    v_hat = state["v"] / (1 - b2 ** state["t"])
    W -= lr * m_hat / (v_hat.sqrt() + eps)


def epoch_drift(bandit: B.Bandit, W0: torch.Tensor, seed: int, mode: str, n_groups: int = 4, k: int = 4,
                lr: float = 0.05, advantage: str = "grpo") -> dict:
    """One rollout batch, one epoch of Adam steps split by `mode`; what moved.

    The batch: n_groups groups of G = 4 drawn from W0 (ONE deterministic draw per seed:
    this experiment samples, it is not an exact sum). "one step" trains on the whole
    batch at once; the batching.MODES split it into k steps with
    batching.minibatch_indices. Each step: loss.policy_loss (PPO, token-mean, normaliser
    from aggregation.step_normaliser of that step) and one Adam step; ratios to the
    sampling policy are live from the second step on. Returns the template drift
    Delta log p_0(Let), the change of the solve rate, how many groups were split, and the
    largest |sum of the advantages| of a step (what cancellation needs to be 0).
    """
    combos = B.sample_groups(bandit, W0, n_groups, seed)
    A = adv_lib.compute_advantages(advantage, bandit.reward[combos])
    resp = bandit.responses[combos].reshape(-1, bandit.L)
    full = torch.ones(resp.shape, dtype=B.DTYPE)
    with torch.no_grad():
        old = B.token_logp(bandit, W0, resp, full)
    if mode == "one step":
        steps = [torch.arange(resp.shape[0])]
    else:
        steps = batching.minibatch_indices(A, k, mode, torch.Generator().manual_seed(seed))
    W, state = W0.clone(), {}
    for idx in steps:
        W.requires_grad_(True)
        mask = full[idx]
        loss, _ = loss_lib.policy_loss(B.token_logp(bandit, W, resp[idx], mask), old[idx], A.reshape(-1)[idx], mask,
                                       loss_lib.LossConfig(), aggregation.step_normaliser(mask))
        (grad,) = torch.autograd.grad(loss, W)
        W = W.detach()
        adam_step(W, grad, state, lr)
    let = B.IDX[B.TEMPLATE]
    drift = float(B.logp_table(bandit, W)[0, let] - B.logp_table(bandit, W0)[0, let])
    return {"drift": drift, "d_solve": B.solve_rate(bandit, W) - B.solve_rate(bandit, W0),
            "split_groups": batching.split_groups(steps, B.G),
            "max_step_sum": max(abs(float(A.reshape(-1)[idx].sum())) for idx in steps)}


def exp4_minibatching(out_dir: str, seeds: range = range(12), template_prob: float = 0.99,
                      slippy_prob: float = 0.9) -> dict:
    """Template drift after one epoch: random vs query-preserved vs reward- and mass-balanced splits.

    Modes of batching.minibatch_indices ([recon]: the paper's reward-balancing rule is
    not public; batching.py documents ours: `balanced` equalises the COUNTS of positive
    and negative rollouts per step, the cancellation paper's rule, `mass_balanced` the SUM of their
    advantages, which is what cancellation needs), plus "one step" (no split) as the
    reference. All groups here share one prompt, so the template's gradient is the same
    in every rollout of a step and a step whose advantages sum to 0 leaves it exactly
    still, even with its groups split; in an LLM, prompts differ and only format tokens
    come close to that.
    The template's true credit is 0 (the reward never reads it), so every bit of
    |Delta log p(Let)| is reward-irrelevant drift. Mean over a fixed set of seeds (each a
    different rollout batch and split); the spread across seeds is in the plot. Why
    Adam matters: its first step moves every parameter with a non-zero gradient by about
    lr, however small that gradient is, so a half-group's uncancelled push becomes a
    full-sized step. (With plain SGD the two halves' pushes would nearly cancel, up to
    O(lr^2) terms.)
    Two template probabilities. At p(Let) = 0.99, as templates in an LLM are nearly
    certain, almost every group is slip-free and a zero-sum step barely touches "Let":
    the test is clean but easy. At p(Let) = 0.9 a third of the groups hold a slip "let",
    whose covariance with the reward is real in a sample (zero in expectation), and
    Adam inflates it at every step of a split, whole groups or not.
    One verdict per mode: it reduces drift if, at p(Let) = 0.99, its mean |drift| is
    below half of random's AND below it by more than 2 SE, paired by seed (same batch);
    the p(Let) = 0.9 numbers are reported beside it.
    """
    data = exp4_compute(seeds, template_prob, slippy_prob)
    claims = exp4_judge(data)
    png = plots.exp4(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1], "drift": data["drift_abs"]}


def exp4_compute(seeds: range = range(12), template_prob: float = 0.99, slippy_prob: float = 0.9) -> dict:
    """Experiment 4's numbers: epoch_drift for every mode and seed, at both template probabilities.

    Returns {"numbers": the printed table; "runs": {q: {mode: [epoch_drift per seed]}};
    "drift_abs": {q: {mode: |drift| [seeds]}}; the settings "template_prob", "slippy_prob",
    "n_seeds", "modes" (MODES)}.
    """
    modes = [m for m in MODES if m != "random"]
    mean = lambda xs: sum(xs) / len(xs)
    runs, drift_abs = {}, {}
    for q in (template_prob, slippy_prob):
        bandit, W0 = B.make_bandit(template_prob=q)
        runs[q] = {mode: [epoch_drift(bandit, W0, seed, mode) for seed in seeds] for mode in MODES}
        drift_abs[q] = {mode: torch.tensor([abs(r["drift"]) for r in rs], dtype=B.DTYPE) for mode, rs in runs[q].items()}
    main = runs[template_prob]
    numbers = {f"{mode}": {"E|drift|": mean([abs(r["drift"]) for r in rs]), "E[drift]": mean([r["drift"] for r in rs]),
                           "E[d solve]": mean([r["d_solve"] for r in rs]),
                           "split groups": mean([r["split_groups"] for r in rs]),
                           "E[max over steps |sum A|]": mean([r["max_step_sum"] for r in rs])}
               for mode, rs in main.items()}
    numbers["seeds (batches of 4 groups x 4 rollouts, 4 Adam steps, lr 0.05)"] = len(seeds)
    for q in (template_prob, slippy_prob):
        numbers[f"p(Let) = {q}: E|drift| / random's; paired difference ± SE"] = {
            mode: "{:.3g}; {:+.2e} ± {:.1e}".format(*versus_random(drift_abs[q], mode)) for mode in modes}
    numbers[f"p(Let) = {slippy_prob}: E|drift| per mode"] = {mode: float(v.mean()) for mode, v in drift_abs[slippy_prob].items()}
    return {"numbers": numbers, "runs": runs, "drift_abs": drift_abs, "template_prob": template_prob,
            "slippy_prob": slippy_prob, "n_seeds": len(seeds), "modes": MODES}


def versus_random(drift_abs: dict, mode: str) -> tuple[float, float, float]:
    """(mode's E|drift| / random's, paired difference mean, its SE); drift_abs: {mode: |drift| [seeds]} at one p(Let)."""
    d = drift_abs[mode] - drift_abs["random"]
    return (float(drift_abs[mode].mean() / drift_abs["random"].mean()), float(d.mean()),
            float(d.std() / len(d) ** 0.5))


def exp4_judge(data: dict) -> list[dict]:
    """Experiment 4's four claims (one per mode that is not random), from exp4_compute's dict."""
    numbers, drift_abs = data["numbers"], data["drift_abs"]
    template_prob, slippy_prob, modes = data["template_prob"], data["slippy_prob"], data["modes"]
    drift = {m: numbers[m]["E|drift|"] for m in modes}
    slip = {m: float(v.mean()) for m, v in drift_abs[slippy_prob].items()}

    def reduces(mode: str) -> bool:
        ratio, diff, se = versus_random(drift_abs[template_prob], mode)
        return ratio < 0.5 and diff < -2 * se

    def at_slippy(mode: str) -> str:
        ratio, diff, se = versus_random(drift_abs[slippy_prob], mode)
        return (f"at p(Let) = {slippy_prob}: {slip[mode]:.3g} vs random {slip['random']:.3g} ({ratio - 1:+.0%}, paired "
                f"{diff:+.2g} ± {se:.1g}) and one step {slip['one step']:.3g} ({slip[mode] / slip['one step']:.1f}x)")

    def against(mode: str) -> str:
        ratio, diff, se = versus_random(drift_abs[template_prob], mode)
        return (f"E|Δ log p(Let)| at p(Let) = {template_prob}: {drift[mode]:.3g} vs random {drift['random']:.3g} "
                f"({ratio:.2g}x; paired {diff:+.2g} ± {se:.1g}), one step {drift['one step']:.3g}")

    worst = lambda mode: numbers[mode]["E[max over steps |sum A|]"]
    return [
        report.claim("Query-preserved mini-batching keeps cancellation alive (less template drift than a random split)",
                     report.agrees_if(reduces("query")),
                     f"{against('query')}; {at_slippy('query')}: with slips most of the drift is their own credit, "
                     "which Adam inflates at each of the 4 steps whether or not the groups are whole"),
        report.claim("Reward-balanced batching reduces template drift compared with a random split: `balanced` "
                     "(equal COUNTS of positive and negative rollouts per step, the cancellation paper's rule)",
                     report.agrees_if(reduces("balanced")),
                     f"{against('balanced')}; {at_slippy('balanced')}. Equal counts are not equal mass: GRPO's "
                     f"advantages differ in size between groups, so its worst step still sums to |ΣA| = "
                     f"{worst('balanced'):.3g} on average (random {worst('random'):.3g}), and Adam turns any residual "
                     "into a full-sized step"),
        report.claim("Reward-balanced batching reduces template drift: `mass_balanced` ([recon] equal SUMS of A per "
                     "step; splits groups)",
                     report.agrees_if(reduces("mass_balanced")),
                     f"{against('mass_balanced')}; {at_slippy('mass_balanced')}. Its worst step sums to |ΣA| = "
                     f"{worst('mass_balanced'):.3g}, with {numbers['mass_balanced']['split groups']:.1f} of 4 groups "
                     "split"),
        report.claim("Reward-balanced batching reduces template drift: `query_balanced` ([recon] whole groups, packed "
                     "so that each step's counts balance)",
                     report.agrees_if(reduces("query_balanced")),
                     f"{against('query_balanced')}; {at_slippy('query_balanced')}. Whole groups are zero-sum on their "
                     "own, so this is query-preserved batching with a packing rule"),
    ]
