"""Mini-batch formation: keeping cancellation alive.

One rollout batch (N prompts x G rollouts = N*G rollouts) usually feeds several optimizer
steps: PPO-style training splits it into mini-batches, and may run several epochs over
it. Each optimizer step sums the gradients of *its own* rollouts only, moves the weights,
and only then does the next step look at its rollouts. This file decides which rollouts
share a step, and that choice is not neutral.

Why the split matters (Cancellation Hypothesis paper, arXiv 2605.08666). Inside a group
whose advantages sum to zero, a token that every rollout shares at the same context (in
our addition task: "+", "=", "\\n", "A:") receives the push A_i from every rollout i. In
ONE summed gradient those pushes cancel: sum_i A_i = 0, so the template token does not
move, and what remains is credit for the tokens that differ between successes and
failures (the paper's "hidden token-level credit assignment"). Cancellation needs the
group's positive and negative rollouts to be in the same gradient. Split them across two
optimizer steps and step 1 pushes the template token up, step 2 pushes it down, and these
two sequential moves do not cancel: step 2's gradient is taken at weights that step 1
already moved, Adam normalises each step separately, PPO clipping sees different ratios,
and the parameters shared with every other token drift in between. So:

  random          shuffle individual rollouts, then split. The common default (TRL, verl
                  mini-batching). Splits almost every group: with N=4, G=8 and 2 steps, a
                  given group lands whole in one step with probability
                  2*C(24,8)/C(32,16) = 0.24%.
  query           "query-preserved mini-batching" (the paper's first intervention):
                  shuffle whole groups, then split, so every group lives in one step.
  balanced        "reward-balanced batching" (the paper's second intervention): every
                  step gets as equal numbers of positive and negative rollouts as the batch
                  allows. Groups may be split. [recon] the paper's exact rule is unknown;
                  ours deals positives and negatives round-robin (see the function).
  query_balanced  both at once [recon]: pack whole groups into steps so each step's
                  positive and negative masses are as equal as possible, e.g. pair a group
                  that solved 1/8 (1 positive, 7 negatives) with one that solved 7/8.
  mass_balanced   advantage-mass balancing [recon]: like `balanced` it may split groups,
                  but it balances the SUM of the advantages in each step instead of the
                  counts. Cancellation needs sum_{b in step} A_b = 0: a token whose gradient
                  is the same in every rollout of the step moves by that sum times its
                  gradient. With GRPO a 1/4-solved group's one success (+1.5) outweighs
                  each of its failures (-0.5), so a step with 2 positives and 2 negatives
                  can still push such a token hard; equal counts are not equal mass.
  random_recentred  a CONTROL, this project's, not a paper's: the split of `random` (the
                  same draws, so the same steps at the same seed), and then each group's
                  part in each step re-centred to zero-sum advantage (step_advantages).
                  Query mini-batches change two things at once: every group cancels
                  inside its step, AND a step holds N/k whole groups (8 prompts of 32
                  with 4 steps) instead of about N (random: ~29 of 32 prompts per step).
                  This mode keeps random's prompts per step and gives back cancellation,
                  so an effect of `query` that it shares is cancellation's, and one it
                  does not share is the prompts per step's. It changes the advantages:
                  a group part of one rollout, or of one reward, gets A = 0, so it
                  trains on less advantage mass than random (train.py logs
                  mb/adv_abs_trained). Needs a zero-sum advantage (the flags' check).
  random_masked   a CONTROL of the control, this project's: random's split again (the
                  same draws), advantage 0 on exactly the rollouts random_recentred zeroes
                  (a part of one rollout, a part whose rollouts share an advantage), every
                  other rollout keeps its batch advantage, NOT re-centred, and the whole
                  step is scaled so that its sum of |A| equals random_recentred's. So it
                  trains on the same rollouts, the same prompts and the same advantage mass
                  as random_recentred in every step, and differs from it in one thing: its
                  parts do not sum to zero, so shared tokens do not cancel inside the step.
                  random_recentred against random changes two things (cancellation, and
                  the rollouts and mass that carry gradient); this arm lets a sweep take
                  them apart (trained_counts measures what each mode holds fixed).

Conventions. A rollout is "positive" if its advantage is > 0, "negative" if < 0, and
"neutral" if exactly 0 (all-equal groups under any zero-sum advantage; dropped rollouts
under psr/nsr). Rollout indices are flat and prompt-major: b = n*G + g, rollout b belongs
to prompt b // G, matching the [B, T] per-token tensors of the rest of the project. Each
step's indices are returned sorted ascending (the order inside a step does not change its
summed gradient, and sorted indices keep a group's rollouts next to each other); the ORDER
OF THE STEPS is random. All randomness comes from the torch.Generator the caller passes;
train.py passes one generator that advances every epoch, so every epoch reshuffles and
the whole run is reproducible from the seed. With n_minibatches = 1 every mode returns the
whole batch as one step, and the choice of mode makes no difference at all.

Token-weighted masses. Under token-mean aggregation (docs/math.md §3.4) a rollout's total
gradient weight grows with its length, so equal *counts* of positives and negatives can
still be an unequal push. query_balanced therefore balances token sums when `lengths`
(response token counts, [N, G]) is given, and counts otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

MODES = ("random", "query", "balanced", "query_balanced", "mass_balanced", "random_recentred", "random_masked")
RECENTRED = ("random_recentred", "random_masked")   # modes whose steps train on advantages changed per group part
RANDOM_SPLIT = ("random", "random_recentred", "random_masked")   # modes that draw random's split: the same steps


# ---------------------------------------------------------------------------------------
# The main idea: one list of index tensors per optimizer step
# ---------------------------------------------------------------------------------------

def minibatch_indices(advantages: Tensor, n_minibatches: int, mode: str,
                      generator: torch.Generator, lengths: Tensor | None = None) -> list[Tensor]:
    """Split one rollout batch into `n_minibatches` optimizer steps.

    advantages: [N, G] float, the advantages that will be trained on (signs; values only in
        mass_balanced). NaN/inf is an error.
    n_minibatches: k, 1 <= k <= N*G (k <= N for the group-preserving modes).
    mode: one of MODES (module header; docs/math.md §5).
    generator: seeded torch.Generator; the result is a deterministic function of its state,
        and it advances, so the next call (next epoch) reshuffles.
    lengths: optional [N, G] response token counts (>= 0), used by query_balanced only.
    Returns k LongTensors of flat rollout indices b = n*G + g, each sorted ascending, that
    partition range(N*G) exactly. random, query and mass_balanced give near-equal chunks
    (sizes differ by at most one rollout, resp. one group); balanced and query_balanced:
    see their helpers.
    """
    n_prompts, group_size = _check_advantages(advantages)
    if lengths is not None:
        _check_lengths(lengths, advantages.shape)
    if mode not in MODES:
        raise ValueError(f"unknown mini-batch mode {mode!r}; expected one of {MODES}")
    total = n_prompts * group_size
    if isinstance(n_minibatches, bool) or not isinstance(n_minibatches, int):
        raise ValueError(f"n_minibatches must be an int, got {n_minibatches!r}")
    if n_minibatches < 1 or n_minibatches > total:
        raise ValueError(f"n_minibatches must be in [1, N*G={total}], got {n_minibatches}")
    if mode in ("query", "query_balanced") and n_minibatches > n_prompts:
        raise ValueError(f"mode {mode!r} keeps groups whole, so it needs N >= n_minibatches; "
                         f"got N={n_prompts} groups and n_minibatches={n_minibatches}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")

    if mode in RANDOM_SPLIT:                              # the same draws: the same steps
        order = torch.randperm(total, generator=generator)
        steps = list(torch.tensor_split(order, n_minibatches))
    elif mode == "query":
        group_order = torch.randperm(n_prompts, generator=generator)
        steps = [_expand_groups(chunk, group_size)
                 for chunk in torch.tensor_split(group_order, n_minibatches)]
    elif mode == "balanced":
        steps = _balanced(advantages, n_minibatches, generator)
    elif mode == "mass_balanced":
        steps = _mass_balanced(advantages, n_minibatches, generator)
    else:
        steps = _query_balanced(advantages, n_minibatches, generator, lengths)

    # Sort inside each step (readability; the summed gradient does not care), and shuffle
    # the order of the steps so no step position is systematically the "big" one.
    steps = [torch.sort(s).values for s in steps]
    step_order = torch.randperm(len(steps), generator=generator)
    return [steps[i] for i in step_order.tolist()]


def step_advantages(advantages: Tensor, step: Tensor, group_size: int, mode: str) -> Tensor:
    """The advantages one optimizer step trains on: `advantages` itself, re-centred, or masked.

    advantages: [B] flat, b = n*G + g; step: the step's flat indices (a LongTensor);
    group_size: G; mode: one of MODES. Returns a [B] tensor whose entries at `step` are
    what the step trains on (the others are not read). For every mode but the two in
    RECENTRED that is the batch's advantages, the same tensor, untouched.

    random_recentred: for the rollouts P_n of group n inside the step,
        A'_b = A_b - mean_{b' in P_n} A_{b'}        (b in P_n)
    so sum_{b in P_n} A'_b = 0 and a token every rollout of the part shares at the same
    weight cancels inside the step, as in a whole group (exchangeability.cancellation_residual of
    the step is 0 at ratio 1). A part of one rollout gets 0 (it has nothing to cancel
    against), and so does every part whose advantages are all equal (one reward): exactly
    0, not the float residue of A - mean(A), so that "the rollouts it trains on" is a set
    (with RLOO's advantages about 1 part in 700 left a residue of ~1e-8). A whole group
    keeps its advantages up to float rounding (a zero-sum advantage's group mean is 0).
    Example: G = 4, A = [+1.5, -0.5, -0.5, -0.5], the step holds rollouts 0, 1, 2:
    mean +0.167, so A' = [+1.333, -0.667, -0.667] (and rollout 3, in another step, gets
    its own part's re-centring there).

    random_masked: the rollouts A' leaves at 0 get 0; the others keep A_b, scaled by one
    number per step,
        A''_b = s A_b [A'_b != 0],     s = sum_{b in step} |A'_b| / sum_{b in step} |A_b| [A'_b != 0]
    so the step trains on the same rollouts and the same sum of |A| as random_recentred's,
    but its parts keep their signs' imbalance: they do not sum to 0 (a whole group does).
    Example, the step above: A' = [+1.333, -0.667, -0.667], sum |A'| = 2.667; the kept
    batch advantages [+1.5, -0.5, -0.5] sum to 2.5 in |A|, so s = 1.067 and
    A'' = [+1.6, -0.533, -0.533] (part sum +0.533, not 0). A step where A' is 0 everywhere
    trains on 0 everywhere (s is not needed).
    """
    if mode not in RECENTRED:
        return advantages
    step = step.to(advantages.device)
    part = advantages[step]
    groups, inverse = torch.unique(step // group_size, return_inverse=True)
    sums = part.new_zeros(len(groups)).index_add_(0, inverse, part)
    counts = torch.bincount(inverse, minlength=len(groups)).to(part.dtype)
    # A part is "one reward" when its largest and smallest advantages are equal (a part of one
    # rollout included): it trains on exactly 0.
    high = part.new_full((len(groups),), -torch.inf).scatter_reduce(0, inverse, part, "amax")
    low = part.new_full((len(groups),), torch.inf).scatter_reduce(0, inverse, part, "amin")
    varied = (high > low)[inverse]
    recentred = torch.where(varied, part - (sums / counts)[inverse], torch.zeros_like(part))
    out = advantages.clone()
    if mode == "random_recentred":
        out[step] = recentred
        return out
    kept = torch.where(varied, part, torch.zeros_like(part))
    mass = kept.abs().sum()
    out[step] = kept * (recentred.abs().sum() / mass) if mass > 0 else kept
    return out


def trained_counts(trained: Tensor, step: Tensor, group_size: int) -> dict:
    """What carries gradient in one optimizer step: {"rollouts", "prompts", "adv_abs_sum"}.

    trained: [B] the advantages the step trains on (step_advantages' result); step: its
    flat indices. rollouts = #{b in step : A_b != 0}, prompts = the groups with at least
    one such rollout, adv_abs_sum = sum_{b in step} |A_b|. A rollout whose advantage is
    exactly 0 contributes nothing to the gradient (forward.carries_gradient skips it), so
    these, not the rollouts present, are what a step trains on. train.py logs them per
    optimizer step (mb/rollouts_trained, mb/prompts_trained, mb/adv_abs_sum_trained) for
    its own mode and for every mode that shares its split (RANDOM_SPLIT): a control's
    held-fixed check compares them on the same batch (experiments/held_fixed.py HeldFixed).
    Example: G = 4, trained [1.333, -0.667, -0.667, x, 0, ...] on step [0, 1, 2, 4]:
    rollouts 3, prompts 1, adv_abs_sum 2.667.
    """
    a = trained[step.to(trained.device)]
    carries = a != 0
    return {"rollouts": int(carries.sum()),
            "prompts": int(torch.unique(step.to(trained.device)[carries] // group_size).numel()),
            "adv_abs_sum": float(a.abs().sum())}


def _balanced(advantages: Tensor, k: int, generator: torch.Generator) -> list[Tensor]:
    """Reward-balanced steps [recon]: deal positives and negatives round-robin, aligned.

    Rule (ours; the paper's exact rule is unknown):
      1. shuffle the P positives and deal them round-robin over steps 0..k-1;
      2. shuffle the Q negatives and deal them round-robin ALSO from step 0;
      3. shuffle the neutrals and give each to the smallest step (lowest index on ties).
    Aligned dealing gives every step d_s = n_pos - n_neg = floor or ceil of (P - Q)/k, so
    max_s |d_s| = ceil(|P - Q| / k), which no split beats (tested). The price: without
    enough neutrals, step sizes differ by up to 2 (P = Q = 3, k = 2: sizes 4 and 2).
    Groups are split freely, as in random mode. Details: docs/math.md §5.1.
    """
    flat = advantages.reshape(-1)
    buckets: list[list[int]] = [[] for _ in range(k)]
    for selector in (flat > 0, flat < 0):
        members = torch.nonzero(selector).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        for j, b in enumerate(members.tolist()):
            buckets[j % k].append(b)
    neutrals = torch.nonzero(flat == 0).flatten()
    neutrals = neutrals[torch.randperm(len(neutrals), generator=generator)]
    for b in neutrals.tolist():
        smallest = min(range(k), key=lambda s: len(buckets[s]))
        buckets[smallest].append(b)
    return [torch.tensor(bucket, dtype=torch.long) for bucket in buckets]


def _mass_balanced(advantages: Tensor, k: int, generator: torch.Generator) -> list[Tensor]:
    """Steps whose advantages sum to (nearly) zero [recon]: greedy number partitioning.

    Target: every step's S_s = sum_{b in s} A_b as close to 0 as the batch allows (at best
    sum_b A_b / k each). Why: under token-mean at ratio 1, a token with the same gradient g
    in every rollout of the step moves by (S_s / n_tokens) g, whatever the lengths.
    Rule (ours): non-neutral rollouts by |A_b| descending (shuffled first for ties), each
    into the non-full step minimising |S_s + A_b|; neutrals fill the remaining places;
    then swap pairs between the largest- and smallest-sum steps while that narrows the gap.
    Step s holds at most floor(B/k) + [s < B mod k] rollouts, as in random mode.
    Groups are split: for steps too small for whole groups, or non-zero-sum advantages
    (psr, asym, FADE with delta < 1), where query balances nothing. Greedy, not optimal.
    Worked example and the full rule: docs/math.md §5.1.
    """
    values = advantages.reshape(-1).tolist()
    total = len(values)
    capacity = [total // k + (1 if s < total % k else 0) for s in range(k)]
    shuffled = torch.randperm(total, generator=generator).tolist()
    movers = sorted((b for b in shuffled if values[b] != 0.0), key=lambda b: -abs(values[b]))
    buckets: list[list[int]] = [[] for _ in range(k)]
    sums = [0.0] * k
    for b in movers:
        open_steps = [s for s in range(k) if len(buckets[s]) < capacity[s]]
        best = min(open_steps, key=lambda s: (abs(sums[s] + values[b]), len(buckets[s]), s))
        buckets[best].append(b)
        sums[best] += values[b]
    for b in (b for b in shuffled if values[b] == 0.0):
        open_steps = [s for s in range(k) if len(buckets[s]) < capacity[s]]
        buckets[min(open_steps, key=lambda s: (len(buckets[s]), s))].append(b)
    for _ in range(total):                       # each swap strictly narrows the widest gap
        hi = max(range(k), key=lambda s: sums[s])
        lo = min(range(k), key=lambda s: sums[s])
        gap = sums[hi] - sums[lo]
        # Swapping x (in hi) for y (in lo) moves d = A_x - A_y: the new gap is |gap - 2d|.
        a_hi = torch.tensor([values[b] for b in buckets[hi]], dtype=torch.float64)
        a_lo = torch.tensor([values[b] for b in buckets[lo]], dtype=torch.float64)
        new_gap = (gap - 2 * (a_hi[:, None] - a_lo[None, :])).abs()
        i, j = divmod(int(new_gap.argmin()), len(a_lo))
        if not float(new_gap[i, j]) < gap - 1e-12:
            break
        x, y = buckets[hi][i], buckets[lo][j]
        buckets[hi][i], buckets[lo][j] = y, x
        sums[hi] -= values[x] - values[y]
        sums[lo] += values[x] - values[y]
    return [torch.tensor(bucket, dtype=torch.long) for bucket in buckets]


def _query_balanced(advantages: Tensor, k: int, generator: torch.Generator,
                    lengths: Tensor | None) -> list[Tensor]:
    """Whole groups packed so each step's positive and negative masses balance [recon].

    Group n's imbalance, mass = rollout count (no lengths) or token count (lengths given):
        e_n = sum_{g: A>0} w_ng - sum_{g: A<0} w_ng,   w = 1 or w = lengths.
    Greedy (ours): shuffle the groups, stable-sort by |e_n| descending, put each into the
    non-full step minimising |step imbalance + e_n| (ties: fewer groups, then lower index).
    Step s holds at most floor(N/k) + [s < N mod k] groups, so group and rollout counts
    per step are near-equal. Example: G = 8, two groups solved 1/8 (e = -6) and two 7/8
    (e = +6), k = 2: each step gets one of each, 8 positives and 8 negatives (tested).
    Not optimal in general (NP-hard); docs/math.md §5.1.
    """
    n_prompts, group_size = advantages.shape
    weight = torch.ones_like(advantages) if lengths is None else lengths.to(advantages.dtype)
    imbalance = ((advantages > 0) * weight).sum(1) - ((advantages < 0) * weight).sum(1)

    shuffled = torch.randperm(n_prompts, generator=generator).tolist()
    order = sorted(shuffled, key=lambda n: -abs(float(imbalance[n])))   # stable sort
    capacity = [n_prompts // k + (1 if s < n_prompts % k else 0) for s in range(k)]
    members: list[list[int]] = [[] for _ in range(k)]
    totals = [0.0] * k
    for n in order:
        e = float(imbalance[n])
        open_steps = [s for s in range(k) if len(members[s]) < capacity[s]]
        best = min(open_steps, key=lambda s: (abs(totals[s] + e), len(members[s]), s))
        members[best].append(n)
        totals[best] += e
    return [_expand_groups(torch.tensor(m, dtype=torch.long), group_size) for m in members]


# ---------------------------------------------------------------------------------------
# What each step contains (train.py logs these)
# ---------------------------------------------------------------------------------------

def minibatch_stats(indices: list[Tensor], advantages: Tensor,
                    lengths: Tensor | None = None) -> list[dict]:
    """Composition of each optimizer step, one dict per step.

    Keys: n_rollouts; n_groups (groups with a rollout in the step); n_whole_groups (groups
    with ALL G rollouts in it: cancellation possible); n_pos, n_neg, n_neutral (A > 0,
    < 0, == 0); pos_tokens, neg_tokens (sum of `lengths` over positive / negative
    rollouts, None without lengths); pos_mass = sum of A over positives (m_S of the step),
    neg_mass = sum of |A| over negatives (m_F).
    Example: G = 2, advantages [[+0.5, -0.5], [0, 0]], indices [[0, 2], [1, 3]]: step 0
    has n_groups 2, n_whole_groups 0, n_pos 1, n_neg 0, n_neutral 1, pos_mass 0.5.
    indices: LongTensors of flat indices b = n*G + g (any partition, or not).
    advantages: [N, G]; lengths: optional [N, G].
    """
    n_prompts, group_size = _check_advantages(advantages)
    if lengths is not None:
        _check_lengths(lengths, advantages.shape)
    flat = advantages.reshape(-1)
    flat_len = None if lengths is None else lengths.reshape(-1)
    total = n_prompts * group_size
    out = []
    for idx in indices:
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= total):
            raise ValueError(f"rollout index out of range [0, {total}): "
                             f"min {int(idx.min())}, max {int(idx.max())}")
        a = flat[idx]
        pos, neg = a > 0, a < 0
        groups, counts = torch.unique(idx // group_size, return_counts=True)
        stats = {
            "n_rollouts": int(len(idx)),
            "n_groups": int(len(groups)),
            "n_whole_groups": int((counts == group_size).sum()),
            "n_pos": int(pos.sum()),
            "n_neg": int(neg.sum()),
            "n_neutral": int((a == 0).sum()),
            "pos_tokens": None if flat_len is None else float(flat_len[idx][pos].sum()),
            "neg_tokens": None if flat_len is None else float(flat_len[idx][neg].sum()),
            "pos_mass": float(a[pos].sum()),
            "neg_mass": float(-a[neg].sum()),
        }
        out.append(stats)
    return out


def split_groups(indices: list[Tensor], group_size: int) -> int:
    """How many groups have rollouts in more than one step (0 means no group was split).

    This is the one-number summary of how much cancellation the split destroyed: for
    query and query_balanced it is 0 by construction; for random it is nearly every group
    that has both signs. indices: list of LongTensors of flat indices b = n*G + g.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    step_of_group: dict[int, int] = {}
    split: set[int] = set()
    for s, idx in enumerate(indices):
        for b in torch.as_tensor(idx).reshape(-1).tolist():
            n = b // group_size
            if step_of_group.setdefault(n, s) != s:
                split.add(n)
    return len(split)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _expand_groups(groups: Tensor, group_size: int) -> Tensor:
    """Group ids [m] -> their flat rollout indices [m*G]: n -> n*G + 0 .. n*G + G-1."""
    offsets = torch.arange(group_size, dtype=torch.long)
    return (groups.long()[:, None] * group_size + offsets[None, :]).reshape(-1)


def _check_advantages(advantages: Tensor) -> tuple[int, int]:
    """Validate an [N, G] finite float advantage tensor; return (N, G)."""
    if not isinstance(advantages, Tensor):
        raise ValueError(f"advantages must be a torch.Tensor, got {type(advantages).__name__}")
    if advantages.dim() != 2:
        raise ValueError(f"advantages must be [N, G], got shape {tuple(advantages.shape)}")
    n_prompts, group_size = advantages.shape
    if n_prompts < 1 or group_size < 1:
        raise ValueError(f"advantages must be non-empty, got shape {tuple(advantages.shape)}")
    if not torch.isfinite(advantages).all():
        raise ValueError(f"advantages contain NaN or inf: {advantages}")
    return n_prompts, group_size


def _check_lengths(lengths: Tensor, shape: torch.Size) -> None:
    """Validate [N, G] response lengths: same shape as the advantages, finite, >= 0."""
    if not isinstance(lengths, Tensor):
        raise ValueError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.shape != shape:
        raise ValueError(f"lengths must have the advantages' shape {tuple(shape)}, "
                         f"got {tuple(lengths.shape)}")
    if not torch.isfinite(lengths.float()).all() or (lengths < 0).any():
        raise ValueError(f"lengths must be finite and >= 0, got {lengths}")
