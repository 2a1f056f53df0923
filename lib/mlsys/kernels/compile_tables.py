"""The compile report read for the book: tables, and the formulas checked against the compiler.

Everything here reads a `compile_report.Report` (the committed one, or one compiled live): no
numbers are typed in. The formula checks are counters like `flop_counter`: the shared-memory rule
and the register floor of `mlsys.accounting.tiles` beside what ptxas reported, tile by tile. The
"why this tile" verdict and each kernel's predicted GPU time: `mlsys.kernels.compile_predictions`.
Used in: chapters 04 and 06.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import book, dtypes
from mlsys.accounting import tiles
from mlsys.kernels.aot import Compiled
from mlsys.kernels.compile_report import ROW_KERNELS, Report, verdict


def short_verdict(compiled: Compiled) -> str:
    """"kept", "spills", "shared", "fails" or "no tensor cores"."""
    text = verdict(compiled)
    for key, word in (("kept", "kept"), ("spills", "spills"), ("shared", "shared"),
                      ("compile", "fails"), ("tensor", "no tensor cores")):
        if key in text:
            return word
    return text


def tile_label(c: Compiled) -> str:
    """"64 x 32" (BLOCK_M x BLOCK_N), or BLOCK_M alone for a row kernel."""
    t = c.launch.tile
    return f"{t['BLOCK_M']} x {t['BLOCK_N']}" if "BLOCK_N" in t else f"{t.get('BLOCK_M', '-')}"


def _kib(n_bytes: float) -> str:
    return f"{n_bytes / 1024:.1f}"


def flash_smem_rule(c: Compiled) -> int:
    """`tiles.flash_smem_bytes` for a flash entry of the report."""
    t, p = c.launch.tile, c.launch.problem
    return tiles.flash_smem_bytes(c.launch.kernel.split(".")[1], t["BLOCK_M"], t["BLOCK_N"],
                                  p["head_dim"], dtypes.bytes_per_element(c.launch.dtype),
                                  c.launch.num_stages, c.launch.target)


def flash_register_floor(c: Compiled) -> tiles.RegisterFloor:
    t = c.launch.tile
    return tiles.flash_register_floor(c.launch.kernel.split(".")[1], t["BLOCK_M"], t["BLOCK_N"],
                                      c.launch.problem["head_dim"], c.launch.num_warps,
                                      c.launch.target)


@dataclass(frozen=True)
class RowSharedCheck:
    """Row kernels' shared memory against their tiles."""

    total: int
    reduction_only: int  # at most 4 B x BLOCK_M x num_warps: one partial per row and warp
    within_tile: int  # at most the tile in fp32 (a layout conversion through shared memory)


def row_shared_check(report: Report) -> RowSharedCheck:
    """How many row-kernel compiles use shared memory only as the cross-warp reductions' scratch,
    and how many stay within one fp32 tile."""
    rows = [c for c in report.entries if c.launch.kernel in ROW_KERNELS and c.ok]
    scratch = [4 * c.launch.tile["BLOCK_M"] * c.launch.num_warps for c in rows]
    tile = [4 * c.launch.tile["BLOCK_M"] * c.launch.problem["n_cols"] for c in rows]
    return RowSharedCheck(len(rows),
                          sum(c.shared_bytes <= s for c, s in zip(rows, scratch, strict=True)),
                          sum(c.shared_bytes <= t for c, t in zip(rows, tile, strict=True)))


def flash_entries(report: Report, **where) -> list[Compiled]:
    """The report's entries of the three tiled flash kernels that match `where`."""
    return [c for c in report.select(**where)
            if c.launch.kernel in {f"flash_attention.{k}" for k in tiles.FLASH_KERNELS}]


def flash_table(report: Report, target: str, *, dtype: str = "bf16", head_dim: int = 128,
                causal: bool = True) -> book.Table:
    """Per kernel and tile (rows x columns, warps, stages): registers, spills, shared memory
    (compiled and by the rule), resident warps per SM (and what limits them), tensor-core
    instructions, verdict."""
    rows = []
    for c in flash_entries(report, dtype=dtype, target=target, head_dim=head_dim, causal=causal):
        occ = c.occupancy() if c.ok else None
        rows.append([c.launch.kernel.split(".")[1],
                     f"{tile_label(c)} w{c.launch.num_warps} s{c.launch.num_stages}",
                     c.registers, c.spill_store_bytes,
                     f"{_kib(c.shared_bytes)} ({_kib(flash_smem_rule(c))})",
                     f"{occ.warps_per_sm} ({occ.limiter})" if occ else "-",
                     c.tensor_core_instructions, short_verdict(c)])
    return book.Table(["kernel", "tile, warps, stages", "regs", "spill B", "smem KiB (rule)",
                       "warps/SM", "MMA", "verdict"], rows)


def more_registers(report: Report, target: str, than: str, **where) -> tuple[int, int]:
    """(tiles that need more registers on `target` than on `than`, tiles compiled on both) over
    the flash entries matching `where` (dtype=..., head_dim=..., causal=...)."""
    other = {(c.launch.kernel, tuple(c.launch.tile.items()), c.launch.num_warps,
              c.launch.num_stages): c for c in flash_entries(report, target=than, **where) if c.ok}
    pairs = [(c, other.get((c.launch.kernel, tuple(c.launch.tile.items()), c.launch.num_warps,
                            c.launch.num_stages)))
             for c in flash_entries(report, target=target, **where) if c.ok]
    pairs = [(c, o) for c, o in pairs if o is not None]
    return sum(c.registers > o.registers for c, o in pairs), len(pairs)


def removal_table(report: Report) -> book.Table:
    """Per kernel, dtype and target: candidates, kept, and why the others were removed."""
    groups: dict[tuple[str, str, str], Counter] = {}
    for c in report.entries:
        key = (c.launch.kernel, c.launch.dtype, c.launch.target)
        groups.setdefault(key, Counter())[short_verdict(c)] += 1
    rows = [[k, d, t, sum(n.values()), n["kept"], n["spills"], n["shared"], n["fails"],
             n["no tensor cores"]] for (k, d, t), n in sorted(groups.items())]
    return book.Table(["kernel", "dtype", "target", "tiles", "kept", "spills", "shared",
                       "fails", "no tensor cores"], rows)


@dataclass(frozen=True)
class SharedCheck:
    """The shared-memory rule against the compiler over the 16-bit flash entries."""

    total: int
    exact: int
    plus_p_tile: int  # larger by exactly one 16-bit P tile (BLOCK_M x BLOCK_N): a layout change
    worst_gap_bytes: int  # largest |compiled - rule|
    fp32_ratio: tuple[float, float]  # compiled / rule for fp32 entries: (min, max)


def shared_memory_check(report: Report) -> SharedCheck:
    """How often `tiles.flash_smem_bytes` equals what the compiler asked for."""
    half = [c for c in flash_entries(report) if c.ok and c.launch.dtype != "fp32"]
    gaps = [c.shared_bytes - flash_smem_rule(c) for c in half]
    p_tile = [2 * c.launch.tile["BLOCK_M"] * c.launch.tile["BLOCK_N"] for c in half]
    ratios = [c.shared_bytes / flash_smem_rule(c)
              for c in flash_entries(report, dtype="fp32") if c.ok]
    return SharedCheck(len(half), gaps.count(0),
                       sum(g == p for g, p in zip(gaps, p_tile, strict=True)),
                       max(map(abs, gaps), default=0),
                       (min(ratios, default=math.nan), max(ratios, default=math.nan)))


@dataclass(frozen=True)
class RegisterCheck:
    """The register floor against ptxas over the compiled flash entries of one input width."""

    total: int
    must_spill: int  # the floor alone is past the cap
    must_spill_and_spilled: int
    spilled: int
    below_floor: int  # used fewer registers than the floor without spilling: the floor is wrong
    smallest_spilling_floor: float  # the lowest floor / cap among the tiles that spilled


def register_check(report: Report, *, sixteen_bit: bool = True) -> RegisterCheck:
    """Which tiles must spill on paper, and did the compiler agree?"""
    entries = [c for c in flash_entries(report)
               if c.ok and (c.launch.dtype != "fp32") == sixteen_bit]
    floors = [flash_register_floor(c) for c in entries]
    must = [c for c, f in zip(entries, floors, strict=True) if f.must_spill]
    spilled = [(c, f) for c, f in zip(entries, floors, strict=True) if c.spills]
    below = [c for c, f in zip(entries, floors, strict=True)
             if not c.spills and c.registers < f.total]
    return RegisterCheck(len(entries), len(must), sum(c.spills for c in must), len(spilled),
                         len(below), min((f.total / f.limit for _, f in spilled),
                                         default=math.nan))


def row_table(report: Report, target: str, dtype: str = "bf16") -> book.Table:
    """Per row kernel and width: kept tiles, the registers they use, the warps per SM they leave
    room for, and how many tiles spilled."""
    rows = []
    for kernel in ("softmax.fwd", "softmax.bwd", "rmsnorm.fwd", "rmsnorm.bwd"):
        widths = sorted({c.launch.problem["n_cols"] for c in report.select(kernel, dtype, target)})
        for n_cols in widths:
            entries = report.select(kernel, dtype, target, n_cols=n_cols)
            kept = [c for c in entries if verdict(c) == "kept"]
            if not kept:
                rows.append([kernel, f"{n_cols:,}", 0, "-", "-", len(entries)])
                continue
            regs = [c.registers for c in kept]
            warps = [c.occupancy().warps_per_sm for c in kept]
            rows.append([kernel, f"{n_cols:,}", len(kept), f"{min(regs)}-{max(regs)}",
                         f"{min(warps)}-{max(warps)}", sum(c.spills for c in entries)])
    return book.Table(["kernel", "row length", "kept tiles", "registers", "warps/SM",
                       "spilled"], rows)


def row_room(report: Report, target: str, dtype: str = "bf16") -> str:
    """One sentence on the row kernels' kept tiles: registers, resident warps, shared memory."""
    kept = [c for c in report.entries if c.launch.kernel in ROW_KERNELS
            and (c.launch.target, c.launch.dtype) == (target, dtype) and verdict(c) == "kept"]
    if not kept:
        raise ValueError(f"no kept row-kernel tile for {dtype} on {target}")
    regs = sorted(c.registers for c in kept)
    warps = sorted(c.occupancy().warps_per_sm for c in kept)
    full = sum(w == c.occupancy().max_warps_per_sm for w, c in zip(warps, kept, strict=True))
    spilled = sum(c.spills for c in report.entries if c.launch.kernel in ROW_KERNELS
                  and (c.launch.target, c.launch.dtype) == (target, dtype))
    return (f"on {target}, {dtype}: the {len(kept)} kept row tiles use {regs[0]} to {regs[-1]} "
            f"registers a thread (median {regs[len(regs) // 2]}) and leave room for "
            f"{warps[0]} to {warps[-1]} resident warps of {kept[0].occupancy().max_warps_per_sm} "
            f"({full} fill the SM); {spilled} candidate tiles spilled and were removed; shared "
            f"memory holds the reductions' partial results and, for some layouts, a tile in "
            f"transit: at most {max(c.shared_bytes for c in kept):,} bytes a block")


_SASS_TEXT = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def ptx_excerpt(ptx: str, patterns: Iterable[str], *, per_pattern: int = 1,
                width: int = 96) -> str:
    """The first `per_pattern` PTX lines containing each of `patterns`, stripped and cut to
    `width` characters (a wgmma names its 32+ accumulator registers one by one)."""
    lines: list[str] = []
    for pattern in patterns:
        lines += [line.strip() for line in ptx.splitlines() if pattern in line][:per_pattern]
    return "\n".join(line if len(line) <= width else line[:width - 4] + " ..." for line in lines)


def excerpt(sass: str, opcodes: Iterable[str], *, per_opcode: int = 2) -> str:
    """The first `per_opcode` instructions of each opcode in `opcodes` from a SASS listing, one
    per line (address and encoding dropped)."""
    lines: list[str] = []
    for opcode in opcodes:
        found = [m.group(1) for m in _SASS_TEXT.finditer(sass)
                 if re.match(rf"(@!?U?P[T0-9]+\s+)?{opcode}\b", m.group(1))]
        lines += found[:per_opcode]
    return "\n".join(lines)
