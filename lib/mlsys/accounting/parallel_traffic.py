"""The bytes each rank of a 4D mesh sends in a training step, and how long they take on a cluster.

Exactly what `mlsys.distributed` sends, call for call (the tests count it): FSDP's all-gathers
and reduce-scatters over `FSDP_AXES` (and HSDP's all-reduce across copies), Megatron's
all-reduces (all-gathers and reduce-scatters with sequence parallelism), ring attention's K and V
around the cp ranks, and the pipeline's point-to-point sends; `sent_bytes` adds them up for one
rank of a `ParallelDims` mesh, by strategy, and `comm_time_s` puts each on the slowest link its
group crosses. The mesh and the model's shape are `accounting.parallel`; the collectives'
bytes `accounting.comms`. Pure: no torch. Used in: chapter 09 (§sec-parallelism),
`mlsys.distributed`.
"""

from __future__ import annotations

from mlsys import checks, hardware
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.parallel import (
    FSDP_AXES,
    ModelShape,
    ParallelDims,
    check_model,
    model_shape,
    stage_layers,
)
from mlsys.dtypes import bytes_per_element


def padded(numel: int, n: int) -> int:
    """numel rounded up to a multiple of n: FSDP's flat parameter, in equal shards."""
    return -(-checks.nonnegative_int(numel, "numel") // checks.positive_int(n, "n")) * n


def fsdp_units(cfg, dims: ParallelDims, stage: int = 0) -> tuple[int, ...]:
    """Parameters of each FSDP unit of a stage on one TP rank: the root (the stage's parameters
    outside the blocks) when it has any, then one unit per block."""
    shape = cfg if isinstance(cfg, ModelShape) else model_shape(cfg)
    lo, hi = stage_layers(shape.n_layers, dims.pp)[stage]
    block = shape.block_tp_params // dims.tp + shape.block_other_params
    root = shape.stage_params(stage, dims.pp, dims.tp) - (hi - lo) * block
    return ((root,) if root else ()) + (block,) * (hi - lo)


def fsdp_sent_bytes(units, n_shards: int, *, param_dtype: str = "fp32",
                    reduce_dtype: str = "fp32", microbatches: int = 1,
                    n_replicas: int = 1) -> dict[str, float]:
    """Per micro-batch and unit: all-gather the weights before its forward and again before its
    backward (freed in between), reduce-scatter its gradient, and with `n_replicas` > 1 all-reduce
    the gradient shard across the copies (HSDP)."""
    n, r = checks.positive_int(n_shards, "n_shards"), checks.positive_int(n_replicas, "n_replicas")
    m = checks.positive_int(microbatches, "microbatches")
    pb, rb = bytes_per_element(param_dtype), bytes_per_element(reduce_dtype)
    out = {"all_gather": 0.0, "reduce_scatter": 0.0, "replicate_all_reduce": 0.0}
    for numel in checks.int_sequence(units, "units"):
        flat = padded(numel, n)
        out["all_gather"] += 2 * m * collective_cost("all_gather", flat * pb, n).sent_bytes
        out["reduce_scatter"] += m * collective_cost("reduce_scatter", flat * rb, n).sent_bytes
        out["replicate_all_reduce"] += m * collective_cost("all_reduce", flat // n * rb,
                                                           r).sent_bytes
    return out


def tp_sent_bytes(d_model: int, tp: int, *, tokens: int, n_blocks: int, act_dtype: str = "fp32",
                  sequence_parallel: bool = False, first: bool = True, last: bool = True,
                  microbatches: int = 1, gain_dtype: str = "fp32") -> float:
    """Megatron per block and micro-batch of `tokens` (b x s): forward all-reduce after o_proj
    and after w2 ("g"), backward all-reduce before attention and before the feed-forward ("f"):
    4 all-reduces of tokens x d_model. With sequence parallelism each becomes an all-gather and a
    reduce-scatter (the same bytes), the two norm gains' gradients are all-reduced, and the stream
    is gathered once more at the edges (backward of the split after the embedding, forward of the
    gather before the final norm)."""
    t = checks.positive_int(tp, "tp")
    checks.positive_ints(d_model=d_model, tokens=tokens, microbatches=microbatches)
    blocks = checks.nonnegative_int(n_blocks, "n_blocks")
    stream = tokens * d_model * bytes_per_element(act_dtype)
    per_block = 4 * collective_cost("all_reduce", stream, t).sent_bytes
    edges = 0.0
    if sequence_parallel:
        per_block += 2 * collective_cost("all_reduce", d_model * bytes_per_element(gain_dtype),
                                         t).sent_bytes
        edges = (first + last) * collective_cost("all_gather", stream, t).sent_bytes
    return microbatches * (blocks * per_block + edges)


def cp_sent_bytes(d_model: int, cp: int, *, tokens: int, n_blocks: int, tp: int = 1,
                  act_dtype: str = "fp32", grad_dtype: str = "fp32",
                  microbatches: int = 1) -> float:
    """Ring attention per block and micro-batch, `tokens` = b x s / cp on this rank: the forward
    passes K and V around the ring (cp - 1 sends); the backward passes them again with their
    gradient accumulators dK, dV (in `grad_dtype`), which take one more hop home (cp sends)."""
    c = checks.positive_int(cp, "cp")
    checks.positive_ints(d_model=d_model, tokens=tokens, tp=tp, microbatches=microbatches)
    blocks = checks.nonnegative_int(n_blocks, "n_blocks")
    kv = tokens * d_model // tp  # elements of K (or V) held by this rank: its heads only
    if c == 1:
        return 0.0
    per_block = (2 * (c - 1) * 2 * kv * bytes_per_element(act_dtype)
                 + c * 2 * kv * bytes_per_element(grad_dtype))
    return float(microbatches * blocks * per_block)


def pp_sent_bytes(stage: int, n_stages: int, *, activation_bytes: float,
                  microbatches: int = 1) -> float:
    """Point-to-point per micro-batch: the activation to the next stage (forward) and its
    gradient to the previous one (backward)."""
    p = checks.positive_int(n_stages, "n_stages")
    s = checks.integer(stage, "stage", minimum=0)
    if s >= p:
        raise ValueError(f"stage ({s}) must be < n_stages ({p}): stages are numbered from 0")
    act = checks.nonnegative(activation_bytes, "activation_bytes")
    m = checks.positive_int(microbatches, "microbatches")
    return m * act * ((s < p - 1) + (s > 0))


def sent_bytes(cfg, dims: ParallelDims, rank: int, *, batch: int, seq: int,
               microbatches: int = 1, param_dtype: str = "fp32", reduce_dtype: str = "fp32",
               act_dtype: str = "fp32", sequence_parallel: bool = False) -> dict[str, float]:
    """Bytes `rank` sends in one training step of `mlsys.distributed.mesh.parallelize`, by
    strategy (keys of `STRATEGY_AXES`); global `batch` sequences of `seq` tokens."""
    check_model(cfg, dims, batch=batch, seq=seq, microbatches=microbatches)
    shape, at = model_shape(cfg), dims.coords(rank)
    d, stage = shape.d_model, at["pp"]
    lo, hi = stage_layers(shape.n_layers, dims.pp)[stage]
    tokens = batch // dims.dp // microbatches * seq // dims.cp  # one micro-batch on this rank
    units = fsdp_units(shape, dims, stage)
    out = fsdp_sent_bytes(units, dims.fsdp, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                          microbatches=microbatches, n_replicas=dims.dp_replicate)
    common = {"tokens": tokens, "n_blocks": hi - lo, "microbatches": microbatches}
    out["tp"] = tp_sent_bytes(d, dims.tp, act_dtype=act_dtype, sequence_parallel=sequence_parallel,
                              first=stage == 0, last=stage == dims.pp - 1, **common)
    out["cp"] = cp_sent_bytes(d, dims.cp, tp=dims.tp, act_dtype=act_dtype, **common)
    out["pp"] = pp_sent_bytes(stage, dims.pp, microbatches=microbatches,
                              activation_bytes=tokens * d * bytes_per_element(act_dtype))
    return out


STRATEGY_AXES = {"all_gather": FSDP_AXES, "reduce_scatter": FSDP_AXES,
                 "replicate_all_reduce": ("dp_replicate",), "tp": ("tp",), "cp": ("cp",),
                 "pp": ("pp",)}
"""The mesh axes each entry of `sent_bytes` travels along."""


def group_link(dims: ParallelDims, cluster: hardware.Cluster, rank: int, *axes: str
               ) -> hardware.Link:
    """The link that bounds a ring over `rank`'s group along `axes` (`Cluster.group_link` of its
    ranks): inside a node its link; across nodes as many ports per node as the group has ranks
    in its emptiest node (whole nodes: the node's egress; one rank per node: one port)."""
    return cluster.group_link(dims.group_ranks(rank, *axes))


def comm_time_s(cfg, dims: ParallelDims, cluster: hardware.Cluster, rank: int = 0,
                **kwargs) -> dict[str, float]:
    """Seconds of each entry of `sent_bytes(cfg, dims, rank, **kwargs)` on `cluster`, before any
    overlap: bytes / the bandwidth of the link its group's ring is bound by (`group_link`; the
    pipeline's point-to-point sends `Cluster.send_link`). Bandwidth only (no latency term): for
    ring collectives the bytes a rank sends are the bus bytes of `accounting.comms`, so this is
    `comms.time_s` with alpha = 0."""
    if not isinstance(cluster, hardware.Cluster):
        raise TypeError(f"cluster must be a hardware.Cluster, got {type(cluster).__name__}")
    sent = sent_bytes(cfg, dims, rank, **kwargs)
    links = {kind: cluster.send_link(dims.span("pp")) if kind == "pp" else
             group_link(dims, cluster, rank, *axes) for kind, axes in STRATEGY_AXES.items()}
    return {kind: b / links[kind].bytes_per_s if b else 0.0 for kind, b in sent.items()}
