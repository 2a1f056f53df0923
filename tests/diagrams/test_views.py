"""The views diagram (chapter 02) draws, for every view, the storage positions PyTorch itself
reaches, in index order, with the view's own shape, strides and offset."""

import itertools

import matplotlib.pyplot as plt
import pytest
import torch

from mlsys import tensors
from mlsys.diagrams import views


def _texts(fig, gid):
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


def _patches(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


BASE = torch.arange(24.0).reshape(2, 3, 4)  # each value is its own storage position
VIEWS = {"base": BASE, "transpose(0, 2)": BASE.transpose(0, 2), "[:, ::2, 1:]": BASE[:, ::2, 1:],
         "view(4, 6)": BASE.view(4, 6), "expand": BASE[1:, :1].expand(-1, 3, -1),
         "[1, 2]": BASE[1, 2], "[0, 1, 3] (0-d)": BASE[0, 1, 3], "flat[::5]": BASE.view(-1)[::5]}


@pytest.mark.parametrize("name", VIEWS)
def test_positions_are_where_torch_reads_each_element(name):
    v = VIEWS[name]
    found = views.positions(v)
    assert found == v.reshape(-1).long().tolist()  # the arange's values: torch's own reads
    indices = list(itertools.product(*(range(n) for n in v.shape)))
    assert found == [v[index].storage_offset() for index in indices]
    assert views.storage_elements(v) == 24


def test_draw_views_numbers_each_row_with_torchs_positions():
    fig = views.draw_views(VIEWS)
    assert _texts(fig, "storage-cell-text") == [str(i) for i in range(24)]
    assert len(_patches(fig, "storage-cell")) == 24
    for k, (name, v) in enumerate(VIEWS.items()):
        assert _texts(fig, f"view{k}-cell-text") == [str(p) for p in v.reshape(-1).long().tolist()]
        assert len(_patches(fig, f"view{k}-cell")) == v.numel()
        (label,) = _texts(fig, f"view{k}-label")
        assert label.startswith(name) and f"stride {v.stride()}" in label
        assert f"offset {v.storage_offset()}" in label and f"shape {tuple(v.shape)}" in label
    expand = _texts(fig, "view4-label")[0]
    assert "12 elements in 4 cells" in expand and "stride (12, 0, 1)" in expand  # stride 0: reused
    contiguous = [_texts(fig, f"view{k}-label")[0].endswith(", contiguous")
                  for k in range(len(VIEWS))]
    assert contiguous == [v.is_contiguous() for v in VIEWS.values()]
    plt.close(fig)


def test_cells_keep_storage_order_in_colour_and_runs_apart():
    fig = views.draw_views({"base": BASE, "t": BASE.transpose(0, 2)})
    storage = {int(t.get_text()): c for t, c in zip(
        [t for t in fig.axes[0].texts if t.get_gid() == "storage-cell-text"],
        _patches(fig, "storage-cell"), strict=True)}
    for text, patch in zip([t for t in fig.axes[0].texts if t.get_gid() == "view1-cell-text"],
                           _patches(fig, "view1-cell"), strict=True):
        assert patch.get_facecolor() == storage[int(text.get_text())].get_facecolor()
    xs = [p.get_x() for p in _patches(fig, "view1-cell")]  # shape (4, 3, 2): runs of 2 set apart
    steps = [round(b - a, 6) for a, b in itertools.pairwise(xs)]
    small, large = 1 + views.GAPS[0], 1 + views.GAPS[1]
    assert steps == [1 if k % 2 == 0 else (large if k % 6 == 5 else small) for k in range(23)]
    plt.close(fig)


def test_split_heads_is_drawn_as_a_view_of_the_activation():
    x = torch.arange(12.0).reshape(1, 3, 4)  # (batch, seq, d_model)
    q = tensors.split_heads(x, 2)
    fig = views.draw_views({"x": x, "split_heads(x, 2)": q})
    assert _texts(fig, "view1-cell-text") == [str(p) for p in [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10,
                                                                 11]]
    plt.close(fig)


def test_labels_do_not_overprint():
    fig = views.draw_views(VIEWS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if t.get_gid().endswith("label")]
    boxes = [t.get_window_extent(renderer) for t in labels]
    cells = [p.get_window_extent(renderer) for p in fig.axes[0].patches]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)
    for box, text in zip(boxes, labels, strict=True):
        assert not any(box.overlaps(c) for c in cells), text.get_text()
    plt.close(fig)


def test_bad_views_are_refused():
    with pytest.raises(ValueError, match="non-empty mapping"):
        views.draw_views({})
    with pytest.raises(TypeError, match=r"views\['a'\] must be a torch.Tensor"):
        views.draw_views({"a": [1, 2]})
    with pytest.raises(ValueError, match=r"share one storage: views\['copy'\]"):
        views.draw_views({"base": BASE, "copy": BASE.clone()})
    big = torch.arange(100.0)
    with pytest.raises(ValueError, match="MAX_DRAWN_ELEMENTS = 48"):
        views.draw_views({"big": big[:10]})  # its storage is too long to draw
    with pytest.raises(TypeError, match="t must be a torch.Tensor"):
        views.positions((2, 3))
