"""Shared test set-up: one torch thread.

Every tensor in the suite is tiny; with two intra-op threads on a busy 2-core machine,
OpenMP spin-waiting made small ops up to ~70x slower (measured while writing the toy).
"""

import torch

torch.set_num_threads(1)
