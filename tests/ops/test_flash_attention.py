"""FlashAttention-2 in PyTorch (`mlsys.ops.flash_attention`, `FlashAttentionTorch`) against the
float64 reference on random irregular shapes, forward (O, L) and backward; every tiling; what it
saves; argument checks."""

import pytest
import torch
from attention_cases import check_case, random_cases
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from mlsys.counters import SavedTensors
from mlsys.ops.attention import attention, causal_mask
from mlsys.ops.flash_attention import (
    FlashAttentionTorch,
    flash_attention_torch,
    flash_attention_torch_backward,
)


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


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


def test_the_backward_checks_o_l_and_do_before_any_work():
    q, k, v = _randn(2, 5, 8, seed=1), _randn(2, 7, 8, seed=2), _randn(2, 7, 4, seed=3)
    out, lse = flash_attention_torch(q, k, v)
    do = torch.ones_like(out)
    grads = flash_attention_torch_backward(q, k, v, out, lse, do)  # the right shapes run
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    for args, error, message in [
        ((out, lse[..., None], do), ValueError,
         r"lse must have shape \(2, 5\) \(one log-sum-exp per query.*got \(2, 5, 1\)"),
        ((out, lse, torch.ones_like(q)), ValueError,
         r"grad_out must have shape \(2, 5, 4\) \(O's shape.*got \(2, 5, 8\)"),
        ((out[:, :3], lse, do), ValueError, r"out must have shape \(2, 5, 4\)"),
        ((out, lse.tolist(), do), TypeError, "lse must be a floating-point tensor, got list"),
        ((out, lse, do.long()), TypeError,
         "grad_out must be a floating-point tensor, got torch.int64"),
    ]:
        with pytest.raises(error, match=message):
            flash_attention_torch_backward(q, k, v, *args)
