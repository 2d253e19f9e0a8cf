"""Shared test set-up: one torch thread, the untrained tiny model, a tiny model fitted to
1-digit addition, and a way to change torch's default device.

Every tensor in the suite is tiny; with two intra-op threads on a busy 2-core machine,
OpenMP spin-waiting made small ops up to ~70x slower (measured while writing the toy).
"""

import contextlib

import pytest
import torch

from machinery import tinymodel, warmups
from tasks.addition import make_addition_rows

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


@pytest.fixture(scope="module")
def addition_tiny_model():
    """(model, tokenizer): a d=32, 2-layer model after 30 supervised AdamW steps (lr 2e-2,
    batches of 32) on 1-digit addition, in eval mode (~1 s). Fitted enough to emit EOS at
    varied positions, which the sampler's tests need; one per test module."""
    tok = tinymodel.build_char_tokenizer()
    m = tinymodel.build_tiny_model(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    rows = make_addition_rows(256, digits=1, seed=0)
    inputs, labels = warmups._encode_rows(tok, rows)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-2)
    gen = torch.Generator().manual_seed(0)
    m.train()
    for _ in range(30):
        idx = torch.randint(len(rows), (32,), generator=gen)
        loss = warmups._response_loss(m, inputs[idx], labels[idx], tok.pad_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval(), tok
