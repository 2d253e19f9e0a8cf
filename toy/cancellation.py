"""Experiments 1, 2 and 5: where a group's update goes, token by token (Cancellation Hypothesis).

The Cancellation Hypothesis paper (arXiv 2605.08666) reads critic-free RL at the token
level. A group's update is sum_i A_i grad log pi(o_i). Write the gradient with respect to
token a's own logit offset (W[a, 0] here, the bias coordinate of the output layer). With
position-only contexts the softmax score gives

    d log pi(o) / d W[a, 0]  =  n_a(o) - sum_t p_t(a)          (n_a(o): count of a in o)

and the second term is the SAME for every response of equal length. Multiply by A_i and
sum over a group whose advantages sum to zero: the second term drops out and

    update of token a  =  sum_i A_i n_a(o_i)  =  G * Cov(A, n_a)       (population Cov)

("implicit token credit", docs/math.md §6.2 [recon]). A token every rollout contains equally
often, a template, gets exactly 0 whatever the rewards; a token that is more frequent in
the successes gets positive credit, one more frequent in the failures negative. No critic
assigns this credit: the comparison inside the group does. Experiment 1 checks the
identity in all 5985 groups through the project's loss; experiment 2 measures how much of
the update lands on template tokens under positive-only training versus critic-free RL;
experiment 5 looks at the other half of the paper's story: tokens are coupled through the
shared output layer, so a token's change is not decided by its own advantage alone.

Experiments 1, 2 and 5a are exact sums over every group of G = 4 rollouts (toy/bandit.py);
5b-c sample responses with filler positions (fixed seeds, standard errors over batches).
Each experiment is expN_compute (the numbers) and expN_judge (the claims) here, and
plots.expN (the figure) in toy/plots.py; expN_* chains the three.
"""

from __future__ import annotations

import torch

import advantages as adv_lib
from toy import bandit as B
from toy import plots, report

TEMPLATE_PROBS = (0.5, 0.9, 0.99)
FLIP_TAU = 1e-3       # docs/math.md §6.1: a token is boosted if its log-prob rose by more than tau


def _setup(template_prob: float = 0.9):
    """The bandit, its weights, every group, their probabilities and rewards."""
    bandit, W = B.make_bandit(template_prob=template_prob)
    combos, log_coef = B.enumerate_groups(bandit.K)
    prob = B.group_probs(bandit, W, combos, log_coef)
    return bandit, W, combos, prob, bandit.reward[combos]


def _slip_free(bandit, combos) -> torch.Tensor:
    """[n] True where every rollout of the group starts with the template "Let"."""
    return (bandit.responses[combos][:, :, 0] == B.IDX[B.TEMPLATE]).all(dim=1)


# ---------------------------------------------------------------------------------------
# 1. The cancellation identity
# ---------------------------------------------------------------------------------------

def exp1_cancellation_identity(out_dir: str) -> dict:
    """Update of each token's logit = G Cov(A, n_a) / (G L), in every group, through loss.py.

    Dr. GRPO's mean-centred advantage (sum_i A_i = 0), PPO on-policy, token-mean: the
    loss divides by the step's G*L tokens, hence the 1/(G L). The update comes from
    autograd through loss.policy_loss (bandit.group_updates); the prediction from the
    token counts alone. Also: the template's whole update (all of W["Let"]) in the groups
    where every rollout has it, which should be 0, and the same for the positive-only
    `psr`, which is not zero-sum and therefore a negative control.
    """
    data = exp1_compute()
    claims = exp1_judge(data)
    png = plots.exp1(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1]}


def exp1_compute() -> dict:
    """Experiment 1's numbers: measured and predicted updates [n, V], the expected credit and its closed form [V].

    Returns {"numbers": the printed table, "measured", "predicted", "credit", "closed",
    "gap"} (gap: E[n_a | correct] - E[n_a | wrong], [V]).
    """
    bandit, W, combos, prob, rewards = _setup()
    A = adv_lib.compute_advantages("mean", rewards)
    dW = B.group_updates(bandit, W, combos, A)
    measured = dW[:, :, 0]                                                  # [n, V] logit offsets
    counts = torch.nn.functional.one_hot(bandit.responses[combos], B.V).sum(dim=2).to(B.DTYPE)  # [n, G, V]
    cov = ((A - A.mean(1, keepdim=True)).unsqueeze(-1) * (counts - counts.mean(1, keepdim=True))).mean(1)
    predicted = B.G * cov / (B.G * bandit.L)
    slip_free = _slip_free(bandit, combos)
    let = B.IDX[B.TEMPLATE]
    psr_dW = B.group_updates(bandit, W, combos, adv_lib.compute_advantages("psr", rewards))
    credit = (prob.unsqueeze(1) * B.G * cov).sum(0)                         # E[G Cov(A, n_a)]
    # In expectation the credit is (G-1) Cov_pi(r, n_a) (expand sum_i (r_i - mean r) n_i over
    # independent rollouts), so its sign is that of E[n_a | correct] - E[n_a | wrong].
    pi, r = B.response_probs(bandit, W).detach(), bandit.reward
    n_resp = torch.nn.functional.one_hot(bandit.responses, B.V).sum(1).to(B.DTYPE)       # [K, V]
    p_solve = float((pi * r).sum())
    closed = (B.G - 1) * ((pi * r) @ n_resp - p_solve * (pi @ n_resp))
    gap = ((pi * r) @ n_resp) / p_solve - ((pi * (1 - r)) @ n_resp) / (1 - p_solve)
    numbers = {
        "groups (all multisets of G=4 of 18 responses)": combos.shape[0],
        "max |measured - G Cov/(G L)| over groups x tokens": float((measured - predicted).abs().max()),
        "max |predicted| (scale)": float(predicted.abs().max()),
        "slip-free groups, P(slip-free)": f"{int(slip_free.sum())}, {float(prob[slip_free].sum()):.4f}",
        "mean: max |update of W[Let]| in slip-free groups": float(dW[slip_free][:, let].abs().max()),
        "psr:  max |update of W[Let]| in slip-free groups": float(psr_dW[slip_free][:, let].abs().max()),
        "expected credit E[G Cov(A, n_a)]": {tok: float(credit[B.IDX[tok]]) for tok in B.VOCAB[:5]},
    }
    return {"numbers": numbers, "measured": measured, "predicted": predicted, "credit": credit, "closed": closed,
            "gap": gap}


def exp1_judge(data: dict) -> list[dict]:
    """Experiment 1's three claims, from exp1_compute's dict."""
    numbers, credit, closed, gap = data["numbers"], data["credit"], data["closed"], data["gap"]
    return [
        report.claim("A token's update is G*Cov(A, n_a) (mean-centred A, equal lengths)",
                     report.agrees_if(numbers["max |measured - G Cov/(G L)| over groups x tokens"] < 1e-14),
                     f"max error {numbers['max |measured - G Cov/(G L)| over groups x tokens']:.1e} over "
                     f"all {numbers['groups (all multisets of G=4 of 18 responses)']} groups, through loss.policy_loss"),
        report.claim("Template tokens shared by every rollout get exactly 0",
                     report.agrees_if(numbers["mean: max |update of W[Let]| in slip-free groups"] < 1e-16),
                     f"{numbers['mean: max |update of W[Let]| in slip-free groups']:.1e} (psr, not zero-sum: "
                     f"{numbers['psr:  max |update of W[Let]| in slip-free groups']:.2g})"),
        report.claim("Tokens more frequent in correct responses get positive credit",
                     report.agrees_if(bool((credit - closed).abs().max() < 1e-15) and all(
                         (float(credit[i]) > 0) == (float(gap[i]) > 0) for i in range(5) if abs(float(gap[i])) > 1e-12)),
                     "E[credit_a] = (G-1) Cov(r, n_a) exactly (error %.0e); E[n_a | correct] - E[n_a | wrong]: "
                     % float((credit - closed).abs().max())
                     + ", ".join(f"{B.VOCAB[i]} {float(gap[i]):+.2f} -> credit {float(credit[i]):+.3f}"
                                 for i in (2, 3, 4))
                     + (" ('7' is in every correct answer, yet 7+7, 6+7, 7+6 make it about as frequent in wrong "
                        "ones: credit is covariance, not presence)" if float(gap[B.IDX["7"]]) < 0 else "")),
    ]


# ---------------------------------------------------------------------------------------
# 2. Positive-only vs critic-free: where the updates go
# ---------------------------------------------------------------------------------------

def template_share(name: str, template_prob: float) -> dict:
    """Share of the update's |Delta log pi| that lands on template-position tokens.

    For every group: its update dW (through loss.py), the first-order change of each of
    its sampled tokens' log-probs, Delta log p_t(o_t) = dz_t(o_t) - sum_b p_t(b) dz_t(b),
    and the sums S_template (position 0: "Let" or the slip "let") and S_all. The share is
    E[S_template] / E[S_all], exact over all groups; first order, so it does not depend
    on the learning rate. [recon] the paper's exact measure is not public.
    Also returned: the same share over slip-free groups only (every rollout has "Let").
    """
    bandit, W, combos, prob, rewards = _setup(template_prob)
    A = adv_lib.compute_advantages(name, rewards)
    change = B.logp_change(bandit, W, B.group_updates(bandit, W, combos, A))
    per_token = B.sampled_token_values(change, bandit.responses[combos], bandit.mask[combos]).abs()  # [n, G, L]
    tpl, total = per_token[:, :, 0].sum(1), per_token.sum((1, 2))
    free = _slip_free(bandit, combos)
    return {"share": float((prob * tpl).sum() / (prob * total).sum()),
            "share_slip_free": float((prob * tpl)[free].sum() / (prob * total)[free].sum()),
            "E_abs_total": float((prob * total).sum())}


def exp2_where_updates_go(out_dir: str) -> dict:
    """psr (positive-only) vs mean / grpo (critic-free) vs nsr: the template's share of the update.

    Paper's claim: compared with training on positive rollouts only, critic-free RL moves
    the update from template and formatting tokens toward reasoning tokens. The mechanism
    in the analog: in a group where every rollout starts with "Let", a zero-sum advantage
    gives "Let" exactly 0, while psr pushes it up by (1 - p) per success. Groups with a
    slip "let" carry real (if reward-irrelevant) covariance under both. We scan the
    template's confidence p(Let), because the direct push shrinks like (1 - p)^2.
    """
    data = exp2_compute()
    claims = exp2_judge(data)
    png = plots.exp2(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1], "table": data["table"]}


def exp2_compute() -> dict:
    """Experiment 2's numbers: `template_share` for psr, mean, grpo, nsr at each of TEMPLATE_PROBS.

    Returns {"numbers": the printed table, "table": {advantage: [template_share(...) per
    p(Let)]}, "template_probs": TEMPLATE_PROBS}.
    """
    table = {name: [template_share(name, q) for q in TEMPLATE_PROBS] for name in ("psr", "mean", "grpo", "nsr")}
    numbers = {f"template share, {name}": {f"p(Let)={q}": row[j]["share"] for j, q in enumerate(TEMPLATE_PROBS)}
               for name, row in table.items()}
    numbers.update({f"share in slip-free groups, {name}": {f"p(Let)={q}": row[j]["share_slip_free"]
                                                          for j, q in enumerate(TEMPLATE_PROBS)}
                    for name, row in table.items()})
    return {"numbers": numbers, "table": table, "template_probs": TEMPLATE_PROBS}


def exp2_judge(data: dict) -> list[dict]:
    """Experiment 2's two claims; reads only data["table"] (psr, mean, grpo) and data["template_probs"]."""
    table, probs = data["table"], data["template_probs"]
    psr_higher = all(table["psr"][j]["share"] > max(table["mean"][j]["share"], table["grpo"][j]["share"])
                     for j in range(len(probs)))
    ratio = [table["psr"][j]["share"] / table["mean"][j]["share"] for j in range(len(probs))]
    return [
        report.claim("Critic-free RL moves the update share from template to reasoning tokens, compared "
                     "with positive-only training",
                     report.agrees_if(psr_higher),
                     "template share psr / mean = " + ", ".join(f"{r:.2f}" for r in ratio)
                     + f" at p(Let) = {', '.join(map(str, probs))}: the effect fades as the template "
                       "becomes certain"),
        report.claim("Mechanism: shared template tokens cancel under zero-sum advantages",
                     report.agrees_if(all(table[n][j]["share_slip_free"] < 1e-12 for n in ("mean", "grpo")
                                          for j in range(len(probs)))
                                      and all(table["psr"][j]["share_slip_free"] > 0 for j in range(len(probs)))),
                     "share in slip-free groups: mean/grpo 0 (to 1e-12), psr "
                     + ", ".join(f"{table['psr'][j]['share_slip_free']:.3g}" for j in range(len(probs)))),
    ]


# ---------------------------------------------------------------------------------------
# 5. Token flips and coupling
# ---------------------------------------------------------------------------------------

N_FILLER = 16         # filler positions: 17 of a response's 19 tokens are reward-irrelevant
FLIP_GROUPS = 64      # groups in the one optimizer step of the new design
FLIP_LR = 4.0         # SGD step of the sampled designs (median |Δ log p| of a decisive token ~0.03)
FLIP_BATCHES = 8      # independent batches (seeds) of the new design, for standard errors


def flip_fractions(lr: float = 1.0, tau: float = FLIP_TAU, name: str = "grpo") -> dict:
    """[recon] THE OLD DESIGN: exact flip fractions when every group is its own step.

    The 3-token bandit; one SGD step of size lr per group (through loss.py, PPO
    on-policy, token-mean), then every sampled token is rescored exactly: boosted if log p
    rose by more than tau, suppressed if it fell by more than tau (docs/math.md §6.1).
    Fractions are ratios of expectations over all groups, e.g. E[#boosted tokens in A>0
    rollouts] / E[#tokens in A>0 rollouts]. Also split into the template position and the
    digits. Two of its three tokens decide the reward, and each group moves the policy on
    its own: that is not the setting the paper measured (see `sampled_flips`).
    """
    bandit, W, combos, prob, rewards = _setup()
    A = adv_lib.compute_advantages(name, rewards)
    change = B.logp_change(bandit, W, B.group_updates(bandit, W, combos, A), lr=lr)
    vals = B.sampled_token_values(change, bandit.responses[combos], bandit.mask[combos])   # [n, G, L]
    out = {}
    for sign, rows in (("pos", A > 0), ("neg", A < 0)):
        weight = prob.unsqueeze(1) * rows                                      # [n, G]
        for part, cols in (("all", slice(None)), ("template", slice(0, 1)), ("digits", slice(1, None))):
            v = vals[:, :, cols]
            n_tok = (weight * v.shape[2]).sum()
            out[f"boost_{sign}_{part}"] = float((weight * (v > tau).sum(2)).sum() / n_tok)
            out[f"suppress_{sign}_{part}"] = float((weight * (v < -tau).sum(2)).sum() / n_tok)
    return out


def sampled_flips(n_filler: int = N_FILLER, groups_per_step: int = FLIP_GROUPS, lr: float = FLIP_LR,
                  n_batches: int = FLIP_BATCHES, tau: float = FLIP_TAU, name: str = "grpo", seed: int = 0) -> dict:
    """[recon] THE NEW DESIGN: flip fractions after ONE step over MANY groups, responses mostly filler.

    The paper's setting: responses mostly of reward-irrelevant tokens that positive and
    negative rollouts share, and one optimizer step over the many groups of a batch. Here:
    the filler bandit (n_filler filler positions, the template, 2 digits); n_batches batches
    of FLIP_GROUPS groups of G = 4 sampled from pi (seeds seed .. seed + n_batches - 1); GRPO
    advantages; each batch cut into steps of groups_per_step groups, each ONE SGD step of
    size lr from the same W on its own loss (loss.policy_loss, PPO on-policy, token-mean);
    every sampled token rescored exactly, boosted / suppressed at tau as in `flip_fractions`.
    groups_per_step = 1 and n_filler = 0 give the two halves of the old design, which is how
    experiment 5 separates the two causes. Returns, per quantity, the list over batches
    (fractions among the tokens of A>0 resp. A<0 rollouts), parts "all", "irrelevant"
    (template and fillers) and "decisive" (the two digits).
    """
    if FLIP_GROUPS % groups_per_step:
        raise ValueError(f"groups_per_step must divide {FLIP_GROUPS}, got {groups_per_step}")
    bandit, W = B.make_bandit(n_filler=n_filler)
    R, n_rollouts = groups_per_step * B.G, FLIP_GROUPS * B.G
    tokens = torch.stack([B.sample_tokens(bandit, W, n_rollouts, seed + s) for s in range(n_batches)])
    A = adv_lib.compute_advantages(name, B.reward_of(tokens).reshape(-1, B.G)).reshape(n_batches, n_rollouts)
    steps = tokens.reshape(-1, R, bandit.L)                                    # [n_batches * FLIP_GROUPS / k, R, L]
    mask = torch.ones(steps.shape, dtype=B.DTYPE)
    change = B.logp_change(bandit, W, B.step_updates(bandit, W, steps, mask, A.reshape(-1, R)), lr=lr)
    vals = B.sampled_token_values(change, steps, mask).reshape(tokens.shape)  # [n_batches, rollouts, L]
    out = {}
    for sign, rows in (("pos", A > 0), ("neg", A < 0)):
        for part, cols in (("all", slice(None)), ("irrelevant", slice(0, -2)), ("decisive", slice(-2, None))):
            v, w = vals[:, :, cols], rows.unsqueeze(-1).to(B.DTYPE)           # [batches, rollouts, l], [.., .., 1]
            n_tok = (w * torch.ones_like(v)).sum((1, 2))
            out[f"boost_{sign}_{part}"] = ((w * (v > tau)).sum((1, 2)) / n_tok).tolist()
            out[f"suppress_{sign}_{part}"] = ((w * (v < -tau)).sum((1, 2)) / n_tok).tolist()
    out["median |Δ log p|, decisive"] = float(vals[:, :, -2:].abs().median())
    out["median |Δ log p|, irrelevant"] = float(vals[:, :, :-2].abs().median())
    return out


def mean_se(xs: list) -> tuple[float, float]:
    """(mean, standard error of the mean) of a list of per-seed numbers."""
    t = torch.tensor(xs, dtype=B.DTYPE)
    return float(t.mean()), float(t.std() / len(xs) ** 0.5) if len(xs) > 1 else float("nan")


CONFIDENT_FILLER, CONFIDENT_SHIFT = "so", 3.0   # 5d's second policy: "so" gets p ~ 0.8-0.9 at every filler position
SENSITIVITY_FILLERS = (4, 8, 12, 16, 32)          # 5e: the flips verdict at other response lengths ...
SENSITIVITY_GROUPS = (1, 4, 16, 64)               # ... and other step sizes (groups per step, dividing 64)


def coupling_matrix(bandit, W) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Every menu occurrence (t, a); the closed-form coupling matrix and the autograd one, [M, M].

    autograd: J J^T with J [M, V*D] the Jacobian of the M log-probs log p_t(a) w.r.t. W.
    """
    occ = B.occurrences(bandit)
    t, a = torch.tensor([o[0] for o in occ]), torch.tensor([o[1] for o in occ])
    J = torch.autograd.functional.jacobian(lambda w: B.logp_table(bandit, w)[t, a], W.detach()).reshape(len(occ), -1)
    return occ, B.coupling_table(bandit, W, occ), J @ J.T


def coupling_classes(bandit, W, closed: torch.Tensor, occ: list) -> dict:
    """Mean |coupling| over pairs of DIFFERENT occurrences (i < j), by kind: {kind: (mean, number of pairs)}.

    Kinds: identical tokens both predicted with p < 0.5 ("low confidence", docs/math.md
    §6.3), identical tokens with at least one at p >= 0.5, and different tokens. The
    diagonal (an occurrence with itself, |grad log p|^2) is left out: it is not a
    coupling between two tokens, and with few occurrences it would dominate the means.
    A kind with no pair gets (nan, 0).
    """
    P = B.logp_table(bandit, W).exp().detach()
    t, a = torch.tensor([o[0] for o in occ]), torch.tensor([o[1] for o in occ])
    i, j = torch.triu_indices(len(occ), len(occ), offset=1)
    value, same = closed[i, j].abs(), a[i] == a[j]
    low = torch.maximum(P[t[i], a[i]], P[t[j], a[j]]) < 0.5
    kinds = {"identical, p < 0.5": same & low, "identical, p >= 0.5": same & ~low, "different": ~same}
    return {kind: (float(value[m].mean()) if bool(m.any()) else float("nan"), int(m.sum())) for kind, m in kinds.items()}


def mean(xs: list) -> float:
    """Mean of a list of per-batch numbers."""
    return sum(xs) / len(xs)


def sign_gap(run: dict, kind: str, part: str = "all") -> float:
    """Fraction of `kind` ("boost" / "suppress") tokens in A>0 rollouts minus in A<0 ones, means over batches."""
    return mean(run[f"{kind}_pos_{part}"]) - mean(run[f"{kind}_neg_{part}"])


def flip_gap(run: dict) -> float:
    """The flips verdict's number: max(|boosted A>0 - A<0|, |suppressed A>0 - A<0|), means over batches."""
    return max(abs(sign_gap(run, kind)) for kind in ("boost", "suppress"))


def exp5_flips_and_coupling(out_dir: str, lr: float = 1.0) -> dict:
    """Token flips after one GRPO step, old design vs the paper's setting; output-layer coupling.

    Paper: positive and negative rollouts have remarkably similar fractions of boosted
    and suppressed tokens, because a token's change is not fixed by its own advantage:
    occurrences are coupled through shared parameters, mostly identical tokens that are
    both predicted with low confidence. [recon] definitions, docs/math.md §6; tau = 1e-3.
    5a, old design (exact): the 3-token bandit, every group its OWN SGD step (lr 1),
    expectations over all 5985 groups. 5b, new design (sampled): responses with 16
    reward-irrelevant filler positions (17 of 19 tokens irrelevant, fillers near-uniform,
    coupled through their shared rows of W), ONE SGD step (lr 4) over 64 groups, 8
    independent batches (mean ± standard error). 5c separates the two changes: filler
    responses with one group per step, and 3-token responses with 64 groups per step.
    5d: the coupling of every pair of DIFFERENT (token, position) occurrences of the
    16-filler bandit (1540 pairs; an occurrence with itself is not a pair), closed form vs
    autograd; "low confidence" means both probabilities below 0.5. Its fillers are all
    near-uniform, so the same bandit is also scored with one filler word made confident
    (its logit offset raised by 3), which gives identical CONFIDENT pairs to compare with.
    5e: the flips verdict's gap at 4, 8, 12, 16, 32 filler positions (64 groups per step)
    and at 1, 4, 16, 64 groups per step (16 fillers), with the same seeds.
    """
    data = exp5_compute(lr)
    claims = exp5_judge(data)
    png = plots.exp5(data, out_dir)
    return {"numbers": data["numbers"], "claims": claims, "png": png.split("/")[-1],
            "runs": {key: data[key] for key in ("new", "one_group", "no_filler", "old")}}


FLIP_KEYS = ("boost_pos_all", "boost_neg_all", "suppress_pos_all", "suppress_neg_all")


def exp5_compute(lr: float = 1.0) -> dict:
    """Experiment 5's numbers: the flip runs of every design (5a-c, 5e) and the coupling matrices (5d).

    Returns {"numbers": the printed table; "old" (flip_fractions at lr), "new", "one_group",
    "no_filler" (sampled_flips runs); "by_fillers", "by_groups" ({size: run}) and
    "gap_by_fillers", "gap_by_groups" ({size: flip_gap}); "new_mean_se" ({key: (mean, SE)}
    of new's per-batch lists); "flip_bars" ({design: [(mean, SE) per FLIP_KEYS]}, SE NaN
    for the exact old design); "kinds", "kinds_c" (coupling_classes, plain and with
    CONFIDENT_FILLER confident); "coupling_confident" [M, M] and "occurrences" (t, a) of the
    confident policy; the settings "tau", "flip_groups", "n_filler", "confident_filler", "L"}.
    """
    old = flip_fractions(lr)
    new = sampled_flips()
    one_group = sampled_flips(groups_per_step=1)
    no_filler = sampled_flips(n_filler=0)
    by_fillers = {F: new if F == N_FILLER else sampled_flips(n_filler=F) for F in SENSITIVITY_FILLERS}
    by_groups = {k: new if k == FLIP_GROUPS else one_group if k == 1 else sampled_flips(groups_per_step=k)
                 for k in SENSITIVITY_GROUPS}
    filler_bandit, W = B.make_bandit(n_filler=N_FILLER)
    W_confident = W.clone()
    W_confident[B.IDX[CONFIDENT_FILLER], 0] += CONFIDENT_SHIFT           # its logit offset, the same at every position
    occ, closed, auto = coupling_matrix(filler_bandit, W)
    _, closed_c, auto_c = coupling_matrix(filler_bandit, W_confident)
    kinds = coupling_classes(filler_bandit, W, closed, occ)
    kinds_c = coupling_classes(filler_bandit, W_confident, closed_c, occ)
    p_confident = B.logp_table(filler_bandit, W_confident).exp()[1:N_FILLER + 1, B.IDX[CONFIDENT_FILLER]]
    ms = {key: mean_se(v) for key, v in new.items() if isinstance(v, list)}
    fmt4 = lambda run, part="all": (f"{mean(run[f'boost_pos_{part}']):.3f} / {mean(run[f'boost_neg_{part}']):.3f}, "
                                    f"{mean(run[f'suppress_pos_{part}']):.3f} / {mean(run[f'suppress_neg_{part}']):.3f}")
    gap_by_fillers = {F: flip_gap(run) for F, run in by_fillers.items()}
    gap_by_groups = {k: flip_gap(run) for k, run in by_groups.items()}
    numbers = {
        "5a old design (3 tokens, 1 group per step, exact): boosted A>0 / A<0, suppressed A>0 / A<0":
            f"{old['boost_pos_all']:.3f} / {old['boost_neg_all']:.3f}, "
            f"{old['suppress_pos_all']:.3f} / {old['suppress_neg_all']:.3f}",
        **{f"5b new design: {key} (mean, SE over {FLIP_BATCHES} batches)": list(v) for key, v in ms.items()
           if key.endswith("_all")},
        "5b new design, reward-irrelevant tokens: boosted A>0 / A<0, suppressed A>0 / A<0": fmt4(new, "irrelevant"),
        "5b new design, decisive tokens: boosted A>0 / A<0, suppressed A>0 / A<0": fmt4(new, "decisive"),
        "5b median |Δ log p|: decisive, irrelevant": [new["median |Δ log p|, decisive"],
                                                      new["median |Δ log p|, irrelevant"]],
        "5c fillers, 1 group per step: boosted A>0 / A<0, suppressed A>0 / A<0": fmt4(one_group),
        "5c 3 tokens, 64 groups per step: boosted A>0 / A<0, suppressed A>0 / A<0": fmt4(no_filler),
        "5c irrelevant tokens, boosted A>0 minus A<0: 1 group vs 64 groups per step":
            [sign_gap(one_group, "boost", "irrelevant"), sign_gap(new, "boost", "irrelevant")],
        f"5e flips gap by filler positions, {FLIP_GROUPS} groups per step (verdict: <= 0.1)": {
            F: round(g, 3) for F, g in gap_by_fillers.items()},
        f"5e flips gap by groups per step, {N_FILLER} filler positions": {
            k: round(g, 3) for k, g in gap_by_groups.items()},
        "5d coupling: max |closed form - autograd| (both policies)": float(max((closed - auto).abs().max(),
                                                                              (closed_c - auto_c).abs().max())),
        f"5d mean |coupling| over pairs of different occurrences, {N_FILLER}-filler bandit (mean, pairs)": kinds,
        f"5d   ... with '{CONFIDENT_FILLER}' made confident (p {float(p_confident.min()):.2f}-"
        f"{float(p_confident.max()):.2f} at every filler position)": kinds_c,
    }
    flip_bars = {design: [mean_se(run[k]) for k in FLIP_KEYS] for design, run in
                 (("old", {k: [old[k]] for k in FLIP_KEYS}), ("one_group", one_group), ("no_filler", no_filler),
                  ("new", new))}
    return {"numbers": numbers, "old": old, "new": new, "one_group": one_group, "no_filler": no_filler,
            "by_fillers": by_fillers, "by_groups": by_groups, "gap_by_fillers": gap_by_fillers,
            "gap_by_groups": gap_by_groups, "new_mean_se": ms, "flip_bars": flip_bars, "kinds": kinds,
            "kinds_c": kinds_c, "coupling_confident": closed_c, "occurrences": occ, "tau": FLIP_TAU,
            "flip_groups": FLIP_GROUPS, "n_filler": N_FILLER, "confident_filler": CONFIDENT_FILLER,
            "L": filler_bandit.L}


def exp5_judge(data: dict) -> list[dict]:
    """Experiment 5's three claims, from exp5_compute's dict."""
    old, new, one_group, no_filler = data["old"], data["new"], data["one_group"], data["no_filler"]
    gap_by_fillers, gap_by_groups = data["gap_by_fillers"], data["gap_by_groups"]
    numbers, ms, kinds, kinds_c = data["numbers"], data["new_mean_se"], data["kinds"], data["kinds_c"]
    groups, n_filler, confident = data["flip_groups"], data["n_filler"], data["confident_filler"]
    old_gap = max(abs(old["boost_pos_all"] - old["boost_neg_all"]), abs(old["suppress_pos_all"] - old["suppress_neg_all"]))
    new_gap = flip_gap(new)
    gap_se = {kind: mean_se([p - q for p, q in zip(new[f"{kind}_pos_all"], new[f"{kind}_neg_all"])])
              for kind in ("boost", "suppress")}
    return [
        report.claim("Positive and negative rollouts have similar fractions of boosted and suppressed tokens "
                     "(we call |difference| <= 0.1 similar)",
                     report.agrees_if(new_gap <= 0.1),
                     f"new design ({n_filler + 1} of {data['L']} tokens reward-irrelevant, one step over {groups} groups): boosted "
                     f"{ms['boost_pos_all'][0]:.3f} ± {ms['boost_pos_all'][1]:.3f} (A>0) vs "
                     f"{ms['boost_neg_all'][0]:.3f} ± {ms['boost_neg_all'][1]:.3f} (A<0), suppressed "
                     f"{ms['suppress_pos_all'][0]:.3f} vs {ms['suppress_neg_all'][0]:.3f}; gaps "
                     f"{gap_se['boost'][0]:+.3f} ± {gap_se['boost'][1]:.3f} and {gap_se['suppress'][0]:+.3f} ± "
                     f"{gap_se['suppress'][1]:.3f}. "
                     f"Old design (3 tokens, each group its own step): gap {old_gap:.3f}. Both changes matter: "
                     f"fillers with one group per step leave a gap of {sign_gap(one_group, 'boost'):.3f}, 3-token "
                     f"responses with {groups} groups per step {sign_gap(no_filler, 'boost'):.3f}. In a one-group step "
                     "a token's change follows its own rollout's advantage; in a many-group step a reward-irrelevant "
                     "token moves with the sum over all its coupled occurrences, whose signs do not depend on its "
                     "own rollout, and only the few decisive tokens keep a sign-dependent change. The verdict depends "
                     "on the analog's size (5e): gap "
                     + " / ".join(f"{g:.3f}" for g in gap_by_fillers.values()) + " at "
                     + " / ".join(map(str, gap_by_fillers)) + f" filler positions ({groups} groups per step), "
                     + " / ".join(f"{g:.3f}" for g in gap_by_groups.values()) + " at "
                     + " / ".join(map(str, gap_by_groups)) + f" groups per step ({n_filler} fillers): it holds with "
                     f"{', '.join(str(F) for F, g in gap_by_fillers.items() if g <= 0.1)} fillers and "
                     f"{', '.join(str(k) for k, g in gap_by_groups.items() if g <= 0.1)} groups per step. The "
                     "gap shrinks steadily toward the paper's setting (hundreds of tokens, many groups per step); "
                     "where it crosses 0.1, our threshold, is not a property of that setting"),
        report.claim("Negative rollouts also contain boosted tokens (a token's change is not its own advantage's sign)",
                     report.agrees_if(min(ms["boost_neg_all"][0], old["boost_neg_all"]) > 0.05),
                     f"{ms['boost_neg_all'][0]:.3f} of the tokens in A<0 rollouts are boosted (old design "
                     f"{old['boost_neg_all']:.3f}); among decisive tokens "
                     f"{mean(new['boost_neg_decisive']):.3f}: a wrong answer's '3' is still credited"),
        report.claim("Coupling is largest between identical low-confidence tokens (closed form = autograd)",
                     report.agrees_if(numbers["5d coupling: max |closed form - autograd| (both policies)"] < 1e-13
                                      and kinds_c["identical, p < 0.5"][0] > 2 * max(kinds_c["identical, p >= 0.5"][0],
                                                                                      kinds_c["different"][0])
                                      and kinds["identical, p < 0.5"][0] > 2 * kinds["different"][0]),
                     f"pairs of different occurrences in the {n_filler}-filler bandit (self-pairs excluded): identical "
                     f"tokens {kinds['identical, p < 0.5'][0]:.3f} ({kinds['identical, p < 0.5'][1]} pairs, all low "
                     f"confidence) vs different tokens {kinds['different'][0]:.3f}; with '{confident}' made "
                     f"confident: identical low-confidence {kinds_c['identical, p < 0.5'][0]:.3f}, identical confident "
                     f"('{confident}' with itself at two positions) {kinds_c['identical, p >= 0.5'][0]:.3f}, "
                     f"different {kinds_c['different'][0]:.3f}; closed form - autograd "
                     f"{numbers['5d coupling: max |closed form - autograd| (both policies)']:.0e}"),
    ]
