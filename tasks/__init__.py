"""Tasks: where the prompts, the reference answers and the checkers live, one file each.

    addition.py        the synthetic task the CPU default trains on (checker: verify.check_addition)
    addition_instruct.py  the same problems worded for a chat model (the last number is the answer)
    countdown.py       the numbers game: several right answers, wording that varies
    expression.py      countdown's checker: an arithmetic grammar with nothing to execute
    math_datasets.py   GSM8K, MATH and {prompt, answer} JSONL files (checker: verify.score_math)
    reasoning_gym.py   any reasoning-gym dataset (its own scorer, sandboxed, or ours)
    task.py            what a Task is, and the held-out split every generated task shares

This file is the one place a task's name is read: get(source) turns a --data value into
a Task, and everything downstream (the trainer, the verifier, the diagnostics, the
warm-up) asks the Task, never the name. Adding a task (docs/extending.md, "Add a task"): write
tasks/NAME.py with its rows and checker and a Task, add one line to TASKS below, and
tests/engine/test_tasks.py runs its checks on it.
"""

from __future__ import annotations

import os

from tasks import addition, addition_instruct, countdown, math_datasets, reasoning_gym
from tasks.task import Task, solution_diversity, template_token_mask   # noqa: F401  (the package's face)

TASKS = {
    "addition": addition.TASK,
    "addition_instruct": addition_instruct.TASK,
    "countdown": countdown.TASK,
    "countdown_instruct": countdown.INSTRUCT,
}
"""The named tasks: --data NAME. Sources with a parameter are below (get)."""

SOURCES = ("'addition', 'addition_instruct', 'countdown', 'countdown_instruct', 'gsm8k', 'math', "
           "'gsm8k:FILE.jsonl', 'math:FILE.jsonl', 'reasoning_gym:NAME'")


def get(source: str) -> Task:
    """The Task of a --data (or --eval_data) value; ValueError naming an unknown one.

    A name in TASKS; "reasoning_gym:NAME" (any reasoning-gym dataset); "gsm8k", "math"
    (the hub), "gsm8k:FILE.jsonl", "math:FILE.jsonl" (a local copy in the hub's format)
    or any "FILE.jsonl" of {prompt, answer} rows (the free-text math task).
    """
    source = str(source)
    if source in TASKS:
        return TASKS[source]
    if source.startswith(reasoning_gym.PREFIX):
        return reasoning_gym.task(source[len(reasoning_gym.PREFIX):])
    if source.partition(":")[0] in ("gsm8k", "math") or source.endswith(".jsonl"):
        return math_datasets.task(source)
    raise ValueError(f"unknown task {source!r}; expected {SOURCES} or a path ending in .jsonl")


def load(source: str, split: str = "train", n: int | None = None, seed: int = 0,
         digits: int = 3) -> tuple[list[dict], Task]:
    """(rows, task) of one source and split. n None: the task's default (all rows of a file).
    split "all": every row of a file source (--eval_data FILE.jsonl), no held-out rule."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"unknown split {split!r}; expected one of ('train', 'test', 'all')")
    if n is not None and n < 0:
        raise ValueError(f"load needs n >= 0 or None, got n={n}")
    task = get(source)
    return task.rows(n, split, seed=seed, digits=digits), task


def check_source(source: str, flag: str = "--data") -> None:
    """A source at the door, before anything is loaded or downloaded (ValueError, one line)."""
    if str(source) in TASKS:
        return
    if str(source).startswith(reasoning_gym.PREFIX):
        return reasoning_gym.check_source(source, flag)
    if os.path.isdir(source):
        raise ValueError(f"{flag} {source!r} is a directory; expected {SOURCES} or a .jsonl file")
    get(source)                                  # an unknown name: ValueError naming it
    math_datasets.check_source(source, flag)


def embedded_warmup_task(source: str) -> Task:
    """The task whose warm-up the embedded model gets for --data `source`: its own, or
    addition's for a task that has none (the embedded model then starts as an adder)."""
    task = get(source)
    return task if task.warmup is not None else addition.TASK
