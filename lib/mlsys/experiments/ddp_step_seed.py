"""The seed's DDP step of the xl preset on two GPUs (`third_party.CS336_STUDENT_DDP_XL`), predicted
from the seed's own all-reduce table (`allreduce_bench.third_party_fit`), and the same gradients on
other links.

The xl model's fp32 gradients are its parameters' sizes, read from the model built on the meta
device. Naive DDP all-reduces them one by one after the backward, flat DDP once, and bucketed DDP
starts a 25 MiB bucket's all-reduce as soon as its gradients are ready, the backward meeting the
last layers first (`accounting.buckets.overlap_exposed_s`). `third_party_numbers` checks what the
seed's runs show against those predictions and gives the page its numbers. The same step in bf16
on faster GPUs (`bf16_case`) sets the bucket size (`bucket_sweeps`), and `zero_traffic` sets the
seed's ZeRO formulas beside `accounting.zero`; `seed_gpu` gives the evidence for the seed's
unnamed GPUs, `dp_roofline` data parallelism's C / W condition and `cross_node` the same
all-reduce across nodes (rings per port, two levels, in-network reduction). Times in seconds,
sizes in bytes. A little over 300 lines: every function reads the same seed run and the same
gradients, on one page. Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from mlsys import checks, hardware, third_party
from mlsys.accounting import activations, flops
from mlsys.accounting import comms as comms_cost
from mlsys.accounting.buckets import (
    BucketPoint,
    best_bucket_cap,
    bucket_bytes,
    bucket_sweep,
    exposed_bounds_s,
    overlap_exposed_s,
)
from mlsys.accounting.zero import STAGES, claimed_zero_sent_bytes, zero_sent_bytes
from mlsys.book import Table, num
from mlsys.experiments.allreduce_bench import third_party_fit
from mlsys.experiments.allreduce_bench import third_party_rows as third_party_rows_allreduce
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
    printed, overlapped, leaving more than the last bucket (the embedding's gradient, ready last):
    over 10x the model's tail, and over 5x what the model leaves with 1,000 MB buckets (the largest
    the assignment sweeps), so no bucket cap the seed could have used explains it; their backward
    slower. The page's numbers, in ms, MiB, % and x."""
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
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    exposed = [r["communication_s"] for r in rows if r["mode_flag"] is None]
    gb_cap = overlap_exposed_s(bucket_bytes(grad_bytes("xl")[::-1], 1e9), overlap_run["backward_s"],
                               WORLD, **ab)  # the assignment's largest cap, 1,000 MB
    assert min(exposed) > 10 * overlap_run["predicted_bucketed_s"] and min(exposed) > 5 * gb_cap
    alone = comms_cost.collective_cost("all_reduce", 1.0, WORLD)  # one all-reduce, per byte
    return {"xl_overlap_lo_ms": min(exposed) * 1e3, "xl_gb_cap_ms": gb_cap * 1e3,
            "xl_overlap_x": min(exposed) / overlap_run["predicted_bucketed_s"],
            "xl_alone_mib": (overlap_run["communication_s"] - alone.steps * fit.alpha_s)
            * fit.bytes_per_s / alone.bus_bytes / MIB,
            "xl_hidden_pct": 100 * (1 - overlap_run["communication_s"]
                                    / naive_run["communication_s"]),
            "xl_pred_naive_ms": naive_run["predicted_naive_s"] * 1e3,
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


# --- the same step elsewhere: bf16 on faster GPUs, bucket caps, ZeRO's traffic -----------------


def bf16_case(accelerator: hardware.Accelerator, batch: int, seq: int, *, preset: str = "xl",
              links: Sequence[str] = ("nvlink4", "pcie5")) -> dict[str, Any]:
    """The seed's step in bf16 on two `accelerator`s: the gradients in the order the backward
    makes them ("sizes", bytes, the last layers first), a backward at the bf16 peak ("backward_s",
    twice the forward's matmul FLOPs) and, per link of `links`, the alpha-beta model with the
    seed's fitted alpha and the link's spec ("links": keyword arguments of `accounting.comms`)."""
    cfg = TransformerConfig.preset(preset)
    backward = (2 * flops.transformer_flops(cfg, batch, seq).forward_matmul_flops
                / accelerator.peak_flop_per_s("bf16"))
    alpha = third_party_fit().alpha_s
    return {"sizes": [b // 2 for b in grad_bytes(preset)[::-1]], "backward_s": backward,
            "links": {k: {"alpha_s": alpha, "bytes_per_s": hardware.LINKS[k].bytes_per_s}
                      for k in links}}


def seed_gpu() -> dict[str, float]:
    """Why the seed's "Ampere" GPUs are taken for A100 80 GB SXMs, an inference the seed does not
    state: their 2-rank all-reduce's bus bandwidth is several times PCIe Gen4's per-direction
    spec, so NVLink (an SXM part), and their xl step's fp32 AdamW states (16 B per parameter)
    plus its fp32 activations (`accounting.activations`, naive attention) need more than the
    40 GB part holds. Asserts both; GB/s and GB."""
    busbw = max(r["busbw_bytes_per_s"] for r in third_party_rows_allreduce()
                if r["world_size"] == WORLD)
    pcie = hardware.LINKS["pcie4"].bytes_per_s
    run = third_party.CS336_STUDENT_DDP_SETUP
    acts = activations.saved_bytes(TransformerConfig.preset(run["preset"]), run["batch"],
                                   run["seq"], attention="naive").total_bytes
    need = 16 * third_party.CS336_STUDENT_DDP_PARAMS + acts
    assert busbw > 4 * pcie and 40e9 < need < hardware.A100_80GB_SXM.hbm_bytes
    return {"seed_busbw_gb": busbw / 1e9, "pcie4_gb": pcie / 1e9, "seed_need_gb": need / 1e9}


def dp_roofline(case: dict[str, Any], accelerator: hardware.Accelerator, batch: int, seq: int,
                cluster: hardware.Cluster, *, preset: str = "xl", nodes: int = 2,
                cap_bytes: float = 25 * MIB) -> tuple[dict[str, float], Table]:
    """Data parallelism's roofline: the backward hides the gradients' all-reduce when its FLOPs
    per byte sent reach the accelerator's C / W (peak FLOP/s over the link's bytes/s). Per token,
    the backward does 2x the forward's matmul FLOPs (about 4 N) and each rank sends
    2 (n-1)/n x 2 N bytes of bf16 gradients, whatever the batch: so the batch per GPU must reach
    (n-1)/n x C / W tokens, about C / W (the Scaling Book's "Training" chapter: pure data
    parallelism is compute-bound when B / X > C / W). Per group (2 GPUs over each link of
    `case`; `nodes` whole nodes of `cluster`; as many GPUs, one per node, `Cluster.ring_link`):
    C / W, the critical tokens per GPU, and whether `batch` x `seq` reaches them; asserts,
    for the 2-GPU groups, that this is exactly when the queue bound of `case`'s buckets
    (`exposed_bounds_s` at `cap_bytes`, alpha aside) stays within the first bucket's filling.
    Returns the numbers ("roof_*") and a table."""
    cfg = TransformerConfig.preset(preset)
    tokens = batch * seq
    per_token = 2 * flops.transformer_flops(cfg, batch, seq).forward_matmul_flops / tokens
    peak, grads = accelerator.peak_flop_per_s("bf16"), sum(case["sizes"])
    assert math.isclose(case["backward_s"], per_token * tokens / peak)
    n = checks.positive_int(nodes, "nodes") * cluster.per_node
    groups = {**{f"2 GPUs, {hardware.LINKS[k].name.split(' (')[0]}": (WORLD, v["bytes_per_s"])
                 for k, v in case["links"].items()},
              f"{nodes} whole nodes ({n} GPUs)": (n, cluster.ring_link(n).bytes_per_s),
              f"{n} nodes, one GPU in each": (n, cluster.ring_link(n, stride=cluster.per_node)
                                               .bytes_per_s)}
    rows, out = [], {"roof_tokens": tokens, "roof_per_token_n": per_token / (grads / 2)}
    for i, (label, (ranks, bandwidth)) in enumerate(groups.items()):
        bus = comms_cost.collective_cost("all_reduce", grads, ranks).bus_bytes
        ridge = peak / bandwidth
        critical = ridge * bus / per_token
        hides = tokens >= critical
        if ranks == WORLD:  # the bucket analysis' case: its queue bound, without the latencies
            first = case["backward_s"] * bucket_bytes(case["sizes"], cap_bytes)[0] / grads
            _, queue = exposed_bounds_s(bucket_bytes(case["sizes"], cap_bytes), case["backward_s"],
                                        ranks, alpha_s=0.0, bytes_per_s=bandwidth)
            assert hides == (queue <= first * (1 + 1e-9))
        out |= {f"roof_ridge_{i}": ridge, f"roof_critical_{i}": critical}
        rows.append([label, num(bandwidth / 1e9), num(ridge), num(critical),
                     "hides" if hides else "exposed"])
    return out, Table(["gradients all-reduced over", "W GB/s", "C / W FLOP/B",
                       "critical tokens per GPU", f"{tokens:,} tokens per GPU"], rows)


def cross_node(grad_bytes_total: float, cluster: hardware.Cluster, nodes: int, *,
               alpha_s: float) -> tuple[dict[str, float], Table]:
    """One all-reduce of `grad_bytes_total` over `nodes` whole nodes of `cluster`, four ways: a
    flat ring costed at one port per GPU (one ring on one NIC), flat rings at the node's egress
    (`Cluster.ring_link`, one ring per port), the two-level all-reduce
    (`comms.hierarchical_all_reduce_s`, phases pipelined: the slowest sets the time) and the
    same with the switches reducing across the nodes (SHARP). Latency `alpha_s` per step.
    Asserts that the egress rings and the pipelined hierarchy move the same bytes per second
    (the hierarchy's gain is latency steps) and that in-network reduction halves the crossing,
    nearly. Returns the numbers ("cn_*", ms) and a table."""
    g = cluster.per_node
    n = checks.positive_int(nodes, "nodes") * g
    ab = {"alpha_s": alpha_s}
    port = comms_cost.collective_time_s("all_reduce", grad_bytes_total, n,
                                        bytes_per_s=cluster.inter_node.bytes_per_s, **ab)
    egress = comms_cost.collective_time_s("all_reduce", grad_bytes_total, n,
                                          bytes_per_s=cluster.ring_link(n).bytes_per_s, **ab)
    kw = {"intra_bytes_per_s": cluster.intra_node.bytes_per_s,
          "inter_bytes_per_s": cluster.inter_node.bytes_per_s, **ab}
    two = comms_cost.hierarchical_all_reduce_s(grad_bytes_total, nodes, g, **kw)
    sharp = comms_cost.hierarchical_all_reduce_s(grad_bytes_total, nodes, g, in_network=True, **kw)
    steps = {"port": 2 * (n - 1), "egress": 2 * (n - 1), "two": 2 * (g - 1) + 2 * (nodes - 1),
             "sharp": 2 * (g - 1) + 2}
    latency = steps["port"] * alpha_s
    assert math.isclose((port - latency) / (egress - latency),
                        cluster.ring_link(n).bytes_per_s / cluster.inter_node.bytes_per_s)
    assert math.isclose(two["across"] - 2 * (nodes - 1) * alpha_s, (nodes - 1) / nodes * n / (
        n - 1) * (egress - latency))  # the same bytes per second as the egress rings
    assert sharp["across"] < 0.6 * two["across"]
    rows = [["one ring, costed at one port per GPU", num(port * 1e3), steps["port"]],
            ["flat rings, one per port: the node's egress", num(egress * 1e3), steps["egress"]],
            ["two levels: ring in the node, ring across", num(max(two.values()) * 1e3),
             steps["two"]],
            ["two levels, the switches sum across (SHARP)", num(max(sharp.values()) * 1e3),
             steps["sharp"]]]
    return ({"cn_nodes": nodes, "cn_gpus": n, "cn_gb": grad_bytes_total / 1e9,
             "cn_port_ms": port * 1e3, "cn_egress_ms": egress * 1e3,
             "cn_two_ms": max(two.values()) * 1e3, "cn_two_sum_ms": sum(two.values()) * 1e3,
             "cn_sharp_ms": max(sharp.values()) * 1e3, "cn_steps_flat": steps["egress"],
             "cn_steps_two": steps["two"]},
            Table(["all-reduce", "ms", "latency steps"], rows))


def bucket_sweeps(caps_bytes: Sequence[float], case: dict[str, Any], seed_backward_s: float, *,
                  fast: str = "nvlink4", slow: str = "pcie5"
                  ) -> tuple[dict[str, list[BucketPoint]], dict[str, Any]]:
    """The exposed communication against the bucket cap (`accounting.buckets.bucket_sweep`): the
    seed's fp32 run on its A100s (their backward `seed_backward_s`, their fit) and `case`
    (`bf16_case`) over the link `fast`. Asserts what the page says: every point at least the
    larger of its bounds; neither extreme cap best; the best only the tail, the embedding's
    gradient (ready last), at PyTorch's 25 MiB among others; over `slow` the queue rules. Returns
    the sweeps and the page's numbers (ms; "valley": the caps within 1% of the best, MiB)."""
    fit = third_party_fit()
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    sizes, backward, links = case["sizes"], case["backward_s"], case["links"]
    sweeps = {"seed: 2 A100s (inferred), fp32, their backward": bucket_sweep(
                  grad_bytes("xl")[::-1], seed_backward_s, WORLD, caps_bytes=caps_bytes, **ab),
              "2 H100s, bf16, backward at peak": bucket_sweep(
                  sizes, backward, WORLD, caps_bytes=caps_bytes, **links[fast])}
    assert all(p.exposed_s >= max(p.tail_s, p.queue_s) * (1 - 1e-9)
               for s in sweeps.values() for p in s)
    points = sweeps["2 H100s, bf16, backward at peak"]
    best = min(p.exposed_s for p in points)
    assert best < min(points[0].exposed_s, points[-1].exposed_s)  # neither extreme is best
    valley = [p.cap_bytes / MIB for p in points if p.exposed_s <= 1.01 * best]
    assert 25 in valley and math.isclose(best, comms_cost.collective_time_s(
        "all_reduce", sizes[-1], WORLD, **links[fast]))  # the tail: the embedding's gradient
    _, slow_s = best_bucket_cap(sizes, backward, WORLD, caps_bytes=caps_bytes, **links[slow])
    assert slow_s > comms_cost.all_reduces_s([sum(sizes)], WORLD, **links[slow]) - backward
    return sweeps, {
        "bwd_fast_ms": backward * 1e3, "pcie_best_ms": slow_s * 1e3, "best_ms": best * 1e3,
        "fast_comm_ms": comms_cost.all_reduces_s([sum(sizes)], WORLD, **links[fast]) * 1e3,
        "valley": " to ".join(dict.fromkeys(num(c) for c in (valley[0], valley[-1])))}


def sweep_table(points: Sequence[BucketPoint]) -> Table:
    """One bucket sweep (`bucket_sweeps`): per cap, the buckets, both bounds and the exposed
    communication, in ms."""
    return Table(["cap MiB", "buckets", "tail ms", "queue ms", "exposed ms"],
                 [[num(p.cap_bytes / MIB), p.buckets, num(p.tail_s * 1e3), num(p.queue_s * 1e3),
                   num(p.exposed_s * 1e3)] for p in points])


def zero_traffic(n_params: int, n_ranks: int, n_layers: int) -> tuple[dict[str, float], Table]:
    """What each ZeRO stage sends per GPU per step (`accounting.zero.zero_sent_bytes`, fp32)
    against the seed's one-pager (`claimed_zero_sent_bytes`, with fp32 gradients and AdamW's
    moments as its M and O). Asserts that stages 1 and 2 send what data parallelism sends and
    stage 3 1.5x, and that the seed's stage 1 sends over twice that, its stage 2 less, its stage 3
    over twice stage 3's. Returns the seed's stages as multiples of data parallelism, and the
    table (GB)."""
    right = {s: sum(zero_sent_bytes(n_params, n_ranks, s).values()) for s in STAGES}
    claim = {s: claimed_zero_sent_bytes(s, 4 * n_params, n_ranks, n_layers=n_layers,
                                        optimizer_bytes=8 * n_params) for s in STAGES}
    assert right[1] == right[2] == right[0] and math.isclose(right[3], 1.5 * right[0])
    assert claim[1] > 2 * right[0] and claim[2] < right[0] and claim[3] > 2 * right[3]
    return ({f"claim_s{s}": claim[s] / right[0] for s in (1, 2, 3)},
            Table(["stage", "sent per GPU (GB)", "× data parallelism", "seed's formula (GB)",
                   "seed / right"],
                  [[s, num(right[s] / 1e9), f"{right[s] / right[0]:.2f}", num(claim[s] / 1e9),
                    f"{claim[s] / right[s]:.2f}"] for s in STAGES]))
