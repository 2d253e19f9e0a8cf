"""toy: a bandit analog of an LLM in which token gradient cancellation is computed exactly.

`python -m toy [--out DIR] [--only N ...]` runs six experiments in seconds and writes one
PNG each and a summary.md. Read the modules in this order:

    bandit.py        the analog: a 3-token "LM" with a shared output layer, every group
                     of G = 4 rollouts enumerated with its probability; updates through
                     the project's own loss.py
    cancellation.py  1. the identity "update = G Cov(A, n_a)"; 2. where the update goes
                     under positive-only vs critic-free RL; 5. token flips and coupling
    breakers.py      3. what breaks exchangeability (1/|o_i|, GSPO, clipping) and what
                     restores it (token sums, DFPO min/orth); 4. mini-batch splits + Adam
    fade.py          6. the sign and difficulty axes of an advantage, and entropy
    report.py        plotting, claims, summary.md

Everything is float64 and exact (sums over all groups, closed forms) except experiment 4
and the learning simulation of experiment 6, which sample with fixed seeds and say so.
"""
