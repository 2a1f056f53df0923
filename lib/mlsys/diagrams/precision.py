"""Mixed precision drawn (chapter 07): the loss scale at work, gradients against fp16's range,
autocast's dtypes, and bf16 weights that stall.

- `draw_loss_scale`: a dynamic loss scaler's run, step by step: the scale S it used (a sawtooth
  on a log axis: doubled after a run of finite steps, halved at an overflow), the largest
  |gradient| the low-precision backward stored (S times the true one), the true one (that divided
  by S), and the format's largest finite number, under which the stored gradients must stay.
  Overflow steps (skipped updates) are marked.
- `zone_limits` / `zone_shares` / `draw_gradient_histogram`: |gradient| entries, times a loss
  scale, sorted into a format's zones by what rounding to it does: underflow (rounds to 0: at most
  half the smallest subnormal, 2^-25 for fp16), subnormal (rounds to a number below the smallest
  normal, 2^-14: fewer significant bits), normal, overflow (rounds to inf; saturates in the "fn"
  formats). The limits follow from the format's (e, m) in `mlsys.numerics.precision.FORMATS`; the
  histogram has one bin per power of two.
- `draw_autocast_map`: the dtype of each module's input, matmul operands, output and weight
  gradients under autocast, as `mlsys.numerics.dtype_recorder` recorded them: one coloured cell per
  (module, item), one group of columns per device.
- `draw_stagnation`: losses of runs that nearly coincide, in two panels: the losses with a marker
  shape each, and each run's loss minus a reference run's, where the gaps show.
References: Micikevicius et al. (2018), "Mixed Precision Training"; IEEE 754-2019.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch
from matplotlib.patches import Patch, Rectangle

from mlsys import checks
from mlsys.numerics.precision import FloatFormat, get_format
from mlsys.plotting import COLORS, CYCLE, finish, marker_styles, subplots

ZONES = ("underflow", "subnormal", "normal", "overflow")
"""What rounding to a format does to a magnitude, from the smallest magnitudes up."""
ZONE_COLORS = {"underflow": "#D55E00", "subnormal": "#E69F00", "normal": "#009E73",
               "overflow": "#CC79A7"}
DTYPE_COLORS = {"fp32": COLORS["measured"], "fp16": COLORS["predicted"], "bf16": COLORS["accent"],
                "fp64": "#56B4E9", "int64": COLORS["muted"], "-": "#F2F2F2"}
"""One colour per dtype in the autocast map; "-" is a cell with nothing recorded."""


def _figure(ax, width: float, height: float):
    if ax is None:
        return subplots(width=width, height=height)
    return ax.figure, ax


def _power(x: float) -> str:
    """x as $2^{k}$ when it is a power of two, else in %g."""
    k = math.log2(x)
    return f"$2^{{{int(k)}}}$" if k == int(k) else f"{x:g}"


# --- the loss-scale sawtooth --------------------------------------------------------------------


def draw_loss_scale(scales: Sequence[float], finite: Sequence[bool],
                    grad_amax: Sequence[float], *, fmt: str | FloatFormat = "fp16", ax=None):
    """One point per step of a dynamic loss scaler's run: `scales[i]`, the S step i+1 multiplied
    its loss by; `finite[i]`, whether all its gradients were finite; `grad_amax[i]`, the largest
    |gradient| its backward stored in `fmt` (scaled by S; inf or NaN where it overflowed). Draws S
    (stairs), the stored amax, the true amax (stored / S), the format's max and the overflow steps
    on one log2 axis. Returns the figure.

    Artists carry gids "scale", "stored-amax", "true-amax", "format-max" and "overflow"."""
    f = get_format(fmt)
    n = len(scales)
    if n == 0 or len(finite) != n or len(grad_amax) != n:
        raise ValueError(f"scales, finite and grad_amax must have one entry per step (> 0), got "
                         f"{n}, {len(finite)} and {len(grad_amax)}")
    for i, (s, ok, a) in enumerate(zip(scales, finite, grad_amax, strict=True)):
        checks.positive(s, f"scales[{i}]")
        if not isinstance(ok, bool):
            raise TypeError(f"finite[{i}] must be a bool, got {ok!r}")
        if ok != math.isfinite(a):
            raise ValueError(f"finite[{i}] is {ok} but grad_amax[{i}] is {a}: a step is finite "
                             "exactly when its largest stored gradient is")
    fig, ax = _figure(ax, 7.0, 3.9)
    steps = range(1, n + 1)
    ok_steps = [i for i in steps if finite[i - 1]]
    bad = [i for i in steps if not finite[i - 1]]
    ax.stairs(scales, [i + 0.5 for i in range(n + 1)], baseline=None, color=COLORS["measured"],
              lw=1.6, label="loss scale S", gid="scale")
    ax.plot(ok_steps, [grad_amax[i - 1] for i in ok_steps], ".", ms=3, color=COLORS["accent"],
            label=f"largest |gradient| × S, as stored in {f.name}", gid="stored-amax")
    ax.plot(ok_steps, [grad_amax[i - 1] / scales[i - 1] for i in ok_steps], "-", lw=1,
            color=CYCLE[3], label="largest |gradient| (÷ S)", gid="true-amax")
    ax.axhline(f.max, color=COLORS["ceiling"], ls="--", lw=1, gid="format-max",
               label=f"{f.name} max ({f.max:,.0f})")
    ax.plot(bad, [f.max] * len(bad), "x", color=COLORS["predicted"], ms=6, mew=1.5,
            gid="overflow", label=f"overflow: step skipped, S halved ({len(bad)} steps)")
    finish(ax, title="Dynamic loss scaling, step by step", xlabel="step", logy=2, legend=False)
    ax.legend(fontsize=7.5, frameon=False, loc="center right", bbox_to_anchor=(1.0, 0.45))
    return fig


# --- gradients against a format's range ---------------------------------------------------------


def zone_limits(fmt: str | FloatFormat = "fp16") -> dict[str, tuple[float, float]]:
    """(lower, upper) magnitude of each zone of `ZONES` for `fmt`, from its (e, m). Ties round to
    even, so each limit belongs to the zone its rounding goes to: underflow 0 < x <= half the
    smallest subnormal (rounds to 0), subnormal between the two limits, normal from the midpoint
    below the smallest normal (rounds up to it) and overflow from the midpoint above the max
    (rounds to inf; in an "fn" format, above the max)."""
    f = get_format(fmt)
    half_sub = f.smallest_subnormal / 2
    top_sub = f.smallest_normal - half_sub  # rounds up to the smallest normal
    overflow = f.max if f.finite_only else f.max + math.ldexp(0.5, f.emax - f.mantissa_bits)
    return {"underflow": (0.0, half_sub), "subnormal": (half_sub, top_sub),
            "normal": (top_sub, overflow), "overflow": (overflow, math.inf)}


def _magnitudes(values) -> torch.Tensor:
    tensors = [values] if isinstance(values, torch.Tensor) else list(values)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("values must be a tensor or a sequence of tensors")
    x = torch.cat([t.detach().flatten().double() for t in tensors]).abs()
    if not torch.isfinite(x).all():
        raise ValueError("values must be finite (take them from a float32 backward)")
    x = x[x != 0]
    if x.numel() == 0:
        raise ValueError("values has no non-zero entry to sort into zones")
    return x


def zone_shares(values, fmt: str | FloatFormat = "fp16", *, scale: float = 1.0
                ) -> dict[str, float]:
    """Fraction of the non-zero entries of `values` (a tensor or tensors, e.g. float32 gradients)
    that, multiplied by `scale`, fall in each zone of `fmt` (`zone_limits`): what a cast to `fmt`
    flushes to 0, leaves subnormal, keeps normal or overflows."""
    checks.positive(scale, "scale")
    x = _magnitudes(values) * scale
    lim = zone_limits(fmt)
    under, top_sub, over = lim["underflow"][1], lim["subnormal"][1], lim["overflow"][0]
    counts = {"underflow": (x <= under).sum(), "subnormal": ((x > under) & (x < top_sub)).sum(),
              "normal": ((x >= top_sub) & (x < over)).sum(), "overflow": (x >= over).sum()}
    return {k: int(v) / x.numel() for k, v in counts.items()}


def share_text(shares: Mapping[str, float]) -> str:
    """'0.01% underflow, 18.7% subnormal' (and overflow where any), for a legend or a page."""
    parts = [f"{100 * shares[k]:.3g}% {k}" for k in ("underflow", "subnormal")]
    if shares.get("overflow", 0.0) > 0:
        parts.append(f"{100 * shares['overflow']:.3g}% overflow")
    return ", ".join(parts)


def draw_gradient_histogram(values, *, fmt: str | FloatFormat = "fp16",
                            scales: Sequence[float] = (1.0,), ax=None):
    """Histogram of log2 |values| (the non-zero entries, one bin per power of two), once per loss
    scale of `scales` (the values times S), as a share of the entries, over the zones of `fmt`
    shaded from `zone_limits`; each histogram's legend entry gives its `zone_shares`. Returns the
    figure. Histograms carry gids "hist-<S>", zone spans "zone-<name>"."""
    f = get_format(fmt)
    if isinstance(scales, str | float | int) or len(scales) == 0:
        raise ValueError(f"scales must be a non-empty sequence of loss scales, got {scales!r}")
    x = _magnitudes(values)
    for i, s in enumerate(scales):
        checks.positive(s, f"scales[{i}]")
    lo = math.floor(math.log2(min(float(x.min()) * min(scales), f.smallest_subnormal))) - 1
    hi = math.ceil(math.log2(max(float(x.max()) * max(scales), f.max))) + 2
    edges = [2.0**k for k in range(lo, hi + 1)]
    fig, ax = _figure(ax, 7.0, 3.9)
    lim = zone_limits(f)
    for zone, (a, b) in lim.items():
        ax.axvspan(max(a, edges[0]), min(b, edges[-1]), color=ZONE_COLORS[zone], alpha=0.13,
                   lw=0, gid=f"zone-{zone}")
    for i, s in enumerate(scales):
        logs = torch.log2(x * s)
        counts = torch.histc(logs, bins=hi - lo, min=lo, max=hi) / x.numel()
        ax.stairs(counts.tolist(), edges, color=CYCLE[i % len(CYCLE)], lw=1.6,
                  fill=i == 0, alpha=0.35 if i == 0 else 1.0, gid=f"hist-{s:g}",
                  label=f"S = {_power(s)}: {share_text(zone_shares(x, f, scale=s))}")
    for v, text in ((lim["underflow"][1], "rounds to 0 below"), (f.smallest_normal, "normal from"),
                    (f.max, "max")):
        ax.axvline(v, color=COLORS["ceiling"], lw=0.8, ls=":")
        ax.annotate(f"{text} {_power(v)}", (v, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -3), textcoords="offset points", fontsize=7, va="top",
                    rotation=90, gid="limit")
    finish(ax, title=f"Gradient magnitudes against {f.name}'s range", xlabel="|gradient| × S",
           ylabel="share of entries", logx=2, legend=False)
    zones = [Patch(color=ZONE_COLORS[z], alpha=0.3, label=z) for z in ZONES]
    ax.legend(handles=ax.get_legend_handles_labels()[0] + zones, fontsize=7, frameon=False,
              loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2)
    return fig


# --- autocast's dtype per module ----------------------------------------------------------------


def _cell_dtypes(cell: str, where: str) -> list[str]:
    names = (list(dict.fromkeys(re.split(r"\s*[,/]\s*", cell.strip())))
             if isinstance(cell, str) else [])
    if not names or not all(n in DTYPE_COLORS for n in names):
        raise ValueError(f"{where} = {cell!r}: every dtype must have a colour in DTYPE_COLORS "
                         f"({', '.join(DTYPE_COLORS)})")
    return names


def draw_autocast_map(maps: Mapping[str, Mapping[str, Mapping[str, str]]], *, ax=None):
    """`maps[panel][row][column]`: a dtype as recorded ("fp16"; several as "fp32, bf16" or
    "fp32/bf16"; "-" for nothing), e.g. panel = a device, row = a module, column = "input". One
    cell per (row, column), split into one coloured strip per dtype it names, one group of
    columns per panel; every panel must have the same rows and columns. Returns the figure.
    Cells carry the gid "cell:<panel>:<row>:<column>" (one patch per strip)."""
    if not isinstance(maps, Mapping) or not maps:
        raise ValueError("maps must map at least one panel to its rows")
    panels = list(maps)
    rows = list(maps[panels[0]])
    if not rows or not all(isinstance(maps[panels[0]][r], Mapping) for r in rows):
        raise ValueError(f"maps[{panels[0]!r}] must map at least one row to its columns")
    columns = list(maps[panels[0]][rows[0]])
    for p in panels:
        if list(maps[p]) != rows:
            raise ValueError(f"maps[{p!r}] has rows {list(maps[p])}, the first panel {rows}")
        for r in rows:
            if list(maps[p][r]) != columns:
                raise ValueError(f"maps[{p!r}][{r!r}] has columns {list(maps[p][r])}, the first "
                                 f"row {columns}")
    width = len(columns) + 0.6  # a group of columns and the gap after it
    fig, ax = _figure(ax, 7.0, 0.27 * len(rows) + 1.5)
    ax.axis("off")
    seen: dict[str, None] = {}
    for g, p in enumerate(panels):
        x0 = g * width
        ax.text(x0 + len(columns) / 2, 2.3, p, ha="center", va="bottom", fontsize=8.5,
                fontweight="bold", gid="panel")
        for j, col in enumerate(columns):
            ax.text(x0 + j + 0.5, 0.65, col.replace(" ", "\n"), ha="center", va="bottom",
                    fontsize=7, gid="column")
        for i, r in enumerate(rows):
            for j, col in enumerate(columns):
                cell = maps[p][r][col]
                names = _cell_dtypes(cell, f"maps[{p!r}][{r!r}][{col!r}]")
                strip = 0.94 / len(names)
                for k, name in enumerate(names):
                    seen[name] = None
                    ax.add_patch(Rectangle((x0 + j + 0.03 + k * strip, -i - 0.45), strip, 0.9,
                                           facecolor=DTYPE_COLORS[name], edgecolor="none",
                                           gid=f"cell:{p}:{r}:{col}"))
                ax.text(x0 + j + 0.5, -i, "–" if cell.strip() == "-" else cell, ha="center",
                        va="center", fontsize=6.5,
                        color="#777777" if cell.strip() == "-" else "white", gid="cell-text")
    for i, r in enumerate(rows):
        ax.text(-0.15, -i, r, ha="right", va="center", fontsize=7.5, gid="row")
    ax.set_xlim(-0.1, len(panels) * width - 0.6)
    ax.set_ylim(-len(rows) + 0.4, 2.9)
    handles = [Patch(facecolor=DTYPE_COLORS[n], label="nothing" if n == "-" else n)
               for n in seen]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=7.5,
              frameon=False, ncol=len(handles))
    return fig


# --- losses that nearly coincide ----------------------------------------------------------------


def draw_stagnation(losses: Mapping[str, Sequence[float]], *, reference: str, ax=None):
    """Loss per step of each run of `losses` (label: losses, all the same length) in two panels:
    the losses, each run with its own colour and marker; and each run's loss minus `reference`'s,
    where runs that lie on top of each other in the first panel come apart. `ax`: None or a pair
    of axes. Returns the figure. Lines carry gids "loss:<label>" and "gap:<label>"."""
    if not isinstance(losses, Mapping) or len(losses) < 2:
        raise ValueError("losses must map two or more runs to their losses")
    checks.choice(reference, "reference", list(losses))
    n = len(losses[reference])
    bad = {k: len(v) for k, v in losses.items() if len(v) != n or n == 0}
    if bad:
        raise ValueError(f"every run must have {n} (> 0) losses, like {reference!r}; got {bad}")
    if ax is None:
        fig, axes = subplots(1, 2, width=7.6, height=3.4)
    else:
        if len(ax) != 2:
            raise ValueError(f"ax must be None or a pair of axes, got {len(ax)}")
        fig, axes = ax[0].figure, ax
    steps = range(1, n + 1)
    every = max(1, n // 10)
    for (color, marker), (label, curve) in zip(marker_styles(len(losses), "runs"), losses.items(),
                                               strict=True):
        style = dict(color=color, marker=marker, ms=5, mfc="none", lw=1.2)
        axes[0].plot(steps, curve, markevery=(0, every), label=label, gid=f"loss:{label}",
                     **style)
        gap = [a - b for a, b in zip(curve, losses[reference], strict=True)]
        axes[1].plot(steps, gap, markevery=(every // 2, every), gid=f"gap:{label}", **style)
    finish(axes[0], title="Loss", xlabel="step", ylabel="loss", legend=False)
    finish(axes[1], title=f"Loss minus that of {reference}", xlabel="step", ylabel="difference",
           legend=False)
    axes[0].legend(fontsize=7, frameon=False)
    return fig
