"""RMSNorm over the last dim, forward and backward, fused: y = x / sqrt(mean(x**2) + eps) * weight.

Forward, per row of N: rstd = 1/sqrt(sum(x**2)/N + eps), y = x * rstd * weight; rstd (fp32, one per
row) is saved for the backward. With xhat = x * rstd and g = dy * weight, the backward is
    dx = rstd * (g - xhat * mean(g * xhat))        (per row)
    dweight = sum over rows of dy * xhat           (per column)
dweight is a reduction across rows: each program sums its rows into its own fp32 partial row, and a
second kernel adds the partial rows; no atomics, so the result is deterministic.

Cost for an (M, N) input of s bytes per element: forward reads x (MN s) and weight (N s), writes y
(MN s) and rstd (4M); backward reads x, dy (2MN s), weight (N s), rstd (4M), writes dx (MN s) and
dweight (N s). Written as eager ops (square, mean, add, rsqrt, two multiplies) the forward makes
about six round trips instead of one. The cost models take a shape and delegate to
`mlsys.accounting.bytes` and `mlsys.accounting.flops`, where the counts are defined.
References: Zhang & Sennrich, "Root Mean Square Layer Normalization" (NeurIPS 2019); Triton
tutorial 05 (layer norm backward), https://triton-lang.org/main/getting-started/tutorials/ .
Used in: §sec-bytes.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import (
    INTERPRETED,
    check_input,
    check_same,
    check_tensor,
    require_triton,
    rows_cols,
    tl,
    triton,
)
from mlsys.kernels.row_tiles import row_autotune

MAX_COLS = 8192
"""Longest row the single-pass kernels hold in registers without spilling, on sm_80 and sm_90 (the
compile report): the forward keeps a clean tile up to 16,384 columns (32,768 in 16-bit), the
backward (x, dy, the weight and its program's share of dweight live at once) up to 8,192."""


def rmsnorm_ref(
    x: Float[Tensor, "... d_model"], weight: Float[Tensor, " d_model"], eps: float = 1e-5
) -> Float[Tensor, "... d_model"]:
    """Reference in x's dtype (pass float64 tensors for the test oracle)."""
    check_tensor(x, "x")
    check_tensor(weight, "weight")
    eps = checks.positive(eps, "eps")
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rmsnorm_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Forward traffic: read x and weight, write y (in dtype) and rstd (fp32, one per row).
    Delegates to `bytes.norm_traffic(..., save_stats=True)`."""
    return bytes_moved.norm_traffic(*rows_cols(shape), dtype, save_stats=True).total_bytes


def rmsnorm_backward_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Backward traffic: read x, dy, weight and rstd; write dx and dweight (the fp32 partial sums
    of dweight excluded). Delegates to `bytes.rmsnorm_backward_traffic`."""
    return bytes_moved.rmsnorm_backward_traffic(*rows_cols(shape), dtype).total_bytes


def rmsnorm_flops(shape: tuple[int, ...]) -> int:
    """Forward FLOPs, 4 per element (square, add, times rstd, times weight) + 3 per row (/N, +eps,
    rsqrt). Delegates to `flops.rmsnorm_flops`."""
    return flops.rmsnorm_flops(*rows_cols(shape))


def rmsnorm_backward_flops(shape: tuple[int, ...]) -> int:
    """Backward FLOPs, 9 per element + 1 per row. Delegates to `flops.rmsnorm_backward_flops`."""
    return flops.rmsnorm_backward_flops(*rows_cols(shape))


@row_autotune("rmsnorm.fwd")
@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps, stride_xm, stride_ym,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    # one program per BLOCK_M rows; BLOCK_N >= n_cols covers a whole row
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    # load x and weight once, in fp32 (padding = 0 adds nothing to the sum of squares)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # compute: the inverse root mean square per row, then scale
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    # store y in the output's dtype and rstd (fp32) for the backward
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@row_autotune("rmsnorm.bwd")
@triton.jit
def _rmsnorm_bwd_kernel(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols,
                        stride_xm, stride_dym, stride_dxm, stride_pm, BLOCK_N: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    # a fixed number of programs, each looping over row tiles pid, pid + P, pid + 2P, ...
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)  # this program's share of dweight
    for tile in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), n_programs):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        # load x, dy (padding = 0: no contribution to either sum) and the saved rstd
        x_ptrs = x_ptr + rows[:, None] * stride_xm + cols[None, :]
        dy_ptrs = dy_ptr + rows[:, None] * stride_dym + cols[None, :]
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        # dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        c = tl.sum(g * xhat, axis=1) / n_cols
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        dx_ptrs = dx_ptr + rows[:, None] * stride_dxm + cols[None, :]
        tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=0)
    # every program writes its partial row (zeros if it had no tile), so no buffer needs clearing
    tl.store(dw_partial_ptr + pid * stride_pm + cols, dw_acc, mask=col_ok)


@triton.jit
def _column_sum_kernel(p_ptr, out_ptr, n_partials, n_cols, stride_pm, BLOCK_P: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # one program per BLOCK_N columns, summing all partial rows in a fixed order (deterministic)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < n_partials)[:, None] & col_ok[None, :]
        p_ptrs = p_ptr + rows[:, None] * stride_pm + cols[None, :]
        acc += tl.sum(tl.load(p_ptrs, mask=mask, other=0.0), axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def _check(x: Tensor, weight: Tensor, eps: float) -> None:
    require_triton("rmsnorm")
    check_input(x, "x")
    check_input(weight, "weight")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected ({x.shape[-1]},), "
                         f"the last dim of x {tuple(x.shape)}")
    check_same(x, "x", weight, "weight")
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"x has rows of {x.shape[-1]} elements; this single-pass kernel holds "
                         f"at most {MAX_COLS} without spilling registers: use rmsnorm_ref")
    checks.positive(eps, "eps")


def _forward_args(x2: Tensor, weight: Tensor, y2: Tensor, rstd: Tensor, eps: float) -> tuple:
    """The forward kernel's arguments for (rows, cols) x2 and y2: BLOCK_N covers a row."""
    n_rows, n_cols = x2.shape
    return (x2, weight, y2, rstd, n_rows, n_cols, float(eps), x2.stride(0), y2.stride(0),
            triton.next_power_of_2(n_cols))


def _backward_args(x2: Tensor, weight: Tensor, rstd: Tensor, dy2: Tensor, dx2: Tensor,
                   partial: Tensor) -> tuple:
    n_rows, n_cols = x2.shape
    return (x2, weight, rstd, dy2, dx2, partial, n_rows, n_cols, x2.stride(0), dy2.stride(0),
            dx2.stride(0), partial.stride(0), triton.next_power_of_2(n_cols))


COLUMN_SUM_TILE = {"BLOCK_P": 32, "BLOCK_N": 128, "num_warps": 4}
"""The fixed tile of `_column_sum_kernel`: 32 partial rows x 128 columns per step, 4 warps."""


def _column_sum_args(partial: Tensor, dweight: Tensor) -> tuple:
    n_programs, n_cols = partial.shape
    return partial, dweight, n_programs, n_cols, partial.stride(0)


def _rmsnorm_forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel; returns y (x's shape and dtype) and rstd (fp32, one per row)."""
    x2 = x.view(-1, x.shape[-1])
    y2 = torch.empty_like(x2)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    grid = lambda meta: (triton.cdiv(x2.shape[0], meta["BLOCK_M"]),)
    _rmsnorm_fwd_kernel[grid](*_forward_args(x2, weight, y2, rstd, eps))
    return y2.view(x.shape), rstd


def _partial_programs(n_rows: int, device: torch.device) -> int:
    """Programs of the backward kernel: 4 per SM on a GPU (each keeps a partial row), else 8."""
    if INTERPRETED or device.type != "cuda":
        return min(n_rows, 8)
    return min(n_rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)


def _rmsnorm_backward(x: Tensor, weight: Tensor, rstd: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    n_cols = x.shape[-1]
    x2, dy2 = x.view(-1, n_cols), dy.view(-1, n_cols)
    dx2 = torch.empty_like(x2)
    n_programs = _partial_programs(x2.shape[0], x.device)
    partial = torch.empty(n_programs, n_cols, dtype=torch.float32, device=x.device)
    _rmsnorm_bwd_kernel[(n_programs,)](*_backward_args(x2, weight, rstd, dy2, dx2, partial))
    dweight = torch.empty_like(weight)
    grid = (triton.cdiv(n_cols, COLUMN_SUM_TILE["BLOCK_N"]),)
    _column_sum_kernel[grid](*_column_sum_args(partial, dweight), **COLUMN_SUM_TILE)
    return dx2.view(x.shape), dweight


AOT_KERNELS = {"fwd": "_rmsnorm_fwd_kernel", "bwd": "_rmsnorm_bwd_kernel",
               "column_sum": "_column_sum_kernel"}
"""The kernels compiled ahead of time (`mlsys.kernels.aot`), by name: the module's attribute."""


def aot_args(kernel: str, dtype: torch.dtype, *, n_rows: int, n_cols: int,
             n_programs: int = 528) -> tuple[tuple, dict]:
    """(arguments, constexprs) of `kernel` ("fwd", "bwd", "column_sum") for an (n_rows, n_cols)
    input, as the launcher passes them, on stand-in CPU tensors (only dtype and alignment are
    read); `n_programs`: the backward's partial rows (4 per SM: 528 on an H100)."""
    x2 = torch.empty(n_rows, n_cols, dtype=dtype)
    weight = torch.empty(n_cols, dtype=dtype)
    rstd = torch.empty(n_rows, dtype=torch.float32)
    partial = torch.empty(n_programs, n_cols, dtype=torch.float32)
    if kernel == "fwd":
        return _forward_args(x2, weight, torch.empty_like(x2), rstd, 1e-5), {}
    if kernel == "bwd":
        return _backward_args(x2, weight, rstd, torch.empty_like(x2), torch.empty_like(x2),
                              partial), {}
    consts = {k: v for k, v in COLUMN_SUM_TILE.items() if k != "num_warps"}
    return _column_sum_args(partial, weight), consts


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        y, rstd = _rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, rstd = ctx.saved_tensors
        # upstream gradients may be broadcast views (stride 0): make them dense, in x's dtype
        dx, dweight = _rmsnorm_backward(x, weight, rstd, dy.to(x.dtype).contiguous())
        return dx, dweight, None


def rmsnorm(
    x: Float[Tensor, "... d_model"], weight: Float[Tensor, " d_model"], eps: float = 1e-5
) -> Float[Tensor, "... d_model"]:
    """RMSNorm over the last dim with fused Triton kernels (forward; backward gives dx and dweight).

    x: contiguous fp16/bf16/fp32 on CUDA (or CPU under the interpreter); weight: (d_model,), same
    dtype and device; eps > 0. Output in x's dtype; fp32 arithmetic inside. Cost: `rmsnorm_bytes`,
    `rmsnorm_flops`.
    """
    _check(x, weight, eps)
    return _RMSNorm.apply(x, weight, eps)
