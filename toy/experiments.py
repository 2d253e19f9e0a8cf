"""The six experiments of the toy, each a function returning its numbers and drawing one PNG.

All use the project's own advantages.py, loss.py, batching.py and scheduler.py on the
bandit of toy/bandit.py. "Exact" means a sum over the whole sample space or a closed
form; where an experiment needs a finite batch (2, 4, 5a) it uses one fixed-seed draw,
says so, and reports the spread over seeds.
"""

from __future__ import annotations

import math

import torch

import advantages as adv_lib
import batching
import loss as loss_lib
import scheduler as sched_lib
from toy import bandit as B

G = 8


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _grad_through_loss(policy, responses, adv, cfg, old_logp=None, group_index=None, mask=None):
    """(grad_b, grad_W) of loss.policy_loss on these responses (descent direction negated:
    returned as the UPDATE direction, i.e. minus the gradient)."""
    logp = B.token_logprobs(policy, responses)
    mask = torch.ones_like(logp) if mask is None else mask
    logp = logp * mask
    old = logp.detach() if old_logp is None else old_logp
    loss, _ = loss_lib.policy_loss(logp, old, adv, mask, cfg, loss_lib.step_normaliser(mask),
                                   group_index=group_index, with_residual=False)
    gb, gW = torch.autograd.grad(loss, policy.parameters())
    return -gb, -gW


# ---------------------------------------------------------------------------------------
# 1. The cancellation identity
# ---------------------------------------------------------------------------------------

def exp1_cancellation_identity(out_dir: str, n_groups: int = 32, seed: int = 0) -> dict:
    """Update of each token's bias b[a] = G Cov(A, n_a) / n_tokens, for every group.

    Through loss.policy_loss (PPO on-policy, token-mean) with Dr. GRPO's mean-centred
    advantage and equal lengths, the update of b[a] is sum_i A_i (n_a(o_i) - sum_t p_t(a))
    / n_tokens, and the second term drops out because sum_i A_i = 0. We check the identity
    on n_groups sampled groups for all 10 tokens, and report the template tokens' update
    in the groups where every rollout has all three templates (exactly 0) and the average
    credit of each digit (the "implicit token credit" of spec section 6).
    """
    policy = B.make_policy(seed)
    responses = B.sample_groups(policy, n_groups, G, seed)
    rewards = B.reward(responses).view(n_groups, G)
    A = adv_lib.compute_advantages("mean", rewards)
    cfg = loss_lib.LossConfig()
    max_err, template_updates, credit = 0.0, [], torch.zeros(B.V, dtype=torch.float64)
    for m in range(n_groups):
        rows = responses[m * G:(m + 1) * G]
        gb, _ = _grad_through_loss(policy, rows, A[m], cfg)
        n = B.token_counts(rows)
        cov = ((A[m] - A[m].mean()).unsqueeze(1) * (n - n.mean(0))).mean(0)      # population Cov(A, n_a)
        predicted = G * cov / (G * B.L)                                           # / n_tokens
        max_err = max(max_err, float((gb - predicted).abs().max()))
        if all(n[:, B.IDX[t]].eq(1).all() for t in B.TEMPLATE_TOKENS):
            template_updates += [float(gb[B.IDX[t]]) for t in B.TEMPLATE_TOKENS]
        credit += G * cov
    credit /= n_groups
    result = {"max_abs_error_vs_G_cov": max_err,
              "groups_with_all_templates": len(template_updates) // 3,
              "max_abs_template_update_in_those": max((abs(u) for u in template_updates), default=0.0),
              "mean_credit": {t: float(credit[B.IDX[t]]) for t in B.TOKENS}}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(B.TOKENS, credit.tolist(), color=["C7" if t in B.TEMPLATE_TOKENS or t[0].isupper() else "C0"
                                              for t in B.TOKENS])
    ax.axhline(0, color="k", lw=0.8)
    ax.set(title=f"1. implicit token credit G·Cov(A, n_a), mean over {n_groups} groups (Dr. GRPO, G={G})",
           ylabel="credit")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp1_cancellation_identity.png", dpi=100)
    plt.close(fig)
    return result


# ---------------------------------------------------------------------------------------
# 2. Positive-only vs critic-free: where the updates go
# ---------------------------------------------------------------------------------------

def update_shares(name: str, n_groups: int = 2000, seed: int = 1, lr: float = 0.1) -> dict:
    """Share of sum |delta log pi(o_t)| on template positions, after one step per group.

    For each sampled group: the update direction is sum_i A_i grad log pi(o_i) (b and W),
    and the first-order change of every sampled token's log-prob is
    delta log p_t(a) = lr * (dz_t(a) - sum_a' p_t(a') dz_t(a')), dz_t = db + dW h_t.
    Vectorised over groups (closed-form scores of the softmax, no autograd loop).
    """
    policy = B.make_policy(0)
    with torch.no_grad():
        P = B.position_logprobs(policy).exp()                       # [L, V]
        responses = B.sample_groups(policy, n_groups, G, seed).view(n_groups, G, B.L)
        A = adv_lib.compute_advantages(name, B.reward(responses.view(-1, B.L)).view(n_groups, G))
        onehot = torch.nn.functional.one_hot(responses, B.V).double()          # [M, G, L, V]
        score = onehot - P                                                   # d log p_t / d z_t
        db = torch.einsum("mg,mglv->mv", A, score)
        dW = torch.einsum("mg,mglv,ld->mvd", A, score, policy.H)
        dz = db.unsqueeze(1) + torch.einsum("mvd,ld->mlv", dW, policy.H)     # [M, L, V]
        dz = torch.where(torch.isfinite(B.position_logprobs(policy)), dz, torch.zeros_like(dz))
        dlogp = lr * (dz - (P * dz).sum(-1, keepdim=True))                  # [M, L, V]
        per_token = dlogp.unsqueeze(1).expand(-1, G, -1, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1).abs()
        template = per_token[:, :, list(B.TEMPLATE_POSITIONS)].sum()
        total = per_token.sum()
    return {"template_share": float(template / total), "total_abs_change": float(total / n_groups)}


def exp2_where_updates_go(out_dir: str) -> dict:
    """psr (positive-only) vs mean (Dr. GRPO) vs grpo: share of update mass on templates."""
    names = ["psr", "mean", "grpo", "nsr"]
    shares = {name: update_shares(name) for name in names}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [shares[n]["template_share"] for n in names], color=["C3", "C0", "C2", "C1"])
    ax.set(title="2. share of |Δ log π| on template tokens (one step per group)", ylabel="template share")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp2_where_updates_go.png", dpi=100)
    plt.close(fig)
    return shares


# ---------------------------------------------------------------------------------------
# 3. Exchangeability breakers and the DFPO fixes
# ---------------------------------------------------------------------------------------

def exp3_exchangeability(out_dir: str) -> dict:
    """Net update of the shared template token "Let" (position 0, same context everywhere)
    in one fixed group, under each objective. Exactly 0 means the group's updates cancel.

    The group: 4 successes and 4 failures, all starting with "Let"; responses are cut to
    unequal lengths 2..5 by the mask (as if they stopped early), and the "old" policy
    that sampled them is a perturbed copy, so GSPO ratios and clipping are live.
    """
    policy = B.make_policy(0)
    digits = [("3", "7"), ("7", "3"), ("5", "5"), ("3", "7"), ("2", "2"), ("2", "5"), ("7", "7"), ("5", "3")]
    responses = torch.tensor([[B.IDX[t] for t in ("Let", x, "so", y, "ans")] for x, y in digits])
    A = adv_lib.compute_advantages("mean", B.reward(responses).view(1, G))[0]
    lengths = torch.tensor([5, 3, 4, 2, 5, 4, 3, 5])
    unequal = (torch.arange(B.L).unsqueeze(0) < lengths.unsqueeze(1)).double()
    equal = torch.ones(G, B.L, dtype=torch.float64)
    old_policy = B.make_policy(0)
    with torch.no_grad():
        old_policy.b += 0.15 * torch.randn(B.V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        old_logp = B.token_logprobs(old_policy, responses)
        same_logp = B.token_logprobs(policy, responses)
    gi = torch.zeros(G, dtype=torch.long)
    let = B.IDX["Let"]
    C = loss_lib.LossConfig
    cases = [
        ("token-mean, on-policy", C(agg="token-mean"), unequal, None),
        ("seq-mean-token-sum-norm (Dr. GRPO)", C(agg="seq-mean-token-sum-norm"), unequal, None),
        ("seq-mean-token-mean, equal lengths", C(agg="seq-mean-token-mean"), equal, None),
        ("seq-mean-token-mean, unequal lengths", C(agg="seq-mean-token-mean"), unequal, None),
        ("GSPO sequence ratio (raw weights)", C(loss_type="gspo", agg="token-mean", eps_low=0.9, eps_high=9.0),
         equal, old_logp),
        ("GSPO + DFPO min", C(loss_type="gspo", agg="token-mean", weight_transform="min", eps_low=0.9, eps_high=9.0),
         unequal, old_logp),
        ("GSPO + DFPO orth", C(loss_type="gspo", agg="token-mean", weight_transform="orth", eps_low=0.9,
                               eps_high=9.0), unequal, old_logp),
        ("PPO 0.2/0.28, ratio 1.25 on 'Let' (inside the range)", C(eps_low=0.2, eps_high=0.28), equal, 1.25),
        ("PPO 0.2/0.2, ratio 1.25 on 'Let' (A>0 clipped, A<0 not)", C(eps_low=0.2, eps_high=0.2), equal, 1.25),
        ("PPO 0.2/0.28, ratio 1.35 on 'Let' (A>0 clipped, A<0 not)", C(eps_low=0.2, eps_high=0.28), equal, 1.35),
    ]
    result = {}
    for label, cfg, mask, old in cases:
        if isinstance(old, float):   # the policy moved: "Let" has this ratio in every rollout
            ratio, old = old, same_logp.clone()
            old[:, 0] -= math.log(ratio)
        gb, _ = _grad_through_loss(policy, responses, A, cfg, old_logp=old, group_index=gi, mask=mask)
        result[label] = float(gb[let])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(result)
    ax.barh(labels, [abs(result[k]) for k in labels], color=["C0" if abs(result[k]) < 1e-12 else "C3" for k in labels])
    ax.set(title="3. |net update| of the shared template token 'Let' in one group", xlabel="|Δ b['Let']|")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp3_exchangeability.png", dpi=100)
    plt.close(fig)
    return result


# ---------------------------------------------------------------------------------------
# 4. Mini-batching: random vs query-preserved vs reward-balanced
# ---------------------------------------------------------------------------------------

def exp4_minibatching(out_dir: str, seeds: range = range(6), n_groups: int = 8, k: int = 4,
                      lr: float = 0.02) -> dict:
    """Drift of the template logits after one epoch of k Adam steps on one rollout batch.

    For each seed: sample n_groups groups of G from the policy (one deterministic draw),
    GRPO advantages, split with batching.minibatch_indices(mode), one Adam step per
    mini-batch through loss.policy_loss (PPO, token-mean). The templates' true credit is 0
    (the reward never reads them), so every bit of |Δ b[template]| is reward-irrelevant
    drift. Adam matters here: it rescales a tiny uncancelled residual to a full-size step.
    """
    modes = list(batching.MODES)
    drift = {m: [] for m in modes}
    tpl = [B.IDX[t] for t in B.TEMPLATE_TOKENS]
    for seed in seeds:
        base = B.make_policy(0)
        responses = B.sample_groups(base, n_groups, G, 100 + seed)
        A = adv_lib.compute_advantages("grpo", B.reward(responses).view(n_groups, G))
        with torch.no_grad():
            old = B.token_logprobs(base, responses)
        for mode in modes:
            policy = base.clone()
            opt = torch.optim.Adam(policy.parameters(), lr=lr)
            steps = batching.minibatch_indices(A, k, mode, torch.Generator().manual_seed(seed))
            for idx in steps:
                logp = B.token_logprobs(policy, responses[idx])
                mask = torch.ones_like(logp)
                loss, _ = loss_lib.policy_loss(logp, old[idx], A.reshape(-1)[idx], mask, loss_lib.LossConfig(),
                                               loss_lib.step_normaliser(mask), with_residual=False)
                opt.zero_grad()
                loss.backward()
                opt.step()
            drift[mode].append(float((policy.b.detach()[tpl] - base.b.detach()[tpl]).abs().mean()))
    result = {m: {"mean": sum(v) / len(v), "max": max(v)} for m, v in drift.items()}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot([drift[m] for m in modes], tick_labels=modes)
    ax.set(title=f"4. template-logit drift after one epoch ({k} Adam steps, {len(seeds)} seeds)",
           ylabel="mean |Δ b[template]|")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp4_minibatching.png", dpi=100)
    plt.close(fig)
    return result


# ---------------------------------------------------------------------------------------
# 5. Token flipping and coupling
# ---------------------------------------------------------------------------------------

def exp5_flips_and_coupling(out_dir: str, n_groups: int = 64, seed: int = 2, tau: float = 1e-3) -> dict:
    """(a) boosted/suppressed token fractions in positive and negative rollouts after one
    GRPO step; (b) the output-layer coupling closed form vs autograd. [recon] definitions.

    Coupling of two occurrences (a at position t, b at position t'): the inner product of
    their W-gradients, grad_W log p_t(a) . grad_W log p_t'(b) =
        ([a == b] - p_t'(a) - p_t(b) + p_t . p_t') * (h_t . h_t')
    """
    policy = B.make_policy(0)
    responses = B.sample_groups(policy, n_groups, G, seed)
    A = adv_lib.compute_advantages("grpo", B.reward(responses).view(n_groups, G)).reshape(-1)
    with torch.no_grad():
        old = B.token_logprobs(policy, responses)
    new_policy = policy.clone()
    opt = torch.optim.SGD(new_policy.parameters(), lr=0.5)
    logp = B.token_logprobs(new_policy, responses)
    mask = torch.ones_like(logp)
    loss, _ = loss_lib.policy_loss(logp, old, A, mask, loss_lib.LossConfig(), loss_lib.step_normaliser(mask),
                                   with_residual=False)
    loss.backward()
    opt.step()
    with torch.no_grad():
        diff = B.token_logprobs(new_policy, responses) - old
    flips = {}
    for name, rows in (("pos", A > 0), ("neg", A < 0)):
        flips[f"boost_{name}"] = float((diff[rows] > tau).double().mean())
        flips[f"suppress_{name}"] = float((diff[rows] < -tau).double().mean())

    # (b) coupling: closed form vs autograd, for every (position, token) pair on the menus
    P = B.position_logprobs(policy).exp().detach()
    occ = [(t, B.IDX[a]) for t, menu in enumerate(B.MENUS) for a in menu]
    grads = []
    for t, a in occ:
        (gW,) = torch.autograd.grad(B.position_logprobs(policy)[t, a], [policy.W])
        grads.append(gW.reshape(-1))
    rows = []
    max_err = 0.0
    for i, (t, a) in enumerate(occ):
        for j, (t2, b2) in enumerate(occ):
            if j < i:
                continue
            closed = (float(a == b2) - P[t2, a] - P[t, b2] + (P[t] * P[t2]).sum()) * (policy.H[t] @ policy.H[t2])
            auto = grads[i] @ grads[j]
            max_err = max(max_err, float((closed - auto).abs()))
            # i == j: the same token at the same position in two different rollouts
            rows.append((a == b2, float(min(P[t, a], P[t2, b2])), float(closed.abs())))
    same_low = [c for same, conf, c in rows if same and conf < 0.5]
    same_high = [c for same, conf, c in rows if same and conf >= 0.5]
    diff_tok = [c for same, conf, c in rows if not same]
    mean = lambda xs: sum(xs) / max(1, len(xs))
    result = {**flips, "coupling_max_error_closed_vs_autograd": max_err,
              "coupling_identical_low_conf": mean(same_low), "coupling_identical_high_conf": mean(same_high),
              "coupling_different_tokens": mean(diff_tok)}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    axes[0].bar(["boost +", "suppr +", "boost −", "suppr −"],
                [flips["boost_pos"], flips["suppress_pos"], flips["boost_neg"], flips["suppress_neg"]],
                color=["C2", "C3", "C2", "C3"])
    axes[0].set(title="5a. token flips after one GRPO step", ylabel="fraction of tokens")
    axes[1].bar(["identical,\np<0.5", "identical,\np>=0.5", "different"],
                [result["coupling_identical_low_conf"], result["coupling_identical_high_conf"],
                 result["coupling_different_tokens"]], color=["C0", "C9", "C7"])
    axes[1].set(title="5b. mean |coupling| between occurrences", ylabel="|grad . grad'|")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp5_flips_coupling.png", dpi=100)
    plt.close(fig)
    return result


# ---------------------------------------------------------------------------------------
# 6. Sign and difficulty axes: masses, and entropy under exact expected updates
# ---------------------------------------------------------------------------------------

def _population(seed: int = 0, M: int = 6, K: int = 8):
    """M prompts, each a softmax over K answers; n_correct and a difficulty shift per prompt."""
    g = torch.Generator().manual_seed(seed)
    n_correct = [1, 1, 2, 2, 3, 4][:M]
    shift = [-1.5, -0.5, -1.0, 0.0, -0.5, 0.5][:M]
    logits = 0.5 * torch.randn(M, K, generator=g, dtype=torch.float64)
    correct = torch.zeros(M, K, dtype=torch.bool)
    for j in range(M):
        correct[j, :n_correct[j]] = True
        logits[j, :n_correct[j]] += shift[j]
    return logits, correct


def simulate(name: str, steps: int = 150, lr: float = 1.0, schedule: str | None = None, seeds=range(3),
             **hyper) -> dict:
    """Train the prompt population with SAMPLED groups; mean over seeds of entropy and solve rate.

    Why sampled and not exact expected updates: in expectation E[grad log pi] = 0, so any
    advantage a(r) + const has the same expected update; psr and nsr are then
    indistinguishable (we checked: identical to 1e-15). Their different effect on entropy
    comes from sampling: psr pushes up the answers it happened to sample (the rich get
    richer), nsr pushes down sampled wrong answers and hands their mass to all others.
    Per step and prompt: G answers from pi_j, A = compute_advantages(name, rewards [M, G]),
    logits_j += lr * (1/G) sum_g A_jg (e_{o_jg} - pi_j)  (the exact score of a softmax).
    One fixed seed per run; the curves are means over `seeds`.
    """
    H_all, p_all, alpha_hist, delta_hist, target = [], [], [], [], None
    for seed in seeds:
        logits, correct = _population()
        M, K = logits.shape
        g = torch.Generator().manual_seed(seed)
        sched = sched_lib.AdvantageScheduler(sched_lib.SchedulerConfig(schedule="fade")) if schedule else None
        H_hist, p_hist = [], []
        for _ in range(steps):
            pi = torch.softmax(logits, 1)
            H = float(-(pi * pi.clamp(min=1e-300).log()).sum(1).mean())
            p = (pi * correct).sum(1)
            if sched is not None:
                s = sched.step(float(p.mean()), H)
                hyper = {"alpha": s["alpha"], "delta": s["delta"]}
                if seed == seeds[0]:
                    alpha_hist.append(s["alpha"])
                    delta_hist.append(s["delta"])
                    target = s["H_target"]
            H_hist.append(H)
            p_hist.append(float(p.mean()))
            answers = torch.multinomial(pi, G, replacement=True, generator=g)               # [M, G]
            rewards = correct.gather(1, answers).double()
            A = adv_lib.compute_advantages(name, rewards, **hyper)
            onehot = torch.nn.functional.one_hot(answers, K).double()                       # [M, G, K]
            logits += lr * (A.unsqueeze(-1) * (onehot - pi.unsqueeze(1))).mean(1)
        H_all.append(H_hist)
        p_all.append(p_hist)
    mean = lambda rows: [sum(col) / len(col) for col in zip(*rows)]
    return {"entropy": mean(H_all), "solve_rate": mean(p_all), "alpha": alpha_hist, "delta": delta_hist,
            "H_target": target}


def exp6_sign_and_difficulty(out_dir: str) -> dict:
    """Mass curves of every advantage, and entropy under success- vs failure-biased updates."""
    runs = {
        "psr (success only)": simulate("psr"),
        "asym delta=2 (success-biased)": simulate("asym", delta=2.0),
        "mean (balanced)": simulate("mean"),
        "asym delta=0.5 (failure-biased)": simulate("asym", delta=0.5),
        "nsr (failure only)": simulate("nsr"),
        "fade + FADE schedule": simulate("fade", schedule="fade"),
    }
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name in adv_lib.ADVANTAGES:
        p, m_S, m_F = adv_lib.mass_curve(name, G=64)
        tot = m_S + m_F
        if tot.max() > 0:
            axes[0].plot(p, tot / tot.max(), lw=1.2, label=name)
    axes[0].set(title="6a. difficulty axis: (m_S+m_F)(p) / max", xlabel="solve rate p")
    axes[0].legend(fontsize=6, ncol=2)
    for label, r in runs.items():
        axes[1].plot(r["entropy"], label=label)
        axes[2].plot(r["solve_rate"], label=label)
    fade = runs["fade + FADE schedule"]
    axes[1].axhline(fade["H_target"], color="k", ls=":", label="FADE H_target = 0.5 H0")
    axes[1].set(title="6b. mean entropy (sampled groups, mean of 3 seeds)", xlabel="step", ylabel="nats")
    axes[2].set(title="6c. mean solve rate", xlabel="step")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/exp6_sign_difficulty.png", dpi=100)
    plt.close(fig)
    summary = {label: {"H0": r["entropy"][0], "H_final": r["entropy"][-1], "p_final": r["solve_rate"][-1]}
               for label, r in runs.items()}
    summary["fade_H_target"] = fade["H_target"]
    summary["fade_final_delta"] = fade["delta"][-1]
    summary["fade_min_entropy"] = min(fade["entropy"])
    return summary
