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
  through the C++ functional API and are not counted).
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


SIZES = {
    "smoke": Sizes("debug", 2, 4, 16, (1, 4), 0, 2),
    "cpu": Sizes("laptop", 2, 8, 64, (1, 2, 4, 8), 1, 4),
    "gpu": Sizes("laptop", 4, 16, 128, (1, 2, 4, 8, 16), 2, 6),  # on the GPU machine's CPU
}


# --- on each rank ---------------------------------------------------------------------------------


def measure(rank, s: Sizes) -> dict[str, Any]:
    """Everything the experiment times on one rank (runs inside `distributed.launch`)."""
    import torch

    from mlsys.distributed import comms, fsdp, pp, tp
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

    def timed(model, batch, sync=None):
        opt = torch.optim.AdamW(model.parameters())
        times, sent = [], None
        for _ in range(s.warmup + s.steps):
            torch.distributed.barrier(group=rank.group)
            t0 = time.perf_counter()
            with comms.count_bytes() as count:
                next_token_loss(model, batch).backward()
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
    rows.append({"kind": "setup", "preset": s.preset, "world_size": p, "batch": s.batch,
                 "seq": s.seq, "device": env.device_name(), "ranks_device": "cpu",
                 "backend": "gloo", "note": note})
    return rows


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
    return text


EXPERIMENT = Experiment(
    name="parallel_step",
    chapter="09_parallelism",
    description="pipeline bubble (GPipe, 1F1B) vs (p-1)/(m+p-1); FSDP vs FSDP2; TP vs DTensor",
    gpu_seconds=90,
    sizes=SIZES,
    run=run,
)
