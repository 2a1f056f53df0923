import matplotlib.pyplot as plt
import pytest

from mlsys import plotting


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
