"""The fields of one stored number: sign, exponent and mantissa bits, and the value they hold.

`decompose(x, fmt)` rounds x to a format of `mlsys.numerics.precision` (exactly, as `round_to`
does) and splits the stored value into its bit fields (`Bits`): the IEEE 754 layout
(-1)^S * 2^(E - bias) * 1.M, subnormals 2^emin * 0.M, and the all-ones exponent for inf and NaN
(fn formats: S.1111.111 is NaN, and there is no inf). Used in: §sec-precision,
`mlsys.numerics.norm_numerics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from mlsys.numerics.precision import FORMATS, FloatFormat, floor_log2, get_format, round_to


@dataclass(frozen=True)
class Bits:
    """The fields of one stored number: sign, exponent field E, mantissa field M (bit strings)."""

    format: str
    sign: int
    exponent: str
    mantissa: str
    kind: str  # "zero", "subnormal", "normal", "inf" or "nan"
    value: float  # the stored value (x after rounding)

    @property
    def pattern(self) -> str:
        return f"{self.sign} {self.exponent} {self.mantissa}"

    @property
    def unbiased_exponent(self) -> int | None:
        """E - bias for normal numbers, emin for subnormals and zero, None for inf/NaN."""
        f = FORMATS[self.format]
        return None if self.kind in ("inf", "nan") else max(int(self.exponent, 2), 1) - f.bias

    def reconstruct(self) -> float:
        """The value read back from the fields: (-1)^S * 2^(E-bias) * (1.M), or 2^emin * (0.M)
        for a subnormal."""
        if self.kind == "nan":
            return math.nan
        if self.kind == "inf":
            return -math.inf if self.sign else math.inf
        f = FORMATS[self.format]
        lead = 1 if self.kind == "normal" else 0
        significand = lead + Fraction(int(self.mantissa, 2), 2**f.mantissa_bits)
        return (-1) ** self.sign * float(significand * Fraction(2) ** self.unbiased_exponent)


def decompose(x: float, fmt: str | torch.dtype | FloatFormat) -> Bits:
    """Round `x` to `fmt` and split the result into sign, exponent and mantissa fields."""
    f = get_format(fmt)
    e_bits, m_bits = f.exponent_bits, f.mantissa_bits
    value = round_to(x, f)
    sign = 1 if math.copysign(1.0, value) < 0 and not math.isnan(value) else 0
    if math.isnan(value):  # quiet NaN (IEEE) / S.1111.111 with S = 0 (fn; S = 1 is NaN too)
        mantissa = "1" * m_bits if f.finite_only else "1" + "0" * (m_bits - 1)
        return Bits(f.name, 0, "1" * e_bits, mantissa, "nan", value)
    if math.isinf(value):
        return Bits(f.name, sign, "1" * e_bits, "0" * m_bits, "inf", value)
    mag = abs(Fraction(value))
    if mag < Fraction(f.smallest_normal):
        field_e, field_m = 0, int(mag / Fraction(f.smallest_subnormal))
        kind = "zero" if mag == 0 else "subnormal"
    else:
        e = floor_log2(mag)
        field_e, field_m = e + f.bias, int((mag / Fraction(2) ** e - 1) * 2**m_bits)
        kind = "normal"
    exponent, mantissa = format(field_e, f"0{e_bits}b"), format(field_m, f"0{m_bits}b")
    return Bits(f.name, sign, exponent, mantissa, kind, value)
