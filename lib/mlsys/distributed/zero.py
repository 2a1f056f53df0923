"""ZeRO stages 1 and 2: each rank keeps the optimizer state (and, at stage 2, the gradients) of its
own share of the parameters only.

`ShardedOptimizer(params, optimizer_cls, group=..., **kwargs)` is a real `torch.optim.Optimizer`
(so `zero_grad`, param groups and `add_param_group` work), sharded over the ranks of `group`
(required: no default to WORLD). Each trainable parameter gets an owner rank
(`accounting.zero.assign_owners`: the rank holding the fewest elements so far); each rank builds
`optimizer_cls` over the parameters it owns, so its state covers about 1/n of them. A step:

1. gradients: stage 1 with `reduce_gradients=False` trusts that a data-parallel wrapper has already
   averaged them (and then the step costs DP's all-reduce plus a broadcast: 1.5x DP's bytes);
   `reduce_gradients=True` sums each gradient onto its owner only (`dist.reduce`), which with the
   broadcast below costs exactly DP's bytes (`accounting.zero.zero_sent_bytes`); stage 2 launches
   those reduces from post-accumulate-grad hooks during the backward and drops every gradient it
   does not own as soon as it has been sent, so a rank ends the step holding only its own;
2. the owner updates its parameters with the inner optimizer, the very code a single process runs
   (so the result is the same bit for bit, given the same gradients);
3. each parameter is broadcast from its owner, so all ranks hold the updated model again.

Frozen parameters (requires_grad False) may be passed: they get no owner and are never sent.
Each parameter must be passed once: a duplicate, in one group or in two, is a ValueError naming
it, before any communication (torch only warns of one inside a group, and ZeRO would then own,
update and broadcast it twice).
At construction rank 0's parameters are broadcast, so every rank starts from the same weights.
Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mlsys import checks
from mlsys.accounting.zero import assign_owners
from mlsys.distributed.ddp import hook_gradients
from mlsys.distributed.groups import check_group


def _distinct(params: Any, where: str, seen: dict[int, str]) -> list[Any]:
    """`params` (tensors, or (name, tensor) pairs) as a list; ValueError naming the first
    parameter that is also at `seen[id(p)]` or earlier in `params` (`seen` gains each one)."""
    if isinstance(params, set):  # unordered: torch's TypeError says why
        return params
    items = [params] if isinstance(params, Tensor) else list(params)
    for i, item in enumerate(items):
        name, p = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
        label = f"{where}[{i}]" + (f" ({name!r})" if name is not None else "")
        if isinstance(p, Tensor):
            if id(p) in seen:
                raise ValueError(
                    f"{label}, of shape {tuple(p.shape)}, is the same parameter as "
                    f"{seen[id(p)]}: each parameter must be passed once (ZeRO would give it an "
                    "owner, update it and broadcast it twice); a tied weight is one parameter, "
                    "as model.parameters() yields it")
            seen[id(p)] = label
    return items


def _param_groups(params: Any) -> list[Any]:
    """`params` as torch.optim reads it (tensors, (name, tensor) pairs or param-group dicts), as a
    list, each group's "params" a list; ValueError if a parameter comes twice, in one group or
    in two."""
    if isinstance(params, Tensor):  # torch's own TypeError says why
        return params
    items, seen = list(params), {}
    if not items or not isinstance(items[0], dict):
        return _distinct(items, "params", seen)
    return [{**g, "params": _distinct(g["params"], f"params[{k}]['params']", seen)}
            if isinstance(g, dict) and "params" in g else g for k, g in enumerate(items)]


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1 (default) or 2 around any `torch.optim.Optimizer` class."""

    def __init__(self, params: Iterable[Any], optimizer_cls: type, *, group,
                 stage: int = 1, reduce_gradients: bool | None = None, **kwargs: Any):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls,
                                                               torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW, got {optimizer_cls!r}")
        checks.choice(stage, "stage", (1, 2))
        params = _param_groups(params)  # each parameter once, checked before any communication
        if reduce_gradients is None:
            reduce_gradients = stage == 2
        if stage == 2 and not reduce_gradients:
            raise ValueError("stage=2 reduces the gradients itself: reduce_gradients must be True")
        self.process_group = check_group(group)
        self.world_size = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        self.stage, self.reduce_gradients = stage, bool(reduce_gradients)
        self._optimizer_cls, self._kwargs = optimizer_cls, kwargs
        self.owner: dict[int, int] = {}  # id(parameter) -> owner's rank in the group
        self._held = [0] * self.world_size  # elements owned per rank so far
        self._trainable: list[Tensor] = []  # in order, each once
        self._inner: torch.optim.Optimizer | None = None
        self._pending: list[tuple[Tensor, Any]] = []
        self._sync = True
        super().__init__(params, defaults=dict(kwargs))
        self.state = self._inner.state  # what this rank really holds

    @property
    def owned_numel(self) -> int:
        """Elements of the parameters this rank owns (its shard)."""
        return self._held[self.rank]

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.process_group, rank)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if isinstance(param_group, dict) and "params" in param_group:
            param_group = {**param_group, "params": _distinct(
                param_group["params"], "param_group['params']",
                {id(p): f"a parameter of param_groups[{k}]"
                 for k, g in enumerate(self.param_groups) for p in g["params"]})}
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        new = [p for p in group["params"] if p.requires_grad and id(p) not in self.owner]
        owners = assign_owners([p.numel() for p in new], self.world_size, held=self._held)
        with torch.no_grad():
            for p in group["params"]:  # everyone starts from rank 0's weights
                dist.broadcast(p, src=self._global(0), group=self.process_group)
        for p, rank in zip(new, owners, strict=True):
            self.owner[id(p)] = rank
            self._held[rank] += p.numel()
            self._trainable.append(p)
            if self.stage == 2:
                hook_gradients([p], self._reduce_now)
        mine = {**{k: v for k, v in group.items() if k != "params"},
                "params": [p for p in new if self.owner[id(p)] == self.rank]}
        if self._inner is None:  # one inner group per group, even empty: hyperparameters align
            self._inner = self._optimizer_cls([mine], **self._kwargs)
        else:
            self._inner.add_param_group(mine)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Stage 2: backward passes inside keep their full gradients (accumulation); the first one
        after reduces them. Stage 1 communicates only in `step`, so this changes nothing there."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _reduce(self, p: Tensor) -> Any:
        if p.grad is None:  # no gradient here: send zeros, so every rank makes the same calls
            p.grad = torch.zeros_like(p)
        return dist.reduce(p.grad, dst=self._global(self.owner[id(p)]), group=self.process_group,
                           async_op=True)

    def _reduce_now(self, p: Tensor) -> None:
        """Stage 2's hook: send this gradient to its owner, and drop the sent ones not ours."""
        if not self._sync:
            return
        self._pending.append((p, self._reduce(p)))
        for q, work in self._pending:
            if q.grad is not None and self.owner[id(q)] != self.rank and work.is_completed():
                q.grad = None

    def _gather_gradients(self) -> None:
        if self.stage == 1:
            self._pending = [(p, self._reduce(p)) for p in self._trainable]
        else:
            sent = {id(p) for p, _ in self._pending}
            self._pending += [(p, self._reduce(p)) for p in self._trainable if id(p) not in sent]
        for p, work in self._pending:
            work.wait()
            if self.owner[id(p)] == self.rank:
                p.grad.div_(self.world_size)
            elif self.stage == 2:
                p.grad = None
        self._pending = []

    @torch.no_grad()
    def step(self, closure=None):
        """Average the gradients onto their owners (unless a wrapper did), update the owned
        parameters, broadcast every parameter from its owner."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.reduce_gradients:
            self._gather_gradients()
        for outer, inner in zip(self.param_groups, self._inner.param_groups, strict=True):
            inner.update({k: v for k, v in outer.items() if k != "params"})  # e.g. a scheduler's lr
        self._inner.step()
        works = [dist.broadcast(p, src=self._global(self.owner[id(p)]), group=self.process_group,
                                async_op=True) for p in self._trainable]
        for work in works:
            work.wait()
        return loss
