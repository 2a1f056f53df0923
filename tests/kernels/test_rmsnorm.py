"""Fused RMSNorm: forward, dx and dweight against float64 autograd; input checks; cost models.

Tests that launch a kernel are marked `needs_triton`; the reference and cost-model tests run
everywhere.
"""

import math

import pytest
import torch
from kernel_cases import DEVICE, needs_gpu, needs_triton

from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import TOLERANCES
from mlsys.kernels.rmsnorm import (
    MAX_COLS,
    _rmsnorm_backward,
    _rmsnorm_forward,
    rmsnorm,
    rmsnorm_backward_bytes,
    rmsnorm_backward_flops,
    rmsnorm_bytes,
    rmsnorm_flops,
    rmsnorm_ref,
)

SHAPES = [(1, 1), (3, 7), (37, 1000), (5, 3, 129)]


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    weight = 1 + 0.3 * torch.randn(shape[-1], generator=gen)
    dy = torch.randn(shape, generator=gen)
    return [t.to(device=DEVICE, dtype=dtype) for t in (x, weight, dy)]


def _check(shape, dtype, eps=1e-5):
    x, weight, dy = _inputs(shape, dtype)
    tol = TOLERANCES[dtype]
    x, weight = x.requires_grad_(), weight.requires_grad_()
    y = rmsnorm(x, weight, eps)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    rmsnorm_ref(x64, w64, eps).backward(dy.double())
    torch.testing.assert_close(y.double(), rmsnorm_ref(x64, w64, eps).detach(), **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    # dweight sums M rows: its rounding error grows like sqrt(M) terms of size ~1
    rows = math.prod(shape[:-1])
    dw_tol = {"rtol": tol["rtol"], "atol": tol["atol"] * math.sqrt(rows)}
    torch.testing.assert_close(weight.grad.double(), w64.grad, **dw_tol)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_grads_match_float64(shape, dtype):
    _check(shape, dtype)


@needs_triton
def test_large_irregular_shape():
    # 1823 rows of 781 columns, rows spread over the backward's programs unevenly
    _check((1823, 781), torch.float32)


@needs_triton
def test_eps_is_used():
    x, weight, _ = _inputs((4, 10), torch.float32)
    x = x * 1e-3  # mean(x**2) ~ 1e-6, comparable to eps
    expected = rmsnorm_ref(x.double(), weight.double(), 1e-4)
    torch.testing.assert_close(rmsnorm(x, weight, 1e-4).double(), expected)


@pytest.mark.gpu
@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1823, 781), (4, 4096), (3, MAX_COLS), (100_000, 64)])
def test_gpu_shapes_and_bf16(shape, dtype):
    _check(shape, dtype)


@needs_triton
def test_dweight_is_deterministic():
    x, weight, dy = _inputs((300, 77), torch.float32)
    _, rstd = _rmsnorm_forward(x, weight, 1e-5)
    first = _rmsnorm_backward(x, weight, rstd, dy)
    second = _rmsnorm_backward(x, weight, rstd, dy)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


F32 = torch.float32


@needs_triton
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "w_dtype", "eps", "error", "message"),
    [
        ((3, 4), (5,), F32, 1e-5, ValueError,
         r"weight has shape \(5,\); expected \(4,\), the last dim of x"),
        ((3, 4), (1, 4), F32, 1e-5, ValueError, r"weight has shape \(1, 4\); expected \(4,\)"),
        ((3, 4), (4,), torch.float16, 1e-5, ValueError,
         "weight has dtype torch.float16 but x has torch.float32"),
        ((3, 4), (4,), torch.int32, 1e-5, TypeError, "weight has dtype torch.int32; expected one"),
        ((3, 4), (4,), F32, 0.0, ValueError, "eps must be > 0, got 0.0"),
        ((3, 4), (4,), F32, -1e-5, ValueError, "eps must be > 0"),
        ((3, 4), (4,), F32, float("nan"), ValueError, "eps must be finite"),
        ((3, 4), (4,), F32, "1e-5", TypeError, "eps must be a real number"),
        ((3, 4), (4,), F32, True, TypeError, "eps must be a real number, got True"),
        ((0, 4), (4,), F32, 1e-5, ValueError, "x is empty"),
        ((1, MAX_COLS + 1), (MAX_COLS + 1,), F32, 1e-5, ValueError,
         f"at most {MAX_COLS} without spilling"),
    ],
)
def test_bad_input_is_refused_before_launch(x_shape, w_shape, w_dtype, eps, error, message):
    x = torch.ones(x_shape, device=DEVICE)
    weight = torch.ones(w_shape, device=DEVICE).to(w_dtype)
    with pytest.raises(error, match=message):
        rmsnorm(x, weight, eps)


@needs_triton
def test_bad_x_is_refused():
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        rmsnorm(torch.ones(3, 4, dtype=torch.int64, device=DEVICE), torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match="x must be contiguous"):
        rmsnorm(torch.ones(4, 3, device=DEVICE).t(), torch.ones(4, device=DEVICE))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_byte_models_count_the_tensors_the_kernels_touch(dtype):
    shape = (5, 3, 41)
    x, weight, dy = _inputs(shape, dtype)
    y, rstd = _rmsnorm_forward(x, weight, 1e-5)
    assert rstd.dtype == torch.float32 and rstd.shape == (15,)
    assert rmsnorm_bytes(shape, dtype) == x.nbytes + weight.nbytes + y.nbytes + rstd.nbytes
    dx, dweight = _rmsnorm_backward(x, weight, rstd, dy)
    touched = x.nbytes + dy.nbytes + weight.nbytes + rstd.nbytes + dx.nbytes + dweight.nbytes
    assert rmsnorm_backward_bytes(shape, dtype) == touched


def test_flop_models_depend_only_on_rows_and_columns():
    assert rmsnorm_flops((6, 10)) == rmsnorm_flops((2, 3, 10)) == 4 * 60 + 3 * 6
    assert rmsnorm_backward_flops((6, 10)) == rmsnorm_backward_flops((3, 2, 10)) == 9 * 60 + 6
    assert rmsnorm_flops((6, 10)) == flops.rmsnorm_flops(6, 10)
    assert rmsnorm_backward_flops((6, 10)) == flops.rmsnorm_backward_flops(6, 10)


def test_byte_models_delegate_to_accounting():
    # forward: x, weight, y in the dtype and 4 bytes of fp32 rstd per row
    assert rmsnorm_bytes((6, 10), "bf16") == (2 * 60 + 10) * 2 + 4 * 6
    forward = bytes_moved.norm_traffic(6, 10, "bf16", save_stats=True)
    assert rmsnorm_bytes((6, 10), "bf16") == forward.total_bytes
    # backward: x, dy, weight, rstd read; dx, dweight written
    traffic = bytes_moved.rmsnorm_backward_traffic(6, 10, "fp16")
    assert (traffic.read_bytes, traffic.write_bytes) == ((2 * 60 + 10) * 2 + 4 * 6, (60 + 10) * 2)
    assert rmsnorm_backward_bytes((2, 3, 10), "fp16") == traffic.total_bytes


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: rmsnorm_bytes((), "fp32"), ValueError, "shape must have at least one dim"),
        (lambda: rmsnorm_flops((3, 0)), ValueError, r"shape\[1\] must be a positive integer"),
        (lambda: rmsnorm_backward_bytes((3, 4), "fp12"), ValueError, "unknown dtype='fp12'"),
        (lambda: rmsnorm_backward_flops([3, -4]), ValueError, r"shape\[1\] must be a positive"),
        (lambda: rmsnorm_bytes((3, 4.0), "fp32"), TypeError, r"shape\[1\] must be an integer"),
        (lambda: rmsnorm_bytes(None, "fp32"), TypeError, "shape must be a sequence"),
        (lambda: rmsnorm_ref(torch.ones(2, 4), torch.ones(4), 0.0), ValueError, "eps must be > 0"),
        (lambda: rmsnorm_ref(torch.ones(2, 4), torch.ones(4), "1e-5"), TypeError, "eps must be"),
        (lambda: rmsnorm_ref([1.0], torch.ones(1)), TypeError, "x must be a torch.Tensor"),
        (lambda: rmsnorm_ref(torch.ones(2, 4), None), TypeError, "weight must be a torch.Tensor"),
        (lambda: rmsnorm_ref(torch.ones(2, 4, dtype=torch.int64), torch.ones(4)), TypeError,
         "x must be a floating-point tensor"),
    ],
)
def test_cost_models_and_reference_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
