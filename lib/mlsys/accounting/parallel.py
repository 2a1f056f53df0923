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

The model may be any `TransformerConfig` (grouped-query attention, GeLU, LayerNorm, a tied head,
experts); `check_model` holds a mesh to the model's rules (heads, KV heads, d_ff, layers with the
interleaved schedule's virtual stages, experts with the expert-parallel degree ep, which is not a
mesh axis: it is carved from dp_replicate x dp_shard x cp). `device_memory` also takes activation
recomputation (none, selective, full: Korthikanti et al. 2022), interleaved 1F1B, the ZeRO stage
of the dp_replicate copies, expert parallelism and fp8; its closed forms are checked against
Korthikanti et al.'s Table 2 with their model's constants and against the book's saved bytes.

The pipeline bubble and schedules live in `accounting.pipeline`, the compute-bound conditions in
the Scaling Book's notation in `accounting.compute_bound`; both are re-exported here. Pure: no
torch. Over 300 lines: the mesh, its checks against the model and what each device holds are one
concept. Used in: chapter 09 (§sec-parallelism), `accounting.planner`, `python -m mlsys plan`.
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
from mlsys.dtypes import bytes_per_element, canonical

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
    """Sizes of a model as parallelism cuts it; bytes are per token and per block. The fields
    after `training_flops_per_token` default to a model without them (0: no GQA, no experts, no
    tied head, nothing for selective or full recomputation to drop)."""

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
    kv_heads: int = 0  # key/value heads (0: not a transformer); tp may exceed them (replicas)
    block_kv_params: int = 0  # the k and v projections of a block (inside block_tp_params)
    block_expert_params: int = 0  # a block's routed experts: split by tp and by ep
    tied_params: int = 0  # a tied head: the last stage's copy of the embedding when pp > 1
    act_core_bytes: float = 0.0  # of act_tp_bytes: what selective recomputation drops
    act_input_bytes: float = 0.0  # a block's input: what full recomputation keeps per block
    block_matmul_params: int = 0  # a block's matrices (fp8 keeps cast copies of them)

    def block_params(self, tp: int, ep: int = 1) -> float:
        """One block's parameters on one TP (and EP) rank, before FSDP: the matrices / tp (k and
        v: one head's worth on each rank when tp exceeds the KV heads, the heads replicated tp /
        kv_heads times), the routed experts / (tp ep), the rest whole."""
        kv_extra = 0.0
        if self.kv_heads and tp > self.kv_heads:
            kv_extra = self.block_kv_params * (1 / self.kv_heads - 1 / tp)
        return (self.block_tp_params / tp + kv_extra + self.block_other_params
                + self.block_expert_params / (tp * ep))

    def stage_params(self, stage: int, n_stages: int, tp: int, ep: int = 1) -> int:
        """Parameters a stage holds on one TP (and EP) rank (before FSDP sharding); an integer
        (the degrees `check_model` allows split every matrix evenly)."""
        lo, hi = stage_layers(self.n_layers, n_stages)[stage]
        if self.block_kv_params or self.block_expert_params:
            blocks = round((hi - lo) * self.block_params(tp, ep))
        else:  # the book's presets, exactly as before
            blocks = (hi - lo) * (self.block_tp_params // tp + self.block_other_params)
        last = self.last_params + (self.tied_params if n_stages > 1 else 0)
        return (blocks + (self.first_params if stage == 0 else 0)
                + (last if stage == n_stages - 1 else 0))


LINEAR_INPUTS = ("qkv_input", "o_proj_input", "ffn_input", "w2_input")
"""Saved tensors that are the inputs of a linear layer: fp8 recipes keep them in fp8."""
FFN_HIDDEN = ("w1_output", "w3_output", "silu_output", "w2_input", "act_output", "act_input",
              "gelu_output", "gelu_input", "relu_output")
"""Saved tensors of d_ff columns (a name missing from `saved_bytes` counts 0)."""


@functools.lru_cache(maxsize=64)
def model_shape(cfg, *, seq: int = 2, dtype: str = "bf16") -> ModelShape:
    """`ModelShape` of a `FeedForwardStack` or of a transformer (a `TransformerConfig`: GQA, GeLU,
    LayerNorm, tied head, biases, experts); activations in `dtype`, the transformer's attention
    counted as a fused kernel (no seq^2 term: ring attention and FlashAttention keep q, k, v, O
    and the log-sum-exp).

    A mixture of experts saves its d_ff tensors for each of the top-k experts a token visits and
    each shared expert (the dense count's d_ff tensors scaled by (k + shared) d_ff_expert / d_ff);
    the router's (N, n_experts) logits and the permuted token copies are left out. `dtype="fp8"`:
    the linear layers' inputs (`LINEAR_INPUTS`) are saved in fp8, 1 byte, as Transformer Engine
    keeps them for the weight gradients; every other tensor in bf16.
    """
    fp8 = canonical(dtype).startswith("fp8")
    act_dtype = "bf16" if fp8 else dtype
    b = bytes_per_element(act_dtype)
    if isinstance(cfg, FeedForwardStack):
        d, f = cfg.d_model, cfg.d_ff
        return ModelShape(cfg.n_layers, d, 2 * d * f, 0, 0, 0, (("d_ff", f),), f * b, 0, d * b, 0,
                          6 * 2 * d * f * cfg.n_layers, block_matmul_params=2 * d * f)
    _, d, h, f, n_layers = config_sizes(cfg, "vocab_size", "d_model", "n_heads", "d_ff",
                                            "n_layers")
    pc = param_counts(cfg)
    act = saved_bytes(cfg, 1, 2, dtype=act_dtype, attention="sdpa")  # linear in tokens: 2 of them
    parts = {k: v / 2 for k, v in act.components().items()}
    kv, d_head = getattr(cfg, "kv_heads", h), d // h
    must = [("n_heads", h), ("d_ff", f)]
    experts = router = 0
    if getattr(cfg, "is_moe", False):
        fe, n_mats = cfg.expert_d_ff, (3 if cfg.mlp == "swiglu" else 2)
        experts = cfg.n_experts * (n_mats * d * fe + ((n_mats - 1) * fe + d if cfg.bias else 0))
        router = d * cfg.n_experts
        scale = (cfg.experts_per_token + cfg.n_shared_experts) * fe / f
        for name in FFN_HIDDEN:
            if name in parts:
                parts[name] *= scale
        must = [("n_heads", h), ("d_ff_expert", fe)]
    if fp8:
        for name in LINEAR_INPUTS:
            parts[name] = parts.get(name, 0) / b
    norm = parts.get("attn_norm", 0) + parts.get("ffn_norm", 0)
    other = parts.get("qkv_input", 0) + parts.get("ffn_input", 0)
    q_k_v = (d + 2 * kv * d_head) * b  # the core's inputs: kept by selective recomputation
    core = max(0.0, parts.get("attention", 0) - q_k_v)
    outside = act.outside_components()
    kv_params = 2 * d * kv * d_head + (2 * kv * d_head if getattr(cfg, "bias", False) else 0)
    block_total = pc.per_layer
    tp_params = block_total - pc.norms_per_layer - experts - router
    tied = getattr(cfg, "tie_embeddings", False)
    head = pc.final_norm + pc.lm_head
    return ModelShape(
        n_layers, d, tp_params, pc.norms_per_layer + router,
        pc.total - n_layers * block_total - head, head, tuple(must),
        sum(parts.values()) - norm - other, norm, other,
        (outside["final_norm"] + outside["lm_head_input"] + outside["loss"]) / 2,
        training_flops_per_token(cfg, checks.positive_int(seq, "seq")),
        kv_heads=kv if kv != h else 0, block_kv_params=kv_params if kv != h else 0,
        block_expert_params=experts, tied_params=pc.embedding if tied and not pc.lm_head else 0,
        act_core_bytes=core, act_input_bytes=d * b, block_matmul_params=tp_params + experts)


@functools.lru_cache(maxsize=4096)  # the planner asks for the same split per stage and mesh
def stage_layers(n_layers: int, n_stages: int) -> tuple[tuple[int, int], ...]:
    """[lo, hi) blocks of each pipeline stage: consecutive, the first stages one longer when
    n_stages does not divide n_layers."""
    n, p = checks.positive_int(n_layers, "n_layers"), checks.positive_int(n_stages, "n_stages")
    if p > n:
        raise ValueError(f"pp ({p}) must be <= n_layers ({n}): every stage needs a block")
    sizes = [n // p + (1 if s < n % p else 0) for s in range(p)]
    bounds = [sum(sizes[:s]) for s in range(p + 1)]
    return tuple((bounds[s], bounds[s + 1]) for s in range(p))


def check_model(cfg, dims: ParallelDims, *, batch: int, seq: int, microbatches: int = 1,
                virtual_stages: int = 1, ep: int = 1) -> None:
    """ValueError naming the first rule `dims` breaks for this model and batch (global `batch`
    sequences of `seq` tokens), before any work: tp divides the heads and d_ff (an expert's
    d_ff for a mixture of experts); tp divides the KV heads, or the KV heads divide tp and each
    TP rank holds one KV head, replicated tp / kv_heads times (our choice: vLLM and
    TensorRT-LLM replicate so; Megatron-Core's and torchtitan's training code split the KV heads
    only, so a mesh with tp > kv_heads is one they would refuse); pp x `virtual_stages` <=
    n_layers, and n_layers divisible by pp x v when v > 1
    (Megatron-LM's interleaved schedule gives each model chunk as many blocks), v > 1 only with
    pp > 1; `ep` > 1 only for a mixture of experts, dividing n_experts and dp_replicate x
    dp_shard x cp (the ranks expert parallelism is carved from: Megatron-Core forms its expert
    groups inside data x context parallelism; torchtitan borrows them from dp_shard x cp)."""
    _check_split(model_shape(cfg), dims)
    checks.positive_ints(batch=batch, seq=seq, microbatches=microbatches,
                         virtual_stages=virtual_stages, ep=ep)
    _check_stages(model_shape(cfg).n_layers, dims.pp, virtual_stages)
    _check_experts(cfg, dims, ep)
    context = getattr(cfg, "context_length", None)
    if context is not None and seq > context:
        raise ValueError(f"seq ({seq}) must be <= context_length ({context})")
    if batch % (dims.dp * microbatches):
        raise ValueError(f"batch ({batch}) is not divisible by dp_replicate * dp_shard * "
                         f"microbatches = {dims.dp} * {microbatches} = {dims.dp * microbatches}")
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")


def check_degrees(cfg, *, tp: int = 1, pp: int = 1, virtual_stages: int = 1,
                  ep: int = 1) -> None:
    """The rules of `check_model` that the model alone sets, for degrees held before a mesh is
    searched (the command line's --tp, --pp, --virtual-stages, --ep): tp against the heads, the
    KV heads and d_ff; pp x v against the layers; ep against the experts. ValueError naming the
    degree and the rule."""
    checks.positive_ints(tp=tp, pp=pp, virtual_stages=virtual_stages, ep=ep)
    shape = model_shape(cfg)
    _check_split(shape, ParallelDims(tp=tp, pp=pp))
    _check_stages(shape.n_layers, pp, virtual_stages)
    if ep > 1:  # the experts' rules only: the data-parallel degrees are not chosen yet
        _check_experts(cfg, ParallelDims(dp_shard=ep), ep)


def _check_stages(n_layers: int, pp: int, v: int) -> None:
    if v == 1:
        return
    if pp == 1:
        raise ValueError(f"virtual_stages ({v}) > 1 needs pp > 1: interleaving splits each "
                         "pipeline stage into v model chunks")
    if pp * v > n_layers:
        raise ValueError(f"pp * virtual_stages = {pp} * {v} = {pp * v} must be <= n_layers "
                         f"({n_layers}): every model chunk needs a block")
    if n_layers % (pp * v):
        raise ValueError(f"n_layers ({n_layers}) is not divisible by pp * virtual_stages = "
                         f"{pp} * {v} = {pp * v} (the interleaved schedule's model chunks "
                         "hold equal numbers of blocks)")


def _check_experts(cfg, dims: ParallelDims, ep: int) -> None:
    if ep == 1:
        return
    n_experts = getattr(cfg, "n_experts", 0)
    if not n_experts:
        raise ValueError(f"ep ({ep}) > 1 needs a mixture of experts (n_experts >= 1); this "
                         "model is dense")
    if n_experts % ep:
        raise ValueError(f"n_experts ({n_experts}) is not divisible by ep ({ep})")
    carved = dims.dp * dims.cp
    if carved % ep:
        raise ValueError(f"ep ({ep}) does not divide dp_replicate * dp_shard * cp = "
                         f"{dims.dp_replicate} * {dims.dp_shard} * {dims.cp} = {carved}, the "
                         "ranks expert parallelism is carved from")


def _check_split(shape: ModelShape, dims: ParallelDims) -> None:
    """ValueError unless tp divides every size it splits (heads, d_ff), tp and the KV heads
    divide one another, and every pipeline stage gets a block."""
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    for name, size in shape.tp_must_divide:
        if size % dims.tp:
            raise ValueError(f"{name} ({size}) is not divisible by tp ({dims.tp})")
    kv = shape.kv_heads
    if kv and kv % dims.tp and dims.tp % kv:
        raise ValueError(f"n_kv_heads ({kv}) and tp ({dims.tp}) must divide one another: tp "
                         "splits the KV heads, or each TP rank holds one KV head, replicated "
                         "tp / n_kv_heads times")
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


RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", https://arxiv.org/abs/2205.05198): none; selective (the attention core is
recomputed: its saved tensors beyond q, k and v are dropped, Section 5); full (each block keeps
only its input and is recomputed whole in the backward, Section 4.3 "Activation memory")."""
ZERO_STAGES = (0, 1, 2)
"""ZeRO stages of the dp_replicate axis (Rajbhandari et al. 2020): 0 replicates every state, 1
shards the fp32 master weights and the optimizer state, 2 the gradients too. The dp_shard axis is
ZeRO-3 (FSDP) whatever the stage."""


def device_memory(cfg, dims: ParallelDims, *, micro_batch: int, seq: int, microbatches: int = 1,
                  schedule: str = "1f1b", recipe: str | TrainingRecipe = "bf16_mixed_adamw",
                  act_dtype: str = "bf16", sequence_parallel: bool = False,
                  activation_shard_fraction: float = 0.0, gathered_units: int = 2,
                  recompute: str = "none", virtual_stages: int = 1, zero: int | None = None,
                  ep: int = 1) -> DeviceMemory:
    """Peak bytes per device, the largest over pipeline stages.

    Model states of a stage's parameters (after TP; the routed experts also / `ep`), divided by
    `dims.fsdp` when > 1 (ZeRO-3; experts by what of dims.fsdp ep does not already cover);
    `zero` 1 or 2 also shards the master weights and optimizer state (1) and the gradients (2)
    over the dp_replicate copies (None or 0: replicated, the default before `zero` existed);
    `gathered_units` unsharded blocks in the recipe's weight dtype (the one in use and the one
    prefetched; 0 to leave them out); activations of `micro_batch` sequences of seq / cp tokens
    per block (TP splits heads and d_ff columns, sequence parallelism the norms) times the
    micro-batches in flight, of which `activation_shard_fraction` is sharded over `dims.fsdp`
    (the CS336 question's "half of the activations"). Impossible meshes are a ValueError first:
    tp must divide the heads and d_ff, every stage needs a block, cp must divide seq.

    `recompute` (`RECOMPUTE`): "selective" drops the attention core's saved tensors beyond its
    inputs q, k, v (`ModelShape.act_core_bytes`); "full" keeps each block's input (split by
    sequence parallelism) and, during the backward, one block's whole activations for one
    micro-batch. `virtual_stages` v > 1 is interleaved 1F1B (Narayanan et al. 2021): stage s
    runs 2 (p - s - 1) + (v - 1) p warm-up forwards of model chunks of n_layers / (p v) blocks
    before its first backward (Megatron-LM's schedule), so the first stage holds
    n_layers (1 + (p - 1) / (p v)) blocks' activations, Korthikanti et al.'s factor
    (Section 4.2.3) against n_layers for plain 1F1B. `act_dtype` "fp8": the linear layers'
    inputs are saved in fp8 (`model_shape`), and each device also keeps fp8 copies of the block
    matrices it computes with, cast once a step and reused by every micro-batch (Transformer
    Engine's weight cache: 2 bytes per parameter, the weight and its transpose, since Hopper's
    fp8 GEMMs take one layout), counted in `gathered`.
    """
    checks.positive_ints(micro_batch=micro_batch, seq=seq, microbatches=microbatches,
                         virtual_stages=virtual_stages, ep=ep)
    checks.choice(recompute, "recompute", RECOMPUTE)
    if zero is not None and (isinstance(zero, bool) or zero not in ZERO_STAGES):
        raise ValueError(f"zero must be None, 0, 1 or 2 (the dp_replicate axis' ZeRO stage; "
                         f"dp_shard is ZeRO-3), got {zero!r}")
    fp8 = canonical(act_dtype).startswith("fp8")
    shape = cfg if isinstance(cfg, ModelShape) else model_shape(cfg, seq=seq, dtype=act_dtype)
    _check_split(shape, dims)
    _check_stages(shape.n_layers, dims.pp, virtual_stages)
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")
    if ep > 1 and not shape.block_expert_params:
        raise ValueError(f"ep ({ep}) > 1 needs a mixture of experts; this model is dense")
    if (dims.dp * dims.cp) % ep:
        raise ValueError(f"ep ({ep}) does not divide dp_replicate * dp_shard * cp = "
                         f"{dims.dp * dims.cp}, the ranks expert parallelism is carved from")
    checks.nonnegative_int(gathered_units, "gathered_units")
    frac = checks.number(activation_shard_fraction, "activation_shard_fraction", minimum=0.0,
                         maximum=1.0)
    per = _recipe(recipe).breakdown()
    tp, n, v, p = dims.tp, dims.fsdp, virtual_stages, dims.pp
    tokens = micro_batch * seq / dims.cp
    sp = tp if sequence_parallel else 1
    block_act = shape.act_tp_bytes / tp + shape.act_other_bytes + shape.act_norm_bytes / sp
    if recompute == "selective":
        block_act -= shape.act_core_bytes / tp
    block_params = shape.block_params(tp, ep)
    expert_block = shape.block_expert_params / (tp * ep)
    expert_shards = n // math.gcd(n, ep)  # FSDP over the dp_shard x cp ranks ep leaves
    copies = dims.dp_replicate * math.gcd(n, ep) / ep  # dp_replicate copies of an expert shard
    best = None
    for stage, (lo, hi) in enumerate(stage_layers(shape.n_layers, p)):
        held = shape.stage_params(stage, p, tp, ep)
        experts = (hi - lo) * expert_block
        dense = held - experts
        params = dense / (n if n > 1 else 1) + experts / expert_shards
        rep = (dense / (n if n > 1 else 1)) / dims.dp_replicate + experts / expert_shards / copies
        states = {kind: params * per[kind] for kind in ("weights", "grads", "master", "optimizer")}
        for kind, stage_needed in (("master", 1), ("optimizer", 1), ("grads", 2)):
            if zero is not None and zero >= stage_needed:
                states[kind] = rep * per[kind]
        if v == 1:
            layers = (hi - lo) * in_flight(stage, p, microbatches, schedule)
        else:  # chunks of n_layers / (p v) blocks in flight after the warm-up forwards
            chunks = min(microbatches * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
            layers = chunks * shape.n_layers // (p * v)
        if recompute == "full":
            act = (layers * shape.act_input_bytes / sp + block_act) * tokens
        else:
            act = layers * block_act * tokens
        if stage == p - 1:
            act += shape.act_last_bytes * tokens * (in_flight(stage, p, microbatches, schedule)
                                                    if v == 1 else 1)
        act *= 1 - frac + frac / n
        gathered = min(gathered_units, hi - lo) * block_params * per["weights"] if n > 1 else 0
        if fp8:  # the cast weights and their transposes, 1 byte each
            matmul = shape.block_matmul_params / tp
            gathered += 2 * matmul * (min(gathered_units, hi - lo) if n > 1 else (hi - lo))
        mem = DeviceMemory(states["weights"], states["grads"], states["master"],
                           states["optimizer"], gathered, act)
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
