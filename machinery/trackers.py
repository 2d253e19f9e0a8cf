"""trackers.py: each line of metrics.jsonl, mirrored to an experiment tracker (--report_to).

TRL (`report_to`), verl (`trainer.logger`), OpenRLHF and nanochat send their metrics to a
tracker: curves in a browser while a run trains, runs side by side. train.py does the
same with `--report_to`, TRL's name and values:

    none         nothing (the default): metrics.jsonl only
    tensorboard  event files under RUN/tensorboard/ (`tensorboard --logdir RUN`)
    trackio      Hugging Face's local-first tracker; its store is $TRACKIO_DIR
                 (default ~/.cache/huggingface/trackio), `trackio show` draws it
    wandb        Weights & Biases, files under RUN/wandb/ (WANDB_MODE=offline: no network)

metrics.jsonl stays the source of truth: it is written first, and the tracker receives
the same dict, every key but "step", which is the tracker's x-axis. One call per
training step, from metrics.log_metrics, the loop's one logging point. A resumed run
opens a new tracker run and repeats the steps after its checkpoint there;
metrics.jsonl is truncated to the checkpoint, so it has each step once.

The packages are optional (requirements/trackers.txt). A tracker that is not installed,
or one that could not start (start_problem: an event-file directory that cannot be
written, wandb online with no login), is one line at the door (setup.check_inputs calls
both), before any data, download or warm-up, not an error after the model has loaded.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

from machinery import checks

TRACKERS = ("none", "tensorboard", "trackio", "wandb")
"""The values of --report_to."""


def missing_package(name: str) -> str | None:
    """None if tracker `name` can be used, else a phrase saying which package to install."""
    if name == "none" or importlib.util.find_spec(name) is not None:
        return None
    return f"needs the {name} package, which is not installed (pip install -r requirements/trackers.txt)"


def start_problem(name: str, out_dir: str) -> str | None:
    """None if tracker `name` can start for a run in out_dir, else what stops it (a phrase
    that follows "--report_to NAME").

    tensorboard: RUN/tensorboard must be, or become, a directory this process can write
    (checks.writable_dir_problem; a file there, or a read-only directory, once failed in
    SummaryWriter after the model had loaded). wandb: offline or disabled mode
    (WANDB_MODE), or a login, found as wandb.init finds one: WANDB_API_KEY, the ~/.netrc
    entry `wandb login` writes, wandb's settings. Online with none, wandb.init stopped
    the run with its own UsageError after the model had loaded (or, at a terminal,
    waited for an answer). The lookup uses wandb's own functions (wandb 0.31's layout,
    requirements/trackers.txt); a wandb laid out otherwise is not checked here.
    """
    if name == "tensorboard":
        path = os.path.join(out_dir, "tensorboard")
        if problem := checks.writable_dir_problem(path):
            return f"writes its event files into {path}, which {problem}" if problem.startswith("is ") else \
                f"writes its event files into {path}: {problem}"
    if name == "wandb":
        try:
            from wandb.sdk import wandb_setup
            from wandb.sdk.lib.wbauth import wbnetrc
        except ImportError:
            return None
        settings = wandb_setup.singleton().settings          # environment and settings files, as wandb.init reads them
        if settings.mode in ("offline", "dryrun", "disabled") or settings.api_key:
            return None
        if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
            return None
        try:
            if wbnetrc.read_netrc_auth(host=settings.base_url):
                return None
        except Exception as e:                                # a ~/.netrc entry wandb cannot read
            return f"cannot read its login ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return ("has no login for " + settings.base_url + ": run `wandb login` (or set WANDB_API_KEY), or set "
                "WANDB_MODE=offline to keep the run in RUN/wandb (wandb sync uploads it later)")
    return None


def open_tracker(name: str, out_dir: str, project: str, run_name: str, config: dict):
    """A tracker for one run: an object with log(metrics, step), close() and `where` (where it
    keeps the run and how to open it, a line of the run's closing summary), or None for "none".

    config: the run's config (dataclasses.asdict of train.py's Config), stored with the run
    by trackio and wandb. Each log call sends one step's metrics dict; values that are
    not numbers (there are none today) would be the tracker's problem, so they are left
    out here rather than crash a training run.
    """
    if name == "none":
        return None
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=os.path.join(out_dir, "tensorboard"))

        def log(metrics: dict, step: int) -> None:
            for key, value in scalars(metrics).items():
                writer.add_scalar(key, value, global_step=step)
            writer.flush()        # a killed run keeps every step it finished, like metrics.jsonl
        where = os.path.join(out_dir, "tensorboard")
        return SimpleNamespace(log=log, close=writer.close, where=f"tensorboard: {where} (tensorboard --logdir {where})")
    if name == "trackio":
        import trackio

        run = trackio.init(project=project, name=run_name, config=config, embed=False)
        store = os.environ.get("TRACKIO_DIR", "~/.cache/huggingface/trackio")
        return SimpleNamespace(log=lambda metrics, step: run.log(scalars(metrics), step=step), close=run.finish,
                               where=f"trackio: run {run_name} of project {project} in {store} (trackio show)")
    import wandb

    run = wandb.init(project=project, name=run_name, dir=out_dir, config=config)
    return SimpleNamespace(log=lambda metrics, step: run.log(scalars(metrics), step=step), close=run.finish,
                           where=f"wandb: run {run_name} of project {project}, files in {os.path.join(out_dir, 'wandb')}")


def scalars(metrics: dict) -> dict:
    """The numbers of one metrics line, without "step" (the x-axis): {key: float}."""
    return {key: float(value) for key, value in metrics.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}
