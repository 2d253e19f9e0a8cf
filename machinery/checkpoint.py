"""Checkpoints: a run killed at any moment resumes exactly where it was.

What "exactly" takes: the model's weights, the optimizer's state (Adam's moments and step
counts), the advantage scheduler's state (FADE's moving averages), the step, and EVERY
random stream the loop draws from (python's for prompt sampling, torch's for token
sampling, numpy's, CUDA's, and the mini-batch shuffling generator). Missing any one of
them still "resumes", but into a different run. tests/test_train.py kills a run with
SIGKILL after a checkpoint, resumes it, and compares every logged metric with an
uninterrupted run of the same seed.

What "at any moment" takes: write into a temporary directory, then rename it into place
(a rename is atomic on POSIX), then point `latest` at it with os.replace. A crash leaves
either the previous complete checkpoint or the new complete one. Metric lines logged
after the checkpoint are dropped on resume (they will be logged again).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
from transformers import AutoModelForCausalLM



def save_checkpoint(run, out_dir: str, step: int, keep: int = 2) -> str:
    """Write out_dir/checkpoints/step_XXXXXX atomically, then point `latest` at it.

    Written into a temporary directory and renamed into place, and `latest` is replaced
    with os.replace, so a run killed at any moment leaves either the previous complete
    checkpoint or the new complete one, never half of one. Keeps the newest `keep`.
    """
    root = os.path.join(out_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step:06d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    run.model.save_pretrained(os.path.join(tmp, "model"))
    run.tokenizer.save_pretrained(os.path.join(tmp, "model"))
    torch.save({
        "step": step,
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "py_rng": run.py_rng.getstate(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": np.random.get_state(),
        "mb_generator": run.mb_generator.get_state(),
    }, os.path.join(tmp, "state.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write(os.path.join(root, "latest"), os.path.basename(final))
    for old in sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp"))[:-keep]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


def load_checkpoint(run, out_dir: str) -> int:
    """Restore the newest checkpoint into `run` (train.Run); returns its step (0 if none exists)."""
    root = os.path.join(out_dir, "checkpoints")
    latest = os.path.join(root, "latest")
    if not os.path.exists(latest):
        return 0
    path = os.path.join(root, open(latest).read().strip())
    # Copy the saved weights INTO the existing model, so the optimizer built for its
    # parameters stays attached to them and can take its saved state as is.
    saved = AutoModelForCausalLM.from_pretrained(os.path.join(path, "model"),
                                                 dtype=next(run.model.parameters()).dtype)
    run.model.load_state_dict(saved.state_dict())
    ck = torch.load(os.path.join(path, "state.pt"), weights_only=False)
    run.optimizer.load_state_dict(ck["optimizer"])
    run.scheduler.load_state_dict(ck["scheduler"])
    run.py_rng.setstate(ck["py_rng"])
    torch.set_rng_state(ck["torch_rng"])
    if ck["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["cuda_rng"])
    np.random.set_state(ck["numpy_rng"])
    run.mb_generator.set_state(ck["mb_generator"])
    return int(ck["step"])


def atomic_write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def truncate_metrics(path: str, last_step: int) -> None:
    """On resume, drop metric lines logged after the checkpoint (they will be redone)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and json.loads(line)["step"] <= last_step]
    atomic_write(path, "".join(keep))


