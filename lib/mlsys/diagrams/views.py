"""One storage, several views: each view drawn as the storage positions it reaches (chapter 02).

A PyTorch tensor is a storage plus (shape, strides, storage offset): element `index` sits at
position `offset + sum(index[d] * stride[d])` of the storage (`mlsys.tensors.element_offset`).
`positions(t)` lists that position for every element of `t` in index order (row-major over its
shape), from the tensor's own `.stride()` and `.storage_offset()`. `draw_views` draws the storage
as a row of numbered cells and under it one row per view: the positions it reaches, in the order
its indices visit them, each cell coloured by its position, with the view's shape, strides and
offset. Runs of the last dimension are set apart by small gaps, of the dimension before by larger
ones, so the shape can be read off the row. A transpose is the same cells in another order, a
slice a subset from an offset, an expand (stride 0) the same cells more than once.
References: PyTorch docs, "Tensor Views"; `mlsys.tensors`. Used in: §sec-tensors-memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle
from torch import Tensor

from mlsys import tensors
from mlsys.plotting import finish, subplots

MAX_DRAWN_ELEMENTS = 48
"""More cells than this in one row (storage or view) are too small to number."""
GAPS = (0.35, 0.8)
"""Space after each run of the last dimension, and after each run of the one before."""
CMAP = "viridis"


def positions(t: Tensor) -> list[int]:
    """Storage position (in elements) of every element of `t`, in index order (row-major over
    `t.shape`): `tensors.element_offset(index, t.stride(), t.storage_offset())`."""
    if not isinstance(t, Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    return [tensors.element_offset(index, t.stride(), t.storage_offset())
            for index in itertools.product(*(range(n) for n in t.shape))]


def storage_elements(t: Tensor) -> int:
    """Elements of the storage under `t`: its bytes over the element size."""
    return t.untyped_storage().nbytes() // t.element_size()


def _cell_xs(shape: tuple[int, ...]) -> list[float]:
    """x of each cell of a row in index order: one unit per cell, plus `GAPS` between runs."""
    xs, x = [], 0.0
    for k, index in enumerate(itertools.product(*(range(n) for n in shape))):
        if k and len(shape) >= 1 and index[-1] == 0:
            x += GAPS[1] if len(shape) >= 2 and index[-2] == 0 else GAPS[0]
        xs.append(x)
        x += 1
    return xs


def _text_color(rgb) -> str:
    r, g, b = rgb[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def view_label(name: str, t: Tensor) -> str:
    """The line above a view's row: its name, shape, strides, offset, how many storage cells it
    reaches, and whether it is contiguous (`tensors.is_contiguous`)."""
    reached = positions(t)
    contiguous = "contiguous" if tensors.is_contiguous(t.shape, t.stride()) else "not contiguous"
    return (f"{name}   shape {tuple(t.shape)}   stride {t.stride()}   offset {t.storage_offset()}"
            f"   ·   {len(reached)} elements in {len(set(reached))} cells, {contiguous}")


def draw_views(views: Mapping[str, Tensor], ax=None, *, title: str | None = None):
    """The storage under `views` (name -> tensor; all must share one storage) as a row of numbered
    cells, and each view as the positions it reaches in index order (`positions`), labelled with
    its shape, strides and storage offset. Returns the figure.

    Cells carry gids "storage-cell" and "view<k>-cell" (k-th view), their numbers the same gids
    with "-text"; each view's label the gid "view<k>-label"."""
    if not isinstance(views, Mapping) or not views:
        raise ValueError("views must be a non-empty mapping of names to tensors")
    for name, t in views.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"views[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
    first_name, first = next(iter(views.items()))
    for name, t in views.items():
        if not tensors.shares_storage(t, first) or t.element_size() != first.element_size():
            raise ValueError(f"views must share one storage: views[{name!r}] does not share "
                             f"views[{first_name!r}]'s (or has another element size)")
    size = storage_elements(first)
    rows = {"storage": size, **{name: t.numel() for name, t in views.items()}}
    too_big = {name: n for name, n in rows.items() if n > MAX_DRAWN_ELEMENTS}
    if too_big:
        raise ValueError(f"views must have at most MAX_DRAWN_ELEMENTS = {MAX_DRAWN_ELEMENTS} "
                         f"elements (and so must their storage) to be drawn, got {too_big}")
    cmap = colormaps[CMAP]

    def cell(x, y, position, gid):
        rgb = to_rgb(cmap(position / max(size - 1, 1)))
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=rgb, edgecolor="white", lw=0.8, gid=gid))
        ax.text(x + 0.5, y + 0.5, str(position), ha="center", va="center", fontsize=7.5,
                color=_text_color(rgb), gid=f"{gid}-text")

    if ax is None:
        fig, ax = subplots(width=8.4, height=0.95 * (len(views) + 1) + 0.5)
    else:
        fig = ax.figure
    ax.axis("off")
    for position in range(size):
        cell(position, 0, position, "storage-cell")
    nbytes = first.untyped_storage().nbytes()
    ax.text(0, 1.25, f"storage: {size} elements of {first.element_size()} bytes ({nbytes} bytes)",
            ha="left", va="bottom", fontsize=8.5, fontweight="bold", gid="storage-label")
    width = float(size)
    for k, (name, t) in enumerate(views.items()):
        y = -2.4 * (k + 1)
        xs = _cell_xs(tuple(t.shape))
        for x, position in zip(xs, positions(t), strict=True):
            cell(x, y, position, f"view{k}-cell")
        width = max(width, xs[-1] + 1 if xs else 0)
        ax.text(0, y + 1.25, view_label(name, t), ha="left", va="bottom", fontsize=8.5,
                gid=f"view{k}-label")
    ax.set_xlim(-0.3, width + 0.3)
    ax.set_ylim(-2.4 * len(views) - 0.3, 2.3)
    finish(ax, title=title or "One storage, several views: the positions each view reaches, "
           "in index order", legend=False)
    return fig
