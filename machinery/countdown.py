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
  are put in order (verify.solution_key); about 70% of prompts have two or more. The
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
the result is positive, division only when exact). The verifier (verify.check_countdown)
accepts ANY expression over the numbers with the right value in exact rational
arithmetic, which includes everything the generator writes.

Which tokens are template (`is_reasoning_text`, used by data.template_token_mask): by
token text, exactly, because the phrase vocabulary and the arithmetic vocabulary are
disjoint by construction. Reasoning: a token made only of digits and + - * / ( ).
Template: every other token (the phrases, "=", newlines, EOS).

Held-out prompts are disjoint from training prompts by construction: a problem (its sorted
numbers and target) is held out iff its crc32 falls in one bucket of ten.
"""

from __future__ import annotations

import itertools
import random
import re
import zlib

import verify
from verify import COUNTDOWN_ANSWER_PREFIXES, COUNTDOWN_CONNECTIVES, COUNTDOWN_STEP_MARKERS

# ---------------------------------------------------------------------------------------
# The task's constants
# ---------------------------------------------------------------------------------------

NUMBERS = 3                 # numbers per problem: two steps of arithmetic
LOW, HIGH = 1, 20           # each number uniform in LOW..HIGH
MAX_TARGET = 100            # targets lie in 1..MAX_TARGET
OPS = "+-*/"

# The wording (verify.py owns it: its format check and answer extraction read it).
STEP_MARKERS = COUNTDOWN_STEP_MARKERS        # "then ", "so ", "next ", "now ", "step "
CONNECTIVES = COUNTDOWN_CONNECTIVES          # "=", " is "
ANSWER_PREFIXES = COUNTDOWN_ANSWER_PREFIXES  # "answer: ", "A: ", "result: "
PHRASES = STEP_MARKERS + ANSWER_PREFIXES + (" is ",)
"""The multi-character phrases; each is one token of the countdown tokenizer."""

MAX_RESPONSE_TOKENS = 40    # generation budget of the warm-up's evaluation (longest response ~37 + EOS)
HELD_OUT_BUCKETS = 10
EVAL_SEED_OFFSET = 1_000_003       # the test split draws from its own random stream


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
    (x+y and y+x are two paths to ONE solution: verify.solution_key merges them).
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
    """The distinct solutions of a problem: the set of verify.solution_key of its paths."""
    return {verify.solution_key(tree) for v, tree in solution_paths(numbers) if v == target}


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
    return first + second + rng.choice(ANSWER_PREFIXES) + verify.render(tree) + "\n"


def instruct_prompt(bare: str) -> str:
    """A countdown prompt worded for a chat model (--data countdown_instruct): the rules,
    the answer line the checker reads, and the bare problem as the last line.

    The embedded model learns the bare "13 14 2 -> 29" format in its warm-up; a hub
    model has never seen it, and its answer is credited only on a line that starts with
    "answer: " (verify.countdown_answer; "Answer:" or "**answer:**" is not), so the
    prompt says so. The checker reads the numbers and the target from the prompt's last
    line, which is the bare problem, unchanged. reasoning-gym's countdown
    (--data reasoning_gym:countdown) is the alternative with its own wording (an answer
    in <answer></answer> tags) and its own scorer, and five numbers instead of three.

    "13 14 2 -> 29\n" ->
        "Use the numbers 13, 14, 2, each exactly once, with + - * / and parentheses, to
         make 29. Think step by step. Then write the expression alone on the last line,
         after "answer: ", for example:\nanswer: (1 + 2) * 3\n\nThe numbers, then the
         target:\n13 14 2 -> 29\n"   (the first sentence is one line)
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
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
    if n < 0:
        raise ValueError(f"make_rows needs n >= 0, got n={n}")
    held_out = split == "test"
    rng = random.Random(seed + (EVAL_SEED_OFFSET if held_out else 0))
    rows = []
    while len(rows) < n:
        numbers, target, paths = draw_problem(rng)
        if is_held_out(numbers, target) != held_out:
            continue
        by_solution = {}
        for tree in paths:
            by_solution.setdefault(verify.solution_key(tree), []).append(tree)
        chosen = by_solution[rng.choice(sorted(by_solution, key=repr))]
        rows.append({"prompt": prompt_text(numbers, target), "answer": str(target),
                     "target": response_text(rng.choice(chosen), rng)})
    return rows


def is_held_out(numbers: list[int], target: int) -> bool:
    """True iff the problem belongs to the test side (crc32 of its sorted numbers and target)."""
    key = " ".join(str(n) for n in sorted(numbers)) + f" -> {target}"
    return zlib.crc32(key.encode()) % HELD_OUT_BUCKETS == 0


def is_reasoning_text(token_text: str) -> bool:
    """A token is reasoning iff its text is non-empty and made only of digits and + - * / ( )."""
    return bool(token_text) and all(c in "0123456789+-*/()" for c in token_text)


def is_correct(text: str, row: dict) -> bool:
    """verify.check_countdown's "correct" for one response to one row (the warm-up's check)."""
    return verify.check_countdown(text, row["answer"], row["prompt"])["correct"] == 1.0


def prompt_from_reasoning_gym(entry: dict) -> str:
    """Our prompt for a reasoning-gym countdown entry: its numbers and target, our format.

    reasoning-gym keeps them in entry["metadata"]["numbers"] and ["target"]; with this
    prompt, verify.check_countdown scores the same answer rg's own scorer does (the two
    are compared on a corpus in tests/test_countdown.py).
    """
    meta = entry["metadata"]
    return prompt_text(list(meta["numbers"]), int(meta["target"]))


def solution_of(response: str):
    """The solution a response's answer line gives (verify.solution_key of its tree), or None."""
    expression = verify.countdown_answer(response)
    try:
        return verify.solution_key(verify.parse_expression(expression))
    except verify.MalformedExpression:
        return None


def solution_diversity(solutions: dict) -> dict:
    """How spread the model's correct answers are over a prompt's distinct solutions.

    solutions: prompt -> [the solution key of each correct sample] (evaluation, n samples
    per prompt). Returns
      eval/distinct_solutions  mean over prompts with >= 1 correct sample of the number of
                               distinct solutions among them;
      eval/solution_entropy    mean over prompts with >= 2 correct samples of the entropy
                               (nats) of the empirical distribution over those solutions:
                               0 when every correct sample gives the same solution, log 2
                               for an even split between two. Our reading [recon] of
                               the design-conditions paper's "solution probability
                               drift": unequal sequence weights drive it to 0
                               (docs/math.md §3.7).
    NaN when no prompt qualifies. The entropy grows with the number of correct samples,
    so compare it between runs with the same evaluation settings only.
    """
    import math

    counts = [[keys.count(k) for k in set(keys)] for keys in solutions.values() if keys]
    entropies = [-sum(c / sum(cs) * math.log(c / sum(cs)) for c in cs) for cs in counts if sum(cs) >= 2]
    return {"eval/distinct_solutions": sum(len(cs) for cs in counts) / len(counts) if counts else math.nan,
            "eval/solution_entropy": sum(entropies) / len(entropies) if entropies else math.nan}
