"""The countdown task: its generator and checker (tasks/countdown.py) and its expression grammar (tasks/expression.py
SECTION 4), against brute force, hostile text, and reasoning-gym's own scorer."""

import itertools
import json
import math
import random
import time
from fractions import Fraction

import pytest
import torch

import tasks
import verify
from machinery import tinymodel
from tasks import countdown, expression, reasoning_gym


def all_expressions(numbers):
    """Every expression over all of `numbers` (each once): (fully parenthesised text, exact value or None).

    All orders, all binary trees, all four operators, exact rationals (non-integer and
    negative intermediates included): a superset of the game's solutions.
    """
    def build(items):
        if len(items) == 1:
            yield str(items[0]), Fraction(items[0])
            return
        for cut in range(1, len(items)):
            for lt, lv in build(items[:cut]):
                for rt, rv in build(items[cut:]):
                    for op in "+-*/":
                        if lv is None or rv is None or (op == "/" and rv == 0):
                            value = None
                        else:
                            value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
                        yield f"({lt}{op}{rt})", value
    for order in set(itertools.permutations(numbers)):
        yield from build(list(order))


def parse_prompt(prompt):
    left, target = prompt.split(" -> ")
    return [int(x) for x in left.split()], int(target)


# --- the checker against brute force ----------------------------------------------------

def test_checker_agrees_with_brute_force_on_every_expression():
    rng = random.Random(0)
    checked = 0
    for _ in range(200):
        numbers = [rng.randint(1, 20) for _ in range(3)]
        target = rng.randint(1, 100)
        for text, value in all_expressions(numbers):
            assert expression.countdown_correct(text, numbers, target) == (value == target), (text, numbers, target)
            checked += 1
    assert checked >= 200 * 2 * 16 * 4                    # >= 1 order x 2 trees x 4^2 ops x ... per problem


def test_every_reference_response_is_correct_and_well_formed():
    rows = countdown.make_rows(500, "train", seed=3)
    for r in rows:
        out = countdown.check(r["target"], r["answer"], r["prompt"])
        assert out == {"format": 1.0, "correct": 1.0, "reward": 1.0}, r


def test_distinct_solutions_are_the_rule_abiding_brute_force_solutions_up_to_commutation():
    """distinct_solutions = the keys of the brute-force solutions whose every intermediate
    result is a positive integer (the game's rules), each key once."""
    rng = random.Random(1)
    for _ in range(200):
        numbers = [rng.randint(1, 20) for _ in range(3)]
        target = rng.randint(1, 100)
        brute = set()
        for text, value in all_expressions(numbers):
            if value != target:
                continue
            tree = expression.parse_expression(text)
            if _rule_abiding(tree):
                brute.add(expression.solution_key(tree))
        assert countdown.distinct_solutions(numbers, target) == brute, (numbers, target)


def _rule_abiding(tree):
    if isinstance(tree, int):
        return True
    value = expression.evaluate(tree)
    return (_rule_abiding(tree[1]) and _rule_abiding(tree[2]) and value is not None and value > 0
            and value.denominator == 1 and value <= countdown.MAX_TARGET * 20 * 20)


def test_solution_key_merges_commutations_only():
    key = lambda s: expression.solution_key(expression.parse_expression(s))
    assert key("2+(14+13)") == key("(13+14)+2") == key("(14+13)+2")
    assert key("(2+14)+13") != key("2+(14+13)")                 # a different first step
    assert key("8-3") != key("3-8") and key("6/3") != key("3/6")


# --- hostile text: a reward every time, never an exception ------------------------------

HOSTILE = ["(" * 100_000 + "1" + ")" * 100_000, "9" * 1_000_000, "1/0", "(1-1)", "2/(3-3)",
           "x" * 1_000_000, "\x00" * 1000, "４２", "-3+5", "2**3", "1.5*2", "", "()", "1+", "((1)",
           "__import__('os').system('true')", "A: " + "(" * 20 + "1" + ")" * 20]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_answers_score_without_raising_and_fast(text):
    prompt, answer = "13 14 2 -> 29\n", "29"
    for response in (text, "A: " + text + "\n", "now 1+1=2\n" * 50_000 + "answer: " + text):
        start = time.perf_counter()
        out = countdown.check(response, answer, prompt)
        assert time.perf_counter() - start < 0.5
        assert out["correct"] == 0.0 and set(out) == {"format", "correct", "reward"}
    assert countdown.check(None, answer, prompt)["reward"] == 0.0


def test_number_multiset_must_match_exactly():
    prompt = "2 2 5 -> 9\n"
    assert countdown.check("A: 2+2+5\n", "9", prompt)["correct"] == 1.0
    assert countdown.check("A: 2+7\n", "9", prompt)["correct"] == 0.0           # 7 is not given
    assert countdown.check("A: 2*2+5\n", "9", prompt)["correct"] == 1.0
    assert countdown.check("A: 2+2+5+0\n", "9", prompt)["correct"] == 0.0       # an extra number
    assert countdown.check("A: (2+5)+2+2-2\n", "9", prompt)["correct"] == 0.0   # 2 used three times
    assert countdown.check("A: 6/4*6\n", "9", "4 6 6 -> 9\n")["correct"] == 1.0  # exact rationals


def test_last_answer_line_wins_and_format_is_logged_not_rewarded():
    prompt = "13 14 2 -> 29\n"
    assert countdown.check("answer: 13+14\nresult: 2+(14+13)\n", "29", prompt)["correct"] == 1.0
    assert countdown.check("result: 2+(14+13)\nanswer: 13+14\n", "29", prompt)["correct"] == 0.0
    junk = countdown.check("hello\nA: 2+(14+13)\n", "29", prompt)
    assert junk == {"format": 0.0, "correct": 1.0, "reward": 1.0}


# --- the generator -----------------------------------------------------------------------

def test_held_out_split_is_disjoint_and_deterministic():
    train_rows = countdown.make_rows(3000, "train", seed=0)
    test_rows = countdown.make_rows(300, "test", seed=0)
    key = lambda r: (tuple(sorted(parse_prompt(r["prompt"])[0])), parse_prompt(r["prompt"])[1])
    assert not {key(r) for r in train_rows} & {key(r) for r in test_rows}
    assert all(tasks.task.is_held_out(countdown.problem_key(*parse_prompt(r["prompt"]))) for r in test_rows)
    assert countdown.make_rows(50, "test", seed=0) == test_rows[:50]
    assert countdown.make_rows(50, "test", seed=1) != test_rows[:50]


def test_most_problems_have_several_distinct_solutions():
    rows = countdown.make_rows(500, "test", seed=0)
    share = sum(len(countdown.distinct_solutions(*parse_prompt(r["prompt"]))) >= 2 for r in rows) / len(rows)
    assert 0.6 < share < 0.8, share                       # measured 0.706


def test_wording_varies_and_every_phrase_is_one_token():
    rows = countdown.make_rows(2000, "train", seed=0)
    tok = tinymodel.build_char_tokenizer()
    for phrase in countdown.PHRASES:
        assert len(tok(phrase)["input_ids"]) == 1, phrase
        share = sum(phrase in r["target"] for r in rows) / len(rows)
        assert share > 0.2, (phrase, share)               # every phrasing is used
    assert tok.decode(tok(rows[0]["target"])["input_ids"]) == rows[0]["target"]
    addition = "7+5+0=12\nA:12\n"                       # addition: still one character per token
    assert tok.convert_ids_to_tokens(tok(addition)["input_ids"]) == list(addition)


def test_template_mask_marks_exactly_the_wording():
    tok = tinymodel.build_char_tokenizer()
    text = "now 14+13 is 27\nstep 2*27=54\nresult: (14+13)*2\n"
    ids = torch.tensor([tok(text)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]])
    mask = torch.ones_like(ids)
    mask[0, -1] = 0
    template = tasks.template_token_mask(countdown.TASK, tok, ids, mask)[0].tolist()
    pieces = [tok.decode([i]) for i in ids[0].tolist()]
    want = [p in ("now ", " is ", "\n", "step ", "=", "result: ") for p in pieces[:-2]] + [True, False]
    assert template == want, list(zip(pieces, template))


def test_solution_diversity_counts_and_entropy():
    k1, k2 = ("+", 2, 3), ("*", 2, 3)
    out = tasks.solution_diversity({"a": [k1, k2], "b": [k1, k1, k1], "c": [k2]})
    assert out["eval/distinct_solutions"] == pytest.approx((2 + 1 + 1) / 3)
    assert out["eval/solution_entropy"] == pytest.approx((math.log(2) + 0.0) / 2)     # "c" has one sample
    assert math.isnan(tasks.solution_diversity({})["eval/solution_entropy"])


# --- reasoning-gym's scorer agrees with ours ---------------------------------------------

def test_reasoning_gym_countdown_scorer_agrees_with_ours():
    rg = pytest.importorskip("reasoning_gym")             # .ci/run installs it: this runs in CI
    score_answer = rg.get_score_answer_fn("countdown")
    entries = list(rg.create_dataset("countdown", size=40, seed=5, min_numbers=3, max_numbers=4))
    cases = 0
    for entry in entries:
        numbers, target = list(entry["metadata"]["numbers"]), int(entry["metadata"]["target"])
        prompt = countdown.prompt_from_reasoning_gym(entry)
        valid = entry["metadata"]["expression"]
        corpus = [valid,                                            # valid (rg's own)
                  f"{valid}+1",                                     # uses a number not given
                  "+".join(str(n) for n in numbers),                # all numbers, wrong value (mostly)
                  "+".join(str(n) for n in numbers[:-1]),           # a number missing
                  f"({valid}", "", "hello"]                         # malformed
        for text in corpus:
            ours = expression.countdown_correct(text, numbers, target)
            theirs = score_answer(answer=text, entry=entry) >= 1.0
            assert ours == theirs, (text, numbers, target)
            assert countdown.check("answer: " + text + "\n", str(target), prompt)["correct"] == float(ours)
            cases += 1
    assert cases == 40 * 7


def test_reasoning_gym_known_differences():
    """Where the two checkers differ, on purpose. sympy reads unary minus and "**", and our
    game's grammar has neither (no negative numbers, no powers): rg credits "-2+3*5" and
    "2**3+5" for 2, 3, 5 -> 13, our game does not. Under reasoning-gym's rules
    (unary_minus=True, how its data is scored) "-2+3*5" is credited, "2**3+5" still not:
    a power is how "9**9**9**9" hangs a scorer. Both refuse decimals and a trailing
    "= 13" alike (a decimal makes rg's numbers check fail)."""
    rg = pytest.importorskip("reasoning_gym")
    score_answer = rg.get_score_answer_fn("countdown")
    entry = {"metadata": {"numbers": [2, 3, 5], "target": 13}}
    differ = {"-2+3*5": (1.0, False), "2**3+5": (1.0, False)}
    same = {"3*5-2": (1.0, True), "2 * 5 + 3": (1.0, True), "((2*5)+3)": (1.0, True), "3*5-2.0": (0.05, False),
            "(3*5-2)*1.0": (0.05, False), "10+3": (0.05, False), "2*5+3 = 13": (0.01, False)}
    for text, (theirs, ours) in {**differ, **same}.items():
        assert score_answer(answer=text, entry=entry) == theirs, text
        assert expression.countdown_correct(text, [2, 3, 5], 13) is ours, text
        assert expression.countdown_correct(text, [2, 3, 5], 13, unary_minus=True) is (ours or text == "-2+3*5"), text
    assert expression.countdown_correct("--2+3*5", [2, 3, 5], 17, unary_minus=True)        # -(-2) + 15
    assert expression.countdown_correct("3*(-(5-2))+22", [2, 3, 5, 22], 13, unary_minus=True)
    assert not expression.countdown_correct("-" * 300 + "2", [2], 2, unary_minus=True)   # over MAX_EXPR_CHARS


def test_reasoning_gym_countdown_data_is_scored_by_our_checker_and_agrees_on_its_own_answers():
    """`--data reasoning_gym:countdown` is scored by our checker (tasks/reasoning_gym.py's OUR_CHECKERS), never by
    rg's scorer, which evals the answer. On the dataset's own reference answers (safe text:
    rg wrote them), with its default settings as train.py draws them, both give full credit,
    and a wrong value or a missing number gets none from either."""
    rg = pytest.importorskip("reasoning_gym")
    from tasks import sandbox
    score_answer = rg.get_score_answer_fn("countdown")
    rows = reasoning_gym.rows("countdown", 30, "train", seed=3)
    responses, answers = [], []
    for row in rows:
        entry = json.loads(row["answer"])
        numbers, target = list(entry["metadata"]["numbers"]), int(entry["metadata"]["target"])
        reference = entry["answer"]
        assert score_answer(answer=reference, entry=entry) == 1.0
        assert expression.countdown_correct(reference, numbers, target, unary_minus=True)
        wrong = reference + "+" + str(numbers[0])            # a number used twice, and another value
        assert score_answer(answer=wrong, entry=entry) < 1.0
        assert not expression.countdown_correct(wrong, numbers, target, unary_minus=True)
        responses += [f"thinking...\n<answer>{reference}</answer>", f"<answer>{wrong}</answer>", reference]
        answers += [row["answer"]] * 3
    pools_before = set(sandbox._pools)
    scores = verify.score(responses, answers, tasks.get("reasoning_gym:countdown"))
    assert [s["reward"] for s in scores] == [1.0, 0.0, 1.0] * len(rows)
    assert [s["format"] for s in scores] == [1.0, 1.0, 0.0] * len(rows)
    assert set(sandbox._pools) == pools_before             # no scorer process was asked (nothing evaluated)


def test_countdown_instruct_words_the_same_problems_for_a_chat_model():
    """--data countdown_instruct: the bare problem is the prompt's last line, the rules and
    the answer line are stated above it, and the checker scores exactly as on the bare prompt."""
    rows, task = tasks.load("countdown_instruct", "test", n=30)
    bare, _ = tasks.load("countdown", "test", n=30)
    assert task.name == "countdown" and [r["answer"] for r in rows] == [b["answer"] for b in bare]
    for r, b in zip(rows, bare):
        assert r["prompt"].endswith("\n" + b["prompt"]) and 'after "answer: "' in r["prompt"]
        numbers = b["prompt"].split(" -> ")[0].split()
        assert f"Use the numbers {', '.join(numbers)}, each exactly once" in r["prompt"]
        expression = countdown.answer_line(b["target"])
        chat = f"Let me try.\n{numbers[0]} first...\nanswer: {expression}"
        assert countdown.check(chat, r["answer"], r["prompt"])["correct"] == 1.0
        assert countdown.check(chat, b["answer"], b["prompt"])["correct"] == 1.0
        wrong = f"answer: {expression}+1"                                     # negative control
        assert countdown.check(wrong, r["answer"], r["prompt"])["correct"] == 0.0
        assert countdown.check(chat.replace("answer:", "Answer:"), r["answer"], r["prompt"])["correct"] == 0.0
