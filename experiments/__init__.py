"""The apparatus of experiments: sweeps of the papers' claims, the benchmark against TRL,
and plots of run directories. Run as modules from the repository root:
`python -m experiments.sweep ...`, `python -m experiments.bench`, `python -m experiments.plot_runs ...`."""
