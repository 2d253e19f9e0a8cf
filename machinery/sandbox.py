"""Sandbox: scoring text a model wrote, in processes that cannot hurt the trainer.

Some verifiers evaluate the answer they check. reasoning-gym's countdown and puzzle24
scorers call sympy's parse_expr, which hands the text to Python's eval; n_queens,
spiral_matrix and a few others call eval directly; math-verify passes parts of an
answer to sympy. A policy under RL explores its output space and keeps whatever is
rewarded, so "the scorer runs model text as code" is a question of when, not if: an
answer `__import__('os').system('rm -rf ~')` or `os.kill(os.getppid(), 9)` is a few
dozen tokens. Running the scorer "in a worker process" is not enough: a process started
by the trainer has the trainer's rights. This file runs such scorers behind three
process boundaries:

    trainer ──pipe──> worker: imports the scorer's      ──fork──> one child per answer:
    (this module)     library once, drops root, and               locks itself down, scores
                      never reads model text itself               ONE answer, writes one
                                                                  JSON value, exits

What a child can NOT do (Linux; each line names the mechanism):
  - outlive its timeout: its worker kills it at `timeout` seconds of wall time (SIGKILL
    to its process group); RLIMIT_CPU (timeout + 1 CPU seconds) and PR_SET_PDEATHSIG
    (it dies with its worker) bound it even if the worker is gone;
  - fork or start threads: RLIMIT_NPROC 0, so a fork bomb is one failed fork;
  - use more than SCORER_MEMORY_BYTES beyond what it inherited: RLIMIT_AS (a memory
    bomb is a MemoryError), no core dump (RLIMIT_CORE 0), no file growth (RLIMIT_FSIZE 0);
  - touch another answer's score: each answer gets a fresh child, so code one answer
    runs dies with it; the worker only forks and reads replies;
  - talk to the trainer: it holds no descriptor of the trainer's pipe (closed after the
    fork), stdin/stdout/stderr are /dev/null, and its reply is read as at most
    MAX_REPLY_BYTES of JSON, never unpickled (a pickle is a program);
  - signal the trainer's process group: the worker runs in a session of its own
    (setsid) and the child in a group of its own, so kill(0, ...) reaches the child only;
  - gain privileges through a setuid program: PR_SET_NO_NEW_PRIVS;
  - when the trainer runs as root: act as root. The worker switches to the unprivileged
    user `nobody` (uid 65534) after importing its library and before any request, so the
    child can neither signal, trace nor write to anything of root's;
  - with Landlock (Linux >= 6.12 for every part; the kernel's unprivileged sandbox,
    used when the kernel offers it): create, write, truncate, remove or execute any file
    anywhere, connect or bind a TCP socket, reach an abstract UNIX socket, or signal
    any process outside itself, whoever the trainer runs as.
  - find anything through a relative path: its working directory is an empty, read-only
    directory of its worker's own, removed when the worker stops.

What a child CAN still do (the limits of this sandbox; say so, do not hide it):
  - It sets ITS OWN score: it runs inside the scorer. This is why the countdown task,
    reasoning-gym's countdown data included, is scored by our own parser
    (verify.py SECTION 4), which evaluates nothing; a task whose only scorer evals
    (puzzle24, n_queens, polynomial_multiplication, ...) can be reward-hacked this way.
  - It can READ what its user can read (nothing restricts reads: the scorers import
    modules lazily), and use UDP or other non-TCP sockets (Landlock has no rules for
    them), so a secret readable by `nobody` (or by you, not as root) can leave.
  - Not root and no Landlock (kernels before 5.13, or Landlock disabled): the child runs
    as you, so it can signal or write anything you own, the trainer included. The
    first worker prints a warning saying so.
  - As root without Landlock: `nobody` can still write where everyone may (/tmp,
    /dev/shm, /var/tmp).
  - It is not a defence against kernel bugs; a container or VM is the next layer.

Cost: a fork per answer, which on a small virtual machine takes longer than
math-verify's own comparison (docs/LOG.md has the numbers); in exchange a hang costs its
timeout and nothing more, because the warm worker kills the child and stays.

Written for Linux (where the tests run). Elsewhere there is no Landlock and no
parent-death signal, and the rest is untested.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import pkgutil
import queue
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection

POOL_SIZE = 2                 # workers per scorer library; the machine this was written on has 2 cores
STARTUP_TIMEOUT = 120.0       # seconds a new worker may take to import its library (1-3 s when idle)
REPLY_GRACE = 10.0            # a worker answers within timeout + this, or is taken to be broken
SCORER_MEMORY_BYTES = 1 << 30  # address space a child may add to what it inherited (1 GiB)
MAX_REPLY_BYTES = 4096        # a child's reply (one JSON value) may not be longer
NOBODY = 65534                # the unprivileged uid/gid a root trainer's workers switch to
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_pools: dict[str, queue.Queue] = {}      # library -> POOL_SIZE slots: a Worker, or None (start on demand)
_pools_guard = threading.Lock()
WORKER_INFO: dict[str, dict] = {}        # library -> what its last worker reported at start (tests read it)
_warned: set = set()                     # warnings already printed


def run_scorer(library: str, args: list, timeout: float, warmup: list | None = None):
    """Score one answer in a sandboxed child: the scorer's reply (a JSON value), or None.

    library: what the worker imports and scores with, "math" or "reasoning_gym:NAME"
    (verify.prepare_scorer). args: the scorer's arguments (JSON values). warmup: arguments
    the worker scores once at start, as the trainer's user, before it drops privileges
    (so the library's lazy imports happen while its files are readable); only trusted
    text belongs there (a dataset's own reference answers, never model output).
    None means: no reply within `timeout` seconds, the child crashed (out of memory,
    killed), or its reply was not JSON. A worker found dead is restarted and the answer
    asked again, once; a worker that dies on the retry too scores None.
    Thread-safe; calls beyond POOL_SIZE concurrent ones per library wait for a worker.
    """
    pool = _pool(library)
    worker = pool.get()                      # blocks while every worker of this library is busy
    try:
        for _ in range(2):
            if worker is None:
                worker = _start_worker(library, warmup or [])    # RuntimeError if it cannot start
            try:
                worker.conn.send_bytes(json.dumps({"timeout": timeout, "args": args}).encode())
                if not worker.conn.poll(timeout + REPLY_GRACE):
                    _stop_worker(worker)     # the worker itself is stuck: never seen, but bounded
                    worker = None
                    return None
                reply = json.loads(worker.conn.recv_bytes(2 * MAX_REPLY_BYTES))
                if reply.get("missing"):
                    _warn_missing(library, reply["missing"])
                return reply.get("value")
            except (EOFError, OSError):      # dead: killed, or out of memory; start another
                _stop_worker(worker)
                worker = None
        return None
    finally:
        pool.put(worker)


def shutdown() -> None:
    """Stop every worker (each waits for its busy call to finish, bounded by its timeout).

    Runs at exit too (atexit), so the workers' directories are removed. Workers also exit
    on their own when the trainer's end of the pipe closes (the trainer was killed), and
    their children die with them (parent-death signal).
    """
    with _pools_guard:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        for _ in range(POOL_SIZE):
            _stop_worker(pool.get())


atexit.register(shutdown)


# ---------------------------------------------------------------------------------------
# The trainer's side: starting and stopping workers
# ---------------------------------------------------------------------------------------

class Worker:
    """One worker process, the trainer's end of its pipe, and its working directory."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, workdir: str):
        self.proc, self.conn, self.workdir = proc, conn, workdir


def _pool(library: str) -> queue.Queue:
    with _pools_guard:
        if library not in _pools:
            _pools[library] = queue.Queue()
            for _ in range(POOL_SIZE):
                _pools[library].put(None)
        return _pools[library]


def _start_worker(library: str, warmup: list) -> Worker:
    """Start one worker and wait until it has imported its library and locked itself down.

    A plain `python -P -c` process (not multiprocessing): it imports only this repository's
    verify.py and the scorer's library, never the trainer's main module, and it talks
    bytes (JSON), never pickles. -P keeps the working directory off sys.path.
    start_new_session: a session and process group of its own (setsid).
    """
    workdir = tempfile.mkdtemp(prefix="tokencredit-sandbox-")
    os.chmod(workdir, 0o555)                 # empty and read-only, for the worker's user too
    mine, theirs = socket.socketpair()
    code = (f"import sys; sys.path.insert(0, {REPO_DIR!r}); from machinery import sandbox; "
            f"sandbox.worker_main({theirs.fileno()})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-P", "-c", code], pass_fds=[theirs.fileno()], cwd=workdir,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    theirs.close()
    worker = Worker(proc, Connection(mine.detach()), workdir)
    try:
        worker.conn.send_bytes(json.dumps({"library": library, "warmup": warmup}).encode())
        if not worker.conn.poll(STARTUP_TIMEOUT):
            raise RuntimeError(f"the {library} scorer's worker did not start within {STARTUP_TIMEOUT:.0f} s")
        info = json.loads(worker.conn.recv_bytes(MAX_REPLY_BYTES))
    except (EOFError, OSError):
        _stop_worker(worker)
        raise RuntimeError(f"the {library} scorer's worker exited during start-up (exit code "
                           f"{proc.poll()}; its error is above)") from None
    except RuntimeError:
        _stop_worker(worker)
        raise
    if "error" in info:
        _stop_worker(worker)
        raise RuntimeError(f"the {library} scorer's worker started, but {info['error']}")
    WORKER_INFO[library] = info
    _warn_if_weak(info)
    return worker


def _stop_worker(worker: Worker | None) -> None:
    """Kill a worker (its busy child dies with it: parent-death signal), reap it, remove its directory."""
    if worker is None:
        return
    try:
        os.killpg(worker.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    worker.proc.wait()
    worker.conn.close()
    try:
        os.rmdir(worker.workdir)
    except OSError:                           # not empty: a child without Landlock wrote in it
        pass


def _warn_if_weak(info: dict) -> None:
    """Warn once when a child could signal the trainer: same user and no Landlock signal scope."""
    if info.get("uid") != os.getuid() or info.get("landlock", 0) >= 6:
        return
    _warn_once("weak", f"the scorer sandbox runs as your user (uid {os.getuid()}) without Landlock's signal scope "
               f"(Landlock ABI {info.get('landlock', 0)}, needs 6): a scored answer that runs code could signal or "
               "write to your processes and files (machinery/sandbox.py)")


def _warn_missing(library: str, names: list) -> None:
    """Warn once per library when a child could not import a module its worker's user cannot read."""
    _warn_once(library, f"the sandboxed {library} scorer needed {', '.join(map(str, names[:3]))}, which its user "
               f"(uid {WORKER_INFO.get(library, {}).get('uid')}) cannot read: answers that need it score 0. Install "
               "Python where every user can read it, or add such an answer to verify.MATH_WARMUP")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# The worker: imports once, forks a locked-down child per answer
# ---------------------------------------------------------------------------------------

def worker_main(fd: int) -> None:
    """Body of a worker process (started by _start_worker with its end of the pipe as fd).

    1. read {"library", "warmup"}; import the library and score the warm-up arguments
       (verify.prepare_scorer), still with the trainer's rights;
    2. drop root (to nobody), set PR_SET_NO_NEW_PRIVS, check that a child can lock
       itself down, and say "ready" with what holds;
    3. for each request {"timeout", "args"}: fork a child that locks itself down
       (_lock_down) and scores; reply {"value": its value or None, "missing": [...]}.
    Exits when the trainer's end of the pipe closes.
    """
    import gc

    import verify

    conn = Connection(fd)
    hello = json.loads(conn.recv_bytes())
    score = verify.prepare_scorer(hello["library"], hello["warmup"])
    path = [p for p in sys.path if os.path.isabs(p) and os.path.isdir(p)]
    installed = {m.name for m in pkgutil.iter_modules()}      # top-level names, read while readable
    uid = _drop_root()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    abi = landlock_abi()
    # Where Python's files may now be out of reach (Python under /root, read by nobody):
    # children then report the modules they failed to import (the module header).
    hidden = installed if any(not os.access(p, os.R_OK | os.X_OK) for p in path) else set()
    gc.freeze()                               # children then leave the inherited objects alone (no copies)
    info = {"uid": uid, "landlock": abi, "pid": os.getpid(), "python_readable": not hidden}
    if _score_in_child(lambda: True, [], STARTUP_TIMEOUT, abi, hidden) != {"value": True, "missing": []}:
        info["error"] = "a sandboxed child could not lock itself down and answer"
    conn.send_bytes(json.dumps(info).encode())
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        reply = _score_in_child(score, request["args"], request["timeout"], abi, hidden)
        try:
            conn.send_bytes(json.dumps(reply or {"value": None}).encode())
        except OSError:                       # the trainer is gone
            return


def _score_in_child(score, args: list, timeout: float, abi: int, hidden: set) -> dict | None:
    """Fork; the child locks down, scores, writes {"value", "missing"}; None on timeout or crash."""
    memory = _address_space() + SCORER_MEMORY_BYTES
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                              # the child: nothing of the trainer's may survive this block
        try:
            os.close(read_end)
            _lock_down(write_end, cpu_seconds=int(timeout) + 1, memory_bytes=memory, landlock=abi)
            missing = _MissingImports(hidden) if hidden else None
            if missing:
                sys.meta_path.insert(0, missing)
            reply = json.dumps({"value": score(*args), "missing": missing.names[:20] if missing else []})
            if len(reply) <= MAX_REPLY_BYTES:
                os.write(write_end, reply.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        os.setpgid(pid, pid)                  # also done by the child: whichever runs first
    except OSError:
        pass
    reply = _read_reply(read_end, timeout)
    os.close(read_end)
    try:
        os.killpg(pid, signal.SIGKILL)        # done or not, the child and anything it left go
    except OSError:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    try:
        reply = json.loads(reply) if reply else None
    except (ValueError, RecursionError):      # not JSON, or nested absurdly deep
        return None
    return reply if isinstance(reply, dict) and isinstance(reply.get("missing"), list) else None


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


def _read_reply(fd: int, timeout: float) -> bytes | None:
    """The bytes a child writes before it closes its end, or None after `timeout` s or too many bytes."""
    deadline, data = time.monotonic() + timeout, b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, MAX_REPLY_BYTES + 1)
        if not chunk:
            return data
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            return None


def _lock_down(keep_fd: int, cpu_seconds: int, memory_bytes: int, landlock: int) -> None:
    """The child's restrictions, applied before it reads the answer (the module header's list)."""
    parent = os.getppid()
    os.setpgid(0, 0)                          # its own process group: kill(0, ...) reaches only itself
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with its worker...
    if os.getppid() != parent:                # ...even one that died before the line above
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.closerange(3, keep_fd)                 # the trainer's pipe, /dev/null's extra descriptor, ...
    os.closerange(keep_fd + 1, 1 << 16)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past RLIMIT_FSIZE fails instead of killing
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(limit, (value, value))
    if landlock:
        _landlock_restrict_self(landlock)


# --- helpers of the worker: uid, prctl, Landlock ----------------------------------------

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


PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


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


def _address_space() -> int:
    """This process's virtual memory size in bytes (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
