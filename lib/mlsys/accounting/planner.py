"""Which mesh? Every valid `ParallelDims` for a model, a cluster and a global batch, with its
memory per device, step time and MFU, ranked.

For each way of writing n_devices as dp_replicate x dp_shard x tp x pp x cp that the model allows
(`parallel.check_model`; TP inside one node, as everyone does; context parallelism with the
zig-zag layout, so seq divisible by 2 cp) and each micro-batch count m that divides the per-replica
batch, `plan` predicts:

- memory: `parallel.device_memory` (1F1B, sequence parallelism with TP), against the HBM; with
  `zero1` (the default) the data-parallel copies of `dp_replicate` shard their fp32 master weights
  and optimizer state (ZeRO-1, Megatron's distributed optimizer, Rajbhandari et al., 2020): the
  bytes of one all-reduce of the gradients a step (a reduce-scatter, then an all-gather of the
  updated weights; the micro-batches' gradients accumulate locally first, where the copies of
  `mlsys.distributed` all-reduce every micro-batch's), less memory. ZeRO-1 + PP is a
  dp_replicate x pp mesh; ZeRO-3 + PP (dp_shard x pp) gathers every block again for every
  micro-batch;
- compute: the step's model FLOPs / (devices x peak x `efficiency`), stretched by the pipeline
  bubble (p - 1) / m;
- communication, `parallel_traffic.comm_time_s` (the bytes of `parallel_traffic.sent_bytes` over
  the cluster's links; a group that spans more ranks than a node crosses the network), bandwidth
  only, all of it in the compute dtype: FSDP's all-gathers and reduce-scatters and HSDP's
  all-reduce overlap compute (prefetch, bucketing) and only their excess shows; TP's all-reduces
  sit on the critical path (no overlap); ring attention hides behind the attention it feeds (its
  share of the FLOPs); pipeline sends show during fill and drain, 2 (p - 1) of them, each over
  its sender's own link (`Cluster.send_link`);
- step time = compute + bubble + exposed communication; MFU = model FLOPs / (step x devices x
  peak).
Ranking (`plan`): the meshes that fit by step time; equal step times (several meshes hide all
their communication and tie exactly) by less communication before overlap (`Plan.traffic_s`: the
traffic over the links it crosses), then by fewer axes above 1, then by memory; `ties` lists the
meshes that tie with the first on step time. `crossing_axes` names the axes whose groups leave a
node.
A model of the first order: no kernel efficiency below `efficiency`, no latency, perfect overlap
where overlap is claimed. Its use is to rank meshes and to say what limits each, not to promise a
time. `first_choices` is the decision tree as a map of the first choice over batch and sequence
length (`family` names each choice); `measured_cluster` describes a machine by what was measured
on it, so the planner can be checked against runs (`experiments.parallel_step`). The ranking as
text is `mlsys.tables.plan_table`, its figures are in `mlsys.plotting`.
`map_facts` reads such a map for the sentences that describe it; `LARGE_SIZES` and `LARGE_RUN` are
the across-nodes example of chapter 09 and the one-pager. A little over 300 lines: the prediction,
the ranking and its ties, and the map are one model, read together.
Pure: numbers in, numbers out. Used in: chapter 09, the parallelism one-pager and appendix,
`python -m mlsys plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from mlsys import checks, hardware
from mlsys.accounting import parallel, step_model
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
    zero1: bool = False  # the dp_replicate copies shard master weights and optimizer (ZeRO-1)
    # the knobs (held or chosen) and what the model counts
    micro_batch: int = 1  # sequences per micro-batch
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0  # the dp_replicate axis' ZeRO stage (dp_shard is ZeRO-3)
    ep: int = 1
    dtype: str = "bf16"
    model: str = "first_order"
    recompute_s: float = 0.0  # the part of compute_s that is recomputation
    other_s: dict[str, float] = field(default_factory=dict)  # the optimizer step
    model_flops: float = 0.0  # a step's, all devices, no recomputation
    hardware_flops: float = 0.0  # with recomputation
    peak_flop_per_s: float = 1.0  # one device's dense peak in `dtype`
    tokens: int = 0  # a step's: batch x seq

    compute_includes_recompute = True

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hbm_bytes

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.bubble_s + sum(self.exposed_s.values())
                + sum(self.other_s.values()))

    @property
    def serial_step_s(self) -> float:
        """The step if no communication overlapped anything: compute + bubble + all of it."""
        return (self.compute_s + self.bubble_s + sum(self.communication_s.values())
                + sum(self.other_s.values()))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops / (self.step_s * self.dims.world_size) / 1e12

    @property
    def hardware_tflops_per_device(self) -> float:
        return self.hardware_flops / (self.step_s * self.dims.world_size) / 1e12

    @property
    def hfu(self) -> float:
        """Hardware FLOPs (recomputation counted) a second / (devices x peak)."""
        return self.hardware_flops / (self.step_s * self.dims.world_size * self.peak_flop_per_s)

    @property
    def memory_bytes_per_device(self) -> float:
        return self.memory.total

    @property
    def breakdown(self) -> dict[str, Any]:
        """Where the step goes, in seconds: compute (recomputation included), recompute,
        bubble, the optimizer, and the exposed communication of each axis."""
        return {"compute_s": self.compute_s, "recompute_s": self.recompute_s,
                "bubble_s": self.bubble_s, **{f"{k}_s": v for k, v in self.other_s.items()},
                "exposed_s": dict(self.exposed_s)}

    def as_json(self) -> dict[str, Any]:
        """One JSON object: `mesh` (every degree, ep and v included), the knobs and the
        predictions (`python -m mlsys plan --json`)."""
        d = self.dims
        mesh = {"dp_replicate": d.dp_replicate, "dp_shard": d.dp_shard, "tp": d.tp,
                "pp": d.pp, "cp": d.cp, "ep": self.ep, "v": self.virtual_stages}
        return {"mesh": mesh, "micro_batch": self.micro_batch,
                "microbatches": self.microbatches, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "zero": self.zero,
                "dtype": self.dtype, "model": self.model, "step_s": self.step_s,
                "tokens_per_s": self.tokens_per_s,
                "model_tflops_per_device": self.model_tflops_per_device,
                "hardware_tflops_per_device": self.hardware_tflops_per_device,
                "mfu": self.mfu, "hfu": self.hfu,
                "memory_bytes_per_device": self.memory_bytes_per_device, "fits": self.fits,
                "breakdown": self.breakdown, "limit": self.limit}

    @property
    def traffic_s(self) -> float:
        """All communication before overlap, in seconds on its links: the first tie-break."""
        return sum(self.communication_s.values())

    @property
    def n_axes(self) -> int:
        """Mesh axes above 1: the second tie-break (fewer process groups to run)."""
        return sum(d > 1 for d in self.dims.shape)

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
                "mfu": self.mfu, "limit": self.limit, "zero1": self.zero1 and d.dp_replicate > 1}


MODELS = ("first_order", "calibrated")
"""The planner's time models: the first-order one (compute at peak x `efficiency`, bandwidth
only, perfect overlap) and the calibrated step model (`accounting.step_model`)."""


def evaluate(cfg, cluster: hardware.Cluster, dims: parallel.ParallelDims, *, batch: int, seq: int,
             microbatches: int = 1, recipe: str = "bf16_mixed_adamw", dtype: str = "bf16",
             efficiency: float = 1.0, zero1: bool = False, model: str = "first_order",
             micro_batch: int | None = None, virtual_stages: int = 1, recompute: str = "none",
             sequence_parallel: bool | None = None, zero: int | None = None,
             ep: int = 1) -> Plan:
    """The prediction for one mesh (the module docstring); `batch` global sequences of `seq`;
    `zero1`: the dp_replicate copies shard their master weights and optimizer state (`zero`,
    when given, says it: 0, 1 or 2). `micro_batch`, when given, sets the micro-batch count
    (batch / dp / micro_batch); `sequence_parallel` None: on when tp > 1."""
    checks.choice(model, "model", MODELS)
    if not isinstance(zero1, bool):
        raise TypeError(f"zero1 must be True or False, got {zero1!r}")
    v, ep = virtual_stages or 1, ep or 1
    recompute = checks.choice(recompute or "none", "recompute", parallel.RECOMPUTE)
    if zero is not None and (isinstance(zero, bool) or zero not in parallel.ZERO_STAGES):
        raise ValueError(f"zero must be 0, 1 or 2 (dp_shard is ZeRO-3), got {zero!r}")
    if micro_batch is not None:
        checks.positive_ints(micro_batch=micro_batch, batch=batch)
        if batch % (dims.dp * micro_batch):
            raise ValueError(f"batch ({batch}) is not divisible by dp x micro_batch = {dims.dp} "
                             f"x {micro_batch}")
        microbatches = batch // dims.dp // micro_batch
    parallel.check_model(cfg, dims, batch=batch, seq=seq, microbatches=microbatches,
                         virtual_stages=v, ep=ep)
    stage = (1 if zero1 else 0) if zero is None else zero
    sp = dims.tp > 1 if sequence_parallel is None else bool(sequence_parallel) and dims.tp > 1
    if model == "calibrated":
        return _calibrated(cfg, cluster, dims, batch=batch, seq=seq, m=microbatches, v=v,
                           recompute=recompute, sp=sp, zero=stage, ep=ep, recipe=recipe,
                           dtype=dtype)
    eff = checks.fraction(efficiency, "efficiency")
    shape = parallel.model_shape(cfg, seq=seq, dtype=dtype)
    acc = cluster.accelerator
    peak = acc.peak_flop_per_s(dtype)
    m, n = microbatches, dims.world_size
    micro = batch // dims.dp // m
    extra = {k: val for k, val in (("recompute", recompute), ("virtual_stages", v), ("ep", ep))
             if val not in ("none", 1)}
    if stage == 2:
        extra["zero"] = 2
    memory = parallel.device_memory(shape if not extra else cfg, dims, micro_batch=micro,
                                    seq=seq, microbatches=m, recipe=recipe, act_dtype=dtype,
                                    sequence_parallel=sp, **extra)
    if stage == 1 and dims.dp_replicate > 1:  # the distributed optimizer: master and moments
        memory = replace(memory, master=memory.master / dims.dp_replicate,
                         optimizer=memory.optimizer / dims.dp_replicate)
    flops = shape.training_flops_per_token * batch * seq
    hw = flops + _recomputed_flops(cfg, batch=batch, seq=seq, recompute=recompute, flops=flops)
    compute = hw / (n * peak * eff)
    bubble = compute * (dims.pp - 1) / (v * m)
    times = comm_time_s(cfg, dims, cluster, 0, batch=batch, seq=seq, microbatches=m,
                        param_dtype=dtype, reduce_dtype=dtype, act_dtype=dtype,
                        sequence_parallel=sp)
    sharded = stage >= 1 and dims.dp_replicate > 1
    if sharded:  # the distributed optimizer accumulates the micro-batches' gradients and
        times["replicate_all_reduce"] /= m  # reduces them once a step
    data = times["all_gather"] + times["reduce_scatter"] + times["replicate_all_reduce"]
    share = attention_share(cfg, seq) if hasattr(cfg, "n_heads") else 0.0
    tokens = micro * seq // dims.cp
    link = cluster.send_link(dims.span("pp")).bytes_per_s  # the sender's own port
    send = tokens * shape.d_model * bytes_per_element(dtype) / link  # one activation
    total = {"fsdp": data, "tp": times["tp"], "cp": times["cp"],
             "pp": 2 * (dims.pp - 1) * v * send}
    exposed = {"fsdp": max(0.0, data - compute), "tp": times["tp"],
               "cp": max(0.0, times["cp"] - compute * share), "pp": total["pp"]}
    step = compute + bubble + sum(exposed.values())
    return Plan(dims, m, memory, acc.hbm_bytes, compute, bubble, exposed,
                flops / (step * n * peak), total, sharded, micro, v, recompute, sp, stage, ep,
                dtype, "first_order", hw / (n * peak * eff) - flops / (n * peak * eff), {},
                flops, hw, peak, batch * seq)


def _recomputed_flops(cfg, *, batch: int, seq: int, recompute: str, flops: float) -> float:
    """FLOPs of the recomputed forward (`step_model.step_flops`); a `FeedForwardStack` reruns
    its whole forward (a third of the step) under "full" and has no attention core."""
    if recompute == "none":
        return 0.0
    if isinstance(cfg, parallel.FeedForwardStack):
        return flops / 3 if recompute == "full" else 0.0
    model, hw = step_model.step_flops(cfg, batch=batch, seq=seq, recompute=recompute)
    return hw - model


def _calibrated(cfg, cluster: hardware.Cluster, dims: parallel.ParallelDims, *, batch: int,
                seq: int, m: int, v: int, recompute: str, sp: bool, zero: int, ep: int,
                recipe: str, dtype: str) -> Plan:
    """The step model's prediction (`step_model.step_time`) and `parallel.device_memory`."""
    if isinstance(cfg, parallel.FeedForwardStack):
        raise ValueError("model='calibrated' needs a transformer config (heads, vocabulary); "
                         "a FeedForwardStack has neither: use model='first_order'")
    micro = batch // dims.dp // m
    bd = step_model.step_time(cfg, cluster, dims, batch=batch, seq=seq, micro_batch=micro,
                              virtual_stages=v, recompute=recompute, sequence_parallel=sp,
                              dtype=dtype, zero=zero, ep=ep)
    memory = _memory(cfg, dims, micro=micro, seq=seq, m=m, recipe=recipe, dtype=dtype, sp=sp,
                     recompute=recompute, v=v, zero=zero, ep=ep)
    return Plan(dims, m, memory, cluster.accelerator.hbm_bytes, bd.compute_s, bd.bubble_s,
                dict(bd.exposed_s), bd.mfu, dict(bd.communication_s),
                zero >= 1 and dims.dp_replicate > 1, micro, v, recompute, sp, zero, ep, dtype,
                "calibrated", bd.recompute_s, {"optimizer": bd.optimizer_s}, bd.model_flops,
                bd.hardware_flops, bd.peak_flop_per_s, batch * seq)


def _memory(cfg, dims, *, micro, seq, m, recipe, dtype, sp, recompute, v, zero, ep):
    return parallel.device_memory(cfg, dims, micro_batch=micro, seq=seq, microbatches=m,
                                  recipe=recipe, act_dtype=dtype, sequence_parallel=sp,
                                  recompute=recompute, virtual_stages=v, zero=zero, ep=ep)


def _factorizations(n: int, k: int):
    """Every ordered k-tuple of positive integers whose product is n (k = 0: the empty tuple,
    when n is 1: every axis is held)."""
    if k == 0:
        if n == 1:
            yield ()
        return
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
         fixed: dict[str, int] | None = None, microbatches: int | None = None,
         zero1: bool = True, model: str = "first_order", micro_batch: int | None = None,
         virtual_stages: int | None = None, recompute: str | None = None,
         sequence_parallel: bool | None = None, zero: int | None = None,
         ep: int | None = None) -> list[Plan]:
    """Every valid mesh with its best knobs, ranked: the ones that fit by step time (ties by
    traffic, then by fewer axes, then by memory), then the rest by memory. A knob given is held;
    None is searched (`model="calibrated"`) or its default (`"first_order"`: every micro-batch
    count, or `microbatches`; no recomputation, v = 1, SP with TP, ZeRO-1 copies with `zero1`,
    ep = 1). The calibrated search, per mesh (the pruning that keeps 1,024 devices to seconds):
    micro-batches of 1, 2, 4 or 8 sequences (or `microbatches`); v of 1, 2 or 4 where the
    layers allow; ep over the powers of two that divide the experts and dp x cp; SP whenever tp
    > 1 (it only saves); and of (ZeRO stage, recomputation) the first that fits in the order
    of their cost in time, (0, none), (1, none), (2, none), (0, selective) ... (2, full): each
    saves memory and costs time, so the cheapest that fits is the one to run."""
    cl = hardware.get_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(cl, hardware.Cluster):
        raise TypeError(f"cluster must be a name such as 'dgx-h100' or a Cluster, got {cluster!r}")
    checks.positive_ints(batch=batch, seq=seq)
    checks.choice(model, "model", MODELS)
    for name, value in (("microbatches", microbatches), ("micro_batch", micro_batch),
                        ("virtual_stages", virtual_stages), ("ep", ep)):
        if value is not None:
            checks.positive_int(value, name)
    if recompute is not None:
        checks.choice(recompute, "recompute", parallel.RECOMPUTE)
    if zero is not None and (isinstance(zero, bool) or zero not in parallel.ZERO_STAGES):
        raise ValueError(f"zero must be 0, 1 or 2 (dp_shard is ZeRO-3), got {zero!r}")
    common = dict(batch=batch, seq=seq, recipe=recipe, dtype=dtype, zero1=zero1, model=model,
                  sequence_parallel=sequence_parallel)
    best: list[Plan] = []
    knobs = (microbatches, micro_batch, virtual_stages, recompute, zero, ep, common)
    for dims in meshes(cfg, cl, n_devices=n_devices, batch=batch, seq=seq, fixed=fixed):
        per_replica = batch // dims.dp
        if model == "calibrated":
            options = _searched(cfg, cl, dims, per_replica, *knobs, quick=True)
        else:
            if micro_batch is not None:
                counts = [per_replica // micro_batch] if per_replica % micro_batch == 0 else []
            else:
                counts = [microbatches] if microbatches else _divisors(per_replica)
            options = [evaluate(cfg, cl, dims, microbatches=k, efficiency=efficiency,
                                virtual_stages=virtual_stages or 1, recompute=recompute,
                                zero=zero, ep=ep or 1, **common)
                       for k in counts if k and per_replica % k == 0
                       and _allowed(cfg, dims, batch, seq, k, virtual_stages or 1, ep or 1)]
        if options:
            best.append(min(options, key=_rank))
        elif microbatches or micro_batch:
            continue
    if not best:
        held = f"microbatches ({microbatches})" if microbatches else \
            f"micro_batch ({micro_batch})"
        raise NoValidMesh(f"{held} divides no mesh's per-replica batch, or no mesh allows the "
                          "held knobs (virtual stages, ep)")
    if model == "calibrated":  # the knobs searched in full on the best meshes of the first pass
        best.sort(key=_rank)
        for i, p in enumerate(best[:REFINED]):
            best[i] = min(_searched(cfg, cl, p.dims, batch // p.dims.dp, *knobs) + [p],
                          key=_rank)
    return sorted(best, key=_rank)


REFINED = 16
"""The calibrated search's second pass: how many of the first pass's best meshes get every
micro-batch size and virtual-stage count."""


def _allowed(cfg, dims, batch, seq, m, v, ep) -> bool:
    try:
        parallel.check_model(cfg, dims, batch=batch, seq=seq, microbatches=m, virtual_stages=v,
                             ep=ep)
    except ValueError:
        return False
    return True


MICRO_BATCHES = (1, 2, 4, 8)
"""The micro-batch sizes the calibrated search tries (those that divide the per-replica batch;
the largest divisor below 8 when none of them does)."""
VIRTUAL_STAGES = (1, 2, 4)


def _searched(cfg, cl, dims, per_replica, microbatches, micro_batch, virtual_stages,
              recompute, zero, ep, common, *, quick: bool = False) -> list[Plan]:
    """The calibrated options of one mesh (`plan`'s docstring); `quick`: the first pass, one
    micro-batch size (the smallest) and one virtual-stage count (the largest up to 2)."""
    if micro_batch is not None:
        sizes = [micro_batch] if per_replica % micro_batch == 0 else []
    elif microbatches is not None:
        sizes = [per_replica // microbatches] if per_replica % microbatches == 0 else []
    else:
        sizes = [b for b in MICRO_BATCHES if per_replica % b == 0]
    vs = [virtual_stages] if virtual_stages else [
        x for x in VIRTUAL_STAGES if x == 1 or (dims.pp > 1 and
                                                cfg.n_layers % (dims.pp * x) == 0)]
    if quick:
        sizes, vs = sizes[:1], [max(x for x in vs if x <= 2)] if vs else []
    n_exp = getattr(cfg, "n_experts", 0)
    if ep:
        eps = [ep]
    else:
        eps = [x for x in (1, 2, 4, 8, 16, 32, 64)
               if x == 1 or (n_exp and n_exp % x == 0 and (dims.dp * dims.cp) % x == 0)]
    zeros = [zero] if zero is not None else ([0, 1, 2] if dims.dp_replicate > 1 else [0])
    recomputes = [recompute] if recompute else list(parallel.RECOMPUTE)
    order = [(z, r) for r in recomputes for z in zeros]
    sp = dims.tp > 1 if common["sequence_parallel"] is None else common["sequence_parallel"]
    out = []
    for v in vs:
        for e in eps:
            for b in sizes:
                m = per_replica // b
                if not _allowed(cfg, dims, common["batch"], common["seq"], m, v, e):
                    continue
                def fits(z, r, b=b, m=m, v=v, e=e):
                    mem = _memory(cfg, dims, micro=b, seq=common["seq"], m=m,
                                  recipe=common["recipe"], dtype=common["dtype"],
                                  sp=sp and dims.tp > 1, recompute=r, v=v, zero=z, ep=e)
                    return mem.total <= cl.accelerator.hbm_bytes

                chosen = order[-1]  # the least memory: when even it does not fit, no search
                if len(order) > 1 and fits(*chosen):
                    chosen = next(o for o in order if o == order[-1] or fits(*o))
                out.append(evaluate(cfg, cl, dims, microbatches=m, virtual_stages=v, ep=e,
                                    zero=chosen[0], recompute=chosen[1], **common))
    return out


def _same(seconds: float) -> float:
    """A time to 9 significant digits: meshes that hide all their communication tie exactly, up
    to the rounding of the sums that give them."""
    return float(f"{seconds:.9g}")


def _rank(p: Plan) -> tuple:
    if not p.fits:
        return (True, p.memory.total)
    return (False, _same(p.step_s), _same(p.traffic_s), p.n_axes, p.memory.total)


def ties(plans: list[Plan]) -> list[Plan]:
    """The plans that fit and tie with the first on step time (the ranking's first rule), in
    rank order: the first is the one the tie-breaks chose."""
    if not plans or not plans[0].fits:
        return []
    return [p for p in plans if p.fits and _same(p.step_s) == _same(plans[0].step_s)]


def crossing_axes(dims: parallel.ParallelDims, cluster: hardware.Cluster) -> tuple[str, ...]:
    """The mesh axes above 1 whose process groups span more ranks than a node holds (their
    collectives cross the network), in `parallel.MESH_AXES` order."""
    if not isinstance(cluster, hardware.Cluster):
        raise TypeError(f"cluster must be a hardware.Cluster, got {type(cluster).__name__}")
    return tuple(a for a in parallel.MESH_AXES
                 if getattr(dims, a) > 1 and dims.span(a) > cluster.per_node)


# --- the examples of chapter 09 and the one-pager -----------------------------------------------

LARGE_SIZES = dict(vocab_size=128_256, context_length=4_096, d_model=8_192, n_layers=80,
                   n_heads=64, d_ff=28_672)
"""Llama 3 70B's sizes (Dubey et al., 2024) in the book's architecture, without its grouped-query
attention: the across-nodes example (`TransformerConfig(**LARGE_SIZES)`)."""
LARGE_RUN = {"n_devices": 64, "batch": 512, "seq": 4_096}
"""The across-nodes example's devices (8 DGX nodes) and global batch (2 M tokens a step)."""


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


DATA_FAMILIES = ("dp", "fsdp", "dp+fsdp")
"""The families of data parallelism alone: copies, shards, or both (HSDP)."""


def map_facts(choices: dict[tuple[int, int], Plan | None]) -> dict[str, Any]:
    """What a map of `first_choices` shows, for the sentences that describe it. At the shortest
    sequence ("short"): the smallest batch from which every first choice is data parallelism alone
    ("dp_from", None if none is), and whether every smaller batch cuts the model, TP in its mesh
    ("cut_below"). At the largest batch: the shortest sequence whose choice has CP ("cp_from").
    The longest sequence at which something fits ("long"), whether every batch there has CP
    ("cp_at_long"), and the shortest at which nothing fits ("none", None if everything fits)."""
    if not choices:
        raise ValueError("choices must map at least one (batch, seq) to a plan")
    batches, seqs = sorted({b for b, _ in choices}), sorted({s for _, s in choices})
    fam = {k: family(p.dims) if p is not None else "" for k, p in choices.items()}
    short, big = seqs[0], batches[-1]
    data = [b for b in batches if all(fam[(c, short)] in DATA_FAMILIES
                                      for c in batches if c >= b)]
    dp_from = data[0] if data else None
    fitting = [s for s in seqs if any(choices[(b, s)] for b in batches)]
    long = max(fitting) if fitting else None
    return {"short": short, "dp_from": dp_from,
            "cut_below": all("tp" in fam[(b, short)] for b in batches
                             if dp_from is None or b < dp_from),
            "cp_from": next((s for s in seqs if "cp" in fam[(big, s)]), None), "long": long,
            "cp_at_long": long is not None and all("cp" in fam[(b, long)] for b in batches),
            "none": next((s for s in seqs if not any(choices[(b, s)] for b in batches)), None)}


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
