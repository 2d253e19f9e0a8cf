"""The person who edits the source: their bugs show, their runs say what happened, their
model is kept, their task and their reward plug in, and other frameworks' names point
to ours.

Runs use an untrained tiny model with tiny budgets (a few seconds each), or, where the
default numbers matter, a few steps of the shipped warm-up.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import train
from machinery import checkpoint, checks, flags, metrics

from tests.engine.helpers import SAMPLE_WITH_TOP_K, add_top_k, copy_of_the_repository, project_files, small_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------------------
# 1. A bug in a chapter keeps its traceback; a usage error is one line
# ---------------------------------------------------------------------------------------

def test_the_copy_to_break_is_what_git_would_commit(tmp_path):
    # The editing tests copy project_files(): tracked files and new ones .gitignore leaves in,
    # never what it ignores. Built on a small repository: a tracked file, a new one, an ignored
    # log and venv file, a tracked file deleted from the tree (the negative cases: each would
    # be copied by a plain copytree).
    root = tmp_path / "r"
    root.mkdir()
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=root,
                                    check=True, capture_output=True)
    git("init", "-q")
    (root / ".gitignore").write_text(".ci-build-*.log\n.venv*/\n")
    for name in ("kept.py", "deleted.py"):
        (root / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "start")
    (root / "new.py").write_text("y = 2\n")
    (root / ".ci-build-vllm.log").write_text("building\n")
    (root / ".venv-vllm").mkdir()
    (root / ".venv-vllm" / "python").write_text("")
    (root / "deleted.py").unlink()
    assert project_files(root) == [".gitignore", "kept.py", "new.py"]


def test_what_ci_writes_into_the_clone_is_ignored_by_git():
    # .ci/run writes its venvs, build logs and Quickstart script into the clone while the suite
    # runs; the copies above leave out what .gitignore ignores, so each must be ignored (a build
    # log copied mid-write once differed from its original and failed the top_k test in CI).
    script = open(os.path.join(REPO, ".ci", "run")).read()
    written = set(re.findall(r"> (\.ci-[\w.-]+)", script)) | {f"{v}/bin/python" for v in
                                                              re.findall(r"(\.venv[\w-]*)", script)}
    assert {".ci-build-vllm.log", ".ci-build-verl.log", ".ci-quickstart.sh", ".venv-vllm/bin/python"} <= written
    shown = subprocess.run(["git", "check-ignore", "--no-index", "-v", "-n", *sorted(written)], cwd=REPO,
                           capture_output=True, text=True).stdout.splitlines()
    not_ignored = [line.split("\t")[-1] for line in shown if line.startswith("::")]
    assert not_ignored == [], f"not in .gitignore: {not_ignored}"
    assert not any(p.startswith((".venv", ".ci-", "runs/")) for p in project_files())


@pytest.mark.slow
def test_a_bug_put_in_a_chapter_shows_its_traceback_naming_the_file(tmp_path):
    repo = copy_of_the_repository(tmp_path)
    source = (repo / "loss.py").read_text()
    head = "def policy_loss("
    body = source.index(":\n", source.index(head)) + 2
    indent = "    "
    first = source.index('"""', body)                       # after the docstring
    end_doc = source.index('"""', first + 3) + 3
    (repo / "loss.py").write_text(source[:end_doc] + f"\n{indent}int(\"not a number\")" + source[end_doc:])
    proc = subprocess.run([sys.executable, "train.py", "--steps", "1", "--out_dir", str(tmp_path / "run"),
                           "--eval_every", "0", "--prompts_per_step", "4", "--group_size", "4"],
                          cwd=repo, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last)" in proc.stderr
    assert re.search(r'File ".*loss\.py", line \d+, in policy_loss', proc.stderr)
    assert "ValueError: invalid literal for int() with base 10: 'not a number'" in proc.stderr


NEW_SETTING_CHECK = """
import contextlib, dataclasses, io, json
import train
from machinery import config
cfg = train.parse_args(["--prefetch", "3", "--out_dir", "x"])
assert cfg.update.prefetch == 3, cfg.update
assert json.loads(json.dumps(dataclasses.asdict(cfg)))["update"]["prefetch"] == 3      # config.json nests it
assert "prefetch" in config.resume_rules(cfg)[0]                                      # --resume may change it
help_text = io.StringIO()
with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
    train.parse_args(["--help"])
assert "Micro-batches to prepare ahead" in help_text.getvalue()
open("flat.json", "w").write(json.dumps({"prefetch": 2}))                              # --config, flat
assert train.parse_args(["--config", "flat.json", "--out_dir", "x"]).update.prefetch == 2
try:
    train.parse_args(["--prefetch", "-1", "--out_dir", "x"])
except SystemExit as e:
    assert e.code == 2
print("ok")
"""


def test_a_new_setting_is_one_field_in_the_file_that_reads_it(tmp_path):
    # A person adding a flag writes one field, with its docstring and its resume rule, and
    # its check, in the part whose file reads it (here forward.UpdateConfig), and nothing
    # else: the flag, its --help, --config, config.json's nesting and the resume check follow.
    repo = copy_of_the_repository(tmp_path)
    path = repo / "machinery" / "forward.py"
    anchor = "    grad_clip: float = field(default=1.0, metadata=FIXED)\n"
    check = "        refuse_nonfinite(self)\n"
    source = path.read_text()
    assert source.count(anchor) == 1 and source.count(check) == 1
    path.write_text(source.replace(anchor, '    prefetch: int = field(default=0, metadata=MAY_CHANGE)\n'
                                           '    """Micro-batches to prepare ahead (a setting of this test)."""\n' + anchor)
                    .replace(check, check + '        check_counts(self, {"prefetch": 0})\n'))
    out = subprocess.run([sys.executable, "-c", NEW_SETTING_CHECK], cwd=repo, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert "train.py: error: --prefetch must be >= 0, got -1" in out.stderr


def test_a_new_sampling_setting_changes_what_is_sampled_and_takes_one_file(tmp_path):
    # top_k, added as a reader would: its field and check where the sampling settings are
    # declared, and one line for each engine's distribution, all in machinery/sampler.py
    # (nanochat's generate takes two files: its engine and the script's call). Nothing
    # else is touched, and it reaches the sampling: with --top_k 1 every group's rollouts
    # are one (greedy), without it they differ (the negative control). vLLM's engine with
    # the same edit: tests/engine/test_vllm_engine.py (CI's step 2).
    repo, changed = add_top_k(tmp_path)
    assert changed == ["machinery/sampler.py"]
    out = subprocess.run([sys.executable, "-c", SAMPLE_WITH_TOP_K, "transformers"], cwd=repo, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    refused = subprocess.run([sys.executable, "train.py", "--top_k", "-1", "--out_dir", str(tmp_path / "run")],
                             cwd=repo, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and refused.stderr.strip() == "train.py: error: --top_k must be >= 0 (0 = off), got -1"


def backend_readers(repo) -> dict[str, list[str]]:
    """{file: the functions in it that read a `.backend` attribute}, and under "imports vLLM"
    the files that import machinery/vllm_rollout.py, over machinery/ and train.py."""
    import ast
    paths = [os.path.join("machinery", f) for f in sorted(os.listdir(os.path.join(repo, "machinery")))
             if f.endswith(".py")] + ["train.py"]
    readers, importers = {}, []
    for path in paths:
        tree = ast.parse(open(os.path.join(repo, path)).read())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(n, ast.Attribute) and n.attr == "backend" for n in ast.walk(fn)):
                readers.setdefault(path, []).append(fn.name)
        if any(isinstance(n, ast.ImportFrom) and (n.module == "machinery.vllm_rollout" or n.module == "machinery"
               and any(a.name == "vllm_rollout" for a in n.names)) for n in ast.walk(tree)):
            importers.append(path)
    return {**{path: sorted(names) for path, names in readers.items()}, "imports vLLM": importers}


def test_the_backend_is_read_by_the_sampler_alone_and_the_loop_names_no_engine(tmp_path):
    # The sampler (machinery/sampler.py) is built from --backend and is the only code that
    # reads it (besides the setting's own check and set-up's question whether vLLM is
    # installed): the loop, the evaluation, the old policy's pass and the diagnostics ask
    # the sampler. Only the sampler and the canary's smoke test import vllm_rollout.py.
    assert backend_readers(REPO) == {
        "machinery/sampler.py": ["__post_init__", "make_sampler", "memory_problem"],
        "machinery/setup.py": ["check_inputs"],
        "imports vLLM": ["machinery/sampler.py", "machinery/vllm_staleness.py"]}
    # negative control: a loop that branches on the engine and imports it is seen
    repo = copy_of_the_repository(tmp_path)
    source = (repo / "train.py").read_text()
    loop = "    for step in bar:\n"
    assert source.count(loop) == 1
    (repo / "train.py").write_text(source.replace(loop, loop + "        from machinery import vllm_rollout\n"
                                                             "        vllm = cfg.sampling.backend == 'vllm'\n"))
    found = backend_readers(repo)
    assert found["train.py"] == ["train"] and "train.py" in found["imports vLLM"]


def test_a_usage_error_at_the_door_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\nnot json\n')
    with pytest.raises(SystemExit) as e:
        train.main(["--data", str(bad), "--out_dir", str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("train.py: error: ") and "rows.jsonl" in err[0]


def test_a_value_error_raised_while_training_is_not_swallowed(tiny_dir, tmp_path, monkeypatch):
    import batching

    def broken(*args, **kwargs):                # every step splits its batch: a bug here always runs
        raise ValueError("a bug of the reader's")
    monkeypatch.setattr(batching, "minibatch_indices", broken)
    with pytest.raises(ValueError, match="a bug of the reader's") as e:
        train.main(small_args(tiny_dir, tmp_path / "run", "--steps", "1"))
    assert not isinstance(e.value, checks.UsageError)


# ---------------------------------------------------------------------------------------
# 2-3. The run shows its start (step 0) and its end (a summary); the model is kept
# ---------------------------------------------------------------------------------------

def test_step_0_is_the_start_and_the_run_ends_with_a_summary_and_its_models(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = train.parse_args(small_args(tiny_dir, out, "--steps", "4"))
    run = train.setup(cfg)
    history = train.train(cfg, run)
    rows = read_jsonl(out / "metrics.jsonl")
    start = json.load(open(out / "start.json"))["eval"]
    assert rows[0] == {"step": 0, **start, "time/elapsed": 0.0}          # step 0: the start's evaluation only
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and [h["step"] for h in history] == [1, 2, 3, 4]
    said = capsys.readouterr().out
    # The start's evaluation says what it scores before it starts (a minute of silence on SmolLM2).
    assert said.index("train.py: evaluating the starting model on 6 held-out prompts x 2 samples (12 rollouts)") < \
        said.index("train.py: done:")
    evals = [r for r in rows if "eval/pass@1" in r]
    best = max(evals, key=lambda r: (r["eval/pass@1"], -r["step"]))
    assert f"held-out pass@1 {start['eval/pass@1']:.3f} at the start, {rows[-1]['eval/pass@1']:.3f} at step 4, " \
           f"best {best['eval/pass@1']:.3f} at step {best['step']}" in said
    assert f"python -m tools.plot_runs {out}" in said and f"{out / 'final'} (step 4)" in said
    # RUN/final and RUN/best load as any hub model does, and hold those weights
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    AutoTokenizer.from_pretrained(out / "final")
    assert json.load(open(out / "final" / "info.json")) == {"step": 4}
    assert json.load(open(out / "best" / "info.json")) == {"step": best["step"], "eval/pass@1": best["eval/pass@1"]}
    trained = run.model.state_dict()                                     # the weights the run ended with
    assert all(torch.equal(v, trained[k].cpu()) for k, v in final.state_dict().items())


def test_best_is_the_first_highest_and_keeps_the_start_until_beaten(tiny_dir, tmp_path):
    from machinery.run import keep_best
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    run = type("R", (), {"model": model, "tokenizer": tok})()
    best = keep_best(run, str(tmp_path), {"step": 0, "eval/pass@1": 0.5}, None)
    assert keep_best(run, str(tmp_path), {"step": 25, "eval/pass@1": 0.5}, best) is best      # a tie: the first
    assert keep_best(run, str(tmp_path), {"step": 50}, best) is best                         # no evaluation
    best = keep_best(run, str(tmp_path), {"step": 75, "eval/pass@1": 0.75}, best)
    assert checkpoint.model_info(str(tmp_path / "best")) == {"step": 75, "eval/pass@1": 0.75}
    assert not os.path.exists(tmp_path / "best.tmp") and not os.path.exists(tmp_path / "best.old")


def test_a_resumed_run_keeps_one_step_0_and_the_same_metrics(tiny_dir, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train.train(train.parse_args(small_args(tiny_dir, whole, "--steps", "4", "--save_every", "2")))
    train.train(train.parse_args(small_args(tiny_dir, cut, "--steps", "2", "--save_every", "2")))
    train.train(train.parse_args(small_args(tiny_dir, cut, "--steps", "4", "--save_every", "2", "--resume")))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert strip(read_jsonl(cut / "metrics.jsonl")) == strip(read_jsonl(whole / "metrics.jsonl"))


def test_plot_runs_draws_pass_at_1_first_and_never_writes_into_the_working_directory(tiny_dir, tmp_path,
                                                                                      monkeypatch):
    from tools import plot_runs
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        train.train(train.parse_args(small_args(tiny_dir, d, "--steps", "2")))
    assert plot_runs.PANELS[0][0] == "held-out pass@k"
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    plot_runs.main([str(a), str(b)])
    assert os.listdir(here) == [] and os.path.isfile(a / "compare.png")
    assert plot_runs.summarize(str(a))["start_pass@1"] == read_jsonl(a / "metrics.jsonl")[0]["eval/pass@1"]


# ---------------------------------------------------------------------------------------
# 4. New tasks: a held-out split of a file, a word when nothing is learned, a new warm-up said aloud
# ---------------------------------------------------------------------------------------

def test_a_jsonl_file_holds_out_one_prompt_in_ten_unless_eval_data_is_given(tmp_path):
    import tasks
    from tasks.task import is_held_out
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(200)))
    train_rows, _ = tasks.load(str(path), "train")
    test_rows, _ = tasks.load(str(path), "test", n=200)
    everything, _ = tasks.load(str(path), "all")
    assert len(everything) == 200 and len(train_rows) + len(test_rows) == 200
    assert {r["prompt"] for r in train_rows}.isdisjoint(r["prompt"] for r in test_rows)
    assert all(is_held_out(r["prompt"]) for r in test_rows) and 5 <= len(test_rows) <= 40
    tiny = tmp_path / "two.jsonl"
    tiny.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in ("a", "b")
                            if not is_held_out(p)))
    with pytest.raises(ValueError, match="no held-out row"):
        tasks.load(str(tiny), "test")


@pytest.mark.slow
def test_a_jsonl_run_says_how_many_rows_it_holds_out_and_warns_when_nothing_is_learned(tiny_dir, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(100)))
    proc = subprocess.run([sys.executable, "train.py", *small_args(tiny_dir, tmp_path / "run", "--steps", "10",
                                                                   "--data", str(path), "--eval_every", "0",
                                                                   "--n_eval", "0")],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = sum(__import__("tasks.task", fromlist=["x"]).is_held_out(f"{i}+{i}=") for i in range(100))
    assert f"{100 - held} rows to train on, {held} held out for evaluation" in proc.stdout
    assert "nothing to learn: every group's rollouts have had equal rewards for 10 steps in a row" in proc.stderr


def test_nothing_to_learn_speaks_once_at_the_streaks_length():
    rows = [{"frac_all_equal": 0.5, "reward": 0.3}] + [{"frac_all_equal": 1.0, "reward": 0.0}] * 12
    said = [metrics.nothing_to_learn(rows[:i], steps=10) for i in range(1, len(rows) + 1)]
    assert [i for i, s in enumerate(said) if s] == [10] and "all wrong" in said[10]
    assert metrics.nothing_to_learn([{"frac_all_equal": 1.0, "reward": 1.0}] * 3, steps=3).count("mastered") == 1


def test_a_task_without_a_shipped_warm_up_is_said_to_be_warmed_up_here(tmp_path):
    from machinery import warmups
    said = []
    cfg = warmups.WarmupConfig(task="mytask", max_steps=1)
    shipped = tmp_path / "weights"
    (shipped / "addition-s0-abc").mkdir(parents=True)
    try:
        warmups.load_or_warmup(cfg, cache_dir=str(tmp_path / "cache"), shipped_dir=str(shipped), say=said.append)
    except Exception:                # the warm-up itself needs the task's rows; the message comes first
        pass
    assert said and said[0].startswith("mytask: no warm-up of the embedded model ships for this task") \
        and "stale" not in said[0]


def test_a_warm_up_that_will_run_says_its_steps_time_and_cache_first_and_trains_the_same(tmp_path):
    # --digits 2 (any warm-up nothing ships or caches) started ~1,500 steps without a word.
    from machinery import warmups
    cfg = warmups.WarmupConfig(task="addition", digits=1, max_steps=4, n_train=64, eval_every=3, eval_prompts=8,
                               batch_size=8)
    shipped, said = tmp_path / "weights", []
    (shipped / "addition-s0-abc").mkdir(parents=True)          # addition ships warm-ups, not this one
    path = warmups.load_or_warmup(cfg, cache_dir=str(tmp_path / "cache"), shipped_dir=str(shipped), say=said.append)
    assert said[0] == ("addition: no warm-up of the embedded model is shipped or cached for --digits 1 --warmup_seed 0 "
                       "(weights/ ships --digits 3 with --warmup_seed 0 or 5): warming it up here, once")
    assert re.fullmatch(r"warm-up: 4 supervised steps, about \d+ s on this machine \(\d+\.\d\d s a step and 2 "
                        r"evaluations of \d+\.\d s, timed now\); cached in " + re.escape(path), said[1]), said
    assert path == str(tmp_path / "cache" / warmups.cache_key(cfg)) and len(said) == 2
    # The estimate ran on a copy: the same warm-up without it gives the same bytes.
    quiet = warmups.warmup(cfg, str(tmp_path / "quiet"))
    assert checkpoint.weights_sha256(quiet) == checkpoint.weights_sha256(path)


# ---------------------------------------------------------------------------------------
# 5. A reward function of the user's own
# ---------------------------------------------------------------------------------------

REWARD_MODULE = '''
def length_reward(response, answer, prompt):
    """1 for a response of at most 3 characters, 0 otherwise, and the length to log."""
    return {"reward": float(len(response) <= 3), "length": float(len(response))}

def out_of_range(response, answer, prompt):
    return 2.0

def two_arguments(response, answer):
    return 1.0
'''


def test_reward_module_function_replaces_the_checker_end_to_end(tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.chdir(tmp_path)
    history = train.train(train.parse_args(small_args(tiny_dir, tmp_path / "run", "--steps", "2",
                                                      "--reward", "my_rewards:length_reward")))
    assert all("reward/length" in h and h["reward/length"] > 0 for h in history)
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert all(s["reward"] == float(len(s["completion"]) <= 3) and s["length"] == len(s["completion"])
               for s in samples)


@pytest.mark.parametrize("spec,needle", [
    ("my_rewards", "expected MODULE:FUNCTION or FILE.py:FUNCTION"),
    ("no_such_module:f", "cannot import 'no_such_module'"),
    ("my_rewards:missing", "has no function 'missing'"),
    ("my_rewards:out_of_range", "the reward must be in [0, 1], got 2.0"),
    ("my_rewards:two_arguments", "calling it as f(response, answer, prompt) failed"),
    ("nowhere.py:f", "no such file 'nowhere.py'"),
])
def test_reward_errors_are_one_line_at_the_door(spec, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        train.main(["--reward", spec, "--out_dir", str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and needle in err, err


def test_reward_from_a_file_path(tmp_path):
    from tasks import user_reward
    import tasks
    (tmp_path / "r.py").write_text(REWARD_MODULE)
    task = user_reward.with_reward(tasks.get("addition"), f"{tmp_path / 'r.py'}:length_reward",
                                   {"prompt": "1+2\n", "answer": "3"})
    assert task.check("12", "3", "1+2\n") == {"reward": 1.0, "length": 2.0, "correct": 1.0}
    assert task.check("1234", "3") == {"reward": 0.0, "length": 4.0, "correct": 0.0}


# A reward that passes the door and goes bad later: CALLS counts the calls (a new module
# per run, loaded from its file), the first GOOD of them score by length as above.
LATER_BAD = '''
import time
CALLS = [0]
GOOD = {good}

def later(response, answer, prompt):
    CALLS[0] += 1
    if CALLS[0] <= GOOD:
        return float(len(response) <= 3)
    {bad}
'''
# The door calls it twice (the training task and the evaluation task); each step scores 4 x 4
# rollouts: with GOOD = 2 + 2 x 16 the third step's first rollout is the first bad call.
GOOD_CALLS = 2 + 2 * 16


@pytest.mark.parametrize("bad,shown", [
    ("return float('nan')", "'reward' must be a finite number, got nan"),
    ("return None", "'reward' must be a finite number, got None"),
    ("return 5.0", "the reward must be in [0, 1], got 5.0"),
    ("return {'reward': 1.0, 'length': 10 ** 400}", "'length' must be a finite number, got an integer of about 401 digits"),
    ("while True: time.sleep(0.01)", "no value after 0.5 s (--reward_timeout 0.5: raise it, or 0 for no limit)"),
    ("try:\n        while True: pass\n    except Exception:\n        return 0.0", "no value after 0.5 s"),
])
def test_a_reward_that_goes_bad_mid_run_is_one_line_and_the_run_keeps_its_steps(bad, shown, tiny_dir, tmp_path,
                                                                                  capsys):
    from tests.engine.helpers import quick_run_args, run_main
    (tmp_path / "r.py").write_text(LATER_BAD.format(good=GOOD_CALLS, bad=bad))
    out = tmp_path / "run"
    code, err = run_main(quick_run_args(tiny_dir, out, "--steps", "4", "--reward", f"{tmp_path / 'r.py'}:later",
                                        "--reward_timeout", "0.5"), capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"train.py: error: --reward {tmp_path / 'r.py'}:later: {shown}"), err
    assert "for the response" in err[0] and "to the row prompt=" in err[0] and "answer=" in err[0]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]          # the steps done are kept
    assert os.path.isdir(out / "checkpoints" / "step_000002")                        # and the checkpoint of step 2


def test_a_reward_too_large_for_a_float_is_one_line_at_the_door(tmp_path, monkeypatch, capsys):
    (tmp_path / "huge.py").write_text("def f(response, answer, prompt):\n    return 10 ** 400\n")
    with pytest.raises(SystemExit) as e:
        train.main(["--reward", f"{tmp_path / 'huge.py'}:f", "--out_dir", str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0, err
    assert "'reward' must be a finite number, got an integer of about 401 digits, too large for a float" in err


@pytest.mark.parametrize("bad,error", [("return 1 / 0", ZeroDivisionError), ("return len(None)", TypeError)])
def test_an_exception_the_reward_raises_itself_keeps_its_traceback(bad, error, tiny_dir, tmp_path, capsys):
    # A bug in the user's function, at a later step or at the door's own call (a TypeError
    # from inside the function is not a signature that does not fit): the traceback ends in it.
    from tests.engine.helpers import quick_run_args
    for good in (GOOD_CALLS, 0):
        (tmp_path / f"r{good}.py").write_text(LATER_BAD.format(good=good, bad=bad))
        with pytest.raises(error) as e:
            train.main(quick_run_args(tiny_dir, tmp_path / f"run{good}", "--steps", "4", "--reward",
                                      f"{tmp_path / f'r{good}.py'}:later"))
        assert e.traceback[-1].name == "later"


def test_the_time_limit_stops_python_code_and_restores_the_previous_handler():
    import signal
    import time
    from tasks import user_reward
    before = signal.getsignal(signal.SIGALRM)
    message = lambda: "too slow"
    for slow in (lambda: time.sleep(5), lambda: [None for _ in iter(int, 1)]):        # a sleep, a loop for ever
        with pytest.raises(user_reward.RewardError, match="^too slow$"):
            user_reward.call_with_limit(slow, (), 0.2, message)
    assert user_reward.call_with_limit(lambda x: x + 1, (1,), 0.2, message) == 2     # in time: its value
    assert user_reward.call_with_limit(lambda: 7, (), 0, message) == 7               # 0: no limit
    assert signal.getsignal(signal.SIGALRM) == before
    assert train.Config().reward_timeout == 30.0


def test_a_reward_that_catches_its_interruption_and_returns_late_is_stopped_all_the_same():
    """`except BaseException:` catches the interruption; a function that then returns gave its
    value after its time. Before, that value was taken (0.5 here, 5 s late)."""
    import time
    from tasks import user_reward

    def stubborn():
        try:
            time.sleep(5)
        except BaseException:
            return 0.5
    with pytest.raises(user_reward.RewardError, match=r"^too slow \(it caught the interruption and returned late\)$"):
        user_reward.call_with_limit(stubborn, (), 0.2, lambda: "too slow")


# A --reward whose calls after GOOD_CALLS never end and swallow every interruption; the grace
# made short, in the process that runs it.
NEVER_STOPS = LATER_BAD.format(good=GOOD_CALLS, bad="""while True:
        try:
            time.sleep(100)
        except BaseException:
            pass""")
RUN_WITH_SHORT_GRACE = """
import sys
sys.path.insert(0, {repo!r})
import train
from tasks import user_reward
user_reward.REWARD_GRACE = 2.0
train.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_a_reward_that_ignores_its_timeout_stops_the_run_in_one_line_after_a_grace_period(tiny_dir, tmp_path):
    """A function that catches every interruption and goes on (`except BaseException: pass`
    in a loop) could not be stopped by --reward_timeout: the run hung at step 3 for ever.
    Now, --reward_timeout 0.5 and REWARD_GRACE seconds later, the process ends with one line
    and exit code 2; steps 1-2 and the checkpoint of step 2 are kept."""
    from tests.engine.helpers import quick_run_args
    (tmp_path / "r.py").write_text(NEVER_STOPS)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", RUN_WITH_SHORT_GRACE.format(repo=REPO),
                           *quick_run_args(tiny_dir, out, "--steps", "4", "--reward", f"{tmp_path / 'r.py'}:later",
                                           "--reward_timeout", "0.5")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    err = [line for line in done.stderr.splitlines() if line.startswith("train.py")]
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert err[0].startswith(f"train.py: error: --reward {tmp_path / 'r.py'}:later: no value after 0.5 s")
    assert err[0].endswith("and it went on for 2 s more, catching the interruption (an `except BaseException:` in "
                           "it?); the process stops here: every step logged before and the checkpoints are kept")
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert os.path.isdir(out / "checkpoints" / "step_000002")


def test_reward_timeout_without_a_reward_is_refused(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--reward_timeout", "5"])
    assert "--reward_timeout 5 limits a --reward function's calls; there is no --reward" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# 6. TRL's and verl's names point to ours; a flag that cannot act is refused
# ---------------------------------------------------------------------------------------

def setting_names(cell: str) -> list[str]:
    """The setting a TRL or verl cell of docs/trl_verl.md names: its first `code` span,
    without a value (=...) and without its dotted path; [] for "-" or a value."""
    spans = [x for x in re.findall(r"`([^`]+)`", cell) if x != "key=value"]      # Hydra's syntax, no setting
    if not spans:
        return []
    name = spans[0].split("=")[0].split(" ")[0].split(".")[-1]
    return [name] if re.fullmatch(r"[a-z_][a-z_0-9]*", name) else []


def test_every_trl_and_verl_setting_in_the_mapping_is_our_flag_or_a_one_line_hint():
    ours = {f.name for _, _, f in flags.leaf_fields(train.Config())}            # every flag, in every part
    rows = [line.split("|")[1:-1] for line in open(os.path.join(REPO, "docs", "trl_verl.md"))
            if line.startswith("| ") and not line.startswith("| concept") and not line.startswith("|---")]
    missing = sorted({name for row in rows if len(row) >= 4 for cell in row[2:4] for name in setting_names(cell)
                      if name not in ours and name not in flags.OTHER_NAMES})
    assert missing == []
    assert len(rows) > 30


@pytest.mark.parametrize("argv,needle", [
    (["--per_device_train_batch_size", "4"], "is --micro_batch here"),
    (["--gradient_accumulation_steps", "2"], "accumulated over micro-batches of --micro_batch"),
    (["--scale_rewards", "none"], "--advantage mean"),
    (["--save_steps", "10"], "is --save_every here"),
    (["--loss_type", "dapo"], "--agg token-mean"),
    (["--loss_type", "dr_grpo"], "--agg seq-mean-token-sum-norm"),
    (["--kl_estimator", "low_var_kl"], "--kl_estimator k3"),
    (["--advantage", "dr_grpo"], "--advantage mean"),
    (["--eps_high", "0.28"], "--eps_high 0.28 cannot act with one optimizer step per rollout batch"),
    (["--dual_clip", "3"], "--dual_clip 3.0 cannot act with one optimizer step per rollout batch"),
    (["--kl_estimator", "k1"], "--kl_estimator k1 is read only with a KL penalty"),
])
def test_other_frameworks_names_and_inert_flags_are_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and needle in err, err


def test_clip_flags_are_taken_where_they_act():
    cfg = train.parse_args(["--eps_high", "0.28", "--minibatches", "4"])
    assert cfg.loss.eps_high == 0.28
    assert train.parse_args(["--kl_estimator", "k1", "--kl_coef", "0.01"]).loss.kl_estimator == "k1"


def test_target_noise_is_a_noisy_teacher_for_any_task_and_leaves_the_shipped_names_alone():
    from machinery import warmups
    clean = warmups.WarmupConfig(task="countdown", n_train=400)
    noisy = warmups.WarmupConfig(task="countdown", n_train=400, target_noise=0.5)
    (rows, _), (swapped, _) = warmups._task_rows(clean), warmups._task_rows(noisy)
    changed = [a["target"] != b["target"] for a, b in zip(rows, swapped)]
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in swapped]          # the same problems
    assert 0.35 < sum(changed) / len(changed) < 0.6                               # about half swapped
    targets = {r["target"] for r in rows}
    assert all(b["target"] in targets for b in swapped)                          # each a well-formed target
    assert warmups.cache_key(noisy) != warmups.cache_key(clean)
    shipped = {warmups.cache_key(c) for c in warmups.shipped_configs()}
    assert shipped == {d for d in os.listdir(warmups.SHIPPED_DIR) if os.path.isdir(os.path.join(warmups.SHIPPED_DIR, d))}
