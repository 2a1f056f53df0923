"""A profile's CPU events read once: each op's surroundings, and the rows of the tables.

torch.profiler records every op as an event with its parents (`cpu_parent`), its autograd node
(ranges "autograd::engine::evaluate_function: MmBackward0") and, on a GPU, the kernels it
launched. `Events` walks each op's parents once for the innermost module range
("module::blocks.0.attn_norm (RMSNorm)"), autograd node and optimizer call, links a backward node
to the module of its forward op through the sequence number, places the op in a phase by its
time (`PhaseSpan`), and sums the ops (CPU: self time) or kernels (GPU: device time) by name,
class (`mlsys.profiling.classes.classify`) and phase into `OpRow`s. Used in:
`mlsys.profiling.profiler`, `mlsys.profiling.memory_timeline`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mlsys.profiling.classes import classify

PHASE_PREFIX, MODULE_PREFIX = "phase::", "module::"
"""Names of the ranges `Profile` opens: "phase::forward", "module::lm_head (Linear)"."""
NO_PHASE = "(no phase)"
_NODE_PREFIX = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class OpRow:
    """One operator (CPU) or kernel (GPU) in one phase and class, summed over its calls."""

    name: str  # aten op or autograd node (CPU), kernel (GPU)
    op_class: str  # one of CLASSES
    phase: str  # the phase it ran (GPU: was launched) in, or NO_PHASE
    self_s: float  # self CPU time (CPU) or device time (GPU), seconds
    calls: int  # events (CPU, nested ones included) or kernel launches (GPU)


@dataclass(frozen=True)
class PhaseSpan:
    """One occurrence of a phase, in ns from the start of the profile."""

    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Where:
    """What surrounded an op: its phase, module, autograd node and whether the optimizer ran it."""

    phase: str
    module: str | None  # module path (the forward op's module, for a backward node)
    module_type: str | None
    node: str | None  # autograd node, e.g. "MmBackward0"
    optimizer: bool


class Events:
    """The profile's CPU events resolved once: each op's surroundings, and the rows."""

    def __init__(self, raw, modules: dict[str, tuple], spans: list[PhaseSpan], *, kernels: bool):
        events = [e for e in raw.events() if e.device_type == torch.autograd.DeviceType.CPU]
        self.by_id = {e.id: e for e in events}
        self._up = {id(e): _ancestors(e, modules) for e in events}
        self._forward = {}  # (thread, sequence number) -> the last forward op that held it
        for e in sorted(events, key=lambda e: e.time_range.start):
            if e.sequence_nr >= 0 and self._up[id(e)][1] is None and not e.is_user_annotation:
                self._forward[(e.thread, e.sequence_nr)] = e
        self._spans, self._starts = spans, [s.start_ns for s in spans]
        self.rows = op_rows(events, self.where, kernels=kernels)

    def where(self, e) -> Where:
        module, node_event, optimizer = self._up[id(e)]
        if module is None and node_event is not None:  # backward: the module of its forward op
            linked = self._forward.get((node_event.fwd_thread, node_event.sequence_nr))
            module = self._up[id(linked)][0] if linked is not None else None
        t_ns = e.time_range.start * 1e3
        i = bisect.bisect_right(self._starts, t_ns) - 1
        phase = self._spans[i].name if i >= 0 and t_ns <= self._spans[i].end_ns else NO_PHASE
        node = node_event.name[len(_NODE_PREFIX):] if node_event is not None else None
        return Where(phase, *(module or (None, None)), node, optimizer)


def _ancestors(e, modules: dict[str, tuple]) -> tuple[tuple | None, Any, bool]:
    """(innermost module (path, type), innermost autograd-node event, inside the optimizer's
    `step` or `zero_grad`)."""
    module = node = None
    optimizer = False
    while e is not None:
        if module is None and e.name in modules:
            module = modules[e.name]
        if node is None and e.name.startswith(_NODE_PREFIX):
            node = e
        optimizer = optimizer or e.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))
        e = e.cpu_parent
    return module, node, optimizer


def op_rows(events, where: Callable[[Any], Where], *, kernels: bool) -> list[OpRow]:
    """CPU: every op event's self time; GPU (`kernels`): every kernel's device time, classed by
    its own name or else as the op that launched it."""
    acc: dict[tuple[str, str, str], list] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.name == "[memory]" or (e.is_user_annotation and not kernels):
            continue
        w = where(e)
        name = "" if e.is_user_annotation else e.name  # a range: its surroundings decide
        op_class = classify(name, node=w.node, module=w.module_type, optimizer=w.optimizer)
        items = ([(k.name, k.duration, classify(k.name, optimizer=w.optimizer, fallback=op_class))
                  for k in e.kernels if k.name != e.name]  # not a range's copy on the GPU
                 if kernels else [(e.name, e.self_cpu_time_total, op_class)])
        for name, us, cls in items:
            cell = acc[(name, cls, w.phase)]
            cell[0] += us / 1e6
            cell[1] += 1
    rows = [OpRow(n, c, p, s, k) for (n, c, p), (s, k) in acc.items()]
    return sorted(rows, key=lambda r: -r.self_s)
