"""Bytes per element of the number formats the book uses, without importing torch.

Accepts the book's short names ("fp32", "bf16", "fp8_e4m3"), torch's names ("float32", "bfloat16")
and `torch.dtype` objects (through their string form, "torch.float32"). Used in: every accounting
module; §sec-tensors-memory.
"""

from __future__ import annotations

BYTES_PER_ELEMENT: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,  # stored as fp32; only the tensor core reads 19 of the 32 bits
    "bf16": 2,
    "fp16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "bool": 1,
}

_ALIASES: dict[str, str] = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "fp8": "fp8_e4m3",
    "long": "int64",
    "int": "int32",
}


def canonical_dtype(dtype: object) -> str:
    """The book's short name for `dtype` ("fp32", "bf16", ...); ValueError for an unknown one."""
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown dtype={dtype!r}; known: {', '.join(BYTES_PER_ELEMENT)}")
    return name


def bytes_per_element(dtype: object) -> int:
    """Storage bytes of one element of `dtype` (e.g. 2 for "bf16" or torch.bfloat16)."""
    return BYTES_PER_ELEMENT[canonical_dtype(dtype)]
