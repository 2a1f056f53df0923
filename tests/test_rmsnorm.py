"""Fused RMSNorm: forward, dx and dweight against float64 autograd; input checks; cost-model laws."""

import math

import pytest
import torch
from test_kernels_common import needs_gpu

from mlsys.kernels._triton import INTERPRETED, TOLERANCES
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

DEVICE = "cpu" if INTERPRETED else "cuda"
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_grads_match_float64(shape, dtype):
    _check(shape, dtype)


def test_large_irregular_shape():
    # 1823 rows of 781 columns, rows spread over the backward's programs unevenly
    _check((1823, 781), torch.float32)


def test_eps_is_used():
    x, weight, _ = _inputs((4, 10), torch.float32)
    x = x * 1e-3  # mean(x**2) ~ 1e-6, comparable to eps
    torch.testing.assert_close(rmsnorm(x, weight, 1e-4).double(), rmsnorm_ref(x.double(), weight.double(), 1e-4))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1823, 781), (4, 4096), (3, 65536), (100_000, 64)])
def test_gpu_shapes_and_bf16(shape, dtype):
    _check(shape, dtype)


def test_dweight_is_deterministic():
    x, weight, dy = _inputs((300, 77), torch.float32)
    _, rstd = _rmsnorm_forward(x, weight, 1e-5)
    first = _rmsnorm_backward(x, weight, rstd, dy)
    second = _rmsnorm_backward(x, weight, rstd, dy)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "w_dtype", "eps", "error", "message"),
    [
        ((3, 4), (5,), torch.float32, 1e-5, ValueError, r"weight has shape \(5,\); expected \(4,\), the last dim of x"),
        ((3, 4), (1, 4), torch.float32, 1e-5, ValueError, r"weight has shape \(1, 4\); expected \(4,\)"),
        ((3, 4), (4,), torch.float16, 1e-5, ValueError, "weight has dtype torch.float16 but x has torch.float32"),
        ((3, 4), (4,), torch.int32, 1e-5, TypeError, "weight has dtype torch.int32; expected one of"),
        ((3, 4), (4,), torch.float32, 0.0, ValueError, "eps must be a positive number, got 0.0"),
        ((3, 4), (4,), torch.float32, "1e-5", ValueError, "eps must be a positive number"),
        ((0, 4), (4,), torch.float32, 1e-5, ValueError, "x is empty"),
        ((1, MAX_COLS + 1), (MAX_COLS + 1,), torch.float32, 1e-5, ValueError, "at most 65536"),
    ],
)
def test_bad_input_is_refused_before_launch(x_shape, w_shape, w_dtype, eps, error, message):
    x = torch.ones(x_shape, device=DEVICE)
    weight = torch.ones(w_shape, device=DEVICE).to(w_dtype)
    with pytest.raises(error, match=message):
        rmsnorm(x, weight, eps)


def test_bad_x_is_refused():
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        rmsnorm(torch.ones(3, 4, dtype=torch.int64, device=DEVICE), torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match="x must be contiguous"):
        rmsnorm(torch.ones(4, 3, device=DEVICE).t(), torch.ones(4, device=DEVICE))


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
    with pytest.raises(ValueError, match="shape must have at least one dim"):
        rmsnorm_bytes((), "fp32")
