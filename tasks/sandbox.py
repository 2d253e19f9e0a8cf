"""Sandbox: scoring text a model wrote, in processes that cannot hurt the trainer.

Some verifiers evaluate the answer they check. reasoning-gym's puzzle24 scorer calls
sympy's parse_expr, which hands the text to Python's eval; n_queens, spiral_matrix and
a few others call eval directly; math-verify passes parts of an answer to sympy. A
policy under RL explores its output space and keeps whatever is rewarded, so "the
scorer runs model text as code" is a question of when, not if: an answer
`__import__('os').system('rm -rf ~')` or `os.kill(os.getppid(), 9)` is a few dozen
tokens. Running the scorer "in a worker process" is not enough: a process started by
the trainer has the trainer's rights. So such scorers run behind three process
boundaries, and the innermost may do only what a scorer needs:

    trainer ──pipe──> worker: imports the scorer's   ──fork──> one child per answer:
    (this file)       library once, isolates itself,           locks itself down, scores
                      drops root, never reads                  ONE answer, writes one
                      model text itself                        JSON value, exits
                      (tasks/sandbox_worker.py)

Deny by default. The child's seccomp filter is an allow-list (tasks/sandbox_filter.py
says what it allows and why): the calls a Python scorer makes on its own memory, its
own descriptors and its own signals, and reads; anything else fails with EPERM, and the
scorer reports a wrong answer. Around it, the worker runs where the machine allows in
namespaces of its own, so that a child sees no process but its worker and itself:
  - under bubblewrap (`bwrap`, the sandbox Flatpak uses; Debian's `bubblewrap`) when it
    is on PATH: PID, network, IPC, mount and UTS namespaces (and a user namespace when
    the trainer is not root), a read-only root holding a declared set of files: the
    interpreter, the standard library, site-packages and the system's libraries, never
    a directory that holds a .git, a run directory or the home directory, whatever
    PYTHONPATH says; and a private /tmp (tasks/sandbox_view.py: bubblewrap_command,
    read_only_paths);
  - otherwise built in: PID, network, IPC and mount namespaces by unshare (as root, or
    in a user namespace of its own where the kernel allows unprivileged ones);
  - where neither is possible, the filter alone keeps the child off other processes.
Every worker lives exactly as long as the trainer: it exits when the trainer's end of its
pipe closes, also while a child is scoring, so a trainer killed with SIGKILL leaves no
worker and no child behind. Workers are counted as they start, and so are the answers
that get no score and why (take_counts; metrics.jsonl's sandbox/* keys).
The first worker of a run prints one line saying which it got (_say_what_holds), and one
more where its children's user cannot read a directory of its Python (as root: a Python
or a venv under /root, or a clone made with `mktemp -d`), naming it and the fix
(_warn_unreadable).
TOKENCREDIT_SANDBOX=builtin forces the built-in path, =bwrap requires bubblewrap, and
=filter enters no namespace (the weakest case, so that its tests run anywhere).

What a child can NOT do (Linux, x86_64 or aarch64; each line names the mechanism):
  - open a socket of any kind (TCP, UDP, MPTCP, UNIX, netlink): the filter; and in a
    network namespace there is no interface to reach anything by;
  - reach another process: kill, tgkill, ptrace, process_vm_*, pidfd_*, prlimit with a
    pid, setpriority, sched_setaffinity are refused (the filter), and in a PID namespace
    no other process is in sight; Landlock (ABI 6) scopes signals too;
  - break its worker for later answers: besides the above, the worker checks its own
    limits, priority and CPUs before and after each child and replaces itself if any
    changed, or if a child fails to lock down (it writes "L" first); the trainer then
    asks the answer again of a fresh worker, so a right answer always scores;
  - store anything in the kernel that outlives it: the keyring (add_key, request_key,
    keyctl), SysV IPC, POSIX message queues, memfd, all refused by the filter;
  - write, create, remove or execute any file: openat only for reading (the filter),
    no unlink, rename, mkdir, execve; and Landlock where the kernel has it;
  - outlive its timeout: its worker kills it at `timeout` seconds of wall time (SIGKILL
    to its process group); RLIMIT_CPU (timeout + 1 CPU seconds) bounds a spinning one;
  - outlive its worker: PR_SET_PDEATHSIG (SIGKILL when the worker dies), and prctl,
    which could clear it, is refused;
  - fork, start threads or run a program: clone, fork, execve refused, RLIMIT_NPROC 0;
  - use more than SCORER_MEMORY_BYTES beyond what it inherited: RLIMIT_AS (a memory
    bomb is a MemoryError), no core dump (RLIMIT_CORE 0), no file growth (RLIMIT_FSIZE 0);
  - see the trainer's secrets: a worker's environment is built from nothing
    (WORKER_ENV, never a copy of the trainer's), and the trainer's own, in
    /proc/PID/environ, is out of sight (a PID namespace), closed to `nobody`, and with
    Landlock closed to any process outside the child's domain;
  - put its own text in front of the trainer's user: the trainer keeps of a reply only
    a bool or finite number and installed module names (_is_installed_module_name);
  - talk to the trainer: it holds no descriptor of the trainer's pipe, stdin/stdout/
    stderr are /dev/null, and its reply is read as at most MAX_REPLY_BYTES of UTF-8 JSON
    nested at most 2 deep, of a fixed schema, by a reader that cannot raise, on both
    sides of the worker (tasks/sandbox_reply.py), never unpickled (a pickle is a
    program); any other reply is no score, counted and said (_no_score);
  - read its worker's memory or a sibling's: the worker is not dumpable, and the
    children inherit that;
  - act as root: a root trainer's worker switches to `nobody` (uid 65534) after
    importing its library and before any request; PR_SET_NO_NEW_PRIVS;
  - find anything through a relative path: its working directory is empty and
    read-only (a directory of its worker's own, removed when the worker stops, or by
    the next trainer if this one was killed; under bubblewrap, the sandbox's root).

What a child CAN still do (the limits of this sandbox; say so, do not hide it):
  - It sets ITS OWN score: it runs inside the scorer. This is why the countdown task,
    reasoning-gym's countdown data included, is scored by our own parser
    (tasks/expression.py), which evaluates nothing; a task whose only scorer evals
    (puzzle24, n_queens, polynomial_multiplication, ...) can be reward-hacked this way.
  - It can READ what its user can read (the scorers import modules lazily, so reads
    stay open): under bubblewrap only what is bound there (Python, its packages, the
    system's libraries; and each bind's host path, in /proc/self/mountinfo: see
    sandbox_view.py), elsewhere any file `nobody` (or you, not as root) may read;
    and carry what it read out in its own score (a float holds 6 bytes), its only way out.
  - Spend its timeout's worth of CPU and 1 GiB of memory, and sleep through its timeout.
  - Other architectures than x86_64 and aarch64: no seccomp filter (no system call table
    here); the first worker prints a warning saying so.
  - It is not a defence against kernel bugs: for untrusted production use, run the
    trainer in a container or a VM.

Cost: a fork per answer, which on a small virtual machine takes longer than
math-verify's own comparison (bench/scorer_sandbox.py measures it;
docs/faults_and_safety.md has the numbers); in exchange a hang costs its timeout and
nothing more, because the warm worker kills the child and stays. A worker starts
about half a second slower under bubblewrap (matplotlib, which reasoning-gym imports,
rebuilds its font cache in the sandbox's empty /tmp), once per worker.

Written for Linux (where the tests run). Elsewhere there is no Landlock, no seccomp, no
namespaces and no parent-death signal, and the rest is untested.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pkgutil
import platform
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection

from tasks import sandbox_filter
from tasks.sandbox_worker import MAX_REPLY_BYTES, NOBODY, STARTUP_TIMEOUT  # noqa: F401  (NOBODY: the tests')
from tasks.sandbox_worker import REASONS, WORKER_REPLY, read_reply
from tasks.sandbox_view import BWRAP_NAMESPACES, WORKER_DIR_INSIDE, WORKER_FILES, arguments_file
from tasks.sandbox_view import bubblewrap_command, bwrap_problem, worker_env
from tasks.sandbox_worker import PR_SET_PDEATHSIG, prctl  # noqa: F401  (machinery/checks.py's parent-death signal)

POOL_SIZE = 2                 # workers per scorer library; the machine this was written on has 2 cores
REPLY_GRACE = 10.0            # a worker answers within timeout + this, or is taken to be broken
CHOICE_VARIABLE = "TOKENCREDIT_SANDBOX"    # bwrap, builtin or filter: _start_worker
WORKDIR_PREFIX = "tokencredit-sandbox-"    # + the trainer's PID and start time: see _remove_stale_workdirs

_pools: dict[str, queue.Queue] = {}      # library -> POOL_SIZE slots: a Worker, or None (start on demand)
_pools_guard = threading.Lock()
WORKER_INFO: dict[str, dict] = {}        # library -> what its last worker reported at start (tests read it)
_warned: set = set()                     # warnings already printed
_warned_guard = threading.Lock()         # a batch's threads warn at once: one line each, once
_counts: dict[str, int] = {}             # worker starts and answers without a score, since take_counts
_counts_guard = threading.Lock()


def run_scorer(library: str, args: list, timeout: float, warmup: list | None = None):
    """Score one answer in a sandboxed child: the scorer's value (a bool or a finite float), or None.

    library: what the worker imports and scores with, "math" or "reasoning_gym:NAME"
    (sandbox_worker.prepare_scorer). args: the scorer's arguments (JSON values). warmup:
    arguments the worker scores once at start, as the trainer's user, before it drops
    privileges (so the library's lazy imports happen while its files are readable); only
    trusted text belongs there (a dataset's own reference answers, never model output).
    None means no score, for a reason of sandbox_reply.REASONS: no reply within `timeout`
    seconds, the child crashed (out of memory, killed), its reply was too long, not UTF-8,
    nested too deep, not JSON, not of the schema, or its value not finite. Each is counted
    (take_counts) and said once per reason (_no_score); none is an exception: the worker's
    reply is read by sandbox_reply.read_reply, which cannot raise.
    A worker found dead, or one that says it is broken (something changed its limits,
    priority or CPUs, or its child could not lock down), is replaced; when the answer did
    not run, it is asked again of the new worker, once. So an answer that breaks its
    worker costs the next answer a worker's start, never its score.
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
                    return _no_score(library, "worker_stuck")
                data = worker.conn.recv_bytes(MAX_REPLY_BYTES)   # OSError if longer (never: the worker caps it)
            except (EOFError, OSError):      # dead: killed, or out of memory; start another
                _stop_worker(worker)
                worker = None
                continue
            reply, _ = read_reply(data, WORKER_REPLY)
            if reply is None:                # a worker writes what it read, so never seen: replace it
                _stop_worker(worker)
                worker = None
                return _no_score(library, "worker_reply")
            if reply["broken"]:              # the worker's word (it never runs model text)
                _stop_worker(worker)
                worker = None
                if not reply["scored"]:      # the answer never ran: ask a fresh worker
                    continue
            names = [name for name in reply["missing"] if _is_installed_module_name(name)]
            if names:
                _count("missing_module")
                _warn_missing(library, names)
            value = reply["value"]
            if value is None:
                return _no_score(library, reply["reason"] or "crash")
            return value if isinstance(value, bool) else float(value)
        return _no_score(library, "worker_lost")
    finally:
        pool.put(worker)


def take_counts() -> dict:
    """What the sandbox did since the last call, and reset: {"worker_starts": n, "no_score": n,
    "no_score/<reason>": n, "missing_module": n}, each key only when it happened.
    machinery/metrics.sandbox_counts puts them in each step's line of metrics.jsonl."""
    with _counts_guard:
        counts = dict(_counts)
        _counts.clear()
    return counts


def _count(name: str) -> None:
    with _counts_guard:
        _counts[name] = _counts.get(name, 0) + 1


def _no_score(library: str, reason: str) -> None:
    """An answer that gets no score (None): count it under its reason, and say so once per reason."""
    _count("no_score")
    _count(f"no_score/{reason}")
    _warn_once(f"no_score/{reason}", f"an answer to the sandboxed {library} scorer got no score: {REASONS[reason]}; "
               f"it scores 0 (said once; metrics.jsonl counts them per step as sandbox/no_score/{reason})")
    return None


def shutdown() -> None:
    """Stop every worker (each waits for its busy call to finish, bounded by its timeout).

    Runs at exit too (atexit), so the workers' directories are removed. Workers also exit
    on their own when the trainer's end of the pipe closes (the trainer was killed), and
    their children die with them (parent-death signal); a killed trainer's directories
    are removed by the next one (_remove_stale_workdirs).
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
    """One worker process, the trainer's end of its pipe, and its working directory (or None)."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, workdir: str | None):
        self.proc, self.conn, self.workdir = proc, conn, workdir


def _pool(library: str) -> queue.Queue:
    with _pools_guard:
        if library not in _pools:
            _pools[library] = queue.Queue()
            for _ in range(POOL_SIZE):
                _pools[library].put(None)
        return _pools[library]


def _start_worker(library: str, warmup: list) -> Worker:
    """Start one worker, under bubblewrap where it is on PATH and works, else on the built-in path.

    TOKENCREDIT_SANDBOX=bwrap makes a missing or failing bubblewrap an error instead of
    a warning; =builtin never tries it (CI runs the hostile answers both ways); =filter
    enters no namespace either: what a machine that allows none gets, for its tests.
    """
    _remove_stale_workdirs()
    choice = os.environ.get(CHOICE_VARIABLE, "")
    if choice not in ("", "bwrap", "builtin", "filter"):
        raise RuntimeError(f"{CHOICE_VARIABLE}={choice!r}: use bwrap, builtin, filter, or leave it unset")
    bwrap = shutil.which("bwrap") if choice in ("", "bwrap") else None
    if choice == "bwrap" and not bwrap:
        raise RuntimeError(f"{CHOICE_VARIABLE}=bwrap, but bwrap is not on PATH (apt-get install bubblewrap)")
    if bwrap and (problem := bwrap_problem(bwrap)):
        if choice == "bwrap":
            raise RuntimeError(f"{CHOICE_VARIABLE}=bwrap, but bwrap cannot run here: {problem}")
        _warn_once("bwrap", f"bwrap is on PATH but cannot run here ({problem}): scorers use the built-in "
                   "sandbox (tasks/sandbox.py)")
        bwrap = None
    return _launch(library, warmup, bwrap, namespaces=choice != "filter")


def _launch(library: str, warmup: list, bwrap: str | None, namespaces: bool = True) -> Worker:
    """Start one worker and wait until it has imported its library and locked itself down.

    A plain `python -P -c` process (not multiprocessing): it imports only
    tasks/sandbox_worker.py, by its path, and the scorer's library, never the trainer's
    main module, and it talks bytes (JSON), never pickles. -P keeps the working directory
    off sys.path. start_new_session: a session and process group of its own (setsid).
    env: worker_env(), built from nothing, never a copy of the trainer's environment.
    Under bubblewrap the same command runs inside bubblewrap_command's sandbox; on the
    built-in path its working directory is an empty read-only directory of its own, and
    it enters namespaces of its own unless `namespaces` is False.
    """
    _count("worker_starts")
    workdir = None
    if not bwrap:
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-{_start_time(os.getpid())}-")
        os.chmod(workdir, 0o555)             # empty and read-only, for the worker's user too
    mine, theirs = socket.socketpair()
    # sandbox_worker.py by its path, not `from tasks import sandbox_worker`: the package
    # would import every task (and torch) into the worker, and the tasks folder on
    # sys.path would shadow the scorer libraries (tasks/reasoning_gym.py is not reasoning_gym).
    # Under bubblewrap the worker's files are at WORKER_DIR_INSIDE, and bwrap's arguments
    # (every bind) are in a file (`--args FD`): the command lines a child can read in
    # /proc name no path of the repository (sandbox_view.py's header).
    worker_file = os.path.join(WORKER_DIR_INSIDE, "sandbox_worker.py") if bwrap else WORKER_FILES[0]
    code = (f"import importlib.util as u; s = u.spec_from_file_location('tokencredit_sandbox_worker', "
            f"{worker_file!r}); m = u.module_from_spec(s); s.loader.exec_module(m); m.worker_main({theirs.fileno()})")
    command, pass_fds, arguments = [sys.executable, "-P", "-c", code], [theirs.fileno()], None
    if bwrap:
        arguments = arguments_file(bubblewrap_command(bwrap)[1:-1])
        command = [bwrap, "--args", str(arguments.fileno()), "--"] + command
        pass_fds.append(arguments.fileno())
    try:
        proc = subprocess.Popen(command, pass_fds=pass_fds, cwd=workdir or "/", env=worker_env(),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        theirs.close()
        if arguments is not None:
            arguments.close()
    worker = Worker(proc, Connection(mine.detach()), workdir)
    program = sandbox_filter.program(platform.machine()) if sandbox_filter.supported() else []
    try:
        worker.conn.send_bytes(json.dumps({"library": library, "warmup": warmup, "filter": program,
                                           "namespaces": namespaces and not bwrap}).encode())
        if not worker.conn.poll(STARTUP_TIMEOUT):
            raise RuntimeError(f"the {library} scorer's worker did not start within {STARTUP_TIMEOUT:.0f} s")
        info = json.loads(worker.conn.recv_bytes(1 << 16))     # the worker's own report, before any answer
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
    if bwrap:
        info["namespaces"] = BWRAP_NAMESPACES + ([] if os.geteuid() == 0 else ["user"])
    info["sandbox"] = "bubblewrap" if bwrap else "namespaces" if info["namespaces"] else "filter"
    WORKER_INFO[library] = info
    _say_what_holds(info)
    _warn_if_weak(info)
    _warn_unreadable(info)
    return worker


# ---------------------------------------------------------------------------------------
# The working directories of killed trainers
# ---------------------------------------------------------------------------------------

@functools.cache
def _remove_stale_workdirs() -> None:
    """Remove, once per trainer, the built-in path's working directories that no living trainer owns.

    Each is named WORKDIR_PREFIX + PID + start time of the trainer that made it: a
    trainer killed with SIGKILL runs no exit handler, and its directories stayed in the
    temporary directory. A directory is removed when it is ours (same owner) and no
    process with that PID and start time exists (a PID alone may have been reused).
    Linux only (the start time comes from /proc); elsewhere nothing is removed.
    """
    if _start_time(os.getpid()) is None:
        return
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        found = re.fullmatch(re.escape(WORKDIR_PREFIX) + r"(\d+)-(\d+)-\w+", name)
        path = os.path.join(base, name)
        try:
            if (not found or _start_time(int(found[1])) == int(found[2]) or not os.path.isdir(path)
                    or os.path.islink(path) or os.lstat(path).st_uid != os.geteuid()):
                continue
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:                       # gone meanwhile, or not ours to remove
            pass


def _start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat, field 22); None if none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


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
    if worker.workdir:
        try:
            os.rmdir(worker.workdir)
        except OSError:                       # not empty: never seen (no child can write)
            pass


def describe(info: dict) -> str:
    """What a worker's report (WORKER_INFO) means, in one line."""
    where = {"bubblewrap": "under bubblewrap", "namespaces": "in namespaces of their own",
             "filter": "in no namespace of their own"}[info["sandbox"]]
    detail = "; ".join(part for part in (", ".join(info["namespaces"]), info.get("no_namespaces_because")) if part)
    landlock = f"Landlock ABI {info['landlock']}" if info["landlock"] else "no Landlock"
    seccomp = "the seccomp allow-list" if info["seccomp"] else f"NO seccomp filter ({platform.machine()})"
    return (f"scorers run {where}{f' ({detail})' if detail else ''}, as uid {info['uid']}, with {seccomp} and {landlock}; "
            f"a scoring child sees {info['processes_seen']} process(es)")


def _say_what_holds(info: dict) -> None:
    """The first worker of a trainer prints which sandbox the run got (stderr, one line)."""
    _say_once("said", f"sandbox: {describe(info)} (tasks/sandbox.py)")


def _warn_if_weak(info: dict) -> None:
    """Warn once when a child has no seccomp filter (an architecture without a system call
    table here), and once more when it could then also signal the trainer (same user, no
    Landlock signal scope, no namespaces)."""
    if info.get("seccomp"):
        return
    _warn_once("no-seccomp", f"the scorer sandbox has no seccomp filter on {platform.machine()}: a scored "
               "answer that runs code could open sockets, store keys in the kernel and re-limit or renice "
               "your processes (tasks/sandbox.py)")
    if info.get("uid") != os.getuid() or info.get("landlock", 0) >= 6 or info.get("namespaces"):
        return
    _warn_once("weak", f"the scorer sandbox runs as your user (uid {os.getuid()}) without Landlock's signal scope "
               f"(Landlock ABI {info.get('landlock', 0)}, needs 6): a scored answer that runs code could signal or "
               "write to your processes and files (tasks/sandbox.py)")


def _warn_unreadable(info: dict) -> None:
    """Say once, when the first worker starts, that its children's user cannot read a directory of
    its Python (sandbox_worker._unreadable: the directory and the one that closes it).

    As root the children run as `nobody`, and a Python or a venv under a directory only its
    owner may enter (/root, 0700, or a clone made with `mktemp -d`) is then out of their
    reach: what the worker imported before dropping root, and the warm-up, they inherit;
    a module the scorer imports later for some answer is missing, and that answer scores 0
    (each such answer is then reported too: _warn_missing). Under bubblewrap the
    directories above a bind are made readable, so only a closed directory of Python's
    own is left (a venv made 0700 itself).
    """
    if not info.get("unreadable"):
        return
    entry, closed = info["unreadable"]
    fix = ("" if info["sandbox"] == "bubblewrap" else
           "install bubblewrap (apt-get install bubblewrap: it opens the directories above what it binds), or ")
    chmod = "o+rx" if closed == entry else "o+x"             # an ancestor needs only to be entered
    _warn_once("unreadable", f"the scorer sandbox's user (uid {info['uid']}) cannot read {entry} ({closed} is closed "
               f"to other users): a module its scorers load only for some answers is missing there, and such an "
               f"answer scores 0 (reported when it happens). Fix: {fix}let other users in (chmod {chmod} {closed}), "
               "or install Python and its packages where every user can read them (tasks/sandbox.py)")


def _warn_missing(library: str, names: list) -> None:
    """Warn once per library when a child could not import a module its worker's user cannot read.

    names: module names that passed _is_installed_module_name (a child's text never reaches this line otherwise).
    """
    _warn_once(library, f"the sandboxed {library} scorer needed {', '.join(names[:3])}, which its user "
               f"(uid {WORKER_INFO.get(library, {}).get('uid')}) cannot read: answers that need it score 0. Install "
               "Python where every user can read it, install bubblewrap, or add such an answer to "
               "sandbox_worker.MATH_WARMUP")


def _warn_once(key: str, message: str) -> None:
    _say_once(key, f"warning: {message}")


def _say_once(key: str, line: str) -> None:
    """Print `line` on stderr unless `key` was said. The scoring threads of a batch may say
    at the same moment: the check and the line are taken under one lock, and the line is
    one write with its newline (print writes the text and the newline apart, and two
    threads' lines ran together on one line, one of them then not found by its reader)."""
    with _warned_guard:
        if key in _warned:
            return
        _warned.add(key)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------
# The module names a reply reports: printed only if the trainer's Python has them
# ---------------------------------------------------------------------------------------

def _is_installed_module_name(name: str) -> bool:
    """A name a reply reports (already a dotted identifier of at most MAX_NAME_CHARS: read_reply)
    is printed in _warn_missing only if its top-level package is one the trainer's own Python
    has: the child reports modules it failed to import, so a name the trainer does not have
    was never one. What can still reach stderr is then a choice among installed module
    names, once per library (the warning is printed once): no escape code, no secret, no
    freely chosen word."""
    return name.partition(".")[0] in _installed_top_level()


@functools.cache
def _installed_top_level() -> frozenset:
    """Top-level module names the trainer's Python can import: built in, standard library, or on sys.path."""
    return frozenset({m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
                     | set(getattr(sys, "stdlib_module_names", ())))

