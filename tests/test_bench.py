"""experiments/bench.py's checks at the door (the benchmark itself is a script that prints
numbers, not a test: docs/results.md has them)."""

import sys

import pytest

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
