"""What the kernel tests share (tests/kernels/, tests/accounting/test_activations.py): where a
kernel can run, where its inputs live, and a byte tally of what it moves.

`tally_bytes` runs a function under `mlsys.counters.ByteCounter`, which records the bytes every aten
op reads and writes, to check the byte cost models against. `needs_triton` skips a test that
launches a kernel where Triton is not installed (macOS, Windows); the references and cost models are
tested everywhere. `DEVICE` is where kernel inputs live.
"""

import pytest
import torch

from mlsys.counters import ByteCounter, count_bytes
from mlsys.kernels._triton import HAS_TRITON, INTERPRETED

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CAN_LAUNCH = HAS_TRITON and (INTERPRETED or torch.cuda.is_available())
"""Kernels run here: interpreted on the CPU, or compiled for a CUDA GPU that is present."""

needs_triton = pytest.mark.skipif(
    not CAN_LAUNCH,
    reason="Triton is not installed (Linux only): kernels cannot run here" if not HAS_TRITON
    else "Triton compiles for a GPU (TRITON_INTERPRET is off) and there is none",
)

DEVICE = "cuda" if CAN_LAUNCH and not INTERPRETED else "cpu"
"""Where kernel inputs live: a CUDA device when Triton compiles, else the CPU."""


def tally_bytes(fn, *args) -> ByteCounter:
    """Run fn(*args) under a ByteCounter and return it."""
    return count_bytes(fn, *args)
