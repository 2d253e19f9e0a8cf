"""Addition: the synthetic task the CPU default trains on, with the column carries written out.

It exists to give a tiny model a *verifiable* task whose responses mix two kinds of
tokens, exactly the split the Cancellation Hypothesis paper cares about:

  prompt    "347+85\n"
  response  "7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n"

- template / format tokens  "+", "=", "\n", "A", ":"  appear in every response at the same
  positions, correct or not: their updates should cancel inside a group;
- reasoning tokens          the digits, which differ between right and wrong responses:
  they should receive the credit.

Column k (least significant first) is written "x+y+c=ds": the two operand digits x and y
(the shorter operand is zero-padded), the carry-in c (0 or 1), and the two-digit column
sum ds (d is the carry-out, s the result digit). The answer line "A:<int>" holds the sum
with no leading zeros. Its checker is verify.check_addition, the verifier chapter's
worked example. Held-out problems are disjoint from training ones by construction
(tasks/task.py's split).
"""

from __future__ import annotations

import random

import verify
from tasks.task import HELD_OUT_BUCKETS, Task, is_held_out, split_seed

DEFAULT_N = {"train": 2000, "test": 200}


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
    unsure at exactly the tokens that decide the reward (machinery/warmups.py says why).
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


def addition_split_rows(n: int, split: str, digits: int = 3, seed: int = 0) -> list[dict]:
    """n addition rows of one split; train and test never share a problem.

    Disjoint by construction, not by filtering against one training set: a+b is held out
    iff crc32("min+max") % HELD_OUT_BUCKETS == 0, so every test problem differs from every
    train problem for ANY n, seed and digits, and a+b, b+a land on the same side (no
    commuted copies). The test split also uses seed + EVAL_SEED_OFFSET. Rows are
    make_addition_rows' in its order with the other side's skipped; as
    make_addition_rows(k)[:m] == make_addition_rows(m), the result is deterministic in
    (n, split, digits, seed). Duplicates within a split are kept (digits=1 has 100 ordered
    pairs). About 1/HELD_OUT_BUCKETS of the space is never trained on, the point.
    ValueError if the split's side is empty (never for digits >= 1; the loop is bounded).
    """
    rows_seed = split_seed(seed, split)
    if n < 0:
        raise ValueError(f"addition_split_rows needs n >= 0, got n={n}")
    held_out = split == "test"
    k = max(64, 2 * n * (HELD_OUT_BUCKETS if held_out else 1))
    while True:
        pool = make_addition_rows(k, digits=digits, seed=rows_seed)
        kept = [r for r in pool if is_held_out(problem_key(r["prompt"])) == held_out]
        if len(kept) >= n:
            return kept[:n]
        if k > 1000 * (n + 64):
            raise ValueError(f"could not draw {n} {split} addition problems with digits={digits}")
        k *= 2


def problem_key(prompt: str) -> str:
    """The problem's canonical text for the held-out split: "a+b\\n" -> "min+max", so a+b
    and b+a land on the same side and the test set holds no commuted training problems."""
    a, b = (int(x) for x in prompt.strip().split("+"))
    return f"{min(a, b)}+{max(a, b)}"


def is_reasoning_text(token_text: str) -> bool:
    """A token is reasoning iff its text holds an ASCII digit (the operand, carry, column-sum
    and answer digits); "+", "=", "\\n", "A", ":" and EOS are the format. A token mixing
    both ("=1", BPE only) counts as reasoning: it carries a digit the answer depends on.
    str.isdigit() would also count "²" or "٣"."""
    return any(c in "0123456789" for c in token_text)


def rows(n: int | None, split: str, seed: int = 0, digits: int = 3) -> list[dict]:
    """The task's rows of one split (n None: DEFAULT_N[split])."""
    return addition_split_rows(DEFAULT_N[split] if n is None else n, split, digits=digits, seed=seed)


def warmup_fields(digits: int) -> dict:
    """The embedded model's warm-up (warmups.WarmupConfig fields): width 128 with 4 heads
    of 32, 1500 steps at learning rate 1e-3 decayed to 0, on the noisy teacher's targets
    (digit_noise 0.25). It converges to a model that gets about half the held-out
    problems right from any seed (machinery/warmups.py's header says why). At width 64 with 2
    heads, or at learning rate 3e-3, some seeds never learned to copy the answer line
    or the carry of the second column."""
    return {"digits": digits, "hidden_size": 128, "num_heads": 4, "lr": 1e-3, "max_steps": 1500,
            "lr_decay": True, "digit_noise": 0.25, "eval_every": 100}


TASK = Task(name="addition", rows=rows, check=verify.check_addition, is_reasoning_text=is_reasoning_text,
            eval_prompts=200, eval_samples=4, warmup=warmup_fields,
            max_response_tokens=lambda digits: 10 * digits + 5)
"""--data addition. max_response_tokens: digits column lines of 9 characters ("7+5+0=12\\n"),
"A:" + up to digits+1 answer digits + "\\n", then EOS: 10*digits + 5 (35 for 3 digits)."""
