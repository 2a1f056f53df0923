"""Live and peak bytes of each phase of a step, read as it runs, over one or more recordings.

`meter(device)` gives the meter for the device: a `ProfilerMeter` on a CPU (the profiler's
allocator events, whose running sum is the live bytes at every moment; a `Timeline` per
recording, `mlsys.profiling.memory_timeline`) or a `CudaMeter` on a GPU (the caching allocator's
`memory_allocated` / `max_memory_allocated` around each phase, and its history when asked). Each
phase adds a row of the bytes live when it ends and the most live during it, counted from the
start of the recording. Used in: §sec-tensors-memory (`experiments.training_memory`),
§sec-profiling, the chapter 06 and 07 memory experiments.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from mlsys import checks, env
from mlsys.profiling.events import PhaseSpan
from mlsys.profiling.memory_timeline import (
    Timeline,
    build_timeline,
    from_profile,
    from_snapshot,
    profiler_events,
)
from mlsys.profiling.profiler import Profile


def _warm_cublas() -> None:
    """cuBLAS handles and workspaces are made by the first matmuls and then kept for good: make
    them before counting, so they do not land in the first phase measured."""
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.ones(64, 64, device="cuda", dtype=dtype, requires_grad=True)
        (x @ x).sum().backward()
    torch.cuda.synchronize()


class _Meter:
    """What both meters share: rows of live and peak bytes per phase, and timelines."""

    method = ""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._recordings: list[Any] = []
        self._labels: list[dict[str, Any]] | None = None  # the current recording's phases

    @property
    def timelines(self) -> list[Timeline]:
        """One `Timeline` per recording (CPU: always, read when first asked; GPU: with
        `history=True`)."""
        self._recordings = [from_profile(r, "cpu") if isinstance(r, Profile) else r
                            for r in self._recordings]
        return list(self._recordings)

    def _check(self, recording: bool) -> None:
        if recording and self._labels is not None:
            raise RuntimeError("recordings do not nest")
        if not recording and self._labels is None:
            raise RuntimeError("phase() runs inside meter.recording()")

    def _row(self, labels: dict[str, Any], name: str, live: int, peak: int) -> None:
        self.rows.append({**labels, "phase": name, "live_bytes": live, "peak_bytes": peak})


class ProfilerMeter(_Meter):
    """Live and peak bytes from the profiler's allocation (+) and free (-) events, whose running
    sum is the live bytes at every moment; each recording is one `Profile` (its `model`'s modules
    label the allocations of the timelines)."""

    method = "torch.profiler memory events (profile_memory=True), CPU allocator"

    def __init__(self, *, model: nn.Module | None = None):
        super().__init__()
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        self.model, self._profile = model, None

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self._check(recording=True)
        self._labels = []
        try:
            with Profile(device="cpu", model=self.model, record_memory=True) as prof:
                self._profile = prof
                yield
            events = [(t, b, a, "") for t, b, a, _ in profiler_events(prof, "cpu")]
            curve = build_timeline("cpu", "", events, prof.phase_spans())
            for labels, row in zip(self._labels, curve.phase_rows(), strict=True):
                self._row(labels, row["phase"], row["live_bytes"], row["peak_bytes"])
            self._recordings.append(prof)
        finally:
            self._labels, self._profile = None, None

    @contextlib.contextmanager
    def phase(self, name: str, **labels: Any) -> Iterator[None]:
        """A phase of the current recording; `labels` go into its row before "phase"."""
        self._check(recording=False)
        with self._profile.phase(name):
            self._labels.append(labels)
            yield


class CudaMeter(_Meter):
    """Live and peak bytes of the CUDA caching allocator around each phase
    (`memory_allocated`, `max_memory_allocated` after `reset_peak_memory_stats`); with `history`,
    the allocator's history too (a cost per allocation; `max_entries` bounds the events kept, and
    a recording that fills it raises rather than show a timeline with its start cut off)."""

    method = "torch.cuda.memory_allocated / max_memory_allocated"

    def __init__(self, *, history: bool = False, max_entries: int = 200_000):
        super().__init__()
        if not torch.cuda.is_available():
            raise ValueError("a CudaMeter needs a CUDA device; torch.cuda.is_available() is False")
        self.history = checks.choice(history, "history", (False, True))
        self.max_entries = checks.positive_int(max_entries, "max_entries")
        _warm_cublas()

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self._check(recording=True)
        torch.cuda.synchronize()
        self._labels, self._spans = [], []
        self._base, self._start_ns = torch.cuda.memory_allocated(), time.time_ns()
        if self.history:
            torch.cuda.memory._record_memory_history(max_entries=self.max_entries,
                                                     stacks="python", clear_history=True)
        try:
            yield
            torch.cuda.synchronize()
            if self.history:
                self._recordings.append(self._read_history())
        finally:
            if self.history:
                torch.cuda.memory._record_memory_history(enabled=None)
            self._labels = None

    def _read_history(self) -> Timeline:
        device = torch.cuda.current_device()
        snapshot = torch.cuda.memory._snapshot()
        if len(snapshot["device_traces"][device]) >= self.max_entries:
            raise RuntimeError(f"the allocator's history kept only its last {self.max_entries} "
                               "events: pass a larger max_entries")
        return from_snapshot(snapshot, self._spans, start_us=self._start_ns // 1000,
                             device_index=device, baseline_bytes=self._base)

    @contextlib.contextmanager
    def phase(self, name: str, **labels: Any) -> Iterator[None]:
        """A phase of the current recording; `labels` go into its row before "phase"."""
        self._check(recording=False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.time_ns()
        yield
        torch.cuda.synchronize()
        us = [(t - self._start_ns) // 1000 for t in (start, time.time_ns())]  # the trace's clock
        self._spans.append(PhaseSpan(name, us[0] * 1000, us[1] * 1000))
        self._row(labels, name, torch.cuda.memory_allocated() - self._base,
                  torch.cuda.max_memory_allocated() - self._base)


def meter(device: str | None = None, *, model: nn.Module | None = None,
          history: bool = False) -> ProfilerMeter | CudaMeter:
    """The meter for `device` ("cpu" or "cuda"; default `mlsys.env.device()`); `model` (CPU)
    names the modules in the timelines' labels, `history` (GPU) records timelines there too:

        m = meter()
        with m.recording():
            with m.phase("forward", step=1): ...

    Each phase adds {**labels, "phase", "live_bytes", "peak_bytes"} to `m.rows`: the bytes live
    when it ends and the most live during it, counted from the start of the recording."""
    device = checks.choice(env.device() if device is None else device, "device", ("cpu", "cuda"))
    return ProfilerMeter(model=model) if device == "cpu" else CudaMeter(history=history)
