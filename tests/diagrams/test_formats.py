"""The bit-field diagram (chapter 01) draws each format's fields with the widths of its (e, m),
writes the limits that follow from them, and keeps its labels apart."""

import itertools

import matplotlib.pyplot as plt
import pytest

from mlsys.diagrams import formats
from mlsys.numerics.precision import FORMATS, FloatFormat


def _patches(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def _texts(fig, gid):
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


def test_every_format_is_drawn_one_box_per_bit_aligned_on_the_binary_point():
    fig = formats.draw_bit_fields()
    for f in FORMATS.values():
        sign, exponent, mantissa = (_patches(fig, f"{f.name}-{field}")
                                    for field in ("sign", "exponent", "mantissa"))
        assert (len(sign), len(exponent), len(mantissa)) == (1, f.exponent_bits, f.mantissa_bits)
        assert len(sign) + len(exponent) + len(mantissa) == f.bits
        # the binary point at x = 0: exponent bits to its left, mantissa bits to its right
        assert max(p.get_x() + p.get_width() for p in exponent) == 0
        assert min(p.get_x() for p in mantissa) == 0
        assert sign[0].get_x() == -1 - f.exponent_bits
        assert _texts(fig, f"{f.name}-width") == [str(f.exponent_bits), str(f.mantissa_bits)]
        assert _texts(fig, f"{f.name}-name") == [f"{f.name} ({f.bits} bits)"]
    plt.close(fig)


def test_the_limits_line_is_the_formats_own():
    fig = formats.draw_bit_fields(["fp16", "bf16", "fp8_e4m3"])
    assert _texts(fig, "fp16-limits") == [
        "max 6.55e+04   ·   smallest normal $2^{-14}$   ·   subnormal $2^{-24}$   ·   "
        "eps $2^{-10}$"]
    (e4m3,) = _texts(fig, "fp8_e4m3-limits")
    assert e4m3.startswith("max 448, no inf") and "$2^{-9}$" in e4m3
    for name in ("fp16", "bf16", "fp8_e4m3"):
        f = FORMATS[name]
        assert 2.0**f.emin == f.smallest_normal and 2.0 ** -f.mantissa_bits == f.eps
        assert 2.0 ** (f.emin - f.mantissa_bits) == f.smallest_subnormal
        assert f"{f.max:.3g}" in _texts(fig, f"{name}-limits")[0]
    assert not _patches(fig, "fp32-sign")  # only the formats asked for
    plt.close(fig)


def test_a_format_of_ones_own_and_the_given_axes():
    mine = FloatFormat("e3m4", 3, 4)
    fig, ax = plt.subplots()
    assert formats.draw_bit_fields([mine, "fp32"], ax=ax) is fig
    assert len(_patches(fig, "e3m4-mantissa")) == 4 and len(_patches(fig, "fp32-mantissa")) == 23
    plt.close(fig)


def test_labels_do_not_overprint():
    fig = formats.draw_bit_fields()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if not t.get_gid().endswith("-width")]
    boxes = [t.get_window_extent(renderer) for t in labels]
    for (a, ta), (b, tb) in itertools.combinations(zip(boxes, labels, strict=True), 2):
        assert not a.overlaps(b), (ta.get_text(), tb.get_text())
    patches = [p.get_window_extent(renderer) for p in fig.axes[0].patches]
    for box, text in zip(boxes, labels, strict=True):  # no label lies on a bit's box
        assert not any(box.overlaps(p) for p in patches), text.get_text()
    plt.close(fig)


@pytest.mark.parametrize("bad, error, match", [
    ([], ValueError, "at least one format"),
    (["fp16", "fp16"], ValueError, "must not repeat"),
    (["fp17"], ValueError, r"formats\[0\]='fp17' is not a floating-point format"),
    ("fp16", TypeError, "sequence of format names"),
    (["int8"], ValueError, "formats"),
])
def test_bad_formats_are_refused(bad, error, match):
    with pytest.raises(error, match=match):
        formats.draw_bit_fields(bad)


def test_the_spacing_is_measured_on_torchs_numbers_and_drawn_per_format():
    assert formats.next_gap([1.0, 2.0**-20, 1000.0], "fp16") == [2.0**-10, 2.0**-24, 0.5]
    assert formats.next_gap([1.0], "bf16") == [2.0**-7]
    fig = formats.draw_spacing(["fp16", "bf16", "tf32"], measured=("fp16",), lo=-30, hi=18)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.lines}
    assert set(lines) == {"fp16-ulp", "bf16-ulp", "tf32-ulp", "fp16-measured"}
    xs, ys = lines["fp16-ulp"].get_data()
    assert min(xs) >= FORMATS["fp16"].smallest_subnormal and max(xs) <= FORMATS["fp16"].max
    assert set(ys) == {2.0**e for e in range(-24, 6)}  # the subnormal step, then 2^(E - 10)
    mx, my = lines["fp16-measured"].get_data()
    assert list(my) == formats.next_gap(list(mx), "fp16")
    plt.close(fig)
    with pytest.raises(ValueError, match="not among the drawn formats that torch stores"):
        formats.draw_spacing(["fp16", "tf32"], measured=("tf32",))
    with pytest.raises(ValueError, match="hi must be above lo"):
        formats.draw_spacing(lo=3, hi=3)
