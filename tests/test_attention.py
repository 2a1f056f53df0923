"""Attention (`mlsys.models.attention`) and its cost models (`mlsys.accounting.attention`).

The reference against PyTorch's SDPA; FlashAttention-2 in PyTorch (`FlashAttentionTorch`) against
the float64 reference on random irregular shapes, forward (O, L) and backward; what it saves; the
model trained one step with each backend; FLOPs against `FlopCounterMode`, bytes against
`ByteCounter` and hand counts. `random_cases` and `check_case` are shared with
tests/test_flash_attention.py (the Triton kernels).
"""

import math
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped
from torch.nn.attention.bias import causal_lower_right
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import attention as A
from mlsys.accounting import bytes as B
from mlsys.counters import ByteCounter, SavedTensors
from mlsys.kernels._triton import ATTENTION_TOLERANCES, KERNEL_DTYPES, TOLERANCES
from mlsys.models.attention import (
    FlashAttentionTorch,
    attention,
    causal_mask,
    flash_attention_torch,
    flash_attention_torch_backward,
    naive_causal_attention,
)
from mlsys.models.config import ATTENTION_BACKENDS, TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.training import next_token_loss

LENGTHS = (1, 2, 3, 5, 7, 11, 13, 16, 17, 23, 29, 31, 32, 33, 37, 40)
"""Sequence lengths drawn: 1, primes, and around the tile sizes (never only multiples of them)."""


OFFSETS = (-17, -16, -15, -1, 1, 15, 16, 17)
"""n_k - n_q drawn: the causal diagonal just before, on and after a tile boundary."""


def random_cases(seed, count, *, head_dims, dtypes, blocks, heads=(None, 1, 2, 3)):
    """`count` seeded random cases: shapes (3-D or 4-D); n_k = n_q, any length, or n_q + an
    offset of `OFFSETS`, a third of the time each; causal or not, a dtype, tile sizes, contiguous
    or strided inputs (as `split_heads` makes them)."""
    rng = random.Random(seed)
    for i in range(count):
        n_q = rng.choice(LENGTHS)
        n_k = rng.choice((n_q, rng.choice(LENGTHS), max(1, n_q + rng.choice(OFFSETS))))
        yield dict(
            batch=rng.choice((1, 2)), heads=rng.choice(heads), n_q=n_q, n_k=n_k,
            d=rng.choice(head_dims), causal=rng.random() < 0.6, dtype=rng.choice(dtypes),
            blocks=(rng.choice(blocks), rng.choice(blocks)), strided=rng.random() < 0.3,
            seed=seed * 1000 + i)


def make_qkv(case):
    """q (batch, [heads,] n_q, d), k and v (batch, [heads,] n_k, d), requiring grad; strided
    cases are (batch, seq, heads, d) buffers seen through a transpose."""
    gen = torch.Generator().manual_seed(case["seed"])
    batch, heads, d = case["batch"], case["heads"], case["d"]
    out = []
    for n in (case["n_q"], case["n_k"], case["n_k"]):
        if case["strided"]:
            shape = (batch, n, heads, d) if heads else (n, batch, d)
            x = torch.randn(shape, generator=gen).to(case["dtype"])
            x = x.transpose(1, 2) if heads else x.transpose(0, 1)
        else:
            shape = (batch, heads, n, d) if heads else (batch, n, d)
            x = torch.randn(shape, generator=gen).to(case["dtype"])
        out.append(x.requires_grad_())
    return out


def check_case(apply, case):
    """apply(q, k, v, case) -> O of an autograd Function saving (q, k, v, O, L): O, L and the
    gradients against the float64 reference, at `ATTENTION_TOLERANCES` of the case's dtype."""
    q, k, v = make_qkv(case)
    out = apply(q, k, v, case)
    saved = out.grad_fn.saved_tensors  # the Function's ctx: exactly (q, k, v, O, L)
    assert len(saved) == 5, case
    assert [t.shape for t in saved] == [q.shape, k.shape, v.shape, out.shape, q.shape[:-1]]
    lse = saved[4]
    wide = torch.float64 if case["dtype"] == torch.float64 else torch.float32
    assert out.dtype == q.dtype and lse.dtype == wide, case
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case["seed"] + 1))
    grad_out = grad_out.to(out.dtype)  # rounded to the inputs' dtype, then the same for both
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to(out.device))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out64, lse64 = attention(q64, k64, v64, is_causal=case["causal"], return_lse=True)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), grad_out.double())
    tol = ATTENTION_TOLERANCES[case["dtype"]]
    close = torch.testing.assert_close
    close(out.double().cpu(), out64, **tol["forward"], msg=lambda m: f"O {case} {m}")
    close(lse.double().cpu(), lse64, **tol["forward"], msg=lambda m: f"L {case} {m}")
    for name, g, g64 in zip(("dq", "dk", "dv"), grads, grads64, strict=True):
        assert g.shape == g64.shape and g.dtype == q.dtype
        close(g.double(), g64, **tol["grad"], msg=lambda m, name=name: f"{name} {case} {m}")


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- the reference --------------------------------------------------------------------------------


def test_causal_convention_is_bottom_right():
    assert causal_mask(3, 5).tolist() == [[True, True, True, False, False],
                                          [True, True, True, True, False],
                                          [True, True, True, True, True]]
    assert causal_mask(4, 2).int().tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]  # 2 empty rows
    assert torch.equal(causal_mask(6, 6), torch.ones(6, 6, dtype=torch.bool).tril())
    # PyTorch's is_causal=True aligns top-left: it differs from ours when n_q != n_k
    q, k, v = _randn(1, 3, 16, seed=1), _randn(1, 5, 16, seed=2), _randn(1, 5, 16, seed=3)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(attention(q, k, v, is_causal=True), top_left)


@pytest.mark.parametrize("seed", range(4))
def test_reference_matches_sdpa_with_masks_and_leading_dims(seed):
    rng = random.Random(seed)
    for _ in range(10):
        lead = rng.choice([(), (2,), (2, 3), (1, 2, 2)])
        n_q, n_k, d = rng.choice(LENGTHS), rng.choice(LENGTHS), rng.choice((8, 16, 24))
        q, k, v = (_randn(*lead, n, d, seed=seed * 100 + i)
                   for i, n in enumerate((n_q, n_k, n_k)))
        mask = torch.rand((n_q, n_k), generator=torch.Generator().manual_seed(seed)) < 0.7
        mask[:, 0] = True  # every row attends something: SDPA's math path has no rule for empty
        out, lse = attention(q, k, v, mask, return_lse=True)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))
        if n_q <= n_k:  # no empty rows: SDPA with PyTorch's lower-right causal bias agrees
            torch.testing.assert_close(
                attention(q, k, v, is_causal=True, scale=0.3),
                F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n_q, n_k),
                                               scale=0.3))


def test_tolerances_are_defined_once_per_dtype():
    assert set(ATTENTION_TOLERANCES) == {*KERNEL_DTYPES, torch.float64}
    for dtype, tol in ATTENTION_TOLERANCES.items():
        assert tol["forward"] == TOLERANCES.get(dtype, tol["forward"])  # the kernels' own
        assert tol["grad"]["rtol"] >= tol["forward"]["rtol"] >= torch.finfo(dtype).eps / 2


def test_rows_that_attend_nothing_give_zero_and_minus_inf_and_no_gradient():
    q, k, v = (_randn(2, n, 16, seed=n).requires_grad_() for n in (7, 4, 4))
    out, lse = attention(q, k, v, is_causal=True, return_lse=True)  # rows 0..2 see no key
    assert torch.equal(out[:, :3], torch.zeros(2, 3, 16, dtype=torch.float64))
    assert torch.isneginf(lse[:, :3]).all() and torch.isfinite(lse[:, 3:]).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[:, :3], torch.zeros(2, 3, 16,
                                                                                   dtype=q.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns that n_q > n_k gives NaN; on CPU it is 0
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(7, 4))
    torch.testing.assert_close(out, sdpa.nan_to_num(0.0))
    mask = torch.ones(7, 4, dtype=torch.bool)
    mask[5] = False  # a mask row of False: the same rule
    out, lse = attention(q, k, v, mask, return_lse=True)
    assert (out[:, 5] == 0).all() and torch.isneginf(lse[:, 5]).all()


# --- FlashAttention-2 in PyTorch ------------------------------------------------------------------


def _torch_apply(q, k, v, case):
    return FlashAttentionTorch.apply(q, k, v, case["causal"], *case["blocks"])


TORCH_BLOCKS = (3, 5, 8, 16, 64)


@pytest.mark.parametrize(("seed", "dtype", "count"), [
    (1, torch.float64, 120), (2, torch.float32, 60), (3, torch.float16, 30),
    (4, torch.bfloat16, 30)])
def test_flash_torch_matches_the_float64_reference(seed, dtype, count):
    """240 random cases: irregular lengths (1, primes), n_q != n_k, causal or not, head dims 8 to
    64, tiles that divide nothing, contiguous and strided inputs; O, L, dQ, dK, dV."""
    cases = random_cases(seed, count, head_dims=(8, 16, 24, 32, 64), dtypes=(dtype,),
                         blocks=TORCH_BLOCKS)
    for case in cases:
        check_case(_torch_apply, case)


def test_flash_torch_equals_the_reference_for_every_tiling():
    q, k, v = _randn(2, 3, 29, 16, seed=1), _randn(2, 3, 31, 16, seed=2), _randn(2, 3, 31, 16,
                                                                                  seed=3)
    for causal in (False, True):
        ref, ref_lse = attention(q, k, v, is_causal=causal, return_lse=True)
        for block_q, block_k in [(1, 1), (1, 31), (29, 1), (7, 4), (100, 100)]:
            out, lse = flash_attention_torch(q, k, v, is_causal=causal, block_q=block_q,
                                             block_k=block_k)
            torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_value_dim_may_differ_and_annotations_hold_at_runtime():
    checked = lambda fn: jaxtyped(typechecker=beartype)(fn)  # noqa: E731
    q, k, v = _randn(2, 5, 16, seed=1), _randn(2, 7, 16, seed=2), _randn(2, 7, 8, seed=3)
    ref, ref_lse = checked(attention)(q, k, v, is_causal=True, return_lse=True)
    out, lse = checked(flash_attention_torch)(q, k, v, is_causal=True, block_q=2, block_k=3)
    assert out.shape == (2, 5, 8) and lse.shape == (2, 5)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    assert checked(causal_mask)(5, 7).shape == (5, 7)
    with pytest.raises(TypeCheckError):  # k's batch dims differ from q's
        checked(flash_attention_torch)(q, _randn(3, 7, 16), v)


def test_flash_torch_saves_exactly_q_k_v_o_and_l():
    q, k, v = (_randn(2, 3, n, 16, seed=n, dtype=torch.float32).requires_grad_()
               for n in (9, 9, 9))
    with SavedTensors() as saved:
        out = FlashAttentionTorch.apply(q, k, v, True)
    shapes = [(s.shape, s.dtype) for s in saved.storages]
    assert shapes == [((2, 3, 9, 16), "fp32")] * 4 + [((2, 3, 9), "fp32")]
    assert [s.saves for s in saved.storages] == [1] * 5
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out16 = FlashAttentionTorch.apply(*(x.detach().half().requires_grad_() for x in (q, k, v)),
                                          False)
    assert [t.dtype for t in packed] == [torch.float16] * 4 + [torch.float32]
    assert packed[3] is out16 or packed[3].data_ptr() == out16.data_ptr()
    out.sum().backward()  # is_causal and the tile sizes get no gradient (None)
    assert all(x.grad is not None for x in (q, k, v))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attention([1.0], torch.ones(2, 2), torch.ones(2, 2)), TypeError,
         "q must be a torch.Tensor, got list"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 5), torch.ones(3, 4)), ValueError,
         "q and k need the same last dim d"),
        (lambda: attention(torch.ones(4), torch.ones(3, 4), torch.ones(3, 4)), ValueError,
         r"q must have shape \(..., seq, d\)"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4),
                           torch.ones(2, 3)), TypeError, "mask must be a bool tensor"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4),
                           torch.ones(2, 2, dtype=torch.bool)), ValueError, "does not broadcast"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4), is_causal=1),
         TypeError, "is_causal must be True or False"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4), scale=-1.0),
         ValueError, "scale must be a positive number"),
        (lambda: flash_attention_torch(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4),
                                       block_q=0), ValueError, "block_q must be a positive"),
        (lambda: FlashAttentionTorch.apply(torch.ones(2, 4), torch.ones(2, 4), torch.ones(2, 4),
                                           True), ValueError, r"q must have shape \(batch, seq"),
        (lambda: FlashAttentionTorch.apply(torch.ones(1, 2, 4), torch.ones(1, 3, 4),
                                           torch.ones(1, 2, 4), True), ValueError,
         "k and v the number of keys"),
        (lambda: FlashAttentionTorch.apply(torch.ones(1, 2, 4), torch.ones(1, 3, 4).double(),
                                           torch.ones(1, 3, 4), True), ValueError,
         "k is torch.float64 on cpu but q is torch.float32"),
        (lambda: FlashAttentionTorch.apply(torch.ones(1, 0, 4), torch.ones(1, 3, 4),
                                           torch.ones(1, 3, 4), True), ValueError, "q is empty"),
        (lambda: FlashAttentionTorch.apply(torch.ones(1, 2, 4), torch.ones(1, 3, 4),
                                           torch.ones(1, 3, 4), "yes"), TypeError,
         "is_causal must be True or False"),
        (lambda: FlashAttentionTorch.apply(torch.ones(1, 2, 4, dtype=torch.int64),
                                           torch.ones(1, 3, 4), torch.ones(1, 3, 4), True),
         TypeError, "q must be a floating-point tensor"),
    ],
)
def test_bad_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- the model with each backend ------------------------------------------------------------------


def one_step_gradients(attention_name, dtype, *, seed=0):
    """Gradients of the next-token loss and the parameters after one SGD step, tiny model."""
    cfg = TransformerConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=2,
                            d_ff=48, attention=attention_name)
    model = Transformer(cfg)
    model.init_weights(seed=seed)
    model = model.to(dtype)
    tokens = torch.randint(cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    next_token_loss(model, tokens).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def naive_step():
    return one_step_gradients("naive", torch.float64)


@pytest.mark.parametrize("name", ["sdpa", "flash_torch"])
def test_one_training_step_gives_the_same_gradients(name, naive_step):
    grads, params = one_step_gradients(name, torch.float64)
    for which, ref in zip((grads, params), naive_step, strict=True):
        assert which.keys() == ref.keys()
        for key in ref:
            torch.testing.assert_close(which[key], ref[key], rtol=1e-10, atol=1e-12, msg=key)
    assert set(ATTENTION_BACKENDS) == {"naive", "sdpa", "flash_torch", "flash_triton"}


# --- cost models: pairs and FLOPs -----------------------------------------------------------------


@pytest.mark.parametrize("n_q", [1, 2, 5, 16, 17, 40])
@pytest.mark.parametrize("n_k", [1, 3, 16, 29, 40])
def test_score_pairs_count_the_mask(n_q, n_k):
    mask = causal_mask(n_q, n_k)
    assert A.score_pairs(n_q, n_k, causal=True) == mask.sum().item()
    assert A.score_pairs(n_q, n_k) == A.score_pairs(n_q, n_k, causal=True,
                                                    convention="dense") == n_q * n_k
    assert A.score_pairs(n_q, n_k, causal=True, convention="half") == n_q * n_k / 2
    for block_q, block_k in [(1, 1), (3, 5), (16, 16), (64, 8)]:
        # brute force: every tile holding at least one attended pair, counted whole
        tiles = 0
        for i0 in range(0, n_q, block_q):
            for j0 in range(0, n_k, block_k):
                if mask[i0:i0 + block_q, j0:j0 + block_k].any():
                    tiles += min(block_q, n_q - i0) * min(block_k, n_k - j0)
        exact = A.tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k, causal=True)
        assert exact == tiles
        assert mask.sum().item() <= exact <= n_q * n_k
        assert A.tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k) == n_q * n_k


def test_exact_causal_is_n_n_plus_1_over_2_and_half_is_the_benchmark_convention():
    n, d = 4096, 128
    assert A.score_pairs(n, n, causal=True) == n * (n + 1) // 2
    dense = A.attention_forward_flops(2, 16, n, n, d)
    assert dense == 4 * 2 * 16 * n * n * d
    assert A.attention_forward_flops(2, 16, n, n, d, causal=True, convention="half") == dense // 2
    exact = A.attention_forward_flops(2, 16, n, n, d, causal=True)
    assert exact == dense // 2 + 4 * 2 * 16 * n * d // 2  # the diagonal: N pairs more than half
    for strategy, factor in [("stored_p", 2), ("atomic_dq", 2.5), ("separate_dq", 3.5)]:
        assert A.attention_backward_flops(2, 16, n, n, d, strategy=strategy) == factor * dense


@pytest.mark.parametrize(("n_q", "n_k", "causal"), [(13, 13, True), (37, 23, True),
                                                    (23, 37, True), (29, 31, False)])
def test_flops_match_the_flop_counter(n_q, n_k, causal):
    batch, heads, d, block_q, block_k = 2, 3, 16, 8, 5
    q, k, v = (_randn(batch, heads, n, d, seed=n) for n in (n_q, n_k, n_k))
    with FlopCounterMode(display=False) as counter:
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, block_q=block_q,
                                         block_k=block_k)
    tiled = dict(block_q=block_q, block_k=block_k, causal=causal)
    assert counter.get_total_flops() == A.tiled_attention_forward_flops(
        batch, heads, n_q, n_k, d, **tiled)
    with FlopCounterMode(display=False) as counter:
        flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), is_causal=causal,
                                       block_q=block_q, block_k=block_k)
    assert counter.get_total_flops() == A.tiled_attention_backward_flops(
        batch, heads, n_q, n_k, d, **tiled, strategy="atomic_dq")
    # the naive path computes every pair, masked or not: the dense count, and 2x in backward
    if n_q == n_k:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        with FlopCounterMode(display=False) as counter:
            naive = naive_causal_attention(q, k, v)
        dense = A.attention_forward_flops(batch, heads, n_q, n_k, d, causal=True,
                                          convention="dense")
        assert counter.get_total_flops() == dense
        with FlopCounterMode(display=False) as counter:
            naive.sum().backward()
        assert counter.get_total_flops() == A.attention_backward_flops(
            batch, heads, n_q, n_k, d, causal=True, convention="dense", strategy="stored_p")


# --- cost models: bytes, the IO bound, saved tensors ----------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_naive_traffic_is_what_the_byte_counter_sees_op_by_op(dtype):
    batch, heads, n, d = 2, 3, 11, 16
    q, k, v = (_randn(batch, heads, n, d, seed=i, dtype=dtype) for i in range(3))
    with ByteCounter() as counter:
        naive_causal_attention(q, k, v)
    ops = A.naive_attention_ops(batch, heads, n, n, d, dtype, causal=True)
    seen = {op.op: [] for op in counter.ops}
    for op in counter.ops:
        seen[op.op].append(B.Traffic(op.read_bytes, op.write_bytes))
    assert seen == {"bmm": [ops["scores"], ops["values"]], "div": [ops["scale"]],
                    "ones": [B.Traffic(0, n * n)], "triu": [B.Traffic(n * n, n * n)],
                    "masked_fill": [ops["masked"]], "_softmax": [ops["softmax"]]}
    assert ops["mask"] == B.Traffic(n * n, 2 * n * n)  # ones + triu: the bool mask, 1 B each
    total = A.naive_attention_forward_traffic(batch, heads, n, n, d, dtype, causal=True)
    assert total.total_bytes == counter.total_bytes


def test_tiled_traffic_by_hand_and_against_the_chapter_04_formulas():
    # n = 40, d = 16, fp32, 16 x 16 tiles: 3 query tiles; causal they read 16, 32 and 40 keys
    qo, lse = 40 * 16 * 4, 40 * 4
    full = A.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16, block_k=16)
    assert (full.read_bytes, full.write_bytes) == (qo + 2 * 3 * 40 * 16 * 4, qo + lse)
    causal = A.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16, block_k=16,
                                     causal=True)
    assert causal.read_bytes == qo + 2 * (16 + 32 + 40) * 16 * 4
    # key tiles of 32: the first query tile still loads a whole tile of 32 keys (masked)
    wide_k = A.flash_forward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16, block_k=32,
                                     causal=True)
    assert wide_k.read_bytes == qo + 2 * (32 + 32 + 40) * 16 * 4
    # backward, separate dQ: D (read O, dO; write D) + dK/dV + dQ, rows of q, dO, L, D = 136 B
    row = 2 * 16 * 4 + 2 * 4
    back = A.flash_backward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16, block_k=16,
                                    causal=True)
    kv = 2 * 40 * 16 * 4
    dkdv_rows = 40 + 24 + 8  # key tiles at 0, 16, 32: query rows from 0, 16, 32
    assert back.read_bytes == (2 * qo) + (kv + dkdv_rows * row) + (40 * row + 2 * 88 * 16 * 4)
    assert back.write_bytes == lse + kv + qo
    atomic = A.flash_backward_traffic(1, 1, 40, 40, 16, "fp32", block_q=16, block_k=16,
                                      causal=True, strategy="atomic_dq")
    assert atomic.read_bytes == 2 * qo + kv + dkdv_rows * row + dkdv_rows * 16 * 4 + qo
    assert atomic.write_bytes == lse + kv + qo + dkdv_rows * 16 * 4 + qo  # zero, add, convert
    # chapter 04's non-causal formulas (no L; scale folded into the first matmul)
    for n, block in [(40, 16), (4096, 128)]:
        ours = A.flash_forward_traffic(2, 4, n, n, 64, "bf16", block_q=block, block_k=32)
        assert ours.total_bytes - 2 * 4 * n * 4 == B.tiled_attention_traffic(
            2, 4, n, 64, "bf16", block_q=block).total_bytes
        naive = A.naive_attention_ops(2, 4, n, n, 64, "bf16")
        assert (A.naive_attention_forward_traffic(2, 4, n, n, 64, "bf16").total_bytes
                - naive["scale"].total_bytes) == B.naive_attention_traffic(
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
                block_r, block_c = A.paper_block_sizes(sram, d, "bf16")
                assert block_r == min(block_c, d) and block_c == -(-m // (4 * d))
                moved = A.flash_forward_traffic(1, 1, seq, seq, d, "bf16", block_q=block_c,
                                                block_k=block_r).total_bytes / 2  # elements
                kv = moved - 2 * seq * d - 2 * seq  # less Q, O and L (fp32: 2 elements each)
                bound = A.flash_io_bound_elements(seq, d, sram, "bf16")
                # 2 N d ceil(N / B_c) = 8 N^2 d^2 / M, up to the rounding of the tiles
                assert 8 / (1 + 4 * d / m) <= kv / bound <= 8 + 2 * m / (seq * d)
    # twice the on-chip memory, half the passes over K and V
    assert A.flash_io_bound_elements(4096, 64, 48 * 1024) == pytest.approx(
        2 * A.flash_io_bound_elements(4096, 64, 96 * 1024))
    assert A.standard_io_elements(4096, 64) == 4096 * 64 + 4096**2


def test_saved_bytes_per_backend():
    b, h, n, d = 2, 4, 512, 64
    fused = A.attention_saved_bytes(b, h, n, n, d, "bf16", backend="flash_triton")
    assert fused == 4 * b * h * n * d * 2 + b * h * n * 4  # q, k, v, O in bf16; L in fp32
    for backend in ("sdpa", "flash_torch"):
        assert A.attention_saved_bytes(b, h, n, n, d, "bf16", backend=backend) == fused
    naive = A.attention_saved_bytes(b, h, n, n, d, "bf16", backend="naive")
    assert naive == 3 * b * h * n * d * 2 + b * h * n * n * 2 + n * n  # q, k, v, P, mask
    assert A.attention_saved_bytes(b, h, n, n, d, "bf16", backend="naive",
                                   causal=False) == naive - n * n
    assert A.attention_saved_tensors(1, 1, 3, 5, 16, "fp64", backend="sdpa")[-1] == (
        "logsumexp L", (1, 1, 3), "fp64")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: A.score_pairs(0, 3), ValueError, "n_q must be a positive integer"),
        (lambda: A.score_pairs(3, 3, causal=True, convention="quarter"), ValueError,
         "convention='quarter' is not one of 'exact', 'half', 'dense'"),
        (lambda: A.score_pairs(3, 3, causal="yes"), ValueError, "causal='yes' is not one of"),
        (lambda: A.tiled_score_pairs(3, 3, block_q=0, block_k=4), ValueError,
         "block_q must be a positive integer"),
        (lambda: A.attention_forward_flops(1, 1, 4, 4, 2.0), TypeError, "d_head must be an int"),
        (lambda: A.attention_backward_flops(1, 1, 4, 4, 8, strategy="fast"), ValueError,
         "strategy='fast' is not one of 'stored_p', 'atomic_dq', 'separate_dq'"),
        (lambda: A.flash_forward_traffic(1, 1, 4, 4, 8, "fp12", block_q=4, block_k=4),
         ValueError, "unknown dtype='fp12'"),
        (lambda: A.flash_forward_traffic(1, 1, 4, 4, 8, block_q=4), TypeError, "block_k"),
        (lambda: A.flash_backward_traffic(1, 1, 4, 4, 8, block_q=4, block_k=4,
                                          strategy="stored_p"), ValueError,
         "strategy='stored_p' is not one of 'atomic_dq', 'separate_dq'"),
        (lambda: A.naive_attention_ops(1, True, 4, 4, 8), TypeError, "heads must be an integer"),
        (lambda: A.paper_block_sizes(100, 64, "bf16"), ValueError,
         r"sram_bytes \(100\) holds 50 elements of bf16, fewer than one row of d_head \(64\)"),
        (lambda: A.flash_io_bound_elements(16, 64, 10**6, "bf16"), ValueError,
         "M = 500000 elements > N d = 16 [*] 64 = 1024"),
        (lambda: A.attention_saved_bytes(1, 1, 4, 4, 8, backend="flash"), ValueError,
         "backend='flash' is not one of 'naive', 'sdpa', 'flash_torch', 'flash_triton'"),
        (lambda: A.attention_saved_bytes(1, 1, 4, 4, 8, "fp33", backend="naive"), ValueError,
         "unknown dtype"),
    ],
)
def test_cost_models_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()
