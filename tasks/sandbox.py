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
    to its process group); RLIMIT_CPU (timeout + 1 CPU seconds) bounds a spinning one;
  - outlive its worker (killed by the trainer, the OOM killer, anyone): PR_SET_PDEATHSIG
    sends it SIGKILL when the worker dies, and a seccomp filter refuses it the prctl
    that would clear that (a sleeping child is bounded by neither timer once its
    worker is gone; it would live on under PID 1);
  - leave anything in the kernel behind: SysV shared memory, message queues and
    semaphores (shmget, msgget, semget, ...) are refused by the same filter (on x86_64
    and aarch64), POSIX message queues by RLIMIT_MSGQUEUE 0; such objects outlive their
    creator, and shared memory is counted by no rlimit once detached;
  - see the trainer's secrets: a worker's environment is built from nothing
    (WORKER_ENV, never a copy of the trainer's), and the trainer's own, in
    /proc/PID/environ, is closed to `nobody` and, with Landlock, to any process outside
    the child's Landlock domain;
  - put its own text in front of the trainer's user: the trainer keeps of a reply only
    a bool or finite number and installed module names (_clean_reply), so no escape
    code, secret or file reaches its stderr or logs;
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
    (tasks/expression.py), which evaluates nothing; a task whose only scorer evals
    (puzzle24, n_queens, polynomial_multiplication, ...) can be reward-hacked this way.
  - It can READ what its user can read (nothing restricts reads: the scorers import
    modules lazily), and use UDP or other non-TCP sockets (Landlock has no rules for
    them), so a secret in a file readable by `nobody` (or by you, not as root) can
    leave, over the network or encoded in its own score (a float carries 6 bytes).
  - Not root and no Landlock (kernels before 5.13, or Landlock disabled): the child runs
    as you, so it can signal or write anything you own, the trainer included, and read
    the trainer's environment in /proc. The first worker prints a warning saying so.
  - Other architectures than x86_64 and aarch64: no seccomp filter (no system call
    table here), so SysV IPC stays open and the parent-death signal can be cleared;
    the first worker prints a warning saying so.
  - As root without Landlock: `nobody` can still write where everyone may (/tmp,
    /dev/shm, /var/tmp).
  - It is not a defence against kernel bugs; a container or VM is the next layer.

Cost: a fork per answer, which on a small virtual machine takes longer than
math-verify's own comparison (docs/LOG.md has the numbers); in exchange a hang costs its
timeout and nothing more, because the warm worker kills the child and stays.

Why a filter and not an IPC namespace of the child's own (unshare(CLONE_NEWIPC), whose
objects die with it): the namespace needs CAP_SYS_ADMIN, which the child, `nobody` or
you, does not have. It could take one only inside a user namespace of its own, which
hands model-written code every capability within it and is refused or restricted on
many hosts (Docker's default seccomp profile, Ubuntu's AppArmor default since 24.04);
and inside its own namespace a child still fills memory for its whole timeout (1 GB of
detached segments took 1.1-1.2 s on the 2-core machine: docs/faults_and_safety.md). The
filter refuses the first shmget, as any user, on any kernel since 3.5.

Written for Linux (where the tests run). Elsewhere there is no Landlock, no seccomp and
no parent-death signal, and the rest is untested.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import logging
import math
import os
import pkgutil
import platform
import queue
import re
import resource
import select
import signal
import socket
import struct
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
    """Score one answer in a sandboxed child: the scorer's value (a bool or a finite float), or None.

    library: what the worker imports and scores with, "math" or "reasoning_gym:NAME"
    (prepare_scorer). args: the scorer's arguments (JSON values). warmup: arguments
    the worker scores once at start, as the trainer's user, before it drops privileges
    (so the library's lazy imports happen while its files are readable); only trusted
    text belongs there (a dataset's own reference answers, never model output).
    None means: no reply within `timeout` seconds, the child crashed (out of memory,
    killed), or its reply was not JSON, or its value not a bool or a finite number
    (_clean_reply). A worker found dead is restarted and the answer asked again, once;
    a worker that dies on the retry too scores None.
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
                reply = _clean_reply(json.loads(worker.conn.recv_bytes(2 * MAX_REPLY_BYTES)))
                if reply["missing"]:
                    _warn_missing(library, reply["missing"])
                return reply["value"]
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

    A plain `python -P -c` process (not multiprocessing): it imports only this file
    and the scorer's library, never the trainer's main module, and it talks
    bytes (JSON), never pickles. -P keeps the working directory off sys.path.
    start_new_session: a session and process group of its own (setsid).
    env: worker_env(), built from nothing, never a copy of the trainer's environment.
    """
    workdir = tempfile.mkdtemp(prefix="tokencredit-sandbox-")
    os.chmod(workdir, 0o555)                 # empty and read-only, for the worker's user too
    mine, theirs = socket.socketpair()
    # This file by its path, not `from tasks import sandbox`: the package would import every
    # task (and torch) into the worker, and the tasks folder on sys.path would shadow the
    # scorer libraries (tasks/reasoning_gym.py is not reasoning_gym).
    code = (f"import importlib.util as u; s = u.spec_from_file_location('tokencredit_sandbox', {__file__!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); m.worker_main({theirs.fileno()})")
    proc = subprocess.Popen([sys.executable, "-P", "-c", code], pass_fds=[theirs.fileno()], cwd=workdir,
                            env=worker_env(), stdin=subprocess.DEVNULL, start_new_session=True)
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


# What a worker's environment holds: these values, set here, and nothing else. A trainer's
# environment is where secrets live (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, a
# cloud's tokens, ...), and whatever a worker holds, its children hold too: code in a
# child reads os.environ and can send it away (UDP is open; the module header), or encode
# it in its own score. So the environment is built from nothing rather than filtered
# from the trainer's, where a new secret would pass by default.
WORKER_ENV = {
    # One thread each: POOL_SIZE workers share the cores with the trainer, and a child
    # cannot start threads at all (RLIMIT_NPROC 0), so no library should plan on a pool.
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    # A worker imports as the trainer's user (root, say) before it drops privileges:
    # it writes no .pyc files into the trainer's Python.
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Passed on when the trainer has them: where its Python (the interpreter a worker runs,
# sys.executable) finds its modules and libraries. Without them a worker may not import
# the scorer the trainer would. Paths, not secrets. Everything else stays behind, e.g.
# PATH (a worker starts by absolute path; Python's exec and shutil.which fall back to
# /bin:/usr/bin, and a child may not execute anything where Landlock is on), HOME (Python
# finds a user's site-packages through the password database, and a scorer has no use
# for ~/.netrc or a token cache), TMPDIR (nothing a worker does writes a file),
# VIRTUAL_ENV (a venv's Python finds its packages from its own path), LANG and LC_* (with
# no locale set, Python reads and writes text as UTF-8: its C-locale rules, PEP 538/540).
PASSED_ON = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "LD_LIBRARY_PATH")


def worker_env() -> dict:
    """The environment a worker starts with: WORKER_ENV plus the PASSED_ON variables the trainer has."""
    return {**WORKER_ENV, **{name: os.environ[name] for name in PASSED_ON if name in os.environ}}


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
    """Warn once when a child could signal the trainer (same user and no Landlock signal scope),
    and once when it has no seccomp filter (an architecture without a system call table here)."""
    if not info.get("seccomp"):
        _warn_once("no-seccomp", f"the scorer sandbox has no seccomp filter on {platform.machine()}: a scored "
                   "answer that runs code could leave SysV shared memory behind and outlive its worker "
                   "(tasks/sandbox.py)")
    if info.get("uid") != os.getuid() or info.get("landlock", 0) >= 6:
        return
    _warn_once("weak", f"the scorer sandbox runs as your user (uid {os.getuid()}) without Landlock's signal scope "
               f"(Landlock ABI {info.get('landlock', 0)}, needs 6): a scored answer that runs code could signal or "
               "write to your processes and files (tasks/sandbox.py)")


def _warn_missing(library: str, names: list) -> None:
    """Warn once per library when a child could not import a module its worker's user cannot read.

    names: module names that passed _clean_reply (a child's text never reaches this line otherwise).
    """
    _warn_once(library, f"the sandboxed {library} scorer needed {', '.join(names[:3])}, which its user "
               f"(uid {WORKER_INFO.get(library, {}).get('uid')}) cannot read: answers that need it score 0. Install "
               "Python where every user can read it, or add such an answer to MATH_WARMUP")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# What the trainer takes from a reply: a value and module names, checked
# ---------------------------------------------------------------------------------------

MAX_MISSING = 20              # module names a reply may report (the warning prints 3)
MAX_NAME_CHARS = 200          # a longer dotted name is not a module a scorer imports
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def _clean_reply(reply) -> dict:
    """{"value": a bool, a finite float or None, "missing": [module names]}: all the trainer
    keeps of a reply.

    A reply was written by a child that may run the answer's code, so every byte of it is
    the answer's to choose (a payload can write to the reply pipe itself and exit). Left as
    is, its value could be a string holding a secret, NaN or a 400-digit integer, and its
    `missing` names, printed in a warning, could hold terminal escape codes (they can
    clear or retitle the terminal, or write to its clipboard), a secret, or a file's
    contents, straight to the trainer's stderr and its logs. Kept:
      value: a bool as is; an int or float that is finite as a float, as float;
        anything else is None (the scorer did not answer);
      missing: at most MAX_MISSING names that match a dotted Python identifier of at most
        MAX_NAME_CHARS characters AND whose top-level package the trainer's own Python
        has (the child reports modules it failed to import, so a name the trainer does
        not have was never one). The pattern leaves no control character, escape or
        space; the installed set leaves no freely chosen word (a token shaped like a
        module name) either: what can still reach stderr is a choice among installed
        module names, once per library (the warning is printed once).
    """
    reply = reply if isinstance(reply, dict) else {}
    value = reply.get("value")
    if not isinstance(value, bool):
        try:
            value = float(value) if isinstance(value, (int, float)) else None
        except OverflowError:                 # an int beyond float's range
            value = None
        if value is not None and not math.isfinite(value):
            value = None
    names = reply.get("missing")
    names = [name for name in names if _is_installed_module_name(name)] if isinstance(names, list) else []
    return {"value": value, "missing": names[:MAX_MISSING]}


def _is_installed_module_name(name) -> bool:
    return (isinstance(name, str) and len(name) <= MAX_NAME_CHARS and _MODULE_NAME.fullmatch(name) is not None
            and name.partition(".")[0] in _installed_top_level())


@functools.cache
def _installed_top_level() -> frozenset:
    """Top-level module names the trainer's Python can import: built in, standard library, or on sys.path."""
    return frozenset({m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
                     | set(getattr(sys, "stdlib_module_names", ())))


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
# The worker: imports once, forks a locked-down child per answer
# ---------------------------------------------------------------------------------------

def worker_main(fd: int) -> None:
    """Body of a worker process (started by _start_worker with its end of the pipe as fd).

    1. read {"library", "warmup"}; import the library and score the warm-up arguments
       (prepare_scorer), still with the trainer's rights;
    2. drop root (to nobody), set PR_SET_NO_NEW_PRIVS, check that a child can lock
       itself down, and say "ready" with what holds;
    3. for each request {"timeout", "args"}: fork a child that locks itself down
       (_lock_down) and scores; reply {"value": its value or None, "missing": [...]}.
    Exits when the trainer's end of the pipe closes.
    """
    import gc

    conn = Connection(fd)
    hello = json.loads(conn.recv_bytes())
    score = prepare_scorer(hello["library"], hello["warmup"])
    path = [p for p in sys.path if os.path.isabs(p) and os.path.isdir(p)]
    installed = {m.name for m in pkgutil.iter_modules()}      # top-level names, read while readable
    uid = _drop_root()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    abi = landlock_abi()
    # Where Python's files may now be out of reach (Python under /root, read by nobody):
    # children then report the modules they failed to import (the module header).
    hidden = installed if any(not os.access(p, os.R_OK | os.X_OK) for p in path) else set()
    gc.freeze()                               # children then leave the inherited objects alone (no copies)
    info = {"uid": uid, "landlock": abi, "seccomp": seccomp_supported(), "pid": os.getpid(),
            "python_readable": not hidden}
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
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with its worker (for good: the filter below)...
    if os.getppid() != parent:                # ...even one that died before the line above
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.closerange(3, keep_fd)                 # the trainer's pipe, /dev/null's extra descriptor, ...
    os.closerange(keep_fd + 1, 1 << 16)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past RLIMIT_FSIZE fails instead of killing
    # RLIMIT_MSGQUEUE 0: no POSIX message queue (mq_open), which would outlive the child
    # under its name, in kernel memory, like the SysV objects the filter below refuses.
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_MSGQUEUE, 0)):
        resource.setrlimit(limit, (value, value))
    if landlock:
        _landlock_restrict_self(landlock)
    if seccomp_supported():
        _seccomp_restrict_self()


# --- helpers of the worker: uid, prctl, Landlock, seccomp -------------------------------

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


# seccomp (kernel docs: userspace-api/seccomp_filter): a small classic-BPF program the
# kernel runs at every system call of this process (and of any it could start), reading
# the call's architecture, number and arguments (struct seccomp_data) and answering
# ALLOW or ERRNO. Like Landlock it needs PR_SET_NO_NEW_PRIVS, not root, and stays for good.
# The child's filter refuses (EPERM) two things nothing else here covers:
#   - SysV IPC (shmget, msgget, semget and the calls that use their objects): a segment
#     lives in the kernel, not in a process, so RLIMIT_AS does not count it once detached,
#     Landlock has no rule for it, and it stays after its creator, its worker and the
#     trainer are gone. Refusing shmget itself also bounds memory during the child's 2 s,
#     which a private IPC namespace would not (the module header says why there is none);
#   - prctl(PR_SET_PDEATHSIG, ...): the child set it to SIGKILL first thing, and may not
#     clear it (then sleep and outlive its killed worker, reparented to PID 1).
# System call numbers differ between architectures and there is no portable way to look
# them up at run time, so this file carries the two tables it was checked on (from the
# kernel's asm/unistd_64.h and asm-generic/unistd.h); elsewhere there is no filter, and
# the worker reports "seccomp": false.
_SYSCALLS = {   # platform.machine() -> (AUDIT_ARCH_* of the 64-bit ABI, {name: number})
    "x86_64": (0xC000003E, {"shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66,
                            "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
                            "semtimedop": 220, "prctl": 157}),
    "aarch64": (0xC00000B7, {"msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190,
                             "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195,
                             "shmat": 196, "shmdt": 197, "prctl": 167}),
}
_SYSV_IPC = ("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
             "msgget", "msgsnd", "msgrcv", "msgctl")
_X32_SYSCALL_BIT = 0x40000000             # x86_64's x32 ABI: the same arch value, numbers with this bit
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06   # BPF_LD|BPF_W|BPF_ABS, ...
_ARCH_OFFSET, _NR_OFFSET, _ARG0_OFFSET = 4, 0, 16                         # in struct seccomp_data


class _SockFilter(ctypes.Structure):      # struct sock_filter: one BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):       # struct sock_fprog: the program
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_supported() -> bool:
    """Is there a system call table here for the child's filter? (Linux, 64-bit Python, x86_64 or aarch64)."""
    return sys.platform.startswith("linux") and platform.machine() in _SYSCALLS and struct.calcsize("P") == 8


def seccomp_program(machine: str) -> list:
    """The child's filter as (code, jt, jf, k) instructions. jt/jf: how many instructions to
    skip when the test holds/fails; the last two are ALLOW and DENY (errno EPERM).

        A = arch;  not this ABI (a 32-bit call on a 64-bit kernel, through int 0x80) -> DENY
        A = nr;    x32 call -> DENY;  a SysV IPC call -> DENY
        not prctl -> ALLOW;  A = low 32 bits of arg 0;  PR_SET_PDEATHSIG -> DENY;  else ALLOW

    The prctl test reads only the low half of the 64-bit argument, as the kernel does
    (prctl's option is an int): a value with high bits set cannot slip past it.
    """
    arch, numbers = _SYSCALLS[machine]
    prog = [(_BPF_LD_W_ABS, 0, 0, _ARCH_OFFSET), (_BPF_JEQ_K, 0, "DENY", arch),
            (_BPF_LD_W_ABS, 0, 0, _NR_OFFSET), (_BPF_JGE_K, "DENY", 0, _X32_SYSCALL_BIT)]
    prog += [(_BPF_JEQ_K, "DENY", 0, numbers[name]) for name in _SYSV_IPC]
    prog += [(_BPF_JEQ_K, 0, "ALLOW", numbers["prctl"]), (_BPF_LD_W_ABS, 0, 0, _ARG0_OFFSET),
             (_BPF_JEQ_K, "DENY", "ALLOW", PR_SET_PDEATHSIG)]
    labels = {"ALLOW": len(prog), "DENY": len(prog) + 1}       # where the two answers will be

    def skip(target, i: int) -> int:                             # a label, or 0 (the next instruction)
        return labels[target] - i - 1 if isinstance(target, str) else target
    prog = [(code, skip(jt, i), skip(jf, i), k) for i, (code, jt, jf, k) in enumerate(prog)]
    return prog + [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | 1)]


def _seccomp_restrict_self() -> None:
    """Install seccomp_program for this machine on this process, for good (OSError if refused)."""
    prog = seccomp_program(platform.machine())
    filters = (_SockFilter * len(prog))(*[_SockFilter(*instruction) for instruction in prog])
    fprog = _SockFprog(len(prog), filters)
    prctl(PR_SET_NO_NEW_PRIVS, 1)            # required, as for Landlock
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _address_space() -> int:
    """This process's virtual memory size in bytes (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
