"""Breaches an attacker's matrix found in the scorer sandbox, one test each (tasks/sandbox.py).

Each payload here got through the sandbox as it was before its fix (its test failed on
that code), and is stopped now. The payloads are whole programs: n_queens' scorer evals
an answer, and an answer `exec(CODE, {})` runs CODE with statements and all; a payload
that must report what it saw writes its own reply to the reply pipe (REPLY_HELPER), as
any answer can (a child sets its own score: documented).

First round: the trainer's secrets read from the child's environment, a reply of the
child's own making (a string value, escape codes in the names the trainer prints), SysV
shared memory left behind, a child that clears its parent-death signal and outlives its
killed worker, answer tags that cost the trainer seconds.

Second round (what a deny-list let through): TCP by another protocol number (MPTCP), a
child that lowers its sibling workers' RLIMIT_AS and zeroes every later score, prlimit
on the trainer, the kernel keyring kept across answers, a child that renices or pins its
worker, and a child that could see every process on the machine.
"""

import json
import os
import platform
import re
import resource
import socket
import subprocess
import time

import pytest

from tasks import reasoning_gym, sandbox, sandbox_reply
from tests.engine.sandbox_helpers import (KEY_CALLS, REPLY_HELPER, RIGHT_TIMEOUT, TIMEOUT, descendants, lower_address_space_limits,
                                          open_files_limit, process_alive, process_table, program, remove_test_keys,
                                          rg_entry, sandbox_user, sandbox_processes)

N_QUEENS = "reasoning_gym:n_queens"


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    sandbox.shutdown()


def run(code: str, timeout: float = TIMEOUT):
    """What run_scorer returns for n_queens' answer `code` (a program)."""
    pytest.importorskip("reasoning_gym")
    return sandbox.run_scorer(N_QUEENS, [program(code), rg_entry("n_queens")], timeout)


def right_answers_score(n: int = 4) -> list:
    """n right answers to n_queens in turn (both workers of the pool, twice): their scores."""
    entry = rg_entry("n_queens")
    return [sandbox.run_scorer(N_QUEENS, [json.loads(entry)["answer"], entry], RIGHT_TIMEOUT) for _ in range(n)]


# ---------------------------------------------------------------------------------------
# Second round: what a deny-list let through
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_child_sees_no_other_process():
    """In /proc a child sees its worker and itself (and bubblewrap's PID 1): not the trainer,
    not the sibling workers, not the machine's other processes."""
    seen = run(REPLY_HELPER + "reply({'value': sum(n.isdigit() for n in os.listdir('/proc')), 'missing': []})")
    assert seen is not None and seen <= 3, seen


@pytest.mark.slow
def test_mptcp_and_tcp_to_a_local_listener_are_refused():
    """socket(AF_INET, SOCK_STREAM, 262) is MPTCP: it connected to a plain TCP listener and sent
    data where Landlock's TCP rule refused the same connection by IPPROTO_TCP."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        for protocol in (262, 0):
            errno = run(REPLY_HELPER + f"""
import socket
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, {protocol})
    s.settimeout(1)
    s.connect(("127.0.0.1", {port}))
    s.send(b"x")
    reply({{"value": 0, "missing": []}})
except OSError as e:
    reply({{"value": e.errno, "missing": []}})
""")
            with pytest.raises(socket.timeout):
                server.accept()
            assert errno == 1, (protocol, errno)               # EPERM: socket() itself refused
    finally:
        server.close()


# Lowers the RLIMIT_AS of every sandbox worker of this test process (the trainer) it can
# find, to just above what each uses: the worker lives on, but its next child's
# setrlimit(RLIMIT_AS, what it uses + 1 GiB) fails, and the child exits without a reply.
SIBLINGS = REPLY_HELPER + """
import os, resource
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
def below_trainer(pid):
    while pid > 1:
        pid = parent(pid)
        if pid == TRAINER:
            return True
    return False
hit = 0
for name in os.listdir("/proc"):
    try:
        pid = int(name)
        if pid != os.getpid() and b"worker_main" in open(f"/proc/{pid}/cmdline", "rb").read() and below_trainer(pid):
            size = int(open(f"/proc/{pid}/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.prlimit(pid, resource.RLIMIT_AS, (size + (64 << 20), size + (64 << 20)))
            hit += 1
    except (ValueError, OSError):
        pass
reply({"value": hit, "missing": []})
"""


@pytest.mark.slow
def test_prlimit_of_sibling_workers_cannot_zero_later_scores():
    """One answer re-limited every worker it found; every later answer, right ones included,
    scored 0 for the rest of the run, silently."""
    try:
        assert right_answers_score(2) == [1.0, 1.0]              # both workers up
        hit = run(SIBLINGS.replace("TRAINER", str(os.getpid())))
        assert hit == 0, f"the answer re-limited {hit} worker(s)"
        assert right_answers_score() == [1.0] * 4
    finally:
        sandbox.shutdown()                                       # the next test starts from fresh workers


@pytest.mark.slow
def test_a_worker_whose_limits_were_lowered_is_replaced_and_right_answers_score_1():
    """The wall behind the filter and the namespaces: this test (the trainer's user) lowers
    every worker's RLIMIT_AS from outside, as a breach would. Each worker finds its limits
    changed before its next fork and says it is broken; the trainer replaces it and asks
    the answer again, so no right answer scores 0."""
    try:
        assert right_answers_score(2) == [1.0, 1.0]
        before = set(sandbox_processes())
        assert lower_address_space_limits(sorted(before)) >= 2        # at least the two workers
        assert right_answers_score() == [1.0] * 4
        assert not before & set(sandbox_processes())            # every worker was replaced
    finally:
        sandbox.shutdown()


@pytest.mark.slow
def test_prlimit_on_the_trainer_is_refused():
    """prlimit(RLIMIT_CPU, 1) on a trainer that is not root killed it, RLIMIT_FSIZE 0 broke its
    writes. Here a harmless change (RLIMIT_NOFILE's soft limit one lower) on the trainer, or,
    when this test runs as root, on a stand-in of the sandbox's user, which is what a trainer
    that is not root is to its children."""
    standin = (subprocess.Popen(["sleep", "3600"], user=65534, group=65534, extra_groups=[])
               if os.geteuid() == 0 else None)
    target = standin.pid if standin else os.getpid()
    before = open_files_limit(target)
    try:
        errno = run(REPLY_HELPER + f"""
import resource
try:
    soft, hard = resource.prlimit({target}, resource.RLIMIT_NOFILE)
    resource.prlimit({target}, resource.RLIMIT_NOFILE, (soft - 1, hard))
    reply({{"value": 0, "missing": []}})
except OSError as e:
    reply({{"value": e.errno, "missing": []}})
""")
        assert open_files_limit(target) == before
        assert errno in (1, 3), errno                 # EPERM (the filter), or ESRCH (not in its PID namespace)
    finally:
        if not standin:
            resource.setrlimit(resource.RLIMIT_NOFILE, before)    # as it was, had the breach changed it
        if standin:
            standin.kill()
            standin.wait()


@pytest.mark.slow
def test_the_kernel_keyring_is_out_of_reach():
    """add_key stored a secret in the sandbox user's keyring, which outlives the run; a later
    answer read it back. Both calls are refused now (-1: EPERM)."""
    if platform.machine() not in KEY_CALLS:
        pytest.skip(f"no keyring call numbers for {platform.machine()} here")
    name = f"tokencredit-test-{os.getpid()}"
    calls = KEY_CALLS[platform.machine()]
    store = REPLY_HELPER + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
serial = libc.syscall({calls['add_key']}, b"user", {name.encode()!r}, b"kept-across-answers", 19, -4)
reply({{"value": 1 if serial > 0 else -ctypes.get_errno(), "missing": []}})
"""
    fetch = REPLY_HELPER + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
serial = libc.syscall({calls['keyctl']}, 10, -4, b"user", {name.encode()!r}, 0)       # KEYCTL_SEARCH
if serial < 0:
    reply({{"value": -ctypes.get_errno(), "missing": []}})
buffer = ctypes.create_string_buffer(64)
n = libc.syscall({calls['keyctl']}, 11, serial, buffer, 64)                            # KEYCTL_READ
reply({{"value": 1 if buffer.raw[:n] == b"kept-across-answers" else 0, "missing": []}})
"""
    try:
        stored, fetched = run(store), run(fetch)
        assert (stored, fetched) == (-1.0, -1.0)
    finally:
        remove_test_keys(sandbox_user(), [name])


@pytest.mark.slow
def test_a_child_cannot_renice_or_pin_its_worker():
    """setpriority and sched_setaffinity on the worker (same user: allowed) slowed every later
    answer of that worker. Refused now (EPERM), and every sandbox process keeps this test's
    priority and CPUs."""
    errnos = run(REPLY_HELPER + """
errnos = 0
for attempt in (lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19),
                lambda: os.sched_setaffinity(os.getppid(), {0})):
    try:
        attempt()
    except OSError as e:
        errnos = 100 * errnos + e.errno
reply({"value": errnos, "missing": []})
""")
    ours = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    assert all((os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid)) == ours
               for pid in sandbox_processes())
    assert errnos == 101, errnos                          # EPERM, twice


@pytest.mark.slow
def test_without_namespaces_the_filter_alone_keeps_a_child_off_other_processes(monkeypatch):
    """TOKENCREDIT_SANDBOX=filter: no namespace at all, what a machine that allows none gets.
    The child then sees every process of the machine, and the allow-list alone must refuse
    what reaches them: prlimit of the sibling workers and of its own worker, renicing and
    pinning it, a signal to it, the keyring, MPTCP. A right answer still scores 1."""
    if platform.machine() not in KEY_CALLS:
        pytest.skip(f"no filter (and no keyring call numbers) for {platform.machine()} here")
    monkeypatch.setenv("TOKENCREDIT_SANDBOX", "filter")
    sandbox.shutdown()
    try:
        assert right_answers_score(2) == [1.0, 1.0]
        info = sandbox.WORKER_INFO[N_QUEENS]
        assert info["sandbox"] == "filter" and info["namespaces"] == [] and info["processes_seen"] > 3
        assert run(SIBLINGS.replace("TRAINER", str(os.getpid()))) == 0
        allowed = run(REPLY_HELPER + f"""
import ctypes, platform, resource, socket
nr = {KEY_CALLS.get(platform.machine(), {}).get("add_key", -1)}
attempts = [lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)),
            lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19),
            lambda: os.sched_setaffinity(os.getppid(), {{0}}),
            lambda: os.kill(os.getppid(), 0),
            lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)]
allowed = 0
for attempt in attempts:
    try:
        attempt()
        allowed += 1
    except PermissionError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(nr, b"user", b"tokencredit-filter-only", b"x", 1, -4) > 0 or ctypes.get_errno() != 1:
    allowed += 1
reply({{"value": allowed, "missing": []}})
""")
        assert allowed == 0, f"{allowed} of 6 calls on other processes or the kernel went through"
        assert right_answers_score() == [1.0] * 4
    finally:
        remove_test_keys(sandbox_user(), ["tokencredit-filter-only"])
        sandbox.shutdown()


@pytest.mark.slow
def test_under_bubblewrap_the_home_directory_is_not_there():
    """A file in the trainer's home directory (a token, a credential) is not in the sandbox."""
    path = os.path.join(os.path.expanduser("~"), f".tokencredit-test-token-{os.getpid()}")
    with open(path, "w") as f:
        f.write("token")
    os.chmod(path, 0o644)                                  # readable by anyone who can get to it
    try:
        seen = run(REPLY_HELPER + f"reply({{'value': int(os.path.exists({path!r})), 'missing': []}})")
        if sandbox.WORKER_INFO[N_QUEENS]["sandbox"] != "bubblewrap":
            pytest.skip("the built-in path: reads stay open there (documented)")
        assert seen == 0
    finally:
        os.remove(path)


# ---------------------------------------------------------------------------------------
# First round: secrets, replies, SysV, the parent-death signal
# ---------------------------------------------------------------------------------------

SECRET = "hf_tokencreditPlantedSecret7f3a9c"    # planted in the trainer's environment; must never come back
SECRET_VARS = ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY")


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
def test_no_secret_of_the_trainers_reaches_a_child(planted_secret):
    """A child looks for the secret in its environment, its worker's and the trainer's
    (/proc/PID/environ), and reports what it found in its score (it has no other way out:
    the UDP it once sent them by is refused). Bits: 1 its environment holds the secret,
    2 its worker's does, 4 the trainer's environ could be read, 8 it holds the secret;
    16 its environment has exactly worker_env's names."""
    code = REPLY_HELPER + f"""
bits, secret = 0, {planted_secret.encode()!r}
if secret in repr(dict(os.environ)).encode():
    bits |= 1
try:
    bits |= 2 if secret in open(f"/proc/{{os.getppid()}}/environ", "rb").read() else 0
except OSError:
    pass
try:
    bits |= 4 | (8 if secret in open("/proc/{os.getpid()}/environ", "rb").read() else 0)
except OSError:
    pass
# LC_CTYPE is Python's own (its C-locale coercion, PEP 538); PWD and MPLCONFIGDIR bubblewrap's
if set(os.environ) - {{"LC_CTYPE", "PWD", "MPLCONFIGDIR"}} == {set(sandbox.worker_env())!r}:
    bits |= 16
reply({{"value": bits, "missing": []}})
"""
    bits = int(run(code))
    assert bits & (1 | 2 | 8) == 0, bits                  # the secret, nowhere
    assert bits & 16, bits                                # worker_env's names exactly
    # The trainer's own environment, through /proc: out of a PID namespace's sight, closed to
    # nobody (as root), and closed by Landlock to a process outside the child's domain.
    assert bits & 4 == 0, bits


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
    got = run(REPLY_HELPER + f"reply(json.loads({json.dumps({'value': value, 'missing': []})!r}))")
    assert got == expected and type(got) is type(expected), (value, got)


@pytest.mark.slow
def test_a_childs_missing_field_never_reaches_the_terminal_as_is(planted_secret, capfd, monkeypatch):
    """A reply's `missing` names are printed in a warning: only names of installed modules may be."""
    monkeypatch.setattr(sandbox, "_warned", set(sandbox._warned) - {N_QUEENS})
    code = REPLY_HELPER + f"""
def passwd():
    try:
        return open("/etc/passwd").read()[:1500]      # not there under bubblewrap
    except OSError:
        return "root:x:0:0"
names = ["\\x1b[2J\\x1b[31mHACKED\\x07", os.environ.get({SECRET_VARS[1]!r}, "no secret"), "tc_planted_name_7f3a",
         passwd(), "sympy.printing.tc_real_top_level"]
reply({{"value": 0.0, "missing": names}})
"""
    capfd.readouterr()
    reasoning_gym.score(f"<answer>{program(code)}</answer>", rg_entry("n_queens"), "n_queens", timeout=TIMEOUT)
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "HACKED" not in err
    assert planted_secret not in err and "tc_planted_name_7f3a" not in err
    assert "root:x:0:0" not in err
    assert "needed sympy.printing.tc_real_top_level, which" in err     # the warning itself still comes


def test_reading_a_reply_keeps_module_names_and_finite_values_and_never_raises():
    """sandbox_reply.read_reply, the one reader of both sides: what it keeps of a reply, and
    the reason it gives for each reply it refuses (the answer then gets no score)."""
    read = lambda obj: sandbox_reply.read_reply(json.dumps(obj).encode(), sandbox_reply.CHILD_REPLY)
    assert read({"value": 0.5, "missing": ["sympy.core", "json", "\x1b[31m", "a b", "sympy." + "x" * 300, 7,
                                           None]}) == ({"value": 0.5, "missing": ["sympy.core", "json"]}, "")
    assert read({"value": True, "missing": []}) == ({"value": True, "missing": []}, "")
    assert read({"value": 0, "missing": ["json"] * 100})[0]["missing"] == ["json"] * 20
    for obj, reason in [({"value": float("nan"), "missing": []}, "not_finite"), ({"value": 10 ** 400, "missing": []},
                        "not_finite"), ({"value": "0.5", "missing": []}, "wrong_shape"), (["value", 1], "wrong_shape"),
                        (None, "wrong_shape"), ({"value": 1}, "wrong_shape"), ({"value": 1, "missing": "json"},
                        "wrong_shape"), ({"value": 1, "missing": [], "more": 1}, "wrong_shape"),
                        ({"value": [[0]], "missing": []}, "too_deep")]:
        assert read(obj) == (None, reason), obj
    raw = lambda data: sandbox_reply.read_reply(data, sandbox_reply.CHILD_REPLY)
    nested = b'{"value": ' + b"[" * 990 + b"]" * 990 + b', "missing": []}'
    assert raw(nested) == (None, "too_deep") and len(nested) < sandbox_reply.MAX_REPLY_BYTES
    assert raw(b'{"value": 1, "missing": ["' + b"x" * 4100 + b'"]}') == (None, "too_long")
    assert raw(b"\x00" + b'{"value": 1, "missing": []}') == (None, "not_json")      # json would guess UTF-16
    assert raw(b'{"value": 1, "missing": ["\xff\xfe"]}') == (None, "not_utf8")
    assert raw(b'{"value": 1, "missing": ["[[[{{{", "a\\"]]"]}') == ({"value": 1, "missing": []}, "")  # in strings
    assert raw(b'{"value": 1, "missing": [' + b"1," * 1300 + b"1]}") == ({"value": 1, "missing": []}, "")
    emoji = ('{"value": 1, "missing": ["' + "\U0001F600" * 1000 + '"]}').encode()
    assert len(emoji) <= sandbox_reply.MAX_REPLY_BYTES and raw(emoji) == ({"value": 1, "missing": []}, "")
    rng = __import__("random").Random(0)
    for _ in range(2000):                    # any bytes: a reply or a reason, never an exception
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40))) if rng.random() < 0.5 else \
            "".join(rng.choice('{}[]",:01.e-\\nulltruevaluemissing ') for _ in range(rng.randrange(60))).encode()
        reply, reason = raw(data)
        assert (reply is None) == (reason in sandbox_reply.REASONS) and (reply is None) != (reason == "")


def shm_segments() -> dict:
    """SysV shared memory segments of the whole machine: shmid -> size in bytes (/proc/sysvipc/shm)."""
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {int(row[1]): int(row[3]) for row in rows}


@pytest.mark.slow
def test_a_child_cannot_leave_sysv_shared_memory_behind():
    """shmget + shmat + memset through ctypes: memory outside RLIMIT_AS and Landlock that would
    outlive the child, its worker and the trainer. The reply carries shmget's result (-errno on failure)."""
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
        got = run(code, 10.0)
        left = {shmid: n for shmid, n in shm_segments().items() if shmid not in before and n == size}
        assert left == {}, f"{len(left)} segment(s) of {size >> 20} MB left behind"
        assert got == -1.0, got                              # EPERM: shmget refused
    finally:
        for shmid, n in shm_segments().items():              # remove what the breach left (ours only)
            if shmid not in before and n == size:
                subprocess.run(["ipcrm", "-m", str(shmid)], check=False)


@pytest.mark.slow
def test_a_child_does_not_outlive_its_killed_worker():
    """A child clears its parent-death signal and sleeps; its worker is then killed (SIGKILL to
    the worker's process alone, as the OOM killer would): the child must die with it, not
    live on under PID 1. The child is found from outside, as the newest process below the
    worker, and its worker as its parent (under bubblewrap, below bwrap's own processes)."""
    pytest.importorskip("reasoning_gym")
    code = "import ctypes, time; ctypes.CDLL(None).prctl(1, 0, 0, 0, 0); time.sleep(3600)"
    worker = sandbox._start_worker(N_QUEENS, [])
    child = None
    try:
        idle = set(descendants(worker.proc.pid))
        worker.conn.send_bytes(json.dumps({"timeout": 600.0, "args": [program(code), rg_entry("n_queens")]}).encode())
        deadline = time.monotonic() + 30.0
        while child is None and time.monotonic() < deadline:
            child = next((pid for pid in descendants(worker.proc.pid) if pid not in idle), None)
            time.sleep(0.05)
        assert child is not None, "no child started"
        time.sleep(1.0)                                           # its prctl, then asleep
        assert process_alive(child)
        parent = process_table()[child]                           # its worker: the Python process it forked from
        assert b"worker_main" in open(f"/proc/{parent}/cmdline", "rb").read()
        os.kill(parent, 9)
        deadline = time.monotonic() + 10.0
        while process_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(child), f"the child {child} outlived its worker"
    finally:
        if child is not None and process_alive(child):
            os.kill(child, 9)                                     # the breach's survivor, started by this test
        sandbox._stop_worker(worker)


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
