"""The mixed-precision diagrams (chapter 07) draw what they are given and what the formats imply:
zones whose limits are the ones torch's casts obey, a loss-scale trace whose overflow marks are
the scaler's skipped steps, one coloured cell per recorded dtype, and gaps that are differences."""

import itertools
import math

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_hex

from mlsys.diagrams import precision
from mlsys.numerics.loss_scaling import DynamicLossScaler
from mlsys.numerics.precision import FORMATS


def _by_gid(fig, gid, kind="patches"):
    return [a for ax in fig.axes for a in getattr(ax, kind) if a.get_gid() == gid]


def _no_overprint(fig, texts):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    for (a, ta), (b, tb) in itertools.combinations(zip(boxes, texts, strict=True), 2):
        assert not a.overlaps(b), (ta.get_text(), tb.get_text())


# --- zones ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_zone_limits_are_where_torchs_cast_changes_its_answer(fmt):
    f = FORMATS[fmt]
    lim = precision.zone_limits(fmt)
    assert lim["underflow"][1] == f.smallest_subnormal / 2
    if fmt == "fp16":
        assert (lim["underflow"][1], lim["subnormal"][1], lim["overflow"][0]) == (
            2.0**-25, 2.0**-14 - 2.0**-25, 65_520.0)

    def cast(x):  # from float32, as gradients are (torch casts float64 through float32)
        return torch.tensor([x], dtype=torch.float32).to(f.dtype).double().item()

    def next32(x, toward):
        t = torch.tensor(x, dtype=torch.float32)
        return torch.nextafter(t, torch.tensor(toward, dtype=torch.float32)).item()

    for limit in (lim["underflow"][1], lim["subnormal"][1], lim["overflow"][0]):
        assert torch.tensor(limit, dtype=torch.float32).item() == limit  # exact in float32
        below, above = next32(limit, 0.0), next32(limit, math.inf)
        inside = {"underflow": lambda x, a, b: a < x <= b, "subnormal": lambda x, a, b: a < x < b,
                  "normal": lambda x, a, b: a <= x < b, "overflow": lambda x, a, b: a <= x}
        zones = [z for x in (below, limit, above) for z, (a, b) in lim.items()
                 if inside[z](x, a, b)]
        got = [cast(x) for x in (below, limit, above)]
        for x, zone, y in zip((below, limit, above), zones, got, strict=True):
            expected = {"underflow": y == 0, "subnormal": 0 < y < f.smallest_normal,
                        "normal": f.smallest_normal <= y <= f.max, "overflow": math.isinf(y)}
            assert expected[zone], (x, zone, y)


@pytest.mark.parametrize("scale", [1.0, 2.0**-6, 2.0**10, 3.0])
def test_zone_shares_equal_what_a_cast_does(scale):
    gen = torch.Generator().manual_seed(1)
    x = torch.exp2(torch.empty(20_000).uniform_(-32, 18, generator=gen))  # float32, as gradients
    x = x * torch.where(torch.rand(20_000, generator=gen) < 0.5, -1.0, 1.0)
    shares = precision.zone_shares([x[:7_000], x[7_000:]], "fp16", scale=scale)
    y = (x * scale).to(torch.float16).double().abs()
    assert shares["underflow"] == pytest.approx(float((y == 0).double().mean()), abs=0)
    assert shares["subnormal"] == float(((y > 0) & (y < 2.0**-14)).double().mean())
    assert shares["overflow"] == float(torch.isinf(y).double().mean())
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(v > 0 for v in shares.values()) or scale != 1.0


def test_zone_shares_refuse_what_cannot_be_sorted():
    with pytest.raises(ValueError, match="no non-zero entry"):
        precision.zone_shares(torch.zeros(3))
    with pytest.raises(ValueError, match="must be finite"):
        precision.zone_shares(torch.tensor([1.0, math.inf]))
    with pytest.raises(TypeError, match="tensor or a sequence of tensors"):
        precision.zone_shares([1.0, 2.0])
    with pytest.raises(ValueError, match="scale must be"):
        precision.zone_shares(torch.ones(2), scale=0.0)
    with pytest.raises(ValueError, match="not a floating-point format"):
        precision.zone_shares(torch.ones(2), "fp12")


# --- the histogram --------------------------------------------------------------------------------


def test_the_histogram_sums_to_one_and_its_legend_gives_the_shares():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(500, generator=gen) * 1e-6, torch.randn(300, generator=gen) * 1e-3]
    scales = (1.0, 2.0**8)
    fig = precision.draw_gradient_histogram(grads, scales=scales)
    ax = fig.axes[0]
    for s in scales:
        (hist,) = _by_gid(fig, f"hist-{s:g}")
        heights, edges = hist.get_data().values, hist.get_data().edges
        assert heights.sum() == pytest.approx(1.0)
        assert all(math.log2(e).is_integer() for e in edges)  # one bin per power of two
    labels = ax.get_legend_handles_labels()[1]
    for s in scales:
        text = precision.share_text(precision.zone_shares(grads, "fp16", scale=s))
        assert any(label.endswith(text) for label in labels), (text, labels)
    lim = precision.zone_limits("fp16")
    for zone in ("subnormal", "normal"):
        (span,) = _by_gid(fig, f"zone-{zone}")
        x0, width = span.get_x(), span.get_width()  # an axvspan: data x, axes y
        assert (x0, x0 + width) == pytest.approx(lim[zone])
    _no_overprint(fig, _by_gid(fig, "limit", "texts"))
    plt.close(fig)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"scales": ()}, ValueError, "non-empty sequence"),
    ({"scales": 2.0}, ValueError, "non-empty sequence"),
    ({"scales": (1.0, -2.0)}, ValueError, r"scales\[1\] must be"),
    ({"fmt": "int8"}, ValueError, "not a floating-point format"),
])
def test_the_histogram_refuses_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        precision.draw_gradient_histogram(torch.ones(4), **kwargs)


# --- the loss-scale sawtooth ----------------------------------------------------------------------


def _scaler_run(steps=120, amax=0.05, growth_interval=6):
    """A real DynamicLossScaler driven by a gradient whose largest entry is `amax`: a step
    overflows when amax * S rounds past fp16's max."""
    scaler = DynamicLossScaler(2.0**22, growth_interval=growth_interval)
    stored = []
    for _ in range(steps):
        value = float(torch.tensor(amax * scaler.scale).to(torch.float16))
        stored.append(value)
        scaler.update(math.isfinite(value))
    return scaler.history, stored


def test_the_sawtooth_draws_the_scalers_own_steps():
    history, stored = _scaler_run()
    scales, finite = [e.scale for e in history], [e.finite for e in history]
    fig = precision.draw_loss_scale(scales, finite, stored)
    (stairs,) = _by_gid(fig, "scale")
    assert stairs.get_data().values.tolist() == scales
    (marks,) = _by_gid(fig, "overflow", "lines")
    skipped = [e.step for e in history if not e.finite]
    assert marks.get_xdata().tolist() == skipped and len(skipped) > 5
    assert set(marks.get_ydata()) == {FORMATS["fp16"].max}
    (kept,) = _by_gid(fig, "stored-amax", "lines")
    assert max(kept.get_ydata()) <= FORMATS["fp16"].max  # what was kept fits under the max
    (true,) = _by_gid(fig, "true-amax", "lines")
    assert true.get_ydata().tolist() == pytest.approx([0.05] * len(true.get_ydata()), rel=1e-3)
    (top,) = _by_gid(fig, "format-max", "lines")
    assert top.get_ydata()[0] == 65_504
    assert any(f"({len(skipped)} steps)" in t for t in fig.axes[0].get_legend_handles_labels()[1])
    plt.close(fig)


@pytest.mark.parametrize("args, error, match", [
    (([], [], []), ValueError, "one entry per step"),
    (([1.0, 2.0], [True], [1.0, 1.0]), ValueError, "one entry per step"),
    (([1.0, 0.0], [True, True], [1.0, 1.0]), ValueError, r"scales\[1\] must be"),
    (([1.0], [1], [1.0]), TypeError, r"finite\[0\] must be a bool"),
    (([1.0, 2.0], [True, True], [1.0, math.inf]), ValueError, r"finite\[1\] is True"),
    (([1.0], [False], [3.0]), ValueError, r"finite\[0\] is False"),
])
def test_the_sawtooth_refuses_inconsistent_steps(args, error, match):
    with pytest.raises(error, match=match):
        precision.draw_loss_scale(*args)


# --- the autocast map -----------------------------------------------------------------------------

MAPS = {"cpu (live)": {"fc1 (Linear)": {"weights": "fp32", "output": "bf16", "grads": "fp32/bf16"},
                       "ln (LayerNorm)": {"weights": "fp32", "output": "bf16", "grads": "fp32"},
                       "loss": {"weights": "-", "output": "fp32", "grads": "-"}},
        "cuda (recorded)": {"fc1 (Linear)": {"weights": "fp32", "output": "fp16",
                                             "grads": "fp32/fp16"},
                            "ln (LayerNorm)": {"weights": "fp32", "output": "fp32, fp32",
                                               "grads": "fp32/fp32"},
                            "loss": {"weights": "-", "output": "fp32", "grads": "-"}}}


def test_the_map_colours_one_strip_per_recorded_dtype():
    fig = precision.draw_autocast_map(MAPS)
    for panel, rows in MAPS.items():
        for row, cells in rows.items():
            for col, cell in cells.items():
                strips = _by_gid(fig, f"cell:{panel}:{row}:{col}")
                names = list(dict.fromkeys(cell.replace("/", ", ").split(", ")))
                assert [to_hex(p.get_facecolor()) for p in strips] == [
                    to_hex(precision.DTYPE_COLORS[n]) for n in names], (panel, row, col)
    texts = fig.axes[0].texts
    assert [t.get_text() for t in texts if t.get_gid() == "panel"] == list(MAPS)
    labels = [t for t in texts if t.get_gid() in ("panel", "column", "row")]
    _no_overprint(fig, labels)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["fp32", "bf16", "nothing", "fp16"]  # the dtypes met, in order
    plt.close(fig)


def test_the_map_refuses_panels_that_do_not_line_up_and_unknown_dtypes():
    other = {**MAPS, "x": {"fc1 (Linear)": MAPS["cpu (live)"]["fc1 (Linear)"]}}
    with pytest.raises(ValueError, match=r"maps\['x'\] has rows"):
        precision.draw_autocast_map(other)
    cols = {"x": {r: {"output": c["output"]} for r, c in MAPS["cpu (live)"].items()}}
    with pytest.raises(ValueError, match="has columns"):
        precision.draw_autocast_map({**MAPS, **cols})
    bad = {"p": {"r": {"c": "fp32, complex64"}}}
    with pytest.raises(ValueError, match=r"maps\['p'\]\['r'\]\['c'\] = 'fp32, complex64'"):
        precision.draw_autocast_map(bad)
    with pytest.raises(ValueError, match="at least one panel"):
        precision.draw_autocast_map({})


# --- stagnation -----------------------------------------------------------------------------------


def test_stagnation_panels_show_each_run_and_its_gap_to_the_reference():
    losses = {"fp32": [3.0, 2.5, 2.1, 1.8], "nearest": [3.0, 2.9, 2.85, 2.8],
              "master": [3.0, 2.5, 2.1, 1.8000001]}
    fig = precision.draw_stagnation(losses, reference="fp32")
    markers = set()
    for label, curve in losses.items():
        (line,) = _by_gid(fig, f"loss:{label}", "lines")
        assert line.get_ydata().tolist() == curve
        (gap,) = _by_gid(fig, f"gap:{label}", "lines")
        assert gap.get_ydata().tolist() == pytest.approx(
            [a - b for a, b in zip(curve, losses["fp32"], strict=True)])
        markers.add(line.get_marker())
    assert len(markers) == len(losses)  # curves on top of each other stay apart by shape
    plt.close(fig)
    with pytest.raises(ValueError, match="reference='fp64' is not one of"):
        precision.draw_stagnation(losses, reference="fp64")
    with pytest.raises(ValueError, match="every run must have 4"):
        precision.draw_stagnation({**losses, "short": [1.0]}, reference="fp32")
    with pytest.raises(ValueError, match="two or more runs"):
        precision.draw_stagnation({"fp32": [1.0]}, reference="fp32")
