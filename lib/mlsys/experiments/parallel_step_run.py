"""What `parallel_step` runs: one launch of `world_size` gloo ranks on the CPU, each timing the
pipeline schedules, FSDP and TP (ours and PyTorch's), data parallelism, the whole batch alone and
all-reduces; then, in the parent, the rows: the slowest rank's samples, the bubbles against
(p - 1) / (m + p - 1), and the planner calibrated on the launch's own measurements beside every
mesh that ran (`planner_rows`). The module docstring of `parallel_step` says what the rows mean.
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.accounting import comms as comms_cost
from mlsys.accounting import parallel, parallel_traffic, planner
from mlsys.distributed import comms, ddp, fsdp, launch, pp, torch_strategies, tp
from mlsys.experiments import timing_fields
from mlsys.experiments.kit import slowest, time_all_reduces
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.tables import mesh_text
from mlsys.training import next_token_loss

SCHEDULES = ("gpipe", "1f1b")
FSDP_VARIANTS = ("ours, prefetch", "ours, no prefetch", "fully_shard")
TP_VARIANTS = ("ours", "dtensor")


@dataclass(frozen=True)
class Sizes:
    preset: str
    world_size: int  # ranks: pipeline stages, FSDP shards and TP ranks in turn
    batch: int  # global sequences; divisible by world_size and by every micro-batch count
    seq: int
    microbatches: tuple[int, ...]
    warmup: int
    steps: int
    link_bytes: tuple[int, ...]  # all-reduce sizes of the planner's link calibration


MIB = 2**20
SIZES = {
    "smoke": Sizes("debug", 2, 4, 16, (1, 4), 0, 2, (MIB, 8 * MIB)),
    "cpu": Sizes("laptop", 2, 8, 64, (1, 2, 4, 8), 1, 4, (MIB, 4 * MIB, 16 * MIB)),
    "gpu": Sizes("laptop", 4, 16, 128, (1, 2, 4, 8, 16), 2, 6,  # on the GPU machine's CPU
                 (MIB, 4 * MIB, 16 * MIB)),
}


# --- on each rank ---------------------------------------------------------------------------------


def measure(rank, s: Sizes) -> dict[str, Any]:
    """Everything the experiment times on one rank (runs inside `distributed.launch`)."""
    cfg = TransformerConfig.preset(s.preset)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen)
    mine = tokens.chunk(rank.world_size)[rank.rank]

    def fresh():
        torch.manual_seed(0)
        return Transformer(cfg)

    out: dict[str, Any] = {"bubble": {}, "fsdp": {}, "tp": {}}
    for schedule in SCHEDULES:
        for m in s.microbatches:
            stage = pp.apply_pp(fresh(), rank.group)
            steps = []
            for _ in range(s.warmup + s.steps):
                r = pp.pipeline_step(stage, tokens[:, :-1], tokens[:, 1:], microbatches=m,
                                     schedule=schedule)
                steps.append((r.busy_s, r.span_s))
                stage.zero_grad(set_to_none=True)
            out["bubble"][(schedule, m)] = steps[s.warmup:]

    def timed(model, batch):
        opt = torch.optim.AdamW(model.parameters())
        times, sent = [], None
        for _ in range(s.warmup + s.steps):
            torch.distributed.barrier(group=rank.group)
            t0 = time.perf_counter()
            with comms.count_bytes() as count:
                next_token_loss(model, batch).backward()
                if isinstance(model, ddp.BucketedDDP):
                    model.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            sent = count.sent_bytes if sent is None else sent
        return {"times": times[s.warmup:], "sent_bytes": sent}

    group = rank.group
    out["fsdp"]["ours, prefetch"] = timed(fsdp.apply_fsdp(fresh(), group), mine)
    out["fsdp"]["ours, no prefetch"] = timed(fsdp.apply_fsdp(fresh(), group, prefetch=False),
                                             mine)
    out["fsdp"]["fully_shard"] = timed(torch_strategies.apply_fully_shard(fresh(), group), mine)
    out["tp"]["ours"] = timed(tp.apply_tp(fresh(), group), tokens)
    out["tp"]["dtensor"] = timed(torch_strategies.apply_dtensor_tp(fresh(), group), tokens)
    out["dp"] = timed(ddp.apply_ddp(fresh(), "bucketed", group=group), mine)
    out["alone"] = timed(fresh(), tokens)  # the whole batch on every rank, no communication
    out["all_reduce"] = time_all_reduces(rank, s.link_bytes, 1, max(3, s.steps))
    return out


# --- in the parent --------------------------------------------------------------------------------


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """One launch on the CPU; every part's rows (see the module docstring)."""
    cfg = TransformerConfig.preset(s.preset)
    parallel.stage_layers(cfg.n_layers, s.world_size)
    if s.batch % s.world_size or any(s.batch % k for k in s.microbatches):
        raise ValueError(f"batch ({s.batch}) must be divisible by world_size ({s.world_size}) "
                         f"and by every micro-batch count {s.microbatches}")
    on_gpu = (device or env.device()) == "cuda"
    note = ("ranks on this machine's CPU (gloo): two NCCL ranks cannot share its one GPU"
            if on_gpu else "ranks on the CPU (gloo)")
    per_rank = launch.run(measure, s.world_size, args=(s,), device="cpu", timeout_s=600,
                          collective_timeout_s=300)
    p, rows = s.world_size, []
    for schedule in SCHEDULES:
        for m in s.microbatches:
            steps = [r["bubble"][(schedule, m)] for r in per_rank]
            spans = [max(steps[r][i][1] for r in range(p)) for i in range(s.steps)]
            idle = [1 - sum(steps[r][i][0] for r in range(p)) / p / spans[i]
                    for i in range(s.steps)]
            rows.append({"kind": "bubble", "schedule": schedule, "stages": p,
                         "microbatches": m, "measured": sorted(idle)[len(idle) // 2],
                         "measured_samples": idle, "predicted": parallel.bubble_fraction(p, m),
                         "span": timing_fields(bench.Timing(tuple(spans), 0, "ranks"))})
    units = parallel_traffic.fsdp_units(cfg, parallel.ParallelDims(dp_shard=p))
    predicted = {"fsdp": sum(parallel_traffic.fsdp_sent_bytes(units, p).values()),
                 "tp": parallel_traffic.tp_sent_bytes(cfg.d_model, p, tokens=s.batch * s.seq,
                                                      n_blocks=cfg.n_layers)}
    for kind, variants in (("fsdp", FSDP_VARIANTS), ("tp", TP_VARIANTS)):
        for variant in variants:
            first = per_rank[0][kind][variant]
            rows.append({"kind": kind, "variant": variant,
                         "step": timing_fields(slowest([r[kind][variant]["times"]
                                                         for r in per_rank])),
                         "sent_bytes": first["sent_bytes"] if variant.startswith("ours") else None,
                         "predicted_sent_bytes": predicted[kind]})
    rows += planner_rows(s, per_rank, rows)
    rows.append({"kind": "setup", "preset": s.preset, "world_size": p, "batch": s.batch,
                 "seq": s.seq, "device": env.device_name(), "ranks_device": "cpu",
                 "backend": "gloo", "note": note})
    return rows


def planner_rows(s: Sizes, per_rank: list[dict[str, Any]],
                 measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calibration row, then the planner's prediction beside each measured mesh; only the
    calibration row (with its error) when the all-reduce times give no fit."""
    cfg, p = TransformerConfig.preset(s.preset), s.world_size
    alone = slowest([r["alone"]["times"] for r in per_rank])
    per_token = parallel.model_shape(cfg, seq=s.seq, dtype="fp32").training_flops_per_token
    flops = per_token * s.batch * s.seq
    sizes = sorted(per_rank[0]["all_reduce"])
    per_call = [sorted(max(v) for v in zip(*(r["all_reduce"][m] for r in per_rank),
                                           strict=True))[len(per_rank[0]["all_reduce"][m]) // 2]
                for m in sizes]
    calibration = {"kind": "calibration", "alone": timing_fields(alone),
                   "flop_per_s": flops / alone.median_s, "link_bytes": sizes,
                   "all_reduce_s": per_call}
    try:
        fit = comms_cost.fit_alpha_beta(sizes, per_call, n_ranks=p)
    except ValueError as error:
        return [{**calibration, "error": str(error)}]
    calibration.update(alpha_s=fit.alpha_s, bytes_per_s=fit.bytes_per_s)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cluster = planner.measured_cluster("these CPU ranks", flop_per_s=flops / alone.median_s,
                                       dtype="fp32", link_bytes_per_s=fit.bytes_per_s,
                                       per_node=p, memory_bytes=ram)
    runs = {("dp", 1): ({"dp_replicate": p},
                        timing_fields(slowest([q["dp"]["times"] for q in per_rank])))}
    for r in measured:
        if r["kind"] == "fsdp" and r["variant"] == "ours, prefetch":
            runs[("fsdp", 1)] = ({"dp_shard": p}, r["step"])
        elif r["kind"] == "tp" and r["variant"] == "ours":
            runs[("tp", 1)] = ({"tp": p}, r["step"])
        elif r["kind"] == "bubble" and r["schedule"] == "1f1b":
            runs[("1f1b", r["microbatches"])] = ({"pp": p}, r["span"])
    out = [calibration]
    for (kind, m), (axes, step) in runs.items():
        dims = parallel.ParallelDims(**axes, world_size=p)
        plan = planner.evaluate(cfg, cluster, dims, batch=s.batch, seq=s.seq, microbatches=m,
                                recipe="fp32_adamw", dtype="fp32")
        out.append({"kind": "planner", "run": kind if kind != "1f1b" else f"1f1b, m = {m}",
                    "mesh": mesh_text(dims), "microbatches": m, "step": step,
                    "predicted_s": plan.step_s, "serial_s": plan.serial_step_s,
                    "compute_s": plan.compute_s,
                    "bubble_s": plan.bubble_s, "exposed_s": sum(plan.exposed_s.values())})
    return out
