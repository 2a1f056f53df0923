"""The profiler's own cost: the same callable timed without and with a `Profile` running.

Recording every op costs time per op, so a profiled step is slower than a plain one, and the more
so the smaller its ops. `profiler_overhead` times both with `mlsys.bench.benchmark`, alternately,
so a drifting machine affects both. Used in: §sec-profiling (chapter 05),
`mlsys.experiments.step_profile`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from mlsys import bench, checks
from mlsys.profiling.profiler import Profile


@dataclass(frozen=True)
class Overhead:
    """The same callable timed without and with the profiler running (`ratio` = with / without)."""

    plain: bench.Timing
    profiled: bench.Timing

    @property
    def ratio(self) -> float:
        return self.profiled.median_s / self.plain.median_s


def profiler_overhead(fn: Callable[[], Any], *, device: str | None = None,
                      model: nn.Module | None = None, record_memory: bool = False,
                      warmup: int = 2, repeats: int = 10, rounds: int = 2) -> Overhead:
    """Time `fn` with `mlsys.bench.benchmark`, alternately plain and inside a `Profile` (`rounds`
    times each, so a drifting machine affects both); the profiler's start, stop and parsing are
    outside the timed calls: what remains is its cost per op."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    checks.positive_ints(repeats=repeats, rounds=rounds)
    checks.nonnegative_int(warmup, "warmup")
    plain, profiled = [], []
    for _ in range(rounds):
        plain.append(bench.benchmark(fn, warmup=warmup, repeats=repeats, device=device))
        with Profile(device=device, model=model, record_memory=record_memory):
            profiled.append(bench.benchmark(fn, warmup=warmup, repeats=repeats, device=device))

    def merged(ts: list[bench.Timing]) -> bench.Timing:
        samples = tuple(s for t in ts for s in t.samples_s)
        return bench.Timing(samples, warmup, ts[0].device, provenance=ts[0].provenance)

    return Overhead(merged(plain), merged(profiled))
