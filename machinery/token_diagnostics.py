"""token_diagnostics.py: the Cancellation Hypothesis paper's token diagnostics during training.

diagnostics.py holds the formulas (token flips, where updates go, specificity, token
values' cells, the output-layer coupling), on tensors. What a training step needs around
them is here: the step's record during the update (which rollouts, their loss
coefficients for the cancellation residual), one no-grad pass under the updated weights,
the token values' sampled continuations (from the run's sampler, machinery/sampler.py),
the coupling's forward, and after_update, which puts them together into the metrics
train.py logs on a diagnostic step.

On a step without diagnostics the loop's calls go to NoDiagnostics, whose methods do
nothing (as nanochat's DummyWandb stands in for a logger that is off), so the loop carries
no `if diagnose:` branches. When the diagnostics run and how much they sample is
DiagnosticsConfig (train.py's flags of its fields).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

import exchangeability
import loss
import tasks
import verify
from diagnostics import (COUPLING_CLASSES, SEED_OFFSET, TAU, nanmean, output_layer_coupling, residual_metrics,
                         sample_coupling_pairs, sample_value_positions, specificity, token_flips, value_stats,
                         where_updates_go)
from machinery import forward
from machinery import logprobs
from machinery import rollout
from machinery.flags import MAY_CHANGE, check_counts, require

MAX_VALUE_ROLLOUTS = 2 ** 20  # 2 x --value_samples x --value_k: ~17 minutes per token-value step


# ---------------------------------------------------------------------------------------
# The entry point the trainer calls
# ---------------------------------------------------------------------------------------

def after_update(sampler, rollouts: rollout.Rollouts, old_logp: Tensor, new_logp: Tensor, adv_flat: Tensor,
                 task: str, answers: list[str], *, prompts: list[str] | None = None, rewards: Tensor | None = None,
                 tau: float = TAU,
                 value_samples: int = 0, value_k: int = 8, coupling_pairs: int = 0, seed: int = 0,
                 step: int = 0) -> dict:
    """All token diagnostics of one step, as a flat dict of metrics (docs/metrics.md).

    sampler: the run's (machinery/sampler.py): its model, the policy after the update, in
    eval mode, is the one scored and continued, at its settings (max_new_tokens, temperature).
    Call after the optimizer step(s) of a rollout batch with the
    batch's log-probs under the sampling weights (old_logp) and the updated ones
    (new_logp), both [B, T] on the CPU from one teacher-forced pass. Runs flip/* and
    where/* (free; where/* only for tasks with a template), coupling/* if coupling_pairs
    > 0 (one forward) and value/* if value_samples > 0 (2 * value_samples * value_k
    continuations: the expensive one), timing the last two; costs in docs/metrics.md.
    rollouts: the step's Rollouts; adv_flat: [B]; task: the rows' tasks.Task; answers: N
    reference answers (rollout b answers answers[b // G]); prompts: the N prompt texts
    (countdown's verifier reads them); rewards: [B] or [N, G], for credit/specificity_* (none
    without them). Samples come from streams seeded by (seed, step) inside fork_rng: the
    training RNG never moves, and resumes reproduce. ValueError names a bad input.
    """
    model, tokenizer = sampler.model, sampler.tokenizer
    max_new_tokens, temperature = sampler.cfg.max_new_tokens, sampler.cfg.temperature
    B, T = rollouts.response_ids.shape
    for name, t in (("old_logp", old_logp), ("new_logp", new_logp)):
        if tuple(t.shape) != (B, T):
            raise ValueError(f"after_update: {name} has shape {tuple(t.shape)}, the rollouts are {(B, T)}")
    if tuple(adv_flat.shape) != (B,):
        raise ValueError(f"after_update: adv_flat has shape {tuple(adv_flat.shape)}, expected ({B},)")
    if len(answers) * rollouts.G != B:
        raise ValueError(f"after_update: {len(answers)} answers x G={rollouts.G} != {B} rollouts")
    if prompts is not None and len(prompts) != len(answers):
        raise ValueError(f"after_update: {len(prompts)} prompts but {len(answers)} answers")
    for name, v, low in (("value_samples", value_samples, 0), ("value_k", value_k, 1),
                         ("coupling_pairs", coupling_pairs, 0), ("max_new_tokens", max_new_tokens, T)):
        if v < low:
            raise ValueError(f"after_update: {name} must be >= {low}, got {v}")
    if not tau >= 0:
        raise ValueError(f"after_update: need tau >= 0, got {tau}")

    mask = rollouts.response_mask.float()
    old_logp, new_logp, adv_flat = old_logp.float().cpu(), new_logp.float().cpu(), adv_flat.float().cpu()
    out = token_flips(new_logp, old_logp, mask, adv_flat, tau)
    if rewards is not None:
        out.update(specificity(new_logp, old_logp, mask, rollouts.response_ids.cpu(), rewards.reshape(-1).float().cpu(),
                               rollouts.G))
    template = tasks.template_token_mask(task, tokenizer, rollouts.response_ids, rollouts.response_mask)
    if template is not None:
        out.update(where_updates_go(new_logp, old_logp, mask, adv_flat, template))
    base_seed = seed * 100_003 + step + SEED_OFFSET
    if coupling_pairs:
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(base_seed + 1)
        pairs = sample_coupling_pairs(rollouts.response_ids, mask, old_logp, coupling_pairs, gen)
        out.update(coupling_stats(model, rollouts, pairs, temperature))
        out["time/diag_coupling"] = time.perf_counter() - t0
    if value_samples:
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(base_seed + 2)
        rows, cols, cells = sample_value_positions(new_logp - old_logp, mask, adv_flat, value_samples, gen, tau)
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(base_seed)
            v_with, v_without = token_values(sampler, rollouts, rows, cols, answers, task, value_k, prompts=prompts)
        out.update(value_stats(v_with - v_without, cells))
        out["time/diag_value"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------
# The trainer's probe: what a diagnostic step records during the update
# ---------------------------------------------------------------------------------------
#
# train.py's loop calls the same three methods on every step; on a step without
# diagnostics they belong to NoDiagnostics and do nothing (as nanochat's DummyWandb stands in
# for a logger that is off), so the loop carries no `if diagnose:` branches.

@dataclass
class DiagnosticsConfig:
    """When the token diagnostics run and how much they sample.

    train.py's Config nests it as cfg.diagnostics; each field is the flag of its name, its
    docstring the --help. The diagnostics draw from their own streams, seeded by the run's
    seed and the step, and change the update by float rounding at most (a diagnostic step
    skips no rollout), so --resume may change every field. Checked here, once.
    """

    flip_every: int = field(default=10, metadata=MAY_CHANGE)
    """Token diagnostics (flips, where updates go, coupling; diagnostics.py) and the cancellation residual every this many steps (0 = off)."""
    coupling_pairs: int = field(default=256, metadata=MAY_CHANGE)
    """Token pairs per coupling class on diagnostic steps (output-layer closed form, one forward; 0 = off)."""
    value_every: int = field(default=0, metadata=MAY_CHANGE)
    """Token-value Monte Carlo every this many steps (2 x value_samples x value_k sampled continuations; 0 = off)."""
    value_samples: int = field(default=64, metadata=MAY_CHANGE)
    """Response positions per token-value estimate (stratified: boosted/suppressed x positive/negative rollouts)."""
    value_k: int = field(default=8, metadata=MAY_CHANGE)
    """Continuations per prefix in the token-value estimate (each V has standard error sqrt(V(1-V)/k))."""

    def __post_init__(self):
        check_counts(self, {"flip_every": 0, "coupling_pairs": 0, "value_every": 0, "value_samples": 1, "value_k": 1},
                     {"value_samples": (2 ** 12, "each position costs 2 x --value_k sampled continuations"),
                      "value_k": (2 ** 10, "each of the 2 x --value_samples prefixes costs this many sampled "
                                           "continuations"),
                      "coupling_pairs": (2 ** 12, "each pair holds two vocabulary-sized float64 rows, and at 4096 "
                                                  "pairs the mean's standard error is already under 2% of the "
                                                  "spread")})
        require(not self.value_every or 2 * self.value_samples * self.value_k <= MAX_VALUE_ROLLOUTS,
                f"2 x --value_samples x --value_k must be at most {MAX_VALUE_ROLLOUTS} continuations per token-value "
                f"step (~17 minutes each for the embedded model), got 2 x {self.value_samples} x {self.value_k}")


def diagnostics_for_step(cfg: DiagnosticsConfig, step: int, mask: Tensor, seed: int):
    """DiagnosticStep on a diagnostic step (every cfg.flip_every or cfg.value_every steps), else NoDiagnostics.

    mask: [B, T] the step's response mask (the probe's shapes); seed: the run's seed (the
    diagnostics' own streams derive from it and the step).
    """
    value_step = bool(cfg.value_every) and step % cfg.value_every == 0
    if (bool(cfg.flip_every) and step % cfg.flip_every == 0) or value_step:
        return DiagnosticStep(cfg, step, mask, value_step, seed)
    return NoDiagnostics()


class NoDiagnostics:
    """The probe of a step without diagnostics: every method does nothing."""

    active = False

    def micro_batch(self, *args) -> None:
        pass

    def optimizer_step(self, *args) -> None:
        pass

    def report(self, *args) -> dict:
        return {}


class DiagnosticStep:
    """Records, during one step's update, what the step's diagnostics need afterwards.

    active: True, so forward.carries_gradient runs every rollout (the diagnostics need
    every rollout's log-probs).
    micro_batch: keeps logp_old and the rollout coefficients m_i (loss.rollout_coefficients:
      one extra backward through the loss head only, never through the model);
    optimizer_step: the cancellation residual R_g (exchangeability.cancellation_residual)
      over the optimizer step's whole groups;
    report: one no-grad pass under the updated weights, then after_update, the step's mean
      residual and that of its first optimizer step alone (ratio 1 there, so with whole
      groups and a zero-sum advantage it is 0 to float rounding; docs/metrics.md); rows are
      the step's N data rows (the token values' verifier may read the prompt).
    """

    active = True

    def __init__(self, cfg: DiagnosticsConfig, step: int, mask: Tensor, value_step: bool, seed: int):
        self.cfg, self.step, self.value_step, self.seed = cfg, step, value_step, seed
        self.logp_old = torch.zeros_like(mask)                          # [B, T], CPU
        self.coef = torch.zeros(len(mask), dtype=torch.float64)         # [B] m_i
        self.residuals = []                                             # R_g means, one per optimizer step

    def micro_batch(self, idx: Tensor, logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, group: Tensor,
                    loss_cfg, norm) -> None:
        """idx: the micro-batch's rollouts; the other tensors are theirs (as policy_loss got them)."""
        self.logp_old[idx] = old.float().cpu()
        self.coef[idx] = loss.rollout_coefficients(logp, old, adv, mask, loss_cfg, norm, group).cpu()

    def optimizer_step(self, step_idx: Tensor, group_index: Tensor) -> None:
        residual = exchangeability.cancellation_residual(self.coef[step_idx], group_index[step_idx])
        self.residuals.append(nanmean(residual.tolist()))

    def report(self, sampler, task, update: forward.UpdateConfig, rollouts: rollout.Rollouts, adv: Tensor,
               rows: list[dict], rewards: Tensor | None = None) -> dict:
        """sampler: the run's; its model is the policy after the update (machinery/sampler.py)."""
        cfg = self.cfg
        new_logp = forward.no_grad_pass(sampler.model, rollouts, update, sampler.cfg.temperature)[0]
        out = after_update(sampler, rollouts, self.logp_old, new_logp, adv.reshape(-1), task,
                           [r["answer"] for r in rows], prompts=[r["prompt"] for r in rows], rewards=rewards,
                           value_samples=cfg.value_samples if self.value_step else 0, value_k=cfg.value_k,
                           coupling_pairs=cfg.coupling_pairs, seed=self.seed, step=self.step)
        out.update(residual_metrics(self.residuals))
        return out


def token_values(sampler, rollouts: rollout.Rollouts, rows: Tensor, cols: Tensor, answers: list[str], task: str,
                 k: int, max_batch_rows: int = 2048, prompts: list[str] | None = None) -> tuple[Tensor, Tensor]:
    """[recon] Monte Carlo success probabilities from a prefix with and without a token.

    For the sampled token o_t of rollout b (position (rows[s], cols[s])):
        V_with    = P(success | q, o_{<=t})  ~  mean over k continuations of q + o_{<=t}
        V_without = P(success | q, o_{<t})   ~  mean over k continuations of q + o_{<t}
        value     = V_with - V_without    (standard error of each V: sqrt(V(1-V)/k))

    Continuations: the CURRENT policy (the sampler's model) at the run's sampling settings
    (sampler.continuations), the rollout's remaining budget of max_new_tokens, scored by the
    task's verifier as a rollout is; a complete prefix (EOS, budget used) is scored exactly,
    unsampled. Calls of at most max_batch_rows rows (G = k each); details in docs/math.md
    §6.5. Consumes torch's global RNG: wrap in fork_rng.
    rollouts: the Rollouts the positions index; answers: N reference answers (answers[b // G]);
    prompts: the N prompt texts, or None for verifiers that do not read them.
    Returns (v_with [S] float64, v_without [S] float64).
    """
    model, tokenizer, max_new_tokens = sampler.model, sampler.tokenizer, sampler.cfg.max_new_tokens
    pad_id, eos_ids = rollout.special_ids(model, tokenizer)
    # One job per (position, with/without): the prompt + response prefix, its budget.
    jobs = []                                   # (position s, with?, prompt ids, prefix ids, budget)
    for s, (b, t) in enumerate(zip(rows.tolist(), cols.tolist())):
        prompt = rollouts.prompt_ids[b][rollouts.prompt_mask[b] != 0].tolist()
        response = rollouts.response_ids[b, :t + 1].tolist()
        for with_token in (True, False):
            prefix = response if with_token else response[:-1]
            jobs.append((s, with_token, prompt, prefix, max_new_tokens - len(prefix)))
    texts, owners = [], []                      # decoded full responses; the job each belongs to
    done = [j for j, job in enumerate(jobs) if job[1] and (job[3][-1] in eos_ids or job[4] <= 0)]
    for j in done:                              # complete already: score the prefix itself
        texts.append(tokenizer.decode(jobs[j][3], skip_special_tokens=True))
        owners.append(j)
    todo = sorted(set(range(len(jobs))) - set(done))
    per_call = max(1, max_batch_rows // k)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(todo), per_call):
                chunk = todo[start:start + per_call]
                ids, attn = rollout.pad_rows([jobs[j][2] + jobs[j][3] for j in chunk], pad_id, left=True)
                budget = max(jobs[j][4] for j in chunk)
                tokens = sampler.continuations(ids, attn, k, budget)
                for i, j in enumerate(chunk):
                    cont = tokens[i * k:(i + 1) * k, :jobs[j][4]]
                    cont, cont_mask, _ = rollout.cut_at_eos(cont, eos_ids, pad_id)
                    for row, n_real in zip(cont.tolist(), cont_mask.sum(1).long().tolist()):
                        texts.append(tokenizer.decode(jobs[j][3] + row[:n_real], skip_special_tokens=True))
                        owners.append(j)
    finally:
        model.train(was_training)
    question = [int(rows[jobs[j][0]]) // rollouts.G for j in owners]       # each text's prompt index
    rewards = verify.reward_tensor(verify.score(texts, [answers[q] for q in question], task,
                                                None if prompts is None else [prompts[q] for q in question])).double()
    total = torch.zeros(len(jobs), dtype=torch.float64).index_add_(0, torch.tensor(owners, dtype=torch.long), rewards)
    count = torch.zeros(len(jobs), dtype=torch.float64).index_add_(0, torch.tensor(owners, dtype=torch.long),
                                                                   torch.ones_like(rewards))
    v = (total / count).view(-1, 2)             # jobs were appended (with, without) per position
    return v[:, 0], v[:, 1]


def coupling_stats(model, rollouts: rollout.Rollouts, pairs: dict[str, tuple[Tensor, Tensor]],
                   temperature: float = 1.0) -> dict:
    """Mean output-layer coupling per class of pairs, and the number of pairs.

    One forward pass (logprobs.token_logprobs, in chunks) over the rollouts that hold a
    sampled occurrence gives each occurrence's final hidden state h (the input of the
    output layer) and its next-token distribution p; output_layer_coupling does the
    rest. The model is the caller's (in the trainer: after the update, one step away
    from pi_old); the confidence classes use pi_old itself.
    Keys: "coupling/<class>" (mean coupling, signed, per unit learning rate) and
    "coupling/n_<class>"; the mean is absent for a class with no pair. The paper's
    claim: coupling/same_low is the largest; we expect same_low > same_high > different.
    """
    T = rollouts.response_ids.shape[1]
    needed = torch.unique(torch.cat([torch.cat(p) for p in pairs.values()]))
    h, logp_all = output_layer_features(model, rollouts, needed // T, needed % T, temperature)
    head = model.get_output_embeddings()
    has_bias = getattr(head, "bias", None) is not None
    tokens = rollouts.response_ids.flatten()
    out = {}
    for cls in COUPLING_CLASSES:
        first, second = pairs[cls]
        out[f"coupling/n_{cls}"] = len(first)
        if not len(first):
            continue
        i, j = torch.searchsorted(needed, first), torch.searchsorted(needed, second)   # rows of h, logp_all
        c = output_layer_coupling(logp_all[i].exp(), logp_all[j].exp(), tokens[first], tokens[second],
                                  h[i], h[j], temperature, has_bias)
        out[f"coupling/{cls}"] = float(c.mean())
    return out


def output_layer_features(model, rollouts: rollout.Rollouts, rows: Tensor, cols: Tensor, temperature: float = 1.0,
                          chunk: int = 64) -> tuple[Tensor, Tensor]:
    """Final hidden state and log-distribution at response positions (rows[s], cols[s]).

    h[s] is the input of the output layer (model.get_output_embeddings(), captured by a
    forward hook) at the position that PREDICTS response token cols[s] of rollout
    rows[s]; logp_all[s] = log_softmax(output / T) there, so logp_all[s, token] is what
    logprobs.token_logprobs returns for that token (tested). The forward is
    logprobs.token_logprobs itself, over the distinct rows, chunk rows at a time, no
    gradients; it keeps the last t1 + 1 positions (t1 = the chunk's longest response),
    of which position t predicts response token t.
    Returns (h [S, d] float64, logp_all [S, V] float64).
    """
    captured = {}

    def hook(module, inputs, output):
        captured["h"], captured["z"] = inputs[0], output

    device = next(model.parameters()).device
    h = logp_all = None
    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        with torch.no_grad():
            for idx in torch.unique(rows).split(chunk):
                batch = (rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask)
                logprobs.token_logprobs(model, *(t[idx].to(device) for t in batch), temperature=temperature)
                here = torch.isin(rows, idx).nonzero().squeeze(1)           # the occurrences in this chunk
                local = torch.searchsorted(idx, rows[here])                 # their row within the chunk
                hs = captured["h"][local, cols[here]].double().cpu()
                ls = torch.log_softmax(captured["z"][local, cols[here]].double() / temperature, dim=-1).cpu()
                if h is None:   # made where hs and ls are (the CPU), whatever the default device
                    h = hs.new_zeros(len(rows), hs.shape[1])
                    logp_all = ls.new_zeros(len(rows), ls.shape[1])
                h[here], logp_all[here] = hs, ls
    finally:
        handle.remove()
    return h, logp_all
