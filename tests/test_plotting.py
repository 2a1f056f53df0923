"""mlsys.plotting: the house style, the generic helpers, and the figures of the cost models."""

import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from mlsys import hardware, plotting, tables, third_party
from mlsys.accounting import calibration, memory, parallel, planner
from mlsys.accounting.op_costs import op_costs
from mlsys.models.config import TransformerConfig


def test_subplots_applies_the_house_style():
    fig, axes = plotting.subplots(1, 2, width=8, height=3)
    try:
        assert fig.get_size_inches().tolist() == [8, 3]
        assert len(axes) == 2
        for ax in axes:
            assert not ax.spines["top"].get_visible() and not ax.spines["right"].get_visible()
    finally:
        plt.close(fig)


def test_finish_sets_labels_and_log_axes():
    fig, ax = plotting.subplots()
    try:
        ax.plot([1, 2, 4], [1, 4, 16], label="x^2")
        plotting.finish(ax, title="t", xlabel="x", ylabel="y", logx=2, logy=True)
        assert (ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel()) == ("t", "x", "y")
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert ax.get_legend() is not None
    finally:
        plt.close(fig)


def test_stacked_bars_stack_and_validate():
    fig, ax = plotting.subplots()
    try:
        plotting.stacked_bars(ax, ["a", "b"], {"x": [1, 2], "y": [3, 4]})
        tops = sorted(p.get_y() + p.get_height() for p in ax.patches)
        assert tops == [1, 2, 4, 6]
        with pytest.raises(ValueError, match="parts\\['z'\\] has 1 values for 2 labels"):
            plotting.stacked_bars(ax, ["a", "b"], {"z": [1]})
    finally:
        plt.close(fig)


def test_bad_grid_is_rejected():
    with pytest.raises(ValueError, match="nrows"):
        plotting.subplots(0, 1)


def test_roofline_draws_through_the_ridge():
    from mlsys.roofline import Ceilings

    roof = Ceilings(flop_per_s=100.0, bytes_per_s=10.0, label="toy")  # ridge at 10 FLOP/byte
    fig, ax = plotting.subplots()
    try:
        plotting.roofline(ax, roof, lo=0, hi=6)
        xs, ys = ax.lines[0].get_data()
        assert 10.0 in list(xs) and max(ys) == 100.0 and ys[0] == 10.0
        with pytest.raises(ValueError, match="lo"):
            plotting.roofline(ax, roof, lo=3, hi=3)
    finally:
        plt.close(fig)


# --- the chapters' cost-model figures -------------------------------------------------------------


def test_model_states_draw_a_line_per_recipe_the_presets_and_the_ceilings():
    presets = {"debug": 10**6, "xl": 2 * 10**9}
    h100 = hardware.H100_SXM
    ax = plotting.plot_model_states(presets, accelerator=h100, n_devices=8)
    try:
        recipes = list(memory.RECIPES.values())
        lines = ax.get_lines()
        assert len(lines) == len(recipes) + len(presets) + 4  # + two ceilings, two limits
        for line, r in zip(lines, recipes, strict=False):
            xs, ys = line.get_data()
            assert line.get_label() == r.name and ys[-1] == pytest.approx(xs[-1] * r.bytes_per_param
                                                                          / 1e9)
        dashed = [line.get_label() for line in lines[:len(recipes)]
                  if line.get_linestyle() != "-"]  # the same bytes/param as an earlier recipe
        assert dashed == ["bf16_mixed_adamw", "fp32_sgd"]
        assert lines[len(recipes)].get_ydata()[0] == pytest.approx(16 * 10**6 / 1e9)  # 16 B/param
        assert [t.get_text() for t in ax.texts] == ["debug", "xl", "5B", "40B"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[-3:] == ["presets (16 B/param)", "1 x H100 SXM (80 GB)",
                               "8 x H100 SXM (640 GB)"]
        assert ax.get_title(loc="left") == "Model states versus model size"
        assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    finally:
        plt.close(ax.figure)


def test_op_roofline_puts_each_op_on_the_spec_roof():
    ops = op_costs("bf16")  # every one of them: chapter 04 shows them all
    assert len(ops) <= len(plotting.MARKERS)
    h100 = hardware.H100_SXM
    ax = plotting.plot_op_roofline(ops, accelerator=h100, dtype="bf16")
    try:
        roof, ridge, *points = ax.get_lines()
        assert len(points) == len(ops) and roof.get_label() == "H100 SXM roof, bf16 (spec)"
        assert ridge.get_xdata()[0] == pytest.approx(h100.ridge_intensity("bf16"))
        for line, op in zip(points, ops, strict=True):
            assert line.get_label() == op.name
            expected = min(h100.peak_flop_per_s("bf16"), op.intensity * h100.hbm_bytes_per_s)
            assert line.get_ydata()[0] == pytest.approx(expected)
        assert len({(line.get_color(), line.get_marker()) for line in points}) == len(ops)
        assert ax.get_title(loc="left") == "Napkin roofline: operations on an H100 SXM (bf16)"
        assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)"
        assert len(ax.get_legend().get_texts()) == len(ops) + 1
    finally:
        plt.close(ax.figure)


def test_an_op_past_the_last_marker_is_refused_not_dropped():
    styles = plotting.marker_styles(len(plotting.MARKERS))
    assert len(set(styles)) == len(plotting.MARKERS)
    assert len({marker for _, marker in styles}) == len(plotting.MARKERS)
    too_many = op_costs("bf16") * 2
    with pytest.raises(ValueError, match=rf"{len(too_many)} operations but only "
                                         rf"{len(plotting.MARKERS)} marker shapes"):
        plotting.plot_op_roofline(too_many, accelerator=hardware.H100_SXM, dtype="bf16")
    plt.close("all")


def _overlapping_texts(ax) -> list[tuple[str, str]]:
    ax.figure.canvas.draw()  # the Agg renderer (tests/conftest.py): boxes as drawn
    renderer = ax.figure.canvas.get_renderer()
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer))  # the text, not its arrow
             for t in ax.texts]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:]
            if box_a.overlaps(box_b)]


def test_labels_of_points_on_top_of_each_other_do_not_overprint():
    fig, ax = plotting.subplots()
    try:
        ax.scatter([1, 1, 1, 5], [2, 2, 2.01, 9])
        notes = plotting.label_points(ax, [(1, 2), (1, 2), (1, 2.01)], ["first", "second", "third"],
                                      avoid=[(1, 2), (5, 9)])
        assert [n.get_text() for n in notes] == ["first", "second", "third"]
        assert [n.xy for n in notes] == [(1, 2), (1, 2), (1, 2.01)]  # each joined to its point
        assert _overlapping_texts(ax) == []
        with pytest.raises(ValueError, match="2 points for 1 texts"):
            plotting.label_points(ax, [(1, 2), (3, 4)], ["one"])
    finally:
        plt.close(fig)


# --- the planner's figures ------------------------------------------------------------------------


SMALL = TransformerConfig.preset("small")  # 12 heads, d_ff 3,072
KW = {"n_devices": 16, "batch": 64, "seq": 1024}


@pytest.fixture(scope="module")
def plans():
    return planner.plan(SMALL, "dgx-h100", **KW)


def test_table_and_figures(plans):
    lines = tables.plan_table(plans, top=3)
    assert len(lines) == 4 and "limited by" in lines[0]
    ax = plotting.plot_plans(plans)
    assert ax.collections and ax.get_xlabel() == "predicted step time (s)"
    best = [p for p in plans if p.fits][:3]
    assert [t.get_text() for t in ax.texts] == [
        f"{i}. {tables.plan_text(p)}, m = {p.microbatches}" for i, p in enumerate(best, 1)]
    assert _overlapping_texts(ax) == []  # the best meshes often share a point
    plt.close(ax.figure)
    ax = plotting.plot_compute_bound(parallel.XXL.d_model, parallel.XXL.d_ff, 64,
                                    flop_per_s=hardware.TPU_V5P.peak_flop_per_s("bf16"),
                                    link_bytes_per_s=hardware.LINKS["ici-v5p-axis"].bytes_per_s,
                                    m_x=2, fixed_xy=(16, 4))
    assert len(ax.lines) == 5  # FSDP, TP, optimal mix, X = 16 x Y = 4, and the line at 1


# --- a step broken down --------------------------------------------------------------------------


def test_step_breakdown_stacks_each_part_of_each_step():
    steps = {row.params_b: calibration.predict(row) for row in third_party.MEGATRON_TABLE1[-2:]}
    labels = [f"{k:g}B" for k in steps]
    ax = plotting.step_breakdown(dict(zip(labels, steps.values(), strict=True)))
    try:
        parts = [tables.step_parts(b) for b in steps.values()]
        drawn = [k for k in tables.STEP_PARTS if any(p[k] > 0 for p in parts)]
        assert "ep" not in drawn and {"compute", "recompute", "bubble", "tp"} <= set(drawn)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [
            tables.STEP_PARTS[k] for k in drawn]
        assert len(ax.patches) == len(drawn) * len(steps)  # one segment per part and step
        tops = {}
        for bar in ax.patches:
            x = round(bar.get_x() + bar.get_width() / 2)
            tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
        assert list(tops.values()) == pytest.approx([100.0, 100.0])  # shares add up
        assert [t.get_text() for t in ax.get_xticklabels()] == labels
    finally:
        plt.close(ax.figure)
    ax = plotting.step_breakdown({"one": steps[1008.0]}, share=False)
    try:
        assert sum(bar.get_height() for bar in ax.patches) == pytest.approx(
            steps[1008.0].step_s)
        assert ax.get_ylabel() == "seconds per step"
    finally:
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="at least one"):
        plotting.step_breakdown({})
