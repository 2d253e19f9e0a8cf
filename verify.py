"""Verifiers: how a piece of generated text becomes a reward.

Critic-free RL for reasoning (GRPO and its family, docs/math.md §1) needs no reward
model: each rollout is scored by a program that checks the final answer against a known
reference. That program, the *verifier*, is the whole reward signal, so its mistakes are
the policy's training targets: a verifier that accepts "0432" for 432, or that hangs on
"10^{10^{10^{10}}}", is a bug the policy will find. This file is three steps:

  1. extract   text -> the final answer string          (extract_answer)
  2. compare   answer string vs reference -> bool       (math_equal, check_addition)
  3. score     -> a dict of components, one is "reward" (score_math, check_addition, score)

Three tasks:
- "addition": the synthetic task of data.py SECTION 1. Its format is exact, so the
  checker is exact too: a regular expression for the format, integer comparison of a
  canonical decimal string for the answer, plus a scratchpad consistency check.
- "countdown": the numbers game of machinery/countdown.py. The answer is an arithmetic
  expression; SECTION 4 parses it with a grammar of its own and evaluates it in exact
  rational arithmetic (never eval), then checks the numbers used and the value.
- "math": GSM8K / MATH style free text. The answer is taken from \\boxed{...} (MATH,
  Hendrycks et al. 2021), "#### 42" (GSM8K, Cobbe et al. 2021) or "Answer: ...", and
  compared *symbolically* with HuggingFace's math-verify (\\frac{1}{2} == 0.5,
  2\\sqrt{2} == \\sqrt{8}).

Components. Every scorer returns a dict of floats in {0.0, 1.0}. "reward" is always
equal to "correct": a format bonus (as in DeepSeek-R1's format reward) is *logged* as
the "format" component but never added to the reward, because with group-normalised
advantages any extra reward term changes which rollouts are pushed up, and this project
studies the correctness signal alone. Callers that want shaping can combine components
themselves.

Safety. No model text is ever evaluated in the trainer's process. Our own checkers
(addition, countdown) parse text with grammars that have nothing to execute. The scorers
that can evaluate text (math-verify, which hands parts of an answer to sympy, and
reasoning-gym's dataset scorers, some of which call eval) run only in
machinery/sandbox.py: a locked-down child process per answer, killed at its timeout,
which can neither write files, nor signal the trainer, nor keep running; its header says
exactly what holds and what does not. reasoning-gym's countdown data is scored by our
own checker (SECTION 5).
"""

from __future__ import annotations

import json
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

from machinery import sandbox


# ---------------------------------------------------------------------------------------
# SECTION 1. Extracting the final answer from a response
# ---------------------------------------------------------------------------------------

# Longest \boxed{...} content we scan for its closing brace. A real answer is a few
# dozen characters; the bound makes the scan O(MAX_BOXED_CHARS) however the response
# looks (an unterminated "\boxed{{{{{..." costs at most this many steps).
MAX_BOXED_CHARS = 2000

# "#### 42": GSM8K's answer marker. The rest of the line is the answer.
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*)")
# "Answer: 42" (any case) or "A:42" (capital A, not the end of a word like "DATA:").
_ANSWER_RE = re.compile(r"(?:\b(?i:answer)|(?<![A-Za-z0-9_])A)[ \t]*:[ \t]*([^\n]*)")


def extract_answer(text) -> str | None:
    """The final answer of a response, as a string, or None if there is none.

    Precedence (the first rule that applies decides; inside a rule the LAST occurrence
    wins, because models restate, correct themselves, and finish with the answer):
      1. \\boxed{...}  if the text contains "\\boxed" at all. The last "\\boxed" must be
         well formed: followed by "{", braces balanced (nesting allowed, e.g.
         \\boxed{\\frac{1}{2}}), closed within MAX_BOXED_CHARS. Otherwise -> None, even
         if an earlier \\boxed was fine: a response truncated inside its final box has
         not given an answer, and crediting a box it abandoned would reward it.
      2. "#### <rest of line>"    (GSM8K's marker)
      3. "Answer: <rest of line>" (case-insensitive) or "A:<rest of line>" (the
         addition task's answer line).
    For rules 2-3 the captured line is stripped and one trailing "." removed
    ("Answer: 42." -> "42"). An empty capture ("\\boxed{}", "A:") -> None.

    No normalisation happens here ("1,234" stays "1,234"): deciding that it equals 1234
    is math_equal's job. None, "" and non-str input -> None (a failed generation is
    scored, not crashed on).
    """
    if not isinstance(text, str) or not text:
        return None
    if "\\boxed" in text:
        return last_boxed(text)
    for pattern in (_GSM8K_RE, _ANSWER_RE):
        last = None
        for m in pattern.finditer(text):
            last = m
        if last is not None:
            ans = last.group(1).strip()
            if ans.endswith("."):
                ans = ans[:-1].rstrip()
            return ans or None
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in text, or None if it is absent or malformed.

    A brace counter, not a regex: regular expressions cannot match nested braces, and a
    recursive matcher could blow the stack on 10^5 nested "{". The scan is linear and
    stops after MAX_BOXED_CHARS characters. "\\boxed {x}" (space) is accepted; "\\boxed 5"
    (TeX's brace-less argument) is not. data.math_rows uses this to read MATH's reference
    solutions, so model answers and references are extracted by the same rule.
    Example: last_boxed("so \\boxed{1} no, \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}".
    """
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = start + len("\\boxed")
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, begin = 0, i + 1
    for j in range(i, min(len(text), begin + MAX_BOXED_CHARS + 1)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                content = text[begin:j].strip()
                return content or None
    return None                              # unterminated, or longer than the bound


# ---------------------------------------------------------------------------------------
# SECTION 2. Symbolic equivalence, sandboxed, with a hard wall-clock bound
# ---------------------------------------------------------------------------------------
#
# math-verify bounds its own work with signal.alarm. That has two problems for an RL
# loop: (a) signals only work in the main thread, so math-verify raises (or, with the
# timeout disabled, may hang) when scoring runs in a worker thread; (b) an alarm cannot
# interrupt a long computation inside C code (a huge integer power), so the "timeout"
# may never fire. The only bound that always works is to run the check in another
# process and kill it. And math-verify hands parts of the answer to sympy, whose parser
# can evaluate Python: model text must not reach it with the trainer's rights. So the
# comparison runs in machinery/sandbox.py: a warm worker process per core imports
# math-verify once, and forks a locked-down child per comparison, which it kills at the
# timeout (the sandbox's header lists what that child can and cannot do).

MAX_ANSWER_CHARS = 1000      # longer answers are never credited (see math_equal)
MAX_BRACE_DEPTH = 32         # deeper {...} nesting is never credited (no real answer has it)

_INT_RE = re.compile(r"-?[0-9]+")
# Full-width forms U+FF01..U+FF5E ("４２", "＋") -> ASCII. Not NFKC: NFKC also maps
# "x²" to "x2" and "½" to "1⁄2", which changes what the answer means.
_FULLWIDTH = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)}


def math_equal(pred, ref, timeout: float = 2.0) -> bool:
    """True iff the answer string pred is mathematically equal to the reference ref.

    Steps, cheapest first (each returns early):
      1. non-str or empty (after stripping) -> False.
      2. full-width characters mapped to ASCII; identical strings -> True.
      3. longer than MAX_ANSWER_CHARS, or braces nested deeper than MAX_BRACE_DEPTH
         -> False. This is a policy, not only a speed-up: a 100000-digit "answer" is
         not credited even if it happened to parse.
      4. both plain integers ("-?[0-9]+") -> integer comparison ("0432" == "432" here;
         the addition task is stricter, see check_addition), done on canonical strings.
      5. otherwise math-verify, in a sandboxed child process (machinery/sandbox.py),
         with at most `timeout` seconds of wall time (not counting a worker's one-time
         start-up). A timeout, a crash or a parse failure -> False.
    Both strings are wrapped as "$...$" before math-verify's parse, which makes it read
    them as LaTeX; ref is passed as the gold (math-verify's verify is not symmetric:
    it simplifies assignments like "x=3" on the prediction side).

    Conventions inherited from math-verify 0.9.0, pinned in tests: "1,234" == "1234"
    (thousands separator); "\\frac{1}{2}" == "0.5"; "2\\sqrt{2}" == "\\sqrt{8}";
    "−3" (U+2212) == "-3"; "π" == "\\pi"; "10\\%" == "0.1"; "2,3" == "3,2" (read as a
    set of solutions).

    Thread-safe: callable from any thread; calls beyond sandbox.POOL_SIZE concurrent
    ones wait for a free worker. Measured cost: ~5 us for the integer fast path; tens of
    ms per math-verify call, most of it the fork (docs/LOG.md); a few seconds once per
    worker start-up (importing sympy, scoring MATH_WARMUP); a hang costs `timeout`.
    """
    if not (isinstance(pred, str) and isinstance(ref, str)):
        return False
    if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise ValueError(f"math_equal needs a finite timeout > 0 seconds, got {timeout!r}")
    pred = pred.translate(_FULLWIDTH).strip()
    ref = ref.translate(_FULLWIDTH).strip()
    if not pred or not ref:
        return False
    if pred == ref:
        return True
    for s in (pred, ref):
        if len(s) > MAX_ANSWER_CHARS or _brace_depth(s) > MAX_BRACE_DEPTH:
            return False
    if _INT_RE.fullmatch(pred) and _INT_RE.fullmatch(ref):
        return _canonical_int(pred) == _canonical_int(ref)
    return sandbox.run_scorer("math", [pred, ref], timeout) is True


def shutdown_math_workers() -> None:
    """Stop the sandbox's workers (math-verify's and reasoning-gym's); the next call starts fresh ones."""
    sandbox.shutdown()


# One answer of each kind math-verify treats differently (numbers, fractions, roots,
# sets, intervals, matrices, calculus, units, degrees, ...). A sandbox worker scores them
# once BEFORE it gives up the trainer's rights: sympy imports many of its modules only
# when an answer first needs them, and a worker that has switched to `nobody` may be
# unable to read them (Python installed under /root, say). What it loads here, every
# child inherits.
MATH_WARMUP = [
    ("\\frac{1}{2}", "0.5"), ("2\\sqrt{2}", "\\sqrt{8}"), ("1,234", "1234"), ("10\\%", "0.1"), ("2,3", "3,2"),
    ("x=3", "3"), ("\\{1,2\\}", "\\{2,1\\}"), ("[1,2)", "(0,1]"), ("x \\in (0,1]", "(0,1]"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"), ("\\sin x", "\\sin(x)"),
    ("e^{i\\pi}", "-1"), ("\\int_0^1 x dx", "0.5"), ("\\log_2 8", "3"), ("3 \\text{ cm}", "3"), ("a<b", "b>a"),
    ("\\infty", "\\infty"), ("\\binom{5}{2}", "10"), ("5!", "120"), ("\\sum_{i=1}^3 i", "6"),
    ("\\lim_{x\\to 0} x", "0"), ("\\frac{d}{dx} x^2", "2x"), ("|x|", "\\left|x\\right|"), ("\\emptyset", "\\{\\}"),
    ("\\sqrt[3]{8}", "2"), ("0.\\overline{3}", "1/3"), ("\\gcd(4,6)", "2"), ("x^2+2x+1", "(x+1)^2"),
    ("90^\\circ", "\\frac{\\pi}{2}"), ("π", "\\pi"), ("−3", "-3"),
    ("\\sum_{n=1}^\\infty \\frac{1}{n^2}", "\\frac{\\pi^2}{6}"), ("\\prod_{i=1}^{3} i", "6"),
]


def prepare_scorer(library: str, warmup: list):
    """In a sandbox worker, with the trainer's rights still: import `library`, score the
    warm-up once, and return the function its children call with a request's arguments.

    "math": math-verify; the function (pred, ref) -> bool, after MATH_WARMUP.
    "reasoning_gym:NAME": reasoning-gym's scorer of dataset NAME; the function
    (answer text, entry JSON) -> float in [0, 1] (0.0 on any failure), after scoring
    each warm-up argument pair (the dataset's own reference answers, never model text).
    """
    if library == "math":
        from math_verify import parse, verify

        # The sandbox enforces the time limit, so math-verify's signal timeouts are off
        # (None); silence the warning it logs about that, and its per-failure logging.
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)

        def equal(pred: str, ref: str) -> bool:
            try:
                gold = parse(f"${ref}$", parsing_timeout=None)
                guess = parse(f"${pred}$", parsing_timeout=None)
                return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=None))
            except Exception:                 # any parser/sympy failure is "not equal"
                return False
        for args in MATH_WARMUP:
            equal(*args)
        return equal
    if library.startswith(REASONING_GYM):
        import reasoning_gym

        score_answer = reasoning_gym.get_score_answer_fn(library[len(REASONING_GYM):])

        def rg_score(text: str, entry_json: str) -> float:
            try:
                value = float(score_answer(answer=text, entry=json.loads(entry_json)))
                return value if 0.0 <= value <= 1.0 else 0.0
            except Exception:
                return 0.0
        for args in warmup:
            rg_score(*args)
        return rg_score
    raise ValueError(f"prepare_scorer: unknown library {library!r}")


# --- helpers of SECTION 2 --------------------------------------------------------------

def _brace_depth(s: str) -> int:
    """Maximum nesting depth of "{" in s (unbalanced closers are ignored)."""
    depth = deepest = 0
    for c in s:
        if c == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif c == "}" and depth > 0:
            depth -= 1
    return deepest


def _canonical_int(s: str) -> tuple[bool, str]:
    """(negative, digits without leading zeros) of "-?[0-9]+": equal iff the integers are.

    A string comparison, not int(): Python 3.11+ refuses int() of more than 4300 digits
    (ValueError), and a verifier must return a reward for any text.
    """
    digits = s.lstrip("-").lstrip("0") or "0"
    return s.startswith("-") and digits != "0", digits


# ---------------------------------------------------------------------------------------
# SECTION 3. Scores: from (response, reference) to reward components
# ---------------------------------------------------------------------------------------

def score_math(response, reference: str, timeout: float = 2.0) -> dict:
    """Score a free-text math response against a bare reference answer ("42", "\\frac12").

    Returns {"format": f, "correct": c, "reward": c}:
      f = 1.0 iff extract_answer found an answer (boxed, "####" or "Answer:"),
      c = 1.0 iff f and math_equal(answer, reference).
    reward == correct (module header: format is logged, never rewarded).
    reference is the answer itself, not a solution; data.py extracts it once.
    """
    if not isinstance(reference, str):
        raise ValueError(f"score_math needs a str reference, got {reference!r}")
    pred = extract_answer(response)
    fmt = 1.0 if pred is not None else 0.0
    correct = 1.0 if pred is not None and math_equal(pred, reference, timeout) else 0.0
    return {"format": fmt, "correct": correct, "reward": correct}


# Exact format of an addition response (data.addition_response): column lines
# "x+y+c=ds", then "A:<digits>", then at most one newline. Tokenizers decode without
# the EOS token, so nothing follows.
_ADDITION_FORMAT_RE = re.compile(r"(?:[0-9]\+[0-9]\+[01]=[0-9]{2}\n)+A:[0-9]+\n?")
_COLUMN_RE = re.compile(r"([0-9])\+([0-9])\+([01])=([0-9])([0-9])")
_PROMPT_RE = re.compile(r"([0-9]+)\+([0-9]+)\n?")
_CANONICAL_RE = re.compile(r"0|[1-9][0-9]*")


def check_addition(response, answer: str, prompt: str | None = None) -> dict:
    """Exact checker for the synthetic addition task (data.py SECTION 1).

    Returns {"format", "correct", "scratchpad_ok", "reward"} with values in {0.0, 1.0}:
      format         the whole response matches
                     (r"[0-9]\\+[0-9]\\+[01]=[0-9]{2}\\n")+ r"A:[0-9]+" r"\\n"?
                     and nothing else (no text before, no trailing garbage, no spaces).
      correct        the rest of the line after the LAST "A:" is the canonical decimal
                     string of the reference (no sign, no spaces, no leading zeros):
                     "A:432" is right, "A:0432", "A: 432", "A:432foo" are wrong. Why
                     strict: the answer format is fixed by every training target, so a
                     non-canonical answer is a formatting slip, and a string test is
                     exact where a lenient parse would need its own rules.
                     Independent of format: "junk\\nA:432\\nmore" is correct (c=1, f=0).
      scratchpad_ok  format holds and the column arithmetic is consistent: each line
                     has x+y+c == 10d+s, the first carry-in is 0, each carry-in equals
                     the previous column's carry-out d, and the answer line equals the
                     number the columns spell (d of the last column, then the s digits,
                     most significant first). With prompt "a+b\\n" given, the columns
                     must also be exactly a's and b's digits (zero-padded to the longer
                     operand). A consistent scratchpad with the right operands can only
                     end in the right answer; a right answer after a wrong scratchpad
                     (a lucky guess or memorisation) has scratchpad_ok 0.
      reward         = correct.
    answer must be a canonical decimal string (ValueError otherwise); response may be
    None or non-str (a failed generation), which scores all zeros.
    """
    if not (isinstance(answer, str) and _CANONICAL_RE.fullmatch(answer)):
        raise ValueError(f"check_addition needs a canonical decimal answer, got {answer!r}")
    operands = None
    if prompt is not None:
        m = _PROMPT_RE.fullmatch(prompt) if isinstance(prompt, str) else None
        if m is None:
            raise ValueError(f"check_addition: prompt must look like '347+85\\n', got {prompt!r}")
        operands = m.group(1), m.group(2)
    zero = {"format": 0.0, "correct": 0.0, "scratchpad_ok": 0.0, "reward": 0.0}
    if not isinstance(response, str):
        return zero

    pos = response.rfind("A:")
    correct = 0.0
    if pos >= 0 and response[pos + 2:].split("\n", 1)[0] == answer:
        correct = 1.0
    fmt = 1.0 if _ADDITION_FORMAT_RE.fullmatch(response) else 0.0
    ok = 1.0 if fmt and _scratchpad_consistent(response, operands) else 0.0
    return {"format": fmt, "correct": correct, "scratchpad_ok": ok, "reward": correct}


def score(responses: list, answers: list[str], task: str,
          prompts: list[str] | None = None, timeout: float = 2.0) -> list[dict]:
    """Score a batch: one dict per response (check_addition, check_countdown or score_math).

    task: "addition", "countdown" or "math" (ValueError naming anything else). responses, answers
    and prompts (if given) must have equal lengths (ValueError with both lengths).
    prompts are used by the addition checker's scratchpad test, ignored for math.
    For "math" the comparisons run on sandbox.POOL_SIZE threads, each talking to its own
    worker process, so the pool is used in parallel; the order of results is the
    order of the inputs.
    """
    if task not in ("addition", "countdown", "math") and not task.startswith(REASONING_GYM):
        raise ValueError(f"unknown task {task!r}; expected 'addition', 'countdown', 'math' or 'reasoning_gym:NAME'")
    if len(responses) != len(answers):
        raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
    if prompts is not None and len(prompts) != len(responses):
        raise ValueError(f"score: {len(responses)} responses but {len(prompts)} prompts")
    if task == "addition":
        ps = prompts if prompts is not None else [None] * len(responses)
        return [check_addition(r, a, p) for r, a, p in zip(responses, answers, ps)]
    if task.startswith(REASONING_GYM):        # countdown: SECTION 4's checker; others: the sandbox
        name = task[len(REASONING_GYM):]
        with ThreadPoolExecutor(max_workers=sandbox.POOL_SIZE) as ex:
            return list(ex.map(lambda ra: score_reasoning_gym(ra[0], ra[1], name, timeout), zip(responses, answers)))
    if task == "countdown":                   # the numbers are in the prompt
        if prompts is None:
            raise ValueError("score: the countdown task needs the prompts (they hold the numbers)")
        return [check_countdown(r, a, p) for r, a, p in zip(responses, answers, prompts)]
    for a in answers:                         # fail before starting any work
        if not isinstance(a, str):
            raise ValueError(f"score: answers must be str, got {a!r}")
    if len(responses) <= 1:
        return [score_math(r, a, timeout) for r, a in zip(responses, answers)]
    with ThreadPoolExecutor(max_workers=sandbox.POOL_SIZE) as ex:
        return list(ex.map(lambda ra: score_math(ra[0], ra[1], timeout),
                           zip(responses, answers)))


def reward_tensor(scores: list[dict], key: str = "reward"):
    """[B] float32 tensor of scores[b][key] (B = len(scores), prompt-major as given).

    The bridge to the advantage functions, which reshape it to [N, G]. torch is
    imported here, not at the top, so that math-verify worker processes (which import
    this module) start without loading torch. Missing key -> ValueError naming it.
    """
    import torch

    values = []
    for i, s in enumerate(scores):
        if key not in s:
            raise ValueError(f"reward_tensor: score {i} has no key {key!r} (keys: {sorted(s)})")
        values.append(float(s[key]))
    return torch.tensor(values, dtype=torch.float32)


# --- helpers of SECTION 3 --------------------------------------------------------------

def _scratchpad_consistent(response: str, operands: tuple[str, str] | None) -> bool:
    """Column arithmetic check for a response that already matches the format."""
    lines = response.rstrip("\n").split("\n")
    columns, answer_line = lines[:-1], lines[-1]
    carry, s_digits = 0, []
    for line in columns:
        x, y, c, d, s = (int(g) for g in _COLUMN_RE.fullmatch(line).groups())
        if c != carry or x + y + c != 10 * d + s:
            return False
        carry = d
        s_digits.append(str(s))
    # The number the columns spell, as a canonical string (no leading zero); not int(),
    # which refuses more than 4300 digits, and a long scratchpad is still just text.
    spelled = (str(carry) + "".join(reversed(s_digits))).lstrip("0") or "0"
    if answer_line[2:] != spelled:
        return False
    if operands is not None:
        a, b = operands
        n = max(len(a), len(b))
        if len(columns) != n:
            return False
        a, b = a.zfill(n), b.zfill(n)
        for k, line in enumerate(columns):              # column k: digit n-1-k
            if line[0] != a[n - 1 - k] or line[2] != b[n - 1 - k]:
                return False
    return True


# ---------------------------------------------------------------------------------------
# SECTION 4. Countdown: an exact, bounded expression checker of our own
# ---------------------------------------------------------------------------------------
#
# The countdown task (machinery/countdown.py) asks for an arithmetic expression that uses
# each given number once and equals the target. Checking that means evaluating text the
# model wrote. The common shortcut, eval() or sympy's parse_expr (which calls eval; it is
# what reasoning-gym's countdown scorer uses), executes whatever the text says. This
# section parses the text itself instead, with a grammar that has nothing to execute:
#
#     expr   := term (("+" | "-") term)*
#     term   := atom (("*" | "/") atom)*
#     atom   := NUMBER | "(" expr ")"          NUMBER: 1 to MAX_NUMBER_DIGITS digits
#
# and evaluates it in exact rational arithmetic (fractions.Fraction), so 6/4*2 == 3
# exactly and no float rounding decides a reward. Spaces are ignored. No powers, no
# decimals (the game has none), and no unary minus in our game; reasoning-gym's countdown
# writes answers like "-5 + 65*44/5", so its data is checked with one more rule,
# atom := "-" atom (unary_minus=True). Every input costs time linear in its length:
# the answer is cut to MAX_EXPR_CHARS, parenthesis depth is counted before any recursion,
# and numbers are at most MAX_NUMBER_DIGITS long, so the largest value any accepted
# input can build has a few hundred digits.

# The task's wording, owned here because the format check and the answer extraction below
# read it (machinery/countdown.py writes the warm-up data with it). Each phrase is one
# token of the embedded tokenizer.
COUNTDOWN_STEP_MARKERS = ("then ", "so ", "next ", "now ", "step ")
COUNTDOWN_CONNECTIVES = ("=", " is ")
COUNTDOWN_ANSWER_PREFIXES = ("answer: ", "A: ", "result: ")
MAX_EXPR_CHARS = 200        # a longer answer line is not credited (the task's answers have < 20)
MAX_EXPR_DEPTH = 16         # deeper parenthesis nesting is not credited
MAX_NUMBER_DIGITS = 6       # a longer number is not credited
_COUNTDOWN_PROMPT_RE = re.compile(r"([0-9]+(?: [0-9]+)*) -> ([0-9]+)\n?")
_EXPR_TOKEN_RE = re.compile(r"[0-9]+|[-+*/()]")


class MalformedExpression(ValueError):
    """The text is not an expression of the countdown grammar (or exceeds its bounds)."""


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


def countdown_answer(response: str) -> str | None:
    """The text after the prefix of the LAST line that starts with an answer prefix, or None."""
    if not isinstance(response, str):
        return None
    answer = None
    for line in response.split("\n"):
        for prefix in COUNTDOWN_ANSWER_PREFIXES:
            if line.startswith(prefix):
                answer = line[len(prefix):]
    return answer


def check_countdown(response, answer: str, prompt: str) -> dict:
    """Exact checker of the countdown task: {"format", "correct", "reward"} in {0.0, 1.0}.

      correct  the last answer line's expression (countdown_answer) uses each number of
               the prompt exactly once and equals the target (countdown_correct).
      format   the response is exactly NUMBERS-1 step lines, then the answer line
               (machinery/countdown.py's format, any of its phrasings); logged, not rewarded.
      reward   = correct.
    prompt: "13 14 2 -> 29\\n", or any text whose last line is that (the numbers and target
    are read from the last line: --data countdown_instruct words the task for a chat model
    above it); answer: the target as a string, which must agree with the prompt
    (ValueError otherwise: a data bug).
    Any response (None, 1 MB of text, deep nesting, huge numbers) gets a score, never an
    exception: parse_expression is bounded and raises only MalformedExpression.
    """
    m = _COUNTDOWN_PROMPT_RE.fullmatch(prompt.rstrip("\n").rsplit("\n", 1)[-1]) if isinstance(prompt, str) else None
    if m is None:
        raise ValueError(f"check_countdown: prompt must look like '13 14 2 -> 29\\n', got {prompt!r}")
    numbers, target = [int(x) for x in m.group(1).split()], int(m.group(2))
    if answer != str(target):
        raise ValueError(f"check_countdown: answer {answer!r} is not the prompt's target {target}")
    expression = countdown_answer(response)
    correct = 1.0 if expression is not None and countdown_correct(expression, numbers, target) else 0.0
    fmt = 1.0 if isinstance(response, str) and _countdown_format_re(len(numbers)).fullmatch(response) else 0.0
    return {"format": fmt, "correct": correct, "reward": correct}


# --- helpers of SECTION 4 --------------------------------------------------------------

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


_FORMAT_RES = {}


def _countdown_format_re(n_numbers: int):
    """The exact response format for n numbers: n-1 step lines, then the answer line."""
    if n_numbers not in _FORMAT_RES:
        markers = "|".join(re.escape(m) for m in COUNTDOWN_STEP_MARKERS)
        prefixes = "|".join(re.escape(p) for p in COUNTDOWN_ANSWER_PREFIXES)
        connectives = "|".join(re.escape(c) for c in COUNTDOWN_CONNECTIVES)
        line = rf"(?:{markers})[0-9]+[-+*/][0-9]+(?:{connectives})[0-9]+\n"
        _FORMAT_RES[n_numbers] = re.compile(rf"(?:{line}){{{n_numbers - 1}}}(?:{prefixes})[-+*/()0-9]+\n?")
    return _FORMAT_RES[n_numbers]


# ---------------------------------------------------------------------------------------
# SECTION 5. reasoning-gym's datasets: our checker where we have one, else theirs, sandboxed
# ---------------------------------------------------------------------------------------
#
# `--data reasoning_gym:NAME` trains on any dataset of reasoning-gym and scores with the
# dataset's own score_answer(answer, entry). Some of those scorers evaluate the model's
# text as Python: countdown's and puzzle24's call sympy's parse_expr (which calls eval),
# n_queens' and spiral_matrix's call eval on an answer that is not an exact match. So:
# - countdown is scored by SECTION 4's checker, which evaluates nothing (the numbers and
#   target come from the entry's metadata); tests/test_countdown.py checks that the two
#   agree on the dataset's own answers;
# - every other dataset is scored by its own scorer in machinery/sandbox.py, never in the
#   trainer's process (the trainer never imports reasoning_gym at all). Code an answer
#   runs there cannot hurt the trainer, but it can set its own score: the sandbox's
#   header says what holds.

REASONING_GYM = "reasoning_gym:"          # task names: "reasoning_gym:NAME"
OUR_CHECKERS = ("countdown",)             # reasoning-gym datasets scored by our own checker


def score_reasoning_gym(response, answer: str, name: str, timeout: float = 2.0) -> dict:
    """{"format", "correct", "rg_score", "reward"} of one response to a reasoning-gym entry.

    answer: the row's entry as JSON (data.reasoning_gym_rows). The answer is the text in
    the response's last <answer>...</answer> tags if it has them (reasoning-gym's
    convention; "format" 1.0), else the whole response stripped ("format" 0.0).
    rg_score: for countdown, our checker's verdict (1.0 or 0.0; it gives no partial
    credit); otherwise the dataset scorer's value in [0, 1] (e.g. n_queens gives 0.5 for
    a board written as a Python list), 0.0 after a timeout or a crash.
    correct = reward = 1.0 iff rg_score >= 1.0: the project rewards correctness alone
    (the module header), so a scorer's partial credit is logged, not rewarded.
    """
    if not isinstance(response, str):
        return {"format": 0.0, "correct": 0.0, "rg_score": 0.0, "reward": 0.0}
    tagged = _RG_ANSWER_RE.findall(response[-100_000:])
    text = tagged[-1].strip() if tagged else response.strip()
    if name == "countdown":
        meta = json.loads(answer)["metadata"]
        numbers, target = [int(x) for x in meta["numbers"]], int(meta["target"])
        value = 1.0 if countdown_correct(text, numbers, target, unary_minus=True) else 0.0
    else:
        reply = sandbox.run_scorer(REASONING_GYM + name, [text, answer], timeout, warmup=_rg_warmup(answer))
        value = float(reply) if isinstance(reply, (int, float)) and 0.0 <= reply <= 1.0 else 0.0
    correct = 1.0 if value >= 1.0 else 0.0
    return {"format": 1.0 if tagged else 0.0, "correct": correct, "rg_score": value, "reward": correct}


_RG_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _rg_warmup(entry_json: str) -> list:
    """A sandbox worker's warm-up for a dataset: the entry's OWN reference answer (trusted text)."""
    reference = json.loads(entry_json).get("answer")
    return [[reference, entry_json]] if isinstance(reference, str) else []
