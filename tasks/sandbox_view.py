"""What a sandbox worker sees: its environment, and under bubblewrap a declared set of files.

tasks/sandbox.py starts the workers; this file says what they are given. Two things:

  the environment   built from nothing (WORKER_ENV), plus the few variables that say
                    where Python finds its modules (PASSED_ON): never a copy of the
                    trainer's, which holds its secrets (worker_env);
  the files         under bubblewrap, an empty read-only root holding only what a scorer
                    imports: the interpreter, the standard library and its shared
                    libraries, the directories Python searches (site-packages), the
                    system's shared libraries, and the worker's two files; never a
                    directory that holds a .git, a run directory or the home directory,
                    whatever PYTHONPATH says (read_only_paths, refused_bind).

Bubblewrap (`bwrap`, the sandbox Flatpak uses) mounts each bind at its host path, since
Python finds its files by those paths (a venv's pyvenv.cfg names its base Python; .pth
files and compiled extensions name absolute paths). Its command line, which holds every
bind, is handed over in a file (`--args FD`), so bubblewrap's own process inside the
sandbox (PID 1, whose /proc/1/cmdline any child may read) shows none of them, and the
worker's two files are bound under WORKER_DIR_INSIDE rather than at the repository's
path. What stays visible to a child: the interpreter's path (the worker's command line)
and, in /proc/self/mountinfo, every mount point and its source path within its file
system: the kernel writes them there, bubblewrap has no option to change them, and a
child may read its own /proc (the scorers' reads are allowed).

On the built-in path (no bubblewrap) there are no binds: a child reads what its user may
read (tasks/sandbox.py's header says so).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

from tasks.sandbox_worker import STARTUP_TIMEOUT

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_FILES = (os.path.join(HERE, "sandbox_worker.py"), os.path.join(HERE, "sandbox_reply.py"))
WORKER_DIR_INSIDE = "/tokencredit-sandbox"     # where bubblewrap puts them: no host path in the command line

# What a worker's environment holds: these values, set here, and nothing else. A trainer's
# environment is where secrets live (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, a
# cloud's tokens, ...), and whatever a worker holds, its children hold too: code in a
# child reads os.environ and can encode it in its own score (a float holds 6 bytes; the
# sandbox's header), and had sockets before the allow-list. So the environment is built
# from nothing rather than filtered from the trainer's, where a new secret would pass by
# default.
WORKER_ENV = {
    # One thread each: the workers share the cores with the trainer, and a child cannot
    # start threads at all (RLIMIT_NPROC 0), so no library should plan on a pool.
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


# ---------------------------------------------------------------------------------------
# bubblewrap: the worker in a sandbox that holds only what a scorer needs
# ---------------------------------------------------------------------------------------

BWRAP_NAMESPACES = ["PID", "network", "IPC", "mount", "UTS"]


def bubblewrap_command(bwrap: str) -> list[str]:
    """bwrap's arguments, up to the `--` before the worker's command. What each gives:

      --unshare-pid, -net, -ipc, -uts, -cgroup-try: namespaces of the sandbox's own; the
          worker and its children see only each other (and bubblewrap's own PID 1), have
          a network with nothing in it, and SysV objects no one else has.
      --unshare-user when the trainer is not root: your uid mapped to itself, without
          capabilities (bubblewrap drops them). As root there is none: the worker runs
          as root until it switches to the real `nobody`, which owns nothing, rather than
          a user namespace's root, which owns the files it maps.
      --ro-bind of read_only_paths only, on an empty root made read-only (--remount-ro):
          Python, its libraries and packages; not the home directory, the repository, the
          run directories, /etc. The directories that hold the binds are made
          world-readable, so `nobody` reaches a Python that lives under /root (the
          built-in path cannot: sandbox._warn_unreadable says so).
      --ro-bind of the worker's two files into WORKER_DIR_INSIDE.
      --proc, --dev, --tmpfs /tmp: a /proc of the sandbox's PID namespace, a minimal
          /dev (null, zero, random, ...), a /tmp of its own that goes with it.
    No --die-with-parent: it kills the sandbox when the THREAD that started it ends (the
    parent-death signal follows a thread), and the threads that score a batch come and
    go with each batch (verify.score), so the workers died after every batch, each next
    batch paying their starts again. A worker exits instead when the trainer's end of its
    pipe closes, which is when the trainer process ends, killed or not, also while a
    child is scoring (sandbox_worker._read_reply watches it); bubblewrap ends with it.
    """
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        args += ["--unshare-user"]
    paths = read_only_paths()
    inside = [os.path.join(WORKER_DIR_INSIDE, os.path.basename(f)) for f in WORKER_FILES]
    # /tmp's own tmpfs first: bubblewrap mounts in the order given, so a tmpfs mounted
    # after the binds would hide any of them that live under /tmp (a clone, and its venv,
    # in /tmp/...: the worker's Python would be missing).
    args += ["--tmpfs", "/tmp"]
    # The directories that hold the binds, made first and world-readable (bubblewrap
    # would make them 0700, closed to `nobody`); they hold nothing but the binds.
    for parent in sorted({a for p in paths + inside for a in _ancestors(p)}):
        args += ["--dir", parent]
    for path in paths:
        args += ["--ro-bind", path, path]
    for source, target in zip(WORKER_FILES, inside):
        args += ["--ro-bind", source, target]
    for link in ("/bin", "/lib", "/lib32", "/lib64", "/libx32"):   # merged /usr: /lib -> usr/lib
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--chdir", "/"]
    # matplotlib (reasoning-gym imports it) wants a writable configuration directory and
    # warns at each start without one: the sandbox's own /tmp, which goes with it.
    return args + ["--setenv", "MPLCONFIGDIR", "/tmp", "--"]


def arguments_file(args: list[str]):
    """An unnamed file holding args, NUL-separated, read from its start: bwrap's `--args FD`.

    bubblewrap then runs as `bwrap --args FD -- COMMAND`, and its process inside the
    sandbox (PID 1) shows that and nothing of the binds. The caller passes its fileno
    to the child (pass_fds) and closes it once bubblewrap has started.
    """
    handle = tempfile.TemporaryFile()
    handle.write(b"".join(arg.encode() + b"\0" for arg in args))
    handle.flush()
    handle.seek(0)
    return handle


def read_only_paths() -> list[str]:
    """What a worker reads, each bound read-only at its own path (a path inside another
    one is bound with it):

      the interpreter    the file sys.executable names and each link on the way to it;
                         a venv (sys.prefix, when it is not the base) whole; the base
                         Python's lib/ (the standard library, lib-dynload, libpython and
                         the libraries it was built with), not its bin/, include/ or share/
      its search path    the directories the worker's Python searches, asked of that
                         Python with the worker's environment: site-packages, PYTHONPATH,
                         what .pth files add
      shared libraries   /usr/lib*, /lib* (those that are not links), LD_LIBRARY_PATH,
                         and the loader's cache /etc/ld.so.cache
    Each passes refused_bind, whatever PYTHONPATH says. No program but Python: before,
    the interpreter's whole directory was bound (/usr/bin for the system's Python), and
    matplotlib, which reasoning-gym imports, ran fc-list there, which printed five
    "Fontconfig error" lines per worker start for want of /etc/fonts.
    """
    paths = {"/etc/ld.so.cache"} | ({sys.prefix} if sys.prefix != sys.base_prefix else set()) \
        | ({sys.exec_prefix} if sys.exec_prefix != sys.base_exec_prefix else set())
    paths |= {os.path.join(prefix, lib) for prefix in (sys.base_prefix, sys.base_exec_prefix)
              for lib in ("lib", "lib64")}
    paths |= set(_interpreter_chain(sys.executable))
    paths |= set(worker_sys_path())
    paths |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p}
    paths |= {p for p in ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/bin", "/lib", "/lib32",
                          "/lib64", "/libx32") if not os.path.islink(p)}
    kept = []
    for path in sorted(os.path.abspath(p) for p in paths if os.path.isabs(p) and os.path.exists(p)):
        if refused_bind(path) is None and not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def refused_bind(path: str) -> str | None:
    """Why `path` is never bound into the sandbox, or None. Never:
      "/", the home directory or a directory above it (a home's dot-files hold tokens and
          credentials);
      a directory that holds a .git (a repository: its history, its remotes' URLs, and
          next to it the run directories): PYTHONPATH=$PWD, as docs/trl_verl.md runs the
          TRL example, put the whole clone on the worker's search path;
      a run directory, or a directory that holds one within two levels (runs/NAME):
          config.json beside metrics.jsonl or checkpoints/ (a run's samples and model).
    A scorer's library never lives in such a place; a module a child then misses is
    reported by name (sandbox._warn_missing)."""
    home = os.path.realpath(os.path.expanduser("~"))
    if path == "/" or home == path or home.startswith(path.rstrip("/") + "/"):
        return "the home directory, or above it"
    if not os.path.isdir(path):
        return None
    if os.path.lexists(os.path.join(path, ".git")):
        return "it holds a .git"
    if _holds_run_directory(path, levels=2):
        return "it holds a run directory"
    return None


def _holds_run_directory(path: str, levels: int) -> bool:
    """`path` is a run directory, or one of its subdirectories is, `levels` deep."""
    if os.path.isfile(os.path.join(path, "config.json")) and (
            os.path.isfile(os.path.join(path, "metrics.jsonl")) or os.path.isdir(os.path.join(path, "checkpoints"))):
        return True
    if levels <= 0:
        return False
    try:
        entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return False
    return any(_holds_run_directory(e.path, levels - 1) for e in entries)


def _interpreter_chain(executable: str) -> list[str]:
    """The path sys.executable names and every symbolic link on the way to the real file
    (a venv's bin/python -> python3 -> /usr/bin/python3 -> python3.11): each must exist
    inside for the worker's Python to start by that path."""
    chain, path = [], os.path.abspath(executable)
    for _ in range(40):                          # the kernel's own limit on links followed
        chain.append(path)
        if not os.path.islink(path):
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return chain


def _ancestors(path: str) -> list[str]:
    """"/a/b/c" -> ["/a", "/a/b"]."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


@functools.cache
def worker_sys_path() -> tuple[str, ...]:
    """The worker's sys.path, as its Python computes it with its environment (-P: no cwd)."""
    out = subprocess.run([sys.executable, "-P", "-c", "import json, sys; print(json.dumps(sys.path))"],
                         env=worker_env(), capture_output=True, text=True, timeout=STARTUP_TIMEOUT, cwd="/")
    return tuple(json.loads(out.stdout)) if out.returncode == 0 else ()


@functools.cache
def bwrap_problem(bwrap: str) -> str:
    """"" when bubblewrap runs Python here, else its last line of error (a container without
    user namespaces, say). Asked once per trainer: about 50 ms."""
    try:
        out = subprocess.run(bubblewrap_command(bwrap) + [sys.executable, "-P", "-c", "pass"], env=worker_env(),
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if out.returncode == 0 else (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
