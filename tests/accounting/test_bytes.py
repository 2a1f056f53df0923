"""mlsys.accounting.bytes, the byte-movement formulas: laws, and traffic counted on real ops by a
dispatch-mode tally."""

import pytest
import torch

from mlsys import hardware
from mlsys.accounting import bytes as bytes_moved
from mlsys.counters import ByteCounter as ByteTally


def test_square_matmul_intensity_is_2n_over_3_bytes():
    for n in (64, 1000, 4096):
        assert bytes_moved.matmul_intensity(n, n, n, "bf16") == pytest.approx(2 * n / (3 * 2))
        assert bytes_moved.matmul_intensity(n, n, n, "fp32") == pytest.approx(2 * n / (3 * 4))


def test_matmul_traffic_matches_a_tally_of_torch_mm():
    a, b = torch.randn(37, 53), torch.randn(53, 29)
    with ByteTally() as tally:
        torch.mm(a, b)
    assert bytes_moved.matmul_traffic(37, 29, 53, "fp32") == bytes_moved.Traffic(
        tally.read_bytes, tally.write_bytes)


def test_sharing_an_operand_raises_intensity():
    shared = bytes_moved.batched_matmul_traffic(8, 128, 128, 128, shared_b=True)
    separate = bytes_moved.batched_matmul_traffic(8, 128, 128, 128, shared_b=False)
    assert shared.total_bytes < separate.total_bytes
    one = bytes_moved.matmul_traffic(128, 128, 128)
    assert separate == bytes_moved.Traffic(*[8 * x for x in (one.read_bytes, one.write_bytes)])


def test_elementwise_intensity_is_per_byte_not_per_element():
    assert bytes_moved.elementwise_intensity(1, "fp32") == 1 / 8  # unary: read 4 B, write 4 B
    assert bytes_moved.elementwise_intensity(1, "fp32", n_inputs=2) == 1 / 12  # binary add
    assert bytes_moved.elementwise_intensity(1, "bf16") == 1 / 4
    x, y = torch.randn(1001), torch.randn(1001)
    with ByteTally() as tally:
        torch.add(x, y)
    predicted = bytes_moved.elementwise_traffic(1001, "fp32", n_inputs=2)
    assert predicted.total_bytes == tally.read_bytes + tally.write_bytes


def test_linear_layer_reads_the_weight_twice_not_three_times():
    tokens, d_in, d_out = 7, 11, 13
    traffic = bytes_moved.linear_traffic(tokens, d_in, d_out, "fp32")
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
    accumulating = bytes_moved.linear_traffic(tokens, d_in, d_out, "fp32", accumulate_grad=True)
    assert accumulating.grad_weight.read_bytes - traffic.grad_weight.read_bytes == w_bytes


def test_naive_attention_moves_seq_squared_and_tiled_does_not():
    naive = bytes_moved.naive_attention_traffic(1, 1, 1024, 64, "fp32")
    tiled = bytes_moved.tiled_attention_traffic(1, 1, 1024, 64, "fp32")
    assert tiled.total_bytes == 4 * 1024 * 64 * 4
    assert naive.total_bytes - tiled.total_bytes == 4 * 1024 * 1024 * 4
    # streaming K and V once per query block costs more than the ideal, linear in seq * blocks
    blocked = bytes_moved.tiled_attention_traffic(1, 1, 1024, 64, "fp32", block_q=128)
    assert blocked.read_bytes == (1024 * 64 + 2 * 1024 * 64 * 8) * 4


def test_naive_attention_traffic_matches_a_tally():
    q, k, v = (torch.randn(1, 1, 33, 8) for _ in range(3))
    with ByteTally() as tally:
        s = torch.matmul(q, k.transpose(-2, -1))
        p = torch.softmax(s, dim=-1)
        torch.matmul(p, v)
    predicted = bytes_moved.naive_attention_traffic(1, 1, 33, 8, "fp32")
    assert (tally.read_bytes, tally.write_bytes) == (predicted.read_bytes, predicted.write_bytes)


def test_norm_and_softmax_traffic():
    assert bytes_moved.softmax_traffic(3, 5, "fp16").total_bytes == 2 * 15 * 2
    assert bytes_moved.softmax_backward_traffic(3, 5, "fp16") == bytes_moved.Traffic(2 * 15 * 2,
                                                                                     15 * 2)
    assert bytes_moved.norm_traffic(3, 5, "fp32").read_bytes == (15 + 5) * 4
    assert bytes_moved.norm_traffic(3, 5, "fp32", has_bias=True).read_bytes == (15 + 10) * 4
    # the statistics saved for the backward are fp32 whatever the dtype: rstd, and the mean too
    assert bytes_moved.norm_traffic(3, 5, "bf16", save_stats=True).write_bytes == 15 * 2 + 3 * 4
    layernorm = bytes_moved.norm_traffic(3, 5, "bf16", has_bias=True, save_stats=True)
    assert layernorm.write_bytes == 15 * 2 + 3 * 8
    assert bytes_moved.rmsnorm_backward_traffic(3, 5, "bf16") == bytes_moved.Traffic(
        (30 + 5) * 2 + 3 * 4, (15 + 5) * 2)


def test_naive_softmax_traffic_matches_a_tally_of_five_eager_ops():
    x = torch.randn(7, 33)
    with ByteTally() as tally:
        row_max = x.amax(dim=-1, keepdim=True)
        num = torch.exp(x - row_max)
        num / num.sum(dim=-1, keepdim=True)
    assert bytes_moved.naive_softmax_traffic(7, 33, "fp32") == bytes_moved.Traffic(
        tally.read_bytes, tally.write_bytes)


def test_chain_traffic_fused_and_eager():
    assert bytes_moved.fused_chain_traffic(10, "bf16") == bytes_moved.Traffic(20, 20)
    assert bytes_moved.eager_chain_traffic(10, "bf16", 3) == bytes_moved.Traffic(60, 60)
    x = torch.randn(10)
    with ByteTally() as tally:
        x.cos().cos().cos()
    assert bytes_moved.eager_chain_traffic(10, "fp32", 3) == bytes_moved.Traffic(
        tally.read_bytes, tally.write_bytes)


def test_a100_ridge_and_intensity_helpers():
    a100 = hardware.A100_80GB_SXM
    n = 256
    # a square bf16 matmul of 256 is below the A100 ridge (about 153 FLOP/byte), 4096 is far above
    big = bytes_moved.matmul_intensity(4096, 4096, 4096)
    assert bytes_moved.matmul_intensity(n, n, n) < a100.ridge_intensity("bf16") < big
    assert bytes_moved.intensity(10.0, 4) == 2.5


NAN = float("nan")

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: bytes_moved.intensity(-5, 10), ValueError, "flops must be >= 0, got -5"),
    (lambda: bytes_moved.intensity(1.0, 0), ValueError, "bytes moved must be > 0"),
    (lambda: bytes_moved.intensity(NAN, 10), ValueError, "flops must be finite"),
    (lambda: bytes_moved.intensity(1.0, "10"), TypeError, "bytes moved must be a real number"),
    (lambda: bytes_moved.intensity(1.0, bytes_moved.Traffic(0, 0)), ValueError,
     "bytes moved must be > 0"),
    (lambda: bytes_moved.intensity(None, 10), TypeError, "flops must be a real number"),
    (lambda: bytes_moved.matmul_traffic(0, 1, 1), ValueError, "m must be a positive integer"),
    (lambda: bytes_moved.matmul_traffic(1, 1, 1, "fp12"), ValueError, "unknown dtype='fp12'"),
    (lambda: bytes_moved.matmul_traffic(1.0, 1, 1), TypeError, "m must be an integer"),
    (lambda: bytes_moved.matmul_intensity(1, 1, -1), ValueError, "k must be a positive integer"),
    (lambda: bytes_moved.matmul_intensity(1, 1, 1, None), TypeError, "dtype must be a name"),
    (lambda: bytes_moved.batched_matmul_traffic(0, 1, 1, 1, shared_b=True), ValueError,
     "batch must be"),
    (lambda: bytes_moved.batched_matmul_traffic(2, 1, 1, 1, shared_b="yes"), ValueError,
     "shared_b='yes'"),
    (lambda: bytes_moved.elementwise_traffic(10, "fp12"), ValueError, "unknown dtype"),
    (lambda: bytes_moved.elementwise_traffic(0), ValueError,
     "n_elements must be a positive integer"),
    (lambda: bytes_moved.elementwise_traffic(10, n_inputs=0), ValueError,
     "n_inputs must be a positive"),
    (lambda: bytes_moved.elementwise_traffic(10, n_outputs=True), TypeError,
     "n_outputs must be an integer"),
    (lambda: bytes_moved.elementwise_intensity(-1), ValueError, "flops_per_element must be >= 0"),
    (lambda: bytes_moved.elementwise_intensity(NAN), ValueError,
     "flops_per_element must be finite"),
    (lambda: bytes_moved.elementwise_intensity(1, n_inputs=0), ValueError,
     "n_inputs must be a positive"),
    (lambda: bytes_moved.fused_chain_traffic(-1, "fp32"), ValueError,
     "n_elements must be an integer >= 0"),
    (lambda: bytes_moved.fused_chain_traffic(2.5, "fp32"), TypeError,
     "n_elements must be an integer"),
    (lambda: bytes_moved.fused_chain_traffic(10, None), TypeError, "dtype must be a name"),
    (lambda: bytes_moved.eager_chain_traffic(10, "fp32", -2), ValueError,
     "k must be an integer >= 0"),
    (lambda: bytes_moved.eager_chain_traffic(10, "fp32", 1.0), TypeError, "k must be an integer"),
    (lambda: bytes_moved.softmax_traffic(-2, -3), ValueError,
     "rows must be a positive integer, got -2"),
    (lambda: bytes_moved.softmax_traffic(3, 0), ValueError,
     "cols must be a positive integer, got 0"),
    (lambda: bytes_moved.naive_softmax_traffic(0, 3), ValueError,
     "rows must be a positive integer"),
    (lambda: bytes_moved.softmax_backward_traffic(3, True), TypeError,
     "cols must be an integer, got True"),
    (lambda: bytes_moved.norm_traffic(3, -5), ValueError, "cols must be a positive integer"),
    (lambda: bytes_moved.norm_traffic(3, 5, has_bias="no"), ValueError, "has_bias='no'"),
    (lambda: bytes_moved.norm_traffic(3, 5, save_stats=None), ValueError, "save_stats=None"),
    (lambda: bytes_moved.rmsnorm_backward_traffic(0, 5), ValueError,
     "rows must be a positive integer"),
    (lambda: bytes_moved.rmsnorm_backward_traffic(3, 5, "int4"), ValueError,
     "unknown dtype='int4'"),
    (lambda: bytes_moved.linear_traffic(0, 1, 1), ValueError, "tokens must be a positive integer"),
    (lambda: bytes_moved.linear_traffic(1, 1, 1, accumulate_grad=2), ValueError,
     "accumulate_grad=2"),
    (lambda: bytes_moved.naive_attention_traffic(1, 1, 0, 8), ValueError,
     "seq must be a positive integer"),
    (lambda: bytes_moved.naive_attention_traffic(1, "1", 8, 8), TypeError,
     "heads must be an integer"),
    (lambda: bytes_moved.tiled_attention_traffic(1, 1, 8, 8, block_q=0), ValueError,
     "block_q must be a"),
    (lambda: bytes_moved.tiled_attention_traffic(1, 1, 8, 8, block_q=1.5), TypeError,
     "block_q must be an"),
    (lambda: bytes_moved.Traffic(-1, 0), ValueError, "read_bytes must be an integer >= 0"),
    (lambda: bytes_moved.Traffic(0, 2.5), TypeError, "write_bytes must be an integer"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_before_any_work(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_adamw_traffic_reads_four_tensors_and_writes_three():
    t = bytes_moved.adamw_traffic(1000, "fp32")
    assert (t.read_bytes, t.write_bytes) == (16_000, 12_000)
    assert bytes_moved.adamw_traffic(10, "bf16").total_bytes == 7 * 2 * 10
    with pytest.raises(ValueError, match="n_params must be a positive integer"):
        bytes_moved.adamw_traffic(0)
