"""Fused softmax: forward and gradient against float64 autograd; input checks; cost-model laws.

Tests that launch a kernel are marked `needs_triton`; the reference and cost-model tests run
everywhere.
"""

from fractions import Fraction

import pytest
import torch
from kernel_cases import DEVICE, needs_gpu, needs_triton, tally_bytes

from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import TOLERANCES
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


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_grad_match_float64(shape, dtype):
    _check_forward_and_grad(_x(shape, dtype))


@needs_triton
def test_large_irregular_shape():
    # 1823 rows of 781: not a multiple of the block (1024 columns, several rows per program)
    _check_forward_and_grad(_x((1823, 781), torch.float32))


@pytest.mark.gpu
@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1823, 781), (4, 4096), (3, MAX_COLS), (1000, 33)])
def test_gpu_shapes_and_bf16(shape, dtype):
    _check_forward_and_grad(_x(shape, dtype))


@needs_triton
def test_is_stable_for_large_logits_and_masked_entries():
    x = _x((5, 300), torch.float32, scale=1e4)  # exp(1e4) overflows unless the max is subtracted
    x[:, ::3] = float("-inf")  # masked positions, as in attention
    y = softmax(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), softmax_ref(x.double()), **TOLERANCES[torch.float32])
    assert (y[:, ::3] == 0).all()


@needs_triton
def test_grad_of_a_broadcast_upstream_gradient():
    # sum().backward() hands the kernel a stride-0 gradient; rows of softmax sum to 1, so dx = 0
    x = _x((4, 50), torch.float32).requires_grad_()
    softmax(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), **TOLERANCES[torch.float32])


@needs_triton
@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (torch.ones(3, 4, dtype=torch.int64), TypeError, "x has dtype torch.int64; expected one"),
        (torch.ones(4, 3).t(), ValueError, r"x must be contiguous; call \.contiguous\(\) first"),
        (torch.ones(0, 5), ValueError, "x is empty"),
        (torch.ones(5, 0), ValueError, "x is empty"),
        (torch.ones(1, MAX_COLS + 1), ValueError,
         f"rows of {MAX_COLS + 1} elements; .* at most {MAX_COLS}"),
        ("not a tensor", TypeError, "x must be a torch.Tensor"),
        ([[1.0, 2.0]], TypeError, "x must be a torch.Tensor, got list"),
        (torch.ones(3, dtype=torch.float64), TypeError, "x has dtype torch.float64"),
        (torch.tensor(1.0), ValueError, "x must have at least 1 dimension"),
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
    assert softmax_backward_bytes(shape, dtype) == 3 * x.nbytes
    assert softmax_backward_flops(shape) == 4 * x.numel()
    # torch's softmax backward is one fused op too: it reads y and dy and writes dx
    x32 = torch.randn(shape, requires_grad=True)
    y, dy = softmax_ref(x32), torch.randn(shape)
    tally = tally_bytes(lambda: torch.autograd.grad(y, x32, dy))
    assert [op.op for op in tally.ops] == ["_softmax_backward_data"]
    assert tally.total_bytes == softmax_backward_bytes(shape, "fp32")


@needs_triton
def test_the_launcher_touches_exactly_x_and_y():
    shape, dtype = (6, 19), torch.float16
    x = torch.randn(shape).to(dtype)
    y = _softmax_forward(x.to(DEVICE))
    assert softmax_bytes(shape, dtype) == x.nbytes + y.nbytes


@pytest.mark.parametrize("n", [1, 7, 1000, 50257])
def test_fusion_saves_four_x_at_long_rows(n):
    ratio = Fraction(naive_softmax_bytes((8, n), "bf16"), softmax_bytes((8, n), "bf16"))
    assert ratio == 4 + Fraction(2, n)


def test_kernel_cost_models_delegate_to_accounting():
    shape, (m, n) = (2, 3, 11), (6, 11)
    assert softmax_bytes(shape, "bf16") == bytes_moved.softmax_traffic(m, n, "bf16").total_bytes
    naive = bytes_moved.naive_softmax_traffic(m, n, "bf16").total_bytes
    assert naive_softmax_bytes(shape, "bf16") == naive
    backward = bytes_moved.softmax_backward_traffic(m, n).total_bytes
    assert softmax_backward_bytes(shape, "fp32") == backward
    assert softmax_flops(shape) == flops.softmax_flops(m, n) == 5 * m * n
    assert softmax_backward_flops(shape) == flops.softmax_backward_flops(m, n)
    naive = bytes_moved.naive_softmax_traffic(m, n, "fp32")
    expected = ((5 * m * n + 2 * m) * 4, (3 * m * n + 2 * m) * 4)  # 5MN + 2M read, 3MN + 2M written
    assert (naive.read_bytes, naive.write_bytes) == expected


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: softmax_bytes((), "fp32"), ValueError, "shape must have at least one dim"),
        (lambda: softmax_flops((3, -1)), ValueError, r"shape\[1\] must be a positive integer"),
        (lambda: softmax_bytes((3, 0), "fp32"), ValueError, r"shape\[1\] must be a positive"),
        (lambda: softmax_bytes("ab", "fp32"), TypeError, "shape must be a sequence of integers"),
        (lambda: softmax_bytes((3, 4), "fp12"), ValueError, "unknown dtype='fp12'"),
        (lambda: softmax_bytes((3, 4), None), TypeError, "dtype must be a name"),
        (lambda: naive_softmax_bytes((2.0, 3), "fp32"), TypeError, r"shape\[0\] must be an int"),
        (lambda: softmax_backward_flops((True, 3)), TypeError, r"shape\[0\] must be an integer"),
        (lambda: softmax_backward_bytes((3, 4), 4), TypeError, "dtype must be a name"),
        (lambda: softmax_flops(7), TypeError, "shape must be a sequence"),
        (lambda: softmax_ref([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
        (lambda: softmax_ref(torch.arange(3)), TypeError, "x must be a floating-point tensor"),
        (lambda: naive_softmax("x"), TypeError, "x must be a torch.Tensor, got str"),
        (lambda: naive_softmax(torch.ones(2, dtype=torch.int32)), TypeError, "floating-point"),
    ],
)
def test_cost_models_and_references_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
