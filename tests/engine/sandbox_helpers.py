"""What the scorer sandbox's tests share (tests/engine/test_sandbox.py, test_sandbox_breaches.py):
the scorers that evaluate an answer, a right answer for each task, payload helpers, and
the processes of this test's sandbox as seen from outside it.

Only the sandbox's public face is used here (verify.score, tasks.get, run_scorer,
shutdown): the same tests ran on the code before the allow-list, where the breaches
they send got through.
"""

import json
import os

from tasks import reasoning_gym

TIMEOUT = 2.0          # the scorers' timeout in these tests (seconds)
RIGHT_TIMEOUT = 30.0   # a right answer's: it must score 1 on a loaded machine too (it ends when it is scored)
SLACK = 15.0           # a loaded 2-core machine: fork, kill and reap may lag; still far below a hang

# reasoning-gym's scorers that evaluate the answer they are given (eval, or sympy's
# parse_expr, which calls eval): found by reading every dataset's score_answer.
# (countdown's parse_expr too, but our own checker scores countdown: tasks/reasoning_gym.py.)
EVAL_SCORERS = ["puzzle24", "n_queens", "spiral_matrix", "string_insertion", "binary_matrix",
                "polynomial_multiplication", "simple_integration", "intermediate_integration"]

_ENTRIES = {}


def rg_entry(name: str) -> str:
    """Dataset `name`'s first training entry, as JSON (what a row's answer holds)."""
    if name not in _ENTRIES:
        _ENTRIES[name] = reasoning_gym.rows(name, 1, "train", seed=0)[0]["answer"]
    return _ENTRIES[name]


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


def right_answer(task: str) -> tuple[str, str, str]:
    """A response that scores 1 on `task` (a reasoning-gym dataset: its entry's own answer)."""
    if task.startswith("reasoning_gym:"):
        return wrap(task, json.loads(rg_entry(task.split(":", 1)[1]))["answer"])
    # math: not "24" itself, which verify.math_equal settles as a string before any sandbox
    return wrap(task, {"addition": "2", "countdown": "13+14+2", "math": "\\frac{48}{2}"}[task])


def program(code: str) -> str:
    """An answer that an eval-based scorer runs as a program: exec(CODE, {}) is an expression,
    so eval (n_queens, ...) and sympy's parse_expr (puzzle24, ...) both run it, statements and all."""
    return f"exec({code!r}, {{}})"


# The child's reply pipe is the only FIFO among its descriptors (0-2 are /dev/null): a
# payload can write a reply of its choosing there and exit before the scorer answers.
# (A child writes one byte, "L", when it has locked down; a reply after it is read as JSON.)
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


def process_table() -> dict[int, int]:
    """pid -> parent pid, for every process in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    table[int(name)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return table


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before children."""
    table, found, frontier = process_table(), [], [pid]
    while frontier:
        children = [p for p, parent in table.items() if parent in frontier]
        found += children
        frontier = children
    return found


def sandbox_processes() -> list[int]:
    """This test process's sandbox: the workers (and bubblewrap's processes, whose command
    line holds the worker's) below it, children of the workers included."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"worker_main" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def process_alive(pid: int) -> bool:
    """Running (a zombie waiting for PID 1 to reap it counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


# The kernel keyring's system calls (glibc has no wrapper; libkeyutils does): add_key,
# keyctl. A key in the user keyring outlives every process of its user.
KEY_CALLS = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}
KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_INVALIDATE = -4, 10, 11, 21


def sandbox_user() -> int:
    """The uid the scorer children run as: `nobody` (65534) under a root trainer, else the trainer's own."""
    return 65534 if os.geteuid() == 0 else os.getuid()


def keyring_keys(uid: int, names: list[str], action: str = "find") -> list[str]:
    """As user `uid` (a forked helper that becomes that user: as root, or as that user
    itself), the keys of `names` found in its user keyring ("find"), invalidated ("remove"),
    or stored there ("add": a breach done by hand, the negative control of the search).
    Returns the names found (or added); [] where the calls or the rights are missing."""
    import ctypes
    import platform

    numbers = KEY_CALLS.get(platform.machine())
    if numbers is None or (os.geteuid() != 0 and uid != os.getuid()):
        return []
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        found = []
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            libc = ctypes.CDLL(None, use_errno=True)
            for name in names:
                if action == "add":
                    if libc.syscall(numbers["add_key"], b"user", name.encode(), b"x", 1, KEY_SPEC_USER_KEYRING) > 0:
                        found.append(name)
                    continue
                serial = libc.syscall(numbers["keyctl"], KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user",
                                      name.encode(), 0)
                if serial > 0:
                    found.append(name)
                    if action == "remove":
                        libc.syscall(numbers["keyctl"], KEYCTL_INVALIDATE, serial)
            os.write(write_end, "\n".join(found).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return [n for n in out.split("\n") if n]


def remove_test_keys(uid: int, names: list[str]) -> None:
    """Invalidate the keys `names` in user `uid`'s keyring, if a breach left them there."""
    keyring_keys(uid, names, "remove")


def open_files_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of process `pid`, read from /proc/PID/limits (which anyone may
    read; prlimit of another user's process needs CAP_SYS_RESOURCE, which a container's root
    may lack)."""
    with open(f"/proc/{pid}/limits") as f:
        soft, hard = next(line for line in f if line.startswith("Max open files")).split()[3:5]
    return int(soft), int(hard)


def lower_address_space_limits(pids: list[int], headroom: int = 64 << 20) -> int:
    """Lower each process's RLIMIT_AS to its current size + headroom, as the sandbox's user (a
    forked helper that becomes `nobody` when this runs as root): what a breach did to the
    workers. Returns how many it lowered."""
    read_end, write_end = os.pipe()
    helper = os.fork()
    if helper == 0:
        lowered = 0
        try:
            import resource
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            for pid in pids:
                try:
                    size = int(open(f"/proc/{pid}/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
                    resource.prlimit(pid, resource.RLIMIT_AS, (size + headroom, size + headroom))
                    lowered += 1
                except (OSError, ValueError):
                    pass
        finally:
            os.write(write_end, str(lowered).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        lowered = int(f.read() or 0)
    os.waitpid(helper, 0)
    return lowered
