"""train.py as a TRL or verl user meets it: flags that do what they say, --config, trackers,
samples.jsonl, the evaluation settings, the learning-rate warm-up, gradient checkpointing
and the recipes.

Runs use an untrained tiny model with tiny budgets (a few seconds each). Trackers that are
not installed are skipped here by name; CI installs tensorboard (requirements/trackers.txt).
"""

import dataclasses
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import advantages
import tasks
import train
from machinery import config, flags, resume, warmups
from machinery import trackers
from machinery import rollout
from machinery import setup as setup_lib
from scheduler import AdvantageScheduler

from tests.engine.helpers import copy_of_the_repository, run_main, small_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(glob.glob(os.path.join(REPO, "recipes", "*.yaml")))
GPU_RECIPES = [p for p in RECIPES if not p.endswith("-cpu.yaml")]     # a *-cpu.yaml recipe is tested with its results


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def without_times(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def cli_error(argv, capsys) -> str:
    """train.parse_args(argv) must exit 2 with one line on stderr; that line."""
    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0, err
    return err


# ---------------------------------------------------------------------------------------
# Honest flags: every advantage with its own defaults; a flag that changes nothing is refused
# ---------------------------------------------------------------------------------------

# Groups of 8 with 0..8 successes, and one with partial rewards for the advantages that take them.
REWARDS = torch.stack([(torch.arange(8) < c).double() for c in range(9)])


@pytest.mark.parametrize("name", list(advantages.ADVANTAGES))
def test_every_advantage_from_the_command_line_weighs_as_its_function_with_its_defaults(name):
    """`--advantage NAME` alone computes ADVANTAGES[NAME](rewards) with the function's own
    defaults, exactly (the old CLI passed alpha = delta = 1 to power and asym: mean)."""
    cfg = train.parse_args(["--advantage", name, "--group_size", "8"])
    knobs = AdvantageScheduler(cfg.sched).step(0.5, 1.0)          # what the loop's step 3 returns
    hyper = train.advantage_hyper(cfg, knobs)
    ours = advantages.compute_advantages(name, REWARDS, **hyper)
    assert torch.equal(ours, advantages.ADVANTAGES[name](REWARDS))
    recorded = {flag: getattr(cfg.adv, flag) for flag in config.hyper_defaults(name)}
    assert recorded == config.hyper_defaults(name)             # config.json says what was used
    assert config.unread_flags(name, cfg.adv) == []


def test_power_and_asym_are_not_mean_any_more():
    """Negative control of the test above: at the old CLI values they collapse to `mean`."""
    mean = advantages.ADVANTAGES["mean"](REWARDS)
    assert torch.equal(advantages.power(REWARDS, alpha=1.0), mean) and torch.equal(advantages.asym(REWARDS, 1.0), mean)
    assert not torch.equal(advantages.power(REWARDS), mean) and not torch.equal(advantages.asym(REWARDS), mean)


def test_every_hyper_parameter_is_a_flag_and_every_flag_a_hyper_parameter():
    flags = {f.name for f in dataclasses.fields(config.AdvantageConfig)}
    taken = {flag for name in advantages.ADVANTAGES for flag in config.hyper_defaults(name)}
    assert flags == taken
    cfg = train.parse_args(["--advantage", "risk", "--risk_beta", "0.5"])
    assert train.advantage_hyper(cfg, {}) == {"beta": 0.5}


def test_power_records_alpha_2_in_config_json_and_in_the_metrics(tiny_dir, tmp_path):
    cfg = train.parse_args(small_args(tiny_dir, tmp_path, "--steps", "1", "--advantage", "power", "--eval_every", "0"))
    rows = train.train(cfg)
    saved = json.load(open(tmp_path / "config.json"))
    assert saved["advantage"] == "power" and saved["adv"]["alpha"] == 2.0 and saved["adv"]["delta"] is None
    assert rows[0]["sched/alpha"] == 2.0 and rows[0]["sched/delta"] == 1.0


@pytest.mark.slow
def test_beta_exits_2_naming_kl_coef(tmp_path, capsys):
    err = cli_error(["--beta", "0.04", "--steps", "1", "--out_dir", str(tmp_path)], capsys)
    assert "--kl_coef" in err and "--ema_beta" in err
    assert not os.listdir(tmp_path)                                  # refused before anything was written


@pytest.mark.parametrize("argv,needle", [
    (["--delta", "4"], "--delta 4.0 is read only by --advantage asym, fade, not grpo; TRL's delta"),
    (["--advantage", "power", "--delta", "0.5"], "read only by --advantage asym, fade, not power"),
    (["--alpha", "2"], "--alpha 2.0 is read only by --advantage power, fade, not grpo"),
    (["--k", "2"], "--k 2 is read only by --advantage passk, pkpo"),
    (["--gamma", "0.99"], "verl's gamma is GAE's discount"),
    (["--risk_beta", "1"], "--risk_beta 1.0 is read only by --advantage risk"),
    (["--whiten", "token"], "--whiten token is read only by --advantage reinforce_pp, not grpo"),
    (["--advantage", "reinforce_pp", "--whiten", "tokens"], "reinforce_pp: needs whiten one of rollout, token, got 'tokens'"),
    (["--advantage", "fade", "--schedule", "fade", "--delta", "0.5"], "--schedule fade sets delta every step"),
    (["--alpha_start", "2"], "--alpha_start 2.0 is read only by --schedule decay, not constant"),
    (["--advantage", "fade", "--schedule", "fade", "--delta_end", "0.5"], "read only by --schedule decay, not fade"),
    (["--num_generations", "4"], "TRL's num_generations (verl's rollout.n) is --group_size here"),
    (["--learning_rate=1e-6"], "unrecognized argument --learning_rate=1e-6: TRL's learning_rate is --lr here"),
    (["--max_completion_length", "512"], "--max_new_tokens"),
    (["--temp", "0.5"], "unrecognized argument --temp"),        # no abbreviations
    (["--top_p", "0"], "--top_p must be in (0, 1], got 0.0"),
    (["--eval_temperature", "0"], "--eval_temperature must be in [0.01, 2.0]"),
    (["--report_to", "mlflow"], "--report_to must be one of none, tensorboard, trackio, wandb, got 'mlflow'"),
    (["--lr_warmup_steps", "-1"], "--lr_warmup_steps must be >= 0"),
    (["--data", "countdown_instruct"], "worded for chat models; the embedded model reads --data countdown"),
    (["--data", "countdown", "--eval_data", "countdown_instruct"],
     "--eval_data countdown_instruct is worded for chat models; the embedded model reads --eval_data countdown"),
])
def test_flags_that_would_change_nothing_or_mean_something_else_exit_2(argv, needle, capsys):
    assert needle in cli_error(argv, capsys)


@pytest.mark.parametrize("argv,expect", [
    (["--advantage", "power", "--alpha", "2"], {"alpha": 2.0}),                # the sweeps' arms
    (["--advantage", "asym", "--delta", "0.5"], {"delta": 0.5}),
    (["--advantage", "fade", "--alpha", "3", "--delta", "0.7"], {"alpha": 3.0, "delta": 0.7}),
    (["--advantage", "passk", "--k", "2"], {"k": 2}),
    (["--advantage", "focal", "--gamma", "2", "--adv_eps", "1e-4"], {"gamma": 2.0, "eps": 1e-4}),
    (["--advantage", "w_reinforce", "--lam", "0.2"], {"lam": 0.2}),
    (["--advantage", "asymre", "--dV", "0.1"], {"dV": 0.1}),
    (["--advantage", "reinforce_pp", "--whiten", "token"], {"eps": 1e-6, "whiten": "token"}),
])
def test_each_advantage_takes_its_own_flags(argv, expect):
    assert train.advantage_hyper(train.parse_args(argv), {}) == expect


def test_a_moving_schedule_sets_alpha_and_delta_and_ema_beta_is_its_rate():
    cfg = train.parse_args(["--advantage", "fade", "--schedule", "fade", "--ema_beta", "0.1"])
    assert cfg.sched.ema_beta == 0.1 and cfg.adv.alpha is None and cfg.adv.delta is None
    knobs = AdvantageScheduler(cfg.sched).step(0.2, 1.0)
    assert train.advantage_hyper(cfg, knobs) == {"alpha": knobs["alpha"], "delta": knobs["delta"]}
    p_hat = 0.9 * 0.5 + 0.1 * 0.2                                     # the EMA at rate 0.1 (0.02: 0.494)
    assert knobs["alpha"] == pytest.approx(3 * (1 - p_hat) / (2 * p_hat))
    assert train.parse_args(["--ema_beta", "0.1"]).sched.ema_beta == 0.1    # logged EMAs under every schedule


# ---------------------------------------------------------------------------------------
# --config: a run's config.json reproduces the run; YAML; flags win
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_config_json_reproduces_the_run_and_flags_after_it_win(tiny_dir, tmp_path):
    first = tmp_path / "first"
    train.train(train.parse_args(small_args(tiny_dir, first, "--steps", "3", "--advantage", "nsr", "--lr", "1e-3",
                                            "--lr_warmup_steps", "2", "--minibatches", "2")))
    again = tmp_path / "again"
    cfg = train.parse_args(["--config", str(first / "config.json"), "--out_dir", str(again)])
    assert cfg.advantage == "nsr" and cfg.lr == 1e-3 and cfg.minibatches == 2
    train.train(cfg)
    assert without_times(read_jsonl(again / "metrics.jsonl")) == without_times(read_jsonl(first / "metrics.jsonl"))
    # A flag after --config wins over the file, and here changes the run (negative control).
    other = train.parse_args(["--config", str(first / "config.json"), "--out_dir", str(tmp_path / "o"), "--seed", "1"])
    assert other.seed == 1 and other.lr == 1e-3
    train.train(other)
    assert [r.get("entropy") for r in read_jsonl(tmp_path / "o" / "metrics.jsonl")] != \
        [r.get("entropy") for r in read_jsonl(first / "metrics.jsonl")]


FLAT_CONFIG = os.path.join(REPO, "tests", "data", "config_flat.json")


def test_a_flat_config_json_from_before_the_parts_reads_the_same_and_resumes(tmp_path):
    """tests/data/config_flat.json is a run's config.json as train.py wrote it before the
    settings were nested in parts (every part's field at the top: micro_batch, eval_every,
    value_k, ...; out_dir replaced): `--share_prompts --kl_coef 0.04 --entropy_coef 0.01
    --micro_batch 16 --value_every 10 --value_samples 8 --value_k 2 --steps 20 --eval_every
    10`. --config reads it into the same settings, config.json now nests them, and the
    resume check finds nothing changed between the two (a checkpoint's flat config.json
    resumes)."""
    flat = json.load(open(FLAT_CONFIG))
    assert "micro_batch" in flat and "update" not in flat                      # as it was written
    cfg = train.parse_args(["--config", FLAT_CONFIG, "--out_dir", str(tmp_path / "again")])
    nested = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert (nested["update"]["micro_batch"], nested["update"]["share_prompts"], nested["diagnostics"]["value_k"],
            nested["evaluation"]["eval_every"], nested["loss"]["kl_coef"]) == (16, True, 2, 10, 0.04)
    # Every setting the flat file holds reads back the same; a setting added since (absent
    # from the file) is at its default, so the file's meaning is unchanged.
    defaults = dataclasses.asdict(train.Config())
    read, written = flags.flat_fields(nested), flags.flat_fields(flat)
    default = flags.flat_fields(json.loads(json.dumps(defaults)))
    assert set(written) <= set(read)
    assert {k: read[k] for k in written if k != "out_dir"} == {k: v for k, v in written.items() if k != "out_dir"}
    assert {k: read[k] for k in read if k not in written} == {k: default[k] for k in read if k not in written}
    # A setting the checkpoint predates (absent from its config.json) is no change at its
    # default, and is one at any other value (or with no defaults to tell).
    assert resume.config_changes(flat, nested, {"out_dir"}, defaults) == []
    older = {k: v for k, v in flat.items() if k != "n_eval"}
    assert resume.config_changes(older, nested, {"out_dir"}, defaults) == []
    assert "--n_eval '(absent)' -> 0" in resume.config_changes(older, nested, {"out_dir"})
    later = json.loads(json.dumps(nested))
    later["evaluation"]["n_eval"] = 16
    assert resume.config_changes(older, later, {"out_dir"}, defaults) == ["--n_eval '(absent)' -> 16"]
    flat["micro_batch"], flat["temperature"] = 8, 0.5                          # negative control: two changes named
    assert resume.config_changes(flat, nested, {"out_dir"}, defaults) == ["--micro_batch 8 -> 16",
                                                                          "--temperature 0.5 -> 1.0"]
    again = tmp_path / "again.json"                                            # the nested file reads back the same
    again.write_text(json.dumps(nested))
    assert dataclasses.asdict(train.parse_args(["--config", str(again)])) == dataclasses.asdict(cfg)


def test_every_setting_declares_what_resume_may_do_with_it():
    cfg = train.Config()
    leaves = flags.leaf_fields(cfg)
    assert len(leaves) >= 80 and {group for group, _, _ in leaves} == {
        "", "adv", "sched", "loss", "sampling", "update", "evaluation", "diagnostics"}
    assert [f.name for _, part, f in leaves if not isinstance(part, config.CHAPTER_CONFIGS)
            and f.metadata.get(flags.RESUME) not in flags.RESUME_RULES] == []
    may_change, not_compared = config.resume_rules(cfg)
    chapters = {f.name for _, part, f in leaves if isinstance(part, config.CHAPTER_CONFIGS)}
    assert len(chapters) == 20 and chapters & (may_change | not_compared) == set()     # the objective, the schedule
    assert not_compared == {"out_dir", "resume", "overwrite"}
    # the run's math is fixed in every part; when it stops, how fast and what it reports may change
    math = {"seed", "lr", "data", "group_size", "temperature", "max_new_tokens", "backend", "grad_clip", "n_eval",
            "eval_temperature", "eval_data", "kl_coef", "loss_type", "schedule", "alpha", "adv_eps"}
    assert math & may_change == set()
    assert {"steps", "save_every", "micro_batch", "share_prompts", "compile", "eval_every", "final_eval", "flip_every",
            "value_k", "gpu_memory_utilization", "report_to", "run_name"} <= may_change
    # negative control: a part whose field declares nothing is refused, naming the field
    part = dataclasses.make_dataclass("Part", [("new_knob", int, dataclasses.field(default=0))])
    root = dataclasses.make_dataclass("Root", [("part", part, dataclasses.field(default_factory=part))])
    with pytest.raises(AssertionError, match="--new_knob: its field declares no resume rule"):
        config.resume_rules(root())


def test_config_json_of_a_used_directory_is_refused_without_a_new_out_dir(tiny_dir, tmp_path):
    train.train(train.parse_args(small_args(tiny_dir, tmp_path, "--steps", "1", "--eval_every", "0")))
    cfg = train.parse_args(["--config", str(tmp_path / "config.json")])
    with pytest.raises(ValueError, match="already holds a run"):
        train.setup(cfg)


def test_yaml_config_flat_or_nested_with_yaml_number_quirks(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("advantage: power\nlr: 1e-6\nloss:\n  kl_coef: 0.01\nschedule: constant\nmodel: my/instruct\n"
                    "chat_template: true\neval_temperature: 0.6\nresume: true\n")
    cfg = train.parse_args(["--config", str(path), "--lr", "2e-6"])
    assert (cfg.advantage, cfg.lr, cfg.loss.kl_coef, cfg.sampling.chat_template, cfg.evaluation.eval_temperature) == \
        ("power", 2e-6, 0.01, True, 0.6)
    assert cfg.resume is False                      # resume/overwrite describe an invocation, not a run
    assert train.parse_args(["--config", str(path)]).lr == 1e-6       # YAML reads 1e-6 as a string
    bad = tmp_path / "bad.yaml"
    for text, needle in [("beta: 0.04\n", "unknown field 'beta' (TRL's KL coefficient `beta` is --kl_coef here"),
                         ("steps: ten\n", "'steps' must be an int, got 'ten'"),
                         ("lr: fast\n", "'lr' must be a float, got 'fast'"),
                         ("model: null\n", "'model' may not be null"),
                         ("- 1\n", "expected a mapping"),
                         ("a: [\n", "invalid YAML")]:
        bad.write_text(text)
        assert needle in cli_error(["--config", str(bad)], capsys)
    assert "no such file" in cli_error(["--config", str(tmp_path / "none.yaml")], capsys)


@pytest.mark.parametrize("name,text,needle", [
    ("both.yaml", "kl_coef: 0.1\nloss:\n  kl_coef: 0.0\n",
     "'kl_coef' is given twice, as kl_coef and as loss.kl_coef: keep one"),
    ("both.json", '{"loss": {"kl_coef": 0.0}, "kl_coef": 0.1}',
     "'kl_coef' is given twice, as loss.kl_coef and as kl_coef: keep one"),
    ("twice.yaml", "lr: 1.0e-4\nsteps: 3\nlr: 2.0e-4\n",
     "'lr' is given twice in one mapping (lines 1 and 3): keep one"),
    ("twice.json", '{"adv": {"alpha": 2.0, "alpha": 3.0}, "advantage": "power"}',
     "'alpha' is given twice in one object: keep one"),
])
def test_a_config_file_giving_one_field_twice_is_refused_naming_both(name, text, needle, tmp_path, capsys):
    """Before: the parser kept one of the two without a word (kl_coef 0.0: no KL penalty)."""
    path = tmp_path / name
    path.write_text(text)
    assert cli_error(["--config", str(path)], capsys) == f"train.py: error: --config {path}: {needle}"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=os.path.basename)
def test_recipes_parse_and_set_what_a_real_model_needs(path):
    cfg = train.parse_args(["--config", path])
    s, up, ev = cfg.sampling, cfg.update, cfg.evaluation
    assert s.backend == "vllm" and s.chat_template and cfg.lr <= 1e-5 and s.top_p == 1.0
    if cfg.model == "smollm2-135m-instruct":        # short answers: a short budget, no checkpointing needed
        assert cfg.data == "addition_instruct" and s.max_new_tokens == 32 and not up.gradient_checkpointing
        return
    assert cfg.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert s.max_new_tokens >= 512 and up.gradient_checkpointing
    assert ev.eval_temperature is not None and cfg.data in ("gsm8k", "countdown_instruct")
    # a final evaluation finer than the curve's: GSM8K's whole test split; 1000 generated countdown problems
    assert ev.final_eval == -1 if cfg.data == "gsm8k" else ev.final_eval >= 1000
    # the checkpoint's sampling settings are said, and why the recipe does not follow them
    text = open(path).read()
    assert "generation_config.json asks for temperature 0.7, top_p 0.8, top_k 20" in text and "Not followed" in text


def test_there_are_five_gpu_recipes():
    assert [os.path.basename(p) for p in GPU_RECIPES] == ["qwen2.5-0.5b-countdown-24gb.yaml", "qwen2.5-0.5b-countdown.yaml",
                                                      "qwen2.5-0.5b-gsm8k-24gb.yaml", "qwen2.5-0.5b-gsm8k.yaml",
                                                      "smollm2-135m-addition.yaml"]


CPU_RECIPES = [p for p in RECIPES if p.endswith("-cpu.yaml")]


@pytest.mark.parametrize("path", CPU_RECIPES, ids=os.path.basename)
def test_a_cpu_recipe_is_what_its_committed_runs_ran_and_they_learned(path):
    """docs/runs/NAME/seed_S/ holds each seed's config.json and metrics.jsonl as the run wrote
    them; the recipe must be what they ran (out_dir and seed aside; coupling_pairs is read only
    when flip_every > 0) and each run must show what docs/results.md says: held-out pass@1
    up by at least 0.10 from its start, in at most 30 minutes of training."""
    name = os.path.basename(path)[:-len(".yaml")]
    runs = sorted(glob.glob(os.path.join(REPO, "docs", "runs", name, "seed_*")))
    assert len(runs) >= 2, f"{name}: two seeds' runs committed under docs/runs/{name}/"
    for run in runs:
        with open(os.path.join(run, "config.json")) as f:
            ran = json.load(f)
        ran = flags.flat_fields(ran)                                 # flat as it was written, or nested
        recipe = flags.flat_fields(json.loads(json.dumps(dataclasses.asdict(train.parse_args(
            ["--config", path, "--seed", str(ran["seed"])])))))     # through JSON: tuples become lists, as in config.json
        inert = {"out_dir"} | ({"coupling_pairs"} if ran["flip_every"] == 0 else set())
        # A setting added after these runs is absent from their config.json: at its default it
        # is what they ran (--reward_timeout limits a --reward function, and they had none).
        defaults = flags.flat_fields(json.loads(json.dumps(dataclasses.asdict(train.Config()))))
        inert |= {k for k in recipe if k not in ran and recipe[k] == defaults[k]}
        assert {k for k in recipe if recipe[k] != ran.get(k)} - inert == set(), run
        evals = [r for r in read_jsonl(os.path.join(run, "metrics.jsonl")) if "eval/pass@1" in r]
        assert evals[0]["step"] == 0 and evals[-1]["step"] == ran["steps"], run
        assert evals[-1]["eval/pass@1"] - evals[0]["eval/pass@1"] >= 0.10, run
        assert evals[-1]["time/elapsed"] <= 30 * 60, run


@pytest.mark.parametrize("task,changed", [
    ("gsm8k", {"out_dir", "gpu_memory_utilization", "micro_batch", "max_new_tokens"}),
    ("countdown", {"out_dir", "gpu_memory_utilization", "micro_batch"}),      # 512 tokens already fit 24 GB
])
def test_a_24gb_recipe_is_its_80gb_recipe_with_only_memory_settings_changed(task, changed):
    """Same model, data, algorithm, batch and evaluation; what differs is said in the file."""
    big, small = (flags.flat_fields(dataclasses.asdict(train.parse_args(["--config", os.path.join(REPO, "recipes", name)])))
                  for name in (f"qwen2.5-0.5b-{task}.yaml", f"qwen2.5-0.5b-{task}-24gb.yaml"))
    assert {key for key in big if big[key] != small[key]} == changed
    assert small["micro_batch"] < big["micro_batch"] and small["gpu_memory_utilization"] < big["gpu_memory_utilization"]


def qwen_paper_memory_gb(cfg, card_gb: float, prompt: int = 200) -> dict:
    """docs/vllm.md's memory estimate for Qwen2.5-0.5B (its "One 80 GB GPU" and "One 24 GB
    GPU" tables, the same rows), from the values a recipe sets. GB of 1e9 bytes.

    Worst case: every rollout at max_new_tokens, a templated prompt of `prompt` tokens.
    The trainer: 18 bytes a parameter (fp32 weights, gradients, AdamW's two moments, bf16
    autocast copies), plus the larger of the update's peak (a micro-batch's fp32 logits
    and ~2.5 transient copies, and its activations) and the no-grad entropy pass (18 bytes
    a logit), plus ~0.5 GB of CUDA context. vLLM: its share of the card, of which bf16
    weights and ~1 GB of start-up profiling (assumed), the rest KV cache at 12,288 bytes a
    token (2 x 24 layers x 2 heads x 64 x 2 bytes). Estimated, not measured.
    """
    N, V, h, layers = 494_032_768, 151_936, 896, 24
    b, T = cfg.update.micro_batch, cfg.sampling.max_new_tokens
    logits = 4 * b * T * V
    per_token = 4 * h * layers + 74_500 if cfg.update.gradient_checkpointing else 74_500 * layers
    update = logits + 2.5 * logits + per_token * b * (prompt + T)
    trainer = 18 * N + max(update, 18 * b * T * V) + 0.5e9
    share = cfg.sampling.gpu_memory_utilization * card_gb * 1e9
    kv_needed = 12_288 * cfg.prompts_per_step * (cfg.group_size * T + prompt)    # prompts shared by prefix caching
    return {"trainer": trainer / 1e9, "total": (trainer + share) / 1e9,
            "kv_left": (share - 2 * N - 1e9) / 1e9, "kv_needed": kv_needed / 1e9}


@pytest.mark.parametrize("name,card_gb,documented_gb", [
    ("qwen2.5-0.5b-gsm8k.yaml", 80, 55), ("qwen2.5-0.5b-countdown.yaml", 80, 45),
    ("qwen2.5-0.5b-gsm8k-24gb.yaml", 24, 18), ("qwen2.5-0.5b-countdown-24gb.yaml", 24, 18)])
def test_each_qwen_recipe_fits_its_card_on_paper(name, card_gb, documented_gb):
    """The figures docs/vllm.md and the README give, recomputed from the recipe's values: a
    larger micro-batch or budget written into a 24 GB recipe fails here (micro-batch 4: ~21 GB)."""
    paper = qwen_paper_memory_gb(train.parse_args(["--config", os.path.join(REPO, "recipes", name)]), card_gb)
    assert paper["total"] == pytest.approx(documented_gb, abs=1.5)
    assert paper["total"] <= 0.8 * card_gb          # a fifth of the card for what the arithmetic leaves out
    assert paper["kv_left"] >= 1.5 * paper["kv_needed"]        # vLLM runs a whole step's rollouts at once


# ---------------------------------------------------------------------------------------
# Trackers: the same numbers as metrics.jsonl, read back from each tracker's own store
# ---------------------------------------------------------------------------------------

def test_tensorboard_event_file_holds_metrics_jsonl_series(tiny_dir, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train.train(train.parse_args(small_args(tiny_dir, tmp_path, "--steps", "3", "--report_to", "tensorboard")))
    said = capsys.readouterr().out.splitlines()            # the closing summary names every output, this one too
    assert f"  tensorboard: {tmp_path / 'tensorboard'} (tensorboard --logdir {tmp_path / 'tensorboard'})" in said
    assert f"  run:   {tmp_path} (config.json, start.json, metrics.jsonl, samples.jsonl, checkpoints/)" in said
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert set(events.Tags()["scalars"]) == {k for r in rows for k in r} - {"step"}
    for key in ("reward", "entropy", "grad_norm", "eval/pass@1"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        expected = [(r["step"], r[key]) for r in rows if key in r]
        assert [s for s, _ in logged] == [s for s, _ in expected]
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)   # float32 in the file


def test_trackio_local_store_holds_metrics_jsonl_series(tiny_dir, tmp_path):
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed (pip install -r requirements/trackers.txt)")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, out, "--steps", "3", "--report_to",
                                                                   "trackio", "--project", "tc-test")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = subprocess.run([sys.executable, "-c", "import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
                           "print(json.dumps(SQLiteStorage.get_logs('tc-test', 'run'), default=str))"],
                          env=env, capture_output=True, text=True, timeout=300)
    logs = json.loads(read.stdout)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [log["step"] for log in logs] == [r["step"] for r in rows]
    assert [log["reward"] for log in logs] == [r["reward"] for r in rows]
    assert [log.get("eval/pass@1") for log in logs] == [r.get("eval/pass@1") for r in rows]


def wandb_history(run_file: str) -> list[dict]:
    """The history records of an offline .wandb file: LevelDB-log blocks of protobuf Records
    (header ":W&B" + 3 bytes; each chunk: crc32 (4), length (2, little-endian), type (1:
    full, 2: first, 3: middle, 4: last); blocks of 32 KiB, a tail under 7 bytes is padding)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunk, out = open(run_file, "rb").read(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "history":
                out.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
            chunk = b""
    return out


@pytest.mark.slow
def test_wandb_offline_run_holds_metrics_jsonl_series(tiny_dir, tmp_path):
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, tmp_path, "--steps", "3",
                                                                   "--report_to", "wandb")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run_file] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    history = wandb_history(run_file)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    for key in ("reward", "entropy", "eval/pass@1"):
        assert [h.get(key) for h in history] == [r.get(key) for r in rows]


def test_a_tracker_that_is_not_installed_is_one_line_before_any_warm_up(monkeypatch):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(warmups, "load_or_warmup", lambda *a, **k: pytest.fail("warm-up started"))
    cfg = train.parse_args(["--report_to", "wandb", "--out_dir", "/tmp/never-written"])
    with pytest.raises(ValueError, match=r"^--report_to wandb needs the wandb package, which is not installed "
                                         r"\(pip install -r requirements/trackers.txt\)$"):
        train.setup(cfg)


def test_a_tensorboard_path_that_is_a_file_is_one_line_before_any_work(tiny_dir, tmp_path, capsys, monkeypatch):
    """Before: SummaryWriter failed with a traceback after the data, the model and start.json."""
    pytest.importorskip("tensorboard")
    monkeypatch.setattr(warmups, "load_or_warmup", lambda *a, **k: pytest.fail("warm-up before the door check"))
    monkeypatch.setattr(setup_lib, "load_model", lambda *a, **k: pytest.fail("model loaded before the door check"))
    (tmp_path / "tensorboard").write_text("not a directory")
    code, err = run_main(small_args(tiny_dir, tmp_path, "--report_to", "tensorboard"), capsys)
    assert code == 2 and err == [f"train.py: error: --report_to tensorboard writes its event files into "
                                 f"{tmp_path / 'tensorboard'}, which is a file, not a directory"], err


def test_a_read_only_tensorboard_directory_is_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    """A read-only mount (root writes through a chmod, not through a read-only file system)."""
    pytest.importorskip("tensorboard")
    (tmp_path / "tensorboard").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(tmp_path / "tensorboard")],
                      capture_output=True).returncode:
        pytest.skip("a read-only tmpfs cannot be mounted here (root only)")
    try:
        monkeypatch.setattr(setup_lib, "load_model", lambda *a, **k: pytest.fail("model loaded before the door check"))
        code, err = run_main(small_args(tiny_dir, tmp_path, "--report_to", "tensorboard"), capsys)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "tensorboard")], capture_output=True)
    assert code == 2 and err == [f"train.py: error: --report_to tensorboard writes its event files into "
                                 f"{tmp_path / 'tensorboard'}: cannot write in {tmp_path / 'tensorboard'} "
                                 "(Read-only file system)"], err


def test_wandb_online_without_a_login_is_one_line_before_the_model_loads(tiny_dir, tmp_path):
    """Before: wandb.init raised its UsageError (a traceback) after the data and the model had loaded."""
    pytest.importorskip("wandb")
    home = tmp_path / "home"                                    # no ~/.netrc, no wandb settings
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(home), OMP_NUM_THREADS="1", WANDB_CONFIG_DIR=str(home / "wandb"))
    proc = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, tmp_path / "run", "--steps", "1",
                                                                   "--report_to", "wandb")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("train.py: error: --report_to wandb has no login for ") and lines[0].endswith(
        ": run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to keep the run in RUN/wandb "
        "(wandb sync uploads it later)"), lines
    assert "starting from" not in proc.stdout and not os.path.exists(tmp_path / "run" / "metrics.jsonl")
    env["WANDB_MODE"] = "offline"                               # offline needs no login: the door lets it through
    assert subprocess.run([sys.executable, "-c", "from machinery import trackers; "
                           "import sys; sys.exit(trackers.start_problem('wandb', 'x') is not None)"],
                          cwd=REPO, env=env).returncode == 0


# ---------------------------------------------------------------------------------------
# Evaluation: samples.jsonl, --eval_temperature, --eval_data, --top_p
# ---------------------------------------------------------------------------------------

def test_samples_jsonl_after_each_evaluation_and_a_resume_keeps_them_once(tiny_dir, tmp_path):
    train.train(train.parse_args(small_args(tiny_dir, tmp_path, "--steps", "4", "--save_every", "2",
                                            "--log_eval_completions", "4")))
    lines = read_jsonl(tmp_path / "samples.jsonl")
    assert [x["step"] for x in lines] == [0] * 4 + [2] * 4 + [4] * 4      # step 0: eval_before_train
    rows = {r["prompt"]: r["answer"] for r in tasks.load("addition", "test", n=6, digits=1)[0]}
    for x in lines:
        assert rows[x["prompt"]] == x["answer"] and isinstance(x["completion"], str)
        assert x["reward"] in (0.0, 1.0) and "correct" in x
    resume.keep_samples_until(str(tmp_path / "samples.jsonl"), 2)       # what --resume from step 2 does
    assert [x["step"] for x in read_jsonl(tmp_path / "samples.jsonl")] == [0] * 4 + [2] * 4


@pytest.mark.slow
def test_eval_temperature_defaults_to_the_training_one_and_changes_evaluation_only(tiny_dir, tmp_path):
    runs = {}
    for name, extra in [("default", []), ("same", ["--eval_temperature", "1.0"]), ("cold", ["--eval_temperature", "0.05"])]:
        train.train(train.parse_args(small_args(tiny_dir, tmp_path / name, "--steps", "2", *extra)))
        runs[name] = (without_times(read_jsonl(tmp_path / name / "metrics.jsonl")),
                      [x["completion"] for x in read_jsonl(tmp_path / name / "samples.jsonl")])
    assert runs["same"] == runs["default"]
    assert runs["cold"][1] != runs["default"][1]                       # evaluation sampled otherwise
    drop_eval = lambda rows: [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows]
    assert drop_eval(runs["cold"][0]) == drop_eval(runs["default"][0])   # training did not move


@pytest.mark.slow
def test_eval_data_evaluates_on_another_source(tiny_dir, tmp_path):
    rows = tmp_path / "held_out.jsonl"
    # Worded otherwise than addition's "a+b\n" rows: a held-out file shares no prompt with training.
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{a}=\n", "answer": str(2 * a)}) + "\n" for a in range(3)))
    cfg = train.parse_args(small_args(tiny_dir, tmp_path / "run", "--steps", "2", "--eval_data", str(rows),
                                      "--n_eval", "3"))
    run = train.setup(cfg)
    assert (run.task.name, run.eval_task.name) == ("addition", "math") and sorted(r["answer"] for r in run.eval_rows) == ["0", "2", "4"]
    train.train(cfg, run)
    assert {x["prompt"] for x in read_jsonl(tmp_path / "run" / "samples.jsonl")} == {"0+0=\n", "1+1=\n", "2+2=\n"}


def test_eval_data_that_shares_prompts_with_the_training_rows_is_refused_with_the_count(tiny_dir, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(200)))
    train_prompts = {r["prompt"] for r in tasks.load(str(data), "train")[0]}
    some = tmp_path / "some.jsonl"                      # three training prompts among five new ones
    some.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n"
                            for p in sorted(train_prompts)[:3] + [f"What is {i} - {i}?" for i in range(5)]))
    for eval_data, n, count in ((data, 200, f"{len(train_prompts)} of its 200 prompts"), (some, 8, "3 of its 8 prompts")):
        code, err = run_main(small_args(tiny_dir, tmp_path / "run", "--data", str(data), "--eval_data", str(eval_data),
                                        "--n_eval", str(n), "--steps", "1"), capsys)
        assert code == 2 and len(err) == 1, err
        assert err[0] == (f"train.py: error: --eval_data {eval_data}: {count} are also training prompts, so held-out "
                          "pass@1 would partly be training accuracy; remove them from the evaluation file (the "
                          f"training reward already measures the training prompts) (--data {data})"), err
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")          # refused before any work


def test_top_p_reaches_the_sampler_for_rollouts_and_evaluation(tiny_dir, tmp_path, monkeypatch):
    temperature, seen = [], []               # each call's temperature; (top_p, temperature) of every draw
    generate, nucleus = rollout.generate_rollouts, rollout.top_p_filter
    monkeypatch.setattr(rollout, "generate_rollouts",
                        lambda *a, **k: temperature.append(k["temperature"]) or generate(*a, **k))
    monkeypatch.setattr(rollout, "top_p_filter",
                        lambda probs, top_p: seen.append((top_p, temperature[-1])) or nucleus(probs, top_p))
    train.train(train.parse_args(small_args(tiny_dir, tmp_path, "--steps", "2", "--top_p", "0.9",
                                            "--eval_temperature", "0.5")))
    assert set(seen) == {(0.9, 1.0), (0.9, 0.5)}


# ---------------------------------------------------------------------------------------
# Optimisation: learning-rate warm-up, gradient checkpointing
# ---------------------------------------------------------------------------------------

def test_lr_warmup_is_linear_in_the_step_then_constant(tiny_dir, tmp_path):
    rows = train.train(train.parse_args(small_args(tiny_dir, tmp_path / "w", "--steps", "5", "--lr", "1e-3",
                                                   "--lr_warmup_steps", "4", "--eval_every", "0")))
    assert [r["lr"] for r in rows] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3], rel=1e-12)
    flat = train.train(train.parse_args(small_args(tiny_dir, tmp_path / "f", "--steps", "2", "--lr", "1e-3",
                                                   "--eval_every", "0")))
    assert [r["lr"] for r in flat] == [1e-3, 1e-3]


def test_gradient_checkpointing_changes_memory_not_the_update(tiny_dir, tmp_path):
    # The backward recomputes each layer's forward with the same kernels: every logged
    # number of 2 steps measured equal bit for bit (AVX-512 and AVX2); the bound leaves
    # float32 room for other kernels. Negative control: layer 0's parameters get no gradient
    # (what reentrant checkpointing does when a layer's input needs none): gradient norms
    # off by 11-13%, 1e4x the bound.
    common = ["--steps", "2", "--advantage", "nsr", "--eval_every", "0"]
    plain = without_times(train.train(train.parse_args(small_args(tiny_dir, tmp_path / "p", *common))))

    def checkpointed(out, lose_layer_0=False):
        cfg = train.parse_args(small_args(tiny_dir, tmp_path / out, *common, "--gradient_checkpointing"))
        run = train.setup(cfg)
        assert run.model.is_gradient_checkpointing
        if lose_layer_0:
            for p in run.model.model.layers[0].parameters():
                p.register_hook(torch.zeros_like)
        return without_times(train.train(cfg, run))

    for a, b in zip(plain, checkpointed("c")):
        assert a.keys() == b.keys()
        assert [b[k] for k in a] == pytest.approx([a[k] for k in a], rel=1e-5, abs=1e-7)
    lost = checkpointed("lost", lose_layer_0=True)
    assert max(abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] for a, b in zip(plain, lost)) > 10 * 1e-5


# --- docs/extending.md's recipe "Add an advantage", followed in a copy of the repository ---

def follow_the_advantage_recipe(tmp_path):
    """The recipe's edits, word for word, for a throwaway advantage `scaled` with its own
    hyper-parameter tau: A = tau (r - mean r), which sums to zero per group, in a copy of the
    repository (its tests kept) at tmp_path/repo, which it returns."""
    copy = copy_of_the_repository(tmp_path, leave_out=("weights", "docs"))

    def insert(path, anchor, text, before=False):
        s = (copy / path).read_text()
        assert s.count(anchor) == 1, (path, anchor)
        (copy / path).write_text(s.replace(anchor, text + anchor if before else anchor + text))
    insert("advantages.py", "# ---------------------------------------------------------------------------------------\n"
           "# The registry and the door", '@register(zero_sum=True)\n'                         # its name, it sums to 0
           'def scaled(rewards: Tensor, tau: float = 0.5) -> Tensor:\n'
           '    """A throwaway advantage: tau (r - mean r)."""\n'
           '    return tau * (rewards - rewards.mean(dim=1, keepdim=True))\n\n\n', before=True)   # the function
    insert("advantages.py", "HYPER_RANGES = {\n", '    "tau": (lambda v, G: is_finite_number(v) and v > 0, "a finite tau > 0",\n'
           '            "the scale of the centred reward"),\n')                  # its range and what it is: its flag
    insert("tests/lesson/test_advantages.py", "RANGE_CASES = [\n", '    ("scaled", "tau", [0.0, float("nan")], [1e-3]),\n')
    insert("tests/lesson/test_advantages.py", '        "reinforce": (1.0, 0.0),\n', '        "scaled": (0.5 * (1 - p), -0.5 * p),\n')
    return copy


@pytest.mark.slow
def test_advantage_recipe_end_to_end(tiny_dir, tmp_path):
    # docs/extending.md, "Add an advantage": every edit it lists, and nothing else, in a copy of the
    # repository. The registry tests must pass with the new advantage in them, and train.py
    # must train it 2 steps with its hyper-parameter from the command line and record it.
    copy = follow_the_advantage_recipe(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/lesson/test_advantages.py"],
                           cwd=copy, env=env, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert "test_closed_forms_at_G8[scaled] PASSED" in tests.stdout                   # the registry tests ran on it
    assert "test_zero_sum_methods_sum_to_zero_per_group[scaled] PASSED" in tests.stdout
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, out, "--steps", "2", "--eval_every", "0",
                                                                   "--advantage", "scaled", "--tau", "0.25")],
                         cwd=copy, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "config.json").read_text())["adv"]["tau"] == 0.25
    refused = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, tmp_path / "bad", "--advantage", "scaled",
                                                                       "--tau", "0")],
                             cwd=copy, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "scaled: needs a finite tau > 0, got 0.0" in refused.stderr   # its range, at the door



FORGOTTEN_ROW_CHECK = """
import contextlib, io
import train
def parse(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            train.parse_args([*argv, "--out_dir", "x"])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()
code, _, err = parse("--advantage", "scaled", "--tau", "0.25")
assert code == 2 and err.splitlines() == ["train.py: error: scaled: its hyper-parameter 'tau' has no range in "
                                          "advantages.HYPER_RANGES (docs/extending.md, 'Add an advantage')"], err
code, out, _ = parse("--help")
assert code == 0 and "scaled: no row in advantages.HYPER_RANGES (default 0.5)." in " ".join(out.split()), out
code, _, err = parse("--advantage", "grpo", "--tau", "0.25")      # negative control: a flag grpo does not read
assert code == 2 and "--tau 0.25 is read only by --advantage scaled, not grpo" in err, err
print("ok")
"""


def test_an_advantage_whose_hyper_parameter_has_no_range_is_one_line_at_the_door(tmp_path):
    # The recipe with one step forgotten, as a new user might: no HYPER_RANGES row for tau.
    # train.py must still import and list --tau, and choosing the advantage must be one line
    # naming the missing row and the recipe (exit 2), not a KeyError from the import.
    copy = follow_the_advantage_recipe(tmp_path)
    row = '    "tau": (lambda v, G: is_finite_number(v) and v > 0, "a finite tau > 0",\n            "the scale of the centred reward"),\n'
    source = (copy / "advantages.py").read_text()
    assert source.count(row) == 1
    (copy / "advantages.py").write_text(source.replace(row, ""))
    out = subprocess.run([sys.executable, "-c", FORGOTTEN_ROW_CHECK], cwd=copy, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
