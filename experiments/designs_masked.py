"""designs_masked.py: the dose question taken apart: cancellation inside a step, or what carries gradient?

On addition at lr 4e-4 with 4 mini-batches, query mini-batches ended below random, and
random_recentred (random's split, each group's part of a step re-centred to zero sum:
the recentred sweep) ended below both. random_recentred was meant to hold random's
prompts per Adam step and restore cancellation. It holds the prompts PRESENT, not the
prompts TRAINED ON: re-centring gives 0 to every part of one rollout and every part whose
rollouts share a reward, so on one batch it trains on fewer rollouts, fewer prompts and
less advantage mass than random (measured here on every step: the held-fixed checks).
So random_recentred against random changes two things at once, and its verdict could not
say which one made large steps fragile.

This sweep adds the arm that takes them apart, random_masked (batching.py): random's split
(the same draws as random and random_recentred), advantage 0 on exactly the rollouts
random_recentred zeroes, the others keep their batch advantage NOT re-centred, and each
step is scaled so its sum of |A| equals random_recentred's. Against random_recentred it
differs in one thing, whether each group's part is zero-sum (cancellation inside the step);
against random in what carries gradient (the rollouts and the mass), with the split and the
parts' imbalance kept. What each control holds is declared (HeldFixed) and measured on every
step of every run; a finding that needs it is not testable if it fails.

Declared before any run of this sweep, both ways:
  - random_masked stays near random, above random_recentred: cancellation inside a step is
    the fragile part (masked vs recentred agrees, masked vs random does not);
  - random_masked falls with random_recentred, below random: the rollouts and mass lost are,
    and the dose result says nothing about cancellation (masked vs random agrees, the
    equivalence of masked and recentred within 0.10 agrees);
  - in between, or neither differs: the runs do not separate the two here; the page says so.

The two tasks:
  addition  the character model, lr 4e-4, 4 mini-batches, 100 steps (the recentred sweep's
            flags exactly): the recentred sweep's 10 pairs plus 10 fresh ones (RL seeds 10-14
            from both shipped warm-ups; no addition sweep has run them), all four arms on
            each, all on one machine: 20 pairs. The recentred sweep's own runs cannot be a
            pair's other half here: they ran on an AMD EPYC with AVX-512 kernels, and the same
            run on an EPYC without them (AVX2) parts at step 1's gradient norm in the 6th
            digit (the old commit reproduces the new one's numbers on AVX2 to the bit), so all
            four arms run again on those seeds (a replication of that sweep on another float
            path, besides). Outcomes final pass@1 and pass@1 at step 10, co-primary:
            the recentred sweep's random_recentred and query were level at step 10 (-0.040,
            p 0.59) and parted later. One family of 6 (20 pairs' floor 2e-6 survives it).
  smollm2   SmolLM2-135M-Instruct at lr 3e-5 (the edge pilot's lr where one of two runs of
            random fell below its start: the regime where the character model's arms
            parted; the edge rule chose 1e-5, where entropy falls from 0.67 to 0.10 and
            pass@1 plateaus by step 10-20), 4 mini-batches, 40 steps, 8 pairs (RL seeds
            10-17, which no run has used). Primary outcome the mean held-out pass@1 over the
            run's evaluations (its SD over the 1e-5 sweep's runs: 0.030, against final
            pass@1's 0.068); secondary final pass@1, and, as a row, whether a run ended
            below its start. Two families of 4: with 8 pairs the two-sided floor 2/256 =
            0.0078 survives Holm over 4 (0.031), not over 8 (0.0625), so one family per
            sweep (the other reading the page shows) cannot find a two-sided effect here.
"""

from __future__ import annotations

from experiments.claims import Check, Claim
from experiments.held_fixed import HeldFixed
from experiments.designs import (CANCELLATION, FIRST_STEP_TOL, HOLDS_SPLIT, HOLDS_TRAINED, OURS, Q_BATCHING_GAIN,
                                 RECENTRED_HELD, RECENTRED_HOLDS, TASKS, Sweep, task_flags, threshold)
from experiments.designs_cancellation import DOSES
from experiments.quantities import at_start, collapsed, final, first_reach, mean_of, min_of, peak_of, tail_mean, value_at

DECLARED_IN = "experiments/designs_masked.py"
MODES = ("random", "query", "random_recentred", "random_masked")
FRESH = (10, 11, 12, 13, 14)            # addition's fresh RL seeds: no addition sweep has run them
SMOLLM2_SEEDS = (10, 11, 12, 13, 14, 15, 16, 17)   # no SmolLM2 run has used them (sweeps 0-5, pilot 100-101)
EQUIVALENCE = 0.10                      # "masked and recentred alike": |difference| in pass@1 below this

# What each control holds, measured on every step (experiments/claims.py run_held).
HELD = [HeldFixed(HOLDS_TRAINED, "random_masked", "random_recentred", "random_recentred"),
        HeldFixed(HOLDS_SPLIT, "random_masked", "random", "random", quantities=("split_groups",), pairwise=True),
        RECENTRED_HELD]                 # declared to be measured, not to pass (designs.py)

CANCELS = "whether each group's part of an optimizer step sums to zero (cancellation inside the step)"
CARRIES = "which rollouts and how much |A| carry gradient (random's split and unbalanced parts kept)"


def masked(task: str = "addition") -> Sweep:
    """random, query, random_recentred and random_masked (module header): the dose question taken apart."""
    smollm2 = bool(TASKS[task].get("recipe"))
    outcomes = [("mean pass@1", "primary"), ("final pass@1", "secondary")] if smollm2 else \
        [("final pass@1", ""), ("pass@1 at step 10", "")]
    claims = []
    for row, family in outcomes:
        claims += [
            Claim(OURS, f"random_masked: higher {row} than random_recentred (cancellation inside a step is what "
                        "the fragility needs)", Q_BATCHING_GAIN, row, "random_masked", "random_recentred", +1,
                  family=family, needs=(HOLDS_TRAINED,), isolates=CANCELS),
              Claim(OURS, f"random_masked: lower {row} than random (the rollouts and mass that carry gradient are)",
                    Q_BATCHING_GAIN, row, "random_masked", "random", -1, family=family, needs=(HOLDS_SPLIT,),
                    isolates=CARRIES)]
        if smollm2:
            claims += [Claim(CANCELLATION, f"query mini-batches: higher {row} than random", Q_BATCHING_GAIN, row,
                             "query", "random", +1, family=family, sided="one"),
                       Claim(OURS, f"random_recentred: lower {row} than random (re-centring per part, which "
                                   "changes cancellation and what carries gradient at once)", Q_BATCHING_GAIN, row,
                             "random_recentred", "random", -1, family=family)]
        else:
            claims.append(Claim(OURS, f"random_masked and random_recentred alike in {row} (within "
                                      f"{EQUIVALENCE:g})", Q_BATCHING_GAIN, row, "random_masked",
                                "random_recentred", 0, margin=EQUIVALENCE, family=family, needs=(HOLDS_TRAINED,)))
    checks = [Check("query mini-batches never split a group", "split groups / step", ("query",), "zero"),
              Check("random's split cuts groups in all three random-split arms", "split groups / step",
                    ("random", "random_recentred", "random_masked"), "positive"),
              Check("whole groups, or each group's part re-centred: the first optimizer step's residual is 0 to "
                    "rounding", "first-step residual", ("query", "random_recentred"), "zero", tol=FIRST_STEP_TOL),
              Check("split groups that are not re-centred cannot cancel: the first-step residual is above 0",
                    "first-step residual", ("random", "random_masked"), "positive", tol=1e-3)]
    if smollm2:
        flags = [*task_flags(task), "--minibatches", "4", *TASKS[task]["sweeps"]["masked"]["flags"],
                 "--flip_every", "10", "--coupling_pairs", "0"]
        seeds = {"seeds": SMOLLM2_SEEDS, "warmup_seeds": (0,)}
    else:     # the recentred sweep's flags exactly, so that its committed runs are this sweep's pairs too
        flags = [*TASKS[task]["flags"], *DOSES[task]["shared"], "--lr", "4e-4", "--coupling_pairs", "0"]
        seeds = {"seeds": (0, 1, 2, 3, 4, *FRESH)}
    return Sweep(
        name="masked",
        claim="Is a large step fragile because cancellation happens inside it, or because of what carries gradient? "
              "random_masked trains on random_recentred's rollouts and mass without its zero-sum parts (ours).",
        flags=flags,
        arms={mode: ["--minibatch_mode", mode] for mode in MODES},
        rows=[("final pass@1", final("eval/pass@1"), "held-out pass@1 at the last step"),
              ("mean pass@1", mean_of("eval/pass@1"), "held-out pass@1, mean over the run's evaluations"),
              ("pass@1 at step 10", value_at("eval/pass@1", 10), "held-out pass@1 after the first 10 batches"),
              ("start pass@1", at_start("eval/pass@1"), "held-out pass@1 of the starting weights (start.json)"),
              ("peak pass@1", peak_of("eval/pass@1"), "best held-out pass@1 over the run's evaluations"),
              ("min pass@1", min_of("eval/pass@1"), "worst held-out pass@1 over the run's evaluations"),
              ("ended below start", collapsed(share=1.0), "1 if final pass@1 < start pass@1, else 0"),
              ("collapsed", collapsed(), "1 if final pass@1 < half of start pass@1, else 0"),
              (f"steps to pass@1 >= {threshold(task)}", first_reach("eval/pass@1", threshold(task)),
               "first evaluation step at or above the threshold (one evaluation past the end if never)"),
              ("first-step residual", mean_of("cancellation_residual_first"),
               "R_g of the first optimizer step of each batch (ratio 1), mean over diagnostic steps"),
              ("split groups / step", mean_of("mb/split_groups"),
               "groups cut across optimizer steps, per optimizer step, mean over steps"),
              ("rollouts trained / step", mean_of("mb/rollouts_trained"),
               "rollouts with an advantage not 0, per optimizer step, mean over steps"),
              ("prompts trained / step", mean_of("mb/prompts_trained"),
               "prompts with such a rollout, per optimizer step, mean over steps"),
              ("sum |A| trained / step", mean_of("mb/adv_abs_sum_trained"),
               "sum of |advantage| per optimizer step, mean over steps"),
              ("mean |A| trained", mean_of("mb/adv_abs_trained"),
               "mean |advantage| the optimizer steps trained on, over every rollout"),
              ("approx kl", mean_of("approx_kl"), "mean over steps of the sampling policy's KL to the updated one"),
              ("grad norm", mean_of("grad_norm"), "mean over steps of the gradient norm before clipping"),
              ("entropy, last 10 steps", tail_mean("entropy", 10), "mean token entropy, nats"),
              ("minutes", final("time/elapsed", scale=1 / 60), "train.py's wall clock for the run")],
        curves=[("eval/pass@1", "held-out pass@1"), ("entropy", "entropy (nats/token)"),
                ("mb/rollouts_trained", "rollouts trained per optimizer step"),
                ("mb/adv_abs_sum_trained", "sum |A| trained per optimizer step"),
                ("approx_kl", "approx KL to the sampling policy"), ("grad_norm", "gradient norm")],
        claims=claims, checks=checks, held=HELD, declared_in=DECLARED_IN, **seeds)
