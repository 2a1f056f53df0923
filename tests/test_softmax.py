"""Fused softmax: forward and gradient against float64 autograd; input checks; cost-model laws."""

from fractions import Fraction

import pytest
import torch
from test_kernels_common import needs_gpu, tally_bytes

from mlsys.kernels._triton import INTERPRETED, TOLERANCES
from mlsys.kernels.softmax import (
    MAX_COLS,
    _softmax_forward,
    naive_softmax,
    naive_softmax_bytes,
    softmax,
    softmax_backward_bytes,
    softmax_backward_flops,
    softmax_bytes,
    softmax_flops,
    softmax_ref,
)

DEVICE = "cpu" if INTERPRETED else "cuda"
SHAPES = [(1, 1), (3, 7), (37, 1000), (5, 3, 129)]


def _x(shape, dtype, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(device=DEVICE, dtype=dtype)


def _check_forward_and_grad(x):
    tol = TOLERANCES[x.dtype]
    dy = _x(x.shape, x.dtype, seed=1, scale=1.0)
    x = x.clone().requires_grad_()
    y = softmax(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = softmax_ref(x64)
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64, **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_grad_match_float64(shape, dtype):
    _check_forward_and_grad(_x(shape, dtype))


def test_large_irregular_shape():
    # 1823 rows of 781: not a multiple of the block (1024 columns, several rows per program)
    _check_forward_and_grad(_x((1823, 781), torch.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1823, 781), (4, 4096), (3, 65536), (1000, 33)])
def test_gpu_shapes_and_bf16(shape, dtype):
    _check_forward_and_grad(_x(shape, dtype))


def test_is_stable_for_large_logits_and_masked_entries():
    x = _x((5, 300), torch.float32, scale=1e4)  # exp(1e4) overflows unless the row max is subtracted
    x[:, ::3] = float("-inf")  # masked positions, as in attention
    y = softmax(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), softmax_ref(x.double()), **TOLERANCES[torch.float32])
    assert (y[:, ::3] == 0).all()


def test_grad_of_a_broadcast_upstream_gradient():
    # sum().backward() hands the kernel a stride-0 gradient; rows of softmax sum to 1, so dx = 0
    x = _x((4, 50), torch.float32).requires_grad_()
    softmax(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), **TOLERANCES[torch.float32])


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (torch.ones(3, 4, dtype=torch.int64), TypeError, "x has dtype torch.int64; expected one of"),
        (torch.ones(4, 3).t(), ValueError, r"x must be contiguous; call \.contiguous\(\) first"),
        (torch.ones(0, 5), ValueError, "x is empty"),
        (torch.ones(5, 0), ValueError, "x is empty"),
        (torch.ones(1, MAX_COLS + 1), ValueError, f"rows of {MAX_COLS + 1} elements; .* at most {MAX_COLS}"),
        ("not a tensor", TypeError, "x must be a torch.Tensor"),
    ],
)
def test_bad_input_is_refused_before_launch(x, error, message):
    if isinstance(x, torch.Tensor):
        x = x.to(DEVICE)
    with pytest.raises(error, match=message):
        softmax(x)


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 11)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_naive_softmax_moves_what_the_model_says(shape, dtype):
    x = torch.randn(shape).to(dtype)
    tally = tally_bytes(naive_softmax, x)
    assert [op.op for op in tally.ops] == ["amax", "sub", "exp", "sum", "div"]
    assert tally.total_bytes == naive_softmax_bytes(shape, dtype)
    # one FLOP per element per op (max compare, subtract, exp, add, divide)
    assert softmax_flops(shape) == sum(op.largest_numel for op in tally.ops)
    torch.testing.assert_close(naive_softmax(x.double()), softmax_ref(x.double()))


def test_fused_model_is_one_read_and_one_write():
    shape, dtype = (6, 19), torch.float16
    x = torch.randn(shape).to(dtype)
    # torch.softmax is itself one fused op: exactly the fused model's traffic
    assert tally_bytes(softmax_ref, x).total_bytes == softmax_bytes(shape, dtype)
    # and the Triton launcher touches exactly x and y
    y = _softmax_forward(x.to(DEVICE))
    assert softmax_bytes(shape, dtype) == x.nbytes + y.nbytes
    assert softmax_backward_bytes(shape, dtype) == 3 * x.nbytes
    assert softmax_backward_flops(shape) == 4 * x.numel()


@pytest.mark.parametrize("n", [1, 7, 1000, 50257])
def test_fusion_saves_four_x_at_long_rows(n):
    ratio = Fraction(naive_softmax_bytes((8, n), "bf16"), softmax_bytes((8, n), "bf16"))
    assert ratio == 4 + Fraction(2, n)


def test_cost_models_refuse_bad_shapes():
    with pytest.raises(ValueError, match="shape must have at least one dim"):
        softmax_bytes((), "fp32")
    with pytest.raises(ValueError, match="all >= 0"):
        softmax_flops((3, -1))
