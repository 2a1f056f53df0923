"""Byte-movement formulas: laws, and traffic counted on real ops by a dispatch-mode tally."""

import pytest
import torch

from mlsys import hardware
from mlsys.accounting import bytes as B
from mlsys.counters import ByteCounter as ByteTally


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
    assert B.elementwise_traffic(1001, "fp32", n_inputs=2).total_bytes == tally.read_bytes + tally.write_bytes


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
    assert traffic.total.read_bytes - (traffic.forward.read_bytes - w_bytes) - backward.read_bytes == w_bytes
    assert traffic.grad_weight.write_bytes == w_bytes
    accumulating = B.linear_traffic(tokens, d_in, d_out, "fp32", accumulate_grad=True)
    assert accumulating.grad_weight.read_bytes - traffic.grad_weight.read_bytes == w_bytes


def test_naive_attention_moves_seq_squared_and_tiled_does_not():
    naive = B.naive_attention_traffic(1, 1, 1024, 64, "fp32")
    tiled = B.tiled_attention_traffic(1, 1, 1024, 64, "fp32")
    assert tiled.total_bytes == 4 * 1024 * 64 * 4
    assert naive.total_bytes - tiled.total_bytes == 4 * 1024 * 1024 * 4
    # streaming K and V once per query block costs more than the ideal but stays linear in seq * blocks
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
    assert B.norm_traffic(3, 5, "fp32").read_bytes == (15 + 5) * 4
    assert B.norm_traffic(3, 5, "fp32", has_bias=True).read_bytes == (15 + 10) * 4


def test_a100_ridge_and_intensity_helpers():
    a100 = hardware.A100_80GB_SXM
    n = 256
    # a square bf16 matmul of 256 is below the A100 ridge (about 153 FLOP/byte), 4096 is far above
    assert B.matmul_intensity(n, n, n) < a100.ridge_intensity("bf16") < B.matmul_intensity(4096, 4096, 4096)
    with pytest.raises(ValueError, match="bytes moved must be positive"):
        B.intensity(1.0, 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: B.matmul_traffic(0, 1, 1), "m must be a positive integer"),
        (lambda: B.elementwise_traffic(10, "fp12"), "unknown dtype"),
        (lambda: B.tiled_attention_traffic(1, 1, 8, 8, block_q=0), "block_q"),
        (lambda: B.elementwise_intensity(-1), "flops_per_element"),
    ],
)
def test_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()
