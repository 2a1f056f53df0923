"""A training step's memory over time: parameters, optimizer state, gradients and activations.

Five parts, stacked in this order (`PARTS`):
- **parameters** and **optimizer state** are resident: allocated before the step, constant through
  it (the weights, and AdamW's two moments once its first step made them);
- **gradients**: tensors the backward makes that are still live when it ends (each parameter's
  gradient), freed by `zero_grad(set_to_none=True)` at the end of the optimizer phase;
- **activations**: tensors the forward makes that are still live when it ends (what autograd
  saved for the backward, and the loss), freed one by one during the backward;
- **temporaries**: everything else (a forward op's scratch freed within the forward, the
  backward's intermediate gradients, the optimizer's scratch).

`measured` sorts every allocation of a `mlsys.profiling.memory_timeline.Timeline` (the whole
recording, not a `to_record` cut) into these parts by when it was made and when it was freed
(`origin`); `predicted` draws the napkin's version from the byte counts of `mlsys.accounting`
(the recipe's bytes per parameter, `activations.saved_bytes`): activations grow linearly over the
forward and shrink linearly over the backward while the gradients grow, so the predicted peak is
resident + max(activations, gradients), not the "16 B/param + activations" that counts both in
full. `draw_step_memory` draws one or more of them side by side on one byte scale, phases shaded.
Bytes; times in ns from the step's start (drawn in ms, or as phase fractions for a prediction
without measured phases). Used in: §sec-profiling (chapter 05).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from matplotlib.patches import Patch

from mlsys import checks
from mlsys.accounting import memory
from mlsys.book import num
from mlsys.plotting import COLORS, CYCLE, finish, subplots
from mlsys.profiling.events import PhaseSpan
from mlsys.profiling.memory_timeline import Allocation, Timeline

PARTS = ("parameters", "optimizer state", "gradients", "activations", "temporaries")
PHASES = ("forward", "backward", "optimizer")
_COLORS = dict(zip(PARTS, (CYCLE[0], CYCLE[5], CYCLE[2], CYCLE[1], COLORS["muted"]),
                   strict=True))


@dataclass(frozen=True)
class StepMemory:
    """Live bytes by part at each time of one step, its phases, and what it was read from."""

    times_ns: tuple[int, ...]
    parts: dict[str, tuple[int, ...]]  # every name of PARTS, one value per time
    phases: tuple[PhaseSpan, ...]
    source: str  # e.g. "measured: torch.profiler allocator events, cpu"
    kind: str = "measured"  # or "predicted": drawn as the allocator's steps, or as lines
    xlabel: str = "ms from the step's start"

    def __post_init__(self) -> None:
        if set(self.parts) != set(PARTS):
            raise ValueError(f"parts must have exactly the keys {PARTS}, got {tuple(self.parts)}")
        n = len(self.times_ns)
        if n == 0 or any(len(v) != n for v in self.parts.values()):
            raise ValueError(f"every part needs one value per time ({n} times), got "
                             f"{ {k: len(v) for k, v in self.parts.items()} }")
        if list(self.times_ns) != sorted(self.times_ns):
            raise ValueError("times_ns must be in increasing order")
        checks.choice(self.kind, "kind", ("measured", "predicted"))

    def total(self) -> tuple[int, ...]:
        """Live bytes of all parts together, at each time."""
        return tuple(sum(col) for col in zip(*self.parts.values(), strict=True))

    def peak(self) -> tuple[int, dict[str, int]]:
        """(time of the first highest total, the parts then)."""
        totals = self.total()
        i = max(range(len(totals)), key=totals.__getitem__)
        return self.times_ns[i], {k: v[i] for k, v in self.parts.items()}

    def to_record(self) -> dict[str, Any]:
        """JSON-ready (`from_record` reads it back)."""
        return {"times_ns": list(self.times_ns), "parts": {k: list(v) for k, v in
                                                           self.parts.items()},
                "phases": [asdict(p) for p in self.phases], "source": self.source,
                "kind": self.kind, "xlabel": self.xlabel}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StepMemory:
        return cls(tuple(record["times_ns"]), {k: tuple(v) for k, v in record["parts"].items()},
                   tuple(PhaseSpan(**p) for p in record["phases"]), record["source"],
                   record["kind"], record["xlabel"])


def _phase_end(phases: Sequence[PhaseSpan], name: str) -> int:
    ends = [p.end_ns for p in phases if p.name == name]
    if not ends:
        raise ValueError(f"the step must have a {name!r} phase; its phases are "
                         f"{[p.name for p in phases]}")
    return ends[0]


def origin(allocation: Allocation, *, forward_end_ns: int, backward_end_ns: int) -> str:
    """"activations", "gradients" or "temporaries" (the module docstring's rules)."""
    def outlives(t_ns: int) -> bool:
        return allocation.end_ns is None or allocation.end_ns > t_ns

    if allocation.phase == "forward" and outlives(forward_end_ns):
        return "activations"
    if allocation.phase == "backward" and outlives(backward_end_ns):
        return "gradients"
    return "temporaries"


def measured(timeline: Timeline, *, param_bytes: int, optimizer_bytes: int,
             max_points: int = 800) -> StepMemory:
    """The parts over a recorded step: each allocation of `timeline` by `origin`, on top of the
    resident `param_bytes` and `optimizer_bytes` (read from the tensors, before the step). Keeps
    at most about `max_points` times (each bucket keeps its highest total and its last time)."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    checks.nonnegative_int(param_bytes, "param_bytes")
    checks.nonnegative_int(optimizer_bytes, "optimizer_bytes")
    checks.positive_int(max_points, "max_points")
    ends = {"forward_end_ns": _phase_end(timeline.phases, "forward"),
            "backward_end_ns": _phase_end(timeline.phases, "backward")}
    moves = []  # (time, part index, signed bytes)
    for a in timeline.allocations:
        k = PARTS.index(origin(a, **ends))
        moves.append((a.start_ns, k, a.nbytes))
        if a.end_ns is not None:
            moves.append((a.end_ns, k, -a.nbytes))
    moves.sort(key=lambda m: (m[0], m[2]))
    live = [param_bytes, optimizer_bytes, 0, 0, 0]
    times, rows = [0], [tuple(live)]
    for t, k, nbytes in moves:
        live[k] += nbytes
        times.append(t)
        rows.append(tuple(live))
    width = max(1, -(-len(times) // max_points))
    keep = sorted({0} | {i for lo in range(0, len(times), width) for i in (
        max(range(lo, min(len(times), lo + width)), key=lambda j: sum(rows[j])),
        min(len(times), lo + width) - 1)})
    return StepMemory(tuple(times[i] for i in keep),
                      {p: tuple(rows[i][j] for i in keep) for j, p in enumerate(PARTS)},
                      tuple(timeline.phases), f"measured: {timeline.source}, {timeline.device}")


def predicted(*, n_params: int, recipe: str, activation_bytes: int,
              phases: Sequence[PhaseSpan] | None = None) -> StepMemory:
    """The napkin's step (module docstring) for `n_params` under `recipe` (of
    `accounting.memory.RECIPES`) with `activation_bytes` saved by the forward, on the times of
    `phases` (default: nominal times, forward 1, backward 2 (twice its FLOPs), optimizer 1)."""
    r = memory.recipe(recipe)
    n = checks.nonnegative_int(n_params, "n_params")
    act = checks.nonnegative_int(activation_bytes, "activation_bytes")
    xlabel = "ms from the step's start"
    if phases is None:
        phases = [PhaseSpan(name, a * 10**6, b * 10**6) for name, a, b in
                  zip(PHASES, (0, 1, 3), (1, 3, 4), strict=True)]
        xlabel = "nominal time: forward 1, backward 2, optimizer 1"
    span = {p: [s for s in phases if s.name == p][:1] for p in PHASES}
    missing = [p for p in PHASES if not span[p]]
    if missing:
        raise ValueError(f"phases must include {PHASES}; missing {missing}")
    (f,), (b,), (o,) = span["forward"], span["backward"], span["optimizer"]
    grads = n * r.grad_bytes
    # (time, activations, gradients): linear between these corners, freed at the optimizer's end
    corners = [(f.start_ns, 0, 0), (f.end_ns, act, 0), (b.start_ns, act, 0), (b.end_ns, 0, grads),
               (o.start_ns, 0, grads), (o.end_ns, 0, grads), (o.end_ns, 0, 0)]
    resident = (n * (r.weight_bytes + r.master_bytes), n * r.optimizer_bytes)
    return StepMemory(tuple(c[0] for c in corners),
                      {"parameters": (resident[0],) * 7, "optimizer state": (resident[1],) * 7,
                       "gradients": tuple(c[2] for c in corners),
                       "activations": tuple(c[1] for c in corners), "temporaries": (0,) * 7},
                      tuple(phases), f"predicted: {recipe}, {num(n / 1e6)}M parameters",
                      "predicted", xlabel)


def draw_step_memory(*steps: StepMemory, titles: Sequence[str] | None = None,
                     napkin_bytes: float | None = None, axes=None):
    """Each step's parts stacked over time (MB), one panel per step on one byte scale, phases
    shaded and named, the peak marked with its parts in MB; a measured step is drawn as steps
    (the allocator's curve), a predicted one as lines. `napkin_bytes` (e.g. 16 B/param + saved
    activations) is a dashed line. Returns the figure."""
    if not steps or not all(isinstance(s, StepMemory) for s in steps):
        raise TypeError("draw_step_memory takes one or more StepMemory (measured or predicted)")
    if titles is not None and len(titles) != len(steps):
        raise ValueError(f"titles must give one title per step ({len(steps)}), "
                         f"got {len(titles)}")
    if axes is None:
        _, axes = subplots(1, len(steps), width=4.6 * len(steps) + 1.8, height=3.6, sharey=True)
    axes = list(axes) if isinstance(axes, Sequence) or hasattr(axes, "__len__") else [axes]
    for i, (s, ax) in enumerate(zip(steps, axes, strict=True)):
        ms = [t / 1e6 for t in s.times_ns]
        step = "post" if s.kind == "measured" else None
        low = [0.0] * len(ms)
        for part in PARTS:
            high = [lo + v / 1e6 for lo, v in zip(low, s.parts[part], strict=True)]
            ax.fill_between(ms, low, high, step=step, color=_COLORS[part], lw=0, alpha=0.85,
                            gid=part)
            low = high
        shades = itertools.cycle((0.06, 0.13))
        for p in s.phases:
            ax.axvspan(p.start_ns / 1e6, p.end_ns / 1e6, color="black", alpha=next(shades), lw=0)
            narrow = p.end_ns - p.start_ns < 0.15 * (s.times_ns[-1] - s.times_ns[0])
            ax.text(p.end_ns / 1e6 if narrow else (p.start_ns + p.end_ns) / 2e6, 1.0, p.name,
                    transform=ax.get_xaxis_transform(), ha="right" if narrow else "center",
                    va="bottom", fontsize=8)
        t_peak, at = s.peak()
        ax.plot([t_peak / 1e6], [sum(at.values()) / 1e6], "v", color=COLORS["ceiling"],
                gid="peak")
        if napkin_bytes is not None:
            ax.axhline(checks.positive(napkin_bytes, "napkin_bytes") / 1e6, ls="--", lw=1,
                       color=COLORS["ceiling"], gid="napkin")
        label = ", ".join(f"{k.split()[0]} {num(v / 1e6, 2)}" for k, v in at.items() if v)
        ax.set_xlim(ms[0], ms[-1])
        finish(ax, xlabel=s.xlabel, ylabel="live (MB)" if i == 0 else None, legend=False)
        ax.set_title((titles[i] + "\n" if titles else "") + f"peak {num(sum(at.values()) / 1e6)}"
                     f" MB: {label}", loc="left", fontsize=8, pad=14)
    handles = [Patch(color=_COLORS[p], label=p) for p in PARTS]
    if napkin_bytes is not None:
        handles.append(Patch(fill=False, ls="--", label=f"napkin: {num(napkin_bytes / 1e6)} MB"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    frameon=False, fontsize=8)
    return axes[0].figure
