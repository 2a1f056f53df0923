"""mlsys.tensors: stride arithmetic checked against PyTorch's views, shapes against torch.matmul;
and the shape annotations, checked at run time with jaxtyping + beartype.

The library only annotates (checking every call would cost time in the chapters); here each function
is wrapped with `jaxtyped(typechecker=beartype)`, so a call whose shapes disagree with the
annotation raises `jaxtyping.TypeCheckError` (a TypeError) before the body runs, and a body that
returns the wrong shape is caught on the way out. Used in: §sec-tensors-memory (chapter 02).
"""

import inspect
import itertools
import re

import pytest
import torch
from beartype import beartype
from jaxtyping import Float, TypeCheckError, jaxtyped
from torch import Tensor

from mlsys import tensors
from mlsys.tensors import (
    contiguous_strides,
    element_offset,
    flattens_to_view,
    is_contiguous,
    matmul_shape,
    merge_heads,
    shares_storage,
    split_heads,
)


def _views():
    """Views of one (4, 5, 6) storage that exercise every kind of stride: name -> tensor."""
    base = torch.arange(4 * 5 * 6, dtype=torch.float32).reshape(4, 5, 6)
    return {
        "base": base,
        "transpose": base.transpose(0, 2),
        "permute": base.permute(1, 2, 0),
        "slice_step": base[1:, ::2, 1::3],
        "select": base[2],
        "expand": torch.arange(6.0).expand(4, 5, 6),
        "unsqueeze_expand": base[:, :1, :].expand(4, 3, 6),
        "narrow_transpose": base.narrow(1, 2, 3).transpose(1, 2),
        "size_one": base[:, 3:4, :],
        "empty": base[:, 2:2, :],
        "step_1d": base[1, 2, ::2],
        "step_then_size_one": base[::2, 1:2, 3],
        "rows_with_gaps": base[1, 1:4, :4],
        "evenly_spaced_2d": base.reshape(-1)[::2].view(6, 10),  # strides (20, 2): flat, gaps
    }


@pytest.mark.parametrize("name", list(_views()))
def test_element_offset_matches_storage_offset_and_pointer_difference(name):
    view = _views()[name]
    for index in itertools.product(*(range(n) for n in view.shape)):
        predicted = element_offset(index, view.stride(), view.storage_offset())
        assert predicted == view[index].storage_offset()
        byte_distance = view[index].data_ptr() - view.untyped_storage().data_ptr()
        assert predicted * view.element_size() == byte_distance


@pytest.mark.parametrize("name", list(_views()))
def test_is_contiguous_agrees_with_torch(name):
    view = _views()[name]
    assert is_contiguous(view.shape, view.stride()) == view.is_contiguous()


@pytest.mark.parametrize("name", list(_views()))
def test_flattens_to_view_predicts_when_view_minus_one_works(name):
    view = _views()[name]
    try:
        flat = view.view(-1)
    except RuntimeError:
        works = False
    else:
        works = True
        assert flat.data_ptr() == view.data_ptr()
    assert flattens_to_view(view.shape, view.stride()) == works
    copied = view.reshape(-1).untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    assert copied == (not works)


def test_flattening_needs_more_than_contiguity_only_when_strides_are_uneven():
    assert flattens_to_view((4,), (3,)) and not is_contiguous((4,), (3,))  # a 1-D slice with a step
    assert flattens_to_view((2, 3), (6, 2)) and not is_contiguous((2, 3), (6, 2))  # stride 2
    assert not flattens_to_view((3, 2), (1, 3))  # a transpose


@pytest.mark.parametrize(
    "shape", [(), (7,), (2, 3, 4), (1, 5, 1), (3, 0, 2), (0,), (2, 1, 3, 1, 5)]
)
def test_contiguous_strides_match_a_fresh_tensor(shape):
    assert contiguous_strides(shape) == torch.empty(shape).stride()
    assert is_contiguous(shape, contiguous_strides(shape))


def test_contiguous_strides_is_the_product_of_the_later_sizes():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert element_offset((1, 2, 3), (12, 4, 1)) == 1 * 12 + 2 * 4 + 3
    assert element_offset((1, 2, 3), (12, 4, 1), storage_offset=5) == 28


MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((2, 3), (5, 3, 4)),
    ((7, 1, 2, 3), (5, 3, 4)),
    ((3,), (6, 3, 4)),
    ((6, 2, 3), (3,)),
    ((1, 2, 3), (5, 1, 3, 4)),
    ((8, 16, 64), (64, 176)),  # (batch, seq, d_model) @ (d_model, d_ff)
    ((0, 2, 3), (3, 4)),
]


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES)
def test_matmul_shape_matches_torch(a_shape, b_shape):
    product = torch.matmul(torch.ones(a_shape), torch.ones(b_shape))
    assert matmul_shape(a_shape, b_shape) == tuple(product.shape)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "message"),
    [
        ((2, 3), (4, 5), "inner dimensions differ"),
        ((3,), (4,), "inner dimensions differ"),
        ((2, 2, 3), (3, 3, 4), "do not broadcast: 2 vs 3"),
        ((), (3,), "at least 1 dimension"),
    ],
)
def test_matmul_shape_refuses_what_torch_refuses(a_shape, b_shape, message):
    with pytest.raises(RuntimeError):
        torch.matmul(torch.ones(a_shape), torch.ones(b_shape))
    with pytest.raises(ValueError, match=message):
        matmul_shape(a_shape, b_shape)


def test_split_heads_is_a_view_and_merge_heads_inverts_it():
    batch, seq, d_model, n_heads = 2, 5, 12, 3
    x = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(0))
    heads = split_heads(x, n_heads)
    assert heads.shape == (batch, n_heads, seq, d_model // n_heads)
    assert heads.data_ptr() == x.data_ptr() and not heads.is_contiguous()  # a view: new strides
    assert torch.equal(heads, x.view(batch, seq, n_heads, d_model // n_heads).transpose(1, 2))
    merged = merge_heads(heads)  # undoing the split restores the original strides: still a view
    assert torch.equal(merged, x) and merged.data_ptr() == x.data_ptr()


def test_merge_heads_copies_a_contiguous_heads_tensor():
    heads = torch.randn(2, 3, 5, 4)  # attention's output: (batch, heads, seq, d_head), contiguous
    merged = merge_heads(heads)
    assert merged.shape == (2, 5, 12)
    assert merged.untyped_storage().data_ptr() != heads.untyped_storage().data_ptr()
    assert torch.equal(merged, heads.transpose(1, 2).reshape(2, 5, 12))
    single_position = torch.randn(2, 3, 1, 4)  # seq = 1: moving heads past seq moves nothing
    assert merge_heads(single_position).data_ptr() == single_position.data_ptr()


X = torch.ones(2, 3, 10)

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: element_offset((1, 2), (4, 1, 1)), ValueError, "one per dimension"),
    (lambda: element_offset((-1, 0), (4, 1)), ValueError, r"index\[0\] must be an integer >= 0"),
    (lambda: element_offset((1.5, 0), (4, 1)), TypeError, r"index\[0\] must be an integer"),
    (lambda: element_offset((1, 0), (4, 1), storage_offset=-2), ValueError, "storage_offset"),
    (lambda: element_offset((1, 0), (4, 1), storage_offset=True), TypeError,
     "storage_offset must be an integer, got True"),
    (lambda: element_offset((1, 0), (4, 1), 1.5), TypeError, "storage_offset must be an integer"),
    (lambda: element_offset(3, (4,)), TypeError, "index must be a sequence"),
    (lambda: element_offset((0,), "1"), TypeError, "strides must be a sequence"),
    (lambda: element_offset((0,), (-1,)), ValueError, r"strides\[0\] must be an integer >= 0"),
    (lambda: contiguous_strides((2, -1)), ValueError, r"shape\[1\] must be an integer >= 0"),
    (lambda: contiguous_strides("abc"), TypeError, "shape must be a sequence of integers"),
    (lambda: contiguous_strides((True, 2)), TypeError, r"shape\[0\] must be an integer, got True"),
    (lambda: is_contiguous((2, 3), (3,)), ValueError, "one per dimension"),
    (lambda: is_contiguous((2, 3), None), TypeError, "strides must be a sequence"),
    (lambda: flattens_to_view((2, 3), (3, 1, 1)), ValueError, "one per dimension"),
    (lambda: flattens_to_view((2.0, 3), (3, 1)), TypeError, r"shape\[0\] must be an integer"),
    (lambda: matmul_shape((2, 3.0), (3,)), TypeError, r"a_shape\[1\] must be an integer"),
    (lambda: matmul_shape(None, (3,)), TypeError, "a_shape must be a sequence"),
    (lambda: matmul_shape((2, 3), (3, -4)), ValueError, r"b_shape\[1\] must be an integer >= 0"),
    (lambda: split_heads(X, 4), ValueError, r"d_model \(10\) is not divisible by n_heads \(4\)"),
    (lambda: split_heads(torch.ones(2, 10), 2), ValueError, r"shape \(batch, seq, d_model\)"),
    (lambda: split_heads(X, 0), ValueError, "n_heads must be a positive integer"),
    (lambda: split_heads(X, True), TypeError, "n_heads must be an integer, got True"),
    (lambda: split_heads(X, 2.0), TypeError, "n_heads must be an integer"),
    (lambda: split_heads([[1.0]], 1), TypeError, "x must be a torch.Tensor, got list"),
    (lambda: merge_heads(torch.ones(2, 3, 4)), ValueError, r"shape \(batch, heads, seq, d_head\)"),
    (lambda: merge_heads("x"), TypeError, "x must be a torch.Tensor, got str"),
    (lambda: shares_storage(X, [1, 2]), TypeError, "must be tensors"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_bad_input_names_the_argument_and_the_rule(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_shares_storage():
    x = torch.arange(12.0).view(3, 4)
    assert shares_storage(x.t(), x) and shares_storage(x[1:], x)
    assert not shares_storage(x.t().contiguous(), x) and not shares_storage(x.clone(), x)
    with pytest.raises(TypeError, match="must be tensors"):
        shares_storage(x, [1, 2])


# --- shape annotations, checked at run time -------------------------------------------------------

# The book's dimension vocabulary (DESIGN.md §3, notation page).
VOCABULARY = {"batch", "seq", "d_model", "heads", "d_head", "d_ff", "vocab"}


def checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def _randn(*shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_split_and_merge_heads_accept_consistent_shapes():
    x = _randn(2, 5, 12)  # (batch, seq, d_model)
    heads = checked(tensors.split_heads)(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert checked(tensors.merge_heads)(heads).shape == (2, 5, 12)


@pytest.mark.parametrize(
    "bad",
    [
        torch.ones(5, 12),  # rank 2: no batch dimension
        torch.ones(2, 5, 12, dtype=torch.int64),  # not a floating-point tensor
    ],
)
def test_split_heads_rejects_a_wrong_rank_or_dtype_before_running(bad):
    with pytest.raises(TypeCheckError, match="parameter 'x'"):
        checked(tensors.split_heads)(bad, 3)


def test_a_wrong_return_shape_is_caught():
    @jaxtyped(typechecker=beartype)
    def forgets_to_transpose(
        x: Float[Tensor, "batch seq d_model"],
    ) -> Float[Tensor, "seq batch d_model"]:
        return x  # the bug: shape (batch, seq, d_model) returned as (seq, batch, d_model)

    with pytest.raises(TypeCheckError, match="return"):
        forgets_to_transpose(_randn(2, 5, 12))
    assert forgets_to_transpose(_randn(3, 3, 12)).shape == (3, 3, 12)  # square: the bug is unseen


def _dimension_names(fn) -> set[str]:
    names = set()
    for annotation in inspect.get_annotations(fn, eval_str=True).values():
        if hasattr(annotation, "dim_str"):
            names |= set(re.findall(r"[A-Za-z_]\w*", annotation.dim_str))
    return names


def test_mlsys_tensors_uses_the_book_vocabulary():
    functions = inspect.getmembers(tensors, inspect.isfunction)
    public = [fn for name, fn in functions if not name.startswith("_")]
    annotated = [fn for fn in public if _dimension_names(fn)]
    assert {fn.__name__ for fn in annotated} == {"split_heads", "merge_heads"}
    for fn in annotated:
        assert _dimension_names(fn) <= VOCABULARY, (fn.__name__, _dimension_names(fn) - VOCABULARY)
