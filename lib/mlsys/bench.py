"""Timing that can be trusted: warm-up, synchronization, many repeats, median and spread, provenance.

On a GPU, kernel launches are asynchronous: a timer around `fn()` measures the launch, not the work.
`benchmark` synchronizes and times each repeat with CUDA events there, and with `time.perf_counter`
on CPU. Warm-up calls (compilation, autotuning, caches) are excluded explicitly. The median is
reported with the 20th and 80th percentiles, never a lone mean.

Every `Timing` carries `provenance()`: device, versions, date and git commit, so a number printed in
the book or written under `results/` says what produced it. Used in: every measuring chapter.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlsys import env


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
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def benchmark(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    repeats: int = 20,
    device: str | None = None,
    min_time_s: float = 0.0,
) -> Timing:
    """Time `fn()` (no arguments): `warmup` untimed calls, then at least `repeats` timed ones.

    `device` defaults to `mlsys.env.device()`; on "cuda" each call is bracketed by CUDA events and
    the device is synchronized, elsewhere `time.perf_counter` brackets a synchronized call.
    `min_time_s` keeps repeating until the timed calls add up to at least that long.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if min_time_s < 0:
        raise ValueError(f"min_time_s must be >= 0, got {min_time_s}")
    device = env.device() if device is None else device
    if device not in ("cuda", "mps", "cpu"):
        raise ValueError(f"device must be 'cuda', 'mps' or 'cpu', got {device!r}")

    for _ in range(warmup):
        fn()
    _synchronize(device)

    samples: list[float] = []
    while len(samples) < repeats or sum(samples) < min_time_s:
        samples.append(_time_once(fn, device))
    return Timing(samples_s=tuple(samples), warmup=warmup, device=device, provenance=provenance())


def _time_once(fn: Callable[[], Any], device: str) -> float:
    if device == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
    t0 = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - t0


def git_commit(repo: Path | None = None) -> str:
    """Short commit hash of the checkout (with "+dirty" for uncommitted changes), or "unknown"."""
    cwd = repo or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """What produced a measurement: device, versions, profile, date (UTC), commit and command line."""
    record: dict[str, Any] = {
        "device": env.device_name(),
        "device_type": env.device(),
        "profile": env.profile(),
        **{f"{k}_version": v for k, v in env.versions().items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": shlex.join(sys.argv),
    }
    if env.device() == "cuda":
        import torch

        record["driver_cuda"] = torch.version.cuda
        record["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return record


def achieved_flop_per_s(flops: float, seconds: float) -> float:
    """FLOP/s achieved when `flops` of work takes `seconds`."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return flops / seconds


def achieved_bytes_per_s(n_bytes: float, seconds: float) -> float:
    """Bytes/s achieved when `n_bytes` of traffic takes `seconds`."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return n_bytes / seconds


# glibc <malloc.h> parameters and their defaults (mallopt(3)).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536


@contextlib.contextmanager
def kept_cpu_memory() -> Iterator[bool]:
    """Inside: glibc keeps freed memory mapped, as a GPU's caching allocator does; yields whether applied.

    PyTorch's CPU allocator returns large freed blocks to the OS, so each fresh output of tens of MB is
    new memory the OS must map and zero page by page on first write, and a timing of `x * 2` measures
    page faults more than the kernel. Serving large blocks from the heap (M_MMAP_MAX = 0) and never
    trimming it (a large M_TRIM_THRESHOLD) removes that. Process-wide while active; the glibc defaults
    are restored on exit. Elsewhere (not Linux/glibc) nothing changes and it yields False.
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
