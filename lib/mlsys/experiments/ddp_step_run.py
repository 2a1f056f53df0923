"""What `ddp_step` runs: one launch of `world_size` ranks, each timing every DDP variant, and the
parent turning the ranks' samples into rows (the slowest rank's, step by step).

On each rank (`measure`): all-reduce probes; forward, backward, communication and optimizer of
naive, flat, overlapped and bucketed DDP, with the all-reduces counted
(`distributed.comms.count_bytes`); bucketed DDP across bucket sizes; our bucketed DDP against
`torch.nn.parallel.DistributedDataParallel`, alternating step by step; K micro-batches with and
without `no_sync`; ZeRO stages 0, 1 and 2 (what each rank holds after a step, and what it sent).
The module docstring of `ddp_step` says what the rows mean. Used in: §sec-data-parallel.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mlsys import env
from mlsys.accounting import activations
from mlsys.accounting import zero as zero_cost
from mlsys.distributed import comms, ddp, launch, zero
from mlsys.experiments import kit, timing_fields
from mlsys.experiments.kit import fit_row, slowest, time_all_reduces
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.training import next_token_loss, training_state_bytes

PHASES = ("forward", "backward", "communication", "optimizer")
VARIANTS = ("naive", "flat", "overlapped", "bucketed")
MIB = 2**20


@dataclass(frozen=True)
class Sizes:
    preset: str
    world_size: int
    batch: int  # per rank; divisible by every micro-batch count
    seq: int
    warmup: int
    steps: int
    bucket_sizes_mb: tuple[float, ...]
    micro_batches: tuple[int, ...]
    probe_bytes: tuple[int, ...]
    bucket_mb: float  # the bucketed variant's, torch's and accumulation's cap: several buckets


SIZES = {
    "smoke": Sizes("debug", 2, 2, 32, 1, 3, (0.05, 0.25, 25.0), (1, 2), (2**12, 2**16, 2**22),
                   0.25),  # 0.87 MiB of gradients: 4 buckets
    "cpu": Sizes("laptop", 2, 4, 64, 2, 8, (0.5, 2.0, 8.0, 25.0), (1, 2, 4),
                 (2**12, 2**16, 2**20, 2**25), 4.0),  # 24 MiB: 7 buckets (25 MiB would be 1)
    "gpu": Sizes("medium", 2, 4, 512, 3, 10, (1.0, 5.0, 25.0, 100.0), (1, 2, 4),
                 (2**16, 2**20, 2**24, 2**28), 25.0),  # 1.6 GiB: 75 buckets, PyTorch's cap
}
"""Sizes per profile. `bucket_mb` is chosen so that the bucketed variant has several buckets:
PyTorch's 25 MiB would hold all of the laptop preset's 24 MiB of gradients in one."""


# --- on each rank ---------------------------------------------------------------------------------


def measure(rank, s: Sizes) -> dict[str, Any]:
    """Everything the experiment times on one rank (runs inside `distributed.launch`)."""
    cfg, dev, group = TransformerConfig.preset(s.preset), rank.device, rank.group
    gen = torch.Generator().manual_seed(1_000 + rank.rank)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(dev)
    adamw = torch.optim.AdamW

    def fresh():
        if dev.type == "cuda":  # free the previous part's model before the next one
            kit.free("cuda")
        model = Transformer(cfg).to(dev)
        model.init_weights(seed=0)
        return model

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def step(wrapped, opt, micro: int = 1, sync_each: bool = False) -> list[float]:
        """Seconds of forward, backward, communication and optimizer in one optimizer step."""
        dist.barrier(group=group)
        spent = [0.0] * 4
        for i, chunk in enumerate(tokens.chunk(micro)):
            sync = sync_each or i == micro - 1
            with contextlib.nullcontext() if sync else wrapped.no_sync():
                t0 = now()
                loss = next_token_loss(wrapped, chunk) / micro
                t1 = now()
                loss.backward()
                t2 = now()
                if sync:
                    wrapped.finish_gradient_synchronization()
                t3 = now()
            spent[0], spent[1], spent[2] = spent[0] + t1 - t0, spent[1] + t2 - t1, \
                spent[2] + t3 - t2
        t0 = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        spent[3] = now() - t0
        return spent

    def timed(wrapped, **kw) -> dict[str, Any]:
        opt = adamw(wrapped.parameters())
        with comms.count_bytes() as count:  # the first step, counted, is also a warm-up
            step(wrapped, opt, **kw)
        samples = [step(wrapped, opt, **kw) for _ in range(s.warmup + s.steps)]
        return {"phases": samples[s.warmup:], "calls": count.calls["all_reduce"],
                "sent_bytes": count.sent_bytes}

    out: dict[str, Any] = {"probe": time_all_reduces(rank, s.probe_bytes, 1, s.steps)}
    for variant in VARIANTS:
        wrapped = ddp.apply_ddp(fresh(), variant, group=group, bucket_size_mb=s.bucket_mb)
        out[variant] = timed(wrapped)
    out["tensor_bytes"] = [p.numel() * p.element_size() for p in wrapped.trainable][::-1]
    out["buckets"] = {}
    for mb in s.bucket_sizes_mb:
        wrapped = ddp.BucketedDDP(fresh(), group, bucket_size_mb=mb)
        out["buckets"][mb] = {**timed(wrapped), "bucket_bytes": [
            sum(p.numel() * p.element_size() for p in b) for b in wrapped.buckets]}
    out["torch"] = _against_torch(step, fresh, group, dev, s)
    out["accumulation"] = []
    for k in s.micro_batches:
        for sync_each in (False, True) if k > 1 else (False,):
            wrapped = ddp.BucketedDDP(fresh(), group, bucket_size_mb=s.bucket_mb)
            out["accumulation"].append({"micro_batches": k, "sync_each": sync_each,
                                        **timed(wrapped, micro=k, sync_each=sync_each)})
    del wrapped
    out["zero"] = []
    for stage in (0, 1, 2):
        model = fresh()
        if stage == 0:
            wrapped = ddp.BucketedDDP(model, group, bucket_size_mb=s.bucket_mb)
            opt = adamw(model.parameters())
        else:
            wrapped = None
            opt = zero.ShardedOptimizer(model.parameters(), adamw, group=group, stage=stage,
                                        reduce_gradients=True)
        with comms.count_bytes() as count:
            next_token_loss(wrapped or model, tokens).backward()
            if wrapped is not None:
                wrapped.finish_gradient_synchronization()
            opt.step()
        held = training_state_bytes(model, opt)  # before zero_grad: the gradients still held
        out["zero"].append({"stage": stage, "held": held, "sent_bytes": count.sent_bytes,
                            "owned_numel": getattr(opt, "owned_numel", None)})
        del model, wrapped, opt
    return out


def _against_torch(step, fresh, group, dev, s: Sizes) -> dict[str, Any]:
    """Our bucketed DDP and torch's DDP (the same cap, `s.bucket_mb`, buffers broadcast once),
    alternating which goes first, step by step."""
    ours = ddp.BucketedDDP(fresh(), group, bucket_size_mb=s.bucket_mb)
    options = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    once = ({"forward_sync_buffers": False} if "forward_sync_buffers" in options  # torch 2.13+
            else {"broadcast_buffers": False})
    theirs = torch.nn.parallel.DistributedDataParallel(
        fresh(), device_ids=[dev.index] if dev.type == "cuda" else None, process_group=group,
        bucket_cap_mb=s.bucket_mb, **once)
    theirs.finish_gradient_synchronization = lambda: None  # torch syncs inside the backward
    pair = {"ours": (ours, torch.optim.AdamW(ours.parameters())),
            "torch": (theirs, torch.optim.AdamW(theirs.parameters()))}
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for i in range(2 * (s.warmup + s.steps)):
        for name in ("ours", "torch") if i % 2 else ("torch", "ours"):
            total = sum(step(*pair[name]))
            if i >= 2 * s.warmup:
                times[name].append(total)
    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(),
                                                           theirs.parameters(), strict=True))
    return {**times, "max_param_diff": diff}


# --- in the parent --------------------------------------------------------------------------------


def _phase_rows(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Timings of each phase and of the whole step, the slowest rank's per step."""
    out = {}
    for i, phase in enumerate(PHASES):
        out[phase] = timing_fields(slowest([[p[i] for p in r["phases"]] for r in per_rank]))
    out["step"] = timing_fields(slowest([[sum(p) for p in r["phases"]] for r in per_rank]))
    out["all_reduce_calls"] = per_rank[0]["calls"]
    out["sent_bytes"] = per_rank[0]["sent_bytes"]
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """One launch; every part's rows (see the module docstring)."""
    device = "cuda" if (device or env.device()) == "cuda" else "cpu"
    world, note = s.world_size, ""
    if device == "cuda":
        available = torch.cuda.device_count()
        if available < world:
            world = available
            note = (f"{s.world_size} ranks need {s.world_size} GPUs; this machine has "
                    f"{available}: one rank, whose collectives cross no link")
    cfg = TransformerConfig.preset(s.preset)
    if any(s.batch % k for k in s.micro_batches):
        raise ValueError(f"batch ({s.batch}) must be divisible by every micro-batch count "
                         f"{s.micro_batches}")
    per_rank = launch.run(measure, world, args=(s,), device=device, timeout_s=600,
                          collective_timeout_s=300)
    first = per_rank[0]
    rows: list[dict[str, Any]] = []
    for size in s.probe_bytes:
        rows.append({"kind": "probe", "message_bytes": size,
                     **timing_fields(slowest([r["probe"][size] for r in per_rank]))})
    if world > 1:
        rows.append(fit_row([r["message_bytes"] for r in rows], [r["median_s"] for r in rows],
                            world))
    tensor_bytes = first["tensor_bytes"]
    for variant in VARIANTS:
        rows.append({"kind": "variant", "variant": variant,
                     **_phase_rows([r[variant] for r in per_rank])})
    for mb in s.bucket_sizes_mb:
        rows.append({"kind": "bucket", "bucket_size_mb": mb,
                     "bucket_bytes": first["buckets"][mb]["bucket_bytes"],
                     **_phase_rows([r["buckets"][mb] for r in per_rank])})
    rows.append({"kind": "torch", "ours": timing_fields(slowest([r["torch"]["ours"]
                                                                 for r in per_rank])),
                 "torch": timing_fields(slowest([r["torch"]["torch"] for r in per_rank])),
                 "max_param_diff": max(r["torch"]["max_param_diff"] for r in per_rank)})
    for i, acc in enumerate(first["accumulation"]):
        k = acc["micro_batches"]
        rows.append({"kind": "accumulation", "micro_batches": k, "sync_each": acc["sync_each"],
                     "saved_activation_bytes": activations.saved_bytes(
                         cfg, s.batch // k, s.seq).total_bytes,
                     **_phase_rows([r["accumulation"][i] for r in per_rank])})
    n_params = sum(tensor_bytes) // 4
    for r, mine in enumerate(per_rank):
        for z in mine["zero"]:
            stage, shard = z["stage"], z["owned_numel"]
            rows.append({"kind": "zero", "rank": r, "stage": stage, "held": z["held"],
                         "owned_numel": shard, "sent_bytes": z["sent_bytes"],
                         "predicted": zero_cost.zero_memory_breakdown(n_params, world, stage,
                                                                      shard_params=shard),
                         "ideal": zero_cost.zero_memory_breakdown(n_params, world, stage),
                         "predicted_sent_bytes": sum(zero_cost.zero_sent_bytes(
                             n_params, world, stage).values())})
    rows.append({"kind": "setup", "preset": s.preset, "world_size": world, "batch": s.batch,
                 "seq": s.seq, "n_params": n_params, "tensor_bytes": tensor_bytes,
                 "device": env.device_name(), "backend": launch.default_backend(device),
                 "note": note, "bucket_mb": s.bucket_mb, "cores": os.cpu_count()})
    return rows
