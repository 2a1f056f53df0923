"""Counters that check the book's formulas against what PyTorch actually does.

`ByteCounter` is to memory traffic what `torch.utils.flop_counter.FlopCounterMode` is to FLOPs: a
`TorchDispatchMode` that sees every aten op and adds up the bytes of the tensors it reads (its
tensor inputs) and writes (its outputs). It counts what an eager op moves if each input is read
once and each output written once; views (outputs sharing an input's storage: transpose, expand,
a reshape that needs no copy) move nothing and are skipped, and 0-d tensors are scalars passed as
arguments, not traffic. It cannot see caches: on a GPU a small tensor re-read from L2 still counts.

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
            t.device.type != "meta" and t.untyped_storage().data_ptr() in input_storages for t in outputs
        )
        if not is_view:
            name = func.overloadpacket.__name__
            largest = max((t.numel() for t in inputs + outputs), default=0)
            self.ops.append(OpTraffic(name, sum(map(_nbytes, inputs)), sum(map(_nbytes, outputs)), largest))
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


def count_model_flops(cfg, batch: int, seq: int, *, backward: bool = False):
    """Build `Transformer(cfg)` on the meta device and run it under `FlopCounterMode`.

    Meta tensors have shapes but no storage: even the largest preset costs no memory and no
    arithmetic runs, yet every operator dispatches, so the counter sees each matmul with its shapes
    and attributes it to the module that ran it. Returns the counter (`get_total_flops()`,
    `get_flop_counts()` keyed "Transformer.blocks.0.attn.q_proj", ...). With `backward`, the
    backward of `logits.sum()` is counted too.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from mlsys.models.transformer import Transformer

    if batch < 1 or seq < 1:
        raise ValueError(f"batch ({batch}) and seq ({seq}) must be positive")
    with torch.device("meta"):
        model = Transformer(cfg)
        tokens = torch.zeros(batch, seq, dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            logits = model(tokens)
            if backward:
                logits.sum().backward()
    return counter
