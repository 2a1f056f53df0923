"""Each kernel's predicted GPU time from the compile report, and the "why this tile" verdict.

The prediction is labelled as one: the roofline time of the kernel's FLOPs and bytes
(`mlsys.accounting`) on the target's GPU (sm_90: H100 SXM, sm_80: A100 SXM), stretched by the
last wave: a grid of G programs runs in ceil(G / S) waves of S = SMs x blocks per SM (the
occupancy), and a last wave that is partly empty leaves SMs idle, so time = roofline / (G / (waves
x S)). It ignores latency, the per-launch overhead and the unequal work of causal tiles.
`why_this_tile` picks the kept forward tile with the lowest prediction and says why in a sentence
computed from the numbers. Used in: chapters 04 and 06.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import book, checks, dtypes, hardware, roofline
from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic, flops
from mlsys.accounting import bytes as bytes_moved
from mlsys.kernels.aot import Compiled
from mlsys.kernels.compile_report import Report, verdict
from mlsys.kernels.compile_tables import flash_entries, short_verdict, tile_label

GPU_OF_TARGET = {"sm_80": hardware.A100_80GB_SXM, "sm_90": hardware.H100_SXM}
"""The GPU whose roofline a target's prediction uses."""
CANNOT_CHOOSE = 1.05
"""Kept tiles whose predictions lie within this factor are a tie for the model."""


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
    flop = attention_cost.attention_forward_flops(batch, heads, seq, seq, d, causal=causal)
    tiles_per_head = math.ceil(seq / t["BLOCK_M"])
    resident = gpu.sm_count * c.occupancy().blocks_per_sm
    in_flight = min(batch * heads, math.ceil(resident / tiles_per_head))
    kv_bytes = in_flight * 2 * seq * d * dtypes.bytes_per_element(dtype)
    from_l2 = gpu.l2_bytes is not None and kv_bytes <= gpu.l2_bytes
    block_q = seq if from_l2 else t["BLOCK_M"]  # one query tile per head: K and V read once
    traffic = attention_traffic.flash_forward_traffic(batch, heads, seq, seq, d, dtype,
                                                      block_q=block_q, block_k=t["BLOCK_N"],
                                                      causal=causal)
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
    entries = flash_entries(report, kernel="flash_attention.fwd", dtype=dtype, target=target,
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
        choice = (f"the slowest kept tile, {tile_label(worst)} with {worst.launch.num_warps} warps "
                  f"and {worst.launch.num_stages} stages, predicts {q.time_s * 1e3:.3g} ms "
                  f"({spread:.2f}x)")
    text = (f"On the {p.gpu} ({target}), {dtype}, d = {head_dim}, "
            f"{'causal' if causal else 'not causal'}, {seq:,} tokens x {heads} heads: "
            f"{len(kept)} of {len(entries)} forward tiles are kept (removed: {why_removed}). "
            f"The kernel is {p.roofline.bound} (roofline {p.roofline.time_s * 1e3:.3g} ms; "
            f"{p.note}). {tile_label(best)} with {t.num_warps} warps and {t.num_stages} stages "
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
        rows.append([f"{seq:,}", batch, f"{tile_label(best)} w{best.launch.num_warps}",
                     f"{p.roofline.time_s * 1e3:.3g}", p.roofline.bound.split("-")[0],
                     f"{p.wave_efficiency:.0%}", f"{p.time_s * 1e3:.3g}",
                     "-" if seen is None else f"{seen * 1e3:.3g}"])
    return book.Table(["seq", "batch", "tile", "roofline ms", "bound", "waves busy",
                       "predicted ms", "measured ms"], rows)


def predict_row_kernel(c: Compiled, n_rows: int, n_cols: int) -> Prediction:
    """A softmax or RMSNorm forward launch on (n_rows, n_cols): memory-bound by its bytes."""
    kernel, dtype = c.launch.kernel, c.launch.dtype
    if kernel == "softmax.fwd":
        flop = flops.softmax_flops(n_rows, n_cols)
        traffic = bytes_moved.softmax_traffic(n_rows, n_cols, dtype)
    elif kernel == "rmsnorm.fwd":
        flop = flops.rmsnorm_flops(n_rows, n_cols)
        traffic = bytes_moved.norm_traffic(n_rows, n_cols, dtype, save_stats=True)
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
