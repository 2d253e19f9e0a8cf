"""docs/extending.md's recipe "Add a sweep with a declared claim", followed in a copy of the repository.

The recipe's code blocks are its edits (a design file, a budget line, an import and an entry in
the registry) and its shell block its commands. This test reads them from the recipe, applies
each block to the file the line before it names, and runs the commands as written (the sweep's
with a tiny budget on a tiny fitted model appended), so a recipe that names a wrong file, key,
import or command fails here, not in a reader's hands. The copy has no committed sweep data, so
`report` writes the new sweep's page alone, in seconds.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.engine.helpers import copy_of_the_repository

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLE = "## Add a sweep with a declared claim"
# The tiny budget: 2 RL seeds of warm-up seed 0, 2 steps; then, after `--`, train.py's flags for
# a tiny model and batch, an evaluation and the token diagnostics (the first-step residual) every step.
TINY = ["--warmup_seeds", "0", "--seeds", "0,1", "--steps", "2", "--jobs", "2"]


def recipe() -> tuple[list[tuple[str, str]], list[str]]:
    """([(file, python block)], shell commands) of the recipe, in its order. A python block's
    file is the last backticked *.py path of the prose before it (since the block before: the
    step that says where the code goes); comments and `git` lines of the shell block are left out."""
    text = open(os.path.join(REPO, "docs", "extending.md")).read()
    assert TITLE in text, f"docs/extending.md has no section {TITLE!r}"
    section = text.split(TITLE, 1)[1].split("\n## ", 1)[0]
    edits = []
    for before, block in re.findall(r"((?:(?!```).)*?)```python\n(.*?)```", section, re.S):
        paths = re.findall(r"`([\w/]+\.py)`", before)
        assert paths, f"no file named before the block: {before[-300:]!r}"
        edits.append((paths[-1], block))
    shell = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(shell) == 1, "the recipe has one shell block"
    commands = [line.split("  #", 1)[0].strip() for line in shell[0].splitlines()]
    return edits, [c for c in commands if c and not c.startswith("git ")]


def apply(copy, path: str, block: str) -> None:
    """One code block of the recipe, where its prose says: a new file, a line of a task's
    "sweeps" in designs.TASKS, or the registry's import and SWEEPS entry."""
    target = copy / path
    if path == "experiments/designs.py":                      # one line in TASKS["addition"]["sweeps"]
        line = block.strip()
        assert line.count("\n") == 0 and line.endswith(","), line
        source = target.read_text()
        at = source.index('"sweeps": {\n', source.index('\n    "addition": {')) + len('"sweeps": {\n')
        target.write_text(source[:at] + " " * 12 + line + "\n" + source[at:])
    elif path == "experiments/registry.py":                   # the import, then an entry of SWEEPS
        source = target.read_text()
        for line in block.strip().splitlines():
            if line.startswith("from "):
                last = max(m.end() for m in re.finditer(r"^from experiments\.designs\w* import .*\n", source, re.M))
                source = source[:last] + line + "\n" + source[last:]
            else:
                entry = re.fullmatch(r"SWEEPS = \{\.\.\., (.+)\}", line)
                assert entry, line
                end = source.index("}\n", source.index("SWEEPS = {"))
                source = source[:end] + ", " + entry.group(1) + source[end:]
        target.write_text(source)
    else:                                                     # a design file of its own
        assert not target.exists(), f"{path} exists: the recipe's file would replace it"
        target.write_text(block)


@pytest.fixture
def fitted_dir(addition_tiny_model, tmp_path):
    """The suite's tiny model fitted to 1-digit addition, saved: it solves some prompts, so the
    runs have rewards, advantages and residuals to measure."""
    model, tok = addition_tiny_model
    d = tmp_path / "fitted"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


# A reward that mixes every group (the parity of the response's length): the tiny model solves
# no 1-digit sum in 2 steps, and a group of equal rewards has no advantage, so nothing to
# cancel and no first-step residual to check (the page would say "not measured").
PARITY_REWARD = "def score(response, answer, prompt):\n    return float(len(response) % 2)\n"


@pytest.mark.slow
def test_the_sweep_recipe_end_to_end(fitted_dir, tmp_path):
    edits, commands = recipe()
    assert [path for path, _ in edits] == ["experiments/designs_split.py", "experiments/designs.py",
                                           "experiments/registry.py"]
    assert [c.split()[:4] for c in commands] == [["python", "-m", "experiments.sweep", "plan"],
                                                 ["python", "-m", "experiments.sweep", "split"],
                                                 ["python", "-m", "experiments.sweep", "report"]]
    copy = copy_of_the_repository(tmp_path, leave_out=("experiments/results",))   # no sweep data
    (copy / "experiments" / "results").mkdir()
    for path, block in edits:
        apply(copy, path, block)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    (tmp_path / "parity_reward.py").write_text(PARITY_REWARD)
    extra = ["--", "--model", fitted_dir, "--reward", f"{tmp_path / 'parity_reward.py'}:score", "--digits", "1", "--prompts_per_step", "4", "--group_size", "4",
             "--max_new_tokens", "24", "--n_eval", "6", "--eval_samples", "2", "--eval_every", "1",
             "--flip_every", "1", "--save_every", "0"]
    said = {}
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "experiments.sweep"], command
        name = argv[3]                                      # plan, the sweep's name, report
        argv = [sys.executable, *argv[1:]] + ([*TINY, *extra] if name not in ("plan", "report") else [])
        done = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
        said[name] = done.stdout
    # plan: its budget line (3 arms x 2 warm-up seeds x 5 RL seeds, 100 steps, 1 part) and its command
    assert re.search(r"^    split +addition +3 +30 +100 ", said["plan"], re.M), said["plan"][:3000]
    assert "python -m experiments.sweep split --task addition" in said["plan"]
    # the sweep: every arm from both pairs, finished
    runs = copy / "runs" / "sweeps" / "addition" / "split"
    for arm in ("random", "query", "random_masked"):
        for seed in (0, 1):
            assert (runs / arm / "warmup_0" / f"seed_{seed}" / "done.json").is_file(), (arm, seed)
    # report: the page, with the recipe's checks, held-fixed check and findings; claims.md lists them
    page = (copy / "experiments" / "results" / "sweep_addition_split.md").read_text()
    assert "6 of 30 planned" in page and "INCOMPLETE" in page           # 2 of the design's 10 pairs
    assert "| query mini-batches never split a group | split groups / step | query | 2 |" in page
    assert re.search(r"\| whole groups, zero-sum advantage: the first optimizer step's residual is 0 to rounding "
                     r"\| first-step residual \| query \| 2 \| .* \| \*\*pass\*\* \|", page), page
    held = page.split("## Held fixed", 1)[1].split("\n## ", 1)[0]
    assert "random_masked draws random's split" in held and "NOT MET" not in held and "| **met** (tolerance" in held, held
    for text in ("2 query mini-batches: higher final pass@1 than random",
                 "random_masked: lower final pass@1 than random (what carries gradient)"):
        assert text in page and text in (copy / "experiments" / "results" / "claims.md").read_text()
    assert "- final entropy: mean token entropy at the last step, nats" in page      # its own row
    # the suite's declaration rules hold for the new sweep (its records, its budget)
    checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "tests/study/test_claims.py", "-k", "declares_rows or the_budget"],
                            cwd=copy, env=env, capture_output=True, text=True)
    assert checks.returncode == 0 and "2 passed" in checks.stdout, checks.stdout[-3000:]
