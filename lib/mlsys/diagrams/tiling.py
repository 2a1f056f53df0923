"""FlashAttention's tiles, the online-softmax rescaling and the causal tile map, drawn (chapter 06).

- `draw_flash_tiling`: one forward program of the tiled kernel: the block of `block_q` query rows
  it holds, the `block_k`-row tiles of K and V it streams (in order), the score tile on chip and
  the output block it writes once. The loop bound is the kernels' own
  (`mlsys.accounting.attention.keys_in_tiles`), so a causal program stops at its diagonal tile.
- `online_softmax_steps` / `draw_online_softmax`: the running max m and sum l of one row of
  scores, block by block, and the factor exp(m_old - m_new) that rescales what was summed before
  (Milakov & Gimelshein 2018), with the numbers of the recurrence run on that row.
- `causal_tiles` / `draw_causal_tiles`: every (query tile, key tile) of a causal kernel sorted
  into skipped (past the loop bound, never loaded), full (no pair masked) and diagonal (crossing
  the diagonal: computed whole, then masked); the computed ones hold `tiled_score_pairs` pairs.

Conventions (bottom-right causal alignment, query i sees keys j <= i + n_k - n_q) are those of
`mlsys.ops.attention` and the kernels of `mlsys.kernels.flash_attention`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.patches import Patch, Rectangle

from mlsys import checks
from mlsys.accounting import attention as attention_cost
from mlsys.plotting import COLORS, finish, subplots

TILE_KINDS = ("skipped", "full", "diagonal")
"""The three kinds of causal tile, in the order `causal_tiles` returns them."""
KIND_COLORS = {"skipped": "#FFFFFF", "full": COLORS["measured"], "diagonal": COLORS["predicted"]}

Tile = tuple[int, int, int, int]
"""(first query row, one past the last, first key, one past the last) of one tile."""


def _sizes(n_q: int, n_k: int, block_q: int, block_k: int) -> None:
    checks.positive_ints(n_q=n_q, n_k=n_k, block_q=block_q, block_k=block_k)


def _figure(ax, width: float, height: float):
    if ax is None:
        return subplots(width=width, height=height)
    return ax.figure, ax


# --- the tiles one forward program holds and streams ----------------------------------------------


def streamed_key_tiles(q_start: int, n_q: int, n_k: int, *, block_q: int, block_k: int,
                       causal: bool = False) -> list[tuple[int, int]]:
    """(first key, one past the last) of each K/V tile the forward program of the query block
    starting at row `q_start` loads, in order: up to the kernels' loop bound."""
    _sizes(n_q, n_k, block_q, block_k)
    keys = attention_cost.keys_in_tiles(q_start, n_q, n_k, block_q, block_k, causal)
    return [(j0, min(j0 + block_k, n_k)) for j0 in range(0, keys, block_k)]


def draw_flash_tiling(n_q: int, n_k: int, d_head: int, *, block_q: int, block_k: int,
                      program: int | None = None, step: int | None = None,
                      causal: bool = False, ax=None):
    """One program of FlashAttention-2's forward: Q's block `program` (`block_q` rows x `d_head`)
    held on chip, K and V streamed in tiles of `block_k` rows (numbered in loop order; with
    `causal`, the tiles past the diagonal are skipped), the score tile of loop step `step` on chip,
    and the O block written once. Sizes in elements, drawn to scale. Defaults: the middle program,
    its middle step. Returns the figure."""
    _sizes(n_q, n_k, block_q, block_k)
    checks.positive_int(d_head, "d_head")
    programs = -(-n_q // block_q)
    program = programs // 2 if program is None else program
    checks.integer(program, "program", minimum=0)
    if program >= programs:
        raise ValueError(f"program={program} must be below the {programs} query blocks "
                         f"(ceil(n_q={n_q} / block_q={block_q}))")
    i0, i1 = program * block_q, min(n_q, (program + 1) * block_q)
    streamed = streamed_key_tiles(i0, n_q, n_k, block_q=block_q, block_k=block_k, causal=causal)
    step = len(streamed) // 2 if step is None else step
    checks.integer(step, "step", minimum=0)
    if streamed and step >= len(streamed):
        raise ValueError(f"step={step} must be below the {len(streamed)} K/V tiles this program "
                         "streams")
    gap = max(n_q, n_k) / 24
    fig, ax = _figure(ax, 8.0, 7.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.grid(False)

    def box(x, y, w, h, gid, color, alpha=1.0, hatch=None, text=None, rotate=0):
        patch = Rectangle((x, y), w, h, facecolor=color, alpha=alpha, edgecolor="black", lw=0.6,
                          hatch=hatch, gid=gid)
        ax.add_patch(patch)
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8,
                    rotation=rotate, gid=f"{gid}-label")
        return patch

    held, streamed_c, onchip = COLORS["measured"], COLORS["accent"], COLORS["predicted"]
    # Q (n_q x d) left of the scores, O (n_q x d) right of them; rows grow downwards
    for p in range(programs):
        r0, r1 = p * block_q, min(n_q, (p + 1) * block_q)
        mine = p == program
        box(-gap - d_head, r0, d_head, r1 - r0, "q-held" if mine else "q-block",
            held if mine else "white", text=f"{r1 - r0}×{d_head}" if mine else None, rotate=90)
        box(n_k + gap, r0, d_head, r1 - r0, "o-written" if mine else "o-block",
            held if mine else "white", text="written once" if mine else None, rotate=90)
    # K^T and V^T (d x n_k) above the scores, cut into key tiles: streamed in order, or skipped
    order = {j0: k + 1 for k, (j0, _) in enumerate(streamed)}  # loop order, from 1
    for j0 in range(0, n_k, block_k):
        j1 = min(n_k, j0 + block_k)
        for row, name in ((-gap - d_head, "k"), (-2 * gap - 2 * d_head, "v")):
            if j0 not in order:
                box(j0, row, j1 - j0, d_head, f"{name}-skipped", "white", hatch="//")
            else:
                box(j0, row, j1 - j0, d_head, f"{name}-streamed", streamed_c,
                    alpha=1.0 if order[j0] == step + 1 else 0.35, text=str(order[j0]))
    # the scores: this program's row of tiles (one on chip at a time); other programs faint
    for j0 in range(0, n_k, block_k):
        j1 = min(n_k, j0 + block_k)
        if j0 in order:
            current = order[j0] == step + 1
            box(j0, i0, j1 - j0, i1 - i0, "s-current" if current else "s-visited", onchip,
                alpha=1.0 if current else 0.25, text="S, P" if current else None)
        else:
            box(j0, i0, j1 - j0, i1 - i0, "s-skipped", "white", hatch="//")
    ax.add_patch(Rectangle((0, 0), n_k, n_q, fill=False, edgecolor=COLORS["muted"], lw=0.6,
                           gid="s-outline"))
    others = (0, i0) if i0 >= n_q - i1 else (i1, n_q)  # the larger part of S left to others
    if others[1] > others[0]:
        ax.text(n_k / 2, sum(others) / 2, "S = QKᵀ: the other query blocks are other programs,\n"
                "running at the same time", ha="center", va="center", fontsize=8,
                color=COLORS["muted"], gid="s-label")
    labels = {"Q": (-gap - d_head / 2, -gap / 2), "O": (n_k + gap + d_head / 2, -gap / 2),
              "Kᵀ": (-gap / 2, -gap - d_head / 2), "Vᵀ": (-gap / 2, -2 * gap - 1.5 * d_head)}
    for text, (x, y) in labels.items():
        ax.text(x, y, text, ha="center" if text in "QO" else "right", va="center", fontsize=10,
                fontweight="bold", gid="matrix-label")
    ax.set_xlim(-2 * gap - d_head, n_k + 2 * gap + d_head)
    ax.set_ylim(n_q + gap / 2, -2 * gap - 2 * d_head - gap / 2)
    skipped = -(-n_k // block_k) - len(streamed)
    handles = [Patch(facecolor=held, label=f"held: Q block of {i1 - i0} rows, O block"),
               Patch(facecolor=streamed_c, label=f"streamed: {len(streamed)} K, V tiles of "
                     f"{block_k} rows, in order"),
               Patch(facecolor=onchip, label="on chip: one score tile at a time")]
    if skipped:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label=f"skipped (causal): {skipped} tiles"))
    ax.legend(handles=handles,
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=2, frameon=False,
              fontsize=8)
    ax.set_title(f"One program of the forward: query rows {i0:,}–{i1 - 1:,} of {n_q:,}, "
                 f"d = {d_head}", loc="left", fontsize=10)
    return fig


# --- the online softmax, block by block -----------------------------------------------------------


@dataclass(frozen=True)
class OnlineStep:
    """One key block of the online softmax of one row."""

    start: int  # first key of the block
    stop: int  # one past its last key
    m_old: float  # running max before the block (-inf before the first)
    m_new: float  # running max after it
    rescale: float  # exp(m_old - m_new): what the earlier sum and output are multiplied by
    l_old: float  # running sum before the block, sum of exp(s - m_old) over the keys seen
    block_sum: float  # sum over the block of exp(s - m_new)
    l_new: float  # l_old * rescale + block_sum


def online_softmax_steps(scores: Sequence[float], *, block_k: int) -> list[OnlineStep]:
    """The online softmax's recurrence run on one row of `scores`, `block_k` keys at a time:
    m' = max(m, max s'), l' = l exp(m - m') + sum exp(s' - m'). At the end m + log l is the
    row's log-sum-exp."""
    row = [float(s) for s in scores]
    checks.positive_int(block_k, "block_k")
    if not row or not all(math.isfinite(s) for s in row):
        raise ValueError(f"scores must be a non-empty row of finite numbers, got {len(row)} "
                         "numbers" + ("" if not row else " with a non-finite one"))
    m, ell, steps = -math.inf, 0.0, []
    for start in range(0, len(row), block_k):
        block = row[start:start + block_k]
        m_new = max(m, max(block))
        rescale = math.exp(m - m_new)  # exp(-inf) = 0 before the first block
        block_sum = sum(math.exp(s - m_new) for s in block)
        steps.append(OnlineStep(start, start + len(block), m, m_new, rescale, ell, block_sum,
                                ell * rescale + block_sum))
        m, ell = m_new, ell * rescale + block_sum
    return steps


def draw_online_softmax(scores: Sequence[float], *, block_k: int, ax=None):
    """The online softmax of one row: (top) its scores, key by key, with the running max m after
    each block; (bottom) the running sum l after each block, split into the earlier sum rescaled
    by exp(m_old - m_new) and the block's own sum, with the factor written above it. Numbers from
    `online_softmax_steps`. `ax`: two axes (top, bottom), or None for a new figure. Returns the
    figure."""
    steps = online_softmax_steps(scores, block_k=block_k)
    row = [float(s) for s in scores]
    if ax is None:
        fig, ax = subplots(2, 1, width=8.0, height=5.6, sharex=True)
    elif len(ax) != 2:
        raise ValueError(f"ax must be two axes (scores, sums) or None, got {len(ax)}")
    fig, (top, bottom) = ax[0].figure, ax
    top.plot(range(len(row)), row, "o", ms=3, color=COLORS["muted"], label="score s of each key")
    for k, st in enumerate(steps):
        top.plot([st.start - 0.5, st.stop - 0.5], [st.m_new] * 2, "-", lw=2,
                 color=COLORS["predicted"], label="running max m" if k == 0 else None,
                 gid="m-line")
        for panel in (top, bottom):
            panel.axvline(st.start - 0.5, color=COLORS["muted"], lw=0.6, ls="--")
    finish(top, title=f"One row, {len(row)} keys in blocks of {block_k}", ylabel="score",
           legend=False)
    width = 0.8 * min(block_k, len(row))
    centers = [(st.start + st.stop - 1) / 2 for st in steps]
    kept = [st.l_old * st.rescale for st in steps]
    bottom.bar(centers, kept, width, color=COLORS["measured"], gid="l-kept",
               label="earlier sum × exp(m_old − m_new)")
    bottom.bar(centers, [st.block_sum for st in steps], width, bottom=kept,
               color=COLORS["accent"], gid="l-block", label="this block: Σ exp(s − m_new)")
    bottom.plot(centers[1:], [st.l_old for st in steps[1:]], "_", ms=18, mew=2,
                color=COLORS["ceiling"], label="earlier sum before rescaling", gid="l-old")
    top_l = max(max(st.l_new, st.l_old) for st in steps)
    for c, st in zip(centers[1:], steps[1:], strict=True):
        bottom.text(c, max(st.l_new, st.l_old) + 0.04 * top_l, f"×{st.rescale:.2g}",
                    ha="center", va="bottom", fontsize=8, gid="rescale-label")
    bottom.set_ylim(0, 1.25 * top_l)
    finish(bottom, xlabel="key", ylabel="running sum l", legend=False)
    for panel in (top, bottom):
        panel.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


# --- the causal tile map --------------------------------------------------------------------------


def causal_tiles(n_q: int, n_k: int, *, block_q: int, block_k: int) -> dict[str, list[Tile]]:
    """Every (block_q x block_k) tile of a causal kernel by kind: "skipped" (past the loop bound,
    `attention.keys_in_tiles`: never loaded), "full" (computed, no pair masked) and "diagonal"
    (computed whole, then masked: some key lies in a row's future)."""
    _sizes(n_q, n_k, block_q, block_k)
    offset = attention_cost.causal_offset(n_q, n_k)
    kinds: dict[str, list[Tile]] = {kind: [] for kind in TILE_KINDS}
    for i0 in range(0, n_q, block_q):
        i1, hi = min(n_q, i0 + block_q), attention_cost.keys_in_tiles(i0, n_q, n_k, block_q,
                                                                       block_k, True)
        for j0 in range(0, n_k, block_k):
            j1 = min(n_k, j0 + block_k)
            # a tile has masked pairs when its last key lies past its first row's last key (the
            # book's kernels evaluate the mask on every tile they visit, full ones included)
            kind = "skipped" if j0 >= hi else "diagonal" if j1 - 1 > i0 + offset else "full"
            kinds[kind].append((i0, i1, j0, j1))
    return kinds


def draw_causal_tiles(n_q: int, n_k: int, *, block_q: int, block_k: int, ax=None):
    """The causal tile map: each tile of the (n_q x n_k) scores coloured by kind
    (`causal_tiles`), drawn to scale with the exact diagonal (query i sees keys j <= i + n_k -
    n_q), the counts in the legend and the computed pairs against the dense ones in the title.
    Returns the figure."""
    kinds = causal_tiles(n_q, n_k, block_q=block_q, block_k=block_k)
    longest = max(n_q, n_k)
    fig, ax = _figure(ax, 4.6 * n_k / longest + 3.0, max(2.4, 4.6 * n_q / longest + 1.0))
    ax.set_aspect("equal")
    ax.grid(False)
    for kind, found in kinds.items():
        for i0, i1, j0, j1 in found:
            ax.add_patch(Rectangle((j0, i0), j1 - j0, i1 - i0, facecolor=KIND_COLORS[kind],
                                   alpha=0.85, edgecolor="black", lw=0.5, gid=kind))
    offset = attention_cost.causal_offset(n_q, n_k)
    first = max(0, -offset - 1)  # the edge of the keys row i sees: x = i + offset + 1
    ax.plot([first + offset + 1, n_k], [first, n_q - 1], color=COLORS["ceiling"], lw=1.2,
            label="key = query + n_k − n_q", gid="diagonal-line")
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)
    computed = attention_cost.tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k,
                                                causal=True)
    finish(ax, title=f"Causal tiles of {block_q} × {block_k}: {computed / (n_q * n_k):.1%} of "
           "the pairs computed", xlabel="key", ylabel="query", legend=False)
    handles = [Patch(facecolor=KIND_COLORS[kind], edgecolor="black",
                     label=f"{kind} ({len(kinds[kind])})") for kind in TILE_KINDS]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0][:1], frameon=False,
              fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig
