"""A tensor is a view of a storage: (storage, shape, strides, storage_offset).

Element `index` of a tensor lives at storage position `storage_offset + sum(index[d] * strides[d])`
(strides count elements, not bytes, in PyTorch). Everything here is that one rule put to work:
`element_offset` is indexing, `contiguous_strides` and `is_contiguous` say when a tensor is laid
out row-major with no gaps, `flattens_to_view` when `.view(-1)` can avoid a copy, and
`matmul_shape` predicts the shape `torch.matmul` returns when it broadcasts over leading
dimensions. `split_heads` and `merge_heads` are the einops rearranges of multi-head attention:
splitting is a free view, merging attention's output copies.

References: PyTorch docs, "Tensor Views" and `torch.Tensor.stride`; Rogozhnikov (2022), "Einops".
Used in: §sec-tensors-memory (chapter 02).
"""

from __future__ import annotations

from collections.abc import Sequence

from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from mlsys import checks


def _layout(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """(shape, strides) as int tuples of equal length (entries >= 0)."""
    dims = checks.int_sequence(shape, "shape")
    steps = checks.int_sequence(strides, "strides")
    if len(dims) != len(steps):
        raise ValueError(f"shape has {len(dims)} entries but strides has {len(steps)}: "
                         "need one per dimension")
    return dims, steps


def _tensor(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major ("C order") strides, in elements, of a fresh tensor of `shape`.

    The last dimension has stride 1 and each earlier stride is the product of the sizes after it:
    `contiguous_strides((2, 3, 4)) == (12, 4, 1)`, what `torch.empty(2, 3, 4).stride()` returns.
    """
    strides, step = [], 1
    for size in reversed(checks.int_sequence(shape, "shape")):
        strides.append(step)
        step *= max(size, 1)  # PyTorch treats a size-0 dimension as size 1 here
    return tuple(reversed(strides))


def element_offset(index: Sequence[int], strides: Sequence[int], storage_offset: int = 0) -> int:
    """Storage position (in elements) of `tensor[index]`:
    storage_offset + sum(index[d] * strides[d]).

    Multiply by `element_size()` for bytes past the storage's start. Index entries must be
    non-negative (wrap negative ones with the size first); one entry per dimension.
    """
    idx = checks.int_sequence(index, "index")
    steps = checks.int_sequence(strides, "strides")
    if len(idx) != len(steps):
        raise ValueError(f"index has {len(idx)} entries but strides has {len(steps)}: "
                         "need one per dimension")
    start = checks.nonnegative_int(storage_offset, "storage_offset")
    return start + sum(i * s for i, s in zip(idx, steps, strict=True))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Does (shape, strides) describe a row-major layout with no gaps? PyTorch's `is_contiguous`.

    Dimensions of size 1 are ignored (their stride is never used), and a tensor with no elements
    is contiguous. A transpose, a slice with a step, or an `expand` (stride 0) breaks contiguity.
    """
    dims, steps = _layout(shape, strides)
    if 0 in dims:
        return True
    expected = 1
    for size, stride in zip(reversed(dims), reversed(steps), strict=True):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def flattens_to_view(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Can `.view(-1)` flatten (shape, strides) without a copy? Then `.reshape(-1)` is free too.

    Every dimension must step exactly over the block of the next one,
    stride[d] == stride[d+1] * size[d+1] (size-1 dimensions ignored), so that the elements in index
    order are evenly spaced in the storage. Contiguous tensors pass; so does a 1-D slice with a
    step (the one remaining stride need not be 1).
    """
    dims, steps = _layout(shape, strides)
    if 0 in dims:
        return True
    kept = [(size, stride) for size, stride in zip(dims, steps, strict=True) if size != 1]
    pairs = zip(kept[:-1], kept[1:], strict=True)
    return all(outer[1] == inner[1] * inner[0] for outer, inner in pairs)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast two batch shapes, aligned from the right; a size-1 dimension stretches."""
    out = []
    for k in range(1, max(len(a), len(b)) + 1):
        x = a[-k] if k <= len(a) else 1
        y = b[-k] if k <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ValueError(f"leading dimensions {a} and {b} do not broadcast: {x} vs {y} "
                             f"at dim -{k}")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def matmul_shape(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of `torch.matmul(a, b)`: (..., m, k) @ (..., k, n) -> (broadcast(...), m, n).

    The last two dimensions are the matrices; all earlier ("leading") dimensions broadcast against
    each other. A 1-D operand is a vector: (k,) on the left acts as (1, k), on the right as (k, 1),
    and that dimension is dropped from the result. Both 1-D: a dot product, shape ().
    """
    a = checks.int_sequence(a_shape, "a_shape")
    b = checks.int_sequence(b_shape, "b_shape")
    if not a or not b:
        raise ValueError(f"matmul needs operands with at least 1 dimension, got a_shape={a} and "
                         f"b_shape={b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions differ: a_shape {a} contracts {a2[-1]}, b_shape {b} "
                         f"contracts {b2[-2]}")
    batch, m, n = _broadcast(a2[:-2], b2[:-2]), (a2[-2],), (b2[-1],)
    return batch + (m if len(a) > 1 else ()) + (n if len(b) > 1 else ())  # a vector's 1 is dropped


def shares_storage(a: Tensor, b: Tensor) -> bool:
    """Do `a` and `b` view the same storage (so writing through one changes the other)?"""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def split_heads(
    x: Float[Tensor, "batch seq d_model"], n_heads: int
) -> Float[Tensor, "batch heads seq d_head"]:
    """(batch, seq, d_model) -> (batch, heads, seq, d_head): a view, no bytes copied.

    d_model is read as (heads, d_head) and the heads dimension moved forward; only the strides
    change.
    """
    if _tensor(x, "x").ndim != 3:
        raise ValueError(f"x must have shape (batch, seq, d_model), got {tuple(x.shape)}")
    n_heads = checks.positive_int(n_heads, "n_heads")
    if x.shape[-1] % n_heads != 0:
        raise ValueError(f"d_model ({x.shape[-1]}) is not divisible by n_heads ({n_heads})")
    return rearrange(x, "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)


def merge_heads(x: Float[Tensor, "batch heads seq d_head"]) -> Float[Tensor, "batch seq d_model"]:
    """(batch, heads, seq, d_head) -> (batch, seq, heads * d_head), the inverse of `split_heads`.

    Whether this copies depends on x's strides, not on the call: undoing `split_heads` is a free
    view, but a contiguous (batch, heads, seq, d_head) tensor, such as attention's output, must be
    copied so that (heads, d_head) become one contiguous d_model dimension.
    """
    if _tensor(x, "x").ndim != 4:
        raise ValueError(f"x must have shape (batch, heads, seq, d_head), got {tuple(x.shape)}")
    return rearrange(x, "batch heads seq d_head -> batch seq (heads d_head)")
