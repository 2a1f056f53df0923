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
on its CPU cores and every row says so (`ranks_device`). What runs (on each rank and in the
parent) is `parallel_step_run`; this module reads the rows. Used in: chapter 09
(§sec-parallelism).
"""

from __future__ import annotations

from typing import Any

from mlsys import bench
from mlsys.book import Table, num, verdict
from mlsys.experiments import Experiment, kit, timing_of
from mlsys.experiments.kit import setup
from mlsys.experiments.parallel_step_run import SCHEDULES, SIZES, run

# --- reading the rows (live or recorded) ----------------------------------------------------------


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
    return kit.first(rows, "calibration")


def planner_table(rows: list[dict[str, Any]]) -> Table:
    """The planner's predicted step beside the measured one, with its terms, for every mesh (five
    columns, so that the table fits a page's column)."""
    out = [[r["run"], num(r["step"]["median_s"] * 1e3),
            f"{num(r['predicted_s'] * 1e3)} ({r['predicted_s'] / r['step']['median_s']:.2f}x)",
            num(r["serial_s"] * 1e3), " + ".join(num(r[k] * 1e3) for k in
                                                 ("compute_s", "bubble_s", "exposed_s"))]
           for r in rows if r["kind"] == "planner"]
    return Table([f"run ({setup(rows)['world_size']} ranks)", "measured ms",
                  "planner ms (x measured)", "no overlap ms", "compute + bubble + comms ms"], out)


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
    gpu_seconds=65,
    sizes=SIZES,
    run=run,
)
