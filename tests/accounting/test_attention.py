"""mlsys.accounting.attention: score pairs under every mask convention (against the mask, by
brute force over tiles), FLOPs against `FlopCounterMode` on the naive and tiled paths, the
bytes each backend saves for backward, and the argument checks.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import attention as attention_cost
from mlsys.models.attention import naive_causal_attention
from mlsys.ops.attention import causal_mask, naive_attention
from mlsys.ops.flash_attention import flash_attention_torch, flash_attention_torch_backward
from mlsys.profiling import memory_meter


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- pairs and FLOPs ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_q", [1, 2, 5, 16, 17, 40])
@pytest.mark.parametrize("n_k", [1, 3, 16, 29, 40])
def test_score_pairs_count_the_mask(n_q, n_k):
    mask = causal_mask(n_q, n_k)
    assert attention_cost.score_pairs(n_q, n_k, causal=True) == mask.sum().item()
    dense = attention_cost.score_pairs(n_q, n_k, causal=True, convention="dense")
    assert attention_cost.score_pairs(n_q, n_k) == dense == n_q * n_k
    assert attention_cost.score_pairs(n_q, n_k, causal=True, convention="half") == n_q * n_k / 2
    for block_q, block_k in [(1, 1), (3, 5), (16, 16), (64, 8)]:
        # brute force: every tile holding at least one attended pair, counted whole
        tiles = 0
        for i0 in range(0, n_q, block_q):
            for j0 in range(0, n_k, block_k):
                if mask[i0:i0 + block_q, j0:j0 + block_k].any():
                    tiles += min(block_q, n_q - i0) * min(block_k, n_k - j0)
        exact = attention_cost.tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k,
                                                 causal=True)
        assert exact == tiles
        assert mask.sum().item() <= exact <= n_q * n_k
        dense = attention_cost.tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k)
        assert dense == n_q * n_k


def test_exact_causal_is_n_n_plus_1_over_2_and_half_is_the_benchmark_convention():
    n, d = 4096, 128
    assert attention_cost.score_pairs(n, n, causal=True) == n * (n + 1) // 2
    dense = attention_cost.attention_forward_flops(2, 16, n, n, d)
    assert dense == 4 * 2 * 16 * n * n * d
    half = attention_cost.attention_forward_flops(2, 16, n, n, d, causal=True, convention="half")
    assert half == dense // 2
    exact = attention_cost.attention_forward_flops(2, 16, n, n, d, causal=True)
    assert exact == dense // 2 + 4 * 2 * 16 * n * d // 2  # the diagonal: N pairs more than half
    for strategy, factor in [("stored_p", 2), ("atomic_dq", 2.5), ("separate_dq", 3.5)]:
        backward = attention_cost.attention_backward_flops(2, 16, n, n, d, strategy=strategy)
        assert backward == factor * dense


@pytest.mark.parametrize(("n_q", "n_k", "causal"), [(13, 13, True), (37, 23, True),
                                                    (23, 37, True), (29, 31, False)])
def test_flops_match_the_flop_counter(n_q, n_k, causal):
    batch, heads, d, block_q, block_k = 2, 3, 16, 8, 5
    q, k, v = (_randn(batch, heads, n, d, seed=n) for n in (n_q, n_k, n_k))
    with FlopCounterMode(display=False) as counter:
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, block_q=block_q,
                                         block_k=block_k)
    tiled = dict(block_q=block_q, block_k=block_k, causal=causal)
    assert counter.get_total_flops() == attention_cost.tiled_attention_forward_flops(
        batch, heads, n_q, n_k, d, **tiled)
    with FlopCounterMode(display=False) as counter:
        flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), is_causal=causal,
                                       block_q=block_q, block_k=block_k)
    assert counter.get_total_flops() == attention_cost.tiled_attention_backward_flops(
        batch, heads, n_q, n_k, d, **tiled, strategy="atomic_dq")
    # the naive path computes every pair, masked or not: the dense count, and 2x in backward
    if n_q == n_k:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        with FlopCounterMode(display=False) as counter:
            naive = naive_causal_attention(q, k, v)
        dense = attention_cost.attention_forward_flops(batch, heads, n_q, n_k, d, causal=True,
                                                       convention="dense")
        assert counter.get_total_flops() == dense
        with FlopCounterMode(display=False) as counter:
            naive.sum().backward()
        assert counter.get_total_flops() == attention_cost.attention_backward_flops(
            batch, heads, n_q, n_k, d, causal=True, convention="dense", strategy="stored_p")


# --- saved tensors --------------------------------------------------------------------------------


def test_saved_bytes_per_backend():
    b, h, n, d = 2, 4, 512, 64
    fused = attention_cost.attention_saved_bytes(b, h, n, n, d, "bf16", backend="flash_triton")
    assert fused == 4 * b * h * n * d * 2 + b * h * n * 4  # q, k, v, O in bf16; L in fp32
    for backend in ("sdpa", "flash_torch"):
        assert attention_cost.attention_saved_bytes(b, h, n, n, d, "bf16", backend=backend) == fused
    naive = attention_cost.attention_saved_bytes(b, h, n, n, d, "bf16", backend="naive")
    assert naive == 3 * b * h * n * d * 2 + b * h * n * n * 2 + n * n  # q, k, v, P, mask
    assert attention_cost.attention_saved_bytes(b, h, n, n, d, "bf16", backend="naive",
                                                causal=False) == naive - n * n
    assert attention_cost.attention_saved_tensors(1, 1, 3, 5, 16, "fp64", backend="sdpa")[-1] == (
        "logsumexp L", (1, 1, 3), "fp64")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attention_cost.score_pairs(0, 3), ValueError, "n_q must be a positive integer"),
        (lambda: attention_cost.score_pairs(3, 3, causal=True, convention="quarter"), ValueError,
         "convention='quarter' is not one of 'exact', 'half', 'dense'"),
        (lambda: attention_cost.score_pairs(3, 3, causal="yes"), ValueError,
         "causal='yes' is not one of"),
        (lambda: attention_cost.tiled_score_pairs(3, 3, block_q=0, block_k=4), ValueError,
         "block_q must be a positive integer"),
        (lambda: attention_cost.attention_forward_flops(1, 1, 4, 4, 2.0), TypeError,
         "d_head must be an int"),
        (lambda: attention_cost.attention_backward_flops(1, 1, 4, 4, 8, strategy="fast"),
         ValueError, "strategy='fast' is not one of 'stored_p', 'atomic_dq', 'separate_dq'"),
        (lambda: attention_cost.attention_saved_bytes(1, 1, 4, 4, 8, backend="flash"), ValueError,
         "backend='flash' is not one of 'naive', 'sdpa', 'flash_torch', 'flash_triton'"),
        (lambda: attention_cost.attention_saved_bytes(1, 1, 4, 4, 8, "fp33", backend="naive"),
         ValueError, "unknown dtype"),
    ],
)
def test_cost_models_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("shape", [(2, 1, 64, 16), (3, 2, 37, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_memory_is_what_the_allocator_holds(shape, causal):
    batch, heads, n, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen)
    meter = memory_meter.meter("cpu")
    with meter.recording():
        with meter.phase("forward"):
            out = naive_attention(q, k, v, is_causal=causal)
        with meter.phase("backward"):
            out.backward(grad)
    rows = {r["phase"]: r for r in meter.rows}
    predicted = attention_cost.naive_memory(batch, heads, n, n, d, "fp32", causal=causal)
    assert rows["forward"]["live_bytes"] == predicted.before_backward_bytes
    assert rows["backward"]["peak_bytes"] == predicted.backward_peak_bytes
    assert predicted.backward_peak_bytes - predicted.before_backward_bytes == (
        2 * predicted.matrix_bytes + predicted.output_bytes)  # dP, dS and dV
