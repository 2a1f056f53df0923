"""mlsys.accounting.op_costs, the table of the book's operations: their order, closed forms of
their intensities, the dtype's effect, agreement with `accounting.bytes`, and the argument
checks."""

import math

import pytest

from mlsys import hardware
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.accounting.op_costs import OpCost, op_costs
from mlsys.dtypes import bytes_per_element

OPS = op_costs()
NAMES = [op.name for op in OPS]


def test_op_costs_lists_the_book_operations_in_order():
    assert NAMES == [
        "square matmul N = 4096", "square matmul N = 64", "skinny matmul 16 x 4096 x 4096",
        "batched matmul, shared W (64 x 128 rows)",
        "batched matmul, one W per item (64 x 128 rows)",
        "linear forward + backward (4096 x 4096 x 4096)", "elementwise unary (1 FLOP/element)",
        "elementwise binary add", "fused softmax (4096 rows of 4096)",
        "fused RMSNorm (4096 rows of 4096)", "fused LayerNorm (4096 rows of 4096)",
        "naive attention (T = 4096)", "tiled attention, ideal (T = 4096)",
    ]  # fmt: skip
    assert all(op.intensity == op.flops / op.traffic.total_bytes for op in OPS)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8_e4m3"])
def test_op_costs_closed_forms(dtype):
    b = bytes_per_element(dtype)
    T, D, N, m, Ba, r = 37, 48, 20, 3, 5, 7
    bh, S, d = 2 * 3, 40, 8
    ops = op_costs(dtype, tokens=T, d_model=D, small_n=N, skinny_rows=m, batch=Ba,
                     rows_per_item=r, attention=(2, 3, S, d))
    exact = [
        2 * D / (3 * b), 2 * N / (3 * b), 2 * m * D / (b * (2 * m + D)),
        2 * Ba * r * D / (b * (2 * Ba * r + D)), 2 * r * D / (b * (2 * r + D)),
        2 * T * D / (b * (2 * T + D)), 1 / (2 * b), 1 / (3 * b), 5 / (2 * b),
        None, None,  # the norms: per-row terms and the weight read make the form approximate
        S * (2 * d + 3) / (2 * b * (S + d)), S * (2 * d + 3) / (2 * b * d),
    ]  # fmt: skip
    for op, value in zip(ops, exact, strict=True):
        if value is not None:
            assert math.isclose(op.intensity, value, rel_tol=1e-12), op.name
    rms, ln = ops[9], ops[10]
    assert math.isclose(rms.intensity, (4 * T * D + 3 * T) / ((2 * T * D + D) * b), rel_tol=1e-12)
    assert math.isclose(ln.intensity, 7 * T * D / ((2 * T * D + 2 * D) * b), rel_tol=1e-12)
    attention = bh * (4 * S * S * d + 6 * S * S)  # two matmuls; softmax 5 and scale 1 per score
    assert ops[11].flops == ops[12].flops == flops.scaled_dot_product_flops(2, 3, S, d) == attention


def test_op_costs_in_fp32_have_half_the_bf16_intensity():
    # FLOPs do not depend on the dtype and every byte of these minimum traffics scales with b
    # (the norms' fp32 statistics are not part of their forward minimum), so exactly one half
    for op32, op16 in zip(op_costs("fp32"), OPS, strict=True):
        assert op32.flops == op16.flops and op32.traffic.total_bytes == 2 * op16.traffic.total_bytes
        assert op32.intensity == op16.intensity / 2, op32.name
        assert op32.formula == op16.formula


def test_op_costs_match_the_one_formulas_elsewhere():
    by_name = dict(zip(NAMES, OPS, strict=True))
    assert by_name["square matmul N = 4096"].intensity == bytes_moved.matmul_intensity(4096, 4096,
                                                                                      4096)
    unary = by_name["elementwise unary (1 FLOP/element)"]
    assert unary.intensity == bytes_moved.elementwise_intensity(1, "bf16")
    h100 = hardware.H100_SXM.ridge_intensity("bf16")
    assert by_name["naive attention (T = 4096)"].intensity < h100
    assert by_name["tiled attention, ideal (T = 4096)"].intensity > h100


INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: op_costs("fp12"), ValueError, "unknown dtype='fp12'"),
    (lambda: op_costs(tokens=0), ValueError, "tokens must be a positive integer"),
    (lambda: op_costs(small_n=True), TypeError, "small_n must be an integer, got True"),
    (lambda: op_costs(attention=(1, 2, 3)), ValueError, r"attention must be \(batch, heads"),
    (lambda: op_costs(attention=(1, 32, 0, 128)), ValueError, r"attention\[2\] must be a"),
    (lambda: op_costs(attention="1,2,3,4"), TypeError, "attention must be a sequence"),
    (lambda: OpCost("op", 10, 100, "1/b"), TypeError, "traffic must be a Traffic, got int"),
    (lambda: OpCost("op", -10, bytes_moved.Traffic(1, 1), "1/b"), ValueError,
     "flops must be an integer"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_before_any_work(call, error, message):
    with pytest.raises(error, match=message):
        call()
