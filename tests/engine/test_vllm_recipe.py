"""The one-GPU recipe, rehearsed on vLLM's CPU build: everything but the GPU and the model's size.

`python train.py --config recipes/qwen2.5-0.5b-gsm8k.yaml` runs as the README says, with
only the model, the data and the budgets changed on the command line:

- the model: a hub-format directory built here, of Qwen2.5's architecture (Qwen2: grouped
  key/value heads, biases on q, k and v, tied embeddings) at ~90k parameters, with Qwen's
  tokenizer class (Qwen2Tokenizer: byte-level, Qwen's pre-tokenizer; here the 256 bytes
  and no merges, so one token per ASCII character), a ChatML chat template as
  Qwen2.5-Instruct's, and <|im_end|> as EOS. Two heads of 32, the smallest head size
  vLLM's CPU attention has. (Not the embedded model's character tokenizer: a directory
  whose config says qwen2 loads as Qwen2Tokenizer, which drops its whitespace.) A short
  supervised warm-up on the templated prompts teaches it to answer "So the answer is
  \\boxed{N.0}.", so the rewards are not all zero and the chat template is really used
  (untemplated prompts are text it never saw);
- the data: tests/data/gsm8k_mini.jsonl, six problems in GSM8K's hub format (written for
  this test), through --data gsm8k:FILE, the hub path's own converter and prompt;
- the budgets: steps, prompts, samples per prompt, new tokens, evaluation size.

Every other setting is the recipe's: --backend vllm, the chat template, lr 1e-6 with its
warm-up, gradient checkpointing, micro-batch 8, evaluation at temperature 0.6. The answer
"18.0" against GSM8K's "18" passes neither of math_equal's fast paths (equal strings,
integers), so every reward of 1 comes from math-verify in verify.py's worker processes,
running beside the in-process engine.

The SmolLM2 recipe (recipes/smollm2-135m-addition.yaml) is rehearsed on the real model
itself, SmolLM2-135M-Instruct from PyPI (machinery/hub_models.py; converted into
.cache/hub_models/ by .ci/run's first step, or here), with only the budgets cut.

Marked `vllm`; skipped where vLLM is not installed unless VLLM_REQUIRED=1 (.ci/run's vLLM step).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.engine.helpers import skip_unless_vllm

pytestmark = pytest.mark.vllm

skip_unless_vllm()

from machinery import flags  # noqa: E402
from tasks import math_datasets  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join("recipes", "qwen2.5-0.5b-gsm8k.yaml")
ROWS = os.path.join("tests", "data", "gsm8k_mini.jsonl")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def answer_text(answer: str) -> str:
    return f"So the answer is \\boxed{{{answer}.0}}."


def byte_alphabet() -> list[str]:
    """The 256 byte-level symbols (GPT-2's mapping, which Qwen's tokenizer uses): printable
    bytes stand for themselves, the others for chr(256 + i), so "\\n" is "Ċ"."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    others = [b for b in range(256) if b not in printable]
    symbol = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return [symbol[b] for b in range(256)]


def build_chat_model(path) -> str:
    """A tiny Qwen2 chat model saved as a hub directory, warmed up to answer_text (~10 s)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(byte_alphabet())} | {"<|endoftext|>": 256, "<|im_start|>": 257,
                                                             "<|im_end|>": 258}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHATML
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    # Supervised warm-up: the templated prompt, then answer_text and EOS; loss on the answer only.
    pairs = []
    for row in math_datasets.load_gsm8k(os.path.join(REPO, ROWS)):
        prompt = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                         add_generation_prompt=True)
        pairs.append((tok(prompt, add_special_tokens=False)["input_ids"],
                      tok(answer_text(row["answer"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), tok.pad_token_id)
    labels, mask = torch.full_like(ids, -100), torch.zeros_like(ids)
    for i, (p, a) in enumerate(pairs):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
        mask[i, :len(p) + len(a)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.05, f"the warm-up did not fit the answers (loss {loss.item():.3f})"
    model.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_the_gsm8k_recipe_runs_on_vllm_with_a_chat_model(tmp_path):
    model_dir = build_chat_model(tmp_path / "qwen2-tiny")
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--config", RECIPE,
           "--model", model_dir, "--data", f"gsm8k:{ROWS}", "--out_dir", str(out),
           "--steps", "2", "--prompts_per_step", "3", "--group_size", "4", "--max_new_tokens", "40",
           "--eval_every", "2", "--n_eval", "6", "--eval_samples", "2", "--save_every", "2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = flags.flat_fields(json.load(open(out / "config.json")))      # nested in its parts
    recipe = {"model": model_dir, "backend": "vllm", "chat_template": True, "lr": 1e-6, "lr_warmup_steps": 10,
              "gradient_checkpointing": True, "micro_batch": 8, "eval_temperature": 0.6, "top_p": 1.0}
    assert {key: saved[key] for key in recipe} == recipe
    rows = [r for line in open(out / "metrics.jsonl") if (r := json.loads(line))["step"] >= 1]   # training steps
    gaps = ["%.1e" % r["vllm/canary_gap"] for r in rows]
    print(f"\nrecipe on vLLM CPU: reward {[r['reward'] for r in rows]}, pass@1 {rows[-1]['eval/pass@1']:.2f}, "
          f"canary {gaps}")
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["lr"] for r in rows] == pytest.approx([1e-7, 2e-7])          # the warm-up's first two steps
    assert all(r["vllm/canary_gap"] <= r["vllm/canary_bound"] for r in rows)
    assert all(r["reward"] > 0 for r in rows) and rows[-1]["eval/pass@1"] > 0
    # the recipe's final_eval: -1, the whole held-out split once more after the last step
    assert "final/pass@1" in rows[-1] and all("final/pass@1" not in r for r in rows[:-1])
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert [s["step"] for s in samples] == [0] * 6 + [2] * 6             # step 0: eval_before_train
    credited = [s for s in samples if s["reward"] == 1.0]
    assert any(answer_text(s["answer"]) in s["completion"] for s in credited)    # "N.0" == "N": math-verify
    assert all("<|im_" not in s["completion"] for s in samples)          # EOS stopped and was cut
    assert os.path.isfile(out / "checkpoints" / "step_000002" / "manifest.json")


def test_the_smollm2_recipe_runs_on_vllm_with_the_real_model(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--config", os.path.join("recipes", "smollm2-135m-addition.yaml"),
           "--out_dir", str(out), "--steps", "2", "--prompts_per_step", "4", "--group_size", "4",
           "--max_new_tokens", "16", "--eval_every", "2", "--n_eval", "8", "--eval_samples", "2", "--save_every", "2",
           "--lr_warmup_steps", "2"]                  # the recipe's 10 would be longer than the run
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = flags.flat_fields(json.load(open(out / "config.json")))      # nested in its parts
    recipe = {"model": "smollm2-135m-instruct", "data": "addition_instruct", "digits": 2, "backend": "vllm",
              "chat_template": True, "lr": 2e-6, "micro_batch": 32, "share_prompts": True,
              "gradient_checkpointing": False, "temperature": 0.7, "top_p": 1.0}
    assert {key: saved[key] for key in recipe} == recipe
    start = json.load(open(out / "start.json"))
    assert start["source"]["gguf_sha256"].startswith("b179c9523d0e") and start["source"]["weights_as_pinned"]
    rows = [r for line in open(out / "metrics.jsonl") if (r := json.loads(line))["step"] >= 1]   # training steps
    print(f"\nSmolLM2 recipe on vLLM CPU: reward {[r['reward'] for r in rows]}, canary "
          f"{['%.1e' % r['vllm/canary_gap'] for r in rows]}, time/sample {[round(r['time/sample'], 1) for r in rows]}, "
          f"time/update {[round(r['time/update'], 1) for r in rows]}, pass@1 {start['eval']['eval/pass@1']:.2f} -> "
          f"{rows[-1]['eval/pass@1']:.2f}")
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["lr"] for r in rows] == pytest.approx([1e-6, 2e-6])          # the warm-up, over the 2 steps
    # An fp32 engine against the fp32 trainer: canary measured 5.3e-6 and 5.7e-6 (AVX-512),
    # 4.8e-6 with the trainer's kernels at ATEN_CPU_CAPABILITY=avx2. A bf16 engine is 0.031
    # nats off, an engine left stale 0.42 (docs/vllm.md).
    assert all(r["vllm/canary_gap"] < 1e-4 and r["vllm/canary_gap"] <= r["vllm/canary_bound"] for r in rows)
    assert "stale" not in proc.stderr
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert [s["step"] for s in samples] == [0] * 8 + [2] * 8
    assert all("<|im_" not in s["completion"] for s in samples)          # EOS stopped and was cut
