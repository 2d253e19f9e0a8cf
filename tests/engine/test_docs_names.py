"""The documentation names code that exists.

docs/*.md and the README point a reader at functions: `vllm_staleness.staleness_gap`, the
"source" column of docs/metrics.md, `machinery/token_diagnostics.after_update`. A rename
or a move leaves such a name pointing at nothing, and no other test notices: the reader
searches for a function that is gone. This test reads every such name and looks it up in
the module it names (by file name, anywhere in the project; a package by its __init__.py),
among the names the module defines or imports at its top level.

Left out: docs/LOG.md (history names what the code was then) and the sweep pages (written
by `report` from the committed data; their text comes from experiments/pages.py).

And the README's "Files" section names every module of the engine, the study, the
benchmarks, the run viewer and the integrations, so the house it describes is the house there is; and the times the README
and the CPU recipe promise are times docs/results.md measured, with the machine's load.
"""

import ast
import functools
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A backticked `module.name`, `module.name()` or `folder/module.name`, alone in its backticks.
BACKTICKED = re.compile(r"`((?:[\w]+/)*)(\w+)\.(\w+)(?:\(\))?`")
# The last cell of a docs/metrics.md row: "module.name" or "module.name (folder/)".
SOURCE_CELL = re.compile(r"\|\s*(\w+)\.(\w+)(?: \([\w/.]+\))?\s*\|\s*$")
FILE_ENDINGS = {"py", "md", "yaml", "yml", "json", "jsonl", "txt", "png", "gz", "sh", "safetensors", "toml", "cfg",
                "ini", "log", "csv", "pt", "gguf", "whl"}


def tracked(pattern: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def top_level_names(path: str) -> set[str]:
    """What `module.NAME` can mean: the module's top-level defs, classes, assignments and imports."""
    tree = ast.parse(open(os.path.join(REPO, path)).read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@functools.cache                        # parsed once for every test of this file
def project_modules() -> dict[str, set[str]]:
    """{module name: its top-level names} for every tracked .py file outside tests/ (a
    package's name maps to its __init__.py). Two files of one name: their names merged."""
    modules = {}
    for path in tracked("*.py"):
        if path.startswith("tests/"):
            continue
        parts = path[:-3].split("/")
        name = parts[-2] if parts[-1] == "__init__" else parts[-1]
        if name == "__main__":
            continue
        modules.setdefault(name, set()).update(top_level_names(path))
    return modules


def other_library_columns(header: str) -> set[int]:
    """The columns of a table whose header names TRL or verl: their cells hold those
    libraries' settings (verl's `rollout.n` is a config key, not our machinery/rollout.py)."""
    return {i for i, cell in enumerate(header.split("|")) if re.search(r"\b(TRL|verl)\b", cell)}


def named_in_docs(text: str, metrics_page: bool) -> list[tuple[int, str, str]]:
    """(line number, module, name) for every code name the text gives, but in the cells of
    another library's column."""
    found, lines, skip = [], text.splitlines(), set()
    for number, line in enumerate(lines, 1):
        if line.startswith("|") and number < len(lines) and lines[number].startswith("|---"):
            skip = other_library_columns(line)                  # a table's header row
        elif not line.startswith("|"):
            skip = set()
        cells = line.split("|") if line.startswith("|") else [line]
        for folders, module, name in (m for i, cell in enumerate(cells) if i not in skip
                                      for m in BACKTICKED.findall(cell)):
            if name not in FILE_ENDINGS:
                found.append((number, module, name))
        if metrics_page and (m := SOURCE_CELL.search(line)) and m.group(2) not in FILE_ENDINGS:
            found.append((number, m.group(1), m.group(2)))
    return found


def stale_names(doc_texts: dict[str, str], modules: dict[str, set[str]]) -> list[str]:
    """'docs/x.md:12 module.name' for each name whose module exists and lacks it."""
    return [f"{doc}:{number} {module}.{name}"
            for doc, text in doc_texts.items()
            for number, module, name in named_in_docs(text, doc.endswith("metrics.md"))
            if module in modules and name not in modules[module]]


def documentation() -> dict[str, str]:
    paths = ["README.md"] + [p for p in tracked("docs/*.md")
                             if p != "docs/LOG.md" and not os.path.basename(p).startswith("sweep_")]
    return {p: open(os.path.join(REPO, p)).read() for p in paths}


def test_every_function_the_documentation_names_exists():
    docs, modules = documentation(), project_modules()
    assert len(docs) >= 8 and "vllm_rollout" in modules and "diagnostics" in modules
    checked = sum(1 for text in docs.values() for _, module, _ in named_in_docs(text, True) if module in modules)
    assert checked >= 50                                    # the test reads the names it is meant to read
    assert stale_names(docs, modules) == []


@pytest.mark.parametrize("doc,text,expected", [
    ("docs/math.md", "In the code: `vllm_rollout.canary_gap`.", ["docs/math.md:1 vllm_rollout.canary_gap"]),
    ("docs/math.md", "See `machinery/token_diagnostics.gone()` and `loss.policy_loss`.",
     ["docs/math.md:1 token_diagnostics.gone"]),
    ("docs/metrics.md", "| `vllm/canary_gap` | the gap | vllm_rollout.canary_gap |",
     ["docs/metrics.md:1 vllm_rollout.canary_gap"]),
    ("docs/metrics.md", "| `x` | y | token_diagnostics.token_values (machinery/) |", []),
    ("docs/vllm.md", "`train.py`, `requirements/gpu.txt`, `unknown_module.thing`", []),
    ("docs/trl_verl.md", "| concept | ours | verl |\n|---|---|---|\n| G | `rollout.gone` | `rollout.n` |",
     ["docs/trl_verl.md:3 rollout.gone"]),
])
def test_a_name_that_is_gone_is_found_and_files_and_other_libraries_are_not(doc, text, expected):
    assert stale_names({doc: text}, project_modules()) == expected


def test_the_readmes_files_section_names_every_module_of_the_engine_the_study_and_the_integrations():
    """README's "Files" lists the house; a module added to machinery/, experiments/, bench/,
    tools/ or integrations/ without a word there is one a reader cannot find from the README
    (tasks/ and toy/ are described by what each file holds, not by name)."""
    readme = open(os.path.join(REPO, "README.md")).read()
    files = readme.split("## Files", 1)[1].split("\n## ", 1)[0]
    modules = [p for folder in ("machinery", "experiments", "bench", "tools", "integrations")
               for p in tracked(f"{folder}/*.py")
               if not p.endswith("__init__.py")]
    assert len(modules) >= 30
    assert [p for p in modules if not re.search(rf"\b{re.escape(os.path.basename(p))}", files)] == []


def test_the_readme_teaches_in_at_most_16_kb():
    """The README is the lesson's front page, kept to 16 KB (16,384 bytes): reference
    material (recipes, every flag, every measurement) lives in docs/, which it links. Each
    results commit adds a line somewhere; this keeps the total where it was promised."""
    size = os.path.getsize(os.path.join(REPO, "README.md"))
    assert size <= 16 * 1024, f"README.md is {size} bytes; move reference material to docs/"


def test_the_times_the_readme_and_the_cpu_recipe_promise_are_measured_with_the_load_said():
    """A time a newcomer plans by is one docs/results.md measured, the machine's load beside
    it: "a few minutes" for the suite was 7-16, "under 20 (30) minutes" for the SmolLM2 recipe
    was 75-90 on a loaded machine."""
    readme = open(os.path.join(REPO, "README.md")).read()
    recipe = open(os.path.join(REPO, "recipes", "smollm2-135m-addition-cpu.yaml")).read()
    results = open(os.path.join(REPO, "docs", "results.md")).read()
    tests_and_ci = results.split("## Tests and CI", 1)[1].split("\n## ", 1)[0]
    smollm2 = results.split("## A real pretrained model learns on a CPU", 1)[1].split("\n## ", 1)[0]
    test_line = next(line for line in readme.split("## Quickstart", 1)[1].splitlines() if "python -m pytest" in line)
    suite = re.findall(r"\d+ min \d+ s", test_line)
    # one time for the whole suite, or one per part (the main suite, the sandbox's): each measured there
    assert len(suite) in (1, 2) and all(t in tests_and_ci for t in suite) and "quiet" in test_line
    for text in (readme.split("On a CPU,", 1)[1].split("\n\n", 1)[0], recipe.split("\nmodel:", 1)[0]):
        quoted = re.findall(r"\d+(?:\.\d+)?-\d+(?:\.\d+)? (?:min|s)\b", text)   # ranges: "18.5-19.5 min", "8-9 s"
        assert len(quoted) >= 3 and "load average" in text, text
        for span in quoted:                 # the range itself, or both its ends, in results.md's section
            value, unit = span.split(" ")
            low, high = value.split("-")
            assert span in smollm2 or (f"{low} {unit}" in smollm2 and f"{high} {unit}" in smollm2), span
    assert "a few minutes" not in test_line and "under 20 minutes" not in readme and "under 30 minutes" not in recipe
