"""Addition worded for a chat model: "What is 23 + 48? Answer with just the number."

The embedded model reads the bare "23+48\\n" of tasks/addition.py and writes a scratchpad
it was warmed up on. A pretrained instruct model has seen neither: it reads a question
and answers in its own words ("23 + 48 = 71", "The sum is 71."). So this task asks the
same problems (addition.py's rows, its held-out split, --digits operand digits) as a
question, and its checker reads the LAST number of the response:

    prompt    "What is 23 + 48? Answer with just the number."
    response  "23 + 48 = 71"           correct (the last number is 71), format 0
    response  "71"                      correct, format 1 (the number alone, as asked)
    response  "23 + 48 = 100"           wrong

Why the last number: it is what the model states last, after any working, and it
needs no answer marker the model was never taught. It cannot be gamed by listing
candidates (only one number counts). Why only "correct" is rewarded: as everywhere in
this project, format is logged, never rewarded. The answer must be written as the
reference is ("071" and "71.0" are wrong): a number is a run of ASCII digits, so "-71"
reads as 71 (sums here are never negative).

Problems with a zero operand are left out: "What is 0 + 48?" would be answered by
echoing the question's last number, and the checker could not tell an echo from an
answer. Free text has no fixed template, so the task has no template-token split
(is_reasoning_text None), like tasks/math_datasets.py.

SmolLM2-135M-Instruct partly solves it at the start (--digits 2: about one answer in eight
right at temperature 0.7, fewer at 1.0; docs/results.md, "A real pretrained model learns
on a CPU"), so a group of 8 often holds both a success and a failure and RL has a signal.
recipes/smollm2-135m-addition.yaml and recipes/smollm2-135m-addition-cpu.yaml train it.
"""

from __future__ import annotations

import re

from tasks import addition
from tasks.task import Task

_NUMBER_RE = re.compile(r"[0-9]+")
_CANONICAL_RE = re.compile(r"0|[1-9][0-9]*")


def instruct_prompt(a: int, b: int) -> str:
    """The question for a + b: "What is 23 + 48? Answer with just the number." (no newline:
    the chat template ends the user's turn)."""
    return f"What is {a} + {b}? Answer with just the number."


def rows(n: int | None, split: str, seed: int = 0, digits: int = 3) -> list[dict]:
    """n problems of one split (n None: addition's default), worded as a question.

    addition.py's rows (so the same held-out split: a problem is on the test side for
    both wordings or for neither), minus those with a zero operand (the module header
    says why), each {"prompt", "answer", "target"}: target is a reference response in a
    chat model's words, "23 + 48 = 71". Deterministic in (n, split, seed, digits).
    """
    n = addition.DEFAULT_N[split] if n is None else n
    k = n + 16
    while True:
        kept = []
        for r in addition.rows(k, split, seed=seed, digits=digits):
            a, b = (int(x) for x in r["prompt"].strip().split("+"))
            if a and b:
                kept.append({"prompt": instruct_prompt(a, b), "answer": r["answer"], "target": f"{a} + {b} = {a + b}"})
        if len(kept) >= n:
            return kept[:n]
        k *= 2


def check(response, answer: str, prompt: str | None = None) -> dict:
    """{"format", "correct", "reward"} in {0.0, 1.0}: the last number of the response against the answer.

    correct  the response's last run of ASCII digits is exactly the reference string.
    format   the response, stripped, is that number alone (what the prompt asks for).
    reward   = correct. A None or non-str response scores all zeros; answer must be a
    canonical decimal (ValueError otherwise). The prompt is not read.
    """
    if not (isinstance(answer, str) and _CANONICAL_RE.fullmatch(answer)):
        raise ValueError(f"addition_instruct needs a canonical decimal answer, got {answer!r}")
    if not isinstance(response, str):
        return {"format": 0.0, "correct": 0.0, "reward": 0.0}
    numbers = _NUMBER_RE.findall(response)
    correct = 1.0 if numbers and numbers[-1] == answer else 0.0
    fmt = 1.0 if _CANONICAL_RE.fullmatch(response.strip()) else 0.0
    return {"format": fmt, "correct": correct, "reward": correct}


TASK = Task(name="addition_instruct", rows=rows, check=check, eval_prompts=200, eval_samples=4,
            bare_wording="addition")
"""--data addition_instruct (with --digits: operands of 1..digits digits, as addition)."""
