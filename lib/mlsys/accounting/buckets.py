"""Gradient buckets of data parallelism: how tensors are grouped, and the communication the
backward leaves exposed.

DDP all-reduces the gradients in buckets, in the order they become ready (reverse of the forward
for a sequential model); each bucket's ring all-reduce (`comms.collective_time_s`, alpha-beta)
starts once its gradients are ready and the previous all-reduce is done. Small buckets start early
but pay alpha many times; large ones start late and leave a long last all-reduce after the
backward. `overlap_schedule` times each bucket, `overlap_exposed_s` is the communication left
when the backward ends, `exposed_bounds_s` its two lower bounds (tail and queue), `bucket_sweep`
and `best_bucket_cap` the trade-off over bucket caps. Pure: no torch. Used in:
§sec-data-parallel (chapter 08), `mlsys.distributed.ddp`, `mlsys.diagrams.collectives`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.comms import all_reduces_s, collective_time_s


def buckets(tensor_bytes: Sequence[int], cap_bytes: float) -> list[list[int]]:
    """Indices of tensors grouped in order into buckets of at most `cap_bytes` (a tensor larger
    than the cap gets a bucket of its own). Pass the tensors in the order their gradients become
    ready (reverse of the forward for a sequential model)."""
    sizes = checks.int_sequence(tensor_bytes, "tensor_bytes", minimum=0)
    cap = checks.positive(cap_bytes, "cap_bytes")
    out: list[list[int]] = []
    filled = 0
    for i, size in enumerate(sizes):
        if not out or filled + size > cap:
            out.append([])
            filled = 0
        out[-1].append(i)
        filled += size
    return out


@dataclass(frozen=True)
class BucketSlot:
    """One bucket of `overlap_schedule`: its bytes, when the backward starts and finishes its
    gradients, and when its all-reduce starts and ends (seconds from the backward's start)."""

    bytes: float
    first_s: float
    ready_s: float
    start_s: float
    end_s: float


def overlap_schedule(bucket_bytes: Sequence[float], backward_s: float, n_ranks: int, *,
                     alpha_s: float, bytes_per_s: float) -> list[BucketSlot]:
    """Each bucket's timing when its all-reduce starts as soon as its gradients are ready and the
    previous all-reduce is done.

    Gradients are assumed to appear at a steady rate in bytes over `backward_s`. The trade-off:
    small buckets start early but pay `alpha` many times; large ones start late and leave a long
    last all-reduce (the tail) after the backward.
    """
    sizes = [checks.nonnegative(b, f"bucket_bytes[{i}]") for i, b in enumerate(bucket_bytes)]
    backward = checks.nonnegative(backward_s, "backward_s")
    total, done, end, slots = sum(sizes), 0.0, 0.0, []
    for size in sizes:
        first = backward * done / total if total else 0.0
        done += size
        ready = backward * done / total if total else backward
        start = max(ready, end)
        end = start + collective_time_s("all_reduce", size, n_ranks, alpha_s=alpha_s,
                                        bytes_per_s=bytes_per_s)
        slots.append(BucketSlot(size, first, ready, start, end))
    return slots


def overlap_exposed_s(bucket_bytes: Sequence[float], backward_s: float, n_ranks: int, *,
                      alpha_s: float, bytes_per_s: float) -> float:
    """Communication left after the backward pass ends (`overlap_schedule`'s last all-reduce
    past `backward_s`), 0 when the backward hides it all."""
    slots = overlap_schedule(bucket_bytes, backward_s, n_ranks, alpha_s=alpha_s,
                             bytes_per_s=bytes_per_s)
    return max(slots[-1].end_s - backward_s, 0.0) if slots else 0.0


def exposed_bounds_s(bucket_bytes: Sequence[float], backward_s: float, n_ranks: int, *,
                     alpha_s: float, bytes_per_s: float) -> tuple[float, float]:
    """The two lower bounds on `overlap_exposed_s` that set the best bucket size: (tail, queue).

    tail: the last bucket's all-reduce, which cannot start before the backward ends; it grows
    with the bucket size. queue: the all-reduces run one after another from the moment the first
    bucket is ready, so they end no earlier than first-ready + the sum of all their times, which
    the backward hides: queue = first_ready + sum - backward_s; it grows with the number of
    buckets (one alpha term each) and with the size of the first. The exposed time is at least
    the larger of the two, and equal to it for equal buckets.
    """
    sizes = [checks.nonnegative(b, f"bucket_bytes[{i}]") for i, b in enumerate(bucket_bytes)]
    if not sizes:
        raise ValueError("bucket_bytes must hold at least one bucket")
    backward = checks.nonnegative(backward_s, "backward_s")
    ab = {"alpha_s": alpha_s, "bytes_per_s": bytes_per_s}
    tail = collective_time_s("all_reduce", sizes[-1], n_ranks, **ab)
    total = sum(sizes)
    first_ready = backward * sizes[0] / total if total else backward
    queue = first_ready + all_reduces_s(sizes, n_ranks, **ab) - backward
    return tail, max(queue, 0.0)


def bucket_bytes(tensor_bytes: Sequence[int], cap_bytes: float) -> list[int]:
    """The size of each bucket `buckets` makes, in bytes."""
    sizes = checks.int_sequence(tensor_bytes, "tensor_bytes", minimum=0)
    return [sum(sizes[i] for i in group) for group in buckets(sizes, cap_bytes)]


@dataclass(frozen=True)
class BucketPoint:
    """One bucket cap of a sweep: its buckets, the two bounds and the exposed communication."""

    cap_bytes: float
    buckets: int
    tail_s: float  # `exposed_bounds_s`
    queue_s: float
    exposed_s: float  # `overlap_exposed_s`


def bucket_sweep(tensor_bytes: Sequence[int], backward_s: float, n_ranks: int, *,
                 alpha_s: float, bytes_per_s: float,
                 caps_bytes: Sequence[float]) -> list[BucketPoint]:
    """Every cap of `caps_bytes`, the tensors (in the order they become ready) bucketed under it:
    how many buckets, the tail and queue bounds, and the communication left after the backward."""
    if not caps_bytes:
        raise ValueError("caps_bytes must name at least one bucket cap")
    ab = {"alpha_s": alpha_s, "bytes_per_s": bytes_per_s}
    out = []
    for cap in caps_bytes:
        groups = bucket_bytes(tensor_bytes, cap)
        tail, queue = exposed_bounds_s(groups, backward_s, n_ranks, **ab)
        out.append(BucketPoint(float(cap), len(groups), tail, queue,
                               overlap_exposed_s(groups, backward_s, n_ranks, **ab)))
    return out


def best_bucket_cap(tensor_bytes: Sequence[int], backward_s: float, n_ranks: int, *,
                    alpha_s: float, bytes_per_s: float,
                    caps_bytes: Sequence[float]) -> tuple[float, float]:
    """The cap among `caps_bytes` whose buckets leave the least exposed communication (the first
    of equals), and that time: (cap_bytes, exposed_s)."""
    best = min(bucket_sweep(tensor_bytes, backward_s, n_ranks, alpha_s=alpha_s,
                            bytes_per_s=bytes_per_s, caps_bytes=caps_bytes),
               key=lambda p: p.exposed_s)
    return best.cap_bytes, best.exposed_s
