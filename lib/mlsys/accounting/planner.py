"""Which mesh? Every valid `ParallelDims` for a model, a cluster and a global batch, with its
memory per device, step time and MFU, ranked.

For each way of writing n_devices as dp_replicate x dp_shard x tp x pp x cp that the model allows
(`parallel.check_model`; TP inside one node, as everyone does; context parallelism with the
zig-zag layout, so seq divisible by 2 cp) and each micro-batch count m that divides the per-replica
batch, `plan` predicts:

- memory: `parallel.device_memory` (1F1B, sequence parallelism with TP), against the HBM;
- compute: the step's model FLOPs / (devices x peak x `efficiency`), stretched by the pipeline
  bubble (p - 1) / m;
- communication, `parallel_traffic.comm_time_s` (the bytes of `parallel_traffic.sent_bytes` over
  the cluster's links; a group that spans more ranks than a node crosses the network), bandwidth
  only, all of it in the compute dtype: FSDP's all-gathers and reduce-scatters and HSDP's
  all-reduce overlap compute (prefetch, bucketing) and only their excess shows; TP's all-reduces
  sit on the critical path (no overlap); ring attention hides behind the attention it feeds (its
  share of the FLOPs); pipeline sends show during fill and drain, 2 (p - 1) of them;
- step time = compute + bubble + exposed communication; MFU = model FLOPs / (step x devices x
  peak).
A model of the first order: no kernel efficiency below `efficiency`, no latency, perfect overlap
where overlap is claimed. Its use is to rank meshes and to say what limits each, not to promise a
time. `first_choices` is the decision tree as a map of the first choice over batch and sequence
length (`family` names each choice); `measured_cluster` describes a machine by what was measured
on it, so the planner can be checked against runs (`experiments.parallel_step`). The ranking as
text is `mlsys.tables.plan_table`, its figures are in `mlsys.plotting`.
Pure: numbers in, numbers out. Used in: chapter 09, `python -m mlsys plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mlsys import checks, hardware
from mlsys.accounting import parallel
from mlsys.accounting.flops import attention_share
from mlsys.accounting.parallel_traffic import comm_time_s
from mlsys.dtypes import bytes_per_element

GB = 1e9


class NoValidMesh(ValueError):
    """No factorization of the devices is valid for the model and batch (`meshes`)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Plan:
    """One mesh and micro-batch count, and what the model predicts for it."""

    dims: parallel.ParallelDims
    microbatches: int
    memory: parallel.DeviceMemory
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


def evaluate(cfg, cluster: hardware.Cluster, dims: parallel.ParallelDims, *, batch: int, seq: int,
             microbatches: int = 1, recipe: str = "bf16_mixed_adamw", dtype: str = "bf16",
             efficiency: float = 1.0) -> Plan:
    """The prediction for one mesh (the module docstring); `batch` global sequences of `seq`."""
    parallel.check_model(cfg, dims, batch=batch, seq=seq, microbatches=microbatches)
    eff = checks.fraction(efficiency, "efficiency")
    shape = parallel.model_shape(cfg, seq=seq, dtype=dtype)
    acc = cluster.accelerator
    peak = acc.peak_flop_per_s(dtype)
    m, n = microbatches, dims.world_size
    micro = batch // dims.dp // m
    sp = dims.tp > 1
    memory = parallel.device_memory(shape, dims, micro_batch=micro, seq=seq,
                                    microbatches=m, recipe=recipe, act_dtype=dtype,
                                    sequence_parallel=sp)
    flops = shape.training_flops_per_token * batch * seq
    compute = flops / (n * peak * eff)
    bubble = compute * (dims.pp - 1) / m
    times = comm_time_s(cfg, dims, cluster, 0, batch=batch, seq=seq, microbatches=m,
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
           fixed: dict[str, int] | None = None) -> list[parallel.ParallelDims]:
    """Every ParallelDims of n_devices the model allows, with the axes in `fixed` held; a fixed
    choice that cannot work is a ValueError saying why."""
    n = checks.positive_int(n_devices, "n_devices")
    checks.positive_ints(batch=batch, seq=seq)
    context = getattr(cfg, "context_length", None)
    if context is not None and seq > context:
        raise ValueError(f"seq ({seq}) must be <= context_length ({context})")
    fixed = dict(fixed or {})
    for axis, degree in fixed.items():
        checks.choice(axis, "axis", parallel.MESH_AXES)
        checks.positive_int(degree, axis)
        if n % degree:
            raise ValueError(f"{axis} ({degree}) does not divide the devices ({n})")
    product = math.prod(fixed.values())
    if n % product or len(fixed) == len(parallel.MESH_AXES):
        parallel.ParallelDims(**fixed, world_size=n)  # raises with the arithmetic when it is wrong
    if fixed.get("tp", 1) > cluster.per_node:
        raise ValueError(f"tp ({fixed['tp']}) must be <= {cluster.per_node}, the accelerators "
                         f"per node of {cluster.name}: tensor parallelism stays inside a node")
    free = [a for a in parallel.MESH_AXES if a not in fixed]
    out, first_error = [], None
    for degrees in _factorizations(n // product, len(free)):
        chosen = {**fixed, **dict(zip(free, degrees, strict=True))}
        if chosen["tp"] > cluster.per_node:
            continue
        try:
            dims = parallel.ParallelDims(**chosen, world_size=n)
            parallel.check_model(cfg, dims, batch=batch, seq=seq)
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


# --- the decision tree as a map: the planner's first choice over batch and sequence length ------

FAMILY_AXES = {"dp_replicate": "dp", "dp_shard": "fsdp", "tp": "tp", "pp": "pp", "cp": "cp"}


def family(dims: parallel.ParallelDims) -> str:
    """The strategies a mesh combines, in the tables' order: "fsdp", "tp+fsdp", "dp+fsdp" (HSDP)
    ...; "one device" when no axis is above 1."""
    used = [name for axis, name in FAMILY_AXES.items() if getattr(dims, axis) > 1]
    return "+".join(used) or "one device"


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
