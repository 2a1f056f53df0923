"""Where a running sum stops growing, predicted exactly and measured with torch.

A running sum `s <- round(s + a)` moves in whole ulps: inside a binade of spacing u every step
adds `round(a/u) * u`, and once `a < u/2` nothing changes. `plateau_sum` predicts a sum binade by
binade from that rule alone (exact rational arithmetic from `mlsys.numerics.precision`, no torch);
`running_sum` measures it with torch, one addition at a time. Remedies: a wider accumulator
(`sequential_sum`) and Kahan's compensated sum (`kahan_sum`), both computed on the values' device.
References: Higham, "Accuracy and Stability of Numerical Algorithms" (2002), ch. 4; Kahan (1965).
Used in: §sec-precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.numerics.precision import (
    FloatFormat,
    floor_log2,
    get_format,
    round_exact,
    round_to,
    ulp_exponent,
)

# ---------------------------------------------------------------- prediction

@dataclass(frozen=True)
class Segment:
    """`steps` consecutive additions that each add exactly `increment` (0 once the sum stalled)."""

    start: float
    increment: float
    steps: int
    ulp: float  # spacing of the accumulator at `start`

    def after(self, j: int) -> float:
        """The sum after j of the segment's additions, exactly (then rounded once to float64)."""
        j = checks.nonnegative_int(j, "j")
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
    """Predicted partial sums of `n` additions of `addend` (as stored) into an accumulator."""

    addend: float  # the addend as its format stores it (0.01 in fp16 is 0.01000213623046875)
    n: int
    accumulator: str
    segments: tuple[Segment, ...]
    stall_step: int | None  # additions that changed the sum before it stalled; None: never

    @property
    def final(self) -> float:
        return self.segments[-1].end if self.segments else 0.0

    @property
    def exact(self) -> float:
        """n * addend in exact arithmetic: the sum without rounding in the accumulator."""
        return float(self.n * Fraction(self.addend))

    def run_starting_in(self, lo: float, hi: float) -> Segment:
        """The first run of several equal additions that starts in [lo, hi); ValueError if none."""
        lo, hi = checks.number(lo, "lo"), checks.number(hi, "hi")
        for seg in self.segments:
            if lo <= seg.start < hi and seg.steps > 1:
                return seg
        raise ValueError(f"no run of equal additions starts in [{lo}, {hi})")

    def trajectory(self) -> list[float]:
        """Partial sums after 1, 2, ..., n additions."""
        return [seg.after(j) for seg in self.segments for j in range(1, seg.steps + 1)]


def plateau_value(addend: float, fmt: str | torch.dtype | FloatFormat) -> float:
    """Where a running sum of `addend` (> 0, as stored) freezes: the first power of two 2^E whose
    ulp 2^(E-m) exceeds 2*addend, i.e. 2^(floor(log2 a) + m + 2); for a = 2^p it is 2^(p + m + 1)
    (ties to even)."""
    f = get_format(fmt)
    a = Fraction(checks.positive(addend, "addend"))
    p = floor_log2(a)
    power_of_two = a == Fraction(2) ** p
    e = p + f.mantissa_bits + (1 if power_of_two else 2)
    return math.ldexp(1.0, e) if e <= f.emax else (f.max if f.finite_only else math.inf)


def plateau_sum(
    addend: float,
    n: int,
    fmt: str | torch.dtype | FloatFormat,
    addend_format: str | torch.dtype | FloatFormat | None = None,
) -> SumPrediction:
    """Predict `s <- round(s + a)` for n steps from s = 0, exactly, binade by binade.

    `a` is `addend` rounded to `addend_format` (default: the accumulator format). Inside a binade of
    spacing u, s = k*u and every step adds round(a/u)*u; the sum stalls once that is 0 (a < u/2, or
    a = u/2 with k even). The step that crosses into the next binade is rounded on its own.
    """
    f = get_format(fmt)
    n = checks.nonnegative_int(n, "n")
    addend = checks.number(addend, "addend")
    addend_f = f if addend_format is None else get_format(addend_format, name="addend_format")
    stored = round_to(addend, addend_f)
    if stored < 0:  # rounding is symmetric: predict for -a and mirror
        mirror = plateau_sum(-stored, n, f, "fp64")
        segs = tuple(Segment(-s.start, -s.increment, s.steps, s.ulp) for s in mirror.segments)
        return SumPrediction(stored, n, f.name, segs, mirror.stall_step)
    a, s, done, segments, stall = Fraction(stored), Fraction(0), 0, [], None

    def emit(start: Fraction, increment: Fraction | float, steps: int) -> None:
        u = math.ldexp(1.0, ulp_exponent(start, f)) if math.isfinite(start) else math.inf
        prev = segments[-1] if segments else None
        same = prev is not None and (prev.increment, prev.ulp, prev.end) == (
            float(increment), u, float(start))
        if same:
            segments[-1] = Segment(prev.start, prev.increment, prev.steps + steps, prev.ulp)
        else:
            segments.append(Segment(float(start), float(increment), steps, u))

    while done < n:
        new = round_exact(s + a, f) if math.isfinite(s) else s  # one exact step
        if new == s:  # nothing changes, now or ever: the plateau
            emit(s, 0.0, n - done)
            stall = done
            break
        emit(s, new - s if math.isfinite(new) else math.inf, 1)
        s, done = new, done + 1
        if not math.isfinite(s):
            continue
        k_exp = ulp_exponent(s, f)
        u = Fraction(2) ** k_exp
        k = s / u  # s = k * u, k an integer
        top = min(Fraction(2) ** (max(floor_log2(s), f.emin) + 1) / u - 1, Fraction(f.max) / u)
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
    n = checks.nonnegative_int(n, "n")
    ku = max(n - 1, 0) * get_format(fmt).unit_roundoff
    return math.inf if ku >= 1 else ku / (1 - ku)


# ---------------------------------------------------------------- measurement

def running_sum(
    addend: float,
    n: int,
    dtype: str | torch.dtype,
    accumulator_dtype: str | torch.dtype | None = None,
    *,
    explicit_cast: bool = False,
) -> Float[Tensor, " n"]:
    """Measure: add `addend` (stored in `dtype`) n times, one torch addition at a time, into a 0-d
    CPU accumulator; returns the n partial sums. `explicit_cast` converts the addend to the
    accumulator dtype before each `+=` instead of relying on type promotion."""
    n = checks.nonnegative_int(n, "n")
    addend = checks.number(addend, "addend")
    checks.choice(explicit_cast, "explicit_cast", (True, False))
    x_dtype = _arith_dtype(dtype, "dtype")
    acc_dtype = x_dtype
    if accumulator_dtype is not None:
        acc_dtype = _arith_dtype(accumulator_dtype, "accumulator_dtype")
    x = torch.tensor(addend, dtype=x_dtype)  # torch's own cast stores the addend
    acc, partial = torch.zeros((), dtype=acc_dtype), []
    for _ in range(n):
        acc += x.to(acc_dtype) if explicit_cast else x
        partial.append(acc.item())
    return torch.tensor(partial, dtype=acc_dtype)


def sequential_sum(
    values: Float[Tensor, "*batch n"], accumulator_dtype: str | torch.dtype
) -> Float[Tensor, "*batch"]:
    """Left-to-right sum over the last dim, every partial sum rounded to `accumulator_dtype`;
    computed on the values' device."""
    _check_values(values)
    acc_dtype = _arith_dtype(accumulator_dtype, "accumulator_dtype")
    acc = torch.zeros(values.shape[:-1], dtype=acc_dtype, device=values.device)
    for k in range(values.shape[-1]):
        acc += values[..., k]
    return acc


def kahan_sum(
    values: Float[Tensor, "*batch n"], dtype: str | torch.dtype
) -> Float[Tensor, "*batch"]:
    """Kahan's compensated sum over the last dim, every operation in `dtype`, on the values'
    device: the rounding error of each addition is recovered as (t - s) - y and subtracted from the
    next term (Kahan 1965)."""
    _check_values(values)
    dt = _arith_dtype(dtype, "dtype")
    x = values.to(dt)
    s = torch.zeros(x.shape[:-1], dtype=dt, device=x.device)
    c = torch.zeros_like(s)  # running compensation: what the last addition lost
    for k in range(x.shape[-1]):
        y = x[..., k] - c
        t = s + y
        c = (t - s) - y
        s = t
    return s


def _check_values(values: Tensor) -> None:
    if not isinstance(values, Tensor):
        raise TypeError(f"values must be a floating-point tensor, got {type(values).__name__}")
    if not torch.is_floating_point(values) or values.dim() == 0:
        raise TypeError(f"values must be a floating-point tensor with a last dim to sum over, "
                        f"got {values.dtype} of shape {tuple(values.shape)}")


def _arith_dtype(dtype: str | torch.dtype, argument: str) -> torch.dtype:
    """The torch dtype of a format torch can add in; ValueError naming `argument` otherwise."""
    f = get_format(dtype, name=argument)
    if f.torch_dtype is None or f.bits == 8:
        raise ValueError(f"{argument}={dtype!r}: torch has no addition in {f.name}; "
                         "use plateau_sum to predict")
    return f.dtype
