"""The dtype of everything a forward and backward touch: autocast's real behaviour, as a table.

`DtypeRecorder` combines module hooks (each module's parameters as stored, its input and output,
and, through a hook on the output, the gradient flowing back into it) with a `TorchDispatchMode`,
which sees every aten op after autocast has chosen its dtypes, the casts it inserts included.
When the block ends it reads each parameter's gradient: its stored dtype, and the narrowest
format that holds its values exactly (`exact_in`): an fp32 gradient computed by a bf16 matmul
says "bf16". Autocast's op lists differ by device (CPU autocast lets layer_norm and softmax follow
their input; CUDA's list runs them in fp32), so the table is measured where the model runs,
never copied from documentation. Used in: §sec-mixed-precision (`experiments.autocast_dtypes`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mlsys.book import Table
from mlsys.counters import OUTSIDE
from mlsys.dtypes import canonical, torch_dtype


def _dtype_name(dtype: torch.dtype) -> str:
    try:
        return canonical(dtype)
    except ValueError:  # a dtype the book's registry does not list (uint8, complex64, ...)
        return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class OpDtypes:
    """One aten op as it ran (after autocast chose its dtypes): its tensors' dtypes."""

    op: str  # the overload packet's name ("mm", "_to_copy", "native_layer_norm")
    phase: str  # "forward" or "backward" (run by the autograd engine)
    module: str  # innermost module running in the forward ("" the model itself); OUTSIDE else
    inputs: tuple[str, ...]  # dtypes of its tensor arguments, in order (book short names)
    outputs: tuple[str, ...]


EXACT_IN = ("bf16", "fp16", "fp32", "fp64")
"""Formats tried, narrowest first, by `exact_in`."""


def exact_in(t: torch.Tensor) -> str:
    """The first format of `EXACT_IN` (no wider than `t`'s own) that holds every value of `t`
    exactly: a gradient stored in fp32 but computed by a bf16 matmul says "bf16"."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"t must be a floating-point tensor, got {type(t).__name__}")
    for name in EXACT_IN:
        dt = torch_dtype(name)
        if dt.itemsize <= t.element_size() and torch.equal(t.to(dt).to(t.dtype), t):
            return name
    return _dtype_name(t.dtype)


def _dtypes(obj: Any) -> tuple[str, ...]:
    return tuple(_dtype_name(t.dtype) for t in tree_leaves(obj) if isinstance(t, torch.Tensor))


class DtypeRecorder(TorchDispatchMode):
    """Record the dtype of everything a forward and backward touch, inside
    `with DtypeRecorder(model) as rec:` (run the forward, `rec.note("loss", loss)`, backward).

    Per module (forward hooks): its own parameters as stored, its input and output, and (a hook
    on the output) the gradient that flows back into it. Per aten op (this is a
    `TorchDispatchMode`, so it sees what autocast dispatched, casts included): its inputs' and
    outputs' dtypes, the module that ran it and the phase. When the block ends, each parameter's
    gradient: its dtype and the narrowest format that holds its values exactly (`exact_in`).
    `table()` puts one row per module that ran; `ops` holds every op.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self._model = model
        self.ops: list[OpDtypes] = []
        self.modules: dict[str, dict[str, Any]] = {}  # path -> what was seen, in forward order
        self.notes: dict[str, str] = {}
        self.grads: dict[str, tuple[str, str]] = {}  # parameter -> (stored dtype, exact in)
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> DtypeRecorder:
        for name, module in self._model.named_modules():
            self._handles.append(module.register_forward_pre_hook(
                functools.partial(self._enter_module, name)))
            self._handles.append(module.register_forward_hook(
                functools.partial(self._exit_module, name), always_call=True))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()
        with torch.no_grad():
            self.grads = {n: (_dtype_name(p.grad.dtype), exact_in(p.grad))
                          for n, p in self._model.named_parameters() if p.grad is not None}

    def _enter_module(self, name: str, module: nn.Module, args: Any) -> None:
        self._stack.append(name)
        entry = self.modules.setdefault(name, {"type": type(module).__name__})
        entry["params"] = tuple(_dtype_name(p.dtype) for p in module.parameters(recurse=False))
        entry["input"] = _dtypes(args)

    def _exit_module(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()
        entry = self.modules[name]
        entry["output"] = _dtypes(output)
        for t in tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(functools.partial(self._grad_seen, name))

    def _grad_seen(self, name: str, grad: torch.Tensor) -> None:
        self.modules[name]["output grad"] = _dtype_name(grad.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view and func.overloadpacket.__name__ != "detach":
            backward = torch._C._current_autograd_node() is not None
            module = OUTSIDE if backward or not self._stack else self._stack[-1]
            self.ops.append(OpDtypes(func.overloadpacket.__name__,
                                     "backward" if backward else "forward", module,
                                     _dtypes((args, kwargs)), _dtypes(out)))
        return out

    def note(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Record `tensor`'s dtype under `name` (e.g. "loss") and return it unchanged."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a tensor, got {type(tensor).__name__}")
        self.notes[name] = _dtype_name(tensor.dtype)
        return tensor

    def module_ops(self, path: str, *, phase: str = "forward") -> list[OpDtypes]:
        """The ops run inside module `path` (its own and its children's) in `phase`."""
        if phase not in ("forward", "backward"):
            raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")
        if path not in self.modules:
            raise ValueError(f"path={path!r} did not run; ran: {', '.join(self.modules)}")
        inside = [o for o in self.ops if o.phase == phase and o.module != OUTSIDE]
        return [o for o in inside if path == "" or o.module == path
                or o.module.startswith(path + ".")]

    def table(self, *, leaves_only: bool = True) -> Table:
        """One row per module that ran (only modules without children when `leaves_only`):
        parameters as stored, the dtypes its matmuls read, input, output, the gradient flowing
        back into its output, and its parameters' gradients (stored / exact in)."""
        body = []
        for path, e in self.modules.items():
            module = self._model.get_submodule(path)
            if leaves_only and any(True for _ in module.children()):
                continue
            own = [n for n, _ in module.named_parameters(prefix=path, recurse=False)]
            grads = sorted({"/".join(self.grads[n]) for n in own if n in self.grads})
            reads = sorted({d for o in self.module_ops(path) if o.op in _MATMULS for d in o.inputs})
            body.append([path or "(model)", e["type"], ", ".join(sorted(set(e.get("params", ()))))
                         or "-", ", ".join(reads) or "-", ", ".join(e.get("input", ())) or "-",
                         ", ".join(e.get("output", ())) or "-", e.get("output grad", "-"),
                         ", ".join(grads) or "-"])
        return Table(["module", "type", "parameters", "matmul reads", "input", "output",
                      "output's gradient", "parameter grads (stored/exact in)"], body)


_MATMULS = frozenset({"mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "_scaled_mm"})
