"""RMSNorm in low precision: where the squares, the mean and epsilon go wrong, measured exactly.

RMSNorm divides x by sqrt(mean(x^2) + eps). In a 16-bit format three things can break:
1. the squares: fp16's max is 65,504, so x^2 overflows once |x| >= 256 and the sum of d squares
   once the row's rms exceeds sqrt(65,504 / d) (4.0 for d = 4,096); x^2 also flushes to 0 once
   |x| < 2^-12.5 (fp16's smallest subnormal is 2^-24). bf16 has fp32's exponent range: neither.
2. the mean, a sum of d terms: a kernel that keeps its running sum in bf16 stops growing after
   about 2^(m+2) = 512 similar terms (chapter 01's plateau, `mlsys.numerics.summation`); torch's own
   reductions of bf16/fp16 tensors accumulate in fp32 and round once, and do not.
3. eps: what matters is not whether eps is a normal number, but its stored value and when
   adding it changes the mean square. 1e-5 is subnormal in fp16 (below 2^-14) yet stored as
   168 * 2^-24 = 1.00136e-5, the same value bf16 stores (both keep 8 significant bits there);
   1e-8 is 0 in fp16. And mean_square + eps == mean_square, eps absorbed, for every mean square
   from `absorbed_from` up: 2^-5 in fp16, 2^-8 in bf16, 2^8 in fp32 for eps = 1e-5.
`eps_facts` states these exactly; `rms_inv` computes 1 / sqrt(mean(x^2) + eps) in a chosen dtype
and way of summing (an overflowed sum gives a scale of 0, wrong but finite), and `norm_errors`
compares it with float64 on real activations, which `norm_inputs` captures from a model.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from mlsys import checks
from mlsys.dtypes import torch_dtype
from mlsys.numerics.bit_fields import decompose
from mlsys.numerics.precision import get_format, round_to
from mlsys.numerics.summation import sequential_sum

ACCUMULATE = ("torch", "sequential")
"""How the mean of the squares is summed: torch's reduction (fp32 accumulator inside, one final
rounding) or one addition at a time in the dtype itself (a kernel with a low-precision
accumulator)."""


@dataclass(frozen=True)
class EpsFacts:
    """What a format does with one epsilon."""

    eps: float
    format: str
    stored: float  # eps as the format stores it
    kind: str  # "normal", "subnormal" or "zero"
    rel_error: float  # |stored - eps| / eps
    absorbed_from: float  # every mean square >= this (a power of two) absorbs it: ms + eps == ms


def absorbed_from(eps: float, fmt: str) -> float:
    """The smallest power of two 2^k such that m + eps rounds to m for every m >= 2^k in `fmt`
    (eps as stored): eps <= ulp(2^k) / 2 = 2^(k - mantissa_bits - 1), ties going to the even m."""
    f = get_format(fmt)
    stored = round_to(checks.positive(eps, "eps"), f)
    if stored == 0:
        return 0.0  # eps is 0 in this format: nothing to absorb, everywhere
    k = math.ceil(math.log2(stored)) + f.mantissa_bits + 1
    while k - 1 >= f.emin and Fraction(stored) <= Fraction(2) ** (k - 1 - f.mantissa_bits - 1):
        k -= 1  # (log2 may land on the boundary)
    while Fraction(stored) > Fraction(2) ** (k - f.mantissa_bits - 1):
        k += 1
    return math.ldexp(1.0, k)


def eps_facts(eps: float, fmt: str) -> EpsFacts:
    """Stored value, kind, relative error and absorption threshold of `eps` in `fmt`."""
    bits = decompose(checks.positive(eps, "eps"), fmt)
    f = get_format(fmt)
    return EpsFacts(eps, f.name, bits.value, bits.kind, abs(bits.value - eps) / eps,
                    absorbed_from(eps, fmt))


def square_overflow_rms(d: int, fmt: str) -> float:
    """The rms above which the sum of d squares exceeds the format's max: sqrt(max / d)."""
    return math.sqrt(get_format(fmt).max / checks.positive_int(d, "d"))


def square_flush_below(fmt: str) -> float:
    """|x| below which x^2 rounds to 0: sqrt(smallest_subnormal / 2) (the tie goes to 0)."""
    return math.sqrt(get_format(fmt).smallest_subnormal / 2)


def mean_square(x: Float[Tensor, "*batch d"], dtype: str, *,
                accumulate: str = "torch") -> Float[Tensor, "*batch"]:
    """mean(x^2) over the last dim with x, its squares, their sum and the mean all in `dtype`;
    the sum by torch's reduction or sequentially (`ACCUMULATE`). inf once the sum overflows."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim == 0:
        raise TypeError("x must be a floating-point tensor with a last dim to normalize")
    checks.choice(accumulate, "accumulate", ACCUMULATE)
    dt = torch_dtype(dtype)
    squares = x.to(dt) * x.to(dt)
    total = squares.sum(-1) if accumulate == "torch" else sequential_sum(squares, dt)
    return total / torch.tensor(x.shape[-1], dtype=dt)


def rms_inv(x: Float[Tensor, "*batch d"], dtype: str, *, eps: float = 1e-5,
            accumulate: str = "torch") -> Float[Tensor, "*batch"]:
    """1 / sqrt(mean(x^2) + eps), every step in `dtype` (`mean_square`, then eps and rsqrt):
    an overflowed sum gives rsqrt(inf) = 0, a silently wrong, finite scale."""
    eps_t = torch.tensor(checks.positive(eps, "eps"), dtype=torch_dtype(dtype))
    return torch.rsqrt(mean_square(x, dtype, accumulate=accumulate) + eps_t)


def norm_errors(x: Float[Tensor, "*batch d"], *, dtypes: tuple[str, ...] = ("fp16", "bf16"),
                eps: float = 1e-5) -> list[dict[str, Any]]:
    """Per dtype and `ACCUMULATE` mode: `rms_inv` against float64 over the rows of `x`: median
    and max relative error, the fraction of rows whose sum of squares overflowed (their scale
    comes out 0), and the fraction of squares that overflowed or flushed to 0."""
    ref = rms_inv(x.double(), "fp64", eps=eps)
    rows = []
    for name in dtypes:
        dt = torch_dtype(name)
        squares = x.to(dt) * x.to(dt)
        nonzero = x != 0
        for mode in ACCUMULATE:
            got = rms_inv(x, name, eps=eps, accumulate=mode).double()
            rel = (got - ref).abs() / ref
            rows.append({
                "dtype": name, "accumulate": mode, "d": x.shape[-1], "rows": ref.numel(),
                "median_rel_error": float(rel.median()), "max_rel_error": float(rel.max()),
                "overflowed_rows": float(torch.isinf(mean_square(x, name, accumulate=mode))
                                         .double().mean()),
                "squares_overflowed": float(torch.isinf(squares).double().mean()),
                "squares_flushed": float(((squares == 0) & nonzero).double().mean())})
    return rows


def norm_inputs(model: nn.Module, *args: Any) -> dict[str, Tensor]:
    """The input of every module whose class name ends in "Norm" during `model(*args)`, by
    module path (detached, fp32); the forward runs without gradients."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    captured: dict[str, Tensor] = {}
    handles = [m.register_forward_pre_hook(
        lambda mod, a, name=name: captured.setdefault(name, a[0].detach().float()))
        for name, m in model.named_modules() if type(m).__name__.endswith("Norm")]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return captured
