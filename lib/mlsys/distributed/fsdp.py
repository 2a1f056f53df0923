"""FSDP (ZeRO-3) by hand, one unit at a time; and PyTorch's FSDP2 on the same units, to compare.

`apply_fsdp(module, group, wrap=...)` cuts any module into units by a **wrap policy**: module
classes (`wrap=(Block,)`, `wrap={nn.Linear}`) or a predicate `wrap=lambda name, module: ...`;
each outermost matching submodule with parameters is a unit, and the root unit holds whatever
parameters remain. The default (`wrap=None`) is the elements of `module.blocks`: one unit per
block of a `Transformer` or a `pp.PipelineStage`, and the root (embedding, final norm, head).
A parameter shared by several units (tied weights: an embedding that is also the head) lives in
the root unit, which stays gathered for the whole forward and backward (`wrap_units`). Each unit's
parameters are flattened into one vector, padded to a multiple of the n ranks of `group`, and each
rank keeps only its 1/n slice as a parameter (`flat_shard`, the master shard the optimizer
updates). Around each unit:

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

So per unit and micro-batch: 2 all-gathers and 1 reduce-scatter, `accounting.parallel.
fsdp_sent_bytes`; memory: the shards, plus the root unit (gathered through the whole forward and
backward) and at most two other unsharded units (the one in use and the one prefetched). Units are
found in registration order (`named_children`, depth first) and prefetched in the order the last
forward ran them (registration order before the first). A prefetch is only a guess: a backward
prefetch skips units whose gradient is already reduced, and each forward of the module starts by
freeing whatever is still gathered, so no copy taken before an optimizer step is used after it.
Every rank must run the same units in the same order (as with DDP); `apply_fsdp` checks that the
ranks cut the same units (one small collective) before changing the module. The module's classes
are not changed: parameters become plain attributes that the hooks set. Works on a `Transformer`
or a `pp.PipelineStage` after `tp.apply_tp` and `cp.apply_cp`, and on any module whose units
touch their parameters only inside their own forward (the root's: anywhere in the module's).

Precision, from the chapter-07 `PrecisionPolicy` (`policy=`, an object or a name;
`mixed_precision_policy` gives PyTorch's equivalent; `policy_dtypes` the three dtypes):

| policy field                        | apply_fsdp         | FSDP2 (`MixedPrecisionPolicy`)  |
|-------------------------------------|--------------------|---------------------------------|
| param_dtype (weights the pass reads)| compute_dtype      | param_dtype                     |
| grad_dtype (grads held and reduced) | reduce_dtype       | reduce_dtype                    |
| update_dtype (master, else weights) | the shards' dtype  | the sharded parameters' dtype   |
| compute_dtype != param_dtype        | autocast: the caller's `torch.autocast`; weights fp32 |
| loss_scale="dynamic"                | refused, ValueError (see `_check_policy`)            |
| optimizer                           | the caller's, built over the shards                  |

So bf16_mixed_adamw gathers and computes in bf16, reduces bf16 gradients and keeps fp32 master
shards (whose gradients, added after the reduction, are fp32 too); fp32 policies change nothing;
a policy without a master (bf16_pure_adamw) keeps bf16 shards. Outputs come out in the compute
dtype (cast logits with `.float()` before the loss); the module's floating-point inputs are cast
to it.

Reference: Zhao et al., 2023, "PyTorch FSDP"; Rajbhandari et al., 2020 (ZeRO-3). Used in:
chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from mlsys import checks
from mlsys.accounting.parallel import padded
from mlsys.distributed.comms import all_gather_single, reduce_scatter_single
from mlsys.distributed.groups import check_group
from mlsys.dtypes import torch_dtype
from mlsys.policies import POLICIES, PrecisionPolicy
from mlsys.policies import policy as _named_policy

Wrap = type | Iterable[type] | Callable[[str, nn.Module], bool] | None
"""A wrap policy: None (the blocks of `.blocks`), an nn.Module class or a tuple/list/set of them
(`()`: no unit but the root), or a predicate `(name, module) -> bool` (name as in
`named_modules`, e.g. "layers.0")."""

_SEQUENCES = (tuple, list, set, frozenset)


def _all_gather(output: Tensor, shard: Tensor, group, async_op: bool = False):
    return all_gather_single(output, shard, group=group, async_op=async_op)


# --- the wrap policy -------------------------------------------------------------------------


def _matcher(module: nn.Module, wrap: Wrap) -> Callable[[str, nn.Module], bool]:
    if wrap is None:
        blocks = getattr(module, "blocks", None)
        if not isinstance(blocks, (nn.ModuleList, nn.ModuleDict)):
            raise TypeError(f"wrap=None makes one unit per block of `.blocks` (a Transformer or a "
                            f"pp.PipelineStage), but {type(module).__name__} has no `.blocks` "
                            "ModuleList (or ModuleDict): pass wrap= module classes (e.g. "
                            "wrap=(nn.Linear,)) or a predicate (wrap=lambda name, module: ...)")
        ids = {id(b) for b in blocks.children()}
        return lambda name, sub: id(sub) in ids
    if isinstance(wrap, type):
        wrap = (wrap,)
    if isinstance(wrap, _SEQUENCES):
        classes = tuple(wrap)
        for c in classes:
            if not (isinstance(c, type) and issubclass(c, nn.Module)):
                raise TypeError(f"wrap must hold torch.nn.Module subclasses, got {c!r} in {wrap!r}")
        return lambda name, sub: isinstance(sub, classes)
    if callable(wrap):
        def match(name: str, sub: nn.Module) -> bool:
            answer = wrap(name, sub)
            if not isinstance(answer, bool):
                raise TypeError(f"wrap(name, module) must return True or False, got {answer!r} "
                                f"for {name!r}")
            return answer
        return match
    raise TypeError("wrap must be None (the blocks of `.blocks`), an nn.Module class or a "
                    "tuple/list/set of them, or a predicate (name, module) -> bool; got "
                    f"{type(wrap).__name__}")


def _home(name: str, prefixes: set[str]) -> str:
    """The unit a parameter (or module) named `name` falls in: its outermost ancestor in
    `prefixes`, else "" (the root)."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        head = ".".join(parts[:i])
        if head in prefixes:
            return head
    return ""


def wrap_units(module: nn.Module, wrap: Wrap = None) -> list[tuple[str, nn.Module]]:
    """The units `wrap` cuts `module` into, besides the root: (name, submodule) in registration
    order (depth first). Each is an outermost match holding parameters (a match inside a match
    belongs to the outer one); a match that shares a parameter with another unit or with the root
    (tied weights, a module registered twice) is dropped, its parameters left to the root. Checks
    only: raises before anything is changed, and needs no process group."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    match = _matcher(module, wrap)
    if next(module.parameters(), None) is None:
        raise ValueError(f"module ({type(module).__name__}) has no parameters to shard")
    found: list[tuple[str, nn.Module]] = []
    seen = {id(module)}

    def visit(prefix: str, parent: nn.Module) -> None:
        for child_name, child in parent.named_children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            name = prefix + child_name
            if match(name, child):
                if next(child.parameters(), None) is not None:
                    found.append((name, child))
            else:
                visit(name + ".", child)

    visit("", module)
    explicit_none = isinstance(wrap, _SEQUENCES) and len(wrap) == 0
    if not found and wrap is not None and not explicit_none:
        raise ValueError(f"wrap={wrap!r} matched no submodule of {type(module).__name__} that "
                         "holds parameters, so the whole module would be one unit: check the "
                         "classes or the predicate (or pass wrap=() to ask for one unit)")
    while True:  # drop units that share a parameter with another unit or the root, until none do
        prefixes = {name for name, _ in found}
        homes: dict[int, set[str]] = {}
        for pname, p in module.named_parameters(remove_duplicate=False):
            homes.setdefault(id(p), set()).add(_home(pname, prefixes))
        shared = {h for hs in homes.values() if len(hs) > 1 for h in hs}
        kept = [(name, sub) for name, sub in found if name not in shared]
        if len(kept) == len(found):
            return found
        found = kept


def _layout(module: nn.Module, units: list[tuple[str, nn.Module]]
            ) -> list[tuple[str, nn.Module, list[tuple[str, nn.Parameter, list[str]]]]]:
    """Every unit (the root "" first, if it holds anything) as (name, owner, params), each param
    as (its first name in owner, the parameter, every name it has in owner: tied aliases)."""
    prefixes = {name for name, _ in units}

    def grouped(named: Iterable[tuple[str, nn.Parameter]]) -> list:
        out: dict[int, tuple[str, nn.Parameter, list[str]]] = {}
        for qual, p in named:
            out.setdefault(id(p), (qual, p, []))[2].append(qual)
        return list(out.values())

    root = grouped((n, p) for n, p in module.named_parameters(remove_duplicate=False)
                   if not _home(n, prefixes))
    out = [("", module, root)] if root else []
    return out + [(name, sub, grouped(sub.named_parameters(remove_duplicate=False)))
                  for name, sub in units]


# --- the precision policy --------------------------------------------------------------------


def _check_policy(policy: object) -> PrecisionPolicy | None:
    """`policy` as a PrecisionPolicy (a name goes through `mlsys.policies.policy`), or None.

    Loss scaling is refused: `mlsys.loss_scaling.DynamicLossScaler` decides from the gradients it
    sees whether to skip a step, and under FSDP each rank sees only its shard of them, so ranks
    could decide differently and their shards drift apart (a sharded scaler would all-reduce the
    verdict first; there is none here). Use a bf16 policy, which needs no scaling."""
    if policy is None:
        return None
    if isinstance(policy, str):
        chosen = _named_policy(checks.choice(policy, "policy", POLICIES))
    elif isinstance(policy, PrecisionPolicy):
        chosen = policy
    else:
        raise TypeError("policy must be a mlsys.policies.PrecisionPolicy, a policy name such as "
                        f"'bf16_mixed_adamw', or None; got {type(policy).__name__}")
    if chosen.loss_scale != "none":
        raise ValueError(f"policy {chosen.label!r} scales its loss, which FSDP cannot express: "
                         "each rank sees only its shard of the gradients, so ranks could disagree "
                         "on skipping a step; use a policy with loss_scale='none' (bf16)")
    return chosen


def policy_dtypes(policy: PrecisionPolicy | str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(gather, reduce, shard) torch dtypes of `policy`, the mapping of the module docstring:
    weights are gathered (and the forward and backward run) in `param_dtype`, gradients reduced in
    `grad_dtype` (the policy's "gradients as held and reduced"), and the shards, which the optimizer
    updates, held in `update_dtype` (the fp32 master if the policy has one, else the weights).
    `policy("bf16_mixed_adamw")` -> (bf16, bf16, fp32); "fp32_adamw" -> (fp32, fp32, fp32)."""
    chosen = _check_policy(policy)
    if chosen is None:
        raise TypeError("policy must be a PrecisionPolicy or a policy name, got None")
    return (torch_dtype(chosen.param_dtype), torch_dtype(chosen.grad_dtype),
            torch_dtype(chosen.update_dtype))


def _check_dtype(dtype: object, name: str) -> None:
    floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
    if dtype is not None and not floating:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")


def _resolve(chosen: PrecisionPolicy | None, given: dict[str, torch.dtype | None]
             ) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype | None]:
    """(gather, reduce, shard) dtypes from the policy and the explicit dtypes `given` (two, in
    that order, by argument name); an explicit dtype that contradicts the policy is a ValueError."""
    for name, dtype in given.items():
        _check_dtype(dtype, name)
    explicit = list(given.values())
    if chosen is None:
        return explicit[0], explicit[1], None
    implied = policy_dtypes(chosen)
    for (name, dtype), want in zip(given.items(), implied, strict=False):
        if dtype is not None and dtype != want:
            raise ValueError(f"{name}={dtype} contradicts policy {chosen.label!r}, which gives "
                             f"{name}={want}: pass the policy or the dtype, not both")
    return implied


def mixed_precision_policy(policy: PrecisionPolicy | str | None):
    """PyTorch FSDP2's `MixedPrecisionPolicy` for a chapter-07 policy (the module docstring's
    mapping): `param_dtype` = policy.param_dtype (gathers, forward and backward),
    `reduce_dtype` = policy.grad_dtype, `output_dtype` = None (outputs come out in param_dtype,
    as `apply_fsdp`'s do: cast logits with `.float()` before the loss), `cast_forward_inputs` =
    True (each unit's floating inputs cast to param_dtype). FSDP2 keeps the sharded parameters in
    the module's own dtype, so the module must already hold policy.update_dtype (fp32 for a policy
    with a master; `apply_fully_shard(policy=...)` casts it). None: no mixed precision.
    Autocast policies: run the forward under `torch.autocast` yourself."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    chosen = _check_policy(policy)
    if chosen is None:
        return MixedPrecisionPolicy()
    param, reduce, _ = policy_dtypes(chosen)
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce, output_dtype=None,
                                cast_forward_inputs=True)


def _agree(group, what: list) -> None:
    """Every rank of `group` must describe the same units: a ValueError on all of them if not
    (instead of a hang, or shards of different models mixed)."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, what, group=group)
    differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differ:
        def names(units: list) -> str:
            listed = [repr(name or "<root>") for name, _ in units]
            return ", ".join(listed[:8] + (["..."] if len(listed) > 8 else []))
        raise ValueError(f"the ranks of the group cut the module into different units (ranks "
                         f"{differ} differ from rank 0): build the same model, with the same wrap "
                         f"policy, on every rank; rank 0 has units {names(everyone[0])}, rank "
                         f"{differ[0]} {names(everyone[differ[0]])}")


# --- the hand-written FSDP -------------------------------------------------------------------


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

    def __init__(self, module: nn.Module, group, *, layout: list, compute_dtype: torch.dtype | None,
                 reduce_dtype: torch.dtype, shard_dtype: torch.dtype | None, prefetch: bool,
                 replicate_group=None):
        self.group, self.replicate_group = group, replicate_group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.replicas = 1 if replicate_group is None else dist.get_world_size(replicate_group)
        self.compute_dtype, self.reduce_dtype, self.prefetch = compute_dtype, reduce_dtype, prefetch
        self.units = [self._unit(name, owner, params, shard_dtype)
                      for name, owner, params in layout]
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
        """Every unit's weights (or their averaged gradients) gathered whole, in the shards' dtype,
        by their names in the model before `apply_fsdp` (a tied weight under its first name, as
        `named_parameters()` gives it). A collective: every rank of the group must call it."""
        out = {}
        for unit in self.units:
            local = unit.shard.grad if grads else unit.shard.detach()
            if local is None:
                local = torch.zeros_like(unit.shard)
            whole = torch.empty(local.numel() * self.n, dtype=local.dtype, device=local.device)
            _all_gather(whole, local.contiguous(), self.group)
            for entry, piece in zip(unit.entries, whole.split(unit.sizes), strict=False):
                out[entry.name] = piece.view(entry.shape).clone()
        return out


def _check_floating(layout: list, shard_dtype: torch.dtype | None) -> None:
    for name, _, params in layout:
        dtypes = {p.dtype for _, p, _ in params}
        devices = {p.device for _, p, _ in params}
        unit = f"unit {name!r}" if name else "the root unit"
        if not all(d.is_floating_point for d in dtypes):
            raise TypeError(f"{unit} holds non-floating-point parameters ("
                            f"{sorted(map(str, dtypes))}): FSDP shards floating-point weights only")
        if len(devices) > 1 or (shard_dtype is None and len(dtypes) > 1):
            raise ValueError(f"{unit} mixes dtypes or devices ({sorted(map(str, dtypes))}, "
                             f"{sorted(map(str, devices))}): its parameters are flattened into one "
                             "vector; cast the module first, or pass policy= (which sets the "
                             "shards' dtype)")


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
    chosen = _check_policy(policy)
    compute, reduce, shard = _resolve(chosen, {"compute_dtype": compute_dtype,
                                               "reduce_dtype": reduce_dtype})
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}")
    layout = _layout(module, units)
    _check_floating(layout, shard)
    check_group(group)
    if replicate_group is not None:
        check_group(replicate_group, "replicate_group")
    _agree(group, [(name, [(q, tuple(p.shape)) for q, p, _ in params])
                   for name, _, params in layout])
    module.fsdp = FSDP(module, group, layout=layout, compute_dtype=compute,
                       reduce_dtype=reduce or torch.float32, shard_dtype=shard,
                       prefetch=prefetch, replicate_group=replicate_group)
    return module


def apply_fully_shard(module: nn.Module, group_or_mesh, *, wrap: Wrap = None,
                      policy: PrecisionPolicy | str | None = None,
                      param_dtype: torch.dtype | None = None,
                      reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """PyTorch's FSDP2 on the units of `wrap` (as `apply_fsdp`): `fully_shard` on each, then on
    the root; parameters become DTensors sharded on dim 0. `group_or_mesh`: a ProcessGroup, a 1-D
    DeviceMesh, or a 2-D one (replicate, shard): HSDP. `policy` gives
    `mixed_precision_policy(policy)` and casts the parameters to policy.update_dtype (the shards'
    dtype: fp32 under a policy with a master, else its param_dtype); explicit `param_dtype` and
    `reduce_dtype` must agree with it. Everything is checked before any collective."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule) or hasattr(module, "fsdp"):
        raise ValueError("module is already sharded (apply_fully_shard or apply_fsdp)")
    units = wrap_units(module, wrap)
    chosen = _check_policy(policy)
    param, reduce, shard = _resolve(chosen, {"param_dtype": param_dtype,
                                             "reduce_dtype": reduce_dtype})
    mp = (mixed_precision_policy(chosen) if chosen is not None
          else MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce))
    layout = _layout(module, units)
    _check_floating(layout, shard)
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
        _agree(mesh.get_group(dim), [(name, [(q, tuple(p.shape)) for q, p, _ in params])
                                     for name, _, params in layout])
    if shard is not None:
        for p in module.parameters():
            if p.dtype != shard:
                p.data = p.data.to(shard)
    for _, sub in units:
        fully_shard(sub, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module
