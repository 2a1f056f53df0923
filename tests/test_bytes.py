"""Byte-movement formulas: laws, and traffic counted on real ops by a dispatch-mode tally."""

import math

import pytest
import torch

from mlsys import hardware
from mlsys.accounting import bytes as B
from mlsys.accounting import flops
from mlsys.counters import ByteCounter as ByteTally
from mlsys.dtypes import bytes_per_element


def test_square_matmul_intensity_is_2n_over_3_bytes():
    for n in (64, 1000, 4096):
        assert B.matmul_intensity(n, n, n, "bf16") == pytest.approx(2 * n / (3 * 2))
        assert B.matmul_intensity(n, n, n, "fp32") == pytest.approx(2 * n / (3 * 4))


def test_matmul_traffic_matches_a_tally_of_torch_mm():
    a, b = torch.randn(37, 53), torch.randn(53, 29)
    with ByteTally() as tally:
        torch.mm(a, b)
    assert B.matmul_traffic(37, 29, 53, "fp32") == B.Traffic(tally.read_bytes, tally.write_bytes)


def test_sharing_an_operand_raises_intensity():
    shared = B.batched_matmul_traffic(8, 128, 128, 128, shared_b=True)
    separate = B.batched_matmul_traffic(8, 128, 128, 128, shared_b=False)
    assert shared.total_bytes < separate.total_bytes
    assert separate == B.Traffic(*[8 * x for x in (B.matmul_traffic(128, 128, 128).read_bytes,
                                                    B.matmul_traffic(128, 128, 128).write_bytes)])


def test_elementwise_intensity_is_per_byte_not_per_element():
    assert B.elementwise_intensity(1, "fp32") == 1 / 8  # unary: read 4 B, write 4 B
    assert B.elementwise_intensity(1, "fp32", n_inputs=2) == 1 / 12  # binary add
    assert B.elementwise_intensity(1, "bf16") == 1 / 4
    x, y = torch.randn(1001), torch.randn(1001)
    with ByteTally() as tally:
        torch.add(x, y)
    predicted = B.elementwise_traffic(1001, "fp32", n_inputs=2)
    assert predicted.total_bytes == tally.read_bytes + tally.write_bytes


def test_linear_layer_reads_the_weight_twice_not_three_times():
    tokens, d_in, d_out = 7, 11, 13
    traffic = B.linear_traffic(tokens, d_in, d_out, "fp32")
    assert traffic.weight_reads == 2
    x = torch.randn(tokens, d_in, requires_grad=True)
    w = torch.randn(d_out, d_in, requires_grad=True)
    y = x @ w.t()
    dy = torch.randn(tokens, d_out)
    with ByteTally() as tally:
        torch.autograd.grad(y, (x, w), dy)
    # the tally sees exactly the two backward matmuls (transposes are views and move no data)
    backward = traffic.grad_input + traffic.grad_weight
    assert (tally.read_bytes, tally.write_bytes) == (backward.read_bytes, backward.write_bytes)
    w_bytes = d_in * d_out * 4
    forward_without_w = traffic.forward.read_bytes - w_bytes
    assert traffic.total.read_bytes - forward_without_w - backward.read_bytes == w_bytes
    assert traffic.grad_weight.write_bytes == w_bytes
    accumulating = B.linear_traffic(tokens, d_in, d_out, "fp32", accumulate_grad=True)
    assert accumulating.grad_weight.read_bytes - traffic.grad_weight.read_bytes == w_bytes


def test_naive_attention_moves_seq_squared_and_tiled_does_not():
    naive = B.naive_attention_traffic(1, 1, 1024, 64, "fp32")
    tiled = B.tiled_attention_traffic(1, 1, 1024, 64, "fp32")
    assert tiled.total_bytes == 4 * 1024 * 64 * 4
    assert naive.total_bytes - tiled.total_bytes == 4 * 1024 * 1024 * 4
    # streaming K and V once per query block costs more than the ideal, linear in seq * blocks
    blocked = B.tiled_attention_traffic(1, 1, 1024, 64, "fp32", block_q=128)
    assert blocked.read_bytes == (1024 * 64 + 2 * 1024 * 64 * 8) * 4


def test_naive_attention_traffic_matches_a_tally():
    q, k, v = (torch.randn(1, 1, 33, 8) for _ in range(3))
    with ByteTally() as tally:
        s = torch.matmul(q, k.transpose(-2, -1))
        p = torch.softmax(s, dim=-1)
        torch.matmul(p, v)
    predicted = B.naive_attention_traffic(1, 1, 33, 8, "fp32")
    assert (tally.read_bytes, tally.write_bytes) == (predicted.read_bytes, predicted.write_bytes)


def test_norm_and_softmax_traffic():
    assert B.softmax_traffic(3, 5, "fp16").total_bytes == 2 * 15 * 2
    assert B.softmax_backward_traffic(3, 5, "fp16") == B.Traffic(2 * 15 * 2, 15 * 2)
    assert B.norm_traffic(3, 5, "fp32").read_bytes == (15 + 5) * 4
    assert B.norm_traffic(3, 5, "fp32", has_bias=True).read_bytes == (15 + 10) * 4
    # the statistics saved for the backward are fp32 whatever the dtype: rstd, and the mean too
    assert B.norm_traffic(3, 5, "bf16", save_stats=True).write_bytes == 15 * 2 + 3 * 4
    layernorm = B.norm_traffic(3, 5, "bf16", has_bias=True, save_stats=True)
    assert layernorm.write_bytes == 15 * 2 + 3 * 8
    assert B.rmsnorm_backward_traffic(3, 5, "bf16") == B.Traffic((30 + 5) * 2 + 3 * 4, (15 + 5) * 2)


def test_naive_softmax_traffic_matches_a_tally_of_five_eager_ops():
    x = torch.randn(7, 33)
    with ByteTally() as tally:
        row_max = x.amax(dim=-1, keepdim=True)
        num = torch.exp(x - row_max)
        num / num.sum(dim=-1, keepdim=True)
    assert B.naive_softmax_traffic(7, 33, "fp32") == B.Traffic(tally.read_bytes, tally.write_bytes)


def test_chain_traffic_fused_and_eager():
    assert B.fused_chain_traffic(10, "bf16") == B.Traffic(20, 20)
    assert B.eager_chain_traffic(10, "bf16", 3) == B.Traffic(60, 60)
    x = torch.randn(10)
    with ByteTally() as tally:
        x.cos().cos().cos()
    assert B.eager_chain_traffic(10, "fp32", 3) == B.Traffic(tally.read_bytes, tally.write_bytes)


def test_a100_ridge_and_intensity_helpers():
    a100 = hardware.A100_80GB_SXM
    n = 256
    # a square bf16 matmul of 256 is below the A100 ridge (about 153 FLOP/byte), 4096 is far above
    big = B.matmul_intensity(4096, 4096, 4096)
    assert B.matmul_intensity(n, n, n) < a100.ridge_intensity("bf16") < big
    assert B.intensity(10.0, 4) == 2.5


# --- the table of the book's operations ----------------------------------------------------------

OPS = B.op_costs()
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
    ops = B.op_costs(dtype, tokens=T, d_model=D, small_n=N, skinny_rows=m, batch=Ba,
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
    for op32, op16 in zip(B.op_costs("fp32"), OPS, strict=True):
        assert op32.flops == op16.flops and op32.traffic.total_bytes == 2 * op16.traffic.total_bytes
        assert op32.intensity == op16.intensity / 2, op32.name
        assert op32.formula == op16.formula


def test_op_costs_match_the_one_formulas_elsewhere():
    by_name = dict(zip(NAMES, OPS, strict=True))
    assert by_name["square matmul N = 4096"].intensity == B.matmul_intensity(4096, 4096, 4096)
    unary = by_name["elementwise unary (1 FLOP/element)"]
    assert unary.intensity == B.elementwise_intensity(1, "bf16")
    h100 = hardware.H100_SXM.ridge_intensity("bf16")
    assert by_name["naive attention (T = 4096)"].intensity < h100
    assert by_name["tiled attention, ideal (T = 4096)"].intensity > h100


NAN = float("nan")

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: B.intensity(-5, 10), ValueError, "flops must be >= 0, got -5"),
    (lambda: B.intensity(1.0, 0), ValueError, "bytes moved must be > 0"),
    (lambda: B.intensity(NAN, 10), ValueError, "flops must be finite"),
    (lambda: B.intensity(1.0, "10"), TypeError, "bytes moved must be a real number"),
    (lambda: B.intensity(1.0, B.Traffic(0, 0)), ValueError, "bytes moved must be > 0"),
    (lambda: B.intensity(None, 10), TypeError, "flops must be a real number"),
    (lambda: B.matmul_traffic(0, 1, 1), ValueError, "m must be a positive integer"),
    (lambda: B.matmul_traffic(1, 1, 1, "fp12"), ValueError, "unknown dtype='fp12'"),
    (lambda: B.matmul_traffic(1.0, 1, 1), TypeError, "m must be an integer"),
    (lambda: B.matmul_intensity(1, 1, -1), ValueError, "k must be a positive integer"),
    (lambda: B.matmul_intensity(1, 1, 1, None), TypeError, "dtype must be a name"),
    (lambda: B.batched_matmul_traffic(0, 1, 1, 1, shared_b=True), ValueError, "batch must be"),
    (lambda: B.batched_matmul_traffic(2, 1, 1, 1, shared_b="yes"), ValueError, "shared_b='yes'"),
    (lambda: B.elementwise_traffic(10, "fp12"), ValueError, "unknown dtype"),
    (lambda: B.elementwise_traffic(0), ValueError, "n_elements must be a positive integer"),
    (lambda: B.elementwise_traffic(10, n_inputs=0), ValueError, "n_inputs must be a positive"),
    (lambda: B.elementwise_traffic(10, n_outputs=True), TypeError, "n_outputs must be an integer"),
    (lambda: B.elementwise_intensity(-1), ValueError, "flops_per_element must be >= 0"),
    (lambda: B.elementwise_intensity(NAN), ValueError, "flops_per_element must be finite"),
    (lambda: B.elementwise_intensity(1, n_inputs=0), ValueError, "n_inputs must be a positive"),
    (lambda: B.fused_chain_traffic(-1, "fp32"), ValueError, "n_elements must be an integer >= 0"),
    (lambda: B.fused_chain_traffic(2.5, "fp32"), TypeError, "n_elements must be an integer"),
    (lambda: B.fused_chain_traffic(10, None), TypeError, "dtype must be a name"),
    (lambda: B.eager_chain_traffic(10, "fp32", -2), ValueError, "k must be an integer >= 0"),
    (lambda: B.eager_chain_traffic(10, "fp32", 1.0), TypeError, "k must be an integer"),
    (lambda: B.softmax_traffic(-2, -3), ValueError, "rows must be a positive integer, got -2"),
    (lambda: B.softmax_traffic(3, 0), ValueError, "cols must be a positive integer, got 0"),
    (lambda: B.naive_softmax_traffic(0, 3), ValueError, "rows must be a positive integer"),
    (lambda: B.softmax_backward_traffic(3, True), TypeError, "cols must be an integer, got True"),
    (lambda: B.norm_traffic(3, -5), ValueError, "cols must be a positive integer"),
    (lambda: B.norm_traffic(3, 5, has_bias="no"), ValueError, "has_bias='no'"),
    (lambda: B.norm_traffic(3, 5, save_stats=None), ValueError, "save_stats=None"),
    (lambda: B.rmsnorm_backward_traffic(0, 5), ValueError, "rows must be a positive integer"),
    (lambda: B.rmsnorm_backward_traffic(3, 5, "int4"), ValueError, "unknown dtype='int4'"),
    (lambda: B.linear_traffic(0, 1, 1), ValueError, "tokens must be a positive integer"),
    (lambda: B.linear_traffic(1, 1, 1, accumulate_grad=2), ValueError, "accumulate_grad=2"),
    (lambda: B.naive_attention_traffic(1, 1, 0, 8), ValueError, "seq must be a positive integer"),
    (lambda: B.naive_attention_traffic(1, "1", 8, 8), TypeError, "heads must be an integer"),
    (lambda: B.tiled_attention_traffic(1, 1, 8, 8, block_q=0), ValueError, "block_q must be a"),
    (lambda: B.tiled_attention_traffic(1, 1, 8, 8, block_q=1.5), TypeError, "block_q must be an"),
    (lambda: B.op_costs("fp12"), ValueError, "unknown dtype='fp12'"),
    (lambda: B.op_costs(tokens=0), ValueError, "tokens must be a positive integer"),
    (lambda: B.op_costs(small_n=True), TypeError, "small_n must be an integer, got True"),
    (lambda: B.op_costs(attention=(1, 2, 3)), ValueError, r"attention must be \(batch, heads"),
    (lambda: B.op_costs(attention=(1, 32, 0, 128)), ValueError, r"attention\[2\] must be a"),
    (lambda: B.op_costs(attention="1,2,3,4"), TypeError, "attention must be a sequence"),
    (lambda: B.Traffic(-1, 0), ValueError, "read_bytes must be an integer >= 0"),
    (lambda: B.Traffic(0, 2.5), TypeError, "write_bytes must be an integer"),
    (lambda: B.OpCost("op", 10, 100, "1/b"), TypeError, "traffic must be a Traffic, got int"),
    (lambda: B.OpCost("op", -10, B.Traffic(1, 1), "1/b"), ValueError, "flops must be an integer"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_before_any_work(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_adamw_traffic_reads_four_tensors_and_writes_three():
    t = B.adamw_traffic(1000, "fp32")
    assert (t.read_bytes, t.write_bytes) == (16_000, 12_000)
    assert B.adamw_traffic(10, "bf16").total_bytes == 7 * 2 * 10
    with pytest.raises(ValueError, match="n_params must be a positive integer"):
        B.adamw_traffic(0)
