"""PyTorch's own strategies on the same model as the hand-written ones, to compare: FSDP2
(`fully_shard`) on the units of `fsdp_units.wrap_units`, DTensor tensor parallelism
(`parallelize_module`) on the blocks `tp.apply_tp` splits, and `torch.distributed.pipelining` on a
`pp.PipelineStage`. Each takes its process group explicitly and checks its arguments as the
hand-written one does; the tests train both ways and compare them with one process. The training
entry point (`mlsys.train.parallelize`) applies the same torch strategies to a DeviceMesh.
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage as TorchStage
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from mlsys import checks
from mlsys.accounting.pipeline import SCHEDULES
from mlsys.distributed.fsdp_precision import check_policy, mixed_precision_policy, resolve_dtypes
from mlsys.distributed.fsdp_units import Wrap, agree, check_floating, layout, wrap_units
from mlsys.distributed.groups import check_blocks, check_group
from mlsys.distributed.pp import PipelineStage
from mlsys.policies import PrecisionPolicy


def apply_fully_shard(module: nn.Module, group_or_mesh, *, wrap: Wrap = None,
                      policy: PrecisionPolicy | str | None = None,
                      param_dtype: torch.dtype | None = None,
                      reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """PyTorch's FSDP2 on the units of `wrap` (as `fsdp.apply_fsdp`): `fully_shard` on each, then on
    the root; parameters become DTensors sharded on dim 0. `group_or_mesh`: a ProcessGroup, a 1-D
    DeviceMesh, or a 2-D one (replicate, shard): HSDP. `policy` gives
    `mixed_precision_policy(policy)` and casts the parameters to policy.update_dtype (the shards'
    dtype: fp32 under a policy with a master, else its param_dtype); explicit `param_dtype` and
    `reduce_dtype` must agree with it. Everything is checked before any collective."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule) or hasattr(module, "fsdp"):
        raise ValueError("module is already sharded (apply_fully_shard or apply_fsdp)")
    units = wrap_units(module, wrap)
    chosen = check_policy(policy)
    param, reduce, shard = resolve_dtypes(chosen, {"param_dtype": param_dtype,
                                                   "reduce_dtype": reduce_dtype})
    mp = (mixed_precision_policy(chosen) if chosen is not None
          else MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce))
    cut = layout(module, units)
    check_floating(cut, shard)
    if isinstance(group_or_mesh, DeviceMesh):
        if group_or_mesh.ndim not in (1, 2):
            raise ValueError(f"group_or_mesh must be a 1-D DeviceMesh (the ranks sharing the "
                             f"shards) or a 2-D one (replicate, shard), got "
                             f"{group_or_mesh.ndim}-D: pass the data-parallel axes, mesh[names]")
        mesh = group_or_mesh
    else:
        check_group(group_or_mesh, "group_or_mesh")
        mesh = DeviceMesh.from_group(group_or_mesh, next(module.parameters()).device.type)
    for dim in range(mesh.ndim):
        agree(mesh.get_group(dim), cut)
    if shard is not None:
        for p in module.parameters():
            if p.dtype != shard:
                p.data = p.data.to(shard)
    for _, sub in units:
        fully_shard(sub, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def apply_dtensor_tp(module: nn.Module, group) -> nn.Module:
    """The same split by PyTorch's DTensor: `parallelize_module` with ColwiseParallel for q, k, v,
    w1, w3 and RowwiseParallel for o_proj, w2 over a 1-D mesh of `group` (no sequence
    parallelism); attention's `n_heads` set to the local count, as `tp.apply_tp` does."""
    check_blocks(module)
    check_group(group)
    n = dist.get_world_size(group)
    mesh = DeviceMesh.from_group(group, next(module.parameters()).device.type)
    plan = {**{f"attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
            "attn.o_proj": RowwiseParallel(), "ffn.w1": ColwiseParallel(),
            "ffn.w3": ColwiseParallel(), "ffn.w2": RowwiseParallel()}
    for i, block in enumerate(module.blocks):
        if block.attn.n_heads % n:
            raise ValueError(f"blocks.{i}: n_heads ({block.attn.n_heads}) is not divisible by "
                             f"the TP degree ({n})")
        parallelize_module(block, mesh, plan)
        block.attn.n_heads //= n
    return module


def torch_pipeline_step(stage: PipelineStage, inputs: Tensor, targets: Tensor, *,
                        microbatches: int, schedule: str = "1f1b") -> float | None:
    """The step of `pp.pipeline_step` by `torch.distributed.pipelining` (ScheduleGPipe or
    Schedule1F1B over the same stage module, gradients scaled by 1/m); the mean loss on the last
    stage, None elsewhere."""
    if not isinstance(stage, PipelineStage):
        raise TypeError(f"stage must be a PipelineStage (from pp.apply_pp), got "
                        f"{type(stage).__name__}")
    check_group(stage.group, "stage.group")  # torch's stage would fall back to WORLD
    m = checks.positive_int(microbatches, "microbatches")
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[checks.choice(schedule, "schedule",
                                                                          SCHEDULES)]
    theirs = TorchStage(stage, stage.stage, stage.n_stages, inputs.device, group=stage.group)

    def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    runner = kind(theirs, m, loss_fn=loss_fn)
    losses: list[Tensor] = []
    if stage.is_first:  # contiguous: torch 2.11's stage rejects a view's strides (x[:, :-1])
        runner.step(inputs.contiguous())
    elif stage.is_last:
        runner.step(target=targets, losses=losses)
    else:
        runner.step()
    return sum(loss.item() for loss in losses) / m if stage.is_last else None
