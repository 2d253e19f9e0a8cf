"""Tests for scheduler.py: FADE closed forms, EMA conventions, targets, resume, schedules."""

import hashlib
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from scheduler import (CONFIG_RANGES, AdvantageScheduler, SchedulerConfig,  # noqa: E402
                       fade_alpha, fade_delta, fade_delta_relative)

# The scheduler computes in Python floats: float64, each operation correctly rounded, the
# same on every CPU. Its closed forms of O(1) values round at ~1e-16 x the operations;
# pytest.approx's default (1e-6 relative) is far above that, the tighter bounds say why.


def test_alpha_closed_form_and_clips():
    for p in [0.0, 0.05, 0.2, 1 / 3]:
        assert fade_alpha(p) == 3.0
    for p in [0.6, 0.7, 0.99, 1.0]:
        assert fade_alpha(p) == 1.0
    assert fade_alpha(0.5) == pytest.approx(1.5)
    for p in [0.34, 0.4, 0.45, 0.55, 0.59]:
        assert fade_alpha(p) == pytest.approx(3 * (1 - p) / (2 * p))
        assert 1.0 < fade_alpha(p) < 3.0


def test_delta_closed_form_and_clips():
    assert fade_delta(2.0, 1.0) == 1.0                    # above target
    assert fade_delta(1.0, 1.0) == 1.0                    # at target
    assert fade_delta(0.5, 1.0) == pytest.approx(0.5)
    assert fade_delta(0.8, 1.0) == pytest.approx(0.8)
    assert fade_delta(0.3, 1.0) == pytest.approx(0.3)
    assert fade_delta(0.0, 1.0) == 0.3                    # floor
    assert fade_delta(0.1, 2.0) == 0.3


def test_relative_delta_closed_form_and_clips():
    # delta = clip(H_hat / H_target, 0.3, 1): the entropy's ratio to its target
    assert fade_delta_relative(0.03, 0.04) == pytest.approx(0.75)
    assert fade_delta(0.03, 0.04) == pytest.approx(0.99)            # the paper's rule barely moves there
    assert fade_delta_relative(0.02, 0.04) == pytest.approx(0.5)
    assert fade_delta_relative(0.04, 0.04) == 1.0                    # at target
    assert fade_delta_relative(0.5, 0.04) == 1.0                     # above: the clip's top
    assert fade_delta_relative(0.012, 0.04) == pytest.approx(0.3)    # 30% of target: the floor
    assert fade_delta_relative(0.001, 0.04) == 0.3
    assert fade_delta_relative(0.0, 0.0) == 1.0                      # a zero target is never undershot
    # scale-free: the same ratio gives the same delta at any entropy scale
    for scale in (0.01, 1.0, 30.0):
        assert fade_delta_relative(0.6 * scale, scale) == pytest.approx(0.6)
    # the two rules coincide when H_target = 1 nat (1 + H - 1 = H / 1)
    # (1 + h) - 1 rounds 1 + h once: at most half a spacing of [1, 2), 1.1e-16 (measured 1.1e-16)
    for h in (0.2, 0.45, 0.9, 1.3):
        assert fade_delta_relative(h, 1.0) == pytest.approx(fade_delta(h, 1.0), abs=1e-14)


def test_fade_rel_schedule_reads_the_same_emas_as_fade():
    inputs = [((7 * i % 11) / 10, 0.08 * 0.98 ** i) for i in range(300)]      # entropy falls to 0.2% of H0
    paper, rel = (AdvantageScheduler(SchedulerConfig(schedule=name)) for name in ("fade", "fade_rel"))
    for x in inputs:
        a, b = paper.step(*x), rel.step(*x)
        assert (a["alpha"], a["p_hat"], a["H_hat"], a["H_target"]) == (b["alpha"], b["p_hat"], b["H_hat"], b["H_target"])
        assert b["delta"] == pytest.approx(max(0.3, min(1.0, b["H_hat"] / b["H_target"])), rel=1e-15)   # measured 0
    # H_target = 0.04 (half of H0 = 0.08): the paper's delta never goes below 0.96, the relative one
    # reaches the floor
    assert a["delta"] > 0.96 and b["delta"] == 0.3


def test_fade_rel_state_dict_resumes_exactly():
    inputs = [(0.1 * (i % 10), 0.3 * 0.97 ** i) for i in range(80)]
    full = AdvantageScheduler(SchedulerConfig(schedule="fade_rel"))
    ref = [full.step(*x) for x in inputs]
    a = AdvantageScheduler(SchedulerConfig(schedule="fade_rel"))
    for x in inputs[:40]:
        a.step(*x)
    b = AdvantageScheduler(SchedulerConfig(schedule="fade_rel"))
    b.load_state_dict(dict(a.state_dict()))
    assert [b.step(*x) for x in inputs[40:]] == ref[40:]            # bit-for-bit
    assert min(o["delta"] for o in ref) < 0.9                         # it moved, so the resume was tested on a moving delta
    fresh = AdvantageScheduler(SchedulerConfig(schedule="fade_rel"))
    assert [fresh.step(*x) for x in inputs[40:]] != ref[40:]          # negative control


def test_ema_closed_form_after_k_steps():
    beta, k, x = 0.02, 37, 0.9
    s = AdvantageScheduler(SchedulerConfig(ema_beta=beta))
    for _ in range(k):
        out = s.step(solve_rate=x, entropy=1.0)
    mix = 1 - (1 - beta) ** k
    assert out["p_hat"] == pytest.approx((1 - mix) * 0.5 + mix * x, rel=1e-12)
    assert s.t == k


def test_entropy_ema_starts_at_first_measurement():
    s = AdvantageScheduler(SchedulerConfig(ema_beta=0.02))
    first = s.step(0.5, entropy=2.0)
    assert first["H_hat"] == 2.0                           # H_hat = H0 on step one
    second = s.step(0.5, entropy=1.0)
    assert second["H_hat"] == pytest.approx(0.98 * 2.0 + 0.02 * 1.0)
    # first step already reads its own batch: p_hat = 0.98 * 0.5 + 0.02 * 0.0
    s2 = AdvantageScheduler()
    assert s2.step(0.0, 1.0)["p_hat"] == pytest.approx(0.49)


def test_source_convention_differs():
    new = AdvantageScheduler(SchedulerConfig(ema="new"))
    src = AdvantageScheduler(SchedulerConfig(ema="source"))
    a, b = new.step(0.1, 1.0), src.step(0.1, 1.0)
    assert a["p_hat"] == pytest.approx(0.98 * 0.5 + 0.02 * 0.1)   # 0.492
    assert b["p_hat"] == pytest.approx(0.02 * 0.5 + 0.98 * 0.1)   # 0.108
    assert a["alpha"] == pytest.approx(3 * (1 - 0.492) / (2 * 0.492))
    assert b["alpha"] == 3.0                               # the source reading jumps at once


def test_relative_and_absolute_target():
    rel = AdvantageScheduler(SchedulerConfig())            # target_rel = 0.5
    out = rel.step(0.5, entropy=1.6)
    assert out["H_target"] == pytest.approx(0.8)
    for _ in range(5):                                     # H0 stays the FIRST entropy
        out = rel.step(0.5, entropy=0.1)
    assert out["H_target"] == pytest.approx(0.8)
    absolute = AdvantageScheduler(SchedulerConfig(h_target=0.25))
    assert absolute.step(0.5, entropy=3.0)["H_target"] == 0.25
    with pytest.raises(ValueError, match="first step"):
        AdvantageScheduler().h_target()


def test_fade_delta_drops_when_entropy_falls_below_target():
    s = AdvantageScheduler(SchedulerConfig(h_target=1.0))
    assert s.step(0.5, entropy=1.5)["delta"] == 1.0
    for _ in range(200):
        out = s.step(0.5, entropy=0.0)
    h = 1.5 * 0.98 ** 200                                  # EMA decays toward 0
    assert out["H_hat"] == pytest.approx(h)
    assert out["delta"] == pytest.approx(max(0.3, 1 + h - 1.0))
    assert out["delta"] < 1.0


def test_state_dict_round_trip_resumes_exactly():
    inputs = [(0.1 * (i % 10), 2.0 - 0.01 * i) for i in range(60)]
    full = AdvantageScheduler()
    ref = [full.step(*x) for x in inputs]
    a = AdvantageScheduler()
    for x in inputs[:25]:
        a.step(*x)
    state = a.state_dict()
    b = AdvantageScheduler()
    b.load_state_dict(dict(state))
    resumed = [b.step(*x) for x in inputs[25:]]
    assert resumed == ref[25:]                             # bit-for-bit
    # negative control: a fresh scheduler does not reproduce the tail
    fresh = AdvantageScheduler()
    assert [fresh.step(*x) for x in inputs[25:]] != ref[25:]
    with pytest.raises(ValueError, match="H0"):
        AdvantageScheduler().load_state_dict({"p_hat": 0.5, "H_hat": 1.0, "t": 0})


def test_constant_schedule_sets_no_knobs_and_still_tracks_the_emas():
    s = AdvantageScheduler(SchedulerConfig(schedule="constant"))
    outs = [s.step(sr, h) for sr, h in [(0.0, 3.0), (1.0, 0.0), (0.3, 1.0)] * 10]
    assert all(set(o) == {"p_hat", "H_hat", "H_target"} for o in outs)   # the advantage keeps its own
    assert outs[0]["p_hat"] != outs[-1]["p_hat"]           # EMAs still tracked for logs
    with pytest.raises(TypeError, match="alpha"):           # no fixed knobs here: they are advantage flags
        SchedulerConfig(schedule="constant", alpha=2.0)


def test_decay_endpoints_and_midpoint():
    cfg = SchedulerConfig(schedule="decay", total_steps=11, alpha_start=3.0,
                          alpha_end=1.0, delta_end=0.3)
    s = AdvantageScheduler(cfg)
    outs = [s.step(0.5, 1.0) for _ in range(15)]
    assert (outs[0]["alpha"], outs[0]["delta"]) == (3.0, 1.0)
    assert outs[5]["alpha"] == pytest.approx(2.0)
    assert outs[5]["delta"] == pytest.approx(0.65)
    assert outs[10]["alpha"] == pytest.approx(1.0) and outs[10]["delta"] == pytest.approx(0.3)
    assert all(o["alpha"] == pytest.approx(1.0) and o["delta"] == pytest.approx(0.3)
               for o in outs[10:])
    # independent of the inputs: a different solve rate / entropy gives the same knobs
    s2 = AdvantageScheduler(cfg)
    outs2 = [s2.step(0.0, 5.0) for _ in range(15)]
    assert [(o["alpha"], o["delta"]) for o in outs2] == [(o["alpha"], o["delta"]) for o in outs]


def test_fade_alpha_follows_p_hat_over_training():
    s = AdvantageScheduler()
    first = s.step(0.0, 1.0)
    assert first["alpha"] == pytest.approx(3 * (1 - 0.49) / (2 * 0.49))
    for _ in range(300):
        out = s.step(1.0, 1.0)
    assert out["p_hat"] > 0.99 and out["alpha"] == 1.0


@pytest.mark.parametrize("sr,h,match", [(1.5, 1.0, "1.5"), (-0.1, 1.0, "-0.1"),
                                        (float("nan"), 1.0, "nan"), (0.5, -1.0, "-1.0"),
                                        (0.5, float("inf"), "inf"), ("x", 1.0, "'x'")])
def test_bad_step_inputs_raise(sr, h, match):
    with pytest.raises(ValueError, match=match):
        AdvantageScheduler().step(sr, h)


@pytest.mark.parametrize("kwargs,match", [
    ({"schedule": "cosine"}, "cosine"), ({"ema": "old"}, "old"), ({"ema_beta": 0.0}, "0.0"),
    ({"ema_beta": 1.5}, "1.5"), ({"schedule": "decay"}, "None"),
    ({"schedule": "decay", "total_steps": 1}, "1"), ({"schedule": "decay", "total_steps": 2 ** 20}, "below 1048576"),
    ({"p_init": 0.0}, "0.0"), ({"target_rel": -1.0}, "-1.0"),
    ({"h_target": math.nan}, "nan"), ({"h_target": -0.5}, "-0.5"), ({"alpha_start": 0.9}, "0.9"),
    ({"alpha_end": math.inf}, "inf"), ({"delta_end": 0.0}, "0.0"),
    ({"ema_beta": "0.1"}, "'0.1'"), ({"p_init": True}, "True"), ({"target_rel": math.inf}, "inf"),
    ({"schedule": "decay", "total_steps": 10.0}, "10.0"), ({"schedule": "decay", "total_steps": True}, "True")])
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_config_door_names_the_field_and_covers_every_range():
    for name in CONFIG_RANGES:
        with pytest.raises(ValueError, match=rf"^{name} must be .*, got -7$"):
            SchedulerConfig(**{name: -7})
    assert set(CONFIG_RANGES) | {"total_steps"} == set(SchedulerConfig.__dataclass_fields__)
    # total_steps is read by "decay" only, so other schedules accept any value (as before)
    assert SchedulerConfig(schedule="fade", total_steps=1).total_steps == 1
    assert SchedulerConfig(schedule="decay", total_steps=2).total_steps == 2


def test_a_rejected_step_changes_no_state():
    s = AdvantageScheduler()
    s.step(0.25, 1.5)
    before = s.state_dict()
    for sr, h in [(math.nan, 1.0), (0.5, -1.0), (2.0, 1.0)]:
        with pytest.raises(ValueError):
            s.step(sr, h)
        assert s.state_dict() == before


# The issue-8 refactor (checks moved to the door, clips written as clip()) changed no bit:
# sha256 of the repr of 120 steps' outputs, computed with scheduler.py as it was before it
# (git 848a306). Plain Python floats, so the pins hold on any IEEE-754 machine. The
# constant schedule's pin is that of the same code's outputs without alpha and delta,
# which "constant" no longer returns (the rename of beta to ema_beta changed no bit).
SCHEDULE_PINS = [
    ({}, "f6bf193f8c66c7e8"),
    ({"ema": "source"}, "4f6f38f9d9934262"),
    ({"h_target": 1.2, "ema_beta": 0.1}, "3830e0ee379ef412"),
    ({"schedule": "constant"}, "07903dd7d3285b69"),
    ({"schedule": "decay", "total_steps": 50}, "654c2b9268184147"),
]


@pytest.mark.parametrize("kwargs,pin", SCHEDULE_PINS)
def test_outputs_are_pinned_bit_for_bit(kwargs, pin):
    inputs = [((7 * i % 11) / 10, 2.5 * 0.97 ** i + 0.05 * (i % 3)) for i in range(120)]
    s = AdvantageScheduler(SchedulerConfig(**kwargs))
    outs = [s.step(*x) for x in inputs]
    assert hashlib.sha256(repr(outs).encode()).hexdigest()[:16] == pin
    # negative control: a 1e-12 change of one input changes the pin
    s = AdvantageScheduler(SchedulerConfig(**kwargs))
    nudged = inputs[:60] + [(inputs[60][0] + 1e-12, inputs[60][1])] + inputs[61:]
    outs = [s.step(*x) for x in nudged]
    assert hashlib.sha256(repr(outs).encode()).hexdigest()[:16] != pin


def test_step_hyper_replaces_alpha_and_delta_by_the_schedules_and_keeps_the_rest():
    # the one rule train.py and the TRL integration both apply
    from scheduler import SCHEDULED, step_hyper
    assert SCHEDULED == ("alpha", "delta")
    given = {"alpha": 2.0, "eps": 1e-6}
    assert step_hyper(given, {"alpha": 1.5, "delta": 0.8, "p_hat": 0.4, "H_hat": 0.1}) == \
        {"alpha": 1.5, "eps": 1e-6, "delta": 0.8}
    assert step_hyper(given, {"p_hat": 0.4, "H_hat": 0.1, "H_target": 0.05}) == given     # "constant": given stands
    knobs = AdvantageScheduler(SchedulerConfig(schedule="decay", total_steps=3)).step(0.5, 0.2)
    assert step_hyper({}, knobs) == {"alpha": 3.0, "delta": 1.0}                            # the ramp's first step
