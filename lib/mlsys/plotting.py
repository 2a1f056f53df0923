"""One house style for every figure in the book, and the figures of the cost models.

`subplots()` makes a figure with the book's size, fonts and grid; `finish(ax, ...)` labels it.
Colors come from `COLORS` (colour-blind-safe, Okabe-Ito) so a quantity keeps its colour across
chapters: measured values in `COLORS["measured"]`, predictions in `COLORS["predicted"]`, hardware
ceilings in `COLORS["ceiling"]`. Nothing is changed globally: the style is applied per figure.
`marker_styles` gives each series its own colour and shape (or refuses), and `label_points` labels
points so that no two labels overprint.

The cost models' figures draw what `mlsys.accounting` computes and compute nothing of their own:
model states against model size (`plot_model_states`, chapter 02), operations under a spec's
roofline (`plot_op_roofline`, chapter 04), DDP's bucket sweeps (`plot_bucket_sweeps`, chapter 08),
the planner's meshes (`plot_plans`), the compute-bound curves (`plot_compute_bound`) and the
decision map (`plot_first_choices`, chapter 09), and a step of the calibrated step model broken
down (`step_breakdown`, the page on published runs). A little over 300 lines: the house style and
the figures that use it, one module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.patches import Patch
from matplotlib.text import OffsetFrom

from mlsys.accounting import compute_bound, memory, planner
from mlsys.accounting.buckets import BucketPoint
from mlsys.accounting.op_costs import OpCost
from mlsys.hardware import Accelerator
from mlsys.roofline import Ceilings
from mlsys.tables import STEP_PARTS, plan_text, step_parts

COLORS = {
    "measured": "#0072B2",  # blue
    "predicted": "#D55E00",  # vermillion
    "ceiling": "#000000",  # black
    "accent": "#009E73",  # green
    "muted": "#999999",
}
CYCLE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
MARKERS = ["o", "s", "D", "^", "v", "<", ">", "P", "X", "*", "h", "p", "d", "H", "8"]
"""Marker shapes for many points on one axes (colour and shape together tell them apart); a plot
that gives each series its own shape raises rather than drop the series past the last one."""

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


def finish(ax, *, title: str | None = None, xlabel: str | None = None,
           ylabel: str | None = None, logx: bool | int = False, logy: bool | int = False,
           legend: bool = True) -> None:
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


def marker_styles(n: int, what: str = "series") -> list[tuple[str, str]]:
    """(colour, marker) for `n` series, each pair different; ValueError when `n` exceeds the
    `MARKERS` (a series would otherwise be dropped without a word)."""
    if n > len(MARKERS):
        raise ValueError(f"{n} {what} but only {len(MARKERS)} marker shapes (plotting.MARKERS): "
                         "add shapes there, or plot fewer")
    return [(CYCLE[i % len(CYCLE)], MARKERS[i]) for i in range(n)]


def label_points(ax, points: Sequence[tuple[float, float]], texts: Sequence[str], *,
                 avoid: Sequence[tuple[float, float]] = (), fontsize: float = 7):
    """Label `points` (data coordinates) with `texts` stacked one line apart in the corner of the
    axes with fewest of the `avoid` points, each joined to its point by a thin line, so that the
    labels of points that lie close (or on top of each other) never overprint. Call it after the
    axes' scales are set. Returns the annotations."""
    if len(points) != len(texts):
        raise ValueError(f"{len(points)} points for {len(texts)} texts")
    if not texts:
        return []
    to_axes = ax.transData + ax.transAxes.inverted()
    x, y = to_axes.transform(np.asarray(list(avoid) or list(points), dtype=float)).T
    step = 1.8 * fontsize  # points between the labels' baselines
    height = len(texts) * step / max(ax.bbox.height * 72 / ax.figure.dpi, 1.0) + 0.05
    top, bottom, right = y > 0.97 - height, y < 0.03 + height, x > 0.5
    crowds = {(0.98, 0.97): right & top, (0.98, 0.03 + height): right & bottom,
              (0.02, 0.97): ~right & top, (0.02, 0.03 + height): ~right & bottom}
    x0, y0 = min(crowds, key=lambda corner: int(crowds[corner].sum()))  # the emptiest corner
    return [ax.annotate(
        text, point, xycoords="data", xytext=(0, -i * step), textcoords=OffsetFrom(ax, (x0, y0)),
        ha="right" if x0 > 0.5 else "left", va="top", fontsize=fontsize,
        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85),
        arrowprops=dict(arrowstyle="-", color=COLORS["muted"], lw=0.6, shrinkA=0, shrinkB=3))
        for i, (point, text) in enumerate(zip(points, texts, strict=True))]


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


# --- the cost models' figures --------------------------------------------------------------------

GB = 1e9


def plot_model_states(n_params: dict[str, int], ax=None, *, accelerator: Accelerator,
                      n_devices: int):
    """Model states (GB) against parameters from 1e5 to 1e12, one line per recipe of
    `memory.RECIPES` (dashed where an earlier recipe has the same bytes per parameter); the
    presets `n_params` (name: parameters) marked at 16 B/param; the HBM of one and of `n_devices`
    accelerators as ceilings, each with the largest fp32 AdamW model under it. Returns the axes."""
    if ax is None:
        _, ax = subplots()
    sizes = torch.logspace(5, 12, 60, dtype=torch.float64).tolist()
    drawn = set()  # a recipe with the bytes/param of an earlier one shares its line: dashed
    for color, r in zip(CYCLE, memory.RECIPES.values(), strict=False):
        ax.plot(sizes, [s * r.bytes_per_param / GB for s in sizes], color=color, label=r.name,
                linestyle=(0, (4, 4)) if r.bytes_per_param in drawn else "-")
        drawn.add(r.bytes_per_param)
    for i, (name, p) in enumerate(n_params.items()):
        preset_gb = memory.model_state_bytes(p, "fp32_adamw") / GB
        ax.plot(p, preset_gb, "o", color="white", markeredgecolor=COLORS["ceiling"],
                label="presets (16 B/param)" if i == 0 else None)
        ax.annotate(name, (p, preset_gb), xytext=(-6, 6), textcoords="offset points", ha="right",
                    fontsize=7)
    for devices, style in ((1, ":"), (n_devices, "-.")):
        ceiling_gb = devices * accelerator.hbm_bytes / GB
        ax.axhline(ceiling_gb, color=COLORS["ceiling"], linestyle=style, lw=1,
                   label=f"{devices} x {accelerator.name} ({ceiling_gb:.0f} GB)")
        limit = memory.max_trainable_params(devices, accelerator.hbm_bytes, "fp32_adamw")
        ax.axvline(limit, color=COLORS["muted"], linestyle=style, lw=1)
        ax.annotate(f"{limit / GB:.0f}B", (limit, ceiling_gb), xytext=(4, -12),
                    textcoords="offset points", fontsize=8)
    finish(ax, title="Model states versus model size", xlabel="parameters",
           ylabel="model states (GB)", logx=True, logy=True)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def plot_op_roofline(ops: Sequence[OpCost], ax=None, *, accelerator: Accelerator, dtype: str):
    """Each operation (`op_costs.op_costs` in `dtype`) at its intensity (FLOP/byte) and attainable
    FLOP/s under the spec roofline of `accelerator` in `dtype`, drawn from 2**-5 to 2**14 FLOP/byte
    with its ridge point dotted. Returns the axes."""
    if ax is None:
        _, ax = subplots()
    roof = Ceilings.from_spec(accelerator, dtype)
    roofline(ax, roof, lo=-5, hi=14, lw=2, label=f"{accelerator.name} roof, {dtype} (spec)")
    ax.axvline(roof.ridge_intensity, color=COLORS["muted"], ls=":", lw=1)
    for (color, marker), op in zip(marker_styles(len(ops), "operations"), ops, strict=True):
        ax.plot([op.intensity], [roof.attainable_flop_per_s(op.intensity)], marker, color=color,
                ms=7, label=op.name)
    finish(ax, title=f"Napkin roofline: operations on an {accelerator.name} ({dtype})",
           xlabel="arithmetic intensity (FLOP/byte)", ylabel="attainable FLOP/s", logx=2,
           logy=True)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


def plot_bucket_sweeps(sweeps: dict[str, list[BucketPoint]], ax):
    """Exposed communication (and its tail and queue bounds, dotted and dashed) against the bucket
    cap in MiB, one colour per sweep (`accounting.buckets.bucket_sweep`). Returns the axes."""
    for color, (name, points) in zip(CYCLE, sweeps.items(), strict=False):
        caps = [p.cap_bytes / 2**20 for p in points]
        ax.plot(caps, [p.exposed_s * 1e3 for p in points], "o-", color=color,
                label=f"{name}: exposed")
        ax.plot(caps, [p.tail_s * 1e3 for p in points], ":", color=color, label="tail")
        ax.plot(caps, [p.queue_s * 1e3 if p.queue_s > 0 else math.nan for p in points], "--",
                color=color, label="queue")
    finish(ax, title="communication left after the backward (model)",
           xlabel="bucket cap (MiB)", ylabel="ms", logx=2, logy=True)
    ax.legend(fontsize=7, ncol=2, frameon=False, loc="upper center")
    return ax


def plot_plans(plans: list[planner.Plan], ax=None, *, label_top: int = 3):
    """Memory per device against step time, one point per mesh of `planner.plan`, the HBM as a
    line; the best `label_top` that fit labelled with their rank, mesh and micro-batches, stacked
    where they do not overprint (`label_points`). Returns the axes."""
    if ax is None:
        _, ax = subplots()
    fit = [p for p in plans if p.fits]
    over = [p for p in plans if not p.fits]
    for group, color, label in ((fit, COLORS["predicted"], "fits"),
                                (over, COLORS["muted"], "does not fit")):
        if group:
            ax.scatter([p.step_s for p in group], [p.memory.total / GB for p in group], s=14,
                       color=color, label=label)
    if plans:
        ax.axhline(plans[0].hbm_bytes / GB, color=COLORS["ceiling"], lw=1, label="HBM per device")
    finish(ax, xlabel="predicted step time (s)", ylabel="memory per device (GB)", logx=True,
           logy=True)
    top = fit[:label_top]
    label_points(ax, [(p.step_s, p.memory.total / GB) for p in top],
                 [f"{i}. {plan_text(p)}, m = {p.microbatches}" for i, p in enumerate(top, 1)],
                 avoid=[(p.step_s, p.memory.total / GB) for p in plans])
    return ax


def plot_compute_bound(d_model: int, d_ff: int, n_devices: int, *, flop_per_s: float,
                       link_bytes_per_s: float, m_x: float = 1, m_y: float = 1,
                       fixed_xy: tuple[int, int] | None = None, model: str = "sum", ax=None):
    """T_math / T_comms of one layer's forward against tokens per device B / N
    (`compute_bound.compute_to_comms_curves`, T_comms the Scaling Book's T_FSDP + T_TP, or their
    max with `model="max"`): pure FSDP, pure TP, FSDP x TP at the optimal split and at `fixed_xy`
    = (X, Y); above 1 the layer is compute-bound. Returns the axes."""
    per_device = np.logspace(0, 5, 200)
    curves = compute_bound.compute_to_comms_curves(
        per_device, d_model, d_ff, n_devices, flop_per_s=flop_per_s,
        link_bytes_per_s=link_bytes_per_s, m_x=m_x, m_y=m_y, fixed_xy=fixed_xy, model=model)
    if ax is None:
        _, ax = subplots()
    labels = {"fsdp": f"FSDP, X = {n_devices}", "tp": f"TP, Y = {n_devices}",
              "optimal": "FSDP x TP, optimal X"}
    if fixed_xy is not None:
        labels["fixed"] = f"FSDP x TP, X = {fixed_xy[0]}, Y = {fixed_xy[1]}"
    for i, (key, ratios) in enumerate(curves.items()):
        ax.plot(per_device, ratios, label=labels[key], color=CYCLE[i])
    ax.axhline(1.0, color=COLORS["ceiling"], lw=1, ls="--", label="compute = comms")
    finish(ax, xlabel="tokens per device, B / N", ylabel="T_math / T_comms", logx=True, logy=True)
    return ax


def plot_first_choices(choices: dict[tuple[int, int], planner.Plan | None], ax=None):
    """The decision tree drawn by the planner (`planner.first_choices`): one cell per (global
    batch, seq), coloured by the family of its first choice and labelled with the mesh and its
    predicted MFU. Returns the axes."""
    if ax is None:
        _, ax = subplots()
    batches = sorted({b for b, _ in choices})
    seqs = sorted({s for _, s in choices})
    names = sorted({planner.family(p.dims) for p in choices.values() if p is not None})
    codes = {name: i for i, name in enumerate(names)}
    grid = np.full((len(seqs), len(batches)), np.nan)
    for (b, s), p in choices.items():
        if p is not None:
            grid[seqs.index(s), batches.index(b)] = codes[planner.family(p.dims)]
    colors = [to_rgba(CYCLE[i % len(CYCLE)], 0.55) for i in range(len(names))]
    ax.imshow(grid, cmap=ListedColormap(colors or ["white"]), vmin=-0.5,
              vmax=max(len(names), 1) - 0.5, origin="lower", aspect="auto")
    for (b, s), p in choices.items():
        text = "nothing fits" if p is None else f"{plan_text(p)}\n{p.mfu:.0%}"
        ax.text(batches.index(b), seqs.index(s), text, ha="center", va="center", fontsize=6)
    ax.grid(False)
    ax.set_xticks(range(len(batches)), [f"{b:,}" for b in batches])
    ax.set_yticks(range(len(seqs)), [f"{s:,}" for s in seqs])
    ax.set_xlabel("global batch (sequences)")
    ax.set_ylabel("sequence length (tokens)")
    ax.legend(handles=[Patch(color=c, label=n) for n, c in zip(names, colors, strict=True)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


STEP_PART_STYLES = {"compute": ("#0072B2", ""), "recompute": ("#56B4E9", ""),
                    "bubble": (COLORS["muted"], ""), "tp": ("#D55E00", ""),
                    "cp": ("#CC79A7", ""), "ep": ("#F0E442", ""), "pp": ("#E69F00", ""),
                    "dp": ("#009E73", ""), "fsdp": ("#009E73", "//"), "optimizer": ("#000000", "")}
"""(colour, hatch) of each part of a step (`tables.STEP_PARTS`): compute in blues, the bubble
grey, each axis' exposed communication its own colour (FSDP hatched beside DP)."""


def step_breakdown(steps: dict[str, Any], ax=None, *, share: bool = True):
    """One stacked bar per step of `steps` (its label: a `step_model.StepBreakdown` or a
    `planner.Plan`), one segment per part of `tables.step_parts` that is above zero in some step:
    the share of the step in percent (`share`), or seconds. Returns the axes."""
    if not steps:
        raise ValueError("steps must hold at least one breakdown")
    parts = {name: step_parts(b) for name, b in steps.items()}
    if ax is None:
        _, ax = subplots()
    labels = list(parts)
    bottoms = [0.0] * len(labels)
    for key, name in STEP_PARTS.items():
        values = [p[key] / (sum(p.values()) / 100 if share else 1.0) for p in parts.values()]
        if not any(v > 0 for v in values):
            continue
        color, hatch = STEP_PART_STYLES[key]
        ax.bar(labels, values, bottom=bottoms, label=name, color=color, hatch=hatch,
               edgecolor="white" if hatch else None, linewidth=0)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    finish(ax, ylabel="share of the step (%)" if share else "seconds per step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax
