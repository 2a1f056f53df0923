"""The one dtype registry of the book: short name, bytes per element, torch's name.

Every module and chapter names a dtype through this table: the accounting (bytes of a tensor, no
torch needed), the kernels and experiments (the `torch.dtype` to allocate), the precision chapter
(whose `FloatFormat` adds the bit fields). Accepted spellings: the book's short names ("fp32",
"bf16", "fp8_e4m3"), torch's names ("float32", "bfloat16"), their common aliases ("half",
"float") and `torch.dtype` objects (read through their string form, so torch is not imported).

Used in: every chapter; §sec-precision, §sec-tensors-memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    """One number format as the book stores it."""

    name: str  # the book's short name, e.g. "bf16"
    bytes: int  # storage bytes per element
    torch_name: str | None  # attribute of the torch module; None where torch has no such dtype
    aliases: tuple[str, ...] = ()


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp64", 8, "float64", ("float64", "double")),
        DType("fp32", 4, "float32", ("float32", "float")),
        # tf32 is stored as fp32: only the tensor core reads 19 of the 32 bits; no torch dtype
        DType("tf32", 4, None),
        DType("bf16", 2, "bfloat16", ("bfloat16",)),
        DType("fp16", 2, "float16", ("float16", "half")),
        DType("fp8_e4m3", 1, "float8_e4m3fn", ("float8_e4m3fn", "fp8")),
        DType("fp8_e5m2", 1, "float8_e5m2", ("float8_e5m2",)),
        DType("int64", 8, "int64", ("long",)),
        DType("int32", 4, "int32", ("int",)),
        DType("int8", 1, "int8", ()),
        DType("bool", 1, "bool", ()),
    )
}
"""Short name -> DType."""

_BY_SPELLING: dict[str, str] = {
    **{d.name: d.name for d in DTYPES.values()},
    **{alias: d.name for d in DTYPES.values() for alias in d.aliases},
}


def canonical(dtype: object) -> str:
    """The book's short name of `dtype` ("fp32", "bf16", ...); ValueError naming the known ones."""
    if isinstance(dtype, bool) or not isinstance(dtype, str) and type(dtype).__name__ != "dtype":
        raise TypeError(f"dtype must be a name such as 'bf16' or a torch.dtype, got {dtype!r}")
    spelling = str(dtype).strip().lower().removeprefix("torch.")
    if spelling not in _BY_SPELLING:
        raise ValueError(f"unknown dtype={dtype!r}; known: {', '.join(DTYPES)}")
    return _BY_SPELLING[spelling]


def bytes_per_element(dtype: object) -> int:
    """Storage bytes of one element of `dtype` (2 for "bf16" or torch.bfloat16)."""
    return DTYPES[canonical(dtype)].bytes


def torch_dtype(dtype: object) -> torch.dtype:
    """The `torch.dtype` of `dtype` (torch.bfloat16 for "bf16"); ValueError where torch has none
    (tf32)."""
    entry = DTYPES[canonical(dtype)]
    if entry.torch_name is None:
        raise ValueError(f"dtype={dtype!r} has no torch dtype "
                         "(tf32 exists only inside matrix units)")
    import torch  # heavy: the napkin math's command line imports dtypes and must stay torch-free

    return getattr(torch, entry.torch_name)
