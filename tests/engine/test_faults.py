"""Fault injection: what a run directory can suffer, and what train.py does about it.

Each test damages a run the way the world does (a second run in the same directory, a
changed flag on resume, a truncated or missing checkpoint file, a pointer left empty, a
full disk that tore the last metrics line, a pickle from someone else) and checks the
contract: a clear one-line refusal (exit code 2 at the CLI), or a fallback with a
one-line warning, and never a lost checkpoint or a silently different run.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from machinery import checkpoint
import train

from tests.engine.helpers import quick_run_args, run_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def steps_logged(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def ckpt(out_dir, step):
    return os.path.join(out_dir, "checkpoints", f"step_{step:06d}")


# --- a second run in the same directory --------------------------------------------------

@pytest.mark.slow
def test_fresh_run_in_used_directory_is_refused_and_destroys_nothing(tiny_dir, tmp_path, capsys):
    # The reported sequence: 8 steps, then a fresh 2-step run in the same directory. The
    # old code deleted metrics.jsonl, kept the old step_6/step_8 (keep-2 by name), and
    # deleted each new checkpoint as soon as it was written, while `latest` named it.
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "8"), capsys)[0] == 0
    before = sorted(os.listdir(tmp_path / "checkpoints"))
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)
    assert code == 2 and len(err) == 1 and "already holds a run" in err[0] and "--overwrite" in err[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == before == ["latest", "step_000006", "step_000008"]
    assert steps_logged(tmp_path) == list(range(1, 9))
    # --overwrite starts clean: only the new run's checkpoints and metrics remain
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2", "--overwrite"), capsys)[0] == 0
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_000002"]
    assert steps_logged(tmp_path) == [1, 2]
    # and it resumes (the old code crashed here: `latest` named a deleted directory)
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume"), capsys)[0] == 0
    assert steps_logged(tmp_path) == [1, 2, 3, 4]


def test_prune_never_deletes_the_checkpoint_just_written(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4, 6, 8):                                   # an abandoned run's future
        (root / f"step_{step:06d}").mkdir(parents=True)
    (root / "step_000003.tmp").mkdir()                          # a save killed half-way
    checkpoint.prune(str(root), step=3, keep=2)
    assert sorted(os.listdir(root)) == ["step_000002"]          # 3 itself is not on disk here
    (root / "step_000003").mkdir()
    checkpoint.prune(str(root), step=3, keep=1)
    assert sorted(os.listdir(root)) == ["step_000003"]


# --- resume compares the config ----------------------------------------------------------

@pytest.mark.parametrize("changed", [["--lr", "1e-3"], ["--weight_decay", "0.1"], ["--group_size", "2"],
                                     ["--advantage", "nsr"], ["--kl_coef", "0.1"], ["--minibatches", "2"],
                                     ["--seed", "1"]])
def test_resume_refuses_a_change_to_the_run_naming_the_field(tiny_dir, tmp_path, capsys, changed):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    config_before = open(tmp_path / "config.json").read()
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume", *changed), capsys)
    assert code == 2 and len(err) == 1, err
    assert f"{changed[0]} " in err[0] and "would change the run" in err[0]
    assert open(tmp_path / "config.json").read() == config_before          # not rewritten
    assert steps_logged(tmp_path) == [1, 2]


def test_resume_allows_what_does_not_change_the_math(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume", "--eval_every", "4",
                              "--save_every", "1", "--max_minutes", "30", "--micro_batch", "4"), capsys)
    assert code == 0 and err == []
    assert steps_logged(tmp_path) == [1, 2, 3, 4]
    assert json.load(open(tmp_path / "config.json"))["evaluation"]["eval_every"] == 4      # nested in its part


def test_resume_takes_the_runs_own_settings_and_says_each_flag_that_changes_one(tiny_dir, tmp_path, capsys):
    """`train.py --resume --out_dir RUN` continues RUN with its own settings: a run made with
    --steps 6 and killed after step 2 resumes to step 6, with the metrics of a run never
    killed, and says nothing. Before, the flags' defaults applied: --steps 300, and the
    default --model, --digits, ... which the checkpoint refused ("would change the run").
    A flag given wins, in one line naming it with the run's own value."""
    straight = tmp_path / "straight"
    assert run_main(quick_run_args(tiny_dir, straight, "--steps", "6"), capsys)[0] == 0
    killed = tmp_path / "killed"
    assert run_main(quick_run_args(tiny_dir, killed, "--steps", "6", "--max_minutes", "1e-9"), capsys)[0] == 0
    assert steps_logged(killed) == [1] and os.path.isdir(ckpt(killed, 1))          # stopped after step 1
    config = json.load(open(killed / "config.json"))
    config["max_minutes"] = 0.0                          # as if killed: the run's own settings, no time limit
    (killed / "config.json").write_text(json.dumps(config))
    code, err = run_main(["--resume", "--out_dir", str(killed)], capsys)
    assert (code, err) == (0, [])
    drop = lambda rows: [{k: v for k, v in m.items() if not k.startswith("time/")} for m in rows]
    read = lambda out: [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert steps_logged(killed) == [1, 2, 3, 4, 5, 6] and drop(read(killed)) == drop(read(straight))
    train.main(["--resume", "--out_dir", str(killed), "--steps", "7", "--save_every", "1"])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train.py: --resume")]
    assert said == [f"train.py: --resume: {killed}/config.json gives the run's settings, and the flags change "
                    "--steps 7 (the run's: 6), --save_every 1 (the run's: 2)"], said
    assert steps_logged(killed) == list(range(1, 8))


# A train.py killed with SIGKILL right after its last checkpoint, before RUN/final is written.
KILLED_BEFORE_FINAL = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import train
train.keep_final = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
train.main(sys.argv[1:])
"""


def tree_bytes(directory) -> dict:
    """{relative path: bytes} of every file below `directory`."""
    return {os.path.relpath(os.path.join(base, name), directory): open(os.path.join(base, name), "rb").read()
            for base, _, names in os.walk(directory) for name in names}


@pytest.mark.slow
def test_a_run_killed_after_its_last_checkpoint_finishes_with_the_bytes_of_one_never_killed(tiny_dir, tmp_path,
                                                                                            capsys):
    """kill -9 after the last step's checkpoint, before RUN/final: before, --resume said
    "nothing to do" and final/ never appeared. Now --resume loads that checkpoint, trains
    no step, and writes final/: every file of final/ and best/ byte for byte the
    uninterrupted run's, and the same metrics."""
    args = ["--steps", "4", "--eval_every", "2"]
    straight = tmp_path / "straight"
    assert run_main(quick_run_args(tiny_dir, straight, *args), capsys)[0] == 0
    killed = tmp_path / "killed"
    out = subprocess.run([sys.executable, "-c", KILLED_BEFORE_FINAL.format(repo=REPO),
                          *quick_run_args(tiny_dir, killed, *args)], cwd=tmp_path, capture_output=True, timeout=600)
    assert out.returncode == -9, out.stderr[-2000:]
    assert os.path.isdir(ckpt(killed, 4)) and not os.path.exists(killed / "final")
    code, err = run_main(quick_run_args(tiny_dir, killed, *args, "--resume"), capsys)
    assert (code, err) == (0, [])
    for name in ("final", "best"):
        assert tree_bytes(killed / name) == tree_bytes(straight / name), name
    drop = lambda out: [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                        for line in open(out / "metrics.jsonl")]
    assert drop(killed) == drop(straight)
    code, err = run_main(quick_run_args(tiny_dir, killed, *args, "--resume"), capsys)
    assert code == 2 and "RUN/final holds its model, so there is nothing to do" in err[0]


def test_a_save_a_kill_stopped_between_its_renames_is_completed_on_resume(tmp_path):
    """save_model moves the old model aside, then the new one (complete: info.json written
    last) into place; a kill between the two left neither under the name."""
    best = tmp_path / "best"
    (tmp_path / "best.old").mkdir()
    (tmp_path / "best.old" / "info.json").write_text('{"step": 2}')
    (tmp_path / "best.tmp").mkdir()
    (tmp_path / "best.tmp" / "info.json").write_text('{"step": 4}')
    assert checkpoint.finish_interrupted_save(str(best)) == "best/ completed from best.tmp"
    assert checkpoint.model_info(str(best)) == {"step": 4} and sorted(os.listdir(tmp_path)) == ["best"]
    assert checkpoint.finish_interrupted_save(str(best)) is None                      # nothing to do
    os.rename(best, tmp_path / "best.old")
    (tmp_path / "best.tmp").mkdir()                     # cut short while written: no info.json
    assert checkpoint.finish_interrupted_save(str(best)) == "best/ restored from best.old"
    assert checkpoint.model_info(str(best)) == {"step": 4}


@pytest.mark.slow
def test_a_missing_best_is_written_from_the_checkpoint_that_holds_its_model(tiny_dir, tmp_path, capsys):
    """RUN/best missing at --resume: written from the checkpoint loaded when metrics.jsonl
    names its step as the best (here the last evaluation is made the best by hand, so
    best/ then holds final/'s weights); else one line says its model is in no checkpoint."""
    args = ["--steps", "4", "--eval_every", "2"]
    out = tmp_path / "run"
    assert run_main(quick_run_args(tiny_dir, out, *args), capsys)[0] == 0
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    for m in lines:
        if m["step"] == 4:
            m["eval/pass@1"] = 1.0                      # the best, at the checkpoint's step
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    for name in ("best", "final"):
        __import__("shutil").rmtree(out / name)
    assert run_main(quick_run_args(tiny_dir, out, *args, "--resume"), capsys) == (0, [])
    assert checkpoint.model_info(str(out / "best")) == {"step": 4, "eval/pass@1": 1.0}
    assert tree_bytes(out / "best")["model.safetensors"] == tree_bytes(out / "final")["model.safetensors"]
    for m in lines:
        if m["step"] == 4:
            m["eval/pass@1"] = -1.0                     # the best is now the start's: in no checkpoint
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    for name in ("best", "final"):
        __import__("shutil").rmtree(out / name)
    code, err = run_main(quick_run_args(tiny_dir, out, *args, "--resume"), capsys)
    assert code == 0 and len(err) == 1 and "best is missing, and its model (step 0" in err[0], err
    assert not os.path.exists(out / "best") and checkpoint.model_info(str(out / "final")) == {"step": 4}


def test_resume_with_nothing_left_to_do_says_so(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4"), capsys)[0] == 0
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume"), capsys)
    assert code == 2 and len(err) == 1 and "nothing to do" in err[0]
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2", "--resume"), capsys)
    assert code == 2 and "already at step 4" in err[0]


def test_resume_without_a_checkpoint_says_so_then_starts(tiny_dir, tmp_path, capsys):
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2", "--resume"), capsys)
    assert code == 0 and err == [f"train.py: warning: --resume: no checkpoint in {str(tmp_path)!r}; starting from step 0"]
    assert steps_logged(tmp_path) == [1, 2]


# --- damaged checkpoints -----------------------------------------------------------------

def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage", ["state.pt", "model.safetensors", "latest empty", "latest missing dir"])
@pytest.mark.slow
def test_damaged_latest_checkpoint_falls_back_to_the_intact_one(tiny_dir, tmp_path, capsys, damage):
    reference = tmp_path / "reference"
    assert run_main(quick_run_args(tiny_dir, reference, "--steps", "6"), capsys)[0] == 0
    out = tmp_path / "run"
    assert run_main(quick_run_args(tiny_dir, out, "--steps", "4"), capsys)[0] == 0      # step_2 and step_4
    if damage == "state.pt":
        truncate(os.path.join(ckpt(out, 4), "state.pt"))
    elif damage == "model.safetensors":
        truncate(os.path.join(ckpt(out, 4), "model", "model.safetensors"))
    elif damage == "latest empty":
        open(out / "checkpoints" / "latest", "w").close()
    else:
        (out / "checkpoints" / "latest").write_text("step_000099")
    code, err = run_main(quick_run_args(tiny_dir, out, "--steps", "6", "--resume"), capsys)
    assert code == 0 and len(err) == 1 and err[0].startswith("train.py: warning:"), err
    if damage in ("state.pt", "model.safetensors"):
        assert "step_000004" in err[0] and "resuming from step_000002" in err[0]
        assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    else:
        assert "latest" in err[0]
    # the fallback continues exactly: the same metrics as an undisturbed 6-step run
    got = [json.loads(l) for l in open(out / "metrics.jsonl")]
    want = [json.loads(l) for l in open(reference / "metrics.jsonl")]
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert strip(got) == strip(want)


def test_no_intact_checkpoint_is_one_line(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4"), capsys)[0] == 0
    for step in (2, 4):
        truncate(os.path.join(ckpt(tmp_path, step), "state.pt"))
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "6", "--resume"), capsys)
    assert code == 2 and len(err) == 1 and "no usable checkpoint" in err[0]


def test_manifest_catches_a_flipped_byte_of_the_same_size(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    path = ckpt(tmp_path, 2)
    assert checkpoint.check_checkpoint(path) is None
    weights = os.path.join(path, "model", "model.safetensors")
    data = bytearray(open(weights, "rb").read())
    data[-1] ^= 0xFF
    open(weights, "wb").write(bytes(data))
    assert checkpoint.check_checkpoint(path) == os.path.join("model", "model.safetensors") + \
        " does not match its checksum"


# --- a torn metrics line -----------------------------------------------------------------

def test_torn_last_metrics_line_is_dropped_on_resume(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward": 0.2')                       # a full disk cut step 3's line
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "3", "--resume"), capsys)
    assert code == 0 and len(err) == 1 and "dropped a torn last line" in err[0]
    assert steps_logged(tmp_path) == [1, 2, 3]


def test_torn_line_in_the_middle_is_an_error_naming_file_and_line(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    lines = open(tmp_path / "metrics.jsonl").read().splitlines()
    open(tmp_path / "metrics.jsonl", "w").write(lines[0][:20] + "\n" + lines[1] + "\n")
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "3", "--resume"), capsys)
    assert code == 2 and len(err) == 1 and f"{tmp_path / 'metrics.jsonl'}:1:" in err[0]


# --- the state file cannot run code ------------------------------------------------------

class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_state_is_loaded_with_weights_only(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2"), capsys)[0] == 0
    state = os.path.join(ckpt(tmp_path, 2), "state.pt")
    ck = torch.load(state, weights_only=True)                         # what we write loads so
    assert isinstance(ck["py_rng"], list) and isinstance(ck["numpy_rng"]["key"], torch.Tensor)
    # A state.pt that needs pickle's full power is refused, not executed (the manifest is
    # rewritten to match, as someone handing over a crafted run directory would).
    ck["extra"] = Boom()
    torch.save(ck, state)
    os.remove(os.path.join(ckpt(tmp_path, 2), checkpoint.MANIFEST))
    checkpoint.write_manifest(ckpt(tmp_path, 2), 2)
    assert checkpoint.check_checkpoint(ckpt(tmp_path, 2)) is None
    run = train.setup(train.parse_args(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume")))
    with pytest.raises(ValueError, match="cannot be loaded: UnpicklingError"):
        checkpoint.load_checkpoint(ckpt(tmp_path, 2), run.model, run.optimizer, run.scheduler, run.py_rng,
                                   run.mb_generator)


# --- one writer per run directory ----------------------------------------------------------

def start_train(argv):
    return subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *argv], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_lines(path, n, proc, limit=240):
    """Wait until metrics.jsonl at `path` has >= n lines (the first writer is mid-run)."""
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
            return
        time.sleep(0.2)
    pytest.fail(f"the first run did not reach {n} logged steps")


@pytest.mark.parametrize("second", [["--seed", "7", "--overwrite"], ["--resume", "--steps", "3000"]])
@pytest.mark.slow
def test_a_second_writer_is_refused_naming_the_first_and_each_step_is_logged_once(tiny_dir, tmp_path, second,
                                                                                   capsys):
    """Before: both wrote the same metrics.jsonl (steps twice, out of order), the checkpoint kept
    the last writer's config, and both exited 0. The second writer is train.main in this
    process (the lock is between processes all the same; a train.py process would add ~8 s of
    imports while the first run trains on)."""
    first = start_train(quick_run_args(tiny_dir, tmp_path, "--steps", "2000"))     # still running when the second comes
    try:
        wait_for_lines(tmp_path / "metrics.jsonl", 2, first)
        with pytest.raises(SystemExit) as second_exit:
            train.main([*quick_run_args(tiny_dir, tmp_path, "--steps", "2000"), *second])
        assert first.poll() is None, "the first run ended too early for this test"
    finally:
        first.kill()
        first.wait()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert second_exit.value.code == 2 and len(lines) == 1, err
    assert f"is in use by another process (PID {first.pid})" in lines[0]
    logged = steps_logged(tmp_path)
    assert logged == list(range(1, len(logged) + 1))        # each step once, in order: one writer
    assert json.load(open(tmp_path / "config.json"))["seed"] == 0


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_is_taken_over(tiny_dir, tmp_path):
    """The kill lands wherever the first run happens to be (a fast machine logs several steps
    between the poll and the kill), so the resume's budget is counted from what was logged."""
    first = start_train(quick_run_args(tiny_dir, tmp_path, "--steps", "2000"))
    wait_for_lines(tmp_path / "metrics.jsonl", 3, first)
    first.kill()
    first.wait()
    assert (tmp_path / "lock").read_text().strip() == str(first.pid)     # the file stays; the lock went with it
    complete = [line for line in open(tmp_path / "metrics.jsonl") if line.endswith("\n")]   # a kill mid-write
    target = json.loads(complete[-1])["step"] + 3                                           # leaves a part-line
    proc = subprocess.run([sys.executable, os.path.join(REPO, "train.py"),
                           *quick_run_args(tiny_dir, tmp_path, "--steps", str(target)), "--resume"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert steps_logged(tmp_path) == list(range(1, target + 1))


# --- metrics never lag the checkpoint ------------------------------------------------------

def test_a_lost_metrics_line_falls_back_to_a_checkpoint_it_covers(tiny_dir, tmp_path, capsys):
    """Line 6 of 6 lost (a crash between the line and its fsync, or a hand edit): the step-6
    checkpoint is not used, the run resumes from step 4 and logs 5 and 6 again. Before, it
    resumed from step 6 and step 6 was never logged."""
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "6"), capsys)[0] == 0
    lines = open(tmp_path / "metrics.jsonl").readlines()
    open(tmp_path / "metrics.jsonl", "w").writelines(lines[:5])
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "8", "--resume"), capsys)
    assert code == 0 and any("step_000006: metrics.jsonl lacks step 6" in line for line in err), err
    assert steps_logged(tmp_path) == list(range(1, 9))


def test_metrics_missing_below_every_checkpoint_is_one_line_naming_the_steps(tiny_dir, tmp_path, capsys):
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "6"), capsys)[0] == 0
    lines = open(tmp_path / "metrics.jsonl").readlines()
    open(tmp_path / "metrics.jsonl", "w").writelines(lines[:2] + lines[3:])        # step 3 gone
    code, err = run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "8", "--resume"), capsys)
    assert code == 2 and len(err) == 1 and "metrics.jsonl lacks step 3" in err[0], err


def test_metrics_are_fsynced_before_the_checkpoint_that_covers_them(tiny_dir, tmp_path, capsys, monkeypatch):
    """The order of fsyncs: metrics.jsonl (holding the step's line) before any file of the step's
    checkpoint. Before, metrics.jsonl was never fsync'ed and a crash could keep a checkpoint
    while losing a line it covers."""
    synced = []                                  # (path, lines in metrics.jsonl at that moment)
    real_fsync = os.fsync

    def fsync(fd):
        metrics = tmp_path / "metrics.jsonl"
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), len(open(metrics).readlines()) if metrics.exists() else 0))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "4"), capsys)[0] == 0
    for step in (2, 4):
        first = next(i for i, (p, _) in enumerate(synced) if f"step_{step:06d}" in p)
        before = [n for p, n in synced[:first] if p.endswith("metrics.jsonl")]
        assert before and before[-1] == step, (step, synced[:first])


# --- a gradient that is inf or NaN stops the run (issue 41) ----------------------------------

@pytest.mark.parametrize("field,flags,step,norm", [
    ("kl_coef", ["--advantage", "nsr", "--kl_coef", "0.1"], 2, "inf"),     # KL's gradient is 0 at step 1
    ("entropy_coef", ["--entropy_coef", "0.01"], 1, "inf"),
    ("lr", ["--advantage", "nsr"], 2, "nan"),                                # inf weights after step 1
])
def test_a_gradient_norm_of_inf_or_nan_stops_the_run_in_one_line_naming_the_flag(field, flags, step, norm, tiny_dir,
                                                                                  tmp_path, capsys, monkeypatch):
    """Before: every later step's update was 0 * inf or NaN, nothing trained, and the run exited 0.
    The values are past the door's ranges, as the Python API (or a bound the door lacks) lets them be."""
    cfg = train.parse_args(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--save_every", "1", *flags))
    setattr(cfg if field == "lr" else cfg.loss, field, 1e30)
    monkeypatch.setattr(train, "parse_args", lambda argv: cfg)
    code, err = run_main([], capsys)
    assert code == 2 and err == [f"train.py: error: step {step}: gradient norm is {norm}; --{field} 1e+30 is the "
                                 "likely cause (nothing of this step was logged or saved)"], err
    if step == 1:                                                           # the bad step is not logged...
        assert not os.path.exists(tmp_path / "metrics.jsonl") and not os.path.exists(tmp_path / "checkpoints")
    else:
        assert steps_logged(tmp_path) == [1] and checkpoint.check_checkpoint(ckpt(tmp_path, 1)) is None
        assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_000001"]      # ... nor saved
    from machinery import checks
    checks.lock_dir(str(tmp_path), "--out_dir").close()                       # the lock was let go


def test_the_likely_cause_is_the_coefficient_farthest_above_its_usual_value(tiny_dir, tmp_path):
    cfg = train.parse_args(quick_run_args(tiny_dir, tmp_path, "--kl_coef", "0.4", "--lr", "0.1", "--advantage", "power",
                                "--alpha", "2"))
    run = train.Run.__new__(train.Run)                                      # only close() reads it
    run.tracker = run.lock = None
    with pytest.raises(train.NotFinite, match=r"^step 7: gradient norm is nan; --lr 0.1 is the likely cause"):
        train.stop_if_not_finite(run, cfg, 7, [1.0, float("nan")])         # 0.1 / 4e-4 = 250x beats 0.4 / 0.04
    cfg.lr = 4e-4
    with pytest.raises(train.NotFinite, match=r"; --kl_coef 0.4 is the likely cause"):
        train.stop_if_not_finite(run, cfg, 7, [float("inf")])
    cfg.loss.kl_coef = 0.0
    with pytest.raises(train.NotFinite, match=r"; no coefficient is above its usual value: lower --lr \(nothing of"):
        train.stop_if_not_finite(run, cfg, 7, [float("inf")])
    train.stop_if_not_finite(run, cfg, 7, [0.0, 3.5])                       # finite: nothing happens


# --- a disk that fills up or refuses a write (issue 41) ---------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """make(bytes) -> a directory on a tmpfs of that size (root only: skipped where mount is not allowed)."""
    mounted = []

    def make(size):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode:
            pytest.skip("a small tmpfs cannot be mounted here (root only)")
        mounted.append(path)
        return path
    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory, leave):
    """Fill directory's file system up to `leave` bytes free (another process's file, as it were)."""
    free = checkpoint.free_bytes(str(directory))
    with open(os.path.join(directory, "filler"), "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_disk_that_fills_during_a_run_loses_nothing_and_a_resume_waits_for_room(tiny_dir, tmp_path, small_disk,
                                                                                  capsys, monkeypatch):
    """--save_every 1 on a disk that fills up: one line at the first save that cannot fit,
    nothing half-written, the previous checkpoint intact; --resume while still full is one
    line before any write; with room again it continues exactly where it was."""
    reference = tmp_path / "reference"
    assert run_main(quick_run_args(tiny_dir, reference, "--steps", "4", "--save_every", "1"), capsys)[0] == 0
    disk = small_disk(8 << 20)
    out = disk / "run"
    real_save = train.save_checkpoint

    def save(run, out_dir, step, config):
        if step == 2:
            fill(disk, leave=200_000)
        return real_save(run, out_dir, step, config)
    monkeypatch.setattr(train, "save_checkpoint", save)
    code, err = run_main(quick_run_args(tiny_dir, out, "--steps", "4", "--save_every", "1"), capsys)
    assert code == 2 and len(err) == 1, err
    root = out / "checkpoints"
    assert re.fullmatch(re.escape(f"train.py: error: step 2: the checkpoint could not be written in {root} "
                                  "(No space left on device: ") + r"1\d\d\.\d kB" + re.escape(
        " free, the checkpoint needs 1.7 MB); nothing is lost: step_000001 is intact, and metrics.jsonl has every "
        "step; free some space, then --resume"), err[0]), err
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step_000001"]            # no step_000002.tmp
    assert checkpoint.check_checkpoint(ckpt(out, 1)) is None and steps_logged(out) == [1, 2]
    monkeypatch.setattr(train, "save_checkpoint", real_save)
    config = (out / "config.json").read_text()
    code, err = run_main(quick_run_args(tiny_dir, out, "--steps", "4", "--save_every", "1", "--resume"), capsys)
    assert code == 2 and len(err) == 1 and f"--out_dir {out}: " in err[0] and "free for the run's files" in err[0], err
    assert (out / "config.json").read_text() == config and steps_logged(out) == [1, 2]
    os.remove(disk / "filler")
    assert run_main(quick_run_args(tiny_dir, out, "--steps", "4", "--save_every", "1", "--resume"), capsys)[0] == 0
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert strip(json.loads(line) for line in open(out / "metrics.jsonl")) == \
        strip(json.loads(line) for line in open(reference / "metrics.jsonl"))


def test_a_write_the_disk_cuts_short_mid_checkpoint_is_one_line_and_leaves_nothing(tiny_dir, tmp_path, small_disk,
                                                                                   capsys, monkeypatch):
    """The space goes while the checkpoint is written (here: the estimate says 0 bytes, and
    1 MB is left): torch.save's error says only "unexpected pos", so the full disk is read
    off the file system; the half-written step_000002.tmp is removed."""
    disk = small_disk(8 << 20)
    out = disk / "run"
    real_save = train.save_checkpoint

    def save(run, out_dir, step, config):
        if step == 2:
            fill(disk, leave=1_000_000)
        return real_save(run, out_dir, step, config)
    monkeypatch.setattr(train, "save_checkpoint", save)
    monkeypatch.setattr(checkpoint, "save_bytes", lambda model, state: 0)
    code, err = run_main(quick_run_args(tiny_dir, out, "--steps", "4", "--save_every", "1"), capsys)
    assert code == 2 and len(err) == 1 and "(No space left on device: " in err[0], err
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step_000001"]


def test_write_errors_of_the_disk_are_one_line_where_no_tmpfs_can_be_mounted(tiny_dir, tmp_path, capsys, monkeypatch):
    """The same contract without root: ENOSPC from torch.save (simulated) and from metrics.jsonl
    (written to /dev/full, which answers every write with ENOSPC)."""
    import errno
    from machinery import checks, metrics
    assert run_main(quick_run_args(tiny_dir, tmp_path, "--steps", "2", "--save_every", "1"), capsys)[0] == 0
    run = train.setup(train.parse_args(quick_run_args(tiny_dir, tmp_path, "--steps", "4", "--resume")))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(checks.UsageError, match=r"^step 3: the checkpoint could not be written in .* \(No space left on "
                                              r"device\); nothing is lost: step_000002 is intact"):
        train.save_checkpoint(run, str(tmp_path), 3, {})
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_000001", "step_000002"]
    run.lock.close()
    os.symlink("/dev/full", tmp_path / "full")
    os.makedirs(tmp_path / "elsewhere")
    os.symlink("/dev/full", tmp_path / "elsewhere" / "metrics.jsonl")
    with pytest.raises(checks.UsageError, match=r"metrics.jsonl could not be written \(No space left on device\); the "
                                              r"run stopped at step 3, and its checkpoints are intact"):
        metrics.log_metrics(str(tmp_path / "elsewhere"), None, {"step": 3, "reward": 0.5, "entropy": 1.0}, None)
