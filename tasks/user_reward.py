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

After the door, every call is checked the same way: a value that is not a finite number
in [0, 1] (NaN, None, 5.0, an integer too large for a float), or a call that has not
returned after --reward_timeout seconds, stops the run with one line (RewardError: the
function, the value or the wait, the response and its row), exit code 2. The run
directory keeps every step logged before it and its checkpoints (--resume continues
once the function is fixed). A function that catches the interruption (`except
BaseException:`) and returns late is stopped the same way; one that catches it and goes
on stops the process after a grace period (REWARD_GRACE), in one line, exit code 2,
the checkpoints and logged steps kept. An exception the function raises itself is a bug
in it and keeps its traceback, which points into the function.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Callable

from tasks.task import Task

SPEC = re.compile(r"(?P<module>[^:]+):(?P<function>[A-Za-z_][A-Za-z_0-9]*)")


class RewardError(ValueError):
    """The user's reward function gave a value that is no reward, or did not return in time:
    one line naming the function, the value or the wait and the row, exit code 2.

    Not a bug of ours nor an exception of the user's code (that keeps its traceback): the
    line says everything there is to fix. A ValueError, like every bad input; train.py's
    main prints it as one line (tasks/ cannot import machinery/checks.UsageError).
    """


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


def as_score(value, spec: str, row: str = "") -> dict:
    """The function's return value as a checker's score dict: {"reward", "correct", ...}.

    A number, or a dict with "reward"; every value must be a finite number and the reward
    in [0, 1] (RewardError naming the function, the value and `row`, the call's response
    and row as describe_call gives them: a reward outside [0, 1] would silently rescale
    every advantage). correct = the dict's "correct", else reward == 1.
    """
    out = dict(value) if isinstance(value, dict) else {"reward": value}
    if "reward" not in out:
        raise RewardError(f"--reward {spec}: returned a dict without 'reward': {sorted(out)}{row}")
    for key, v in out.items():
        if problem := number_problem(v):
            raise RewardError(f"--reward {spec}: {key!r} must be a finite number, got {problem}{row}")
    if not 0.0 <= out["reward"] <= 1.0:
        raise RewardError(f"--reward {spec}: the reward must be in [0, 1], got {out['reward']!r}{row}")
    out = {k: float(v) for k, v in out.items()}
    out.setdefault("correct", float(out["reward"] == 1.0))
    return out


def number_problem(v) -> str | None:
    """None for a finite int or float (not a bool), else the value as the message shows it.

    An int is converted to float first: 10**400 is a finite Python int but no float
    (float() raises OverflowError), and its 401 digits would fill a screen, so it is
    described by its size. NaN and inf are shown as they are; anything else by its repr,
    cut at 80 characters.
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return short(v)
    try:
        f = float(v)
    except OverflowError:
        return f"an integer of about {int(v.bit_length() * math.log10(2)) + 1} digits, too large for a float"
    return None if math.isfinite(f) else repr(f)


def with_reward(task: Task, spec: str, row: dict, timeout: float = 0.0) -> Task:
    """`task` with its checker replaced by the function named by `spec`, after one call on
    `row` (its answer as the response): the checks at the door. The task keeps its rows,
    template and budget; its name gains the function's ("math+my_rewards:score").

    Every call, the door's included, runs under `timeout` seconds (call_with_limit; 0 =
    no limit) and its value is checked by as_score: RewardError, one line, naming the row.
    A signature that does not take (response, answer, prompt) is found by binding the
    arguments, not by calling: a TypeError the function raises itself is its bug and
    keeps its traceback.
    """
    fn = load(spec)
    try:
        inspect.signature(fn).bind(row["answer"], row["answer"], row["prompt"])
    except TypeError as e:              # a signature that does not take (response, answer, prompt)
        raise ValueError(f"--reward {spec}: calling it as f(response, answer, prompt) failed: {e}") from None
    except ValueError:                  # no signature to read (some builtins): the call below decides
        pass

    def check(response, answer, prompt=None, **_):
        where = describe_call(response, answer, prompt)
        value = call_with_limit(fn, (response, answer, prompt), timeout,
                                lambda: f"--reward {spec}: no value after {timeout:g} s (--reward_timeout "
                                        f"{timeout:g}: raise it, or 0 for no limit){where}")
        return as_score(value, spec, where)
    check(row["answer"], row["answer"], row["prompt"])          # the door: one call on a row it must score
    return dataclasses.replace(task, name=f"{task.name}+{spec}", check=check, sandboxed=False, needs_prompt=False)


def describe_call(response, answer, prompt) -> str:
    """The end of a RewardError's line: which response, to which row, each cut to 60 characters."""
    return f", for the response {short(response, 60)} to the row prompt={short(prompt, 60)}, answer={short(answer, 60)}"


def short(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters with "..." (a long prompt or a huge list stays one line)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------
# A call with a time limit
# ---------------------------------------------------------------------------------------

class _TimeUp(BaseException):
    """Raised inside the user's function when its time is up. A BaseException, as
    KeyboardInterrupt is, so that a function's own `except Exception:` cannot swallow it."""


REWARD_GRACE = 10.0     # seconds a function that swallows its _TimeUp gets before the process stops
REWARD_NUDGE = 1.0      # seconds between the _TimeUp raised in it meanwhile


def call_with_limit(fn: Callable, args: tuple, seconds: float, message: Callable[[], str]):
    """fn(*args), or RewardError(message()) once it has run `seconds` of wall time (0: no limit).

    A real-time interval timer (setitimer, SIGALRM) raises _TimeUp in the function at
    its next bytecode: it stops a Python loop, a sleep, a blocked socket read or a
    regular expression that backtracks for ever (Python's re checks for signals), with
    the traceback's frames unwound, so the trainer's own state is untouched. What it
    cannot stop is C code that never returns to the interpreter (an extension holding
    the GIL); only a separate process can (tasks/sandbox.py's scorers run in one).
    A function may catch _TimeUp (`except BaseException:`). If it then returns, its value
    came late: RewardError all the same. If it goes on, _TimeUp is raised in it again
    every REWARD_NUDGE seconds, and after REWARD_GRACE seconds more the process ends: one
    line on stderr and os._exit(2), since nothing can unwind a function that refuses to
    stop. What the run wrote is on disk then (metrics.jsonl line by line, the checkpoints
    atomically); its lock dies with the process, so --resume works once it is fixed.
    Signals reach the main thread only: called from another thread, fn runs without a
    limit. The previous SIGALRM handler is put back after every call.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        return fn(*args)
    fired, deadline = [], time.monotonic() + seconds + REWARD_GRACE

    def time_up(signum, frame):
        fired.append(True)
        if time.monotonic() >= deadline:
            print(f"\ntrain.py: error: {message()}, and it went on for {REWARD_GRACE:g} s more, catching the "
                  "interruption (an `except BaseException:` in it?); the process stops here: every step logged "
                  "before and the checkpoints are kept", file=sys.stderr, flush=True)
            os._exit(2)
        raise _TimeUp()
    previous = signal.signal(signal.SIGALRM, time_up)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds, REWARD_NUDGE)
        try:
            value = fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if fired:                             # it caught _TimeUp, and returned after its time
            raise RewardError(f"{message()} (it caught the interruption and returned late)")
        return value
    except _TimeUp:
        raise RewardError(message()) from None
    finally:
        signal.signal(signal.SIGALRM, previous)
