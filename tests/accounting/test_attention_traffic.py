"""mlsys.accounting.attention_traffic: the naive forward and backward op by op (against
`ByteCounter`), the tiled forward and backward by hand and against chapter 04's formulas,
the IO bound of Dao et al. (Theorem 2), the seed formulas kept for the page's corrections, and
the argument checks.
"""

import math

import pytest
import torch

from mlsys.accounting import attention_traffic
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting.bytes import Traffic
from mlsys.counters import ByteCounter
from mlsys.models.attention import naive_causal_attention


def _randn(*shape, seed=0, dtype=torch.float32):
    """Inputs of the backward tests: drawn in fp32, cast, requiring grad."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x.to(dtype).requires_grad_()


def _plain_randn(*shape, seed=0, dtype=torch.float64):
    """Inputs of the forward test: drawn in `dtype`, no grad."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- the naive forward and backward ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_naive_traffic_is_what_the_byte_counter_sees_op_by_op(dtype):
    batch, heads, n, d = 2, 3, 11, 16
    q, k, v = (_plain_randn(batch, heads, n, d, seed=i, dtype=dtype) for i in range(3))
    with ByteCounter() as counter:
        naive_causal_attention(q, k, v)
    ops = attention_traffic.naive_attention_ops(batch, heads, n, n, d, dtype, causal=True)
    seen = {op.op: [] for op in counter.ops}
    for op in counter.ops:
        seen[op.op].append(bytes_moved.Traffic(op.read_bytes, op.write_bytes))
    assert seen == {"bmm": [ops["scores"], ops["values"]], "div": [ops["scale"]],
                    "ones": [bytes_moved.Traffic(0, n * n)],
                    "triu": [bytes_moved.Traffic(n * n, n * n)],
                    "masked_fill": [ops["masked"]], "_softmax": [ops["softmax"]]}
    # ones + triu: the bool mask, 1 B each
    assert ops["mask"] == bytes_moved.Traffic(n * n, 2 * n * n)
    total = attention_traffic.naive_attention_forward_traffic(batch, heads, n, n, d, dtype,
                                                              causal=True)
    assert total.total_bytes == counter.total_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_naive_backward_is_what_the_byte_counter_sees_op_by_op(dtype):
    batch, heads, n, d = 2, 3, 11, 16
    q, k, v = (_randn(batch, heads, n, d, seed=i, dtype=dtype) for i in range(3))
    out = naive_causal_attention(q, k, v)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    with ByteCounter() as counter:
        torch.autograd.grad(out, (q, k, v), grad_out)
    ops = attention_traffic.naive_attention_backward_ops(batch, heads, n, n, d, dtype, causal=True)
    seen = [(op.op, Traffic(op.read_bytes, op.write_bytes)) for op in counter.ops]
    assert seen == [("bmm", ops["dv"]), ("bmm", ops["dp"]), ("_softmax_backward_data",
                    ops["softmax"]), ("masked_fill", ops["masked"]), ("div", ops["scale"]),
                    ("bmm", ops["dq"]), ("bmm", ops["dk"])]
    total = attention_traffic.naive_attention_backward_traffic(batch, heads, n, n, d, dtype,
                                                               causal=True)
    assert total.total_bytes == counter.total_bytes


def test_naive_backward_without_a_mask_has_no_masked_op():
    batch, heads, n, d = 1, 2, 7, 8
    q, k, v = (_randn(batch, heads, n, d, seed=i) for i in range(3))
    probs = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(dim=-1)  # not causal
    out = probs @ v
    grad_out = torch.ones_like(out)
    with ByteCounter() as counter:
        torch.autograd.grad(out, (q, k, v), grad_out)
    total = attention_traffic.naive_attention_backward_traffic(batch, heads, n, n, d, "fp32")
    assert total.total_bytes == counter.total_bytes
    assert list(attention_traffic.naive_attention_backward_ops(1, 1, 3, 3, 8)) == [
        "dv", "dp", "softmax", "scale", "dq", "dk"]


@pytest.mark.parametrize(("n_q", "n_k"), [(5, 5), (3, 8), (8, 3)])
def test_naive_backward_closed_form(n_q, n_k):
    batch, heads, d, b = 2, 3, 16, 2
    bh = batch * heads
    for causal, reads, writes in ((False, 6, 3), (True, 7, 4)):  # n_q x n_k matrices moved
        got = attention_traffic.naive_attention_backward_traffic(batch, heads, n_q, n_k, d, "bf16",
                                                                 causal=causal)
        mask = n_q * n_k if causal else 0
        assert got.read_bytes == b * bh * (reads * n_q * n_k + (3 * n_q + 2 * n_k) * d) + mask
        assert got.write_bytes == b * bh * (writes * n_q * n_k + (n_q + 2 * n_k) * d)
        matrices = 11 if causal else 9
        assert got.total_bytes == b * bh * (matrices * n_q * n_k + 4 * (n_q + n_k) * d) + mask


# --- the tiled forward and backward, the IO bound -------------------------------------------------


def test_tiled_traffic_by_hand_and_against_the_chapter_04_formulas():
    # n = 40, d = 16, fp32, 16 x 16 tiles: 3 query tiles; causal they read 16, 32 and 40 keys
    qo, lse = 40 * 16 * 4, 40 * 4
    full = attention_traffic.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16,
                                                   block_k=16)
    assert (full.read_bytes, full.write_bytes) == (qo + 2 * 3 * 40 * 16 * 4, qo + lse)
    causal = attention_traffic.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16,
                                                     block_k=16, causal=True)
    assert causal.read_bytes == qo + 2 * (16 + 32 + 40) * 16 * 4
    # key tiles of 32: the first query tile still loads a whole tile of 32 keys (masked)
    wide_k = attention_traffic.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16,
                                                     block_k=32, causal=True)
    assert wide_k.read_bytes == qo + 2 * (32 + 32 + 40) * 16 * 4
    # backward, separate dQ: D (read O, dO; write D) + dK/dV + dQ, rows of q, dO, L, D = 136 B
    row = 2 * 16 * 4 + 2 * 4
    back = attention_traffic.flash_backward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16,
                                                    block_k=16, causal=True)
    kv = 2 * 40 * 16 * 4
    dkdv_rows = 40 + 24 + 8  # key tiles at 0, 16, 32: query rows from 0, 16, 32
    assert back.read_bytes == (2 * qo) + (kv + dkdv_rows * row) + (40 * row + 2 * 88 * 16 * 4)
    assert back.write_bytes == lse + kv + qo
    atomic = attention_traffic.flash_backward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16,
                                                      block_k=16, causal=True,
                                                      strategy="atomic_dq")
    assert atomic.read_bytes == 2 * qo + kv + dkdv_rows * row + dkdv_rows * 16 * 4 + qo
    assert atomic.write_bytes == lse + kv + qo + dkdv_rows * 16 * 4 + qo  # zero, add, convert
    # chapter 04's non-causal formulas (no L; scale folded into the first matmul)
    for n, block in [(40, 16), (4096, 128)]:
        ours = attention_traffic.flash_forward_traffic(2, 4, n, n, 64, "bf16", block_q=block,
                                                       block_k=32)
        assert ours.total_bytes - 2 * 4 * n * 4 == bytes_moved.tiled_attention_traffic(
            2, 4, n, 64, "bf16", block_q=block).total_bytes
        naive = attention_traffic.naive_attention_ops(2, 4, n, n, 64, "bf16")
        assert (attention_traffic.naive_attention_forward_traffic(2, 4, n, n, 64,
                                                                  "bf16").total_bytes
                - naive["scale"].total_bytes) == bytes_moved.naive_attention_traffic(
                    2, 4, n, 64, "bf16").total_bytes


def test_io_complexity_follows_n2_d2_over_m():
    """Dao et al. 2022, Theorem 2: with query tiles of B_c = ceil(M / 4d) rows, the forward reads
    K and V about 4 N d / M times: 8 N^2 d^2 / M elements, plus Q, O and L."""
    for seq in (1024, 4096, 16_384):
        for d in (64, 128):
            for sram in (48 * 1024, 96 * 1024, 192 * 1024):
                m = sram // 2  # bf16 elements on chip
                if m > seq * d:
                    continue  # everything fits: the bound is stated for M <= N d
                block_r, block_c = attention_traffic.paper_block_sizes(sram, d, "bf16")
                assert block_r == min(block_c, d) and block_c == -(-m // (4 * d))
                moved = attention_traffic.flash_forward_traffic(
                    1, 1, seq, seq, d, "bf16", block_q=block_c,
                    block_k=block_r).total_bytes / 2  # elements
                kv = moved - 2 * seq * d - 2 * seq  # less Q, O and L (fp32: 2 elements each)
                bound = attention_traffic.flash_io_bound_elements(seq, d, sram, "bf16")
                # 2 N d ceil(N / B_c) = 8 N^2 d^2 / M, up to the rounding of the tiles
                assert 8 / (1 + 4 * d / m) <= kv / bound <= 8 + 2 * m / (seq * d)
    # twice the on-chip memory, half the passes over K and V
    assert attention_traffic.flash_io_bound_elements(4096, 64, 48 * 1024) == pytest.approx(
        2 * attention_traffic.flash_io_bound_elements(4096, 64, 96 * 1024))
    assert attention_traffic.standard_io_elements(4096, 64) == 4096 * 64 + 4096**2


# --- the seeds' formulas --------------------------------------------------------------------------


def test_claimed_formulas_as_written():
    batch, seq, d_model = 2, 10, 8
    assert attention_traffic.claimed_attention_layer_bytes(batch, seq, d_model) == \
        4 * batch * seq * d_model + 4 * d_model**2 + 2 * batch * seq**2
    assert attention_traffic.claimed_flash_attention_bytes(batch, seq,
                                                           d_model) == batch * seq * d_model


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attention_traffic.flash_forward_traffic(1, 1, 4, 4, 8, "fp12", block_q=4,
                                                         block_k=4),
         ValueError, "unknown dtype='fp12'"),
        (lambda: attention_traffic.flash_forward_traffic(1, 1, 4, 4, 8, block_q=4), TypeError,
         "block_k"),
        (lambda: attention_traffic.flash_backward_traffic(1, 1, 4, 4, 8, block_q=4, block_k=4,
                                                          strategy="stored_p"), ValueError,
         "strategy='stored_p' is not one of 'atomic_dq', 'separate_dq'"),
        (lambda: attention_traffic.naive_attention_ops(1, True, 4, 4, 8), TypeError,
         "heads must be an integer"),
        (lambda: attention_traffic.paper_block_sizes(100, 64, "bf16"), ValueError,
         r"sram_bytes \(100\) holds 50 elements of bf16, fewer than one row of d_head \(64\)"),
        (lambda: attention_traffic.flash_io_bound_elements(16, 64, 10**6, "bf16"), ValueError,
         "M = 500000 elements > N d = 16 [*] 64 = 1024"),
        (lambda: attention_traffic.naive_attention_backward_ops(1, 1, 4, 4, 8, causal="yes"),
         ValueError, "causal='yes' is not one of"),
        (lambda: attention_traffic.claimed_attention_layer_bytes(0, 4, 8), ValueError,
         "batch must be a positive integer"),
    ],
)
def test_cost_models_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()
