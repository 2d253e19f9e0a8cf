"""The scorer sandbox's tests from a clone only its owner may enter (tasks/sandbox.py).

As root the sandbox's children run as `nobody`, and a clone made where `mktemp -d` puts it
(mode 0700), or under /root, is closed to `nobody`. The product works from there (a
worker reads its own files as root, before it drops root; bubblewrap binds them with
readable directories above; sandbox._warn_unreadable says so in one line where a
Python's own directory is closed), but a test that made a child read a file of the
repository failed there, and only there: the suite was red for a user who cloned it the
way a container's root does. This test copies the checkout's code and tests into
tmp_path/locked/ (chmod 700) and runs, there and in a pytest of its own, a locked-down
child's reads (test_sandbox_filter.py) and a real scorer's round trip through the sandbox
(test_sandbox.py), under bubblewrap and on the built-in path. As a user who is not root
the children run as that user, who may enter the directory: it passes trivially then.
"""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The tests run from the locked clone: a child that reads a file after dropping root, and
# one answer right and one wrong through an eval-based scorer (n_queens: reasoning-gym's
# scorer evaluates the answer text), the issue's own case.
SELECTED = ["tests/engine/test_sandbox_filter.py::test_a_locked_down_child_can_read_and_compute_and_nothing_else",
            "tests/engine/test_sandbox.py::test_a_right_answer_scores_1_and_a_wrong_one_0[reasoning_gym:n_queens]"]


def copy_checkout(dest: str) -> None:
    """The code and tests of this checkout (as they are on disk, edits included) into dest:
    the top-level chapters and train.py, tasks/, machinery/, tests/ and pytest.ini; not
    .git, venvs, caches, docs or experiments."""
    os.makedirs(dest)
    for name in os.listdir(REPO):
        source = os.path.join(REPO, name)
        if name.endswith(".py") or name == "pytest.ini":
            shutil.copy2(source, dest)
        elif name in ("tasks", "machinery", "tests"):
            shutil.copytree(source, os.path.join(dest, name), ignore=shutil.ignore_patterns("__pycache__"))


@pytest.mark.parametrize("choice", ["bwrap", "builtin"])
@pytest.mark.slow
def test_the_sandboxs_tests_pass_from_a_clone_only_its_owner_may_enter(tmp_path, choice):
    pytest.importorskip("reasoning_gym")
    if choice == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bwrap is not on PATH")
    locked = tmp_path / "locked"
    copy_checkout(str(locked / "c"))
    os.chmod(locked, 0o700)
    assert os.stat(locked).st_mode & 0o777 == 0o700
    env = {**os.environ, "TOKENCREDIT_SANDBOX": choice, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)                          # the clone's own code, not this checkout's
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECTED],
                         cwd=locked / "c", env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(SELECTED)} passed" in out.stdout, out.stdout[-2000:]
