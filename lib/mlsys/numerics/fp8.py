"""fp8 matmuls as fp8 training does them: E4M3 in the forward, E5M2 for gradients, per-tensor
scales from a history of absolute maxima, fp32 accumulation.

An fp8 format has 256 codes, so a tensor must be scaled into its range before the cast: with
scale s = max / amax (amax = max |x|), the largest entry lands on the format's largest number and
the smallest ones stay above its subnormals. E4M3 (max 448, 3 mantissa bits: relative error at
most 2^-4 per rounding) carries weights and activations; E5M2 (max 57,344, 2 mantissa bits) the
gradients, which span more octaves (Micikevicius et al., 2022, "FP8 Formats for Deep Learning").
"Delayed" scaling takes s from the largest amax of the last few steps (`AmaxHistory`, as NVIDIA's
Transformer Engine does), so the scale is known before the tensor is; "current" scaling uses this
tensor's own amax (one more pass over it).

On a CPU the fp8 dtypes convert but have no arithmetic: `quantize` casts (saturating at ±max, the
way fp8 training casts do), the "simulated" backend multiplies the dequantized values in fp32 (what
an fp8 GEMM with fp32 accumulation computes, up to the order of the sums), and "scaled_mm" calls
`torch._scaled_mm`, which takes its second operand column-major and divides by the scales after
accumulating (on a GPU it needs an fp8 tensor core: compute capability 8.9 or newer).
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from mlsys import checks
from mlsys.dtypes import torch_dtype
from mlsys.numerics.precision import get_format

FORWARD_FORMAT = "fp8_e4m3"
BACKWARD_FORMAT = "fp8_e5m2"
BACKENDS = ("simulated", "scaled_mm")
SCALINGS = ("delayed", "current", "none")


def _fp8(fmt: str) -> str:
    f = get_format(fmt)
    if f.bits != 8:
        raise ValueError(f"fmt={fmt!r} is not an fp8 format; use 'fp8_e4m3' or 'fp8_e5m2'")
    return f.name


def scale_for(amax: float, fmt: str, *, margin: int = 0) -> float:
    """max(fmt) / amax / 2^margin: the factor that puts |x| = amax on the format's largest value
    (`margin` octaves below it); 1 where amax is 0 (nothing to scale)."""
    f = get_format(_fp8(fmt))
    amax = checks.nonnegative(amax, "amax")
    checks.nonnegative_int(margin, "margin")
    return 1.0 if amax == 0 else f.max / amax / 2.0**margin


def quantize(x: Float[Tensor, "*shape"], fmt: str, scale: float) -> Tensor:
    """x * scale in `fmt`, rounded to nearest; values beyond ±max saturate to ±max (no inf)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {type(x).__name__}")
    f = get_format(_fp8(fmt))
    checks.positive(scale, "scale")
    return (x.float() * scale).clamp(-f.max, f.max).to(torch_dtype(f.name))


def dequantize(q: Tensor, scale: float) -> Float[Tensor, "*shape"]:
    """The fp32 values an fp8 tensor `q` stands for: q / scale. `q` must have an fp8 dtype: a
    uint8 or int8 tensor holds integers, not fp8 codes, and would be read as its integers."""
    if not isinstance(q, Tensor) or not (q.is_floating_point() and q.element_size() == 1):
        got = q.dtype if isinstance(q, Tensor) else type(q).__name__
        raise TypeError(f"q must be an fp8 tensor (torch.float8_e4m3fn or torch.float8_e5m2, "
                        f"from quantize), got {got}")
    return q.float() / checks.positive(scale, "scale")


class AmaxHistory:
    """The absolute maxima of the last `length` tensors one role has seen (a layer's input, its
    weight or its output gradient); `scale` uses the largest (Transformer Engine's "max")."""

    def __init__(self, length: int = 16) -> None:
        self.amaxes: deque[float] = deque(maxlen=checks.positive_int(length, "length"))

    def record(self, x: Tensor) -> float:
        """Append max |x| and return it."""
        amax = float(x.detach().abs().max()) if x.numel() else 0.0
        self.amaxes.append(amax)
        return amax

    def scale(self, fmt: str, *, margin: int = 0) -> float:
        """`scale_for` the largest amax remembered (1 while the history is empty)."""
        return scale_for(max(self.amaxes, default=0.0), fmt, margin=margin)


@dataclass(frozen=True)
class RoundTrip:
    """What one quantize/dequantize round trip did to a tensor's non-zero entries."""

    max_rel_error: float  # over entries that stayed in fp8's normal range (bounded by 2^-(m+1))
    median_rel_error: float  # over every non-zero entry
    saturated: float  # fraction clipped to ±max
    flushed: float  # fraction that became 0
    subnormal: float  # fraction that landed below the smallest normal (fewer bits)


def roundtrip(x: Tensor, fmt: str, scale: float) -> RoundTrip:
    """Quantize `x` with `scale`, dequantize, and compare with `x` entry by entry."""
    f = get_format(_fp8(fmt))
    q = quantize(x, fmt, scale)
    back, ref = dequantize(q, scale).double(), x.detach().double()
    nz = ref != 0
    if not bool(nz.any()):
        return RoundTrip(0.0, 0.0, 0.0, 0.0, 0.0)
    rel = (back[nz] - ref[nz]).abs() / ref[nz].abs()
    scaled = (ref[nz] * scale).abs()
    beyond = f.max * (1 + 2.0 ** -(f.mantissa_bits + 1))  # above this, rounding cannot reach max
    normal = (scaled >= f.smallest_normal) & (scaled <= beyond)
    return RoundTrip(float(rel[normal].max()) if bool(normal.any()) else math.nan,
                     float(rel.median()), float((scaled > beyond).double().mean()),
                     float((back[nz] == 0).double().mean()),
                     float(((scaled < f.smallest_normal) & (back[nz] != 0)).double().mean()))


def relative_error(approx: Tensor, exact: Tensor) -> float:
    """||approx - exact|| / ||exact|| (Frobenius norms, in float64)."""
    a, e = approx.detach().double(), exact.detach().double()
    return float((a - e).norm() / e.norm()) if float(e.norm()) > 0 else float((a - e).norm())


def fp8_mm(a: Tensor, a_scale: float, b: Tensor, b_scale: float, *,
           backend: str = "simulated") -> Float[Tensor, "m n"]:
    """(a / a_scale) @ (b / b_scale) for fp8 `a` (m, k) and `b` (k, n), accumulated in fp32."""
    checks.choice(backend, "backend", BACKENDS)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must be (m, k) and (k, n)")
    if backend == "simulated":
        return dequantize(a, a_scale) @ dequantize(b, b_scale)
    inv_a = torch.tensor(1.0 / a_scale, device=a.device)
    inv_b = torch.tensor(1.0 / b_scale, device=b.device)
    return torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a=inv_a,
                            scale_b=inv_b, out_dtype=torch.float32)  # b column-major


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d: Tensor, weight: Tensor, layer: Fp8Linear) -> Tensor:
        sx, sw = layer.scale("input", x2d), layer.scale("weight", weight)
        qx, qw = quantize(x2d, FORWARD_FORMAT, sx), quantize(weight, FORWARD_FORMAT, sw)
        ctx.save_for_backward(qx, qw)
        ctx.scales, ctx.layer = (sx, sw), layer
        return fp8_mm(qx, sx, qw.t(), sw, backend=layer.backend)  # (n, in) @ (in, out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        qx, qw = ctx.saved_tensors
        (sx, sw), layer = ctx.scales, ctx.layer
        sg = layer.scale("grad", grad)
        qg = quantize(grad, BACKWARD_FORMAT, sg)
        grad_x = fp8_mm(qg, sg, qw, sw, backend=layer.backend)  # (n, out) @ (out, in)
        grad_w = fp8_mm(qg.t(), sg, qx, sx, backend=layer.backend)  # (out, n) @ (n, in)
        return grad_x, grad_w, None


class Fp8Linear(nn.Module):
    """y = x W^T (no bias) with x and W in E4M3 and the output's gradient in E5M2, each with its
    own per-tensor scale ("delayed": from its `AmaxHistory`, the current amax while the history is
    empty; "current": its own amax; "none": scale 1, to show why scaling is needed). Output and
    gradients are fp32."""

    def __init__(self, weight: Tensor, *, scaling: str = "delayed", history: int = 16,
                 margin: int = 0, backend: str = "simulated") -> None:
        super().__init__()
        if not isinstance(weight, Tensor) or weight.ndim != 2:
            raise ValueError("weight must be a 2-D tensor (out_features, in_features)")
        self.weight = nn.Parameter(weight.detach().float().clone())
        self.scaling = checks.choice(scaling, "scaling", SCALINGS)
        self.backend = checks.choice(backend, "backend", BACKENDS)
        self.margin = checks.nonnegative_int(margin, "margin")
        self.histories = {role: AmaxHistory(history) for role in ("input", "weight", "grad")}

    def scale(self, role: str, x: Tensor) -> float:
        """The scale for tensor `x` in `role`; records its amax in the role's history."""
        fmt = BACKWARD_FORMAT if role == "grad" else FORWARD_FORMAT
        history = self.histories[role]
        if self.scaling == "none":
            return 1.0
        if self.scaling == "current" or not history.amaxes:
            return scale_for(history.record(x), fmt, margin=self.margin)
        s = history.scale(fmt, margin=self.margin)  # from earlier steps only, then remember this
        history.record(x)
        return s

    def forward(self, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch d_out"]:
        if x.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"x has last dim {x.shape[-1]}; the weight needs "
                             f"{self.weight.shape[1]}")
        y = _Fp8LinearFunction.apply(x.reshape(-1, x.shape[-1]), self.weight, self)
        return y.reshape(*x.shape[:-1], self.weight.shape[0])
