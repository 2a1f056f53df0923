"""All-reduce time against message size and rank count, with the alpha-beta model fitted to it.

For each rank count, one launch (`distributed.launch`) times `dist.all_reduce` of every size: a
barrier, then back-to-back calls (as many as `calls_per_sample` says; a device sync on GPU), on
every rank; a sample is the slowest rank's time per call, since a collective is done when its last
rank is. The rows give the algorithm bandwidth
(M / time) and the bus bandwidth (x 2 (n-1)/n, nccl-tests' definition), and per rank count the
fitted latency per step (alpha) and bandwidth (beta) of `accounting.comms`, beside the link's spec
where there is one (NVLink on a GPU node; none for gloo over loopback on one CPU).

On a CPU the ranks are gloo processes on one machine: the sizes are small and the "link" is the
memory and the kernel's loopback. On GPUs the ranks are NCCL processes, one per GPU; a machine
with one GPU cannot run 2 ranks, so it records one-rank rows (no bytes cross a link) and a row
that says why. `third_party_fit` fits the same model to the seed's 2-GPU NCCL table.
`collectives_table` tabulates every collective's bytes, and `ring_check` / `ring_table` check the
hand-written ring against `dist.all_reduce` on live ranks. Over 300 lines: one module, since the
live run, the seed's table and the ring are read with the same alpha-beta model and bandwidths,
on the same page, and its verdicts name what crowds the ranks (`crowded`).
Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mlsys import bench, env, hardware, third_party
from mlsys.accounting import comms as comms_cost
from mlsys.book import Table, num, verdict
from mlsys.distributed import comms, launch
from mlsys.experiments import Experiment, timing_fields, timing_of
from mlsys.experiments.kit import calls_per_sample, fit_row, setup, slowest, time_all_reduces

MIB = 2**20


@dataclass(frozen=True)
class Sizes:
    world_sizes: tuple[int, ...]
    message_bytes: tuple[int, ...]  # float32 tensors of these sizes
    warmup: int
    repeats: int


SIZES = {
    "smoke": Sizes((2,), (2**12, 2**16, 2**22), 1, 5),
    "cpu": Sizes((2, 4, 6), (MIB, 4 * MIB, 16 * MIB, 64 * MIB), 2, 10),
    "gpu": Sizes((2, 4, 6), (MIB, 10 * MIB, 100 * MIB, 1_024 * MIB), 5, 20),  # the seed's sizes
}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every (rank count, size) point, one fit per rank count, and skipped rank counts."""
    device = "cuda" if (device or env.device()) == "cuda" else "cpu"
    available = None
    if device == "cuda":
        available = torch.cuda.device_count()
    rows: list[dict[str, Any]] = []
    worlds = [w for w in s.world_sizes if available is None or w <= available]
    for w in s.world_sizes:
        if w not in worlds:
            rows.append({"kind": "skipped", "world_size": w,
                         "why": f"{w} ranks need {w} GPUs; this machine has {available}"})
    if not worlds:  # one GPU: NCCL on one rank, so that the GPU run still says something
        worlds = [1]
    backend = launch.default_backend(device)
    for w in bench.progress(worlds, desc="rank counts"):
        per_rank = launch.run(time_all_reduces, w, args=(s.message_bytes, s.warmup, s.repeats),
                              device=device, timeout_s=600, collective_timeout_s=300)
        for size in s.message_bytes:
            timing = slowest([r[size] for r in per_rank], warmup=s.warmup, device=device)
            rows.append({"kind": "point", "world_size": w, "message_bytes": size,
                         "backend": backend, "calls_per_sample": calls_per_sample(size),
                         **timing_fields(timing),
                         "algbw_bytes_per_s": comms_cost.algorithm_bandwidth(size, timing.median_s),
                         "busbw_bytes_per_s": comms_cost.bus_bandwidth("all_reduce", size,
                                                                       timing.median_s, w),
                         "problems": bench.noise_problems({f"{size} B": timing})})
        if w > 1:
            points = [r for r in rows if r["kind"] == "point" and r["world_size"] == w]
            rows.append({"world_size": w, **fit_row([r["message_bytes"] for r in points],
                                                    [r["median_s"] for r in points], w)})
    acc = hardware.detect() if device == "cuda" else None
    rows.append({"kind": "setup", "device": env.device_name(), "backend": backend,
                 "link": acc.interconnect_name if acc else None,
                 "link_bytes_per_s": acc.interconnect_bytes_per_s if acc else None,
                 "cores": os.cpu_count()})
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def fits(rows: list[dict[str, Any]]) -> dict[int, comms_cost.AlphaBeta]:
    """The fitted alpha-beta model of each rank count (where the fit succeeded)."""
    return {r["world_size"]: comms_cost.AlphaBeta("all_reduce", r["world_size"], r["alpha_s"],
                                                  r["bytes_per_s"], r["per_call_s"],
                                                  tuple(r["relative_errors"]))
            for r in rows if r["kind"] == "fit" and "error" not in r}


def table(rows: list[dict[str, Any]]) -> Table:
    models = fits(rows)
    out = []
    for r in rows:
        if r["kind"] == "skipped":
            out.append([r["world_size"], "", r["why"], "", "", ""])
        elif r["kind"] == "point":
            t = timing_of(r)
            fit = models.get(r["world_size"])
            out.append([r["world_size"], num(r["message_bytes"] / MIB),
                        f"{num(t.median_s * 1e3)} ({num(t.p20_s * 1e3)}–{num(t.p80_s * 1e3)})",
                        num(r["algbw_bytes_per_s"] / 1e9), num(r["busbw_bytes_per_s"] / 1e9),
                        num(fit.time_s(r["message_bytes"]) * 1e3) if fit else "no fit (1 rank)"])
    return Table(["ranks", "MiB", "ms (p20–p80)", "algbw GB/s", "busbw GB/s", "fit ms"], out)


def crowded(rows: list[dict[str, Any]]) -> str:
    """A sentence when more gloo ranks ran than the machine has cores (so a rank waits for a
    core, and its times scatter), else ""."""
    st, worlds = setup(rows), [r["world_size"] for r in rows if r["kind"] == "point"]
    cores = st.get("cores")
    if st["backend"] != "gloo" or not cores or not worlds or max(worlds) <= cores:
        return ""
    return (f"{max(worlds)} gloo ranks shared {cores} cores and one memory, so ranks waited "
            f"for a core")


def _bus_band(r: dict[str, Any]) -> tuple[float, float]:
    """The bus bandwidths of a point's p80 and p20 times: its p20-p80 band."""
    return tuple(comms_cost.bus_bandwidth("all_reduce", r["message_bytes"], r[t], r["world_size"])
                 for t in ("p80_s", "p20_s"))


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The fitted alpha and beta per rank count, against the link; algbw vs busbw across counts.
    Withheld when noisy, naming first any crowding of ranks on cores (`crowded`); the bus
    bandwidth's change across rank counts is given anyway when it lies beyond both points'
    p20-p80 bands, since noise does not move a whole band."""
    points = [r for r in rows if r["kind"] == "point"]
    problems = [p for r in points for p in r["problems"]]
    problems += [f"{r['world_size']} ranks: {r['error']}" for r in rows
                 if r["kind"] == "fit" and "error" in r]
    if problems and crowded(rows):
        problems.insert(0, crowded(rows))
    models, link = fits(rows), setup(rows)["link_bytes_per_s"]
    if not models and not any(r["kind"] == "fit" for r in rows):
        text = ("one rank only: an all-reduce over one rank crosses no link, so there is no alpha "
                "or beta to fit (this machine has one GPU)")
        return {"fit": text, "bandwidths": text}
    parts = []
    for w, fit in models.items():
        largest = max((r for r in points if r["world_size"] == w),
                      key=lambda r: r["message_bytes"])
        spec = f", {largest['busbw_bytes_per_s'] / link:.0%} of the link's spec" if link else ""
        worst = max(abs(e) for e in fit.relative_errors)
        parts.append(f"{w} ranks: alpha = {num(fit.alpha_s * 1e6)} µs per step, beta = "
                     f"{num(fit.bytes_per_s / 1e9)} GB/s (fit within {worst:.0%}); the largest "
                     f"message reached a bus bandwidth of {num(largest['busbw_bytes_per_s'] / 1e9)}"
                     f" GB/s{spec}")
    largest_size = max(r["message_bytes"] for r in points)
    at = sorted((r for r in points if r["message_bytes"] == largest_size),
                key=lambda r: r["world_size"])
    beyond = False
    if len(at) > 1:
        lo, hi = at[0], at[-1]
        algbw = hi["algbw_bytes_per_s"] / lo["algbw_bytes_per_s"]
        busbw = hi["busbw_bytes_per_s"] / lo["busbw_bytes_per_s"]
        ring = (comms_cost.bus_factor("all_reduce", lo["world_size"])
                / comms_cost.bus_factor("all_reduce", hi["world_size"]))
        bands = (f"from {lo['world_size']} to {hi['world_size']} ranks at "
                 f"{num(largest_size / MIB)} MiB, the algorithm bandwidth changed {algbw:.2f}x and "
                 f"the bus bandwidth {busbw:.2f}x (a ring on equal links: {ring:.2f}x and 1x)")
        (lo_min, lo_max), (hi_min, hi_max) = _bus_band(lo), _bus_band(hi)
        if hi_max < lo_min or hi_min > lo_max:
            beyond = True
            bands += (f"; the bus bandwidth {'fell' if hi_max < lo_min else 'rose'} beyond both "
                      f"points' p20-p80 bands, so not noise: the ranks do not each have a link "
                      f"of their own" + (f": {crowded(rows)}" if crowded(rows) else ""))
    else:
        bands = "one rank count: nothing to compare across rank counts"
    return {"fit": verdict("; ".join(parts), problems),
            "bandwidths": verdict(bands, [] if beyond else problems)}


def plot(rows: list[dict[str, Any]], axes) -> None:
    """Left: time against message size per rank count, measured (p20-p80 bars) and fitted.
    Right: the bus bandwidth with the fitted beta and, where there is one, the link's spec."""
    from mlsys.plotting import COLORS, CYCLE, finish  # matplotlib: only when a page draws

    models, link = fits(rows), setup(rows)
    points = [r for r in rows if r["kind"] == "point"]
    for color, w in zip(CYCLE, dict.fromkeys(r["world_size"] for r in points), strict=False):
        mine = [r for r in points if r["world_size"] == w]
        mib = [r["message_bytes"] / MIB for r in mine]
        ms = [r["median_s"] * 1e3 for r in mine]
        bars = [[m - r["p20_s"] * 1e3 for m, r in zip(ms, mine, strict=True)],
                [r["p80_s"] * 1e3 - m for m, r in zip(ms, mine, strict=True)]]
        axes[0].errorbar(mib, ms, yerr=bars, fmt="o", color=color, label=f"{w} ranks")
        axes[1].plot(mib, [r["busbw_bytes_per_s"] / 1e9 for r in mine], "o-", color=color,
                     label=f"{w} ranks, bus bandwidth")
        if w in models:
            axes[0].plot(mib, [models[w].time_s(r["message_bytes"]) * 1e3 for r in mine], ":",
                         color=color)
            axes[1].axhline(models[w].bytes_per_s / 1e9, ls=":", color=color)
    axes[0].plot([], [], ":", color=COLORS["muted"], label="alpha-beta fit")
    if link["link_bytes_per_s"]:
        axes[1].axhline(link["link_bytes_per_s"] / 1e9, color=COLORS["ceiling"],
                        label=f"{link['link']}, per direction")
    finish(axes[0], title="all-reduce time", xlabel="message (MiB)", ylabel="ms", logx=2,
           logy=True)
    finish(axes[1], title="bus bandwidth (dotted: fitted beta)", xlabel="message (MiB)",
           ylabel="GB/s", logx=2)


def collectives_table(ranks: tuple[int, int] = (2, 8)) -> Table:
    """Every collective of `accounting.comms` per byte of message: sent per rank at both rank
    counts, and the bus factor and ring steps at the larger. Asserts that an all-reduce is a
    reduce-scatter and an all-gather, in bytes and in steps."""
    few, many = ranks
    cost = {(c, n): comms_cost.collective_cost(c, 1.0, n)
            for c in comms_cost.COLLECTIVES for n in ranks}
    ar, rs, ag = (cost[c, many] for c in ("all_reduce", "reduce_scatter", "all_gather"))
    assert ar.sent_bytes == rs.sent_bytes + ag.sent_bytes and ar.steps == rs.steps + ag.steps
    return Table(["collective", f"sent / M (n = {few})", f"(n = {many})",
                  f"bus factor (n = {many})", f"ring steps (n = {many})"],
                 [[c.replace("_", "-"), f"{cost[c, few].sent_bytes:.3g}",
                   f"{cost[c, many].sent_bytes:.3g}", f"{cost[c, many].bus_factor:.3g}",
                   cost[c, many].steps] for c in comms_cost.COLLECTIVES])


def ring_check(rank, numel: int, seed: int = 0) -> dict[str, Any]:
    """On one rank: `distributed.comms.ring_all_reduce` of `numel` random float32 values against
    `dist.all_reduce` of the same tensor, with the bytes and calls each made (runs in a rank)."""
    gen = torch.Generator().manual_seed(seed + rank.rank)
    x = torch.randn(numel, generator=gen).to(rank.device)
    ours, ref = x.clone(), x.clone()
    with comms.count_bytes() as ring:
        comms.ring_all_reduce(ours, rank.group)
    with comms.count_bytes() as library:
        dist.all_reduce(ref, group=rank.group)
    return {"max_abs_diff": (ours - ref).abs().max().item(), "ring_sent_bytes": ring.sent_bytes,
            "ring_calls": dict(ring.calls), "all_reduce_sent_bytes": library.sent_bytes}


def ring_table(outs: list[dict[str, Any]], numel: int) -> Table:
    """The ranks' `ring_check` results as a table, after asserting on each rank: the ring's sum
    equals `dist.all_reduce`'s to rounding, it sent the accounting's 2 (n-1)/n M bytes, and it made
    2 (n-1) sends and as many receives."""
    n = len(outs)
    predicted = comms_cost.collective_cost("all_reduce", 4 * numel, n).sent_bytes
    for out in outs:
        assert out["max_abs_diff"] < 1e-5 and out["ring_sent_bytes"] == predicted, out
        assert out["ring_calls"] == {"isend": 2 * (n - 1), "recv": 2 * (n - 1)}, out
    return Table(["rank", "max |ring - all_reduce|", "ring sent (MB)", "2(n-1)/n M (MB)", "calls"],
                 [[r, f"{o['max_abs_diff']:.1e}", num(o["ring_sent_bytes"] / 1e6),
                   num(predicted / 1e6), ", ".join(f"{k} × {v}" for k, v in calls.items())]
                  for r, o in enumerate(outs) for calls in [o["ring_calls"]]])


def third_party_fit(world_size: int = 2) -> comms_cost.AlphaBeta:
    """The alpha-beta model fitted to the seed's NCCL table at `world_size` (2: four sizes)."""
    points = [r for r in third_party.CS336_STUDENT_ALLREDUCE if r.world_size == world_size]
    return comms_cost.fit_alpha_beta([r.message_bytes for r in points],
                                     [r.mean_s for r in points], n_ranks=world_size)


def third_party_rows() -> list[dict[str, Any]]:
    """The seed's table with its printed "GB/s", the GB/s it really is, and the 2-rank fit.
    Asserts that each printed "GB/s" is the bus bandwidth in GiB/s, to the rounding of the
    times (`comms_cost.claimed_effective_gb_per_s`)."""
    fit = third_party_fit()
    out = []
    for r in third_party.CS336_STUDENT_ALLREDUCE:
        claimed = comms_cost.claimed_effective_gb_per_s(r.message_bytes, r.mean_s, r.world_size)
        assert abs(claimed / r.claimed_gb_per_s - 1) < 6e-3, r
        out.append({"world_size": r.world_size, "message_bytes": r.message_bytes,
                    "mean_s": r.mean_s, "claimed_gb_per_s": r.claimed_gb_per_s,
                    "algbw_bytes_per_s": comms_cost.algorithm_bandwidth(r.message_bytes, r.mean_s),
                    "busbw_bytes_per_s": comms_cost.bus_bandwidth("all_reduce", r.message_bytes,
                                                                  r.mean_s, r.world_size),
                    "fit_2_ranks_s": fit.time_s(r.message_bytes) if r.world_size == 2 else None,
                    "size_stated": r.size_stated})
    return out


def third_party_table(rows: list[dict[str, Any]]) -> Table:
    """The seed's all-reduce table (`third_party_rows`) with both bandwidths of each row and the
    2-rank fit; a size the table lost is starred."""
    def mib(r: dict[str, Any]) -> str:
        return num(r["message_bytes"] / MIB) + ("" if r["size_stated"] else "*")

    return Table(["ranks", "MiB", "their mean ms", "their 'GB/s'", "algbw GB/s", "busbw GB/s",
                  "busbw GiB/s", "2-rank fit ms"],
                 [[r["world_size"], mib(r),
                   num(r["mean_s"] * 1e3), r["claimed_gb_per_s"],
                   num(r["algbw_bytes_per_s"] / 1e9), num(r["busbw_bytes_per_s"] / 1e9),
                   num(r["busbw_bytes_per_s"] / comms_cost.GIB),
                   num(r["fit_2_ranks_s"] * 1e3) if r["fit_2_ranks_s"] else ""] for r in rows])


def third_party_verdict(accelerator: hardware.Accelerator = hardware.A100_80GB_SXM) -> str:
    """What the seed's bandwidths are, and its 2-rank fit against `accelerator`'s link."""
    fit = third_party_fit()
    big = [r for r in third_party_rows() if r["message_bytes"] == 2**30]
    two = next(r for r in big if r["world_size"] == 2)
    four = next(r for r in big if r["world_size"] == 4)
    return (f"its 'GB/s' are bus bandwidths in GiB/s: {two['claimed_gb_per_s']} 'GB/s' at 2 "
            f"ranks is {num(two['busbw_bytes_per_s'] / 1e9)} GB/s, and at 4 ranks "
            f"{four['claimed_gb_per_s']} 'GB/s' is a bus bandwidth of "
            f"{num(four['busbw_bytes_per_s'] / 1e9)} GB/s for an algorithm bandwidth of "
            f"{num(four['algbw_bytes_per_s'] / 1e9)} GB/s; its 2-rank table fits alpha = "
            f"{num(fit.alpha_s * 1e6)} µs per step and beta = {num(fit.bytes_per_s / 1e9)} GB/s, "
            f"{fit.bytes_per_s / accelerator.interconnect_bytes_per_s:.0%} of the "
            f"{accelerator.name}'s {num(accelerator.interconnect_bytes_per_s / 1e9)} GB/s per "
            f"direction ({accelerator.interconnect_name})")


def third_party_formulas(fit: comms_cost.AlphaBeta, ranks: tuple[int, ...] = (2, 8, 64),
                         sizes: tuple[int, ...] = (MIB, 2**30)) -> Table:
    """The seed's two ring formulas (`comms_cost.claimed_ring_all_reduce_s`, with (n-1) latency
    steps, and `claimed_large_message_all_reduce_s`, 2M / beta) against the ring's time, with the
    latency and bandwidth of `fit`; asserts that the first misses exactly (n-1) alpha."""
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    rows = []
    for n in ranks:
        for m in sizes:
            right = comms_cost.collective_time_s("all_reduce", m, n, **ab)
            ring = comms_cost.claimed_ring_all_reduce_s(m, n, **ab)
            large = comms_cost.claimed_large_message_all_reduce_s(m, fit.bytes_per_s)
            assert math.isclose(right - ring, (n - 1) * fit.alpha_s)  # half the steps missing
            rows.append([n, num(m / MIB), num(right * 1e3), num(ring * 1e3),
                         f"{ring / right:.2f}", num(large * 1e3), f"{large / right:.2f}"])
    return Table(["ranks", "MiB", "2(n-1)α + 2(n-1)/n M/β (ms)", "seed: (n-1)α (ms)",
                  "seed / right", "seed: 2M/β (ms)", "seed / right"], rows)


EXPERIMENT = Experiment(
    name="allreduce_bench",
    chapter="08_data_parallel",
    description="all-reduce time vs size and ranks; alpha-beta fit; algorithm vs bus bandwidth",
    gpu_seconds=15,
    sizes=SIZES,
    run=run,
)
