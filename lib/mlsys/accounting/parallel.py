"""4D parallelism on paper: the mesh, what a model is to it, and what each device holds.

A mesh of `ParallelDims` degrees, outermost axis first (`MESH_AXES`, torchtitan's order, so the
tensor-parallel ranks are neighbours, inside one node): pipeline `pp` (stages of consecutive
blocks), data `dp_replicate` (plain copies, gradients all-reduced), data `dp_shard` (FSDP, ZeRO-3),
context `cp` (sequence shards, ring attention) and tensor `tp` (Megatron: attention by heads,
SwiGLU by columns of w1, w3 and rows of w2). FSDP shards over dp_shard x cp (`FSDP_AXES`,
`ParallelDims.fsdp`): the cp ranks hold the same weights, so they can share the shards, as
torchtitan does. Memory per device (`device_memory`) follows from the degrees; the bytes each rank
sends per step are `accounting.parallel_traffic`, expert parallelism `accounting.experts`, and the
planner (`accounting.planner`) turns them into time.

The pipeline bubble and schedules live in `accounting.pipeline`, the compute-bound conditions in
the Scaling Book's notation in `accounting.compute_bound`; both are re-exported here. Pure: no
torch. A little over 300 lines: the mesh, its checks against the model and what each device
holds are one concept. Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from mlsys import checks
from mlsys.accounting.activations import saved_bytes
from mlsys.accounting.compute_bound import (  # noqa: F401 (re-exported)
    LayerTimes,
    compute_bound_batch,
    ici_intensity,
    layer_times,
    optimal_compute_bound_batch,
    optimal_fsdp_degree,
)
from mlsys.accounting.flops import training_flops_per_token
from mlsys.accounting.memory import TrainingRecipe
from mlsys.accounting.memory import recipe as _recipe
from mlsys.accounting.params import config_sizes, param_counts
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
FSDP_AXES = ("dp_shard", "cp")
"""The axes FSDP shards the weights over (the cp ranks hold the same weights, so they share)."""


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
        """Ranks the weights are sharded over: the product of the `FSDP_AXES` degrees."""
        return math.prod(getattr(self, axis) for axis in FSDP_AXES)

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
    _check_split(model_shape(cfg), dims)
    checks.positive_ints(batch=batch, seq=seq, microbatches=microbatches)
    context = getattr(cfg, "context_length", None)
    if context is not None and seq > context:
        raise ValueError(f"seq ({seq}) must be <= context_length ({context})")
    if batch % (dims.dp * microbatches):
        raise ValueError(f"batch ({batch}) is not divisible by dp_replicate * dp_shard * "
                         f"microbatches = {dims.dp} * {microbatches} = {dims.dp * microbatches}")
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")


def _check_split(shape: ModelShape, dims: ParallelDims) -> None:
    """ValueError unless tp divides every size it splits (heads, d_ff) and every pipeline
    stage gets a block."""
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    for name, size in shape.tp_must_divide:
        if size % dims.tp:
            raise ValueError(f"{name} ({size}) is not divisible by tp ({dims.tp})")
    stage_layers(shape.n_layers, dims.pp)


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
    (the CS336 question's "half of the activations"). Impossible meshes are a ValueError first:
    tp must divide the heads and d_ff, every stage needs a block, cp must divide seq.
    """
    checks.positive_ints(micro_batch=micro_batch, seq=seq, microbatches=microbatches)
    shape = cfg if isinstance(cfg, ModelShape) else model_shape(cfg, seq=seq, dtype=act_dtype)
    _check_split(shape, dims)
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")
    checks.nonnegative_int(gathered_units, "gathered_units")
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
