"""The seed's attention sweep (`third_party.CS336_STUDENT_ATTENTION`: batch 8, one head, fp32, an
Ampere GPU) against the count of `accounting.attention.naive_memory`, and where the naive peak
stops fitting each accelerator's memory. Bytes, MiB (2^20) for the seed's readings. The live and
recorded runs of the same sweep are `attention_sweep`. Used in: §sec-attention.
"""

from __future__ import annotations

from typing import Any

from mlsys import hardware, third_party
from mlsys.accounting import attention as attention_cost
from mlsys.book import Table, num

MIB = 2**20
SEED_SEQ = 16_384
"""The seed's longest length, where its fixed allocations no longer matter."""


def _seed(variant: str) -> dict[tuple[int, int], third_party.ThirdPartyAttention]:
    return {(r.d_head, r.seq): r for r in third_party.CS336_STUDENT_ATTENTION
            if r.variant == variant}


def seed_table(batch: int = 8) -> Table:
    """The seed's eager sweep (`third_party.CS336_STUDENT_ATTENTION`: `batch` sequences, one
    head, fp32) beside `naive_memory` with q, k and v added (its readings count from zero, ours
    above the inputs): bytes per n^2 before the backward, and the n x n matrices it added in it."""
    rows = []
    for (d, seq), r in _seed("eager").items():
        m = attention_cost.naive_memory(batch, 1, seq, seq, d, "fp32")
        inputs = 3 * batch * seq * d * 4  # q, k, v
        rows.append([d, f"{seq:,}", num(r.before_backward_mb),
                     num((m.before_backward_bytes + inputs) / MIB),
                     f"{r.before_backward_mb * MIB / seq**2:.1f}", num(r.peak_mb),
                     f"{(r.peak_mb - r.before_backward_mb) * MIB / m.matrix_bytes:.2f}"])
    return Table(["d", "seq", "theirs: before backward (MiB)", "predicted, with q, k, v (MiB)",
                  "theirs: bytes / n²", "theirs: peak (MiB)",
                  "theirs: added in backward (matrices)"], rows)


def seed_numbers(batch: int = 8) -> dict[str, Any]:
    """The seed's run at `SEED_SEQ` tokens, d = 16: bytes per (query, key) pair of one fp32 P
    per sequence ("per_pair") and theirs before the backward ("bytes_per_pair"); the n x n
    matrices their backward added, eager ("their_extra") and compiled ("their_comp_extra"); their
    peak, and the same matrices at twice the length (GB)."""
    matrix = batch * SEED_SEQ**2 * 4  # one fp32 n x n matrix per sequence
    long, comp = _seed("eager")[(16, SEED_SEQ)], _seed("compiled")[(16, SEED_SEQ)]
    their_extra = (long.peak_mb - long.before_backward_mb) * MIB / matrix
    return {"per_pair": batch * 4, "bytes_per_pair": long.before_backward_mb * MIB / SEED_SEQ**2,
            "their_extra": their_extra, "seed_peak_gb": long.peak_mb * MIB / 1e9,
            "seed_peak_2x_gb": (round(their_extra) + 1) * batch * (2 * SEED_SEQ)**2 * 4 / 1e9,
            "their_comp_extra": (comp.peak_mb - comp.before_backward_mb) * MIB / matrix}


def fits_table(batch: int = 8, d_head: int = 64) -> Table:
    """Per accelerator of `mlsys.hardware`: the longest power-of-two length whose eager backward
    peak (`batch` sequences, one head, fp32) fits its memory, and the first that does not."""
    rows = []
    for acc in hardware.ACCELERATORS.values():
        fits = [n for n in (2**k for k in range(8, 18))
                if attention_cost.naive_memory(batch, 1, n, n, d_head, "fp32").backward_peak_bytes
                <= acc.hbm_bytes]
        largest = max(fits) if fits else None
        rows.append([acc.name, num(acc.hbm_bytes / 1e9), f"{largest:,}" if largest else "-",
                     f"{2 * largest:,}" if largest else "-"])
    return Table(["device", "memory (GB)", "longest power of two that fits",
                  "first that does not"], rows)
