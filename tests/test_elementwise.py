"""repeat_unary: the fused k-step chain against a float64 eager reference; input checks; cost-model laws."""

import pytest
import torch
from test_kernels_common import needs_gpu, tally_bytes

from mlsys.kernels._triton import INTERPRETED, TOLERANCES
from mlsys.kernels.elementwise import (
    eager_chain_bytes,
    repeat_unary,
    repeat_unary_bytes,
    repeat_unary_flops,
    repeat_unary_ref,
)

DEVICE = "cpu" if INTERPRETED else "cuda"
CPU_DTYPES = [torch.float32, torch.float16]


def _x(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(shape, generator=gen)).to(device=DEVICE, dtype=dtype)


def _check(x, k, op):
    y = repeat_unary(x, k, op)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y.double(), repeat_unary_ref(x.double(), k, op), **TOLERANCES[x.dtype])


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("op", ["fma", "cos"])
@pytest.mark.parametrize("k", [0, 1, 7])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 3, 129), ()])
def test_matches_float64_reference(shape, k, op, dtype):
    _check(_x(shape, dtype), k, op)


@pytest.mark.parametrize("shape", [(37, 1000), (1823, 781)])
def test_irregular_large_shapes(shape):
    # 1823 * 781 = 1_423_763 elements: 1391 programs, the last one partly masked
    _check(_x(shape, torch.float32), 3, "fma")
    _check(_x(shape, torch.float16, seed=1), 2, "cos")


def test_k_zero_is_an_exact_copy():
    x = _x((3, 7), torch.float16)
    assert torch.equal(repeat_unary(x, 0, "cos"), x)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("op", ["fma", "cos"])
def test_bf16_on_gpu(op):
    _check(_x((1823, 781), torch.bfloat16), 5, op)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"k": -1}, ValueError, r"k must be >= 0 \(k = 0 is a copy\), got -1"),
        ({"k": 2.0}, TypeError, "k must be an int, got float"),
        ({"k": True}, TypeError, "k must be an int, got bool"),
        ({"op": "tanh"}, ValueError, "op='tanh' is not a known op; choose one of fma, cos"),
        ({"x": torch.ones(4, dtype=torch.int32)}, TypeError, "x has dtype torch.int32; expected one of"),
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
    assert repeat_unary_flops(x.numel(), 4, op) == per_element * sum(steps) == per_element * 4 * x.numel()


def test_cost_models_refuse_bad_arguments():
    with pytest.raises(ValueError, match="n_elements must be >= 0"):
        repeat_unary_bytes(-1, "fp32")
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        eager_chain_bytes(10, "fp32", -2)
    with pytest.raises(ValueError, match="op='exp'"):
        repeat_unary_flops(10, 1, "exp")
