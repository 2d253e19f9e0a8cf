"""toy: two small analogs of an LLM, in which token gradient cancellation and the FADE
mechanisms are computed exactly.

`python -m toy [--out DIR] [--only N ...]` runs seven experiments in seconds and writes one
PNG each and a summary.md. Each experiment is computed, judged and plotted in three
separate functions (toy/__main__.py says how). Read the modules in this order:

    bandit.py        the analog: a 3-token "LM" with a shared output layer, every group
                     of G = 4 rollouts enumerated with its probability (and a variant with
                     reward-irrelevant filler positions, sampled); updates through the
                     project's own loss.py
    cancellation.py  1. the identity "update = G Cov(A, n_a)"; 2. where the update goes
                     under positive-only vs critic-free RL; 5. token flips (one group per
                     step vs one step over many groups) and coupling
    breakers.py      3. what breaks exchangeability (1/|o_i|, GSPO, clipping) and what
                     restores it (token sums, DFPO min/orth); 4. mini-batch splits + Adam
    answers.py       the second analog: a prompt as one softmax over 8 final answers (no
                     tokens, but entropy to lose), exact per prompt, simulated over many
    fade.py          6. the sign and difficulty axes of an advantage and entropy, with Adam
                     at three step sizes and with SGD; 7. FADE's schedule against static
                     (alpha, delta), and against its own step size
    plots.py         the seven figures, one function per experiment, each drawn from the
                     dict of numbers its experiment's compute function returns
    report.py        figure helpers, claims and their five verdict labels, summary.md

Everything is float64. Experiments 1-3, 5a, 5d, 6a/6b and 6c's lr -> 0 path are exact
(sums over all groups, closed forms); experiment 4, 5b-c/5e and the learning simulations
of 6c and 7 sample with fixed seeds and say so (5b-c, 6c and 7 report standard errors
over seeds).
"""
