"""Data parallelism by hand: four wrappers of an unmodified module, from naive to bucketed.

Every rank holds the whole model and runs its own slice of the batch; after the backward pass the
gradients are averaged over the ranks, so every optimizer step is the same everywhere. The
wrappers differ only in *when* and *how many* all-reduces they launch:

- `NaiveDDP`: after the backward, one all-reduce per parameter (as many launches as tensors);
- `FlatDDP`: after the backward, one all-reduce of all gradients flattened into one buffer;
- `OverlappedDDP`: one asynchronous all-reduce per parameter, launched from a post-accumulate-grad
  hook the moment its gradient is ready, so communication overlaps the rest of the backward;
- `BucketedDDP`: gradients grouped, in reverse order of the parameters (roughly the order the
  backward produces them), into buckets of at most `bucket_size_mb` (MiB, as torch's
  `bucket_cap_mb`); each bucket is all-reduced asynchronously as soon as it is full.

All of them: broadcast rank 0's parameters and buffers at construction; add no parameters
(`.module` is the wrapped model); hook a tied parameter once and skip frozen ones; give a trainable
parameter that got no gradient zeros, so every rank launches the same collectives; and accumulate
gradients without communication inside `with model.no_sync():`. After each backward that is not in
`no_sync`, call `finish_gradient_synchronization()` before the optimizer step.
Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlsys import checks
from mlsys.accounting.buckets import buckets as _bucket_indices
from mlsys.distributed.groups import check_group

MIB = 2**20


def hook_gradients(params: list[Tensor], method: Callable[[Tensor], None]) -> None:
    """Call the bound `method(p)` as soon as each parameter's gradient is accumulated in a backward
    pass (a post-accumulate-grad hook), through a weak reference: the parameters do not keep
    `method`'s object alive, so dropping a wrapper frees it at once (no reference cycle)."""
    ref = weakref.WeakMethod(method)

    def hook(p: Tensor) -> None:
        bound = ref()
        if bound is not None:
            bound(p)

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


class _DataParallel(nn.Module):
    """What every variant shares: the broadcast at construction, the trainable parameters,
    `no_sync` and averaging."""

    def __init__(self, module: nn.Module, group):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        self.group = check_group(group)
        self.world_size = dist.get_world_size(self.group)
        self._sync = True
        src = dist.get_global_rank(self.group, 0)
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=src, group=self.group)
        # parameters() yields a tied parameter once; frozen ones never get a gradient to average
        self.trainable = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the first one after syncs them."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _grad(self, p: Tensor) -> Tensor:
        if p.grad is None:  # unused this step on this rank: zeros keep the collectives matched
            p.grad = torch.zeros_like(p)
        return p.grad

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError


class NaiveDDP(_DataParallel):
    """One blocking all-reduce per parameter after the backward pass."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        for p in self.trainable:
            grad = self._grad(p)
            dist.all_reduce(grad, group=self.group)
            grad.div_(self.world_size)


class FlatDDP(_DataParallel):
    """One all-reduce of every gradient, flattened into one buffer, after the backward pass."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync or not self.trainable:
            return
        grads = [self._grad(p) for p in self.trainable]
        flat = _flatten_dense_tensors(grads)  # one copy in, one copy out: the price of one launch
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)


class OverlappedDDP(_DataParallel):
    """An asynchronous all-reduce per parameter, launched as soon as its gradient is ready."""

    def __init__(self, module: nn.Module, group):
        super().__init__(module, group)
        self._pending: list[tuple[Tensor, object]] = []
        hook_gradients(self.trainable, self._hook)

    def _hook(self, p: Tensor) -> None:
        if self._sync:
            work = dist.all_reduce(p.grad, group=self.group, async_op=True)
            self._pending.append((p, work))

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        launched = {id(p) for p, _ in self._pending}
        for p in self.trainable:  # parameters that got no gradient: all-reduce zeros, in order
            if id(p) not in launched:
                self._pending.append((p, dist.all_reduce(self._grad(p), group=self.group,
                                                         async_op=True)))
        for p, work in self._pending:
            work.wait()
            p.grad.div_(self.world_size)
        self._pending = []


class BucketedDDP(_DataParallel):
    """Gradients in buckets of at most `bucket_size_mb` MiB, each all-reduced asynchronously as
    soon as its last gradient is ready; `finish_gradient_synchronization` waits and copies back.
    """

    def __init__(self, module: nn.Module, group, *, bucket_size_mb: float = 25.0):
        checks.positive(bucket_size_mb, "bucket_size_mb")
        super().__init__(module, group)
        self.bucket_size_mb = float(bucket_size_mb)
        ready_order = self.trainable[::-1]  # the backward meets the last layers first
        sizes = [p.numel() * p.element_size() for p in ready_order]
        self.buckets = [[ready_order[i] for i in group]
                        for group in _bucket_indices(sizes, bucket_size_mb * MIB)]
        self._bucket_of = {id(p): b for b, params in enumerate(self.buckets) for p in params}
        self._reset()
        hook_gradients(self.trainable, self._hook)

    def _reset(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._work: list[tuple[int, Tensor, object] | None] = [None] * len(self.buckets)

    def _launch(self, b: int) -> None:
        grads = [self._grad(p) for p in self.buckets[b]]
        flat = _flatten_dense_tensors(grads) if len(grads) > 1 else grads[0]
        self._work[b] = (b, flat, dist.all_reduce(flat, group=self.group, async_op=True))

    def _hook(self, p: Tensor) -> None:
        if not self._sync:
            return
        b = self._bucket_of[id(p)]
        if self._work[b] is not None:
            raise RuntimeError("a gradient arrived for a bucket already sent this step: call "
                               "finish_gradient_synchronization() after every backward")
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._launch(b)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync:
            return
        for b in range(len(self.buckets)):  # buckets with a parameter that got no gradient
            if self._work[b] is None:
                self._launch(b)
        for b, flat, work in self._work:
            work.wait()
            flat.div_(self.world_size)
            params = self.buckets[b]
            if len(params) > 1:
                grads = [p.grad for p in params]
                for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads),
                                        strict=True):
                    grad.copy_(synced)
        self._reset()


VARIANTS = {"naive": NaiveDDP, "flat": FlatDDP, "overlapped": OverlappedDDP,
            "bucketed": BucketedDDP}


def apply_ddp(module: nn.Module, variant: str = "bucketed", *, group,
              bucket_size_mb: float = 25.0) -> _DataParallel:
    """Wrap an unmodified `module` in the data-parallel `variant` ("naive", "flat",
    "overlapped" or "bucketed", which alone takes `bucket_size_mb`) over the ranks of `group`."""
    checks.choice(variant, "variant", VARIANTS)
    if variant == "bucketed":
        return BucketedDDP(module, group, bucket_size_mb=bucket_size_mb)
    return VARIANTS[variant](module, group)
