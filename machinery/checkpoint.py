"""Checkpoints: a run killed at any moment resumes exactly where it was, or says why not.

What "exactly" takes: the model's weights, the optimizer's state (Adam's moments and step
counts), the advantage scheduler's state (FADE's moving averages), the step, and EVERY
random stream the loop draws from (python's for prompt sampling, torch's for token
sampling, numpy's, CUDA's, and the mini-batch shuffling generator). Missing any one of
them still "resumes", but into a different run. tests/engine/test_train.py kills a run with
SIGKILL after a checkpoint, resumes it, and compares every logged metric with an
uninterrupted run of the same seed.

What "at any moment" takes: write into a temporary directory, then rename it into place
(a rename is atomic on POSIX), then point `latest` at it with os.replace. A crash leaves
either the previous complete checkpoint or the new complete one. The metric lines a
checkpoint covers are fsync'ed before it is written, so no crash can keep a checkpoint
and lose a line it covers; lines logged after the checkpoint are dropped on resume
(they will be logged again; resume.py), and a resume checks that metrics.jsonl has every step up to
the checkpoint's.

A disk that fills up, or refuses a write, while a checkpoint is written: the half-written
temporary directory is removed, and the run stops with one line (UsageError) that
names the step, the error and the intact checkpoint it can resume from: nothing is lost.
Before writing, a save that cannot fit (free space below the bytes it will write, which
save_bytes counts) is refused the same way without writing anything; train.py's
check_room asks the same question once at start-up, for the whole run.

What "or says why not" takes: a rename protects against a crash, not against a disk
that fills up, a copy cut short, or a file edited by hand. So every checkpoint carries
a MANIFEST, written last inside the temporary directory: the size and SHA-256 of every
other file. A checkpoint is intact iff its manifest exists and every file matches it;
`find_checkpoint` walks the checkpoints newest first and returns the newest intact one,
with what is wrong with each one it skipped. Nothing is read into the run before the
files have been checked.

What a run directory may be used for, which checkpoint --resume takes, and what of the
logs it keeps are resume.py's chapter (resume_point, truncate_metrics); it builds on
this file, which knows nothing of it.

The layout, per checkpoint (out_dir/checkpoints/step_000040/):
    model/          save_pretrained's weights, config and tokenizer (loads like any model)
    state.pt        optimizer, scheduler, step and RNG states: tensors and plain python
                    values only, so it loads with torch.load(weights_only=True), which
                    cannot run code (a pickle from someone else's run directory could)
    config.json     the run's config as it was trained (train.py compares it on resume)
    manifest.json   {"step": 40, "files": {relative path: {"bytes": n, "sha256": hex}}}
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from machinery.usage_error import UsageError, size_text

MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"step_(\d+)")          # a checkpoint directory's name: step_000040
KEEP = 2                                      # checkpoints a run keeps (prune); one more exists while saving
# A write the disk refused, rather than a bug: full (ENOSPC), over quota (EDQUOT), a file
# over the size limit (EFBIG), read-only (EROFS), or no permission (EACCES, EPERM).
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}

# The directories of weights a run writes into its out_dir, named here once (run.py writes
# them, setup.py counts their room, checks.py checks their kind, the sweep deletes them).
# Their sizes for SmolLM2-135M, trained in float32: its weights are 135M x 4 bytes = 0.54 GB.
#   checkpoints/  step_XXXXXX/ for --resume: weights, Adam's two moments and the random
#                 streams, so three times the weights, ~1.6 GB each; the newest KEEP are kept
#                 (one more while a save is written)
#   best/         the model at its highest held-out pass@1 (save_model): the weights, ~0.5 GB
#   final/        the model after the last step (save_model): the weights, ~0.5 GB
# WEIGHT_DIRS, largest first, is what experiments/sweep.py deletes of a finished run
# (unless --keep_weights): the metrics it reports are in metrics.jsonl.
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
FINAL_DIR = "final"
WEIGHT_DIRS = (CHECKPOINTS_DIR, BEST_DIR, FINAL_DIR)
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the code a run's start.json names


def save_checkpoint(out_dir: str, step: int, config: dict, model, tokenizer, state: dict, keep: int = KEEP) -> str:
    """Write out_dir/checkpoints/step_XXXXXX atomically, then point `latest` at it.

    model, tokenizer: saved as a model directory; state: training_state(...), the
    optimizer, schedule and random streams. config: the run's config as a JSON-able dict (dataclasses.asdict),
    stored beside the weights so a resume can tell whether it continues the same run.
    Written into a temporary directory (manifest last, every file fsync'ed) and renamed
    into place, and `latest` is replaced with os.replace, so a run killed at any moment
    leaves either the previous complete checkpoint or the new complete one, never half
    of one. Then `prune` keeps the newest `keep`, this one always among them.
    A disk that cannot take it (full, read-only, ...): nothing half-written is left, and
    UsageError says so in one line (the module header).
    """
    if keep < 1:
        raise ValueError(f"save_checkpoint needs keep >= 1, got {keep}")
    # First make the metric lines this checkpoint covers durable: the checkpoint is
    # fsync'ed below, and a crash must not keep it while losing the line of its step.
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        _fsync_file(metrics)
    root = os.path.join(out_dir, CHECKPOINTS_DIR)
    final = os.path.join(root, f"step_{step:06d}")
    tmp = final + ".tmp"
    try:
        os.makedirs(root, exist_ok=True)
        _remove(tmp)
        need, free = save_bytes(model, state), free_bytes(root)
        if free < need:                       # refused before a byte is written
            raise OSError(errno.ENOSPC, f"{size_text(free)} free, the checkpoint needs {size_text(need)}")
        model.save_pretrained(os.path.join(tmp, "model"))
        tokenizer.save_pretrained(os.path.join(tmp, "model"))
        torch.save(state, os.path.join(tmp, "state.pt"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=1, allow_nan=False)      # strict JSON: no NaN or Infinity
        write_manifest(tmp, step)
    except Exception as e:
        problem = disk_problem(e, root)       # measured before the removal frees the space again
        _remove(tmp)                          # half a checkpoint: never read, and it holds space
        if problem is None:                   # not the disk: a bug, with its traceback
            raise
        previous, _ = find_checkpoint(out_dir)
        raise UsageError(f"step {step}: the checkpoint could not be written in {root} ({problem}); nothing "
                              f"is lost: " + (f"{os.path.basename(previous)} is intact, and metrics.jsonl has every "
                                              "step; free some space, then --resume" if previous else
                                              "free some space and start again")) from e
    _remove(final)                            # same step from an abandoned attempt (see prune), or a stray file
    os.replace(tmp, final)
    _fsync_dir(root)
    atomic_write(os.path.join(root, "latest"), os.path.basename(final))
    prune(root, step, keep)
    return final


def prune(root: str, step: int, keep: int) -> None:
    """Delete the checkpoints a run that just saved `step` no longer needs.

    - step directories NEWER than `step`: they belong to a future this run abandoned (a
      resume fell back past them because they were damaged; find_checkpoint never skips
      an intact newer one), and left in place they would shadow every new checkpoint;
    - of the rest (steps <= `step`), all but the newest `keep`. The checkpoint just
      written is the newest of these, so it is never the one deleted;
    - leftover *.tmp directories of saves that were killed half-way.
    Deciding by step number relative to the new checkpoint, not by "the highest `keep`
    names", is what keeps a run from deleting its own fresh checkpoints.
    """
    names = os.listdir(root)
    older = sorted((n for n in names if _step_of(n) is not None and _step_of(n) <= step), key=_step_of)
    doomed = [n for n in names if _step_of(n) is not None and _step_of(n) > step] + older[:-keep]
    doomed += [n for n in names if n.endswith(".tmp") and os.path.isdir(os.path.join(root, n))]
    for name in doomed:
        _remove(os.path.join(root, name))


def find_checkpoint(out_dir: str, usable=None) -> tuple[str | None, list[str]]:
    """(the newest intact checkpoint or None, what is wrong with each one skipped).

    Walks out_dir/checkpoints/step_* from the highest step down and stops at the first
    intact one (check_checkpoint) that `usable(path)`, if given, does not object to (it
    returns None or what is wrong, as check_checkpoint does). `latest` is the pointer a
    finished save writes last; it is read only to report a problem with it (not a file,
    empty, naming a directory that does not exist or is damaged, or lagging behind an
    intact newer checkpoint: a save killed between its rename and the pointer). The step
    directories themselves are the truth. Returns (None, []) when there is no checkpoint
    at all, (None, problems) when there are some and none is usable.
    """
    root = os.path.join(out_dir, CHECKPOINTS_DIR)
    if not os.path.isdir(root):
        return None, []
    problems = []
    latest_path = os.path.join(root, "latest")
    latest = None
    if os.path.lexists(latest_path) and not os.path.isfile(latest_path):
        problems.append("checkpoints/latest is not a file")
    elif os.path.exists(latest_path):
        with open(latest_path, "rb") as f:
            latest = f.read().decode("utf-8", "replace").strip()
        if not latest:
            problems.append("checkpoints/latest is empty")
        elif not os.path.isdir(os.path.join(root, latest)):
            problems.append(f"checkpoints/latest names {latest!r}, which does not exist")
    for name in sorted((n for n in os.listdir(root) if _step_of(n) is not None), key=_step_of, reverse=True):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            problems.append(f"{name} is not a directory")
            continue
        problem = check_checkpoint(path)
        if problem is None and usable is not None:
            problem = usable(path)
        if problem is None:
            if _step_of(latest or "") is not None and _step_of(latest) < _step_of(name):
                problems.append(f"checkpoints/latest names {latest}, but {name} is newer and intact")
            return path, problems
        problems.append(f"{name}: {problem}")
    return None, problems


def check_checkpoint(path: str) -> str | None:
    """None if the checkpoint directory `path` is intact, else what is wrong (one phrase).

    Intact: manifest.json parses, names at least state.pt, config.json and the model's
    files, and every file it names exists with the recorded size and SHA-256. A missing
    manifest means the save never finished (the manifest is written last) or the
    checkpoint predates manifests.
    """
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        files = manifest["files"]
        if not isinstance(files, dict) or not isinstance(manifest["step"], int):
            raise ValueError
    except FileNotFoundError:
        return "no manifest.json (a save that did not finish, or a checkpoint from before manifests)"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "manifest.json is damaged"
    if manifest["step"] != _step_of(os.path.basename(os.path.normpath(path))):
        return f"its manifest is for step {manifest['step']}"
    for needed in ("state.pt", "config.json", os.path.join("model", "config.json")):
        if needed not in files:
            return f"the manifest does not list {needed}"
    for rel, meta in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        size = os.path.getsize(full)
        if size != meta.get("bytes"):
            return f"{rel} has {size} bytes, the manifest says {meta.get('bytes')}"
        if file_sha256(full) != meta.get("sha256"):
            return f"{rel} does not match its checksum"
    return None


def read_config(path: str) -> dict:
    """The run config a checkpoint was trained with (its config.json)."""
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def checkpoint_step(path: str) -> int:
    """The step a checkpoint was saved at (from its manifest)."""
    with open(os.path.join(path, MANIFEST)) as f:
        return int(json.load(f)["step"])


def load_checkpoint(path: str, model, optimizer, scheduler, py_rng, mb_generator) -> int:
    """Restore the checkpoint directory `path` (check it first) into these objects; returns its step.

    Everything is read before anything is applied, so a file that fails to load leaves
    the run as it was (ValueError naming the checkpoint).
    """
    try:
        ck = torch.load(os.path.join(path, "state.pt"), weights_only=True)
        # Copy the saved weights INTO the existing model, so the optimizer built for its
        # parameters stays attached to them and can take its saved state as is.
        saved = AutoModelForCausalLM.from_pretrained(os.path.join(path, "model"),
                                                     dtype=next(model.parameters()).dtype)
    except Exception as e:                      # version skew, a file changed after the check
        raise ValueError(f"checkpoint {path} cannot be loaded: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    model.load_state_dict(saved.state_dict())
    optimizer.load_state_dict(ck["optimizer"])
    scheduler.load_state_dict(ck["scheduler"])
    restore_rng(ck, py_rng, mb_generator)
    return int(ck["step"])


def training_state(step: int, optimizer, scheduler, py_rng, mb_generator) -> dict:
    """What state.pt holds: tensors, numbers, strings, lists and dicts only.

    torch.load(weights_only=True) refuses anything else (it unpickles no classes and
    calls no functions), so the RNG states are taken apart into such values:
      python's random  getstate() = (version, 625 ints, gauss_next) -> a list
      numpy's legacy   get_state() = ("MT19937", uint32[624], pos, has_gauss, cached)
                       -> the key as an int64 tensor and the rest as numbers
      torch, CUDA and the mini-batch Generator: already uint8 tensors.
    """
    version, internal, gauss_next = py_rng.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    return {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "py_rng": [version, list(internal), gauss_next],
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "mb_generator": mb_generator.get_state(),
    }


def restore_rng(ck: dict, py_rng, mb_generator) -> None:
    """Put every random stream back as training_state took it (the global ones, and these two)."""
    version, internal, gauss_next = ck["py_rng"]
    py_rng.setstate((version, tuple(internal), gauss_next))
    torch.set_rng_state(ck["torch_rng"])
    if ck["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["cuda_rng"])
    np_state = ck["numpy_rng"]
    np.random.set_state((np_state["kind"], np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    mb_generator.set_state(ck["mb_generator"])


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def write_manifest(directory: str, step: int) -> None:
    """Record size and SHA-256 of every file under `directory`, fsync'ed, then the manifest.

    Hashing reads each file back from disk, so the manifest describes what was really
    written; the fsync makes it durable before the rename publishes the checkpoint.
    """
    files = {}
    for base, _, names in os.walk(directory):
        for name in sorted(names):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, directory)
            with open(full, "rb") as f:
                os.fsync(f.fileno())
            files[rel] = {"bytes": os.path.getsize(full), "sha256": file_sha256(full)}
    atomic_write(os.path.join(directory, MANIFEST), json.dumps({"step": step, "files": files}, indent=1))
    _fsync_dir(directory)


def _remove(path: str) -> None:
    """Remove a directory tree, or a file or link, at `path`; nothing there is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync_file(path: str) -> None:
    """Make a file's written data durable (fsync through a descriptor of our own)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write(path: str, text: str) -> None:
    """Write `text` to path through path.tmp and a rename: a reader sees the old or the new
    file, never half of one. A disk that refuses the write: path.tmp is removed, `path`
    is as it was, and UsageError says so in one line."""
    try:
        with open(path + ".tmp", "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except OSError as e:
        problem = disk_problem(e, os.path.dirname(path) or ".")
        if os.path.lexists(path + ".tmp"):
            os.remove(path + ".tmp")
        refuse_write(e, path, "it is as it was", problem)


def refuse_write(e: BaseException, path: str, consequence: str, problem: str | None = None) -> None:
    """Raise UsageError for a write to `path` that the disk refused (disk_problem, or
    `problem` measured earlier), saying what it leaves behind; re-raise `e` otherwise."""
    problem = problem or disk_problem(e, os.path.dirname(path) or ".")
    if problem is None:
        raise e
    raise UsageError(f"{path} could not be written ({problem}); {consequence}") from e


def save_bytes(model, state: dict) -> int:
    """A lower bound on the bytes a checkpoint of `model` and `state` writes: every tensor of
    the weights (a tied one once) and of the training state (Adam's two moments per
    weight), which is nearly all of it (the tokenizer and config files are the rest)."""
    weights = {t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}
    return sum(weights.values()) + _tensor_bytes(state)


def free_bytes(path: str) -> int:
    """Bytes that this process may still write on path's file system (root may use the
    blocks the file system reserves for it; others may not)."""
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def disk_problem(e: BaseException, path: str) -> str | None:
    """What the disk said, if exception `e` from writing under `path` is the disk's refusal; else None.

    An OSError carries its errno (DISK_ERRNOS). The writers that are not Python's own do
    not: safetensors raises SafetensorError ("... No space left on device (os error 28)"),
    torch.save a RuntimeError ("unexpected pos 576 vs 534"). Those count as the disk's
    when their text names such an errno as Rust's I/O errors do ("(os error 28)":
    safetensors removes its half-written file, so the disk is no longer full after), or
    when the file system has (almost) nothing left just after: a write that runs out of
    space fills it to the last block before it fails.
    """
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        return f"{os.strerror(e.errno)}: {e.strerror}" if e.strerror != os.strerror(e.errno) else e.strerror
    named = re.search(r"\(os error (\d+)\)", str(e))
    if named and int(named[1]) in DISK_ERRNOS and not isinstance(e, OSError):
        return f"{os.strerror(int(named[1]))} ({type(e).__name__})"
    try:
        full = free_bytes(path) < 1 << 20
    except OSError:
        return None
    return (f"{os.strerror(errno.ENOSPC)}: the file system is full after the writer's {type(e).__name__}"
            if full and not isinstance(e, OSError) else None)


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0




def weights_sha256(path: str) -> str | None:
    """SHA-256 of a model directory's weights: of its one weight file, or of the sorted
    "name sha256" lines of several (sharded checkpoints). None if it has none (a hub id).

    This names the start of a run: two runs with the same hash started from the same
    bytes, whatever machine they ran on."""
    if not os.path.isdir(path):
        return None
    files = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".bin")))
    digests = [(n, file_sha256(os.path.join(path, n))) for n in files]
    if len(digests) == 1:
        return digests[0][1]
    return hashlib.sha256("".join(f"{n} {d}\n" for n, d in digests).encode()).hexdigest() if digests else None


def file_sha256(path: str) -> str:
    """SHA-256 of a file's bytes, read in 1 MB blocks: the manifest's per-file hashes, and a
    model directory's weights (weights_sha256)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version(repo_dir: str = REPO_DIR) -> dict:
    """{"commit": the repository's HEAD, "clean": no tracked file changed and no untracked
    file beside them}, or None for each that git cannot tell (no git, not a clone).

    What ran, beside what it started from (weights_sha256): start.json records it, so two
    runs compared as a pair can be shown to come from one commit, and a run made from an
    edited tree says so (clean false: the commit alone does not name its code).
    """
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None
    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    return {"commit": commit.strip() if commit else None, "clean": None if status is None else status.strip() == ""}


def _step_of(name: str) -> int | None:
    m = STEP_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def _fsync_dir(path: str) -> None:
    """Make a rename inside `path` durable (POSIX: the directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# The trained model, kept: RUN/final and RUN/best
# ---------------------------------------------------------------------------------------

def save_model(directory: str, model, tokenizer, info: dict) -> dict:
    """Write a model directory that AutoModelForCausalLM.from_pretrained(directory) loads,
    with info.json (what it is: {"step", "eval/pass@1", ...}); returns info.

    Checkpoints (checkpoints/step_*) are for --resume and are pruned to the last two;
    this is the model itself, kept: RUN/final after the last step, RUN/best at the
    evaluation with the highest held-out pass@1 (the start included). Written into
    DIRECTORY.tmp, then moved into place, the previous one moved aside first and removed
    last: a kill leaves the old directory, the new one, or (between the two renames, a
    moment) DIRECTORY.old and a complete DIRECTORY.tmp, never a half-written model under
    the name; --resume completes that last case (finish_interrupted_save).
    """
    tmp, old = directory + ".tmp", directory + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    atomic_write(os.path.join(tmp, "info.json"), json.dumps(info, indent=1))
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(directory):
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return info


def finish_interrupted_save(directory: str) -> str | None:
    """Complete a save_model that a kill stopped between its two renames; what it did, or None.

    Then `directory` is missing, and DIRECTORY.tmp holds the new model (complete: its
    info.json is written last) and DIRECTORY.old the previous one, if there was one. The
    new one is moved into place (the save had finished writing it), else the old one back.
    A DIRECTORY.tmp without info.json was cut short while written: it is left for the next
    save_model, which removes it first.
    """
    tmp, old = directory + ".tmp", directory + ".old"
    if os.path.exists(directory):
        return None
    if os.path.isfile(os.path.join(tmp, "info.json")):
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
        return f"{os.path.basename(directory)}/ completed from {os.path.basename(tmp)}"
    if os.path.isdir(old):
        os.replace(old, directory)
        return f"{os.path.basename(directory)}/ restored from {os.path.basename(old)}"
    return None


def model_info(directory: str) -> dict | None:
    """The info.json of a model save_model wrote (None if there is none, or it is unreadable)."""
    try:
        with open(os.path.join(directory, "info.json")) as f:
            info = json.load(f)
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None
