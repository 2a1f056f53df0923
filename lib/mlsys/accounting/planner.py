"""Which mesh? Every valid `ParallelDims` for a model, a cluster and a global batch, with its
memory per device, step time and MFU, ranked.

For each way of writing n_devices as dp_replicate x dp_shard x tp x pp x cp that the model allows
(`parallel.check_model`; TP inside one node, as everyone does; context parallelism with the
zig-zag layout, so seq divisible by 2 cp) and each micro-batch count m that divides the per-replica
batch, `plan` predicts:

- memory: `parallel.device_memory` (1F1B, sequence parallelism with TP), against the HBM;
- compute: the step's model FLOPs / (devices x peak x `efficiency`), stretched by the pipeline
  bubble (p - 1) / m;
- communication, `parallel.comm_time_s` (the bytes of `parallel.sent_bytes` over the cluster's
  links; a group that spans more ranks than a node crosses the network), bandwidth only, all of it
  in the compute dtype: FSDP's all-gathers and reduce-scatters and HSDP's all-reduce overlap
  compute (prefetch, bucketing)
  and only their excess shows; TP's all-reduces sit on the critical path (no overlap); ring
  attention hides behind the attention it feeds (its share of the FLOPs); pipeline sends show
  during fill and drain, 2 (p - 1) of them;
- step time = compute + bubble + exposed communication; MFU = model FLOPs / (step x devices x
  peak).
A model of the first order: no kernel efficiency below `efficiency`, no latency, perfect overlap
where overlap is claimed. Its use is to rank meshes and to say what limits each, not to promise a
time. `table` renders the ranking; `plot_plans` and `plot_compute_bound` draw the chapter's figures;
`first_choices` and `plot_first_choices` draw the decision tree as a map of the first choice over
batch and sequence length; `measured_cluster` describes a machine by what was measured on it, so
the planner can be checked against runs (`experiments.parallel_step`).
Pure (matplotlib only inside the plot functions). Used in: chapter 09, `python -m mlsys plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mlsys import checks, hardware
from mlsys.accounting import parallel as P
from mlsys.accounting.flops import attention_share
from mlsys.book import num
from mlsys.dtypes import bytes_per_element

GB = 1e9


class NoValidMesh(ValueError):
    """No factorization of the devices is valid for the model and batch (`meshes`)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Plan:
    """One mesh and micro-batch count, and what the model predicts for it."""

    dims: P.ParallelDims
    microbatches: int
    memory: P.DeviceMemory
    hbm_bytes: float
    compute_s: float  # FLOPs / (devices x peak x efficiency)
    bubble_s: float
    exposed_s: dict[str, float] = field(default_factory=dict)  # communication compute leaves
    mfu: float = 0.0
    communication_s: dict[str, float] = field(default_factory=dict)  # all of it, before overlap

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hbm_bytes

    @property
    def step_s(self) -> float:
        return self.compute_s + self.bubble_s + sum(self.exposed_s.values())

    @property
    def serial_step_s(self) -> float:
        """The step if no communication overlapped anything: compute + bubble + all of it."""
        return self.compute_s + self.bubble_s + sum(self.communication_s.values())

    @property
    def limit(self) -> str:
        """What costs the most beyond compute: "compute", "bubble" or a strategy's communication."""
        costs = {"bubble": self.bubble_s, **self.exposed_s}
        worst = max(costs, key=costs.get)
        return "compute" if costs[worst] < 0.05 * self.compute_s else worst

    def as_row(self) -> dict[str, Any]:
        d = self.dims
        return {"dp_replicate": d.dp_replicate, "dp_shard": d.dp_shard, "tp": d.tp, "pp": d.pp,
                "cp": d.cp, "microbatches": self.microbatches,
                "memory_gb": self.memory.total / GB, "fits": self.fits, "step_s": self.step_s,
                "mfu": self.mfu, "limit": self.limit}


def evaluate(cfg, cluster: hardware.Cluster, dims: P.ParallelDims, *, batch: int, seq: int,
             microbatches: int = 1, recipe: str = "bf16_mixed_adamw", dtype: str = "bf16",
             efficiency: float = 1.0) -> Plan:
    """The prediction for one mesh (the module docstring); `batch` global sequences of `seq`."""
    P.check_model(cfg, dims, batch=batch, seq=seq, microbatches=microbatches)
    eff = checks.fraction(efficiency, "efficiency")
    shape = P.model_shape(cfg, seq=seq, dtype=dtype)
    acc = cluster.accelerator
    peak = acc.peak_flop_per_s(dtype)
    m, n = microbatches, dims.world_size
    micro = batch // dims.dp // m
    sp = dims.tp > 1
    memory = P.device_memory(shape, dims, micro_batch=micro, seq=seq, microbatches=m,
                             recipe=recipe, act_dtype=dtype, sequence_parallel=sp)
    flops = shape.training_flops_per_token * batch * seq
    compute = flops / (n * peak * eff)
    bubble = compute * (dims.pp - 1) / m
    times = P.comm_time_s(cfg, dims, cluster, 0, batch=batch, seq=seq, microbatches=m,
                          param_dtype=dtype, reduce_dtype=dtype, act_dtype=dtype,
                          sequence_parallel=sp)
    data = times["all_gather"] + times["reduce_scatter"] + times["replicate_all_reduce"]
    share = attention_share(cfg, seq) if hasattr(cfg, "n_heads") else 0.0
    tokens = micro * seq // dims.cp
    link = cluster.ring_link(dims.span("pp")).bytes_per_s
    send = tokens * shape.d_model * bytes_per_element(dtype) / link  # one activation
    total = {"fsdp": data, "tp": times["tp"], "cp": times["cp"], "pp": 2 * (dims.pp - 1) * send}
    exposed = {"fsdp": max(0.0, data - compute), "tp": times["tp"],
               "cp": max(0.0, times["cp"] - compute * share), "pp": total["pp"]}
    step = compute + bubble + sum(exposed.values())
    return Plan(dims, m, memory, acc.hbm_bytes, compute, bubble, exposed,
                flops / (step * n * peak), total)


def _factorizations(n: int, k: int):
    """Every ordered k-tuple of positive integers whose product is n."""
    if k == 1:
        yield (n,)
        return
    for d in _divisors(n):
        for rest in _factorizations(n // d, k - 1):
            yield (d, *rest)


def meshes(cfg, cluster: hardware.Cluster, *, n_devices: int, batch: int, seq: int,
           fixed: dict[str, int] | None = None) -> list[P.ParallelDims]:
    """Every ParallelDims of n_devices the model allows, with the axes in `fixed` held; a fixed
    choice that cannot work is a ValueError saying why."""
    n = checks.positive_int(n_devices, "n_devices")
    checks.positive_ints(batch=batch, seq=seq)
    context = getattr(cfg, "context_length", None)
    if context is not None and seq > context:
        raise ValueError(f"seq ({seq}) must be <= context_length ({context})")
    fixed = dict(fixed or {})
    for axis, degree in fixed.items():
        checks.choice(axis, "axis", P.MESH_AXES)
        checks.positive_int(degree, axis)
        if n % degree:
            raise ValueError(f"{axis} ({degree}) does not divide the devices ({n})")
    product = math.prod(fixed.values())
    if n % product or len(fixed) == len(P.MESH_AXES):
        P.ParallelDims(**fixed, world_size=n)  # raises with the arithmetic when it is wrong
    if fixed.get("tp", 1) > cluster.per_node:
        raise ValueError(f"tp ({fixed['tp']}) must be <= {cluster.per_node}, the accelerators "
                         f"per node of {cluster.name}: tensor parallelism stays inside a node")
    free = [a for a in P.MESH_AXES if a not in fixed]
    out, first_error = [], None
    for degrees in _factorizations(n // product, len(free)):
        chosen = {**fixed, **dict(zip(free, degrees, strict=True))}
        if chosen["tp"] > cluster.per_node:
            continue
        try:
            dims = P.ParallelDims(**chosen, world_size=n)
            P.check_model(cfg, dims, batch=batch, seq=seq)
            if dims.cp > 1 and seq % (2 * dims.cp):
                raise ValueError(f"seq ({seq}) is not divisible by 2 cp = {2 * dims.cp} (the "
                                 "zig-zag layout)")
        except ValueError as error:
            first_error = first_error or error
            continue
        out.append(dims)
    if not out:
        why = f"; for example: {first_error}" if first_error else ""
        raise NoValidMesh(f"no mesh of {n} devices is valid for this model and batch{why}")
    return out


def plan(cfg, cluster: str | hardware.Cluster, *, n_devices: int, batch: int, seq: int,
         recipe: str = "bf16_mixed_adamw", dtype: str = "bf16", efficiency: float = 1.0,
         fixed: dict[str, int] | None = None, microbatches: int | None = None) -> list[Plan]:
    """Every valid mesh with its best micro-batch count (every divisor of the per-replica batch,
    or `microbatches`), ranked: the ones that fit by step time, then the rest by memory."""
    cl = hardware.get_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(cl, hardware.Cluster):
        raise TypeError(f"cluster must be a name such as 'dgx-h100' or a Cluster, got {cluster!r}")
    checks.positive_ints(batch=batch, seq=seq)
    if microbatches is not None:
        checks.positive_int(microbatches, "microbatches")
    best: list[Plan] = []
    for dims in meshes(cfg, cl, n_devices=n_devices, batch=batch, seq=seq, fixed=fixed):
        per_replica = batch // dims.dp
        counts = [microbatches] if microbatches else _divisors(per_replica)
        options = [evaluate(cfg, cl, dims, batch=batch, seq=seq, microbatches=k, recipe=recipe,
                            dtype=dtype, efficiency=efficiency)
                   for k in counts if per_replica % k == 0]
        if not options:
            raise ValueError(f"microbatches ({microbatches}) does not divide the per-replica "
                             f"batch ({per_replica}) of {dims}")
        best.append(min(options, key=_rank))
    return sorted(best, key=_rank)


def _rank(p: Plan) -> tuple:
    return (not p.fits, p.step_s if p.fits else p.memory.total)


def table(plans: list[Plan], *, top: int = 10) -> list[str]:
    """The first `top` plans as aligned text lines (what `python -m mlsys plan` prints)."""
    checks.positive_int(top, "top")
    header = ("#", "dp_rep", "dp_shard", "tp", "pp", "cp", "m", "mem GB", "fits", "step s",
              "MFU", "limited by")
    rows = [header]
    for i, p in enumerate(plans[:top], 1):
        r = p.as_row()
        rows.append((str(i), *(str(r[k]) for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp",
                                                   "microbatches")),
                     num(r["memory_gb"]), "yes" if r["fits"] else "NO", num(r["step_s"]),
                     f"{r['mfu']:.0%}", r["limit"]))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
            for row in rows]


def plot_plans(plans: list[Plan], ax=None, *, label_top: int = 3):
    """Memory per device against step time, one point per mesh, the HBM as a line; the best
    `label_top` labelled. Returns the axes."""
    from mlsys import plotting

    if ax is None:
        _, ax = plotting.subplots()
    fit = [p for p in plans if p.fits]
    over = [p for p in plans if not p.fits]
    for group, color, label in ((fit, plotting.COLORS["predicted"], "fits"),
                                (over, plotting.COLORS["muted"], "does not fit")):
        if group:
            ax.scatter([p.step_s for p in group], [p.memory.total / GB for p in group], s=14,
                       color=color, label=label)
    if plans:
        ax.axhline(plans[0].hbm_bytes / GB, color=plotting.COLORS["ceiling"], lw=1,
                   label="HBM per device")
    for p in fit[:label_top]:
        d = p.dims
        ax.annotate(f"dp {d.dp_replicate}x{d.dp_shard} tp {d.tp} pp {d.pp} cp {d.cp}",
                    (p.step_s, p.memory.total / GB), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    plotting.finish(ax, xlabel="predicted step time (s)", ylabel="memory per device (GB)",
                    logx=True, logy=True)
    return ax


def plot_compute_bound(d_model: int, d_ff: int, n_devices: int, *, flop_per_s: float,
                       link_bytes_per_s: float, m_x: int = 1, m_y: int = 1,
                       fixed_xy: tuple[int, int] | None = None, ax=None):
    """T_math / T_comms of one layer's forward against tokens per device B / N, for pure FSDP
    (X = N), pure TP (Y = N), mixed FSDP x TP at the Scaling Book's optimal (non-integer) split,
    and at `fixed_xy` = (X, Y); above 1 the layer is compute-bound. Returns the axes."""
    import math

    import numpy as np

    from mlsys import plotting

    n = checks.positive_int(n_devices, "n_devices")
    c, w = checks.positive(flop_per_s, "flop_per_s"), checks.positive(link_bytes_per_s,
                                                                       "link_bytes_per_s")
    if ax is None:
        _, ax = plotting.subplots()
    per_device = np.logspace(0, 5, 200)

    def ratio(b: float, x: float, y: float) -> float:  # b tokens per device, x * y devices
        math_s = 4 * b * d_model * d_ff / c
        fsdp = 4 * d_model * d_ff / (y * w * m_x) if x > 1 else 0.0
        tp = 4 * b * x * y * d_model / (x * w * m_y) if y > 1 else 0.0
        return math_s / max(fsdp, tp) if max(fsdp, tp) else math.inf

    def optimal(b: float) -> float:
        x = min(max(P.optimal_fsdp_degree(b * n, d_ff, n, m_x=m_x, m_y=m_y), 1.0), n)
        return ratio(b, x, n / x)

    curves = {f"FSDP, X = {n}": lambda b: ratio(b, n, 1), f"TP, Y = {n}": lambda b: ratio(b, 1, n),
              "FSDP x TP, optimal X": optimal}
    if fixed_xy is not None:
        x, y = (checks.positive_int(v, name) for v, name in zip(fixed_xy, ("X", "Y"),
                                                                  strict=True))
        curves[f"FSDP x TP, X = {x}, Y = {y}"] = lambda b: ratio(b, x, y)
    for i, (label, f) in enumerate(curves.items()):
        ax.plot(per_device, [f(b) for b in per_device], label=label, color=plotting.CYCLE[i])
    ax.axhline(1.0, color=plotting.COLORS["ceiling"], lw=1, ls="--", label="compute = comms")
    plotting.finish(ax, xlabel="tokens per device, B / N", ylabel="T_math / T_comms",
                    logx=True, logy=True)
    return ax


# --- the decision tree as a map: the planner's first choice over batch and sequence length -------

FAMILY_AXES = {"dp_replicate": "dp", "dp_shard": "fsdp", "tp": "tp", "pp": "pp", "cp": "cp"}


def family(dims: P.ParallelDims) -> str:
    """The strategies a mesh combines, in the tables' order: "fsdp", "tp+fsdp", "dp+fsdp" (HSDP)
    ...; "one device" when no axis is above 1."""
    used = [name for axis, name in FAMILY_AXES.items() if getattr(dims, axis) > 1]
    return "+".join(used) or "one device"


def mesh_text(dims: P.ParallelDims) -> str:
    """The degrees above 1, short: "tp 2 fsdp 4"."""
    return " ".join(f"{name} {getattr(dims, axis)}" for axis, name in FAMILY_AXES.items()
                    if getattr(dims, axis) > 1) or "one device"


def first_choices(cfg, cluster: str | hardware.Cluster, *, n_devices: int, batches, seqs,
                  **options) -> dict[tuple[int, int], Plan | None]:
    """The planner's first choice for every (global batch, seq) pair, None where no mesh fits or
    none is valid (`NoValidMesh`; other errors propagate); `options` as for `plan`.
    `cfg.context_length` must cover every seq."""
    out: dict[tuple[int, int], Plan | None] = {}
    for seq in seqs:
        for batch in batches:
            try:
                plans = plan(cfg, cluster, n_devices=n_devices, batch=batch, seq=seq, **options)
            except NoValidMesh:
                plans = []
            out[(batch, seq)] = plans[0] if plans and plans[0].fits else None
    return out


def plot_first_choices(choices: dict[tuple[int, int], Plan | None], ax=None):
    """The decision tree drawn by the planner: one cell per (global batch, seq), coloured by the
    family of its first choice and labelled with the mesh and its predicted MFU. Returns the
    axes."""
    import numpy as np
    from matplotlib.colors import ListedColormap, to_rgba
    from matplotlib.patches import Patch

    from mlsys import plotting

    if ax is None:
        _, ax = plotting.subplots()
    batches = sorted({b for b, _ in choices})
    seqs = sorted({s for _, s in choices})
    names = sorted({family(p.dims) for p in choices.values() if p is not None})
    codes = {name: i for i, name in enumerate(names)}
    grid = np.full((len(seqs), len(batches)), np.nan)
    for (b, s), p in choices.items():
        if p is not None:
            grid[seqs.index(s), batches.index(b)] = codes[family(p.dims)]
    colors = [to_rgba(plotting.CYCLE[i % len(plotting.CYCLE)], 0.55) for i in range(len(names))]
    ax.imshow(grid, cmap=ListedColormap(colors or ["white"]), vmin=-0.5,
              vmax=max(len(names), 1) - 0.5, origin="lower", aspect="auto")
    for (b, s), p in choices.items():
        text = "nothing fits" if p is None else f"{mesh_text(p.dims)}\n{p.mfu:.0%}"
        ax.text(batches.index(b), seqs.index(s), text, ha="center", va="center", fontsize=6)
    ax.grid(False)
    ax.set_xticks(range(len(batches)), [f"{b:,}" for b in batches])
    ax.set_yticks(range(len(seqs)), [f"{s:,}" for s in seqs])
    ax.set_xlabel("global batch (sequences)")
    ax.set_ylabel("sequence length (tokens)")
    ax.legend(handles=[Patch(color=c, label=n) for n, c in zip(names, colors, strict=True)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


# --- the planner on a machine it can be checked on ----------------------------------------------


def measured_cluster(name: str, *, flop_per_s: float, dtype: str, link_bytes_per_s: float,
                     per_node: int, memory_bytes: float) -> hardware.Cluster:
    """A one-node cluster described by what was measured on it: the FLOP/s one rank reaches
    (the planner's peak, to use with efficiency 1) and the bandwidth of an all-reduce fit (the
    link). The chip's memory bandwidth is not measured and not read by the planner: its field
    holds the link's figure."""
    rate = checks.positive(flop_per_s, "flop_per_s")
    link_rate = checks.positive(link_bytes_per_s, "link_bytes_per_s")
    acc = hardware.Accelerator(
        name=name, vendor="measured", dense_flop_per_s={dtype: rate},
        hbm_bytes=checks.positive(memory_bytes, "memory_bytes"), hbm_bytes_per_s=link_rate,
        l2_bytes=None, smem_per_sm_bytes=None, sm_count=None, interconnect_bytes_per_s=link_rate,
        interconnect_name="measured link", pcie_bytes_per_s=link_rate,
        notes="FLOP/s and link measured; memory bandwidth not (its field holds the link's)")
    link = hardware.Link(f"{name}: measured link", link_rate, "an all-reduce fit (alpha-beta)")
    return hardware.Cluster(name, acc, checks.positive_int(per_node, "per_node"), link, None)
