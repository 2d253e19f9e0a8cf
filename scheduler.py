"""Scheduling the advantage: FADE (Decugis et al. 2026, arXiv 2607.01490).

The FADE paper splits any advantage into a success mass m_S and a failure mass m_F
(docs/math.md §2) and reads them along two axes:
  - difficulty: where m_S(p) + m_F(p) peaks over the group solve rate p. Focusing on hard
    prompts sharpens the signal but spends fewer rollouts' worth of gradient;
  - sign: m_S versus m_F. The paper's claim: too much success mass collapses the entropy,
    too much failure mass collapses the geometry of the weights (with Adam; under SGD on
    logits the imbalance has no first-order effect on entropy, docs/math.md §2.3).
Its observation is that the right point on both axes moves during training: early on
(exploration) balance and a hard focus help; later (exploitation) suppressing failures
harder and a medium focus help. FADE ("Focal Advantage with Dynamic Entropy") therefore
reads two training statistics and turns them into the two knobs of its advantage

    A_i = (1 - p)^(alpha - 1) * (r_i - mean(r)),   divided by delta where r_i < mean(r)

(advantages.fade(rewards, alpha, delta); masses p(1-p)^alpha and p(1-p)^alpha / delta).
This file holds only the knobs' schedule:

    p_hat  <- EMA of the batch solve rate            (starts at 0.5)
    H_hat  <- EMA of the mean token entropy, nats    (starts at the first measurement H0)
    alpha   = clip(3 (1 - p_hat) / (2 p_hat), 1, 3)  hard focus while prompts are hard:
                                                     3 for p_hat <= 1/3, 1 for p_hat >= 0.6
    delta   = clip(1 + H_hat - H_target, 0.3, 1)     1 (balanced) while entropy is above
                                                     target; below it failures are
                                                     amplified, up to 1/0.3 = 3.3x
    H_target = an absolute number of nats, or target_rel * H0 (0.5 is the paper's best)

Order of one training step (our choice, used by train.py): measure this batch's solve
rate and mean entropy, call `step(solve_rate, entropy)`, which FIRST updates the EMAs with
them and THEN returns the alpha/delta computed from the updated EMAs, and use those for
this batch's advantages (`step_hyper`: the one rule by which train.py and the TRL
integration hand them to the advantage). So the very first step already reads its own batch (and
H_hat = H0 on step one). Whether the paper updates before or after is not stated.

EMA convention [recon]. Written here (default, ema="new"), with beta = ema_beta:
    p_hat <- (1 - beta) p_hat + beta * x,   beta = 0.02   (memory ~ 1/beta = 50 steps)
The source's formula puts beta on the old value instead (ema="source"):
    p_hat <- beta p_hat + (1 - beta) x
which keeps only 2% of the history, i.e. barely smooths. Both are offered; the default
is the reading that makes "moving average" mean something. The field is `ema_beta`
(OpenRLHF's name for an EMA rate), not `beta`: in TRL and verl `beta` is the KL
coefficient, and a TRL user who typed --beta would believe a KL penalty was on.

Units, candidly: delta compares entropies in nats with an offset of 1, so the same rule
bites at different relative drops for a model whose entropy is 0.3 nats versus 3 nats.
A model whose entropy fell to 0.03 nats under a target of 0.04 is 25% below target, yet
gets delta = 1 + 0.03 - 0.04 = 0.99: the rule barely moves. So a second rule,
"fade_rel" [recon], measures the gap in units of the target:

    delta = clip(1 + (H_hat - H_target) / H_target, 0.3, 1) = clip(H_hat / H_target, 0.3, 1)

delta is then the entropy's ratio to its target: 1 at the target, 0.5 at half of it, the
floor 0.3 at 30% of it, whatever the entropy scale of the model. The two rules coincide
exactly when H_target = 1 nat (1 + H - 1 = H / 1), the scale at which the paper's offset
of 1 is a relative gap; for the small entropies of the embedded model (0.03-0.3 nats) the
paper's rule barely leaves 1 (docs/math.md §4).

Also here: "constant", no schedule at all (the advantage keeps the alpha and delta it is
given: train.py's --alpha and --delta, or its function's defaults; the static baselines,
and alpha = delta = 1 makes the fade advantage exactly Dr. GRPO's r - mean(r)), and a
"decay" schedule (alpha and delta move linearly in the step count, the paper's ablation
of reading the dynamics versus following the clock; [recon] its exact shape is unknown).
The EMAs are updated and reported in every schedule, so logs are comparable.

With delta < 1 a group's advantages no longer sum to zero (failures weigh 1/delta
times more), so FADE deliberately trades some gradient cancellation (batching.py) for
entropy control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advantages import is_finite_number

SCHEDULES = ("fade", "fade_rel", "constant", "decay")
EMA_CONVENTIONS = ("new", "source")

# The FADE clip ranges (from the paper's formulas).
ALPHA_MIN, ALPHA_MAX = 1.0, 3.0
DELTA_MIN, DELTA_MAX = 0.3, 1.0


# ---------------------------------------------------------------------------------------
# The FADE formulas, as plain functions: the two knobs and the EMA that feeds them.
# The scheduler calls them with checked inputs (AdvantageScheduler.step checks them once).
# ---------------------------------------------------------------------------------------

def fade_alpha(p_hat: float) -> float:
    """Difficulty focus: alpha = clip(3 (1 - p_hat) / (2 p_hat), 1, 3).

    The power advantage (1-p)^(alpha-1) (r - mean) has mass p(1-p)^alpha, peaking at
    p = 1/(1+alpha): alpha = 3 focuses on prompts solved 1/4 of the time, alpha = 1 on
    1/2 (plain mean-centring). The formula hits 3 at p_hat = 1/3 and 1 at p_hat = 0.6.
    Example: p_hat = 0.5 -> 3 * 0.5 / 1.0 = 1.5. p_hat = 0 (never solved) -> 3, handled
    before the division.
    """
    if p_hat <= 1.0 / 3.0:    # the clip's top; also keeps p_hat = 0 out of the division
        return ALPHA_MAX
    if p_hat >= 0.6:          # the clip's bottom, exact (3 * 0.4 / 1.2 is 1.0000000000000002)
        return ALPHA_MIN
    return _clip(3.0 * (1.0 - p_hat) / (2.0 * p_hat), ALPHA_MIN, ALPHA_MAX)


def fade_delta(h_hat: float, h_target: float) -> float:
    """Sign balance: delta = clip(1 + H_hat - H_target, 0.3, 1).

    delta divides the negative advantages, so delta = 1 keeps the group zero-sum
    (balanced) and delta < 1 makes failures weigh 1/delta times more. The FADE paper's
    reading: pushing failures down spreads probability over the other tokens and raises
    the entropy, which is why it is switched on once the entropy falls below target.
    (With Adam; under SGD on logits the imbalance has no first-order effect on entropy:
    docs/math.md §2.3, toy experiment 6.) Example: H_target = 1.0,
    H_hat = 0.5 -> delta = 0.5 (failures x2); H_hat <= 0.3 -> the floor 0.3 (x3.3).
    """
    return _clip(1.0 + h_hat - h_target, DELTA_MIN, DELTA_MAX)


def fade_delta_relative(h_hat: float, h_target: float) -> float:
    """[recon] Sign balance on the entropy's own scale: delta = clip(H_hat / H_target, 0.3, 1).

    The paper's gap 1 + H_hat - H_target, with the gap H_hat - H_target divided by
    H_target (the "fade_rel" schedule; module header). Examples: H_target = 0.04,
    H_hat = 0.03 -> 0.75 (fade_delta gives 0.99); H_hat = 0.01 -> the floor 0.3; H_hat >=
    H_target -> 1. A zero target (H0 = 0: the first batch had no entropy at all) can
    never be undershot: delta = 1, instead of a division by zero.
    """
    if h_target <= 0.0:
        return DELTA_MAX
    return _clip(h_hat / h_target, DELTA_MIN, DELTA_MAX)


def _ema(old: float, x: float, beta: float, convention: str) -> float:
    """One EMA update. "new": (1-beta) old + beta x.  "source" [recon]: beta old + (1-beta) x.

    After k updates with a constant x from old = v0 under "new":
        v_k = (1 - beta)^k v0 + (1 - (1 - beta)^k) x     (tested)
    e.g. beta = 0.02, k = 50: 36% of v0 is left. Under "source" only beta^k of v0 is left
    (0.02 after one step).
    """
    if convention == "new":
        return (1.0 - beta) * old + beta * x
    return beta * old + (1.0 - beta) * x


# ---------------------------------------------------------------------------------------
# The config, checked once at its door (__post_init__)
# ---------------------------------------------------------------------------------------

@dataclass
class SchedulerConfig:
    """Hyper-parameters of the advantage schedule (defaults: the FADE paper's)."""

    schedule: str = "fade"
    """One of SCHEDULES: "fade" (reads p_hat, H_hat), "fade_rel" (the same with delta = clip(H_hat / H_target)), "constant" (none: the advantage's own alpha, delta), or "decay" (step count)."""
    ema_beta: float = 0.02
    """FADE's EMA rate in (0, 1): weight of the NEW value under ema="new", of the OLD under "source" (not TRL's beta: that is --kl_coef)."""
    ema: str = "new"
    """EMA convention, "new" (default, smooths over ~1/ema_beta steps) or "source" [recon]."""
    p_init: float = 0.5
    """Initial p_hat, the solve-rate EMA before any batch is seen."""
    h_target: float | None = None
    """Absolute entropy target in nats; if None the target is relative (target_rel * H0)."""
    target_rel: float = 0.5
    """Relative target: H_target = target_rel * H0 (first measured entropy); paper's best 0.5."""
    alpha_start: float = 3.0
    """"decay": alpha at the first step (hard focus)."""
    alpha_end: float = 1.0
    """"decay": alpha at step total_steps - 1 and after (GRPO-like focus)."""
    delta_end: float = 0.3
    """"decay": delta at step total_steps - 1 and after (delta starts at 1, balanced)."""
    total_steps: int | None = None
    """"decay": number of training steps the linear ramp spans (>= 2); required for decay."""

    def __post_init__(self) -> None:
        """The door: every field against CONFIG_RANGES; one ValueError line naming the value."""
        for name, (ok, what) in CONFIG_RANGES.items():
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"{name} must be {what}, got {value!r}")
        steps = self.total_steps
        if self.schedule == "decay" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 2):
            raise ValueError(f"the decay schedule needs an int total_steps >= 2, got {steps!r}")
        # The ramp moves alpha by (alpha_end - alpha_start) / (total_steps - 1) a step: a ramp
        # longer than any run (2**20 steps) never reaches its end, and at 10**30 the step
        # (~1e-30) is below alpha's float64 rounding, so alpha would never leave alpha_start.
        if self.schedule == "decay" and steps >= MAX_TOTAL_STEPS:
            raise ValueError(f"total_steps must be below {MAX_TOTAL_STEPS}, the longest run (--steps): a longer decay "
                             f"ramp never reaches alpha_end and delta_end, got {steps}")


MAX_TOTAL_STEPS = 2 ** 20      # the longest run train.py accepts (--steps)

# SchedulerConfig's field ranges: field -> (test(value), what it must be). total_steps is
# checked only for "decay", the one schedule that reads it.
CONFIG_RANGES = {
    "schedule": (lambda v: v in SCHEDULES, f"one of {SCHEDULES}"),
    "ema": (lambda v: v in EMA_CONVENTIONS, f"one of {EMA_CONVENTIONS}"),
    "ema_beta": (lambda v: is_finite_number(v) and 0.0 < v < 1.0, "in (0, 1)"),
    "p_init": (lambda v: is_finite_number(v) and 0.0 < v <= 1.0, "in (0, 1]"),
    "h_target": (lambda v: v is None or (is_finite_number(v) and v >= 0.0),
                 "None or a finite number of nats >= 0"),
    "target_rel": (lambda v: is_finite_number(v) and v > 0.0, "finite and > 0"),
    # alpha < 1 would make (1 - p)^(alpha - 1) infinite on all-correct groups (p = 1);
    # above 10 it leaves the fade advantage's own range (advantages.HYPER_RANGES says why).
    # Checked here, not at a step: alpha_start 1e30 once passed, and the ramp's end
    # 1e30 + 1 x (1 - 1e30) rounded to 0.0, refused at step 2 of a 3-step run by the
    # advantage, far from its flag ("fade: needs a finite alpha > 0, got 0.0").
    "alpha_start": (lambda v: is_finite_number(v) and 1.0 <= v <= 10.0, "finite and in [1, 10]"),
    "alpha_end": (lambda v: is_finite_number(v) and 1.0 <= v <= 10.0, "finite and in [1, 10]"),
    # delta goes from 1 to delta_end: the fade advantage's range for delta (HYPER_RANGES).
    "delta_end": (lambda v: is_finite_number(v) and 1e-3 <= v <= 1e3, "finite and in [0.001, 1000]"),
}


# ---------------------------------------------------------------------------------------
# The scheduler: a little state, one call per training step
# ---------------------------------------------------------------------------------------

class AdvantageScheduler:
    """Holds p_hat, H_hat, H0 and the step count; `step()` once per training step.

    Usage (train.py):
        sched = AdvantageScheduler(SchedulerConfig())
        knobs = sched.step(solve_rate=batch_solve_rate, entropy=batch_mean_entropy)
        adv = advantages.compute_advantages("fade", rewards, alpha=knobs["alpha"], delta=knobs["delta"])
    """

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config if config is not None else SchedulerConfig()
        self.p_hat = self.config.p_init
        self.h_hat: float | None = None      # set to H0 by the first step
        self.h0: float | None = None         # first measured entropy
        self.t = 0                           # number of completed step() calls

    def step(self, solve_rate: float, entropy: float) -> dict:
        """Update the EMAs with this batch, then return this batch's knobs.

        solve_rate: the batch's mean binary reward, in [0, 1].
        entropy: the batch's mean per-token entropy in nats, finite and >= 0.
        Both are checked here, once, before any state changes (ValueError naming the value).
        Returns {"alpha", "delta", "p_hat", "H_hat", "H_target"} (Python floats), where
        p_hat and H_hat already include this batch (see the module header for why);
        "constant" returns no alpha and delta (the advantage keeps its own).
        Step k = 0, 1, ... of "decay" uses fraction f = min(k / (total_steps - 1), 1):
        alpha = alpha_start + f (alpha_end - alpha_start), delta = 1 + f (delta_end - 1).
        """
        solve_rate, entropy = _check_inputs(solve_rate, entropy)
        cfg = self.config
        if self.h0 is None:
            self.h0 = entropy
            self.h_hat = entropy
        self.p_hat = _ema(self.p_hat, solve_rate, cfg.ema_beta, cfg.ema)
        self.h_hat = _ema(self.h_hat, entropy, cfg.ema_beta, cfg.ema)
        h_target = self.h_target()
        state = {"p_hat": float(self.p_hat), "H_hat": float(self.h_hat), "H_target": float(h_target)}
        t, self.t = self.t, self.t + 1
        if cfg.schedule == "constant":
            return state
        if cfg.schedule == "fade":
            alpha, delta = fade_alpha(self.p_hat), fade_delta(self.h_hat, h_target)
        elif cfg.schedule == "fade_rel":   # [recon] the gap in units of the target (module header)
            alpha, delta = fade_alpha(self.p_hat), fade_delta_relative(self.h_hat, h_target)
        else:  # decay [recon]: a straight line in the step count, then held
            f = min(t / (cfg.total_steps - 1), 1.0)
            alpha = cfg.alpha_start + f * (cfg.alpha_end - cfg.alpha_start)
            delta = 1.0 + f * (cfg.delta_end - 1.0)
        return {"alpha": float(alpha), "delta": float(delta), **state}

    def h_target(self) -> float:
        """The entropy target in nats: config.h_target, else target_rel * H0.

        Before the first step a relative target is unknown (H0 not measured): ValueError.
        """
        if self.config.h_target is not None:
            return float(self.config.h_target)
        if self.h0 is None:
            raise ValueError("relative entropy target is undefined before the first step "
                             "(H0 = first measured entropy); call step() first")
        return self.config.target_rel * self.h0

    def state_dict(self) -> dict:
        """Everything that changes during training (not the config): p_hat, H_hat, H0, t.

        Plain Python floats/ints, exact in float64, so a save/load round trip (e.g. with
        torch.save next to the model checkpoint) resumes bit-for-bit. The config is not
        saved: build the scheduler with the same config when resuming.
        """
        return {"p_hat": self.p_hat, "H_hat": self.h_hat, "H0": self.h0, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict(); missing keys or a negative step count: ValueError."""
        missing = {"p_hat", "H_hat", "H0", "t"} - set(state)
        if missing:
            raise ValueError(f"scheduler state_dict is missing keys {sorted(missing)}")
        if int(state["t"]) < 0:
            raise ValueError(f"scheduler step count must be >= 0, got {state['t']}")
        self.p_hat = float(state["p_hat"])
        self.h_hat = None if state["H_hat"] is None else float(state["H_hat"])
        self.h0 = None if state["H0"] is None else float(state["H0"])
        self.t = int(state["t"])


# ---------------------------------------------------------------------------------------
# What a schedule hands the advantage: the one rule both trainers apply
# ---------------------------------------------------------------------------------------

SCHEDULED = ("alpha", "delta")
"""The fade advantage's hyper-parameters that every schedule but "constant" sets each step."""


def step_hyper(given: dict, knobs: dict) -> dict:
    """One step's keyword arguments of the advantage: `given`, then what the schedule set.

        step_hyper(given, knobs) = given, with alpha and delta replaced by knobs' where knobs has them

    given: the advantage's hyper-parameters fixed for the run ({parameter: value}: train.py's
    flags, the TRL integration's advantage_kwargs); knobs: this step's
    AdvantageScheduler.step output, whose other keys (p_hat, H_hat, H_target) are not the
    advantage's and are left out. "constant" returns no alpha and delta, so `given` stands.
    Example: step_hyper({"eps": 1e-6}, {"alpha": 1.5, "delta": 0.8, "p_hat": 0.4})
    == {"eps": 1e-6, "alpha": 1.5, "delta": 0.8}. Both trainers call this one rule, so a
    schedule means the same thing in train.py and in integrations/trl_grpo.py.
    """
    return {**given, **{name: knobs[name] for name in SCHEDULED if name in knobs}}


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _check_inputs(solve_rate: float, entropy: float) -> tuple[float, float]:
    """Convert to float and validate: solve_rate in [0, 1], entropy finite and >= 0."""
    try:
        solve_rate, entropy = float(solve_rate), float(entropy)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"solve_rate and entropy must be numbers, got {solve_rate!r}, "
                         f"{entropy!r}") from err
    if not 0.0 <= solve_rate <= 1.0:   # also rejects NaN
        raise ValueError(f"solve_rate must be in [0, 1], got {solve_rate}")
    if not (math.isfinite(entropy) and entropy >= 0.0):
        raise ValueError(f"entropy must be finite and >= 0 (nats), got {entropy}")
    return solve_rate, entropy


def _clip(x: float, lo: float, hi: float) -> float:
    """clip(x, lo, hi) = min(max(x, lo), hi)."""
    return min(max(x, lo), hi)
