"""The seed's DDP step of the xl preset on two GPUs (`third_party.CS336_STUDENT_DDP_XL`), predicted
from the seed's own all-reduce table (`allreduce_bench.third_party_fit`), and the same gradients on
other links.

The xl model's fp32 gradients are its parameters' sizes, read from the model built on the meta
device. Naive DDP all-reduces them one by one after the backward, flat DDP once, and bucketed DDP
starts a 25 MiB bucket's all-reduce as soon as its gradients are ready, the backward meeting the
last layers first (`accounting.buckets.overlap_exposed_s`). `third_party_numbers` checks what the
seed's runs show against those predictions and gives the page its numbers. Times in seconds,
sizes in bytes. Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from mlsys import hardware, third_party
from mlsys.accounting import comms as comms_cost
from mlsys.accounting.buckets import bucket_bytes, overlap_exposed_s
from mlsys.book import Table, num
from mlsys.experiments.allreduce_bench import third_party_fit
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer

MIB = 2**20
WORLD = 2
"""The seed's GPUs."""


def grad_bytes(preset: str = "xl") -> list[int]:
    """The fp32 gradient of each parameter of `preset`, in bytes, in the model's order."""
    with torch.device("meta"):
        model = Transformer(TransformerConfig.preset(preset))
    return [p.numel() * 4 for p in model.parameters()]


def link_table(sizes: Sequence[int], links: Sequence[str], *, alpha_s: float,
               world: int = WORLD) -> Table:
    """Per link of `hardware.LINKS` (its spec per direction, latency `alpha_s`): one all-reduce of
    every gradient (flat) and one per tensor (naive), in ms."""
    rows = []
    for key in links:
        link = hardware.LINKS[key]
        on_link = {"alpha_s": alpha_s, "bytes_per_s": link.bytes_per_s}
        rows.append([link.name, num(link.bytes_per_s / 1e9),
                     num(comms_cost.all_reduces_s([sum(sizes)], world, **on_link) * 1e3),
                     num(comms_cost.all_reduces_s(sizes, world, **on_link) * 1e3)])
    return Table(["link (per direction)", "GB/s", "flat: one all-reduce (ms)",
                  f"naive: {len(sizes)} all-reduces (ms)"], rows)


def third_party_rows() -> list[dict[str, Any]]:
    """The seed's xl runs beside the communication its own 2-GPU all-reduce table predicts:
    naive, one all-reduce per tensor of the xl model; flat, one of everything."""
    sizes = grad_bytes("xl")
    fit = third_party_fit()
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    predicted = {"naive": comms_cost.all_reduces_s(sizes, WORLD, **ab),
                 "flat": comms_cost.all_reduces_s([sum(sizes)], WORLD, **ab)}
    ready = sizes[::-1]  # the backward meets the last layers first
    buckets = bucket_bytes(ready, 25.0 * MIB)
    return [{"label": r.label, "mode_flag": r.mode_flag, "communication_s": r.communication_s,
             "step_s": r.total_s, "backward_s": r.backward_s, "n_tensors": len(sizes),
             "grad_bytes": sum(sizes), "predicted_naive_s": predicted["naive"],
             "predicted_flat_s": predicted["flat"],
             "predicted_overlapped_s": overlap_exposed_s(ready, r.backward_s, WORLD, **ab),
             "predicted_bucketed_s": overlap_exposed_s(buckets, r.backward_s, WORLD, **ab)}
            for r in third_party.CS336_STUDENT_DDP_XL]


def third_party_table(rows: list[dict[str, Any]]) -> Table:
    """The seed's xl runs (`third_party_rows`) beside the communication their fit predicts."""
    return Table(["their run", "--ddp-mode", "step ms", "backward ms", "communication ms",
                  "predicted: naive", "flat", "25 MiB buckets, overlapped"],
                 [[r["label"], r["mode_flag"] or "not shown", num(r["step_s"] * 1e3),
                   num(r["backward_s"] * 1e3), num(r["communication_s"] * 1e3),
                   num(r["predicted_naive_s"] * 1e3), num(r["predicted_flat_s"] * 1e3),
                   num(r["predicted_bucketed_s"] * 1e3)] for r in rows])


def third_party_numbers(rows: list[dict[str, Any]]) -> dict[str, float]:
    """What the seed's runs show, asserted against the predictions: the naive run's communication
    as predicted; a "flat" run that asked for naive and took its time; two runs whose mode was not
    printed, overlapped, leaving more than the last bucket (the embedding's gradient, ready last);
    their backward slower. The page's numbers, in ms and %."""
    naive_run, flat_run = (r for r in rows if r["mode_flag"] == "naive")
    overlap_run = rows[0]
    fit = third_party_fit()
    assert abs(naive_run["predicted_naive_s"] / naive_run["communication_s"] - 1) < 0.05
    assert flat_run["mode_flag"] == "naive"  # the "flat" profile's command line asked for naive
    assert abs(flat_run["communication_s"] / naive_run["communication_s"] - 1) < 1e-3
    assert flat_run["predicted_flat_s"] < 0.8 * flat_run["communication_s"]
    assert overlap_run["communication_s"] < 0.5 * overlap_run["predicted_flat_s"]  # overlapped
    assert math.isclose(overlap_run["predicted_bucketed_s"], comms_cost.collective_time_s(
        "all_reduce", grad_bytes("xl")[0], WORLD, alpha_s=fit.alpha_s,
        bytes_per_s=fit.bytes_per_s))  # the embedding's gradient, ready last: the tail
    assert overlap_run["backward_s"] > naive_run["backward_s"]
    return {"xl_pred_naive_ms": naive_run["predicted_naive_s"] * 1e3,
            "xl_naive_ms": naive_run["communication_s"] * 1e3,
            "xl_naive_share": 100 * naive_run["communication_s"] / naive_run["step_s"],
            "xl_pred_flat_ms": flat_run["predicted_flat_s"] * 1e3,
            "xl_flat_ms": flat_run["communication_s"] * 1e3,
            "xl_overlap_ms": overlap_run["communication_s"] * 1e3,
            "xl_bwd_ms": overlap_run["backward_s"] * 1e3,
            "xl_tail_ms": overlap_run["predicted_bucketed_s"] * 1e3,
            "xl_hidden_ms": (naive_run["communication_s"] - overlap_run["communication_s"]) * 1e3,
            "xl_slower_bwd_ms": (overlap_run["backward_s"] - naive_run["backward_s"]) * 1e3,
            "xl_saved_ms": (naive_run["step_s"] - overlap_run["step_s"]) * 1e3}
