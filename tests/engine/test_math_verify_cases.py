"""math-verify 0.9.0's own test cases through our checker, the known differences named and counted.

tests/data/math_verify_cases.json holds 141 (gold, pred, expected) cases copied as data
from math-verify's test suite (its header says which files and why those). Each pred is
scored by tasks.math_datasets.score_math, our checker: the answer extracted by
verify.extract_answer, then math_equal, whose symbolic step is math-verify itself in the
sandbox. The gold is read as a reference is: its boxed answer (verify.boxed_answer, the
rule math_rows reads MATH solutions with) if it boxes one, else the gold as written.

Where we differ from math-verify, on purpose, the case says so ("ours", "why"):
- no answer marker: our checker needs \\boxed{}, "####" or "Answer:" (verify.extract_answer);
  math-verify takes the last formula of any text. A policy trained here is asked to box its
  answer (tasks/math_datasets.PROMPT_TEMPLATE), so an unmarked answer is a format failure;
- words between two boxes ("\\boxed{1} papers and \\boxed{2} bins", "\\text{ for part (a) and }"):
  math-verify joins them, we read the earlier box as a draft, as in "\\boxed{1} wait, \\boxed{2}";
- boxes with nothing between them ("\\boxed{1}\\boxed{2}"): math-verify joins them, the last box answers here.
Every other case must agree: a change of math-verify's math, or of our extraction, fails here.
"""

from __future__ import annotations

import collections
import json
import os

import pytest

import verify
from tasks import sandbox
from tasks.math_datasets import score_math

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "tests", "data", "math_verify_cases.json"), encoding="utf-8") as f:
    CASES = json.load(f)["cases"]


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    sandbox.shutdown()


def reference_of(gold: str) -> str:
    """The gold as our tasks hold a reference: its boxed answer, else the text itself."""
    return (verify.boxed_answer(gold) if "\\boxed" in gold else None) or gold.strip()


@pytest.fixture(scope="module")
def scored():
    """(case, our reward) for every case: one sandboxed comparison each, ~0.1 s."""
    return [(case, score_math(case["pred"], reference_of(case["gold"]), timeout=10.0)["reward"]) for case in CASES]


def test_every_case_agrees_with_math_verify_or_is_a_named_difference(scored):
    wrong = [(case["from"], case["pred"][:80], case["expected"], reward) for case, reward in scored
             if reward != case.get("ours", case["expected"])]
    assert not wrong, wrong
    for case, _ in scored:                            # each difference is the kind it says it is
        if case.get("why") == "no answer marker":
            assert verify.extract_answer(case["pred"]) is None, case["pred"][:80]
        elif "why" in case:
            assert verify.extract_answer(case["pred"]) is not None
            assert max(case["gold"].count("\\boxed"), case["pred"].count("\\boxed")) >= 2


def test_the_differences_are_counted():
    """141 cases: 88 agree, 53 differ, of which 50 have no answer marker (math-verify credits an
    unmarked answer; ours reads none), 2 have words between two boxes, 1 two boxes with nothing
    between them. Every difference is a case math-verify credits and we do not."""
    kinds = collections.Counter(case.get("why", "agree") for case in CASES)
    assert len(CASES) == 141 and kinds == {"agree": 88, "no answer marker": 50,
                                           "words between two boxes: the earlier one is a draft": 2,
                                           "boxes with nothing between them: the last one answers": 1}
    assert all(case["expected"] == 1 and case["ours"] == 0 for case in CASES if "why" in case)


def test_several_boxes_and_final_answers_are_read_as_math_verify_reads_them(scored):
    """The cases where reading several boxes as one set changes the answer (boxed_answer is not the
    last box, on the gold's side or the pred's) and that are no named difference: 12, each credited as math-verify credits it (main
    read the last box only, on both sides, and credited none of them). The case where a final-
    answer line after the last box wins over it (\\boxed{255}, then "The final answer is
    $10,455$"): credited too (main: 0)."""
    joined = [(case, reward) for case, reward in scored if "why" not in case
              and any("\\boxed" in text and verify.boxed_answer(text) != verify.last_boxed(text)
                     for text in (case["gold"], case["pred"]))]
    assert len(joined) == 12 and all(reward == case["expected"] == 1 for case, reward in joined)
    final = [(case, reward) for case, reward in scored
             if "\\boxed" in case["pred"] and verify.extract_answer(case["pred"]) != verify.boxed_answer(case["pred"])]
    assert len(final) == 1 and all(reward == case["expected"] == 1 for case, reward in final)
