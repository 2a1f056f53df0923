"""The memory hierarchy of an accelerator, with its sizes and bandwidths, drawn (chapter 04).

`memory_levels` reads what `mlsys.hardware` holds of one accelerator, from the registers down to
the links that leave the chip: the register file (its SM architecture's 32-bit registers per SM,
times the SMs), shared memory / L1 per SM (times the SMs), the L2 cache, HBM with its bandwidth,
the chip-to-chip link (NVLink, ICI) and the host link (PCIe), both per direction. Where the table
has no figure (the bandwidth of the on-chip levels, a size it does not list), the level says so
instead of guessing. `draw_memory_hierarchy` draws the levels as a stack of boxes whose widths
grow with the logarithm of the chip-wide size, each labelled with its size per SM and in all, and
its bandwidth. Units: bytes and bytes/s (GB = 1e9 B, MiB = 2**20 B, as `mlsys.hardware`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib.patches import Rectangle

from mlsys import hardware
from mlsys.hardware import Accelerator
from mlsys.plotting import COLORS, CYCLE, finish, subplots

REGISTER_BYTES = 4
"""An SM's registers are 32 bits wide (`hardware.SMArchitecture.registers_per_sm` counts them)."""
MISSING = "not in mlsys.hardware"


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy: its size per SM and on the whole chip (bytes), its bandwidth
    (bytes/s; for a link, per direction), whether it is on the chip, and a short note. None: the
    table has no figure for it."""

    name: str
    per_sm_bytes: float | None
    total_bytes: float | None
    bytes_per_s: float | None
    on_chip: bool
    note: str = ""


def _accelerator(accelerator: Accelerator | str) -> Accelerator:
    if isinstance(accelerator, str):
        return hardware.get(accelerator)
    if not isinstance(accelerator, Accelerator):
        raise TypeError("accelerator must be an mlsys.hardware.Accelerator or a registry key "
                        f"such as 'h100', got {type(accelerator).__name__}")
    return accelerator


def _unit(acc: Accelerator) -> str:
    """What `sm_count` counts: streaming multiprocessors on a GPU, TensorCores on a TPU."""
    return "SM" if acc.vendor == "NVIDIA" else "core"


def memory_levels(accelerator: Accelerator | str) -> list[Level]:
    """The levels of `accelerator` (an `Accelerator` or a key of `hardware.ACCELERATORS`), from
    the registers to the host link, with what `mlsys.hardware` holds of each (None where it has
    nothing)."""
    acc = _accelerator(accelerator)
    sms = acc.sm_count
    arch = hardware.SM_ARCHITECTURES.get(acc.sm_arch) if acc.sm_arch else None
    regs = None if arch is None else arch.registers_per_sm * REGISTER_BYTES
    smem = acc.smem_per_sm_bytes

    def chip(per_sm: float | None) -> float | None:
        return None if per_sm is None or sms is None else per_sm * sms

    unit = _unit(acc)
    return [
        Level("registers", regs, chip(regs), None, True,
              f"{arch.registers_per_sm:,} × 32 bit per {unit}" if arch else ""),
        Level("shared memory / L1", smem, chip(smem), None, True),
        Level("L2 cache", None, acc.l2_bytes, None, True,
              f"shared by all {unit}s" if acc.l2_bytes else ""),
        Level("HBM", None, acc.hbm_bytes, acc.hbm_bytes_per_s, False,
              "off the chip, on its package"),
        Level(f"other chips ({acc.interconnect_name})", None, None, acc.interconnect_bytes_per_s,
              False, "per direction"),
        Level("host (PCIe)", None, None, acc.pcie_bytes_per_s, False, "per direction"),
    ]


def size_text(n_bytes: float) -> str:
    """Bytes as the hardware table writes them: KiB and MiB on chip, GB for HBM."""
    if n_bytes >= 1e9:
        return f"{n_bytes / 1e9:,.0f} GB"
    if n_bytes >= 2**20:
        return f"{n_bytes / 2**20:,.1f} MiB"
    return f"{n_bytes / 2**10:,.0f} KiB"


def rate_text(bytes_per_s: float) -> str:
    """Bytes/s in TB/s from 1 TB/s up, else GB/s."""
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.2f} TB/s"
    return f"{bytes_per_s / 1e9:,.0f} GB/s"


LOG_FLOOR = 5.0
"""log10 of the size drawn as a box of no width (100 kB): a box is log10(bytes) - 5 wide."""
ROW = 1.0  # height of one level's row, in data units


def draw_memory_hierarchy(accelerator: Accelerator | str, ax=None):
    """The hierarchy of `accelerator` (`memory_levels`): the storage levels as a stack of boxes,
    registers on top, each box as wide as log10(chip-wide bytes) - `LOG_FLOOR` (dashed where the
    size is missing), named and sized per SM on the left, its bandwidth on the right; below HBM,
    the two links off the package as arrows to another chip and to the host, with their
    bandwidths per direction. Boxes carry gids "box <level name>", arrows "link <level name>".
    Returns the figure."""
    acc = _accelerator(accelerator)
    levels = memory_levels(acc)
    storage, links = levels[:4], levels[4:]
    unit = _unit(acc)
    if ax is None:
        _, ax = subplots(width=8.0, height=5.2)
    widths = [max(math.log10(lv.total_bytes) - LOG_FLOOR, 0.3) if lv.total_bytes else 1.8
              for lv in storage]
    half = max(widths) / 2
    for i, (lv, width) in enumerate(zip(storage, widths, strict=True)):
        y = -i * ROW
        color = CYCLE[0] if lv.on_chip else CYCLE[1]
        missing = lv.total_bytes is None
        ax.add_patch(Rectangle((-width / 2, y - 0.38), width, 0.76, facecolor="none" if missing
                               else color, alpha=1.0 if missing else 0.3, edgecolor=color,
                               ls="--" if missing else "-", lw=1.2, gid=f"box {lv.name}"))
        ax.text(0, y, "size not in\nmlsys.hardware" if missing else size_text(lv.total_bytes),
                ha="center", va="center", fontsize=8)
        where = f"{size_text(lv.per_sm_bytes)} per {unit} × {acc.sm_count}" if lv.per_sm_bytes \
            else lv.note
        ax.text(-half - 0.3, y, f"{lv.name}\n{where}" if where else lv.name, ha="right",
                va="center", fontsize=8)
        rate = f"{rate_text(lv.bytes_per_s)} to and from the chip" if lv.bytes_per_s else \
            "bandwidth " + MISSING
        ax.text(half + 0.3, y, rate, ha="left", va="center", fontsize=8,
                color=COLORS["ceiling"] if lv.bytes_per_s else COLORS["muted"])
    chip_edge = -(sum(lv.on_chip for lv in storage) - 0.5) * ROW
    ax.axhline(chip_edge, color=COLORS["muted"], ls=":", lw=0.8)
    ax.text(half + 0.3, chip_edge + 0.05, "on the chip ↑  off the chip ↓", fontsize=7,
            va="bottom", color=COLORS["muted"])
    hbm_bottom, y_link = -(len(storage) - 1) * ROW - 0.38, -len(storage) * ROW - 0.2
    for side, (lv, what) in zip((-1, 1), zip(links, ("another chip", "host CPU"), strict=True),
                                strict=True):
        x = side * 0.55 * half
        ax.add_patch(Rectangle((x - 0.4 * half, y_link - 0.3), 0.8 * half, 0.6, facecolor="none",
                               edgecolor=CYCLE[3], lw=1.2, gid=f"box {what}"))
        ax.text(x, y_link, f"{what}\n{lv.name.split('(')[-1].rstrip(')')}", ha="center",
                va="center", fontsize=8)
        ax.annotate("", (x, hbm_bottom), (x, y_link + 0.3), arrowprops={
            "arrowstyle": "<|-|>", "color": CYCLE[3], "gid": f"link {lv.name}",
            "lw": 1 + 3 * lv.bytes_per_s / acc.hbm_bytes_per_s})
        ax.text(x + side * (0.4 * half + 0.15), y_link, f"{rate_text(lv.bytes_per_s)} each way\n"
                f"= HBM's / {acc.hbm_bytes_per_s / lv.bytes_per_s:.0f}", fontsize=8,
                ha="right" if side < 0 else "left", va="center")
    ax.set_xlim(-half - 4.0, half + 4.0)
    ax.set_ylim(y_link - 0.45, 0.5)
    ax.axis("off")
    finish(ax, title=f"{acc.name}: memory levels (box width ∝ log of the size) and bandwidths",
           legend=False)
    return ax.figure
