"""verl plugin: this project's advantages and policy losses in verl's own registries.

verl (ByteDance, pinned at 0.9.1 in requirements/verl.txt) picks the advantage by name,
`algorithm.adv_estimator=NAME`, from `core_algos.ADV_ESTIMATOR_REGISTRY`, and the policy
loss by name, `actor_rollout_ref.actor.policy_loss.loss_mode=NAME`, from
`core_algos.POLICY_LOSS_REGISTRY`. Importing this module fills both with prefixed names:

    tc_<name>   for every advantage in advantages.ADVANTAGES, with its default
                hyper-parameters (tc_grpo, tc_mean, tc_rloo, tc_passk (k = 4), tc_fade
                (alpha = 1, delta = 1), ...); `register_advantage` adds variants with
                other fixed hyper-parameters, e.g. a fade at alpha 2, delta 0.5;
    tc_ppo, tc_cispo, tc_gspo   loss.policy_loss with loss_type ppo / cispo / gspo.

Where the registration must happen. verl computes advantages and losses inside Ray
actors, not in the launching script, so registering in the script does nothing there.
verl imports plugins itself in every process that imports verl, two ways:
  - VERL_USE_EXTERNAL_MODULES=integrations.verl_plugin (with the repository on
    PYTHONPATH): `import verl` imports the module, and an import error is LOUD (verl's
    import fails);
  - an entry point in the group "verl.plugins" of an installed distribution: a failing
    one is logged at DEBUG level only and verl goes on without the names.
Ray workers inherit the environment of the process that started Ray, so set the
variables before `python -m verl.trainer.main_ppo`. tests/engine/test_integration_verl.py
proves the registration in fresh processes and in a fresh Ray actor.

The advantage call. verl passes token_level_rewards [B, T] (the outcome reward sits on
the last response token), response_mask [B, T] and index = the rollouts' uids (a numpy
object array; the batch is NOT ordered by group and a group's rollouts need not be
adjacent). We sum the rewards over T (verl's outcome estimators do the same), gather
the rows of each uid into [N, G] (uids in order of first appearance, rows in batch
order), call advantages.compute_advantages, scatter the result back to the rows and
broadcast it over the response tokens: advantages = returns = A_b * response_mask[b].
Groups of unequal size are refused (our advantages take [N, G]).

The loss call. verl passes old_log_prob, log_prob, advantages [B, T], response_mask,
loss_agg_mode and the actor config; `config.global_batch_info` holds the optimizer
step's totals (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor). verl
divides a rank's micro-batch loss by the global totals and multiplies by dp_size (the
data-parallel all-reduce averages over ranks), so our StepNorm for one rank is
n_tokens = batch_num_tokens / dp_size, n_seqs = global_batch_size / dp_size and
max_len = loss_scale_factor (else the response width T), exactly the step-fixed
normaliser of aggregation.py. Without global info (a direct call) the micro-batch's
own totals are used, counting only sequences with a token, as verl's agg_loss does.
Clip ranges come from actor.clip_ratio_low / clip_ratio_high; tc_ppo applies dual clip
with actor.clip_ratio_c (default 3.0) because verl's vanilla loss always does (verl
requires c > 1; set a huge c to switch it off). tc_gspo refuses every aggregation but
seq-mean-token-mean (set actor.loss_agg_mode accordingly; verl's gspo accepts any).
Rollout-correction weights (rollout_is_weights) are refused: loss.py has no such term.

Not covered (no hook in verl 0.9.1): the FADE schedule (the estimator never sees the
entropy; tc_fade runs at fixed alpha and delta), query-preserving mini-batches (verl
forms PPO mini-batches without looking at uids), and DFPO (the loss call gets no uids).
Project files need only torch and the standard library, so they import in verl's env.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo import core_algos

import advantages as adv_lib
import aggregation
import loss as loss_lib

PREFIX = "tc_"


# ---------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------

def outcome_advantage(name: str, hyper: dict, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                      index=None, **unused) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature around advantages.compute_advantages(name, ., **hyper).

    token_level_rewards, response_mask: [B, T]; index: [B] uids (any hashable, any
    order). Returns (advantages, returns), both [B, T] = A_b * response_mask[b, t].
    `unused` takes verl's other keywords (config, reward_baselines, ...).
    """
    if index is None:
        raise ValueError(f"{PREFIX}{name}: needs the rollouts' uids (verl's non_tensor_batch['uid'])")
    scores = token_level_rewards.sum(dim=-1)                       # [B] outcome reward
    rows = group_rows(index)                                       # [N, G] batch rows
    lengths = response_mask.sum(dim=-1).to(scores.dtype)[rows]     # [N, G] response tokens (reinforce_pp's "token")
    adv = adv_lib.compute_advantages(name, scores[rows], lengths=lengths, **hyper)  # [N, G]
    flat = torch.empty_like(scores)
    flat[rows.reshape(-1)] = adv.reshape(-1)
    out = flat.unsqueeze(-1) * response_mask
    return out, out


def group_rows(index) -> torch.Tensor:
    """[N, G] LongTensor: row n lists the batch rows of the n-th distinct uid, in batch order.

    Example: index ["b", "a", "b", "a"] -> [[0, 2], [1, 3]]. Unequal group sizes: ValueError.
    """
    groups: dict = {}
    for row, uid in enumerate(list(index)):
        groups.setdefault(uid, []).append(row)
    sizes = {len(rows) for rows in groups.values()}
    if len(sizes) != 1:
        by_size = {len(rows): uid for uid, rows in groups.items()}
        raise ValueError("tokencredit advantages need groups of equal size G; got uid sizes "
                         + ", ".join(f"{uid!r}: {size}" for size, uid in sorted(by_size.items())))
    return torch.tensor(list(groups.values()), dtype=torch.long)


def register_advantage(verl_name: str, name: str, **hyper) -> None:
    """Register advantages.ADVANTAGES[name] with fixed hyper-parameters under verl_name.

    Example: register_advantage("tc_fade_a2_d05", "fade", alpha=2.0, delta=0.5). The
    hyper-parameters are checked now (one call on a mixed binary group of size 8), not
    in the first training step. Call it from your own plugin module so that it runs in
    every process (see the module header).
    """
    adv_lib.compute_advantages(name, torch.tensor([[1.0, 0.0] * 4]), lengths=torch.ones(1, 8), **hyper)

    def estimator(token_level_rewards, response_mask, index=None, **unused):
        return outcome_advantage(name, hyper, token_level_rewards, response_mask, index)

    estimator.__name__ = verl_name
    estimator.__doc__ = f"advantages.{name}{' with ' + str(hyper) if hyper else ''}, as a verl estimator."
    core_algos.register_adv_est(verl_name)(estimator)


# ---------------------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------------------

def policy_loss(loss_type: str, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                rollout_is_weights=None) -> tuple[torch.Tensor, dict]:
    """verl's policy-loss signature around loss.policy_loss (returns (loss, metrics)).

    advantages [B, T] from verl; GSPO takes one per rollout, read as the masked token
    mean (verl's outcome advantages are constant over a response). The metrics use
    verl's keys: actor/pg_clipfrac (low + high), actor/pg_clipfrac_lower (dual clip),
    actor/ppo_kl (mean of log pi_old - log pi, verl's k1).
    """
    if rollout_is_weights is not None:
        raise ValueError(f"{PREFIX}{loss_type}: rollout correction weights (rollout_is_weights) are not supported")
    if config is None:
        raise ValueError(f"{PREFIX}{loss_type}: needs verl's actor config")
    mask = response_mask.to(log_prob.dtype)
    eps_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    eps_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    cfg = loss_lib.LossConfig(loss_type=loss_type, eps_low=eps_low, eps_high=eps_high, agg=loss_agg_mode,
                              dual_clip=config.get("clip_ratio_c", 3.0) if loss_type == "ppo" else None)
    adv = advantages
    if loss_type == "gspo":
        adv = (advantages * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    loss, stats = loss_lib.policy_loss(log_prob, old_log_prob, adv, mask, cfg, verl_step_norm(mask, config))
    metrics = {
        "actor/pg_clipfrac": stats["clip_frac_low"] + stats["clip_frac_high"],
        "actor/pg_clipfrac_lower": stats["clip_frac_dual"],
        "actor/ppo_kl": float(((old_log_prob - log_prob).detach() * mask).sum() / mask.sum().clamp(min=1)),
    }
    return loss, metrics


def verl_step_norm(mask: torch.Tensor, config) -> aggregation.StepNorm:
    """aggregation.StepNorm for one data-parallel rank from verl's config.global_batch_info.

    n_tokens = batch_num_tokens / dp_size, n_seqs = global_batch_size / dp_size,
    max_len = loss_scale_factor or T; missing totals fall back to this micro-batch's
    (tokens, and sequences with at least one token). See the module header for why.
    """
    info = dict(getattr(config, "global_batch_info", None) or {})
    dp = float(info.get("dp_size") or 1)
    tokens, seqs = info.get("batch_num_tokens"), info.get("global_batch_size")
    n_tokens = float(mask.sum()) if tokens is None else float(tokens) / dp
    n_seqs = float((mask.sum(dim=-1) > 0).sum()) if seqs is None else float(seqs) / dp
    scale = info.get("loss_scale_factor") or getattr(config, "loss_scale_factor", None)
    return aggregation.StepNorm(n_tokens=n_tokens, n_seqs=n_seqs, max_len=float(scale or mask.shape[-1]))


def _register_loss(loss_type: str) -> None:
    def verl_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                  rollout_is_weights=None):
        return policy_loss(loss_type, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                           rollout_is_weights)

    verl_loss.__name__ = f"{PREFIX}{loss_type}"
    verl_loss.__doc__ = f"loss.policy_loss with loss_type={loss_type!r}, as a verl policy loss."
    core_algos.register_policy_loss(f"{PREFIX}{loss_type}")(verl_loss)


# ---------------------------------------------------------------------------------------
# What importing this module does
# ---------------------------------------------------------------------------------------

for _name in adv_lib.ADVANTAGES:
    register_advantage(f"{PREFIX}{_name}", _name)
for _loss_type in loss_lib.LOSS_TYPES:            # every registered surrogate --loss_type picks
    _register_loss(_loss_type)
