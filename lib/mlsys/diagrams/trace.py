"""A profiler trace on a time axis: the host's calls against the device's work, the gaps marked.

`Trace.from_profile` reads a finished `mlsys.profiling.profiler.Profile` (torch.profiler's events
with their parents): the **host lane** holds each top-level operator the program called (the
outermost op event, below the `Profile`'s own ranges: `aten::linear`, an autograd node of the
backward); the **device lane** holds, on a GPU, every kernel with its device time; on a CPU,
which has no device apart from itself, the time each op with a kernel of its own (one registered
for the CPU or as an explicit composite: `aten::addmm`, `aten::mul`; not a wrapper made of other
ops such as `aten::linear`) spends in its own body, outside the ops it calls. Its gaps are then
the time the thread spent in Python, in wrappers and the dispatcher, in the autograd engine and,
under the profiler, in the profiler's own bookkeeping. `gaps` are the
stretches of the window in which no device span runs: on a GPU, the device idles there, waiting
for the host to launch the next kernel (He, "Making Deep Learning Go Brrrr", 2022: the overhead
regime). `draw_trace` draws both lanes, hatches the gaps and labels the longest with their
lengths. Times in microseconds from the profile's start, drawn in ms from the window's start.
Used in: §sec-profiling (chapter 05).
"""

from __future__ import annotations

import functools
import math
from dataclasses import astuple, dataclass
from typing import Any

import torch
from matplotlib.patches import Patch, Rectangle

from mlsys import checks
from mlsys.book import num
from mlsys.plotting import COLORS, CYCLE, finish, subplots
from mlsys.profiling.events import MODULE_PREFIX, PHASE_PREFIX
from mlsys.profiling.profiler import Profile

LANES = ("host", "device")


@dataclass(frozen=True)
class Span:
    """One op or kernel: its name and its start and end (µs from the profile's start)."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Trace:
    """Two lanes of spans over one window, and what they were read from."""

    host: tuple[Span, ...]
    device: tuple[Span, ...]
    source: str  # what produced it, e.g. "torch.profiler, CPU, forward of `debug`"
    device_label: str = "device"  # what the device lane shows, e.g. "kernels (H100)"

    def __post_init__(self) -> None:
        for lane in LANES:
            spans = getattr(self, lane)
            if not spans:
                raise ValueError(f"the {lane} lane is empty: a trace needs at least one span "
                                 "in each lane")
            for s in spans:
                if not (math.isfinite(s.start_us) and math.isfinite(s.end_us)
                        and s.end_us >= s.start_us):
                    raise ValueError(f"{lane} span {s.name!r} must end at or after its start "
                                     f"(start_us={s.start_us}, end_us={s.end_us})")

    @property
    def window(self) -> tuple[float, float]:
        """(start, end) in µs: from the first span's start to the last span's end."""
        spans = self.host + self.device
        return min(s.start_us for s in spans), max(s.end_us for s in spans)

    def busy(self) -> list[tuple[float, float]]:
        """The device lane's spans merged where they overlap (µs), in time order."""
        merged: list[list[float]] = []
        for s in sorted(self.device, key=lambda s: s.start_us):
            if merged and s.start_us <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], s.end_us)
            else:
                merged.append([s.start_us, s.end_us])
        return [(a, b) for a, b in merged]

    def gaps(self) -> list[tuple[float, float]]:
        """The stretches of the window in which no device span runs (µs), in time order."""
        start, end = self.window
        out, t = [], start
        for a, b in self.busy():
            if a > t:
                out.append((t, a))
            t = max(t, b)
        if end > t:
            out.append((t, end))
        return out

    def idle_fraction(self) -> float:
        """The share of the window in the gaps."""
        start, end = self.window
        return sum(b - a for a, b in self.gaps()) / (end - start) if end > start else 0.0

    def to_record(self) -> dict[str, Any]:
        """JSON-ready (`from_record` reads it back): spans as [name, start_us, end_us]."""
        return {"host": [list(astuple(s)) for s in self.host],
                "device": [list(astuple(s)) for s in self.device],
                "source": self.source, "device_label": self.device_label}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Trace:
        return cls(tuple(Span(*s) for s in record["host"]),
                   tuple(Span(*s) for s in record["device"]), record["source"],
                   record["device_label"])

    @classmethod
    def from_profile(cls, prof: Profile, *, phase: str | None = None,
                     first_ops: int | None = None, source: str = "torch.profiler") -> Trace:
        """The lanes of a finished `Profile` (module docstring): ops of the first occurrence of
        `phase` (None: the whole profile), cut after the first `first_ops` host ops."""
        if not isinstance(prof, Profile):
            raise TypeError(f"prof must be an mlsys.profiling.profiler.Profile, "
                            f"got {type(prof).__name__}")
        if first_ops is not None:
            checks.positive_int(first_ops, "first_ops")
        lo, hi = -math.inf, math.inf
        if phase is not None:
            spans = [s for s in prof.phase_spans() if s.name == phase]
            if not spans:
                names = sorted({s.name for s in prof.phase_spans()})
                raise ValueError(f"phase={phase!r} is not a phase of this profile: {names}")
            lo, hi = spans[0].start_ns / 1e3, spans[0].end_ns / 1e3
        events = [e for e in prof.raw.events() if lo <= e.time_range.start <= hi]
        cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and _is_op(e)]
        host = sorted((e for e in cpu if _outermost(e)), key=lambda e: e.time_range.start)
        if first_ops is not None and len(host) > first_ops:
            hi = host[first_ops - 1].time_range.end
            host = host[:first_ops]
        if prof.device == "cuda":
            device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                      and _is_op(e)]  # kernels, copies and sets; not the ranges' GPU copies
            spans = [_span(e) for e in device if e.time_range.start <= hi]
            label = "kernels"
        else:
            spans = [p for e in cpu if _has_kernel(e.name) and e.time_range.start <= hi
                     for p in _own_time(e)]
            label = "ops' own kernels (CPU)"
        return cls(tuple(_span(e) for e in host), tuple(sorted(spans, key=lambda s: s.start_us)),
                   source, label)


def _is_op(e) -> bool:
    """An operator or autograd node, not a range (`Profile`'s phases and modules, the
    optimizer's `record_function`) or a memory event."""
    return not e.is_user_annotation and e.name != "[memory]" and not e.name.startswith(
        (PHASE_PREFIX, MODULE_PREFIX, "Optimizer."))


def _outermost(e) -> bool:
    parent = e.cpu_parent
    while parent is not None:
        if _is_op(parent):
            return False
        parent = parent.cpu_parent
    return True


def _span(e) -> Span:
    return Span(e.name, float(e.time_range.start), float(e.time_range.end))


def _own_time(e) -> list[Span]:
    """The stretches of `e`'s span outside its children's spans: its own body."""
    out, t = [], float(e.time_range.start)
    for c in sorted(e.cpu_children, key=lambda c: c.time_range.start):
        if c.time_range.start > t:
            out.append(Span(e.name, t, float(c.time_range.start)))
        t = max(t, float(c.time_range.end))
    if e.time_range.end > t:
        out.append(Span(e.name, t, float(e.time_range.end)))
    return out


@functools.cache
def _has_kernel(name: str) -> bool:
    """An aten op with a kernel of its own in some overload: registered for the CPU or as an
    explicit composite (which runs its own code); False for wrappers, autograd nodes, unknown."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None) if name.startswith(
        "aten::") else None
    if packet is None:
        return False
    for overload in packet.overloads():
        if overload == "out" or overload.endswith("_out"):  # an `out=` variant: a wrapper too
            continue
        full = name if overload == "default" else f"{name}.{overload}"
        for key in ("CPU", "CompositeExplicitAutograd"):
            try:
                if torch._C._dispatch_has_kernel_for_dispatch_key(full, key):
                    return True
            except RuntimeError:  # an overload the dispatcher does not know under that name
                pass
    return False


def draw_trace(trace: Trace, *, label_gaps: int = 3, title: str | None = None, ax=None):
    """The two lanes on a time axis (ms from the window's start): one bar per host op and per
    device span, each gap of the device lane hatched, the `label_gaps` longest labelled with their
    length, and the idle share in the title. Returns the figure."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a Trace, got {type(trace).__name__}")
    checks.nonnegative_int(label_gaps, "label_gaps")
    if ax is None:
        _, ax = subplots(width=9.0, height=2.6)
    t0, t1 = trace.window
    ms = 1e-3  # µs to ms

    def bar(y, a, b, gid, **style):
        ax.add_patch(Rectangle(((a - t0) * ms, y - 0.3), (b - a) * ms, 0.6, gid=gid, **style))

    for i, s in enumerate(trace.host):
        bar(1, s.start_us, s.end_us, f"host {i}", facecolor=CYCLE[5], edgecolor="white", lw=0.3)
    for i, s in enumerate(trace.device):
        bar(0, s.start_us, s.end_us, f"device {i}", facecolor=CYCLE[0], edgecolor="none")
    gaps = trace.gaps()
    for i, (a, b) in enumerate(gaps):
        bar(0, a, b, f"gap {i}", fill=False, hatch="////", edgecolor=COLORS["predicted"], lw=0)
    longest = sorted(gaps, key=lambda g: g[0] - g[1])[:label_gaps]
    for k, (a, b) in enumerate(sorted(longest)):
        ax.annotate(f"{num(b - a, 2)} µs", xy=((a + b) / 2 * ms - t0 * ms, -0.3),
                    xytext=((a + b) / 2 * ms - t0 * ms, -0.75 - 0.32 * (k % 2)), ha="center",
                    va="top", fontsize=7, color=COLORS["predicted"],
                    arrowprops={"arrowstyle": "-", "color": COLORS["predicted"], "lw": 0.6})
    ax.set_xlim(0, (t1 - t0) * ms)
    ax.set_ylim(-1.5, 1.5)
    ax.set_yticks([0, 1], [trace.device_label.split(" (")[0], "host: ops called"])
    ax.grid(False, axis="y")
    handles = [Patch(facecolor=CYCLE[5], label="host: a top-level op"),
               Patch(facecolor=CYCLE[0], label=trace.device_label),
               Patch(fill=False, hatch="////", edgecolor=COLORS["predicted"],
                     label=f"gap: idle {trace.idle_fraction():.0%} of the window")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3,
              frameon=False, fontsize=8)
    finish(ax, xlabel=f"ms from the window's start ({trace.source})", legend=False,
           title=title)
    return ax.figure
