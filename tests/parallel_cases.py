"""What the parallelism tests share besides the library's harness (`mlsys.distributed.harness`:
the tiny model, its data, one process's training and the loop every rank runs): the one setup,
its reference computed once, the tolerances (defined once, per dtype), and error messages
collected on the ranks.

Imported by the test files and by their ranks (the tests directory is on the ranks' path).
"""

import functools

import torch

from mlsys.distributed import harness

SETUP = harness.Setup()
"""The tiny model (`harness.TINY`), a batch of 8 sequences of 8 tokens, 2 AdamW steps at 1e-3."""
TOL = {
    "fp32": {"rtol": 1e-5, "atol": 2e-6},  # reduction order only (sums split over ranks)
    "bf16": {"rtol": 0.05, "atol": 0.03},  # weights and activations rounded to 8 bits
}
"""Tolerances against one fp32 process, by the dtype the parallel run computes in. AdamW's update
~ lr * g / sqrt(g^2) can turn a last-bit difference in a tiny g (another reduction order) into a
difference of a good part of lr: at lr = 1e-2 one weight of this model moves 3.4e-6 apart under
any FSDP (ours and PyTorch's alike); at lr = 1e-3, 10x less. A real bug (a gradient summed
instead of averaged is caught by the gradients; a missing or wrong update) moves weights by ~lr."""


@functools.cache
def reference() -> dict:
    """One process on the whole batch (`harness.one_process(SETUP)`): the loss of every step, the
    first step's gradients and the weights after the last AdamW step, by parameter name."""
    return harness.one_process(SETUP)


def assert_matches(got: dict, want: dict, dtype: str = "fp32", what: str = "") -> None:
    """Every tensor of `want` in `got`, equal within TOL[dtype]."""
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for name, tensor in want.items():
        torch.testing.assert_close(got[name].float(), tensor, **TOL[dtype],
                                   msg=lambda m, n=name: f"{what} {n}: {m}")


def errors(*calls) -> list[str]:
    """Each call's TypeError or ValueError message, in order ("no error" where none was raised):
    for the misuses that need a running group, collected on the ranks."""
    messages = []
    for call in calls:
        try:
            call()
            messages.append("no error")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages
