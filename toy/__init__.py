"""toy: a bandit analog of an LLM in which token gradient cancellation is computed exactly.

Run `python -m toy [--out DIR] [--only N ...]`: six experiments, printed tables, one PNG
each and a summary.md, in about ten seconds on two CPU cores. bandit.py holds the model
(a 5-token "response" whose template tokens are reward-irrelevant, with an output layer
shared across positions); experiments.py the six experiments, built on the project's own
advantages.py, loss.py, batching.py and scheduler.py.
"""
