"""Allocated bytes over time through named phases, and the largest allocations: what holds memory.

Two sources give the same `Timeline`:
- the profiler's allocator events (`Profile(record_memory=True)`, read by `from_profile`): every
  allocation (+) and free (-) with its time, address and the op that made it, whose surroundings
  (`Profile.where`) label it ("aten::mm in lm_head", "MmBackward0 in blocks.1.ffn.w2"). On a CPU
  this is the only source: the CPU build has no `torch.cuda.memory._record_memory_history`.
- on a GPU, the caching allocator's own history (`torch.cuda.memory._record_memory_history` then
  `_snapshot()`, read by `from_snapshot`): "alloc" and "free_completed" entries with the block size
  (rounded up to 512 bytes, as `memory_allocated()` counts), the address, the time in epoch
  microseconds and the Python frames; the label is the innermost frame outside torch.
Bytes count from the start of the recording (what existed before is `baseline_bytes`, known on a
GPU only). The meters that record them phase by phase are `mlsys.profiling.memory_meter`. `plot`
draws a timeline in the book's style. Used in: §sec-tensors-memory (`experiments.training_memory`),
§sec-profiling.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import checks
from mlsys.profiling.events import MODULE_PREFIX, NO_PHASE, PHASE_PREFIX, PhaseSpan
from mlsys.profiling.profiler import Profile


@dataclass(frozen=True)
class Allocation:
    """One allocation: its size, lifetime (ns from the recording's start) and what made it."""

    nbytes: int
    start_ns: int
    end_ns: int | None  # None: still live when the recording ended
    phase: str  # the phase it was made in, or NO_PHASE
    label: str  # the op and module (profiler) or the innermost user frame (GPU history)


@dataclass(frozen=True)
class Timeline:
    """Live bytes after every allocation and free, the phases, and every allocation."""

    device: str  # "cpu" or "cuda"
    source: str  # which record it was read from
    times_ns: tuple[int, ...]  # from the start of the recording, one per event
    allocated_bytes: tuple[int, ...]  # live after each event, counted from the recording's start
    phases: tuple[PhaseSpan, ...]
    allocations: tuple[Allocation, ...]
    baseline_bytes: int = 0  # allocated before the recording began (GPU; 0 where unknown)

    def live_at(self, t_ns: int) -> int:
        """Live bytes after the last event at or before `t_ns` (0 before the first)."""
        i = bisect.bisect_right(self.times_ns, t_ns)
        return self.allocated_bytes[i - 1] if i else 0

    def peak_between(self, start_ns: int, end_ns: int) -> int:
        """The most bytes live at any moment of [start_ns, end_ns]."""
        lo, hi = bisect.bisect_left(self.times_ns, start_ns), bisect.bisect_right(self.times_ns,
                                                                                  end_ns)
        return max([self.live_at(start_ns), *self.allocated_bytes[lo:hi]])

    def phase_rows(self) -> list[dict[str, Any]]:
        """Per phase occurrence: live bytes when it ends and the peak during it."""
        return [{"phase": p.name, "live_bytes": self.live_at(p.end_ns),
                 "peak_bytes": self.peak_between(p.start_ns, p.end_ns)} for p in self.phases]

    def largest(self, n: int = 5) -> list[Allocation]:
        """The `n` largest allocations, the largest first (the earlier of equal sizes first)."""
        checks.positive_int(n, "n")
        return sorted(self.allocations, key=lambda a: (-a.nbytes, a.start_ns))[:n]

    def peak(self) -> tuple[int, int]:
        """(time in ns, live bytes) of the first moment the most bytes are live ((0, 0) if no
        event)."""
        if not self.allocated_bytes:
            return 0, 0
        i = max(range(len(self.allocated_bytes)), key=self.allocated_bytes.__getitem__)
        return self.times_ns[i], self.allocated_bytes[i]

    def live_allocations(self, t_ns: int) -> list[Allocation]:
        """The allocations live just after `t_ns`: made at or before it, not yet freed."""
        return [a for a in self.allocations
                if a.start_ns <= t_ns and (a.end_ns is None or a.end_ns > t_ns)]

    def to_record(self, *, max_points: int = 2_000, top: int = 10) -> dict[str, Any]:
        """JSON-ready: the curve cut to at most about `max_points` events (each bucket keeps its
        highest and its last, so the peak and the level survive), the phases and the `top`
        largest allocations (`from_record` reads it back)."""
        checks.positive_ints(max_points=max_points, top=top)
        n = len(self.times_ns)
        width = max(1, -(-n // max_points))
        keep = set()
        for lo in range(0, n, width):
            hi = min(n, lo + width)
            keep |= {max(range(lo, hi), key=self.allocated_bytes.__getitem__), hi - 1}
        kept = sorted(keep)
        return {"device": self.device, "source": self.source, "baseline_bytes": self.baseline_bytes,
                "times_ns": [self.times_ns[i] for i in kept],
                "allocated_bytes": [self.allocated_bytes[i] for i in kept],
                "phases": [dataclasses.asdict(p) for p in self.phases],
                "allocations": [dataclasses.asdict(a) for a in self.largest(top)]
                if self.allocations else []}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Timeline:
        """The timeline `to_record` wrote (its curve cut, its largest allocations only)."""
        return cls(record["device"], record["source"], tuple(record["times_ns"]),
                   tuple(record["allocated_bytes"]),
                   tuple(PhaseSpan(**p) for p in record["phases"]),
                   tuple(Allocation(**a) for a in record["allocations"]),
                   record["baseline_bytes"])


def _phase_of(phases: Sequence[PhaseSpan], t_ns: int) -> str:
    i = bisect.bisect_right([p.start_ns for p in phases], t_ns) - 1
    return phases[i].name if i >= 0 and t_ns <= phases[i].end_ns else NO_PHASE


def build_timeline(device: str, source: str, events: list[tuple], phases: Sequence[PhaseSpan],
                   baseline_bytes: int = 0) -> Timeline:
    """`events`: (t_ns, signed bytes, address, label) in any order; frees are matched to the
    allocation at their address (a free of memory older than the recording has none)."""
    events = sorted(events, key=lambda e: (e[0], e[1]))
    open_, done = {}, []
    for t, nbytes, addr, label in events:
        if nbytes > 0:
            open_[addr] = (nbytes, t, label)
        elif addr in open_:
            size, start, made_by = open_.pop(addr)
            done.append(Allocation(size, start, t, _phase_of(phases, start), made_by))
    done += [Allocation(s, t, None, _phase_of(phases, t), lb) for s, t, lb in open_.values()]
    return Timeline(device, source, tuple(e[0] for e in events),
                    tuple(itertools.accumulate(e[1] for e in events)), tuple(phases),
                    tuple(sorted(done, key=lambda a: a.start_ns)), baseline_bytes)


# --- the two sources ---------------------------------------------------------------------------


def profiler_events(prof: Profile, device: str) -> list[tuple]:
    """(t_ns from the trace start, signed bytes, address, parent op node) of every allocator event
    on `device`, from the profiler's event tree (which keeps each allocation under its op)."""
    kineto = prof.raw.profiler.kineto_results
    start, out, stack = kineto.trace_start_ns(), [], list(kineto.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if str(node.tag).endswith("Allocation"):
            f = node.extra_fields
            if f.device.type == device:
                out.append((node.start_time_ns - start, f.alloc_size, f.ptr, node.parent))
    return out


_RANGES = (PHASE_PREFIX, MODULE_PREFIX, "Optimizer.")


def _label(prof: Profile, op) -> str:
    """"aten::mm in lm_head", "MmBackward0 in blocks.0.ffn.w2", "aten::mul_ in optimizer"."""
    if op is None:
        return "outside any op"
    w = prof.where(op.correlation_id)
    what = "" if op.name.startswith(_RANGES) else op.name  # a range is a where, not a what
    if w is None:
        return what or "outside any op"
    where = w.module or ("optimizer" if w.optimizer else None)
    return " in ".join(s for s in (w.node or what, where) if s) or "outside any op"


def from_profile(prof: Profile, device: str = "cpu") -> Timeline:
    """The timeline of a finished `Profile(record_memory=True)` on `device` ("cpu" or "cuda")."""
    if not isinstance(prof, Profile):
        raise TypeError(f"prof must be an mlsys.profiling.profiler.Profile, got "
                        f"{type(prof).__name__}")
    checks.choice(device, "device", ("cpu", "cuda"))
    if not prof.record_memory:
        raise ValueError("the Profile did not record memory: use Profile(record_memory=True)")
    events = [(t, b, addr, _label(prof, op)) for t, b, addr, op in profiler_events(prof, device)]
    return build_timeline(device, "torch.profiler allocator events", events, prof.phase_spans())


def _user_frame(frames: Sequence[dict]) -> str:
    """The innermost Python frame outside torch, as "file.py:line function"."""
    torch_dir = os.path.dirname(torch.__file__)
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and not name.startswith(torch_dir):
            return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    return "no user frame"


def from_snapshot(snapshot: dict, phases: Sequence[PhaseSpan], *, start_us: int,
                  device_index: int = 0, baseline_bytes: int = 0) -> Timeline:
    """The timeline in a `torch.cuda.memory._snapshot()` taken with the history recording since
    `start_us` (epoch microseconds, the trace's clock); `phases` in ns from `start_us`."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise TypeError("snapshot must be the dict of torch.cuda.memory._snapshot()")
    checks.nonnegative_int(device_index, "device_index")
    events = []
    for e in snapshot["device_traces"][device_index]:
        if e["action"] in ("alloc", "free_completed") and e["time_us"] >= start_us:
            sign = 1 if e["action"] == "alloc" else -1
            events.append(((e["time_us"] - start_us) * 1000, sign * e["size"], e["addr"],
                           _user_frame(e.get("frames", []))))
    return build_timeline("cuda", "torch.cuda.memory._snapshot history", events, phases,
                          baseline_bytes)


# --- the figure --------------------------------------------------------------------------------


def plot(timeline: Timeline, ax, *, top: int = 5, title: str | None = None) -> None:
    """Allocated MB against time (ms) with phases shaded and named, the peak marked, and the `top`
    largest allocations numbered where they start, their size and label in the legend."""
    from mlsys import plotting  # matplotlib: only when a page draws

    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    checks.nonnegative_int(top, "top")
    ms = [0.0, *(t / 1e6 for t in timeline.times_ns)]
    mb = [0.0, *(b / 1e6 for b in timeline.allocated_bytes)]
    ax.step(ms, mb, where="post", color=plotting.COLORS["measured"], lw=1.2)
    shades = {name: plotting.CYCLE[4 + i % 4] for i, name in
              enumerate(dict.fromkeys(p.name for p in timeline.phases))}
    for p in timeline.phases:
        ax.axvspan(p.start_ns / 1e6, p.end_ns / 1e6, color=shades[p.name], alpha=0.15, lw=0)
        ax.text((p.start_ns + p.end_ns) / 2e6, 0.98, p.name, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7, rotation=90)
    if len(mb) > 1:
        i = max(range(len(mb)), key=mb.__getitem__)
        ax.plot([ms[i]], [mb[i]], "v", color=plotting.COLORS["ceiling"], ms=6,
                label=f"peak: {mb[i]:.3g} MB")
    for n, a in enumerate(timeline.largest(top) if top and timeline.allocations else [], 1):
        x, y = a.start_ns / 1e6, timeline.live_at(a.start_ns) / 1e6
        ax.plot([x], [y], "o", ms=5, color=plotting.COLORS["predicted"],
                label=f"{n}: {a.nbytes / 1e6:.3g} MB, {a.label}")
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=8)
    plotting.finish(ax, title=title, xlabel="time (ms)", ylabel="allocated (MB)", legend=False)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
