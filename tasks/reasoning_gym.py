"""reasoning-gym's datasets: any of them as a task, scored by our checker where we have one.

`--data reasoning_gym:NAME` trains on any dataset of reasoning-gym (the field's library
of procedural reasoning tasks) and scores with the dataset's own score_answer(answer,
entry), which needs the whole entry: so a row's answer carries it, as JSON. Some of
those scorers evaluate the model's text as Python: countdown's and puzzle24's call
sympy's parse_expr (which calls eval), n_queens' and spiral_matrix's call eval on an
answer that is not an exact match. So:
- a dataset in OUR_CHECKERS is scored by our own checker, which evaluates nothing
  (countdown: tasks/expression.py, with the numbers and target from the entry's
  metadata); tests/engine/test_countdown.py checks that the two agree on the dataset's answers;
- every other dataset is scored by its own scorer in tasks/sandbox.py, never in the
  trainer's process (the trainer never imports reasoning_gym at all). Code an answer
  runs there cannot hurt the trainer, but it can set its own score: the sandbox's
  header says what holds.
Adding a checker of our own for another dataset is one line in OUR_CHECKERS.
"""

from __future__ import annotations

import json

from tasks import sandbox
from tasks.expression import countdown_correct
from tasks.task import EVAL_SEED_OFFSET, Task

PREFIX = "reasoning_gym:"                 # task names: "reasoning_gym:NAME"
DEFAULT_N = {"train": 20000, "test": 100}  # generated, so cheap (countdown's: minutes for 20000)


def countdown_score(text: str, entry: dict) -> float:
    """reasoning-gym's countdown by our expression checker: 1.0 or 0.0 (no partial credit)."""
    meta = entry["metadata"]
    numbers, target = [int(x) for x in meta["numbers"]], int(meta["target"])
    return 1.0 if countdown_correct(text, numbers, target, unary_minus=True) else 0.0


OUR_CHECKERS = {"countdown": countdown_score}
"""Datasets scored by a checker of our own: name -> (answer text, entry) -> score in [0, 1]."""


def rows(name: str, n: int | None, split: str, seed: int = 0) -> list[dict]:
    """n rows of dataset `name`: {"prompt": its question, "answer": the entry as JSON}.

    The test split is the dataset drawn with another seed: disjoint from training in
    practice for large problem spaces, not by construction (a small space can repeat a
    problem). Some generators are slow (countdown's: tens of ms an entry), so a
    progress bar appears once generation has taken more than two seconds.
    """
    import reasoning_gym
    from tqdm import tqdm

    n = DEFAULT_N[split] if n is None else n
    offset = 0 if split == "train" else EVAL_SEED_OFFSET
    dataset = reasoning_gym.create_dataset(name, size=n, seed=seed + offset)
    entries = tqdm(dataset, total=n, desc=f"reasoning-gym {name} ({split} rows)", unit="row", delay=2,
                   dynamic_ncols=True)
    return [{"prompt": entry["question"] + "\n", "answer": json.dumps(entry, default=str)} for entry in entries]


def score(response, answer: str, name: str, timeout: float = 2.0) -> dict:
    """{"format", "correct", "rg_score", "reward"} of one response to a reasoning-gym entry.

    answer: the row's entry as JSON (rows). The answer is the text in
    the response's last <answer>...</answer> tags if it has them (reasoning-gym's
    convention; "format" 1.0), else the whole response stripped ("format" 0.0).
    rg_score: for OUR_CHECKERS, our checker's verdict (countdown's is 1.0 or 0.0); otherwise the dataset scorer's value in [0, 1] (e.g. n_queens gives 0.5 for
    a board written as a Python list), 0.0 after a timeout or a crash.
    correct = reward = 1.0 iff rg_score >= 1.0: the project rewards correctness alone
    (the module header), so a scorer's partial credit is logged, not rewarded.
    """
    if not isinstance(response, str):
        return {"format": 0.0, "correct": 0.0, "rg_score": 0.0, "reward": 0.0}
    tagged = last_answer(response)
    text = tagged.strip() if tagged is not None else response.strip()
    if name in OUR_CHECKERS:
        value = OUR_CHECKERS[name](text, json.loads(answer))
    else:
        reply = sandbox.run_scorer(PREFIX + name, [text, answer], timeout, warmup=_rg_warmup(answer))
        value = float(reply) if isinstance(reply, (int, float)) and 0.0 <= reply <= 1.0 else 0.0
    correct = 1.0 if value >= 1.0 else 0.0
    return {"format": 1.0 if tagged is not None else 0.0, "correct": correct, "rg_score": value, "reward": correct}


ANSWER_WINDOW = 100_000   # characters at the end of a response searched for answer tags


def last_answer(response: str) -> str | None:
    """The text between the last pair of <answer>...</answer> tags in the response's last
    ANSWER_WINDOW characters, or None when there is no pair.

    Pairs are read left to right: an opening tag, then the first closing tag after it;
    the next pair starts after that closing tag. (So "<answer>a<answer>b</answer>" gives
    "a<answer>b", and a closing tag with no opening one before it is ignored.) This is
    exactly what re.findall(r"<answer>(.*?)</answer>", re.DOTALL) finds, in one pass:
    each str.find starts where the last one stopped, so the cost is linear in the text.
    The regex was quadratic on many opening tags and no closing one: from EACH opening
    tag it scanned to the end for a closing tag, and "<answer>" * 12500 (100,000
    characters) took 5-14 s in the trainer's own process, outside any sandbox's timeout.
    """
    text, last, pos = response[-ANSWER_WINDOW:], None, 0
    while True:
        start = text.find("<answer>", pos)
        if start < 0:
            return last
        end = text.find("</answer>", start + len("<answer>"))
        if end < 0:                       # an opening tag with no closing one after it: no more pairs
            return last
        last, pos = text[start + len("<answer>"):end], end + len("</answer>")


def _rg_warmup(entry_json: str) -> list:
    """A sandbox worker's warm-up for a dataset: the entry's OWN reference answer (trusted text)."""
    reference = json.loads(entry_json).get("answer")
    return [[reference, entry_json]] if isinstance(reference, str) else []


def task(name: str) -> Task:
    """The task of dataset `name`: its rows, its scorer, pass@1 to pass@4 on 200 prompts."""
    return Task(name=PREFIX + name, rows=lambda n, split, seed=0, digits=3: rows(name, n, split, seed),
                check=lambda response, answer, prompt=None, timeout=2.0: score(response, answer, name, timeout),
                sandboxed=name not in OUR_CHECKERS,
                workers=sandbox.POOL_SIZE)


def check_source(source: str, flag: str = "--data") -> None:
    """reasoning_gym:NAME at the door: the package is installed and has the dataset (ValueError)."""
    name = source[len(PREFIX):]
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(f"{flag} {source} needs reasoning-gym: pip install -r "
                         "requirements/reasoning-gym.txt") from None
    if name not in reasoning_gym.factory.DATASETS:
        raise ValueError(f"{flag} {source}: reasoning-gym has no dataset {name!r} (e.g. countdown, "
                         "basic_arithmetic, chain_sum)")
