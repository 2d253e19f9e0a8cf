"""Shared test set-up: one torch thread, the untrained tiny model, and a way to change torch's default device.

Every tensor in the suite is tiny; with two intra-op threads on a busy 2-core machine,
OpenMP spin-waiting made small ops up to ~70x slower (measured while writing the toy).
"""

import contextlib

import pytest
import torch

from machinery import tinymodel

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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """An untrained tiny model directory (the embedded model's architecture and character
    tokenizer, random weights): loads through AutoModelForCausalLM like a hub model, and
    needs no warm-up. One per test module, so no module sees another's changes."""
    d = tmp_path_factory.mktemp("tiny")
    tok = tinymodel.build_char_tokenizer()
    tinymodel.build_tiny_model(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)
