"""Hostile answers through every scorer that sees model text (tasks/sandbox.py).

A policy under RL will, sooner or later, write an answer that is also a program. Each
test here sends such answers through a scorer exactly as train.py's verify.score call
does, and checks the contract: a reward of 0 within the scorer's timeout, nothing
harmed (no file outside the sandbox; the trainer, this test process, and a bystander
process of the same user alive; no byte reaching a local listener; the trainer's limits
and the workers' priority and CPUs unchanged), and after EVERY hostile answer a right
answer still scores 1 on both workers of the pool. The corpus goes through every
reasoning-gym scorer that evaluates its answer (sandbox_helpers.EVAL_SCORERS), math-verify,
and our own parsers. A negative control runs a payload through each of those scorers
WITHOUT the sandbox, in a throwaway process, and sees it write its file: the answers are
live, so the tests can fail.

The sandbox runs under bubblewrap where `bwrap` is on PATH, else on its built-in path;
.ci/run runs this file both ways (TOKENCREDIT_SANDBOX=builtin the second time).
test_sandbox_breaches.py has one test per breach an attacker's matrix found;
test_sandbox_filter.py the seccomp program and a child's lock-down, checked directly.
"""

import json
import os
import pathlib
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import tasks
import verify
from tasks import math_datasets, reasoning_gym, sandbox, sandbox_view
from tests.engine.sandbox_helpers import (EVAL_SCORERS, REPLY_HELPER, RIGHT_TIMEOUT, SLACK, descendants,
                                          keyring_keys, open_files_limit, process_alive, program, remove_test_keys,
                                          rg_entry, right_answer, sandbox_processes, sandbox_user, wrap)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = ["addition", "countdown", "math", "reasoning_gym:countdown"] + [f"reasoning_gym:{n}" for n in EVAL_SCORERS]


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    sandbox.shutdown()


@pytest.fixture(scope="module")
def targets():
    """What the hostile answers aim at, and what must be unharmed after each:
    a directory ANY user may write in (mode 777: only the sandbox keeps files out);
    a bystander process of the trainer's user; a TCP and a UDP listener on the host's
    loopback; and the trainer itself for prlimit: this process when it is not root,
    else a stand-in running as `nobody`, the user a root trainer's children run as
    (what a trainer that is not root is to its children)."""
    open_dir = tempfile.mkdtemp(prefix="tokencredit-hostile-", dir="/tmp")
    os.chmod(open_dir, 0o777)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    standin = (subprocess.Popen(["sleep", "3600"], user=65534, group=65534, extra_groups=[])
               if os.geteuid() == 0 else None)
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for server in (tcp, udp):
        server.settimeout(0.01)
    trainer = standin.pid if standin else os.getpid()
    limits = open_files_limit(trainer)
    yield {"open_dir": open_dir, "bystander": bystander, "tcp": tcp, "udp": udp, "trainer": trainer,
           "trainer_limits": limits}
    if not standin:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)         # as it was, if a breach changed it
    remove_test_keys(sandbox_user(), ["tokencredit-hostile"])
    for proc in (bystander, standin):
        if proc:
            proc.kill()
            proc.wait()
    tcp.close()
    udp.close()
    shutil.rmtree(open_dir, ignore_errors=True)


def hostile_answers(t: dict) -> dict:
    """Python an eval-based scorer would run, by what it tries. The last seven got through
    before the allow-list, the namespaces and the worker's self-check (docs/faults_and_safety.md)."""
    os_, tcp_port, udp_port = "__import__('os')", t["tcp"].getsockname()[1], t["udp"].getsockname()[1]
    return {
        "touch": f"{os_}.system('touch {t['open_dir']}/touched')",
        "write": f"open('{t['open_dir']}/written', 'w').write('x')",
        "write_relative": "open('PWNED', 'w').write('x')",
        "kill_parent": f"{os_}.kill({os_}.getppid(), 9)",
        "kill_trainer": f"{os_}.kill({os.getpid()}, 9)",
        "kill_trainer_group": f"{os_}.killpg({os.getpgid(0)}, 9)",
        "kill_bystander": f"{os_}.kill({t['bystander'].pid}, 9)",
        "fork_bomb": f"[{os_}.fork() for _ in range(1000)]",
        "memory_bomb": "bytearray(3 << 30)",
        "memory_bomb_str": "'x' * (3 << 30)",
        "cpu_hang": "9**9**9**9",
        "sleep": "__import__('time').sleep(600)",
        "tcp": program(f"import socket; socket.create_connection(('127.0.0.1', {tcp_port}), 1).send(b'tcp')"),
        "udp": program(f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'udp', "
                       f"('127.0.0.1', {udp_port}))"),
        "mptcp": program(f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); "
                         f"s.settimeout(1); s.connect(('127.0.0.1', {tcp_port})); s.send(b'mptcp')"),
        "prlimit_trainer": program(f"import resource; soft, hard = resource.prlimit({t['trainer']}, "
                                   f"resource.RLIMIT_NOFILE); resource.prlimit({t['trainer']}, "
                                   "resource.RLIMIT_NOFILE, (soft - 1, hard))"),
        "renice_worker": program("import os; os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)"),
        "pin_worker": program("import os; os.sched_setaffinity(os.getppid(), {0})"),
        "keyring": program("import ctypes, platform; nr = {'x86_64': 248, 'aarch64': 217}[platform.machine()]; "
                           "ctypes.CDLL(None).syscall(nr, b'user', b'tokencredit-hostile', b'kept', 4, -4)"),
    }


def harm_done(t: dict) -> list[str]:
    """What a hostile answer changed that it must not have (empty: nothing)."""
    harm = [f"file {name}" for name in os.listdir(t["open_dir"])] + (["file PWNED"] if os.path.exists("PWNED") else [])
    if t["bystander"].poll() is not None:
        harm.append("the bystander was killed")
    for kind, server in (("TCP", t["tcp"]), ("UDP", t["udp"])):
        try:
            got = server.accept()[0].recv(16) if kind == "TCP" else server.recvfrom(16)[0]
            harm.append(f"{kind} listener received {got!r}")
        except (socket.timeout, BlockingIOError):
            pass
    if open_files_limit(t["trainer"]) != t["trainer_limits"]:
        harm.append("the trainer's RLIMIT_NOFILE changed")
    if keyring_keys(sandbox_user(), ["tokencredit-hostile"]):
        harm.append("a key stored in the sandbox user's keyring")
    ours = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    for pid in sandbox_processes():
        try:
            if (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid)) != ours:
                harm.append(f"sandbox process {pid} reniced or pinned")
        except (ProcessLookupError, PermissionError):        # gone meanwhile
            pass
    return harm


def test_harm_done_sees_a_key_left_in_the_sandbox_users_keyring():
    """The corpus's `keyring` answer is judged by a search of the sandbox user's keyring:
    a key stored there by hand (the breach, done outside the sandbox) is found, and gone
    once removed. Without this, that answer's harm check could not fail."""
    if not keyring_keys(sandbox_user(), ["tokencredit-hostile"], "add"):
        pytest.skip("no keyring calls here, or no right to act as the sandbox's user")
    assert keyring_keys(sandbox_user(), ["tokencredit-hostile"]) == ["tokencredit-hostile"]
    remove_test_keys(sandbox_user(), ["tokencredit-hostile"])
    assert keyring_keys(sandbox_user(), ["tokencredit-hostile"]) == []


HOSTILE_TIMEOUT = 1.0  # the hostile answers' timeout: the two that hang cost it, on each of 9 sandboxed tasks


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.slow
def test_hostile_answers_score_0_in_time_harm_nothing_and_right_answers_still_score_1(task, targets):
    if task.startswith("reasoning_gym:"):
        pytest.importorskip("reasoning_gym")            # .ci/run installs it: this runs in CI
    right = right_answer(task)

    def score(response, answer, prompt, timeout=RIGHT_TIMEOUT):
        return verify.score([response], [answer], tasks.get(task), [prompt], timeout=timeout)[0]["reward"]
    assert [score(*right), score(*right)] == [1.0, 1.0]   # both workers started (not timed) and scoring
    for name, payload in hostile_answers(targets).items():
        t0 = time.monotonic()
        reward = score(*wrap(task, payload), timeout=HOSTILE_TIMEOUT)
        elapsed = time.monotonic() - t0
        assert reward == 0.0, name
        assert elapsed < HOSTILE_TIMEOUT + SLACK, (name, elapsed)
        assert harm_done(targets) == [], name
        # The pool hands out its workers in turn: two right answers reach both of them.
        assert [score(*right), score(*right)] == [1.0, 1.0], name


@pytest.mark.slow
def test_negative_control_the_payloads_run_in_every_eval_based_scorer_without_the_sandbox(tmp_path):
    """Each scorer of EVAL_SCORERS, called directly in a throwaway process, runs a payload
    (a program, as the corpus sends them): each one's file appears."""
    pytest.importorskip("reasoning_gym")
    cases = {name: [program(f"open({str(tmp_path / name)!r}, 'w').write('ran')"), rg_entry(name)]
             for name in EVAL_SCORERS}
    code = ("import json, sys, reasoning_gym\n"
            "for name, (answer, entry) in json.loads(sys.argv[1]).items():\n"
            "    reasoning_gym.get_score_answer_fn(name)(answer=answer, entry=json.loads(entry))\n")
    subprocess.run([sys.executable, "-c", code, json.dumps(cases)], cwd=tmp_path, timeout=300, check=True)
    assert sorted(os.listdir(tmp_path)) == sorted(EVAL_SCORERS)


@pytest.mark.slow
def test_ten_hanging_answers_cost_about_ten_timeouts():
    """A hang costs its timeout: the worker kills the child and stays; no restart, no start-up
    allowance on the next request. Before, each hang restarted the worker and the next
    reasoning-gym request waited the timeout plus 120 s of start-up allowance."""
    pytest.importorskip("reasoning_gym")
    entry = rg_entry("puzzle24")
    t0 = time.monotonic()
    reasoning_gym.score("<answer>24</answer>", entry, "puzzle24", timeout=1.0)   # one start-up, if any
    startup = time.monotonic() - t0
    ex = ThreadPoolExecutor(max_workers=1)                # fail instead of freezing the suite
    try:
        t0 = time.monotonic()
        future = ex.submit(lambda: [reasoning_gym.score("<answer>9**9**9**9</answer>", entry, "puzzle24",
                                                               timeout=1.0) for _ in range(10)])
        results = future.result(timeout=10 * 1.0 + startup + 120)
        elapsed = time.monotonic() - t0
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    assert all(r["reward"] == 0.0 and r["rg_score"] == 0.0 for r in results)
    assert elapsed <= 10 * 1.0 + startup + 30, (elapsed, startup)     # generous: the machine is shared


def expected_sandbox() -> str:
    """What this machine gives a worker: bubblewrap where bwrap is on PATH (unless the
    built-in path is forced), else namespaces of its own (root, or unprivileged user namespaces)."""
    if os.environ.get(sandbox.CHOICE_VARIABLE) != "builtin" and shutil.which("bwrap"):
        return "bubblewrap"
    return "namespaces"


@pytest.mark.slow
def test_the_sandbox_reports_what_holds():
    """As root the worker is nobody; the run's sandbox is the one this machine offers, in
    which a child sees its worker and itself (and bubblewrap's PID 1); the first worker's
    line says so."""
    from tasks import sandbox_filter, sandbox_worker
    math_datasets.math_equal("\\frac{1}{2}", "0.5")
    info = sandbox.WORKER_INFO["math"]
    assert info["uid"] == (sandbox.NOBODY if os.geteuid() == 0 else os.getuid())
    assert info["landlock"] == sandbox_worker.landlock_abi()
    assert info["seccomp"] is sandbox_filter.supported()
    assert info["sandbox"] == expected_sandbox()
    assert info["processes_seen"] == {"bubblewrap": 3, "namespaces": 2}[info["sandbox"]]
    assert {"PID", "network", "IPC", "mount"} <= set(info["namespaces"])
    line = sandbox.describe(info)
    assert f"uid {info['uid']}" in line and "seccomp allow-list" in line and f"sees {info['processes_seen']}" in line


@pytest.mark.parametrize("task", ["reasoning_gym:n_queens", "math"])
@pytest.mark.slow
def test_a_right_answer_scores_1_and_a_wrong_one_0(task):
    """The round trip a run makes at every step, on its own: verify.score through the sandbox.
    tests/engine/test_sandbox_private_clone.py runs it from a clone only its owner may enter."""
    if task.startswith("reasoning_gym:"):
        pytest.importorskip("reasoning_gym")

    def score(response, answer, prompt):
        return verify.score([response], [answer], tasks.get(task), [prompt], timeout=RIGHT_TIMEOUT)[0]["reward"]
    assert [score(*right_answer(task)), score(*wrap(task, "0")), score(*right_answer(task))] == [1.0, 0.0, 1.0]


def closed_module_dir(closed_above: bool) -> tuple[str, str]:
    """(a directory holding module tc_closed_part, the directory that closes it to other users):
    the directory itself (0700), or a 0700 directory above it, as /root is above a Python
    installed under it. The module sets TC_CLOSED_PART = 1."""
    closed = tempfile.mkdtemp(prefix="tokencredit-closed-", dir="/tmp")          # 0700
    folder = os.path.join(closed, "site") if closed_above else closed
    os.makedirs(folder, mode=0o755, exist_ok=True)
    with open(os.path.join(folder, "tc_closed_part.py"), "w") as f:
        f.write("TC_CLOSED_PART = 1\n")
    os.chmod(os.path.join(folder, "tc_closed_part.py"), 0o644)
    return folder, closed


@pytest.fixture
def closed_pythonpath(monkeypatch, request):
    """Fresh workers whose PYTHONPATH starts with closed_module_dir(request.param); the
    trainer's sys.path has it too (its check of the module names a reply reports)."""
    if os.geteuid() != 0:
        pytest.skip("the children run as your own user: no directory of yours is closed to them")
    pytest.importorskip("reasoning_gym")
    folder, closed = closed_module_dir(request.param)
    sandbox.shutdown()
    monkeypatch.setenv("PYTHONPATH", folder)
    monkeypatch.syspath_prepend(folder)
    monkeypatch.setattr(sandbox, "_warned", set())
    for cached in (sandbox_view.worker_sys_path, sandbox._installed_top_level):
        cached.cache_clear()
    yield folder, closed
    sandbox.shutdown()                       # later tests' workers start without it
    for cached in (sandbox_view.worker_sys_path, sandbox._installed_top_level):
        cached.cache_clear()
    shutil.rmtree(closed, ignore_errors=True)


# An answer whose scoring needs a module only the closed directory holds: it scores 1 where the
# child can import it, and 0 (the import fails inside eval) where it cannot.
NEEDS_CLOSED_MODULE = REPLY_HELPER + "import tc_closed_part\nreply({'value': 1.0, 'missing': []})"


@pytest.mark.parametrize("closed_pythonpath", [True, False], ids=["closed_above", "closed_itself"],
                         indirect=True)
@pytest.mark.slow
def test_a_python_directory_the_children_cannot_read_is_one_line_at_start_and_no_silent_0(closed_pythonpath,
                                                                                          capfd):
    """As root the children run as `nobody`: a directory of their Python that `nobody` cannot
    enter (here PYTHONPATH's; on a machine, a Python or venv under /root or a `mktemp -d`
    clone) is said in one line when the first worker starts, naming it, the directory that
    closes it and the fix. An answer that needs a module from there scores 0 with a warning
    naming the module, never quietly. Under bubblewrap the directories above a bind are
    made readable, so a directory closed only above is no problem there: no line, and the
    answer scores 1."""
    folder, closed = closed_pythonpath
    entry = rg_entry("n_queens")
    capfd.readouterr()
    right = json.loads(entry)["answer"]
    assert sandbox.run_scorer("reasoning_gym:n_queens", [right, entry], RIGHT_TIMEOUT) == 1.0
    needs = sandbox.run_scorer("reasoning_gym:n_queens", [program(NEEDS_CLOSED_MODULE), entry], RIGHT_TIMEOUT)
    assert sandbox.run_scorer("reasoning_gym:n_queens", [right, entry], RIGHT_TIMEOUT) == 1.0   # the other worker
    err = [line for line in capfd.readouterr().err.splitlines() if "Fontconfig" not in line]
    said = [line for line in err if "cannot read" in line and "closed to other users" in line]
    bubblewrap = sandbox.WORKER_INFO["reasoning_gym:n_queens"]["sandbox"] == "bubblewrap"
    if bubblewrap and folder != closed:
        assert (said, needs) == ([], 1.0)
        return
    assert len(said) == 1, err
    chmod = "o+x" if folder != closed else "o+rx"
    assert f"cannot read {folder} ({closed} is closed" in said[0] and f"chmod {chmod} {closed}" in said[0]
    assert ("apt-get install bubblewrap" in said[0]) is not bubblewrap
    assert needs == 0.0
    assert any("needed tc_closed_part, which its user (uid 65534) cannot read" in line for line in err), err


def test_the_sandbox_choice_is_checked(monkeypatch):
    """TOKENCREDIT_SANDBOX: an unknown value, or bwrap required where there is none, is one
    line before any worker starts."""
    monkeypatch.setenv(sandbox.CHOICE_VARIABLE, "docker")
    with pytest.raises(RuntimeError, match="TOKENCREDIT_SANDBOX='docker': use bwrap, builtin, filter"):
        sandbox._start_worker("math", [])
    monkeypatch.setenv(sandbox.CHOICE_VARIABLE, "bwrap")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="bwrap is not on PATH"):
        sandbox._start_worker("math", [])


def test_bubblewrap_binds_python_but_no_home_directory():
    """What the bubblewrap sandbox holds: the interpreter, its standard library and packages,
    and the worker's two files (under their own directory), read-only; never "/", the home
    directory or a directory above it. No --die-with-parent: it follows the thread that
    started the sandbox, not the trainer (sandbox_view.bubblewrap_command)."""
    command = sandbox.bubblewrap_command("bwrap")
    binds = [command[i + 1] for i, arg in enumerate(command) if arg == "--ro-bind"]
    targets = [command[i + 2] for i, arg in enumerate(command) if arg == "--ro-bind"]
    home = os.path.realpath(os.path.expanduser("~"))
    assert all(path != "/" and not (home + "/").startswith(path.rstrip("/") + "/") for path in binds), binds
    for needed in (os.path.dirname(os.__file__), os.path.realpath(sys.executable), os.path.dirname(json.__file__)):
        assert any(needed == path or needed.startswith(path.rstrip("/") + "/") for path in binds), needed
    assert sorted(targets[-2:]) == [f"{sandbox_view.WORKER_DIR_INSIDE}/sandbox_reply.py",
                                    f"{sandbox_view.WORKER_DIR_INSIDE}/sandbox_worker.py"]
    assert {"--unshare-pid", "--unshare-net", "--unshare-ipc"} <= set(command)
    assert "--die-with-parent" not in command
    assert command[command.index("--tmpfs") + 1] == "/tmp" and command[-1] == "--"


def test_bubblewrap_keeps_what_it_binds_under_tmp(monkeypatch):
    """A clone (and its venv) under /tmp: the sandbox's own /tmp must not hide it. bwrap
    mounts in the order given, so the tmpfs comes before the binds. The negative case is
    the order reversed: a directory of the worker's search path is then missing inside.
    The directory is made under /tmp itself, not pytest's tmp_path: that follows $TMPDIR,
    which may point elsewhere (the negative case then fails for another reason)."""
    bwrap = shutil.which("bwrap")
    if not bwrap or subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "true"]).returncode:
        pytest.skip("bwrap does not run here")
    with tempfile.TemporaryDirectory(dir="/tmp") as under_tmp:
        site = pathlib.Path(under_tmp) / "site"
        site.mkdir()
        copy = site / "tc_module_under_tmp.py"
        copy.write_text("X = 1\n")
        monkeypatch.setattr(sandbox_view, "worker_sys_path", lambda: (str(site),))
        command = sandbox.bubblewrap_command(bwrap)
        read = [sys.executable, "-P", "-c", f"print(len(open({str(copy)!r}).read()))"]
        out = subprocess.run(command + read, env=sandbox.worker_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and int(out.stdout) == len(copy.read_text()), out.stderr
        tmpfs = command.index("--tmpfs")
        late = command[:tmpfs] + command[tmpfs + 2:-1] + ["--tmpfs", "/tmp", "--"]
        out = subprocess.run(late + read, env=sandbox.worker_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "No such file" in out.stderr, out.stderr


TRAINER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from tasks import sandbox
    sandbox.run_scorer("math", ["1", "1"], 30.0)
    print(json.dumps([w.workdir for w in list(sandbox._pools["math"].queue) if w is not None]), flush=True)
    time.sleep({sleep})
""")


@pytest.mark.parametrize("choice", ["bwrap", "builtin"])
@pytest.mark.slow
def test_a_trainer_killed_with_sigkill_leaves_no_process_and_the_next_removes_its_directory(choice):
    """kill -9 of a trainer runs no exit handler: its workers and their children must die
    with it (their pipe closes; bubblewrap's --die-with-parent), and the empty working
    directories of the built-in path, left in the temporary directory, go when the next
    trainer starts its first worker."""
    if choice == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bwrap is not on PATH")
    env = {**os.environ, "TOKENCREDIT_SANDBOX": choice}
    first = subprocess.Popen([sys.executable, "-c", TRAINER.format(repo=REPO, sleep=600)], stdout=subprocess.PIPE,
                             env=env, text=True, cwd=REPO)
    try:
        workdirs = json.loads(first.stdout.readline())
        below = descendants(first.pid)
        assert below, "the trainer started no worker"
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 10.0
    while any(process_alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(pid) for pid in below), [pid for pid in below if process_alive(pid)]
    if choice == "builtin":
        assert workdirs and all(os.path.isdir(d) for d in workdirs)        # nothing removed them
        subprocess.run([sys.executable, "-c", TRAINER.format(repo=REPO, sleep=0)], env=env, cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, timeout=300)
        assert [d for d in workdirs if os.path.exists(d)] == []


def test_a_living_trainers_directory_is_kept(tmp_path, monkeypatch):
    """Only a dead trainer's directories go: one named for this process stays, one named for
    a PID that exists but started at another time (reused) goes, another user's stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ours = tmp_path / f"{sandbox.WORKDIR_PREFIX}{os.getpid()}-{sandbox._start_time(os.getpid())}-abc"
    reused = tmp_path / f"{sandbox.WORKDIR_PREFIX}{os.getpid()}-1-def"
    unrelated = tmp_path / "tokencredit-hostile-xyz"
    for d in (ours, reused, unrelated):
        d.mkdir()
    os.chmod(reused, 0o555)
    sandbox._remove_stale_workdirs.__wrapped__()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, unrelated.name])
