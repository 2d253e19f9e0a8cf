"""The scorer sandbox inside a training run (tasks/sandbox.py), on both of its paths.

Each test here names the path it runs (TOKENCREDIT_SANDBOX=bwrap, =builtin) rather than
taking the machine's, so that one run of the main suite checks both, as .ci/run's step 1c
does for test_sandbox.py and test_sandbox_breaches.py:
  - whatever bytes a child writes as its reply, train.py finishes: the answer scores 0,
    and the reason is counted in metrics.jsonl and said once on stderr;
  - the workers live as long as the trainer, not as long as the thread that scored a
    batch, and their starts are counted;
  - under bubblewrap the sandbox holds a declared set of files: no repository, no run
    directory, whatever PYTHONPATH says; no bind in bubblewrap's command line; no program
    for matplotlib to run.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import tasks
import verify
from tasks import sandbox, sandbox_view
from tests.engine.sandbox_helpers import (REPLY_HELPER, RIGHT_TIMEOUT, lower_address_space_limits, program, rg_entry,
                                          sandbox_processes)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_QUEENS = "reasoning_gym:n_queens"
PATHS = ["bwrap", "builtin"]


def bwrap_runs() -> bool:
    bwrap = shutil.which("bwrap")
    return bool(bwrap) and subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "true"],
                                          capture_output=True).returncode == 0


@pytest.fixture
def sandbox_path(request, monkeypatch):
    """Fresh workers on the path request.param names; none left for the next test."""
    pytest.importorskip("reasoning_gym")
    if request.param == "bwrap" and not bwrap_runs():
        pytest.skip("bwrap does not run here")
    sandbox.shutdown()
    monkeypatch.setenv(sandbox.CHOICE_VARIABLE, request.param)
    sandbox.take_counts()
    yield request.param
    sandbox.shutdown()


# A payload that writes its own bytes to the reply pipe and exits, before the scorer answers.
RAW_REPLY_HELPER = """
import os, stat
def reply_bytes(data):
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, data)
                break
        except OSError:
            pass
    os._exit(0)
"""

# Replies an answer can write, each with the reason it gets no score ("" : it is scored).
HOSTILE_REPLIES = [
    (b'{"value": ' + b"[" * 990 + b"]" * 990 + b', "missing": []}', "too_deep"),  # ~2 KB: a RecursionError before
    (b'{"value": 1.0, "missing": ["' + b"x" * 5000 + b'"]}', "too_long"),
    (('{"value": "' + "\U0001F600" * 1000 + '", "missing": []}').encode(), "wrong_shape"),   # 4 KB, 12 KB re-encoded
    (('{"value": 0.0, "missing": ["' + "\U0001F600" * 1000 + '"]}').encode(), ""),          # scored: 0.0, names dropped
    (b'\x00{"value": 1.0, "missing": []}', "not_json"),        # json guessed UTF-16: a codec nobody could not read
    (b'{"value": 1.0, "missing": ["\xff\xfe"]}', "not_utf8"),
    (b'{"value": 1.0}', "wrong_shape"),
    (b'{"value": 1e999, "missing": []}', "not_finite"),
]

# train.py with every step's responses replaced: rollout i of a step answers HOSTILE_REPLIES[i]'s
# reply (an n_queens answer that is a program writing those bytes), the last rollout its row's
# right answer. The model still samples (its tokens are trained on); only the texts scored change.
TRAIN_WITH_REPLIES = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    import train
    replies = {replies!r}
    setup = train.setup

    def setup_with_replies(cfg):
        run = setup(cfg)
        sample = run.sampler.sample

        def answers(prompts, G, step):
            rollouts = sample(prompts, G, step)
            entry = next(r["answer"] for r in run.train_rows if r["prompt"] == prompts[-1])
            right = "<answer>" + json.loads(entry)["answer"] + "</answer>"
            rollouts.texts = ["<answer>" + text + "</answer>" for text in replies] + [right]
            return rollouts
        run.sampler.sample = answers
        return run
    train.setup = setup_with_replies
    train.main(sys.argv[1:])
""")


@pytest.mark.parametrize("sandbox_path", PATHS, indirect=True)
@pytest.mark.slow
def test_any_reply_a_child_writes_scores_0_in_a_run_that_finishes_and_its_reason_is_counted_and_said(
        sandbox_path, tiny_dir, tmp_path):
    """Through train.py (3 prompts x 3 rollouts, 2 steps): the reply nested 990 deep, one too
    long, 1,000 emoji as the value and as a name, a NUL byte first, invalid UTF-8, valid JSON
    of the wrong shape, a value of 1e999. Before, the nested reply stopped the run with a
    RecursionError (exit 1), the emoji one killed the channel (two worker starts per
    answer) and the NUL byte the worker (built-in path, as root). Now the run finishes,
    each such answer scores 0, metrics.jsonl counts each reason per step, stderr says each
    reason once, and the two workers start once."""
    replies = [program(RAW_REPLY_HELPER + f"reply_bytes({data!r})") for data, _ in HOSTILE_REPLIES]
    out_dir = tmp_path / "run"
    argv = ["--model", tiny_dir, "--out_dir", str(out_dir), "--data", N_QUEENS, "--n_train", "8", "--n_eval", "4",
            "--prompts_per_step", "3", "--group_size", "3", "--max_new_tokens", "4", "--steps", "2",
            "--eval_every", "0", "--save_every", "0", "--threads", "1"]
    assert len(replies) + 1 == 3 * 3
    env = {**os.environ, sandbox.CHOICE_VARIABLE: sandbox_path, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TRAIN_WITH_REPLIES.format(repo=REPO, replies=replies), *argv],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in open(out_dir / "metrics.jsonl")]
    expected = {}
    for _, reason in HOSTILE_REPLIES:
        if reason:
            expected[f"sandbox/no_score/{reason}"] = expected.get(f"sandbox/no_score/{reason}", 0) + 1
    for line in lines:
        counts = {k: v for k, v in line.items() if k.startswith("sandbox/no_score/")}
        assert counts == expected and line["sandbox/no_score"] == sum(expected.values()), line
        assert line["reward"] == pytest.approx(1 / 9)          # the right answer alone (float32's 1/9)
    assert [line["sandbox/worker_starts"] for line in lines] == [2, 0]
    said = [line for line in done.stderr.splitlines() if "got no score" in line]
    assert sorted(said) == sorted(set(said)) and len(said) == len({r for _, r in HOSTILE_REPLIES if r}), said
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def worker_pids() -> set[int]:
    """The process ids of the live workers' outermost processes (bwrap, or the built-in path's)."""
    return {w.proc.pid for pool in sandbox._pools.values() for w in list(pool.queue) if w is not None}


@pytest.mark.parametrize("sandbox_path", PATHS, indirect=True)
@pytest.mark.slow
def test_the_workers_live_as_long_as_the_trainer_and_their_starts_are_counted(sandbox_path):
    """Five scoring batches, each on threads of its own (verify.score's pool), as a run's
    steps are: the same two workers score them all, two starts in all. Before, under
    bubblewrap, --die-with-parent killed the workers when the batch's threads ended: ten
    starts, seconds each. Then both workers' limits are lowered from outside (a breach's
    doing): each is replaced, two starts more, and the right answers still score 1."""
    entry = rg_entry("n_queens")
    right = "<answer>" + json.loads(entry)["answer"] + "</answer>"
    task = tasks.get(N_QUEENS)
    seen = []
    for _ in range(5):
        scores = verify.score([right, "<answer>0</answer>"] * 2, [entry] * 4, task, ["q"] * 4, timeout=RIGHT_TIMEOUT)
        assert [s["reward"] for s in scores] == [1.0, 0.0, 1.0, 0.0]
        seen.append(worker_pids())
    assert len(set().union(*seen)) == 2 and all(pids == seen[0] for pids in seen), seen
    assert sandbox.take_counts() == {"worker_starts": 2}
    assert lower_address_space_limits(sorted(sandbox_processes())) >= 2
    scores = verify.score([right] * 4, [entry] * 4, task, ["q"] * 4, timeout=RIGHT_TIMEOUT)
    assert [s["reward"] for s in scores] == [1.0] * 4
    assert sandbox.take_counts() == {"worker_starts": 2} and not worker_pids() & seen[0]


def fake_repository(root: str) -> str:
    """A directory like a clone: a .git, a module, and a run directory (runs/r: config.json,
    metrics.jsonl) holding a secret-looking sample."""
    os.makedirs(os.path.join(root, ".git"))
    with open(os.path.join(root, ".git", "config"), "w") as f:
        f.write('[remote "origin"]\n\turl = https://token@example.com/repo\n')
    os.makedirs(os.path.join(root, "runs", "r"))
    for name, text in (("config.json", "{}"), ("metrics.jsonl", '{"step": 1}\n'), ("samples.jsonl", "secret\n")):
        with open(os.path.join(root, "runs", "r", name), "w") as f:
            f.write(text)
    with open(os.path.join(root, "tc_repo_module.py"), "w") as f:
        f.write("X = 1\n")
    for base, dirs, files in os.walk(root):
        os.chmod(base, 0o755)
        for name in files:
            os.chmod(os.path.join(base, name), 0o644)
    return root


@pytest.mark.slow
def test_under_bubblewrap_no_repository_and_no_run_directory_is_there_whatever_pythonpath_says(monkeypatch):
    """PYTHONPATH=$PWD (docs/trl_verl.md's command line) put the whole clone in the sandbox: a
    child read .git/config and a run directory's files. Here PYTHONPATH names this checkout
    and a fake clone with a run directory; a child looks for each (bits: 1 this checkout's
    tasks/, 2 its .git, 4 the fake .git/config, 8 the run's samples.jsonl, 16 the fake clone
    at all). Nothing is there; a right answer still scores 1."""
    pytest.importorskip("reasoning_gym")
    if not bwrap_runs():
        pytest.skip("bwrap does not run here")
    fake = fake_repository(tempfile.mkdtemp(prefix="tokencredit-fake-clone-", dir="/tmp"))
    sandbox.shutdown()
    monkeypatch.setenv(sandbox.CHOICE_VARIABLE, "bwrap")
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{fake}")
    sandbox_view.worker_sys_path.cache_clear()
    try:
        command = sandbox.bubblewrap_command("bwrap")
        binds = [command[i + 1] for i, arg in enumerate(command) if arg == "--ro-bind"]
        # The Python environment is the scorers' own, bound wherever it lives: CI's venv is
        # inside the clone (REPO/.venv), and binding it shows the environment, not the clone.
        python_env = (sys.prefix, sys.prefix + "/")
        strays = [b for b in binds if (b in (REPO, fake) or b.startswith((REPO + "/", fake + "/")))
                  and not (b == sys.prefix or b.startswith(python_env[1]))]
        assert sorted(strays) == sorted(sandbox_view.WORKER_FILES), binds      # the worker's two files, no more
        entry = rg_entry("n_queens")
        checks = [(1, os.path.join(REPO, "tasks")), (2, os.path.join(REPO, ".git")),
                  (4, os.path.join(fake, ".git", "config")), (8, os.path.join(fake, "runs", "r", "samples.jsonl")),
                  (16, fake)]
        code = REPLY_HELPER + f"reply({{'value': sum(bit for bit, path in {checks!r} if os.path.exists(path)), " \
                              "'missing': []})"
        assert sandbox.run_scorer(N_QUEENS, [program(code), entry], RIGHT_TIMEOUT) == 0.0
        assert sandbox.run_scorer(N_QUEENS, [json.loads(entry)["answer"], entry], RIGHT_TIMEOUT) == 1.0
        assert sandbox.WORKER_INFO[N_QUEENS]["sandbox"] == "bubblewrap"
    finally:
        sandbox.shutdown()
        sandbox_view.worker_sys_path.cache_clear()
        shutil.rmtree(fake, ignore_errors=True)


def test_what_is_never_bound_whatever_the_search_path(tmp_path):
    """sandbox_view.refused_bind, directly: a directory holding a .git (a file, as in a git
    worktree, counts), a run directory or one holding one two levels down, the home
    directory and what is above it; a plain directory of modules passes."""
    plain = tmp_path / "site"
    plain.mkdir()
    (plain / "m.py").write_text("X = 1\n")
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /elsewhere\n")
    clone = fake_repository(str(tmp_path / "clone"))
    shutil.rmtree(os.path.join(clone, ".git"))               # a copy without its history: still its runs
    home = os.path.realpath(os.path.expanduser("~"))
    assert sandbox_view.refused_bind(str(plain)) is None
    assert sandbox_view.refused_bind(str(worktree)) == "it holds a .git"
    assert sandbox_view.refused_bind(clone) == "it holds a run directory"
    assert sandbox_view.refused_bind(os.path.join(clone, "runs", "r")) == "it holds a run directory"
    for path in (home, os.path.dirname(home), "/"):
        assert sandbox_view.refused_bind(path) == "the home directory, or above it", path


@pytest.mark.slow
def test_bubblewraps_own_command_line_names_no_bind(monkeypatch):
    """/proc/1/cmdline, bubblewrap's own process inside the sandbox, which any child may read,
    held every --ro-bind and its host path, the repository's included. Now its arguments come
    from a file (--args FD) and the worker's files sit in WORKER_DIR_INSIDE. (The
    interpreter's own path stays in the worker's command line, and every bind's path in
    /proc/self/mountinfo: sandbox_view.py's header; so the child drops the interpreter's path
    before it looks for the repository's, which that path holds when the venv sits in the
    clone, as in CI.)"""
    pytest.importorskip("reasoning_gym")
    if not bwrap_runs():
        pytest.skip("bwrap does not run here")
    sandbox.shutdown()
    monkeypatch.setenv(sandbox.CHOICE_VARIABLE, "bwrap")
    try:
        code = REPLY_HELPER + textwrap.dedent(f"""
            seen = open("/proc/1/cmdline", "rb").read() + open(f"/proc/{{os.getppid()}}/cmdline", "rb").read()
            for interpreter in {sorted({sys.executable.encode(), os.path.realpath(sys.executable).encode()}, key=len, reverse=True)!r}:
                seen = seen.replace(interpreter, b"")
            reply({{"value": int(b"--ro-bind" in seen) + 2 * int({REPO.encode()!r} in seen), "missing": []}})
            """)
        assert sandbox.run_scorer(N_QUEENS, [program(code), rg_entry("n_queens")], RIGHT_TIMEOUT) == 0.0
    finally:
        sandbox.shutdown()


def test_the_sandbox_holds_no_program_for_matplotlib_to_run():
    """With the system's Python (/usr/bin/python3), the sandbox bound all of /usr, and with it
    /usr/bin/fc-list, which matplotlib (reasoning-gym imports it) runs at each worker start:
    without /etc/fonts it printed five "Fontconfig error" lines per start. Now only the
    interpreter's file is bound: no fc-list, no line. Asked of the system's Python, in a
    process of its own (the tasks package needs only the standard library)."""
    system = "/usr/bin/python3"
    if not (os.path.exists(system) and os.path.exists("/usr/bin/fc-list") and bwrap_runs()):
        pytest.skip("needs /usr/bin/python3, /usr/bin/fc-list and a bwrap that runs")
    code = textwrap.dedent(f"""
        import os, subprocess, sys
        sys.path.insert(0, {REPO!r})
        from tasks import sandbox
        command = sandbox.bubblewrap_command({shutil.which("bwrap")!r})
        probe = ("import os, subprocess; os.path.exists('/usr/bin/fc-list') and "
                 "subprocess.run(['fc-list'], stdout=subprocess.DEVNULL)")
        out = subprocess.run(command + [sys.executable, "-c", probe], env=sandbox.worker_env(), capture_output=True,
                             text=True)
        print(out.returncode, out.stderr.count("Fontconfig"))
        """)
    out = subprocess.run([system, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["0", "0"], (out.stdout, out.stderr[-2000:])
