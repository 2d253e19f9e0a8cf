"""Hostile answers through every scorer that sees model text (machinery/sandbox.py).

A policy under RL will, sooner or later, write an answer that is also a program. Each
test here sends such answers (a file written outside the sandbox, a kill of the worker's
parent and of the trainer, a fork bomb, a memory bomb, a hang) through a scorer, exactly
as train.py's verify.score call does, and checks the contract: a reward in [0, 1] within
the scorer's timeout, no file outside the sandbox, and the trainer (this test process,
and a bystander process of the same user) alive. A negative control runs the same kind
of answer through reasoning-gym's scorers WITHOUT the sandbox, in a throwaway process,
and sees it create its file: the answers are live, so the tests can fail.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import verify
import tasks
from machinery import sandbox
from tasks import reasoning_gym

TIMEOUT = 2.0          # the scorers' timeout in these tests (seconds)
SLACK = 15.0           # a loaded 2-core machine: fork, kill and reap may lag; still far below a hang


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    sandbox.shutdown()


@pytest.fixture(scope="module")
def open_dir():
    """A directory ANY user may write in (mode 777, reachable by all): only the sandbox keeps files out."""
    d = tempfile.mkdtemp(prefix="tokencredit-hostile-", dir="/tmp")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def bystander():
    """Another process of the trainer's user; a hostile answer tries to kill it too."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield proc
    proc.kill()
    proc.wait()


def hostile_answers(open_dir: str, bystander_pid: int) -> dict:
    """Python expressions an eval-based scorer would run, by what they try."""
    os_ = "__import__('os')"
    return {
        "touch": f"{os_}.system('touch {open_dir}/touched')",
        "write": f"open('{open_dir}/written', 'w').write('x')",
        "write_relative": "open('PWNED', 'w').write('x')",
        "kill_parent": f"{os_}.kill({os_}.getppid(), 9)",
        "kill_trainer": f"{os_}.kill({os.getpid()}, 9)",
        "kill_trainer_group": f"{os_}.killpg({os.getpgid(0)}, 9)",
        "kill_bystander": f"{os_}.kill({bystander_pid}, 9)",
        "fork_bomb": f"[{os_}.fork() for _ in range(1000)]",
        "memory_bomb": "bytearray(3 << 30)",
        "memory_bomb_str": "'x' * (3 << 30)",
        "cpu_hang": "9**9**9**9",
        "sleep": "__import__('time').sleep(600)",
    }


def wrap(task: str, payload: str) -> tuple[str, str, str]:
    """(response, answer, prompt) putting the payload where the task's scorer reads the answer."""
    if task == "addition":
        return f"1+1+0=02\nA:{payload}\n", "2", "1+1\n"
    if task == "countdown":
        return f"now 14+13=27\nanswer: {payload}\n", "29", "13 14 2 -> 29\n"
    if task == "math":
        return f"so \\boxed{{{payload}}}", "24", "a question"
    entry = rg_entry(task.split(":", 1)[1])
    return f"<answer>{payload}</answer>", entry, "a question"


_ENTRIES = {}


def rg_entry(name: str) -> str:
    if name not in _ENTRIES:
        _ENTRIES[name] = reasoning_gym.rows(name, 1, "train", seed=0)[0]["answer"]
    return _ENTRIES[name]


TASKS = ["addition", "countdown", "math", "reasoning_gym:countdown", "reasoning_gym:puzzle24",
         "reasoning_gym:n_queens"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.slow
def test_hostile_answers_score_in_time_and_harm_nothing(task, open_dir, bystander):
    if task.startswith("reasoning_gym:"):
        pytest.importorskip("reasoning_gym")            # .ci/run installs it: this runs in CI
    payloads = hostile_answers(open_dir, bystander.pid)
    if not shields_signals() and task not in ("addition", "countdown", "reasoning_gym:countdown"):
        for name in ("kill_trainer", "kill_trainer_group", "kill_bystander"):
            payloads.pop(name)      # the documented hole: same user, no Landlock (sandbox.py's header)
    response, answer, prompt = wrap(task, "24")
    verify.score([response] * 2, [answer] * 2, tasks.get(task), [prompt] * 2, timeout=TIMEOUT)    # workers started, not timed
    for name, payload in payloads.items():
        response, answer, prompt = wrap(task, payload)
        t0 = time.monotonic()
        [result] = verify.score([response], [answer], tasks.get(task), [prompt], timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
        assert 0.0 <= result["reward"] <= 1.0 and result["reward"] == 0.0, (name, result)
        assert elapsed < TIMEOUT + SLACK, (name, elapsed)
        assert os.listdir(open_dir) == [], (name, os.listdir(open_dir))
        assert not os.path.exists("PWNED"), name
        assert bystander.poll() is None, name            # the bystander lives; and so do we, to get here
    # The pool still scores right after all that (a killed worker was replaced).
    response, answer, prompt = wrap(task, "24")
    scores = verify.score([response], [answer], tasks.get(task), [prompt], timeout=TIMEOUT)
    assert 0.0 <= scores[0]["reward"] <= 1.0


@pytest.mark.slow
def test_sandboxed_scorers_still_give_full_credit_to_right_answers():
    """Negative control for the restrictions: they do not cost a right answer its reward."""
    pytest.importorskip("reasoning_gym")
    for name in ("puzzle24", "n_queens"):
        entry = rg_entry(name)
        reference = json.loads(entry)["answer"]
        [s] = verify.score([f"<answer>{reference}</answer>"], [entry], tasks.get(f"reasoning_gym:{name}"), timeout=10.0)
        assert s["reward"] == 1.0, (name, s)
    assert verify.score(["\\boxed{\\frac{1}{2}}"], ["0.5"], tasks.get("math"), timeout=10.0)[0]["reward"] == 1.0


@pytest.mark.parametrize("name", ["puzzle24", "n_queens"])
@pytest.mark.slow
def test_negative_control_the_payloads_run_in_reasoning_gyms_scorers_without_the_sandbox(name, tmp_path):
    """The same scorer, called directly in a throwaway process, runs the answer: the file appears."""
    pytest.importorskip("reasoning_gym")
    entry = rg_entry(name)
    code = ("import json, sys, reasoning_gym; entry = json.loads(sys.argv[1]); "
            f"reasoning_gym.get_score_answer_fn({name!r})(answer=sys.argv[2], entry=entry)")
    payload = f"__import__('os').system('touch {tmp_path}/ran')"
    subprocess.run([sys.executable, "-c", code, entry, payload], cwd=tmp_path, timeout=300, check=True)
    assert os.path.exists(tmp_path / "ran")


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


def test_a_locked_down_child_cannot_fork_allocate_write_execute_or_signal(open_dir):
    """Each restriction of _lock_down, checked directly in a child forked from this process
    and locked down as a worker's child is (uid switch first when root)."""
    abi = sandbox.landlock_abi()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            sandbox._drop_root()
            sandbox._lock_down(write_end, cpu_seconds=30, memory_bytes=sandbox._address_space() + (256 << 20),
                               landlock=abi)
            results = {}
            for name, attempt in {"fork": lambda: os.fork() == 0 and os._exit(0),
                                  "memory": lambda: bytearray(512 << 20),
                                  "write": lambda: open(os.path.join(open_dir, "x"), "w"),
                                  "execute": lambda: os.execv("/bin/true", ["true"]),
                                  "signal_parent": lambda: os.kill(os.getppid(), 0)}.items():
                try:
                    attempt()
                    results[name] = "allowed"
                except Exception as e:
                    results[name] = type(e).__name__
            os.write(write_end, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        results = json.loads(f.read())
    os.waitpid(pid, 0)
    assert results["fork"] == "BlockingIOError"            # RLIMIT_NPROC 0
    assert results["memory"] == "MemoryError"              # RLIMIT_AS
    if abi >= 1:
        assert results["write"] == "PermissionError" and results["execute"] == "PermissionError"
    if abi >= 6:
        assert results["signal_parent"] == "PermissionError"
    assert os.listdir(open_dir) == []


@pytest.mark.slow
def test_the_sandbox_reports_what_holds():
    """As root the worker is nobody; a child cannot open a TCP connection where Landlock covers TCP."""
    verify.math_equal("\\frac{1}{2}", "0.5")
    info = sandbox.WORKER_INFO["math"]
    if os.geteuid() == 0:
        assert info["uid"] == sandbox.NOBODY
    else:
        assert info["uid"] == os.getuid()
    assert info["landlock"] == sandbox.landlock_abi()


@pytest.mark.slow
def test_a_child_cannot_connect_over_tcp_with_landlock():
    pytest.importorskip("reasoning_gym")
    if sandbox.landlock_abi() < 4:
        pytest.skip("Landlock without TCP rules (ABI < 4): the sandbox does not block TCP here (documented)")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    payload = f"__import__('socket').create_connection(('127.0.0.1', {port})).send(b'x')"
    reasoning_gym.score(f"<answer>{payload}</answer>", rg_entry("n_queens"), "n_queens", timeout=TIMEOUT)
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()


def shields_signals() -> bool:
    """Can a child be kept from signalling this process? As root (it becomes nobody), or with
    Landlock's signal scope (ABI >= 6)."""
    return os.geteuid() == 0 or sandbox.landlock_abi() >= 6


# --- the answer tags: found in linear time, the same answer as before --------------------

OLD_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)   # the extraction before: quadratic


def old_last_answer(text: str):
    tagged = OLD_ANSWER_RE.findall(text[-100_000:])
    return tagged[-1] if tagged else None


def test_answer_tags_are_found_in_linear_time():
    """Many opening tags and no closing one made the lazy regex rescan to the end from every
    opening tag: 12,500 tags cost 5-14 s in the trainer's own process, outside any sandbox."""
    entry = json.dumps({"metadata": {"numbers": [1, 2, 3], "target": 6}})
    for response in ("<answer>" * 12500, "<answer>" * 12500 + "</answer>", "</answer><answer>" * 6000,
                     "<answer>" * 200_000):
        t0 = time.perf_counter()
        result = reasoning_gym.score(response, entry, "countdown")
        elapsed = time.perf_counter() - t0
        assert elapsed < 1.0, (response[:40], len(response), elapsed)
        assert result["reward"] == 0.0


def test_answer_extraction_gives_the_old_regexs_answer():
    ordinary = ["<answer>42</answer>", "think\n<answer>\n 1 2\n3 </answer>\n", "no tags at all", "",
                "<answer>a</answer> then <answer>b</answer>", "<answer></answer>", "<answer>x",
                "x</answer>", "</answer><answer>y</answer>", "<answer><answer>n</answer></answer>",
                "<answer>a<answer>b</answer>c</answer>", "<answer>é→∑</answer>", "<ANSWER>u</ANSWER>",
                "<answer>multi\nline\r\n</answer>", "<answer>a</answer><answer>", "<answer></answer></answer>",
                "<answer>" * 3 + "</answer>" * 3, "<answer >s</answer>", "<<answer>>t<</answer>>",
                "x" * 99_990 + "<answer>cut</answer>", "<answer>" + "y" * 100_000 + "</answer>",
                "<answer>first</answer>" + "z" * 99_995 + "<answer>last</answer>"]
    rng = __import__("random").Random(0)
    pieces = ["<answer>", "</answer>", "<answer", "answer>", "</", "a", " ", "\n", "<", ">"]
    fuzz = ["".join(rng.choice(pieces) for _ in range(rng.randrange(12))) for _ in range(3000)]
    for text in ordinary + fuzz:
        assert reasoning_gym.last_answer(text) == old_last_answer(text), repr(text[:80])
