"""TRL's GRPOTrainer with this project's advantages, the FADE schedule and group-keeping batches.

TRL (Hugging Face, pinned at 1.16.0 in requirements/trl.txt) scales GRPO out with
accelerate and DeepSpeed. Three things this project studies are fixed inside its
GRPOTrainer, and this module swaps each for ours without copying a TRL method body:

1. The advantage. TRL computes it inline in `_generate_and_score_completions`: group
   mean, std (scale_rewards), then each process keeps its own slice of the rollouts.
   There is no hook, so we post-process that method's output. The rewards gathered
   from ALL processes are captured where TRL computes them (`_calculate_rewards`
   returns them gathered), the advantage is recomputed from them with any function of
   `advantages.ADVANTAGES` (`advantages.compute_advantages`), and this process keeps
   the same slice TRL kept: rows [rank * B_local, (rank + 1) * B_local).
   Why recompute from the gathered rewards: a group's G rollouts can sit on different
   processes, and a per-process advantage would see half a group.
2. The FADE schedule (scheduler.AdvantageScheduler): it needs the batch solve rate
   (the mean gathered reward) and the mean token entropy. TRL already measures the
   global token-weighted mean entropy in every `_compute_loss` call and logs it as
   metric "entropy"; we read that number, so no extra forward pass is spent on it
   except once, on the very first batch, when nothing has been trained yet.
   It is one generation batch late: the advantages of batch k use the entropy
   measured while training on batch k-1. For the EMA this does not matter: with
   ema_beta = 0.02, H_hat moves by ema_beta * (H - H_hat) per step, so reading H_{k-1}
   instead of H_k changes H_hat by ema_beta * (H_{k-1} - H_k), 2% of one step's entropy
   change, while the EMA itself averages over ~1/ema_beta = 50 steps. (With a large
   ema_beta, or the "source" EMA convention that keeps only ema_beta of the old value,
   the lag would be felt; train.py, which measures the batch itself, has no lag.)
3. Mini-batches. With steps_per_generation > gradient_accumulation_steps, one
   generation batch feeds several optimizer steps. TRL's `_prepare_inputs` shuffles
   the individual rollouts and cuts them into steps_per_generation chunks, which
   splits nearly every group across optimizer steps and, per the Cancellation
   Hypothesis (batching.py), undoes the cancellation of shared tokens. With
   `minibatch_mode` set, we re-split TRL's buffered chunks with
   `batching.minibatch_indices` ("query" keeps groups whole, "balanced", ...): right
   after TRL filled its buffer we put the rollouts back in prompt-major order (by a
   `rollout_ids` column we added), form the optimizer steps, and cut each step into
   gradient_accumulation_steps micro-batches. TRL's generation timing is untouched.

Every batch also carries `rollout_ids` (the rollout's flat index b = n * G + g in the
generation batch of ALL processes, prompt-major as in the rest of the project) and
`group_ids` (b // G, its prompt's index there): both survive TRL's shuffle and split
and reach `_compute_loss`. They restart at 0 with every generation batch.

What is NOT changed: TRL's loss (`loss_type`, epsilon, delta, ...; the README maps its
flags to ours), generation, reward functions, logging. Text-only: a batch with
pixel_values is refused when minibatch_mode is set. Not resumable bit for bit: the
scheduler state and the batching generator are not written into TRL checkpoints.

Usage:
    trainer = TokencreditGRPOTrainer(model, reward_funcs=f, args=GRPOConfig(...),
                                     train_dataset=ds, advantage="fade",
                                     schedule=SchedulerConfig(), minibatch_mode="query")
    python -m integrations.trl_example --steps 3      # the embedded model, on CPU
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

import advantages as adv_lib
import batching
from scheduler import SCHEDULED, AdvantageScheduler, SchedulerConfig, step_hyper


class TokencreditGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages, FADE knobs and mini-batches come from this project.

    Extra keyword arguments (everything else goes to GRPOTrainer unchanged):
      advantage: a name in advantages.ADVANTAGES ("grpo", "mean", "rloo", "fade", ...).
      advantage_kwargs: its hyper-parameters by parameter name (e.g. {"k": 4} for passk),
        defaults otherwise; for "fade" with a moving schedule ("fade", "decay") alpha and
        delta come from the schedule and may not be given.
      schedule: a scheduler.SchedulerConfig (needs advantage="fade"); None = no schedule.
      minibatch_mode: None (TRL's own shuffle-and-split) or one of batching.MODES.
    After each training generation batch, `self.tokencredit_log` gets one dict
    {"global_step", "solve_rate", "entropy" (fed to the scheduler, or None), "alpha",
    "delta", ...}; the same numbers go to TRL's metrics under "tokencredit/...".
    """

    def __init__(self, *args, advantage: str = "grpo", advantage_kwargs: dict | None = None,
                 schedule: SchedulerConfig | None = None, minibatch_mode: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tc_advantage = advantage
        self.tc_advantage_kwargs = dict(advantage_kwargs or {})
        self.tc_scheduler = None if schedule is None else AdvantageScheduler(schedule)
        self.tc_minibatch_mode = minibatch_mode
        self.tc_knobs: dict = {}                # alpha/delta of the last scheduled batch
        self.tc_entropies: list[float] = []     # TRL's logged entropy per micro-batch since the last generation
        self.tc_generator = torch.Generator().manual_seed(self.args.seed)
        self.tokencredit_log: list[dict] = []
        self._tc_rewards_per_func = None
        self._tc_check_setup()

    # -----------------------------------------------------------------------------------
    # Checks at the door, once
    # -----------------------------------------------------------------------------------

    def _tc_check_setup(self) -> None:
        G, args = self.num_generations, self.args
        if self.tc_advantage not in adv_lib.ADVANTAGES:
            raise ValueError(f"unknown advantage {self.tc_advantage!r}; choose from {', '.join(adv_lib.ADVANTAGES)}")
        if self.tc_scheduler is not None:
            if self.tc_advantage != "fade":
                raise ValueError(f"a schedule drives the 'fade' advantage's alpha and delta; "
                                 f"got advantage={self.tc_advantage!r}")
            given = set(SCHEDULED) & set(self.tc_advantage_kwargs)
            if given and self.tc_scheduler.config.schedule != "constant":
                raise ValueError(f"with a schedule, {sorted(given)} come from the scheduler; "
                                 "drop them from advantage_kwargs")
        # One trial call on a mixed binary group of this G: unknown hyper-parameters and
        # out-of-range ones (passk's k > G, ...) fail here, not in the first training step.
        trial = torch.tensor([[float(g % 2) for g in range(G)]])
        adv_lib.compute_advantages(self.tc_advantage, trial, lengths=torch.ones_like(trial), **self.tc_advantage_kwargs)
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("TokencreditGRPOTrainer recomputes advantages from the weighted reward sum, i.e. "
                             "multi_objective_aggregation='sum_then_normalize'; got "
                             f"{args.multi_objective_aggregation!r}")
        mode = self.tc_minibatch_mode
        if mode is None:
            return
        if mode not in batching.MODES:
            raise ValueError(f"unknown minibatch_mode {mode!r}; expected None or one of {batching.MODES}")
        if mode in batching.RECENTRED and not adv_lib.ADVANTAGES[self.tc_advantage].zero_sum:
            raise ValueError(f"minibatch_mode {mode!r} re-centres each group's part of a step to zero sum, which "
                             f"would undo advantage {self.tc_advantage!r}'s imbalance; use a zero-sum advantage")
        spg, ga = args.steps_per_generation, args.gradient_accumulation_steps
        if spg % ga:
            raise ValueError(f"minibatch_mode needs steps_per_generation ({spg}) to be a multiple of "
                             f"gradient_accumulation_steps ({ga}): each generation batch must feed whole "
                             "optimizer steps")
        local = args.per_device_train_batch_size * spg
        if local % G:
            raise ValueError(f"minibatch_mode needs each process's generation batch (per_device_train_batch_size * "
                             f"steps_per_generation = {local}) to hold whole groups of num_generations={G}")
        if mode in ("query", "query_balanced") and local // G < spg // ga:
            raise ValueError(f"minibatch_mode {mode!r} keeps groups whole, so each process needs at least as many "
                             f"groups ({local // G}) as optimizer steps per generation ({spg // ga})")

    # -----------------------------------------------------------------------------------
    # 1 + 2. Advantages (and the FADE knobs) from the rewards of all processes
    # -----------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, [B_global, n_funcs], gathered from every process; kept for below."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tc_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's batch, with `advantages` replaced by ours and `group_ids`/`rollout_ids` added.

        rewards [N_global, G] = (weighted sum over reward functions, as TRL) viewed
        prompt-major; A = compute_advantages(name, rewards, **hyper) [N_global, G] (with the
        gathered completion lengths for an advantage that reads them: reinforce_pp's "token");
        this process keeps the flat rows [rank * B_local, (rank + 1) * B_local).
        A rollout that no reward function scored (TRL's NaN, whose advantage TRL sets
        to 0) is refused: our advantages need every reward.
        """
        out = super()._generate_and_score_completions(inputs)
        training = self.model.training
        G = self.num_generations if training else self.num_generations_eval
        per_func = self._tc_rewards_per_func
        unscored = torch.isnan(per_func).all(dim=1)
        if unscored.any():
            raise ValueError(f"rollout {int(unscored.nonzero()[0])}: every reward function returned None; "
                             "tokencredit's advantages need a reward for every rollout")
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards = rewards.view(-1, G).cpu()

        if self.tc_scheduler is not None and training:
            self.tc_knobs = self._tc_schedule_step(rewards, out)
        hyper = step_hyper(self.tc_advantage_kwargs, self.tc_knobs)     # the same rule as train.py's
        lengths = None
        if adv_lib.ADVANTAGES[self.tc_advantage].reads_lengths:       # reinforce_pp: every process's tokens
            lengths = self.accelerator.gather(out["completion_mask"].sum(dim=1)).view(-1, G).float().cpu()
        adv_all = adv_lib.compute_advantages(self.tc_advantage, rewards, lengths=lengths, **hyper).reshape(-1)

        local = out["advantages"]
        start = self.accelerator.process_index * local.shape[0]
        rows = torch.arange(start, start + local.shape[0])
        out["advantages"] = adv_all[rows].to(device=local.device, dtype=local.dtype)
        out["rollout_ids"] = rows.to(local.device)
        out["group_ids"] = (rows // G).to(local.device)

        # TRL's completions table logged its own advantages; show the ones trained on.
        logged = self._logs["advantages"]
        for _ in range(min(len(adv_all), len(logged))):
            logged.pop()
        logged.extend(adv_all.tolist())
        return out

    def _tc_schedule_step(self, rewards, out) -> dict:
        """One scheduler step: the gathered solve rate and TRL's last measured entropy.

        entropy = mean over the micro-batches trained since the previous generation of
        TRL's logged global token-mean entropy (one generation batch late, see the
        module header). The first batch has none yet: one no-grad forward over it,
        reduced over processes the way TRL reduces its own metric.
        """
        if self.tc_entropies:
            entropy = sum(self.tc_entropies) / len(self.tc_entropies)
        else:
            entropy = self._tc_measure_entropy(out)
        self.tc_entropies = []
        solve_rate = float(rewards.mean())
        knobs = self.tc_scheduler.step(solve_rate, entropy)
        self.tokencredit_log.append({"global_step": self.state.global_step, "solve_rate": solve_rate,
                                     "entropy": entropy, **knobs})
        for key, value in {"solve_rate": solve_rate, "entropy_in": entropy, **knobs}.items():
            self._metrics["train"][f"tokencredit/{key}"].append(value)
        return knobs

    def _tc_measure_entropy(self, out) -> float:
        """Global token-mean entropy of this batch under the current weights (text models)."""
        mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        with torch.no_grad():
            _, entropy, _ = self._get_per_token_logps_and_entropies(
                self.model, torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1),
                torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1), out["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size, compute_entropy=True)
        totals = torch.stack([(entropy * mask).sum(), mask.sum().float()])
        totals = self.accelerator.reduce(totals, reduction="sum")
        return float(totals[0] / totals[1].clamp(min=1.0))

    def _compute_loss(self, model, inputs):
        """TRL's loss, unchanged; afterwards we keep the entropy TRL just logged for FADE."""
        loss = super()._compute_loss(model, inputs)
        if self.model.training:
            self.tc_entropies.append(self._metrics["train"]["entropy"][-1])
        return loss

    # -----------------------------------------------------------------------------------
    # 3. Optimizer steps that keep groups whole
    # -----------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering; when it just generated and minibatch_mode is set, re-split.

        TRL's buffer is a list of steps_per_generation micro-batches, served one per
        call (index self._step % steps_per_generation); consecutive
        gradient_accumulation_steps of them make one optimizer step. We rebuild that
        list so optimizer step s holds exactly the rollouts of minibatch_indices' step s.
        """
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.tc_minibatch_mode is None or not self.model.training or self._buffered_inputs is before:
            return inputs
        self._buffered_inputs = self._tc_resplit(self._buffered_inputs)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _tc_resplit(self, chunks: list[dict]) -> list[dict]:
        """TRL's shuffled micro-batches -> ours: prompt-major, split by batching.minibatch_indices.

        chunks: steps_per_generation dicts of equal-width tensors. Returns as many dicts:
        optimizer step s (of k = steps_per_generation / gradient_accumulation_steps)
        is cut into gradient_accumulation_steps consecutive micro-batches of its sorted
        indices (sizes differ by at most one rollout; balanced mode may make steps of
        unequal size, see batching.py).
        """
        if any("pixel_values" in c for c in chunks):
            raise ValueError("minibatch_mode supports text batches only (this batch has pixel_values)")
        whole = _concat(chunks)
        ids = whole["rollout_ids"]
        whole = _take(whole, torch.argsort(ids))        # back to prompt-major order
        G = self.num_generations
        adv = whole["advantages"].detach().cpu().view(-1, G)
        lengths = whole["completion_mask"].sum(dim=1).cpu().view(-1, G)
        n_steps = self.args.steps_per_generation // self.args.gradient_accumulation_steps
        steps = batching.minibatch_indices(adv, n_steps, self.tc_minibatch_mode, self.tc_generator, lengths)
        for step in steps:          # random_recentred: each group's part of a step re-centred (else unchanged)
            whole["advantages"] = batching.step_advantages(whole["advantages"], step.to(ids.device), G,
                                                           self.tc_minibatch_mode)
        self._metrics["train"]["tokencredit/split_groups"].append(float(batching.split_groups(steps, G)))
        micro = [part for step in steps for part in torch.tensor_split(step, self.args.gradient_accumulation_steps)]
        return [_take(whole, idx.to(ids.device)) for idx in micro]


# ---------------------------------------------------------------------------------------
# Helpers: TRL's batch dicts hold [B, ...] tensors, 0-d tensors (num_items_in_batch) and None
# ---------------------------------------------------------------------------------------

def _concat(chunks: list[dict]) -> dict:
    """Undo TRL's split: concatenate every [B, ...] entry along dim 0; keep 0-d and None."""
    out = {}
    for key, first in chunks[0].items():
        if first is None or (isinstance(first, torch.Tensor) and first.dim() == 0):
            out[key] = first
        elif isinstance(first, torch.Tensor):
            out[key] = torch.cat([c[key] for c in chunks], dim=0)
        else:
            out[key] = [x for c in chunks for x in c[key]]
    return out


def _take(batch: dict, idx: torch.Tensor) -> dict:
    """Rows idx of every [B, ...] entry (lists too); 0-d tensors and None pass through."""
    out = {}
    for key, value in batch.items():
        if value is None or (isinstance(value, torch.Tensor) and value.dim() == 0):
            out[key] = value
        elif isinstance(value, torch.Tensor):
            out[key] = value[idx]
        else:
            out[key] = [value[i] for i in idx.tolist()]
    return out
