"""Verifiers: how a piece of generated text becomes a reward.

Critic-free RL for reasoning (GRPO and its family, docs/math.md §1) needs no reward
model: each rollout is scored by a program that checks the final answer against a known
reference. That program, the *verifier*, is the whole reward signal, so its mistakes are
the policy's training targets: a verifier that accepts "0432" for 432, or that hangs on
"10^{10^{10^{10}}}", is a bug the policy will find. This file is three steps:

  1. extract   text -> the final answer string          (extract_answer)
  2. compare   answer string vs reference -> bool       (math_equal, check_addition)
  3. score     -> a dict of components, one is "reward" (score_math, check_addition, score)

Two tasks:
- "addition": the synthetic task of data.py SECTION 1. Its format is exact, so the
  checker is exact too: a regular expression for the format, integer comparison of a
  canonical decimal string for the answer, plus a scratchpad consistency check.
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

Safety. Model output is never passed to eval/exec/sympify. The only parser that touches
it is math-verify's (a LaTeX grammar + sympy), and that runs in a separate worker
process with a wall-clock timeout, because sympy can take unbounded time or memory on
tiny inputs (2^2^2^...^99, deeply nested braces). See SECTION 2 for why a process and
not math-verify's own signal-based timeout.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import re
import threading
from concurrent.futures import ThreadPoolExecutor


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
# SECTION 2. Symbolic equivalence with a hard wall-clock bound
# ---------------------------------------------------------------------------------------
#
# math-verify bounds its own work with signal.alarm. That has two problems for an RL
# loop: (a) signals only work in the main thread, so math-verify raises (or, with the
# timeout disabled, may hang) when scoring runs in a worker thread; (b) an alarm cannot
# interrupt a long computation inside C code (a huge integer power), so the "timeout"
# may never fire. The only bound that always works is to run the check in another
# process and kill it. Starting a process per call costs ~1 s (importing sympy), so we
# keep a small pool of persistent worker processes, each fed through a pipe, and
# replace a worker only when it times out or dies.
#
# Two ways a pool can lie, and what we do about them:
# - a worker that died between calls (the OOM killer picks the biggest process, or
#   someone kills it) answers the next request with a broken pipe. That is not the
#   answer's fault, so the worker is restarted and the comparison asked again, once;
#   a worker that dies on the retry too is taken to have been killed by this input
#   (say, sympy exhausting memory) and the answer scores False, like a hang.
# - a script without an `if __name__ == "__main__":` guard: "spawn" starts a worker by
#   re-running the main module, which calls math_equal again, inside the child, before
#   it is ready, and the child dies during start-up. Every comparison would be False.
#   A worker that dies before saying "ready" raises RuntimeError instead, naming the fix.

MAX_ANSWER_CHARS = 1000      # longer answers are never credited (see math_equal)
MAX_BRACE_DEPTH = 32         # deeper {...} nesting is never credited (no real answer has it)
POOL_SIZE = 2                # worker processes; the machine this was written on has 2 cores
STARTUP_TIMEOUT = 120.0      # seconds a new worker may take to import math-verify

_INT_RE = re.compile(r"-?[0-9]+")
# Full-width forms U+FF01..U+FF5E ("４２", "＋") -> ASCII. Not NFKC: NFKC also maps
# "x²" to "x2" and "½" to "1⁄2", which changes what the answer means.
_FULLWIDTH = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)}

_pool: queue.Queue | None = None           # holds (process, connection) or None slots
_pool_guard = threading.Lock()


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
      5. otherwise math-verify, in a worker process, with at most `timeout` seconds of
         wall time (not counting a worker's one-time start-up). A timeout or a parse
         failure -> False; a timed-out worker is killed and replaced. A worker found
         dead is restarted and the comparison asked again, once (SECTION 2's comment).
    Both strings are wrapped as "$...$" before math-verify's parse, which makes it read
    them as LaTeX; ref is passed as the gold (math-verify's verify is not symmetric:
    it simplifies assignments like "x=3" on the prediction side).

    Conventions inherited from math-verify 0.9.0, pinned in tests: "1,234" == "1234"
    (thousands separator); "\\frac{1}{2}" == "0.5"; "2\\sqrt{2}" == "\\sqrt{8}";
    "−3" (U+2212) == "-3"; "π" == "\\pi"; "10\\%" == "0.1"; "2,3" == "3,2" (read as a
    set of solutions).

    Thread-safe: callable from any thread; calls beyond POOL_SIZE concurrent ones wait
    for a free worker. Scripts that call it must guard their entry point with
    `if __name__ == "__main__":` because workers are started with "spawn" (without
    the guard a worker dies starting up, and this raises RuntimeError saying so).
    Measured cost (shared 2-core CPU): ~5 us for the integer fast path; ~30 ms per
    math-verify call on distinct LaTeX fractions (~9 ms when math-verify's parse cache
    already holds both strings); 1-3 s once per worker start-up (importing sympy); a
    hang costs `timeout` plus one worker restart.
    """
    if not (isinstance(pred, str) and isinstance(ref, str)):
        return False
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"math_equal needs timeout > 0 seconds, got {timeout!r}")
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
    return _ask_worker(pred, ref, timeout)


def shutdown_math_workers() -> None:
    """Kill the worker processes (they are daemons, so exit kills them anyway).

    Waits for busy workers to be handed back (each is bounded by its call's timeout).
    The next math_equal call starts fresh workers.
    """
    global _pool
    with _pool_guard:
        pool, _pool = _pool, None
    if pool is None:
        return
    for _ in range(POOL_SIZE):
        _stop_worker(pool.get())


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


def _ask_worker(pred: str, ref: str, timeout: float) -> bool:
    """Send (pred, ref) to a pooled worker; its answer, or False after `timeout` s.

    A worker found dead is restarted and asked again, once (the section's comment).
    """
    global _pool
    with _pool_guard:
        if _pool is None:
            _pool = queue.Queue()
            for _ in range(POOL_SIZE):
                _pool.put(None)              # empty slot: a worker is started on demand
        pool = _pool
    worker = pool.get()                       # blocks while all workers are busy
    result = False
    try:
        for attempt in range(2):
            if worker is None:
                worker = _start_worker()     # RuntimeError if it cannot start at all
            proc, conn = worker
            try:
                conn.send((pred, ref))
                if conn.poll(timeout):
                    result = bool(conn.recv())
                else:                         # hung: the only cure is to kill it
                    _stop_worker(worker)
                    worker = None
                break
            except (EOFError, OSError):       # dead: killed, or out of memory
                _stop_worker(worker)
                worker = None
    finally:
        pool.put(worker)
    return result


def _start_worker():
    """Start one worker process and wait until it has imported math-verify."""
    # "spawn", not "fork": forking a process that already runs torch / tokenizer
    # threads can deadlock the child on a lock some thread held at fork time.
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_worker_loop, args=(child_conn,), daemon=True,
                       name="math-verify-worker")
    proc.start()
    child_conn.close()
    try:
        ready = parent_conn.poll(STARTUP_TIMEOUT) and parent_conn.recv() == "ready"
    except (EOFError, OSError):               # the child closed the pipe: it died starting up
        proc.join(5)
        _stop_worker((proc, parent_conn))
        raise RuntimeError(
            f"math-verify worker exited during start-up (exit code {proc.exitcode}). Workers start with "
            "'spawn', which re-runs the main module: a script that scores math answers must guard its "
            "entry point with `if __name__ == \"__main__\":` (and math-verify must be installed)") from None
    if not ready:
        _stop_worker((proc, parent_conn))
        raise RuntimeError(f"math-verify worker did not start within {STARTUP_TIMEOUT} s")
    return proc, parent_conn


def _stop_worker(worker) -> None:
    if worker is None:
        return
    proc, conn = worker
    if proc.is_alive():
        proc.kill()
    proc.join()
    conn.close()


def _worker_loop(conn) -> None:
    """Body of a worker process: answer (pred, ref) requests until the pipe closes."""
    from math_verify import parse, verify

    # The parent enforces the time limit, so math-verify's signal timeouts are off
    # (None); silence the warning it logs about that, and its per-failure logging.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    conn.send("ready")
    while True:
        try:
            pred, ref = conn.recv()
        except (EOFError, OSError):
            return
        try:
            gold = parse(f"${ref}$", parsing_timeout=None)
            guess = parse(f"${pred}$", parsing_timeout=None)
            ok = bool(gold) and bool(guess) and verify(gold, guess, timeout_seconds=None)
        except Exception:                     # any parser/sympy failure is "not equal"
            ok = False
        conn.send(bool(ok))


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
    """Score a batch: one dict per response (check_addition or score_math).

    task: "addition" or "math" (ValueError naming anything else). responses, answers
    and prompts (if given) must have equal lengths (ValueError with both lengths).
    prompts are used by the addition checker's scratchpad test, ignored for math.
    For "math" the comparisons run on POOL_SIZE threads, each talking to its own
    worker process, so the pool is used in parallel; the order of results is the
    order of the inputs.
    """
    if task not in ("addition", "math"):
        raise ValueError(f"unknown task {task!r}; expected 'addition' or 'math'")
    if len(responses) != len(answers):
        raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
    if prompts is not None and len(prompts) != len(responses):
        raise ValueError(f"score: {len(responses)} responses but {len(prompts)} prompts")
    if task == "addition":
        ps = prompts if prompts is not None else [None] * len(responses)
        return [check_addition(r, a, p) for r, a, p in zip(responses, answers, ps)]
    for a in answers:                         # fail before starting any work
        if not isinstance(a, str):
            raise ValueError(f"score: answers must be str, got {a!r}")
    if len(responses) <= 1:
        return [score_math(r, a, timeout) for r, a in zip(responses, answers)]
    with ThreadPoolExecutor(max_workers=POOL_SIZE) as ex:
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
