"""The policy-gradient objective: from per-rollout advantages to one scalar loss.

advantages.py gives every rollout a weight A_i. This file turns the weights into a loss
whose gradient is (approximately) sum_i sum_t w_{i,t} A_i grad log pi(o_{i,t}), and it
is where most of the quiet differences between GRPO implementations live:

1. The per-token surrogate (spec section 3). With rho_t = pi(o_t) / pi_old(o_t):
   - PPO clip (Schulman et al. 2017): max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)),
     clip-higher eps_high = 0.28 from DAPO, optional dual clip c = 3 for A < 0 (Ye et al.);
   - CISPO (MiniMax-M1): -sg(clip(rho)) A log pi, so no token ever loses its gradient;
   - GSPO (Qwen): one ratio per SEQUENCE, s_i = exp(mean_t log rho_{i,t}), clipped per
     sequence.
2. The aggregation, which decides how much each token weighs (four modes below).
3. Token gradient cancellation (arXiv 2604.13088, "design conditions"; its method is
   DFPO). Inside a group with sum_i A_i = 0, a token every rollout shares at the same
   context (a template prefix) gets the same gradient g from every rollout, so its net
   update is sum_i w_i A_i g. That is zero only if every rollout gives it the SAME weight
   w_i ("gradient exchangeability"). Three common choices break it:
     - GSPO's sequence ratio s_i, different in every rollout once the policy moved;
     - asymmetric clipping, which zeroes some rollouts' weights and not others';
     - [derived] per-sequence length normalisation 1/|o_i| with unequal lengths
       (seq-mean-token-mean, the original GRPO).
   The paper's two fixes act on detached per-rollout weights w before the gradient:
     min:  w~_i = min_j w_j over the group;   orth:  w~ = w - (A.w / A.A) A.
   Both make sum_i w~_i A_i = 0 again. `cancellation_residual` measures the breakage.

Also here: KL to a reference policy (k1, k2, k3), full-vocabulary entropy, and
negative-token filtering for single-rollout training.

Shapes: B rollouts in this call (a micro-batch), T response positions.
    logp, old_logp, ref_logp, mask, entropy: [B, T]; advantages: [B] (or [B, T]);
    group_index: [B] long, which prompt (group) each rollout belongs to.
Natural logs; entropy and KL in nats.

Micro-batch invariance: the normaliser (how many tokens / sequences the whole optimizer
step has) is computed ONCE from the whole step by `step_normaliser` and passed in. Then
summing the losses of any split of the step into micro-batches gives exactly the loss
(and the gradient) of the whole step. Averaging per micro-batch instead, the naive way,
weights short micro-batches' tokens more (tests/test_loss.py shows both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_TYPES = ("ppo", "cispo", "gspo")
WEIGHT_TRANSFORMS = (None, "min", "orth")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass
class LossConfig:
    """Everything that defines the objective; train.py exposes each field as a flag."""

    loss_type: str = "ppo"
    """Surrogate: 'ppo' (token ratio clip), 'cispo' (clipped detached ratio), 'gspo' (sequence ratio)."""
    eps_low: float = 0.2
    """Lower clip range: ratios below 1 - eps_low stop pushing down tokens with A < 0."""
    eps_high: float = 0.2
    """Upper clip range: ratios above 1 + eps_high stop pushing up tokens with A > 0 (DAPO: 0.28)."""
    dual_clip: float | None = None
    """Dual clip constant c (> 1, typically 3): caps the loss of A < 0 tokens at -c A. None = off."""
    agg: str = "token-mean"
    """Aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm."""
    weight_transform: str | None = None
    """DFPO transform of GSPO's detached sequence weights: None | 'min' | 'orth' (loss_type='gspo' only)."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference policy (0 = off, no reference needed)."""
    kl_estimator: str = "k3"
    """KL estimator on sampled tokens: k1 = log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (r = pi_ref/pi)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (0 = off; entropy is still logged when given)."""
    neg_filter_frac: float | None = None
    """Negative token filtering: in A < 0 rollouts keep only this lowest-probability fraction (0.1)."""

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS}, got {self.agg!r}")
        if self.weight_transform not in WEIGHT_TRANSFORMS:
            raise ValueError(f"weight_transform must be one of {WEIGHT_TRANSFORMS}, got {self.weight_transform!r}")
        if self.weight_transform is not None and self.loss_type != "gspo":
            raise ValueError(f"weight_transform={self.weight_transform!r} acts on GSPO's sequence weights; "
                             f"it needs loss_type='gspo', got {self.loss_type!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if not self.eps_high >= 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}")
        if self.neg_filter_frac is not None and not 0 < self.neg_filter_frac <= 1:
            raise ValueError(f"neg_filter_frac must be in (0, 1] (or None), got {self.neg_filter_frac}")


# ---------------------------------------------------------------------------------------
# Aggregation over a whole optimizer step
# ---------------------------------------------------------------------------------------

@dataclass
class StepNorm:
    """The normaliser of one optimizer step, fixed before micro-batching."""

    n_tokens: float
    """Response tokens in the whole step (token-mean divides by this)."""
    n_seqs: float
    """Rollouts in the whole step (the seq-mean-* modes divide by this)."""
    max_len: float
    """The fixed length constant of seq-mean-token-sum-norm (Dr. GRPO uses the generation budget)."""


def step_normaliser(mask: Tensor, max_len: int | None = None) -> StepNorm:
    """Compute the step's normaliser from the mask of EVERY rollout in the step.

    mask: [B_step, T] (1 on response tokens). max_len: Dr. GRPO's constant; default is
    the mask's width T. Call this once per optimizer step, before splitting the step into
    micro-batches, and pass the result to every `policy_loss` call of that step.
    """
    if mask.dim() != 2:
        raise ValueError(f"step_normaliser: mask must be [B, T], got {tuple(mask.shape)}")
    n_tokens = float(mask.sum())
    if n_tokens <= 0:
        raise ValueError("step_normaliser: the step has no response tokens (mask is all zero)")
    max_len = mask.shape[1] if max_len is None else max_len
    if max_len < mask.shape[1]:
        raise ValueError(f"step_normaliser: max_len={max_len} is shorter than the responses (T={mask.shape[1]})")
    return StepNorm(n_tokens=n_tokens, n_seqs=float(mask.shape[0]), max_len=float(max_len))


def aggregate(per_token: Tensor, mask: Tensor, agg: str, norm: StepNorm) -> Tensor:
    """Reduce a [B, T] per-token loss to this micro-batch's share of the step's scalar.

        token-mean               sum_{i,t} l / n_tokens(step)          (DAPO, TRL default)
        seq-mean-token-mean      sum_i (sum_t l / |o_i|) / n_seqs(step)  (original GRPO)
        seq-mean-token-sum       sum_{i,t} l / n_seqs(step)
        seq-mean-token-sum-norm  sum_{i,t} l / (n_seqs(step) * max_len)  (Dr. GRPO)

    Only seq-mean-token-mean gives a token a weight that depends on its own sequence's
    length, 1/|o_i|: a shared template token then weighs more in short rollouts than in
    long ones, and its updates stop cancelling (Dr. GRPO calls the same factor a length
    bias: short correct answers are pushed up harder, long wrong ones pushed down less).
    Every mode is a sum over rollouts divided by step constants, so micro-batch losses
    add up to the step's loss exactly.
    """
    masked = per_token * mask
    if agg == "token-mean":
        return masked.sum() / norm.n_tokens
    if agg == "seq-mean-token-mean":
        lengths = mask.sum(dim=1).clamp(min=1)  # an empty rollout contributes 0, not NaN
        return (masked.sum(dim=1) / lengths).sum() / norm.n_seqs
    if agg == "seq-mean-token-sum":
        return masked.sum() / norm.n_seqs
    if agg == "seq-mean-token-sum-norm":
        return masked.sum() / (norm.n_seqs * norm.max_len)
    raise ValueError(f"unknown aggregation {agg!r}; choose from {AGGREGATIONS}")


# ---------------------------------------------------------------------------------------
# Per-token surrogates
# ---------------------------------------------------------------------------------------

def ppo_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float,
             dual_clip: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate per token, with separate low/high ranges and dual clip.

        l = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
        dual clip (A < 0 only):  l = min(l, -c A)

    The max picks the pessimistic branch: a token with A > 0 stops getting gradient once
    rho > 1 + eps_high, a token with A < 0 once rho < 1 - eps_low. Clip-higher
    (eps_high > eps_low, DAPO) lets rare good tokens grow further before clipping: it is
    ASYMMETRIC, so rollouts with A > 0 and A < 0 stop at different ratios and a shared
    token's updates no longer cancel. Dual clip bounds the loss of a negative-advantage
    token whose ratio exploded (rho > c), which otherwise dominates the batch.
    ratio, adv: [B, T] (adv broadcast from [B, 1] is fine). Returns (loss [B, T],
    clipped_low [B, T] bool, clipped_high [B, T] bool): the tokens whose gradient the
    clip removed, for the clip-fraction metrics.
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    clipped_low = (adv < 0) & (ratio < 1.0 - eps_low)
    clipped_high = (adv > 0) & (ratio > 1.0 + eps_high)
    return loss, clipped_low, clipped_high


def cispo(logp: Tensor, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the gradient.

        l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi

    The clipped ratio is detached, so it only scales a REINFORCE term: every token keeps a
    gradient (PPO's clip drops tokens outright, often the rare "reflection" tokens).
    On-policy (rho = 1) the gradient equals PPO's. Returns [B, T].
    """
    weight = ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)
    return -weight * adv * logp


def gspo_sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, length: Tensor | None = None) -> Tensor:
    """GSPO's sequence ratio (Zheng et al. 2025): s_i = exp( sum_t mask log rho_{i,t} / L_i ).

    L_i = |o_i| (the sequence's own length, GSPO) unless `length` [B] gives another
    normaliser (the DFPO weights use a group-constant one). The length-normalised
    geometric mean keeps s_i near 1 for long sequences. Returns [B], differentiable.
    """
    L = mask.sum(dim=1).clamp(min=1) if length is None else length
    return torch.exp(((logp - old_logp) * mask).sum(dim=1) / L)


def dfpo_transform(w: Tensor, adv: Tensor, group_index: Tensor, mode: str) -> Tensor:
    """The DFPO weight transforms (arXiv 2604.13088) that restore exchangeability.

    w: [B] detached per-rollout weights; adv: [B]; group_index: [B]. Per group g:
        min:   w~_i = min_{j in g} w_j                  every rollout the same weight
        orth:  w~ = w - (A.w / A.A) A                   remove w's component along A
    After either, sum_{i in g} w~_i A_i = 0 whenever sum_i A_i = 0 (min) or always
    (orth), so a token shared by the group gets no net update. min is conservative (the
    whole group moves at its most pessimistic weight); orth keeps w's spread where it is
    orthogonal to the advantages. Groups with A.A = 0 (all-equal rewards) are left as is.
    Only the rollouts present in this call are a "group": pass whole groups (the
    query-preserved batching of batching.py does).
    """
    out = w.clone()
    for g in torch.unique(group_index):
        idx = (group_index == g).nonzero().squeeze(1)
        wg, ag = w[idx], adv[idx]
        if mode == "min":
            out[idx] = wg.min()
        elif mode == "orth":
            aa = (ag * ag).sum()
            if aa > 0:
                out[idx] = wg - (ag * wg).sum() / aa * ag
        else:
            raise ValueError(f"unknown weight transform {mode!r}; choose 'min' or 'orth'")
    return out


def cancellation_residual(m: Tensor, group_index: Tensor) -> Tensor:
    """Per-group residual R_g = |sum_i m_i| / sum_i |m_i|, with m_i = w_i A_i.

    0 means a shared token's updates cancel exactly in that group, 1 that they all push
    the same way. m: [B] per-rollout effective coefficients; group_index: [B]. Returns
    [n_groups] in the order of torch.unique(group_index); groups whose coefficients are
    all 0 (nothing to cancel) get NaN so callers can drop them with nanmean.
    """
    groups, inverse = torch.unique(group_index, return_inverse=True)
    num = torch.zeros(len(groups), dtype=m.dtype).index_add_(0, inverse, m).abs()
    den = torch.zeros(len(groups), dtype=m.dtype).index_add_(0, inverse, m.abs())
    return torch.where(den > 0, num / den.clamp(min=1e-30), torch.full_like(den, float("nan")))


# ---------------------------------------------------------------------------------------
# KL, entropy, negative-token filtering
# ---------------------------------------------------------------------------------------

def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi (Schulman 2020).

    With log r = log pi_ref - log pi:
        k1 = -log r                     unbiased value; its gradient on sampled tokens has
                                        zero expectation on-policy (E_pi[grad log pi] = 0),
                                        so as a LOSS it does not pull toward pi_ref at all
        k2 = (log r)^2 / 2              biased value; its gradient is exactly the gradient
                                        of KL(pi || pi_ref) in expectation
        k3 = r - 1 - log r              unbiased, always >= 0 (GRPO's choice); its gradient
                                        is that of KL(pi_ref || pi), also toward pi_ref
    A sign slip here (adding +k1 where -k1 belongs, or r = pi/pi_ref in k3) has shipped in
    real frameworks; tests/test_loss.py checks that one step on k2 or k3 lowers the exact
    KL and that k1's expected gradient vanishes. Returns [B, T].
    """
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r ** 2
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; choose from {KL_ESTIMATORS}")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Full-vocabulary entropy H = -sum_v p_v log p_v of softmax(logits), in nats.

    logits: [..., V] -> [...]. Computed as logsumexp(z) - sum_v p_v z_v, which never forms
    log 0. This is the policy's entropy at a position, NOT the surprisal -log p of the
    sampled token (which only estimates it, noisily). Apply any temperature before.
    """
    p = torch.softmax(logits.float(), dim=-1)
    return torch.logsumexp(logits.float(), dim=-1) - (p * logits.float()).sum(dim=-1)


def negative_token_filter(old_logp: Tensor, mask: Tensor, adv: Tensor, frac: float) -> Tensor:
    """Negative token filtering (arXiv 2606.17250). [recon from a third-party reproduction]

    A failed single rollout is mostly fine tokens plus a few that went wrong; pushing all
    of them down penalises the good ones ("false penalties"). Keep the negative update only
    on the ceil(frac * |o_i|) lowest-probability tokens of each rollout with A_i < 0,
    chosen once from the OLD log-probs (so the choice does not move during epochs).
    Rollouts with A_i >= 0 keep every token. Masked tokens still count in the length
    normaliser (the normaliser comes from the full mask, only the loss is zeroed).
    old_logp, mask: [B, T]; adv: [B]. Returns a [B, T] float keep-mask (a subset of mask).
    """
    keep = mask.clone().float()
    big = torch.finfo(old_logp.dtype).max
    for i in (adv < 0).nonzero().squeeze(1).tolist():
        n = int(mask[i].sum())
        if n == 0:
            continue
        k = max(1, int(torch.ceil(torch.tensor(frac * n)).item()))
        scores = torch.where(mask[i] > 0, old_logp[i], torch.full_like(old_logp[i], big))
        lowest = torch.topk(scores, k, largest=False).indices
        keep[i] = 0.0
        keep[i, lowest] = 1.0
    return keep


# ---------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------

def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossConfig,
                norm: StepNorm, group_index: Tensor | None = None, ref_logp: Tensor | None = None,
                entropy: Tensor | None = None, with_residual: bool = True) -> tuple[Tensor, dict]:
    """This micro-batch's share of the step's loss, and the statistics a trainer logs.

    logp: [B, T] log pi(o_t) under the current policy (differentiable); old_logp: [B, T]
    under the sampling policy (detached); advantages: [B] per rollout (or [B, T] per
    token; GSPO and the DFPO transforms need [B]); mask: [B, T] response-token mask;
    norm: from `step_normaliser` on the WHOLE step; group_index: [B] group ids (needed by
    the DFPO transforms and the cancellation residual); ref_logp: [B, T] reference
    log-probs (needed iff kl_coef > 0); entropy: [B, T] full-vocabulary entropy
    (differentiable if entropy_coef > 0).

    loss = aggregate(surrogate) + kl_coef * aggregate(KL) - entropy_coef * aggregate(H)

    Stats (python floats, token-means over THIS call unless noted; train.py weights them
    by "n_tokens" to combine micro-batches):
      clip_frac_low / clip_frac_high   tokens whose gradient PPO's clip removed, per side
                                       (0 by construction with one step per batch: rho = 1)
      approx_kl                        k3 estimate of KL(pi_old || pi) (Schulman's)
      entropy, kl_ref                  when given
      cancellation_residual            nanmean over groups of R_g (see below; only with
                                       group_index and with_residual=True)
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f"policy_loss: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must all be the same [B, T]")
    B = logp.shape[0]
    if advantages.shape not in ((B,), (B, logp.shape[1])):
        raise ValueError(f"policy_loss: advantages must be [B]={B} or [B, T], got {tuple(advantages.shape)}")
    if not torch.isfinite(advantages).all():
        raise ValueError("policy_loss: advantages contain NaN or inf")
    per_rollout = advantages.dim() == 1
    if cfg.loss_type == "gspo" and not per_rollout:
        raise ValueError("policy_loss: GSPO needs one advantage per rollout, shape [B]")
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if cfg.weight_transform is not None and group_index is None:
        raise ValueError("policy_loss: the DFPO weight transform needs group_index")

    mask = mask.to(logp.dtype)
    adv_tok = advantages.unsqueeze(1).expand_as(logp) if per_rollout else advantages
    old_logp = old_logp.detach()
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    clipped_low = clipped_high = torch.zeros_like(mask, dtype=torch.bool)

    if cfg.loss_type == "ppo":
        per_token, clipped_low, clipped_high = ppo_clip(ratio, adv_tok, cfg.eps_low, cfg.eps_high, cfg.dual_clip)
    elif cfg.loss_type == "cispo":
        per_token = cispo(logp, ratio, adv_tok, cfg.eps_low, cfg.eps_high)
        clipped_low = (ratio < 1.0 - cfg.eps_low) & mask.bool()
        clipped_high = (ratio > 1.0 + cfg.eps_high) & mask.bool()
    elif cfg.weight_transform is None:
        # GSPO, token form: the value of every token's ratio is s_i, its gradient
        # s_i * grad log pi_t; clipped per sequence. With agg="seq-mean-token-mean" this
        # is exactly GSPO's sequence objective.
        s = gspo_sequence_ratio(logp.detach(), old_logp, mask)
        token_ratio = s.unsqueeze(1) * torch.exp(logp - logp.detach())
        per_token, clipped_low, clipped_high = ppo_clip(token_ratio, adv_tok, cfg.eps_low, cfg.eps_high)
    else:
        # DFPO. [recon] The paper's w_i is taken as the detached GSPO sequence ratio with
        # a normaliser that is the same for every rollout of a group (the group's longest
        # response), zeroed where GSPO's clip would drop the sequence. The transform then
        # equalises the weights (min) or removes their component along A (orth), and the
        # surrogate is a REINFORCE term with that detached weight:
        #     l_{i,t} = -w~_i A_i exp(log pi_t - sg(log pi_t))    (value -w~A, grad -w~A grad log pi)
        # Use a token-sum aggregation with it: seq-mean-token-mean would multiply in
        # 1/|o_i| again and re-break exchangeability.
        lengths = mask.sum(dim=1)
        group_len = torch.zeros_like(lengths)
        for g in torch.unique(group_index):
            sel = group_index == g
            group_len[sel] = lengths[sel].max()
        s = gspo_sequence_ratio(logp.detach(), old_logp, mask, length=group_len.clamp(min=1))
        dropped = ((advantages > 0) & (s > 1 + cfg.eps_high)) | ((advantages < 0) & (s < 1 - cfg.eps_low))
        w = torch.where(dropped, torch.zeros_like(s), s)
        w = dfpo_transform(w, advantages, group_index, cfg.weight_transform)
        per_token = -(w * advantages).unsqueeze(1) * torch.exp(logp - logp.detach())
        clipped_low = ((advantages < 0) & dropped).unsqueeze(1) & mask.bool()
        clipped_high = ((advantages > 0) & dropped).unsqueeze(1) & mask.bool()

    if cfg.neg_filter_frac is not None:
        if not per_rollout:
            raise ValueError("policy_loss: negative token filtering needs advantages of shape [B]")
        per_token = per_token * negative_token_filter(old_logp, mask, advantages, cfg.neg_filter_frac)

    loss = aggregate(per_token, mask, cfg.agg, norm)
    stats = {}
    if cfg.kl_coef > 0:
        kl = kl_penalty(logp, ref_logp.detach(), cfg.kl_estimator)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.agg, norm)
        stats["kl_ref"] = _masked_mean(kl.detach(), mask)
    if entropy is not None:
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.agg, norm)
        stats["entropy"] = _masked_mean(entropy.detach(), mask)

    with torch.no_grad():
        n_tok = float(mask.sum())
        stats["n_tokens"] = n_tok
        stats["clip_frac_low"] = float((clipped_low.float() * mask).sum()) / max(n_tok, 1.0)
        stats["clip_frac_high"] = float((clipped_high.float() * mask).sum()) / max(n_tok, 1.0)
        stats["approx_kl"] = _masked_mean(ratio - 1.0 - log_ratio, mask)
    if with_residual and group_index is not None and per_rollout:
        stats["cancellation_residual"] = _residual_of_loss(logp, old_logp, advantages, mask, cfg, norm, group_index)
    return loss, stats


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _residual_of_loss(logp, old_logp, advantages, mask, cfg, norm, group_index) -> float:
    """Cancellation residual of the loss actually used, read off its gradient.

    The coefficient of grad log pi at token t of rollout i is c_{i,t} = -dLoss/dlogp_{i,t}.
    A token shared by the whole group at the same context gets sum_i c_{i,t} times its
    gradient, so we take m_i = mean_t c_{i,t} (the coefficient a typical shared token gets
    in rollout i) and report the nanmean over groups of |sum_i m_i| / sum_i |m_i|.
    One extra backward through the cheap loss head only (the model is not involved).
    """
    leaf = logp.detach().clone().requires_grad_(True)
    plain = LossConfig(**{**cfg.__dict__, "kl_coef": 0.0, "entropy_coef": 0.0})
    with torch.enable_grad():
        loss, _ = policy_loss(leaf, old_logp, advantages, mask, plain, norm, group_index=group_index,
                              with_residual=False)
        (coef,) = torch.autograd.grad(loss, leaf)
    m = -(coef * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    r = cancellation_residual(m.double(), group_index)
    return float(torch.nanmean(r)) if bool(torch.isfinite(r).any()) else float("nan")
