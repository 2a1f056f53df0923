"""mlsys.diagrams.hierarchy: the levels against the hardware table, field by field, and the drawn
boxes and labels against the levels, for every accelerator of the table."""

import itertools
import math

import matplotlib.pyplot as plt
import pytest

from mlsys import hardware
from mlsys.diagrams import hierarchy


def _texts(fig) -> list:
    ax = fig.axes[0]
    return [t for t in [ax.title, ax._left_title, *ax.texts] if t.get_text().strip()]


def _texts_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap; none may be cut at the figure's edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9)) for t in _texts(fig)]
    edge = fig.bbox
    outside = [name for name, b in boxes if not (edge.x0 - 1 <= b.x0 and b.x1 <= edge.x1 + 1
                                                 and edge.y0 - 1 <= b.y0 and b.y1 <= edge.y1 + 1)]
    assert not outside, f"text cut at the figure's edge: {outside}"
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def test_the_h100s_levels_are_the_tables_figures():
    h100 = hardware.H100_SXM
    sm = hardware.SM_ARCHITECTURES["sm_90"]
    levels = {lv.name: lv for lv in hierarchy.memory_levels(h100)}
    regs = levels["registers"]
    assert regs.per_sm_bytes == sm.registers_per_sm * 4 == 256 * 2**10
    assert regs.total_bytes == 132 * 256 * 2**10
    smem = levels["shared memory / L1"]
    assert (smem.per_sm_bytes, smem.total_bytes) == (228 * 2**10, 132 * 228 * 2**10)
    assert levels["L2 cache"].total_bytes == h100.l2_bytes
    hbm = levels["HBM"]
    assert (hbm.total_bytes, hbm.bytes_per_s) == (h100.hbm_bytes, h100.hbm_bytes_per_s)
    assert levels["other chips (NVLink 4)"].bytes_per_s == h100.interconnect_bytes_per_s
    assert levels["host (PCIe)"].bytes_per_s == h100.pcie_bytes_per_s
    # the on-chip levels have no bandwidth in the table: None, not a guess
    assert [lv.bytes_per_s for lv in levels.values() if lv.on_chip] == [None] * 3
    assert [lv.name for lv in levels.values() if lv.on_chip] == [
        "registers", "shared memory / L1", "L2 cache"]


@pytest.mark.parametrize("key", list(hardware.ACCELERATORS))
def test_a_level_is_missing_exactly_where_the_table_is(key):
    acc = hardware.get(key)
    levels = hierarchy.memory_levels(key)
    assert hierarchy.memory_levels(acc) == levels  # a key or the Accelerator itself
    regs, smem, l2 = levels[:3]
    assert (regs.total_bytes is None) == (acc.sm_arch is None or acc.sm_count is None)
    assert (smem.total_bytes is None) == (acc.smem_per_sm_bytes is None or acc.sm_count is None)
    assert l2.total_bytes == acc.l2_bytes


@pytest.mark.parametrize("key", list(hardware.ACCELERATORS))
def test_the_drawing_shows_every_level_as_the_table_has_it(key):
    acc = hardware.get(key)
    levels = hierarchy.memory_levels(acc)
    fig = hierarchy.draw_memory_hierarchy(acc)
    ax = fig.axes[0]
    boxes = {p.get_gid(): p for p in ax.patches if str(p.get_gid()).startswith("box ")}
    texts = "\n".join(t.get_text() for t in _texts(fig))
    for lv in levels[:4]:
        box = boxes[f"box {lv.name}"]
        if lv.total_bytes is None:
            assert box.get_linestyle() == "--"
        else:  # as wide as log10 of the size, less the floor, and labelled with the size
            assert box.get_width() == pytest.approx(math.log10(lv.total_bytes)
                                                    - hierarchy.LOG_FLOOR)
            assert hierarchy.size_text(lv.total_bytes) in texts
    widths = [boxes[f"box {lv.name}"].get_width() for lv in levels[:4] if lv.total_bytes]
    assert widths[-1] == max(widths)  # HBM is the largest
    missing = sum(lv.total_bytes is None for lv in levels[:4]) + \
        sum(lv.bytes_per_s is None for lv in levels[:4])
    assert texts.count(hierarchy.MISSING) + texts.count("not in\nmlsys.hardware") == missing
    for lv in levels[3:]:  # HBM and the two links, with their bandwidths and ratios
        assert hierarchy.rate_text(lv.bytes_per_s) in texts
    for lv in levels[4:]:
        assert f"HBM's / {acc.hbm_bytes_per_s / lv.bytes_per_s:.0f}" in texts
    assert _texts_overlap(fig) == []
    plt.close(fig)


def test_size_and_rate_texts():
    assert hierarchy.size_text(228 * 2**10) == "228 KiB"
    assert hierarchy.size_text(50 * 2**20) == "50.0 MiB"
    assert hierarchy.size_text(80e9) == "80 GB"
    assert hierarchy.rate_text(3.35e12) == "3.35 TB/s"
    assert hierarchy.rate_text(450e9) == "450 GB/s"


def test_the_hierarchy_refuses_what_is_not_an_accelerator():
    with pytest.raises(ValueError, match="unknown accelerator"):
        hierarchy.draw_memory_hierarchy("h900")
    with pytest.raises(TypeError, match="Accelerator or a registry key"):
        hierarchy.draw_memory_hierarchy(3.35e12)
