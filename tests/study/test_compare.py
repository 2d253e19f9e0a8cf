"""experiments/compare.py and compare_page.py: its statistics are the study's (identical p, effect and
SE on a committed sweep's pairs), its words on hand-made pairs, a bad arm refused before any run
(no directory made), and the command end to end on a tiny untrained model (3 seeds x 2 arms x 3
steps, a --data file and a --reward function shared): the page's numbers equal a recomputation
from the metrics files, the plot, and the resume (finished runs untouched, a killed one
continued exactly; other flags or another config in a run directory refused)."""

import json
import math
import os
import shutil

import numpy as np
import pytest

from experiments import compare, compare_page, designs_fade, exact_tests, pages
from tools.plot_runs import series_from_rows

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED = os.path.join(REPO, "experiments", "results", "sweep_addition_advantages.jsonl.gz")


def pairs_of(runs, arm, reference, metric):
    """compare_page's inputs from a sweep's runs: (a, b, cpus), a the reference, b the arm."""
    side = {"a": [r for r in runs if r.arm == reference], "b": [r for r in runs if r.arm == arm]}
    values = {k: {r.key: metric.fn(series_from_rows(r.rows)) for r in rs} for k, rs in side.items()}
    cpus = {(k, r.key): pages.cpu_model(r.record) for k, rs in side.items() for r in rs}
    return values["a"], values["b"], cpus


# ---------------------------------------------------------------------------------------
# The statistics: the study's, on the study's data
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def advantages_sweep():
    """The committed advantages sweep on addition (60 runs, 10 pairs per arm) and the study's verdicts on it."""
    runs = pages.read_run_data(COMMITTED)
    sweep = designs_fade.advantages("addition")
    verdicts, _, values, _ = pages.judge_runs(sweep, runs)
    return runs, verdicts, values


def test_statistics_are_the_studys_on_a_committed_sweeps_pairs(advantages_sweep):
    """The three findings of the committed sweep page (asym, psr, nsr vs mean on entropy over the
    last 10 steps), recomputed by compare from the same runs: the same per-run numbers, and
    n, effect, SE and p identical to the study's (==, not approx: the same code on the same
    numbers); the 80%-power effect the study's at a family of one."""
    runs, verdicts, values = advantages_sweep
    metric = compare_page.parse_metric("entropy_last10")
    assert len(verdicts) == 3
    for study in verdicts:
        arm = study["claim"].arm
        a, b, cpus = pairs_of(runs, arm, "mean", metric)
        assert a == values["entropy, last 10 steps", "mean"] and b == values["entropy, last 10 steps", arm]
        ours = compare_page.judge_pairs(a, b, compare_page.Question(metric), cpus)["difference"]
        assert (ours["n"], ours["effect"], ours["se"], ours["p"], ours["floor"]) == \
            (study["n"], study["effect"], study["se"], study["p"], study["floor"]), arm
        assert ours["n"] == 10 and ours["verdict"] == study["verdict"] == "no difference detected"
        d = np.array([b[k] - a[k] for k in sorted(a)])
        assert ours["power80"] == exact_tests.power_ratio(10, 0.05) * float(np.std(d, ddof=1))
    # the page's own numbers, as committed: psr vs mean, -0.00239 ± 0.00176, p 0.2070
    psr = next(v for v in verdicts if v["claim"].arm == "psr")
    assert pages.fmt(psr["effect"]) == "-0.00239" and f"{psr['p']:.4f}" == "0.2070"


def test_one_sided_and_equivalence_are_the_exact_tests_on_those_pairs(advantages_sweep):
    """A declared direction gives the one-sided sign-flip p (against b > a, or a > b), --margin
    TOST's, each exactly the exact_tests function's on the pairs' differences."""
    runs, _, _ = advantages_sweep
    metric = compare_page.parse_metric("entropy_last10")
    a, b, cpus = pairs_of(runs, "nsr", "mean", metric)
    d = np.array([b[k] - a[k] for k in sorted(a)])
    up = compare_page.judge_pairs(a, b, compare_page.Question(metric, "b>a", 0.004), cpus)
    down = compare_page.judge_pairs(a, b, compare_page.Question(metric, "a>b"), cpus)["difference"]
    assert up["difference"]["p"] == exact_tests.sign_flip_p_greater(d) and up["difference"]["floor"] == 1 / 1024
    assert down["p"] == exact_tests.sign_flip_p_greater(-d)
    assert up["equivalence"]["p"] == exact_tests.tost_p(d, 0.004) and up["equivalence"]["n"] == 10
    assert down["verdict"] == "no difference detected" and "other sign" in down["detail"]


def test_the_verdict_in_words_on_hand_made_pairs():
    """Six pairs all one way reach the two-sided floor 2/64 (agrees: b higher; opposite: b
    lower); five cannot (no verdict possible, the floor said); a declared direction says
    "as declared"; a margin wider than the spread is equivalence."""
    metric = compare_page.parse_metric("final_pass@1")
    a = {(0, s): 0.8 for s in range(6)}
    up = {(0, s): 0.8 + 0.01 * (s + 1) for s in range(6)}
    down = {(0, s): 0.8 - 0.01 * (s + 1) for s in range(6)}
    rec = compare_page.judge_pairs(a, up, compare_page.Question(metric))["difference"]
    assert rec["p"] == 2 / 64 and rec["verdict"] == "agrees"
    assert compare_page.reading(rec, compare_page.Question(metric)).startswith("**agrees**: b is higher than a (")
    rec = compare_page.judge_pairs(a, down, compare_page.Question(metric))["difference"]
    assert rec["verdict"] == "opposite" and "b is lower than a" in compare_page.reading(rec, compare_page.Question(metric))
    q = compare_page.Question(metric, "a>b")
    rec = compare_page.judge_pairs(a, down, q)["difference"]
    assert rec["p"] == 1 / 64 and compare_page.reading(rec, q).startswith("**agrees**: b is lower than a, as declared")
    five = {k: v for k, v in up.items() if k[1] < 5}
    rec = compare_page.judge_pairs(a, five, compare_page.Question(metric))["difference"]
    assert rec["p"] == rec["floor"] == 2 / 32
    assert compare_page.reading(rec, compare_page.Question(metric)).startswith(
        "**no verdict possible**: with 5 pairs the smallest p this test can give is 0.0625, not below 0.05 "
        "(it needs 6 pairs)")
    q = compare_page.Question(metric, margin=0.1)
    rec = compare_page.judge_pairs(a, up, q)["equivalence"]
    assert rec["p"] == 1 / 64 and compare_page.reading(rec, q).startswith("**agrees**: b - a is within ±0.1")
    assert compare_page.fewest_pairs("two") == 6 and compare_page.fewest_pairs("one") == 5


def test_seeds_and_metrics_parse_or_say_what_is_accepted():
    assert compare.parse_seeds("0-5") == [0, 1, 2, 3, 4, 5] and compare.parse_seeds("0-2,7") == [0, 1, 2, 7]
    for bad in ("5-2", "a", "1,1", "-1", ""):
        with pytest.raises(ValueError):
            compare.parse_seeds(bad)
    m = compare_page.parse_metric("mean/grad_norm")
    assert (m.key, m.kind) == ("grad_norm", "mean")
    series = {"eval/pass@1": (np.array([10, 20, 30]), np.array([0.5, 0.7, 0.6]))}
    assert compare_page.parse_metric("final_pass@1").fn(series) == 0.6
    assert compare_page.parse_metric("mean_pass@1").fn(series) == pytest.approx(0.6)
    assert math.isnan(compare_page.parse_metric("final/entropy").fn(series))
    with pytest.raises(ValueError, match="final/KEY or mean/KEY"):
        compare_page.parse_metric("best_pass@1")


def hand_made_runs(out, machine_of):
    """Finished run directories without training: seed s gives a final pass@1 of 0.8 (a) and
    0.8 + 0.01 (s + 1) (b), each run on machine_of(arm, seed), AVX2 kernels."""
    for arm in ("a", "b"):
        for s in range(6):
            d = out / arm / f"seed_{s}"
            d.mkdir(parents=True)
            x = 0.8 + (0.01 * (s + 1) if arm == "b" else 0.0)
            rows = [{"step": 0, "eval/pass@1": 0.5}, {"step": 1, "entropy": 0.3, "eval/pass@1": 0.6},
                    {"step": 2, "entropy": 0.2, "eval/pass@1": x}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / "done.json").write_text(json.dumps({"seconds": 30.0}))
            (d / "start.json").write_text(json.dumps({"weights_sha256": "5b" * 32, "float_path": "AVX2"}))
            (d / "machines.json").write_text(json.dumps([{"at": "t", "machine": machine_of(arm, s)}]))


def test_a_pair_across_cpus_is_left_out_and_the_page_says_so(tmp_path):
    """b/seed_1 ran on another CPU model: that pair leaves the test (5 pairs: no verdict
    possible, where all 6 would agree) and the page names it; on one CPU, all 6 count."""
    amd, intel = "nproc 2, AMD EPYC, Linux x86_64", "nproc 2, Intel(R) Xeon(R), Linux x86_64"
    meta = {"command": "c", "a": [], "b": ["--lr", "1e-3"], "shared": [], "steps": 2, "invocations": []}
    q = compare_page.Question(compare_page.parse_metric("final_pass@1"))
    hand_made_runs(tmp_path / "mixed", lambda arm, s: intel if (arm, s) == ("b", 1) else amd)
    rec = compare_page.write_page(str(tmp_path / "mixed"), list(range(6)), q, meta)["difference"]
    text = (tmp_path / "mixed" / "compare.md").read_text()
    assert rec["n"] == 5 and rec["p"] == 2 / 32 and "1 pair left out" in rec["detail"]
    assert "pair 1 ran across CPU models or float paths and is left out" in text
    assert "| 1 | 0.8 | 0.82 | 0.02 | AMD EPYC, AVX2 / Intel(R) Xeon(R), AVX2 |" in text
    # the means beside mean(b - a) are over the same 5 pairs (b: 0.838, not the 6 pairs' 0.835)
    assert "pairs: 6; in the test: 5" in text
    assert "| mean ± SE (the pairs in the test) | 0.8 ± 0 | 0.838 ± 0.0086 | 0.038 ± 0.0086 | |" in text
    hand_made_runs(tmp_path / "one", lambda arm, s: amd)
    rec = compare_page.write_page(str(tmp_path / "one"), list(range(6)), q, meta)["difference"]
    assert rec["n"] == 6 and rec["p"] == 2 / 64 and rec["verdict"] == "agrees"
    text = (tmp_path / "one" / "compare.md").read_text()
    assert "both runs of each of the 6 pairs ran on one CPU model and float path" in text
    assert "**agrees**: b is higher than a" in text and (tmp_path / "one" / "compare.png").stat().st_size > 1000


# ---------------------------------------------------------------------------------------
# Checks at the door: a bad arm is refused before any run
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["--a", "--advantage mean", "--b", "--advantage nope"], "arm b (--advantage nope): train.py: error: "),
    (["--a", "--seed 3", "--b", "--advantage rloo"], "--a sets --seed"),
    (["--a", "", "--b", "--steps=9"], "--b sets --steps"),
    (["--a", "", "--b", "--data /nonexistent/x.jsonl"], "arm b (--data /nonexistent/x.jsonl): "),
    (["--a", "--reward no_such_module:score", "--b", ""], "arm a (--reward no_such_module:score): --reward"),
    (["--a", "", "--b", "--eval_every 0"], "arm b (--eval_every 0): --metric final_pass@1 reads eval/pass@1"),
    (["--a", "--lr 1e-3", "--b", "--lr   1e-3"], "--a and --b are the same flags"),
    (["--a", "", "--b", "--lr 1e-3", "--metric", "best"], "--metric 'best'"),
    (["--a", "", "--b", "--lr 1e-3", "--seeds", "3-1"], "--seeds '3-1'"),
    (["--a", "", "--b", "--lr 1e-3", "--", "--out_dir", "x"], "the flags after -- sets --out_dir"),
])
def test_a_bad_arm_is_one_line_exit_2_and_no_directory(argv, needle, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    monkeypatch.setattr(compare, "run", lambda *args, **kwargs: pytest.fail("a run was started"))
    own, shared = (argv[:argv.index("--")], argv[argv.index("--"):]) if "--" in argv else (argv, [])
    with pytest.raises(SystemExit) as e:
        compare.main([*own, "--steps", "2", "--out", str(out), *shared])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("compare.py: error: ") and needle in err[0], err
    assert not out.exists()                                    # nothing made: no run, no directory


# ---------------------------------------------------------------------------------------
# End to end on a tiny untrained model: 3 seeds x 2 arms x 3 steps
# ---------------------------------------------------------------------------------------

LENGTH_REWARD = '''def score(response, answer, prompt):
    """Longer responses score higher, up to 16 characters: a reward an untrained model earns."""
    return min(1.0, len(response) / 16)
'''


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A {prompt, answer} .jsonl of 40 sums (4 held out) and a --reward file."""
    d = tmp_path_factory.mktemp("user")
    rng = np.random.default_rng(0)
    with open(d / "sums.jsonl", "w") as f:
        for x, y in rng.integers(0, 10, (40, 2)):
            f.write(json.dumps({"prompt": f"{x}+{y}=", "answer": str(x + y)}) + "\n")
    (d / "length_reward.py").write_text(LENGTH_REWARD)
    return d


def argv_for(out, tiny_dir, user_files, *own):
    return ["--a", "", "--b", "--temperature 0.5", "--seeds", "0-2", "--steps", "3", "--metric", "mean/entropy",
            "--out", str(out), *own, "--", "--model", tiny_dir, "--prompts_per_step", "4", "--group_size", "4",
            "--max_new_tokens", "16", "--n_eval", "4", "--eval_samples", "2", "--eval_every", "1", "--save_every", "2",
            "--data", str(user_files / "sums.jsonl"), "--reward", f"{user_files / 'length_reward.py'}:score"]


@pytest.fixture(scope="module")
def finished_compare(tmp_path_factory, tiny_dir, user_files):
    out = tmp_path_factory.mktemp("compare") / "cmp"
    compare.main(argv_for(out, tiny_dir, user_files, "--keep_weights"))       # the resume test needs the weights
    return out


def read_steps(d):
    return [r for r in compare_page.read_rows(d) if r["step"] != 0]


@pytest.mark.slow
def test_end_to_end_the_page_and_plot_hold_the_metrics_files_numbers(finished_compare, capsys):
    out = finished_compare
    for arm in ("a", "b"):
        for seed in range(3):
            d = out / arm / f"seed_{seed}"
            assert {"metrics.jsonl", "start.json", "done.json", "sweep_args.json", "machines.json"} <= set(os.listdir(d))
            assert [r["step"] for r in read_steps(d)] == [1, 2, 3]
            assert json.load(open(d / "config.json"))["seed"] == seed
    text = (out / "compare.md").read_text()
    rows = {}
    for seed in range(3):          # mean/entropy: the mean over steps 1-3 of each run's entropy
        a, b = (float(np.mean([r["entropy"] for r in read_steps(out / arm / f"seed_{seed}")])) for arm in ("a", "b"))
        rows[seed] = b - a
        assert f"| {seed} | {pages.fmt(a)} | {pages.fmt(b)} | {pages.fmt(b - a)} |" in text
    d = np.array(list(rows.values()))
    assert all(d < 0)                              # temperature 0.5 samples lower-entropy tokens in every pair
    assert f"{pages.fmt(d.mean())} ± {pages.fmt(d.std(ddof=1) / math.sqrt(3))} |" in text
    assert "**no verdict possible**: with 3 pairs the smallest p this test can give is 0.25" in text
    assert "both runs of each of the 3 pairs ran on one CPU model and float path" in text
    assert "load average (1 min)" in text and "6 runs in" in text
    assert "--data" in text and "--reward" in text and "![curves of both arms per seed](compare.png)" in text
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.load(open(out / "compare.json"))
    assert data["difference"]["p"] == 0.25 and data["difference"]["n"] == 3
    log = (out / "compare.log").read_text()
    assert "pair seed 2 done; 3 pairs finished: b - a = " in log and log.count("pair seed 2 done") == 1
    assert "cost, timed on a/seed_0" in log


@pytest.mark.slow
def test_resume_reuses_finished_runs_and_continues_a_killed_one(finished_compare, tiny_dir, user_files, tmp_path,
                                                                capsys):
    out = tmp_path / "cmp"
    shutil.copytree(finished_compare, out)
    killed = out / "b" / "seed_1"
    before = read_steps(killed)
    # b/seed_1 as if killed after its step-2 checkpoint: no done.json, no step-3 checkpoint, metrics to step 2
    os.remove(killed / "done.json")
    shutil.rmtree(killed / "checkpoints" / "step_000003")
    (killed / "checkpoints" / "latest").write_text("step_000002")
    with open(killed / "metrics.jsonl") as f:
        lines = f.readlines()
    (killed / "metrics.jsonl").write_text("".join(lines[:3]))           # step 0 (the start), 1 and 2
    others = [out / arm / f"seed_{s}" for arm in ("a", "b") for s in range(3) if (arm, s) != ("b", 1)]
    untouched = {d: {f: os.stat(d / f).st_mtime_ns for f in ("metrics.jsonl", "train.log", "done.json")} for d in others}
    capsys.readouterr()
    compare.main(argv_for(out, tiny_dir, user_files))
    printed = capsys.readouterr().out
    assert "runs: 5 finished, 1 resume; finished runs are reused" in printed
    for d, mtimes in untouched.items():
        assert {f: os.stat(d / f).st_mtime_ns for f in mtimes} == mtimes, d
    assert "--resume" in (killed / "train.log").read_text().split("=== sweep.py")[-1].splitlines()[0]
    drop = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert drop(read_steps(killed)) == drop(before)                 # continued exactly (train.py's resume)
    assert len(json.load(open(killed / "machines.json"))) == 2       # started, then resumed: two records
    text = (out / "compare.md").read_text()
    assert "6 runs in" in text and "1 run in" in text                  # each invocation: what it ran, its load


@pytest.mark.slow
def test_a_run_directory_of_other_flags_or_config_is_refused_and_nothing_runs(finished_compare, tiny_dir, user_files,
                                                                              tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(finished_compare, out)
    with pytest.raises(SystemExit) as e:                             # other flags: 4 steps
        compare.main([*argv_for(out, tiny_dir, user_files)[:7], "4", *argv_for(out, tiny_dir, user_files)[8:]])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and "holds a run with other train.py flags" in err[0], err
    config = json.load(open(out / "a" / "seed_0" / "config.json"))
    config["lr"] = 1.0                                               # the same flags, another config (a recipe changed)
    json.dump(config, open(out / "a" / "seed_0" / "config.json", "w"))
    with pytest.raises(SystemExit) as e:
        compare.main(argv_for(out, tiny_dir, user_files))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and "another config (--lr 1.0 -> 0.0004)" in err[0], err
    assert (out / "invocations.jsonl").read_text() == (finished_compare / "invocations.jsonl").read_text()  # ran nothing


@pytest.mark.slow
def test_another_metric_on_finished_runs_reruns_nothing_and_an_unknown_one_is_refused(finished_compare, tiny_dir,
                                                                                       user_files, tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(finished_compare, out)
    argv = argv_for(out, tiny_dir, user_files)
    i = argv.index("mean/entropy")
    with pytest.raises(SystemExit) as e:
        compare.main([*argv[:i], "final/no_such_key", *argv[i + 1:]])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and "no finished run logged 'no_such_key'" in err[0], err
    compare.main([*argv[:i], "final/reward", *argv[i + 1:]])
    printed = capsys.readouterr().out
    assert "every run was finished before: nothing to run" in printed
    rewards = {s: [read_steps(out / arm / f"seed_{s}")[-1]["reward"] for arm in ("a", "b")] for s in range(3)}
    text = (out / "compare.md").read_text()
    assert "*asked after the runs*, which were made to answer mean/entropy, two-sided: a re-reading" in text
    assert "declared before the runs" in (finished_compare / "compare.md").read_text()
    for s, (a, b) in rewards.items():
        assert f"| {s} | {pages.fmt(a)} | {pages.fmt(b)} | {pages.fmt(b - a)} |" in text
