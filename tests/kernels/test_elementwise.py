"""repeat_unary: the fused k-step chain against a float64 eager reference; input checks; costs.

Tests that launch a kernel are marked `needs_triton`; the reference and cost-model tests run
everywhere.
"""

import pytest
import torch
from kernel_cases import DEVICE, needs_gpu, needs_triton, tally_bytes

from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import TOLERANCES
from mlsys.kernels.elementwise import (
    eager_chain_bytes,
    repeat_unary,
    repeat_unary_bytes,
    repeat_unary_flops,
    repeat_unary_ref,
)

CPU_DTYPES = [torch.float32, torch.float16]


def _x(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(shape, generator=gen)).to(device=DEVICE, dtype=dtype)


def _check(x, k, op):
    y = repeat_unary(x, k, op)
    assert y.shape == x.shape and y.dtype == x.dtype
    expected = repeat_unary_ref(x.double(), k, op)
    torch.testing.assert_close(y.double(), expected, **TOLERANCES[x.dtype])


@needs_triton
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("op", ["fma", "cos"])
@pytest.mark.parametrize("k", [0, 1, 7])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 3, 129), ()])
def test_matches_float64_reference(shape, k, op, dtype):
    _check(_x(shape, dtype), k, op)


@needs_triton
@pytest.mark.parametrize("shape", [(37, 1000), (1823, 781)])
def test_irregular_large_shapes(shape):
    # 1823 * 781 = 1_423_763 elements: 1391 programs, the last one partly masked
    _check(_x(shape, torch.float32), 3, "fma")
    _check(_x(shape, torch.float16, seed=1), 2, "cos")


@needs_triton
def test_k_zero_is_an_exact_copy():
    x = _x((3, 7), torch.float16)
    assert torch.equal(repeat_unary(x, 0, "cos"), x)


@pytest.mark.gpu
@needs_gpu
@needs_triton
@pytest.mark.parametrize("op", ["fma", "cos"])
def test_bf16_on_gpu(op):
    _check(_x((1823, 781), torch.bfloat16), 5, op)


@needs_triton
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"k": -1}, ValueError, "k must be an integer >= 0, got -1"),
        ({"k": 2.0}, TypeError, r"k must be an integer, got 2.0 \(float\)"),
        ({"k": True}, TypeError, "k must be an integer, got True"),
        ({"k": None}, TypeError, "k must be an integer, got None"),
        ({"op": "tanh"}, ValueError, "op='tanh' is not one of 'fma', 'cos'"),
        ({"op": None}, ValueError, "op=None is not one of"),
        ({"x": [1.0, 2.0]}, TypeError, "x must be a torch.Tensor, got list"),
        ({"x": torch.ones(4, dtype=torch.int32)}, TypeError, "x has dtype torch.int32; expected"),
        ({"x": torch.ones(4, 3).t()}, ValueError, "x must be contiguous"),
        ({"x": torch.ones(0)}, ValueError, "x is empty"),
    ],
)
def test_bad_input_is_refused_before_launch(kwargs, error, message):
    args = {"x": _x((4, 3), torch.float32), "k": 1, "op": "fma", **kwargs}
    with pytest.raises(error, match=message):
        repeat_unary(args["x"], args["k"], args["op"])


@pytest.mark.parametrize("op", ["fma", "cos"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_eager_chain_bytes_is_what_the_eager_reference_moves(k, dtype, op):
    x = _x((3, 7), dtype).cpu()
    tally = tally_bytes(repeat_unary_ref, x, k, op)
    assert tally.total_bytes == eager_chain_bytes(x.numel(), dtype, k)
    # fusing saves a factor k: one read and one write instead of k of each
    assert eager_chain_bytes(x.numel(), dtype, k) == k * repeat_unary_bytes(x.numel(), dtype)
    assert repeat_unary_bytes(x.numel(), dtype) == 2 * x.nbytes


@pytest.mark.parametrize("op", ["fma", "cos"])
def test_flops_count_the_eager_ops(op):
    x = torch.ones(3, 7)
    tally = tally_bytes(repeat_unary_ref, x, 4, op)
    steps = [op.largest_numel for op in tally.ops if op.op in ("add", "cos")]
    per_element = 2 if op == "fma" else 1  # a multiply-add is 2 FLOPs; cos is counted as one op
    predicted = repeat_unary_flops(x.numel(), 4, op)
    assert predicted == per_element * sum(steps) == per_element * 4 * x.numel()


def test_cost_models_delegate_to_accounting():
    assert repeat_unary_flops(10, 3, "fma") == flops.repeat_unary_flops(10, 3, "fma") == 60
    assert repeat_unary_flops(10, 3, "cos") == 30
    fused = bytes_moved.fused_chain_traffic(10, "bf16").total_bytes
    assert repeat_unary_bytes(10, "bf16") == fused == 40
    eager = bytes_moved.eager_chain_traffic(10, "bf16", 3).total_bytes
    assert eager_chain_bytes(10, "bf16", 3) == eager
    assert eager_chain_bytes(10, "bf16", 0) == 0 and repeat_unary_flops(0, 5) == 0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: repeat_unary_bytes(-1, "fp32"), ValueError, "n_elements must be an integer >= 0"),
        (lambda: repeat_unary_bytes(2.5, "fp32"), TypeError, "n_elements must be an integer"),
        (lambda: repeat_unary_bytes(10, "fp12"), ValueError, "unknown dtype='fp12'"),
        (lambda: eager_chain_bytes(10, "fp32", -2), ValueError, "k must be an integer >= 0"),
        (lambda: eager_chain_bytes(10, "fp32", 1.0), TypeError, "k must be an integer"),
        (lambda: eager_chain_bytes(True, "fp32", 1), TypeError, "n_elements must be an integer"),
        (lambda: repeat_unary_flops(10, 1, "exp"), ValueError, "op='exp' is not one of"),
        (lambda: repeat_unary_flops(2.5, 1), TypeError, r"n_elements must be an integer, got 2.5"),
        (lambda: repeat_unary_flops(10, -1), ValueError, "k must be an integer >= 0, got -1"),
        (lambda: repeat_unary_flops(10, True), TypeError, "k must be an integer, got True"),
        (lambda: repeat_unary_flops(-3, 1), ValueError, "n_elements must be an integer >= 0"),
        (lambda: repeat_unary_ref(torch.ones(3), -1), ValueError, "k must be an integer >= 0"),
        (lambda: repeat_unary_ref(torch.ones(3), 1, "tanh"), ValueError, "op='tanh' is not one"),
        (lambda: repeat_unary_ref([1.0], 1), TypeError, "x must be a torch.Tensor, got list"),
        (lambda: repeat_unary_ref(torch.arange(3), 1), TypeError, "x must be a floating-point"),
    ],
)
def test_cost_models_and_reference_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
