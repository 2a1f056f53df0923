"""The checks every distributed strategy makes of its arguments, in one public home.

`check_initialized` insists on a running `torch.distributed`; `check_group` on an explicit
process group inside it (no silent default to WORLD: every function that communicates takes its
group as an argument); `check_blocks` on a module that keeps its transformer blocks in `.blocks`
(a `Transformer` or a `pp.PipelineStage`), which tensor and context parallelism walk.
Used by `comms`, `ddp`, `zero`, `fsdp`, `tp`, `pp`, `cp`, `mesh` and `torch_strategies`.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn


def check_initialized() -> None:
    """RuntimeError unless torch.distributed is up (a launch, or init_process_group)."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: run inside "
                           "mlsys.distributed.launch (or call init_process_group first)")


def check_group(group: object, name: str = "group") -> Any:
    """A process group, explicitly: torch.distributed must be up and `group` a ProcessGroup.

    Anything but None or a ProcessGroup (a name such as 'world', a rank list) is a TypeError at
    once, even outside a launch; None there says that torch.distributed is not initialized."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name} must be a torch.distributed.ProcessGroup (e.g. Rank.group or a "
                        f"mesh axis), got {_short(group)}")
    check_initialized()
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name} must be a torch.distributed.ProcessGroup (e.g. Rank.group or a "
                        f"mesh axis), got {type(group).__name__}")
    return group


def _short(value: object) -> str:
    """`value`'s type and a repr of at most 40 characters: what a message quotes."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_blocks(module: object) -> nn.Module:
    """A module with its blocks in `.blocks`, a ModuleList (what tp.apply_tp and cp.apply_cp
    need)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(getattr(module, "blocks", None), nn.ModuleList):
        raise TypeError(f"module must have its blocks in `.blocks` (a Transformer or a "
                        f"pp.PipelineStage), got {type(module).__name__}")
    return module
