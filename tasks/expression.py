"""An exact, bounded checker of arithmetic expressions: a grammar with nothing to execute.

The countdown task (tasks/countdown.py) asks for an arithmetic expression that uses each
given number once and equals the target. Checking that means evaluating text the model
wrote. The common shortcut, eval() or sympy's parse_expr (which calls eval; it is what
reasoning-gym's countdown scorer uses), executes whatever the text says. This file parses
the text itself instead, with a grammar that has nothing to execute:

    expr   := term (("+" | "-") term)*
    term   := atom (("*" | "/") atom)*
    atom   := NUMBER | "(" expr ")"          NUMBER: 1 to MAX_NUMBER_DIGITS digits

and evaluates it in exact rational arithmetic (fractions.Fraction), so 6/4*2 == 3
exactly and no float rounding decides a reward. Spaces are ignored. No powers, no
decimals (the game has none), and no unary minus in our game; reasoning-gym's countdown
writes answers like "-5 + 65*44/5", so its data is checked with one more rule,
atom := "-" atom (unary_minus=True). Every input costs time linear in its length:
the answer is cut to MAX_EXPR_CHARS, parenthesis depth is counted before any recursion,
and numbers are at most MAX_NUMBER_DIGITS long, so the largest value any accepted
input can build has a few hundred digits.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_EXPR_CHARS = 200        # a longer answer line is not credited (the task's answers have < 20)
MAX_EXPR_DEPTH = 16         # deeper parenthesis nesting is not credited
MAX_NUMBER_DIGITS = 6       # a longer number is not credited
_EXPR_TOKEN_RE = re.compile(r"[0-9]+|[-+*/()]")


class MalformedExpression(ValueError):
    """The text is not an expression of the grammar (or exceeds its bounds)."""


def parse_expression(text: str, unary_minus: bool = False):
    """Parse an arithmetic expression into a tree: an int, or (op, left, right).

    Left-associative, * and / bind tighter than + and -: "8-3-1" is ("-", ("-", 8, 3), 1).
    unary_minus: also accept "-" before an atom, as ("neg", atom): "-2*3" is
    ("*", ("neg", 2), 3) (its value is -(2*3) all the same).
    Raises MalformedExpression (one line saying why) for anything outside the grammar or
    its bounds. Never evaluates anything.
    Example: parse_expression("2+(14+13)") == ("+", 2, ("+", 14, 13)).
    """
    if not isinstance(text, str):
        raise MalformedExpression(f"not a string: {type(text).__name__}")
    text = text.replace(" ", "")
    if not text or len(text) > MAX_EXPR_CHARS:
        raise MalformedExpression(f"length {len(text)} outside 1..{MAX_EXPR_CHARS}")
    tokens = _EXPR_TOKEN_RE.findall(text)
    if "".join(tokens) != text:
        raise MalformedExpression("a character outside digits, + - * / ( )")
    depth = 0
    for tok in tokens:                      # depth first, so the recursion below is bounded
        depth += (tok == "(") - (tok == ")")
        if depth > MAX_EXPR_DEPTH or depth < 0:
            raise MalformedExpression(f"parentheses unbalanced or nested deeper than {MAX_EXPR_DEPTH}")
    if depth:
        raise MalformedExpression("unbalanced parentheses")
    tree, pos = _parse_sum(tokens, 0, unary_minus)
    if pos != len(tokens):
        raise MalformedExpression(f"unexpected {tokens[pos]!r} at token {pos}")
    return tree


def evaluate(tree):
    """The exact value of a tree (Fraction), or None if it divides by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    if tree[0] == "neg":
        value = evaluate(tree[1])
        return None if value is None else -value
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def leaves(tree) -> list[int]:
    """The numbers a tree uses, left to right."""
    return [tree] if isinstance(tree, int) else [n for sub in tree[1:] for n in leaves(sub)]


def solution_key(tree):
    """What makes two solutions the same: the tree with the operands of + and * in order.

    (14+13)+2 and 2+(13+14) have one key; (2+14)+13 has another: it computes a different
    intermediate result. The countdown generator counts distinct solutions with it, and
    the evaluation's solution diversity counts the model's distinct correct answers.
    """
    if isinstance(tree, int):
        return tree
    if tree[0] == "neg":
        return ("neg", solution_key(tree[1]))
    op, left, right = tree
    left, right = solution_key(left), solution_key(right)
    if op in "+*" and _key_order(right) < _key_order(left):
        left, right = right, left
    return (op, left, right)


def render(tree) -> str:
    """A tree as text, every inner operation in parentheses: ("+", 2, ("+", 14, 13)) -> "2+(14+13)"."""
    if isinstance(tree, int):
        return str(tree)
    if tree[0] == "neg":
        return f"-{render(tree[1])}" if isinstance(tree[1], int) else f"-({render(tree[1])})"
    op, left, right = tree
    wrap = lambda t: render(t) if isinstance(t, int) else f"({render(t)})"
    return f"{wrap(left)}{op}{wrap(right)}"


def countdown_correct(expression: str, numbers: list[int], target: int, unary_minus: bool = False) -> bool:
    """True iff the expression uses exactly the multiset `numbers` and equals `target` exactly.

    unary_minus: reasoning-gym's rules (parse_expression); off for our own game.
    """
    try:
        tree = parse_expression(expression, unary_minus)
    except MalformedExpression:
        return False
    return sorted(leaves(tree)) == sorted(numbers) and evaluate(tree) == target


# --- helpers ---------------------------------------------------------------------------

def _parse_sum(tokens, pos, unary):
    tree, pos = _parse_product(tokens, pos, unary)
    while pos < len(tokens) and tokens[pos] in "+-":
        op = tokens[pos]
        right, pos = _parse_product(tokens, pos + 1, unary)
        tree = (op, tree, right)
    return tree, pos


def _parse_product(tokens, pos, unary):
    tree, pos = _parse_atom(tokens, pos, unary)
    while pos < len(tokens) and tokens[pos] in "*/":
        op = tokens[pos]
        right, pos = _parse_atom(tokens, pos + 1, unary)
        tree = (op, tree, right)
    return tree, pos


def _parse_atom(tokens, pos, unary):
    if pos >= len(tokens):
        raise MalformedExpression("the expression ends where a number or '(' belongs")
    tok = tokens[pos]
    if tok == "-" and unary:                # at most MAX_EXPR_CHARS deep: well inside Python's stack
        tree, pos = _parse_atom(tokens, pos + 1, unary)
        return ("neg", tree), pos
    if tok == "(":
        tree, pos = _parse_sum(tokens, pos + 1, unary)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise MalformedExpression("missing ')'")
        return tree, pos + 1
    if not tok.isdigit():
        raise MalformedExpression(f"unexpected {tok!r} at token {pos}")
    if len(tok) > MAX_NUMBER_DIGITS:
        raise MalformedExpression(f"a number longer than {MAX_NUMBER_DIGITS} digits")
    return int(tok), pos + 1


def _key_order(t):
    """A total order on keys (ints before trees, trees by their text) to sort operands."""
    return (0, t, "") if isinstance(t, int) else (1, 0, repr(t))
