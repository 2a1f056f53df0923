"""mlsys.diagrams.collectives: the simulated ring against the sum and the accounting's bytes, the
ring grid against the simulation, and the DDP overlap lanes against `accounting.buckets`."""

import itertools

import matplotlib.pyplot as plt
import pytest
import torch

from mlsys import hardware
from mlsys.accounting import buckets
from mlsys.accounting import comms as comms_cost
from mlsys.diagrams import collectives
from mlsys.plotting import COLORS


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_the_simulated_ring_sums_and_sends_what_the_accounting_says(n):
    gen = torch.Generator().manual_seed(n)
    ints = [torch.randint(-1000, 1000, (3, 17), generator=gen) for _ in range(n)]
    copies = [x.clone() for x in ints]
    trace = collectives.simulate_ring_all_reduce(ints)
    total = torch.stack(ints).sum(0)
    assert all(torch.equal(r, total) for r in trace.results)  # exact on integers
    assert all(torch.equal(a, b) for a, b in zip(ints, copies, strict=True))  # inputs untouched
    assert [s.phase for s in trace.steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    # after the reduce-scatter, rank r holds the whole sum of chunk r + 1 and of no other chunk
    first_ag = trace.steps[n - 1]
    for r in range(n):
        done = [c for c in range(n) if first_ag.holds[r][c] == frozenset(range(n))]
        assert done == [(r + 1) % n] and first_ag.sends[r] == (r + 1) % n
    assert all(h == frozenset(range(n)) for row in trace.final for h in row)
    # floats whose length n divides: each rank sends 2 (n-1)/n M, the accounting's bytes
    floats = [torch.randn(12 * n, generator=gen, dtype=torch.float64) for _ in range(n)]
    trace = collectives.simulate_ring_all_reduce(floats)
    assert torch.allclose(trace.results[0], torch.stack(floats).sum(0))
    sent = comms_cost.collective_cost("all_reduce", 8 * 12 * n, n).sent_bytes
    assert trace.sent_bytes == (sent,) * n


def test_the_simulated_ring_refuses_bad_buffers():
    with pytest.raises(ValueError, match="number of ranks"):
        collectives.simulate_ring_all_reduce([torch.ones(4)])
    with pytest.raises(ValueError, match="same shape and dtype"):
        collectives.simulate_ring_all_reduce([torch.ones(4), torch.ones(5)])
    with pytest.raises(TypeError, match="sequence of torch tensors"):
        collectives.simulate_ring_all_reduce([[1.0], [2.0]])


def _drawn_texts(fig) -> list:
    """The texts a figure shows: titles, labels, tick labels inside the view, texts, legends."""
    out = []
    for ax in fig.axes:
        out += [ax.title, ax._left_title, *ax.texts]
        if ax.axison:
            out += [ax.xaxis.label, ax.yaxis.label]
            lo, hi = sorted(ax.get_xlim())
            out += [t for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
            lo, hi = sorted(ax.get_ylim())
            out += [t for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
        if ax.get_legend():
            out += ax.get_legend().get_texts()
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def _texts_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap; asserts that none is cut at the figure's edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9))
             for t in _drawn_texts(fig)]
    edge = fig.bbox
    outside = [name for name, b in boxes if not (edge.x0 - 1 <= b.x0 and b.x1 <= edge.x1 + 1)]
    assert not outside, f"text cut at the figure's edge: {outside}"
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


@pytest.mark.parametrize("n", [2, 4, 6])
def test_the_ring_grid_draws_the_simulation(n):
    fig = collectives.draw_ring_all_reduce(n, numel=10 * n + 3)
    ax = fig.axes[0]
    trace = collectives.simulate_ring_all_reduce(
        [torch.randn(10 * n + 3, dtype=torch.float64) for _ in range(n)])
    columns = 2 * (n - 1) + 1
    chunks = [p for p in ax.patches if str(p.get_gid()).startswith("chunk")]
    assert len(chunks) == n * n * columns
    sent = sorted(tuple(map(int, p.get_gid().split()[1:])) for p in ax.patches
                  if str(p.get_gid()).startswith("sent"))
    assert sent == sorted((j, r, step.sends[r]) for j, step in enumerate(trace.steps)
                          for r in range(n))
    # the numbers in the boxes are the simulation's counts, and green means all n
    counts = [int(t.get_text()) for t in ax.texts if t.get_text().isdigit()]
    holds = [st.holds for st in trace.steps] + [trace.final]
    assert counts == [len(h[r][c]) for h in holds for r in range(n) for c in range(n)]
    green = [p for p in chunks if p.get_facecolor()[:3] == plt.matplotlib.colors.to_rgb(
        COLORS["accent"])]
    assert len(green) == sum(len(h[r][c]) == n for h in holds for r in range(n) for c in range(n))
    assert _texts_overlap(fig) == []
    plt.close(fig)


def test_the_ring_grid_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="n_ranks"):
        collectives.draw_ring_all_reduce(1)
    with pytest.raises(ValueError, match="n_ranks must be at most"):
        collectives.draw_ring_all_reduce(collectives.MAX_DRAWN_RANKS + 1)
    with pytest.raises(TypeError, match="n_ranks"):
        collectives.draw_ring_all_reduce(2.0)
    with pytest.raises(ValueError, match="numel"):
        collectives.draw_ring_all_reduce(4, numel=3)


AB = {"alpha_s": 20e-6, "bytes_per_s": hardware.LINKS["nvlink4"].bytes_per_s}
SIZES = [30 << 20, *([20 << 20] * 40), 3 << 20]  # ready order: the last one small


@pytest.mark.parametrize(("cap", "backward_s", "link"), [
    (64 << 20, 20e-3, "nvlink4"), (2 << 30, 20e-3, "nvlink4"), (25 << 20, 5e-3, "pcie4"),
    (1 << 20, 1e-3, "nvlink4")])
def test_the_overlap_lanes_are_the_bucket_schedule(cap, backward_s, link):
    ab = {**AB, "bytes_per_s": hardware.LINKS[link].bytes_per_s}
    slots = buckets.overlap_schedule(buckets.bucket_bytes(SIZES, cap), backward_s, 2, **ab)
    assert [s.bytes for s in slots] == buckets.bucket_bytes(SIZES, cap)
    for a, b in itertools.pairwise(slots):
        assert a.ready_s == pytest.approx(b.first_s) and b.start_s >= a.end_s  # one at a time
    assert all(s.start_s >= s.ready_s for s in slots)  # none starts before its bucket is ready
    fig = collectives.draw_ddp_overlap(SIZES, cap, backward_s, 2, **ab)
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches}
    assert len([g for g in bars if str(g).startswith("all-reduce")]) == len(slots)
    last = bars[f"all-reduce {len(slots) - 1}"]
    assert last.get_x() + last.get_width() == pytest.approx(slots[-1].end_s * 1e3)
    backward = sum(bars[f"backward {i}"].get_width() for i in range(len(slots)))
    assert backward == pytest.approx(backward_s * 1e3)
    # the hatched span is the accounting's exposed communication, and starts at the backward's end
    exposed = buckets.overlap_exposed_s(buckets.bucket_bytes(SIZES, cap), backward_s, 2, **ab)
    assert bars["exposed"].get_width() == pytest.approx(exposed * 1e3)
    assert bars["exposed"].get_x() == pytest.approx(backward_s * 1e3)
    assert _texts_overlap(fig) == []
    plt.close(fig)


def test_the_overlap_diagram_refuses_bad_input():
    with pytest.raises(ValueError, match="backward_s"):
        collectives.draw_ddp_overlap(SIZES, 25 << 20, -1.0, 2, **AB)
    with pytest.raises(ValueError, match="cap_bytes"):
        collectives.draw_ddp_overlap(SIZES, 0, 1.0, 2, **AB)
    with pytest.raises(ValueError, match="tensor_bytes"):
        collectives.draw_ddp_overlap([-1, 4], 25 << 20, 1.0, 2, **AB)
