"""Shared test set-up: one torch thread, and a way to change torch's default device.

Every tensor in the suite is tiny; with two intra-op threads on a busy 2-core machine,
OpenMP spin-waiting made small ops up to ~70x slower (measured while writing the toy).
"""

import contextlib

import pytest
import torch

torch.set_num_threads(1)


@contextlib.contextmanager
def _default_device(device):
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None if before == torch.device("cpu") else before)


@pytest.fixture
def default_device():
    """`with default_device("meta"): ...` runs a block with another default device.

    How the suite checks, without a GPU, that code which receives tensors on one device
    makes its own tensors there too: a GPU run keeps its tensors on CUDA while torch's
    default device stays the CPU, so a bare torch.zeros(n) lands elsewhere. Here the
    inputs stay on the CPU and the default becomes "meta": a tensor that does not follow
    its inputs lands on "meta", and then fails to mix or comes back without values.
    """
    return _default_device
