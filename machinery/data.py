"""Data: the embedded synthetic task, and {prompt, answer} rows from JSONL files.

SECTION 1 (below) is the synthetic task the CPU default trains on: multi-digit addition
with the column carries written out. It exists to give a tiny model a *verifiable* task
whose responses mix two kinds of tokens, exactly the split the Cancellation Hypothesis
paper cares about:

  prompt    "347+85\n"
  response  "7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n"

- template / format tokens  "+", "=", "\n", "A", ":"  appear in every response at the same
  positions, correct or not: their updates should cancel inside a group;
- reasoning tokens          the digits, which differ between right and wrong responses:
  they should receive the credit.

Column k (least significant first) is written "x+y+c=ds": the two operand digits x and y
(the shorter operand is zero-padded), the carry-in c (0 or 1), and the two-digit column
sum ds (d is the carry-out, s the result digit). The answer line "A:<int>" holds the sum
with no leading zeros.

SECTION 2 reads and writes {prompt, answer} rows as JSON Lines (one JSON object per
line), with errors that name the file and the 1-based line.

SECTION 3 converts the two standard math benchmarks into the same rows:
- GSM8K (Cobbe et al. 2021, hub "openai/gsm8k"): {"question", "answer": "...#### 42"};
- MATH (Hendrycks et al. 2021): {"problem", "solution": "...\\boxed{42}..."}, or an
  explicit "answer" column as in MATH-500.
Prompts are raw text ending in an instruction to box the final answer (PROMPT_TEMPLATE);
a chat template, if the model needs one, is applied by the model code, not here.

SECTION 4 is the single entry point train.py uses: load_task(name_or_path, split, ...)
-> (rows, task), where task names the verifier ("addition" or "math", see verify.py).
Held-out addition problems are disjoint from training ones by construction.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import zlib

from machinery import countdown


# ---------------------------------------------------------------------------------------
# SECTION 1. The synthetic addition task (exact format; verify.check_addition parses it)
# ---------------------------------------------------------------------------------------

def addition_response(a: int, b: int, digit_noise: float = 0.0, rng: random.Random | None = None) -> str:
    """The reference response (scratchpad + answer line) for a + b.

    Example: addition_response(347, 85) ==
        "7+5+0=12\\n4+8+1=13\\n3+0+1=04\\nA:432\\n"
    The number of columns is the digit count of the longer operand; the final carry, if
    any, shows only in the last column's "d" and in the answer.

    digit_noise > 0 gives a NOISY TEACHER, for the embedded model's warm-up only: each
    column's result digit s is, with that probability (draws from rng), replaced by one
    of the 9 other digits, uniformly. The carry d stays right (the next column's c is
    computed from the true sum), and the answer line is read off the written digits, as
    a model that copies its scratchpad would: 347+85 with the middle digit replaced by 7
    gives "...4+8+1=17\\n...A:472". A model trained on such targets to convergence is
    unsure at exactly the tokens that decide the reward (tinymodel.py says why).
    """
    if a < 0 or b < 0:
        raise ValueError(f"addition operands must be non-negative, got a={a}, b={b}")
    sa, sb = str(a), str(b)
    n = max(len(sa), len(sb))
    sa, sb = sa.zfill(n), sb.zfill(n)
    lines, written, carry = [], [], 0
    for k in range(n - 1, -1, -1):          # least significant column first
        x, y = int(sa[k]), int(sb[k])
        s = x + y + carry
        digit = s % 10
        if digit_noise and rng.random() < digit_noise:
            digit = (digit + rng.randint(1, 9)) % 10
        lines.append(f"{x}+{y}+{carry}={s // 10}{digit}\n")
        written.append(digit)
        carry = s // 10
    answer = carry * 10 ** n + sum(d * 10 ** k for k, d in enumerate(written))   # == a + b without noise
    return "".join(lines) + f"A:{answer}\n"


def addition_prompt(a: int, b: int) -> str:
    """The prompt for a + b: "347+85\\n" (operands as written, no padding)."""
    return f"{a}+{b}\n"


def make_addition_rows(n: int, digits: int = 3, seed: int = 0) -> list[dict]:
    """n random addition problems with operands of 1..digits digits.

    Each row: {"prompt": "347+85\\n", "answer": "432", "target": reference response}.
    "target" is the supervised warm-up's label; RL uses only prompt and answer.
    Operand lengths are drawn uniformly (then the value uniformly among numbers of that
    length) so short problems are not drowned out by long ones.
    Deterministic in (n, digits, seed).
    """
    if n < 0 or digits < 1:
        raise ValueError(f"make_addition_rows needs n >= 0 and digits >= 1, got n={n}, digits={digits}")
    rng = random.Random(seed)

    def operand() -> int:
        length = rng.randint(1, digits)
        lo = 0 if length == 1 else 10 ** (length - 1)
        return rng.randint(lo, 10 ** length - 1)

    rows = []
    for _ in range(n):
        a, b = operand(), operand()
        rows.append({"prompt": addition_prompt(a, b), "answer": str(a + b),
                     "target": addition_response(a, b)})
    return rows


def template_token_mask(task: str, tokenizer, response_ids, response_mask):
    """Which response tokens are template (format) tokens: [B, T] bool, or None.

    The Cancellation Hypothesis paper's "where do updates go" diagnostic
    (diagnostics.where_updates_go) splits the change in log-prob between template
    tokens, which right and wrong rollouts share, and reasoning tokens, which decide
    the reward. Only the task knows which is which, so the rule lives here:

    task "addition" (this section's format, "7+5+0=12\\nA:12\\n"):
      reasoning  a token whose text contains a digit: the operand, carry, column-sum
                 and answer digits;
      template   every other real token: "+", "=", "\\n", "A", ":", the EOS token
                 (the choice to stop after the answer line is part of the format; it
                 sits at the same place in every well-formed response), and any stray
                 character (a warmed-up model almost never emits one).
      A token that mixes digits and format characters ("=1", possible with a BPE
      tokenizer, never with the embedded one-character-per-token tokenizer) counts
      as reasoning: it carries a digit the answer depends on.
      The split is by token TYPE, not by decision: "\\n" versus "A" after the last
      column, or EOS, can decide the reward too; they are still the format's tokens.
    task "countdown" (machinery/countdown.py, "now 14+13=27\\n...A: 2+(14+13)\\n"):
      reasoning  a token made only of digits and + - * / ( ) (countdown.is_reasoning_text):
                 the numbers, operations and parentheses the answer depends on;
      template   every other real token: the phrases ("now ", " is ", "answer: ", ...:
                 one token each), "=", "\\n" and EOS. The phrases are drawn at random in
                 the warm-up data, so these are the template tokens with real entropy.
    task "math" (GSM8K, MATH, .jsonl files) and "reasoning_gym:NAME": None. Free text has no fixed template,
      and any rule (say, "digits are reasoning") would give a silently wrong split, so
      the diagnostic is skipped for it.

    response_ids: [B, T] long; response_mask: [B, T] (1 on real tokens, incl. EOS).
    Returns a [B, T] bool tensor, False on padding (the reasoning tokens are then
    response_mask & ~template). Each distinct id is decoded once
    (tokenizer.decode([id], skip_special_tokens=True): special tokens decode to "").
    Unknown task: ValueError naming it.
    Example: the tokens of "7+5+0=12\\nA:12\\n" + EOS are template at
    + + = \\n A : \\n EOS, reasoning at 7 5 0 1 2 1 2.
    """
    import torch

    if task == "math" or task.startswith("reasoning_gym:"):
        return None
    if task not in ("addition", "countdown"):
        raise ValueError(f"template_token_mask: unknown task {task!r}; expected 'addition', 'countdown' or 'math'")
    ids = torch.as_tensor(response_ids)
    distinct, where = torch.unique(ids, return_inverse=True)
    texts = [tokenizer.decode([i], skip_special_tokens=True) for i in distinct.tolist()]
    if task == "countdown":
        template_kind = [not countdown.is_reasoning_text(text) for text in texts]
    else:   # ASCII digits only: str.isdigit() would also count "²" or "٣"
        template_kind = [not any(c in "0123456789" for c in text) for text in texts]
    template_kind = torch.tensor(template_kind, dtype=torch.bool)
    is_template = template_kind[where]
    return is_template & (torch.as_tensor(response_mask) != 0)


# ---------------------------------------------------------------------------------------
# SECTION 2. {prompt, answer} rows in JSON Lines files
# ---------------------------------------------------------------------------------------

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
# SECTION 3. GSM8K and MATH
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
    and several mirrors ship it), else the content of the LAST \\boxed{...} of the
    solution, read by verify.last_boxed, the same rule that reads the model's answer.
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
    from verify import last_boxed          # the verifier's own extraction rule

    problem = rec.get("problem")
    if not (isinstance(problem, str) and problem.strip()):
        raise ValueError(f"{where}: MATH record needs a non-empty 'problem', got {problem!r}")
    answer = rec.get("answer")
    if not (isinstance(answer, str) and answer.strip()):
        solution = rec.get("solution")
        answer = last_boxed(solution) if isinstance(solution, str) else None
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
# SECTION 4. One entry point: load_task
# ---------------------------------------------------------------------------------------

SPLITS = ("train", "test")
HELD_OUT_BUCKETS = 10          # 1 in 10 addition problems (by hash) is held out
EVAL_SEED_OFFSET = 1_000_003   # the test split draws from a different random stream
DEFAULT_ADDITION_N = {"train": 2000, "test": 200}
DEFAULT_COUNTDOWN_N = {"train": 20000, "test": 100}   # also reasoning-gym's: generated, so cheap
REASONING_GYM = "reasoning_gym:"                       # --data reasoning_gym:NAME
COUNTDOWN_INSTRUCT = "countdown_instruct"              # countdown's problems, worded for a chat model
SOURCES = ("'addition', 'countdown', 'countdown_instruct', 'gsm8k', 'math', 'gsm8k:FILE.jsonl', 'math:FILE.jsonl', "
           "'reasoning_gym:NAME'")


def load_task(name_or_path: str, split: str = "train", n: int | None = None,
              seed: int = 0, digits: int = 3) -> tuple[list[dict], str]:
    """Rows for one task and split, and the verifier's task name: (rows, task).

    name_or_path:
      "addition"     synthetic rows (SECTION 1), task "addition"; n defaults to
                     DEFAULT_ADDITION_N[split]; see addition_split_rows for how train
                     and test are kept apart.
      "countdown"    machinery/countdown.py's rows, task "countdown": the bare prompt
                     "13 14 2 -> 29" the embedded model is warmed up on.
      "countdown_instruct"  the same problems, each prompt worded for a chat model
                     (countdown.instruct_prompt: the rules and the answer line the
                     checker reads), task "countdown".
      "gsm8k"        load_gsm8k(GSM8K_HUB, split), task "math" (scored by math_equal).
      "math"         load_math(MATH_HUB, split), task "math".
      "gsm8k:FILE.jsonl", "math:FILE.jsonl"   a local copy in the hub's format (records
                     {"question", "answer": "...#### 42"}, or MATH's), the same rows as
                     from the hub without it; split is ignored, the file is the split.
      "<file>.jsonl" load_jsonl(file) ({prompt, answer} rows), task "math"; split is
                     ignored, the file is the split.
    For the non-synthetic sources, n=None keeps every row in file order; n=k keeps a
    seeded random sample of k rows (random.Random(seed).sample), and k larger than the
    data is a ValueError rather than a silently smaller set.
    Unknown names and splits outside SPLITS raise ValueError naming them.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n is not None and n < 0:
        raise ValueError(f"load_task needs n >= 0 or None, got n={n}")
    if name_or_path == "addition":
        count = DEFAULT_ADDITION_N[split] if n is None else n
        return addition_split_rows(count, split, digits=digits, seed=seed), "addition"
    if name_or_path in ("countdown", COUNTDOWN_INSTRUCT):
        count = DEFAULT_COUNTDOWN_N[split] if n is None else n
        rows = countdown.make_rows(count, split, seed=seed)
        if name_or_path == COUNTDOWN_INSTRUCT:
            rows = [{**r, "prompt": countdown.instruct_prompt(r["prompt"])} for r in rows]
        return rows, "countdown"
    if str(name_or_path).startswith(REASONING_GYM):
        name = name_or_path[len(REASONING_GYM):]
        return reasoning_gym_rows(name, split, DEFAULT_COUNTDOWN_N[split] if n is None else n, seed), name_or_path
    kind, _, local = str(name_or_path).partition(":")
    if name_or_path == "gsm8k":
        rows = load_gsm8k(GSM8K_HUB, split)
    elif name_or_path == "math":
        rows = load_math(MATH_HUB, split)
    elif kind in ("gsm8k", "math") and local.endswith(".jsonl"):
        rows = (load_gsm8k if kind == "gsm8k" else load_math)(local, split)
    elif str(name_or_path).endswith(".jsonl"):
        rows = load_jsonl(name_or_path)
    else:
        raise ValueError(f"unknown task {name_or_path!r}; expected {SOURCES} or a path ending in .jsonl")
    if n is not None:
        if n > len(rows):
            raise ValueError(f"asked for n={n} rows but {name_or_path!r} ({split}) has {len(rows)}")
        rows = random.Random(seed).sample(rows, n)
    return rows, "math"


def reasoning_gym_rows(name: str, split: str, n: int, seed: int = 0) -> list[dict]:
    """n rows of reasoning-gym's dataset `name`: {"prompt": its question, "answer": the entry as JSON}.

    reasoning-gym (the field's library of procedural reasoning tasks) generates each
    dataset from a seed and scores an answer with the dataset's own score_answer(answer,
    entry), which needs the whole entry: so the row's answer carries it, and
    verify.score hands it to the scorer in a worker process (some scorers eval the
    model's text: countdown's runs sympy's parse_expr). The test split is the dataset
    drawn with another seed: disjoint from training in practice for large problem
    spaces, not by construction (a small space can repeat a problem). Some generators
    are slow (countdown's: tens of ms an entry, minutes for the default 20000 rows), so
    a progress bar appears once generation has taken more than two seconds.
    """
    import reasoning_gym
    from tqdm import tqdm

    offset = 0 if split == "train" else 1_000_003
    dataset = reasoning_gym.create_dataset(name, size=n, seed=seed + offset)
    entries = tqdm(dataset, total=n, desc=f"reasoning-gym {name} ({split} rows)", unit="row", delay=2,
                   dynamic_ncols=True)
    return [{"prompt": entry["question"] + "\n", "answer": json.dumps(entry, default=str)} for entry in entries]


def check_source(name_or_path: str, flag: str = "--data") -> None:
    """load_task's source at the door, before anything is loaded (ValueError, one line).

    A .jsonl path must be a file (not a directory, not missing); "gsm8k" and "math" need
    the `datasets` package and a hub that answers (config.hub_problem: one quick request
    instead of datasets' minute of retries when there is no network). Reading the rows
    is still load_task's job, and its errors name file and line. flag: the option the
    source came from (--data, --eval_data), for the message.
    """
    if name_or_path in ("addition", "countdown", COUNTDOWN_INSTRUCT):
        return
    if str(name_or_path).startswith(REASONING_GYM):
        name = name_or_path[len(REASONING_GYM):]
        try:
            import reasoning_gym
        except ImportError:
            raise ValueError(f"{flag} {name_or_path} needs reasoning-gym: pip install -r "
                             "requirements/reasoning-gym.txt") from None
        if name not in reasoning_gym.factory.DATASETS:
            raise ValueError(f"{flag} {name_or_path}: reasoning-gym has no dataset {name!r} (e.g. countdown, "
                             "basic_arithmetic, chain_sum)")
        return
    if name_or_path in ("gsm8k", "math"):
        import importlib.util

        from machinery import config
        if importlib.util.find_spec("datasets") is None:
            raise ValueError(f"{flag} {name_or_path} needs the `datasets` package: {DATASETS_INSTALL} "
                             "(or pass a local .jsonl file in the hub's format)")
        hub = GSM8K_HUB if name_or_path == "gsm8k" else MATH_HUB
        if problem := config.hub_problem(hub, "dataset"):
            raise ValueError(f"{flag} {name_or_path} ({hub}): {problem}")
        return
    kind, _, local = str(name_or_path).partition(":")
    if kind in ("gsm8k", "math"):
        if not (local.endswith(".jsonl") and os.path.isfile(local)):
            raise ValueError(f"{flag} {name_or_path!r}: expected {kind}:FILE.jsonl with an existing file in the "
                             "hub's format")
        return
    if os.path.isdir(name_or_path):
        raise ValueError(f"{flag} {name_or_path!r} is a directory; expected {SOURCES} or a .jsonl file")
    if not str(name_or_path).endswith(".jsonl"):
        raise ValueError(f"unknown task {name_or_path!r}; expected {SOURCES} or a path ending in .jsonl")
    if not os.path.isfile(name_or_path):
        raise ValueError(f"{flag} {name_or_path!r}: no such file")


def addition_split_rows(n: int, split: str, digits: int = 3, seed: int = 0) -> list[dict]:
    """n addition rows of one split; train and test never share a problem.

    Disjointness is by construction, not by filtering against one particular training
    set: a problem a+b is held out iff crc32("min+max") % HELD_OUT_BUCKETS == 0, so
    every test problem differs from every train problem for ANY n, seed and digits
    (and a+b, b+a land on the same side, so the test set holds no commuted copies of
    training problems). The test split also uses seed + EVAL_SEED_OFFSET, so it is not
    a re-filtered copy of the training stream. Rows are make_addition_rows' rows in its
    order with the other side's problems skipped; make_addition_rows(k)[:m] equals
    make_addition_rows(m) for the same seed, so drawing more and filtering is
    deterministic in (n, split, digits, seed). Duplicates within a split are kept
    (the problem space for digits=1 has only 100 ordered pairs).

    Cost of this choice: about 1/HELD_OUT_BUCKETS of the problem space is never
    trained on, which is the point. ValueError if the split's side of the space is
    empty (this does not happen for digits >= 1 with the constants above, but the
    loop is bounded anyway).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n < 0:
        raise ValueError(f"addition_split_rows needs n >= 0, got n={n}")
    held_out = split == "test"
    rows_seed = seed + EVAL_SEED_OFFSET if held_out else seed
    k = max(64, 2 * n * (HELD_OUT_BUCKETS if held_out else 1))
    while True:
        pool = make_addition_rows(k, digits=digits, seed=rows_seed)
        kept = [r for r in pool if is_held_out(r["prompt"]) == held_out]
        if len(kept) >= n:
            return kept[:n]
        if k > 1000 * (n + 64):
            raise ValueError(f"could not draw {n} {split} addition problems with digits={digits}")
        k *= 2


def is_held_out(prompt: str) -> bool:
    """True iff the addition problem in prompt "a+b\\n" belongs to the test side.

    crc32 (not Python's hash(), which is salted per process) of the operands in
    sorted order, so the partition is the same on every machine and run.
    """
    a, b = (int(x) for x in prompt.strip().split("+"))
    key = f"{min(a, b)}+{max(a, b)}"
    return zlib.crc32(key.encode()) % HELD_OUT_BUCKETS == 0
