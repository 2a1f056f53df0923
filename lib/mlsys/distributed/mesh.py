"""Meshes of process groups, and the one order in which the strategies compose.

A `Mesh` is this rank's process group along every axis of `accounting.parallel.ParallelDims`
(`MESH_AXES`, outermost first: pp, dp_replicate, dp_shard, cp, tp; tp varies fastest, so a TP
group is a run of neighbouring ranks, one node), plus "fsdp" (`FSDP_AXES`, dp_shard x cp: the
ranks that share the weights' shards). Groups are built with `new_group(...,
use_local_synchronization=True)`, each rank joining only its own; nothing is global: the mesh is
passed to whatever needs a group.

`parallelize(model, mesh)` applies the strategies to the unmodified book model in this order:

1. PP  `pp.apply_pp`: keep this rank's stage (always a `PipelineStage`; one stage when pp = 1),
       so the later steps only touch the blocks this rank runs;
2. TP  `tp.apply_tp`: split the stage's matrices over "tp" (with sequence parallelism if asked);
       before FSDP, because FSDP flattens whatever parameters the blocks hold, TP slices included;
3. CP  `cp.apply_cp`: ring attention over "cp" (modules only, no parameters: order-free after TP);
4. FSDP `fsdp.apply_fsdp`: shard each block's (already TP-sliced) parameters over "fsdp", the
       gradients averaged over dp_shard x cp; with dp_replicate > 1, HSDP: shard gradients also
       all-reduced over "dp_replicate". Last, so it sees the final parameters.
(torchtitan applies TP, then activation checkpointing and compile, then FSDP: the same rule.)
`train_step` then runs `pp.pipeline_step` on this rank's share of the batch (`local_batch`).
Sequence parallelism needs pp = 1 here (the stream sent between stages would be split).
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mlsys import checks
from mlsys.accounting.parallel import FSDP_AXES, MESH_AXES, ParallelDims
from mlsys.distributed import cp as _cp
from mlsys.distributed import fsdp as _fsdp
from mlsys.distributed import pp as _pp
from mlsys.distributed import tp as _tp
from mlsys.distributed.groups import check_initialized

GROUPS = {**{axis: (axis,) for axis in MESH_AXES}, "fsdp": FSDP_AXES}
"""Every group a mesh holds: name -> the axes it spans."""


@dataclass
class Mesh:
    """This rank's place in the mesh and its group along every axis of `GROUPS`."""

    dims: ParallelDims
    rank: int
    coords: dict[str, int]
    groups: dict[str, Any]

    def group(self, name: str) -> Any:
        return self.groups[checks.choice(name, "name", GROUPS)]

    @property
    def dp_index(self) -> int:
        """Which slice of the batch this rank trains on."""
        return self.coords["dp_replicate"] * self.dims.dp_shard + self.coords["dp_shard"]


def build_mesh(dims: ParallelDims) -> Mesh:
    """This rank's groups for `dims` (every rank of the world calls it, in any order)."""
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    check_initialized()
    world = dist.get_world_size()
    if world != dims.world_size:
        raise ValueError(f"dims describe {dims.world_size} ranks but the world has {world}")
    rank = dist.get_rank()
    groups = {name: dist.new_group(list(dims.group_ranks(rank, *axes)),
                                   use_local_synchronization=True)
              for name, axes in GROUPS.items()}
    return Mesh(dims, rank, dims.coords(rank), groups)


def parallelize(model, mesh: Mesh, *, seq: int, sequence_parallel: bool = False,
                cp_layout: str = "zigzag", compute_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype = torch.float32,
                prefetch: bool = True) -> _pp.PipelineStage:
    """This rank's stage of `model` (a Transformer) with every strategy of `mesh` applied, in the
    module docstring's order; `seq` is the full sequence length (context parallelism splits it)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a Mesh (from build_mesh), got {type(mesh).__name__}")
    d = mesh.dims
    if sequence_parallel and d.pp > 1:
        raise ValueError(f"sequence_parallel needs pp = 1 here, got pp = {d.pp}: the stream "
                         "sent between stages would be split along the sequence")
    stage = _pp.apply_pp(model, mesh.group("pp"))
    if d.tp > 1:
        _tp.apply_tp(stage, mesh.group("tp"), sequence_parallel=sequence_parallel)
    if d.cp > 1:
        _cp.apply_cp(stage, mesh.group("cp"), seq=seq, layout=cp_layout)
    _fsdp.apply_fsdp(stage, mesh.group("fsdp"), compute_dtype=compute_dtype,
                     reduce_dtype=reduce_dtype, prefetch=prefetch,
                     replicate_group=mesh.group("dp_replicate") if d.dp_replicate > 1 else None)
    return stage


def local_batch(tokens: Tensor, mesh: Mesh, *, cp_layout: str = "zigzag"
                ) -> tuple[Tensor, Tensor]:
    """This rank's (inputs, targets) from the global (batch, seq + 1) tokens: its data-parallel
    slice of the batch, and its context-parallel positions of each sequence."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise ValueError(f"tokens must be a (batch, seq + 1) tensor, got "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    d = mesh.dims
    if tokens.shape[0] % d.dp:
        raise ValueError(f"batch ({tokens.shape[0]}) is not divisible by dp_replicate * dp_shard "
                         f"= {d.dp}")
    mine = tokens.chunk(d.dp)[mesh.dp_index]
    if d.cp > 1:
        return _cp.shard_tokens(mine, d.cp, mesh.coords["cp"], cp_layout)
    return mine[:, :-1], mine[:, 1:]


def train_step(stage: _pp.PipelineStage, mesh: Mesh, tokens: Tensor, *, microbatches: int = 1,
               schedule: str = "1f1b", cp_layout: str = "zigzag",
               activation_dtype: torch.dtype = torch.float32) -> _pp.PipelineStep:
    """Forward and backward of one step on every rank (the optimizer step is the caller's)."""
    inputs, targets = local_batch(tokens, mesh, cp_layout=cp_layout)
    return _pp.pipeline_step(stage, inputs, targets, microbatches=microbatches, schedule=schedule,
                             activation_dtype=activation_dtype)


def full_state(stage: _pp.PipelineStage, mesh: Mesh, *, grads: bool = False) -> dict[str, Tensor]:
    """The weights (or gradients) of this rank's stage, unsharded and named as in the whole
    model (a collective over the mesh's fsdp and tp groups)."""
    named = stage.fsdp.unsharded(grads=grads) if hasattr(stage, "fsdp") else {
        n: (p.grad if grads else p.detach()) for n, p in stage.named_parameters()}
    if mesh.dims.tp > 1:
        named = _tp.unsharded(named, stage, mesh.group("tp"))
    return {stage.model_name(n): t for n, t in named.items()}
