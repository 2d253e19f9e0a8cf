"""Resuming a run: where to pick up, what of the logs to keep, which settings may change.

A run killed at step 37 whose newest checkpoint is step 30 continues with `train.py
--resume`. What a resume promises: the resumed run's metrics.jsonl is, line for line, the
metrics.jsonl of the uninterrupted run of the same seed (the time/* keys, wall-clock
seconds, aside, and the sandbox/* counts of a sandboxed task, which count this process's
worker starts). tests/engine/test_train.py kills a run with SIGKILL, resumes it and
compares every logged metric; a run with another seed is its negative control. A run
killed after its last checkpoint, before RUN/final, is finished by --resume (finished),
and --resume alone continues a run with its own settings (config.parse_args).
checkpoint.py keeps the state that takes (weights, optimizer, schedule, every random
stream) and says which checkpoints are intact; this file decides the rest, once, at the
door (setup.check_inputs calls resume_point) and when the run directory is opened
(run.open_run_dir calls truncate_metrics and keep_samples_until):

  where to pick up   the newest intact checkpoint whose steps metrics.jsonl has every
                     line of (a metrics line is fsync'ed before the checkpoint that covers
                     it, so no crash loses one; a file cut or replaced afterwards can);
                     none at all: step 0. A fresh run (no --resume) refuses a directory
                     that holds a run.
  what of the logs   the lines of metrics.jsonl and samples.jsonl up to the checkpoint's
                     step; the later ones (31-37 above) are dropped, because the resumed
                     run logs them again, and kept they would appear twice. A torn last
                     line of metrics.jsonl (a kill or a full disk mid-write) is dropped
                     with a warning; a bad line elsewhere is an error naming file and line.
  which settings     the checkpoint's config must equal this one, but for the fields that
                     declare they may change (metadata=MAY_CHANGE: when the run stops,
                     evaluates or saves, how fast, where it reports; config.resume_rules
                     says why each is safe) and those not compared (where it runs).
                     Anything else is the run's math, and a resume that changed it would
                     be a new run under the old one's name: refused, naming the field.

Where this differs from TRL and verl. TRL's GRPOTrainer resumes through transformers'
Trainer (resume_from_checkpoint=True: the highest checkpoint-N), which restores the
weights, optimizer, schedule and random streams too and, for settings, only WARNS when
logging_steps, eval_steps, save_steps or the batch size differ from the checkpoint's
(compare_trainer_and_checkpoint_args).
verl (trainer.resume_mode=auto) takes the step its tracker file
latest_checkpointed_iteration.txt names. Here the step directories are the truth
(`latest` is only checked against them), a damaged checkpoint is skipped for an older
intact one, a change to the run's math is refused rather than warned about, and the
run's own log is cut back to the checkpoint, so that the promise above can be tested.
Why each rule: docs/faults_and_safety.md, "Resume and faults".
"""

from __future__ import annotations

import json
import os

from machinery import flags
from machinery.checkpoint import BEST_DIR, CHECKPOINTS_DIR, FINAL_DIR, atomic_write, checkpoint_step, find_checkpoint
from machinery.checkpoint import finish_interrupted_save, model_info, read_config

# ---------------------------------------------------------------------------------------
# What a run directory holds, and what this invocation may do with it (--resume)
# ---------------------------------------------------------------------------------------

def resume_point(out_dir: str, config: dict, resume: bool, overwrite: bool, steps: int, may_change: set,
                 not_compared: set, warn, defaults: dict | None = None) -> str | None:
    """What out_dir holds, and what this invocation may do with it (setup.check_inputs).

    Fresh run: out_dir must not hold a run (non-empty metrics.jsonl or checkpoints/) unless
    --overwrite starts it over. --resume: the newest intact checkpoint (find_checkpoint)
    whose steps metrics.jsonl has every line of, warning per checkpoint skipped; none at
    all: a warning and step 0 (a sweep resumes runs killed before their first checkpoint);
    some but none usable: refused, naming what is wrong with each. Then its config must
    equal this one outside may_change (the fields that declare so: config.resume_rules),
    --steps must reach its step, and metrics.jsonl must be readable up to it (a torn last
    line is dropped with a warning). Why each rule: docs/faults_and_safety.md, "Resume and
    faults".
    config: dataclasses.asdict of the run's config; defaults: the same of the default
    config (config_changes: a setting the checkpoint predates, at its default, is no
    change); warn: prints one line. Raises
    ValueError (one line) for a refusal; returns the checkpoint, or None for step 0.
    """
    out = out_dir
    used = [name for name in ("metrics.jsonl", CHECKPOINTS_DIR) if non_empty(os.path.join(out, name))]
    if not resume:
        if used and not overwrite:
            raise ValueError(f"--out_dir {out!r} already holds a run ({' and '.join(used)}): continue it with "
                             "--resume, start it over with --overwrite, or choose another --out_dir")
        return None
    for name in (FINAL_DIR, BEST_DIR):        # a save_model a kill stopped between its renames
        if note := finish_interrupted_save(os.path.join(out, name)):
            warn(f"--resume: {note}")
    metrics_path = os.path.join(out, "metrics.jsonl")
    logged = {json.loads(line)["step"] for line in metrics_to_keep(metrics_path, 2 ** 62)[0]}

    def metrics_cover(path: str) -> str | None:
        missing = sorted(set(range(1, checkpoint_step(path) + 1)) - logged)
        return f"metrics.jsonl lacks step {_spans(missing)}" if missing else None
    path, problems = find_checkpoint(out, usable=metrics_cover)
    if path is None:
        if problems:
            raise ValueError(f"--resume: no usable checkpoint in {os.path.join(out, CHECKPOINTS_DIR)} "
                             f"({'; '.join(problems)})")
        warn(f"--resume: no checkpoint in {out!r}; starting from step 0")
        metrics_to_keep(os.path.join(out, "metrics.jsonl"), 0)       # readable, or one line
        return None
    for problem in problems:
        warn(f"checkpoint skipped: {problem}; resuming from {os.path.basename(path)}")
    step = checkpoint_step(path)
    changed = config_changes(read_config(path), config, set(may_change) | set(not_compared), defaults)
    if changed:
        raise ValueError(f"--resume would change the run saved at step {step}: {'; '.join(changed)} (only "
                         f"{', '.join(sorted(may_change))} may change; start a new run in another --out_dir)")
    if steps < step or steps == step and finished(out, step):
        raise ValueError(f"--steps {steps}: the checkpoint is already at step {step}" +
                         (" and RUN/final holds its model" if steps == step else "") +
                         f", so there is nothing to do (a resume continues: --steps > {step})")
    torn = metrics_to_keep(os.path.join(out, "metrics.jsonl"), step)[1]
    if torn:
        warn(torn)
    return path


def finished(out_dir: str, step: int) -> bool:
    """RUN/final holds the model of `step` (its info.json says so): the run ended there.

    A run killed after its last checkpoint and before final/ was written (or while it was)
    has the checkpoint of its last step and no such final/: --resume then loads that
    checkpoint, trains no step, and writes final/ (and best/, if it is missing and its
    model is that checkpoint's) from it, the bytes the uninterrupted run would have
    written (train.py; tests/engine/test_faults.py kills a run at that moment)."""
    info = model_info(os.path.join(out_dir, FINAL_DIR))
    return info is not None and info.get("step") == step


def config_changes(saved: dict, config: dict, skip: set, defaults: dict | None = None) -> list[str]:
    """'--name old -> new' for every field that differs from a checkpoint's config.

    Both sides flattened to flag names (flags.flat_fields: names are unique, so a
    checkpoint whose config.json is flat, written before the settings were nested in
    parts, compares with a nested one) and compared as JSON values, so 4e-4 equals the
    0.0004 read back from the checkpoint. The fields in `skip` are not compared. A field
    only one side has counts as changed, but one: a setting added after the checkpoint was
    written (absent from it) whose value here is its default in `defaults` (asdict of the
    default config), since a new setting's default is what the code did before it existed.
    """
    old, new = flags.flat_fields(saved), flags.flat_fields(json.loads(json.dumps(config)))
    default = flags.flat_fields(json.loads(json.dumps(defaults or {})))
    missing = "(absent)"
    for name in set(new) - set(old):
        if name in default and new[name] == default[name]:
            old[name] = new[name]                    # added since, at its default: unchanged
    return [f"--{name} {old.get(name, missing)!r} -> {new.get(name, missing)!r}"
            for name in sorted(set(old) | set(new))
            if name not in skip and old.get(name, missing) != new.get(name, missing)]


def non_empty(path: str) -> bool:
    """A file with content, or a directory with an entry."""
    if os.path.isdir(path):
        return bool(os.listdir(path))
    return os.path.isfile(path) and os.path.getsize(path) > 0


# ---------------------------------------------------------------------------------------
# metrics.jsonl on resume
# ---------------------------------------------------------------------------------------

def metrics_to_keep(path: str, last_step: int) -> tuple[list[str], str | None]:
    """(the lines of metrics.jsonl a resume from `last_step` keeps, a note on a torn last line).

    Kept: the lines with "step" <= last_step; the later ones are logged again. A LAST
    line that is not a JSON object with a "step" is a write cut short (a full disk, a
    kill mid-write): the checkpoint was saved after its step's line was complete, so
    that line belongs to a step the resume redoes, and it is dropped (the note says so).
    A bad line anywhere else was not cut short by us: ValueError naming file and line.
    Read as bytes, so a line torn inside a multi-byte character is also just torn.
    """
    if not os.path.exists(path):
        return [], None
    with open(path, "rb") as f:
        raw = [line for line in f.read().split(b"\n") if line.strip()]
    keep, torn = [], None
    for i, line in enumerate(raw):
        try:
            rec = json.loads(line.decode("utf-8"))
            step = rec["step"]
            if not isinstance(step, int):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if i == len(raw) - 1:
                torn = f"{path}: dropped a torn last line ({len(line)} bytes, not a JSON record)"
                break
            raise ValueError(f"{path}:{i + 1}: not a metrics record (a JSON object with a 'step'): "
                             f"{line[:60].decode('utf-8', 'replace')!r}") from None
        if step <= last_step:
            keep.append(line.decode("utf-8") + "\n")
    return keep, torn


def truncate_metrics(path: str, last_step: int) -> None:
    """On resume, keep metrics_to_keep's lines (atomically); later steps will be redone."""
    if os.path.exists(path):
        atomic_write(path, "".join(metrics_to_keep(path, last_step)[0]))


def keep_samples_until(path: str, step: int) -> None:
    """Drop the lines of samples.jsonl written after `step` (a resumed run writes them again).

    Like truncate_metrics for metrics.jsonl; a line that does not parse (a write torn
    by a kill) is dropped too. Rewritten atomically.
    """
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    atomic_write(path, "".join(kept))


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _spans(steps: list[int]) -> str:
    """Sorted steps as spans: [3, 4, 5, 9] -> "3-5, 9" (at most five spans, then "...")."""
    spans = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans]
    return ", ".join(text[:5]) + (", ..." if len(text) > 5 else "")
