"""Loss scaling: keep fp16 gradients out of the subnormal range by multiplying the loss by a scale.

fp16 has 5 exponent bits: its smallest normal number is 2^-14 (6.1e-5) and its smallest subnormal
2^-24 (6.0e-8). A gradient below 2^-14 keeps fewer significant bits the smaller it is, and one
below 2^-25 becomes 0. Multiplying the loss by S multiplies every gradient by S (the chain rule is
linear), which moves them up into the normal range; the update divides by S again, in fp32, before
anyone reads them. Too large an S overflows instead (fp16's max is 65,504): the gradients hold inf
or NaN, and the step must be skipped.

`DynamicLossScaler` picks S as training goes (Micikevicius et al., 2018, "Mixed Precision
Training", section 3.2), with the rules and defaults of `torch.amp.GradScaler`: start at 2^16; on a
step whose gradients are not all finite, skip the update and halve S; after `growth_interval`
finite steps in a row, double S. One rule more than GradScaler: S never drops below `min_scale`
(default 1, the floor of DeepSpeed's and Megatron-LM's dynamic scalers). Below 1 the scale would
push the gradients toward fp16's subnormals, and an overflow at S = 1 means the unscaled gradients
themselves are inf or NaN, which no scale mends; without a floor, 1,091 overflows in a row halve
the default 2^16 to 0.0 (past a float's smallest subnormal, 2^-1074), and every later gradient
is divided by 0. An overflow at the floor skips the step without backing off ("skip at min_scale"
in `history`) and warns, once. Every decision is kept in `history`. `underflow` compares
gradients computed in a low-precision backward with a float reference, entry by entry.
Used in: §sec-mixed-precision (`mlsys.training` uses the scaler,
`mlsys.experiments.mixed_precision` traces it on the book's model).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mlsys import checks
from mlsys.numerics.precision import get_format

MIN_SCALE = 1.0
"""The default floor of `DynamicLossScaler`'s scale (DeepSpeed's `min_loss_scale` and Megatron-LM's
`--min-loss-scale` default to 1 too)."""


@dataclass(frozen=True)
class ScaleEvent:
    """One step's decision: the scale the loss was multiplied by, and what happened next."""

    step: int  # 1-based count of updates attempted
    scale: float  # S used for this step's backward
    finite: bool  # every gradient entry finite after the backward
    action: str  # "skip and back off", "skip at min_scale", "grow" or "keep"


class DynamicLossScaler:
    """Scale the loss, check and unscale the gradients, and adapt the scale.

    `scale_loss(loss)` before `backward()`; `unscale_(grads)` divides the gradients in place by S
    and says whether they were all finite; `update(finite)` then halves S (`backoff_factor`) after
    an overflow (never below `min_scale`) or doubles it (`growth_factor`) after
    `growth_interval` finite steps in a row. Powers of two keep the scaling exact:
    x * 2^k / 2^k == x for every normal fp32 value.
    """

    def __init__(self, init_scale: float = 2.0**16, *, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2_000,
                 min_scale: float = MIN_SCALE) -> None:
        self.min_scale = checks.positive(min_scale, "min_scale")
        self.scale = checks.positive(init_scale, "init_scale")
        if self.scale < self.min_scale:
            raise ValueError(f"init_scale must be >= min_scale = {self.min_scale:g}, "
                             f"got {self.scale:g}")
        self.growth_factor = checks.number(growth_factor, "growth_factor", minimum=1.0,
                                           strict=True)
        self.backoff_factor = checks.number(backoff_factor, "backoff_factor", minimum=0.0,
                                            maximum=1.0, strict=True)
        if self.backoff_factor == 1.0:
            raise ValueError("backoff_factor must be < 1: an overflow has to lower the scale")
        self.growth_interval = checks.positive_int(growth_interval, "growth_interval")
        self.finite_in_a_row = 0  # torch's "growth tracker"
        self.history: list[ScaleEvent] = []

    def scale_loss(self, loss: Tensor) -> Tensor:
        """loss * S (do the backward of this, not of the loss)."""
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise TypeError(f"loss must be a 0-d tensor, got {type(loss).__name__}")
        return loss * self.scale

    def unscale_(self, grads: Sequence[Tensor | None]) -> bool:
        """Divide every gradient by S in place (in its own dtype) and return whether all entries
        were finite. Entries that are None (parameters without a gradient) are skipped."""
        present = [g for g in grads if g is not None]
        if not all(isinstance(g, Tensor) and g.is_floating_point() for g in present):
            raise TypeError("grads must be floating-point tensors (or None)")
        if not present:
            return True
        finite = bool(torch.stack([torch.isfinite(g).all() for g in present]).all())  # one sync
        torch._foreach_mul_(present, 1.0 / self.scale)
        return finite

    def update(self, finite: bool) -> str:
        """Record this step and adapt S; returns the action taken."""
        if not isinstance(finite, bool):
            raise TypeError(f"finite must be a bool, got {finite!r}")
        if not finite:
            action, self.finite_in_a_row = "skip and back off", 0
            if self.scale <= self.min_scale:  # the floor: nothing lower is worth trying
                action = "skip at min_scale"
                self._warn_at_floor()
        else:
            self.finite_in_a_row += 1
            action = "keep"
            if self.finite_in_a_row == self.growth_interval:
                action, self.finite_in_a_row = "grow", 0
        self.history.append(ScaleEvent(len(self.history) + 1, self.scale, finite, action))
        if action == "skip and back off":
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        elif action == "grow":
            self.scale *= self.growth_factor
        return action

    def _warn_at_floor(self) -> None:
        if not any(e.action == "skip at min_scale" for e in self.history):  # once per scaler
            warnings.warn(f"loss scale: step {len(self.history) + 1} overflowed at min_scale = "
                          f"{self.min_scale:g}; skipped without backing off (the unscaled "
                          "gradients are inf or NaN: look at the loss and the weights)",
                          RuntimeWarning, stacklevel=3)

    @property
    def skipped(self) -> int:
        """Steps whose update was skipped (their gradients overflowed)."""
        return sum(not e.finite for e in self.history)


# --- what a low-precision backward loses -------------------------------------------------------


@dataclass(frozen=True)
class Underflow:
    """One tensor's gradient computed in a low-precision format against a float reference."""

    numel: int  # entries whose reference is non-zero (the ones that carry information)
    flushed: float  # fraction of those that came out exactly 0
    subnormal: float  # fraction below the format's smallest normal (fewer significant bits)
    overflowed: float  # fraction that came out inf or NaN
    median_rel_error: float  # median |g - ref| / |ref| over the finite entries


def underflow(reference: Tensor, measured: Tensor, fmt: str = "fp16", *,
              scale: float = 1.0) -> Underflow:
    """Compare `measured` (the gradient as the low-precision backward produced it, computed with
    the loss multiplied by `scale`) with `reference` (a float gradient of the unscaled loss).

    Subnormal means |measured| < the smallest normal of `fmt` (2^-14 for fp16), before unscaling.
    """
    if not isinstance(reference, Tensor) or not isinstance(measured, Tensor):
        raise TypeError("reference and measured must be tensors")
    if reference.shape != measured.shape:
        raise ValueError(f"reference {tuple(reference.shape)} and measured "
                         f"{tuple(measured.shape)} must have the same shape")
    f = get_format(fmt)
    checks.positive(scale, "scale")
    ref = reference.detach().double()
    raw = measured.detach().double()  # still scaled: what the low-precision tensor held
    mask = ref != 0
    n = int(mask.sum())
    if n == 0:
        return Underflow(0, 0.0, 0.0, 0.0, 0.0)
    r, m = ref[mask], raw[mask]
    finite = torch.isfinite(m)
    rel = ((m[finite] / scale - r[finite]).abs() / r[finite].abs())
    return Underflow(
        numel=n, flushed=float((m == 0).double().mean()),
        subnormal=float(((m.abs() < f.smallest_normal) & (m != 0)).double().mean()),
        overflowed=float((~finite).double().mean()),
        median_rel_error=float(rel.median()) if rel.numel() else float("nan"))
