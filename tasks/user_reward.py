"""user_reward.py: `train.py --reward MODULE:FUNCTION`, a reward function of the user's own.

TRL's GRPOTrainer takes `reward_funcs`; here the same idea replaces a task's checker: a
function

    def my_reward(response: str, answer: str, prompt: str) -> float | dict

returns the rollout's reward in [0, 1] (or a dict with "reward" in [0, 1] and any other
numbers to log, e.g. {"reward": 0.5, "format": 1.0}; "correct" too, else correct means
reward == 1, which held-out pass@k counts). It replaces the checker of --data (and of
its evaluation) for any source: a named task, reasoning_gym:NAME or a .jsonl file, whose
rows still give the prompt and the reference answer.

Where it runs: in the trainer's process, like our own checkers (verify.py), which parse
answers with grammars and evaluate nothing. A function that evaluates model text (eval,
exec, a subprocess) is the user's to sandbox: tasks/sandbox.py shows how ours do.
At the door (train.py's setup) the function is imported and called once, on the first
training row with its reference answer as the response, so a wrong name, a signature
that does not fit or a value outside [0, 1] is one line before any model loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys
from typing import Callable

from tasks.task import Task

SPEC = re.compile(r"(?P<module>[^:]+):(?P<function>[A-Za-z_][A-Za-z_0-9]*)")


def load(spec: str) -> Callable:
    """MODULE:FUNCTION (importable from the working directory or PYTHONPATH) or
    path/to/file.py:FUNCTION -> the function. ValueError (one line) for anything else."""
    match = SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"--reward {spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    module_name, name = match["module"], match["function"]
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ValueError(f"--reward {spec!r}: no such file {module_name!r}")
            loader = importlib.util.spec_from_file_location(f"user_reward_{name}", module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:          # a module next to where train.py is run
                sys.path.append(os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--reward {spec!r}: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--reward {spec!r}: {module_name} has no function {name!r}")
    return fn


def as_score(value, spec: str) -> dict:
    """The function's return value as a checker's score dict: {"reward", "correct", ...}.

    A number, or a dict with "reward"; every value must be a finite number and the reward
    in [0, 1] (ValueError naming the function and the value: a reward outside it would
    silently rescale every advantage). correct = the dict's "correct", else reward == 1.
    """
    out = dict(value) if isinstance(value, dict) else {"reward": value}
    if "reward" not in out:
        raise ValueError(f"--reward {spec}: returned a dict without 'reward': {sorted(out)}")
    for key, v in out.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"--reward {spec}: {key!r} must be a finite number, got {v!r}")
    if not 0.0 <= out["reward"] <= 1.0:
        raise ValueError(f"--reward {spec}: the reward must be in [0, 1], got {out['reward']!r}")
    out = {k: float(v) for k, v in out.items()}
    out.setdefault("correct", float(out["reward"] == 1.0))
    return out


def with_reward(task: Task, spec: str, row: dict) -> Task:
    """`task` with its checker replaced by the function named by `spec`, after one call on
    `row` (its answer as the response): the checks at the door. The task keeps its rows,
    template and budget; its name gains the function's ("math+my_rewards:score")."""
    fn = load(spec)
    try:
        as_score(fn(row["answer"], row["answer"], row["prompt"]), spec)
    except TypeError as e:                  # a signature that does not take (response, answer, prompt)
        raise ValueError(f"--reward {spec}: calling it as f(response, answer, prompt) failed: {e}") from None

    def check(response, answer, prompt=None, **_):
        return as_score(fn(response, answer, prompt), spec)
    return dataclasses.replace(task, name=f"{task.name}+{spec}", check=check, sandboxed=False, needs_prompt=False)
