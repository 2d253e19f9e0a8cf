"""Tests of tinymodel.py: the character tokenizer, the tiny Llama, the cached warm-up.

No real warm-up runs here (it takes about a minute): the cache tests use a model of a
few thousand parameters trained for a few steps, and the stopping rule is tested with
a scripted evaluation.
"""

import json
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import checkpoint, tinymodel, warmups
from machinery.tinymodel import build_char_tokenizer, build_tiny_model
from machinery.warmups import WarmupConfig
from tasks import addition, countdown

# A warm-up small enough for a test: ~5k parameters, a handful of steps, 1-digit problems.
TINY = dict(digits=1, hidden_size=16, num_heads=2, intermediate_size=32, batch_size=8, n_train=64,
            max_steps=4, eval_every=2, eval_prompts=4, target_pass1=1.0)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

def test_tokenizer_round_trips_every_task_string(tok):
    rows = [r for d in (1, 2, 3, 4) for r in addition.make_addition_rows(100, digits=d, seed=d)]
    for r in rows:
        for s in (r["prompt"], r["target"], r["prompt"] + r["target"]):
            ids = tok(s)["input_ids"]
            assert len(ids) == len(s)                          # one token per character, nothing added
            assert tok.decode(ids) == s
            assert tok.unk_token_id not in ids
    # every vocabulary character is its own token
    for c in tinymodel.CHARS:
        assert tok.convert_ids_to_tokens(tok(c)["input_ids"]) == [c]


def test_tokenizer_specials_and_unknowns(tok):
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert len(tok) == 3 + len(tinymodel.CHARS) + len(countdown.PHRASES) == 108
    assert tok("a\tb")["input_ids"] == [tok.convert_tokens_to_ids("a"), 2, tok.convert_tokens_to_ids("b")]
    ids = tok("12")["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "12"


def test_tokenizer_loads_back_through_autotokenizer_beside_the_model(tok, tmp_path):
    """Saved next to the model's config.json, exactly as the warm-up cache stores it."""
    build_tiny_model(tok, seed=0, hidden_size=16, num_heads=2, intermediate_size=32).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    s = "347+85\n7+5+0=12\n4+8+1=13\n3+0+1=04\nA:432\n ~{}"
    assert back(s)["input_ids"] == tok(s)["input_ids"]
    assert back.decode(back(s)["input_ids"]) == s
    assert (back.pad_token_id, back.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)


def test_qwen2_model_type_would_break_the_tokenizer(tok, tmp_path):
    """Why the tiny model is a Llama and not a Qwen2 (pinned for transformers 5.20).

    AutoTokenizer forces Qwen2Tokenizer for any directory whose config.json says
    model_type "qwen2", which rebuilds the byte-level pre-tokenizer and silently drops
    "\\n" from our character vocabulary. If this test starts failing, transformers
    changed that rule and a Qwen2 config would work too.
    """
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back("3+4\n")["input_ids"] != tok("3+4\n")["input_ids"]


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------

def test_model_saves_and_loads_with_identical_logits(tok, tmp_path):
    model = build_tiny_model(tok, seed=0)
    model.save_pretrained(tmp_path)
    x = torch.tensor([tok("347+85\n7+5+0=12\n")["input_ids"]])
    with torch.no_grad():
        ref = model(x).logits
        eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
        assert torch.equal(eager(x).logits, ref)               # same kernel: bit-identical
        default = AutoModelForCausalLM.from_pretrained(tmp_path).eval()   # SDPA kernel by default
        # another attention kernel, float32: measured 2.4e-7 apart (AVX-512 and AVX2); the
        # control below (another model) 0.80
        torch.testing.assert_close(default(x).logits, ref, atol=1e-5, rtol=0)
        other = build_tiny_model(tok, seed=1)                  # negative control
        assert (other(x).logits - ref).abs().max() > 1e-2
    gen = json.load(open(tmp_path / "generation_config.json"))
    assert "top_k" not in gen and "temperature" not in gen    # no sampling defaults ride along


def test_build_is_seeded_and_leaves_the_global_rng_alone(tok):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build_tiny_model(tok, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    b = build_tiny_model(tok, seed=5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


def test_param_count_closed_form_and_bound(tok):
    cfg = WarmupConfig()
    model = build_tiny_model(tok, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                             num_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size)
    V, d, ff, L = len(tok), cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    # tied embedding + per layer (q, k, v, o) + SwiGLU (gate, up, down) + 2 RMSNorms, + final norm
    assert tinymodel.count_params(model) == V * d + L * (4 * d * d + 3 * d * ff + 2 * d) + d
    assert tinymodel.count_params(model) < 200_000          # the CPU default's stated bound
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_tiny_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="hidden_size 30"):
        tinymodel.tiny_config(99, hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="num_layers"):
        tinymodel.tiny_config(99, num_layers=0)


# ---------------------------------------------------------------------------------------
# Warm-up pieces
# ---------------------------------------------------------------------------------------

def test_the_warm_up_checks_with_the_task_checker():
    """The warm-up's evaluation reads the answer line as verify.check_addition does."""
    correct = lambda text: addition.TASK.check(text, "432", "347+85\n")["correct"] == 1.0
    assert correct("7+5+0=12\nA:432\n")
    assert correct("junk\nA:1\nA:432")                  # the LAST "A:" counts
    for wrong in ("A:0432\n", "A: 432\n", "A:432foo", "432", "A:43\n", ""):
        assert not correct(wrong), wrong


def test_encoded_rows_put_loss_on_response_tokens_only(tok):
    rows = addition.make_addition_rows(5, digits=2, seed=0)
    inputs, labels = warmups._encode_rows(tok, rows)
    for i, r in enumerate(rows):
        p, t = tok(r["prompt"])["input_ids"], tok(r["target"])["input_ids"]
        n = len(p) + len(t) + 1
        assert inputs[i, :n].tolist() == p + t + [tok.eos_token_id]
        assert (inputs[i, n:] == tok.pad_token_id).all()
        assert labels[i, :len(p)].tolist() == [-100] * len(p)
        assert labels[i, len(p):n].tolist() == t + [tok.eos_token_id]
        assert (labels[i, n:] == -100).all()


def test_response_loss_equals_hand_computed_cross_entropy(tok):
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_heads=2, intermediate_size=32)
    rows = addition.make_addition_rows(4, digits=2, seed=1)
    inputs, labels = warmups._encode_rows(tok, rows)
    with torch.no_grad():
        loss = warmups._response_loss(model, inputs, labels, tok.pad_token_id)
        total, count, row_means = 0.0, 0, []
        for i in range(len(rows)):
            n = int((inputs[i] != tok.pad_token_id).sum())
            logp = model(inputs[i:i + 1, :n]).logits[0].log_softmax(-1)
            nll = [-logp[s, labels[i, s + 1]].item() for s in range(n - 1)
                   if labels[i, s + 1] != -100]              # the token at s+1 is a response token
            total, count = total + sum(nll), count + len(nll)
            row_means.append(sum(nll) / len(nll))
    assert count == sum(len(r["target"]) + 1 for r in rows)
    # float32 (batched, padded) against float64 sums of float32 rows: measured 1.8e-8
    # (AVX-512) and 2.0e-8 (AVX2) relative. Negative control: a mean of the rows' means
    # (each row weighted alike, not each token) is 4.2e-4 relative away.
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
    assert abs(sum(row_means) / len(row_means) - loss.item()) > 10 * 1e-5 * loss.item()


def test_warmup_config_validation_and_cache_key():
    with pytest.raises(ValueError, match="target_pass1 must be in"):
        WarmupConfig(target_pass1=1.5).validate()
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        WarmupConfig(batch_size=0).validate()
    with pytest.raises(ValueError, match="lr must be > 0"):
        WarmupConfig(lr=0.0).validate()
    assert warmups.cache_key(WarmupConfig()) == warmups.cache_key(WarmupConfig())
    assert warmups.cache_key(WarmupConfig()).startswith("addition-s0-")
    assert warmups.cache_key(WarmupConfig(digits=2)) != warmups.cache_key(WarmupConfig())   # in the hash
    assert warmups.cache_key(WarmupConfig(seed=1)) != warmups.cache_key(WarmupConfig())
    assert warmups.cache_key(WarmupConfig(lr=1e-3)) != warmups.cache_key(WarmupConfig())


def test_max_response_tokens_covers_the_longest_target():
    for d in (1, 2, 3):
        longest = "9" * d + "+" + "9" * d
        target = addition.addition_response(int("9" * d), int("9" * d))
        assert len(target) + 1 == warmups.max_response_tokens(warmups.WarmupConfig(digits=d)), longest


def test_warmup_stops_at_first_eval_reaching_target(tmp_path, monkeypatch):
    script = iter([0.1, 0.2, 0.35, 0.9])
    calls = []
    monkeypatch.setattr(warmups, "_eval_pass1", lambda *a: calls.append(a[-1]) or next(script))
    cfg = WarmupConfig(**{**TINY, "max_steps": 20, "target_pass1": 0.3})
    path = warmups.warmup(cfg, str(tmp_path))
    summary = json.load(open(os.path.join(path, "warmup.json")))
    assert calls == [2, 4, 6]                                    # stopped at the third evaluation
    assert summary["steps"] == 6 and summary["reached_target"] and summary["final_pass1"] == 0.35
    # the step cap: never reaching the target still saves a model, flagged as such
    monkeypatch.setattr(warmups, "_eval_pass1", lambda *a: 0.0)
    path = warmups.warmup(WarmupConfig(**{**TINY, "max_steps": 3, "target_pass1": 0.3}), str(tmp_path))
    summary = json.load(open(os.path.join(path, "warmup.json")))
    assert summary["steps"] == 3 and not summary["reached_target"]
    assert [h["step"] for h in summary["history"]] == [2, 3]     # every eval_every, and at the cap


# ---------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------

def test_warmup_writes_a_cache_and_a_second_call_reuses_it(tmp_path, monkeypatch):
    cfg = WarmupConfig(**TINY)
    path = warmups.load_or_warmup(cfg, str(tmp_path))
    assert os.path.basename(path) == warmups.cache_key(cfg)
    assert sorted(os.listdir(tmp_path)) == [warmups.cache_key(cfg)]      # no temporary left over
    summary = json.load(open(os.path.join(path, "warmup.json")))
    assert summary["steps"] == 4 and summary["config"] == {**WarmupConfig().__dict__, **TINY}
    mtime = os.path.getmtime(os.path.join(path, "model.safetensors"))

    calls = []
    real = warmups.warmup
    monkeypatch.setattr(warmups, "warmup", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert warmups.load_or_warmup(cfg, str(tmp_path)) == path
    assert calls == [] and os.path.getmtime(os.path.join(path, "model.safetensors")) == mtime
    # a different config is a different entry, and it is trained
    other = warmups.load_or_warmup(WarmupConfig(**{**TINY, "seed": 1}), str(tmp_path))
    assert calls == [1] and other != path
    # the entry is an ordinary model directory
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok) and tok.decode(tok("9+9\n")["input_ids"]) == "9+9\n"


def test_failed_save_leaves_no_partial_directory(tmp_path, monkeypatch):
    cfg = WarmupConfig(**TINY)
    tok_class = type(build_char_tokenizer())

    def broken_save(self, *args, **kwargs):          # the model is already written by now
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(tok_class, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        warmups.load_or_warmup(cfg, str(tmp_path))
    assert os.listdir(tmp_path) == []                # neither the entry nor a temporary
    monkeypatch.undo()
    path = warmups.load_or_warmup(cfg, str(tmp_path))  # a retry then succeeds
    assert os.path.isfile(os.path.join(path, "warmup.json"))


def test_incomplete_entry_is_replaced(tmp_path):
    """A directory without warmup.json (never written by warmup, which renames complete
    entries into place; e.g. a hand copy interrupted half-way) is retrained over."""
    cfg = WarmupConfig(**TINY)
    stale = tmp_path / warmups.cache_key(cfg)
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"half a model")
    path = warmups.load_or_warmup(cfg, str(tmp_path))
    assert sorted(os.listdir(path)) == ["config.json", "generation_config.json", "model.safetensors",
                                        "tokenizer.json", "tokenizer_config.json", "warmup.json"]
    assert sorted(os.listdir(tmp_path)) == [warmups.cache_key(cfg)]


# ---------------------------------------------------------------------------------------
# Shipped warm-ups: the same starting bytes on every machine
# ---------------------------------------------------------------------------------------

def test_shipped_weights_are_exactly_the_codes_warmups():
    """weights/ holds one complete model directory per shipped_configs() entry, under the
    key this code computes, built from that config, and nothing else. Fails when the
    warm-up code or config changes without `python -m machinery.warmups` (stale weights)."""
    expected = {warmups.cache_key(cfg): cfg for cfg in warmups.shipped_configs()}
    assert sorted(os.listdir(warmups.SHIPPED_DIR)) == sorted(expected)
    for key, cfg in expected.items():
        path = os.path.join(warmups.SHIPPED_DIR, key)
        summary = json.load(open(os.path.join(path, "warmup.json")))
        added = {name: WarmupConfig.__dataclass_fields__[name].default for name in warmups.ADDED_LATER}
        assert {**added, **summary["config"]} == cfg.__dict__ and summary["cache_format"] == warmups.CACHE_FORMAT, key
        assert summary["steps"] == cfg.max_steps
        assert len(checkpoint.weights_sha256(path)) == 64


def test_default_embedded_runs_start_from_shipped_weights(monkeypatch, tmp_path):
    """Seed 0 of each task loads from weights/ and trains nothing, whatever the cache holds."""
    monkeypatch.setattr(warmups, "warmup", lambda *a, **k: pytest.fail("warm-up of a shipped config"))
    for task in warmups.TASKS:
        cfg = warmups.warmup_config(task, seed=0)
        path = warmups.load_or_warmup(cfg, str(tmp_path))
        assert path == os.path.join(warmups.SHIPPED_DIR, warmups.cache_key(cfg))


def test_shipped_then_cache_then_warmup_and_stale_shipped_weights_are_said(tmp_path, monkeypatch):
    cfg = WarmupConfig(**TINY)
    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    built = warmups.load_or_warmup(cfg, str(cache), shipped_dir=None)         # trains into the cache
    trained = []
    monkeypatch.setattr(warmups, "warmup", lambda *a, **k: trained.append(1) or built)
    # 1. a shipped copy wins over the cache
    shutil.copytree(built, shipped / warmups.cache_key(cfg))
    assert warmups.load_or_warmup(cfg, str(cache), shipped_dir=str(shipped)) == str(shipped / warmups.cache_key(cfg))
    # 2. no shipped copy: the cache
    shutil.rmtree(shipped / warmups.cache_key(cfg))
    said = []
    assert warmups.load_or_warmup(cfg, str(cache), shipped_dir=str(shipped), say=said.append) == built
    assert trained == [] and said == []
    # 3. a config the repository ships, missing from shipped_dir (which ships other warm-ups of
    #    its task): stale, said in one line, then warmed up
    monkeypatch.setattr(warmups, "shipped_configs", lambda: [cfg])
    shutil.rmtree(built)
    os.makedirs(shipped / f"{cfg.task}-s9-000000000000")
    warmups.load_or_warmup(cfg, str(cache), shipped_dir=str(shipped), say=said.append)
    assert trained == [1] and len(said) == 1 and "stale" in said[0] and warmups.cache_key(cfg) in said[0]
    # a config nobody ships is not called stale (a custom width is not a stale checkpoint), and
    # the warm-up it starts is said aloud
    monkeypatch.setattr(warmups, "shipped_configs", lambda: [])
    warmups.load_or_warmup(cfg, str(cache), shipped_dir=str(shipped), say=said.append)
    assert trained == [1, 1] and len(said) == 2 and "stale" not in said[1]
    assert said[1] == "addition: no warm-up of the embedded model is shipped or cached for --digits 1 --warmup_seed 0: " \
                      "warming it up here, once"


# ---------------------------------------------------------------------------------------
# Every warm-up is checked against the SHA-256 recorded for it before it is used
# ---------------------------------------------------------------------------------------

def test_the_shipped_sha256_table_names_every_shipped_directory():
    """SHIPPED_SHA256 pins weights/: one line per directory, each the hash of its bytes."""
    assert warmups.SHIPPED_SHA256 == {key: checkpoint.weights_sha256(os.path.join(warmups.SHIPPED_DIR, key))
                                        for key in os.listdir(warmups.SHIPPED_DIR)}
    assert warmups.SHIPPED_SHA256["addition-s0-b840513ee205"].startswith("5b98e55b3977")


def damaged_copy(src, dst, damage):
    """A copy of the model directory src at dst, its model.safetensors with one byte
    flipped in the last tensor's data, or the tensor embed_tokens renamed emced_tokens."""
    shutil.copytree(src, dst)
    weights = os.path.join(dst, "model.safetensors")
    data = bytearray(open(weights, "rb").read())
    if damage == "flip":
        data[-1] ^= 0x01
    else:
        at = data.index(b"embed_tokens")                # in the header: the same length, another name
        data[at:at + len(b"embed_tokens")] = b"emced_tokens"
    open(weights, "wb").write(bytes(data))


@pytest.mark.parametrize("damage,detail", [
    ("flip", "its weights do not match their recorded SHA-256 (5b98e55b3977, got "),
    ("rename", "no tensor model.embed_tokens.weight, an unexpected tensor model.emced_tokens.weight; "),
])
def test_a_changed_shipped_warm_up_is_refused_in_one_line(damage, detail, tmp_path, monkeypatch):
    """Before: a flipped byte started "(shipped, sha256 ...)" without a word; a renamed tensor
    loaded random embeddings, trained nothing, and exited 0."""
    monkeypatch.setattr(warmups, "warmup", lambda *a, **k: pytest.fail("warmed up instead"))
    cfg = warmups.warmup_config("addition", seed=0)
    key = warmups.cache_key(cfg)
    damaged_copy(os.path.join(warmups.SHIPPED_DIR, key), tmp_path / "weights" / key, damage)
    with pytest.raises(warmups.UsageError) as e:
        warmups.load_or_warmup(cfg, str(tmp_path / "cache"), shipped_dir=str(tmp_path / "weights"))
    message = str(e.value)
    assert message.startswith(f"shipped warm-up {tmp_path / 'weights' / key} is damaged: ") and "\n" not in message
    assert detail in message and message.endswith(f"git checkout -- weights/{key} restores the repository's copy")
    # the intact copy passes, and is the one returned
    shutil.copytree(os.path.join(warmups.SHIPPED_DIR, key), tmp_path / "intact" / key)
    assert warmups.load_or_warmup(cfg, str(tmp_path / "cache"), shipped_dir=str(tmp_path / "intact")) == \
        str(tmp_path / "intact" / key)


def test_a_cache_entry_records_its_sha256_and_is_checked_against_it(tmp_path):
    cfg = WarmupConfig(**TINY)
    path = warmups.load_or_warmup(cfg, str(tmp_path / "cache"), shipped_dir=None)
    recorded = json.load(open(os.path.join(path, "warmup.json")))["weights_sha256"]
    assert recorded == checkpoint.weights_sha256(path) and warmups.recorded_sha256(path, shipped=False) == recorded
    assert warmups.verify_warmup(path, shipped=False) is True
    weights = os.path.join(path, "model.safetensors")
    data = bytearray(open(weights, "rb").read())
    data[-1] ^= 0x01
    open(weights, "wb").write(bytes(data))
    with pytest.raises(warmups.UsageError, match=rf"^warm-up {path} is damaged: its weights do not match their "
                                                   rf"recorded SHA-256 \({recorded[:12]}, got [0-9a-f]{{12}}\); "
                                                   r"delete that directory to rebuild it$"):
        warmups.load_or_warmup(cfg, str(tmp_path / "cache"), shipped_dir=None)


def test_a_cache_entry_from_before_the_records_is_used_unverified_unless_a_tensor_is_wrong(tmp_path):
    """An entry written before SHA-256s were recorded has nothing to match: it is used with
    a note, and start.json's "verified" is false; a missing or renamed tensor is refused."""
    entry = tmp_path / "cache" / "addition-s0-000000000000"
    tok = build_char_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(entry)
    tok.save_pretrained(entry)
    (entry / "warmup.json").write_text("{}")
    said = []
    assert warmups.verify_warmup(str(entry), shipped=False, say=said.append) is False
    assert said == [f"warm-up {entry} records no SHA-256 (written before they were recorded): used unverified; "
                    "delete that directory to rebuild it with one"]
    shutil.rmtree(tmp_path / "renamed", ignore_errors=True)
    damaged_copy(entry, tmp_path / "renamed", "rename")
    with pytest.raises(warmups.UsageError, match=r"is damaged: no tensor model.embed_tokens.weight, an unexpected "
                                                   r"tensor model.emced_tokens.weight; delete that directory"):
        warmups.verify_warmup(str(tmp_path / "renamed"), shipped=False, say=said.append)
    assert warmups.weight_keys_problem(str(entry)) is None


def test_weights_hash_names_the_bytes(tmp_path):
    tok = build_char_tokenizer()
    for seed in (0, 0, 1):
        d = tmp_path / f"m{seed}"
        if not d.exists():
            tinymodel.build_tiny_model(tok, seed=seed).save_pretrained(d)
    assert checkpoint.weights_sha256(str(tmp_path / "m0")) != checkpoint.weights_sha256(str(tmp_path / "m1"))
    assert checkpoint.weights_sha256(str(tmp_path / "nothing")) is None
