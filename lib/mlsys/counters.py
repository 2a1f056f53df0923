"""Counters that check the book's formulas against what PyTorch actually does.

`ByteCounter` is to memory traffic what `torch.utils.flop_counter.FlopCounterMode` is to FLOPs: a
`TorchDispatchMode` that sees every aten op and adds up the bytes of the tensors it reads (its
tensor inputs) and writes (its outputs). It counts what an eager op moves if each input is read
once and each output written once; views (outputs sharing an input's storage: transpose, expand,
a reshape that needs no copy) move nothing and are skipped, and 0-d tensors are scalars passed as
arguments, not traffic. It cannot see caches: on a GPU a small tensor re-read from L2 still counts.

`StorageTouches` answers a narrower question: which ops read or write the storage of a few named
tensors (chapter 04 uses it to show that a linear layer's backward reads W once and writes dW once).

Used in: §sec-bytes and the tests of `mlsys.accounting.bytes` and `mlsys.kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


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
