"""Floating-point formats: bit layouts, spacing (ulp), rounding, and where running sums stop growing.

A format with `e` exponent bits and `m` stored mantissa bits holds numbers `(1 + M/2^m) * 2^(E - bias)`.
Every property (max, smallest normal and subnormal, eps) follows from (e, m) and one convention: IEEE 754
formats keep the all-ones exponent for inf/NaN; "fn" formats (fp8 e4m3) have no inf, only the all-ones
pattern is NaN, and overflow saturates. `round_to` rounds exactly (rationals, ties to even), with no torch.

A running sum `s <- round(s + a)` moves in whole ulps: inside a binade of spacing u every step adds
`round(a/u) * u`, and once `a < u/2` nothing changes. `plateau_sum` predicts a sum binade by binade from
that rule alone; `running_sum` measures it with torch. References: IEEE 754-2019; Higham, "Accuracy and
Stability of Numerical Algorithms" (2002), ch. 2 and 4; Kahan (1965); Micikevicius et al. (2022) for fp8.
Used in: §sec-precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys.accounting.dtypes import canonical_dtype


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format defined by its field widths and special-value convention."""

    name: str  # the book's short name, e.g. "bf16"
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits; the significand has mantissa_bits + 1 bits
    finite_only: bool = False  # "fn": no infinities, all-ones pattern = NaN, overflow saturates to max
    torch_dtype: str | None = None  # torch's name, None where torch has no such dtype (tf32)

    def __post_init__(self) -> None:
        if self.exponent_bits < 2 or self.mantissa_bits < 1:
            raise ValueError(f"exponent_bits ({self.exponent_bits}) must be >= 2 and mantissa_bits "
                             f"({self.mantissa_bits}) >= 1")

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
        # IEEE: mantissa all ones; fn: all ones is NaN, so one step less.
        top = 2 - 2.0 ** (1 - self.mantissa_bits) if self.finite_only else 2 - 2.0**-self.mantissa_bits
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
    def dtype(self) -> torch.dtype:
        if self.torch_dtype is None:
            raise ValueError(f"{self.name} has no torch dtype (it exists only inside matrix units)")
        return getattr(torch, self.torch_dtype)


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp64", 11, 52, torch_dtype="float64"),
        FloatFormat("fp32", 8, 23, torch_dtype="float32"),
        FloatFormat("tf32", 8, 10),  # NVIDIA tensor-core input: fp32 range, fp16 precision, 19 bits
        FloatFormat("fp16", 5, 10, torch_dtype="float16"),
        FloatFormat("bf16", 8, 7, torch_dtype="bfloat16"),
        FloatFormat("fp8_e4m3", 4, 3, finite_only=True, torch_dtype="float8_e4m3fn"),
        FloatFormat("fp8_e5m2", 5, 2, torch_dtype="float8_e5m2"),
    )
}


def get_format(fmt: str | torch.dtype | FloatFormat) -> FloatFormat:
    """Look up a format by short name ("bf16"), torch name ("bfloat16") or torch dtype."""
    if isinstance(fmt, FloatFormat):
        return fmt
    try:
        return FORMATS[canonical_dtype(fmt)]
    except (ValueError, KeyError):
        raise ValueError(f"fmt={fmt!r} is not a floating-point format; known: {', '.join(FORMATS)}") from None


def format_table() -> list[dict[str, object]]:
    """One row per format: field widths and the derived range and precision (floats, Python ints)."""
    return [
        {"format": f.name, "bits": f.bits, "exponent_bits": f.exponent_bits, "mantissa_bits": f.mantissa_bits,
         "bias": f.bias, "max": f.max, "smallest_normal": f.smallest_normal,
         "smallest_subnormal": f.smallest_subnormal, "eps": f.eps, "infinities": not f.finite_only,
         "torch_dtype": f.torch_dtype or "-"}
        for f in FORMATS.values()
    ]


# ---------------------------------------------------------------- exact rounding

def _floor_log2(q: Fraction) -> int:
    """floor(log2(q)) for a rational q > 0, exactly."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    below = q.numerator < (q.denominator << e) if e >= 0 else (q.numerator << -e) < q.denominator
    return e - 1 if below else e


def _ulp_exponent(magnitude: Fraction, f: FloatFormat) -> int:
    """log2 of the spacing of `f` at `magnitude` (>= 0); constant below the smallest normal."""
    e = _floor_log2(magnitude) if magnitude > 0 else f.emin
    return max(e, f.emin) - f.mantissa_bits


def _round_exact(x: Fraction, f: FloatFormat) -> Fraction | float:
    """Round a rational to `f`, ties to even; overflow gives +-inf (IEEE) or +-max (fn, saturating)."""
    mag = abs(x)
    if mag == 0:
        return x
    k = _ulp_exponent(mag, f)
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
    (fn formats saturate inf to max, as torch's cast does)."""
    f = get_format(fmt)
    x = float(x)
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return math.copysign(f.max, x) if f.finite_only else x
    r = _round_exact(Fraction(x), f)
    return math.copysign(0.0, x) if r == 0 else float(r)


def ulp(x: float, fmt: str | torch.dtype | FloatFormat) -> float:
    """Spacing of `fmt` at magnitude |x|: 2^(max(floor(log2|x|), emin) - m)."""
    f = get_format(fmt)
    if not math.isfinite(x) or abs(x) > f.max:
        raise ValueError(f"x={x!r} is outside {f.name}'s finite range (max {f.max:g})")
    return math.ldexp(1.0, _ulp_exponent(abs(Fraction(x)), f))


@dataclass(frozen=True)
class Bits:
    """The fields of one stored number: sign, exponent field E and mantissa field M as bit strings."""

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
        """The value read back from the fields: (-1)^S * 2^(E-bias) * (1.M), or 2^emin * (0.M) subnormal."""
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
    if math.isnan(value):  # quiet NaN (IEEE) / the single NaN pattern (fn)
        mantissa = "1" * m_bits if f.finite_only else "1" + "0" * (m_bits - 1)
        return Bits(f.name, 0, "1" * e_bits, mantissa, "nan", value)
    if math.isinf(value):
        return Bits(f.name, sign, "1" * e_bits, "0" * m_bits, "inf", value)
    mag = abs(Fraction(value))
    if mag < Fraction(f.smallest_normal):
        field_e, field_m = 0, int(mag / Fraction(f.smallest_subnormal))
        kind = "zero" if mag == 0 else "subnormal"
    else:
        e = _floor_log2(mag)
        field_e, field_m = e + f.bias, int((mag / Fraction(2) ** e - 1) * 2**m_bits)
        kind = "normal"
    return Bits(f.name, sign, format(field_e, f"0{e_bits}b"), format(field_m, f"0{m_bits}b"), kind, value)


# ---------------------------------------------------------------- running sums: prediction

@dataclass(frozen=True)
class Segment:
    """`steps` consecutive additions that each add exactly `increment` (0 once the sum has stalled)."""

    start: float
    increment: float
    steps: int
    ulp: float  # spacing of the accumulator at `start`

    def after(self, j: int) -> float:
        """The sum after j of the segment's additions, exactly (then rounded once to float64)."""
        if j == 0 or self.increment == 0:
            return self.start
        if not (math.isfinite(self.start) and math.isfinite(self.increment)):
            return self.start + self.increment  # an overflow to inf, or inf staying inf
        return float(Fraction(self.start) + Fraction(self.increment) * j)

    @property
    def end(self) -> float:
        return self.after(self.steps)


@dataclass(frozen=True)
class SumPrediction:
    """Predicted partial sums of `n` additions of `addend` (as stored) into an accumulator format."""

    addend: float  # the addend as the addend format stores it (0.01 in fp16 is 0.01000213623046875)
    n: int
    accumulator: str
    segments: tuple[Segment, ...]
    stall_step: int | None  # additions that changed the sum before it stopped growing; None: never stopped

    @property
    def final(self) -> float:
        return self.segments[-1].end if self.segments else 0.0

    @property
    def exact(self) -> float:
        """n * addend in exact arithmetic: what the sum would be without rounding in the accumulator."""
        return float(self.n * Fraction(self.addend))

    def trajectory(self) -> list[float]:
        """Partial sums after 1, 2, ..., n additions."""
        return [seg.after(j) for seg in self.segments for j in range(1, seg.steps + 1)]


def plateau_value(addend: float, fmt: str | torch.dtype | FloatFormat) -> float:
    """Where a running sum of `addend` (> 0, as stored) freezes: the first power of two 2^E whose ulp
    2^(E-m) exceeds 2*addend, i.e. 2^(floor(log2 a) + m + 2); for a = 2^p it is 2^(p + m + 1) (tie to even)."""
    f = get_format(fmt)
    if not (math.isfinite(addend) and addend > 0):
        raise ValueError(f"addend={addend!r} must be a finite positive number")
    a = Fraction(addend)
    p = _floor_log2(a)
    power_of_two = a == Fraction(2) ** p
    e = p + f.mantissa_bits + (1 if power_of_two else 2)
    return math.ldexp(1.0, e) if e <= f.emax else (f.max if f.finite_only else math.inf)


def plateau_sum(addend: float, n: int, fmt: str | torch.dtype | FloatFormat,
                addend_format: str | torch.dtype | FloatFormat | None = None) -> SumPrediction:
    """Predict `s <- round(s + a)` for n steps from s = 0, exactly, binade by binade.

    `a` is `addend` rounded to `addend_format` (default: the accumulator format). Inside a binade of
    spacing u, s = k*u and every step adds round(a/u)*u; the sum stalls once that is 0 (a < u/2, or
    a = u/2 with k even). The step that crosses into the next binade is rounded on its own.
    """
    f = get_format(fmt)
    _check_count(n)
    if not math.isfinite(addend):
        raise ValueError(f"addend={addend!r} must be finite")
    stored = round_to(addend, get_format(addend_format) if addend_format is not None else f)
    if stored < 0:  # rounding is symmetric: predict for -a and mirror
        mirror = plateau_sum(-stored, n, f, "fp64")
        segs = tuple(Segment(-s.start, -s.increment, s.steps, s.ulp) for s in mirror.segments)
        return SumPrediction(stored, n, f.name, segs, mirror.stall_step)
    a, s, done, segments, stall = Fraction(stored), Fraction(0), 0, [], None

    def emit(start: Fraction, increment: Fraction | float, steps: int) -> None:
        u = math.ldexp(1.0, _ulp_exponent(start, f)) if math.isfinite(start) else math.inf
        prev = segments[-1] if segments else None
        if prev is not None and (prev.increment, prev.ulp, prev.end) == (float(increment), u, float(start)):
            segments[-1] = Segment(prev.start, prev.increment, prev.steps + steps, prev.ulp)
        else:
            segments.append(Segment(float(start), float(increment), steps, u))

    while done < n:
        new = _round_exact(s + a, f) if math.isfinite(s) else s  # one exact step
        if new == s:  # nothing changes, now or ever: the plateau
            emit(s, 0.0, n - done)
            stall = done
            break
        emit(s, new - s if math.isfinite(new) else math.inf, 1)
        s, done = new, done + 1
        if not math.isfinite(s):
            continue
        k_exp = _ulp_exponent(s, f)
        u = Fraction(2) ** k_exp
        k = s / u  # s = k * u, k an integer
        top = min(Fraction(2) ** (max(_floor_log2(s), f.emin) + 1) / u - 1, Fraction(f.max) / u)
        q, frac = divmod(a / u, 1)
        if frac == Fraction(1, 2) and k % 2 == 1:
            continue  # a tie seen from an odd k: take one exact step to reach an even k first
        delta = q + (1 if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and q % 2 == 1) else 0)
        if delta == 0:
            continue
        steps = min(n - done, int((top - k) // delta))  # stay strictly inside the binade
        if steps > 0:
            emit(s, delta * u, steps)
            s, done = s + steps * delta * u, done + steps
    return SumPrediction(stored, n, f.name, tuple(segments), stall)


def recursive_sum_error_bound(n: int, fmt: str | torch.dtype | FloatFormat) -> float:
    """Higham's bound for left-to-right summation of n terms: |error| <= gamma_(n-1) * sum|x_i|,
    gamma_k = k*u / (1 - k*u); returns gamma_(n-1) (inf once (n-1)*u >= 1)."""
    _check_count(n)
    ku = max(n - 1, 0) * get_format(fmt).unit_roundoff
    return math.inf if ku >= 1 else ku / (1 - ku)


# ---------------------------------------------------------------- running sums: measurement

def running_sum(addend: float, n: int, dtype: str | torch.dtype, accumulator_dtype: str | torch.dtype | None = None,
                *, explicit_cast: bool = False) -> Float[Tensor, " n"]:
    """Measure: add `addend` (stored in `dtype`) n times, one torch addition at a time, into a 0-d
    accumulator; returns the n partial sums. `explicit_cast` converts the addend to the accumulator
    dtype before each `+=` instead of relying on type promotion."""
    _check_count(n)
    if not math.isfinite(addend):
        raise ValueError(f"addend={addend!r} must be finite")
    x_dtype = _arith_dtype(dtype, "dtype")
    acc_dtype = x_dtype if accumulator_dtype is None else _arith_dtype(accumulator_dtype, "accumulator_dtype")
    x = torch.tensor(addend, dtype=x_dtype)  # torch's own cast stores the addend
    acc, partial = torch.zeros((), dtype=acc_dtype), []
    for _ in range(n):
        acc += x.to(acc_dtype) if explicit_cast else x
        partial.append(acc.item())
    return torch.tensor(partial, dtype=acc_dtype)


def sequential_sum(values: Float[Tensor, "*batch n"], accumulator_dtype: str | torch.dtype
                   ) -> Float[Tensor, "*batch"]:
    """Left-to-right sum over the last dim, every partial sum rounded to `accumulator_dtype`."""
    _check_values(values)
    acc_dtype = _arith_dtype(accumulator_dtype, "accumulator_dtype")
    acc = torch.zeros(values.shape[:-1], dtype=acc_dtype)
    for k in range(values.shape[-1]):
        acc += values[..., k]
    return acc


def kahan_sum(values: Float[Tensor, "*batch n"], dtype: str | torch.dtype) -> Float[Tensor, "*batch"]:
    """Kahan's compensated sum over the last dim with every operation in `dtype`: the rounding error
    of each addition is recovered as (t - s) - y and subtracted from the next term (Kahan 1965)."""
    _check_values(values)
    dt = _arith_dtype(dtype, "dtype")
    x = values.to(dt)
    s = torch.zeros(x.shape[:-1], dtype=dt)
    c = torch.zeros_like(s)  # running compensation: what the last addition lost
    for k in range(x.shape[-1]):
        y = x[..., k] - c
        t = s + y
        c = (t - s) - y
        s = t
    return s


def stochastic_round(x: Float[Tensor, "*batch"], fmt: str | torch.dtype | FloatFormat, *,
                     generator: torch.Generator) -> Float[Tensor, "*batch"]:
    """Round each element down or up to a neighbour in `fmt` with probability proportional to
    closeness, so E[result] = x. Returns float64 values that `fmt` holds exactly."""
    f = get_format(fmt)
    if not torch.is_floating_point(x):
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    x64 = x.to(torch.float64)
    mag = x64.abs()
    _, e = torch.frexp(mag)  # mag = mant * 2^e with mant in [0.5, 1): floor(log2 mag) = e - 1
    u = torch.ldexp(torch.ones_like(mag), torch.clamp(e - 1, min=f.emin) - f.mantissa_bits)
    down = torch.floor(mag / u) * u
    up_probability = (mag - down) / u
    draw = torch.rand(mag.shape, generator=generator, dtype=torch.float64)
    out = down + u * (draw < up_probability)
    out = torch.where(out > f.max, f.max if f.finite_only else math.inf, out)
    return torch.where(torch.isfinite(x64), torch.copysign(out, x64), x64)


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r} must be a non-negative integer")


def _check_values(values: Tensor) -> None:
    if not torch.is_floating_point(values) or values.dim() == 0:
        raise TypeError(f"values must be a floating-point tensor with a last dim to sum over, got "
                        f"{values.dtype} of shape {tuple(values.shape)}")


def _arith_dtype(dtype: str | torch.dtype, argument: str) -> torch.dtype:
    f = get_format(dtype)
    if f.torch_dtype is None or f.bits == 8:
        raise ValueError(f"{argument}={dtype!r}: torch has no addition in {f.name}; use plateau_sum to predict")
    return f.dtype
