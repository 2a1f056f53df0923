"""The seed's attention sweep (`third_party.CS336_STUDENT_ATTENTION`: batch 8, one head, fp32, an
Ampere GPU) against the count of `accounting.attention.naive_memory`, and where the naive peak
stops fitting each accelerator's memory. Bytes, MiB (2^20) for the seed's readings: torch's memory
statistics are bytes, and the seed divided them by 2^20 and printed "MB". Its "Memory/seq^2"
column then multiplied MiB by 10^6 (`printed_per_seq2`): a unit mix the chapter shows as an
exercise. The live and recorded runs of the same sweep are `attention_sweep`.
Used in: §sec-attention.
"""

from __future__ import annotations

from typing import Any

from mlsys import hardware, third_party
from mlsys.accounting import attention as attention_cost
from mlsys.book import Table, num

MIB = 2**20
SEED_SEQ = 16_384
"""The seed's longest length, where its fixed allocations no longer matter."""
SEED_PRINTED = {(16, 256): 162.124634, (16, 1_024): 47.922134, (16, 4_096): 31.962991,
                (16, 8_192): 30.998141, (16, 16_384): 30.697323, (32, 16_384): 30.816533,
                (64, 16_384): 31.054951, (128, 16_384): 31.531788}
"""(d, seq) -> the seed's "Memory/seq^2" as printed (its memory scaling analysis of the eager
sweep, 'pytorch_attention' (a)): d = 16 at every length, and every d at 16,384 tokens."""


def _seed(variant: str) -> dict[tuple[int, int], third_party.ThirdPartyAttention]:
    return {(r.d_head, r.seq): r for r in third_party.CS336_STUDENT_ATTENTION
            if r.variant == variant}


def _predicted_mib(batch: int, d: int, seq: int) -> float:
    """`naive_memory` before the backward with q, k and v added (the seed's readings count from
    zero, ours above the inputs), MiB."""
    m = attention_cost.naive_memory(batch, 1, seq, seq, d, "fp32")
    return (m.before_backward_bytes + 3 * batch * seq * d * 4) / MIB


def seed_table(batch: int = 8) -> Table:
    """The seed's eager sweep (`third_party.CS336_STUDENT_ATTENTION`: `batch` sequences, one
    head, fp32) beside `naive_memory` with q, k and v added: their excess over it (MiB), bytes per
    n^2 before the backward, and the n x n matrices their backward added."""
    rows = []
    for (d, seq), r in _seed("eager").items():
        matrix = attention_cost.naive_memory(batch, 1, seq, seq, d, "fp32").matrix_bytes
        predicted = _predicted_mib(batch, d, seq)
        rows.append([d, f"{seq:,}", num(r.before_backward_mb), num(predicted),
                     f"{r.before_backward_mb - predicted:.1f}",
                     f"{r.before_backward_mb * MIB / seq**2:.1f}", num(r.peak_mb),
                     f"{(r.peak_mb - r.before_backward_mb) * MIB / matrix:.2f}"])
    return Table(["d", "seq", "theirs: before backward (MiB)", "predicted, with q, k, v (MiB)",
                  "theirs − predicted (MiB)", "theirs: bytes / n²", "theirs: peak (MiB)",
                  "theirs: added in backward (matrices)"], rows)


def seed_numbers(batch: int = 8) -> dict[str, Any]:
    """The seed's run at `SEED_SEQ` tokens, d = 16: bytes per (query, key) pair of one fp32 P
    per sequence ("per_pair") and theirs before the backward ("bytes_per_pair"); the n x n
    matrices their backward added, eager ("their_extra") and compiled ("their_comp_extra"); their
    peak, and the same matrices at twice the length (GB). Their fixed offset: the least and most
    their readings exceed the count with q, k, v ("offset_lo_mib", "offset_hi_mib", MiB), beside
    q, k and v themselves at their shortest row ("qkv_short_mib", 256 tokens, d = 16)."""
    matrix = batch * SEED_SEQ**2 * 4  # one fp32 n x n matrix per sequence
    eager = _seed("eager")
    long, comp = eager[(16, SEED_SEQ)], _seed("compiled")[(16, SEED_SEQ)]
    their_extra = (long.peak_mb - long.before_backward_mb) * MIB / matrix
    offsets = [r.before_backward_mb - _predicted_mib(batch, d, seq)
               for (d, seq), r in eager.items()]
    short_d, short_seq = min(eager)
    return {"per_pair": batch * 4, "bytes_per_pair": long.before_backward_mb * MIB / SEED_SEQ**2,
            "their_extra": their_extra, "seed_peak_gb": long.peak_mb * MIB / 1e9,
            "seed_peak_2x_gb": (round(their_extra) + 1) * batch * (2 * SEED_SEQ)**2 * 4 / 1e9,
            "their_comp_extra": (comp.peak_mb - comp.before_backward_mb) * MIB / matrix,
            "offset_lo_mib": min(offsets), "offset_hi_mib": max(offsets),
            "qkv_short_mib": 3 * batch * short_seq * short_d * 4 / MIB}


def printed_per_seq2() -> dict[tuple[int, int], tuple[float, float]]:
    """(d, seq) -> (their "Mem Before" reading in MiB, their printed "Memory/seq^2") for every
    entry of `SEED_PRINTED`: the pairs a reader needs to find how the column was computed."""
    eager = _seed("eager")
    return {key: (eager[key].before_backward_mb, printed) for key, printed in SEED_PRINTED.items()}


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
