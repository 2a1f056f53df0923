"""Where a training step's time goes: torch.profiler tables by phase and by class of operation.

`Profile` wraps `torch.profiler.profile` around a region split into named phases
(`with prof.phase("forward"): ...`). Each phase is a `record_function` range and, on a GPU, an NVTX
range of the same name, so Nsight Systems shows the phases the tables use. Given the `model`, every
module's forward is a range too ("module::blocks.0.attn_norm (RMSNorm)"). Afterwards `ops()` lists
each operator (CPU: self CPU time of aten ops and autograd nodes) or kernel (GPU: device time,
attributed to the op that launched it) with its phase and class; `classes()` gives every class's
share of time per phase and overall. Time spent outside every op (Python, the ranges themselves)
is reported per phase by `phases()`, not spread over the classes.

The class of each op (`CLASSES`, the rules: `mlsys.profiling.classes`) is read from its name, its
autograd node and its module (`mlsys.profiling.events`). On a GPU a kernel with a rule of its own
keeps it (a copy launched by a linear layer under autocast is "copy/cast"); the others take the
launching op's class. There the backward's kernels are launched from autograd's device thread,
outside the main thread's NVTX range in Nsight; the tables place every op in a phase by its time.
`mlsys.accounting.flops_by_class.class_flops` maps the model's FLOPs onto the same classes, so
`class_table` can set FLOP share beside time share. The profiler's own cost:
`mlsys.profiling.overhead`. Used in: §sec-profiling (chapter 05),
`mlsys.profiling.memory_timeline`.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from mlsys import checks, env
from mlsys.book import Table
from mlsys.profiling.classes import CLASSES
from mlsys.profiling.events import (
    MODULE_PREFIX,
    NO_PHASE,
    PHASE_PREFIX,
    Events,
    OpRow,
    PhaseSpan,
    Where,
)

# --- ranges ------------------------------------------------------------------------------------


@contextlib.contextmanager
def module_ranges(model: nn.Module, *, nvtx: bool = False) -> Iterator[dict[str, tuple]]:
    """Every module's forward as a range "module::<path> (<Type>)" (and an NVTX range with `nvtx`);
    yields {range name: (path, type name)}. Hooks are removed on exit."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names, stack, handles = {}, [], []
    for path, module in model.named_modules():
        name = f"{MODULE_PREFIX}{path or 'model'} ({type(module).__name__})"
        names[name] = (path or "model", type(module).__name__)

        def pre(_m, _args, name=name):
            stack.append(torch.profiler.record_function(name).__enter__())
            if nvtx:
                torch.cuda.nvtx.range_push(name)

        def post(_m, _args, _out):
            if nvtx:
                torch.cuda.nvtx.range_pop()
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre),
                    module.register_forward_hook(post, always_call=True)]
    try:
        yield names
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """KINETO_LOG_LEVEL=6 while the profiler runs, then restored: it silences kineto's
    "profiler_start"/"profiler_stop" lines on stderr. Kineto reads the level once, when the first
    profiler of the process starts, so one started earlier without it keeps printing."""
    old = os.environ.get("KINETO_LOG_LEVEL")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)


# --- the profile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassShare:
    """One class's time in one phase ("all": the whole profile)."""

    phase: str
    op_class: str
    self_s: float
    share: float  # of the phase's op (or kernel) time; the classes of a phase sum to 1
    calls: int


@dataclass(frozen=True)
class PhaseTime:
    """A phase's wall time (its ranges, summed over its occurrences) and the time in ops."""

    phase: str
    wall_s: float
    op_s: float  # CPU: self time of ops; GPU: kernel time
    occurrences: int

    @property
    def outside_ops_s(self) -> float:
        """Wall time not in any op (CPU: Python and framework overhead between ops)."""
        return self.wall_s - self.op_s


class Profile:
    """`with Profile(model=model) as prof:` then `with prof.phase("forward"): ...`; read the
    tables after the block. `device` defaults to `mlsys.env.device()` ("cpu" or "cuda");
    `record_memory` adds the allocator's events (`mlsys.profiling.memory_timeline.from_profile`)."""

    def __init__(self, *, device: str | None = None, model: nn.Module | None = None,
                 record_memory: bool = False):
        self.device = checks.choice(env.device() if device is None else device, "device",
                                    ("cpu", "cuda"))
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch.cuda.is_available() is False")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        self.record_memory = checks.choice(record_memory, "record_memory", (False, True))
        self.model, self.raw, self.modules = model, None, {}
        self._stack, self._open, self._done = contextlib.ExitStack(), None, False
        self._parsed: Events | None = None

    def __enter__(self) -> Profile:
        if self.raw is not None:
            raise RuntimeError("a Profile records once; make a new one")
        cuda = self.device == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.raw = torch.profiler.profile(activities=activities, profile_memory=self.record_memory)
        self._stack.enter_context(_quiet_kineto())
        with warnings.catch_warnings():
            # torch 2.11 warns "Profiler clears events at the end of each cycle" when any profiler
            # starts (it checks after creating one); torch 2.13 only on a second cycle. One here.
            warnings.filterwarnings("ignore", "Warning: Profiler clears events", UserWarning)
            self._stack.enter_context(self.raw)
        if self.model is not None:
            self.modules = self._stack.enter_context(module_ranges(self.model, nvtx=cuda))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._done = True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named phase (ranges "phase::<name>"); phases do not nest and may repeat. On a GPU
        the device is synchronized at both ends, so the range's wall time includes its kernels."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"phase name must be a non-empty string, got {name!r}")
        if self.raw is None or self._done:
            raise RuntimeError("phase() runs inside the `with Profile(...)` block")
        if self._open is not None:
            raise ValueError(f"phase {name!r} opened inside phase {self._open!r}: "
                             "phases do not nest")
        cuda, self._open = self.device == "cuda", name
        try:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(PHASE_PREFIX + name)
            with torch.profiler.record_function(PHASE_PREFIX + name):
                yield
                if cuda:
                    torch.cuda.synchronize()
        finally:
            if cuda:
                torch.cuda.nvtx.range_pop()
            self._open = None

    # --- reading the events ------------------------------------------------------------------

    def _results(self) -> Events:
        if not self._done:
            raise RuntimeError("results are ready after the `with Profile(...)` block ends")
        if self._parsed is None:
            self._parsed = Events(self.raw, self.modules, self.phase_spans(),
                                  kernels=self.device == "cuda")
        return self._parsed

    def phase_spans(self) -> list[PhaseSpan]:
        """Every phase occurrence in time order (ns from the profile's start)."""
        if not self._done:
            raise RuntimeError("results are ready after the `with Profile(...)` block ends")
        kineto = self.raw.profiler.kineto_results
        start = kineto.trace_start_ns()  # GPU copies of the ranges (device CUDA) left out:
        spans = [PhaseSpan(e.name()[len(PHASE_PREFIX):], e.start_ns() - start, e.end_ns() - start)
                 for e in kineto.events() if e.name().startswith(PHASE_PREFIX)
                 and e.device_type() == torch.autograd.DeviceType.CPU]
        return sorted(spans, key=lambda s: s.start_ns)

    def where(self, correlation_id: int) -> Where | None:
        """The surroundings of the CPU op with this correlation id (None if none recorded)."""
        event = self._results().by_id.get(correlation_id)
        return None if event is None else self._results().where(event)

    def ops(self) -> list[OpRow]:
        """Operators (CPU) or kernels (GPU) by phase, class and name, the slowest first."""
        return self._results().rows

    def phases(self) -> list[PhaseTime]:
        """Wall and op time of each phase, in order of first occurrence (NO_PHASE last)."""
        op_s, wall, count = defaultdict(float), defaultdict(float), defaultdict(int)
        for r in self.ops():
            op_s[r.phase] += r.self_s
        for s in self.phase_spans():
            wall[s.name] += (s.end_ns - s.start_ns) / 1e9
            count[s.name] += 1
        names = list(count) + ([NO_PHASE] if NO_PHASE in op_s else [])
        return [PhaseTime(p, wall[p], op_s[p], count[p]) for p in names]

    def classes(self) -> list[ClassShare]:
        """Every class's time share and calls per phase, then overall ("all")."""
        rows = self.ops()
        out = []
        for phase in [p.phase for p in self.phases()] + ["all"]:
            mine = [r for r in rows if phase in ("all", r.phase)]
            total = sum(r.self_s for r in mine)
            for cls in CLASSES:
                of = [r for r in mine if r.op_class == cls]
                s = sum(r.self_s for r in of)
                out.append(ClassShare(phase, cls, s, s / total if total else 0.0,
                                      sum(r.calls for r in of)))
        return out

    def op_table(self, top: int = 12) -> Table:
        """The `top` slowest ops (CPU) or kernels (GPU): `op_table(self.ops(), ...)`."""
        return op_table(self.ops(), top=top, kernels=self.device == "cuda")

    def class_table(self, flops: dict[str, float] | None = None) -> Table:
        """Time share of each class per phase and overall: `class_table(self.classes(), flops)`."""
        return class_table(self.classes(), flops)


# --- tables (of a live profile or of recorded rows) ----------------------------------------------


def shares(values: dict[str, float]) -> dict[str, float]:
    """Each value over their sum (all 0 when the sum is 0)."""
    total = sum(values.values())
    return {k: (v / total if total else 0.0) for k, v in values.items()}


def op_table(rows: list[OpRow], *, top: int = 12, kernels: bool = False) -> Table:
    """The `top` slowest rows: name, class, phase, self time (ms), calls, share of the total."""
    checks.positive_int(top, "top")
    rows = sorted(rows, key=lambda r: -r.self_s)
    total = sum(r.self_s for r in rows) or 1.0
    return Table(["kernel" if kernels else "op", "class", "phase", "self (ms)", "calls", "share"],
                 [[_short(r.name), r.op_class, r.phase, f"{r.self_s * 1e3:.3f}", r.calls,
                   f"{r.self_s / total:.1%}"] for r in rows[:top]])


def class_table(shares_: list[ClassShare], flops: dict[str, float] | None = None) -> Table:
    """Time share of each class per phase and overall ("all"), its calls and, given `flops` (e.g.
    `flops_by_class.class_flops(..., training=True)`), its FLOP share beside. Classes never seen
    are left out."""
    if flops is not None and not set(flops) <= set(CLASSES):
        raise ValueError(f"flops has keys that are not classes: "
                         f"{sorted(set(flops) - set(CLASSES))}; classes: {CLASSES}")
    phases = list(dict.fromkeys(s.phase for s in shares_))
    if "all" not in phases:
        raise ValueError("shares_ must include the overall rows (phase 'all'), as "
                         "Profile.classes() returns them")
    flop_share = shares(flops) if flops is not None else {}
    body = []
    for cls in CLASSES:
        row = {s.phase: s for s in shares_ if s.op_class == cls}
        if not row or (row["all"].calls == 0 and not flop_share.get(cls)):
            continue
        cells = [f"{row[p].share:.1%}" for p in phases] + [row["all"].calls]
        body.append([cls, *cells] + ([f"{flop_share.get(cls, 0.0):.2%}"] if flops else []))
    header = ["class", *(f"{p}: time" for p in phases), "calls"]
    return Table(header + (["FLOPs"] if flops else []), body)


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
