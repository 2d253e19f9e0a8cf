"""Verifiers: how a piece of generated text becomes a reward.

Critic-free RL for reasoning (GRPO and its family, docs/math.md §1) needs no reward
model: each rollout is scored by a program that checks the final answer against a known
reference. That program, the *verifier*, is the whole reward signal, so its mistakes are
the policy's training targets: a verifier that accepts "0432" for 432, or that hangs on
"10^{10^{10^{10}}}", is a bug the policy will find. This file is four steps:

  1. extract   text -> the final answer string          (extract_answer)
  2. compare   answer string vs reference -> bool       (math_equal, check_addition)
  3. score     -> a dict of components, one is "reward" (score_math, check_addition, score)
  4. measure   c correct of n samples -> pass@k          (pass_at_k, for evaluation)

Two checkers are written here, one per kind of answer; each task's file (tasks/) names
its checker, and score() calls it:
- check_addition, the worked example: the synthetic task of tasks/addition.py. Its
  format is exact, so the checker is exact too: a regular expression for the format,
  a string comparison of a canonical decimal answer, plus a scratchpad consistency check.
- score_math: GSM8K / MATH style free text. The answer is taken from \\boxed{...} (MATH,
  Hendrycks et al. 2021), "#### 42" (GSM8K, Cobbe et al. 2021) or "Answer: ...", and
  compared *symbolically* with HuggingFace's math-verify (\\frac{1}{2} == 0.5,
  2\\sqrt{2} == \\sqrt{8}).
The countdown task's checker parses an arithmetic expression with a grammar of its own
(tasks/expression.py), and reasoning-gym's datasets bring their own scorers
(tasks/reasoning_gym.py).

Components. Every scorer returns a dict of floats in {0.0, 1.0}. "reward" is always
equal to "correct": a format bonus (as in DeepSeek-R1's format reward) is *logged* as
the "format" component but never added to the reward, because with group-normalised
advantages any extra reward term changes which rollouts are pushed up, and this project
studies the correctness signal alone. Callers that want shaping can combine components
themselves.

Safety. No model text is ever evaluated in the trainer's process. Our own checkers
(addition, countdown's) parse text with grammars that have nothing to execute. The scorers
that can evaluate text (math-verify, which hands parts of an answer to sympy, and
reasoning-gym's dataset scorers, some of which call eval) run only in
tasks/sandbox.py: a locked-down child process per answer, killed at its timeout,
which can neither write files, nor signal the trainer, nor keep running; its header says
exactly what holds and what does not.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


# ---------------------------------------------------------------------------------------
# SECTION 1. Extracting the final answer from a response
# ---------------------------------------------------------------------------------------

# Longest \boxed{...} content we scan for its closing brace. A real answer is a few
# dozen characters; the bound makes the scan O(MAX_BOXED_CHARS) however the response
# looks (an unterminated "\boxed{{{{{..." costs at most this many steps).
MAX_BOXED_CHARS = 2000
# Most boxes one answer joins into a set (boxed_answer): MATH's references box up to a
# handful; the bound keeps the walk back through a long response's boxes short.
MAX_JOINED_BOXES = 16

# "#### 42": GSM8K's answer marker. The rest of the line is the answer.
_GSM8K_RE = re.compile(r"####[ \t]*([^\n]*)")
# "Answer: 42" (any case) or "A:42" (capital A, not the end of a word like "DATA:").
_ANSWER_RE = re.compile(r"(?:\b(?i:answer)|(?<![A-Za-z0-9_])A)[ \t]*:[ \t]*([^\n]*)")
# A final-answer marker: "Final Answer: ..." ("**Final Answer:** ...") or Minerva's "the final
# answer is $...": not "the final answer is right", which names no answer.
_FINAL_RE = re.compile(r"\b(?i:final[ \t]+answer)(?:[ \t*]*:|(?=[ \t]+(?i:is)[ \t]*:?[ \t]*(?:\$|\\[(\[])))"
                       r"[ \t*]*([^\n]*)")
# Minerva's answer sentence (Lewkowycz et al. 2022): "The final answer is $X$. I hope it is correct."
_MINERVA_RE = re.compile(r"(?i:final[ \t]+answer[ \t]+is)[ \t]*:?[ \t]*(?:\$\$?|\\\(|\\\[)(.+?)(?:\$\$?|\\\)|\\\])")
# What may stand between two boxes that answer together, once math delimiters, spacing
# commands and \text{...} are taken out: a separator, then an optional "x =" / "y_2 =".
_BOX_GAP_NOISE_RE = re.compile(r"\\(?:quad|qquad|[,;:! ])|\\text\s*\{([^{}]*)\}|\$|\\[()\[\]]|~|\s")
_BOX_JOINER_RE = re.compile(r"(?:,|;|,?and|,?or)(?:[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?=)?")
# For reading an answer line: math spans, numbers, words, and the characters of a formula.
_MATH_SPAN_RE = re.compile(r"\$\$?.*?\$\$?|\\\(.*?\\\)|\\\[.*?\\\]")
_NUMBER_RE = re.compile(r"(?<![\w.^_])-?[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?(?![\w^_])")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_FORMULA_CHARS_RE = re.compile(r"[=^_\\{}+*/<>|]")


def extract_answer(text) -> str | None:
    """The final answer of a response, as a string, or None if there is none.

    Precedence (the first rule that applies decides; inside a rule the LAST occurrence wins):
      1. \\boxed{...}  if the text contains "\\boxed" at all: boxed_answer(text), the last
         box, or the boxes joined to it by a separator as one set ("\\boxed{1} and
         \\boxed{-2}" -> "1, -2"). The last "\\boxed" must be well formed ("{", balanced
         braces, nesting allowed, closed within MAX_BOXED_CHARS), else None even if an
         earlier box was fine: a response truncated inside its final box has not answered.
         One exception: a final-answer marker ("Final Answer: ...", or Minerva's "the final
         answer is $X$") AFTER the last box, with an answer on its line, wins over it: the box was an
         intermediate result ("... = \\boxed{255} ... Final Answer: The final answer is
         $10,455$." -> "10,455").
      2. "#### <rest of line>"    (GSM8K's marker)
      3. "Answer: <rest of line>" (case-insensitive) or "A:<rest of line>" (addition).
    For the marker rules the line is reduced to what is compared (answer_in_line): Minerva's
    "The final answer is $X$. I hope it is correct." gives X, a line of prose with exactly
    one number gives the number ("The largest $n$ is 34." -> "34"), any other line is
    stripped of its spaces and one trailing "." ("Answer: 42." -> "42"). So math_equal's
    length cap (MAX_ANSWER_CHARS) applies to the answer compared, not to the chatter
    around it on its line. An empty capture ("\\boxed{}", "A:") -> None. No other
    normalisation ("1,234" stays): that is math_equal's job. None, "" and non-str input ->
    None (a failed generation is scored, not crashed on). Why each rule: docs/math.md §10.
    """
    if not isinstance(text, str) or not text:
        return None
    if "\\boxed" in text:
        boxed, end = _boxed_answer_and_end(text)
        final = None
        for m in _FINAL_RE.finditer(text, end):
            final = m
        if final is not None:                 # Minerva's sentence starts at the marker itself
            minerva = _MINERVA_RE.match(final.group(0))
            answer = minerva.group(1).strip() if minerva else answer_in_line(final.group(1))
            if answer:
                return answer
        return boxed
    for pattern in (_GSM8K_RE, _ANSWER_RE):
        last = None
        for m in pattern.finditer(text):
            last = m
        if last is not None:
            return answer_in_line(last.group(1))
    return None


def boxed_answer(text: str) -> str | None:
    """The boxed answer of a text: the last \\boxed{...}, as a set with the boxes joined to it.

    Several boxes answer together when only a separator stands between them: "," ";" "and"
    "or" (", and" too), with math delimiters ($, \\( \\), \\[ \\]), spacing (\\quad) and
    \\text{...} around it and an "x =" before the next box. Their contents are joined by
    ", " in the text's order, which math_equal compares as a set, as math-verify reads
    "2,3" == "3,2": "\\(x = \\boxed{1}\\) and \\(x = \\boxed{-2}\\)" -> "1, -2", so a
    response must give both ("\\boxed{1, -2}", "\\boxed{-2}, \\boxed{1}") and "\\boxed{-2}"
    alone scores 0. Any other text between two boxes ("\\boxed{1} wait, no: \\boxed{2}")
    makes the earlier one a draft: the last box alone answers. math-verify 0.9.0 joins boxes
    by the same separators; it also lets words stand before one ("\\boxed{1} papers and
    \\boxed{2} bins"), which we read as a correction, like "\\boxed{1} wait, \\boxed{2}".
    At most MAX_JOINED_BOXES boxes join. None if the last box is absent or malformed
    (last_boxed). tasks/math_datasets.math_rows reads MATH's reference solutions with it,
    so a reference and a response are read by the same rule.
    Example: boxed_answer("so \\boxed{1} no, \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}";
    boxed_answer("\\boxed{(1, 2)}, \\boxed{(2, 1)}") == "(1, 2), (2, 1)".
    """
    return _boxed_answer_and_end(text)[0]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in text, or None if it is absent or malformed.

    A brace counter, not a regex: regular expressions cannot match nested braces, and a
    recursive matcher could blow the stack on 10^5 nested "{". The scan is linear and
    stops after MAX_BOXED_CHARS characters. "\\boxed {x}" (space) is accepted; "\\boxed 5"
    (TeX's brace-less argument) is not. boxed_answer joins it with the boxes before it.
    Example: last_boxed("so \\boxed{1} no, \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}".
    """
    start = text.rfind("\\boxed")
    return _box_at(text, start)[0] if start >= 0 else None


def answer_in_line(line: str) -> str | None:
    """What an answer marker's line compares: the answer in it, without the prose around it.

      1. Minerva's sentence, "The final answer is $X$" (or \\(X\\), \\[X\\]): X.
      2. Prose with exactly one number, where the number is the answer ("The largest $n$
         is 34." -> "34", "There are 12 apples." -> "12"): prose is a word of two letters
         or more outside the math spans, no math span holds a digit, and no formula
         character (= ^ _ \\ { } + * / < > |) stands outside them.
      3. Else the line, stripped, with one trailing "." removed.
    None if nothing is left. A line that is a formula ("x = 3", "\\frac{1}{2} cm") stays
    whole: math-verify reads it (x = 3 is 3 there).
    """
    minerva = _MINERVA_RE.search(line)
    if minerva:
        return minerva.group(1).strip() or None
    number = _prose_number(line)
    if number is not None:
        return number
    ans = line.strip()
    if ans.endswith("."):
        ans = ans[:-1].rstrip()
    return ans or None


# --- helpers of SECTION 1 --------------------------------------------------------------

def _box_at(text: str, start: int) -> tuple[str | None, int]:
    """(content, end) of the box whose "\\boxed" starts at `start`: end is the index after its
    closing brace; (None, len(text)) if it is malformed (no "{", unbalanced, or longer than
    MAX_BOXED_CHARS: a malformed box runs to the end of the text)."""
    i = start + len("\\boxed")
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None, len(text)
    depth, begin = 0, i + 1
    for j in range(i, min(len(text), begin + MAX_BOXED_CHARS + 1)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[begin:j].strip() or None, j + 1
    return None, len(text)                   # unterminated, or longer than the bound


def _boxed_answer_and_end(text: str) -> tuple[str | None, int]:
    """(boxed_answer(text), the end of the last box), walking back from the last box while
    the gap to the one before it is a separator (_joins)."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None, len(text)
    last, end = _box_at(text, start)
    if last is None:
        return None, end
    parts = [last]
    while len(parts) < MAX_JOINED_BOXES:
        before = text.rfind("\\boxed", 0, start)
        if before < 0:
            break
        content, before_end = _box_at(text, before)
        if content is None or before_end > start or not _joins(text[before_end:start]):
            break
        parts.append(content)
        start = before
    return ", ".join(reversed(parts)), end


def _joins(gap: str) -> bool:
    """True iff the text between two boxes is only a separator ("," ";" "and" "or"), with
    math delimiters, spacing and \\text{} around it and an optional "x =" after it."""
    return _BOX_JOINER_RE.fullmatch(_BOX_GAP_NOISE_RE.sub(lambda m: m.group(1) or "", gap)) is not None


def _prose_number(line: str) -> str | None:
    """The one number of a line of prose (answer_in_line's rule 2), or None."""
    spans = _MATH_SPAN_RE.findall(line)
    if any(c.isdigit() for span in spans for c in span):
        return None
    outside = _MATH_SPAN_RE.sub(" ", line)
    if _FORMULA_CHARS_RE.search(outside) or not _WORD_RE.search(outside):
        return None
    numbers = _NUMBER_RE.findall(outside)
    return numbers[0] if len(numbers) == 1 else None


# ---------------------------------------------------------------------------------------
# SECTION 2. Mathematical equality: the cheap exact steps here, the symbolic one brought by the task
# ---------------------------------------------------------------------------------------
#
# math-verify bounds its own work with signal.alarm. That has two problems for an RL
# loop: (a) signals only work in the main thread, so math-verify raises (or, with the
# timeout disabled, may hang) when scoring runs in a worker thread; (b) an alarm cannot
# interrupt a long computation inside C code (a huge integer power), so the "timeout"
# may never fire. The only bound that always works is to run the check in another
# process and kill it. And math-verify hands parts of the answer to sympy, whose parser
# can evaluate Python: model text must not reach it with the trainer's rights. So the
# comparison runs in tasks/sandbox.py: a warm worker process per core imports
# math-verify once, and forks a locked-down child per comparison, which it kills at the
# timeout (the sandbox's header lists what that child can and cannot do).

MAX_ANSWER_CHARS = 1000      # longer answers are never credited (see math_equal): the answer compared, not its line
MAX_BRACE_DEPTH = 32         # deeper {...} nesting is never credited (no real answer has it)

_INT_RE = re.compile(r"-?[0-9]+")
# Full-width forms U+FF01..U+FF5E ("４２", "＋") -> ASCII. Not NFKC: NFKC also maps
# "x²" to "x2" and "½" to "1⁄2", which changes what the answer means.
_FULLWIDTH = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)}


def math_equal(pred, ref, timeout: float = 2.0, symbolic: Callable[[str, str, float], bool] | None = None) -> bool:
    """True iff the answer string pred is mathematically equal to the reference ref.

    Steps, cheapest first (each returns early):
      1. non-str or empty (after stripping) -> False.
      2. full-width characters mapped to ASCII; identical strings -> True.
      3. longer than MAX_ANSWER_CHARS, or braces nested deeper than MAX_BRACE_DEPTH
         -> False (a policy: a 100000-digit "answer" is not credited even if it parses).
         The cap is on the strings compared, pred as extract_answer reduced it (the X of
         "The final answer is $X$. I hope it is correct. Note: ..."), not on its line.
      4. both plain integers ("-?[0-9]+") -> integer comparison ("0432" == "432").
      5. else symbolic(pred, ref, timeout): the comparison that needs a parser, brought by
         the task that needs it (tasks/math_datasets.py: math-verify on "$pred$" vs gold
         "$ref$" in a sandboxed child process, tasks/sandbox.py, within `timeout` seconds
         of wall time; a timeout, a crash or a parse failure -> False). None: False, so
         this file stays pure, parsing and executing nothing.
    Cost: ~5 us on the integer path, tens of ms per math-verify call, `timeout` for a hang.
    math-verify's conventions ("1,234" == "1234", "2,3" == "3,2", ...): docs/math.md §10.
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
    return symbolic is not None and symbolic(pred, ref, timeout) is True


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

def score_math(response, reference: str, timeout: float = 2.0,
               symbolic: Callable[[str, str, float], bool] | None = None) -> dict:
    """Score a free-text math response against a bare reference answer ("42", "\\frac12").

    Returns {"format": f, "correct": c, "reward": c}:
      f = 1.0 iff extract_answer found an answer (boxed, "####" or "Answer:"),
      c = 1.0 iff f and math_equal(answer, reference, timeout, symbolic).
    reward == correct (module header: format is logged, never rewarded).
    reference is the answer itself, not a solution; tasks/math_datasets.py extracts it once.
    """
    if not isinstance(reference, str):
        raise ValueError(f"score_math needs a str reference, got {reference!r}")
    pred = extract_answer(response)
    fmt = 1.0 if pred is not None else 0.0
    correct = 1.0 if pred is not None and math_equal(pred, reference, timeout, symbolic) else 0.0
    return {"format": fmt, "correct": correct, "reward": correct}


# Exact format of an addition response (tasks/addition.addition_response): column lines
# "x+y+c=ds", then "A:<digits>", then at most one newline. Tokenizers decode without
# the EOS token, so nothing follows.
_ADDITION_FORMAT_RE = re.compile(r"(?:[0-9]\+[0-9]\+[01]=[0-9]{2}\n)+A:[0-9]+\n?")
_COLUMN_RE = re.compile(r"([0-9])\+([0-9])\+([01])=([0-9])([0-9])")
_PROMPT_RE = re.compile(r"([0-9]+)\+([0-9]+)\n?")
_CANONICAL_RE = re.compile(r"0|[1-9][0-9]*")


def check_addition(response, answer: str, prompt: str | None = None) -> dict:
    """Exact checker for the synthetic addition task (tasks/addition.py).

    Returns {"format", "correct", "scratchpad_ok", "reward"} with values in {0.0, 1.0}:
      format         the whole response is (r"[0-9]\\+[0-9]\\+[01]=[0-9]{2}\\n")+ r"A:[0-9]+"
                     r"\\n"? and nothing else (no text around, no spaces).
      correct        the line after the LAST "A:" is the canonical decimal string of the
                     reference: "A:432" right; "A:0432", "A: 432", "A:432foo" wrong.
                     Independent of format: "junk\\nA:432\\nmore" is correct (c=1, f=0).
      scratchpad_ok  format holds and the columns are consistent: x+y+c == 10d+s per line,
                     first carry-in 0, carries chained, the answer spelled by the columns;
                     with prompt "a+b\\n", the columns are a's and b's digits.
      reward         = correct.
    Why strict, and what scratchpad_ok catches: docs/math.md §10. answer must be canonical
    (ValueError otherwise); a None or non-str response scores all zeros.
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


def score(responses: list, answers: list[str], task, prompts: list[str] | None = None,
          timeout: float = 2.0) -> list[dict]:
    """Score a batch with the task's checker: one dict per response, in input order.

    task: a tasks.Task (tasks.get(name) gives it); its `check` is check_addition,
    score_math, countdown's or reasoning-gym's. responses, answers and prompts (if
    given) must have equal lengths (ValueError with both lengths). A checker that reads
    the prompt (countdown: the numbers are in it) refuses prompts=None. A sandboxed
    checker (math-verify, reasoning-gym's scorers) gets `timeout` seconds per answer,
    and the batch runs on task.workers threads, each waiting on its own sandbox worker
    process, so the pool is used in parallel.
    """
    if len(responses) != len(answers):
        raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
    if prompts is not None and len(prompts) != len(responses):
        raise ValueError(f"score: {len(responses)} responses but {len(prompts)} prompts")
    if prompts is None and task.needs_prompt:
        raise ValueError(f"score: the {task.name} task needs the prompts (they hold the problem)")
    prompts = prompts if prompts is not None else [None] * len(responses)
    if not task.sandboxed:
        return [task.check(r, a, p) for r, a, p in zip(responses, answers, prompts)]
    for a in answers:                         # fail before starting any work
        if not isinstance(a, str):
            raise ValueError(f"score: answers must be str, got {a!r}")
    one = lambda rap: task.check(*rap, timeout=timeout)
    if len(responses) <= 1:
        return [one(rap) for rap in zip(responses, answers, prompts)]
    with ThreadPoolExecutor(max_workers=task.workers) as ex:
        return list(ex.map(one, zip(responses, answers, prompts)))


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
# SECTION 4. From rewards to a model's score: the unbiased pass@k (Chen et al. 2021)
# ---------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of one prompt with c correct (Chen et al. 2021, the Codex paper).

    The probability that at least one of k samples drawn without replacement from the n is
    correct:

        pass@k = 1 - C(n - c, k) / C(n, k)
               = 1 - prod_{i = n-c+1}^{n} (1 - k / i)        (the numerically stable form)

    The product never forms a huge binomial coefficient (C(1000, 500) overflows a float).
    It is exactly 1 when n - c < k (every k-subset holds a success). Why not "best of k
    random draws" or "max over n": both are biased estimates of pass@k (docs/math.md §7,
    §9). The evaluation averages it over prompts; `passk` and `pkpo` (advantages.py) train
    on the same quantity. Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod
