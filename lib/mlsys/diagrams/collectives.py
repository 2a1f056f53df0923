"""The ring all-reduce chunk by chunk, and DDP's bucket all-reduces overlapping the backward.

`simulate_ring_all_reduce` runs the ring of `accounting.comms` on n tensors in one process: each
buffer cut into n chunks (`tensor_split`, as `distributed.comms.ring_all_reduce` cuts it); n-1
reduce-scatter steps in which every rank sends chunk r - s to its right-hand neighbour and adds
the chunk arriving from its left, then n-1 all-gather steps in which the finished chunks travel
once around the ring. It returns each rank's result (checked against the sum) with a trace of what
every rank sent and held at every step; `draw_ring_all_reduce` draws that trace as a grid of ranks
by steps. (Patarasuk & Yuan, 2009; Thakur et al., 2005.)

`draw_ddp_overlap` draws `accounting.buckets.overlap_schedule` on a time axis: gradients appear at
a steady rate in bytes over the backward, each bucket's all-reduce (alpha-beta) starts when its
gradients are ready and the previous all-reduce is done; what ends after the backward is exposed.
One lane for the backward, one for the communication. Times in seconds (drawn in ms), sizes in
bytes.
Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.patches import Patch, Rectangle
from torch import Tensor

from mlsys import checks
from mlsys.accounting import buckets as bucket_model
from mlsys.book import num
from mlsys.plotting import COLORS, CYCLE, finish, subplots

PHASES = ("reduce-scatter", "all-gather")
MAX_DRAWN_RANKS = 6
"""More ranks than this make a grid too small to read."""


@dataclass(frozen=True)
class RingStep:
    """One step of the ring: the chunk each rank sends to its right-hand neighbour, and what each
    rank holds before the step: per rank, per chunk, the ranks whose parts that chunk sums."""

    phase: str  # "reduce-scatter" or "all-gather"
    step: int  # 1 to n-1 within its phase
    sends: tuple[int, ...]  # chunk index, by rank
    holds: tuple[tuple[frozenset[int], ...], ...]  # [rank][chunk]


@dataclass(frozen=True)
class RingTrace:
    """`simulate_ring_all_reduce`'s result: each rank's reduced tensor, every step, what each rank
    holds at the end, and the bytes each rank sent."""

    results: list[Tensor]
    steps: list[RingStep]
    final: tuple[tuple[frozenset[int], ...], ...]
    sent_bytes: tuple[int, ...]  # by rank


def simulate_ring_all_reduce(buffers: Sequence[Tensor]) -> RingTrace:
    """The ring all-reduce of `buffers` (one tensor per rank, equal shapes and dtypes), simulated
    step by step in this process; the inputs are not modified. Every step's messages are taken
    before any rank adds, as if all ranks sent at once. Raises if a result is not the sum."""
    if not isinstance(buffers, Sequence) or not all(isinstance(b, Tensor) for b in buffers):
        raise TypeError("buffers must be a sequence of torch tensors, one per rank")
    n = checks.integer(len(buffers), "len(buffers) (the number of ranks)", minimum=2)
    if len({(b.shape, b.dtype) for b in buffers}) != 1:
        raise ValueError("buffers must all have the same shape and dtype, got "
                         f"{[(tuple(b.shape), b.dtype) for b in buffers]}")
    flat = [b.detach().reshape(-1).clone() for b in buffers]
    chunks = [list(f.tensor_split(n)) for f in flat]  # views of each rank's flat copy
    holds = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    sent = [0] * n
    steps = []
    for phase in PHASES:
        for s in range(n - 1):
            # reduce-scatter passes on the chunk r - s, all-gather the finished chunk r + 1 - s
            sends = [(r - s) % n if phase == PHASES[0] else (r + 1 - s) % n for r in range(n)]
            steps.append(RingStep(phase, s + 1, tuple(sends), tuple(map(tuple, holds))))
            messages = [(chunks[r][sends[r]].clone(), holds[r][sends[r]]) for r in range(n)]
            for r in range(n):
                left = (r - 1) % n
                into, (payload, parts) = sends[left], messages[left]
                sent[left] += payload.numel() * payload.element_size()
                if phase == PHASES[0]:
                    chunks[r][into].add_(payload)
                    holds[r][into] = holds[r][into] | parts
                else:
                    chunks[r][into].copy_(payload)
                    holds[r][into] = parts
    results = [f.view_as(buffers[0]) for f in flat]
    stacked = torch.stack([b.detach() for b in buffers])
    total = stacked.sum(0)
    # floats: the ring adds in another order, and each addition may round by one unit
    slack = (n * torch.finfo(total.dtype).eps * stacked.abs().sum(0)
             if total.is_floating_point() else torch.zeros_like(total))
    if not all(bool(((x - total).abs() <= slack).all()) for x in results):
        raise AssertionError("the simulated ring does not give the sum on every rank")
    return RingTrace(results, steps, tuple(map(tuple, holds)), tuple(sent))


def draw_ring_all_reduce(n_ranks: int = 4, *, numel: int = 1024, seed: int = 0, ax=None):
    """The ring all-reduce of `n_ranks` random float64 buffers of `numel` elements, simulated
    (`simulate_ring_all_reduce`) and drawn as a grid: one row per rank, one column per step (and
    the end). A cell shows the rank's n chunks, each with the number of ranks whose parts it sums,
    green once it holds all n; the chunk the rank sends to its right-hand neighbour in that step
    is outlined. Returns the figure."""
    n = checks.integer(n_ranks, "n_ranks", minimum=2)
    if n > MAX_DRAWN_RANKS:
        raise ValueError(f"n_ranks must be at most {MAX_DRAWN_RANKS} to be drawn, got {n}")
    checks.integer(numel, "numel", minimum=n)
    gen = torch.Generator().manual_seed(seed)
    trace = simulate_ring_all_reduce([torch.randn(numel, generator=gen, dtype=torch.float64)
                                      for _ in range(n)])
    columns = [(f"{'RS' if st.phase == PHASES[0] else 'AG'} {st.step}", st.holds, st.sends)
               for st in trace.steps] + [("end", trace.final, None)]
    if ax is None:
        fig, ax = subplots(width=min(max(1.0 + 0.23 * (n + 1) * len(columns), 7.5), 11.0),
                           height=1.3 + 0.42 * n)
    width, height = n + 1.0, 1.4  # of one cell, in boxes
    for j, (label, holds, sends) in enumerate(columns):
        x0 = j * width
        ax.text(x0 + n / 2 - 0.05, 1.05, label, ha="center", va="bottom", fontsize=8)
        for r in range(n):
            y = -r * height
            for c in range(n):
                k = len(holds[r][c])
                face = COLORS["accent"] if k == n else CYCLE[0]
                alpha = 1.0 if k == n else 0.15 + 0.55 * (k - 1) / max(n - 2, 1)
                sent = sends is not None and sends[r] == c
                ax.add_patch(Rectangle((x0 + c, y), 0.9, 0.9, facecolor=face, alpha=alpha,
                                       gid=f"chunk {j} {r} {c}"))
                ax.add_patch(Rectangle((x0 + c, y), 0.9, 0.9, fill=False, lw=2.2 if sent else 0.5,
                                       edgecolor=COLORS["predicted"] if sent else COLORS["muted"],
                                       gid=f"sent {j} {r} {c}" if sent else None))
                ax.text(x0 + c + 0.45, y + 0.45, str(k), ha="center", va="center", fontsize=7,
                        color="white" if k == n else "black")
    for r in range(n):
        ax.text(-0.3, -r * height + 0.45, f"rank {r}", ha="right", va="center", fontsize=8)
    rs_end = (n - 1) * width - 0.55
    ax.axvline(rs_end, color=COLORS["muted"], ls="--", lw=0.8)
    ax.set_xlim(-2.6, len(columns) * width)
    ax.set_ylim(-(n - 1) * height - 0.4, 1.6)
    ax.axis("off")
    handles = [Patch(facecolor=CYCLE[0], alpha=0.4, label="partial sum (number: ranks in it)"),
               Patch(facecolor=COLORS["accent"], label=f"finished: all {n} ranks"),
               Patch(fill=False, edgecolor=COLORS["predicted"], lw=2.2,
                     label="sent to the right-hand rank")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=3,
              frameon=False, fontsize=8)
    finish(ax, title=f"Ring all-reduce on {n} ranks: each rank's chunks 0 to {n - 1}, left to "
                     "right,\nbefore each step of the reduce-scatter (RS), then of the all-gather "
                     "(AG)", legend=False)
    return ax.figure


def draw_ddp_overlap(tensor_bytes: Sequence[int], cap_bytes: float, backward_s: float,
                     n_ranks: int, *, alpha_s: float, bytes_per_s: float, title: str | None = None,
                     ax=None):
    """DDP's bucketed all-reduces against the backward on a time axis (ms): the backward lane,
    coloured by the bucket each stretch of it fills; the communication lane, one bar per bucket's
    all-reduce (`accounting.buckets.overlap_schedule`); what runs past the backward's end hatched
    as exposed (`accounting.buckets.overlap_exposed_s`). Returns the figure."""
    slots = bucket_model.overlap_schedule(bucket_model.bucket_bytes(tensor_bytes, cap_bytes),
                                          backward_s, n_ranks, alpha_s=alpha_s,
                                          bytes_per_s=bytes_per_s)
    exposed = max(slots[-1].end_s - backward_s, 0.0)
    if ax is None:
        _, ax = subplots(width=8.0, height=2.4)
    ms = 1e3
    for i, slot in enumerate(slots):
        shade = {"facecolor": CYCLE[0] if i % 2 else CYCLE[5], "edgecolor": "none"}
        ax.barh(1, (slot.ready_s - slot.first_s) * ms, left=slot.first_s * ms, height=0.6,
                gid=f"backward {i}", **shade)
        ax.barh(0, (slot.end_s - slot.start_s) * ms, left=slot.start_s * ms, height=0.6,
                gid=f"all-reduce {i}", **shade)
    ax.barh(0, exposed * ms, left=backward_s * ms, height=0.7, fill=False, hatch="///",
            edgecolor=COLORS["predicted"], lw=1.2, gid="exposed")
    ax.axvline(backward_s * ms, color=COLORS["ceiling"], ls="--", lw=0.8)
    # the label goes where nothing is drawn: on the backward's lane after it ends, if the
    # exposed time leaves room there, else in the gap between the lanes, left of the end
    right = max(slots[-1].end_s, backward_s) * ms
    room = right - backward_s * ms > 0.45 * right
    ax.annotate(f"exposed after the backward: {num(exposed * ms)} ms",
                xy=((backward_s + exposed / 2) * ms, 0.35),
                xytext=(backward_s * ms + (0.02 if room else -0.01) * right, 1.0 if room else 0.52),
                ha="left" if room else "right", va="center", fontsize=8,
                color=COLORS["predicted"], arrowprops={"arrowstyle": "->", "relpos": (
                    0.0 if room else 1.0, 0.5), "color": COLORS["predicted"]})
    ax.set_yticks([0, 1], ["all-reduce", "backward"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, right * 1.03)
    ax.grid(False, axis="y")
    finish(ax, xlabel="ms from the start of the backward", legend=False,
           title=title or f"{len(slots)} buckets of at most {num(cap_bytes / 2**20)} MiB, "
                          f"{n_ranks} ranks")
    return ax.figure
