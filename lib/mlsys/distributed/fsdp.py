"""FSDP (ZeRO-3) by hand, one unit at a time.

`apply_fsdp(module, group, wrap=...)` cuts any module into units by a wrap policy
(`fsdp_units.wrap_units`: by default one unit per block of `.blocks`, and the root unit, which
holds the rest and stays gathered for the whole forward and backward). Each unit's parameters are
flattened into one vector, padded to a multiple of the n ranks of `group`, and each rank keeps only
its 1/n slice as a parameter (`flat_shard`, the master shard the optimizer updates). Around each
unit:

1. before its forward: all-gather the shards (cast to `compute_dtype`, so a bf16 gather moves half
   the bytes) into the unit's unsharded buffer, and point the modules' weights at views of it;
   with `prefetch`, the next unit's all-gather is started now, so it overlaps this unit's compute;
2. after its forward: free the buffer (its storage is resized to 0; autograd's saved views keep
   pointing at it);
3. before its backward (a hook on the unit's output gradients): all-gather again into the same
   storage (prefetching the unit whose backward comes next);
4. once its gradient is complete (a post-accumulate-grad hook on the buffer): reduce-scatter it in
   `reduce_dtype`, average over the n ranks (and, for HSDP, all-reduce the shard over
   `replicate_group`), add it to the shard's gradient, and free the buffer again.

So per unit and micro-batch: 2 all-gathers and 1 reduce-scatter, `accounting.parallel_traffic.
fsdp_sent_bytes`; memory: the shards, plus the root unit (gathered through the whole forward and
backward) and at most two other unsharded units (the one in use and the one prefetched). Units are
prefetched in the order the last forward ran them (registration order before the first). A
prefetch is only a guess: a backward prefetch skips units whose gradient is already reduced, and
each forward of the module starts by freeing whatever is still gathered, so no copy taken before
an optimizer step is used after it. Every rank must run the same units in the same order (as with
DDP); `apply_fsdp` checks that the ranks cut the same units (`fsdp_units.agree`) before changing
the module. The module's classes are not changed: parameters become plain attributes that the
hooks set. Works on a `Transformer` or a `pp.PipelineStage` after `tp.apply_tp` and
`cp.apply_cp`, and on any module whose units touch their parameters only inside their own forward
(the root's: anywhere in the module's). Precision comes from a chapter-07 `PrecisionPolicy`
(`policy=`), mapped as `fsdp_precision` says; PyTorch's FSDP2 on the same units is
`torch_strategies.apply_fully_shard`.

Longer than 300 lines: `FSDP`'s hooks (gather, free, prefetch, reduce) share one unit's state and
only make sense together. Reference: Zhao et al., 2023, "PyTorch FSDP"; Rajbhandari et al., 2020
(ZeRO-3). Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from mlsys.accounting.parallel_traffic import padded
from mlsys.distributed.comms import all_gather_single, reduce_scatter_single
from mlsys.distributed.fsdp_precision import check_policy, resolve_dtypes
from mlsys.distributed.fsdp_units import Layout, Wrap, agree, check_floating, layout, wrap_units
from mlsys.distributed.groups import check_group
from mlsys.policies import PrecisionPolicy


@dataclass
class Entry:
    """One parameter of a unit: its name before `apply_fsdp`, every (module, attribute) holding
    it (several for tied weights), its shape and number of elements."""

    name: str
    owners: list[tuple[nn.Module, str]]
    shape: torch.Size
    numel: int


@dataclass(eq=False)  # compared by identity
class Unit:
    """One unit's flat parameter: the local shard, the unsharded buffer and where each weight
    lives in it."""

    name: str  # "" for the root, "blocks.3" for a block, "layers.0" for a wrapped layer
    module: nn.Module
    entries: list[Entry]
    shard: nn.Parameter  # master shard (update dtype), 1/n of the padded flat vector
    full: Tensor  # unsharded, compute dtype, requires grad; storage freed when not gathered
    gathered: bool = False
    pending: tuple | None = None  # (work, source) of a prefetch in flight
    awaiting: int = 0  # forwards whose backward has not reduced this unit's gradient yet
    next_forward: Unit | None = None
    next_backward: Unit | None = None
    sizes: list[int] = field(default_factory=list)


def _tensors(obj: object) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    """`obj` with its floating-point tensors (in tuples, lists, dicts) cast to `dtype`."""
    if isinstance(obj, Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_cast(item, dtype) for item in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(item, dtype) for item in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


class FSDP:
    """The state `apply_fsdp` attaches to a module (`module.fsdp`): its units and groups."""

    def __init__(self, module: nn.Module, group, *, units: Layout,
                 compute_dtype: torch.dtype | None, reduce_dtype: torch.dtype,
                 shard_dtype: torch.dtype | None, prefetch: bool, replicate_group=None):
        self.group, self.replicate_group = group, replicate_group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.replicas = 1 if replicate_group is None else dist.get_world_size(replicate_group)
        self.compute_dtype, self.reduce_dtype, self.prefetch = compute_dtype, reduce_dtype, prefetch
        self.units = [self._unit(name, owner, params, shard_dtype)
                      for name, owner, params in units]
        self.root = self.units[0] if self.units and not self.units[0].name else None
        self.order = list(self.units)  # the forward order: registration order until one ran
        self._trace: list[Unit] | None = None
        self._link()
        # before the root unit's hooks (same module), so they run first
        module.register_forward_pre_hook(self._start_forward, with_kwargs=True)
        module.register_forward_hook(self._end_forward)
        for unit in self.units:
            self._hook(unit)

    def _unit(self, name: str, owner: nn.Module, params: list, dtype: torch.dtype | None) -> Unit:
        entries, sizes, flats = [], [], []
        for qual, p, quals in params:
            owners = {}
            for q in quals:
                sub_name, _, attr = q.rpartition(".")
                sub = owner.get_submodule(sub_name)
                owners[(id(sub), attr)] = (sub, attr)
            entries.append(Entry(f"{name}.{qual}" if name else qual, list(owners.values()),
                                 p.shape, p.numel()))
            sizes.append(p.numel())
            flats.append(p.detach().reshape(-1).to(dtype or p.dtype))
        total = sum(sizes)
        flat = torch.zeros(padded(total, self.n), dtype=flats[0].dtype, device=flats[0].device)
        flat[:total] = torch.cat(flats)
        k = flat.numel() // self.n
        shard = nn.Parameter(flat[self.rank * k:(self.rank + 1) * k].clone())
        for entry in entries:
            for sub, attr in entry.owners:
                del sub._parameters[attr]  # from now on a plain attribute, set by the hooks
        owner.register_parameter("flat_shard", shard)
        full = torch.empty(flat.numel(), dtype=self.compute_dtype or flat.dtype,
                           device=flat.device)
        full.untyped_storage().resize_(0)
        full.requires_grad_(True)
        return Unit(name, owner, entries, shard, full, sizes=sizes + [flat.numel() - total])

    def _link(self) -> None:
        """Prefetch links from `self.order`: forward in that order; backward in reverse, except
        the root, whose backward starts first (at the output) and ends last (at the input)."""
        for unit in self.units:
            unit.next_forward = unit.next_backward = None
        for a, b in zip(self.order, self.order[1:], strict=False):
            a.next_forward = b
        rest = [u for u in self.order if u is not self.root]
        for a, b in zip(rest, rest[1:], strict=False):
            b.next_backward = a
        if self.root is not None and rest:
            self.root.next_backward = rest[-1]

    # --- the module's own hooks: one forward of the whole module ---

    def _start_forward(self, module, args, kwargs):
        for unit in self.units:  # nothing gathered before this forward (an optimizer step since?)
            self._free(unit)
        self._trace = []
        if self.prefetch and self.root is None and self.order:  # e.g. a middle pipeline stage
            self._prefetch(self.order[0])
        if self.compute_dtype is not None:
            return _cast(args, self.compute_dtype), _cast(kwargs, self.compute_dtype)
        return None

    def _end_forward(self, module, args, output) -> None:
        if self._trace:
            self.order = self._trace
            self._link()
        self._trace = None

    # --- the four hooks of the module docstring ---

    def _hook(self, unit: Unit) -> None:
        def pre_forward(module, args):
            first = self._trace is None or unit not in self._trace  # once per forward
            if self._trace is not None and first:
                self._trace.append(unit)
            if first and torch.is_grad_enabled():
                unit.awaiting += 1
            self._gather(unit)
            if self.prefetch and unit.next_forward is not None:
                self._prefetch(unit.next_forward)
            views = unit.full.split(unit.sizes)
            for entry, view in zip(unit.entries, views, strict=False):
                weight = view.view(entry.shape)
                for sub, attr in entry.owners:
                    setattr(sub, attr, weight)

        def post_forward(module, args, output):
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad: self._pre_backward(unit))
            self._free(unit)

        unit.module.register_forward_pre_hook(pre_forward)
        unit.module.register_forward_hook(post_forward)
        unit.full.register_post_accumulate_grad_hook(lambda full: self._post_backward(unit))

    def _pre_backward(self, unit: Unit) -> None:
        self._gather(unit)
        after = unit.next_backward
        if self.prefetch and after is not None and after.awaiting > 0:
            self._prefetch(after)

    def _post_backward(self, unit: Unit) -> None:
        unit.awaiting = max(0, unit.awaiting - 1)
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
        unit.pending = (all_gather_single(unit.full.data, source, self.group, async_op=True),
                        source)

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
        """Every unit's weights (or their averaged gradients) gathered whole, in the shards' dtype,
        by their names in the model before `apply_fsdp` (a tied weight under its first name, as
        `named_parameters()` gives it). A collective: every rank of the group must call it."""
        out = {}
        for unit in self.units:
            local = unit.shard.grad if grads else unit.shard.detach()
            if local is None:
                local = torch.zeros_like(unit.shard)
            whole = torch.empty(local.numel() * self.n, dtype=local.dtype, device=local.device)
            all_gather_single(whole, local.contiguous(), self.group)
            for entry, piece in zip(unit.entries, whole.split(unit.sizes), strict=False):
                out[entry.name] = piece.view(entry.shape).clone()
        return out


def apply_fsdp(module: nn.Module, group, *, wrap: Wrap = None,
               policy: PrecisionPolicy | str | None = None,
               compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
               prefetch: bool = True, replicate_group=None) -> nn.Module:
    """Shard `module` over `group`, one unit per match of `wrap` plus the root (the module
    docstring); returns it, its state in `.fsdp` (`module.fsdp.unsharded()` gathers the weights).

    `wrap`: module classes or a predicate (name, module) -> bool; None: the blocks of `.blocks`
    (a ModuleList or ModuleDict).
    `policy`: a chapter-07 PrecisionPolicy or its name; it sets `compute_dtype` (the dtype weights
    are gathered and computed in: policy.param_dtype; None: the parameters' own), `reduce_dtype`
    (the dtype gradients are reduce-scattered in: policy.grad_dtype; default fp32) and the
    shards' dtype (policy.update_dtype; default the parameters'). Explicit dtypes must agree with
    the policy; a policy with autocast gathers fp32 weights (run the forward under
    `torch.autocast`); one with loss scaling is refused. With a compute dtype, the module's
    floating-point inputs are cast to it (its output comes out in it). `replicate_group`: the
    copies of this shard group (HSDP), whose shard gradients are all-reduced. Everything is
    checked before any collective. Build the optimizer afterwards, over `module.parameters()`
    (the shards).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if hasattr(module, "fsdp"):
        raise ValueError("apply_fsdp was already applied to this module")
    units = wrap_units(module, wrap)
    chosen = check_policy(policy)
    compute, reduce, shard = resolve_dtypes(chosen, {"compute_dtype": compute_dtype,
                                                     "reduce_dtype": reduce_dtype})
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}")
    cut = layout(module, units)
    check_floating(cut, shard)
    check_group(group)
    if replicate_group is not None:
        check_group(replicate_group, "replicate_group")
    agree(group, cut)
    module.fsdp = FSDP(module, group, units=cut, compute_dtype=compute,
                       reduce_dtype=reduce or torch.float32, shard_dtype=shard,
                       prefetch=prefetch, replicate_group=replicate_group)
    return module
