"""One house style for every figure in the book.

`subplots()` makes a figure with the book's size, fonts and grid; `finish(ax, ...)` labels it.
Colors come from `COLORS` (colour-blind-safe, Okabe-Ito) so a quantity keeps its colour across
chapters: measured values in `COLORS["measured"]`, predictions in `COLORS["predicted"]`, hardware
ceilings in `COLORS["ceiling"]`. Nothing is changed globally: the style is applied per figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt

COLORS = {
    "measured": "#0072B2",  # blue
    "predicted": "#D55E00",  # vermillion
    "ceiling": "#000000",  # black
    "accent": "#009E73",  # green
    "muted": "#999999",
}
CYCLE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
MARKERS = ["o", "s", "D", "^", "v", "<", ">", "P", "X", "*", "h", "p"]
"""Marker shapes for many points on one axes (colour and shape together tell them apart)."""

DPI = 110


def subplots(nrows: int = 1, ncols: int = 1, *, width: float = 6.4, height: float = 3.8,
             **kwargs: Any):
    """`plt.subplots` in the house style; returns (figure, axes). Sizes are inches per whole figure.

    The style is applied to the new axes directly (no `rc_context`: leaving one resets pyplot's
    interactive state, and later figures in a notebook would no longer display).
    """
    if nrows < 1 or ncols < 1:
        raise ValueError(f"nrows ({nrows}) and ncols ({ncols}) must be at least 1")
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), dpi=DPI, layout="constrained",
                             **kwargs)
    for ax in fig.axes:
        ax.set_prop_cycle(color=CYCLE)
        ax.grid(True, alpha=0.3, which="major")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return fig, axes


def finish(
    ax,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logx: bool | int = False,
    logy: bool | int = False,
    legend: bool = True,
) -> None:
    """Label an axes; `logx=2` gives a base-2 log axis, `True` base 10."""
    if title:
        ax.set_title(title, loc="left")
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=10 if logx is True else logx)
    if logy:
        ax.set_yscale("log", base=10 if logy is True else logy)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, fontsize=9)


def stacked_bars(ax, labels: Sequence[str], parts: dict[str, Sequence[float]], *,
                 ylabel: str = "") -> None:
    """Stacked bar chart: one bar per label, one segment per entry of `parts` (same length as
    labels)."""
    bottoms = [0.0] * len(labels)
    for color, (part, values) in zip(CYCLE, parts.items(), strict=False):
        if len(values) != len(labels):
            raise ValueError(f"parts[{part!r}] has {len(values)} values for {len(labels)} labels")
        ax.bar(labels, values, bottom=bottoms, label=part, color=color)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    if ylabel:
        ax.set_ylabel(ylabel)


def roofline(ax, ceilings, *, lo: int, hi: int, **line_kwargs: Any) -> None:
    """Draw the roof min(peak, intensity x bandwidth) of `ceilings` (an `mlsys.roofline.Ceilings`)
    from intensity 2**lo to 2**hi FLOP/byte, through its ridge point, on log-log axes."""
    if lo >= hi:
        raise ValueError(f"lo ({lo}) must be below hi ({hi})")
    xs = {2.0**e for e in range(lo, hi + 1)}
    if 2.0**lo < ceilings.ridge_intensity < 2.0**hi:
        xs.add(ceilings.ridge_intensity)  # the corner of the roof
    xs = sorted(xs)
    line_kwargs.setdefault("color", COLORS["ceiling"])
    ax.plot(xs, [ceilings.attainable_flop_per_s(x) for x in xs], **line_kwargs)
