"""experiments/bench.py's checks at the door and its counting (the benchmark itself is a
script that prints numbers, not a test: docs/results.md has them)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from experiments import bench
from machinery import tinymodel


def test_missing_trl_is_one_line_before_the_warm_up(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)                 # `import trl` raises ImportError
    monkeypatch.setattr(tinymodel, "load_or_warmup", lambda *a, **k: pytest.fail("warm-up before the TRL check"))
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
    ro = SimpleNamespace(G=2, response_ids=ids, response_mask=mask)
    # group 0 shares "5 6" (4 nodes for 6 tokens); group 1 shares "5" (2 nodes for 3 tokens),
    # and its "5" is not group 0's "5": a prefix is shared within a group only
    assert bench.prefix_tree_size(ro, torch.arange(4)) == (6, 9)
    assert bench.prefix_tree_size(ro, torch.tensor([0, 2])) == (4, 4)
    assert bench.prefix_tree_size(ro, torch.tensor([1])) == (3, 3)
