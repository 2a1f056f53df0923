"""The compile report read for the book: tables, the formulas checked against the compiler, the
"why this tile" verdict and each kernel's predicted GPU time.

Everything here reads a `compile_report.Report` (the committed one, or one compiled live): no
numbers are typed in. The formula checks are counters like `flop_counter`: the shared-memory rule
and the register floor of `mlsys.accounting.tiles` beside what ptxas reported, tile by tile.

The prediction is labelled as one: the roofline time of the kernel's FLOPs and bytes
(`mlsys.accounting`) on the target's GPU (sm_90: H100 SXM, sm_80: A100 SXM), stretched by the
last wave: a grid of G programs runs in ceil(G / S) waves of S = SMs x blocks per SM (the
occupancy), and a last wave that is partly empty leaves SMs idle, so time = roofline / (G / (waves
x S)). It ignores latency, the per-launch overhead and the unequal work of causal tiles.
Used in: chapters 04 and 06.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import book, checks, dtypes, hardware, roofline
from mlsys.accounting import attention as A
from mlsys.accounting import bytes as B
from mlsys.accounting import flops, tiles
from mlsys.kernels.aot import Compiled
from mlsys.kernels.compile_report import ROW_KERNELS, Report, verdict

GPU_OF_TARGET = {"sm_80": hardware.A100_80GB_SXM, "sm_90": hardware.H100_SXM}
"""The GPU whose roofline a target's prediction uses."""
CANNOT_CHOOSE = 1.05
"""Kept tiles whose predictions lie within this factor are a tie for the model."""


def short_verdict(compiled: Compiled) -> str:
    """"kept", "spills", "shared", "fails" or "no tensor cores"."""
    text = verdict(compiled)
    for key, word in (("kept", "kept"), ("spills", "spills"), ("shared", "shared"),
                      ("compile", "fails"), ("tensor", "no tensor cores")):
        if key in text:
            return word
    return text


def _tile(c: Compiled) -> str:
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


def _flash(report: Report, **where) -> list[Compiled]:
    return [c for c in report.select(**where)
            if c.launch.kernel in {f"flash_attention.{k}" for k in tiles.FLASH_KERNELS}]


def flash_table(report: Report, target: str, *, dtype: str = "bf16", head_dim: int = 128,
                causal: bool = True) -> book.Table:
    """Per kernel and tile (rows x columns, warps, stages): registers, spills, shared memory
    (compiled and by the rule), resident warps per SM (and what limits them), tensor-core
    instructions, verdict."""
    rows = []
    for c in _flash(report, dtype=dtype, target=target, head_dim=head_dim, causal=causal):
        occ = c.occupancy() if c.ok else None
        rows.append([c.launch.kernel.split(".")[1],
                     f"{_tile(c)} w{c.launch.num_warps} s{c.launch.num_stages}",
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
              c.launch.num_stages): c for c in _flash(report, target=than, **where) if c.ok}
    pairs = [(c, other.get((c.launch.kernel, tuple(c.launch.tile.items()), c.launch.num_warps,
                            c.launch.num_stages))) for c in _flash(report, target=target, **where)
             if c.ok]
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
    half = [c for c in _flash(report) if c.ok and c.launch.dtype != "fp32"]
    gaps = [c.shared_bytes - flash_smem_rule(c) for c in half]
    p_tile = [2 * c.launch.tile["BLOCK_M"] * c.launch.tile["BLOCK_N"] for c in half]
    ratios = [c.shared_bytes / flash_smem_rule(c) for c in _flash(report, dtype="fp32") if c.ok]
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
    entries = [c for c in _flash(report) if c.ok and (c.launch.dtype != "fp32") == sixteen_bit]
    floors = [flash_register_floor(c) for c in entries]
    must = [c for c, f in zip(entries, floors, strict=True) if f.must_spill]
    spilled = [(c, f) for c, f in zip(entries, floors, strict=True) if c.spills]
    below = [c for c, f in zip(entries, floors, strict=True)
             if not c.spills and c.registers < f.total]
    return RegisterCheck(len(entries), len(must), sum(c.spills for c in must), len(spilled),
                         len(below), min((f.total / f.limit for _, f in spilled),
                                         default=math.nan))


# --- predicted time: the roofline, stretched by the last wave ------------------------------------


@dataclass(frozen=True)
class Prediction:
    """A kernel's predicted time on the GPU of its target (a prediction, not a measurement)."""

    roofline: roofline.Estimate
    programs: int  # grid size
    slots: int  # SMs x resident blocks per SM
    gpu: str
    n_bytes: float  # main-memory traffic
    note: str = ""  # what the traffic assumed

    @property
    def waves(self) -> int:
        return math.ceil(self.programs / self.slots)

    @property
    def wave_efficiency(self) -> float:
        return self.programs / (self.waves * self.slots)

    @property
    def time_s(self) -> float:
        return self.roofline.time_s / self.wave_efficiency


def predict(compiled: Compiled, flop: float, n_bytes: float, programs: int,
            dtype: str | None = None) -> Prediction:
    """The prediction for `compiled` doing `flop` FLOPs and `n_bytes` of traffic in `programs`
    programs, at the `dtype` peak (default: the launch's dtype; fp32 uses the FMA units' rate)."""
    gpu = GPU_OF_TARGET[compiled.launch.target]
    ceilings = roofline.Ceilings.from_spec(gpu, dtype or compiled.launch.dtype)
    blocks = compiled.occupancy().blocks_per_sm
    if blocks == 0:
        raise ValueError(f"{compiled.launch.label()} cannot launch: no block fits an SM")
    slots = gpu.sm_count * blocks
    return Prediction(roofline.estimate(flop, n_bytes, ceilings),
                      checks.positive_int(programs, "programs"), slots, gpu.name, n_bytes)


def predict_flash_forward(c: Compiled, batch: int, heads: int, seq: int) -> Prediction:
    """The forward kernel of entry `c` on (batch, heads, seq, head_dim) inputs, n_q = n_k.

    Each query tile re-reads its head's K and V. Programs start in grid order, query tiles of one
    head first, so the resident ones cover ceil(resident / tiles per head) heads: when those
    heads' K and V fit in the L2, the re-reads are L2 hits and main memory sees K and V once per
    head; otherwise every re-read is counted (`flash_forward_traffic`)."""
    d, causal = c.launch.problem["head_dim"], c.launch.problem["causal"]
    t, dtype = c.launch.tile, c.launch.dtype
    gpu = GPU_OF_TARGET[c.launch.target]
    flop = A.attention_forward_flops(batch, heads, seq, seq, d, causal=causal)
    tiles_per_head = math.ceil(seq / t["BLOCK_M"])
    resident = gpu.sm_count * c.occupancy().blocks_per_sm
    in_flight = min(batch * heads, math.ceil(resident / tiles_per_head))
    kv_bytes = in_flight * 2 * seq * d * dtypes.bytes_per_element(dtype)
    from_l2 = gpu.l2_bytes is not None and kv_bytes <= gpu.l2_bytes
    block_q = seq if from_l2 else t["BLOCK_M"]  # one query tile per head: K and V read once
    traffic = A.flash_forward_traffic(batch, heads, seq, seq, d, dtype, block_q=block_q,
                                      block_k=t["BLOCK_N"], causal=causal)
    heads_text = f"{in_flight} head{'s' * (in_flight > 1)}"
    note = (f"the {heads_text} in flight hold {kv_bytes / 2**20:.0f} MiB of K and V, "
            f"{'within' if from_l2 else 'more than'} the {gpu.l2_bytes / 2**20:.0f} MiB L2: "
            f"{'re-reads hit it' if from_l2 else 'every re-read is counted'}")
    p = predict(c, flop, traffic.total_bytes, tiles_per_head * batch * heads)
    return Prediction(p.roofline, p.programs, p.slots, p.gpu, p.n_bytes, note)


def why_this_tile(report: Report, target: str, *, dtype: str = "bf16", head_dim: int = 128,
                  causal: bool = True, batch: int = 1, heads: int = 16,
                  seq: int = 16_384) -> tuple[Compiled, str]:
    """The kept forward tile with the lowest predicted time, and a sentence computed from the
    numbers saying why (what was removed, the bound, the traffic, the waves)."""
    entries = _flash(report, kernel="flash_attention.fwd", dtype=dtype, target=target,
                     head_dim=head_dim, causal=causal)
    kept = [c for c in entries if verdict(c) == "kept"]
    if not kept:
        raise ValueError(f"no kept forward tile for {dtype}, d={head_dim}, {target}")
    preds = {id(c): predict_flash_forward(c, batch, heads, seq) for c in kept}
    best = min(kept, key=lambda c: (preds[id(c)].time_s, -c.occupancy().warps_per_sm))
    worst = max(kept, key=lambda c: preds[id(c)].time_s)
    p, q = preds[id(best)], preds[id(worst)]
    removed = Counter(short_verdict(c) for c in entries if verdict(c) != "kept")
    why_removed = ", ".join(f"{n} {w}" for w, n in removed.items()) or "none"
    t, spread = best.launch, q.time_s / p.time_s
    if spread < CANNOT_CHOOSE:
        choice = (f"every kept tile predicts {p.time_s * 1e3:.3g} to {q.time_s * 1e3:.3g} ms, "
                  f"within {spread - 1:.0%} of each other: this model cannot choose between "
                  "them, and the autotuner's timing does")
    else:
        choice = (f"the slowest kept tile, {_tile(worst)} with {worst.launch.num_warps} warps "
                  f"and {worst.launch.num_stages} stages, predicts {q.time_s * 1e3:.3g} ms "
                  f"({spread:.2f}x)")
    text = (f"On the {p.gpu} ({target}), {dtype}, d = {head_dim}, "
            f"{'causal' if causal else 'not causal'}, {seq:,} tokens x {heads} heads: "
            f"{len(kept)} of {len(entries)} forward tiles are kept (removed: {why_removed}). "
            f"The kernel is {p.roofline.bound} (roofline {p.roofline.time_s * 1e3:.3g} ms; "
            f"{p.note}). {_tile(best)} with {t.num_warps} warps and {t.num_stages} stages "
            f"predicts {p.time_s * 1e3:.3g} ms: {best.occupancy().blocks_per_sm} blocks per SM, "
            f"{p.waves} waves with {p.wave_efficiency:.0%} of the slots busy, "
            f"{best.registers} registers, no spills; {choice}.")
    return best, text


def flash_predictions(report: Report, target: str, problems: Iterable[tuple[int, int]], *,
                      dtype: str = "bf16", head_dim: int = 128, causal: bool = True,
                      heads: int = 16, measured: dict[tuple[int, int], float] | None = None,
                      ) -> book.Table:
    """Predicted forward time per (batch, seq) in `problems` for the tile `why_this_tile` picks
    there, beside the roofline and, where `measured` has (batch, seq) -> seconds, the record."""
    rows = []
    for batch, seq in problems:
        best, _ = why_this_tile(report, target, dtype=dtype, head_dim=head_dim, causal=causal,
                                batch=batch, heads=heads, seq=seq)
        p = predict_flash_forward(best, batch, heads, seq)
        seen = (measured or {}).get((batch, seq))
        rows.append([f"{seq:,}", batch, f"{_tile(best)} w{best.launch.num_warps}",
                     f"{p.roofline.time_s * 1e3:.3g}", p.roofline.bound.split("-")[0],
                     f"{p.wave_efficiency:.0%}", f"{p.time_s * 1e3:.3g}",
                     "-" if seen is None else f"{seen * 1e3:.3g}"])
    return book.Table(["seq", "batch", "tile", "roofline ms", "bound", "waves busy",
                       "predicted ms", "measured ms"], rows)


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


def predict_row_kernel(c: Compiled, n_rows: int, n_cols: int) -> Prediction:
    """A softmax or RMSNorm forward launch on (n_rows, n_cols): memory-bound by its bytes."""
    kernel, dtype = c.launch.kernel, c.launch.dtype
    if kernel == "softmax.fwd":
        flop, traffic = flops.softmax_flops(n_rows, n_cols), B.softmax_traffic(n_rows, n_cols,
                                                                                dtype)
    elif kernel == "rmsnorm.fwd":
        flop = flops.rmsnorm_flops(n_rows, n_cols)
        traffic = B.norm_traffic(n_rows, n_cols, dtype, save_stats=True)
    else:
        raise ValueError(f"kernel={kernel!r}: predictions cover softmax.fwd and rmsnorm.fwd")
    programs = math.ceil(n_rows / c.launch.tile["BLOCK_M"])
    return predict(c, flop, traffic.total_bytes, programs, dtype="fp32")


def row_predictions(report: Report, target: str, numel: int, widths: Iterable[int], *,
                    dtype: str = "bf16") -> book.Table:
    """Softmax and RMSNorm forward on `numel` elements in rows of each width: the kept tile with
    the lowest predicted time (tile: rows per program and warps), its resources, and the
    predicted time and bandwidth."""
    rows = []
    for kernel in ("softmax.fwd", "rmsnorm.fwd"):
        for n_cols in widths:
            n_rows = numel // n_cols
            kept = [c for c in report.select(kernel, dtype, target, n_cols=n_cols)
                    if verdict(c) == "kept"]
            if not kept:
                raise ValueError(f"no kept {kernel} tile at {n_cols} columns, {dtype}, {target}")
            preds = {id(c): predict_row_kernel(c, n_rows, n_cols) for c in kept}
            best = min(kept, key=lambda c: (preds[id(c)].time_s, -c.occupancy().warps_per_sm))
            p = preds[id(best)]
            rows.append([kernel, f"{n_cols:,}", f"{n_rows:,}",
                         f"{best.launch.tile['BLOCK_M']} w{best.launch.num_warps}",
                         best.registers, best.occupancy().warps_per_sm,
                         f"{p.wave_efficiency:.0%}", f"{p.time_s * 1e6:,.0f}",
                         f"{p.n_bytes / p.time_s / 1e9:,.0f}"])
    return book.Table(["kernel", "cols", "rows", "tile", "regs", "warps/SM", "waves",
                       "µs (pred.)", "GB/s"], rows)


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
