"""Tests for verify.py: answer extraction, bounded symbolic equality, task checkers.

Adversarial inputs (huge numbers, nested braces, power towers, unicode, truncation) are
here because a policy under RL will produce all of them. Hang cases assert the RESULT
(False) and are guarded by a generous future timeout so a regression fails instead of
freezing the suite; nothing asserts speed.
"""

import itertools
import os
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import tasks
import verify
from tasks import sandbox
from tasks.addition import addition_prompt, addition_response
from verify import check_addition, extract_answer, last_boxed, reward_tensor, score
from tasks.math_datasets import math_equal, score_math      # verify's, with the sandboxed symbolic step

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    sandbox.shutdown()


def run_guarded(fn, *args, limit=90.0, **kwargs):
    """Run fn in another thread (also exercising non-main-thread use); fail, not hang."""
    with ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(fn, *args, **kwargs).result(timeout=limit)


# --------------------------------------------------------------------------- extraction

def test_extract_boxed_nested_and_last_wins():
    assert extract_answer(r"so \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_answer(r"\boxed{1} wait, no: \boxed{ {2}+{3} }") == "{2}+{3}"
    assert extract_answer(r"\boxed {7}") == "7"
    assert last_boxed(r"a \boxed{x} b") == "x"


def test_extract_truncated_or_empty_box_gives_none():
    # The last box decides: a truncated final box is no answer, even after a good one.
    assert extract_answer(r"\boxed{3} hmm, actually \boxed{4") is None
    assert extract_answer(r"\boxed{}") is None
    assert extract_answer(r"\boxed 5") is None
    # ...and a box, even broken, takes precedence over "Answer:".
    assert extract_answer("Answer: 5 \\boxed{") is None


def test_extract_deeply_nested_and_unterminated_braces_are_bounded():
    assert extract_answer("\\boxed{" + "{" * 100_000) is None
    deep = "{" * 500 + "1" + "}" * 500
    assert extract_answer("\\boxed{" + deep + "}") == deep           # within the bound
    too_long = "1" * (verify.MAX_BOXED_CHARS + 1)
    assert extract_answer("\\boxed{" + too_long + "}") is None
    ok_len = "1" * verify.MAX_BOXED_CHARS
    assert extract_answer("\\boxed{" + ok_len + "}") == ok_len


def test_extract_precedence_boxed_then_gsm8k_then_answer():
    assert extract_answer("Answer: 1\n#### 2\n\\boxed{3}") == "3"
    assert extract_answer("Answer: 1\n#### 2\n") == "2"
    assert extract_answer("blah\nAnswer: 1") == "1"


def test_extract_gsm8k_keeps_separator_and_repeated_tags_last_wins():
    assert extract_answer("#### 1,234") == "1,234"          # normalised by math_equal
    assert extract_answer("#### 5\n#### 6") == "6"
    assert extract_answer("A:1\nA:2\n") == "2"
    assert extract_answer("answer: 7\nFinal ANSWER: 8.") == "8"


def test_extract_answer_tag_rules():
    assert extract_answer("A:432\n") == "432"
    assert extract_answer("DATA: 5") is None        # "A:" inside a word is not a tag
    assert extract_answer("A:") is None
    assert extract_answer("no answer here, 42") is None


@pytest.mark.parametrize("bad", [None, "", 42, b"\\boxed{1}", ["A:1"]])
def test_extract_non_text_is_none(bad):
    assert extract_answer(bad) is None


# --------------------------------------------------------------------------- math_equal

@pytest.mark.parametrize("pred,ref", [
    (r"\frac{1}{2}", "0.5"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    ("1,234", "1234"),           # thousands separator accepted (math-verify convention)
    ("４２", "42"),               # full-width digits mapped to ASCII first
    ("−3", "-3"),                # U+2212 minus
    ("π", r"\pi"),
    ("0432", "432"),             # plain integers compare as integers (addition is stricter)
    ("x+1", "1+x"),
    (r"\{1,2\}", r"\{2,1\}"),
    (r"\dfrac{3}{4}", "0.75"),
    ("5", "5.0"),
])
def test_math_equal_true(pred, ref):
    assert math_equal(pred, ref) is True


@pytest.mark.parametrize("pred,ref", [
    ("3", "4"),
    (r"2\sqrt{2}", r"\sqrt{6}"),
    ("x+1", "x-1"),
    (r"\frac{1}{3}", "0.33"),
    ("π", "3.14"),
    ("1,235", "1234"),
    ("-3", "3"),
])
def test_math_equal_false(pred, ref):
    assert math_equal(pred, ref) is False


@pytest.mark.parametrize("pred,ref", [(None, "1"), ("1", None), ("", "1"), ("  ", "1"),
                                      ("1", ""), (1, 1)])
def test_math_equal_empty_or_non_str_is_false(pred, ref):
    assert math_equal(pred, ref) is False


def test_math_equal_rejects_bad_timeout():
    with pytest.raises(ValueError, match="-1"):
        math_equal("1", "2", timeout=-1)


def test_math_equal_caps_are_policy_not_only_speed():
    huge = "9" * 100_000
    assert math_equal(huge, "9") is False
    assert math_equal(huge, huge) is True            # identical strings: cheap and exact
    assert math_equal("9" * (verify.MAX_ANSWER_CHARS + 1), "9" * (verify.MAX_ANSWER_CHARS + 1) + " ") is True
    nested = "{" * 10_000 + "1" + "}" * 10_000
    assert math_equal(nested, "1") is False
    # Negative control for the depth cap: shallow braces still go to math-verify.
    assert math_equal("{{1}}", "1") is True


@pytest.mark.slow
def test_math_equal_power_tower_and_hang_return_false_and_pool_recovers():
    assert run_guarded(math_equal, "2^2^2^2^2^2^2^99", "1") is False
    # Hangs inside sympy; only killing the worker process ends it.
    assert run_guarded(math_equal, "10^{10^{10^{10}}}", "1", timeout=1.0) is False
    # The killed worker is replaced: the next calls still get real answers.
    assert run_guarded(math_equal, r"\frac{1}{2}", "0.5") is True
    assert run_guarded(math_equal, r"\frac{1}{2}", "0.6") is False


def test_math_equal_from_many_threads():
    pairs = [(r"\frac{%d}{2}" % k, str(k / 2)) for k in range(1, 9)]
    pairs += [(r"\frac{%d}{2}" % k, str(k / 2 + 1)) for k in range(1, 9)]
    results = [None] * len(pairs)

    def work(i):
        results[i] = math_equal(*pairs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert results == [True] * 8 + [False] * 8


# --------------------------------------------------------------------------- score_math

def test_score_math_components():
    assert score_math(r"... so \boxed{\frac12}", "0.5") == {"format": 1.0, "correct": 1.0, "reward": 1.0}
    assert score_math(r"\boxed{3}", "4") == {"format": 1.0, "correct": 0.0, "reward": 0.0}
    assert score_math("I think it is 4", "4") == {"format": 0.0, "correct": 0.0, "reward": 0.0}
    assert score_math(None, "4") == {"format": 0.0, "correct": 0.0, "reward": 0.0}
    assert score_math("#### 1,234", "1234")["correct"] == 1.0
    with pytest.raises(ValueError, match="4"):
        score_math(r"\boxed{4}", 4)


# ------------------------------------------------------------------------ check_addition

ALL_ONE = {"format": 1.0, "correct": 1.0, "scratchpad_ok": 1.0, "reward": 1.0}


def test_addition_reference_response_scores_all_ones():
    assert check_addition("7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n", "432", "347+85\n") == ALL_ONE
    assert check_addition("7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432", "432") == ALL_ONE
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randint(0, 99999), rng.randint(0, 99999)
        assert check_addition(addition_response(a, b), str(a + b), addition_prompt(a, b)) == ALL_ONE


def test_addition_wrong_answer():
    r = check_addition("7+5+0=12\n4+8+1=13\n3+0+1=04\nA:433\n", "432")
    assert r == {"format": 1.0, "correct": 0.0, "scratchpad_ok": 0.0, "reward": 0.0}


def test_addition_right_answer_broken_format():
    r = check_addition("The sum is\nA:432\n", "432")
    assert r == {"format": 0.0, "correct": 1.0, "scratchpad_ok": 0.0, "reward": 1.0}
    r = check_addition("7+5+0=12\nA:432\nmore text", "432")      # garbage after the line
    assert (r["format"], r["correct"]) == (0.0, 1.0)


def test_addition_leading_zeros_spaces_and_trailing_garbage_are_wrong():
    pad = "7+5+0=12\n4+8+1=13\n3+0+1=04\n"
    assert check_addition(pad + "A:0432\n", "432")["correct"] == 0.0
    assert check_addition(pad + "A:0432\n", "432")["format"] == 1.0
    assert check_addition(pad + "A: 432\n", "432")["correct"] == 0.0
    r = check_addition(pad + "A:432 foo\n", "432")
    assert (r["format"], r["correct"]) == (0.0, 0.0)
    assert check_addition(pad + "A:432\n\n", "432")["format"] == 0.0     # one newline max
    assert check_addition(" " + pad + "A:432\n", "432")["format"] == 0.0


def test_addition_last_answer_line_wins():
    assert check_addition("A:432\nA:431\n", "432")["correct"] == 0.0
    assert check_addition("A:431\nA:432\n", "432")["correct"] == 1.0


def test_addition_scratchpad_consistency():
    # Consistent arithmetic, but for 346+85, not the prompt's 347+85.
    other = addition_response(346, 85)
    assert check_addition(other, "432")["correct"] == 0.0
    assert check_addition(other, "431")["scratchpad_ok"] == 1.0
    assert check_addition(other, "431", "347+85\n")["scratchpad_ok"] == 0.0
    # Right answer after a wrong column sum (a lucky guess): correct but not ok.
    lucky = "7+5+0=13\n4+8+1=13\n3+0+1=04\nA:432\n"
    assert check_addition(lucky, "432") == {"format": 1.0, "correct": 1.0,
                                            "scratchpad_ok": 0.0, "reward": 1.0}
    # Carry not propagated.
    assert check_addition("7+5+0=12\n4+8+0=12\n3+0+1=04\nA:422\n", "422")["scratchpad_ok"] == 0.0
    # Extra column for the prompt: digits match numerically but column count does not.
    assert check_addition("5+5+0=10\n0+0+1=01\nA:10\n", "10", "5+5\n")["scratchpad_ok"] == 0.0
    assert check_addition("5+5+0=10\nA:10\n", "10", "5+5\n") == ALL_ONE


def test_addition_any_single_digit_mutation_breaks_the_scratchpad():
    rng = random.Random(1)
    for _ in range(100):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        target, prompt = addition_response(a, b), addition_prompt(a, b)
        digit_pos = [i for i, c in enumerate(target) if c.isdigit()]
        i = rng.choice(digit_pos)
        new = rng.choice([d for d in "0123456789" if d != target[i]])
        mutated = target[:i] + new + target[i + 1:]
        assert check_addition(mutated, str(a + b), prompt)["scratchpad_ok"] == 0.0, mutated


def test_addition_bad_inputs():
    assert check_addition(None, "5")["reward"] == 0.0
    assert check_addition("", "5") == {"format": 0.0, "correct": 0.0, "scratchpad_ok": 0.0, "reward": 0.0}
    with pytest.raises(ValueError, match="0432"):
        check_addition("A:432", "0432")
    with pytest.raises(ValueError, match="3 plus 4"):
        check_addition("A:7", "7", prompt="3 plus 4")


# --------------------------------------------------------------------------- batch score

def test_score_dispatch_and_order():
    resp = [r"\boxed{2}", r"\boxed{3}", "#### 1,000", "nothing", r"\boxed{\frac{2}{4}}"]
    ans = ["2", "2", "1000", "1", "0.5"]
    out = score(resp, ans, tasks.get("math"))
    assert [s["correct"] for s in out] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [s["format"] for s in out] == [1.0, 1.0, 1.0, 0.0, 1.0]
    add = score(["5+5+0=10\nA:10\n", "A:11"], ["10", "10"], tasks.get("addition"), prompts=["5+5\n", "5+5\n"])
    assert add[0] == ALL_ONE and add[1]["reward"] == 0.0


def test_score_errors_name_the_problem():
    with pytest.raises(ValueError, match="'gsm9k'"):
        tasks.get("gsm9k")
    with pytest.raises(ValueError, match=r"3 responses but 2 answers"):
        score(["a", "b", "c"], ["1", "2"], tasks.get("math"))
    with pytest.raises(ValueError, match=r"1 responses but 2 prompts"):
        score(["a"], ["1"], tasks.get("addition"), prompts=["1+1\n", "1+2\n"])


def test_reward_tensor():
    t = reward_tensor([{"reward": 1.0, "format": 0.0}, {"reward": 0.0, "format": 1.0}])
    assert t.dtype == torch.float32 and t.tolist() == [1.0, 0.0]
    assert reward_tensor([{"reward": 1.0}, {"reward": 0.0, "format": 1.0}], key="reward").shape == (2,)
    assert reward_tensor([]).shape == (0,)
    with pytest.raises(ValueError, match="'format'"):
        reward_tensor([{"reward": 1.0}], key="format")


# --- a verifier returns a reward for any text, and never lies about a dead worker --------

def test_addition_long_well_formed_scratchpad_scores_instead_of_raising():
    # 4300 column lines spell a 4301-digit number: int() refuses more than 4300 digits.
    out = check_addition("1+1+0=02\n" * 4300 + "A:2\n", "2", "1+1\n")
    assert out == {"format": 1.0, "correct": 1.0, "scratchpad_ok": 0.0, "reward": 1.0}   # columns spell 22...2
    assert score(["1+1+0=02\n" * 4300 + "A:2\n"], ["2"], tasks.get("addition"), ["1+1\n"])[0]["reward"] == 1.0


@pytest.mark.slow
def test_math_equal_restarts_a_worker_killed_between_calls():
    from tasks import sandbox
    assert run_guarded(math_equal, r"\frac{1}{2}", "0.5") is True          # the pool exists
    killed = 0
    for worker in list(sandbox._pools["math"].queue):
        if worker is not None:
            worker.proc.kill()
            worker.proc.wait(5)
            killed += 1
    assert killed >= 1
    # A dead worker's pipe breaks; the answer is asked again of a new worker, not scored False.
    assert run_guarded(math_equal, r"\frac{1}{2}", "0.5") is True
    assert run_guarded(math_equal, r"\frac{2}{4}", "0.5") is True


@pytest.mark.slow
def test_script_without_main_guard_scores_right(tmp_path):
    """Workers are plain `python -c` processes, not multiprocessing's "spawn" (which re-ran the
    main module, so a script without `if __name__ == "__main__":` died in every worker)."""
    script = tmp_path / "unguarded.py"
    script.write_text("import sys\nsys.path.insert(0, %r)\nfrom tasks import math_datasets\n"
                      "print(math_datasets.math_equal(r'\\frac{1}{2}', '0.5'))\n" % REPO)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]


# --- several boxes, a final answer after a draft box, long lines, prose: what is compared -------

TWO_ROOTS = r"Then \(x = \boxed{1}\) and \(x = \boxed{-2}\)."        # a MATH-style reference solution


def test_several_boxes_are_one_set_on_both_sides():
    """A reference solution boxing two roots is the set of both (math_rows reads it so): half an
    answer scores 0, the whole one 1, in one box or several, in any order."""
    from tasks.math_datasets import math_rows
    reference = math_rows([{"problem": "Solve x^2 + x - 2 = 0.", "solution": TWO_ROOTS}])[0]["answer"]
    assert reference == "1, -2" and verify.boxed_answer(TWO_ROOTS) == "1, -2"
    assert last_boxed(TWO_ROOTS) == "-2"                                    # what main read: the last box only
    for response, reward in ((r"\boxed{-2}", 0.0), (r"so \boxed{1}", 0.0), (r"\boxed{1, -2}", 1.0),
                             (r"\boxed{-2,1}", 1.0), (r"\boxed{1} and \boxed{-2}", 1.0),
                             (r"$x=\boxed{-2}$, or $x=\boxed{1}$", 1.0), (r"\boxed{1} or \boxed{-3}", 0.0)):
        assert score_math(response, reference)["reward"] == reward, response
    # math-verify's own case (tests/test_numina_cases.py): four pairs in four boxes
    pairs = "solutions are:\n\n\\[\n\\boxed{(1, 2)}, \\boxed{(2, 1)}, \\boxed{(-1, -20)}, \\boxed{(-20, -1)}\n\\]"
    assert score_math(pairs, "(2,1),(1,2),(-1,-20),(-20,-1)")["reward"] == 1.0
    assert score_math(pairs.replace(r", \boxed{(-20, -1)}", ""), "(2,1),(1,2),(-1,-20),(-20,-1)")["reward"] == 0.0


def test_only_a_separator_joins_boxes():
    assert extract_answer(r"$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$") == "(2, 2), (6, 2)"
    assert extract_answer(r"\( y_1 = \boxed{a} \) and \( y_2 = \boxed{b} \)") == "a, b"
    assert extract_answer(r"\boxed{1},\boxed{2};\boxed{3}") == "1, 2, 3"
    # anything else between them makes the earlier box a draft
    assert extract_answer(r"\boxed{1} no no no \boxed{2}") == "2"
    assert extract_answer(r"\boxed{1} wait, \boxed{2}") == "2"
    assert extract_answer(r"\boxed{1} papers and \boxed{2} bins") == "2"         # math-verify: {1, 2}
    assert extract_answer(r"\boxed{1} and \boxed{2") is None                     # the last box decides
    many = ", ".join([r"\boxed{%d}" % k for k in range(40)])
    assert extract_answer(many) == ", ".join(str(k) for k in range(40 - verify.MAX_JOINED_BOXES, 40))


def test_a_final_answer_after_a_draft_box_wins():
    """math-verify's case (tests/test_all.py): an intermediate \\boxed{255}, then Minerva's line."""
    text = (r"the interest is $0.05 \cdot 10,200 \cdot \frac{1}{2} = \boxed{255}$ So Dr. Zaius has $10,455. "
            "Final Answer: The final answer is $10,455$. I hope it is correct.")
    assert extract_answer(text) == "10,455" and score_math(text, "10455")["reward"] == 1.0
    # negative control: without the final line the box answers, and it is wrong
    assert score_math(text.split("Final Answer")[0], "10455")["reward"] == 0.0
    # a marker BEFORE the box, or one that names no answer, leaves the box in charge
    assert extract_answer("Final Answer: 3\n\\boxed{4}") == "4"
    assert extract_answer(r"\boxed{4}. I hope the final answer is right.") == "4"
    assert extract_answer("\\boxed{4}\n**Final Answer:**\n") == "4"


def test_the_length_cap_applies_to_the_answer_not_its_line():
    """An answer line of ~2,000 characters (Minerva's sentence, then a note) holds a short answer:
    credited. The cap still refuses a long answer itself."""
    note = " Note: the solution assumes that A and B are nonzero digits; please double-check." * 24
    line = "Final Answer: The final answer is $14{,}916$. I hope it is correct." + note
    assert len(line) > 1900 and extract_answer(line) == "14{,}916"
    assert score_math(line, "14916")["reward"] == 1.0
    assert score_math("Answer: " + "1" * (verify.MAX_ANSWER_CHARS + 1), "1")["reward"] == 0.0     # still capped


def test_prose_with_one_number_is_the_number():
    assert extract_answer("Final Answer: The largest $n$ is 34.") == "34"
    assert score_math("Final Answer: The largest $n$ is 34.", "34")["reward"] == 1.0
    assert score_math("Final Answer: The largest $n$ is 35.", "34")["reward"] == 0.0
    assert extract_answer("Answer: There are 12 apples.") == "12"
    # not prose with one number: left whole, for math-verify to read
    assert extract_answer("Answer: between 3 and 34") == "between 3 and 34"
    assert extract_answer("Answer: x = 3") == "x = 3"
    assert extract_answer("Answer: it is x^2") == "it is x^2"
    assert extract_answer("Answer: $2^5$ ways") == "$2^5$ ways"
    assert extract_answer("#### 1,234") == "1,234"


# ---- pass@k -----------------------------------------------------------------------------

@pytest.mark.parametrize("n,c", [(5, 0), (5, 2), (6, 3), (7, 7), (8, 1), (10, 4)])
def test_pass_at_k_matches_exact_enumeration(n, c):
    items = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        exact = sum(any(items[i] for i in s) for s in subsets) / len(subsets)
        # Python floats, a product of <= 10 ratios: measured <= 1.1e-16
        assert abs(verify.pass_at_k(n, c, k) - exact) < 1e-12, (n, c, k)


def test_pass_at_k_large_n_is_stable_and_bad_input():
    # C(1000, 500) overflows float; the product form does not
    v = verify.pass_at_k(1000, 3, 500)
    assert abs(v - (1 - (500 / 1000) * (499 / 999) * (498 / 998))) < 1e-12      # measured 0
    with pytest.raises(ValueError, match="k=0"):
        verify.pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="c=5"):
        verify.pass_at_k(4, 5, 1)
