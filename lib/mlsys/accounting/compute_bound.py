"""When compute hides communication: the compute-bound conditions of FSDP, TP and both, in the
Scaling Book's notation (Austin et al., 2025, "How to Scale Your Model", part 5,
https://jax-ml.github.io/scaling-book/training/).

C FLOP/s per chip, W_ici the bandwidth of one mesh axis (bytes/s; 2 x 9e10 on a TPU v5p axis,
`hardware.LINKS["ici-v5p-axis"]`), alpha = C / W_ici, X-way FSDP, Y-way TP, N = X Y chips, M_X
and M_Y the mesh axes each spans, B tokens, D = d_model, F = d_ff. Per layer of two matmuls
(D -> F -> D), forward only, bf16 (2 bytes):

    T_math = 4 B D F / (N C)     T_FSDP = 4 D F / (Y W M_X)     T_TP = 4 B D / (X W M_Y)

so, with the two communications overlapped (T_comms = max), for a *given* X and Y the layer is
compute-bound when B / N > alpha / (Y M_X) (FSDP; alpha / M_X per device for pure FSDP) and
F M_Y > Y alpha (TP, whatever B). The book's closed form B / N > alpha^2 / (M_X M_Y F) is the
best case: it holds only at its optimal split X_opt = sqrt(B M_X N / (F M_Y)) (non-integer X, Y),
where T_FSDP = T_TP; a mesh with another X pays more. Pure: no torch. Used in: chapter 09.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import checks


def ici_intensity(flop_per_s: float, link_bytes_per_s: float) -> float:
    """alpha = C / W_ici: FLOPs a chip does in the time one byte crosses a mesh axis."""
    return checks.positive(flop_per_s, "flop_per_s") / checks.positive(link_bytes_per_s,
                                                                        "link_bytes_per_s")


@dataclass(frozen=True)
class LayerTimes:
    """Forward seconds of one block under X-way FSDP and Y-way TP (the module docstring)."""

    math_s: float
    fsdp_s: float
    tp_s: float

    @property
    def comms_s(self) -> float:
        """The two overlapped with each other (the Scaling Book's assumption)."""
        return max(self.fsdp_s, self.tp_s)

    @property
    def compute_bound(self) -> bool:
        return self.math_s >= self.comms_s


def layer_times(batch: float, d_model: int, d_ff: int, *, x: int = 1, y: int = 1,
                flop_per_s: float, link_bytes_per_s: float, m_x: int = 1,
                m_y: int = 1) -> LayerTimes:
    """T_math = 4 B D F / (X Y C), T_FSDP = 4 D F / (Y W M_X) (0 if X = 1), T_TP = 4 B D /
    (X W M_Y) (0 if Y = 1): bf16, B tokens in all."""
    b = checks.positive(batch, "batch")
    checks.positive_ints(d_model=d_model, d_ff=d_ff, x=x, y=y, m_x=m_x, m_y=m_y)
    c, w = checks.positive(flop_per_s, "flop_per_s"), checks.positive(link_bytes_per_s,
                                                                       "link_bytes_per_s")
    return LayerTimes(4 * b * d_model * d_ff / (x * y * c),
                      4 * d_model * d_ff / (y * w * m_x) if x > 1 else 0.0,
                      4 * b * d_model / (x * w * m_y) if y > 1 else 0.0)


def compute_bound_batch(d_ff: int, *, x: int = 1, y: int = 1, flop_per_s: float,
                        link_bytes_per_s: float, m_x: int = 1, m_y: int = 1) -> float:
    """Smallest tokens per device B / (X Y) above which compute time exceeds communication time
    for this X and Y (forward): alpha / (Y M_X) from FSDP (0 without it); TP's condition
    F M_Y >= Y alpha does not depend on B, so math.inf when it fails."""
    checks.positive_ints(d_ff=d_ff, x=x, y=y, m_x=m_x, m_y=m_y)
    alpha = ici_intensity(flop_per_s, link_bytes_per_s)
    if y > 1 and d_ff * m_y < y * alpha:
        return math.inf
    return alpha / (y * m_x) if x > 1 else 0.0


def optimal_fsdp_degree(batch: float, d_ff: int, n_devices: int, *, m_x: int = 1,
                        m_y: int = 1) -> float:
    """The Scaling Book's X_opt = sqrt(B M_X N / (F M_Y)), where T_FSDP = T_TP (non-integer)."""
    b = checks.positive(batch, "batch")
    checks.positive_ints(d_ff=d_ff, n_devices=n_devices, m_x=m_x, m_y=m_y)
    return math.sqrt(b * m_x * n_devices / (d_ff * m_y))


def optimal_compute_bound_batch(d_ff: int, *, flop_per_s: float, link_bytes_per_s: float,
                                m_x: int = 1, m_y: int = 1) -> float:
    """The Scaling Book's closed form B / N > alpha^2 / (M_X M_Y F): valid only at X_opt."""
    checks.positive_ints(d_ff=d_ff, m_x=m_x, m_y=m_y)
    return ici_intensity(flop_per_s, link_bytes_per_s) ** 2 / (m_x * m_y * d_ff)


def compute_to_comms_curves(tokens_per_device: Iterable[float], d_model: int, d_ff: int,
                            n_devices: int, *, flop_per_s: float, link_bytes_per_s: float,
                            m_x: int = 1, m_y: int = 1,
                            fixed_xy: tuple[int, int] | None = None) -> dict[str, list[float]]:
    """T_math / T_comms of one layer's forward at each b = B / N of `tokens_per_device`, for pure
    FSDP ("fsdp", X = N), pure TP ("tp", Y = N), FSDP x TP at the Scaling Book's optimal split
    ("optimal": X_opt clamped to [1, N], not an integer) and, given `fixed_xy` = (X, Y), that mesh
    ("fixed"). The two communications overlap (`LayerTimes.comms_s`); above 1 the layer is
    compute-bound; math.inf where nothing is sent."""
    n = checks.positive_int(n_devices, "n_devices")
    checks.positive_ints(d_model=d_model, d_ff=d_ff, m_x=m_x, m_y=m_y)
    c, w = checks.positive(flop_per_s, "flop_per_s"), checks.positive(link_bytes_per_s,
                                                                       "link_bytes_per_s")

    def ratio(b: float, x: float, y: float) -> float:  # b tokens per device, x * y devices
        math_s = 4 * b * d_model * d_ff / c
        fsdp = 4 * d_model * d_ff / (y * w * m_x) if x > 1 else 0.0
        tp = 4 * b * x * y * d_model / (x * w * m_y) if y > 1 else 0.0
        return math_s / max(fsdp, tp) if max(fsdp, tp) else math.inf

    def optimal(b: float) -> float:
        x = min(max(optimal_fsdp_degree(b * n, d_ff, n, m_x=m_x, m_y=m_y), 1.0), n)
        return ratio(b, x, n / x)

    points = list(tokens_per_device)
    curves = {"fsdp": [ratio(b, n, 1) for b in points], "tp": [ratio(b, 1, n) for b in points],
              "optimal": [optimal(b) for b in points]}
    if fixed_xy is not None:
        x, y = (checks.positive_int(v, name) for v, name in zip(fixed_xy, ("X", "Y"),
                                                                  strict=True))
        curves["fixed"] = [ratio(b, x, y) for b in points]
    return curves
