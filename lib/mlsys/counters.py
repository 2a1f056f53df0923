"""Counters that check the book's formulas against what PyTorch actually does.

`ByteCounter` is to memory traffic what `torch.utils.flop_counter.FlopCounterMode` is to FLOPs: a
`TorchDispatchMode` that sees every aten op and adds up the bytes of the tensors it reads (its
tensor inputs) and writes (its outputs). It counts what an eager op moves if each input is read
once and each output written once; views (outputs sharing an input's storage: transpose, expand,
a reshape that needs no copy) move nothing and are skipped, and 0-d tensors are scalars passed as
arguments, not traffic. It cannot see caches: on a GPU a small tensor re-read from L2 still counts.

`StorageTouches` answers a narrower question: which ops read or write the storage of a few named
tensors (chapter 04 uses it to show that a linear layer's backward reads W once and writes dW once).

`SavedTensors` counts what autograd keeps for backward (through
`torch.autograd.graph.saved_tensors_hooks`), storage by storage, split into activations and
parameters and tagged with the module that saved them: the check of
`mlsys.accounting.activations`.

Used in: §sec-bytes, chapter 05 (activation memory) and the tests of `mlsys.accounting.bytes`,
`mlsys.accounting.activations` and `mlsys.kernels`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mlsys.checks import positive_int
from mlsys.dtypes import canonical


@dataclass(frozen=True)
class OpTraffic:
    """Bytes one aten op read and wrote."""

    op: str
    read_bytes: int
    write_bytes: int
    largest_numel: int  # elements of the op's largest tensor: the work of an elementwise op


def _nbytes(t: torch.Tensor) -> int:
    return 0 if t.dim() == 0 else t.numel() * t.element_size()


class ByteCounter(TorchDispatchMode):
    """Record the bytes read and written by every aten op run inside `with ByteCounter() as c:`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpTraffic] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        input_storages = {t.untyped_storage().data_ptr() for t in inputs if t.device.type != "meta"}
        is_view = bool(outputs) and all(
            t.device.type != "meta" and t.untyped_storage().data_ptr() in input_storages
            for t in outputs
        )
        if not is_view:
            name = func.overloadpacket.__name__
            largest = max((t.numel() for t in inputs + outputs), default=0)
            read, written = sum(map(_nbytes, inputs)), sum(map(_nbytes, outputs))
            self.ops.append(OpTraffic(name, read, written, largest))
        return out

    @property
    def read_bytes(self) -> int:
        return sum(op.read_bytes for op in self.ops)

    @property
    def write_bytes(self) -> int:
        return sum(op.write_bytes for op in self.ops)

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes


def count_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ByteCounter:
    """Run `fn(*args, **kwargs)` under a `ByteCounter` and return the counter."""
    with ByteCounter() as counter:
        fn(*args, **kwargs)
    return counter


@dataclass(frozen=True)
class Touch:
    """One aten op (not a view) that touched a watched tensor: which names it read and wrote."""

    op: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


class StorageTouches(TorchDispatchMode):
    """Log the ops that read or write the storage of the named tensors:
    `StorageTouches(W=w, dW=w.grad)`.

    A tensor counts as read when a view of its storage is an op's input and as written when it is
    an output (in-place ops such as `add_` are both). View ops move no data and are left out.
    """

    def __init__(self, **tensors: torch.Tensor) -> None:
        super().__init__()
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        self._storages = {name: t.untyped_storage().data_ptr() for name, t in tensors.items()}
        self.touches: list[Touch] = []

    def _names(self, obj: Any) -> tuple[str, ...]:
        ptrs = {t.untyped_storage().data_ptr()
                for t in tree_leaves(obj) if isinstance(t, torch.Tensor)}
        return tuple(sorted(name for name, ptr in self._storages.items() if ptr in ptrs))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view:
            reads, writes = self._names((args, kwargs)), self._names(out)
            if reads or writes:
                self.touches.append(Touch(str(func), reads, writes))
        return out

    def count(self, name: str, *, kind: str) -> int:
        """How many ops read (`kind="read"`) or wrote (`kind="write"`) the tensor called `name`."""
        if name not in self._storages:
            raise ValueError(f"name={name!r} is not watched; watched: {', '.join(self._storages)}")
        if kind not in ("read", "write"):
            raise ValueError(f"kind must be 'read' or 'write', got {kind!r}")
        return sum(name in (t.reads if kind == "read" else t.writes) for t in self.touches)


# --- what autograd saves for backward -------------------------------------------------------------

OUTSIDE = "(outside)"
"""The module path of a tensor saved while no module of the model was running (e.g. the loss)."""


@dataclass(frozen=True)
class SavedStorage:
    """One storage autograd keeps for backward, however many views of it were saved."""

    nbytes: int  # the whole storage: what stays allocated while the graph lives
    shape: tuple[int, ...]  # of the first view saved
    dtype: str  # the book's short name ("fp32", "bf16", "bool", "int64")
    module: str  # innermost module running when first saved ("blocks.0.attn"; "" the model
    #              itself), or OUTSIDE
    kind: str  # "activation", "parameter" or "excluded"
    saves: int  # how many times a view of it was saved


def _dtype_name(dtype: torch.dtype) -> str:
    try:
        return canonical(dtype)
    except ValueError:  # a dtype the book's registry does not list (uint8, complex64, ...)
        return str(dtype).removeprefix("torch.")


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter or a view of one (nn.Linear saves `weight.t()`, whose `_base` is the weight)."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)


class SavedTensors:
    """Record what autograd saves for backward inside `with SavedTensors(model) as saved:`.

    Each saved tensor is keyed on its storage, `untyped_storage()._cdata` (the identity of the
    C++ storage; on the meta device every `data_ptr()` is 0, so data pointers would merge
    everything), and counted once at the storage's `nbytes()`: q, k and v projections saving one
    input, or a slice saved twice, cost one storage. The whole storage, not the view's extent, is
    what a saved view keeps allocated: `tokens[:, :-1]` keeps the (batch, seq + 1) batch alive.

    Kinds: "parameter" (an `nn.Parameter` or a view of one, any parameter of `model`),
    "excluded" (the tensors in `exclude` and the buffers of `model`, e.g. RoPE tables: state
    that exists before the forward) and "activation" (the rest: what the forward adds). With a
    `model`, forward hooks on its modules tag each storage with the innermost module running
    when it was first saved (`SavedStorage.module`, "blocks.0.attn"). The counter holds no
    tensor (the allocator sees the same memory with or without it), so its keys are valid only
    while the saved tensors live: keep the graph (the loss) until the counter is read. The
    recomputation inside `torch.utils.checkpoint` installs its own hooks, so a checkpointed
    segment shows up only through the inputs the checkpoint saves.
    """

    def __init__(self, model: nn.Module | None = None, *,
                 exclude: Iterable[torch.Tensor] = ()) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if isinstance(exclude, torch.Tensor):
            exclude = (exclude,)
        exclude = list(exclude)
        for i, t in enumerate(exclude):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"exclude[{i}] must be a tensor, got {type(t).__name__}")
        if model is not None:
            exclude += list(model.buffers())
        self._model = model
        self._parameters = {p.untyped_storage()._cdata
                            for p in (model.parameters() if model is not None else ())}
        self._excluded = {t.untyped_storage()._cdata for t in exclude}
        self._records: dict[int, dict[str, Any]] = {}  # storage key -> SavedStorage fields
        self._stack: list[str] = []  # paths of the modules running now, innermost last
        self._handles: list[Any] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def __enter__(self) -> SavedTensors:
        if self._model is not None:
            for name, module in self._model.named_modules():
                self._handles.append(module.register_forward_pre_hook(
                    functools.partial(self._enter_module, name)))
                self._handles.append(module.register_forward_hook(
                    self._exit_module, always_call=True))
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()

    def _enter_module(self, name: str, module: nn.Module, args: Any) -> None:
        self._stack.append(name)

    def _exit_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        record = self._records.get(key)
        if record is None:
            if key in self._parameters or _is_parameter(t):
                kind = "parameter"
            else:
                kind = "excluded" if key in self._excluded else "activation"
            record = self._records[key] = dict(
                nbytes=storage.nbytes(), shape=tuple(t.shape), dtype=_dtype_name(t.dtype),
                module=self._stack[-1] if self._stack else OUTSIDE, kind=kind, saves=0)
        record["saves"] += 1
        return t

    @property
    def storages(self) -> list[SavedStorage]:
        """Every storage saved, in the order first saved."""
        return [SavedStorage(**record) for record in self._records.values()]

    def _bytes(self, kind: str) -> int:
        return sum(s.nbytes for s in self.storages if s.kind == kind)

    @property
    def activation_bytes(self) -> int:
        """Bytes of the storages the forward created and autograd keeps (activations)."""
        return self._bytes("activation")

    @property
    def parameter_bytes(self) -> int:
        """Bytes of the parameters saved (each once): state that exists before the forward."""
        return self._bytes("parameter")

    @property
    def excluded_bytes(self) -> int:
        """Bytes of the saved storages of `exclude` and of the model's buffers."""
        return self._bytes("excluded")

    def by_module(self, depth: int | None = None) -> dict[str, int]:
        """Activation bytes by the module that first saved them, paths cut to `depth` names
        (`depth=2`: "blocks.0"); in the order first saved."""
        if depth is not None:
            positive_int(depth, "depth")
        out: dict[str, int] = {}
        for s in self.storages:
            if s.kind == "activation":
                path = s.module if s.module == OUTSIDE else ".".join(s.module.split(".")[:depth])
                out[path] = out.get(path, 0) + s.nbytes
        return out

    def by_dtype(self) -> dict[str, int]:
        """Activation bytes by dtype ("fp32", "bf16", "bool", "int64"), in the order first
        saved."""
        out: dict[str, int] = {}
        for s in self.storages:
            if s.kind == "activation":
                out[s.dtype] = out.get(s.dtype, 0) + s.nbytes
        return out
