"""integrations/verl_plugin.py inside verl 0.9.1, checked against our own functions and verl's.

Runs in verl's own environment (requirements/verl.txt: verl pins transformers < 5.11):
    /work/.venv-verl/bin/python -m pytest -q tests/engine/test_integration_verl.py
Without verl the module skips, unless TOKENCREDIT_REQUIRE_VERL=1 (the CI step sets it),
where a missing verl is a failure.

What is checked:
- registration happens where verl runs: a fresh process that only imports verl with
  VERL_USE_EXTERNAL_MODULES set, a fresh Ray actor, and the "verl.plugins" entry-point
  group; negative controls show that without the variable nothing is registered, that a
  bad module name fails loudly, and that a broken entry point fails SILENTLY (verl logs
  it at DEBUG), which is why the registry itself is inspected;
- advantages through verl's own `compute_advantage` dispatch equal advantages.py's
  exactly, on a shuffled batch whose uids are not contiguous; verl's built-in grpo/rloo
  agree with ours to float rounding, and its grpo_passk is a different method;
- losses: loss.policy_loss equals verl's built-in vanilla (with our dual_clip = 3, which
  verl always applies) and cispo to <= 1e-6 in value and 1e-7 in gradient under all four
  aggregations, GSPO under its own aggregation; the tc_ losses called through verl's
  registry with verl's global batch info (dp_size > 1) equal verl's built-ins too;
- the peer's numbers, many seeds (60 random batches: G = 2, 4, 8, all-equal groups, padded
  rows and rows with no token, T up to 600, log ratios past verl's +-20 clamp and past
  float32's overflow): verl's own grpo, Dr. GRPO, rloo and reinforce_plus_plus_baseline
  advantages, agg_loss, and vanilla, cispo and gspo losses against ours, with the known
  differences asserted as such (an all-equal group: 0 here, float residue or -m/s in verl;
  verl's seq-mean counts only non-empty rows; verl caps GSPO's sequence log ratio at 10). A
  verl upgrade that changes its math fails here first.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import verl  # noqa: F401
except ImportError:
    if os.environ.get("TOKENCREDIT_REQUIRE_VERL") == "1":
        raise
    pytest.skip("verl is not installed (its own env: requirements/verl.txt)", allow_module_level=True)

import numpy as np  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

import advantages as adv_lib  # noqa: E402
import aggregation  # noqa: E402
import loss as loss_lib  # noqa: E402
from integrations import verl_plugin  # noqa: E402,F401  (registers the tc_ names in this process)

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
EXPECTED_ADV = sorted(f"tc_{name}" for name in adv_lib.ADVANTAGES)
EXPECTED_LOSS = ["tc_cispo", "tc_gspo", "tc_ppo"]


# ---------------------------------------------------------------------------------------
# Registration in fresh processes
# ---------------------------------------------------------------------------------------

PROBE = ("import json, verl; from verl.trainer.ppo import core_algos as c; "
         "print(json.dumps([sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith('tc_')), "
         "sorted(k for k in c.POLICY_LOSS_REGISTRY if k.startswith('tc_'))]))")


def fresh(env_extra: dict, code: str = PROBE, pythonpath: str = REPO) -> subprocess.CompletedProcess:
    """Run `code` in a new interpreter of this env, from /, with only the given plugin settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath, **env_extra})
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True,
                          timeout=300)


def names_of(proc: subprocess.CompletedProcess) -> list:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_env_var_registers_in_a_fresh_process():
    adv, losses = names_of(fresh({"VERL_USE_EXTERNAL_MODULES": "integrations.verl_plugin"}))
    assert adv == EXPECTED_ADV and losses == EXPECTED_LOSS
    # Negative control: the same probe without the variable registers nothing.
    assert names_of(fresh({})) == [[], []]


def test_env_var_with_a_bad_module_fails_loudly():
    proc = fresh({"VERL_USE_EXTERNAL_MODULES": "integrations.no_such_plugin"})
    assert proc.returncode != 0 and "No module named 'integrations.no_such_plugin'" in proc.stderr


def write_entry_point(site, target: str) -> None:
    """A minimal installed distribution whose entry point in "verl.plugins" is `target`."""
    info = site / "tokencredit_verl_plugin-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokencredit-verl-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[verl.plugins]\ntokencredit = {target}\n")


def test_entry_point_registers_and_a_broken_one_is_silent(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_entry_point(good, "integrations.verl_plugin")
    write_entry_point(bad, "integrations.no_such_plugin")
    adv, losses = names_of(fresh({}, pythonpath=f"{good}{os.pathsep}{REPO}"))
    assert adv == EXPECTED_ADV and losses == EXPECTED_LOSS
    proc = fresh({}, pythonpath=f"{bad}{os.pathsep}{REPO}")
    assert names_of(proc) == [[], []]                       # verl imported fine, nothing registered
    assert "no_such_plugin" not in proc.stderr               # and nothing said so above DEBUG


RAY_PROBE = """
import json, os, ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)

@ray.remote(num_cpus=0)
class Probe:
    def names(self):
        from verl.trainer.ppo import core_algos as c
        return [os.getpid(), sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith("tc_")),
                sorted(k for k in c.POLICY_LOSS_REGISTRY if k.startswith("tc_"))]

inherit = Probe.remote()                                                  # the launcher's environment
cleared = Probe.options(runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": ""}}).remote()
print(json.dumps([os.getpid(), ray.get(inherit.names.remote()), ray.get(cleared.names.remote())]))
ray.shutdown()
"""


def test_fresh_ray_actor_sees_the_registered_names():
    """Set in the launching shell, the variable reaches Ray actors; cleared, nothing is there."""
    proc = fresh({"VERL_USE_EXTERNAL_MODULES": "integrations.verl_plugin", "RAY_DISABLE_USAGE_STATS": "1"},
                 code=RAY_PROBE)
    driver, (pid, adv, losses), (_, adv_cleared, losses_cleared) = names_of(proc)
    assert pid != driver                                     # really another process
    assert adv == EXPECTED_ADV and losses == EXPECTED_LOSS
    assert adv_cleared == [] and losses_cleared == []


# ---------------------------------------------------------------------------------------
# Advantages through verl's compute_advantage dispatch
# ---------------------------------------------------------------------------------------

def shuffled_batch(N: int = 6, G: int = 8, T: int = 9, seed: int = 0):
    """A DataProto of N groups x G rollouts in random row order (uids not contiguous).

    Binary outcome rewards on each response's last token, as verl's reward managers do;
    groups cover all-wrong, all-correct and mixed. Returns (data, rewards [N, G], rows
    [N, G]): rows[n, g] is the batch row of group n's g-th rollout.
    """
    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(N, G, generator=gen) < torch.linspace(0, 1, N).unsqueeze(1)).float()
    rewards[0], rewards[-1] = 0.0, 1.0
    perm = torch.randperm(N * G, generator=gen)
    # Rollout (n, g) sits at batch row rows[n, g]; inside a group, g follows the batch order
    # (as the plugin reads a group), so float sums run in the same order on both sides.
    rows = perm.view(N, G).sort(dim=1).values
    lengths = torch.randint(1, T + 1, (N * G,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    token_rewards = torch.zeros(N * G, T)
    flat_rows = rows.reshape(-1)
    token_rewards[flat_rows, lengths[flat_rows] - 1] = rewards.reshape(-1)
    uid = np.empty(N * G, dtype=object)
    for n in range(N):
        for g in range(G):
            uid[int(rows[n, g])] = f"prompt-{n}"
    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards, "response_mask": mask},
                               non_tensors={"uid": uid})
    return data, rewards, rows


def through_verl(estimator: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages [B, T], rewards [N, G], rows [N, G]) from verl's compute_advantage."""
    data, rewards, rows = shuffled_batch()
    out = compute_advantage(data, adv_estimator=estimator, config=AlgoConfig(), **kwargs)
    assert torch.equal(out.batch["returns"], out.batch["advantages"])
    return out.batch["advantages"], rewards, rows


def expected_tokens(adv: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(rows.numel())
    flat[rows.reshape(-1)] = adv.reshape(-1)
    return flat.unsqueeze(-1) * mask


@pytest.mark.parametrize("name", list(adv_lib.ADVANTAGES))
def test_dispatch_equals_our_advantages_exactly(name):
    got, rewards, rows = through_verl(f"tc_{name}")
    data, _, _ = shuffled_batch()
    want = expected_tokens(adv_lib.compute_advantages(name, rewards), rows, data.batch["response_mask"])
    assert torch.equal(got, want)
    if name in ("grpo", "mean", "rloo", "passk"):
        assert (want != 0).any()                 # mixed groups: not a 0 == 0 comparison


def test_verl_builtins_versus_ours():
    """verl's grpo, Dr. GRPO (no std) and rloo agree with ours to rounding; grpo_passk is another method."""
    data, rewards, rows = shuffled_batch()
    mask = data.batch["response_mask"]
    for builtin, ours, kwargs in (("grpo", "grpo", {}), ("grpo", "mean", {"norm_adv_by_std_in_grpo": False}),
                                  ("rloo", "rloo", {})):
        got, _, _ = through_verl(builtin, **kwargs)
        want = expected_tokens(adv_lib.compute_advantages(ours, rewards), rows, mask)
        # float32, two codes: measured 0, 0 and 6.0e-8 (AVX-512 and AVX2); another estimator
        # under the same name (below) is 0.52 away
        assert float((got - want).abs().max()) <= 1e-6, builtin
    got, _, _ = through_verl("grpo_passk")
    want = expected_tokens(adv_lib.compute_advantages("passk", rewards), rows, mask)
    assert float((got - want).abs().max()) > 0.1             # same word, different estimator


def test_unequal_groups_are_refused():
    data, _, _ = shuffled_batch()
    uid = data.non_tensor_batch["uid"].copy()
    uid[0] = "a-lone-rollout"
    with pytest.raises(ValueError, match="groups of equal size G.*'a-lone-rollout': 1"):
        verl_plugin.outcome_advantage("grpo", {}, data.batch["token_level_rewards"], data.batch["response_mask"],
                                      uid)


def test_registered_variant_with_fixed_hyper_parameters():
    verl_plugin.register_advantage("tc_fade_a2_d05", "fade", alpha=2.0, delta=0.5)
    got, rewards, rows = through_verl("tc_fade_a2_d05")
    data, _, _ = shuffled_batch()
    want = expected_tokens(adv_lib.fade(rewards, alpha=2.0, delta=0.5), rows, data.batch["response_mask"])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="takes no hyper-parameter 'beta'"):
        verl_plugin.register_advantage("tc_bad", "fade", beta=1.0)


# ---------------------------------------------------------------------------------------
# Losses: ours vs verl's built-ins
# ---------------------------------------------------------------------------------------

def loss_case(B: int = 12, T: int = 10, seed: int = 0):
    """Unequal lengths, ratios far from 1 (every clip fires, including dual clip at 3)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    old = -torch.rand(B, T, generator=gen) * 3
    logp = old + 1.2 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    return logp, old, adv, mask


def actor_config(**kw) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, **kw)


# The same loss computed by two codes rounds differently: values of up to 0.64 measured
# 2 float32 spacings apart (6e-8), gradients 6e-11, with AVX-512 and AVX2 kernels alike.
# The bounds leave >= 10x for another CPU; the real differences the tests below show
# (dual clip off, the sum divided by the wrong count) are 0.046 and 0.30.
SAME_VALUE, SAME_GRAD = 1e-6, 1e-7


def same_loss(v_a, g_a, v_b, g_b) -> bool:
    return abs(v_a - v_b) <= SAME_VALUE and float((g_a - g_b).abs().max()) <= SAME_GRAD


def value_and_grad(fn, logp):
    leaf = logp.clone().requires_grad_(True)
    value = fn(leaf)
    (grad,) = torch.autograd.grad(value, leaf)
    return float(value.detach()), grad


def ours(loss_type, agg, logp, old, adv, mask, dual_clip=None, max_len=None):
    cfg = loss_lib.LossConfig(loss_type=loss_type, eps_low=0.2, eps_high=0.28, dual_clip=dual_clip, agg=agg)
    norm = aggregation.step_normaliser(mask, max_len=max_len)
    a = adv if loss_type == "gspo" else adv.unsqueeze(1).expand_as(logp)
    return lambda leaf: loss_lib.policy_loss(leaf, old, a, mask, cfg, norm)[0]


def verls(mode, agg, old, adv, mask, config=None):
    fn = core_algos.get_policy_loss_fn(mode)
    config = config or actor_config()
    a = adv.unsqueeze(1) * mask
    return lambda leaf: fn(old_log_prob=old, log_prob=leaf, advantages=a, response_mask=mask, loss_agg_mode=agg,
                           config=config)[0]


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode, loss_type, dual_clip", [("vanilla", "ppo", 3.0), ("cispo", "cispo", None)])
def test_ppo_and_cispo_equal_verl(agg, mode, loss_type, dual_clip):
    logp, old, adv, mask = loss_case()
    v_ours, g_ours = value_and_grad(ours(loss_type, agg, logp, old, adv, mask, dual_clip), logp)
    v_verl, g_verl = value_and_grad(verls(mode, agg, old, adv, mask), logp)
    assert same_loss(v_ours, g_ours, v_verl, g_verl)
    # ... and our tc_ loss, called through verl's registry, is the same function.
    v_tc, g_tc = value_and_grad(verls(f"tc_{loss_type}", agg, old, adv, mask), logp)
    assert same_loss(v_tc, g_tc, v_verl, g_verl)
    assert float(g_verl.abs().max()) > 1e-3


def test_dual_clip_is_what_verl_vanilla_always_does():
    logp, old, adv, mask = loss_case()
    ratio = torch.exp(logp - old)
    assert bool(((ratio > 3) & (adv.unsqueeze(1) < 0) & (mask > 0)).any())     # the case exercises it
    v_verl, _ = value_and_grad(verls("vanilla", "token-mean", old, adv, mask), logp)
    v_off, _ = value_and_grad(ours("ppo", "token-mean", logp, old, adv, mask, dual_clip=None), logp)
    assert abs(v_off - v_verl) > 1e-3                        # without dual clip: a different loss (0.046)


def test_gspo_equals_verl_gspo():
    logp, old, adv, mask = loss_case()
    logp = old + 0.5 * (logp - old)          # sequence ratios near 1: some clipped, some not
    agg = "seq-mean-token-mean"
    v_ours, g_ours = value_and_grad(ours("gspo", agg, logp, old, adv, mask), logp)
    v_verl, g_verl = value_and_grad(verls("gspo", agg, old, adv, mask), logp)
    assert same_loss(v_ours, g_ours, v_verl, g_verl)
    v_tc, g_tc = value_and_grad(verls("tc_gspo", agg, old, adv, mask), logp)
    assert same_loss(v_tc, g_tc, v_verl, g_verl)
    assert float(g_verl.abs().max()) > 1e-3
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    clipped = ((adv > 0) & (s > 1.28)) | ((adv < 0) & (s < 0.8))
    assert clipped.any() and not clipped.all()
    with pytest.raises(ValueError, match="GSPO's objective is a mean over sequences"):
        verls("tc_gspo", "token-mean", old, adv, mask)(logp)


def test_seq_mean_token_sum_norm_divides_by_batch_times_length():
    """verl 0.9.1: sum / (global_batch_size * loss_scale_factor), the same as ours with max_len."""
    logp, old, adv, mask = loss_case()
    B, L = mask.shape[0], 16
    config = actor_config(loss_scale_factor=L)
    config.global_batch_info["loss_scale_factor"] = L
    v_verl, g_verl = value_and_grad(verls("vanilla", "seq-mean-token-sum-norm", old, adv, mask, config), logp)
    v_ours, g_ours = value_and_grad(ours("ppo", "seq-mean-token-sum-norm", logp, old, adv, mask, 3.0, max_len=L),
                                    logp)
    assert same_loss(v_ours, g_ours, v_verl, g_verl)
    v_sum, _ = value_and_grad(ours("ppo", "seq-mean-token-sum", logp, old, adv, mask, 3.0), logp)
    # measured 3.7e-9 apart (AVX-512 and AVX2); dividing by L alone, the control, 0.30
    assert v_verl == pytest.approx(v_sum / L, abs=SAME_VALUE)    # / (B * L): not / L alone (that would be B x)
    assert abs(v_verl - v_sum * B / L) > 1e-3


@pytest.mark.parametrize("agg", AGGS)
def test_global_batch_info_maps_to_our_step_normaliser(agg):
    """With dp_size = 2 and a step 3x this micro-batch, tc_ppo scales exactly as verl's vanilla."""
    logp, old, adv, mask = loss_case()
    config = actor_config()
    config.global_batch_info.update(dp_size=2, batch_num_tokens=float(3 * mask.sum()),
                                    global_batch_size=3 * mask.shape[0], loss_scale_factor=None)
    v_verl, g_verl = value_and_grad(verls("vanilla", agg, old, adv, mask, config), logp)
    v_tc, g_tc = value_and_grad(verls("tc_ppo", agg, old, adv, mask, config), logp)
    assert same_loss(v_tc, g_tc, v_verl, g_verl)
    v_local, _ = value_and_grad(verls("tc_ppo", agg, old, adv, mask), logp)
    # measured <= 5.0e-9 apart (AVX-512 and AVX2); the control, dp_size left out, 0.015-0.15
    assert abs(v_local * 2 / 3 - v_tc) <= SAME_VALUE       # n / dp_size = 1.5 x the micro-batch
    assert abs(v_local / 3 - v_tc) > 10 * SAME_VALUE       # negative control: dp_size left out


def test_rollout_correction_weights_are_refused():
    logp, old, adv, mask = loss_case()
    fn = core_algos.get_policy_loss_fn("tc_ppo")
    with pytest.raises(ValueError, match="rollout_is_weights"):
        fn(old_log_prob=old, log_prob=logp, advantages=adv.unsqueeze(1) * mask, response_mask=mask,
           config=actor_config(), rollout_is_weights=torch.ones_like(mask))


# ---------------------------------------------------------------------------------------
# The peer's numbers: verl's own functions and ours on the same random inputs, many seeds
# ---------------------------------------------------------------------------------------

PEER_SEEDS = range(60)


def peer_batch(seed: int):
    """N groups of G (G in 2, 4, 8) in random row order, T up to 600 on every fifth seed,
    padded rows (masks with zeros; a row with no token on every fourth seed), binary rewards
    on odd seeds and continuous ones on even seeds, every batch with an all-equal group.
    Returns (token_level_rewards [B, T], mask [B, T], uid [B], rewards [N, G], rows [N, G])."""
    gen = torch.Generator().manual_seed(1000 + seed)
    G = (2, 4, 8)[seed % 3]
    N = int(torch.randint(2, 7, (1,), generator=gen))
    T = int(torch.randint(2, 600 if seed % 5 == 0 else 16, (1,), generator=gen))
    B = N * G
    if seed % 2:
        rewards = (torch.rand(N, G, generator=gen) < 0.5).float()
    else:
        rewards = torch.rand(N, G, generator=gen).round(decimals=2)
    rewards[0] = rewards[0, 0]                                       # an all-equal group
    rows = torch.randperm(B, generator=gen).view(N, G).sort(dim=1).values
    lengths = torch.randint(0 if seed % 4 == 0 else 1, T + 1, (B,), generator=gen)
    lengths[rows[-1, 0]] = max(int(lengths[rows[-1, 0]]), 2)         # at least 2 tokens in the batch
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    token_rewards = torch.zeros(B, T)
    token_rewards[rows.reshape(-1), (lengths[rows.reshape(-1)] - 1).clamp(min=0)] = rewards.reshape(-1)
    uid = np.empty(B, dtype=object)
    for n in range(N):
        uid[rows[n].numpy()] = f"p{n}"
    return token_rewards, mask, uid, rewards, rows


def largest(x: torch.Tensor) -> float:
    """max |x|, 0 for an empty tensor."""
    return float(x.abs().max()) if x.numel() else 0.0


def per_rollout(adv_tokens: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """verl's [B, T] advantages back to [N, G]: each row's value on its tokens (0 for a row with none)."""
    flat = (adv_tokens * mask).sum(1) / mask.sum(1).clamp(min=1)
    return flat[rows]


# Two float32 codes: measured <= 4.8e-7 apart over these batches (AVX-512 and AVX2), the
# ratio of two std's rounding (1.2e-7 relative) times advantages up to 2.6; a wrong
# estimator (rloo for mean, per rollout for per token) is >= 0.044 away.
PEER_ADV = 5e-6


def test_verl_advantages_equal_ours_on_many_batches():
    """verl's grpo (with and without the std: Dr. GRPO), rloo and reinforce_plus_plus_baseline
    (the REINFORCE++ equation, our reinforce_pp with whiten="token") against ours, 60 batches.
    Known differences, asserted as such: an all-equal group is exactly 0 here, float residue
    in verl where the rewards are not binary (the mean of 0.37 four times is not 0.37) and
    -m/s under verl's reinforce_plus_plus_baseline (its token mean shifts every rollout)."""
    residue = 0.0
    for seed in PEER_SEEDS:
        token_rewards, mask, uid, rewards, rows = peer_batch(seed)
        constant = (rewards.max(1).values == rewards.min(1).values)
        lengths = mask.sum(1)[rows]
        for fn, kwargs, ours in (
                (core_algos.compute_grpo_outcome_advantage, {}, adv_lib.grpo(rewards)),
                (core_algos.compute_grpo_outcome_advantage, {"norm_adv_by_std_in_grpo": False}, adv_lib.mean(rewards)),
                (core_algos.compute_rloo_outcome_advantage, {}, adv_lib.rloo(rewards)),
                (core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage, {},
                 adv_lib.compute_advantages("reinforce_pp", rewards, lengths=lengths, whiten="token", eps=1e-12))):
            theirs, _ = fn(token_level_rewards=token_rewards.clone(), response_mask=mask, index=uid, **kwargs)
            theirs = per_rollout(theirs, mask, rows)
            has_tokens = lengths > 0
            mixed = ~constant.unsqueeze(1) & has_tokens
            if fn is core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage:
                # verl: (x - m) rsqrt(var + 1e-8), ours here (x - m) / (std + 1e-12): verl's guard
                # moves a value by 5e-9 / var relative, measured <= 1.5e-6 over these batches
                assert torch.allclose(theirs[mixed], ours[mixed], rtol=2e-5, atol=PEER_ADV), seed
            else:
                assert largest((theirs - ours)[mixed]) <= PEER_ADV, (seed, fn.__name__, kwargs)
                residue = max(residue, largest(theirs[constant]))
            assert (ours[constant] == 0).all()
    assert 0 < residue < 0.5        # verl's float residue on an all-equal group: measured 0.056 (ours: 0)


def test_verl_reinforce_pp_is_the_token_form_not_ours_by_default():
    """Negative control: at unequal lengths our default (per rollout) is not verl's reinforce_plus_plus_baseline."""
    token_rewards, mask, uid, rewards, rows = peer_batch(1)
    theirs = per_rollout(core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_level_rewards=token_rewards.clone(), response_mask=mask, index=uid)[0], mask, rows)
    gap = (theirs - adv_lib.compute_advantages("reinforce_pp", rewards)).abs().max()
    assert float(gap) > 0.05


@pytest.mark.parametrize("agg", AGGS)
def test_verl_agg_loss_equals_aggregate(agg):
    """verl's agg_loss against aggregation.aggregate on 60 random loss matrices. verl's seq-mean
    modes count only the rows with a token (global_batch_size = non-empty rows); ours divide
    by the step's rows: equal once n_seqs counts what verl counts (the plugin's verl_step_norm
    does), and a named difference (B / B_nonempty) with step_normaliser's own count."""
    differs = 0
    for seed in PEER_SEEDS:
        _, mask, _, _, _ = peer_batch(seed)
        loss_mat = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed))
        theirs = float(core_algos.agg_loss(loss_mat, mask, agg))
        nonempty = float((mask.sum(1) > 0).sum())
        norm = aggregation.StepNorm(n_tokens=float(mask.sum()), n_seqs=nonempty, max_len=float(mask.shape[1]))
        # float32 sums in two orders, and verl's 1e-8 in 1/(|o_i| + 1e-8): measured <= 6.0e-7
        # (AVX-512 and AVX2); the named difference below is >= 5.7e-4 where it acts
        assert abs(float(aggregation.aggregate(loss_mat, mask, agg, norm)) - theirs) <= 1e-5, (seed, agg)
        ours_own = float(aggregation.aggregate(loss_mat, mask, agg, aggregation.step_normaliser(mask)))
        differs += abs(ours_own - theirs) > 1e-5
    assert differs == (0 if agg == "token-mean" else sum((peer_batch(s)[1].sum(1) == 0).any() for s in PEER_SEEDS))


def random_losses(seed: int):
    """A loss case with log ratios up to +-3, and on every third seed some past verl's clamp
    (+-25) and past float32 exp's overflow (+100); log-probs and old log-probs stay <= 0."""
    _, mask, _, _, _ = peer_batch(seed)
    gen = torch.Generator().manual_seed(2000 + seed)
    B, T = mask.shape
    log_ratio = (0.5 + seed % 3) * torch.randn(B, T, generator=gen).clamp(-3, 3)
    if seed % 3 == 0:
        log_ratio += 25.0 * (torch.rand(B, T, generator=gen) < 0.05) * torch.randn(B, T, generator=gen).sign()
        log_ratio += 100.0 * (torch.rand(B, T, generator=gen) < 0.02)
    base = -3 * torch.rand(B, T, generator=gen)
    logp, old = base + log_ratio.clamp(max=0), base - log_ratio.clamp(min=0)
    adv = torch.randn(B, generator=gen)
    mask[mask.sum(1) == 0, 0] = 1.0                      # every rollout one token at least: verl's GSPO divides by it
    return logp, old, adv, mask


@pytest.mark.parametrize("mode, loss_type, dual_clip", [("vanilla", "ppo", 3.0), ("cispo", "cispo", None)])
def test_verl_policy_losses_equal_ours_on_many_batches(mode, loss_type, dual_clip):
    """verl's vanilla (dual clip 3) and cispo against loss.policy_loss, 60 batches x 4 aggregations,
    log ratios past +-20 and past exp's overflow on every third batch: verl clamps the log ratio
    at +-20, and so do we (loss.token_log_ratio), so values and gradients agree there too
    (without the clamp our gradient was NaN past 88.7)."""
    extreme = 0
    for seed in PEER_SEEDS:
        logp, old, adv, mask = random_losses(seed)
        extreme += bool((((logp - old) > 88.8) & (mask > 0)).any())
        for agg in AGGS:
            v_ours, g_ours = value_and_grad(ours(loss_type, agg, logp, old, adv, mask, dual_clip), logp)
            v_verl, g_verl = value_and_grad(verls(mode, agg, old, adv, mask), logp)
            assert torch.isfinite(g_ours).all()
            # values up to 241 past the clamp (e^20 x a token's share): measured <= 4.5e-7
            # relative, gradients <= 9.3e-10 (AVX-512 and AVX2); dual clip off is 0.046 away
            assert abs(v_ours - v_verl) <= 1e-5 * max(1.0, abs(v_verl)), (seed, agg, v_ours, v_verl)
            assert float((g_ours - g_verl).abs().max()) <= SAME_GRAD * max(1.0, float(g_verl.abs().max())), (seed, agg)
    assert extreme >= 5                                      # 8 of the 60 batches, seeded


def test_verl_gspo_equals_ours_on_many_batches_and_caps_its_ratio_at_e10():
    """GSPO, sequence ratios near 1 (GSPO's own range), 60 batches: equal. A named difference:
    verl caps the sequence log ratio at 10, ours at 20 (loss.gspo_sequence_ratio), so an A < 0
    rollout whose sequence ratio is past e^10 weighs e^10 in verl and its own ratio here."""
    agg = "seq-mean-token-mean"
    for seed in PEER_SEEDS:
        logp, old, adv, mask = random_losses(seed)
        logp = old + 0.01 * (logp - old).clamp(-3, 3)
        v_ours, g_ours = value_and_grad(ours("gspo", agg, logp, old, adv, mask), logp)
        v_verl, g_verl = value_and_grad(verls("gspo", agg, old, adv, mask), logp)
        assert same_loss(v_ours, g_ours, v_verl, g_verl), seed
    logp, old, adv, mask = random_losses(1)
    adv = -adv.abs()
    far = old + 15.0                                                     # sequence log ratio 15
    v_ours, _ = value_and_grad(ours("gspo", agg, far, old, adv, mask), far)
    v_verl, _ = value_and_grad(verls("gspo", agg, old, adv, mask), far)
    assert v_ours == pytest.approx(math.exp(5.0) * v_verl, rel=1e-5)   # e^15 against e^10
