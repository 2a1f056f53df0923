"""The tiling diagrams (chapter 06) draw what the kernels compute: the tiles a program holds and
streams up to the kernels' loop bound, the online softmax's own recurrence, and causal tile counts
equal to the mask's and to `tiled_score_pairs`."""

import math

import matplotlib.pyplot as plt
import pytest
import torch

from mlsys.accounting import attention as attention_cost
from mlsys.diagrams import tiling
from mlsys.ops.attention import causal_mask
from mlsys.ops.flash_attention import flash_attention_torch

SHAPES = [(1, 1), (7, 7), (64, 64), (100, 37), (37, 100), (128, 128), (200, 333)]
BLOCKS = [(1, 1), (3, 5), (16, 16), (64, 8), (32, 64)]


def _patches(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def _texts(fig, gid):
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


@pytest.mark.parametrize("n_q, n_k", SHAPES)
@pytest.mark.parametrize("block_q, block_k", BLOCKS)
def test_causal_tiles_match_the_mask_and_the_accounting(n_q, n_k, block_q, block_k):
    kinds = tiling.causal_tiles(n_q, n_k, block_q=block_q, block_k=block_k)
    mask = causal_mask(n_q, n_k)  # True where query i sees key j
    tiles_q, tiles_k = -(-n_q // block_q), -(-n_k // block_k)
    assert sum(len(v) for v in kinds.values()) == tiles_q * tiles_k
    for kind, found in kinds.items():
        for i0, i1, j0, j1 in found:
            seen = mask[i0:i1, j0:j1]
            expected = ("skipped" if not seen.any() else "full" if seen.all() else "diagonal")
            assert kind == expected, (kind, (i0, i1, j0, j1))
    computed = sum((i1 - i0) * (j1 - j0) for kind in ("full", "diagonal")
                   for i0, i1, j0, j1 in kinds[kind])
    assert computed == attention_cost.tiled_score_pairs(n_q, n_k, block_q=block_q,
                                                        block_k=block_k, causal=True)
    # the dK/dV kernel's loop (over query tiles, from `lo`) visits the same tiles as the forward
    offset = n_k - n_q
    backward = {(i0, j0) for j0 in range(0, n_k, block_k)
                for i0 in range(max(0, j0 - offset) // block_q * block_q, n_q, block_q)}
    assert backward == {(i0, j0) for kind in ("full", "diagonal")
                        for i0, _, j0, _ in kinds[kind]}


def test_draw_causal_tiles_draws_each_kind_with_its_count():
    n, block_q, block_k = 1_024, 128, 64
    kinds = tiling.causal_tiles(n, n, block_q=block_q, block_k=block_k)
    assert {k: len(v) for k, v in kinds.items()} == {"skipped": 56, "full": 56, "diagonal": 16}
    fig = tiling.draw_causal_tiles(n, n, block_q=block_q, block_k=block_k)
    for kind in tiling.TILE_KINDS:
        assert len(_patches(fig, kind)) == len(kinds[kind])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:3] == ["skipped (56)", "full (56)", "diagonal (16)"]
    pairs = attention_cost.tiled_score_pairs(n, n, block_q=block_q, block_k=block_k, causal=True)
    assert f"{pairs / n**2:.1%}" in fig.axes[0].get_title(loc="left")
    plt.close(fig)


def test_draw_flash_tiling_holds_one_q_block_and_streams_to_the_loop_bound():
    n, d, block_q, block_k = 512, 64, 128, 64
    fig = tiling.draw_flash_tiling(n, n, d, block_q=block_q, block_k=block_k, program=2,
                                   causal=True)
    held = _patches(fig, "q-held")
    assert len(held) == 1 and held[0].get_height() == block_q and held[0].get_y() == 2 * block_q
    assert len(_patches(fig, "q-block")) == n // block_q - 1
    keys = attention_cost.keys_in_tiles(2 * block_q, n, n, block_q, block_k, True)
    assert len(_patches(fig, "k-streamed")) == len(_patches(fig, "v-streamed")) == keys // block_k
    assert len(_patches(fig, "k-skipped")) == (n - keys) // block_k == 2
    assert _texts(fig, "k-streamed-label") == [str(i) for i in range(1, keys // block_k + 1)]
    assert len(_patches(fig, "s-current")) == 1
    plt.close(fig)
    # not causal, a ragged last block: every key tile streamed, the held block's rows counted
    fig = tiling.draw_flash_tiling(300, 200, 32, block_q=128, block_k=64, program=2)
    assert _patches(fig, "q-held")[0].get_height() == 300 - 256
    assert [p.get_width() for p in _patches(fig, "k-streamed")] == [64, 64, 64, 8]
    assert not _patches(fig, "k-skipped")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[1] == "streamed: 4 K, V tiles of 64 rows, in order" and len(legend) == 3
    plt.close(fig)


def test_online_softmax_steps_are_the_recurrence_and_end_at_the_logsumexp():
    g = torch.Generator().manual_seed(1)
    row = torch.randn(70, generator=g, dtype=torch.float64) * 5
    steps = tiling.online_softmax_steps(row, block_k=16)
    assert [(s.start, s.stop) for s in steps] == [(0, 16), (16, 32), (32, 48), (48, 64), (64, 70)]
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.m_old == before.m_new and after.l_old == before.l_new
        assert after.rescale == pytest.approx(math.exp(before.m_new - after.m_new))
    assert steps[0].rescale == 0.0 and steps[-1].m_new == row.max().item()
    last = steps[-1]
    assert last.m_new + math.log(last.l_new) == pytest.approx(torch.logsumexp(row, 0).item(),
                                                              rel=1e-12)
    # the same (m, l) as the tiled FlashAttention of `mlsys.ops` for a query whose scores are row
    q, k = torch.ones(1, 1, dtype=torch.float64), row[:, None]
    _, lse = flash_attention_torch(q, k, k, scale=1.0, block_q=1, block_k=16)
    assert lse.item() == pytest.approx(last.m_new + math.log(last.l_new), rel=1e-12)


def test_draw_online_softmax_draws_each_step():
    g = torch.Generator().manual_seed(0)
    row = torch.randn(64, generator=g, dtype=torch.float64)
    steps = tiling.online_softmax_steps(row, block_k=8)
    fig = tiling.draw_online_softmax(row, block_k=8)
    top, bottom = fig.axes
    m_lines = [line for line in top.lines if line.get_gid() == "m-line"]
    assert [line.get_ydata()[0] for line in m_lines] == [s.m_new for s in steps]
    assert [line.get_ydata()[0] for line in m_lines] == [
        row[:s.stop].max().item() for s in steps]
    heights = [p.get_height() for p in bottom.patches if p.get_gid() == "l-block"]
    assert heights == pytest.approx([s.block_sum for s in steps])
    kept = [p.get_height() for p in bottom.patches if p.get_gid() == "l-kept"]
    assert [a + b for a, b in zip(kept, heights, strict=True)] == pytest.approx(
        [s.l_new for s in steps])
    assert _texts(fig, "rescale-label") == [f"×{s.rescale:.2g}" for s in steps[1:]]
    plt.close(fig)


def test_labels_do_not_overprint():
    g = torch.Generator().manual_seed(0)
    fig = tiling.draw_online_softmax(torch.randn(64, generator=g), block_k=8)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[1].texts]
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            assert not boxes[a].overlaps(boxes[b])
    plt.close(fig)


@pytest.mark.parametrize("call, match", [
    (lambda: tiling.causal_tiles(0, 4, block_q=1, block_k=1), "n_q"),
    (lambda: tiling.causal_tiles(4, 4, block_q=4, block_k=-1), "block_k"),
    (lambda: tiling.draw_flash_tiling(64, 64, 16, block_q=32, block_k=16, program=2),
     r"program=2 must be below the 2 query blocks"),
    (lambda: tiling.draw_flash_tiling(64, 64, 16, block_q=32, block_k=16, program=0, step=4,
                                      causal=True), r"step=4 must be below the 2 K/V tiles"),
    (lambda: tiling.draw_flash_tiling(64, 64, 0, block_q=32, block_k=16), "d_head"),
    (lambda: tiling.online_softmax_steps([], block_k=4), "non-empty"),
    (lambda: tiling.online_softmax_steps([1.0, math.inf], block_k=4), "finite"),
    (lambda: tiling.online_softmax_steps([1.0], block_k=0), "block_k"),
    (lambda: tiling.draw_online_softmax([1.0, 2.0], block_k=1, ax=[None]), "two axes"),
])
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
