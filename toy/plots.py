"""The figures of the seven experiments: one function per experiment, data in, PNG out.

Each experiment (toy/cancellation.py, breakers.py, fade.py) is split in three: a compute
function returns a plain dict of numbers, a judge function turns that dict into the
papers' claims with their verdicts, and the function of the same number here draws it.
Nothing here computes a number that a verdict reads; a figure only shows the dict it is
given, so the figures can change without touching a verdict, and the reverse.

plots.expN(data, out_dir) writes out_dir/expN_*.png and returns its path. The keys each
one reads are those of the matching expN_compute, settings included (step sizes, seeds,
...): this module imports no experiment module, because they import it. matplotlib is
used here and through report.py's figure helpers only.
"""

from __future__ import annotations

import torch

from toy import bandit as B
from toy import report


def exp1(data: dict, out_dir: str) -> str:
    """1a: every group's measured update against G Cov(A, n_a) / (G L), per token; 1b: each token's expected credit."""
    predicted, measured, credit = data["predicted"], data["measured"], data["credit"]
    fig, (ax0, ax1) = report.figure(2)
    colors = ["C7", "C8", "C0", "C3", "C2"]
    for tok, color in zip(B.VOCAB[:5], colors):
        i = B.IDX[tok]
        pairs = torch.unique(torch.stack([predicted[:, i], measured[:, i]], 1).round(decimals=12), dim=0)
        ax0.plot(pairs[:, 0], pairs[:, 1], "o", ms=3, color=color, label=tok)
    ax0.set(title=f"1a. all {measured.shape[0]} groups: autograd through loss.py vs prediction",
            xlabel="G·Cov(A, n_a) / (G·L)", ylabel="update of W[a, 0] (token a's logit)")
    ax0.legend(fontsize=8)
    toks = list(B.VOCAB[:5])
    ax1.bar(toks, [float(credit[B.IDX[t]]) for t in toks], color=colors)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="1b. expected implicit credit E[G·Cov(A, n_a)] (exact)", ylabel="credit")
    return report.save(fig, out_dir, "exp1_cancellation_identity.png")


def exp2(data: dict, out_dir: str) -> str:
    """2a: the template's share of |Δ log π| per advantage and p(Let) (log scale); 2b: the same relative to psr."""
    table, probs = data["table"], data["template_probs"]
    fig, (ax0, ax1) = report.figure(2)
    x = list(range(len(probs)))
    for name, color, style in zip(table, ["C3", "C0", "C2", "C1"], ["o-", "o-", "x--", "o-"]):
        ax0.plot(x, [r["share"] for r in table[name]], style, color=color, label=name)
        ax1.plot(x, [r["share"] / p["share"] for r, p in zip(table[name], table["psr"])], style, color=color,
                 label=name)
    for ax in (ax0, ax1):
        ax.set_xticks(x, [str(q) for q in probs])
        ax.set_xlabel("template probability p(Let)")
        ax.legend(fontsize=8)
    report.log_axis(ax0, "y")
    ax0.set(title="2a. share of |Δ log π| on the template position (exact)", ylabel="template share")
    ax1.set(title="2b. the same, relative to positive-only (psr)", ylabel="share / share of psr")
    return report.save(fig, out_dir, "exp2_where_updates_go.png")


def exp5(data: dict, out_dir: str) -> str:
    """5a-c: flip fractions of the four designs; 5e: the flips gap vs the analog's size; 5d: a coupling heatmap."""
    groups, n_filler, confident = data["flip_groups"], data["n_filler"], data["confident_filler"]
    fig, (ax0, ax1, ax2) = report.figure(3, width=17, height=4.6)
    fig.subplots_adjust(right=0.95, bottom=0.2)
    labels = ["boosted\nA>0", "boosted\nA<0", "suppressed\nA>0", "suppressed\nA<0"]
    x = torch.arange(4, dtype=torch.float64)
    designs = [("old: 3 tokens, 1 group/step (exact)", "old", "C7"), ("fillers, 1 group/step", "one_group", "C1"),
               (f"3 tokens, {groups} groups/step", "no_filler", "C0"),
               (f"new: fillers, {groups} groups/step", "new", "C2")]
    for j, (label, design, color) in enumerate(designs):
        stats = data["flip_bars"][design]
        ax0.bar(x + 0.2 * (j - 1.5), [m for m, _ in stats], 0.2, yerr=[0 if se != se else se for _, se in stats],
                color=color, label=label)
    ax0.set_xticks(x.tolist(), labels)
    ax0.set(title=f"5a-c. token flips after one GRPO step (τ={data['tau']:g})", ylabel="fraction of tokens")
    ax0.legend(fontsize=7)
    by_fillers, by_groups = data["gap_by_fillers"], data["gap_by_groups"]
    ax1.plot(list(by_fillers), list(by_fillers.values()), "o-", color="C2",
             label=f"filler positions ({groups} groups per step)")
    ax1.plot(list(by_groups), list(by_groups.values()), "s--", color="C0",
             label=f"groups per step ({n_filler} filler positions)")
    ax1.axhline(0.1, color="0.5", lw=0.8, ls=":")
    report.log_axis(ax1, "x")
    ax1.set_xticks(sorted(set(by_fillers) | set(by_groups)))
    ax1.set(title="5e. the flips verdict's gap vs the analog's size\n(below the dotted line: 'similar')",
            xlabel="filler positions / groups per step", ylabel="max |A>0 - A<0| fraction")
    ax1.legend(fontsize=7)
    # The coupling heatmap of the confident policy, on the template, the first 3 filler
    # positions and the digits (the other 13 filler positions repeat the pattern).
    occ = data["occurrences"]
    shown = [i for i, (t, _) in enumerate(occ) if t <= 3 or t >= data["L"] - 2]
    names = [f"{B.VOCAB[a]}@{t}" for t, a in (occ[i] for i in shown)]
    part = data["coupling_confident"][shown][:, shown].clone()
    part.fill_diagonal_(float("nan"))                  # self-pairs: not drawn (white), not in the means
    vmax = float(part.nan_to_num().abs().max())
    im = ax2.imshow(part.numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    ax2.set_xticks(range(len(shown)), names, rotation=70, fontsize=7)
    ax2.set_yticks(range(len(shown)), names, fontsize=7)
    ax2.set_title(f"5d. coupling ∇log p·∇log p' (token@position), '{confident}' confident;\n"
                  "(diagonal, self-pairs: left out)", fontsize=9)
    fig.colorbar(im, ax=ax2, fraction=0.046)
    return report.save(fig, out_dir, "exp5_flips_coupling.png")


def exp3(data: dict, out_dir: str) -> str:
    """3a: each objective's E[R_g] on the template (log scale, by expected outcome); 3b: PPO's net weight vs ρ."""
    bars, scan = data["bars"], data["scan"]
    fig, (ax0, ax1) = report.figure(2, width=12, height=4.4)
    fig.subplots_adjust(left=0.27, top=0.86)
    labels = list(bars)
    ax0.barh(labels, [max(v, 1e-18) for v, _ in bars.values()],
             color=["C1" if "min" in label else "C0" if z else "C3" for label, (_, z) in bars.items()])
    report.log_axis(ax0, "x")
    ax0.set_xlim(1e-18, 1)
    ax0.invert_yaxis()
    ax0.tick_params(axis="y", labelsize=8)
    ax0.set(title="3a. cancellation residual on 'Let' (exact; blue: 0 up to rounding;\norange: 0 unless the clip "
                  "drops a rollout)", xlabel="E[R_g] = E[|Σ_i c_i| / Σ_i |c_i|]  (log scale)")
    for (lo, hi), color in zip(scan, ("C3", "C1")):
        ax1.plot(data["ratios"], scan[(lo, hi)], color=color, label=f"PPO clip {lo}/{hi}")
    ax1.axvspan(0.8, 1.2, color="0.9", label="inside both clip ranges")
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="3b. PPO: net weight vs the template's ratio ρ", xlabel="ρ = π(Let)/π_old(Let)",
            ylabel="E[Σ_i c_i]")
    ax1.legend(fontsize=8)
    return report.save(fig, out_dir, "exp3_exchangeability.png")


def exp4(data: dict, out_dir: str) -> str:
    """4a: |template drift| per mode and seed, at both p(Let) (log scale); 4b: the mean change of the solve rate."""
    runs, modes, numbers = data["runs"], data["modes"], data["numbers"]
    template_prob, slippy_prob = data["template_prob"], data["slippy_prob"]
    fig, (ax0, ax1) = report.figure(2, height=4.2)
    fig.subplots_adjust(bottom=0.2)
    for q, offset, color in ((template_prob, -0.2, "C0"), (slippy_prob, 0.2, "C1")):
        box = ax0.boxplot([[max(abs(r["drift"]), 1e-16) for r in runs[q][m]] for m in modes],
                          positions=[i + 1 + offset for i in range(len(modes))], widths=0.35, patch_artist=True)
        for patch in box["boxes"]:
            patch.set_facecolor(color)
        ax0.plot([], [], "s", color=color, label=f"p(Let) = {q}")
    ax0.set_xticks(range(1, len(modes) + 1), list(modes))
    report.log_axis(ax0, "y")
    ax0.tick_params(axis="x", labelsize=7, labelrotation=15)
    ax0.legend(fontsize=7)
    ax0.set(title=f"4a. |Δ log p(Let)| after one epoch ({data['n_seeds']} seeds)", ylabel="template drift (log)")
    ax1.bar(list(modes), [numbers[m]["E[d solve]"] for m in modes], color="C2")
    ax1.tick_params(axis="x", labelsize=7, labelrotation=15)
    ax1.set(title=f"4b. mean change of the solve rate, p(Let) = {template_prob}\n(the useful part)",
            ylabel="Δ p(correct)")
    return report.save(fig, out_dir, "exp4_minibatching.png")


def exp6(data: dict, out_dir: str) -> str:
    """6a: each advantage's total mass vs p; 6b: the exact one-step E[ΔH]; 6c: entropy among correct answers.

    6c's third panel follows it along the Adam, SGD and exact lr -> 0 runs; the fourth
    shows, per method, Adam's gap to mean at solve rate match_p (± 2 SE) at each step size.
    """
    labels, step, path, ps = data["labels"], data["step"], data["path"], data["one_step_ps"]
    adam, sgd, adam_lrs = data["adam"][data["adam_lr"]], data["sgd"], data["adam_lrs"]
    match_p, seeds = data["match_p"], data["seeds"]
    fig, (ax0, ax1, ax2, ax3) = report.figure(4, width=21, height=4.6)
    fig.subplots_adjust(left=0.04, right=0.99, top=0.86, wspace=0.3)
    for name, (p, m_S, m_F) in data["curves"].items():
        total = m_S + m_F
        if float(total.max()) > 0:
            ax0.plot(p, total / total.max(), lw=1.1, label=name)
    ax0.set(title="6a. difficulty axis: (m_S+m_F)(p) / max", xlabel="group solve rate p")
    ax0.legend(fontsize=6, ncol=2)
    colors = ("C3", "C1", "C0", "C2", "C5", "C4")
    lrs = torch.tensor(adam_lrs)
    for c, (label, color) in enumerate(zip(labels, colors)):
        ax1.plot(ps, [r["dH"] for r in step[label]], "o-", color=color, label=label)
        ax1.plot(ps, [r["dH_all_equal_groups"] for r in step[label]], ":", color=color)
        for hist, style in ((adam[label]["hist"], "-"), (sgd[label]["hist"], "--"), (path[:, c], ":")):
            h = hist.mean(-1)                                                    # [T, 4]
            ax2.plot(h[:, 0], h[:, 2], style, color=color)
        stats = data["adam_correct_vs_mean"][label]
        ax3.errorbar(lrs, [m for m, _ in stats], yerr=[2 * se for _, se in stats], fmt="o-", color=color, capsize=3,
                     label=label)
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set(title="6b. exact E[ΔH] of one SGD step\n(dotted: the part from all-equal groups)", xlabel="solve rate p",
            ylabel="nats")
    ax1.legend(fontsize=7)
    ax2.axvline(match_p, color="0.6", lw=0.8)
    ax2.set(title=f"6c. entropy among correct answers (solid: Adam lr {data['adam_lr']},\ndashed: SGD lr "
                  f"{data['sgd_lr']}, dotted: exact lr → 0 path; {seeds} seeds)",
            xlabel="mean solve rate", ylabel="nats", xlim=(0.4, 1.0))
    ax3.axhline(0, color="k", lw=0.8)
    report.log_axis(ax3, "x")
    ax3.set_xticks(list(adam_lrs))
    ax3.set(title=f"6c. Adam: entropy among correct minus mean's\nat solve rate {match_p} (± 2 SE) vs step size",
            xlabel="Adam lr", ylabel="nats")
    ax3.legend(fontsize=7)
    return report.save(fig, out_dir, "exp6_sign_difficulty.png")


def exp7(data: dict, out_dir: str) -> str:
    """7a: every arm's mean solve rate (controls dotted); 7b: coverage vs solve rate; 7c: FADE's knobs and scale."""
    hist, arms, statics, final = data["hist"], data["arms"], data["statics"], data["final"]
    steps, match_p, seeds, k = len(data["scale"]), data["match_p"], data["seeds"], data["coverage_k"]
    fig, (ax0, ax1, ax2) = report.figure(3, width=16, height=4.4)
    for label, color in zip(arms, [f"C{i}" for i in range(len(statics))] + ["k", "C4", "C5"]):
        h = hist[label].mean(-1)
        style = "-" if label in final else ":"            # the two controls are the arms without a final state
        ax0.plot(h[:, 0], style, color=color, label=label)
        if label in final:
            ax1.plot(h[:, 0], h[:, 3], color=color, label=label)
    ax0.axhline(match_p, color="0.6", lw=0.8)
    ax0.set(title=f"7a. mean solve rate (Adam, mean of {seeds} seeds;\ndotted: the two controls)", xlabel="step",
            ylabel="solve rate", xlim=(0, 100))
    ax0.legend(fontsize=7)
    ax1.set(title=f"7b. coverage@{k} of correct answers vs solve rate", xlabel="mean solve rate",
            ylabel=f"coverage@{k}", xlim=(0.6, 1.0))
    ax2.plot(range(steps), data["scale"], color="k", label="sum|A|: FADE / mean")
    ax2.plot(range(steps), data["alpha"][:steps].mean(1), color="C1", label="alpha")
    ax2.plot(range(steps), data["delta"].mean(1), color="C2", label="delta")
    ax2.axhline(1, color="0.6", lw=0.8)
    ax2.set(title="7c. FADE's knobs and its advantage scale\nrelative to mean's (mean of seeds)", xlabel="step")
    ax2.legend(fontsize=7)
    return report.save(fig, out_dir, "exp7_fade_schedule.png")
