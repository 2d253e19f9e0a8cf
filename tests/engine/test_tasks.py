"""Tests of tasks/: every task's contract, the addition task's exact format, splits, JSONL rows, GSM8K/MATH."""

import importlib.util
import json
import os
import re
import sys

import pytest

import tasks
from machinery import warmups
from tasks import addition
from tasks.addition import addition_response, addition_split_rows, make_addition_rows
from tasks.math_datasets import format_prompt, gsm8k_rows, load_gsm8k, load_jsonl, load_math, math_rows, save_jsonl
from tasks.task import is_held_out as held_out_key

load_task = tasks.load
is_held_out = lambda prompt: held_out_key(addition.problem_key(prompt))    # an addition prompt's side

COLUMN = re.compile(r"([0-9])\+([0-9])\+([01])=([0-9])([0-9])")


def parse_scratchpad(target: str):
    """Independent re-implementation: (columns [(x, y, c, d, s)], answer int)."""
    lines = target.split("\n")
    assert lines[-1] == "" and lines[-2].startswith("A:")
    cols = [tuple(int(g) for g in COLUMN.fullmatch(line).groups()) for line in lines[:-2]]
    return cols, int(lines[-2][2:])


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------- every registered task

@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_every_registered_task_keeps_the_task_contract(name):
    """What the trainer asks of a task (tasks/task.py), for each name in tasks.TASKS; the
    recipe "Add a task" (docs/extending.md) points here."""
    task = tasks.get(name)
    train, test = (task.rows(60, split, seed=0, digits=3) for split in ("train", "test"))
    assert len(train) == len(test) == 60
    assert task.rows(60, "train", seed=0, digits=3) == train                # deterministic
    assert task.rows(60, "train", seed=1, digits=3) != train                # and seeded
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}   # the held-out split
    for r in train[:10] + test[:10]:
        assert isinstance(r["prompt"], str) and isinstance(r["answer"], str)
        if "target" in r:                         # a generated task's reference response scores 1
            right = task.check(r["target"], r["answer"], r["prompt"])
            assert right["reward"] == right["correct"] == 1.0, (r, right)
        for wrong in ("", "no answer here", "\x00" * 5, r["prompt"]):            # 0, and never raises
            score = task.check(wrong, r["answer"], r["prompt"])
            assert score["reward"] == score["correct"] == 0.0, (wrong, score)
    assert task.eval_prompts >= 1 and task.eval_samples >= 1
    if task.warmup is not None:                   # the embedded model's warm-up is a valid config
        assert warmups.warmup_config(task.name, 3, seed=0).task == task.name
        assert task.max_response_tokens(3) >= 1
    if task.is_reasoning_text is not None:        # the answer's digits are reasoning, a newline template
        assert task.is_reasoning_text(train[0]["answer"][0]) and not task.is_reasoning_text("\n")


# --------------------------------------------------------------------- synthetic task

def test_reference_example_from_the_docstring():
    assert addition_response(347, 85) == "7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n"
    assert addition_response(999, 1) == "9+1+0=10\n9+0+1=10\n9+0+1=10\nA:1000\n"
    assert addition_response(0, 0) == "0+0+0=00\nA:0\n"


@pytest.mark.parametrize("digits,seed", [(1, 0), (3, 1), (5, 2)])
def test_reference_responses_parse_back_to_the_right_arithmetic(digits, seed):
    for row in make_addition_rows(300, digits=digits, seed=seed):
        a, b = (int(x) for x in row["prompt"].rstrip("\n").split("+"))
        assert row["prompt"] == f"{a}+{b}\n" and row["answer"] == str(a + b)
        cols, ans = parse_scratchpad(row["target"])
        assert ans == a + b and str(ans) == row["answer"]
        n = max(len(str(a)), len(str(b)))
        assert len(cols) == n
        carry, total = 0, 0
        for k, (x, y, c, d, s) in enumerate(cols):
            assert x == (a // 10 ** k) % 10 and y == (b // 10 ** k) % 10
            assert c == carry and x + y + c == 10 * d + s
            carry, total = d, total + s * 10 ** k
        assert total + carry * 10 ** n == a + b
        assert 1 <= len(str(a)) <= digits and 1 <= len(str(b)) <= digits


def test_make_addition_rows_deterministic_and_prefix_stable():
    assert make_addition_rows(50, seed=3) == make_addition_rows(50, seed=3)
    assert make_addition_rows(50, seed=3) != make_addition_rows(50, seed=4)
    # addition_split_rows relies on this: more rows extend, never reshuffle, fewer rows.
    assert make_addition_rows(200, seed=3)[:50] == make_addition_rows(50, seed=3)


# ---------------------------------------------------------------------- splits / load_task

@pytest.mark.parametrize("digits", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 7])
def test_addition_train_and_test_are_disjoint(digits, seed):
    train, task = load_task("addition", "train", n=3000, seed=seed, digits=digits)
    test, _ = load_task("addition", "test", n=300, seed=seed, digits=digits)
    assert task is addition.TASK and len(train) == 3000 and len(test) == 300
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in test})
    assert all(is_held_out(r["prompt"]) for r in test)
    assert not any(is_held_out(r["prompt"]) for r in train)
    # Also disjoint from a training set drawn with ANOTHER seed (the partition is global).
    other, _ = load_task("addition", "train", n=3000, seed=seed + 1, digits=digits)
    assert {r["prompt"] for r in other}.isdisjoint({r["prompt"] for r in test})


def test_held_out_is_commutation_invariant_and_about_one_in_ten():
    pairs = [(a, b) for a in range(100) for b in range(100)]
    for a, b in pairs:
        assert is_held_out(f"{a}+{b}\n") == is_held_out(f"{b}+{a}\n")
    frac = sum(is_held_out(f"{a}+{b}\n") for a, b in pairs) / len(pairs)
    assert 0.05 < frac < 0.15


def test_addition_split_rows_deterministic_and_seed_dependent():
    assert addition_split_rows(100, "test", seed=5) == addition_split_rows(100, "test", seed=5)
    assert addition_split_rows(100, "test", seed=5) != addition_split_rows(100, "test", seed=6)
    assert addition_split_rows(100, "train", seed=5)[:40] == addition_split_rows(40, "train", seed=5)
    # Train rows are the seed's stream minus held-out problems, in stream order.
    stream = [r for r in make_addition_rows(400, seed=5) if not is_held_out(r["prompt"])]
    assert addition_split_rows(100, "train", seed=5) == stream[:100]
    # Test uses a different stream than train for the same seed.
    shifted = [r for r in make_addition_rows(4000, seed=5) if is_held_out(r["prompt"])]
    assert addition_split_rows(50, "test", seed=5) != shifted[:50]
    assert addition_split_rows(0, "test") == []


def test_load_task_defaults_and_errors(tmp_path):
    rows, _ = load_task("addition", "test")
    assert len(rows) == addition.DEFAULT_N["test"]
    assert set(rows[0]) == {"prompt", "answer", "target"}
    with pytest.raises(ValueError, match="'svamp'"):
        load_task("svamp", "train")
    with pytest.raises(ValueError, match="'validation'"):
        load_task("addition", "validation")
    with pytest.raises(ValueError, match="-1"):
        load_task("addition", "train", n=-1)


def test_load_task_jsonl_sampling(tmp_path):
    path = tmp_path / "rows.jsonl"
    save_jsonl([{"prompt": f"p{i}", "answer": str(i)} for i in range(20)], path)
    rows, task = load_task(str(path), "all")                   # the whole file, in file order
    assert task.name == "math" and [r["answer"] for r in rows] == [str(i) for i in range(20)]
    train_rows, _ = load_task(str(path), "train")
    a, _ = load_task(str(path), "train", n=5, seed=1)
    b, _ = load_task(str(path), "train", n=5, seed=1)
    c, _ = load_task(str(path), "train", n=5, seed=2)
    assert a == b and a != c and len({r["prompt"] for r in a}) == 5
    with pytest.raises(ValueError, match=f"n=21.*has {len(train_rows)}"):
        load_task(str(path), "train", n=21)


# ------------------------------------------------------------------------------ JSONL

def test_save_load_round_trip_unicode_and_atomic(tmp_path):
    rows = [{"prompt": "Combien font 2+2 ? π ≈ 3", "answer": "4"},
            {"prompt": "line\nbreak \"quoted\"", "answer": "\\frac{1}{2}"}]
    path = tmp_path / "sub" / "rows.jsonl"
    save_jsonl(rows, path)
    assert load_jsonl(path) == rows
    assert "π" in path.read_text(encoding="utf-8")              # UTF-8, not \u escapes
    assert os.listdir(path.parent) == ["rows.jsonl"]             # no temp file left
    # A failing write leaves the old file intact and no temp file behind.
    with pytest.raises(TypeError):
        save_jsonl([{"prompt": "x", "answer": {1, 2}}], path)
    assert load_jsonl(path) == rows
    assert os.listdir(path.parent) == ["rows.jsonl"]
    save_jsonl(rows[:1], path)                                   # overwrite works
    assert load_jsonl(path) == rows[:1]


def test_load_jsonl_custom_keys_and_blank_lines(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [json.dumps({"q": "1+1?", "a": "2", "extra": 3}), "",
                                              json.dumps({"q": "2+2?", "a": "4"})])
    assert load_jsonl(path, prompt_key="q", answer_key="a") == [
        {"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]


GOOD = json.dumps({"prompt": "p", "answer": "1"})


@pytest.mark.parametrize("bad,what", [
    ('{"prompt": "p", "answer": ', "invalid JSON"),
    ('["p", "1"]', "expected a JSON object"),
    ('{"answer": "1"}', "missing key 'prompt'"),
    ('{"prompt": "p"}', "missing key 'answer'"),
    ('{"prompt": "p", "answer": 1}', "'answer' must be a string"),
    ('{"prompt": null, "answer": "1"}', "'prompt' must be a string"),
    ('{"prompt": "  ", "answer": "1"}', "'prompt' is empty"),
    ('{"prompt": "p", "answer": ""}', "'answer' is empty"),
])
def test_load_jsonl_bad_row_names_file_and_line(tmp_path, bad, what):
    # Line 3 is bad; line 2 is blank and still counts, as in an editor.
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(ValueError) as e:
        load_jsonl(path)
    assert f"{path}:3:" in str(e.value) and what in str(e.value)


def test_answers_that_can_never_be_scored_are_refused_at_the_door_with_a_count(tmp_path, tiny_dir, capsys):
    """A reference "\\boxed{" (an unclosed box) can never be matched: any response holding it
    holds "\\boxed", whose last well-formed box is read, and math-verify finds nothing in
    it. A file of such answers was accepted and trained on rewards of 0 without a word. Now
    it is one line at the door, counting them and naming the first; negative controls:
    closed boxes, a brace alone, a box without braces are scorable and pass."""
    from tasks import math_datasets
    from tests.engine.helpers import run_main
    rows = [{"prompt": f"q{i}", "answer": a} for i, a in enumerate(["\\boxed{", "42", "\\boxed{\\frac{1}{2}", "{"])]
    path = tmp_path / "data.jsonl"
    math_datasets.save_jsonl(rows, path)
    with pytest.raises(ValueError) as e:
        load_jsonl(str(path))
    assert str(e.value) == (f"{path}: 2 of 4 reference answers can never be scored right (an unclosed \\boxed{{), "
                            f"the first at {path}:1: '\\\\boxed{{'; fix or drop those rows")
    for answer in ("\\boxed{5}", "{", "\\boxed 5", "x \\boxed{a}{", "5 \\}"):
        assert math_datasets.unscorable(answer) is None, answer
    every = tmp_path / "boxed.jsonl"                          # the reported case: every answer is "\\boxed{"
    math_datasets.save_jsonl([{"prompt": f"q{i}", "answer": "\\boxed{"} for i in range(20)], every)
    code, err = run_main(["--model", tiny_dir, "--data", str(every), "--out_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err) == 1 and "20 of 20 reference answers can never be scored right" in err[0], err
    gsm8k = tmp_path / "gsm8k.jsonl"
    math_datasets.save_jsonl([{"question": "q", "answer": "so #### \\boxed{"}], gsm8k)
    with pytest.raises(ValueError, match="1 of 1 reference answers can never be scored right"):
        load_gsm8k(str(gsm8k))


# ------------------------------------------------------------------------- GSM8K / MATH

GSM8K_RECORDS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
                 "as many clips in May. How many clips did Natalia sell altogether?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
               "<<48+24=72>>72 clips altogether in April and May.\n#### 72"},
    {"question": "A farm has 1,000 hens and buys 234 more. How many hens now?",
     "answer": "1,000 + 234 = <<1000+234=1234>>1,234\n#### 1,234"},
]

MATH_RECORDS = [
    {"problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?", "level": "Level 1",
     "type": "Prealgebra",
     "solution": "First $\\boxed{1}$ is wrong. We get $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."},
    {"problem": "Compute $\\sqrt{8}$.", "level": "Level 2", "type": "Algebra",
     "solution": "It is $2\\sqrt{2}$.", "answer": "2\\sqrt{2}"},
]


def test_format_prompt_asks_for_boxed():
    p = format_prompt("  What is 2+2?\n")
    assert p == "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}."


def test_gsm8k_conversion_local_hub_format(tmp_path):
    path = write_lines(tmp_path / "gsm8k_train.jsonl", [json.dumps(r) for r in GSM8K_RECORDS])
    rows = load_gsm8k(str(path))
    assert [r["answer"] for r in rows] == ["72", "1234"]
    assert rows[0]["prompt"] == format_prompt(GSM8K_RECORDS[0]["question"])
    assert rows == gsm8k_rows(GSM8K_RECORDS)
    # load_task's ".jsonl" path reads {prompt, answer} rows, not hub records:
    with pytest.raises(ValueError, match="missing key 'prompt'"):
        load_task(str(path), "train")


def test_gsm8k_bad_record_names_file_and_line(tmp_path):
    bad = {"question": "q?", "answer": "the answer is 5"}
    path = write_lines(tmp_path / "g.jsonl", [json.dumps(GSM8K_RECORDS[0]), json.dumps(bad)])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2:") + ".*####"):
        load_gsm8k(str(path))
    with pytest.raises(ValueError, match="record 1.*question"):
        gsm8k_rows([{"answer": "#### 3"}])


def test_math_conversion_local_hub_format(tmp_path):
    path = write_lines(tmp_path / "math_test.jsonl", [json.dumps(r) for r in MATH_RECORDS])
    rows = load_math(str(path), split="test")
    assert [r["answer"] for r in rows] == ["\\frac{1}{2}", "2\\sqrt{2}"]   # last box; answer key
    assert rows[1]["prompt"] == format_prompt("Compute $\\sqrt{8}$.")
    assert rows == math_rows(MATH_RECORDS)


def test_math_bad_record_names_file_and_line(tmp_path):
    bad = {"problem": "p", "solution": "no box here"}
    path = write_lines(tmp_path / "m.jsonl", [json.dumps(MATH_RECORDS[0]), json.dumps(bad)])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2:") + ".*boxed"):
        load_math(str(path))
    with pytest.raises(ValueError, match="record 1.*problem"):
        math_rows([{"solution": "\\boxed{1}"}])


def test_hub_path_without_datasets_says_how_to_install(monkeypatch):
    """A CPU user is told to install datasets (it is in trl.txt), not sent to gpu.txt's vLLM."""
    monkeypatch.setitem(sys.modules, "datasets", None)      # makes `import datasets` fail
    cpu_first = re.escape("pip install datasets==5.2.0 (it is in requirements/trl.txt")
    with pytest.raises(ImportError, match=cpu_first):
        load_gsm8k("openai/gsm8k")
    with pytest.raises(ImportError, match=cpu_first):
        load_task("math", "train")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)     # no datasets at the door
    with pytest.raises(ValueError, match="^--eval_data gsm8k needs the `datasets` package: " + cpu_first):
        tasks.check_source("gsm8k", flag="--eval_data")


def test_a_local_copy_in_the_hub_format_loads_through_load_task(tmp_path):
    gsm = write_lines(tmp_path / "gsm8k_test.jsonl", [json.dumps(r) for r in GSM8K_RECORDS])
    assert load_task(f"gsm8k:{gsm}", "test")[0] == gsm8k_rows(GSM8K_RECORDS)
    rows, _ = load_task(f"gsm8k:{gsm}", "train", n=1, seed=0)
    assert rows[0] in gsm8k_rows(GSM8K_RECORDS)
    math_file = write_lines(tmp_path / "math.jsonl", [json.dumps(r) for r in MATH_RECORDS])
    assert load_task(f"math:{math_file}", "test")[0] == math_rows(MATH_RECORDS)
    tasks.check_source(f"gsm8k:{gsm}")
    for bad in (f"gsm8k:{tmp_path}/none.jsonl", f"math:{tmp_path}", "gsm8k:"):
        with pytest.raises(ValueError, match="expected (gsm8k|math):FILE.jsonl with an existing file"):
            tasks.check_source(bad)


# ---------------------------------------------------------------------- chat-worded addition

def test_addition_instruct_asks_addition_problems_and_credits_the_last_number():
    from tasks import addition_instruct
    rows = addition_instruct.rows(50, "test", seed=0, digits=2)
    pairs = [tuple(int(x) for x in r["prompt"].split("+")) for r in addition.rows(80, "test", seed=0, digits=2)]
    pairs = [(a, b) for a, b in pairs if a and b][:50]                 # no zero operand (the header says why)
    assert [r["prompt"] for r in rows] == [f"What is {a} + {b}? Answer with just the number." for a, b in pairs]
    assert [r["answer"] for r in rows] == [str(a + b) for a, b in pairs]   # addition's problems, its held-out split
    check = addition_instruct.check
    assert check("23 + 48 = 71", "71") == {"format": 0.0, "correct": 1.0, "reward": 1.0}
    assert check(" 71\n", "71") == {"format": 1.0, "correct": 1.0, "reward": 1.0}
    for wrong in ("23 + 48 = 100", "71 or 72", "71.0", "071", "seventy-one", "", None):
        assert check(wrong, "71")["correct"] == 0.0, wrong
    assert check("72", "71") == {"format": 1.0, "correct": 0.0, "reward": 0.0}     # format is logged, not rewarded
