"""Gradient mass: where an advantage puts its weight, on the FADE paper's two axes.

advantages.py turns G rewards into G weights. This file measures any such answer with two
numbers per group (the FADE paper's decomposition, Decugis et al. 2026, arXiv 2607.01490):

    m_S = sum_{A_i > 0} A_i          m_F = sum_{A_i < 0} |A_i|

- the SIGN axis is their ratio m_S / m_F (psr: success only; nsr: failure only; every
  zero-sum method: m_S = m_F). Its effect on entropy is second order (docs/math.md §2.3);
- the DIFFICULTY axis is where m_S(p) + m_F(p) peaks over the group's solve rate p: GRPO
  at p = 1/2, `power` with exponent alpha at p = 1/(1 + alpha).

The curves are built by CALLING the registered advantages on synthetic groups, never
from a second copy of their formulas, so a curve that disagrees with a closed form is a
bug in one of the two (tests/lesson/test_advantages.py checks both).

    m_S, m_F = gradient_mass(A)                        # per-group masses, [N] each
    p, m_S, m_F = mass_curve("grpo", G=64)             # the population curves
    python mass.py --plot docs/masses.png              # every advantage on both axes
    python mass.py --table [--G 8]                     # every advantage's value for a success
                                                       # and a failure at each c correct
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import Tensor

from advantages import ADVANTAGES, compute_advantages


def gradient_mass(adv: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group success and failure mass of an advantage tensor.

    m_S[n] = sum_{g: A[n,g] > 0} A[n,g]        m_F[n] = sum_{g: A[n,g] < 0} |A[n,g]|

    adv: [N, G]. Returns two [N] tensors. These are group SUMS; divide by G for the
    per-rollout masses the FADE paper writes as m_S = w_S p, m_F = w_F (1 - p).
    m_S = m_F for every zero-sum method; m_S - m_F is the net push a token shared by the
    whole group receives. It does NOT drive entropy at first order: for one group under
    SGD on logits, dH ~ -(eta/G) [ sum_i A_i pi(o_i)(log pi(o_i) + H) - (m_S - m_F) kappa ],
    kappa = sum_a pi_a^2 (log pi_a + H), and in expectation over on-policy samples the
    mass term drops out (docs/math.md §2.3, corrected; Cui et al. 2025's covariance form).
    """
    if adv.dim() != 2:
        raise ValueError(f"gradient_mass: adv must have shape [N, G], got {tuple(adv.shape)}")
    return adv.clamp(min=0).sum(dim=1), (-adv).clamp(min=0).sum(dim=1)


def mass_curve(name: str, G: int = 64, **hyper) -> tuple[Tensor, Tensor, Tensor]:
    """Population mass curves m_S(p), m_F(p) of a registered advantage.

    Built by CALLING the advantage on synthetic binary groups (one group per c = 0..G,
    so p = c/G exactly), not by a second hand-written formula: a curve that disagrees
    with a closed form in the docstrings is a bug in one of them, and the tests check
    both. Returns (p [G+1], m_S [G+1], m_F [G+1]) per rollout (group sums / G).

    For `reinforce_pp`, whose scale depends on the whole batch, the curve is for a batch
    made of exactly these G+1 groups; read its shape, not its scale.
    """
    c = torch.arange(G + 1)
    rewards = (torch.arange(G).unsqueeze(0) < c.unsqueeze(1)).double()   # row c: c ones
    m_S, m_F = gradient_mass(compute_advantages(name, rewards, **hyper))
    return c.double() / G, m_S / G, m_F / G


def expected_mass_curve(name: str, ps: Tensor, G: int = 8, **hyper) -> tuple[Tensor, Tensor]:
    """Expected per-rollout masses for a prompt of TRUE solve rate p at finite G.

    E_{c ~ Binomial(G, p)} [ m_S(c) / G ], same for m_F. This is what training with G
    rollouts actually applies on average; at small G it differs from the large-G
    `mass_curve` (e.g. all-correct/all-wrong groups, probability p^G + (1-p)^G, give
    zero for zero-sum methods). ps: [K] in [0, 1]. Returns two [K] tensors.
    """
    ps = torch.as_tensor(ps, dtype=torch.float64)
    _, m_S, m_F = mass_curve(name, G=G, **hyper)
    c = torch.arange(G + 1, dtype=torch.float64)
    binom = torch.tensor([math.comb(G, int(ci)) for ci in c], dtype=torch.float64)
    prob = binom * ps.unsqueeze(1) ** c * (1 - ps.unsqueeze(1)) ** (G - c)   # [K, G+1]
    return prob @ (m_S * G) / G, prob @ (m_F * G) / G


def plot_masses(path: str, G: int = 64) -> None:
    """Draw every registered advantage on the difficulty and the sign axis into a PNG.

    Left: the difficulty axis, total mass (m_S + m_F)(p) scaled to peak 1, so the peak
    location (GRPO 1/2, power alpha=2 at 1/3, maxrl at p -> 0) is what you compare.
    Middle: the sign axis, m_S / (m_S + m_F): 0.5 is balanced (cancellation possible),
    1 is success-only (psr), 0 failure-only (nsr). Right: raw m_S (solid) and m_F
    (dashed) for the FADE family, the paper's p(1-p)^alpha and p(1-p)^alpha / delta.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    cmap = plt.get_cmap("tab20")
    for i, name in enumerate(ADVANTAGES):
        p, m_S, m_F = mass_curve(name, G=G)
        total = m_S + m_F
        style = dict(color=cmap(i % 20), label=name, lw=1.6)
        if total.max() > 0:
            axes[0].plot(p, total / total.max(), **style)
        inner = total > 0
        axes[1].plot(p[inner], (m_S / total)[inner], **style)
    for (label, hyper), color in zip([("fade a=1 d=1 (Dr. GRPO)", dict(alpha=1.0, delta=1.0)),
                                      ("fade a=2 d=1", dict(alpha=2.0, delta=1.0)),
                                      ("fade a=3 d=0.5", dict(alpha=3.0, delta=0.5))],
                                     ["C0", "C1", "C3"]):
        p, m_S, m_F = mass_curve("fade", G=G, **hyper)
        axes[2].plot(p, m_S, color=color, label=label + "  m_S")
        axes[2].plot(p, m_F, color=color, ls="--", label=label + "  m_F")
    axes[0].set(title="difficulty axis: (m_S+m_F)(p) / max", xlabel="group solve rate p")
    axes[1].set(title="sign axis: m_S / (m_S+m_F)", xlabel="group solve rate p", ylim=(-0.05, 1.05))
    axes[2].set(title="FADE family masses per rollout", xlabel="group solve rate p")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=9, fontsize=8, frameon=False)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"gradient mass of every advantage (binary rewards, G={G}; from mass.py, calling advantages.py)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(G: int = 8) -> None:
    """Print every advantage's value for a success and a failure at c = 1..G-1 correct: the
    two numbers behind each group's masses (m_S = c A_success, m_F = (G - c) |A_failure|)."""
    print(f"advantage of a success / a failure, G={G}, c correct")
    print("name".ljust(13) + "".join(f"c={c}".rjust(16) for c in range(1, G)))
    rewards = (torch.arange(G).unsqueeze(0) < torch.arange(1, G).unsqueeze(1)).double()   # row c-1: c successes first
    for name in ADVANTAGES:
        try:
            A = compute_advantages(name, rewards)
        except ValueError as e:                  # e.g. passk's default k = 4 at G = 3
            print(name.ljust(13) + f"  (not at G={G}: {e})")
            continue
        cells = [f"{A[c - 1, 0].item():+.3f}/{A[c - 1, G - 1].item():+.3f}" for c in range(1, G)]
        print(name.ljust(13) + "".join(cell.rjust(16) for cell in cells))


MAX_CLI_G = 1024       # a larger --G draws curves and tables no one reads; at 10**8 it runs out of memory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mass.py", description="Every advantage's gradient mass curves in one PNG "
                                     "(--plot), or its value for a success and a failure at each c correct (--table).")
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message}\n")   # one line, exit 2
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--plot", metavar="PNG", help="draw all mass curves into this PNG (--G default 64)")
    what.add_argument("--table", action="store_true", help="print the closed-form table (--G default 8)")
    parser.add_argument("--G", type=int, default=None, help="group size of the curves or the table")
    args = parser.parse_args(argv)
    G = args.G if args.G is not None else (8 if args.table else 64)
    if not 2 <= G <= MAX_CLI_G:                      # a [G+1, G] batch for the curves, [G-1, G] for the table
        parser.error(f"--G must be in [2, {MAX_CLI_G}], got {G}")
    if args.table:
        print_table(G)
        return
    folder = os.path.dirname(os.path.abspath(args.plot))       # before the work, not after
    if os.path.isdir(args.plot) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        parser.error(f"--plot {args.plot!r}: not a file this process can write (is it a directory, or is its "
                     "directory missing or read-only?)")
    plot_masses(args.plot, G=G)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
