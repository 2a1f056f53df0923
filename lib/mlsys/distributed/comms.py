"""A ring all-reduce built from sends and receives, and a counter of the bytes collectives move.

`ring_all_reduce` is the bandwidth-optimal algorithm of `accounting.comms`, written out: the tensor
is cut into n chunks; in n-1 steps of a reduce-scatter each rank passes a chunk to its right-hand
neighbour and adds the one arriving from its left, until each rank holds the full sum of one chunk;
in n-1 steps of an all-gather the summed chunks travel once more around the ring. Each rank sends
2 (n-1) chunks of M / n bytes: 2 (n-1)/n M, which `count_bytes` measures. (Patarasuk & Yuan, 2009,
"Bandwidth optimal all-reduce algorithms for clusters of workstations".)

`count_bytes()` wraps the `torch.distributed` functions while it is active and tallies, per call,
the function, its message size (M as `accounting.comms` names it) and the bytes this rank sends and
receives: exactly what point-to-point calls pass, and `accounting.comms.collective_cost` for
collectives (whose inner algorithm the library does not expose). It sees calls made through the
Python API (our DDP, ZeRO and ring code); torch's own DistributedDataParallel calls the process
group from C++ and is not seen. Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from mlsys.accounting.comms import collective_cost
from mlsys.distributed.groups import check_group

# torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor to all_gather_single and
# reduce_scatter_single (the old names still work and warn); torch 2.11 has only the old names.
# The library calls whichever this torch has, through the two functions below; `count_bytes`
# tallies the call under that name.
ALL_GATHER_SINGLE = (
    "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor")
REDUCE_SCATTER_SINGLE = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor")


def all_gather_single(output: Tensor, input: Tensor, group, async_op: bool = False):
    """`dist.all_gather_single` (torch >= 2.13) or `dist.all_gather_into_tensor` (older): every
    rank's `input` of `group` concatenated along dim 0 into `output`."""
    gather = getattr(dist, ALL_GATHER_SINGLE)  # looked up per call: `count_bytes` replaces it
    return gather(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: Tensor, input: Tensor, group, async_op: bool = False):
    """`dist.reduce_scatter_single` (torch >= 2.13) or `dist.reduce_scatter_tensor` (older): the
    sum over the ranks of `group` of `input`, this rank's 1/n of it (along dim 0) into `output`."""
    scatter = getattr(dist, REDUCE_SCATTER_SINGLE)
    return scatter(output, input, group=group, async_op=async_op)


# function -> (collective of accounting.comms, the argument that names the message)
COUNTED = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "all_to_all_single": ("all_to_all", "input"),
    "send": ("send", "tensor"),
    "isend": ("send", "tensor"),
    "recv": ("recv", "tensor"),
    "irecv": ("recv", "tensor"),
    "barrier": ("barrier", None),
}


def _nbytes(obj: object) -> int:
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    return sum(_nbytes(t) for t in obj)  # a list of tensors


@dataclass
class CommCount:
    """What one rank's calls moved while `count_bytes` was active."""

    calls: Counter = field(default_factory=Counter)  # function name -> calls
    message_bytes: Counter = field(default_factory=Counter)  # collective -> sum of M
    sent_bytes: float = 0.0  # this rank, all calls
    received_bytes: float = 0.0
    records: list = field(default_factory=list)  # (function, collective, M, n_ranks) per call

    def add(self, function: str, collective: str, message_bytes: int, n_ranks: int) -> None:
        self.calls[function] += 1
        self.records.append((function, collective, message_bytes, n_ranks))
        if collective == "barrier":
            return
        self.message_bytes[collective] += message_bytes
        if collective == "send":
            self.sent_bytes += message_bytes
        elif collective == "recv":
            self.received_bytes += message_bytes
        else:
            cost = collective_cost(collective, message_bytes, n_ranks)
            self.sent_bytes += cost.sent_bytes
            self.received_bytes += cost.received_bytes


@contextlib.contextmanager
def count_bytes() -> Iterator[CommCount]:
    """Within: every `torch.distributed` call of `COUNTED` is tallied in the yielded `CommCount`.

    The functions are replaced in `torch.distributed` (and in its `distributed_c10d` module, so
    `P2POp(dist.isend, ...)` and `batch_isend_irecv` work and are counted) and restored on exit. A
    call made inside another counted call (a wrapper around a wrapper) is counted once.
    """
    count = CommCount()
    lock, inner = threading.Lock(), threading.local()
    modules = (dist, dist.distributed_c10d)
    saved: list[tuple[object, str, object]] = []

    def wrap(name: str, original):
        collective, arg = COUNTED[name]
        signature = inspect.signature(original)

        def counted(*args, **kwargs):
            if getattr(inner, "depth", 0) == 0:
                bound = signature.bind(*args, **kwargs)
                group = bound.arguments.get("group")
                n = dist.get_world_size(group) if group is not None else dist.get_world_size()
                size = 0 if arg is None else _nbytes(bound.arguments[arg])
                with lock:
                    count.add(name, collective, size, n)
            inner.depth = getattr(inner, "depth", 0) + 1
            try:
                return original(*args, **kwargs)
            finally:
                inner.depth -= 1

        counted.__wrapped__ = original
        return counted

    wrappers = {name: wrap(name, getattr(dist, name)) for name in COUNTED if hasattr(dist, name)}
    try:
        for module in modules:
            for name, wrapper in wrappers.items():
                if hasattr(module, name):
                    saved.append((module, name, getattr(module, name)))
                    setattr(module, name, wrapper)
        yield count
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


def _exchange(send: Tensor, dst: int, recv: Tensor, src: int, group) -> None:
    """Send `send` to global rank `dst` while receiving `recv` from `src` (no deadlock: the send is
    asynchronous)."""
    request = dist.isend(send, dst=dst, group=group)
    dist.recv(recv, src=src, group=group)
    request.wait()


def ring_all_reduce(tensor: Tensor, group) -> Tensor:
    """Sum `tensor` over the ranks of `group` in place, by a ring of sends and receives; return it.

    Equal to `dist.all_reduce(tensor)` (bit for bit on integers and on 2 ranks; floats may differ
    in the last bits elsewhere, since the additions happen in another order).
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (the ring sends views of it)")
    check_group(group)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor
    chunks = list(tensor.view(-1).tensor_split(n))  # sizes differ by at most one element
    right = dist.get_global_rank(group, (r + 1) % n)
    left = dist.get_global_rank(group, (r - 1) % n)
    buffer = torch.empty_like(chunks[0])  # the first chunks are the largest
    # reduce-scatter: at step s, pass on chunk r - s (holding s + 1 ranks' parts) and add the
    # left neighbour's chunk r - s - 1; after n - 1 steps chunk r + 1 holds the sum of all n.
    for s in range(n - 1):
        out, into = (r - s) % n, (r - s - 1) % n
        incoming = buffer[: chunks[into].numel()]
        _exchange(chunks[out], right, incoming, left, group)
        chunks[into].add_(incoming)
    # all-gather: pass each finished chunk once around the ring, overwriting the partial sums
    for s in range(n - 1):
        out, into = (r + 1 - s) % n, (r - s) % n
        _exchange(chunks[out], right, chunks[into], left, group)
    return tensor
