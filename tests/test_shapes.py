"""Shape annotations checked at run time: jaxtyping + beartype on the library's tensor functions.

The library only annotates (checking every call would cost time in the chapters); here each function
is wrapped with `jaxtyped(typechecker=beartype)`, so a call whose shapes disagree with the
annotation raises `jaxtyping.TypeCheckError` (a TypeError) before the body runs, and a body that
returns the wrong shape is caught on the way out. Used in: §sec-tensors-memory (chapter 02).
"""

import inspect
import re

import pytest
import torch
from beartype import beartype
from jaxtyping import Float, TypeCheckError, jaxtyped
from torch import Tensor

from mlsys import tensors
from mlsys.models import attention, transformer

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


def test_attention_checks_that_q_k_v_agree():
    attend = checked(attention.naive_causal_attention)
    q, k, v = _randn(2, 3, 5, 4), _randn(2, 3, 5, 4), _randn(2, 3, 5, 4)
    assert attend(q, k, v).shape == (2, 3, 5, 4)
    with pytest.raises(TypeCheckError, match="parameter 'v'"):
        attend(q, k, _randn(2, 3, 7, 4))  # seq 7 against 5
    with pytest.raises(TypeCheckError, match="parameter 'k'"):
        attend(q, _randn(1, 3, 5, 4), v)  # batch 1 against 2


def test_symbolic_dimensions_are_evaluated():
    rope = checked(transformer.apply_rope)  # cos and sin are annotated (seq, d_head//2)
    x = _randn(2, 3, 5, 8)
    assert rope(x, torch.ones(5, 4), torch.zeros(5, 4)).shape == x.shape
    with pytest.raises(TypeCheckError, match="parameter 'cos'"):
        rope(x, torch.ones(5, 8), torch.zeros(5, 8))  # d_head, not d_head // 2


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
