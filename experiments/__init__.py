"""The study: sweeps of the papers' claims on real training, their pages and what they cost.
Run as modules from the repository root: `python -m experiments.sweep plan`, `python -m
experiments.sweep NAME --task TASK`, `python -m experiments.sweep report`, `python -m
experiments.task_stats`. (The speed benchmarks are in bench/, the run viewer in tools/.)"""
