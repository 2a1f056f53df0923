"""mlsys.diagrams.flops: the matmul boxes against their shapes and 2mnk, the linear layer's three
passes against `accounting.flops` and PyTorch's counter, the block's bars against `layer_flops`
and the counter on the real model."""

import itertools

import matplotlib.pyplot as plt
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import flops
from mlsys.book import num
from mlsys.diagrams import flops as flop_diagrams
from mlsys.models.config import TransformerConfig
from mlsys.models.counting import count_model_flops


def _texts_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of texts (titles, texts, tick labels, legend) whose boxes overlap; none may be cut at
    the figure's edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, *ax.texts]
        if ax.axison:  # the tick labels inside the view
            lo, hi = sorted(ax.get_xlim())
            texts += [ax.xaxis.label, *(t for t in ax.get_xticklabels()
                                        if lo <= t.get_position()[0] <= hi)]
            lo, hi = sorted(ax.get_ylim())
            texts += [t for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
        if ax.get_legend():
            texts += ax.get_legend().get_texts()
    boxes = [(t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9)) for t in texts
             if t.get_visible() and t.get_text().strip()]
    outside = [name for name, b in boxes if not (fig.bbox.x0 - 1 <= b.x0 and
                                                 b.x1 <= fig.bbox.x1 + 1)]
    assert not outside, f"text cut at the figure's edge: {outside}"
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def _boxes(ax) -> dict[str, tuple[float, float]]:
    """(width, height) of the boxes A, B and C of a drawn matmul."""
    return {p.get_gid(): (p.get_width(), p.get_height()) for p in ax.patches
            if p.get_gid() in ("A", "B", "C")}


@pytest.mark.parametrize(("m", "n", "k"), [(37, 53, 71), (4, 100, 9), (64, 64, 64)])
def test_a_matmul_is_drawn_to_its_shapes_with_2mnk_in_the_title(m, n, k):
    fig = flop_diagrams.draw_matmul(m, n, k)
    ax = fig.axes[0]
    assert _boxes(ax) == {"A": (k, m), "B": (n, k), "C": (n, m)}
    assert num(flops.matmul_flops(m, n, k)) in ax.get_title(loc="left")
    # the marked row of A and column of B are one row long and one column tall
    marks = {p.get_gid(): p for p in ax.patches}
    assert (marks["row of A"].get_width(), marks["row of A"].get_height()) == (k, 1)
    assert (marks["column of B"].get_width(), marks["column of B"].get_height()) == (1, k)
    assert _texts_overlap(fig) == []
    plt.close(fig)


def test_a_matmul_refuses_sizes_that_are_not_positive_ints():
    with pytest.raises(ValueError, match="m"):
        flop_diagrams.draw_matmul(0, 3, 4)
    with pytest.raises((TypeError, ValueError), match="k"):
        flop_diagrams.draw_matmul(2, 3, 4.5)


@pytest.mark.parametrize(("tokens", "d_in", "d_out"), [(45, 96, 160), (7, 11, 13), (128, 16, 16)])
def test_the_linear_passes_are_the_counters_forward_and_backward(tokens, d_in, d_out):
    passes = flop_diagrams.linear_passes(tokens, d_in, d_out)
    assert [sorted((p.m, p.n, p.k)) for p in passes] == [sorted((tokens, d_in, d_out))] * 3
    layer = torch.nn.Linear(d_in, d_out, bias=False)
    x = torch.randn(tokens, d_in, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        y = layer(x)
    with FlopCounterMode(display=False) as backward:
        y.sum().backward()
    assert passes[0].flops == forward.get_total_flops()
    assert passes[1].flops + passes[2].flops == backward.get_total_flops()
    # the gradients' shapes are the drawn outputs: dX is tokens x d_in, dW is d_in x d_out
    assert (passes[1].m, passes[1].n) == tuple(x.grad.shape)
    assert (passes[2].m, passes[2].n) == tuple(layer.weight.grad.T.shape)


def test_the_linear_passes_are_drawn_on_one_scale():
    fig = flop_diagrams.draw_linear_passes(45, 96, 160)
    axes = fig.axes
    assert len(axes) == 3
    for ax, p in zip(axes, flop_diagrams.linear_passes(45, 96, 160), strict=True):
        assert _boxes(ax) == {"A": (p.k, p.m), "B": (p.n, p.k), "C": (p.n, p.m)}
        assert num(p.flops) in ax.get_title(loc="left")
    spans = {(round(ax.get_xlim()[1] - ax.get_xlim()[0], 9),
              round(ax.get_ylim()[1] - ax.get_ylim()[0], 9)) for ax in axes}
    assert len(spans) == 1  # one scale: equal extents in every panel
    assert num(flops.linear_backward_flops(45, 96, 160)) in fig.texts[0].get_text()
    assert _texts_overlap(fig) == []
    plt.close(fig)


@pytest.mark.parametrize(("preset", "batch", "seq"), [("debug", 3, 100), ("small", 4, 512)])
def test_the_block_bars_are_layer_flops_three_times(preset, batch, seq):
    cfg = TransformerConfig.preset(preset)
    lf = flops.layer_flops(cfg, batch, seq)
    passes = flop_diagrams.block_passes(cfg, batch, seq)
    assert list(passes) == list(lf.MATMUL_TERMS)
    assert {name: sum(p) for name, p in passes.items()} == {
        name: 3 * getattr(lf, name) for name in lf.MATMUL_TERMS}
    fig = flop_diagrams.draw_block_flops(cfg, batch, seq)
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    for name, parts in passes.items():
        left = 0.0
        for part, value in zip(("forward", "grad 1", "grad 2"), parts, strict=True):
            bar = bars[f"{name} {part}"]
            assert bar.get_width() == pytest.approx(value / 1e9)
            assert bar.get_x() == pytest.approx(left)
            left += value / 1e9
    title = ax.get_title(loc="left")
    assert num(lf.matmul_flops / 1e9) in title and num(2 * lf.matmul_flops / 1e9) in title
    assert _texts_overlap(fig) == []
    plt.close(fig)


def test_the_block_bars_add_up_to_the_counters_training_count():
    cfg, batch, seq = TransformerConfig.preset("debug"), 2, 37
    per_block = sum(sum(p) for p in flop_diagrams.block_passes(cfg, batch, seq).values())
    head = 3 * flops.linear_flops(batch * seq, cfg.d_model, cfg.vocab_size)
    counted = count_model_flops(cfg, batch, seq, backward=True).get_total_flops()
    assert cfg.n_layers * per_block + head == counted


def test_the_block_diagram_refuses_a_bad_config_or_size():
    with pytest.raises(TypeError, match="d_model"):
        flop_diagrams.draw_block_flops(object(), 2, 8)
    with pytest.raises(ValueError, match="seq"):
        flop_diagrams.draw_block_flops(TransformerConfig.preset("debug"), 2, 0)
