"""When compute hides communication: the compute-bound conditions of FSDP, TP and both, in the
Scaling Book's notation (Austin et al., 2025, "How to Scale Your Model", the Training section,
"Mixed FSDP and Tensor Parallelism", https://jax-ml.github.io/scaling-book/training/).

C FLOP/s per chip, W_ici the bandwidth of one mesh axis (bytes/s; 2 x 9e10 on a TPU v5p axis,
`hardware.LINKS["ici-v5p-axis"]`), alpha = C / W_ici, X-way FSDP, Y-way TP, N = X Y chips, M_X
and M_Y the mesh axes each spans (`torus_axes`), B tokens, D = d_model, F = d_ff. Per layer of two
matmuls (D -> F -> D), forward only, bf16 (2 bytes):

    T_math = 4 B D F / (N C)     T_FSDP = 4 D F / (Y W M_X)     T_TP = 4 B D / (X W M_Y)

Two models of the communication (`COMMS_MODELS`), compute overlapping it in both:
- "sum", the Book's: the layer is compute-bound when T_FSDP + T_TP < T_math. For a given X and Y
  that is B / N > alpha / (Y M_X) / (1 - Y alpha / (F M_Y)), and F M_Y > Y alpha is needed at any
  batch. At the best split, X_opt = sqrt(B M_X N / (F M_Y)) (where T_FSDP = T_TP, the double root
  of the Book's quadratic in X), B / N > 4 alpha^2 / (F M_X M_Y): the Book's closed form, 2
  alpha^2 / F with M_X = 2, M_Y = 1 (its takeaway).
- "max": the two communications also overlap each other (each on its own links), so only the
  larger counts: B / N > alpha / (Y M_X) and F M_Y > Y alpha; at the best split alpha^2 / (F M_X
  M_Y), a quarter of the Book's. Optimistic: it is what the book printed before it was checked
  against the Book. Pure: no torch. Used in: chapter 09, the parallelism appendix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import checks

COMMS_MODELS = ("sum", "max")
"""How FSDP's and TP's communication times combine: "sum" (the Scaling Book's) or "max"."""


def ici_intensity(flop_per_s: float, link_bytes_per_s: float) -> float:
    """alpha = C / W_ici: FLOPs a chip does in the time one byte crosses a mesh axis."""
    return checks.positive(flop_per_s, "flop_per_s") / checks.positive(link_bytes_per_s,
                                                                        "link_bytes_per_s")


def _axes(m_x: float, m_y: float) -> tuple[float, float]:
    return checks.positive(m_x, "m_x"), checks.positive(m_y, "m_y")


def torus_axes(x: int, y: int, torus: tuple[int, ...] = (4, 4, 4)) -> tuple[float, float]:
    """(M_X, M_Y): the torus axes an X-way FSDP group and a Y-way TP group span when X is laid
    along the first axes and Y along the rest, X Y = every chip. An axis split between the two
    (a 4-ring as 2 x 2) counts to each its share in log terms (half each): M_X + M_Y = the
    number of axes, the Book's "these should roughly sum to 3" on a 4 x 4 x 4 TPU v5p slice."""
    checks.positive_ints(x=x, y=y)
    sizes = checks.int_sequence(torus, "torus", minimum=2)
    if x * y != math.prod(sizes):
        raise ValueError(f"x * y ({x} * {y}) must equal the torus's chips "
                         f"({' x '.join(map(str, sizes))} = {math.prod(sizes)})")
    m_x, left = 0.0, x
    for k in sizes:
        part = math.gcd(left, k)
        if left % k and part != left:
            raise ValueError(f"x ({x}) cannot be laid along the axes {sizes} in order: "
                             f"it must fill each axis before the next")
        m_x, left = m_x + math.log(part) / math.log(k), left // part
    return m_x, len(sizes) - m_x


@dataclass(frozen=True)
class LayerTimes:
    """Forward seconds of one block under X-way FSDP and Y-way TP (the module docstring)."""

    math_s: float
    fsdp_s: float
    tp_s: float

    def comms(self, model: str = "sum") -> float:
        """The communication the math must hide: T_FSDP + T_TP (the Book's) or their max."""
        if checks.choice(model, "model", COMMS_MODELS) == "sum":
            return self.fsdp_s + self.tp_s
        return max(self.fsdp_s, self.tp_s)

    @property
    def comms_s(self) -> float:
        """T_FSDP + T_TP: the Scaling Book's sum."""
        return self.comms("sum")

    def is_compute_bound(self, model: str = "sum") -> bool:
        return self.math_s >= self.comms(model)

    @property
    def compute_bound(self) -> bool:
        """T_math >= T_FSDP + T_TP (the Book's condition)."""
        return self.is_compute_bound("sum")


def layer_times(batch: float, d_model: int, d_ff: int, *, x: int = 1, y: int = 1,
                flop_per_s: float, link_bytes_per_s: float, m_x: float = 1,
                m_y: float = 1) -> LayerTimes:
    """T_math = 4 B D F / (X Y C), T_FSDP = 4 D F / (Y W M_X) (0 if X = 1), T_TP = 4 B D /
    (X W M_Y) (0 if Y = 1): bf16, B tokens in all."""
    b = checks.positive(batch, "batch")
    checks.positive_ints(d_model=d_model, d_ff=d_ff, x=x, y=y)
    mx, my = _axes(m_x, m_y)
    c, w = checks.positive(flop_per_s, "flop_per_s"), checks.positive(link_bytes_per_s,
                                                                       "link_bytes_per_s")
    return LayerTimes(4 * b * d_model * d_ff / (x * y * c),
                      4 * d_model * d_ff / (y * w * mx) if x > 1 else 0.0,
                      4 * b * d_model / (x * w * my) if y > 1 else 0.0)


def compute_bound_batch(d_ff: int, *, x: int = 1, y: int = 1, flop_per_s: float,
                        link_bytes_per_s: float, m_x: float = 1, m_y: float = 1,
                        model: str = "sum") -> float:
    """Smallest tokens per device B / (X Y) above which the math hides the communication for
    this X and Y (forward). "sum" (the Book's): alpha / (Y M_X) / (1 - Y alpha / (F M_Y)); "max":
    alpha / (Y M_X). 0 without FSDP when TP hides; math.inf when TP's share alone, Y alpha /
    (F M_Y), reaches 1 (no batch helps)."""
    checks.positive_ints(d_ff=d_ff, x=x, y=y)
    mx, my = _axes(m_x, m_y)
    checks.choice(model, "model", COMMS_MODELS)
    alpha = ici_intensity(flop_per_s, link_bytes_per_s)
    tp_share = y * alpha / (d_ff * my) if y > 1 else 0.0  # T_TP / T_math, whatever the batch
    if tp_share > 1 or (tp_share == 1 and (model == "sum" and x > 1)):
        return math.inf
    if x == 1:
        return 0.0
    fsdp = alpha / (y * mx)
    return fsdp / (1 - tp_share) if model == "sum" else fsdp


def optimal_fsdp_degree(batch: float, d_ff: int, n_devices: int, *, m_x: float = 1,
                        m_y: float = 1) -> float:
    """The Scaling Book's X_opt = sqrt(B M_X N / (F M_Y)), where T_FSDP = T_TP (non-integer):
    the split that minimizes the sum and the max alike."""
    b = checks.positive(batch, "batch")
    checks.positive_ints(d_ff=d_ff, n_devices=n_devices)
    mx, my = _axes(m_x, m_y)
    return math.sqrt(b * mx * n_devices / (d_ff * my))


def optimal_compute_bound_batch(d_ff: int, *, flop_per_s: float, link_bytes_per_s: float,
                                m_x: float = 1, m_y: float = 1, model: str = "sum") -> float:
    """Tokens per device below which no split of FSDP x TP is compute-bound: the Book's
    4 alpha^2 / (F M_X M_Y) ("sum"), or alpha^2 / (F M_X M_Y) ("max"); reached at X_opt only."""
    checks.positive_int(d_ff, "d_ff")
    mx, my = _axes(m_x, m_y)
    factor = 4 if checks.choice(model, "model", COMMS_MODELS) == "sum" else 1
    return factor * ici_intensity(flop_per_s, link_bytes_per_s) ** 2 / (mx * my * d_ff)


def split_thresholds(d_ff: int, splits: Iterable[tuple[int, int, float]], *, flop_per_s: float,
                     link_bytes_per_s: float,
                     torus: tuple[int, ...] = (4, 4, 4)) -> list[dict[str, float]]:
    """For each (X, Y, gather) of `splits` on `torus`: M_X and M_Y (`torus_axes`), TP's share of
    the math Y alpha / (F M_Y), and the tokens per device above which the layer is compute-bound
    under both models (`compute_bound_batch`). `gather` is the bytes of a gathered weight against
    bf16's (0.5 for fp8 gathers): it divides T_FSDP as a larger M_X would."""
    alpha = ici_intensity(flop_per_s, link_bytes_per_s)
    out = []
    for x, y, gather in splits:
        mx, my = torus_axes(x, y, torus)
        g = checks.positive(gather, "gather")
        kw = {"x": x, "y": y, "flop_per_s": flop_per_s, "link_bytes_per_s": link_bytes_per_s,
              "m_x": mx / g, "m_y": my if y > 1 else 1}
        out.append({"x": x, "y": y, "m_x": mx, "m_y": my, "gather": g,
                    "tp_share": y * alpha / (d_ff * my) if y > 1 else 0.0,
                    **{m: compute_bound_batch(d_ff, model=m, **kw) for m in COMMS_MODELS}})
    return out


def compute_to_comms_curves(tokens_per_device: Iterable[float], d_model: int, d_ff: int,
                            n_devices: int, *, flop_per_s: float, link_bytes_per_s: float,
                            m_x: float = 1, m_y: float = 1,
                            fixed_xy: tuple[int, int] | None = None,
                            model: str = "sum") -> dict[str, list[float]]:
    """T_math / T_comms of one layer's forward at each b = B / N of `tokens_per_device`, for pure
    FSDP ("fsdp", X = N), pure TP ("tp", Y = N), FSDP x TP at the Scaling Book's optimal split
    ("optimal": X_opt clamped to [1, N], not an integer, or pure FSDP or TP where one of them
    does better: without one of the two the other's term is gone) and, given `fixed_xy` =
    (X, Y), that mesh ("fixed"). T_comms per `model` (`LayerTimes.comms`); above 1 the layer is
    compute-bound; math.inf where nothing is sent."""
    n = checks.positive_int(n_devices, "n_devices")
    checks.positive_ints(d_model=d_model, d_ff=d_ff)
    mx, my = _axes(m_x, m_y)
    checks.choice(model, "model", COMMS_MODELS)
    c, w = checks.positive(flop_per_s, "flop_per_s"), checks.positive(link_bytes_per_s,
                                                                       "link_bytes_per_s")

    def ratio(b: float, x: float, y: float) -> float:  # b tokens per device, x * y devices
        math_s = 4 * b * d_model * d_ff / c
        fsdp = 4 * d_model * d_ff / (y * w * mx) if x > 1 else 0.0
        tp = 4 * b * x * y * d_model / (x * w * my) if y > 1 else 0.0
        comms = fsdp + tp if model == "sum" else max(fsdp, tp)
        return math_s / comms if comms else math.inf

    def optimal(b: float) -> float:  # X_opt, or an end where dropping an axis does better
        x = min(max(optimal_fsdp_degree(b * n, d_ff, n, m_x=mx, m_y=my), 1.0), n)
        return max(ratio(b, x, n / x), ratio(b, n, 1), ratio(b, 1, n))

    points = list(tokens_per_device)
    curves = {"fsdp": [ratio(b, n, 1) for b in points], "tp": [ratio(b, 1, n) for b in points],
              "optimal": [optimal(b) for b in points]}
    if fixed_xy is not None:
        x, y = (checks.positive_int(v, name) for v, name in zip(fixed_xy, ("X", "Y"),
                                                                  strict=True))
        curves["fixed"] = [ratio(b, x, y) for b in points]
    return curves
