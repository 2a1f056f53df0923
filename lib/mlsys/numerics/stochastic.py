"""Stochastic rounding put to work: running sums that round-to-nearest stalls, kept unbiased.

Round to nearest sends s + a back to s whenever |a| < ulp(s)/2, at every step (chapter 01's
plateau): its error is a bias, and it grows with n. Stochastic rounding rounds s + a up to the next
number of the format with probability (s + a - down) / ulp and down otherwise
(`precision.stochastic_round`; Gupta et al. 2015, "Deep Learning with Limited Numerical
Precision"), so that E[round(s + a)] = s + a exactly. Over n steps the expected sum is therefore
start + n a, with no bias, and the rounding errors (each of mean 0 given the past, and of variance
p (1 - p) ulp^2 <= ulp^2 / 4) add up to a standard deviation of at most sqrt(n) ulp_max / 2, where
ulp_max is the spacing at the largest magnitude the sum reaches. Round to nearest is exact on
average only by luck; stochastic rounding is exact on average by construction, and pays with a
spread of about sqrt(n) half-ulps.

`stochastic_sum` runs many independent trials of one running sum at once (a vector of sums, one
`stochastic_round` per step), `nearest_sum` the same sum rounded to nearest by torch. The addend
and the start are stored in the format first (round to nearest, as a cast does): what stochastic
rounding removes is the accumulation's bias, not the addend's own representation error. Used in:
§sec-precision (a bf16 running sum, and a bf16 weight receiving updates below half its ulp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mlsys import checks
from mlsys.numerics.precision import get_format, round_to, stochastic_round, ulp

MAX_MANTISSA_BITS = 23
"""Formats up to fp32's precision: s + a of two such numbers is exact in float64 while their
exponents differ by less than 29, so the only rounding of a step is the stochastic one."""


@dataclass(frozen=True)
class StochasticSums:
    """Independent trials of start + a + a + ... (n additions) with stochastic rounding."""

    fmt: str
    start: float  # as stored in fmt
    addend: float  # as stored in fmt
    n: int
    finals: tuple[float, ...]  # each trial's last partial sum (values of fmt)
    largest: float  # the largest |partial sum| any trial reached

    @property
    def trials(self) -> int:
        return len(self.finals)

    @property
    def exact(self) -> float:
        """start + n * addend of the stored numbers, the expected value of every trial."""
        return self.start + self.n * self.addend

    @property
    def mean(self) -> float:
        return math.fsum(self.finals) / self.trials

    @property
    def std(self) -> float:
        """The spread of the trials (population standard deviation; 0 for one trial)."""
        mean = self.mean
        return math.sqrt(math.fsum((v - mean) ** 2 for v in self.finals) / self.trials)

    @property
    def std_bound(self) -> float:
        """sqrt(n) ulp(largest) / 2: what the standard deviation of one trial cannot exceed."""
        return math.sqrt(self.n) * ulp(self.largest, self.fmt) / 2

    @property
    def standard_error(self) -> float:
        """std_bound / sqrt(trials): how far the mean of the trials may stray by chance."""
        return self.std_bound / math.sqrt(self.trials)


def _format(fmt: object):
    f = get_format(fmt)
    if f.mantissa_bits > MAX_MANTISSA_BITS:
        raise ValueError(f"fmt={f.name!r} has {f.mantissa_bits} mantissa bits; stochastic sums "
                         f"here take formats of at most {MAX_MANTISSA_BITS} (fp32 and narrower)")
    return f


def _stored(value: object, name: str, f) -> float:
    stored = round_to(checks.number(value, name), f)
    if not math.isfinite(stored):
        raise ValueError(f"{name}={value!r} is not finite in {f.name} (its largest is {f.max:g})")
    return stored


def stochastic_sum(addend: float, n: int, fmt: str, *, trials: int, generator: torch.Generator,
                   start: float = 0.0) -> StochasticSums:
    """`trials` independent running sums start + addend (n times), each addition rounded
    stochastically to `fmt`. The draws come from `generator` (a seed gives the same sums)."""
    f = _format(fmt)
    a, s0 = _stored(addend, "addend", f), _stored(start, "start", f)
    checks.nonnegative_int(n, "n")
    checks.positive_int(trials, "trials")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    s = torch.full((trials,), s0, dtype=torch.float64)
    largest = abs(s0)
    for _ in range(n):
        s = stochastic_round(s + a, f, generator=generator)
        largest = max(largest, s.abs().max().item())
    if not torch.isfinite(s).all():
        raise OverflowError(f"the sum left {f.name}'s range (largest {f.max:g})")
    return StochasticSums(f.name, s0, a, n, tuple(s.tolist()), largest)


def nearest_sum(addend: float, n: int, fmt: str, *, start: float = 0.0) -> float:
    """The same running sum with every addition rounded to nearest: torch adding the stored
    addend in `fmt`'s dtype, one addition per step."""
    f = _format(fmt)
    if f.torch_dtype is None:
        raise ValueError(f"fmt={f.name!r} has no torch dtype to add in; use a storage format "
                         "such as 'bf16'")
    a, s0 = _stored(addend, "addend", f), _stored(start, "start", f)
    checks.nonnegative_int(n, "n")
    acc = torch.tensor(s0, dtype=f.dtype)
    step = torch.tensor(a, dtype=f.dtype)
    for _ in range(n):
        acc += step
    return acc.item()
