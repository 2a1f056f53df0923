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
  bucketed DDP), FSDP, TP and the 1F1B pipeline at each m, beside the measured step; whether it
  ordered the runs better than chance is Kendall's rank test (`order_agreement`).
A sample is the slowest rank's step. The ranks always run on the CPU: the strategies need two or
more ranks, and one GPU cannot host two NCCL ranks, so a machine with one GPU runs the gpu sizes
on its CPU cores and every row says so (`ranks_device`). What runs (on each rank and in the
parent) is `parallel_step_run`; this module reads the rows. The chapter's tables of the accounting,
nothing measured, are here too (`fsdp_fit_table`, `split_table`, `strategy_table`). Used in:
chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

from mlsys import bench
from mlsys.accounting import compute_bound, parallel, parallel_traffic
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
    text["bytes"] = (f"our FSDP and TP {'made exactly' if exact else 'did not make'} the calls, "
                     "with the message sizes, that accounting.parallel predicts")
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


def order_agreement(predicted: list[float], measured: list[float]) -> tuple[int, int, float]:
    """Pairs of runs the prediction puts in the measured order, the pairs, and the one-sided
    p-value of Kendall's rank test: the share of the orderings of the measured values that put at
    least as many pairs in order if the prediction knew nothing (exact up to 8 runs, the normal
    approximation beyond; a tie counts as out of order). Half the pairs is what chance gives."""
    if len(predicted) != len(measured) or len(predicted) < 2:
        raise ValueError(f"predicted and measured must be two lists of the same length >= 2, got "
                         f"{len(predicted)} and {len(measured)}")
    n = len(predicted)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]

    def agree(order) -> int:
        return sum((predicted[i] - predicted[j]) * (order[i] - order[j]) > 0 for i, j in pairs)

    hits = agree(measured)
    if n <= 8:
        counts = [agree(p) for p in itertools.permutations(measured)]
        return hits, len(pairs), sum(c >= hits for c in counts) / len(counts)
    s = 2 * hits - len(pairs)  # Kendall's S with no ties
    sd = math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    return hits, len(pairs), 0.5 * math.erfc((s - 1) / sd / math.sqrt(2))


def planner_verdict(rows: list[dict[str, Any]]) -> str:
    """How far the calibrated planner's steps were from the measured ones, and how many pairs of
    runs it put in the measured order, against chance (`order_agreement`); withheld when a step
    or the calibration was noisy."""
    cal = calibration(rows)
    if "error" in cal:
        return f"no verdict: the all-reduce times gave no link to calibrate on ({cal['error']})"
    runs = [r for r in rows if r["kind"] == "planner"]
    ratio = {r["run"]: r["predicted_s"] / r["step"]["median_s"] for r in runs}
    agree, pairs, p_value = order_agreement([r["predicted_s"] for r in runs],
                                            [r["step"]["median_s"] for r in runs])
    chance = ("better than chance" if p_value < 0.05 else "no better than chance, which puts "
              "half in order")
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
        f"no overlap, {above} above both; it put {agree} of {pairs} pairs of runs in the measured "
        f"order, {chance} (one-sided p = {p_value:.2f}, Kendall's rank test)",
        bench.noise_problems(timings))


# --- the chapter's tables of the accounting (nothing measured) ------------------------------------


def fsdp_fit_table(device_bytes: float, state_bytes: float, per_token_bytes: float,
                   tokens_per_device: Iterable[int], *, shard_fraction: float = 0.5) -> Table:
    """Part (b) of the XXL question: for each count of tokens per device, the smallest pure-FSDP
    degree N that holds the state and the activations, `shard_fraction` of them sharded
    (`parallel.min_shards_to_fit`, checked against N - 1), and its memory per device; "never"
    where the unsharded part alone fills the device."""
    rows, f = [], shard_fraction
    for t in tokens_per_device:
        a = per_token_bytes * t
        try:
            n = parallel.min_shards_to_fit(device_bytes, state_bytes, a,
                                           activation_shard_fraction=f)
        except ValueError:
            rows.append([f"{t:,}", "never", "-"])
            continue
        m = state_bytes / n + a * (1 - f + f / n)
        assert m <= device_bytes and (n == 1 or device_bytes < state_bytes / (n - 1)
                                      + a * (1 - f + f / (n - 1)))
        rows.append([f"{t:,}", n, num(m / 1e9)])
    return Table(["tokens per device", "smallest N_FSDP", "memory per device (GB)"], rows)


def split_table(d_ff: int, splits, **kw: Any) -> Table:
    """Part (d): `compute_bound.split_thresholds` as a table, both models side by side."""
    rows = []
    for r in compute_bound.split_thresholds(d_ff, splits, **kw):
        x, y = r["x"], r["y"]
        name = f"X = {x}, Y = {y}" + ("" if r["gather"] == 1 else
                                     f", gathers at {r['gather']:g}x the bytes (fp8)")
        rows.append([name, f"{r['m_x']:g}, {r['m_y']:g}", f"{r['tp_share']:.0%}",
                     num(r["sum"]), num(r["max"]),
                     "-" if math.isinf(r["sum"]) else f"{r['sum'] * x * y:,.0f}"])
    return Table(["split", "M_X, M_Y", "T_TP / T_math", "tokens per device (sum)",
                  "(max)", "global batch (sum)"], rows)


def strategy_table(cfg, cases: dict[str, tuple], *, world_size: int, batch: int, seq: int,
                   dtype: str = "bf16") -> Table:
    """What each strategy of `cases` (name: (degrees, micro-batches[, sequence parallelism]))
    holds and sends per device and step (`parallel.device_memory`, `parallel_traffic.sent_bytes`),
    everything in `dtype`: the weights gathered, the gradients reduced and the activations sent."""
    rows = []
    for name, (degrees, m, *sp) in cases.items():
        dims = parallel.ParallelDims(**degrees, world_size=world_size)
        sent = parallel_traffic.sent_bytes(cfg, dims, 0, batch=batch, seq=seq, microbatches=m,
                                           param_dtype=dtype, reduce_dtype=dtype,
                                           act_dtype=dtype, sequence_parallel=any(sp))
        mem = parallel.device_memory(cfg, dims, micro_batch=batch // (dims.dp * m), seq=seq,
                                     microbatches=m, act_dtype=dtype, sequence_parallel=any(sp))
        rows.append([name, num(mem.states / 1e9), num(mem.activations / 1e9),
                     ", ".join(f"{k} {num(v / 1e9)}" for k, v in sent.items() if v)])
    return Table(["strategy", "states per device (GB)", "activations (GB)",
                  f"sent per step (GB, {dtype})"], rows)


EXPERIMENT = Experiment(
    name="parallel_step",
    chapter="09_parallelism",
    description="pipeline bubble (GPipe, 1F1B) vs (p-1)/(m+p-1); FSDP vs FSDP2; TP vs DTensor; "
                "the planner calibrated and checked against every mesh",
    gpu_seconds=65,
    sizes=SIZES,
    run=run,
)
