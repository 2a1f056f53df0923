"""Floating-point formats: bit layouts, spacing (ulp), rounding, where running sums stop growing.

A format with `e` exponent bits and `m` stored mantissa bits holds numbers
`(1 + M/2^m) * 2^(E - bias)`. Every property (max, smallest normal and subnormal, eps) follows from
(e, m) and one convention: IEEE 754 formats keep the all-ones exponent for inf/NaN; "fn" formats
(fp8 e4m3) have no inf, only exponent and mantissa all ones (S.1111.111, two encodings: one per
sign) are NaN, and overflow saturates. `round_to` rounds
exactly (rationals, ties to even), with no torch; the bit fields of a rounded number:
`mlsys.numerics.bit_fields`.

`stochastic_round` rounds up or down at random, unbiased. Running sums, which these rules decide,
are in `mlsys.numerics.summation`. References: IEEE 754-2019; Higham, "Accuracy and Stability of
Numerical Algorithms" (2002), ch. 2; Micikevicius et al. (2022) for fp8.
Used in: §sec-precision.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.dtypes import DTYPES, torch_dtype
from mlsys.dtypes import canonical as canonical_dtype


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format defined by its field widths and special-value convention."""

    name: str  # the book's short name, e.g. "bf16"
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits; the significand has mantissa_bits + 1 bits
    finite_only: bool = False  # "fn": no inf; S.1111.111 (either sign) is NaN; overflow saturates

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a FloatFormat's name must be a non-empty string, got {self.name!r}")
        checks.integer(self.exponent_bits, "exponent_bits", minimum=2)
        checks.positive_int(self.mantissa_bits, "mantissa_bits")
        checks.choice(self.finite_only, "finite_only", (True, False))

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (exponent field 1)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number: field all-ones - 1 (IEEE) or all-ones (fn)."""
        return 2**self.exponent_bits - (1 if self.finite_only else 2) - self.bias

    @property
    def max(self) -> float:
        # IEEE: mantissa all ones; fn: exponent and mantissa all ones is NaN, so one step less.
        m = self.mantissa_bits
        top = 2 - 2.0 ** (1 - m) if self.finite_only else 2 - 2.0**-m
        return math.ldexp(top, self.emax)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1 and the next number, 2^-m."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one rounding to nearest: eps / 2 (Higham's u)."""
        return self.eps / 2

    @property
    def torch_dtype(self) -> str | None:
        """torch's name for the format (from `mlsys.dtypes`), None where torch has none (tf32)."""
        return DTYPES[self.name].torch_name

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.name)


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp64", 11, 52),
        FloatFormat("fp32", 8, 23),
        FloatFormat("tf32", 8, 10),  # NVIDIA tensor-core input: fp32 range, fp16 precision, 19 bits
        FloatFormat("fp16", 5, 10),
        FloatFormat("bf16", 8, 7),
        FloatFormat("fp8_e4m3", 4, 3, finite_only=True),
        FloatFormat("fp8_e5m2", 5, 2),
    )
}


def get_format(fmt: str | torch.dtype | FloatFormat, *, name: str = "fmt") -> FloatFormat:
    """Look up a format by short name ("bf16"), torch name ("bfloat16") or torch dtype; errors
    name the argument `name`."""
    if isinstance(fmt, FloatFormat):
        return fmt
    try:
        short = canonical_dtype(fmt)
    except TypeError:
        raise TypeError(f"{name} must be a format name such as 'bf16', a torch.dtype or a "
                        f"FloatFormat, got {fmt!r}") from None
    except ValueError:
        short = None
    if short not in FORMATS:
        known = ", ".join(FORMATS)
        raise ValueError(f"{name}={fmt!r} is not a floating-point format; known: {known}")
    return FORMATS[short]


@functools.cache
def torch_fn_cast_saturates() -> bool:
    """Does this torch's cast to an fn format saturate out-of-range values at +-max, as `round_to`
    does (torch 2.13)? torch 2.11's gives NaN for |x| >= max + ulp/2 (464 in e4m3) and for +-inf.
    `saturating_cast` saturates on both. Asked of torch once, on the first call."""
    cast = torch.tensor([1000.0, -math.inf]).to(torch.float8_e4m3fn).float()
    return bool(torch.isfinite(cast).all())


def saturating_cast(x: Tensor, fmt: str | torch.dtype | FloatFormat) -> Tensor:
    """`x` cast to `fmt`'s torch dtype, rounded as `round_to` rounds: fn formats saturate at +-max
    (clamped first where this torch's cast gives NaN, see `torch_fn_cast_saturates`)."""
    f = get_format(fmt)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if f.finite_only and not torch_fn_cast_saturates():
        x = x.clamp(-f.max, f.max)  # NaN stays NaN
    return x.to(f.dtype)


def format_table() -> list[dict[str, object]]:
    """One row per format: field widths and the derived range and precision (floats and ints)."""
    return [
        {"format": f.name, "bits": f.bits, "exponent_bits": f.exponent_bits,
         "mantissa_bits": f.mantissa_bits, "bias": f.bias, "max": f.max,
         "smallest_normal": f.smallest_normal, "smallest_subnormal": f.smallest_subnormal,
         "eps": f.eps, "infinities": not f.finite_only, "torch_dtype": f.torch_dtype or "-"}
        for f in FORMATS.values()
    ]


# ---------------------------------------------------------------- exact rounding

def _fraction(q: object, name: str) -> Fraction:
    """`q` (a Fraction or an int; convert a float with Fraction(x) first) as a Fraction."""
    if isinstance(q, bool) or not isinstance(q, numbers.Rational):
        raise TypeError(f"{name} must be a Fraction or an int, got {q!r} ({type(q).__name__})")
    return Fraction(q)


def _format(f: object) -> FloatFormat:
    if not isinstance(f, FloatFormat):
        raise TypeError(f"f must be a FloatFormat (see get_format), got {f!r}")
    return f


def floor_log2(q: Fraction) -> int:
    """floor(log2(q)) for a rational q > 0, exactly."""
    q = _fraction(q, "q")
    if q <= 0:
        raise ValueError(f"q must be > 0, got {q}")
    e = q.numerator.bit_length() - q.denominator.bit_length()
    below = q.numerator < (q.denominator << e) if e >= 0 else (q.numerator << -e) < q.denominator
    return e - 1 if below else e


def ulp_exponent(magnitude: Fraction, f: FloatFormat) -> int:
    """log2 of the spacing of `f` at `magnitude` (>= 0); constant below the smallest normal."""
    magnitude, f = _fraction(magnitude, "magnitude"), _format(f)
    if magnitude < 0:
        raise ValueError(f"magnitude must be >= 0, got {magnitude}")
    e = floor_log2(magnitude) if magnitude > 0 else f.emin
    return max(e, f.emin) - f.mantissa_bits


def round_exact(x: Fraction, f: FloatFormat) -> Fraction | float:
    """Round a rational to `f`, ties to even; overflow gives +-inf (IEEE) or +-max (fn formats)."""
    x, f = _fraction(x, "x"), _format(f)
    mag = abs(x)
    if mag == 0:
        return x
    k = ulp_exponent(mag, f)
    scaled = mag / Fraction(2) ** k
    n, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and n % 2 == 1):
        n += 1  # above the midpoint, or exactly on it with an odd neighbour below: go up
    value = n * Fraction(2) ** k
    if value > f.max:
        value = Fraction(f.max) if f.finite_only else math.inf
    return value if x > 0 else -value


def round_to(x: float, fmt: str | torch.dtype | FloatFormat) -> float:
    """`x` rounded to nearest in `fmt` (ties to even), computed exactly; inf/NaN pass through
    (fn formats saturate inf to max, as torch 2.13's cast does; see `saturating_cast`)."""
    f = get_format(fmt)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"x must be a real number, got {x!r} ({type(x).__name__})")
    x = float(x)
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return math.copysign(f.max, x) if f.finite_only else x
    r = round_exact(Fraction(x), f)
    return math.copysign(0.0, x) if r == 0 else float(r)


def ulp(x: float, fmt: str | torch.dtype | FloatFormat) -> float:
    """Spacing of `fmt` at magnitude |x|: 2^(max(floor(log2|x|), emin) - m)."""
    f = get_format(fmt)
    x = checks.number(x, "x")
    if abs(x) > f.max:
        raise ValueError(f"x={x!r} is outside {f.name}'s finite range (max {f.max:g})")
    return math.ldexp(1.0, ulp_exponent(abs(Fraction(x)), f))


def stochastic_round(
    x: Float[Tensor, "*batch"], fmt: str | torch.dtype | FloatFormat, *, generator: torch.Generator
) -> Float[Tensor, "*batch"]:
    """Round each element down or up to a neighbour in `fmt` with probability proportional to
    closeness, so E[result] = x. Returns float64 values that `fmt` holds exactly, on x's device.

    The uniform draws come from `generator` on its own device (a CPU generator works for any x:
    the draws are moved to x's device), so a seed gives the same result on every device.
    """
    f = get_format(fmt)
    if not isinstance(x, Tensor) or not torch.is_floating_point(x):
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor, got {what}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    x64 = x.to(torch.float64)
    mag = x64.abs()
    _, e = torch.frexp(mag)  # mag = mant * 2^e with mant in [0.5, 1): floor(log2 mag) = e - 1
    u = torch.ldexp(torch.ones_like(mag), torch.clamp(e - 1, min=f.emin) - f.mantissa_bits)
    down = torch.floor(mag / u) * u
    up_probability = (mag - down) / u
    draw = torch.rand(mag.shape, generator=generator, dtype=torch.float64, device=generator.device)
    out = down + u * (draw.to(mag.device) < up_probability)
    out = torch.where(out > f.max, f.max if f.finite_only else math.inf, out)
    return torch.where(torch.isfinite(x64), torch.copysign(out, x64), x64)
