"""Scaling a tensor into an 8-bit format: why a scale at all, one per tensor, or one per block.

An fp8 format covers few octaves: e4m3 holds normal numbers from 2^-6 to 448 (subnormals down to
2^-9), e5m2 from 2^-14 to 57,344, each with 2 or 3 mantissa bits. A tensor whose entries live
elsewhere (gradients of 1e-4, say) loses them to underflow, or to saturation above max, however
precise its in-range entries are: so every fp8 recipe multiplies by a scale before the cast and
divides it out afterwards.

- "none": the cast alone (saturating at +-max, as fp8 training casts do).
- "tensor": one scale per tensor, s = max / amax (`fp8.scale_for`), which puts the largest entry
  on the format's largest number. One outlier sets s for everything: with an outlier r times the
  typical entry, the typical entries land r times below max, and past the format's range
  (max / smallest normal = 2^14 * 1.75 in e4m3) they fall into the subnormals and then to zero.
- "block": one scale per block of `block` consecutive entries, a power of two as the OCP
  Microscaling formats store it (an E8M0 byte; MXFP8 = blocks of 32 e4m3 or e5m2 elements with one
  shared scale; OCP "Microscaling Formats (MX) v1.0", 2023; Rouhani et al. 2023, arXiv:2310.10537):
  X = 2^(floor(log2 amax_block) - emax), emax the exponent of the element format's largest normal
  number (8 for e4m3), and each element is x / X cast to the element format with saturation. An
  outlier now costs only its own block. The power-of-two scale puts amax_block / X in
  [2^emax, 2^(emax+1)), so a block's largest entry may saturate (in e4m3 above 448, up to 12.5%
  low), as the specification accepts.

`quantize` returns what the format keeps of x (dequantized, float64), `errors` measures it against
x, `outlier_tensor` makes a test tensor. Used in: §sec-precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.numerics.precision import get_format

SCALINGS = ("none", "tensor", "block")
"""How a tensor is scaled before the cast (the module docstring)."""
MX_BLOCK = 32
"""Elements per shared scale in the OCP MX formats."""
E8M0_EXPONENTS = (-127, 127)
"""The exponents an E8M0 scale can hold (the all-ones byte is NaN)."""


def _fp8(fmt: object):
    f = get_format(fmt)
    if f.bits != 8:
        raise ValueError(f"fmt={f.name!r} is not an fp8 format; use 'fp8_e4m3' or 'fp8_e5m2'")
    return f


def _cast(x: Tensor, f) -> Tensor:
    """x rounded to the format, saturating at +-max; back in float64."""
    return x.clamp(-f.max, f.max).to(f.dtype).to(torch.float64)


def quantize(x: Float[Tensor, "*shape"], fmt: str, scaling: str, *,
             block: int = MX_BLOCK) -> Float[Tensor, "*shape"]:
    """What `fmt` keeps of `x` under `scaling` (see `SCALINGS`), dequantized to float64. "block"
    takes blocks of `block` consecutive elements of the flattened tensor (its size must be a
    multiple of `block`)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor, got {what}")
    f = _fp8(fmt)
    checks.choice(scaling, "scaling", SCALINGS)
    block = checks.positive_int(block, "block")
    x64 = x.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        raise ValueError("x must be finite (a scale cannot be taken from inf or NaN)")
    if scaling == "none":
        return _cast(x64, f)
    if scaling == "tensor":
        amax = x64.abs().max().item() if x64.numel() else 0.0
        scale = 1.0 if amax == 0 else f.max / amax
        return _cast(x64 * scale, f) / scale
    if x64.numel() % block:
        raise ValueError(f"x has {x64.numel()} elements, not a multiple of block={block}")
    blocks = x64.reshape(-1, block)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    emax = math.floor(math.log2(f.max))  # the exponent of the largest normal number
    _, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    shared = torch.where(amax > 0, e - 1 - emax, torch.zeros_like(e)).clamp(*E8M0_EXPONENTS)
    scale = torch.ldexp(torch.ones_like(amax), shared)
    return (_cast(blocks / scale, f) * scale).reshape(x.shape)


@dataclass(frozen=True)
class ScalingError:
    """How far a quantized tensor is from the original."""

    mean_relative: float  # mean over the nonzero entries of |q - x| / |x|
    flushed: float  # share of the nonzero entries that became 0


def errors(x: Tensor, q: Tensor) -> ScalingError:
    """`q` (from `quantize`) against `x`: the mean relative error of the nonzero entries, and the
    share of them flushed to zero."""
    if not isinstance(x, Tensor) or not isinstance(q, Tensor) or x.shape != q.shape:
        raise ValueError("x and q must be tensors of the same shape (q = quantize(x, ...))")
    x64, q64 = x.detach().to(torch.float64), q.detach().to(torch.float64)
    nonzero = x64 != 0
    if not nonzero.any():
        raise ValueError("x has no nonzero entry to measure a relative error on")
    rel = ((q64 - x64).abs() / x64.abs())[nonzero]
    flushed = (q64[nonzero] == 0).double().mean().item()
    return ScalingError(rel.mean().item(), flushed)


def outlier_tensor(n: int, *, std: float, outliers: int, ratio: float,
                   generator: torch.Generator) -> Float[Tensor, " n"]:
    """n entries drawn from N(0, std^2), then `outliers` of them (at random places) set to
    +-ratio * std: the bulk of a tensor and the few large values that set its amax."""
    n = checks.positive_int(n, "n")
    std = checks.positive(std, "std")
    outliers = checks.nonnegative_int(outliers, "outliers")
    ratio = checks.positive(ratio, "ratio")
    if outliers > n:
        raise ValueError(f"outliers ({outliers}) must be at most n ({n})")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    x = torch.randn(n, generator=generator, dtype=torch.float64) * std
    where = torch.randperm(n, generator=generator)[:outliers]
    signs = torch.where(torch.rand(outliers, generator=generator, dtype=torch.float64) < 0.5,
                        -1.0, 1.0).to(torch.float64)
    x[where] = signs * ratio * std
    return x
