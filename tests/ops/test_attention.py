"""The attention reference (`mlsys.ops.attention`): the bottom-right causal convention, against
PyTorch's SDPA with masks and leading dims, rows that attend nothing, and argument checks."""

import math
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from attention_cases import LENGTHS
from torch.nn.attention.bias import causal_lower_right

from mlsys.ops.attention import attention, causal_mask, max_error, naive_attention
from mlsys.ops.flash_attention import FlashAttentionTorch


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


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
         ValueError, "scale must be a finite positive number"),
        (lambda: attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 4),
                           scale=float("inf")), ValueError,
         r"scale must be a finite positive number or None \(1/sqrt\(d\)\), got inf"),
        (lambda: attention(torch.ones(2, 5, 4), torch.ones(3, 6, 4), torch.ones(3, 6, 4)),
         ValueError, r"the batch dims \(all but the last two\) must broadcast together"),
        (lambda: causal_mask(-1, 3), ValueError, "n_q must be an integer >= 0, got -1"),
        (lambda: naive_attention(torch.ones(4), torch.ones(4), torch.ones(4)), ValueError,
         r"q must have shape \(..., seq, d\), got \(4,\)"),
        (lambda: naive_attention(torch.ones(1, 3, 4), torch.ones(1, 3, 6), torch.ones(1, 3, 6)),
         ValueError, "q and k need the same last dim d"),
        (lambda: naive_attention(*(torch.ones(1, 3, 4, dtype=torch.int64),) * 3), TypeError,
         "q must be a floating-point tensor, got dtype torch.int64"),
        (lambda: naive_attention(torch.ones(1, 3, 4), torch.ones(1, 3, 4).double(),
                                 torch.ones(1, 3, 4)), TypeError, "must share one dtype"),
        (lambda: naive_attention(torch.ones(1, 5, 4), torch.ones(1, 3, 4), torch.ones(1, 3, 4),
                                 is_causal=True), ValueError, "is_causal=True needs n_q <= n_k"),
    ],
)
def test_bad_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_naive_attention_is_the_reference_and_checks_its_flag():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 19, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(naive_attention(q, k, v, is_causal=causal),
                                   attention(q, k, v, is_causal=causal))
        # fewer queries than keys (the last ones, as when decoding): the same bottom-right rule
        torch.testing.assert_close(naive_attention(q[..., 12:, :], k, v, is_causal=causal),
                                   attention(q[..., 12:, :], k, v, is_causal=causal))
    with pytest.raises(TypeError, match="is_causal"):
        naive_attention(q, k, v, is_causal="yes")


def test_max_error_finds_a_wrong_implementation():
    gen = torch.Generator().manual_seed(2)
    shapes = ((5, 7, 8), (9, 9, 16))
    good = max_error(FlashAttentionTorch.apply, shapes, dtype=torch.float64, causal=True,
                     generator=gen)
    assert good < 1e-10

    def off_by_scale(q, k, v, causal):
        return attention(q * 1.01, k, v, is_causal=causal)

    assert max_error(off_by_scale, shapes, dtype=torch.float64, causal=True,
                     generator=gen) > 1e-3
    with pytest.raises(TypeError, match="fn must be callable"):
        max_error(3, shapes, dtype=torch.float64, causal=False, generator=gen)


def test_no_keys_at_all_is_the_documented_empty_row():
    """n_k = 0: every query attends nothing, so the module's rule gives O = 0 and L = -inf (the
    max of an empty row would be an error; no row max is taken)."""
    q = _randn(2, 3, 5, 8).requires_grad_()
    k, v = _randn(2, 3, 0, 8), _randn(2, 3, 0, 4)
    for causal in (False, True):
        out, lse = attention(q, k, v, is_causal=causal, return_lse=True)
        assert out.shape == (2, 3, 5, 4) and not out.any()
        assert lse.shape == (2, 3, 5) and torch.isneginf(lse).all()
    out.sum().backward()  # and no gradient: q had no key to be compared with
    assert not q.grad.any()
