"""The three layers: the lesson's chapters stand alone, the engine uses them, the study uses both.

    chapters      advantages, mass, batching, scheduler, loss, aggregation, exchangeability,
                  verify, diagnostics (top level): the formulas; they import torch, the
                  standard library and each other, and nothing of the project's folders
    toy/          the analogs: the chapters only (and toy/ itself)
    tasks/        rows, checkers and their sandbox: the chapters, never the engine
    integrations/ the plugins for TRL and verl: the chapters and tasks/; of the engine only
                  the embedded model (machinery.warmups, for the example script), never its
                  configuration or train.py
    engine        machinery/ and train.py: the chapters and tasks/, never the study, the
                  benchmarks or the viewer
    tools/        the run viewer (plot_runs.py): the chapters and the engine, never the
                  study or train.py (a run of your own needs nothing of the study)
    bench/        the speed benchmarks: the engine and train.py, never the study
    study         experiments/: anything

A reader who opens a chapter reads the formula and nothing it hides; a change in the
engine cannot reach into the lesson. Checked two ways: by importing each chapter in a
fresh interpreter (what got loaded), and by reading every import of every file (what
could be loaded later, inside a function).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAPTERS = ("advantages", "mass", "batching", "scheduler", "loss", "aggregation", "exchangeability", "verify",
            "diagnostics")
FOLDERS = ("machinery", "tasks", "experiments", "toy", "integrations", "bench", "tools")


# What integrations/ may take from the engine: the embedded model, which the example trains.
ENGINE_FOR_INTEGRATIONS = ("machinery.warmups",)


def project_imports(path: str) -> set[str]:
    """The project modules a file imports anywhere (module level or in a function), as
    "loss", "train", or folder.module ("machinery.config", "toy.bandit")."""
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {".".join(a.name.split(".")[:2]) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if "." in node.module or node.module not in FOLDERS:        # from machinery.config import X, from loss import X
                names.add(".".join(node.module.split(".")[:2]))
            else:                                                       # from machinery import config, checks
                names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] in set(FOLDERS) | set(CHAPTERS) | {"train"}}


def layering_problems(repo: str = REPO) -> list[str]:
    """One line per import that crosses the layers the wrong way.

    A forbidden name is a chapter or train ("loss", "train"), a whole folder ("machinery":
    every module in it) or one module of a folder ("machinery.config").
    """
    problems = []
    engine = {f"machinery.{os.path.basename(p)[:-3]}" for p in files_in_repo(repo, "machinery")}
    rules = {**{os.path.join(repo, f"{c}.py"): set(FOLDERS) | {"train"} for c in CHAPTERS},
             **{p: {"machinery", "tasks", "experiments", "integrations", "bench", "tools", "train"}
                for p in files_in_repo(repo, "toy")},
             **{p: {"machinery", "experiments", "toy", "integrations", "bench", "tools", "train"}
                for p in files_in_repo(repo, "tasks")},
             **{p: (engine - set(ENGINE_FOR_INTEGRATIONS)) | {"experiments", "toy", "bench", "tools", "train"}
                for p in files_in_repo(repo, "integrations")},
             **{p: {"experiments", "bench", "tools", "train"} for p in files_in_repo(repo, "machinery")},
             **{p: {"experiments", "bench", "toy", "integrations", "train"} for p in files_in_repo(repo, "tools")},
             **{p: {"experiments", "toy", "integrations"} for p in files_in_repo(repo, "bench")},
             os.path.join(repo, "train.py"): {"experiments", "bench", "tools"}}
    for path, forbidden in rules.items():
        if os.path.isfile(path):
            bad = sorted(name for name in project_imports(path)
                         if any(name == f or name.startswith(f + ".") for f in forbidden))
            problems += [f"{os.path.relpath(path, repo)} imports {name}" for name in bad]
    return problems


def files_in_repo(repo: str, folder: str) -> list[str]:
    root = os.path.join(repo, folder)
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py")) if os.path.isdir(root) else []


def test_no_import_crosses_the_layers_the_wrong_way():
    assert layering_problems() == []


LOADED_BY_EACH_CHAPTER = """
import json, sys
sys.path.insert(0, sys.argv[1])
project = set(json.loads(sys.argv[2]))
loaded = {}
for chapter in json.loads(sys.argv[3]):
    __import__(chapter)
    loaded[chapter] = sorted({m.split(".")[0] for m in sys.modules} & project)
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def loaded_by_each_chapter():
    """{chapter: the project's folders (and train) in sys.modules after importing it}, from one
    fresh interpreter that imports the chapters in turn (a process per chapter paid ~4 s of
    torch's import each). What a chapter loads stays in sys.modules, so a chapter that loads a
    folder shows it, and so does every chapter after it: the first one named is the culprit."""
    out = subprocess.run([sys.executable, "-c", LOADED_BY_EACH_CHAPTER, REPO, json.dumps([*FOLDERS, "train"]),
                          json.dumps(CHAPTERS)], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_imported_alone_loads_nothing_of_the_projects_folders(chapter, loaded_by_each_chapter):
    assert loaded_by_each_chapter[chapter] == [], loaded_by_each_chapter


def test_the_checker_sees_a_chapter_that_imports_the_engine(tmp_path):
    # negative control: a chapter reaching into machinery/ (in a function), a task into the
    # engine, the engine into the study, the toy into the engine, an integration into the
    # engine's configuration, the viewer and the benchmarks into the study; and what is allowed
    # next to each (the integration's example taking the embedded model, the toy its own modules
    # and the chapters, the viewer the engine's checks, the benchmarks train.py and the engine)
    for folder in ("machinery", "tasks", "toy", "integrations", "tools", "bench"):
        (tmp_path / folder).mkdir()
    (tmp_path / "machinery" / "config.py").write_text("")
    (tmp_path / "machinery" / "warmups.py").write_text("")
    (tmp_path / "loss.py").write_text("import torch\ndef f():\n    from machinery import forward\n")
    (tmp_path / "tasks" / "t.py").write_text("from machinery import checks\n")
    (tmp_path / "machinery" / "m.py").write_text("import experiments.pages\nimport tasks\n")
    (tmp_path / "train.py").write_text("from machinery import m\n")
    (tmp_path / "toy" / "__main__.py").write_text("import loss\nfrom toy import bandit\nfrom machinery import checks\n")
    (tmp_path / "integrations" / "plug.py").write_text("import loss\nfrom machinery.config import step_hyper\n")
    (tmp_path / "integrations" / "example.py").write_text("from machinery import warmups\nimport tasks\n"
                                                          "def f():\n    import train\n")
    (tmp_path / "tools" / "viewer.py").write_text("from machinery import checks\nfrom experiments import claims\n")
    (tmp_path / "bench" / "__main__.py").write_text("import train\nfrom machinery import forward\n"
                                                    "from experiments.pages import fmt\n")
    assert layering_problems(str(tmp_path)) == [
        "loss.py imports machinery.forward", "toy/__main__.py imports machinery.checks",
        "tasks/t.py imports machinery.checks", "integrations/example.py imports train",
        "integrations/plug.py imports machinery.config", "machinery/m.py imports experiments.pages",
        "tools/viewer.py imports experiments.claims", "bench/__main__.py imports experiments.pages"]
