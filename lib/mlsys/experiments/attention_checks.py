"""Chapter 06's live checks (not recorded experiments): FlashAttention-2, tiled in PyTorch and in
Triton, against the float64 reference attention, forward and backward, on irregular shapes.

- `flash_torch_table`: `FlashAttentionTorch` in float64 and float32, causal and not;
- `flash_triton_table`: `FlashAttentionTriton` in the page's dtypes, beside the tests' tolerance
  (no rows without Triton: the kernels then do not run).
Each row is the largest |error| of O, dQ, dK and dV (`ops.attention.max_error`), asserted within
its bound: a kernel that disagrees stops the page. Used in: §sec-attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from mlsys.book import Table
from mlsys.ops.attention import max_error
from mlsys.ops.flash_attention import FlashAttentionTorch

Shapes = tuple[tuple[int, int, int], ...]  # (n_q, n_k, d_head) of each input
HEADER = ["implementation", "dtype", "causal", "max |error| (O, dQ, dK, dV)"]


def _rows(name: str, fn: Callable, shapes: Shapes, dtype: torch.dtype, bound: float,
          generator: torch.Generator, device: str = "cpu") -> list[list[object]]:
    """[name, dtype, causal, error] without and with the causal mask, each error below `bound`."""
    rows = []
    for causal in (False, True):
        err = max_error(fn, shapes, dtype=dtype, causal=causal, generator=generator, device=device)
        assert err < bound, f"{name} {dtype} causal={causal}: error {err:.2e} >= {bound:.0e}"
        rows.append([name, str(dtype).removeprefix("torch."), causal, f"{err:.1e}"])
    return rows


def flash_torch_table(shapes: Shapes, generator: torch.Generator) -> Table:
    """`FlashAttentionTorch` in float64 (error below 1e-10) and float32 (below 1e-4), causal and
    not, on inputs of `shapes` drawn from `generator`."""
    rows = [row for dt, bound in ((torch.float64, 1e-10), (torch.float32, 1e-4))
            for row in _rows("flash_torch", FlashAttentionTorch.apply, shapes, dt, bound,
                             generator)]
    return Table(HEADER, rows)


def flash_triton_table(shapes: Shapes, dtypes: Iterable[torch.dtype], generator: torch.Generator,
                       device: str) -> Table:
    """The Triton `FlashAttentionTriton` in each of `dtypes` on `device`, causal and not, its error
    below 10x the tests' gradient tolerance (inputs and outputs of order 1), which a last column
    shows. No rows without Triton."""
    from mlsys.kernels import _triton  # Triton (may be absent): only when the check runs

    rows = []
    if _triton.HAS_TRITON:
        from mlsys.kernels.flash_attention import FlashAttentionTriton  # (the same)

        for dt in dtypes:
            tol = _triton.ATTENTION_TOLERANCES[dt]["grad"]  # the tests' tolerance
            rows += [[*row, f"{tol['atol']:.0e} + {tol['rtol']:.0e}·|ref|"]
                     for row in _rows("flash_triton", FlashAttentionTriton.apply, shapes, dt,
                                      10 * (tol["atol"] + tol["rtol"]), generator, device)]
    return Table([*HEADER, "tests' tolerance"], rows)
