"""FSDP (ZeRO-3) by hand, one block at a time; and PyTorch's FSDP2 on the same model, to compare.

`apply_fsdp(model, group)` cuts the model into units: one per block of `model.blocks`, and the
root (what is left: embedding, final norm, head). Each unit's parameters are flattened into one
fp32 vector, padded to a multiple of the n ranks of `group`, and each rank keeps only its 1/n
slice as a parameter (`flat_shard`, the fp32 master shard the optimizer updates). Around each unit:

1. before its forward: all-gather the shards (cast to `compute_dtype`, so a bf16 gather moves half
   the bytes) into the unit's unsharded buffer, and point the modules' weights at views of it;
   with `prefetch`, the next unit's all-gather is started now, so it overlaps this unit's compute;
2. after its forward: free the buffer (its storage is resized to 0; autograd's saved views keep
   pointing at it);
3. before its backward (a hook on the unit's output gradient): all-gather again into the same
   storage (prefetching the unit before it);
4. once its gradient is complete (a post-accumulate-grad hook on the buffer): reduce-scatter it in
   `reduce_dtype`, average over the n ranks (and, for HSDP, all-reduce the shard over
   `replicate_group`), add it to the shard's gradient, and free the buffer again.

So per unit and micro-batch: 2 all-gathers and 1 reduce-scatter, `accounting.parallel.
fsdp_sent_bytes`; memory: the shards, plus at most two unsharded units (the one in use and the one
prefetched). Every rank must see the same sequence of units (as with DDP). The model's classes
are not changed: parameters become plain attributes that the hooks set. Works on a `Transformer`
or on a `pp.PipelineStage`, after `tp.apply_tp` and `cp.apply_cp`. Reference: Zhao et al., 2023,
"PyTorch FSDP"; Rajbhandari et al., 2020 (ZeRO-3). `apply_fully_shard` applies PyTorch's
`fully_shard` (FSDP2) per block and then to the root. Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from mlsys.accounting.parallel import padded
from mlsys.distributed.comms import all_gather_single, reduce_scatter_single


def _all_gather(output: Tensor, shard: Tensor, group, async_op: bool = False):
    return all_gather_single(output, shard, group=group, async_op=async_op)


def _check_module(module: object) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(getattr(module, "blocks", None), nn.ModuleList):
        raise TypeError(f"module must have its blocks in `.blocks` (a Transformer or a "
                        f"pp.PipelineStage), got {type(module).__name__}")
    return module


def check_group(group: object, name: str = "group") -> Any:
    """A process group, explicitly: torch.distributed must be up and `group` a ProcessGroup."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: run inside "
                           "mlsys.distributed.launch (or call init_process_group first)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name} must be a torch.distributed.ProcessGroup (e.g. Rank.group or a "
                        f"mesh axis), got {type(group).__name__}")
    return group


@dataclass
class Unit:
    """One unit's flat parameter: the local shard, the unsharded buffer and where each weight
    lives in it."""

    name: str  # "" for the root, "blocks.3" for a block
    module: nn.Module
    entries: list[tuple[nn.Module, str, str, torch.Size, int]]  # (owner, attr, name, shape, numel)
    shard: nn.Parameter  # fp32 master shard, 1/n of the padded flat vector
    full: Tensor  # unsharded, compute dtype, requires grad; storage freed when not gathered
    gathered: bool = False
    pending: tuple | None = None  # (work, source) of a prefetch in flight
    next_forward: Unit | None = None
    next_backward: Unit | None = None
    sizes: list[int] = field(default_factory=list)


class FSDP:
    """The state `apply_fsdp` attaches to a module (`module.fsdp`): its units and groups."""

    def __init__(self, module: nn.Module, group, *, compute_dtype: torch.dtype | None,
                 reduce_dtype: torch.dtype, prefetch: bool, replicate_group=None):
        self.group, self.replicate_group = group, replicate_group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.replicas = 1 if replicate_group is None else dist.get_world_size(replicate_group)
        self.compute_dtype, self.reduce_dtype, self.prefetch = compute_dtype, reduce_dtype, prefetch
        block_ids = {id(p) for p in module.blocks.parameters()}
        root = [(n, p) for n, p in module.named_parameters() if id(p) not in block_ids]
        units = [self._unit("", module, root)] if root else []
        units += [self._unit(f"blocks.{i}", b, list(b.named_parameters()))
                  for i, b in enumerate(module.blocks)]
        self.units = units
        blocks = [u for u in units if u.name]
        for a, b in zip(blocks, blocks[1:], strict=False):
            a.next_forward, b.next_backward = b, a
        if units and not units[0].name and blocks:
            units[0].next_forward, units[0].next_backward = blocks[0], blocks[-1]
        for unit in units:
            self._hook(unit)
        if prefetch and blocks and units[0].name:  # no root unit (a middle pipeline stage):
            module.register_forward_pre_hook(lambda m, args: self._prefetch(blocks[0]))

    def _unit(self, name: str, owner: nn.Module, named: list[tuple[str, nn.Parameter]]) -> Unit:
        entries, sizes, flats = [], [], []
        for qual, p in named:
            sub_name, _, attr = qual.rpartition(".")
            sub = owner.get_submodule(sub_name)
            entries.append((sub, attr, f"{name}.{qual}" if name else qual, p.shape, p.numel()))
            sizes.append(p.numel())
            flats.append(p.detach().reshape(-1))
        total = sum(sizes)
        flat = torch.zeros(padded(total, self.n), dtype=flats[0].dtype, device=flats[0].device)
        flat[:total] = torch.cat(flats)
        k = flat.numel() // self.n
        shard = nn.Parameter(flat[self.rank * k:(self.rank + 1) * k].clone())
        for sub, attr, *_ in entries:
            del sub._parameters[attr]  # from now on a plain attribute, set by the hooks
        owner.register_parameter("flat_shard", shard)
        full = torch.empty(flat.numel(), dtype=self.compute_dtype or flat.dtype,
                           device=flat.device)
        full.untyped_storage().resize_(0)
        full.requires_grad_(True)
        return Unit(name, owner, entries, shard, full, sizes=sizes + [flat.numel() - total])

    # --- the four hooks of the module docstring ---

    def _hook(self, unit: Unit) -> None:
        def pre_forward(module, args):
            self._gather(unit)
            if self.prefetch and unit.next_forward is not None:
                self._prefetch(unit.next_forward)
            views = unit.full.split(unit.sizes)
            for (sub, attr, _, shape, _), view in zip(unit.entries, views, strict=False):
                setattr(sub, attr, view.view(shape))

        def post_forward(module, args, output):
            if isinstance(output, Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._pre_backward(unit))
            self._free(unit)

        unit.module.register_forward_pre_hook(pre_forward)
        unit.module.register_forward_hook(post_forward)
        unit.full.register_post_accumulate_grad_hook(lambda full: self._post_backward(unit))

    def _pre_backward(self, unit: Unit) -> None:
        self._gather(unit)
        if self.prefetch and unit.next_backward is not None:
            self._prefetch(unit.next_backward)

    def _post_backward(self, unit: Unit) -> None:
        flat = unit.full.grad.to(self.reduce_dtype)
        unit.full.grad = None
        self._free(unit)
        out = torch.empty(unit.shard.numel(), dtype=self.reduce_dtype, device=flat.device)
        reduce_scatter_single(out, flat, group=self.group)
        out.div_(self.n)
        if self.replicas > 1:
            dist.all_reduce(out, group=self.replicate_group)
            out.div_(self.replicas)
        out = out.to(unit.shard.dtype)
        unit.shard.grad = out if unit.shard.grad is None else unit.shard.grad.add_(out)

    # --- gathering and freeing ---

    def _prefetch(self, unit: Unit) -> None:
        if unit.gathered or unit.pending is not None:
            return
        unit.full.untyped_storage().resize_(unit.full.numel() * unit.full.element_size())
        source = unit.shard.detach().to(unit.full.dtype)  # bf16 gathers move half the bytes
        # .data: write without bumping the version counter autograd checks on saved views
        unit.pending = (_all_gather(unit.full.data, source, self.group, async_op=True), source)

    def _gather(self, unit: Unit) -> None:
        if unit.gathered:
            return
        self._prefetch(unit)
        unit.pending[0].wait()
        unit.pending, unit.gathered = None, True

    def _free(self, unit: Unit) -> None:
        if unit.pending is not None:
            unit.pending[0].wait()
            unit.pending = None
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False

    def unsharded(self, *, grads: bool = False) -> dict[str, Tensor]:
        """Every unit's weights (or their averaged gradients) gathered whole, by their names in
        the model before `apply_fsdp` (a collective: every rank of the group must call it)."""
        out = {}
        for unit in self.units:
            local = unit.shard.grad if grads else unit.shard.detach()
            if local is None:
                local = torch.zeros_like(unit.shard)
            whole = torch.empty(local.numel() * self.n, dtype=local.dtype, device=local.device)
            _all_gather(whole, local.contiguous(), self.group)
            for (_, _, name, shape, _), piece in zip(unit.entries, whole.split(unit.sizes),
                                                     strict=False):
                out[name] = piece.view(shape).clone()
        return out


def apply_fsdp(module: nn.Module, group, *, compute_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype = torch.float32, prefetch: bool = True,
               replicate_group=None) -> nn.Module:
    """Shard `module` (a Transformer or a pp.PipelineStage, unchanged otherwise) over `group`, one
    unit per block plus the root (the module docstring); returns it, its state in `.fsdp`.

    `compute_dtype` (e.g. torch.bfloat16): the dtype weights are gathered and computed in (None:
    the parameters' own); `reduce_dtype`: the dtype gradients are reduce-scattered in;
    `replicate_group`: the copies of this shard group (HSDP), whose shard gradients are
    all-reduced. Build the optimizer afterwards, over `module.parameters()` (the shards).
    """
    _check_module(module)
    check_group(group)
    if replicate_group is not None:
        check_group(replicate_group, "replicate_group")
    for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
        floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
        if dtype is not None and not floating:
            raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}")
    if hasattr(module, "fsdp"):
        raise ValueError("apply_fsdp was already applied to this module")
    module.fsdp = FSDP(module, group, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype,
                       prefetch=prefetch, replicate_group=replicate_group)
    return module


def apply_fully_shard(module: nn.Module, group, *, param_dtype: torch.dtype | None = None,
                      reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """PyTorch's FSDP2 on the same units: `fully_shard` on each block, then on the root, over a
    1-D mesh of `group`; parameters become DTensors sharded on dim 0."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_module(module)
    check_group(group)
    device = next(module.parameters()).device.type
    mesh = DeviceMesh.from_group(group, device)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in module.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    return module
