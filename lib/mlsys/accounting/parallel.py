"""4D parallelism on paper: the mesh, what each device holds, what it sends, the bubble, and when
compute hides communication.

A mesh of `ParallelDims` degrees, outermost axis first (`MESH_AXES`, torchtitan's order, so the
tensor-parallel ranks are neighbours, inside one node): pipeline `pp` (stages of consecutive
blocks), data `dp_replicate` (plain copies, gradients all-reduced), data `dp_shard` (FSDP, ZeRO-3),
context `cp` (sequence shards, ring attention) and tensor `tp` (Megatron: attention by heads,
SwiGLU by columns of w1, w3 and rows of w2). FSDP shards over dp_shard x cp (`fsdp`): the cp ranks
hold the same weights, so they can share the shards, as torchtitan does. Memory per device
(`device_memory`) and bytes per step (`sent_bytes`, exactly what `mlsys.distributed` sends, which
the tests count) follow from the degrees; the planner (`accounting.planner`) turns them into time.
Expert parallelism (`ep_*`: expert weights per rank, the all-to-all bytes of a mixture-of-experts
layer) is counted too, for the one-pager; it is not an axis of the mesh.

The pipeline bubble and schedules live in `accounting.pipeline`, the compute-bound conditions in
the Scaling Book's notation in `accounting.compute_bound`; both are re-exported here. Pure: no
torch. Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from mlsys import checks, hardware
from mlsys.accounting.activations import saved_bytes
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.compute_bound import (  # noqa: F401 (re-exported)
    LayerTimes,
    compute_bound_batch,
    ici_intensity,
    layer_times,
    optimal_compute_bound_batch,
    optimal_fsdp_degree,
)
from mlsys.accounting.memory import TrainingRecipe
from mlsys.accounting.memory import recipe as _recipe
from mlsys.accounting.params import config_sizes
from mlsys.accounting.pipeline import (  # noqa: F401 (re-exported: the bubble is part of 4D)
    SCHEDULES,
    bubble_fraction,
    in_flight,
    pipeline_schedule,
    pipeline_timeline,
    simulated_bubble_fraction,
)
from mlsys.dtypes import bytes_per_element

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Mesh axes, outermost first: rank = row-major index of its coordinates (tp varies fastest)."""


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of the five mesh axes; their product must be `world_size` (default: the product)."""

    dp_replicate: int = 1  # data-parallel copies (gradients all-reduced across them)
    dp_shard: int = 1  # FSDP shards (ZeRO-3: weights, gradients, optimizer state)
    tp: int = 1  # tensor-parallel ranks (one block's matrices split across them)
    pp: int = 1  # pipeline stages (consecutive blocks)
    cp: int = 1  # context-parallel ranks (the sequence split across them)
    world_size: int | None = field(default=None)

    def __post_init__(self) -> None:
        for axis in MESH_AXES:
            checks.positive_int(getattr(self, axis), axis)
        product = math.prod(self.shape)
        if self.world_size is None:
            object.__setattr__(self, "world_size", product)
        elif checks.positive_int(self.world_size, "world_size") != product:
            terms = " * ".join(f"{a} ({getattr(self, a)})" for a in MESH_AXES)
            raise ValueError(f"{terms} = {product} != world_size ({self.world_size})")

    @property
    def shape(self) -> tuple[int, ...]:
        """Degrees in `MESH_AXES` order."""
        return tuple(getattr(self, axis) for axis in MESH_AXES)

    @property
    def dp(self) -> int:
        """Ranks that see different samples: dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> int:
        """Ranks the weights are sharded over: dp_shard * cp."""
        return self.dp_shard * self.cp

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every axis."""
        r = checks.integer(rank, "rank", minimum=0)
        if r >= self.world_size:
            raise ValueError(f"rank ({r}) must be < world_size ({self.world_size})")
        out = {}
        for axis, size in reversed(list(zip(MESH_AXES, self.shape, strict=True))):
            r, out[axis] = divmod(r, size)
        return {axis: out[axis] for axis in MESH_AXES}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for axis, size in zip(MESH_AXES, self.shape, strict=True):
            rank = rank * size + coords[axis]
        return rank

    def group_ranks(self, rank: int, *axes: str) -> tuple[int, ...]:
        """The ranks that differ from `rank` only along `axes` (its process group over them)."""
        for axis in axes:
            checks.choice(axis, "axis", MESH_AXES)
        mine = self.coords(rank)
        grid = [()]
        for axis in axes:
            grid = [g + (i,) for g in grid for i in range(getattr(self, axis))]
        return tuple(sorted(self.rank_of({**mine, **dict(zip(axes, g, strict=True))})
                            for g in grid))

    def span(self, *axes: str) -> int:
        """Consecutive ranks a group over `axes` covers (how far apart its members sit): the
        product of its own and every inner axis' degree, up to the outermost of `axes`."""
        outer = min(MESH_AXES.index(checks.choice(a, "axis", MESH_AXES)) for a in axes)
        return math.prod(self.shape[outer:])


# --- what parallelism needs to know of a model ---------------------------------------------------


@dataclass(frozen=True)
class FeedForwardStack:
    """The Scaling Book's (and CS336's 4D-parallelism question's) model: n_layers blocks of two
    bias-free linears D -> F -> D, no activation function, no attention, embedding or head."""

    d_model: int
    d_ff: int
    n_layers: int

    def __post_init__(self) -> None:
        checks.positive_ints(d_model=self.d_model, d_ff=self.d_ff, n_layers=self.n_layers)

    @property
    def n_params(self) -> int:
        return 2 * self.d_model * self.d_ff * self.n_layers


XXL = FeedForwardStack(d_model=16_384, d_ff=53_248, n_layers=126)
"""The "XXL" model of CS336 (2025) assignment 2's 4D-parallelism question."""


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a model as parallelism cuts it; bytes are per token and per block."""

    n_layers: int
    d_model: int
    block_tp_params: int  # one block's parameters that TP splits (matrices)
    block_other_params: int  # one block's parameters every TP rank holds (norm gains)
    first_params: int  # held by the first pipeline stage only (embedding)
    last_params: int  # held by the last stage only (final norm, head)
    tp_must_divide: tuple[tuple[str, int], ...]  # (name, size) the TP degree must divide
    act_tp_bytes: float  # saved activations TP splits (per head or per d_ff column)
    act_norm_bytes: float  # saved by the norms: split by sequence parallelism only
    act_other_bytes: float  # saved whole on every TP rank (the projections' inputs)
    act_last_bytes: float  # per token, outside the blocks on the last stage (head, loss)
    training_flops_per_token: float  # model FLOPs of forward + backward

    def stage_params(self, stage: int, n_stages: int, tp: int) -> int:
        """Parameters a stage holds on one TP rank (before FSDP sharding)."""
        lo, hi = stage_layers(self.n_layers, n_stages)[stage]
        per_block = self.block_tp_params // tp + self.block_other_params
        return ((hi - lo) * per_block + (self.first_params if stage == 0 else 0)
                + (self.last_params if stage == n_stages - 1 else 0))


@functools.lru_cache(maxsize=64)
def model_shape(cfg, *, seq: int = 2, dtype: str = "bf16") -> ModelShape:
    """`ModelShape` of a `FeedForwardStack` or of the book's transformer (a `TransformerConfig`);
    activations in `dtype`, the transformer's attention counted as a fused kernel (no seq^2 term:
    ring attention and FlashAttention keep q, k, v, O and the log-sum-exp)."""
    b = bytes_per_element(dtype)
    if isinstance(cfg, FeedForwardStack):
        d, f = cfg.d_model, cfg.d_ff
        return ModelShape(cfg.n_layers, d, 2 * d * f, 0, 0, 0, (("d_ff", f),), f * b, 0, d * b, 0,
                          6 * 2 * d * f * cfg.n_layers)
    from mlsys.accounting.flops import training_flops_per_token
    from mlsys.accounting.params import param_counts

    _, d, h, f, n_layers = config_sizes(cfg, "vocab_size", "d_model", "n_heads", "d_ff",
                                            "n_layers")
    pc = param_counts(cfg)
    act = saved_bytes(cfg, 1, 2, dtype=dtype, attention="sdpa")  # linear in tokens: 2 of them
    parts = {k: v / 2 for k, v in act.components().items()}
    norm = parts["attn_norm"] + parts["ffn_norm"]
    other = parts["qkv_input"] + parts["ffn_input"]
    outside = act.outside_components()
    return ModelShape(
        n_layers, d, pc.attention_per_layer + pc.ffn_per_layer, pc.norms_per_layer,
        pc.embedding, pc.final_norm + pc.lm_head, (("n_heads", h), ("d_ff", f)),
        act.block_bytes / 2 - norm - other, norm, other,
        (outside["final_norm"] + outside["lm_head_input"] + outside["loss"]) / 2,
        training_flops_per_token(cfg, checks.positive_int(seq, "seq")))


def stage_layers(n_layers: int, n_stages: int) -> tuple[tuple[int, int], ...]:
    """[lo, hi) blocks of each pipeline stage: consecutive, the first stages one longer when
    n_stages does not divide n_layers."""
    n, p = checks.positive_int(n_layers, "n_layers"), checks.positive_int(n_stages, "n_stages")
    if p > n:
        raise ValueError(f"pp ({p}) must be <= n_layers ({n}): every stage needs a block")
    sizes = [n // p + (1 if s < n % p else 0) for s in range(p)]
    bounds = [sum(sizes[:s]) for s in range(p + 1)]
    return tuple((bounds[s], bounds[s + 1]) for s in range(p))


def check_model(cfg, dims: ParallelDims, *, batch: int, seq: int, microbatches: int = 1) -> None:
    """ValueError naming the first rule `dims` breaks for this model and batch (global `batch`
    sequences of `seq` tokens)."""
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    shape = model_shape(cfg)
    for name, size in shape.tp_must_divide:
        if size % dims.tp:
            raise ValueError(f"{name} ({size}) is not divisible by tp ({dims.tp})")
    stage_layers(shape.n_layers, dims.pp)
    checks.positive_ints(batch=batch, seq=seq, microbatches=microbatches)
    context = getattr(cfg, "context_length", None)
    if context is not None and seq > context:
        raise ValueError(f"seq ({seq}) must be <= context_length ({context})")
    if batch % (dims.dp * microbatches):
        raise ValueError(f"batch ({batch}) is not divisible by dp_replicate * dp_shard * "
                         f"microbatches = {dims.dp} * {microbatches} = {dims.dp * microbatches}")
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")


# --- memory per device ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device holds at its peak, by kind (the worst pipeline stage)."""

    weights: float
    grads: float
    master: float
    optimizer: float
    gathered: float  # FSDP: unsharded compute copies of the blocks in use (and prefetched)
    activations: float

    @property
    def states(self) -> float:
        return self.weights + self.grads + self.master + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.gathered + self.activations

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "grads": self.grads, "master": self.master,
                "optimizer": self.optimizer, "gathered": self.gathered,
                "activations": self.activations}


def device_memory(cfg, dims: ParallelDims, *, micro_batch: int, seq: int, microbatches: int = 1,
                  schedule: str = "1f1b", recipe: str | TrainingRecipe = "bf16_mixed_adamw",
                  act_dtype: str = "bf16", sequence_parallel: bool = False,
                  activation_shard_fraction: float = 0.0, gathered_units: int = 2) -> DeviceMemory:
    """Peak bytes per device, the largest over pipeline stages.

    Model states of a stage's parameters (after TP), divided by `dims.fsdp` when > 1 (ZeRO-3);
    `gathered_units` unsharded blocks in the recipe's weight dtype (the one in use and the one
    prefetched; 0 to leave them out); activations of `micro_batch` sequences of seq / cp tokens
    per block (TP splits heads and d_ff columns, sequence parallelism the norms) times the
    micro-batches in flight, of which `activation_shard_fraction` is sharded over `dims.fsdp`
    (the CS336 question's "half of the activations").
    """
    shape = cfg if isinstance(cfg, ModelShape) else model_shape(cfg, seq=seq, dtype=act_dtype)
    checks.positive_ints(micro_batch=micro_batch, seq=seq, microbatches=microbatches)
    frac = checks.number(activation_shard_fraction, "activation_shard_fraction", minimum=0.0,
                         maximum=1.0)
    per = _recipe(recipe).breakdown()
    tp, n = dims.tp, dims.fsdp
    tokens = micro_batch * seq / dims.cp
    block_act = (shape.act_tp_bytes / tp + shape.act_other_bytes
                 + shape.act_norm_bytes / (tp if sequence_parallel else 1))
    block_params = shape.block_tp_params / tp + shape.block_other_params
    best = None
    for stage, (lo, hi) in enumerate(stage_layers(shape.n_layers, dims.pp)):
        params = shape.stage_params(stage, dims.pp, tp) / (n if n > 1 else 1)
        flight = in_flight(stage, dims.pp, microbatches, schedule)
        act = (hi - lo) * block_act * tokens * flight
        if stage == dims.pp - 1:
            act += shape.act_last_bytes * tokens * in_flight(stage, dims.pp, microbatches,
                                                             schedule)
        act *= 1 - frac + frac / n
        gathered = min(gathered_units, hi - lo) * block_params * per["weights"] if n > 1 else 0
        mem = DeviceMemory(params * per["weights"], params * per["grads"], params * per["master"],
                           params * per["optimizer"], gathered, act)
        if best is None or mem.total > best.total:
            best = mem
    return best


def min_shards_to_fit(device_bytes: float, state_bytes: float, activation_bytes: float = 0.0, *,
                      activation_shard_fraction: float = 0.0) -> int:
    """Smallest N with state_bytes / N + A (1 - f + f / N) <= device_bytes (pure FSDP over N);
    ValueError when even N -> infinity does not fit."""
    m, s = checks.positive(device_bytes, "device_bytes"), checks.nonnegative(state_bytes,
                                                                             "state_bytes")
    a = checks.nonnegative(activation_bytes, "activation_bytes")
    f = checks.number(activation_shard_fraction, "activation_shard_fraction", minimum=0.0,
                      maximum=1.0)
    room = m - a * (1 - f)
    if room <= 0:
        raise ValueError(f"the unsharded activations alone ({a * (1 - f):.4g} B) fill the "
                         f"device ({m:.4g} B): no number of shards fits")
    n = max(1, math.ceil((s + a * f) / room))
    while n > 1 and (s + a * f) / (n - 1) <= room:  # guard against rounding up too far
        n -= 1
    return n


# --- bytes each rank sends per step (what mlsys.distributed does, call for call) ---------------


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


STRATEGY_AXES = {"all_gather": ("dp_shard", "cp"), "reduce_scatter": ("dp_shard", "cp"),
                 "replicate_all_reduce": ("dp_replicate",), "tp": ("tp",), "cp": ("cp",),
                 "pp": ("pp",)}
"""The mesh axes each entry of `sent_bytes` travels along."""


def comm_time_s(cfg, dims: ParallelDims, cluster: hardware.Cluster, rank: int = 0,
                **kwargs) -> dict[str, float]:
    """Seconds of each entry of `sent_bytes(cfg, dims, rank, **kwargs)` on `cluster`, before any
    overlap: bytes / the bandwidth of the slowest link its group crosses (`Cluster.ring_link` of
    the group's span: inside a node, or the network). Bandwidth only (no latency term): for ring
    collectives the bytes a rank sends are the bus bytes of `accounting.comms`, so this is
    `comms.time_s` with alpha = 0."""
    if not isinstance(cluster, hardware.Cluster):
        raise TypeError(f"cluster must be a hardware.Cluster, got {type(cluster).__name__}")
    sent = sent_bytes(cfg, dims, rank, **kwargs)
    return {kind: b / cluster.ring_link(dims.span(*STRATEGY_AXES[kind])).bytes_per_s if b else 0.0
            for kind, b in sent.items()}


# --- expert parallelism (mixture-of-experts layers; not an axis of the planner's mesh) -----------


def ep_expert_params(d_model: int, d_ff: int, n_experts: int, ep: int) -> int:
    """Expert parameters one rank holds when `n_experts` SwiGLU experts of width `d_ff` are spread
    over `ep` ranks: n_experts / ep experts of 3 d_model d_ff each (the router, d_model x
    n_experts, and the rest of the model are not counted: every rank holds them)."""
    checks.positive_ints(d_model=d_model, d_ff=d_ff, n_experts=n_experts, ep=ep)
    if n_experts % ep:
        raise ValueError(f"n_experts ({n_experts}) is not divisible by ep ({ep}): "
                         f"{n_experts} / {ep} = {n_experts / ep:g} experts per rank")
    return n_experts // ep * 3 * d_model * d_ff


def ep_sent_bytes(d_model: int, ep: int, *, tokens: int, top_k: int = 1, n_moe_layers: int = 1,
                  act_dtype: str = "bf16", capacity_factor: float = 1.0,
                  microbatches: int = 1) -> float:
    """Bytes a rank sends per step for expert parallelism (GShard, Lepikhin et al. 2020,
    https://arxiv.org/abs/2006.16668; Switch, Fedus et al. 2021, https://arxiv.org/abs/2101.03961).

    Per MoE layer and micro-batch of `tokens` on this rank, one all-to-all sends each token's
    d_model vector to each of its `top_k` experts (dispatch) and another brings the expert outputs
    back (combine); the backward sends their gradients the same two ways: 4 all-to-alls, each of
    a buffer of capacity_factor x top_k x tokens x d_model elements per rank (slots sized by the
    capacity factor travel whether filled or not), of which (ep - 1) / ep leaves the rank when
    the router spreads the tokens evenly (`comms.collective_cost("all_to_all")`)."""
    checks.positive_ints(d_model=d_model, ep=ep, tokens=tokens, top_k=top_k,
                         microbatches=microbatches)
    layers = checks.nonnegative_int(n_moe_layers, "n_moe_layers")
    cf = checks.positive(capacity_factor, "capacity_factor")
    buffer = cf * top_k * tokens * d_model * bytes_per_element(act_dtype)
    return microbatches * layers * 4 * collective_cost("all_to_all", buffer, ep).sent_bytes


def ep_compute_bound_d_ff(ep: int, *, flop_per_s: float, link_bytes_per_s: float,
                          act_dtype: str = "bf16") -> float:
    """Expert width above which a SwiGLU expert's forward and backward (3 matmuls of 2 d_model d_ff
    FLOPs per routed token, x 3 for the backward: 18 d_model d_ff) take longer than the token's
    4 all-to-all transfers (`ep_sent_bytes`, capacity factor 1) at `link_bytes_per_s`:

        18 D F / C > 4 D b (ep - 1) / ep / W   <=>   F > (2 / 9) b (ep - 1) / ep x C / W

    whatever the batch and top_k (both sides scale with the routed tokens). 0 for ep = 1."""
    e = checks.positive_int(ep, "ep")
    c = checks.positive(flop_per_s, "flop_per_s")
    w = checks.positive(link_bytes_per_s, "link_bytes_per_s")
    return 2 / 9 * bytes_per_element(act_dtype) * (e - 1) / e * c / w
