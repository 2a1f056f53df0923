"""mlsys.diagrams.parallel: the tensor-parallel split, the pipeline schedules and the mesh, each
checked against the accounting that computes it."""

import itertools
import math

import matplotlib
import matplotlib.pyplot as plt
import pytest

from mlsys import hardware
from mlsys.accounting import parallel, parallel_traffic, pipeline
from mlsys.diagrams import parallel as diagrams
from mlsys.models.config import TransformerConfig
from mlsys.plotting import CYCLE

matplotlib.use("Agg")


def _texts_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of non-empty texts of `fig` whose drawn boxes intersect (Agg renderer)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.overlaps(box_b)]


def _by_gid(fig, gid: str):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


# --- tensor parallelism ---------------------------------------------------------------------------


@pytest.mark.parametrize("model, tp", [(parallel.XXL, 4), (TransformerConfig.preset("small"), 2)])
def test_tensor_parallel_gives_each_rank_a_column_of_a_and_a_row_of_b(model, tp):
    shapes = diagrams.tp_shard_shapes(model, tp)
    d, f = shapes["A"]
    assert shapes["A_i"] == (d, f // tp) and shapes["B_i"] == (f // tp, d)
    fig = diagrams.draw_tensor_parallel(model, tp, tokens=2_048)
    try:
        a_shards, b_shards = _by_gid(fig, "A_shard"), _by_gid(fig, "B_shard")
        assert len(a_shards) == len(b_shards) == tp
        a_x = [p.get_x() for p in a_shards]  # rank i's stripe is column i, left to right
        assert a_x == sorted(a_x) and len(set(a_x)) == tp
        assert len({round(p.get_width(), 9) for p in a_shards}) == 1
        b_y = [p.get_y() + i * diagrams.TP_LANE for i, p in enumerate(b_shards)]  # in its lane
        assert b_y == sorted(b_y, reverse=True) and len(set(b_y)) == tp
        texts = {t.get_text() for t in fig.axes[0].texts}
        for i in range(tp):
            assert f"A_{i}\n{d:,} × {f // tp:,}" in texts
            assert f"B_{i}\n{f // tp:,} × {d:,}" in texts
            assert f"Y_{i}\n2,048 × {f // tp:,}" in texts
        assert len(_by_gid(fig, "f")) == tp and len(_by_gid(fig, "g")) == 1
        assert any("f: forward identity, backward all-reduce" in t for t in texts)
        assert any("g: forward all-reduce" in t for t in texts)
        assert _texts_overlap(fig) == []
    finally:
        plt.close(fig)


def test_tensor_parallel_refuses_a_degree_the_model_cannot_take():
    with pytest.raises(ValueError, match=r"d_ff \(53248\) is not divisible by tp \(3\)"):
        diagrams.draw_tensor_parallel(parallel.XXL, 3)
    with pytest.raises(ValueError, match=r"n_heads \(12\) is not divisible by tp \(8\)"):
        diagrams.draw_tensor_parallel(TransformerConfig.preset("small"), 8)
    with pytest.raises(ValueError, match=r"tp \(16\) must be <= 8"):
        diagrams.draw_tensor_parallel(parallel.XXL, 16)
    with pytest.raises(ValueError, match="tokens"):
        diagrams.draw_tensor_parallel(parallel.XXL, 2, tokens=0)


# --- pipeline schedules ---------------------------------------------------------------------------


@pytest.mark.parametrize("p, m, tf, tb", [(4, 8, 1.0, 2.0), (2, 1, 1.0, 1.0), (3, 5, 1.0, 3.0)])
def test_the_shaded_area_is_the_bubble_of_the_accounting(p, m, tf, tb):
    fig = diagrams.draw_pipeline_schedules(p, m, forward_s=tf, backward_s=tb)
    try:
        assert len(fig.axes) == len(pipeline.SCHEDULES)
        total = (m + p - 1) * (tf + tb)
        for ax, schedule in zip(fig.axes, pipeline.SCHEDULES, strict=True):
            idle = [patch for patch in ax.patches if patch.get_gid() == diagrams.IDLE]
            area = sum(patch.get_width() * patch.get_height() for patch in idle)
            drawn = area / (p * total * 0.8)  # every bar is 0.8 high
            assert drawn == pytest.approx(pipeline.bubble_fraction(p, m))
            assert drawn == pytest.approx(pipeline.simulated_bubble_fraction(
                p, m, schedule, forward_s=tf, backward_s=tb))
            ops = [patch for patch in ax.patches if patch.get_gid() != diagrams.IDLE]
            assert len(ops) == 2 * m * p  # a forward and a backward per micro-batch and stage
            busy = sum(patch.get_width() for patch in ops)
            assert busy + area / 0.8 == pytest.approx(p * total)  # no overlap, no hole
            assert f"bubble {pipeline.bubble_fraction(p, m):.1%}" in ax.get_title(loc="left")
            held = [t.get_text() for t in ax.texts if t.get_text().startswith("holds")]
            assert held == [f"holds {pipeline.in_flight(s, p, m, schedule)}" for s in range(p)]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("m", [8, 32])
def test_the_micro_batch_labels_never_overprint(m):
    fig = diagrams.draw_pipeline_schedules(4, m)
    try:
        labels = [t for ax in fig.axes for t in ax.texts if t.get_text()[0] in "FB"]
        if m == 8:  # room for every label: a forward and a backward per micro-batch and stage
            assert len(labels) == len(pipeline.SCHEDULES) * 2 * m * 4
        assert _texts_overlap(fig) == []
    finally:
        plt.close(fig)


def test_pipeline_schedules_check_their_arguments():
    with pytest.raises(ValueError, match="schedule"):
        diagrams.draw_pipeline_schedules(4, 8, schedules=("zero-bubble",))
    with pytest.raises(ValueError, match="at least one"):
        diagrams.draw_pipeline_schedules(4, 8, schedules=())
    fig, ax = plt.subplots()
    try:
        with pytest.raises(ValueError, match="ax has 1 axes for 2 schedules"):
            diagrams.draw_pipeline_schedules(4, 8, ax=ax)
        assert diagrams.draw_pipeline_schedules(4, 8, schedules=("1f1b",), ax=ax) is fig
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="n_stages"):
        diagrams.draw_pipeline_schedules(0, 8)


# --- the mesh on the cluster ----------------------------------------------------------------------


def test_mesh_colours_each_rank_by_its_coordinate_and_places_each_axis_on_its_link():
    dims = parallel.ParallelDims(pp=2, dp_shard=4, cp=2, tp=4)
    cluster = hardware.get_cluster("dgx-h100")
    fig = diagrams.draw_mesh(dims, "dgx-h100")
    try:
        ax = fig.axes[0]
        axes_drawn = [a for a in parallel.MESH_AXES if getattr(dims, a) > 1]
        assert axes_drawn == ["pp", "dp_shard", "cp", "tp"]
        assert len(_by_gid(fig, "node")) == dims.world_size // cluster.per_node
        for axis in axes_drawn:
            cells = [p for p in ax.patches if (p.get_gid() or "").startswith(f"{axis}:")]
            assert len(cells) == dims.world_size
            outlined = set()
            for cell in cells:
                _, rank, k = cell.get_gid().split(":")
                assert int(k) == dims.coords(int(rank))[axis]
                assert matplotlib.colors.same_color(cell.get_facecolor()[:3], CYCLE[int(k)])
                if cell.get_linewidth() > 1:
                    outlined.add(int(rank))
            assert outlined == set(dims.group_ranks(0, axis))
            link = (cluster.send_link(dims.span(axis)) if axis == "pp" else  # the planner's rule
                    parallel_traffic.group_link(dims, cluster, 0, axis))
            rows = {t.get_text(): t.get_position()[1] for t in ax.texts}
            row = rows[f"{axis} = {getattr(dims, axis)} "]
            verdict, = [t.get_text() for t in ax.texts if "groups of" in t.get_text()
                        and t.get_position()[1] == row]
            assert verdict.startswith(f" {dims.world_size // getattr(dims, axis)} groups of ")
            inside = dims.span(axis) <= cluster.per_node
            assert ("inside a node" in verdict) == inside
            assert f"{link.bytes_per_s / 1e9:.0f} GB/s" in verdict
        assert diagrams.axis_links(dims, cluster) == {
            "pp": (False, cluster.inter_node), "dp_shard": (False, cluster.inter_node),
            "cp": (True, cluster.intra_node), "tp": (True, cluster.intra_node)}
        assert _texts_overlap(fig) == []
    finally:
        plt.close(fig)


def test_a_group_that_straddles_two_nodes_crosses_the_network():
    """tp = 3 on nodes of 8: rank 6's group {6, 7, 8} leaves its node though 3 <= 8."""
    dims = parallel.ParallelDims(dp_shard=8, tp=3)
    inside, link = diagrams.axis_links(dims, "dgx-h100")["tp"]
    assert not inside and link is hardware.get_cluster("dgx-h100").inter_node
    assert math.prod(dims.shape) == 24


def test_mesh_checks_its_arguments():
    with pytest.raises(TypeError, match="ParallelDims"):
        diagrams.draw_mesh({"tp": 2}, "dgx-h100")
    with pytest.raises(ValueError, match=r"world_size \(1024\) must be <= 512"):
        diagrams.draw_mesh(parallel.ParallelDims(dp_shard=1024), "dgx-h100")
    with pytest.raises(ValueError, match="cluster"):
        diagrams.draw_mesh(parallel.ParallelDims(tp=2), "dgx-z9")
    lone = hardware.Cluster("one box of 4", hardware.H100_SXM, 4, hardware.LINKS["nvlink4"], None)
    with pytest.raises(ValueError, match="no link between nodes"):
        diagrams.draw_mesh(parallel.ParallelDims(tp=8), lone)
