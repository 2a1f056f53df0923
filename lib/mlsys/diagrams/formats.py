"""The bit fields of every number format, with their ranges, drawn (chapter 01).

`draw_bit_fields` draws each format of `mlsys.numerics.precision` as a row of boxes, one per bit:
the sign, the e exponent bits and the m mantissa bits, the widths read from the format's
(e, m). The rows are aligned on the binary point (the border between exponent and mantissa), so
that what a format spends on range stands to the left of one vertical line and what it spends on
precision to the right: bf16 sits under fp32 on the left and far short of fp16 on the right. Under
each row, the limits that follow from (e, m) (`FloatFormat`): the largest finite number, the
smallest normal 2^emin and subnormal 2^(emin - m) numbers, and eps = 2^-m, the gap after 1.

`draw_spacing` draws the consequence of m: the spacing ulp(x) = 2^(max(floor(log2 |x|), emin) - m)
of each format against |x| (`precision.ulp`), a staircase per format, and, for the formats torch
stores, the gap measured on torch's own numbers (`next_gap`: the stored word plus one, read back).
References: IEEE 754-2019; Micikevicius et al. (2022) for fp8; `mlsys.numerics.precision`.
Used in: §sec-precision (chapter 01).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.patches import Patch, Rectangle

from mlsys import checks
from mlsys.numerics.precision import FORMATS, FloatFormat, get_format, ulp
from mlsys.plotting import COLORS, CYCLE, finish, subplots

FIELD_COLORS = {"sign": COLORS["predicted"], "exponent": COLORS["measured"],
                "mantissa": COLORS["accent"]}
"""One colour per field, in the order a stored number holds them."""
ROW = 2.4
"""Vertical distance between two formats' rows, in box heights."""
WORDS = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
"""The integer dtype of each width: a float tensor viewed as one shows its stored bits."""


def _formats(formats: Sequence[str | FloatFormat] | None) -> list[FloatFormat]:
    """`formats` resolved through `get_format` (None: every format of `FORMATS`), checked."""
    if formats is None:
        return list(FORMATS.values())
    if isinstance(formats, str | FloatFormat) or not isinstance(formats, Sequence):
        raise TypeError("formats must be a sequence of format names or FloatFormats (or None for "
                        f"all of them), got {formats!r}")
    if not formats:
        raise ValueError("formats must name at least one format")
    found = [get_format(f, name=f"formats[{i}]") for i, f in enumerate(formats)]
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        raise ValueError(f"formats must not repeat a format, got {names}")
    return found


def _power(exponent: int) -> str:
    return f"$2^{{{exponent}}}$"


def limits_text(f: FloatFormat) -> str:
    """The line under a format's row: its largest number, smallest normal and subnormal numbers
    and eps, from its (e, m) and convention."""
    tail = ", no inf" if f.finite_only else ""
    return (f"max {f.max:.3g}{tail}   ·   smallest normal {_power(f.emin)}   ·   "
            f"subnormal {_power(f.emin - f.mantissa_bits)}   ·   eps {_power(-f.mantissa_bits)}")


def draw_bit_fields(formats: Sequence[str | FloatFormat] | None = None, ax=None):
    """The sign, exponent and mantissa bits of each of `formats` (names such as "bf16", or
    `FloatFormat`s; default: all of `FORMATS`) as a row of boxes, one per bit, aligned on the binary
    point, each row's range and eps written under it. Returns the figure.

    Patches carry gids "<format>-sign", "<format>-exponent" and "<format>-mantissa" (one per bit);
    the limits line the gid "<format>-limits"."""
    fmts = _formats(formats)
    if ax is None:
        fig, ax = subplots(width=8.4, height=0.66 * len(fmts) + 1.0)
    else:
        fig = ax.figure
    ax.axis("off")
    left = -1 - max(f.exponent_bits for f in fmts)  # the sign bit of the widest exponent
    right = max(f.mantissa_bits for f in fmts)
    for row, f in enumerate(fmts):
        y = -row * ROW
        fields = [("sign", -1 - f.exponent_bits, 1), ("exponent", -f.exponent_bits,
                                                       f.exponent_bits),
                  ("mantissa", 0, f.mantissa_bits)]
        for field, x0, width in fields:
            for bit in range(width):
                ax.add_patch(Rectangle((x0 + bit, y), 1, 1, facecolor=FIELD_COLORS[field],
                                       edgecolor="white", lw=0.5, gid=f"{f.name}-{field}"))
            if field != "sign":
                ax.text(x0 + width / 2, y + 0.5, str(width), ha="center", va="center",
                        fontsize=8, color="white", fontweight="bold", gid=f"{f.name}-width")
        ax.text(left - 0.8, y + 0.5, f"{f.name} ({f.bits} bits)", ha="right", va="center",
                fontsize=9.5, gid=f"{f.name}-name")
        ax.text(left, y - 0.25, limits_text(f), ha="left", va="top", fontsize=8.5,
                color="#333333", gid=f"{f.name}-limits")
        ax.plot([0, 0], [y - 0.15, y + 1.15 if row else y + 2.0], color=COLORS["ceiling"],
                ls="--", lw=0.8)  # the binary point, broken where the limits line passes
    bottom = -(len(fmts) - 1) * ROW - 1.4
    ax.text(-0.4, 2.1, "← range: exponent bits", ha="right", va="bottom", fontsize=8.5,
            gid="range-side")
    ax.text(0.4, 2.1, "precision: mantissa bits →", ha="left", va="bottom", fontsize=8.5,
            gid="precision-side")
    ax.set_xlim(left - 10.5, right + 0.5)
    ax.set_ylim(bottom - 0.2, 3.0)
    handles = [Patch(facecolor=c, label=field) for field, c in FIELD_COLORS.items()]
    ax.legend(handles=handles, loc="lower right", ncol=3, fontsize=8, frameon=False,
              bbox_to_anchor=(1.0, 1.0))
    finish(ax, title="One box per bit, aligned on the binary point", legend=False)
    return fig


def next_gap(values: Sequence[float], fmt: str | FloatFormat) -> list[float]:
    """Measured spacing: for each of `values` (> 0, stored in `fmt`'s torch dtype), the distance to
    the next larger number torch stores, found by adding 1 to the stored word."""
    f = get_format(fmt)
    stored = torch.tensor([checks.positive(v, "values[i]") for v in values], dtype=f.dtype)
    above = (stored.view(WORDS[f.bits]) + 1).view(f.dtype)
    return (above.double() - stored.double()).tolist()


def draw_spacing(formats: Sequence[str | FloatFormat] | None = None, ax=None, *,
                 measured: Sequence[str] = ("fp32", "fp16", "bf16"), lo: int = -26,
                 hi: int = 17):
    """ulp(x) against |x| from 2^lo to 2^hi (both log2) for each of `formats` (default: all), a
    line from each format's smallest subnormal to its max; circles: `next_gap` measured at every
    third power of two for the formats of `measured`, which must equal `ulp` (else RuntimeError).
    Returns the figure."""
    fmts = _formats(formats)
    checks.integer(lo, "lo")
    checks.integer(hi, "hi")
    if hi <= lo:
        raise ValueError(f"hi must be above lo, got lo={lo}, hi={hi}")
    unknown = set(measured) - {f.name for f in fmts if f.torch_dtype}
    if unknown:
        raise ValueError(f"measured names {sorted(unknown)}: not among the drawn formats that "
                         "torch stores")
    if ax is None:
        fig, ax = subplots(width=7.0, height=4.2)
    else:
        fig = ax.figure
    grid = [2.0 ** (k / 50) for k in range(lo * 50, hi * 50)]
    for color, f in zip(CYCLE * 2, fmts, strict=False):
        xs = [x for x in grid if f.smallest_subnormal <= x <= f.max]
        ax.plot(xs, [ulp(x, f) for x in xs], color=color, lw=1.4, label=f"{f.name} (ulp)",
                gid=f"{f.name}-ulp")
        if f.name in measured:
            probe = [2.0**k for k in range(lo, hi, 3) if 2.0**k <= f.max]
            gap = next_gap(probe, f)
            if gap != [ulp(x, f) for x in probe]:
                raise RuntimeError(f"torch's {f.name} spacing differs from ulp: {gap}")
            ax.plot(probe, gap, "o", color=color, ms=5, mfc="none",
                    label=f"{f.name} measured gap", gid=f"{f.name}-measured")
    finish(ax, title="Spacing of representable numbers", xlabel="|x|", ylabel="ulp(x)", logx=2,
           logy=2, legend=False)
    ax.legend(ncol=2, fontsize=8, frameon=False)
    return fig
