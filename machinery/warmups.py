"""The embedded model's supervised warm-up: trained once, cached, shipped, checked.

The model it trains (a character tokenizer and a tiny Llama): machinery/tinymodel.py.

Why warm up at all, and why with a noisy teacher. RL with a binary reward only learns
from groups that contain both a success and a failure: a randomly initialised model never
succeeds (reward 0 everywhere, every advantage 0) and a fully trained one always does.
The warm-up is supervised training (cross-entropy on the response tokens of tasks/addition.py's
scratchpads) that must stop somewhere in between, and WHERE matters more than how far.
Stopped mid-way on clean targets (650 steps at a constant learning rate), the model sat
on the steep part of its learning curve, and where it sat depended on the warm-up seed:
some seeds had not yet learned whole skills (copying the scratchpad into the answer
line, a carry), so many groups were all wrong, which RL cannot learn from, and the RL
after the warm-up ended anywhere between failure and near-perfection (docs/results.md
has the numbers). So the addition warm-up now trains to convergence (cosine learning rate
to 0) on targets from a NOISY TEACHER: each column's result digit
is wrong with probability 0.25 (addition.addition_response). The converged model has every
skill and is unsure exactly where the teacher was: about one result digit in four is
sampled wrong, at random, on every prompt. That is the regime the papers study, and a
stable one: groups are mixed, the template tokens ("+", "=", "A:") are shared by right
and wrong rollouts, and a few digit tokens decide the reward. Countdown keeps its clean
targets and a fixed 3000 steps (its uncertainty is the task's own: several answers and
wordings). The measured starts, per task and warm-up seed, are in docs/results.md.

Shipped weights and caching. The warm-up is deterministic on one machine but not
bit-identical across CPUs: its float sums round differently under another instruction
set, and over hundreds of steps the difference grows into a different model, and RL
from it into a different result (docs/results.md). So the repository SHIPS the
warmed-up weights (weights/<key>/, a model directory of 0.6-1.4 MB) for the warm-up
seeds in SHIPPED_SEEDS, and a run starts from those bytes on
every machine. Anything else (another seed, a changed WarmupConfig) warms up locally and
is cached under <repo>/.cache/tinymodel/. Before either is used its weights are checked
against the SHA-256 recorded for them (SHIPPED_SHA256 for the shipped ones, warmup.json
for a cache entry), so a flipped byte or a renamed tensor is one line, not a run that
quietly starts from other weights. Both are named by cache_key, a hash of the
WarmupConfig: a shipped directory whose key the code no longer produces is stale, and a
run says so in one line and warms up instead (tests/engine/test_tinymodel.py fails on a stale
shipped directory). `python -m machinery.warmups` rebuilds the shipped set. Cache
entries are written atomically (a temporary directory renamed into place), so a crash
never leaves a half-written model.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch

import tasks
from machinery import checkpoint, rollout
from machinery.checks import UsageError
from machinery.tinymodel import build_char_tokenizer, build_tiny_model, count_params
from tasks import addition

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
DEFAULT_CACHE_DIR = os.path.join(REPO_DIR, ".cache", "tinymodel")
SHIPPED_DIR = os.path.join(REPO_DIR, "weights")  # committed warm-ups: the same start on every machine
SHIPPED_SEEDS = (0, 5)    # per task: the default run's start (0) and the sweeps' second block (5);
                          # any other warm-up seed (1-4 in docs/results.md) warms up locally
CACHE_FORMAT = 4          # bump when the warm-up code changes in a way the config cannot see
                          # (4: the noisy teacher's draws and the seed in the key's name)
# The SHA-256 (weights_sha256) of each shipped warm-up's weights: the bytes the README
# promises every machine starts from, pinned here in the code rather than beside them.
# A shipped directory whose weights differ (a flipped byte, a renamed tensor) is refused
# (verify_warmup). After `python -m machinery.warmups` rebuilds weights/, paste the
# lines it prints here; tests/engine/test_tinymodel.py checks the table against weights/.
SHIPPED_SHA256 = {
    "addition-s0-b840513ee205": "5b98e55b39772de4f385cce9b2c6cdf12c715a7122e2ddaca91db75363c824c8",
    "addition-s5-5880f97bf4a1": "f5051d30ffd0995cff354448c4cead9590ffd09391540beef89f2ab15d5f890c",
    "countdown-s0-08e0ec43a83d": "491306ef98f22d34b9c79b5514fd258648224e3efc74f33b33970e76e49cb013",
    "countdown-s5-0f9c47f85bb1": "b26b6c74b7ab1c9d17de434f08bed5a2c41d46d8e9c1723c7193de54f19b1f80",
}

# ---------------------------------------------------------------------------------------
# The warm-up: its config, where a finished one is found, its check, its training
# ---------------------------------------------------------------------------------------

@dataclass
class WarmupConfig:
    """Everything that determines the warm-up result (its hash names the cache entry).

    The defaults are a small clean-target warm-up (countdown's model size); warmup_config(task)
    gives each task's own, the one train.py and the shipped weights use.
    """

    task: str = "addition"
    """'addition' or 'countdown' (tasks/): a task with a warm-up."""
    digits: int = 3
    """Operand digits of the addition task (1..digits-digit operands, tasks/addition.py); unused by countdown."""
    seed: int = 0
    """Seed of the initial weights, the training problems and the batch order."""
    hidden_size: int = 64
    """Model width d."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 2
    """Attention heads (head size d / heads; vLLM's CPU build needs >= 32)."""
    intermediate_size: int = 256
    """SwiGLU hidden width."""
    lr: float = 3e-3
    """AdamW peak learning rate (linear warm-up, then constant, or cosine to 0 with lr_decay)."""
    lr_warmup_steps: int = 50
    """Steps of linear learning-rate warm-up from 0."""
    lr_decay: bool = False
    """Cosine decay of the learning rate to 0 at max_steps: the warm-up ends at rest, not mid-stride."""
    digit_noise: float = 0.0
    """Addition: probability that a training target's column result digit is replaced (a noisy teacher; tasks/addition.addition_response)."""
    target_noise: float = 0.0
    """Any task: probability that a training target is swapped for another training row's (a well-formed answer to another problem: a noisy teacher for any task with reference solutions, so the warm-up ends partly right and RL has room)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    batch_size: int = 64
    """Problems per optimizer step."""
    n_train: int = 20_000
    """Distinct training problems drawn (train side of the task's split only)."""
    max_steps: int = 650
    """Supervised steps (fewer only if target_pass1 is set and reached first)."""
    eval_every: int = 50
    """Evaluate held-out pass@1 every this many steps (logged in warmup.json; stops the run only with target_pass1)."""
    eval_prompts: int = 256
    """Held-out problems per evaluation (one sample each at temperature 1)."""
    target_pass1: float | None = None
    """None: train all max_steps steps (the default). A number in (0, 1]: stop at the first
    evaluation with pass@1 >= it (the earlier rule; noisy on a steep curve, see the header)."""

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"WarmupConfig.task must be one of {TASKS}, got {self.task!r}")
        for name in ("digits", "hidden_size", "num_layers", "num_heads", "intermediate_size", "batch_size",
                     "n_train", "max_steps", "eval_every", "eval_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmupConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"WarmupConfig.lr must be > 0, got {self.lr}")
        if self.lr_warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(f"WarmupConfig.lr_warmup_steps and weight_decay must be >= 0, got "
                             f"{self.lr_warmup_steps}, {self.weight_decay}")
        if not 0 <= self.digit_noise < 1:
            raise ValueError(f"WarmupConfig.digit_noise must be in [0, 1), got {self.digit_noise}")
        if not 0 <= self.target_noise < 1:
            raise ValueError(f"WarmupConfig.target_noise must be in [0, 1), got {self.target_noise}")
        if self.target_pass1 is not None and not 0 < self.target_pass1 <= 1:
            raise ValueError(f"WarmupConfig.target_pass1 must be in (0, 1], got {self.target_pass1}")


TASKS = tuple(name for name, task in tasks.TASKS.items() if task.warmup is not None)   # ("addition", "countdown")


def warmup_config(task: str = "addition", digits: int = 3, seed: int = 0) -> WarmupConfig:
    """The warm-up train.py uses for the embedded model on `task`, from warm-up seed `seed`.

    Each task's file holds its own (Task.warmup: addition.warmup_fields,
    countdown.warmup_fields): the fields that differ from WarmupConfig's defaults. The
    measured starts of RL, per task and seed, are in docs/results.md.
    """
    if task not in TASKS:
        raise ValueError(f"warmup_config: task must be one of {TASKS}, got {task!r}")
    return WarmupConfig(task=task, seed=seed, **tasks.TASKS[task].warmup(digits))


def max_response_tokens(cfg: WarmupConfig) -> int:
    """Tokens of the longest reference response plus EOS: the warm-up's generation budget."""
    return tasks.TASKS[cfg.task].max_response_tokens(cfg.digits)


ADDED_LATER = ("target_noise",)
"""WarmupConfig fields added after weights/ was built: in the hash only when set."""


def cache_key(cfg: WarmupConfig) -> str:
    """Directory name of cfg's warm-up: "<task>-s<seed>-<hash>", hash = 12 hex of
    sha256(config json), which covers every other field (digits among them).
    Example: "addition-s0-3f2a9c81b0d4"."""
    fields = dataclasses.asdict(cfg)
    for name in ADDED_LATER:            # at their default they leave the hash (and the shipped names) alone
        if fields[name] == WarmupConfig.__dataclass_fields__[name].default:
            del fields[name]
    blob = json.dumps({"format": CACHE_FORMAT, **fields}, sort_keys=True)
    return f"{cfg.task}-s{cfg.seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def load_or_warmup(cfg: WarmupConfig | None = None, cache_dir: str | None = None,
                   shipped_dir: str | None = SHIPPED_DIR, say=print) -> str:
    """Path of cfg's warmed-up model directory: shipped, else cached, else trained now.

    1. shipped_dir/<key>: the committed weights (None skips them);
    2. cache_dir/<key>: an earlier local warm-up;
    3. a new warm-up, cached. If cfg is one the repository should ship (shipped_configs)
       but shipped_dir lacks it, the shipped weights are stale (the warm-up code changed
       since they were built): `say` reports it in one line first, because the run will
       not start from shipped bytes. Otherwise it says why nothing fits (a task nothing
       ships for; another --digits or --warmup_seed than the shipped ones), and then
       warmup says how many steps, about how long on this machine and where it caches.
    An entry counts only if it is complete (it holds warmup.json, written last), and it is
    checked against its recorded SHA-256 before it is used (verify_warmup: a mismatch is
    one line, UsageError).
    """
    cfg = cfg or WarmupConfig()
    key = cache_key(cfg)
    if found := existing_warmup(cfg, cache_dir, shipped_dir):
        shipped = shipped_dir is not None and os.path.dirname(found) == os.path.normpath(shipped_dir)
        verify_warmup(found, shipped, say)
        return found
    shipped_tasks = {d.split("-s")[0] for d in os.listdir(shipped_dir)} if shipped_dir and os.path.isdir(shipped_dir) else set()
    if shipped_dir and cfg in shipped_configs() and cfg.task in shipped_tasks:
        say(f"{os.path.relpath(shipped_dir, REPO_DIR)}/ has no {key} (the shipped warm-ups are stale; "
            "python -m machinery.warmups rebuilds them): warming up locally")
    elif cfg.task not in shipped_tasks:     # a task of the user's: nothing shipped is expected
        say(f"{cfg.task}: no warm-up of the embedded model ships for this task: warming it up here, once")
    else:                                   # a shipped task, at another --digits or --warmup_seed
        shipped = [c for c in shipped_configs() if c.task == cfg.task]
        ships = (f" (weights/ ships --digits {'/'.join(sorted({str(c.digits) for c in shipped}))} with --warmup_seed "
                 f"{' or '.join(str(c.seed) for c in shipped)})" if shipped else "")
        say(f"{cfg.task}: no warm-up of the embedded model is shipped or cached for --digits {cfg.digits} "
            f"--warmup_seed {cfg.seed}{ships}: warming it up here, once")
    return warmup(cfg, cache_dir, say=say)


def existing_warmup(cfg: WarmupConfig, cache_dir: str | None = None, shipped_dir: str | None = SHIPPED_DIR) -> str | None:
    """The directory of cfg's finished warm-up (shipped first, then cached), or None: rules 1
    and 2 of load_or_warmup. Finished = it holds warmup.json, written last."""
    key = cache_key(cfg)
    for root in (shipped_dir, cache_dir or DEFAULT_CACHE_DIR):
        if root and os.path.isfile(os.path.join(root, key, "warmup.json")):
            return os.path.join(root, key)
    return None


def recorded_sha256(path: str, shipped: bool) -> str | None:
    """The SHA-256 a warm-up directory's weights were recorded with, or None if none was.

    shipped: the directory is one of the repository's (SHIPPED_SHA256, by its key);
    otherwise, or for a key the table lacks (a test's own shipped directory), the
    "weights_sha256" its warmup.json got when the warm-up wrote it (_save_atomic).
    """
    key = os.path.basename(os.path.normpath(path))
    if shipped and key in SHIPPED_SHA256:
        return SHIPPED_SHA256[key]
    try:
        with open(os.path.join(path, "warmup.json")) as f:
            recorded = json.load(f).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


def verify_warmup(path: str, shipped: bool, say=print) -> bool:
    """Check a warm-up directory before it is loaded: True if its weights are the bytes
    recorded for it, False if it has no record (a cache entry written before records
    were kept: `say` notes it is used unverified); UsageError, one line, otherwise.

    Refused: weights whose SHA-256 differs from the record (the message also names any
    tensor that is missing, unexpected or of the wrong shape, weight_keys_problem: a
    renamed embed_tokens loaded as random embeddings, trained nothing and exited 0); a
    shipped directory with no record at all; an unrecorded entry with such a tensor.
    Hashing the tiny model's 0.6-1.4 MB takes milliseconds.
    """
    key = os.path.basename(os.path.normpath(path))
    remedy = (f"git checkout -- weights/{key} restores the repository's copy" if shipped
              else "delete that directory to rebuild it")
    expected, actual = recorded_sha256(path, shipped), checkpoint.weights_sha256(path)
    keys = None if expected == actual else weight_keys_problem(path)
    if expected is None:
        if shipped:
            raise UsageError(f"shipped warm-up {path} has no SHA-256 in warmups.SHIPPED_SHA256 (after "
                             "python -m machinery.warmups, paste the lines it prints there)")
        if keys:
            raise UsageError(f"warm-up {path} is damaged: {keys}; {remedy}")
        say(f"warm-up {path} records no SHA-256 (written before they were recorded): used unverified; "
            "delete that directory to rebuild it with one")
        return False
    if expected != actual:
        raise UsageError(f"{'shipped ' if shipped else ''}warm-up {path} is damaged: its weights do not match their "
                         f"recorded SHA-256 ({expected[:12]}, got {str(actual)[:12]})"
                         f"{f': {keys}' if keys else ''}; {remedy}")
    return True


def weight_keys_problem(path: str) -> str | None:
    """What is wrong with the tensors of a model directory's model.safetensors, or None.

    Compares the file's tensor names and shapes (its header, read without loading the
    data) with the parameters the architecture in its config.json needs: a tensor
    missing, one nobody asks for, or one of another shape. from_pretrained would load
    such a file with a warning in a log and random values where the tensor belongs.
    """
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
            found = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
        with torch.device("meta"):                 # shapes only: no memory, no random draws
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    except Exception as e:                         # unreadable: the hash, and then the load, say so
        return f"model.safetensors cannot be read ({type(e).__name__})"
    needed = {name: list(p.shape) for name, p in model.named_parameters()}   # tied weights once
    problems = [f"no tensor {n}" for n in sorted(set(needed) - set(found))]
    problems += [f"an unexpected tensor {n}" for n in sorted(set(found) - set(needed))]
    problems += [f"{n} has shape {found[n]}, the model needs {needed[n]}" for n in sorted(set(found) & set(needed))
                 if found[n] != needed[n]]
    return ", ".join(problems) or None


def shipped_configs() -> list[WarmupConfig]:
    """The warm-ups the repository ships: each task's own (warmup_config) for each seed in
    SHIPPED_SEEDS. tests/engine/test_tinymodel.py checks that weights/ holds exactly these."""
    return [warmup_config(task, seed=seed) for task in TASKS for seed in SHIPPED_SEEDS]


def ship(shipped_dir: str = SHIPPED_DIR, cache_dir: str | None = None) -> list[str]:
    """Rebuild the shipped warm-ups: for each of shipped_configs(), warm up (or take the
    cache entry of the same key, which this machine built from the same config) and copy
    the model directory into shipped_dir/<key>; then delete every other entry of
    shipped_dir. Returns the shipped paths. `python -m machinery.warmups`, then commit
    weights/."""
    keep = []
    for cfg in shipped_configs():
        source = load_or_warmup(cfg, cache_dir, shipped_dir=None)
        target = os.path.join(shipped_dir, cache_key(cfg))
        if not os.path.isdir(target):
            tmp = tempfile.mkdtemp(dir=_made(shipped_dir), prefix=".tmp-")
            shutil.copytree(source, tmp, dirs_exist_ok=True)
            os.rename(tmp, target)
        keep.append(target)
    for name in os.listdir(shipped_dir):
        if os.path.join(shipped_dir, name) not in keep:
            shutil.rmtree(os.path.join(shipped_dir, name))
    return keep


def warmup(cfg: WarmupConfig, cache_dir: str | None = None, say=None) -> str:
    """Train the tiny model from scratch for cfg.max_steps steps (or to cfg.target_pass1).

    Objective: next-token cross-entropy on the RESPONSE tokens only (scratchpad + answer
    + EOS; the prompt is input), averaged over the batch's response tokens; AdamW,
    gradient norm clipped at 1. Data: cfg.n_train problems from the train side of the
    task's rows, so train.py's held-out problems are never trained on; batches drawn with
    replacement by a seeded generator. Every cfg.eval_every steps: one temperature-1 sample
    for each of cfg.eval_prompts held-out problems, exact match of the answer line. With
    cfg.target_pass1, the first evaluation at or above it stops early (if never reached,
    the model is saved and warmup.json says so).
    Writes <cache_dir>/<cache_key(cfg)>/ atomically (model, tokenizer, warmup.json: config,
    eval history, seconds, parameter count, the weights' SHA-256; renamed into place when
    complete). Returns the
    path. CPU; the global torch RNG is untouched, so the result depends only on cfg.
    say: None, or a function of one line that hears, before the first step, how many
    steps, about how long on this machine (estimate_seconds: timed on a copy, so the
    warm-up itself is the same with or without it) and where it will be cached.
    """
    from tqdm import tqdm

    cfg.validate()
    cache_dir = cache_dir or DEFAULT_CACHE_DIR
    final = os.path.join(cache_dir, cache_key(cfg))
    t_start = time.perf_counter()

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=cfg.seed, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                             num_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size)
    train_rows, eval_rows = _task_rows(cfg)
    inputs, labels = _encode_rows(tokenizer, train_rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s))
    gen = torch.Generator().manual_seed(cfg.seed)
    if say is not None:
        per_step, per_eval = estimate_seconds(cfg, model, tokenizer, inputs, labels, eval_rows)
        evals = -(-cfg.max_steps // cfg.eval_every)             # every eval_every steps and at the end
        say(f"warm-up: {cfg.max_steps} supervised steps" + (" (fewer if it reaches its target)" if cfg.target_pass1
                                                             else "") +
            f", about {duration_text(cfg.max_steps * per_step + evals * per_eval)} on this machine "
            f"({per_step:.2f} s a step and {evals} evaluations of {per_eval:.1f} s, timed now); cached in {final}")

    history, step, reached = [], 0, False
    goal = f"{cfg.max_steps} steps" if cfg.target_pass1 is None else f"stops at pass@1 >= {cfg.target_pass1}"
    bar = tqdm(total=cfg.max_steps, desc=f"warm-up ({goal})", dynamic_ncols=True)
    while step < cfg.max_steps and not reached:
        model.train()
        idx = torch.randint(len(train_rows), (cfg.batch_size,), generator=gen)
        loss = _response_loss(model, inputs[idx], labels[idx], tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            pass1 = _eval_pass1(model, tokenizer, eval_rows, cfg, step)
            history.append({"step": step, "loss": loss.item(), "pass@1": pass1,
                            "seconds": time.perf_counter() - t_start})
            reached = cfg.target_pass1 is not None and pass1 >= cfg.target_pass1
            bar.set_postfix(loss=f"{loss.item():.3f}", pass1=f"{pass1:.2f}")
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()

    summary = {"config": dataclasses.asdict(cfg), "cache_format": CACHE_FORMAT, "steps": step,
               "reached_target": reached if cfg.target_pass1 is not None else None,
               "final_pass1": history[-1]["pass@1"] if history else None,
               "seconds": time.perf_counter() - t_start, "params": count_params(model), "history": history}
    return _save_atomic(model.eval(), tokenizer, summary, final)


def estimate_seconds(cfg: WarmupConfig, model, tokenizer, inputs: torch.Tensor, labels: torch.Tensor,
                     eval_rows: list[dict], steps: int = 4, eval_prompts: int = 32) -> tuple[float, float]:
    """(seconds per warm-up step, seconds per evaluation) on this machine, now.

    Timed on a deep copy of the model with an optimizer and a batch generator of its own
    (a seed the warm-up's stream never uses), and the evaluation in _eval_pass1's forked
    RNG: nothing the warm-up draws or trains is touched, so its result is the same with
    or without the estimate (tested). One untimed step first (allocations), then `steps`
    steps; the evaluation on `eval_prompts` held-out rows, scaled to all of them. The
    untrained copy writes every response to its full length, as a warm model nearly does
    (the budget is the longest reference), so the evaluation is not underestimated. About
    a second in all; a busy machine's time, if it is busy now.
    """
    trial = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trial.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)

    def one_step():
        idx = torch.randint(len(inputs), (cfg.batch_size,), generator=gen)
        loss = _response_loss(trial.train(), inputs[idx], labels[idx], tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    one_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    per_step = (time.perf_counter() - t0) / steps
    rows = eval_rows[:eval_prompts]
    t0 = time.perf_counter()
    _eval_pass1(trial.eval(), tokenizer, rows, cfg, step=0)
    per_eval = (time.perf_counter() - t0) * len(eval_rows) / max(1, len(rows))
    return per_step, per_eval


def duration_text(seconds: float) -> str:
    """A duration for a reader: '40 s', '3 min', '1.4 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def lr_factor(cfg: WarmupConfig, step: int) -> float:
    """The warm-up's learning rate at optimizer step `step` (0-based), as a share of cfg.lr:
    min(1, (step + 1) / lr_warmup_steps), times (1 + cos(pi * step / max_steps)) / 2 with
    lr_decay (1 at the start, 0 at max_steps)."""
    ramp = min(1.0, (step + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else 1.0
    return ramp * (0.5 * (1 + math.cos(math.pi * min(step, cfg.max_steps) / cfg.max_steps)) if cfg.lr_decay else 1.0)


def _encode_rows(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs [n, L], labels [n, L]) for prompt + target + EOS, right-padded.

    labels hold the token ids on response positions (target characters and EOS) and
    -100 elsewhere (prompt, padding), the ignore index of cross-entropy. Right padding
    is fine for training: every row starts at position 0, as a left-padded prompt does
    under logprobs.token_logprobs' position ids.
    """
    # The Rust tokenizer's batch encoder directly: 4x faster than the Python wrapper.
    encode = tokenizer.backend_tokenizer.encode_batch
    prompts = [e.ids for e in encode([r["prompt"] for r in rows], add_special_tokens=False)]
    targets = [e.ids for e in encode([r["target"] for r in rows], add_special_tokens=False)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    L = max(len(p) + len(t) + 1 for p, t in zip(prompts, targets))
    seqs, labs = [], []
    for p, t in zip(prompts, targets):      # plain lists, one tensor at the end: fast
        seq = p + t + [eos]
        seqs.append(seq + [pad] * (L - len(seq)))
        labs.append([-100] * len(p) + t + [eos] + [-100] * (L - len(seq)))
    inputs, labels = torch.tensor(seqs, dtype=torch.long), torch.tensor(labs, dtype=torch.long)
    return inputs, labels


def _response_loss(model, inputs: torch.Tensor, labels: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean next-token cross-entropy over response positions (labels != -100)."""
    L = int((inputs != pad_id).sum(1).max())                 # trim the batch's padding columns
    inputs, labels = inputs[:, :L], labels[:, :L]
    logits = model(input_ids=inputs, attention_mask=(inputs != pad_id).long(), use_cache=False).logits
    # logits at position s predict token s+1
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)


def _eval_pass1(model, tokenizer, rows: list[dict], cfg: WarmupConfig, step: int) -> float:
    """Held-out pass@1 at temperature 1, sampled in a forked RNG seeded by (seed, step)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 100_003 + step)
        sample_texts = lambda prompts, n: rollout.generate_rollouts(model, tokenizer, prompts, n,
                                                                   max_response_tokens(cfg)).texts
        task = tasks.TASKS[cfg.task]
        check = lambda texts, rows: [task.check(t, r["answer"], r["prompt"])["correct"] == 1.0
                                     for t, r in zip(texts, rows)]
        counts = rollout.sample_eval(sample_texts, rows, 1, check, prompts_per_batch=128)
    return sum(counts) / len(counts)


def _task_rows(cfg: WarmupConfig) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out evaluation rows) of the warm-up: {"prompt", "answer", "target"}.

    Both come from the task's own train / test sides, so the problems train.py
    evaluates on are never trained on; the evaluation rows use another seed than
    train.py's test rows (same held-out side).
    """
    task = tasks.TASKS[cfg.task]
    train_rows = task.rows(cfg.n_train, "train", seed=cfg.seed, digits=cfg.digits)
    if cfg.digit_noise:      # the noisy teacher (addition's): targets only; "answer" stays the true sum
        rng = random.Random(cfg.seed)
        train_rows = [{**r, "target": addition.addition_response(*map(int, r["prompt"].split("+")),
                                                                 digit_noise=cfg.digit_noise, rng=rng)}
                      for r in train_rows]
    if cfg.target_noise:     # the noisy teacher of any task: another problem's (well-formed, wrong) target
        rng, targets = random.Random(cfg.seed + 1), [r["target"] for r in train_rows]
        train_rows = [{**r, "target": rng.choice(targets)} if rng.random() < cfg.target_noise else r
                      for r in train_rows]
    return train_rows, task.rows(cfg.eval_prompts, "test", seed=cfg.seed + 7919, digits=cfg.digits)


def _made(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _save_atomic(model, tokenizer, summary: dict, final: str) -> str:
    """Save into a temporary sibling directory, then rename it to `final` in one step.

    os.rename of a directory within one filesystem is atomic: a reader sees either no
    entry or a complete one. On any error the temporary directory is removed and the
    error re-raised. If another process finished the same warm-up first, its entry is
    kept and ours discarded (same config, same result).
    """
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-" + os.path.basename(final) + "-")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        summary = {**summary, "weights_sha256": checkpoint.weights_sha256(tmp)}    # what verify_warmup checks later
        with open(os.path.join(tmp, "warmup.json"), "w") as f:     # last: marks completeness
            json.dump(summary, f, indent=1)
        if os.path.isdir(final) and not os.path.isfile(os.path.join(final, "warmup.json")):
            shutil.rmtree(final)                # incomplete, not ours (we only rename whole entries)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, "warmup.json")):
                raise
            shutil.rmtree(tmp, ignore_errors=True)                  # lost a benign race
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


if __name__ == "__main__":
    # python -m machinery.warmups: rebuild weights/ (every task x SHIPPED_SEEDS), then paste
    # the lines printed into SHIPPED_SHA256 and commit both.
    for shipped in ship():
        print(f'    "{os.path.basename(shipped)}": "{checkpoint.weights_sha256(shipped)}",')
