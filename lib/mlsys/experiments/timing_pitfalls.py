"""Six ways to time a kernel wrongly, each measured: warm-up, sync, clocks, spread, caches, and
fp32 matmul precision.

1. No warm-up: the first calls of a fresh model pay one-time costs (allocator growth, lazy
   initialization, on a GPU kernel loading and library autotuning; with `torch.compile`, the
   compilation itself). Each of the first calls is timed alone, then the steady state.
2. No synchronization: CUDA kernels are launched asynchronously, so a host timer around a loop of
   launches measures the launches, not the work, unless the device is synchronized first.
3. Host clock or device events: an unsynchronized host timer around one op times its launch; a
   synchronized one adds the launch and synchronization latency to every sample; CUDA events time
   the work on the device.
4. A lone mean: a few slow samples (another process, a page fault) pull the mean; the median and
   the p20–p80 range do not move.
5. Warm caches: a small tensor timed in a loop stays in the last-level cache and runs faster than it
   would in a real step; `bench.benchmark(flush_bytes=...)` writes a large buffer between calls.
6. fp32 matmul precision: `torch.set_float32_matmul_precision` is process-wide, and "high" lets an
   fp32 matmul run on TF32 tensor cores (10 mantissa bits) on an Ampere or later GPU: the same
   "fp32" matmul is timed at "highest" and "high", with its error against float64.
Items 2 and 3 need a GPU: on a CPU ops finish before the call returns, and the rows say so.
`slow_calls` reads a mean ± std that its parts contradict: how many slow calls, and how slow.
`SimulatedKernel` is a kernel on a simulated clock, whose first calls are slow and one of whose
later calls is an outlier: a timer checked on it gives an exact answer (the chapter's exercise).
Used in: §sec-benchmarking.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env
from mlsys.book import Table, num
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer


@dataclass(frozen=True)
class Sizes:
    model: TransformerConfig  # the fresh model whose first calls are timed
    batch: int
    seq: int
    first_calls: int  # calls timed one by one after building the model
    matmul: int  # N of the matmuls of the synchronization test
    launches: int  # matmuls launched per sample in the synchronization test
    small_numel: int  # elements of the tiny op (clocks, spread)
    precision_matmul: int  # N of the fp32 matmul timed at both precisions
    spread_samples: int
    cache_bytes: int  # a tensor small enough to stay in the last-level cache
    flush_bytes: int  # the buffer written between calls to evict it
    compile: bool  # also time torch.compile's first calls
    repeats: int


SIZES = {
    "smoke": Sizes(TransformerConfig.preset("debug"), 2, 64, 4, 256, 20, 1024, 256, 100, 2**22,
                   2**27, False, 9),
    "cpu": Sizes(TransformerConfig.preset("debug"), 4, 128, 5, 512, 20, 1024, 512, 200, 2**22,
                 2**28, True, 15),
    "gpu": Sizes(TransformerConfig.preset("small"), 4, 512, 5, 4_096, 50, 1024, 8_192, 500,
                 2**24, 2**30, True, 30),
}


class SimulatedKernel:
    """A kernel whose i-th call costs `costs_s[i]` seconds of a simulated clock (the last cost
    once the list runs out): call it like a function, read the time with `clock()`, as
    `bench.benchmark(fn, clock=...)` takes it."""

    def __init__(self, costs_s: tuple[float, ...]):
        if not costs_s or any(c <= 0 for c in costs_s):
            raise ValueError(f"costs_s must be one or more positive seconds, got {costs_s}")
        self.costs_s, self.calls, self.now_s = tuple(costs_s), 0, 0.0

    def __call__(self) -> None:
        self.now_s += self.costs_s[min(self.calls, len(self.costs_s) - 1)]
        self.calls += 1

    def clock(self) -> float:
        return self.now_s


SIMULATED_COSTS_S = (20e-3,) * 5 + (1e-3,) * 3 + (40e-3,) + (1e-3,)
"""Five cold calls of 20 ms (allocation, lazy initialization), then 1 ms a call, and one call of
40 ms (another process took the core): the steady time is 1 ms."""


def _first_calls(fn, n: int, device: str) -> list[float]:
    """Seconds of each of the first `n` calls of `fn`, timed one by one, with no warm-up."""
    out = []
    for _ in range(n):
        out.append(bench.benchmark(fn, warmup=0, repeats=1, device=device).median_s)
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    # 1. warm-up: a fresh model's first calls, then its steady state
    model = Transformer(s.model).to(device)
    tokens = torch.randint(s.model.vocab_size, (s.batch, s.seq), generator=gen).to(device)
    first = _first_calls(lambda: model(tokens), s.first_calls, device)
    steady = bench.benchmark(lambda: model(tokens), warmup=1, repeats=s.repeats, device=device)
    rows.append({"kind": "warmup", "what": "eager forward", "first_s": first,
                 **timing_fields(steady)})
    if s.compile:
        compiled = kit.compile_fresh(model)
        first = _first_calls(lambda: compiled(tokens), s.first_calls, device)
        steady = bench.benchmark(lambda: compiled(tokens), warmup=1, repeats=s.repeats,
                                 device=device)
        rows.append({"kind": "warmup", "what": "torch.compile forward", "first_s": first,
                     **timing_fields(steady)})
    # 2. synchronization: a loop of matmul launches timed by the host clock, with and without
    a, b = (torch.randn(s.matmul, s.matmul, generator=gen).to(device) for _ in range(2))

    def launches() -> None:
        for _ in range(s.launches):
            a @ b

    bench.benchmark(launches, warmup=2, repeats=1, device=device)  # warm-up
    unsynced, synced = [], []
    for _ in range(s.repeats):
        t0 = time.perf_counter()
        launches()
        unsynced.append(time.perf_counter() - t0)
        bench._synchronize(device)
        t0 = time.perf_counter()
        launches()
        bench._synchronize(device)
        synced.append(time.perf_counter() - t0)
    rows.append({"kind": "sync", "launches": s.launches, "matmul": s.matmul,
                 "unsynced_s": statistics.median(unsynced), "synced_s": statistics.median(synced)})
    # 3. clocks: one tiny op, host clock (unsynchronized, synchronized) and, on a GPU, CUDA events
    x = torch.ones(s.small_numel, device=device)
    if device == "cuda":
        host_samples, launch_samples = [], []
        for _ in range(s.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            x.add_(1.0)
            launch_samples.append(time.perf_counter() - t0)  # before the kernel has finished
            torch.cuda.synchronize()
            host_samples.append(time.perf_counter() - t0)
        host = bench.Timing(tuple(host_samples), 0, "cuda")
        launch = bench.Timing(tuple(launch_samples), 0, "cuda")
        events = bench.benchmark(lambda: x.add_(1.0), warmup=3, repeats=s.repeats, device=device)
        rows.append({"kind": "clock", "host": timing_fields(host), "events": timing_fields(events),
                     "unsynced": timing_fields(launch)})
    else:  # the host clock is all a CPU has
        host = bench.benchmark(lambda: x.add_(1.0), warmup=3, repeats=s.repeats, device=device)
        rows.append({"kind": "clock", "host": timing_fields(host), "events": None})
    # 4. spread: many samples of the tiny op
    spread = bench.benchmark(lambda: x.add_(1.0), warmup=3, repeats=s.spread_samples, device=device)
    rows.append({"kind": "spread", **timing_fields(spread)})
    # 5. caches: a tensor that fits in the last-level cache, warm and flushed
    y = torch.ones(s.cache_bytes // 4, device=device)
    warm = bench.benchmark(lambda: y.sum(), warmup=3, repeats=s.repeats, device=device)
    cold = bench.benchmark(lambda: y.sum(), warmup=3, repeats=s.repeats, device=device,
                           flush_bytes=s.flush_bytes)
    rows.append({"kind": "cache", "bytes": s.cache_bytes, "flush_bytes": s.flush_bytes,
                 "warm": timing_fields(warm), "flushed": timing_fields(cold)})
    rows.append(_precision(s, device, gen))
    rows.append({"kind": "setup", "device": device})
    return rows


def _precision(s: Sizes, device: str, gen: torch.Generator) -> dict[str, Any]:
    """6. The same fp32 matmul at matmul precision "highest" and "high" (TF32 allowed), timed
    round-robin, each with its largest error against float64 relative to the largest output."""
    a, b = (torch.randn(s.precision_matmul, s.precision_matmul, generator=gen).to(device)
            for _ in range(2))
    exact = a.double() @ b.double()
    scale = exact.abs().max().item()
    before = torch.get_float32_matmul_precision()
    row: dict[str, Any] = {"kind": "precision", "matmul": s.precision_matmul}
    try:
        for level in PRECISIONS:
            torch.set_float32_matmul_precision(level)
            row[f"error_{level}"] = ((a @ b).double() - exact).abs().max().item() / scale
        fns = {level: lambda level=level: (torch.set_float32_matmul_precision(level), a @ b)
               for level in PRECISIONS}
        timings = bench.benchmark_interleaved(fns, warmup=2, repeats=s.repeats, device=device)
    finally:
        torch.set_float32_matmul_precision(before)
    return row | {level: timing_fields(t) for level, t in timings.items()}


PRECISIONS = ("highest", "high")
"""`torch.set_float32_matmul_precision` levels compared: fp32 throughout, and TF32 allowed."""


def slow_calls(mean_s: float, std_s: float, typical_s: float) -> tuple[float, float]:
    """(share of the calls that were slow, how much slower each was) that give a reported mean and
    (population) standard deviation when the other calls took `typical_s`: a share p of calls
    delta slower lifts the mean by p delta and gives a std of delta sqrt(p (1 - p)), so
    p = rise^2 / (rise^2 + std^2) and delta = rise / p."""
    checks.positive(std_s, "std_s")
    rise = mean_s - checks.positive(typical_s, "typical_s")
    if rise <= 0:
        raise ValueError(f"mean_s ({mean_s}) must exceed typical_s ({typical_s}): no slow calls "
                         "lift a mean below the typical call")
    share = rise**2 / (rise**2 + std_s**2)
    return share, rise / share


# --- reading the rows (live or recorded) ----------------------------------------------------------


def sentences(rows: list[dict[str, Any]]) -> dict[str, str]:
    """One sentence per pitfall, computed from its numbers."""
    out = {}
    for r in (r for r in rows if r["kind"] == "warmup"):
        first, median = r["first_s"], r["median_s"]
        out[f"warmup: {r['what']}"] = (
            f"{r['what']}: the first call took {num(first[0] * 1e3)} ms, "
            f"{first[0] / median:,.1f}x the steady median of {num(median * 1e3)} ms; the next "
            f"{len(first) - 1} took {', '.join(f'{t / median:.1f}x' for t in first[1:])}")
    sync = kit.first(rows, "sync")
    ratio = sync["synced_s"] / sync["unsynced_s"]
    out["sync"] = (f"{sync['launches']} matmuls of {sync['matmul']}: "
                   f"{num(sync['unsynced_s'] * 1e3)} ms by the host clock without synchronizing, "
                   f"{num(sync['synced_s'] * 1e3)} ms "
                   "with: " + (f"the unsynchronized number is {ratio:.1f}x too small, it times the "
                               "launches, not the work" if ratio > 1.5 else
                               "they agree, because every op here finishes before its call "
                               "returns" if ratio < 1.2 else
                               f"the unsynchronized number misses {1 - 1 / ratio:.0%} of the work"))
    out["clock"] = clock_sentence(kit.first(rows, "clock"))
    spread = timing_of(kit.first(rows, "spread"))
    mean = statistics.fmean(spread.samples_s)
    out["spread"] = (f"{len(spread.samples_s)} samples of a tiny op: median "
                     f"{num(spread.median_s * 1e6)} µs (p20–p80 {num(spread.p20_s * 1e6)}–"
                     f"{num(spread.p80_s * 1e6)}), mean "
                     f"{num(mean * 1e6)} µs, slowest {num(max(spread.samples_s) * 1e6)} µs: the "
                     f"mean sits {mean / spread.median_s - 1:+.0%} from the median")
    cache = kit.first(rows, "cache")
    warm, cold = timing_of(cache["warm"]), timing_of(cache["flushed"])
    out["cache"] = (f"summing {cache['bytes'] / 2**20:.0f} MiB: {num(warm.median_s * 1e6)} µs "
                    f"warm, {num(cold.median_s * 1e6)} µs after flushing "
                    f"{cache['flush_bytes'] / 2**20:.0f} MiB "
                    f"({cold.median_s / warm.median_s:.2f}x)")
    for precision in (r for r in rows if r["kind"] == "precision"):  # none in older records
        out["precision"] = precision_sentence(precision)
    return out


def clock_sentence(clock: dict[str, Any]) -> str:
    """The tiny op by the host clock (unsynchronized where recorded, synchronized) and by CUDA
    events."""
    host = timing_of(clock["host"])
    if clock["events"] is None:
        return (f"a tiny op took {num(host.median_s * 1e6)} µs by the host clock; this device has "
                "no events to compare (a CPU)")
    events = timing_of(clock["events"])
    text = (f"a tiny op: {num(host.median_s * 1e6)} µs by the synchronized host clock, "
            f"{num(events.median_s * 1e6)} µs by CUDA events: the host clock adds "
            f"{num((host.median_s - events.median_s) * 1e6)} µs of launch and synchronization to "
            "every sample")
    if clock.get("unsynced"):  # (older records: not timed)
        launch = timing_of(clock["unsynced"]).median_s
        text += (f"; without synchronizing it reads {num(launch * 1e6)} µs, the launch alone, "
                 + ("less than the kernel's own time" if launch < events.median_s else
                    "which hides the kernel's time inside the launch's"))
    return text


def precision_sentence(row: dict[str, Any]) -> str:
    """The fp32 matmul at "highest" and "high": time and error, and whether TF32 was used."""
    t = {level: row[level]["median_s"] for level in PRECISIONS}
    err = {level: row[f"error_{level}"] for level in PRECISIONS}
    text = (f"an fp32 matmul of {row['matmul']:,}: {num(t['highest'] * 1e3)} ms at precision "
            f"'highest', {num(t['high'] * 1e3)} ms at 'high' (largest error {err['highest']:.1e} "
            f"and {err['high']:.1e} of the largest output)")
    if err["high"] > 4 * err["highest"]:
        return text + (f": 'high' ran in TF32, {t['highest'] / t['high']:.1f}x as fast and "
                       f"{err['high'] / err['highest']:.0f}x less exact; an fp32 time means "
                       "nothing without the precision it ran at")
    return text + (": the same result to within rounding, so 'high' did not change the arithmetic "
                   "here (no TF32 units on this device)")


def table(rows: list[dict[str, Any]]) -> Table:
    return Table(["pitfall", "measured"], [[k, v] for k, v in sentences(rows).items()])


EXPERIMENT = Experiment(
    name="timing_pitfalls",
    chapter="05_benchmarking",
    description=("warm-up, synchronization, host clock vs events, mean vs median, flushed caches, "
                 "fp32 matmul precision"),
    gpu_seconds=60,
    sizes=SIZES,
    run=run,
)
