"""How FSDP cuts a module into units: the wrap policy, each unit's parameters, and the checks
that every rank cut the same units.

A **wrap policy** picks the units: module classes (`wrap=(Block,)`, `wrap={nn.Linear}`) or a
predicate `wrap=lambda name, module: ...`; each outermost matching submodule with parameters is a
unit, and the root unit holds whatever parameters remain. The default (`wrap=None`) is the elements
of `module.blocks`: one unit per block of a `Transformer` or a `pp.PipelineStage`, and the root
(embedding, final norm, head). A parameter shared by several units (tied weights: an embedding
that is also the head) lives in the root unit (`wrap_units`). Units are found in registration
order (`named_children`, depth first). Both the hand-written FSDP (`fsdp.apply_fsdp`) and PyTorch's
FSDP2 (`torch_strategies.apply_fully_shard`) shard the units this module finds, after `agree` has
checked (one small collective) that every rank of the group found the same ones.
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

Wrap = type | Iterable[type] | Callable[[str, nn.Module], bool] | None
"""A wrap policy: None (the blocks of `.blocks`), an nn.Module class or a tuple/list/set of them
(`()`: no unit but the root), or a predicate `(name, module) -> bool` (name as in
`named_modules`, e.g. "layers.0")."""
Layout = list[tuple[str, nn.Module, list[tuple[str, nn.Parameter, list[str]]]]]
"""Every unit as (name, owner, params), each param as (its first name in owner, the parameter,
every name it has in owner: tied aliases); the root unit "" first, if it holds anything."""

_SEQUENCES = (tuple, list, set, frozenset)


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


def layout(module: nn.Module, units: list[tuple[str, nn.Module]]) -> Layout:
    """The root unit and `units` (from `wrap_units`) with their parameters, as `Layout` says."""
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


def check_floating(units: Layout, shard_dtype: torch.dtype | None) -> None:
    """Each unit flattens into one vector: floating-point parameters of one device (and of one
    dtype, unless `shard_dtype` casts them)."""
    for name, _, params in units:
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


def agree(group, units: Layout) -> None:
    """Every rank of `group` must have cut the same units (names, parameter names and shapes): a
    ValueError on all of them if not (instead of a hang, or shards of different models mixed).
    A collective: every rank of `group` calls it."""
    what = [(name, [(q, tuple(p.shape)) for q, p, _ in params]) for name, _, params in units]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, what, group=group)
    differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differ:
        def names(described: list) -> str:
            listed = [repr(name or "<root>") for name, _ in described]
            return ", ".join(listed[:8] + (["..."] if len(listed) > 8 else []))
        raise ValueError(f"the ranks of the group cut the module into different units (ranks "
                         f"{differ} differ from rank 0): build the same model, with the same wrap "
                         f"policy, on every rank; rank 0 has units {names(everyone[0])}, rank "
                         f"{differ[0]} {names(everyone[differ[0]])}")
