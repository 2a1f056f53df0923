"""A training step under pipeline, FSDP and tensor parallelism: the bubble measured against
(p - 1) / (m + p - 1), and the hand-written strategies timed beside PyTorch's.

One launch of `world_size` ranks (gloo) trains the book's model (next-token loss, AdamW) and
measures:
- **bubble**: GPipe and 1F1B over p = world_size stages for each micro-batch count m: on every
  rank the time its forwards and backwards computed (waiting for a receive excluded) against the
  step's span (the slowest rank's); the idle share 1 - busy / span beside
  `accounting.pipeline.bubble_fraction(p, m)`;
- **fsdp**: our FSDP with and without prefetch, and PyTorch's FSDP2 (`fully_shard`), the step's
  time and the bytes ours sent (`distributed.comms.count_bytes`) beside `accounting.parallel`;
- **tp**: our Megatron TP and DTensor's `parallelize_module`, the same (DTensor's collectives go
  through the C++ functional API and are not counted);
- **planner**: `accounting.planner` calibrated on two measurements of the same launch (the
  FLOP/s each rank reaches stepping the whole batch alone, and an alpha-beta fit of all-reduces
  of `link_bytes`) predicts the step of every mesh that ran: data parallelism (chapter 08's
  bucketed DDP), FSDP, TP and the 1F1B pipeline at each m, beside the measured step.
A sample is the slowest rank's step. The ranks always run on the CPU: the strategies need two or
more ranks, and one GPU cannot host two NCCL ranks, so a machine with one GPU runs the gpu sizes
on its CPU cores and every row says so (`ranks_device`). Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mlsys import bench, env
from mlsys.accounting import parallel as P
from mlsys.book import Table, num, verdict
from mlsys.experiments import Experiment, timing_fields, timing_of
from mlsys.models.config import TransformerConfig

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
    import torch

    from mlsys.distributed import comms, ddp, fsdp, pp, tp
    from mlsys.experiments.allreduce_bench import time_all_reduces
    from mlsys.models.transformer import Transformer
    from mlsys.training import next_token_loss

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
    out["fsdp"]["fully_shard"] = timed(fsdp.apply_fully_shard(fresh(), group), mine)
    out["tp"]["ours"] = timed(tp.apply_tp(fresh(), group), tokens)
    out["tp"]["dtensor"] = timed(tp.apply_dtensor_tp(fresh(), group), tokens)
    out["dp"] = timed(ddp.apply_ddp(fresh(), "bucketed", group=group), mine)
    out["alone"] = timed(fresh(), tokens)  # the whole batch on every rank, no communication
    out["all_reduce"] = time_all_reduces(rank, s.link_bytes, 1, max(3, s.steps))
    return out


# --- in the parent --------------------------------------------------------------------------------


def _slowest(per_rank: list[list[float]]) -> bench.Timing:
    return bench.Timing(tuple(max(v) for v in zip(*per_rank, strict=True)), 0, "ranks")


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """One launch on the CPU; every part's rows (see the module docstring)."""
    from mlsys.distributed import launch

    cfg = TransformerConfig.preset(s.preset)
    P.stage_layers(cfg.n_layers, s.world_size)
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
                         "measured_samples": idle, "predicted": P.bubble_fraction(p, m),
                         "span": timing_fields(bench.Timing(tuple(spans), 0, "ranks"))})
    units = P.fsdp_units(cfg, P.ParallelDims(dp_shard=p))
    predicted = {"fsdp": sum(P.fsdp_sent_bytes(units, p).values()),
                 "tp": P.tp_sent_bytes(cfg.d_model, p, tokens=s.batch * s.seq,
                                       n_blocks=cfg.n_layers)}
    for kind, variants in (("fsdp", FSDP_VARIANTS), ("tp", TP_VARIANTS)):
        for variant in variants:
            first = per_rank[0][kind][variant]
            rows.append({"kind": kind, "variant": variant,
                         "step": timing_fields(_slowest([r[kind][variant]["times"]
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
    import os

    from mlsys.accounting import comms as C
    from mlsys.accounting import planner

    cfg, p = TransformerConfig.preset(s.preset), s.world_size
    alone = _slowest([r["alone"]["times"] for r in per_rank])
    flops = P.model_shape(cfg, seq=s.seq, dtype="fp32").training_flops_per_token * s.batch * s.seq
    sizes = sorted(per_rank[0]["all_reduce"])
    per_call = [sorted(max(v) for v in zip(*(r["all_reduce"][m] for r in per_rank),
                                           strict=True))[len(per_rank[0]["all_reduce"][m]) // 2]
                for m in sizes]
    calibration = {"kind": "calibration", "alone": timing_fields(alone),
                   "flop_per_s": flops / alone.median_s, "link_bytes": sizes,
                   "all_reduce_s": per_call}
    try:
        fit = C.fit_alpha_beta(sizes, per_call, n_ranks=p)
    except ValueError as error:
        return [{**calibration, "error": str(error)}]
    calibration.update(alpha_s=fit.alpha_s, bytes_per_s=fit.bytes_per_s)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cluster = planner.measured_cluster("these CPU ranks", flop_per_s=flops / alone.median_s,
                                       dtype="fp32", link_bytes_per_s=fit.bytes_per_s,
                                       per_node=p, memory_bytes=ram)
    runs = {("dp", 1): ({"dp_replicate": p},
                        timing_fields(_slowest([q["dp"]["times"] for q in per_rank])))}
    for r in measured:
        if r["kind"] == "fsdp" and r["variant"] == "ours, prefetch":
            runs[("fsdp", 1)] = ({"dp_shard": p}, r["step"])
        elif r["kind"] == "tp" and r["variant"] == "ours":
            runs[("tp", 1)] = ({"tp": p}, r["step"])
        elif r["kind"] == "bubble" and r["schedule"] == "1f1b":
            runs[("1f1b", r["microbatches"])] = ({"pp": p}, r["span"])
    out = [calibration]
    for (kind, m), (axes, step) in runs.items():
        dims = P.ParallelDims(**axes, world_size=p)
        plan = planner.evaluate(cfg, cluster, dims, batch=s.batch, seq=s.seq, microbatches=m,
                                recipe="fp32_adamw", dtype="fp32")
        out.append({"kind": "planner", "run": kind if kind != "1f1b" else f"1f1b, m = {m}",
                    "mesh": planner.mesh_text(dims), "microbatches": m, "step": step,
                    "predicted_s": plan.step_s, "serial_s": plan.serial_step_s,
                    "compute_s": plan.compute_s,
                    "bubble_s": plan.bubble_s, "exposed_s": sum(plan.exposed_s.values())})
    return out


# --- reading the rows (live or recorded) ----------------------------------------------------------


def setup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == "setup")


def table(rows: list[dict[str, Any]]) -> Table:
    """Bubbles measured and predicted; steps of each FSDP and TP variant with their bytes."""
    out = []
    for r in (r for r in rows if r["kind"] == "bubble"):
        out.append([f"{r['schedule']}, p = {r['stages']}, m = {r['microbatches']}",
                    num(r["span"]["median_s"] * 1e3), f"{r['measured']:.0%}",
                    f"{r['predicted']:.0%}", ""])
    for r in (r for r in rows if r["kind"] in ("fsdp", "tp")):
        sent = "not counted" if r["sent_bytes"] is None else \
            f"{r['sent_bytes'] / r['predicted_sent_bytes']:.3f}x predicted"
        out.append([f"{r['kind']}: {r['variant']}", num(r["step"]["median_s"] * 1e3), "", "",
                    sent])
    return Table([f"step ({setup(rows)['note']})", "ms", "bubble measured",
                  "bubble (p-1)/(m+p-1)", "bytes sent"], out)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the rows: bubble, fsdp, tp; withheld when the steps were noisy."""
    bubbles = [r for r in rows if r["kind"] == "bubble"]
    steps = {f"{r['kind']} {r['variant']}": timing_of(r["step"]) for r in rows
             if r["kind"] in ("fsdp", "tp")}
    spans = {f"{r['schedule']} m={r['microbatches']}": timing_of(r["span"]) for r in bubbles}
    text = {}
    for schedule in SCHEDULES:
        mine = [r for r in bubbles if r["schedule"] == schedule]
        pairs = ", ".join(f"m = {r['microbatches']}: {r['measured']:.0%} (formula "
                          f"{r['predicted']:.0%})" for r in mine)
        falls = all(a["measured"] > b["measured"] for a, b in zip(mine, mine[1:], strict=False))
        text[f"bubble {schedule}"] = verdict(
            f"{schedule} over {mine[0]['stages']} stages idled {pairs}; the bubble "
            f"{'fell' if falls else 'did not fall'} with every added micro-batch",
            bench.noise_problems({k: v for k, v in spans.items() if k.startswith(schedule)}))
    by = {(r["kind"], r["variant"]): r for r in rows if r["kind"] in ("fsdp", "tp")}
    exact = all(r["sent_bytes"] == r["predicted_sent_bytes"] for r in by.values()
                if r["sent_bytes"] is not None)
    ratio = (by[("fsdp", "ours, prefetch")]["step"]["median_s"]
             / by[("fsdp", "fully_shard")]["step"]["median_s"])
    gain = (by[("fsdp", "ours, no prefetch")]["step"]["median_s"]
            / by[("fsdp", "ours, prefetch")]["step"]["median_s"])
    text["fsdp"] = verdict(f"our FSDP's step took {ratio:.2f}x FSDP2's; without prefetch "
                           f"{gain:.2f}x its own with it", bench.noise_problems(
                               {k: v for k, v in steps.items() if k.startswith("fsdp")}))
    tp_ratio = by[("tp", "ours")]["step"]["median_s"] / by[("tp", "dtensor")]["step"]["median_s"]
    text["tp"] = verdict(f"our Megatron TP's step took {tp_ratio:.2f}x DTensor's",
                         bench.noise_problems({k: v for k, v in steps.items()
                                               if k.startswith("tp")}))
    text["bytes"] = (f"our FSDP and TP sent {'exactly' if exact else 'not'} the bytes "
                     "accounting.parallel predicts")
    text["planner"] = planner_verdict(rows)
    return text


def calibration(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == "calibration")


def planner_table(rows: list[dict[str, Any]]) -> Table:
    """The planner's predicted step beside the measured one, with its terms, for every mesh."""
    out = [[r["run"], num(r["step"]["median_s"] * 1e3), num(r["predicted_s"] * 1e3),
            f"{r['predicted_s'] / r['step']['median_s']:.2f}", num(r["serial_s"] * 1e3),
            num(r["compute_s"] * 1e3), num(r["bubble_s"] * 1e3), num(r["exposed_s"] * 1e3)]
           for r in rows if r["kind"] == "planner"]
    return Table([f"run ({setup(rows)['world_size']} ranks)",
                  "measured ms", "planner ms", "planner / measured", "no overlap ms",
                  "compute ms", "bubble ms", "exposed comms ms"], out)


def planner_verdict(rows: list[dict[str, Any]]) -> str:
    """How far the calibrated planner's steps were from the measured ones, and how many pairs of
    runs it put in the measured order; withheld when a step or the calibration was noisy."""
    cal = calibration(rows)
    if "error" in cal:
        return f"no verdict: the all-reduce times gave no link to calibrate on ({cal['error']})"
    runs = [r for r in rows if r["kind"] == "planner"]
    ratio = {r["run"]: r["predicted_s"] / r["step"]["median_s"] for r in runs}
    pairs = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]]
    agree = sum((a["predicted_s"] - b["predicted_s"]) * (a["step"]["median_s"]
                                                         - b["step"]["median_s"]) > 0
                for a, b in pairs)
    low, high = min(ratio, key=ratio.get), max(ratio, key=ratio.get)
    between = sum(r["predicted_s"] <= r["step"]["median_s"] <= r["serial_s"] for r in runs)
    above = sum(r["step"]["median_s"] > r["serial_s"] for r in runs)
    timings = {r["run"]: timing_of(r["step"]) for r in runs}
    timings["one rank alone"] = timing_of(cal["alone"])
    return verdict(
        f"calibrated on {cal['flop_per_s'] / 1e9:.1f} GFLOP/s per rank and a "
        f"{cal['bytes_per_s'] / 1e9:.2f} GB/s link (its {cal['alpha_s'] * 1e6:.0f} us latency "
        f"left out, as the planner leaves latency out), the planner's steps ran from "
        f"{ratio[low]:.2f}x the measured one ({low}) to {ratio[high]:.2f}x ({high}); "
        f"{between} of {len(runs)} measured steps lay between its prediction and the same with "
        f"no overlap, {above} above both; it put {agree} of {len(pairs)} pairs of runs in the "
        "measured order",
        bench.noise_problems(timings))


EXPERIMENT = Experiment(
    name="parallel_step",
    chapter="09_parallelism",
    description="pipeline bubble (GPipe, 1F1B) vs (p-1)/(m+p-1); FSDP vs FSDP2; TP vs DTensor; "
                "the planner calibrated and checked against every mesh",
    gpu_seconds=120,
    sizes=SIZES,
    run=run,
)
