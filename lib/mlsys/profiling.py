"""Where a training step's time goes: torch.profiler tables by phase and by class of operation.

`Profile` wraps `torch.profiler.profile` around a region split into named phases
(`with prof.phase("forward"): ...`). Each phase is a `record_function` range and, on a GPU, an NVTX
range of the same name, so Nsight Systems shows the phases the tables use. Given the `model`, every
module's forward is a range too ("module::blocks.0.attn_norm (RMSNorm)"). Afterwards `ops()` lists
each operator (CPU: self CPU time of aten ops and autograd nodes) or kernel (GPU: device time,
attributed to the op that launched it) with its phase and class; `classes()` gives every class's
share of time per phase and overall. Time spent outside every op (Python, the ranges themselves)
is reported per phase by `phases()`, not spread over the classes.

Classes (`CLASSES`) follow what an op computes, decided in this order (`classify`):
1. a name rule of `NAME_RULES` on the op or kernel, then on the autograd node it ran in (every op
   a node runs is the node's, the add summing gradients that reach it included); communication
   always wins, and inside the optimizer's `step` and `zero_grad` the rest is "optimizer";
2. else the innermost module that ran it (`MODULE_RULES`: a norm, a linear layer, an embedding),
   in the backward through the autograd node's sequence number, which names its forward op;
3. else "elementwise" (pointwise ops, reductions, views: RoPE, SwiGLU's gate, residual adds).
On a GPU a kernel with a rule of its own keeps it (a copy launched by a linear layer under
autocast is "copy/cast"); the others take the launching op's class. There the backward's kernels
are launched from autograd's device thread, outside the main thread's NVTX range in Nsight; the
tables place every op in a phase by its time.
Written-out attention is split into its matmuls, softmax and elementwise ops; "attention" is a
fused kernel (SDPA, FlashAttention). `class_flops` maps `mlsys.accounting.flops` onto the same
classes, so a page can set FLOP share beside time share (normalization: a fraction of a percent of
the FLOPs, a visible slice of the time; He, "Making Deep Learning Go Brrrr", 2022).
Used in: §sec-profiling (chapter 05), `mlsys.memory_timeline`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mlsys import bench, checks, env
from mlsys.accounting import flops as _flops
from mlsys.book import Table
from mlsys.models.config import ATTENTION_BACKENDS

CLASSES = ("matmul", "attention", "elementwise", "normalization", "softmax", "copy/cast",
           "optimizer", "communication", "other")
NAME_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"),
    ("attention", r"scaled_dot_product|flash|efficient_attention|fmha|attention|_attn|sdpa"),
    ("optimizer", r"_foreach_|_fused_adam|_fused_sgd|multi_tensor_apply"),
    ("softmax", r"softmax"),  # also log_softmax (the loss), softmax_warp_*, cunn_SoftMax*
    ("matmul", r"gemm|gemv|matmul|nvjet|xmma|splitkreduce|cublas|addmm|mmbackward"
               r"|\b(aten::)?(mm|bmm|mv|dot|linear|baddbmm|_scaled_mm)\b"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|rsqrt|gammabeta"
                      r"|rowwisemoments"),  # rsqrt appears in a transformer only inside norms
    ("copy/cast", r"copy|clone|contiguous|memcpy|memset|catarray|aten::(to|cat|stack)\b"),
    ("other", r"embedding|index_select|index_add|gather|scatter|nll_?loss|aminmax"
              r"|_local_scalar_dense|indexselect"),  # lookups, the loss's pick, the token check
)
"""(class, regex searched case-insensitively): aten ops, autograd nodes and GPU kernel names."""
MODULE_RULES: tuple[tuple[str, str], ...] = (
    ("normalization", r"Norm"), ("matmul", r"Linear"), ("other", r"Embedding"))
"""(class, regex on the module's type name) for ops no name rule claims."""
DEFAULT_CLASS = "elementwise"
PHASE_PREFIX, MODULE_PREFIX = "phase::", "module::"
NO_PHASE = "(no phase)"
_NODE_PREFIX = "autograd::engine::evaluate_function: "
_COMPILED = [(cls, re.compile(rx, re.IGNORECASE)) for cls, rx in NAME_RULES]


def name_class(name: str) -> str | None:
    """The class of the first `NAME_RULES` entry matching `name`, or None."""
    return next((cls for cls, rx in _COMPILED if rx.search(name)), None)


def classify(name: str, *, node: str | None = None, module: str | None = None,
             optimizer: bool = False, fallback: str = DEFAULT_CLASS) -> str:
    """The class of op (or kernel) `name`. `node`: the autograd node it ran in; `module`: the
    type name of the module it ran in; `optimizer`: inside the optimizer's `step` or `zero_grad`.
    Precedence: the module docstring."""
    rule = name_class(name)
    if rule == "communication":
        return rule
    if optimizer:
        return "optimizer"
    rule = rule or (name_class(node) if node else None)
    if rule is None and module:
        rule = next((c for c, rx in MODULE_RULES if re.search(rx, module)), None)
    return rule or fallback


# --- FLOPs by class (pure) ---------------------------------------------------------------------


def class_flops(cfg, batch: int, seq: int, *, training: bool = False,
                attention: str | None = None) -> dict[str, int]:
    """`mlsys.accounting.flops.transformer_flops` by class: forward FLOPs, or training = 3x forward
    (exact for matmuls, the accounting's estimate for the rest). With written-out ("naive")
    attention the scores and values are matmuls, the scale elementwise and the softmax softmax;
    any other backend is one fused "attention" op. The loss's log-softmax over the vocabulary is
    "softmax" (5 per logit, `flops.softmax_flops`), where the profiler puts its time. Not counted:
    the embedding lookup, the optimizer and copies, which get 0."""
    checks.choice(training, "training", (False, True))
    attention = checks.choice(attention or getattr(cfg, "attention", "naive"), "attention",
                              ATTENTION_BACKENDS)
    mf = _flops.transformer_flops(cfg, batch, seq)
    lf, n = mf.layer, mf.n_layers
    out = dict.fromkeys(CLASSES, 0)
    out["matmul"] = n * (lf.q_proj + lf.k_proj + lf.v_proj + lf.o_proj + lf.ffn_flops) + mf.lm_head
    out["elementwise"] = n * (lf.rope + lf.swiglu_gate + lf.residual)
    out["normalization"] = n * lf.norms + mf.final_norm
    out["softmax"] = _flops.softmax_flops(batch * seq, cfg.vocab_size)  # the loss
    core = {"matmul": lf.attention_scores + lf.attention_values,
            "elementwise": lf.attention_scale, "softmax": lf.softmax}
    for cls, value in core.items():
        out[cls if attention == "naive" else "attention"] += n * value
    return {cls: 3 * v if training else v for cls, v in out.items()}


def shares(values: dict[str, float]) -> dict[str, float]:
    """Each value over their sum (all 0 when the sum is 0)."""
    total = sum(values.values())
    return {k: (v / total if total else 0.0) for k, v in values.items()}


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
class OpRow:
    """One operator (CPU) or kernel (GPU) in one phase and class, summed over its calls."""

    name: str  # aten op or autograd node (CPU), kernel (GPU)
    op_class: str  # one of CLASSES
    phase: str  # the phase it ran (GPU: was launched) in, or NO_PHASE
    self_s: float  # self CPU time (CPU) or device time (GPU), seconds
    calls: int  # events (CPU, nested ones included) or kernel launches (GPU)


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


class Profile:
    """`with Profile(model=model) as prof:` then `with prof.phase("forward"): ...`; read the
    tables after the block. `device` defaults to `mlsys.env.device()` ("cpu" or "cuda");
    `record_memory` adds the allocator's events (`mlsys.memory_timeline.from_profile`)."""

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
        self._parsed: _Parsed | None = None

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

    def _results(self) -> _Parsed:
        if not self._done:
            raise RuntimeError("results are ready after the `with Profile(...)` block ends")
        if self._parsed is None:
            self._parsed = _Parsed(self.raw, self.modules, self.phase_spans(),
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
    `class_flops(..., training=True)`), its FLOP share beside. Classes never seen are left out."""
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


class _Parsed:
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
        self.rows = _rows(events, self.where, kernels=kernels)

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


def _rows(events, where: Callable[[Any], Where], *, kernels: bool) -> list[OpRow]:
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


# --- the profiler's own cost -------------------------------------------------------------------


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
