"""designs_pretrained.py: the papers' claims on a model someone pretrained (SmolLM2-135M-Instruct).

Every sweep of the character model (designs_cancellation.py, designs_fade.py) starts from a
342k-parameter model warmed up here on one task; the papers are about pretrained LLMs.
SmolLM2-135M-Instruct learns chat-worded addition on a CPU (its recipe,
recipes/smollm2-135m-addition-cpu.yaml: held-out pass@1 from 0.13 to 0.82 in 100 steps,
about 11 s a step on one quiet core), so three of the sweeps run on it too, under the same
names, so that experiments/results/claims.md shows a claim's verdict on each model in one row:

  batching    random vs query vs random_recentred, 4 mini-batches at the edge lr, 40 steps:
              does keeping groups whole help, and if query differs from random, is it the
              cancellation or the fewer prompts per optimizer step (the control)?
  advantages  FADE's sign axis: psr and nsr against mean on the entropy of the last 10 of
              50 steps (the character model's entropy sat near a floor; this model's
              starts at ~0.85 nats a token)
  credit      grpo vs psr, 30 steps, the token diagnostics every 5th step and the token
              value every 15th: flips, value, specificity (Cancellation Hypothesis)
  edge        a PILOT, not a test: which lr is "the edge" for batching (its rule below)

The pairs. The model has one set of weights (its SHA-256 in each run's start.json), so a
pair is an RL seed: designs.PRETRAINED_SEEDS, 6 seeds, every arm from each (the seed picks
the prompts, the held-out set and every sample, so two arms' runs of one seed differ only
in the arm). Held-out pass@1 on 200 prompts x 4 samples: its sampling SE is at most
sqrt(0.25 / 800) = 0.018, 0.025 for a paired difference, so a difference of 0.05 in one
pair is two SEs.

Families and sides, declared here because 6 pairs leave little room. The exact sign-flip
test's floor is 2/64 = 0.031 two-sided and 1/64 = 0.016 one-sided, so under Holm a
two-sided claim can be significant only in a family of 1, and one-sided claims in a family
of up to 3 (3/64 = 0.047). A claim is one-sided only where its paper states the direction
("these interventions improve RLVR training"; "tokens boosted ... consistently demonstrate
higher value"); FADE's "imbalanced updates collapse either entropy or weight geometry" does
not say which imbalance collapses entropy, and our own questions have no paper: two-sided,
a family each. So every family below is as small as its claims' tests allow; the cost is a
larger chance of some false finding across the families of a sweep (at most the number of
families x 0.05), which the pages state by listing the families.

Runs on one machine. A paired difference is only the arm's if both runs ran on the same
CPU (another CPU rounds float sums differently, and a last-bit difference becomes another
sampled token): the report leaves out pairs whose runs' CPU models differ, and the parts
(experiments/sweep.py) hold whole pairs, every arm of a seed, so a part finished on
another machine mixes no pair.
"""

from __future__ import annotations

from experiments.claims import Check, Claim
from experiments.designs import (CANCELLATION, FADE, FIRST_STEP_TOL, OURS, Q_BATCHING_GAIN, Q_FLIPS, Q_SIGN,
                                 Q_SPECIFIC, Q_VALUE, RECENTRED_HELD, RECENTRED_HOLDS, RESIDUAL_TOL, TASKS, Sweep,
                                 task_flags, task_seeds, threshold)
from experiments.quantities import (FLIP_SHARES, REACH_THE_THRESHOLD, RESIDUAL_PER_STEP, TOKEN_VALUES, at_start,
                                    difference, final, reach_row, row, rows, tail_mean)

DECLARED_IN = "experiments/designs_pretrained.py"
# advantages and credit on 10 pairs: their first 6 seeds' agreements stood on families of one
# or two claims at the 6-pair floor, and under one family per sweep none survived; 4 more RL
# seeds no run had used (6-9), declared with the reading below before any of their runs.
TEN_PAIRS = {"seeds": (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), "warmup_seeds": (0,), "holm": "sweep"}
FLIP_MARGIN = 0.6931471805599453        # log 2: "similar" shares within a factor of 2 (the character model's)


def edge(task: str = "smollm2") -> Sweep:
    """The edge-lr pilot: which learning rate the batching sweep runs at. Not a test.

    The character model's dose result sat where updates were large enough that every arm
    degraded (lr 4e-4 with 4 optimizer steps per batch). The recipe's lr 1e-5 was chosen
    for ONE optimizer step per batch; with 4 (the batching sweep's) each batch moves the
    weights about 4 times as far. The grid: random mini-batches, 4 per batch, lr 1e-5,
    3e-5 and 1e-4 (the recipe's 30-step pilots with one step per batch: 1e-4 collapsed the
    arithmetic, 3e-5 ended at 0.54, 1e-5 at 0.66), 20 steps, on RL seeds 100 and 101, which
    no sweep runs (its pairs use 0-5).
    The rule, written before the pilot ran: the edge lr is the LARGEST lr of the grid at
    which both pilot runs end (step 20) with held-out pass@1 above their start's; if none
    does, 1e-5. That is the largest step at which random mini-batches still learn here,
    the regime where the character model's arms parted.
    """
    lrs = ("1e-5", "3e-5", "1e-4")
    return Sweep(
        name="edge",
        claim="A pilot, not a test: the largest lr (of 1e-5, 3e-5, 1e-4) at which random mini-batches (4 per "
              "batch) still learn, for the batching sweep (its rule: experiments/designs_pretrained.py edge).",
        flags=[*task_flags(task), "--minibatches", "4", "--minibatch_mode", "random", "--coupling_pairs", "0"],
        arms={f"lr{lr}": ["--lr", lr] for lr in lrs},
        rows=[row("start pass@1"), row("pass@1 at step 10", how="held-out pass@1 after 10 steps"), row("final pass@1"),
              ("gain", difference(final("eval/pass@1"), at_start("eval/pass@1")),
               "final minus start pass@1 (the rule: above 0 in both runs)"),
              ("entropy, last 5 steps", tail_mean("entropy", 5), "mean token entropy, nats"),
              *rows("approx kl", "minutes")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("approx_kl", "approx KL to the sampling policy"), ("reward", "training reward")],
        seeds=(100, 101), warmup_seeds=(0,), declared_in=DECLARED_IN)


def batching(task: str = "smollm2") -> Sweep:
    """random vs query vs random_recentred, 4 mini-batches at the edge lr (batching.py).

    query keeps each group in one optimizer step, so its shared tokens cancel there
    (Cancellation Hypothesis paper: "query-preserved mini-batching"), but it also gives
    each Adam step N/4 = 2 whole prompts of the batch's 8, where random gives rollouts of
    about 7. random_recentred keeps random's split (the same steps at the same seed) and
    re-centres each group's part of a step to zero-sum advantage: cancellation without
    fewer prompts per step. On the character model at lr 4e-4 query ended below random
    (experiments/designs_cancellation.py dose and recentred); here:
      paper  query above random, on final pass@1 and on the mean over the run's held-out
             evaluations (one-sided: the paper says the interventions improve training);
      ours   random_recentred against random on final pass@1, two-sided. Written both
             ways before the runs: if it ends below random, as query did on the character
             model, cancellation inside a step is what makes large steps fragile; if it
             stays with random while query differs, the prompts per step are; if neither
             differs from random, this model at this lr does not show the dose effect.
    random_recentred trains on less advantage mass (mb/adv_abs_trained, a row): a part of
    one rollout or one reward gets 0. Under Adam a global scale of the advantages cancels
    (m / sqrt(v)), so the smaller mass is not by itself a smaller step.
    Diagnostics every 10th step, for the first-step residual checks.
    """
    arms = {mode: ["--minibatch_mode", mode] for mode in ("random", "query", "random_recentred")}
    claims = [Claim(CANCELLATION, "query mini-batches: higher final pass@1 than random", Q_BATCHING_GAIN,
                    "final pass@1", "query", "random", +1, family="paper", sided="one"),
              Claim(CANCELLATION, "query mini-batches: higher mean pass@1 over the evaluations than random",
                    Q_BATCHING_GAIN, "mean pass@1", "query", "random", +1, family="paper", sided="one"),
              # reads random_recentred as random with cancellation alone: needs what it holds, which
              # these runs predate (RECENTRED_HOLDS, designs.py): not measured on them
              Claim(OURS, "random_recentred (cancellation, random's prompts per step): lower final pass@1 than "
                          "random", Q_BATCHING_GAIN, "final pass@1", "random_recentred", "random", -1, family="ours",
                    needs=(RECENTRED_HOLDS,), posthoc=True)]
    checks = [Check("query mini-batches never split a group", "split groups / step", ("query",), "zero"),
              Check("random and random_recentred split groups", "split groups / step",
                    ("random", "random_recentred"), "positive"),
              Check("whole groups, or each group's part re-centred: the first optimizer step's residual is 0 to "
                    "rounding", "first-step residual", ("query", "random_recentred"), "zero", tol=FIRST_STEP_TOL),
              Check("split groups cannot cancel: random's first-step residual is above 0", "first-step residual",
                    ("random",), "positive", tol=1e-3)]
    return Sweep(
        name="batching",
        claim="Keeping each group's rollouts in one optimizer step keeps the updates of shared tokens cancelling "
              "and should train better (Cancellation Hypothesis paper); random_recentred asks whether a difference "
              "comes from the cancellation or from query's fewer prompts per optimizer step (ours).",
        flags=[*task_flags(task), "--minibatches", "4", *TASKS[task]["sweeps"].get("batching", {}).get("flags", []),
               "--flip_every", "10", "--coupling_pairs", "0"],
        arms=arms,
        rows=[*rows("final pass@1", "mean pass@1", "start pass@1", "peak pass@1", "min pass@1", "collapsed"),
              reach_row(threshold(task), how=REACH_THE_THRESHOLD), row("first-step residual"),
              row("cancellation residual", how=RESIDUAL_PER_STEP),
              *rows("split groups / step", "mean |A| of the batch", "mean |A| trained", "approx kl", "grad norm",
                    "entropy, last 10 steps", "minutes")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("approx_kl", "approx KL to the sampling policy"), ("mb/adv_abs_trained", "mean |A| trained"),
                ("cancellation_residual", "cancellation residual R_g"), ("reward", "training reward")],
        claims=claims, checks=checks, held=[RECENTRED_HELD], declared_in=DECLARED_IN, **task_seeds(task))


def advantages(task: str = "smollm2") -> Sweep:
    """FADE's sign axis on a pretrained model: psr and nsr against mean (Dr. GRPO).

    psr trains on successes alone (failures A = 0), nsr on failures alone; at one
    optimizer step per batch (the recipe's) mean is the reference that changes one thing.
    The finding: the entropy of the last 10 of 50 steps. The character model's entropy
    sat near its floor (addition ~0.1 nats); this model's starts near 0.85 nats and GRPO
    brings it to ~0.1 within 20 steps (the recipe's runs), so an imbalance has room to
    show. Two-sided, a family each: FADE's sentence says one imbalance collapses entropy,
    not which; our direction (psr below, nsr above) is the character model's declaration.
    The difficulty axis (power, asym) is not run here: budget.
    10 pairs (TEN_PAIRS), read under one family per sweep (both claims in one Holm family;
    the declared families of one each shown beside): declared before the runs of seeds 6-9.
    """
    claims = [Claim(FADE, "success mass only (psr): entropy collapses below mean's", Q_SIGN,
                    "entropy, last 10 steps", "psr", "mean", -1, family="psr"),
              Claim(FADE, "failure mass only (nsr): entropy stays above mean's", Q_SIGN,
                    "entropy, last 10 steps", "nsr", "mean", +1, family="nsr")]
    checks = [Check("zero-sum advantage: success mass = failure mass", "m_S - m_F", ("mean",), "zero", tol=1e-6),
              Check("psr gives failures no mass", "m_F (mean)", ("psr",), "zero"),
              Check("nsr gives successes no mass", "m_S (mean)", ("nsr",), "zero")]
    return Sweep(
        name="advantages",
        claim="How much a success pushes up and a failure pushes down (m_S vs m_F, the sign axis) moves the "
              "entropy (FADE paper), on a pretrained model.",
        flags=[*task_flags(task), "--coupling_pairs", "0"],
        arms={"mean": ["--advantage", "mean"], "psr": ["--advantage", "psr"], "nsr": ["--advantage", "nsr"]},
        rows=[*rows("entropy, first 10 steps", "entropy, last 10 steps", "final pass@1", "start pass@1", "peak pass@1",
                    "m_S (mean)", "m_F (mean)", "m_S - m_F", "m_F / m_S"),
              ("response length, last 10 steps", tail_mean("resp_len_mean", 10), "mean response tokens"),
              row("minutes")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("m_S", "success mass m_S per rollout"), ("m_F", "failure mass m_F per rollout"),
                ("resp_len_mean", "mean response length (tokens)"), ("reward", "training reward")],
        claims=claims, checks=checks, declared_in=DECLARED_IN, **TEN_PAIRS)


def credit(task: str = "smollm2") -> Sweep:
    """GRPO vs positive-only training (psr) with the token diagnostics, on a pretrained model.

    Diagnostics every 5th step (flips, where updates go, specificity), the token value
    every 15th (steps 15 and 30) on 128 stratified positions, pooled over both (diagnostics.py;
    [recon] definitions, docs/math.md): one value step took 250 s of a 500 s smoke run on a
    busy machine, so two, not three.
    Declared before these runs, on a model none of the character model's margins saw:
      flips (family "flips", TOST): the boosted shares of negative and positive rollouts,
            and the suppressed shares, within a factor of 2 (the paper: "remarkably similar
            proportions");
      value (family "value", one-sided: the paper states it): boosted tokens have higher
            value than suppressed ones, in positive and in negative rollouts;
      specificity (family "specificity", one-sided): the correlation of a token's
            specificity to successes with its Δ log π is above 0 under GRPO. At first
            order in the learning rate this is what the gradient says: a token's Δ log π
            follows sum_i A_i n_i(a), its count-weighted advantage, which specificity
            tracks; what could make it fail is everything past first order (Adam, the
            coupling of tokens through shared weights, several tokens per position);
      vs psr (family "vs psr", two-sided, ours): the correlation is larger under GRPO than
            under psr, where a token shared with failures is pushed up instead of cancelled.
    10 pairs (TEN_PAIRS), read under one family per sweep (the six claims in one Holm family;
    the declared families shown beside), and "value b+ - s+" testable only with at least 8
    runs that have a number (a success with a suppressed token at a value step: 5 of the
    first 6 had one); declared before the runs of seeds 6-9.
    The template-share claim of the character model is not declared: this task's free text
    has no template split (tasks/addition_instruct.py). No coupling: its orderings are
    checks of the formula (the credit sweep of the character model runs them).
    """
    claims = [Claim(CANCELLATION, "boosted shares of negative and positive rollouts within a factor 2", Q_FLIPS,
                    "flip log(b- / b+)", "grpo", None, 0, margin=FLIP_MARGIN, family="flips"),
              Claim(CANCELLATION, "suppressed shares of positive and negative rollouts within a factor 2", Q_FLIPS,
                    "flip log(s+ / s-)", "grpo", None, 0, margin=FLIP_MARGIN, family="flips"),
              Claim(CANCELLATION, "boosted tokens of positive rollouts: higher value than suppressed", Q_VALUE,
                    "value b+ - s+", "grpo", None, +1, family="value", sided="one", min_n=8),
              Claim(CANCELLATION, "boosted tokens of negative rollouts: higher value than suppressed", Q_VALUE,
                    "value b- - s-", "grpo", None, +1, family="value", sided="one"),
              Claim(CANCELLATION, "tokens more specific to successes are reinforced more (correlation above 0)",
                    Q_SPECIFIC, "specificity corr", "grpo", None, +1, family="specificity", sided="one"),
              Claim(CANCELLATION, "specificity and reinforcement correlate more than under psr", Q_SPECIFIC,
                    "specificity corr", "grpo", "psr", +1, family="vs psr")]
    checks = [Check("zero-sum advantage, one optimizer step: residual 0 to rounding", "cancellation residual",
                    ("grpo",), "zero", tol=RESIDUAL_TOL),
              Check("psr's one-signed advantage cannot cancel: residual exactly 1", "cancellation residual", ("psr",),
                    "equals", 1.0, tol=RESIDUAL_TOL),
              Check("psr gives failures no mass", "m_F (mean)", ("psr",), "zero")]
    return Sweep(
        name="credit",
        claim="Tokens flip both ways in positive and negative rollouts; boosted tokens have higher value than "
              "suppressed ones; tokens specific to successes are reinforced more, and more than under "
              "positive-only training (Cancellation Hypothesis paper), on a pretrained model.",
        flags=[*task_flags(task), "--flip_every", "5", "--value_every", "15", "--value_samples", "128",
               "--coupling_pairs", "0"],
        arms={"grpo": ["--advantage", "grpo"], "psr": ["--advantage", "psr"]},
        rows=rows("specificity corr", "specificity cells", *FLIP_SHARES, "flip log(b- / b+)", "flip log(s+ / s-)",
                  *TOKEN_VALUES, "cancellation residual", "m_F (mean)", "final pass@1", "start pass@1", "minutes"),
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("credit/specificity_corr", "specificity vs Δ log π"),
                ("flip/boost_neg", "boosted share, negative rollouts"),
                ("flip/boost_pos", "boosted share, positive rollouts"),
                ("value/boosted_pos", "value, boosted tokens of positive rollouts")],
        claims=claims, checks=checks, declared_in=DECLARED_IN, **TEN_PAIRS)
