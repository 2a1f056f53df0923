"""The DeviceMesh of a run and the order in which torch's own strategies are applied to the model.

`device_mesh(dims, device)` is `init_device_mesh` over the five axes of
`accounting.parallel.MESH_AXES` (pp outermost, tp innermost: a TP group is a run of neighbouring
ranks, one node). `build(run, mesh)` then makes this rank's part of the book's `Transformer`:

1. PP  this rank's `Stage`: the embedding (first stage), its blocks, the head (last stage), with
       the blocks under their global numbers, so state-dict keys are the whole model's (a
       checkpoint saved under one pipeline loads under another);
2. TP  `parallelize_module` on mesh["tp"]: q, k, v, w1, w3 column-wise and o, w2 row-wise
       (Megatron); with sequence parallelism the norms, the embedding's output and the head's
       input are split along the sequence (as torchtitan's Llama plan);
3. FSDP `fully_shard` on every block, then on the stage, over mesh["dp_shard"] (or
       mesh["dp_replicate", "dp_shard"], HSDP), with the chapter-07 policy's
       `MixedPrecisionPolicy`; applied even on one rank, so every mesh computes alike.
Pipelines run through `torch.distributed.pipelining` (Schedule1F1B) over mesh["pp"].
The hand-written versions of each are `mlsys.distributed` (tested equal in tests/test_train.py).
Reference: the torchtitan `parallelize_llama` order (TP, then FSDP). Used in: chapter 10.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from mlsys import dtypes
from mlsys.accounting.parallel import FSDP_AXES, MESH_AXES, ParallelDims, stage_layers
from mlsys.distributed.fsdp_precision import mixed_precision_policy
from mlsys.models.transformer import Transformer
from mlsys.train.options import Run


class Stage(nn.Module):
    """The layers of `model` that pipeline stage `stage` of `n_stages` runs; blocks keep their
    numbers in the whole model (`blocks.<i>`), so names match `Transformer.state_dict()`."""

    def __init__(self, model: Transformer, stage: int = 0, n_stages: int = 1):
        super().__init__()
        lo, hi = stage_layers(len(model.blocks), n_stages)[stage]
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.config = model.config
        self.rope = model.rope
        self.token_embedding = model.token_embedding if self.is_first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(lo, hi)})
        self.final_norm = model.final_norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None

    def forward(self, x: Tensor) -> Tensor:
        """Tokens (batch, seq) on the first stage, else activations (batch, seq, d_model);
        logits (batch, seq, vocab) out of the last stage, activations elsewhere."""
        cos, sin = self.rope(x.shape[1])
        if self.token_embedding is not None:
            x = self.token_embedding(x)
        for block in self.blocks.values():
            x = block(x, cos, sin)
        if self.lm_head is not None:
            x = self.lm_head(self.final_norm(x))
        return x


def device_mesh(dims: ParallelDims, device: str) -> Any:
    """The run's DeviceMesh over `MESH_AXES` (every axis, degree 1 included)."""
    return init_device_mesh(device, dims.shape, mesh_dim_names=MESH_AXES)


def dp_mesh(mesh: Any, dims: ParallelDims) -> Any:
    """The axes FSDP works over: those of `FSDP_AXES` (dp_shard x cp) with a degree above 1, else
    dp_shard; after dp_replicate for HSDP: dp_shard, or (dp_replicate, dp_shard). Context
    parallelism is refused by `options`, so the shards lie along one axis."""
    shard = [axis for axis in FSDP_AXES if getattr(dims, axis) > 1] or ["dp_shard"]
    if len(shard) > 1:
        raise ValueError(f"FSDP over several axes ({', '.join(shard)}) needs them flattened into "
                         "one: the entry point shards over dp_shard alone (cp = 1)")
    names = ("dp_replicate", *shard) if dims.dp_replicate > 1 else tuple(shard)
    return mesh[names] if len(names) > 1 else mesh[names[0]]


def apply_tp(stage: Stage, tp_mesh: Any, *, sequence_parallel: bool) -> None:
    """Megatron's split of every block over `tp_mesh` by `parallelize_module`; attention's
    `n_heads` becomes the local count. With `sequence_parallel`, norms run on sequence shards."""
    n = tp_mesh.size()
    out = {"output_layouts": Shard(1)} if sequence_parallel else {}
    plan: dict[str, Any] = {**{f"attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj",
                                                                         "v_proj")},
                            "attn.o_proj": RowwiseParallel(**out),
                            "ffn.w1": ColwiseParallel(), "ffn.w2": RowwiseParallel(**out)}
    if hasattr(next(iter(stage.blocks.values())).ffn, "w3"):  # SwiGLU's gate; GeLU has none
        plan["ffn.w3"] = ColwiseParallel()
    if sequence_parallel:
        gather = {"input_layouts": (Shard(1), None, None),
                  "desired_input_layouts": (Replicate(), None, None)}
        plan.update({"attn_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                     "attn": PrepareModuleInput(**gather),
                     "ffn": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),))})
        top: dict[str, Any] = {}
        if stage.token_embedding is not None:
            top["token_embedding"] = RowwiseParallel(input_layouts=Replicate(),
                                                     output_layouts=Shard(1))
        if stage.lm_head is not None:
            top["final_norm"] = SequenceParallel()
            top["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        parallelize_module(stage, tp_mesh, top)
    for block in stage.blocks.values():
        parallelize_module(block, tp_mesh, plan)
        block.attn.n_heads //= n


def apply_fsdp(stage: Stage, mesh: Any, policy: Any) -> None:
    """FSDP2 on every block, then the stage, with the policy's mixed precision."""
    mp = mixed_precision_policy(policy)
    for block in stage.blocks.values():
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(stage, mesh=mesh, mp_policy=mp)


def build(run: Run, mesh: Any) -> Stage:
    """This rank's stage of a freshly initialized model (seed `run.options.seed`, the same on
    every rank), with PP, TP and FSDP applied in the module docstring's order."""
    d, device = run.dims, torch.device(run.device, torch.cuda.current_device()
                                       if run.device == "cuda" else None)
    torch.manual_seed(run.options.seed)
    model = Transformer(run.config)  # on the CPU: every rank draws the same weights
    if run.policy.update_dtype != "fp32":  # the shards hold what the optimizer updates: fp32
        model = model.to(dtypes.torch_dtype(run.policy.update_dtype))  # or pure bf16 weights
    stage = Stage(model, mesh["pp"].get_local_rank(), d.pp).to(device)
    if d.tp > 1:
        apply_tp(stage, mesh["tp"], sequence_parallel=run.options.sequence_parallel)
    apply_fsdp(stage, dp_mesh(mesh, d), run.policy)
    return stage


def pipeline(stage: Stage, run: Run, mesh: Any, loss_fn: Any) -> Any:
    """A `Schedule1F1B` over mesh["pp"] for this stage, `run.accumulation` micro-batches."""
    device = next(stage.parameters()).device
    theirs = PipelineStage(stage, mesh["pp"].get_local_rank(), run.dims.pp, device,
                           group=mesh["pp"].get_group())
    return Schedule1F1B(theirs, run.accumulation, loss_fn=loss_fn)


def grad_norm(stage: Stage, pp_group: Any) -> Tensor:
    """The L2 norm of the whole model's gradient, across every shard and stage (fp32 scalar).

    A DTensor gradient's sum of squares is a DTensor reduction (`full_tensor` all-reduces the
    partial sums over exactly the mesh dimensions it is split on: summing the local squares over
    `device_mesh.get_group(i)` by hand miscounted FSDP2's strided shards on a 2-D mesh, giving
    each data-parallel rank another norm). The stages' sums are added over `pp_group` (None: a
    run without a pipeline, one stage).
    """
    total = torch.zeros((), dtype=torch.float32, device=next(stage.parameters()).device)
    for p in stage.parameters():
        g = p.grad
        if g is None:
            continue
        square = g.detach().float().pow(2).sum()
        total += square.full_tensor() if isinstance(square, DTensor) else square
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


def clip_(stage: Stage, max_norm: float, norm: Tensor) -> None:
    """Scale every gradient by min(1, max_norm / norm), as `clip_grad_norm_` does."""
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in stage.parameters():
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad.device))


def full_state(stage: Stage) -> dict[str, Tensor]:
    """This stage's weights, unsharded, on the CPU (DTensors gathered: a collective)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
            for n, p in stage.named_parameters()}
