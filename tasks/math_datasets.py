"""Free-text math: GSM8K, MATH and {prompt, answer} JSONL files, scored by math_equal.

Three sources of the same rows, {"prompt", "answer"}, all scored by verify.score_math
(the answer is extracted from \\boxed{...}, "####" or "Answer:" and compared
symbolically, in the sandbox):
- GSM8K (Cobbe et al. 2021, hub "openai/gsm8k"): {"question", "answer": "...#### 42"};
- MATH (Hendrycks et al. 2021): {"problem", "solution": "...\\boxed{42}..."}, or an
  explicit "answer" column as in MATH-500;
- any JSON Lines file of {prompt, answer} rows (errors name the file and the 1-based line).
Prompts are raw text ending in an instruction to box the final answer (PROMPT_TEMPLATE);
a chat template, if the model needs one, is applied by the model code, not here.
Free text has no fixed template, so the task has no template-token split. Held out: the
benchmark's own test split; for a copy in the hub's format ("gsm8k:FILE.jsonl") the file
is its split; a plain {prompt, answer} file is split by the shared rule (task.is_held_out,
1 prompt in 10), unless train.py evaluates on another file (--eval_data, read whole).
"""

from __future__ import annotations

import json
import os
import random
import tempfile

import verify
from tasks import sandbox
from tasks.task import HELD_OUT_BUCKETS, Task, is_held_out

# ---------------------------------------------------------------------------------------
# SECTION 1. {prompt, answer} rows in JSON Lines files
# ---------------------------------------------------------------------------------------

def symbolic_equal(pred: str, ref: str, timeout: float) -> bool:
    """math-verify's comparison of "$pred$" with gold "$ref$", in a locked-down child process
    (tasks/sandbox.py) killed at `timeout` seconds: the step of verify.math_equal that
    hands model text to a parser (sympy's can evaluate Python), so it never runs in the
    trainer's process. Why a process and not math-verify's own signal timeout:
    verify.py, SECTION 2. Thread-safe; calls beyond sandbox.POOL_SIZE concurrent ones wait."""
    return sandbox.run_scorer("math", [pred, ref], timeout) is True


def math_equal(pred, ref, timeout: float = 2.0) -> bool:
    """verify.math_equal with its symbolic step (symbolic_equal): what free-text math is scored by."""
    return verify.math_equal(pred, ref, timeout, symbolic=symbolic_equal)


def score_math(response, reference: str, timeout: float = 2.0) -> dict:
    """verify.score_math with the sandboxed symbolic step: {"format", "correct", "reward"}."""
    return verify.score_math(response, reference, timeout, symbolic=symbolic_equal)


def load_jsonl(path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[dict]:
    """Rows {"prompt": str, "answer": str} from a JSON Lines file.

    Each non-blank line must be a JSON object whose prompt_key and answer_key values
    are strings, the prompt non-empty and the answer non-empty after stripping (an
    empty reference can never be matched, so it is a data error, not a hard problem).
    Other keys are dropped. Blank lines (e.g. a trailing newline) are skipped. The
    first bad line raises ValueError("<path>:<line>: <what is wrong>") with the 1-based
    line number, so the row can be found with an editor's go-to-line.
    The answer is kept verbatim: it is compared by verify.math_equal, which
    normalises ("1,234" == "1234"); no numeric type is accepted (42 instead of "42")
    because a silent str() would turn 0.1 into "0.1" but 1e-7 into "1e-07".
    """
    rows = []
    for lineno, rec in _read_json_lines(path):
        where = f"{path}:{lineno}"
        prompt, answer = rec.get(prompt_key), rec.get(answer_key)
        for key, value in ((prompt_key, prompt), (answer_key, answer)):
            if key not in rec:
                raise ValueError(f"{where}: missing key {key!r} (keys: {sorted(rec)})")
            if not isinstance(value, str):
                raise ValueError(f"{where}: {key!r} must be a string, got {value!r}")
            if not value.strip():
                raise ValueError(f"{where}: {key!r} is empty")
        rows.append({"prompt": prompt, "answer": answer})
    return rows


def save_jsonl(rows: list[dict], path) -> None:
    """Write rows as JSON Lines, atomically: readers see the old file or the new one.

    The rows go to a temporary file in the same directory (same filesystem, so the
    rename is atomic), which is flushed and fsync'ed and then os.replace'd over path.
    A crash mid-write leaves the previous file intact and no partial one. Non-ASCII text
    is written as UTF-8, not \\u escapes. The parent directory is created if missing.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _read_json_lines(path) -> list[tuple[int, dict]]:
    """(1-based line number, object) for each non-blank line; ValueError on bad JSON.

    Read as bytes and decoded line by line, so a line that is not UTF-8 is reported
    with its file and line like any other bad line (a text-mode read would fail inside
    the iteration, naming only a byte offset).
    """
    out = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at column "
                                 f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            except RecursionError:             # [[[[...: deeper than Python's parser recurses
                raise ValueError(f"{path}:{lineno}: JSON nested too deeply") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            out.append((lineno, rec))
    return out


# ---------------------------------------------------------------------------------------
# SECTION 2. GSM8K and MATH
# ---------------------------------------------------------------------------------------

# The instruction appended to every benchmark problem. It asks for \boxed{} because
# verify.extract_answer gives \boxed the highest precedence, and because it is the
# wording of the Qwen2.5-Math prompt that many open RL recipes (SimpleRL-Zoo,
# Dr. GRPO's code) train with, so pretrained math models already follow it.
PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

GSM8K_HUB = "openai/gsm8k"                      # config "main"
# Where `datasets` comes from: the CPU environment gets it with TRL's file; gpu.txt has it too
# (but also vLLM, which a CPU user does not want for this).
DATASETS_INSTALL = ("pip install datasets==5.2.0 (it is in requirements/trl.txt; on a GPU machine "
                    "requirements/gpu.txt has it)")
MATH_HUB = "DigitalLearningGmbH/MATH-lighteval"  # one public mirror of Hendrycks MATH
                                                 # (7500 train / 5000 test); not tested


def format_prompt(problem: str) -> str:
    """PROMPT_TEMPLATE applied to a problem statement (stripped of outer whitespace)."""
    return PROMPT_TEMPLATE.format(problem=problem.strip())


def gsm8k_rows(records) -> list[dict]:
    """GSM8K records {"question", "answer": "<worked solution>\\n#### 42"} -> rows.

    The reference is the text after the LAST "####", stripped, with thousands
    separators removed ("#### 1,234" -> "1234"): every GSM8K answer is a number, and a
    canonical reference makes logs and exact-match baselines cleaner (math_equal would
    accept either). The worked solution is dropped: RL needs only the final answer.
    A record without "question"/"####" raises ValueError naming the record (1-based).
    """
    return [_gsm8k_row(rec, f"record {i}") for i, rec in enumerate(records, start=1)]


def math_rows(records) -> list[dict]:
    """Hendrycks MATH records {"problem", "solution", ["answer"]} -> rows.

    The reference is the record's "answer" if it has a non-empty string one (MATH-500
    and several mirrors ship it), else the solution's boxed answer, read by
    verify.boxed_answer, the rule that reads the model's: the LAST \\boxed{...}, or the
    boxes joined to it by a separator as one set ("\\(x = \\boxed{1}\\) and \\(x =
    \\boxed{-2}\\)" -> "1, -2", so that only a complete answer matches it).
    A record with neither raises ValueError naming the record (1-based).
    """
    return [_math_row(rec, f"record {i}") for i, rec in enumerate(records, start=1)]


def load_gsm8k(source: str = GSM8K_HUB, split: str = "train") -> list[dict]:
    """GSM8K rows from a local .jsonl file in the hub's format, or from the hub.

    A source ending in ".jsonl" is read locally (split is ignored: the file is the
    split) and errors name the file and line. Anything else is a hub dataset name,
    loaded with datasets.load_dataset (config "main" for openai/gsm8k); this path needs
    the optional `datasets` package and the network, and is not exercised by tests.
    """
    if str(source).endswith(".jsonl"):
        return [_gsm8k_row(rec, f"{source}:{ln}") for ln, rec in _read_json_lines(source)]
    config = "main" if source == GSM8K_HUB else None
    return gsm8k_rows(_hub_records(source, split, config))


def load_math(source: str = MATH_HUB, split: str = "train") -> list[dict]:
    """MATH rows from a local .jsonl file in the hub's format, or from the hub.

    Same local/hub rule as load_gsm8k; records are converted by math_rows' rule.
    """
    if str(source).endswith(".jsonl"):
        return [_math_row(rec, f"{source}:{ln}") for ln, rec in _read_json_lines(source)]
    return math_rows(_hub_records(source, split, None))


def _gsm8k_row(rec, where: str) -> dict:
    question, solution = rec.get("question"), rec.get("answer")
    if not (isinstance(question, str) and question.strip()):
        raise ValueError(f"{where}: GSM8K record needs a non-empty 'question', got {question!r}")
    if not (isinstance(solution, str) and "####" in solution):
        raise ValueError(f"{where}: GSM8K 'answer' must contain '#### <number>', got {solution!r}")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise ValueError(f"{where}: GSM8K answer after '####' is empty")
    return {"prompt": format_prompt(question), "answer": answer}


def _math_row(rec, where: str) -> dict:
    problem = rec.get("problem")
    if not (isinstance(problem, str) and problem.strip()):
        raise ValueError(f"{where}: MATH record needs a non-empty 'problem', got {problem!r}")
    answer = rec.get("answer")
    if not (isinstance(answer, str) and answer.strip()):
        solution = rec.get("solution")
        answer = verify.boxed_answer(solution) if isinstance(solution, str) else None   # the verifier's own rule
        if answer is None:
            raise ValueError(f"{where}: MATH record has no 'answer' and no \\boxed{{...}} "
                             f"in its 'solution' ({str(solution)[:80]!r})")
    return {"prompt": format_prompt(problem), "answer": answer.strip()}


def _hub_records(name: str, split: str, config: str | None):
    """Records of a hub dataset split, via the optional `datasets` package."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f"loading {name!r} from the Hugging Face hub needs the `datasets` package: "
                          f"{DATASETS_INSTALL} (or pass a local .jsonl file in the hub's format)") from None
    try:
        return datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as e:         # ConnectionError is an OSError; a missing split a ValueError
        raise ValueError(f"could not load {name!r} ({split}) from the Hugging Face hub: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# ---------------------------------------------------------------------------------------
# SECTION 3. The task: one per source
# ---------------------------------------------------------------------------------------

def load(source: str, split: str = "train") -> list[dict]:
    """All rows of a source: "gsm8k", "math" (the hub), "gsm8k:FILE.jsonl", "math:FILE.jsonl"
    (a local copy in the hub's format: the file is the split) or "FILE.jsonl" ({prompt, answer})."""
    kind, _, local = str(source).partition(":")
    if source == "gsm8k":
        return load_gsm8k(GSM8K_HUB, split)
    if source == "math":
        return load_math(MATH_HUB, split)
    if kind in ("gsm8k", "math") and local.endswith(".jsonl"):
        return (load_gsm8k if kind == "gsm8k" else load_math)(local, split)
    return load_jsonl(source)


HUBS = {"gsm8k": GSM8K_HUB, "math": MATH_HUB}
"""The hub datasets a --data name reads (the trainer's door checks the hub answers)."""


def task(source: str) -> Task:
    """The task of one source. n rows (rows(n, ...)): None keeps every row in file order;
    n = k keeps a seeded random sample of k (random.Random(seed).sample), and k larger
    than the data is a ValueError rather than a silently smaller set.

    A plain {prompt, answer} FILE.jsonl has no split of its own, so it gets the one rule
    every generated task uses (task.is_held_out: 1 prompt in 10 by the crc32 of its text):
    split "train" is the other 9 in 10, "test" the held-out tenth (at most n of them: a
    small file's tenth may be short of the task's default budget), "all" the whole file
    (train.py's --eval_data FILE). Otherwise "held-out" pass@k would be training accuracy.
    The hub's splits and a "gsm8k:FILE.jsonl" copy (the file IS the split) are read as they are.
    """
    plain_file = str(source).endswith(".jsonl") and str(source).partition(":")[0] not in ("gsm8k", "math")

    def rows(n: int | None, split: str, seed: int = 0, digits: int = 3) -> list[dict]:
        out = load(source, split)
        if plain_file and split != "all":
            out = [r for r in out if is_held_out(r["prompt"]) == (split == "test")]
            if not out:
                raise ValueError(f"{source!r} has no {'held-out' if split == 'test' else 'training'} row "
                                 f"(1 prompt in {HELD_OUT_BUCKETS} is held out, by a hash of its text): give "
                                 "--eval_data FILE to evaluate on another file")
            n = None if n is None or (split == "test" and n > len(out)) else n
        if n is None:
            return out
        if n > len(out):
            raise ValueError(f"asked for n={n} rows but {source!r} ({split}) has {len(out)}")
        return random.Random(seed).sample(out, n)
    return Task(name="math", rows=rows, check=lambda response, answer, prompt=None, timeout=2.0:
                score_math(response, answer, timeout), sandboxed=True, workers=sandbox.POOL_SIZE)


def check_source(source: str, flag: str = "--data") -> None:
    """A source at the door, before anything is loaded (ValueError, one line).

    A .jsonl path must be a file; "gsm8k" and "math" need the `datasets` package (and a hub
    that answers: the trainer's door asks it, machinery/checks.py hub_problem, one quick
    request instead of datasets' minute of retries without a network). Reading the rows
    is load's job, and its errors name file and line. flag: the option the source came
    from, for the message.
    """
    if source in ("gsm8k", "math"):
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            raise ValueError(f"{flag} {source} needs the `datasets` package: {DATASETS_INSTALL} "
                             "(or pass a local .jsonl file in the hub's format)")
        return
    kind, _, local = str(source).partition(":")
    if kind in ("gsm8k", "math"):
        if not (local.endswith(".jsonl") and os.path.isfile(local)):
            raise ValueError(f"{flag} {source!r}: expected {kind}:FILE.jsonl with an existing file in the "
                             "hub's format")
        return
    if not os.path.isfile(source):
        raise ValueError(f"{flag} {source!r}: no such file")
