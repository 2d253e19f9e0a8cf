"""bench/ (python -m bench)'s checks at the door and its counting (the benchmark itself is a
script that prints numbers, not a test: docs/results.md has them)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from bench import __main__ as bench, ours as bench_ours, smollm2 as bench_smollm2, trl_trainer as bench_trl
from machinery import warmups


def test_missing_trl_is_one_line_before_the_warm_up(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)                 # `import trl` raises ImportError
    monkeypatch.setattr(warmups, "load_or_warmup", lambda *a, **k: pytest.fail("warm-up before the TRL check"))
    with pytest.raises(SystemExit) as e:
        bench.main([])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "TRL is not installed" in err


@pytest.mark.parametrize("argv, needle", [(["--steps", "0"], "--steps must be >= 1"),
                                          (["--micro_batch", "7"], "--micro_batch must divide 256"),
                                          (["--data", "gsm8k"], "invalid choice")])
def test_bad_flags_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_prefix_tree_size_counts_repeated_prefixes_within_a_group_only():
    ids = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 0, 0], [5, 9, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float)
    rollouts = SimpleNamespace(G=2, response_ids=ids, response_mask=mask)
    # group 0 shares "5 6" (4 nodes for 6 tokens); group 1 shares "5" (2 nodes for 3 tokens),
    # and its "5" is not group 0's "5": a prefix is shared within a group only
    assert bench_ours.prefix_tree_size(rollouts, torch.arange(4)) == (6, 9)
    assert bench_ours.prefix_tree_size(rollouts, torch.tensor([0, 2])) == (4, 4)
    assert bench_ours.prefix_tree_size(rollouts, torch.tensor([1])) == (3, 3)


def test_real_model_refuses_the_embedded_models_options_and_checks_its_own_batch(capsys):
    for argv, needle in [(["--model", "smollm2-135m-instruct", "--profile", "--data", "countdown"],
                          "--data, --profile: the embedded model's options"),
                         (["--model", "smollm2-135m-instruct", "--micro_batch", "48"], "--micro_batch must divide 64"),
                         (["--lm_head"], "--lm_head times TRL's fused LM head on the real model"),
                         (["--model", "smollm2-135m-instruct", "--lm_head", "--skip_trl"], "it needs"),
                         (["--model", "smollm2-135m-instruct", "--one", "fast"], "--one must be one of ours,")]:
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and needle in err


def test_work_flags_are_train_pys_flags():
    import train
    tiny = train.parse_args(bench.Work().flags())
    assert (tiny.model, tiny.data, tiny.digits, tiny.prompts_per_step, tiny.group_size, tiny.sampling.max_new_tokens,
            tiny.sampling.temperature, tiny.lr, tiny.sampling.chat_template) == ("tiny", "addition", 3, 32, 8, 48, 1.0, 4e-4,
                                                                                 False)
    real = train.parse_args(bench_smollm2.SMOLLM2.flags())
    assert (real.model, real.data, real.digits, real.prompts_per_step, real.group_size, real.sampling.max_new_tokens,
            real.sampling.temperature, real.sampling.chat_template) == ("smollm2-135m-instruct", "addition_instruct", 2, 8,
                                                                        8, 16, 0.7, True)
    assert "--digits" not in bench.Work(data="countdown").flags()


class _Counter:
    def twice(self, n):                  # calls itself: a nested call of the same name counts once
        return n if n == 0 else self.twice(n - 1)


def test_stage_clock_times_each_outer_call_once_and_restores_everything():
    import types
    module = types.SimpleNamespace(f=lambda x: x + 1)
    obj = _Counter()
    gate = [False]
    with bench_trl.stage_clock([(module, "f", "f"), (_Counter, "twice", "twice"),
                            (obj, "twice", "gated", lambda: gate[0])]) as events:
        assert module.f(1) == 2 and obj.twice(3) == 0
        gate[0] = True
        obj.twice(2)
    # f once; the gated instance wrapper skipped its first call, timed its second; inside each,
    # the class's wrapper timed the outer call of `twice` and not its recursion
    assert sorted(name for _, _, name in events) == ["f", "gated", "twice", "twice"]
    assert all(seconds >= 0 for _, seconds, _ in events)
    assert module.f(1) == 2 and "twice" not in vars(obj) and _Counter.twice.__name__ == "twice"
    t = [start for start, _, _ in events]
    assert bench_trl.events_between(events, min(t), max(t) + 1) == {
        name: sum(s for _, s, n in events if n == name) for name in ("f", "gated", "twice")}
    assert bench_trl.events_between(events, max(t) + 1, max(t) + 2) == {}
