"""The three layers: the lesson's chapters stand alone, the engine uses them, the study uses both.

    chapters   advantages, mass, batching, scheduler, loss, verify, diagnostics (top level):
               the formulas; they import torch, the standard library and each other, and
               nothing of the project's folders
    tasks/     rows, checkers and their sandbox: the chapters, never the engine
    engine     machinery/ and train.py: the chapters and tasks/, never the study
    study      experiments/: anything

A reader who opens a chapter reads the formula and nothing it hides; a change in the
engine cannot reach into the lesson. Checked two ways: by importing each chapter in a
fresh interpreter (what got loaded), and by reading every import of every file (what
could be loaded later, inside a function).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAPTERS = ("advantages", "mass", "batching", "scheduler", "loss", "verify", "diagnostics")
FOLDERS = ("machinery", "tasks", "experiments", "toy", "integrations")


def project_imports(path: str) -> set[str]:
    """The top-level project names a file imports anywhere (module level or in a function)."""
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & (set(FOLDERS) | set(CHAPTERS) | {"train"})


def layering_problems(repo: str = REPO) -> list[str]:
    """One line per import that crosses the layers the wrong way."""
    problems = []
    rules = {**{os.path.join(repo, f"{c}.py"): set(FOLDERS) | {"train"} for c in CHAPTERS},
             **{p: {"machinery", "experiments", "toy", "integrations", "train"}
                for p in files_in_repo(repo, "tasks")},
             **{p: {"experiments", "train"} for p in files_in_repo(repo, "machinery")},
             os.path.join(repo, "train.py"): {"experiments"}}
    for path, forbidden in rules.items():
        if os.path.isfile(path):
            bad = sorted(project_imports(path) & forbidden)
            problems += [f"{os.path.relpath(path, repo)} imports {name}" for name in bad]
    return problems


def files_in_repo(repo: str, folder: str) -> list[str]:
    root = os.path.join(repo, folder)
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py")) if os.path.isdir(root) else []


def test_no_import_crosses_the_layers_the_wrong_way():
    assert layering_problems() == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_imported_alone_loads_nothing_of_the_projects_folders(chapter):
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import {chapter}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(FOLDERS) | {'train'}!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_the_checker_sees_a_chapter_that_imports_the_engine(tmp_path):
    # negative control: a chapter reaching into machinery/ (in a function), a task into the
    # engine, the engine into the study
    for folder in ("machinery", "tasks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "loss.py").write_text("import torch\ndef f():\n    from machinery import forward\n")
    (tmp_path / "tasks" / "t.py").write_text("from machinery import checks\n")
    (tmp_path / "machinery" / "m.py").write_text("import experiments.pages\nimport tasks\n")
    (tmp_path / "train.py").write_text("from machinery import m\n")
    assert layering_problems(str(tmp_path)) == ["loss.py imports machinery", "tasks/t.py imports machinery",
                                                "machinery/m.py imports experiments"]
