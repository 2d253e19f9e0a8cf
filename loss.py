"""The policy-gradient objective: from per-rollout advantages to one scalar loss.

advantages.py gives every rollout a weight A_i. This file turns the weights into a loss
whose gradient is (approximately) sum_i sum_t c_{i,t} A_i grad log pi(o_{i,t}), and it
is where most of the quiet differences between GRPO implementations live. Read
`policy_loss` (bottom of the file) first: it picks a surrogate, aggregates, adds KL and
entropy. Everything above it is one of those pieces.

1. The per-token surrogate (docs/math.md §3), registered in SURROGATES with its
   properties (`register`, beside its definition, as advantages.py registers advantages:
   its own aggregation, the aggregations it accepts, whether it keeps cancellation,
   whether its weights are per sequence or read whole groups). With
   rho_t = pi(o_t) / pi_old(o_t):
   - `ppo_clip` (Schulman et al. 2017): max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)),
     clip-higher eps_high = 0.28 from DAPO, optional dual clip c = 3 for A < 0 (Ye et al.);
   - `cispo` (MiniMax-M1): -sg(clip(rho)) A log pi, so no token ever loses its gradient;
   - `gspo` (Qwen, Zheng et al. 2025): one ratio per SEQUENCE,
     s_i = exp(mean_t log rho_{i,t}), clipped per sequence. GSPO is a sequence objective,
     J = mean_i min(s_i A_i, clip(s_i) A_i), so it runs ONLY with the aggregation that
     reproduces it, seq-mean-token-mean (any other is refused: it would be a different
     objective under GSPO's name);
   - `dfpo`: GSPO's weights made exchangeable (point 3, exchangeability.py).
2. The aggregation, which decides how much each token weighs: four modes, from DAPO's
   token-mean to Dr. GRPO's constant normaliser, and why only a token sum keeps point 3
   (aggregation.py, which this file imports: `aggregate`, over a `StepNorm`).
3. Token gradient cancellation (arXiv 2604.13088): a token every rollout of a group shares
   cancels only if every rollout gives it the same weight. exchangeability.py teaches it:
   what breaks it, DFPO's transforms that restore it (min, orth; controls keep, equal), and
   the residual R_g that measures it; `rollout_coefficients` reads that residual off this
   file's own gradient (bottom of the file).

Also here: KL to a reference policy (k1, k2, k3), full-vocabulary entropy, and
negative-token filtering for single-rollout training.

Shapes: B rollouts in this call (a micro-batch), T response positions.
    logp, old_logp, ref_logp, mask, entropy: [B, T]; advantages: [B] (or [B, T] for
    ppo/cispo); group_index: [B] long, which prompt (group) each rollout belongs to.
Natural logs; entropy and KL in nats.
Devices: every tensor this file makes is made on its inputs' device (`x.new_zeros`,
`torch.zeros_like`), so the loss runs wherever the model does; a bare `torch.zeros(n)`
would land on the CPU and fail to mix with CUDA inputs. tests/lesson/test_loss.py checks it by
making the default device "meta" while the inputs stay on the CPU.

Micro-batch invariance: the normaliser of the whole optimizer step is computed ONCE
(aggregation.step_normaliser) and passed in, so the losses of any split of the step into
micro-batches add up to the step's loss and gradient exactly (aggregation.py says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

import exchangeability
from aggregation import AGGREGATIONS, TOKEN_SUMS, StepNorm, aggregate, masked_mean

WEIGHT_TRANSFORMS = (None, "min", "orth", "keep", "equal")
KL_ESTIMATORS = ("k1", "k2", "k3")
MAX_KL_COEF = 10.0        # LossConfig says why these two bounds
MAX_ENTROPY_COEF = 1.0
MAX_LOG_RATIO = 20.0      # |log rho| is clamped here before exp (token_log_ratio says where it acts, and why)


# ---------------------------------------------------------------------------------------
# The registry: each surrogate is registered where it is defined, with its properties
# ---------------------------------------------------------------------------------------

SURROGATES: dict = {}
"""name -> per-token surrogate, in the order defined below. policy_loss calls the one
LossConfig.surrogate names: --loss_type picks it, and --weight_transform turns gspo into dfpo."""


def register(own_aggregation: str, keeps_cancellation: bool, aggregations: tuple = AGGREGATIONS,
             aggregation_reason: str = "", per_sequence: bool = False, whole_groups: bool = False):
    """Add the decorated surrogate to SURROGATES under its name, its properties beside it
    (verl's register_policy_loss does the same for its policy losses), read by LossConfig,
    policy_loss, the trainer and the tests:

      own_aggregation     the aggregation it runs with when --agg is not given
      aggregations        the aggregations it accepts; aggregation_reason says why it refuses
                          the others (GSPO is a mean over sequences; DFPO needs a token sum)
      keeps_cancellation  inside a zero-sum group, every rollout gives a token they all
                          share at the same context the same weight (until a clip acts), so
                          that token's updates cancel under a token-sum aggregation
                          (exchangeability.py); tests/lesson/test_loss.py measures it for each
      per_sequence        one weight per rollout: it needs one advantage per rollout, [B]
      whole_groups        it reads the other rollouts of a rollout's group, so every cut of
                          a batch (mini-batches, micro-batches, the zero-advantage skip)
                          must keep groups whole (machinery/forward.py asks this)
    A surrogate is f(logp, old_logp, adv, mask, cfg, group_index) -> (per-token loss [B, T],
    clipped_low, clipped_high, clipped_dual), cfg the LossConfig (as verl hands its
    policy losses their config). Example: @register(own_aggregation="token-mean",
    keeps_cancellation=True) above `def cispo(...)`.
    """
    bad = [a for a in (own_aggregation, *aggregations) if a not in AGGREGATIONS]
    if bad or own_aggregation not in aggregations:
        raise ValueError(f"register: aggregations must come from {AGGREGATIONS} and hold own_aggregation, "
                         f"got {own_aggregation!r} and {aggregations}")

    def add(fn):
        fn.own_aggregation, fn.aggregations, fn.aggregation_reason = own_aggregation, aggregations, aggregation_reason
        fn.keeps_cancellation, fn.per_sequence, fn.whole_groups = keeps_cancellation, per_sequence, whole_groups
        SURROGATES[fn.__name__] = fn
        return fn
    return add


@dataclass
class LossConfig:
    """Everything that defines the objective; train.py exposes each field as a flag.

    "Off" is None for every optional piece (dual_clip, weight_transform, neg_filter_frac)
    and 0.0 for the two coefficients.
    """

    loss_type: str = "ppo"
    """Surrogate: 'ppo' (token ratio clip), 'cispo' (clipped detached ratio), 'gspo' (sequence ratio)."""
    eps_low: float = 0.2
    """Lower clip range: ratios below 1 - eps_low stop pushing down tokens with A < 0."""
    eps_high: float = 0.2
    """Upper clip range: ratios above 1 + eps_high stop pushing up tokens with A > 0 (DAPO: 0.28)."""
    dual_clip: float | None = None
    """Dual clip constant c > 1 (typically 3): caps the loss of A < 0 tokens at -c A (loss_type 'ppo' only). None = off."""
    agg: str | None = None
    """Aggregation (token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm); None = the surrogate's own."""
    weight_transform: str | None = None
    """DFPO transform of GSPO's detached sequence weights: 'min' | 'orth', or the controls 'keep' (untransformed) | 'equal' (all 1); loss_type gspo; None = off."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference policy (0 = off, no reference needed)."""
    kl_estimator: str = "k3"
    """KL estimator on sampled tokens: k1 = log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (r = pi_ref/pi)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (0 = off; entropy is still logged when given)."""
    neg_filter_frac: float | None = None
    """Negative token filtering: in A < 0 rollouts keep only this lowest-probability fraction (paper: 0.1). None = off."""

    @property
    def surrogate(self) -> str:
        """The SURROGATES name in force: loss_type, or 'dfpo' (GSPO with a weight transform)."""
        return "dfpo" if self.weight_transform is not None else self.loss_type

    @property
    def aggregation(self) -> str:
        """The aggregation in force: `agg`, or the surrogate's own when agg is None."""
        return SURROGATES[self.surrogate].own_aggregation if self.agg is None else self.agg

    def __post_init__(self):
        # Checks at the door: every field once, here; the formula functions trust them.
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.weight_transform not in WEIGHT_TRANSFORMS:
            raise ValueError(f"weight_transform must be one of {WEIGHT_TRANSFORMS}, got {self.weight_transform!r}")
        if self.weight_transform is not None and self.loss_type != "gspo":
            raise ValueError(f"weight_transform={self.weight_transform!r} acts on GSPO's sequence weights; "
                             f"it needs loss_type='gspo', got {self.loss_type!r}")
        if self.agg is not None and self.agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS} (or None), got {self.agg!r}")
        accepted = SURROGATES[self.surrogate].aggregations
        if self.aggregation not in accepted:
            needs = f"agg={accepted[0]!r}" if len(accepted) == 1 else f"agg one of {accepted}"
            raise ValueError(f"{SURROGATES[self.surrogate].aggregation_reason}: it needs {needs} (or agg=None), "
                             f"got agg={self.agg!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if not self.eps_high >= 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        # Every clip bound inside the clamp of the log ratio (token_log_ratio), so that the
        # clamp never moves a bound: past e^20 = 4.9e8 a "clip" would be the clamp's.
        bound = math.exp(MAX_LOG_RATIO)
        for name, value, limit in (("1 - eps_low", 1 - self.eps_low, 1 / bound), ("1 + eps_high", 1 + self.eps_high,
                                   bound), ("dual_clip", self.dual_clip, bound)):
            if value is not None and math.isfinite(value) and not 1 / bound < value < bound:
                raise ValueError(f"{name} must lie strictly between e^-{MAX_LOG_RATIO:g} and e^{MAX_LOG_RATIO:g} "
                                 f"(where the log ratio is clamped: loss.MAX_LOG_RATIO), got {value:g}")
        # Only PPO's token clip has a dual clip (Ye et al.: bound a token whose ratio exploded
        # under A < 0). CISPO's weight is capped at 1 + eps_high already; GSPO and DFPO clip
        # whole sequences. Accepted there, it would be an option that silently does nothing.
        if self.dual_clip is not None and self.surrogate != "ppo":
            raise ValueError(f"dual_clip={self.dual_clip} applies to loss_type='ppo' only; {self.surrogate} "
                             f"would ignore it (drop dual_clip)")
        # Upper bounds: where the coefficient stops shaping the update and starts freezing it
        # (1e30 overflowed the gradient norm to inf at every step, and the run exited 0).
        # With a penalty beta, the best policy per token is pi_ref(a) exp(A_a / beta) / Z
        # for the KL and exp(A_a / beta) / Z for the entropy bonus (the Gibbs form of a
        # regularised objective). Advantages are O(1) (GRPO's: within +-2.5 for G = 8, so
        # two tokens' advantages differ by 5 at most). At kl_coef 10 the best policy's odds
        # between two tokens are then within e^0.5 of the reference's: training is pinned
        # to the start (GRPO used 0.04). At entropy_coef 1 they are within e^5 of EVEN
        # odds, whatever the reward: close to uniform noise over the vocabulary (usual
        # values: 0.001 to 0.01). NaN and inf are left to train.py's Config, which names them
        # as such for every float field at once (machinery/flags.py's refuse_nonfinite).
        if math.isfinite(self.kl_coef) and not 0 <= self.kl_coef <= MAX_KL_COEF:
            raise ValueError(f"kl_coef must be in [0, {MAX_KL_COEF}] (at {MAX_KL_COEF} the policy stays within odds "
                             f"e^0.5 of the reference: frozen), got {self.kl_coef}")
        if math.isfinite(self.entropy_coef) and not 0 <= self.entropy_coef <= MAX_ENTROPY_COEF:
            raise ValueError(f"entropy_coef must be in [0, {MAX_ENTROPY_COEF}] (at {MAX_ENTROPY_COEF} the bonus "
                             f"outweighs every reward: near-uniform noise), got {self.entropy_coef}")
        if self.neg_filter_frac is not None and not 0 < self.neg_filter_frac <= 1:
            raise ValueError(f"neg_filter_frac must be in (0, 1] (or None), got {self.neg_filter_frac}")



# ---------------------------------------------------------------------------------------
# The surrogates, each registered (SURROGATES) with its properties. Each takes
# (logp, old_logp, adv, mask, cfg, group_index) and returns (per-token loss [B, T],
# clipped_low, clipped_high, clipped_dual): three [B, T] bool masks of the tokens a clip
# acted on. For PPO, GSPO and DFPO that is the tokens whose gradient the clip removed;
# CISPO removes none, and marks the tokens whose importance weight it clamped
# (policy_loss's stats say the same). adv: [B] per rollout, or [B, T] per token where the
# surrogate is not per_sequence. ppo_clip is PPO's formula on any ratio, which GSPO reuses.
# ---------------------------------------------------------------------------------------

@register(own_aggregation="token-mean", keeps_cancellation=True)
def ppo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig,
        group_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clip (Schulman et al. 2017) on the token ratio rho_t = exp(log pi_t - log pi_old_t).

    A token shared by every rollout at the same context has the same rho_t in each, so
    with a token-sum aggregation its weight is the same in every rollout until the clip
    acts, and then only an asymmetric clip (clip-higher) breaks that: ppo_clip says how.
    """
    return ppo_clip(torch.exp(token_log_ratio(logp, old_logp)), _per_token(adv), cfg.eps_low, cfg.eps_high,
                    cfg.dual_clip)


def token_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log rho_t = log pi_t - log pi_old_t, clamped to [-MAX_LOG_RATIO, MAX_LOG_RATIO] = [-20, 20].

    Why: exp overflows at log rho >= 88.73 in float32 (709.79 in float64). rho = inf then
    makes PPO's clipped branch's gradient 0 * inf = NaN even where the loss is finite
    (A > 0, or A < 0 under the dual clip), and an A < 0 token's loss +inf: a NaN step that
    the trainer would blame on --lr. verl clamps at the same +-20 (core_algos'
    compute_policy_loss_vanilla). Rare when old_logp is the sampler's own; not rare with
    off-policy data or old log-probs brought from elsewhere.
    Where it acts: only at |log rho| > 20 (rho > 4.9e8 or rho < 2.1e-9), outside every
    clip bound (LossConfig keeps 1 - eps_low, 1 + eps_high and dual_clip within
    (e^-20, e^20)), so a token a clip already removes keeps its value and its zero
    gradient. What it changes: an A < 0 token above e^20 without a dual clip gets the
    loss -A e^20 and no gradient (a dual clip at e^20, where the exact gradient -A rho is
    past 4.9e8 |A| or inf), and an A > 0 token below e^-20 loses a gradient of
    A rho < 2.1e-9 A. Inside [-20, 20] the clamp is the identity in value and gradient,
    so a run whose ratios stay there (every on-policy run: rho = 1) is unchanged bit for bit.
    logp, old_logp: [B, T] (old_logp detached). Returns [B, T].
    """
    return (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def ppo_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float,
             dual_clip: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate per token, with separate low/high ranges and dual clip.

        l = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
        dual clip (A < 0 only):  l = min(l, -c A)

    The max picks the pessimistic branch: a token with A > 0 stops getting gradient once
    rho > 1 + eps_high, a token with A < 0 once rho < 1 - eps_low. Clip-higher
    (eps_high > eps_low, DAPO) lets rare good tokens grow further before clipping: it is
    ASYMMETRIC, so rollouts with A > 0 and A < 0 stop at different ratios and a shared
    token's updates no longer cancel. Dual clip bounds the loss of a negative-advantage
    token whose ratio exploded (rho > c), which otherwise dominates the batch; such a
    token's loss is the constant -c A, so it gets NO gradient: it is counted in
    clipped_dual. ratio, adv: [B, T] (adv broadcast from [B, 1] is fine).
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    clipped_low = (adv < 0) & (ratio < 1.0 - eps_low)
    clipped_high = (adv > 0) & (ratio > 1.0 + eps_high)
    clipped_dual = torch.zeros_like(clipped_low)
    if dual_clip is not None:
        clipped_dual = (adv < 0) & (ratio > dual_clip)
        loss = torch.where(clipped_dual, -adv * dual_clip, loss)
    return loss, clipped_low, clipped_high, clipped_dual


@register(own_aggregation="token-mean", keeps_cancellation=True)
def cispo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig,
          group_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the gradient.

        l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi

    The clipped ratio is detached, so it only scales a REINFORCE term: every token keeps a
    gradient (PPO's clip drops tokens outright, often the rare "reflection" tokens).
    On-policy (rho = 1) the gradient equals PPO's. The "clipped" masks here mean
    something else than PPO's: the tokens whose WEIGHT the clamp changed, whatever the
    sign of A (low: rho < 1 - eps_low, raised to 1 - eps_low; high: rho > 1 + eps_high,
    capped), because the clamp biases every such token's gradient, not only the ones PPO
    would drop. None loses its gradient, so dual is empty. (TRL's cispo_clip_ratio counts
    only A > 0 tokens above its cap.)
    """
    ratio, adv = torch.exp(token_log_ratio(logp, old_logp)), _per_token(adv)
    weight = ratio.detach().clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    nothing = torch.zeros_like(ratio, dtype=torch.bool)
    return -weight * adv * logp, ratio < 1.0 - cfg.eps_low, ratio > 1.0 + cfg.eps_high, nothing


def gspo_sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, length: Tensor | None = None) -> Tensor:
    """GSPO's sequence ratio (Zheng et al. 2025): s_i = exp( sum_t mask log rho_{i,t} / L_i ).

    L_i = |o_i| (the sequence's own length, GSPO) unless `length` [B] gives another
    normaliser (the DFPO weights use a group-constant one). The length-normalised
    geometric mean keeps s_i near 1 for long sequences. The exponent is clamped to
    [-MAX_LOG_RATIO, MAX_LOG_RATIO] as token_log_ratio's is (an exponent past 88.7 made
    s_i = inf, and a NaN gradient): GSPO and DFPO pass a detached logp, so the clamp moves
    a value only, past every clip bound. Returns [B], differentiable.
    """
    L = mask.sum(dim=1).clamp(min=1) if length is None else length
    return torch.exp((((logp - old_logp) * mask).sum(dim=1) / L).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


@register(own_aggregation="seq-mean-token-mean", aggregations=("seq-mean-token-mean",),
          aggregation_reason="GSPO's objective is a mean over sequences", keeps_cancellation=False,
          per_sequence=True)
def gspo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig,
         group_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GSPO (Zheng et al. 2025, Qwen) written per token, so that `aggregate` can reduce it.

        GSPO:   J = mean_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
        here:   l_{i,t} = ppo_clip(s_i * exp(log pi_t - sg(log pi_t)), A_i)

    Every token of rollout i carries the VALUE s_i and the gradient s_i grad log pi_t,
    clipped per sequence (all its tokens share one ratio). Averaged over the tokens of
    the sequence (1/|o_i|) and then over sequences, that is exactly GSPO's J and its
    gradient s_i A_i (1/|o_i|) sum_t grad log pi_t; LossConfig therefore allows only
    seq-mean-token-mean here (tests/lesson/test_loss.py checks loss and gradient against an
    independent sequence-level implementation to 1e-6). adv: [B]. It does not keep
    cancellation: s_i differs from rollout to rollout once the policy has moved, and a
    shared token gets each rollout's s_i.
    """
    s = gspo_sequence_ratio(logp.detach(), old_logp, mask)                   # [B] value only
    token_ratio = s.unsqueeze(1) * torch.exp(logp - logp.detach())            # value s_i, grad s_i
    return ppo_clip(token_ratio, adv.unsqueeze(1), cfg.eps_low, cfg.eps_high)


@register(own_aggregation="seq-mean-token-sum-norm", aggregations=TOKEN_SUMS,
          aggregation_reason="DFPO's weights need a token-sum aggregation (seq-mean-token-mean's 1/|o_i| "
                             "re-breaks exchangeability)",
          keeps_cancellation=True, per_sequence=True, whole_groups=True)
def dfpo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig,
         group_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """DFPO (arXiv 2604.13088): GSPO's weights, made exchangeable inside each group.

        s_i  = exp( sum_t log rho_{i,t} / |o_i| )      GSPO's own sequence ratio
        kept = GSPO's trust region on s_i:  A > 0: s_i <= 1 + eps_high;  A < 0: s_i >= 1 - eps_low
        w_i  = exp( sum_t log rho_{i,t} / L_g ),  L_g = max_{j in g} |o_j|        [recon]
        w~   = exchangeability.dfpo_transform(w, A) over the KEPT rollouts;  w~ = 0 if dropped
        l_{i,t} = -w~_i A_i exp(log pi_t - sg(log pi_t))     (value -w~A, grad -w~A grad log pi)

    [recon] Two ratios on purpose: GSPO's s_i decides the trust region; w_i's group-shared
    normaliser keeps a shared token's weight independent of its rollout's length (§3.7).
    Clip first, then transform: a dropped rollout stays at exactly zero gradient. It keeps
    cancellation with the paper's transforms, min and orth; the controls keep and equal
    take it apart again (GSPO's weights, GSPO's clip): exchangeability.py. Why each
    choice: docs/math.md §3.8, §3.11. adv: [B]; group_index: [B]; the transform is
    cfg.weight_transform. Use a token-sum aggregation (LossConfig enforces it); its own is
    Dr. GRPO's token sum over a step constant, the closest exchangeable analog of GSPO's
    per-sequence mean.
    """
    eps_low, eps_high, mode = cfg.eps_low, cfg.eps_high, cfg.weight_transform
    lengths = mask.sum(dim=1)
    groups, inverse = torch.unique(group_index, return_inverse=True)
    group_len = lengths.new_zeros(len(groups)).scatter_reduce(0, inverse, lengths, "amax", include_self=False)
    s = gspo_sequence_ratio(logp.detach(), old_logp, mask)                     # decides keep / drop
    dropped = ((adv > 0) & (s > 1 + eps_high)) | ((adv < 0) & (s < 1 - eps_low))
    w = gspo_sequence_ratio(logp.detach(), old_logp, mask, length=group_len[inverse].clamp(min=1))
    w = exchangeability.dfpo_transform(w, adv, group_index, mode, kept=~dropped)
    per_token = -(w * adv).unsqueeze(1) * torch.exp(logp - logp.detach())
    row = lambda flags: flags.unsqueeze(1).expand_as(mask)
    return per_token, row((adv < 0) & dropped), row((adv > 0) & dropped), row(torch.zeros_like(dropped))


LOSS_TYPES = tuple(name for name in SURROGATES if name != "dfpo")
"""--loss_type's choices: every registered surrogate but dfpo, which is --loss_type gspo with a --weight_transform."""


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
    real frameworks; tests/lesson/test_loss.py checks that one step on k2 or k3 lowers the exact
    KL and that k1's expected gradient vanishes. Returns [B, T].
    """
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r ** 2
    return torch.exp(log_r) - 1.0 - log_r   # k3


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Full-vocabulary entropy H = -sum_v p_v log p_v of softmax(logits), in nats.

    logits: [..., V] -> [...]. Computed as logsumexp(z) - sum_v p_v z_v, which never forms
    log 0. This is the policy's entropy at a position, NOT the surprisal -log p of the
    sampled token (which only estimates it, noisily). Apply any temperature before.
    """
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


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
        k = max(1, math.ceil(frac * n))
        scores = torch.where(mask[i] > 0, old_logp[i], torch.full_like(old_logp[i], big))
        keep[i] = 0.0
        keep[i, torch.topk(scores, k, largest=False).indices] = 1.0
    return keep


# ---------------------------------------------------------------------------------------
# The loss: pick a surrogate, aggregate, add KL and entropy
# ---------------------------------------------------------------------------------------

def per_token_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossConfig,
                        group_index: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The configured surrogate (SURROGATES[cfg.surrogate]) and negative-token filter per token, before aggregation.

    Returns (l [B, T], clipped_low, clipped_high, clipped_dual); see the surrogates above.
    """
    per_token, *clipped = SURROGATES[cfg.surrogate](logp, old_logp, advantages, mask, cfg, group_index)
    if cfg.neg_filter_frac is not None:
        per_token = per_token * negative_token_filter(old_logp, mask, advantages, cfg.neg_filter_frac)
    return (per_token, *clipped)


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossConfig,
                norm: StepNorm, group_index: Tensor | None = None, ref_logp: Tensor | None = None,
                entropy: Tensor | None = None) -> tuple[Tensor, dict]:
    """This micro-batch's share of the step's loss, and the statistics a trainer logs.

        loss = aggregate(surrogate) + kl_coef * aggregate(KL) - entropy_coef * aggregate(H)

    logp: [B, T] log pi(o_t) under the current policy (differentiable); old_logp: [B, T]
    under the sampling policy; advantages: [B] per rollout (or [B, T] per token for ppo and
    cispo); mask: [B, T]; norm: from aggregation.step_normaliser on the WHOLE step; group_index: [B]
    (DFPO needs it); ref_logp: [B, T] (iff kl_coef > 0); entropy: [B, T] full-vocabulary
    entropy (differentiable if entropy_coef > 0).
    Stats, python floats, token-means over THIS call (combine micro-batches weighted by
    "n_tokens"; the "n_*" counts add up): clip_frac_low/_high/_dual (0 by construction with
    one step per batch), approx_kl (k3 of KL(pi_old || pi)), entropy, kl_ref, n_tokens, and
    for dfpo the group counts of exchangeability.dfpo_group_counts. Definitions:
    docs/metrics.md. The cancellation residual is separate (cancellation_residual_of_loss):
    training pays nothing.
    """
    _check_inputs(logp, old_logp, advantages, mask, cfg, group_index, ref_logp)
    mask = mask.to(logp.dtype)
    old_logp = old_logp.detach()
    per_token, clipped_low, clipped_high, clipped_dual = per_token_surrogate(
        logp, old_logp, advantages, mask, cfg, group_index)
    loss = aggregate(per_token, mask, cfg.aggregation, norm)
    stats = {}
    if cfg.kl_coef > 0:
        kl = kl_penalty(logp, ref_logp.detach(), cfg.kl_estimator)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.aggregation, norm)
        stats["kl_ref"] = masked_mean(kl.detach(), mask)
    if entropy is not None:
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.aggregation, norm)
        stats["entropy"] = masked_mean(entropy.detach(), mask)

    with torch.no_grad():
        log_ratio = logp.detach() - old_logp
        stats["n_tokens"] = float(mask.sum())
        stats["clip_frac_low"] = masked_mean(clipped_low, mask)
        stats["clip_frac_high"] = masked_mean(clipped_high, mask)
        stats["clip_frac_dual"] = masked_mean(clipped_dual, mask)
        stats["approx_kl"] = masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)
        if cfg.surrogate == "dfpo":      # a dropped rollout has every token flagged, in low or high
            dropped = (clipped_low | clipped_high).any(dim=1)
            stats.update(exchangeability.dfpo_group_counts(advantages, dropped, group_index))
    return loss, stats


# ---------------------------------------------------------------------------------------
# Diagnostic: the cancellation residual of the loss actually used
# ---------------------------------------------------------------------------------------

def rollout_coefficients(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                         cfg: LossConfig, norm: StepNorm, group_index: Tensor) -> Tensor:
    """m_i: the coefficient a typical token of rollout i gets on grad log pi, [B] float64.

        c_{i,t} = -dLoss/dlogp_{i,t},   m_i = mean_t c_{i,t}

    A token shared by the group at the same context gets sum_i c_{i,t} times its gradient,
    so m_i is what rollout i adds to it and exchangeability.cancellation_residual(m,
    group_index) says how far the group is from cancelling. With the step-fixed `norm`, m_i depends only on
    rollout i (and its group, for DFPO), so m of several micro-batches can be concatenated.
    Float rounding is not a weight: m_i = 0 where |m_i| <= RESIDUAL_REL_TOL * |A_i| u_i
    (exchangeability.py), u_i the aggregation's coefficient for a rollout of weight 1
    (docs/math.md §3.9 says why).
    One backward through surrogate and aggregation, never the model: call it when a
    diagnostic wants the number. KL and entropy terms are left out.
    logp, old_logp, mask: [B, T] (detached is fine); advantages, group_index: [B].
    """
    leaf = logp.detach().clone().requires_grad_(True)
    unit = torch.zeros_like(leaf, requires_grad=True)        # d aggregate / d per-token loss
    mask = mask.to(leaf.dtype)
    with torch.enable_grad():
        per_token = per_token_surrogate(leaf, old_logp.detach(), advantages, mask, cfg, group_index)[0]
        (coef,) = torch.autograd.grad(aggregate(per_token, mask, cfg.aggregation, norm), leaf)
        (u,) = torch.autograd.grad(aggregate(unit, mask, cfg.aggregation, norm), unit)
    tokens = mask.sum(dim=1).clamp(min=1)
    m = (-(coef * mask).sum(dim=1) / tokens).double()
    u = ((u * mask).sum(dim=1) / tokens).double()
    noise = m.abs() <= exchangeability.RESIDUAL_REL_TOL * advantages.detach().double().abs() * u.abs()
    return torch.where(noise, torch.zeros_like(m), m)


def cancellation_residual_of_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                                  cfg: LossConfig, norm: StepNorm, group_index: Tensor) -> float:
    """nanmean over groups of R_g for the rollouts given; NaN if no group has anything to cancel.

    How far a configuration is from exact cancellation, read off its own gradient
    (rollout_coefficients, then exchangeability.cancellation_residual: a group cut across
    calls is judged on its part in this call). Same shapes as rollout_coefficients.
    """
    r = exchangeability.cancellation_residual(
        rollout_coefficients(logp, old_logp, advantages, mask, cfg, norm, group_index), group_index)
    return float(torch.nanmean(r)) if bool(torch.isfinite(r).any()) else float("nan")


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _per_token(adv: Tensor) -> Tensor:
    """A per-rollout advantage [B] as [B, 1], broadcast over the tokens; [B, T] unchanged."""
    return adv.unsqueeze(1) if adv.dim() == 1 else adv


def _check_inputs(logp, old_logp, advantages, mask, cfg, group_index, ref_logp) -> None:
    """policy_loss's checks at the door: shapes, finiteness, what the config needs."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f"policy_loss: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must all be the same [B, T]")
    B = logp.shape[0]
    if advantages.shape not in ((B,), (B, logp.shape[1])):
        raise ValueError(f"policy_loss: advantages must be [B]={B} or [B, T], got {tuple(advantages.shape)}")
    if not torch.isfinite(advantages).all():
        raise ValueError("policy_loss: advantages contain NaN or inf")
    if advantages.dim() == 2 and (SURROGATES[cfg.surrogate].per_sequence or cfg.neg_filter_frac is not None):
        raise ValueError(f"policy_loss: {cfg.surrogate} / negative token filtering need one advantage per "
                         f"rollout, shape [B]={B}, got {tuple(advantages.shape)}")
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if SURROGATES[cfg.surrogate].whole_groups and (group_index is None or group_index.shape != (B,)):
        raise ValueError(f"policy_loss: {cfg.surrogate} reads whole groups: it needs group_index of shape [B]={B}")
    if cfg.surrogate == "dfpo" and cfg.weight_transform == "orth":
        # orth would re-centre advantages that do not sum to zero (see exchangeability.dfpo_transform)
        groups, inverse = torch.unique(group_index, return_inverse=True)
        total = advantages.new_zeros(len(groups)).index_add_(0, inverse, advantages)
        scale = advantages.new_zeros(len(groups)).index_add_(0, inverse, advantages.abs())
        worst = int((total.abs() - 1e-6 * scale).argmax())
        if total[worst].abs() > 1e-6 * scale[worst] + 1e-12:
            raise ValueError(f"policy_loss: weight_transform='orth' needs advantages that sum to zero in every "
                             f"group (orth would re-centre them); group {int(groups[worst])} sums to "
                             f"{float(total[worst]):.4g}. Use a zero-sum advantage or 'min'.")
