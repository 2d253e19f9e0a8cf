"""Countdown: a task with several right answers and wording that does not matter.

The Countdown numbers game, as in the small-scale reproductions of R1-style RL: given
three numbers and a target, write an arithmetic expression that uses each number exactly
once and equals the target. The response is a scratchpad of one operation per line, then
the answer line:

    prompt    "13 14 2 -> 29\\n"
    response  "now 14+13=27\\nso 2+27 is 29\\nA: 2+(14+13)\\n"

Why this task exists beside the addition task. Addition has one right response per prompt
and a template the warm-up makes near-certain, so the papers' claims about diversity,
entropy and template tokens have nothing to act on there. Countdown is built to have what
the papers study, in a controlled form:

- Several valid reasoning paths. 2+(14+13), (2+14)+13 and (2+13)+14 all reach 29. Two
  solutions are distinct when their expression trees differ after the operands of + and *
  are put in order (solution_key); about 70% of prompts have two or more. The
  warm-up target of a prompt is one of its distinct solutions drawn uniformly, so the
  warmed model spreads its probability over them, and RL can keep or collapse that spread.
- Reward-irrelevant wording that varies. Each step line starts with one of five markers
  and joins its result with "=" or " is ", and the answer line starts with one of three
  prefixes, each drawn uniformly and independently (PHRASES). This is the controlled
  version of the papers' template tokens: shared by right and wrong rollouts, free to
  vary, worth nothing. Each phrase is ONE token of the embedded tokenizer (tinymodel.py
  gives the phrases their own ids, as a BPE vocabulary gives common words theirs), so a
  template token is a choice, not the predictable tail of a word.
- A real search. The model has to find the operations: the warmed model's held-out pass@1
  is low and its pass@16 high (docs/results.md), so RL has room.

The game's rules: every intermediate result is a positive integer (subtraction only when
the result is positive, division only when exact). The checker (check)
accepts ANY expression over the numbers with the right value in exact rational
arithmetic, which includes everything the generator writes.

Which tokens are template (`is_reasoning_text`, used by tasks.template_token_mask): by
token text, exactly, because the phrase vocabulary and the arithmetic vocabulary are
disjoint by construction. Reasoning: a token made only of digits and + - * / ( ), spaces
around them aside (a BPE model's " +"). Template: every other token (the phrases, "=",
newlines, EOS).

Held-out prompts are disjoint from training prompts by construction: a problem (its sorted
numbers and target) is held out iff its crc32 falls in one bucket of ten.
"""

from __future__ import annotations

import itertools
import random
import re

from tasks.expression import MalformedExpression, countdown_correct, parse_expression, render, solution_key
from tasks.task import Task, is_held_out, split_seed

# ---------------------------------------------------------------------------------------
# The task's constants
# ---------------------------------------------------------------------------------------

NUMBERS = 3                 # numbers per problem: two steps of arithmetic
LOW, HIGH = 1, 20           # each number uniform in LOW..HIGH
MAX_TARGET = 100            # targets lie in 1..MAX_TARGET
OPS = "+-*/"

# The wording: the warm-up data is written with it, the checker's format test and answer
# line read it. Each phrase is one token of the embedded tokenizer.
STEP_MARKERS = ("then ", "so ", "next ", "now ", "step ")
CONNECTIVES = ("=", " is ")
ANSWER_PREFIXES = ("answer: ", "A: ", "result: ")
PHRASES = STEP_MARKERS + ANSWER_PREFIXES + (" is ",)
"""The multi-character phrases; each is one token of the countdown tokenizer."""

MAX_RESPONSE_TOKENS = 40    # generation budget of the warm-up's evaluation (longest response ~37 + EOS)
DEFAULT_N = {"train": 20000, "test": 100}
_PROMPT_RE = re.compile(r"([0-9]+(?: [0-9]+)*) -> ([0-9]+)\n?")


# ---------------------------------------------------------------------------------------
# Problems and their solutions
# ---------------------------------------------------------------------------------------

def step(a: int, op: str, b: int) -> int | None:
    """a op b under the game's rules: a positive integer, or None where the rules forbid it."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    return a // b if a % b == 0 else None             # "/": exact division only


def solution_paths(numbers: list[int], max_target: int = MAX_TARGET) -> list[tuple]:
    """Every way to combine three numbers in two steps, as expression trees with their value.

    A tree is an int (a number) or (op, left, right). Two steps over three numbers give
    (x op1 y) op2 z or z op2 (x op1 y): 3! orders x 4 x 4 operators x 2 sides, minus the
    steps the rules forbid, minus results above max_target. Operand orders are all listed
    (x+y and y+x are two paths to ONE solution: solution_key merges them).
    Returns [(value, tree)], deterministic in its input.
    """
    out = []
    for x, y, z in itertools.permutations(numbers):
        for op1 in OPS:
            r = step(x, op1, y)
            if r is None:
                continue
            inner = (op1, x, y)
            for op2 in OPS:
                for left, right, a, b in ((inner, z, r, z), (z, inner, z, r)):
                    v = step(a, op2, b)
                    if v is not None and v <= max_target:
                        out.append((v, (op2, left, right)))
    return out


def distinct_solutions(numbers: list[int], target: int) -> set:
    """The distinct solutions of a problem: the set of solution_key of its paths."""
    return {solution_key(tree) for v, tree in solution_paths(numbers) if v == target}


def draw_problem(rng: random.Random) -> tuple[list[int], int, list]:
    """(numbers, target, paths to target): numbers uniform, target the value of a uniform path.

    Drawing the target through a random path (rather than uniformly among reachable
    values) is how Countdown generators usually work (reasoning-gym draws a random
    expression); it favours targets with many paths, so most problems have several
    solutions.
    """
    while True:
        numbers = [rng.randint(LOW, HIGH) for _ in range(NUMBERS)]
        paths = solution_paths(numbers)
        if paths:
            target = rng.choice(paths)[0]
            return numbers, target, [tree for v, tree in paths if v == target]


def prompt_text(numbers: list[int], target: int) -> str:
    """"13 14 2 -> 29\\n": the numbers in the order drawn, then the target."""
    return " ".join(str(n) for n in numbers) + f" -> {target}\n"


def response_text(tree, rng: random.Random) -> str:
    """The scratchpad of a two-step tree, in a randomly drawn phrasing.

    "<marker><x><op1><y><connective><r>\\n<marker><a><op2><b><connective><v>\\n<prefix><expr>\\n",
    where the answer expression puts the first step in parentheses, on the side where
    the tree has it: "(x op1 y) op2 z" or "z op2 (x op1 y)".
    """
    op2, left, right = tree
    inner, outer_side = (left, "left") if isinstance(left, tuple) else (right, "right")
    op1, x, y = inner
    r = step(x, op1, y)
    z = right if outer_side == "left" else left
    a, b = (r, z) if outer_side == "left" else (z, r)
    first = f"{rng.choice(STEP_MARKERS)}{x}{op1}{y}{rng.choice(CONNECTIVES)}{r}\n"
    second = f"{rng.choice(STEP_MARKERS)}{a}{op2}{b}{rng.choice(CONNECTIVES)}{step(a, op2, b)}\n"
    return first + second + rng.choice(ANSWER_PREFIXES) + render(tree) + "\n"


def instruct_prompt(bare: str) -> str:
    """A countdown prompt worded for a chat model (--data countdown_instruct): the rules,
    the answer line the checker reads, and the bare problem as the last line.

    A hub model has never seen the warm-up's bare "13 14 2 -> 29" format, and its answer
    is credited only on a line starting "answer: " (answer_line; not "Answer:" or
    "**answer:**"), so the prompt says so. The checker reads numbers and target from the
    last line, the bare problem unchanged. reasoning-gym's countdown (--data
    reasoning_gym:countdown) is the alternative, with its own wording, scorer and five numbers.

    Example: "13 14 2 -> 29" becomes one line "Use the numbers 13, 14, 2, each exactly
    once, with + - * / and parentheses, to make 29. Think step by step. Then write the
    expression alone on the last line, after "answer: ", for example:", the line
    "answer: (1 + 2) * 3", a blank line, "The numbers, then the target:" and the problem.
    """
    numbers, target = bare.strip().split(" -> ")
    return (f"Use the numbers {', '.join(numbers.split())}, each exactly once, with + - * / and parentheses, "
            f"to make {target}. Think step by step. Then write the expression alone on the last line, after "
            '"answer: ", for example:\nanswer: (1 + 2) * 3\n\n'
            f"The numbers, then the target:\n{bare.strip()}\n")


def make_rows(n: int, split: str, seed: int = 0) -> list[dict]:
    """n problems of one split: {"prompt", "answer": target, "target": a reference response}.

    "target" is the warm-up's label: one distinct solution of the problem drawn
    uniformly, written with one of its operand orders and a random phrasing. RL uses only
    "prompt" and "answer" (the checker reads the numbers from the prompt). Train and test
    never share a problem (is_held_out), and the test split draws from its own stream.
    Duplicates within a split are kept. Deterministic in (n, split, seed).
    """
    rng = random.Random(split_seed(seed, split))
    if n < 0:
        raise ValueError(f"make_rows needs n >= 0, got n={n}")
    held_out = split == "test"
    rows = []
    while len(rows) < n:
        numbers, target, paths = draw_problem(rng)
        if is_held_out(problem_key(numbers, target)) != held_out:
            continue
        by_solution = {}
        for tree in paths:
            by_solution.setdefault(solution_key(tree), []).append(tree)
        chosen = by_solution[rng.choice(sorted(by_solution, key=repr))]
        rows.append({"prompt": prompt_text(numbers, target), "answer": str(target),
                     "target": response_text(rng.choice(chosen), rng)})
    return rows


def problem_key(numbers: list[int], target: int) -> str:
    """The problem's canonical text for the held-out split: its sorted numbers and target."""
    return " ".join(str(n) for n in sorted(numbers)) + f" -> {target}"


def is_reasoning_text(token_text: str) -> bool:
    """A token is reasoning iff its text, spaces stripped, is non-empty and made only of
    digits and + - * / ( ).

    Stripped: a BPE vocabulary writes an operator with the space before it as one token
    (SmolLM2's " +", " *", " ("), and that token is the operator's choice, reasoning; a
    token of spaces or newlines alone is layout, template. The embedded tokenizer has no
    such tokens (its phrases hold letters), so for it the strip changes nothing.
    """
    text = token_text.strip()
    return bool(text) and all(c in "0123456789+-*/()" for c in text)


def prompt_from_reasoning_gym(entry: dict) -> str:
    """Our prompt for a reasoning-gym countdown entry: its numbers and target, our format.

    reasoning-gym keeps them in entry["metadata"]["numbers"] and ["target"]; with this
    prompt, check scores the same answer rg's own scorer does (the two
    are compared on a corpus in tests/engine/test_countdown.py).
    """
    meta = entry["metadata"]
    return prompt_text(list(meta["numbers"]), int(meta["target"]))


def solution_of(response: str):
    """The solution a response's answer line gives (solution_key of its tree), or None."""
    expression = answer_line(response)
    try:
        return solution_key(parse_expression(expression))
    except MalformedExpression:
        return None


# ---------------------------------------------------------------------------------------
# The checker (the expression's grammar and exact value: tasks/expression.py)
# ---------------------------------------------------------------------------------------

def answer_line(response: str) -> str | None:
    """The text after the prefix of the LAST line that starts with an answer prefix, or None."""
    if not isinstance(response, str):
        return None
    answer = None
    for line in response.split("\n"):
        for prefix in ANSWER_PREFIXES:
            if line.startswith(prefix):
                answer = line[len(prefix):]
    return answer


def check(response, answer: str, prompt: str) -> dict:
    """Exact checker of the countdown task: {"format", "correct", "reward"} in {0.0, 1.0}.

      correct  the last answer line's expression (answer_line) uses each number of
               the prompt exactly once and equals the target (countdown_correct).
      format   the response is exactly NUMBERS-1 step lines, then the answer line
               (make_rows' format, any of its phrasings); logged, not rewarded.
      reward   = correct.
    prompt: "13 14 2 -> 29\\n", or any text whose last line is that (the numbers and target
    are read from the last line: --data countdown_instruct words the task for a chat model
    above it); answer: the target as a string, which must agree with the prompt
    (ValueError otherwise: a data bug).
    Any response (None, 1 MB of text, deep nesting, huge numbers) gets a score, never an
    exception: parse_expression is bounded and raises only MalformedExpression.
    """
    m = _PROMPT_RE.fullmatch(prompt.rstrip("\n").rsplit("\n", 1)[-1]) if isinstance(prompt, str) else None
    if m is None:
        raise ValueError(f"countdown: prompt must look like '13 14 2 -> 29\\n', got {prompt!r}")
    numbers, target = [int(x) for x in m.group(1).split()], int(m.group(2))
    if answer != str(target):
        raise ValueError(f"countdown: answer {answer!r} is not the prompt's target {target}")
    expression = answer_line(response)
    correct = 1.0 if expression is not None and countdown_correct(expression, numbers, target) else 0.0
    fmt = 1.0 if isinstance(response, str) and _countdown_format_re(len(numbers)).fullmatch(response) else 0.0
    return {"format": fmt, "correct": correct, "reward": correct}


def rows(n: int | None, split: str, seed: int = 0, digits: int = 3, instruct: bool = False) -> list[dict]:
    """The task's rows (n None: DEFAULT_N[split]); instruct: prompts worded for a chat model."""
    out = make_rows(DEFAULT_N[split] if n is None else n, split, seed=seed)
    return [{**r, "prompt": instruct_prompt(r["prompt"])} for r in out] if instruct else out


def warmup_fields(digits: int) -> dict:
    """The embedded model's warm-up (warmups.WarmupConfig fields): width 64 with 2 heads,
    3000 steps on clean targets. The warm-up is meant to leave the model uncertain among
    several right answers and wordings, not to solve the task (docs/results.md)."""
    return {"max_steps": 3000, "eval_every": 500}


TASK = Task(name="countdown", rows=rows, check=check, needs_prompt=True, is_reasoning_text=is_reasoning_text,
            eval_prompts=100, eval_samples=16, warmup=warmup_fields, max_response_tokens=lambda digits: MAX_RESPONSE_TOKENS,
            solution_of=solution_of)
"""--data countdown: the bare prompts the embedded model is warmed up on; pass@1 to pass@16."""
INSTRUCT = Task(name="countdown", rows=lambda n, split, seed=0, digits=3: rows(n, split, seed, digits, instruct=True),
                check=check, needs_prompt=True, is_reasoning_text=is_reasoning_text, eval_prompts=100,
                eval_samples=16, solution_of=solution_of, bare_wording="countdown")
"""--data countdown_instruct: the same problems worded for a chat model (no embedded warm-up)."""


# --- helpers ---------------------------------------------------------------------------

_FORMAT_RES = {}


def _countdown_format_re(n_numbers: int):
    """The exact response format for n numbers: n-1 step lines, then the answer line."""
    if n_numbers not in _FORMAT_RES:
        markers = "|".join(re.escape(m) for m in STEP_MARKERS)
        prefixes = "|".join(re.escape(p) for p in ANSWER_PREFIXES)
        connectives = "|".join(re.escape(c) for c in CONNECTIVES)
        line = rf"(?:{markers})[0-9]+[-+*/][0-9]+(?:{connectives})[0-9]+\n"
        _FORMAT_RES[n_numbers] = re.compile(rf"(?:{line}){{{n_numbers - 1}}}(?:{prefixes})[-+*/()0-9]+\n?")
    return _FORMAT_RES[n_numbers]
