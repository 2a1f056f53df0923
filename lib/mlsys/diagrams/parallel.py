"""Chapter 09's diagrams: tensor parallelism's split with f and g, the pipeline schedules, and the
4D mesh laid over a cluster's nodes.

- `draw_tensor_parallel`: a Megatron MLP Z = phi(X A) B on `tp` ranks, one lane per rank: A split
  by columns, B by rows (Shoeybi et al., 2019), the shard shapes from `accounting.parallel`'s
  model shape, and the two conjugate operators, f (identity forward, all-reduce backward) before
  the column-parallel matmul and g (all-reduce forward, identity backward) after the row-parallel
  one.
- `draw_pipeline_schedules`: GPipe's all-forward-all-backward against 1F1B, one timeline row per
  stage played out by `accounting.pipeline.pipeline_timeline`, every idle gap shaded; the shaded
  share of the drawn area is the bubble (p - 1) / (m + p - 1) of both.
- `draw_mesh`: every rank of a `ParallelDims` mesh in its node of a `hardware.Cluster`, one strip
  per mesh axis, coloured by the rank's index along that axis; each axis says whether its groups
  stay inside a node (the node's link) or cross the network.
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle

from mlsys import checks, hardware
from mlsys.accounting import parallel, pipeline
from mlsys.plotting import COLORS, CYCLE, finish, subplots

MAX_TP_LANES = 8
"""`draw_tensor_parallel` draws one lane per rank: at most this many."""
TP_LANE = 1.5
"""Height of one rank's lane in `draw_tensor_parallel` (data units)."""
MAX_MESH_RANKS = 512
"""`draw_mesh` draws one cell per rank: at most this many."""
STAGE_COLORS = {"F": CYCLE[0], "B": CYCLE[1]}
IDLE = "idle"
"""The `gid` of every shaded idle patch of `draw_pipeline_schedules` (and of nothing else)."""


def _figure(ax, **size):
    if ax is None:
        return subplots(**size)
    return ax.figure, ax


def _box(ax, x, y, w, h, text, *, color="white", gid=None, fontsize=7, alpha=1.0):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=COLORS["ceiling"], lw=0.8,
                           alpha=alpha, gid=gid))
    if text:
        ax.text(x + w / 2, y - 0.08, text, ha="center", va="top", fontsize=fontsize)


def tp_shard_shapes(model, tp: int) -> dict[str, tuple[int, int]]:
    """(rows, columns) of what one of `tp` ranks holds of an MLP's A (D x F, split by columns)
    and B (F x D, split by rows), from `parallel.model_shape`; ValueError naming the size that
    `tp` does not divide (`parallel.check_model`'s rule)."""
    t = checks.positive_int(tp, "tp")
    parallel.check_model(model, parallel.ParallelDims(tp=t), batch=1, seq=1)
    shape = parallel.model_shape(model)
    d, f = shape.d_model, dict(shape.tp_must_divide)["d_ff"]
    return {"A": (d, f), "B": (f, d), "A_i": (d, f // t), "B_i": (f // t, d)}


def draw_tensor_parallel(model, tp: int, *, tokens: int | None = None, ax=None):
    """The MLP Z = phi(X A) B of `model` (a `parallel.FeedForwardStack` or a `TransformerConfig`,
    whose SwiGLU splits w1 and w3 like A and w2 like B) on `tp` ranks, one lane per rank: X whole
    on every rank, f, rank i's column stripe A_i of A, its Y_i = phi(X A_i) (phi elementwise, so
    no communication), its row stripe B_i of B, the partial Z_i = Y_i B_i, and g summing the Z_i
    into Z. Shapes in elements (T = `tokens`, or the letter T). Returns the figure."""
    t = checks.positive_int(tp, "tp")
    if t > MAX_TP_LANES:
        raise ValueError(f"tp ({t}) must be <= {MAX_TP_LANES}: one lane per rank is drawn")
    shapes = tp_shard_shapes(model, t)
    d, f = shapes["A"]
    rows = "T" if tokens is None else f"{checks.positive_int(tokens, 'tokens'):,}"
    fig, ax = _figure(ax, width=8.5, height=1.0 + 1.1 * t)
    lane, aw, ah, bw, bh = TP_LANE, 1.6, 0.6, 0.45, 0.9
    xs = {"X": 0.0, "f": 1.45, "A": 2.0, "Y": 4.1, "B": 5.4, "Z_i": 6.5, "g": 8.4, "Z": 8.95}
    for i in range(t):
        y0, color = -i * lane, CYCLE[i % len(CYCLE)]
        _box(ax, xs["X"], y0, 0.9, 0.5, f"X\n{rows} × {d:,}", color=COLORS["muted"], alpha=0.4)
        ax.add_patch(Circle((xs["f"], y0 + 0.25), 0.17, facecolor="white",
                            edgecolor=COLORS["ceiling"], gid="f"))
        ax.text(xs["f"], y0 + 0.25, "f", ha="center", va="center", fontsize=9, style="italic")
        for j in range(t):  # A by columns: stripe j belongs to rank j
            ax.add_patch(Rectangle((xs["A"] + j * aw / t, y0 - 0.05), aw / t, ah,
                                   facecolor=color if j == i else "white",
                                   edgecolor=COLORS["muted"], lw=0.6,
                                   gid="A_shard" if j == i else None))
            ax.add_patch(Rectangle((xs["B"], y0 + 0.55 - (j + 1) * bh / t), bw, bh / t,
                                   facecolor=color if j == i else "white",
                                   edgecolor=COLORS["muted"], lw=0.6,
                                   gid="B_shard" if j == i else None))
        ax.text(xs["A"] + aw / 2, y0 - 0.13, f"A_{i}\n{d:,} × {f // t:,}", ha="center", va="top",
                fontsize=7)
        _box(ax, xs["Y"], y0, 0.9 / t + 0.25, 0.5, f"Y_{i}\n{rows} × {f // t:,}", color=color,
             alpha=0.6)
        ax.text(xs["B"] + bw / 2, y0 + 0.55 - bh - 0.08, f"B_{i}\n{f // t:,} × {d:,}",
                ha="center", va="top", fontsize=7)
        _box(ax, xs["Z_i"], y0, 0.9, 0.5, f"Z_{i} (partial)\n{rows} × {d:,}", color=color,
             alpha=0.35)
        for x0, x1 in ((0.9, xs["f"] - 0.17), (xs["f"] + 0.17, xs["A"]), (xs["A"] + aw, xs["Y"]),
                       (xs["Y"] + 0.9 / t + 0.25, xs["B"]), (xs["B"] + bw, xs["Z_i"]),
                       (xs["Z_i"] + 0.9, xs["g"] - 0.2)):
            ax.annotate("", (x1, y0 + 0.25), (x0, y0 + 0.25),
                        arrowprops=dict(arrowstyle="->", lw=0.7, color=COLORS["ceiling"]))
    top, bottom = 0.55, -(t - 1) * lane - 0.05
    ax.add_patch(FancyBboxPatch((xs["g"] - 0.2, bottom), 0.4, top - bottom,
                                boxstyle="round,pad=0.02", facecolor="white",
                                edgecolor=COLORS["ceiling"], gid="g"))
    ax.text(xs["g"], (top + bottom) / 2, "g", ha="center", va="center", fontsize=9,
            style="italic")
    zy = (top + bottom) / 2 - 0.25
    ax.annotate("", (xs["Z"], zy + 0.25), (xs["g"] + 0.2, zy + 0.25),
                arrowprops=dict(arrowstyle="->", lw=0.7, color=COLORS["ceiling"]))
    _box(ax, xs["Z"], zy, 0.9, 0.5, f"Z = Σ Z_i\n{rows} × {d:,}", color=COLORS["muted"],
         alpha=0.4)
    note = (f"f: forward identity, backward all-reduce of dL/dX ({rows} × {d:,})\n"
            f"g: forward all-reduce of the Z_i ({rows} × {d:,}), backward identity")
    ax.text(0.0, bottom - 0.75, note, ha="left", va="top", fontsize=8)
    ax.set_xlim(-0.2, 10.5)
    ax.set_ylim(bottom - 1.35, top + 0.35)
    ax.set_axis_off()
    finish(ax, title=f"Tensor parallelism on {t} ranks: A by columns, B by rows", legend=False)
    return fig


def _idle_gaps(ops, total: float) -> list[tuple[float, float]]:
    """(start, end) of the times a stage waits, between 0 and `total`."""
    gaps, clock = [], 0.0
    for _, _, start, end in ops:
        if start > clock:
            gaps.append((clock, start))
        clock = end
    return gaps + ([(clock, total)] if total > clock else [])


def held_microbatches(ops) -> int:
    """Most micro-batches whose forward a stage has run and whose backward it has not: the
    activations it holds at once, read off its timeline."""
    held = peak = 0
    for op, *_ in ops:
        held += 1 if op == "F" else -1
        peak = max(peak, held)
    return peak


def draw_pipeline_schedules(n_stages: int, microbatches: int, *, forward_s: float = 1.0,
                            backward_s: float = 2.0, schedules: Sequence[str] = pipeline.SCHEDULES,
                            ax=None):
    """One panel per schedule of `schedules` (GPipe and 1F1B): a timeline row per stage of
    `pipeline.pipeline_timeline(n_stages, microbatches, schedule, ...)`, forwards and backwards
    labelled with their micro-batch, idle gaps shaded (`gid` `IDLE`), and on the right the
    micro-batches each stage holds at once. Times in units of `forward_s`; `ax`: one axes per
    schedule. Returns the figure."""
    names = tuple(checks.choice(s, "schedule", pipeline.SCHEDULES) for s in schedules)
    if not names:
        raise ValueError("schedules must name at least one of " + ", ".join(pipeline.SCHEDULES))
    p = checks.positive_int(n_stages, "n_stages")
    if ax is None:
        fig, axes = subplots(len(names), 1, width=8.5, height=0.5 + len(names) * (0.5 + 0.32 * p),
                             sharex=True, squeeze=False)
        axes = list(axes[:, 0])
    else:
        axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
        if len(axes) != len(names):
            raise ValueError(f"ax has {len(axes)} axes for {len(names)} schedules")
        fig = axes[0].figure
    for a, name in zip(axes, names, strict=True):
        timeline = pipeline.pipeline_timeline(p, microbatches, name, forward_s=forward_s,
                                              backward_s=backward_s)
        total = max(ops[-1][3] for ops in timeline)
        per_unit = a.get_position().width * fig.get_figwidth() * 72 / (total * 1.1)  # points
        idle = 0.0
        for s, ops in enumerate(timeline):
            y = p - 1 - s
            for op, i, start, end in ops:
                a.add_patch(Rectangle((start, y + 0.1), end - start, 0.8, edgecolor="white",
                                      facecolor=STAGE_COLORS[op], lw=0.8, alpha=0.85))
                if (end - start) * per_unit > 0.7 * 6 * len(f"{op}{i}") + 2:  # if the label fits
                    a.text((start + end) / 2, y + 0.5, f"{op}{i}", ha="center", va="center",
                           fontsize=6, color="white")
            for start, end in _idle_gaps(ops, total):
                a.add_patch(Rectangle((start, y + 0.1), end - start, 0.8, facecolor="none",
                                      hatch="////", edgecolor=COLORS["muted"], lw=0, gid=IDLE))
                idle += end - start
            a.text(total * 1.01, y + 0.5, f"holds {held_microbatches(ops)}", va="center",
                   fontsize=7)
        share = idle / (p * total)
        a.set_xlim(0, total * 1.1)
        a.set_ylim(0, p)
        a.set_yticks([p - 0.5 - s for s in range(p)], [f"stage {s}" for s in range(p)])
        a.grid(False)
        label = {"gpipe": "GPipe (all forwards, then all backwards)", "1f1b": "1F1B"}[name]
        finish(a, title=f"{label}: bubble {share:.1%} of the step", legend=False)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, label=f"{op} (micro-batch i)")
               for op, c in STAGE_COLORS.items()]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="none", hatch="////",
                             edgecolor=COLORS["muted"], label="idle (the bubble)"))
    axes[0].legend(handles=handles, fontsize=7, ncol=3, frameon=False, loc="lower left",
                   bbox_to_anchor=(0.0, 1.12))
    finish(axes[-1], xlabel=f"time (units of one forward; a backward takes "
                            f"{backward_s / forward_s:g})", legend=False)
    return fig


def _short(link: hardware.Link) -> str:
    """"NVLink 4, 450 GB/s": the link's name up to its first bracket or comma, per direction."""
    name = re.split(r" \(|,", link.name)[0]
    return f"{name}, {link.bytes_per_s / 1e9:.0f} GB/s"


def axis_links(dims: parallel.ParallelDims, cluster) -> dict[str, tuple[bool, hardware.Link]]:
    """For each mesh axis of degree > 1, outermost first: (whether every one of its groups lies
    inside one node, the slowest link its groups cross), from the groups `dims.group_ranks`."""
    c = hardware.get_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(c, hardware.Cluster):
        raise TypeError(f"cluster must be a hardware.Cluster or a key such as 'dgx-h100', "
                        f"got {cluster!r}")
    out = {}
    for axis in parallel.MESH_AXES:
        if getattr(dims, axis) == 1:
            continue
        inside = all(len({r // c.per_node for r in dims.group_ranks(rank, axis)}) == 1
                     for rank in range(dims.world_size))
        if not inside and c.inter_node is None:
            raise ValueError(f"{c.name}: {axis} groups cross nodes, and it has no link between "
                             "nodes")
        groups = {dims.group_ranks(rank, axis) for rank in range(dims.world_size)}
        out[axis] = (inside, c.send_link(dims.span(axis)) if axis == "pp" else
                     min((c.group_link(g) for g in groups), key=lambda link: link.bytes_per_s))
    return out


def draw_mesh(dims: parallel.ParallelDims, cluster, *, ax=None):
    """Every rank of `dims` in its node of `cluster` (a `hardware.Cluster` or its key), one strip
    per mesh axis of degree > 1 (`parallel.MESH_AXES` order, rank = row-major index, tp fastest):
    each cell coloured by the rank's index along that axis, rank 0's group outlined, and the axis'
    verdict (`axis_links`): inside a node, on its link, or across the network. Returns the
    figure."""
    if not isinstance(dims, parallel.ParallelDims):
        raise TypeError(f"dims must be a parallel.ParallelDims, got {type(dims).__name__}")
    w = dims.world_size
    if w > MAX_MESH_RANKS:
        raise ValueError(f"world_size ({w}) must be <= {MAX_MESH_RANKS}: one cell per rank is "
                         "drawn")
    links = axis_links(dims, cluster)
    c = hardware.get_cluster(cluster) if isinstance(cluster, str) else cluster
    fig, ax = _figure(ax, width=9.0, height=1.0 + 0.55 * max(len(links), 1))
    gap, n = 0.6, max(len(links), 1)
    x_of = [r + gap * (r // c.per_node) for r in range(w)]
    for node in range((w - 1) // c.per_node + 1):
        members = [x_of[r] for r in range(w) if r // c.per_node == node]
        ax.add_patch(FancyBboxPatch((members[0] - 0.15, -0.1), members[-1] - members[0] + 1.3,
                                    n + 0.2, boxstyle="round,pad=0.05", facecolor="none",
                                    edgecolor=COLORS["muted"], lw=1.0, gid="node"))
        ax.text((members[0] + members[-1] + 1) / 2, n + 0.25, f"node {node}", ha="center",
                va="bottom", fontsize=7)
    for row, (axis, (inside, link)) in enumerate(links.items()):
        y, degree = n - 1 - row, getattr(dims, axis)
        group = set(dims.group_ranks(0, axis))
        for r in range(w):
            k = dims.coords(r)[axis]
            ax.add_patch(Rectangle((x_of[r], y + 0.1), 1.0, 0.8, facecolor=CYCLE[k % len(CYCLE)],
                                   alpha=0.75, edgecolor=COLORS["ceiling"] if r in group
                                   else "white", lw=1.6 if r in group else 0.5,
                                   gid=f"{axis}:{r}:{k}"))
        edge = ("axes fraction", "data")  # the labels sit outside the cells, left and right
        ax.annotate(f"{axis} = {degree} ", (0.0, y + 0.5), xycoords=edge, ha="right",
                    va="center", fontsize=8)
        where = "inside a node" if inside else "across nodes"
        ax.annotate(f" {w // degree} groups of {degree}, {where}: {_short(link)}", (1.0, y + 0.5),
                    xycoords=edge, ha="left", va="center", fontsize=7)
    ax.set_xlim(-0.3, x_of[-1] + 1.3)
    ax.set_ylim(-0.3, n + 0.7)
    ax.set_axis_off()
    finish(ax, title=f"{w} ranks on {c.name}: colour = index along the axis, outlined = rank "
                     "0's group", legend=False)
    return fig
