"""The checks at the door, completed: every value, path and file a user can hand over that
used to pass silently, fail late, or end in a traceback. Each case is one line on stderr
and exit code 2 before any work (no data, no model, no warm-up), or recovers correctly.
"""

import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import train
from machinery import checkpoint, tinymodel, warmups
from machinery import checks as door_checks
from machinery import config
import tasks
from tasks import reasoning_gym

from tests.engine.helpers import quick_run_args, run_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_work(monkeypatch):
    """Any data load, warm-up or model load fails the test: the check came too late."""
    monkeypatch.setattr(tasks, "load", lambda *a, **k: pytest.fail("data loaded before the door check"))
    monkeypatch.setattr(warmups, "load_or_warmup", lambda *a, **k: pytest.fail("warm-up before the door check"))


# --- values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (["--kl_coef", "nan"], "argument --kl_coef: must be a finite number, got 'nan'"),
    (["--entropy_coef", "nan"], "argument --entropy_coef: must be a finite number, got 'nan'"),
    (["--kl_coef", "inf"], "argument --kl_coef: must be a finite number, got 'inf'"),
    (["--eps_high", "inf"], "argument --eps_high: must be a finite number, got 'inf'"),
    (["--dual_clip", "inf"], "argument --dual_clip: must be a finite number, got 'inf'"),
    (["--lr", "1e30"], "--lr must be in (0, 1.0], got 1e+30"),
    (["--seed", "-1"], "--seed must be in [0, 131071], got -1"),
    (["--seed", str(2 ** 17)], "--seed must be in [0, 131071], got 131072"),
    (["--out_dir", ""], "--out_dir must not be empty"),
    (["--prompts_per_step", "1000000000000"], "at most 4194304 rollouts per step, got 1000000000000 x 4"),
    (["--steps", str(2 ** 20)], "--steps must be below 1048576"),
])
def test_bad_values_are_one_line_before_any_work(flags, needle, tiny_dir, tmp_path, capsys, no_work):
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", *flags), capsys)
    assert code == 2 and len(err) == 1 and needle in err[0] and err[0].startswith("train.py: error:"), err
    assert not os.path.exists(tmp_path / "run")                 # nothing written either


def test_every_float_of_the_api_configs_is_checked_for_finiteness():
    """The same rule without the command line: a NaN in any float field is refused by name."""
    from loss import LossConfig
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--kl_coef must be a finite number"):
            train.Config(loss=LossConfig(kl_coef=value))
        with pytest.raises(ValueError, match="--lr must be a finite number"):
            train.Config(lr=value)


# --- numbers that train nothing, and counts past what they would cost ------------------------

BIG = "1" + "0" * 30          # a 31-digit integer: hung (--digits, --n_train) or died in C++ without the flag


@pytest.mark.parametrize("flags,needle", [
    # Coefficients past where they freeze or wreck training (each ran to exit 0 before).
    (["--weight_decay", "1e30"], "--lr x --weight_decay must be at most 0.01 (AdamW shrinks every weight by that "
                                 "share at each step), got 0.0004 x 1e+30"),
    (["--grad_clip", "1e-30"], "--grad_clip must be 0 (off) or at least 0.001 (a smaller norm sinks under Adam's "
                               "eps and nothing moves), got 1e-30"),
    (["--kl_coef", "1e30"], "kl_coef must be in [0, 10.0] (at 10.0 the policy stays within odds e^0.5 of the "
                            "reference: frozen), got 1e+30"),
    (["--entropy_coef", "1e30"], "entropy_coef must be in [0, 1.0] (at 1.0 the bonus outweighs every reward: "
                                 "near-uniform noise), got 1e+30"),
    (["--advantage", "w_reinforce", "--lam", "1e30"], "w_reinforce: needs a finite lam in [0, 100], got 1e+30"),
    (["--advantage", "asymre", "--dV", "1e30"], "asymre: needs a finite dV in (-1, 1), got 1e+30"),
    (["--advantage", "asymre", "--dV", "-1"], "asymre: needs a finite dV in (-1, 1), got -1.0"),
    (["--advantage", "power", "--alpha", "1e30"], "power: needs a finite alpha in (0, 10], got 1e+30"),
    (["--advantage", "focal", "--gamma", "1e30"], "focal: needs a finite gamma in [0, 10], got 1e+30"),
    (["--advantage", "risk", "--risk_beta", "1e30"], "risk: needs a finite beta (--risk_beta) with 0 < |beta| "
                                                     "<= 100, got 1e+30"),
    (["--adv_eps", "1e30"], "grpo: needs a finite eps (--adv_eps) in (0, 0.01], got 1e+30"),
    (["--advantage", "asym", "--delta", "1e-30"], "asym: needs a finite delta in [0.001, 1000], got 1e-30"),
    (["--advantage", "fade", "--schedule", "decay", "--alpha_start", "1e30"],
     "alpha_start must be finite and in [1, 10], got 1e+30"),           # not at step 2 as "got 0.0"
    (["--advantage", "fade", "--schedule", "decay", "--alpha_end", "1e30"],
     "alpha_end must be finite and in [1, 10], got 1e+30"),
    (["--advantage", "fade", "--schedule", "decay", "--delta_end", "1e-30"],
     "delta_end must be finite and in [0.001, 1000], got 1e-30"),
    # A decay ramp of 10^30 steps moves alpha by ~1e-30 a step: it never left alpha_start.
    (["--advantage", "fade", "--schedule", "decay", "--total_steps", BIG],
     f"total_steps must be below 1048576, the longest run (--steps): a longer decay ramp never reaches "
     f"alpha_end and delta_end, got {BIG}"),
    # Counts: the bound and what a value past it would cost, naming the flag.
    (["--digits", BIG], "--digits must be at most 100 (a d-digit problem's worked answer is 10d + 5 tokens"),
    (["--n_train", BIG], "--n_train must be at most 1000000 (drawing 10^6 prompts takes 20-90 s"),
    (["--n_eval", BIG], "--n_eval must be at most 65536 (every evaluation samples --eval_samples rollouts"),
    (["--epochs", BIG], "--epochs must be at most 100 (every epoch is one more forward and backward"),
    (["--max_new_tokens", BIG], "--max_new_tokens must be at most 131072 (128k tokens, the longest context"),
    (["--eval_samples", BIG], "--eval_samples must be at most 1024 (pass@k up to k = 1024"),
    (["--value_k", BIG], "--value_k must be at most 1024 (each of the 2 x --value_samples prefixes"),
    (["--value_samples", BIG], "--value_samples must be at most 4096 (each position costs 2 x --value_k"),
    (["--threads", BIG], "--threads must be at most 1024 (threads beyond the CPU's cores"),
    (["--micro_batch", BIG], "--micro_batch must be at most 4194304 (a step holds at most 2**22 rollouts"),
    (["--coupling_pairs", BIG], "--coupling_pairs must be at most 4096 (each pair holds two vocabulary-sized"),
    (["--lr_warmup_steps", BIG], "--lr_warmup_steps must be at most 1048576 (a warm-up longer than any run"),
    (["--n_eval", "65536", "--eval_samples", "1024"], "--n_eval x --eval_samples must be at most 1048576 rollouts "
                                                      "per evaluation (~17 minutes each for the embedded model), "
                                                      "got 65536 x 1024"),
    (["--value_every", "1", "--value_samples", "4096", "--value_k", "1024"],
     "2 x --value_samples x --value_k must be at most 1048576 continuations per token-value step"),
])
def test_numbers_that_would_train_nothing_or_cost_too_much_are_one_line(flags, needle, tiny_dir, tmp_path, capsys,
                                                                        no_work):
    """Issue 41: each of these passed the door and trained nothing (exit 0), hung, or died
    in C++ ("Overflow when unpacking long long") without naming its flag."""
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", *flags), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("train.py: error: "), err
    assert needle in err[0], err
    assert not os.path.exists(tmp_path / "run")


def test_chat_template_with_the_embedded_model_is_one_line_before_its_warm_up(capsys, no_work):
    # It was a transformers traceback from inside apply_chat_template, at the first prompt.
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--chat_template"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == (
        "train.py: error: --chat_template wraps prompts in the tokenizer's chat template, and the embedded model's "
        "character tokenizer has none (it reads bare prompts): leave --chat_template out, or train an instruct --model")


def test_a_model_whose_tokenizer_has_no_chat_template_or_an_lr_that_moves_no_weight_is_one_line(tiny_dir, tmp_path,
                                                                                               capsys):
    # Both need the loaded model, and both are refused before the start's evaluation or step 1:
    # --lr 1e-30 trained nothing and exited 0.
    for flags, needle in [(["--chat_template"], f"train.py: error: --chat_template: the tokenizer of --model "
                                                f"{tiny_dir} has no chat template"),
                          (["--lr", "1e-30"], "train.py: error: --lr 1e-30 cannot change this model's float32 "
                                              "weights: Adam moves a weight by about lr per step")]:
        code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", *flags), capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(needle), err
        assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")
    assert door_checks.lr_problem(1e-6, tinymodel.build_tiny_model(tinymodel.build_char_tokenizer())) is None


def test_the_lr_floor_is_where_adams_first_step_stops_moving_half_the_weights():
    """checks.lr_problem's criterion, measured: one AdamW step (|step| = lr x |g| / (|g| + eps),
    about lr) from the embedded model's shipped start, under a random gradient. Just below
    the floor at least half the float32 weights stay bit for bit (every weight at least the
    median size); a little above it, more than half move."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    start = warmups.load_or_warmup(warmups.warmup_config("addition"))          # the shipped weights
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    floor = float(np.spacing(np.float32(weights.abs().median()))) / 2           # 2**-30 here (median 0.0196)
    assert f"raise --lr to {floor:.2g} or more" in door_checks.lr_problem(1e-30, model)

    def share_moved(lr):
        m = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
        gen = torch.Generator().manual_seed(0)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        before = [p.detach().clone() for p in m.parameters()]
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0).step()
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(m.parameters(), before))
        return moved / sum(b.numel() for b in before)
    assert share_moved(0.9 * floor) <= 0.5 < share_moved(2 * floor)
    assert door_checks.lr_problem(0.9 * floor, model) is not None and door_checks.lr_problem(1.1 * floor, model) is None


def test_a_prompt_of_50_mb_is_one_line_before_the_tokenizer(tiny_dir, tmp_path):
    """It aborted the process inside the tokenizer (Rust's allocator, exit 134, no message)."""
    rows = tmp_path / "rows.jsonl"
    with open(rows, "w") as f:
        f.writelines(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40))
        f.write(json.dumps({"prompt": "7" * (50 << 20), "answer": "7"}) + "\n")
    proc = subprocess.run([sys.executable, "train.py", *quick_run_args(tiny_dir, tmp_path / "run", "--data", str(rows))],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"a prompt of {50 << 20:,} characters ('7777777777" in lines[0] and "at most 524,288" in lines[0], lines
    assert "starting from" not in proc.stdout                  # refused before the model was used


def test_sampling_that_could_not_fit_in_memory_is_one_line_before_sampling(tiny_dir, tmp_path, capsys, monkeypatch):
    """--max_new_tokens 10^8 was killed by the kernel mid-run; here a machine of 1 GB and a
    100,000-token budget: 16 rollouts x 100,004 positions x 1 KB of keys and values."""
    from machinery import sampler
    monkeypatch.setattr(door_checks, "memory_bytes", lambda device: 10 ** 9)
    monkeypatch.setattr(sampler.KVCacheSampler, "sample", lambda *a, **k: pytest.fail("sampled"))
    monkeypatch.setattr(sampler.KVCacheSampler, "sample_texts", lambda *a, **k: pytest.fail("sampled"))
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", "--max_new_tokens", "100000"), capsys)
    assert code == 2 and err == [
        "train.py: error: sampling 16 rollouts at once (--prompts_per_step x --group_size = 16) of up to 4 prompt "
        "tokens + --max_new_tokens 100,000 could need 1.7 GB of key/value cache, more than this machine's 1.0 GB "
        "of memory: lower --max_new_tokens or --prompts_per_step"], err
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", "--max_new_tokens", "20000", "--eval_samples", "1024",
                          "--eval_every", "1"), capsys)
    assert code == 2 and len(err) == 1 and "sampling 1,024 rollouts at once (--eval_samples 1024)" in err[0], err


def test_config_json_is_strict_json(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    for path in (tmp_path / "config.json", tmp_path / "checkpoints" / "step_000002" / "config.json"):
        json.loads(path.read_text(), parse_constant=refuse)


# --- paths and files in the run directory ---------------------------------------------------

def test_out_dir_a_symlink_loop_is_one_line(tiny_dir, tmp_path, capsys, no_work):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "a"), capsys)
    assert code == 2 and len(err) == 1 and "symbolic link that leads nowhere" in err[0], err


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints/latest", "config.json"])
def test_a_directory_where_a_run_file_belongs_is_one_line(name, tiny_dir, tmp_path, capsys, no_work):
    os.makedirs(tmp_path / name)
    resume = ["--resume"] if name.startswith("checkpoints") else []
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, *resume), capsys)
    assert code == 2 and len(err) == 1 and f"{tmp_path / name} is not a file" in err[0], err


def test_a_checkpoint_directory_replaced_by_a_file_is_skipped_and_overwritten(tiny_dir, tmp_path, capsys):
    """Resumes from the intact checkpoint before it, then writes the new checkpoint over the file."""
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4"), capsys)[0] == 0
    shutil.rmtree(tmp_path / "checkpoints" / "step_000004")
    (tmp_path / "checkpoints" / "step_000004").write_text("not a checkpoint")
    (tmp_path / "metrics.jsonl").write_text("".join((tmp_path / "metrics.jsonl").read_text().splitlines(True)[:2]))
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "6", "--resume"), capsys)
    assert code == 0 and any("step_000004 is not a directory" in line for line in err), err
    assert checkpoint.check_checkpoint(str(tmp_path / "checkpoints" / "step_000006")) is None
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_jsonl_row_nested_a_hundred_thousand_deep_is_one_line(tiny_dir, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    code, err = run_main(quick_run_args(tiny_dir, tmp_path / "run", "--data", str(rows)), capsys)
    assert code == 2 and len(err) == 1 and "rows.jsonl:2: JSON nested too deeply" in err[0], err


def test_truncated_cached_warm_up_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(warmups, "load_or_warmup", functools.partial(warmups.load_or_warmup, cache_dir=str(cache),
                                                                       shipped_dir=None))
    cfg = train.parse_args(["--out_dir", str(tmp_path / "run"), "--digits", "1"])
    entry = cache / warmups.cache_key(config.embedded_warmup(cfg))
    tok = tinymodel.build_char_tokenizer()
    tinymodel.build_tiny_model(tok, seed=0).save_pretrained(entry)
    tok.save_pretrained(entry)
    (entry / "warmup.json").write_text("{}")                     # a complete entry, as the cache sees it
    weights = entry / "model.safetensors"
    os.truncate(weights, os.path.getsize(weights) // 2)          # ... then a copy cut short
    code, err = run_main(["--out_dir", str(tmp_path / "run"), "--digits", "1", "--steps", "1"], capsys)
    assert code == 2 and len(err) == 1 and f"warm-up {entry} is damaged" in err[0], err


# --- the other entry points -------------------------------------------------------------------

def shipped_start(out_dir, *extra):
    """A one-step run from the shipped addition warm-up (--digits 3, its key), tiny budgets."""
    return ["--out_dir", str(out_dir), "--steps", "1", "--prompts_per_step", "2", "--group_size", "2",
            "--max_new_tokens", "8", "--eval_every", "0", "--flip_every", "0", "--threads", "1", *extra]


def test_start_json_says_whether_the_start_was_verified(tiny_dir, tmp_path, capsys):
    assert run_main(shipped_start(tmp_path / "shipped"), capsys)[0] == 0
    start = json.load(open(tmp_path / "shipped" / "start.json"))
    key = os.path.basename(start["model_path"])
    assert start["shipped"] and start["verified"] is True
    assert start["weights_sha256"] == warmups.SHIPPED_SHA256[key] == checkpoint.weights_sha256(start["model_path"])
    assert run_main(quick_run_args(tiny_dir, tmp_path / "path", "--steps", "1"), capsys)[0] == 0
    start = json.load(open(tmp_path / "path" / "start.json"))
    assert not start["shipped"] and start["verified"] is False          # a model directory: nothing recorded


def test_a_flipped_byte_in_a_shipped_warm_up_is_one_line_before_the_run(tmp_path, capsys, monkeypatch):
    """The issue's case: the run started "(shipped, sha256 15df9f3a56c5)" without a word."""
    key = warmups.cache_key(warmups.warmup_config("addition", seed=0))
    shutil.copytree(os.path.join(warmups.SHIPPED_DIR, key), tmp_path / "weights" / key)
    weights = tmp_path / "weights" / key / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(warmups, "load_or_warmup", functools.partial(
        warmups.load_or_warmup, cache_dir=str(tmp_path / "cache"), shipped_dir=str(tmp_path / "weights")))
    code, err = run_main(shipped_start(tmp_path / "run"), capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: shipped warm-up {tmp_path / 'weights' / key} is damaged: its weights "
                             f"do not match their recorded SHA-256 ({warmups.SHIPPED_SHA256[key][:12]}, got "), err
    assert not os.path.exists(tmp_path / "run" / "start.json") and not os.path.exists(tmp_path / "cache")


def run_cli(*argv, env=None):
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_table_cli_bounds_the_group_size():
    start = time.monotonic()
    code, err = run_cli("-m", "mass", "--table", "--G", "100000000")
    assert code == 2 and err == ["mass.py: error: --G must be in [2, 1024], got 100000000"]
    assert time.monotonic() - start < 120                      # refused, not computed (45 s, then out of memory)


def test_sweep_out_a_file_is_one_line(tmp_path, capsys):
    from experiments import sweep
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        sweep.main(["advantages", "--out", str(tmp_path / "file")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and "--out" in err[0] and "is a file" in err[0], err


@pytest.mark.parametrize("module,prog", [("bench.__main__", "python -m bench"),
                                         ("integrations.trl_example", "trl_example.py")])
def test_bench_and_trl_example_bad_flags_are_one_line(module, prog, capsys):
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(["--steps", "x"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and err == [f"{prog}: error: argument --steps: invalid int value: 'x'"], err


@pytest.mark.slow
def test_trl_example_without_trl_is_one_line(tmp_path):
    """A `trl` that cannot be imported (as on a machine without it) stops the example at once."""
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text("raise ImportError('No module named trl', name='trl')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    code, err = run_cli("-m", "integrations.trl_example", env=env)
    assert code == 2 and err == ["trl_example.py: error: trl is not installed: pip install -r requirements/trl.txt"], err


@pytest.mark.slow
def test_slow_reasoning_gym_data_shows_progress(monkeypatch, capsys):
    """Generation that takes longer than two seconds shows a progress bar (countdown's takes minutes)."""
    rg = pytest.importorskip("reasoning_gym")

    def slow_dataset(name, size, seed):
        for i in range(size):
            time.sleep(0.6)
            yield {"question": f"q{i}", "answer": "a", "metadata": {}}
    monkeypatch.setattr(rg, "create_dataset", slow_dataset)
    rows = reasoning_gym.rows("countdown", 6, "train")
    assert len(rows) == 6
    assert "reasoning-gym countdown (train rows)" in capsys.readouterr().err


def test_lock_dir_names_the_holder_and_takes_over_a_stale_lock(tmp_path):
    held = door_checks.lock_dir(str(tmp_path), "--out_dir")
    with pytest.raises(ValueError, match=f"in use by another process \\(PID {os.getpid()}\\)"):
        door_checks.lock_dir(str(tmp_path), "--out_dir")
    held.close()
    # A lock file left by a process that died holds no lock: the next writer takes it.
    dead = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                           "from machinery import checks; checks.lock_dir(sys.argv[2], 'x'); "
                           "import os; os._exit(9)", REPO, str(tmp_path)])
    assert dead.returncode == 9 and (tmp_path / door_checks.LOCK_FILE).read_text().strip() != str(os.getpid())
    door_checks.lock_dir(str(tmp_path), "--out_dir").close()
