"""The sandbox's worker and its children: the code that runs on the far side of the pipe.

tasks/sandbox.py (the trainer's side) starts a worker process with this file loaded by
its path, never as part of the tasks package: the package would import every task (and
torch) into the worker, and the tasks folder on sys.path would shadow the scorer
libraries (tasks/reasoning_gym.py is not reasoning_gym). So this file imports nothing
of the project as a package: the standard library, tasks/sandbox_reply.py (the replies'
reader, loaded by its path: _load_sibling) and, in prepare_scorer, the scorer's library.

    worker (one per core and library)                 child (one per answer)
    1. imports the library, scores trusted warm-up    5. locks itself down (_lock_down):
       text, as the trainer's user                       rlimits, Landlock, the seccomp
    2. on the built-in path: enters PID, network,         allow-list; writes "L"
       IPC and mount namespaces of its own            6. scores ONE answer, writes one
       (_enter_namespaces); under bubblewrap it is        JSON value, exits
       already in them
    3. drops root (to nobody), no new privileges,
       not dumpable (no /proc/PID/mem, no ptrace)
    4. per answer: checks that nothing changed its
       limits, priority or CPUs, forks a child,
       waits at most `timeout` s, kills it

The "L" a child writes after its lock-down and before it reads the answer tells its
worker that the child started as it should: a worker whose child did not write it
(its limits were lowered, so a child's setrlimit failed; a fork failed) says it is
broken, and the trainer replaces it and asks again (the answer never ran). The
answer's own code runs after the "L", so it cannot fake that.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pkgutil
import resource
import select
import signal
import sys
import time
from multiprocessing.connection import Connection

STARTUP_TIMEOUT = 120.0       # seconds a new worker may take to import its library (1-3 s when idle)
SCORER_MEMORY_BYTES = 1 << 30  # address space a child may add to what it inherited (1 GiB)
NOBODY = 65534                # the unprivileged uid/gid a root trainer's workers switch to
LOCKED = b"L"                 # what a child writes once locked down, before it reads the answer


def _load_sibling(name: str):
    """tasks/NAME.py, loaded by its path beside this file (a worker has no tasks package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tokencredit_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The replies' reader and its caps (tasks/sandbox_reply.py): the worker reads its child's
# reply with it, and the trainer (tasks/sandbox.py) the worker's, through these names.
_reply = _load_sibling("sandbox_reply")
read_reply, REASONS = _reply.read_reply, _reply.REASONS
CHILD_REPLY, WORKER_REPLY = _reply.CHILD_REPLY, _reply.WORKER_REPLY
MAX_REPLY_BYTES, MAX_MISSING, MAX_NAME_CHARS, MAX_TEXT_CHARS = (_reply.MAX_REPLY_BYTES, _reply.MAX_MISSING,
                                                               _reply.MAX_NAME_CHARS, _reply.MAX_TEXT_CHARS)


# ---------------------------------------------------------------------------------------
# The scorers a worker runs: math-verify's comparison, reasoning-gym's dataset scorers
# ---------------------------------------------------------------------------------------

# One answer of each kind math-verify treats differently (numbers, fractions, roots,
# sets, intervals, matrices, calculus, units, degrees, ...). A sandbox worker scores them
# once BEFORE it gives up the trainer's rights: sympy imports many of its modules only
# when an answer first needs them, and a worker that has switched to `nobody` may be
# unable to read them (Python installed under /root, say). What it loads here, every
# child inherits.
MATH_WARMUP = [
    ("\\frac{1}{2}", "0.5"), ("2\\sqrt{2}", "\\sqrt{8}"), ("1,234", "1234"), ("10\\%", "0.1"), ("2,3", "3,2"),
    ("x=3", "3"), ("\\{1,2\\}", "\\{2,1\\}"), ("[1,2)", "(0,1]"), ("x \\in (0,1]", "(0,1]"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"), ("\\sin x", "\\sin(x)"),
    ("e^{i\\pi}", "-1"), ("\\int_0^1 x dx", "0.5"), ("\\log_2 8", "3"), ("3 \\text{ cm}", "3"), ("a<b", "b>a"),
    ("\\infty", "\\infty"), ("\\binom{5}{2}", "10"), ("5!", "120"), ("\\sum_{i=1}^3 i", "6"),
    ("\\lim_{x\\to 0} x", "0"), ("\\frac{d}{dx} x^2", "2x"), ("|x|", "\\left|x\\right|"), ("\\emptyset", "\\{\\}"),
    ("\\sqrt[3]{8}", "2"), ("0.\\overline{3}", "1/3"), ("\\gcd(4,6)", "2"), ("x^2+2x+1", "(x+1)^2"),
    ("90^\\circ", "\\frac{\\pi}{2}"), ("π", "\\pi"), ("−3", "-3"),
    ("\\sum_{n=1}^\\infty \\frac{1}{n^2}", "\\frac{\\pi^2}{6}"), ("\\prod_{i=1}^{3} i", "6"),
]


def prepare_scorer(library: str, warmup: list):
    """In a sandbox worker, with the trainer's rights still: import `library`, score the
    warm-up once, and return the function its children call with a request's arguments.

    "math": math-verify; the function (pred, ref) -> bool, after MATH_WARMUP.
    "reasoning_gym:NAME": reasoning-gym's scorer of dataset NAME; the function
    (answer text, entry JSON) -> float in [0, 1] (0.0 on any failure), after scoring
    each warm-up argument pair (the dataset's own reference answers, never model text).
    """
    if library == "math":
        from math_verify import parse, verify

        # The sandbox enforces the time limit, so math-verify's signal timeouts are off
        # (None); silence the warning it logs about that, and its per-failure logging.
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)

        def equal(pred: str, ref: str) -> bool:
            try:
                gold = parse(f"${ref}$", parsing_timeout=None)
                guess = parse(f"${pred}$", parsing_timeout=None)
                return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=None))
            except Exception:                 # any parser/sympy failure is "not equal"
                return False
        for args in MATH_WARMUP:
            equal(*args)
        return equal
    if library.startswith("reasoning_gym:"):
        import reasoning_gym

        score_answer = reasoning_gym.get_score_answer_fn(library[len("reasoning_gym:"):])

        def rg_score(text: str, entry_json: str) -> float:
            try:
                value = float(score_answer(answer=text, entry=json.loads(entry_json)))
                return value if 0.0 <= value <= 1.0 else 0.0
            except Exception:
                return 0.0
        for args in warmup:
            rg_score(*args)
        return rg_score
    raise ValueError(f"prepare_scorer: unknown library {library!r}")


# ---------------------------------------------------------------------------------------
# The worker: imports once, isolates itself, forks a locked-down child per answer
# ---------------------------------------------------------------------------------------

def worker_main(fd: int) -> None:
    """Body of a worker process (started by sandbox._start_worker with its end of the pipe as fd).

    Reads {"library", "warmup", "filter", "namespaces"}: "filter" is the seccomp program
    as (code, jt, jf, k) rows (sandbox_filter.program; [] where there is none),
    "namespaces" whether to enter namespaces of its own (the built-in path; under
    bubblewrap the worker is in them already). Says "ready" with what holds, then for
    each request {"timeout", "args"} replies WORKER_REPLY's fields: the child's "value"
    and "missing" as read_reply kept them (value None when there is none, and "reason"
    names why), "scored" whether the answer ran at all, and "broken" ("" unless something
    went wrong with the worker itself) what. Exits when the trainer's end closes (also
    while a child scores: _read_reply watches it), or after replying that it is broken.
    """
    import gc

    conn = Connection(fd)
    hello = json.loads(conn.recv_bytes())
    score = prepare_scorer(hello["library"], hello["warmup"])
    path = [p for p in sys.path if os.path.isabs(p) and os.path.isdir(p)]
    installed = {m.name for m in pkgutil.iter_modules()}      # top-level names, read while readable
    namespaces, why_not, alive = _enter_namespaces(fd) if hello["namespaces"] else ([], "", None)
    uid = _drop_root()
    if alive is not None:
        _die_with_parent(alive)               # again: a uid change cleared it
        os.close(alive)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)       # its children inherit it: no reading or writing a sibling's memory
    abi = landlock_abi()
    seccomp = kernel_filter(hello["filter"]) if hello["filter"] else None
    # Where Python's files may now be out of reach (Python under /root, read by nobody):
    # children then report the modules they failed to import (sandbox.py's header).
    unreadable = _unreadable(path)
    hidden = installed if unreadable else set()
    gc.freeze()                               # children then leave the inherited objects alone (no copies)
    info = {"uid": uid, "landlock": abi, "seccomp": seccomp is not None, "namespaces": namespaces,
            "no_namespaces_because": why_not, "unreadable": unreadable}
    # The first child is a probe: it must lock down and answer, and what it answers is how
    # many processes it can see in /proc (its worker and itself, in a PID namespace of its own).
    probe, locked, _ = _score_in_child(_processes_seen, [], STARTUP_TIMEOUT, abi, hidden, seccomp)
    info["processes_seen"] = (probe or {}).get("value")
    if not locked or type(info["processes_seen"]) is not int:
        info["error"] = "a sandboxed child could not lock itself down and answer"
    try:
        conn.send_bytes(json.dumps(info).encode())
    except OSError:                           # the trainer died while this worker started
        return
    state = _own_state()
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):           # the trainer's end closed: it stopped this worker, or died
            return
        reply = {"value": None, "missing": [], "scored": False, "broken": "", "reason": ""}
        if _own_state() != state:             # before the fork: a changed worker scores nothing
            reply["broken"] = "its limits, priority or CPUs changed"
        else:
            try:
                child, locked, reason = _score_in_child(score, request["args"], request["timeout"], abi, hidden,
                                                        seccomp, watch=fd)
                reply.update(child or {}, scored=locked, reason=reason)
                reply["broken"] = "" if locked else "a child could not lock itself down"
            except _TrainerGone:
                return
            except OSError as e:              # fork failed: its process limit was lowered, say
                reply["broken"] = f"it could not start a child ({e})"[:MAX_TEXT_CHARS]
        if not reply["broken"] and _own_state() != state:
            reply["broken"] = "its limits, priority or CPUs changed while it scored"
        try:
            conn.send_bytes(json.dumps(reply).encode())     # ASCII: the names are identifiers
        except OSError:                       # the trainer is gone
            return
        if reply["broken"]:
            return


def _unreadable(path: list[str]) -> list[str]:
    """[the first directory of `path` this process cannot read, the directory that closes it]
    ([] when it reads them all): asked after dropping root, so as the children's user.

    The closing directory is the first on the way down that this user may not enter (or
    read): /root, 0700, above a Python or a venv installed under it, or a clone made with
    `mktemp -d`. sandbox._warn_unreadable names both, and the fix, in one line.
    """
    for entry in path:
        if not os.access(entry, os.R_OK | os.X_OK):
            parts = entry.rstrip("/").split("/")
            for i in range(2, len(parts) + 1):
                folder = "/".join(parts[:i])
                if not os.access(folder, os.X_OK if i < len(parts) else os.R_OK | os.X_OK):
                    return [entry, folder]
            return [entry, entry]
    return []


def _processes_seen() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


# Every resource limit this platform has (RLIMIT_AS, _CPU, _NPROC, ...).
_LIMITS = sorted({getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")})


def _own_state() -> tuple:
    """What a child must never change in its worker: its limits, its priority, its CPUs.

    The filter refuses every call that could (prlimit with a pid, setpriority,
    sched_setaffinity), and namespaces hide the worker's siblings; this check is the
    wall behind those: a worker found changed scores nothing more. A few microseconds.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return [resource.getrlimit(limit) for limit in _LIMITS], os.getpriority(os.PRIO_PROCESS, 0), cpus


def _score_in_child(score, args: list, timeout: float, abi: int, hidden: set, seccomp,
                    watch: int | None = None) -> tuple[dict | None, bool, str]:
    """Fork; the child locks down, writes LOCKED, scores, writes {"value", "missing"}.

    Returns (the reply read_reply kept, or None; whether the child locked itself down;
    "" or why there is no reply: "timeout", "crash" (it ended without one), or
    read_reply's reason). OSError if the fork itself fails. watch: the trainer's end of
    the pipe; _TrainerGone (the child killed and reaped first) if it closes meanwhile.
    """
    memory = _address_space() + SCORER_MEMORY_BYTES
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:                              # the child: nothing of the trainer's may survive this block
        try:
            os.close(read_end)
            _lock_down(write_end, cpu_seconds=int(timeout) + 1, memory_bytes=memory, landlock=abi, seccomp=seccomp)
            os.write(write_end, LOCKED)
            missing = _MissingImports(hidden) if hidden else None
            if missing:
                sys.meta_path.insert(0, missing)
            value = score(*args)
            names = [n for n in (missing.names if missing else []) if len(n) <= MAX_NAME_CHARS][:MAX_MISSING]
            os.write(write_end, json.dumps({"value": value, "missing": names}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        os.setpgid(pid, pid)                  # also done by the child: whichever runs first
    except OSError:
        pass
    try:
        data, reason = _read_reply(read_end, timeout, pid, watch)
    finally:
        os.close(read_end)
        try:
            os.killpg(pid, signal.SIGKILL)    # done or not, the child and anything it left go
        except OSError:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    locked, data = data[:1] == LOCKED, data[1:]
    if reason or not data:
        return None, locked, reason or "crash"
    reply, reason = read_reply(data, CHILD_REPLY)
    return reply, locked, reason


class _TrainerGone(Exception):
    """The trainer's end of the pipe closed while a child was scoring: the trainer is gone."""


class _MissingImports:
    """First finder of a child's sys.meta_path: notes each installed module it cannot find.

    Installed only when some of sys.path is unreadable to the worker's user: the library
    may then import a module lazily that the child cannot read. `installed`: the
    top-level names the worker could see before it dropped root (a module that is not
    installed at all, an optional dependency the library probes for, is not reported).
    """

    def __init__(self, installed: set):
        self.installed, self.names = installed, []

    def find_spec(self, name, path=None, target=None):
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
        if name.partition(".")[0] in self.installed:
            self.names.append(name)
        return None


def _read_reply(fd: int, timeout: float, pid: int, watch: int | None = None) -> tuple[bytes, str]:
    """(the bytes child `pid` wrote to fd, "" if it exited within `timeout` s having written no
    more than LOCKED and MAX_REPLY_BYTES, else "timeout" or "too_long").

    The worker sleeps until the child exits (a pidfd, Linux 5.3+, readable then) and reads
    the pipe once: one wake-up per answer, where reading as bytes come (the fallback)
    wakes for the "L", the reply and the end. On a busy machine each wake-up waits for a
    core. The child holds the pipe's only write end, so once it has exited the pipe ends.
    It also wakes when `watch`, the trainer's end of the worker's pipe, becomes readable:
    the trainer sends nothing while it waits for a reply, so that is its end closing (the
    trainer died): _TrainerGone. So a worker lives exactly as long as its trainer, even
    while a child sleeps through a long timeout.
    """
    limit = len(LOCKED) + MAX_REPLY_BYTES
    try:
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):         # no pidfd here: read as bytes come
        return _read_as_written(fd, timeout, limit, watch)
    try:
        ready = select.select([exited] + ([watch] if watch is not None else []), [], [], max(timeout, 0.0))[0]
    finally:
        os.close(exited)
    if watch is not None and watch in ready:
        raise _TrainerGone()
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:                   # still running (its timeout): what it wrote so far
        pass
    return data, "too_long" if len(data) > limit else "" if ready else "timeout"


def _read_as_written(fd: int, timeout: float, limit: int, watch: int | None) -> tuple[bytes, str]:
    deadline, data = time.monotonic() + timeout, b""
    while True:
        left = deadline - time.monotonic()
        ready = select.select([fd] + ([watch] if watch is not None else []), [], [], max(left, 0.0))[0] \
            if left > 0 else []
        if watch is not None and watch in ready:
            raise _TrainerGone()
        if not ready:
            return data, "timeout"
        chunk = os.read(fd, limit + 1)
        if not chunk:
            return data, ""
        data += chunk
        if len(data) > limit:
            return data[:1], "too_long"


def _lock_down(keep_fd: int, cpu_seconds: int, memory_bytes: int, landlock: int, seccomp) -> None:
    """The child's restrictions, applied before it reads the answer (sandbox.py's header).
    seccomp: kernel_filter's program, or None where there is no table for this machine."""
    parent = os.getppid()
    os.setpgid(0, 0)                          # its own process group: kill(0, ...) reaches only itself
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with its worker (for good: the filter refuses prctl)...
    if os.getppid() != parent:                # ...even one that died before the line above
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.closerange(3, keep_fd)                 # the trainer's pipe, /dev/null's extra descriptor, ...
    os.closerange(keep_fd + 1, 1 << 16)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past RLIMIT_FSIZE fails instead of killing
    # RLIMIT_MSGQUEUE 0: no POSIX message queue (mq_open, also refused by the filter).
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_MSGQUEUE, 0)):
        resource.setrlimit(limit, (value, value))
    if landlock:
        _landlock_restrict_self(landlock)
    if seccomp is not None:
        _seccomp_restrict_self(seccomp)       # last: from here on, only the allow-list's calls


# ---------------------------------------------------------------------------------------
# Namespaces of its own: the built-in path (bubblewrap does the same, and more)
# ---------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x00020000, 0x08000000, 0x10000000,
                                                                      0x20000000, 0x40000000)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18


def _enter_namespaces(pipe_fd: int) -> tuple[list[str], str, int | None]:
    """Move this worker into PID, network, IPC and mount namespaces of its own.

    Returns (their names, "" or what is missing, the `alive` pipe's end for
    _die_with_parent), or ([], why not, None). The worker is then PID 1 of its own
    namespace; its children see it and themselves in /proc and nothing else: no trainer,
    no sibling worker, no other process to re-limit, renice or signal, no network
    interface but a loopback that is down, no SysV object of anyone else's.

    Creating a namespace needs CAP_SYS_ADMIN: root has it; anyone else gets it inside a
    user namespace of its own (CLONE_NEWUSER, mapping your uid to itself), where the kernel
    allows unprivileged ones (most do; Debian's and Ubuntu's switches, Docker's default
    seccomp profile may not). Capabilities inside that namespace are dropped again before
    any child starts. Where the kernel refuses, nothing changes and the filter alone keeps
    the child off other processes (sandbox.py's header).

    A new PID namespace holds the process's next child, not the process itself, so this
    forks: the child returns from here as the worker (PID 1 inside), and this process
    stays outside, waiting, and leaves with it. /proc is mounted anew inside (in a mount
    namespace made private first, so nothing of it reaches the host's mounts), so that it
    lists the namespace's processes only.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | (CLONE_NEWUSER if uid else 0)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        return [], f"unshare: {os.strerror(ctypes.get_errno())}", None
    if uid:                                   # map your uid and gid to themselves in the new user namespace
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    alive_r, alive_w = os.pipe()              # held open by the outer process while it lives
    pid = os.fork()
    if pid:                                   # outside: wait for the worker, leave with it
        os.close(alive_r)
        os.close(pipe_fd)                     # the trainer's pipe is the worker's alone
        status = os.waitpid(pid, 0)[1]
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    os.close(alive_w)
    _die_with_parent(alive_r)
    names = ["PID", "network", "IPC", "mount"] + (["user"] if uid else [])
    why_not = ""
    if (libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0
            or libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None) != 0):
        why_not = f"/proc not mounted anew ({os.strerror(ctypes.get_errno())}): it lists the host's processes"
    if uid:
        _drop_capabilities(libc)
    return names, why_not, alive_r


def _die_with_parent(alive_fd: int) -> None:
    """SIGKILL this process when its parent (the outer process) dies, even if it died before the
    prctl: then the parent's end of the `alive` pipe is closed, and alive_fd reads EOF.
    The kernel clears the parent-death signal when the uid changes: worker_main sets it
    again after dropping root."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_fd], [], [], 0)[0]:
        os._exit(1)


def _drop_capabilities(libc) -> None:
    """capset(2) to none: a process in a user namespace of its own holds every capability in it."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)          # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                          # effective, permitted, inheritable: all 0
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


# ---------------------------------------------------------------------------------------
# Helpers: uid, prctl, Landlock, seccomp, memory
# ---------------------------------------------------------------------------------------

def _drop_root() -> int:
    """As root: become nobody for good (groups, gid, then uid; no way back). Returns the uid."""
    if os.geteuid() != 0:
        return os.getuid()
    try:
        import pwd
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        uid = gid = NOBODY
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)                            # as root this sets the real, effective and saved uid
    return os.getuid()


PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38


def prctl(option: int, value: int) -> None:
    """prctl(2) through libc (Linux only; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        if ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


# Landlock (Linux's unprivileged sandbox, kernel docs: userspace-api/landlock). Three system
# calls, numbered alike on every architecture. A ruleset names the access rights it
# HANDLES; with no rule added, every handled right is denied everywhere; restrict_self
# applies it to this process and its children for good. Rights a kernel does not know
# must not be named, so the set grows with the ABI version the kernel reports.
_SYS_CREATE_RULESET, _SYS_RESTRICT_SELF = 444, 446
_CREATE_RULESET_VERSION = 1
_FS_EXECUTE, _FS_WRITE_FILE = 1 << 0, 1 << 1
_FS_MAKE_AND_REMOVE = sum(1 << bit for bit in (4, 5, 6, 7, 8, 9, 10, 11, 12))   # rmdir, unlink, mknod, mkdir, ...
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15               # ABI 2, 3, 5
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1                                  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1                       # ABI 6


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (not Linux, too old, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_long(0),
                           ctypes.c_long(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _landlock_restrict_self(abi: int) -> None:
    """Deny this process, for good: every file write/create/remove/execute, TCP, and (ABI >= 6)
    signals and abstract UNIX sockets beyond itself. Reads stay allowed."""
    fs = _FS_EXECUTE | _FS_WRITE_FILE | _FS_MAKE_AND_REMOVE
    fs |= (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) | (_FS_IOCTL_DEV if abi >= 5 else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)          # struct landlock_ruleset_attr
    size = 8 if abi < 4 else 16 if abi < 6 else 24         # the fields this ABI knows
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_long(size), ctypes.c_long(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    prctl(PR_SET_NO_NEW_PRIVS, 1)            # restrict_self requires it
    if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_long(fd), ctypes.c_long(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(fd)


# seccomp: the program comes from the trainer (sandbox_filter.program, which says what it
# allows and why); here it only becomes the kernel's structures, once per worker, and is
# installed by each child.
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


class _SockFilter(ctypes.Structure):      # struct sock_filter: one BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):       # struct sock_fprog: the program
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def kernel_filter(program: list) -> tuple:
    """(struct sock_fprog, its instructions) for rows (code, jt, jf, k); the pair keeps both alive."""
    instructions = (_SockFilter * len(program))(*[_SockFilter(*map(int, row)) for row in program])
    return _SockFprog(len(program), instructions), instructions


def _seccomp_restrict_self(seccomp: tuple) -> None:
    """Install kernel_filter's program on this process, for good (OSError if refused)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)            # required, as for Landlock
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(seccomp[0]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _address_space() -> int:
    """This process's virtual memory size in bytes (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
