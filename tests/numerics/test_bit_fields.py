"""Tests for mlsys.numerics.bit_fields: the sign, exponent and mantissa fields of a value stored in
a format, against torch's own bits, and the kinds of value (normal, subnormal, zero, inf, NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from mlsys.numerics import bit_fields, precision

TORCH_FORMATS = [name for name, f in precision.FORMATS.items() if f.torch_dtype is not None]
INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _bits_of(value: float, name: str) -> int:
    f = precision.FORMATS[name]
    raw = torch.tensor([value], dtype=torch.float64).to(f.dtype).view(INT_VIEW[f.bits]).item()
    return raw % 2**f.bits


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_decompose_round_trips_and_matches_torch_bits(name):
    f = precision.FORMATS[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (300,), generator=g).double())
    values = x.tolist() + [0.0, -0.0, f.smallest_subnormal, f.smallest_normal, f.max, -f.max, 1.0]
    for v in values:
        bits = bit_fields.decompose(v, name)
        stored = precision.round_to(v, name)
        assert bits.reconstruct() == stored
        assert math.copysign(1, bits.reconstruct()) == math.copysign(1, stored)
        assert len(bits.pattern.replace(" ", "")) == f.bits
        assert int(bits.pattern.replace(" ", ""), 2) == _bits_of(stored, name)


def test_decompose_kinds():
    assert bit_fields.decompose(1.0, "fp16").pattern == "0 01111 0000000000"
    assert bit_fields.decompose(1.0, "fp16").unbiased_exponent == 0
    assert bit_fields.decompose(2**-24, "fp16").kind == "subnormal"
    assert bit_fields.decompose(1e-8, "fp16").kind == "zero"
    assert bit_fields.decompose(1e5, "fp16").kind == "inf"
    assert bit_fields.decompose(1e5, "fp16").unbiased_exponent is None
    assert bit_fields.decompose(1e5, "fp8_e4m3").value == 448.0
    assert bit_fields.decompose(math.nan, "fp8_e4m3").pattern == "0 1111 111"
    assert math.isnan(bit_fields.decompose(math.nan, "fp16").reconstruct())


INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: bit_fields.decompose(None, "fp16"), TypeError, "x must be a real number"),
    (lambda: bit_fields.decompose(1.0, "fp4"), ValueError, "fmt='fp4'"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
