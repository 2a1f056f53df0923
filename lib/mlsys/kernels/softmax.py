"""Row-wise softmax over the last dim, fused: one read of x and one write of y.

softmax(x)_j = exp(x_j - max x) / sum_i exp(x_i - max x); subtracting the row max keeps exp from
overflowing and does not change the result. Written as separate eager ops (`naive_softmax`: max,
subtract, exp, sum, divide) an (M, N) input costs, in elements, reads 5MN + 2M and writes 3MN + 2M:

| op       | reads    | writes |
|----------|----------|--------|
| amax     | MN       | M      |
| subtract | MN + M   | MN     |
| exp      | MN       | MN     |
| sum      | MN       | M      |
| divide   | MN + M   | MN     |

The fused kernel keeps a row (or a few short rows) in registers: reads MN, writes MN, so at large
sizes it should run about 4x faster than the naive sequence and near the device's copy bandwidth.
Backward: dx = y * (dy - sum_j dy_j y_j), a second kernel reading y and dy, writing dx.
The cost models (`softmax_bytes`, `softmax_flops`, ...) take a shape and delegate to
`mlsys.accounting.bytes` and `mlsys.accounting.flops`, where the counts are defined.
References: Triton tutorial 02 (fused softmax),
https://triton-lang.org/main/getting-started/tutorials/ ; Milakov & Gimelshein, "Online
normalizer calculation for softmax" (2018). Used in: §sec-bytes.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import (
    check_input,
    check_tensor,
    require_triton,
    rows_cols,
    tl,
    triton,
)
from mlsys.kernels.row_tiles import row_autotune

MAX_COLS = 16384
"""Longest row the single-pass kernels hold in registers without spilling, on sm_80 and sm_90 (the
compile report): the forward keeps a clean tile up to 32,768 columns, the backward (y and dy held
at once) up to 16,384; at 65,536 even the forward's only tile, 32 warps of 64 values a thread
against a cap of 64 registers, spills."""


def softmax_ref(x: Float[Tensor, "... n"]) -> Float[Tensor, "... n"]:
    """Reference: `torch.softmax(x, dim=-1)` in x's dtype (`x.double()`: the float64 oracle)."""
    return torch.softmax(check_tensor(x, "x"), dim=-1)


def naive_softmax(x: Float[Tensor, "... n"]) -> Float[Tensor, "... n"]:
    """Softmax as five separate eager ops, each a round trip through memory (the module table)."""
    check_tensor(x, "x")
    row_max = x.amax(dim=-1, keepdim=True)  # read MN, write M
    z = x - row_max  # read MN + M, write MN
    num = torch.exp(z)  # read MN, write MN
    den = num.sum(dim=-1, keepdim=True)  # read MN, write M
    return num / den  # read MN + M, write MN


def softmax_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Fused forward traffic, read x + write y = 2MN elements: `bytes.softmax_traffic`."""
    return bytes_moved.softmax_traffic(*rows_cols(shape), dtype).total_bytes


def naive_softmax_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Traffic of `naive_softmax`, 8MN + 4M elements: `bytes.naive_softmax_traffic`."""
    return bytes_moved.naive_softmax_traffic(*rows_cols(shape), dtype).total_bytes


def softmax_backward_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Fused backward traffic, read y, dy + write dx = 3MN: `bytes.softmax_backward_traffic`."""
    return bytes_moved.softmax_backward_traffic(*rows_cols(shape), dtype).total_bytes


def softmax_flops(shape: tuple[int, ...]) -> int:
    """Forward FLOPs, 5 per element (max, subtract, exp, add, divide): `flops.softmax_flops`."""
    return flops.softmax_flops(*rows_cols(shape))


def softmax_backward_flops(shape: tuple[int, ...]) -> int:
    """Backward FLOPs, 4 per element (dy*y, add, subtract, times y): delegates to
    `flops.softmax_backward_flops`."""
    return flops.softmax_backward_flops(*rows_cols(shape))


@row_autotune("softmax.fwd")
@triton.jit
def _softmax_fwd_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_xm, stride_ym, BLOCK_N: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    # one program per BLOCK_M rows; BLOCK_N >= n_cols covers a whole row
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    # rows past the end re-read the last row (no -inf - -inf = nan) and are never stored
    safe_rows = tl.minimum(rows, n_rows - 1).to(tl.int64)
    # load: the only read of x; padding columns get -inf so they add exp(-inf) = 0
    x_ptrs = x_ptr + safe_rows[:, None] * stride_xm + cols[None, :]
    x = tl.load(x_ptrs, mask=col_ok[None, :], other=-float("inf")).to(tl.float32)
    # compute in fp32: subtract the row max, exponentiate, normalize by the row sum
    num = tl.exp(x - tl.max(x, axis=1)[:, None])
    y = num * (1.0 / tl.sum(num, axis=1))[:, None]
    # store: the only write, in the output's dtype
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@row_autotune("softmax.bwd")
@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, stride_ym, stride_dym, stride_dxm,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    # load y and dy (padding = 0 contributes nothing to the row sum)
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    dy_ptrs = dy_ptr + rows[:, None] * stride_dym + cols[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    # dx = y * (dy - <dy, y>) per row
    dot = tl.sum(dy * y, axis=1)
    dx = y * (dy - dot[:, None])
    dx_ptrs = dx_ptr + rows[:, None] * stride_dxm + cols[None, :]
    tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _check(x: Tensor) -> None:
    require_triton("softmax")
    check_input(x, "x")
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"x has rows of {x.shape[-1]} elements; this single-pass kernel holds "
                         f"at most {MAX_COLS} without spilling registers: use softmax_ref")


def _forward_args(x2: Tensor, y2: Tensor) -> tuple:
    """The forward kernel's arguments for (rows, cols) matrices x2 and y2: BLOCK_N covers a row."""
    n_rows, n_cols = x2.shape
    return x2, y2, n_rows, n_cols, x2.stride(0), y2.stride(0), triton.next_power_of_2(n_cols)


def _backward_args(y2: Tensor, dy2: Tensor, dx2: Tensor) -> tuple:
    n_rows, n_cols = y2.shape
    return (y2, dy2, dx2, n_rows, n_cols, y2.stride(0), dy2.stride(0), dx2.stride(0),
            triton.next_power_of_2(n_cols))


def _softmax_forward(x: Tensor) -> Tensor:
    """Launch the forward kernel on a checked, contiguous x: one program per BLOCK_M rows."""
    x2 = x.view(-1, x.shape[-1])
    y2 = torch.empty_like(x2)
    grid = lambda meta: (triton.cdiv(x2.shape[0], meta["BLOCK_M"]),)
    _softmax_fwd_kernel[grid](*_forward_args(x2, y2))
    return y2.view(x.shape)


def _softmax_backward(y: Tensor, dy: Tensor) -> Tensor:
    y2, dy2 = y.view(-1, y.shape[-1]), dy.reshape(-1, y.shape[-1])
    dx2 = torch.empty_like(y2)
    grid = lambda meta: (triton.cdiv(y2.shape[0], meta["BLOCK_M"]),)
    _softmax_bwd_kernel[grid](*_backward_args(y2, dy2, dx2))
    return dx2.view(y.shape)


AOT_KERNELS = {"fwd": "_softmax_fwd_kernel", "bwd": "_softmax_bwd_kernel"}
"""The kernels compiled ahead of time (`mlsys.kernels.aot`), by name: the module's attribute."""


def aot_args(kernel: str, dtype: torch.dtype, *, n_rows: int, n_cols: int) -> tuple[tuple, dict]:
    """(arguments, constexprs) of `kernel` ("fwd", "bwd") for an (n_rows, n_cols) input, as the
    launcher passes them, on stand-in CPU tensors (only their dtype and alignment are read)."""
    x2 = torch.empty(n_rows, n_cols, dtype=dtype)
    if kernel == "fwd":
        return _forward_args(x2, torch.empty_like(x2)), {}
    return _backward_args(x2, torch.empty_like(x2), torch.empty_like(x2)), {}


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = _softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        # upstream gradients may be broadcast views (stride 0) or another dtype: make them match y
        return _softmax_backward(y, dy.to(y.dtype).contiguous())


def softmax(x: Float[Tensor, "... n"]) -> Float[Tensor, "... n"]:
    """Softmax over the last dim with the fused Triton kernels (forward and backward).

    x: contiguous fp16/bf16/fp32 on CUDA (or CPU under the interpreter), rows of at most MAX_COLS.
    Output in x's dtype; fp32 arithmetic inside. Cost: `softmax_bytes`, `softmax_flops`.
    """
    _check(x)
    return _Softmax.apply(x)
