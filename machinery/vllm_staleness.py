"""The staleness canary: does vLLM sample from the weights the trainer holds now? (trap 7)

With --backend vllm there are two copies of the policy: the trainer's, which the
optimizer changes every step, and the engine's, which push_weights (vllm_rollout.py)
overwrites after every step. A push that never arrived, a prefix cache kept from the old
weights, a tied head left behind (traps 1-3): each leaves the engine sampling from OTHER
weights than the ones the trainer scores the samples with, and nothing fails. The loss
is computed, the run goes on, and its rollouts are off-policy by an unknown amount.

The canary catches that at no extra cost. The engine returns the log-prob of every token
it samples; the trainer computes its own log-probs of the same tokens anyway, in its
"old policy" pass (logp_old, which it recomputes rather than take the engine's, as verl
does). With the same weights on both sides the two differ by numerics only, so their mean
absolute difference over the sampled tokens, staleness_gap in nats, reads how far apart
the two copies are. Each step's gap is logged (vllm/canary_gap) beside its bound
(vllm/canary_bound), and a gap above the bound is a warning on stderr.

Why the bound is relative to the run's first gap, not a fixed number: "numerics only"
depends on the setup. Engine and trainer both in float32 disagree by ~1e-7 nats; a bf16
engine against an fp32 trainer by 1e-3 to 0.06, depending on the model and kernels. A
threshold low enough for the first misses nothing but fires on every healthy step of
the second; one high enough for the second is blind in the first. So the reference is
the gap of the run's FIRST batch, sampled (on a fresh run) before any push, when both
copies were loaded from the same checkpoint: the numerical disagreement of THIS setup,
measured. A step is judged stale above max(CANARY_RATIO x first gap, CANARY_FLOOR_NATS)
(staleness_bound, where the factor's measurements are); the floor keeps float32 noise
from ever tripping it. What it cannot see: staleness smaller than the numerics, such as
a bf16 engine one small step behind. The numbers and the trials behind them:
docs/vllm.md, "The canary's bound".

Does the bound separate a fresh engine from a stale one on a real engine? gpu_smoke_test
(trap 10) asks on any device: push the true weights (the reference gap), perturb the
trainer and push (within the bound), restore the trainer WITHOUT pushing (the negative
control: above it), push again (within it). Tested against exact values and with a
stale engine as negative control, without vLLM (tests/engine/test_vllm_rollout.py) and
with it (tests/engine/test_vllm_engine.py, which also runs gpu_smoke_test on vLLM's CPU
build).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import torch
from torch import Tensor

from machinery import logprobs, rollout
from machinery.vllm_rollout import engine_max_model_len, generate_rollouts_vllm, make_engine, push_weights

CANARY_RATIO = 3.0
"""A gap above 3 x the first step's gap means the engine holds other weights (staleness_bound)."""
CANARY_FLOOR_NATS = 1e-4
"""Never warn below this gap: guards a first gap of ~1e-7 (fp32) against noise."""


# ---------------------------------------------------------------------------------------
# 1. The canary (trap 7)
# ---------------------------------------------------------------------------------------

def staleness_gap(vllm_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> float:
    """Mean absolute log-prob gap over real response tokens, in nats.

        gap = sum_{b,t} m_{b,t} |lp_vllm - lp_trainer| / sum_{b,t} m_{b,t}

    Both sides score the SAME sampled tokens: vLLM while sampling, the trainer in its
    teacher-forced "old policy" pass right after. With identical weights only numerics
    differ: ~1e-7 in float32, ~1e-3 to 0.06 nats with a bf16 engine against an fp32
    trainer. Well above that the engine samples from other weights than the trainer
    scores with (a missed push, a stale prefix cache, a reload from disk, a stale tied
    head: traps 1-3) or with another sampling setup. staleness_bound says how far is "well
    above"; measurements in docs/vllm.md.

    Shapes [B, T] (equal); padding values are ignored even if NaN. Returns 0.0 when the
    mask is empty.
    """
    if vllm_logp.shape != trainer_logp.shape or vllm_logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: vllm_logp {tuple(vllm_logp.shape)}, trainer_logp "
                         f"{tuple(trainer_logp.shape)}, mask {tuple(mask.shape)}")
    real = mask > 0
    diff = torch.where(real, (vllm_logp.float() - trainer_logp.float()).abs(), torch.zeros((), dtype=torch.float32))
    return float(diff.sum() / real.sum().clamp(min=1))


def staleness_bound(first_gap: float) -> float:
    """The gap above which a step's rollouts are judged stale: max(3 * first_gap, 1e-4).

    first_gap: staleness_gap of the run's FIRST rollout batch, when engine and trainer hold
    the same checkpoint and no push has happened: the measured numerical disagreement of
    THIS setup (dtype, kernels, model, prompts). Each step warns when staleness_gap >
    staleness_bound(first_gap). [recon] TRL and verl log a similar gap but do not judge it;
    the factor 3 is ours, from measurements (bf16 engine: fresh pushes stayed within
    1.34 x the first gap; fp32: ~1e-7, and the floor keeps float noise from tripping it).
    A fixed bound cannot serve both dtypes. Blind to staleness below the numerics (a bf16
    engine one lr ~1e-6 step behind). On a resumed run the reference is the first batch
    after the resume push, which would hide a broken resume push: check the logged first
    value. Numbers and the trial behind them: docs/vllm.md, "The canary's bound".
    """
    if not first_gap >= 0:
        raise ValueError(f"first_gap must be a gap >= 0, got {first_gap}")
    return max(CANARY_RATIO * first_gap, CANARY_FLOOR_NATS)


@dataclass
class StalenessCheck:
    """The staleness canary of one run: the first batch's gap (the reference) and the last metrics."""

    first: float | None = None
    """staleness_gap of the run's first rollout batch (engine and trainer hold the same checkpoint)."""
    last: dict = field(default_factory=dict)
    """This step's metrics: vllm/canary_gap and vllm/canary_bound."""

    def measure(self, engine_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> dict:
        """Record this batch's gap against the bound; warn on stderr when it is above it."""
        gap = staleness_gap(engine_logp, trainer_logp, mask)
        if self.first is None:
            self.first = gap
        bound = staleness_bound(self.first)
        self.last = {"vllm/canary_gap": gap, "vllm/canary_bound": bound}
        if gap > bound:
            print(f"warning: vLLM and trainer log-probs differ by {gap:.2e} nats on average, above {bound:.2e} "
                  f"(3 x the first step's {self.first:.2e}); the engine may be sampling from stale weights",
                  file=sys.stderr)
        return self.last


# ---------------------------------------------------------------------------------------
# 2. Smoke test (trap 10): run on CPU with vLLM's CPU build by the tests; not on a GPU.
# ---------------------------------------------------------------------------------------

def gpu_smoke_test(model_path: str, G: int = 4, max_new_tokens: int = 32, seed: int = 1234,
                   dtype: str = "bfloat16", noise: float = 0.1, device: str | None = None) -> dict:
    """Check on a real engine that pushes reach it and the canary sees staleness (trap 10).

    device=None picks CUDA if present, else the CPU (vLLM's CPU build; the tests run it
    there). Trainer side as trap 9: fp32 master weights, bf16 autocast on CUDA.
      A. push the true weights; sample with a fixed seed; gap_true is the reference.
      B. perturb the trainer by noise x each tensor's std, push, sample with the same
         seed: samples change, canary vs the PERTURBED trainer within staleness_bound(gap_true).
      C. negative control: restore the trainer WITHOUT pushing; B's canary vs the
         restored trainer must exceed the bound.
      D. push the restored weights, sample with A's seed: within the bound, and report
         whether the samples equal A's (up to GPU nondeterminism).
    Returns the measured numbers; raises AssertionError on a failed check.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    prompts = ["12+35=", "The capital of France is", "def fib(n):"]
    llm = make_engine(model_path, model, dtype=dtype, gpu_memory_utilization=0.3,
                      max_model_len=engine_max_model_len(model.config, rollout.tokenize_prompts(tok, prompts, False),
                                                         max_new_tokens))
    torch.manual_seed(0)                                           # after make_engine (it reseeds)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" and dtype == "bfloat16"
                else contextlib.nullcontext())

    def trainer_gap(rollouts):
        with torch.no_grad(), autocast:
            lp, _ = logprobs.token_logprobs(model, rollouts.prompt_ids.to(device), rollouts.prompt_mask.to(device),
                                            rollouts.response_ids.to(device), rollouts.response_mask.to(device))
        return staleness_gap(rollouts.engine_logp, lp.float().cpu(), rollouts.response_mask)

    def sample_and_gap():
        rollouts = generate_rollouts_vllm(llm, tok, prompts, G, max_new_tokens, seed=seed)
        return rollouts, trainer_gap(rollouts)

    push_weights(llm, model)
    ro_a, gap_a = sample_and_gap()
    bound = staleness_bound(gap_a)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.float().std().to(p.dtype))
    push_weights(llm, model)
    ro_b, gap_b = sample_and_gap()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved[n])
    gap_stale = trainer_gap(ro_b)
    push_weights(llm, model)
    ro_d, gap_d = sample_and_gap()
    result = {"gap_true": gap_a, "bound": bound, "gap_perturbed": gap_b, "gap_stale_control": gap_stale,
              "gap_restored": gap_d,
              "samples_changed_after_perturb": not torch.equal(ro_a.response_ids, ro_b.response_ids),
              "samples_restored_exactly": torch.equal(ro_a.response_ids, ro_d.response_ids)}
    print("vLLM smoke test:", result)
    assert result["samples_changed_after_perturb"], "samples did not change after pushing perturbed weights"
    for key in ("gap_perturbed", "gap_restored"):
        assert result[key] <= bound, (f"{key} = {result[key]:.2e} nats > bound {bound:.2e}: "
                                      "the engine is not sampling the policy")
    assert gap_stale > bound, (f"stale control gap {gap_stale:.2e} nats <= bound {bound:.2e}: "
                               "the canary cannot see staleness")
    return result
