"""bench: how fast the engine is, measured beside TRL's GRPOTrainer and the scorer sandbox.

Not the lesson (the chapters at the top level) and not the study (experiments/: the papers'
claims): these scripts time the engine. Run as modules from the repository root:

    python -m bench                         # our step against TRL's on identical work (__main__.py)
    python -m bench --data countdown        # the same on countdown; --model smollm2-135m-instruct: a real model
    python -m bench.scorer_sandbox          # what scoring one answer in the scorer sandbox costs

    __main__.py        the command line and the report: both trainers, the lower bound, the ablations
    ours.py            the work both trainers do, and train.py on it, timed
    trl_trainer.py     TRL's GRPOTrainer configured to do the same step, and the stage clocks
    smollm2.py         the real model: every configuration in a process of its own
    scorer_sandbox.py  the scorer sandbox's cost per answer, and that it changes no score

The numbers, with the commands and the machine's load: docs/results.md ("Speed against TRL").
"""
