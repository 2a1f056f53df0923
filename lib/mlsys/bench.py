"""Timing that can be trusted: warm-up, synchronization, many repeats, median and spread.

On a GPU, kernel launches are asynchronous: a timer around `fn()` measures the launch, not the work.
`benchmark` synchronizes and times each repeat with CUDA events there, and with `time.perf_counter`
on CPU. Warm-up calls (compilation, autotuning, caches) are excluded explicitly. The median is
reported with the 20th and 80th percentiles, never a lone mean.

Every `Timing` carries `mlsys.results.provenance()`: device, versions, date and git commit, so a
number printed in the book or written under `results/` says what produced it.

A measurement is compared with something, usually a ceiling. `benchmark_interleaved` times several
functions round-robin in one run, so a ceiling probe and the operations compared with it share the
same moments of a noisy machine; `measure_consistently` re-measures (a bounded number of times)
until a consistency check passes, and reports what stayed inconsistent so that a page can withhold
its verdict. The clock is an argument: tests drive all of it with a fake one.
Used in: every measuring chapter.

One module, a little over 300 lines: the record (`Timing`), the two timers and the consistency
loop share the clock, the synchronization and the statistics, and every experiment reads them as
one tool (`bench.benchmark`, `bench.Timing`, `bench.noise_problems`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from tqdm import tqdm  # the plain bar: tqdm.auto warns in a notebook without ipywidgets

from mlsys import checks, env
from mlsys.results import provenance

T = TypeVar("T")
Clock = Callable[[], float]
"""Seconds from an arbitrary origin; `time.perf_counter` unless a test passes a fake one."""

MAX_SPREAD = 1.5
"""A timing whose p80 / p20 exceeds this is too noisy to interpret (re-measured, then reported)."""
MIN_SAMPLE_S = 2e-3
"""Experiments time operations shorter than this several times per sample
(`benchmark_interleaved`)."""
MAX_DRIFT = 0.25
"""A probe whose median moves by more than this fraction between the first and the second half of
its repeats (the machine's load changed during the run) is re-measured, then reported."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one benchmarked function (all repeats kept)."""

    samples_s: tuple[float, ...]
    warmup: int
    device: str
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def p20_s(self) -> float:
        return _quantile(self.samples_s, 0.2)

    @property
    def p80_s(self) -> float:
        return _quantile(self.samples_s, 0.8)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative spread of the middle 60% of samples."""
        return (self.p80_s - self.p20_s) / self.median_s if self.median_s > 0 else 0.0

    @property
    def spread_ratio(self) -> float:
        """p80 / p20: 1 for a perfectly steady timing."""
        return self.p80_s / self.p20_s if self.p20_s > 0 else math.inf

    @property
    def drift(self) -> float:
        """|median of the later half - median of the earlier half| / median of the earlier half.

        Samples are in time order, so this is how much the timing moved during the run (0 with fewer
        than 4 samples, where halves mean nothing).
        """
        n = len(self.samples_s)
        if n < 4:
            return 0.0
        early = statistics.median(self.samples_s[: n // 2])
        late = statistics.median(self.samples_s[n // 2 :])
        return abs(late - early) / early if early > 0 else math.inf

    def __str__(self) -> str:
        return (
            f"{_fmt_s(self.median_s)} median (p20 {_fmt_s(self.p20_s)}, p80 {_fmt_s(self.p80_s)}, "
            f"n={len(self.samples_s)}, {self.device})"
        )


def _quantile(samples: tuple[float, ...], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method)."""
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _fmt_s(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def _check_timing_arguments(warmup: object, repeats: object, device: str | None) -> str:
    checks.nonnegative_int(warmup, "warmup")
    checks.positive_int(repeats, "repeats")
    device = env.device() if device is None else device
    checks.choice(device, "device", ("cuda", "mps", "cpu"))
    if device not in ("cpu", env.device()):  # env.device() is the best one present
        raise ValueError(f"device={device!r}, but torch finds no {device} device on this "
                         f"machine; pass device=None for the one it has ({env.device()!r})")
    return device


def benchmark(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    repeats: int = 20,
    device: str | None = None,
    min_time_s: float = 0.0,
    flush_bytes: int = 0,
    clock: Clock | None = None,
) -> Timing:
    """Time `fn()` (no arguments): `warmup` untimed calls, then at least `repeats` timed ones.

    `device` defaults to `mlsys.env.device()`; on "cuda" each call is bracketed by CUDA events and
    the device is synchronized, elsewhere `clock` (default `time.perf_counter`) brackets a
    synchronized call. `min_time_s` keeps repeating until the timed calls add up to that long.
    `flush_bytes > 0` writes a buffer of that many bytes before every timed call, outside the
    timing (as `triton.testing.do_bench` does with the GPU's L2): pick it larger than the
    last-level cache, so each call starts with cold caches, as in a real step where the other
    layers' tensors have evicted this one's.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    device = _check_timing_arguments(warmup, repeats, device)
    checks.nonnegative(min_time_s, "min_time_s")
    flush = _flusher(checks.nonnegative_int(flush_bytes, "flush_bytes"), device)
    for _ in range(warmup):
        fn()
    _synchronize(device)

    samples: list[float] = []
    while len(samples) < repeats or sum(samples) < min_time_s:
        samples.append(_time_once(fn, device, clock or time.perf_counter, before=flush))
    return Timing(samples_s=tuple(samples), warmup=warmup, device=device, provenance=provenance())


def _flusher(n_bytes: int, device: str) -> Callable[[], Any] | None:
    """A call that overwrites `n_bytes` of memory on `device` (None for 0 bytes)."""
    if n_bytes == 0:
        return None
    buffer = torch.empty(n_bytes, dtype=torch.int8, device=device)
    return buffer.zero_


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None) -> Iterable[T]:
    """`iterable` with a tqdm progress bar on a terminal or with MLSYS_PROGRESS=1, else as is.

    Long sweeps show where they are; a notebook executed for the book keeps its output clean.
    """
    enabled = env.progress_enabled()
    if not enabled:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False)


def benchmark_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 2,
    repeats: int = 10,
    device: str | None = None,
    min_sample_s: float = 0.0,
    clock: Clock | None = None,
) -> dict[str, Timing]:
    """Time several functions round-robin: `repeats` rounds, each calling every function once.

    The order rotates from round to round, so no function always follows the same neighbour. A
    ceiling probe timed this way with the operations it is compared to sees the same moments of
    the machine's load: the comparison is fair even when the load changes during the run.
    With `min_sample_s`, a function faster than that is called several times per sample (as many
    as its last warm-up call says fit), so the timer's own jitter does not dominate tiny operations;
    the samples are always seconds per call.
    """
    if not fns or not all(callable(f) for f in fns.values()):
        raise TypeError("fns must be a non-empty mapping of names to callables")
    device = _check_timing_arguments(warmup, repeats, device)
    checks.nonnegative(min_sample_s, "min_sample_s")
    names = list(fns)
    calls = {}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        one = _time_once(fns[name], device, clock or time.perf_counter) if min_sample_s > 0 else 0.0
        calls[name] = max(1, math.ceil(min_sample_s / one)) if one > 0 else 1
    _synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], calls[name]
            run = fn if n == 1 else (lambda fn=fn, n=n: [fn() for _ in range(n)])
            samples[name].append(_time_once(run, device, clock or time.perf_counter) / n)
    stamp = provenance()
    return {n: Timing(tuple(samples[n]), warmup, device, provenance=stamp) for n in names}


@dataclass(frozen=True)
class Consistency:
    """What the consistency check said after the last attempt: no problems means the numbers
    hold."""

    problems: tuple[str, ...]
    attempts: int

    @property
    def ok(self) -> bool:
        return not self.problems


def noise_problems(
    timings: Mapping[str, Timing], *, max_spread: float = MAX_SPREAD, max_drift: float = MAX_DRIFT
) -> list[str]:
    """The timings whose spread (p80 / p20) or drift between halves exceeds the thresholds, as
    sentences."""
    problems = []
    for name, t in timings.items():
        if t.spread_ratio > max_spread:
            problems.append(f"{name}: p80 / p20 = {t.spread_ratio:.2f} (more than {max_spread:g})")
        if t.drift > max_drift:
            problems.append(f"{name}: moved by {t.drift:.0%} during the run "
                            f"(more than {max_drift:.0%})")
    return problems


def measure_consistently(
    fns: Mapping[str, Callable[[], Any]],
    check: Callable[[dict[str, Timing]], list[str]],
    *,
    attempts: int = 3,
    **timing_kwargs: Any,
) -> tuple[dict[str, Timing], Consistency]:
    """`benchmark_interleaved(fns)` until `check(timings)` finds no problem, at most `attempts`
    times.

    Returns the last timings and what `check` still found in them: a caller shows the numbers in any
    case, and its verdict only when `Consistency.ok`.
    """
    checks.positive_int(attempts, "attempts")
    used = 0
    while True:
        timings = benchmark_interleaved(fns, **timing_kwargs)
        problems, used = check(timings), used + 1
        if not problems or used == attempts:
            return timings, Consistency(tuple(problems), used)


def _time_once(
    fn: Callable[[], Any], device: str, clock: Clock, before: Callable[[], Any] | None = None
) -> float:
    """Seconds of one call of `fn` (after an untimed `before()`, e.g. a cache flush)."""
    if before is not None:
        before()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
    _synchronize(device)
    t0 = clock()
    fn()
    _synchronize(device)
    return clock() - t0


def achieved_flop_per_s(flops: float, seconds: float) -> float:
    """FLOP/s achieved when `flops` of work takes `seconds`."""
    return checks.nonnegative(flops, "flops") / checks.positive(seconds, "seconds")


def achieved_bytes_per_s(n_bytes: float, seconds: float) -> float:
    """Bytes/s achieved when `n_bytes` of traffic takes `seconds`."""
    return checks.nonnegative(n_bytes, "n_bytes") / checks.positive(seconds, "seconds")


# glibc <malloc.h> parameters and their defaults (mallopt(3)).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536


@contextlib.contextmanager
def kept_cpu_memory() -> Iterator[bool]:
    """Inside: glibc keeps freed memory mapped, as a GPU's caching allocator does; yields whether
    applied.

    PyTorch's CPU allocator (c10) takes its memory from glibc's malloc, which serves blocks above
    its mmap threshold (128 KiB at first, raised up to 32 MiB on 64-bit Linux as large blocks are
    freed) from a fresh mmap and unmaps them on free, so each fresh output of tens of MB is new
    memory the OS must map and zero page by page on first write, and a timing of `x * 2`
    measures page faults more than the kernel. Serving large blocks from the heap (M_MMAP_MAX = 0)
    and never trimming it (a large M_TRIM_THRESHOLD) removes that. Process-wide while active; the
    glibc defaults are restored on exit. Elsewhere (not Linux/glibc) nothing changes and it yields
    False.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        yield False
        return
    libc = ctypes.CDLL("libc.so.6")
    applied = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**30) == 1
    try:
        yield applied
    finally:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
