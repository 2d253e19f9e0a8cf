"""Gradient exchangeability: DFPO's weight transforms restore sum_i w~_i A_i = 0 in every
group, and the cancellation residual reads 0, 1 and NaN where it should.

The same functions on a real (tiny) model, through the loss (shared-token gradients, the
residual of micro-batches, every tensor on its inputs' device), are tests/lesson/test_loss.py's.
"""

import math

import torch

import exchangeability as E


def test_dfpo_transform_identities():
    torch.manual_seed(0)
    w = torch.rand(10).double() + 0.5
    a = torch.randn(10).double()
    gi = torch.tensor([0] * 4 + [1] * 6)
    a[:4] -= a[:4].mean()
    a[4:] -= a[4:].mean()
    for mode in ("min", "orth"):
        wt = E.dfpo_transform(w, a, gi, mode)
        for g in (0, 1):
            assert abs((wt[gi == g] * a[gi == g]).sum().item()) < 1e-12
    assert torch.allclose(E.dfpo_transform(w, a, gi, "min")[:4], w[:4].min().expand(4))
    zero = E.dfpo_transform(w, torch.zeros(10).double(), gi, "orth")   # A.A = 0: unchanged
    assert torch.equal(zero, w)


def test_cancellation_residual_values():
    m = torch.tensor([1.0, -1.0, 2.0, 1.0, 0.0, 0.0])
    r = E.cancellation_residual(m, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert r[0].item() == 0.0 and r[1].item() == 1.0 and math.isnan(r[2].item())
