"""Activation checkpointing of the book's transformer, applied to the unmodified model.

`checkpoint_blocks(model, segment)` groups `model.blocks` into consecutive segments of `segment`
blocks (the last may be shorter) and runs each segment under
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: the forward keeps only each
segment's input, and the backward reruns one segment's forward at a time to get back what it
needs. segment=1 checkpoints every block; segment ~ sqrt(n_layers) is the classic sqrt(L) plan of
Chen et al. (2016), "Training Deep Nets with Sublinear Memory Cost". What it saves and recomputes
is predicted by `mlsys.accounting.activations` (`saved_bytes(..., checkpoint_segment=...)`) and
`mlsys.accounting.recompute` (`recompute_flops`), and the tests check both against
`SavedTensors` and `FlopCounterMode`.

How: the model's forward loops `for block in self.blocks`. The blocks move, unchanged, into a
`CheckpointedBlocks` list (same parameter names, same state dict) whose iteration yields one
callable per segment, so that loop now runs segments. Indexing and `len` still give blocks;
iterate `model.blocks.children()` for the blocks themselves. `torch.utils.checkpoint.
checkpoint_sequential` does the same for a module whose blocks take one input; ours take
(x, cos, sin). Used in: chapter 05.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mlsys import checks


class _Segment:
    """Consecutive blocks run as one checkpointed function of (x, cos, sin)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        self.blocks = blocks

    def _forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x, cos, sin)
        return x

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return checkpoint(self._forward, x, cos, sin, use_reentrant=False)


class CheckpointedBlocks(nn.ModuleList):
    """A model's blocks, at the same paths ("blocks.0", ...), iterated by checkpointed segment."""

    def __init__(self, blocks: nn.ModuleList, segment: int) -> None:
        super().__init__(blocks.children())
        self.segment = segment

    def __iter__(self) -> Iterator[_Segment]:  # what the model's forward loop sees
        blocks = list(self.children())
        return iter([_Segment(blocks[i:i + self.segment])
                     for i in range(0, len(blocks), self.segment)])

    def __getitem__(self, idx):  # a slice is a plain list of blocks (no segments)
        if isinstance(idx, slice):
            return nn.ModuleList(list(self.children())[idx])
        return super().__getitem__(idx)

    __repr__ = nn.Module.__repr__  # ModuleList's repr iterates (here: segments)

    def extra_repr(self) -> str:
        return f"segment={self.segment}"


def _blocks(model: object) -> nn.ModuleList:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"model.blocks must be an nn.ModuleList of blocks called as "
                        f"block(x, cos, sin), got {type(blocks).__name__}")
    return blocks


def checkpoint_blocks(model: nn.Module, segment: int) -> nn.Module:
    """Checkpoint `model.blocks` in segments of `segment` blocks; in place, returns `model`.

    Applied again, it replaces the previous segmentation. `uncheckpoint_blocks` undoes it. A
    forward run before undoing still recomputes in its backward: each segment holds its blocks.
    """
    blocks = _blocks(model)
    checks.positive_int(segment, "segment")
    model.blocks = CheckpointedBlocks(blocks, segment)
    return model


def uncheckpoint_blocks(model: nn.Module) -> nn.Module:
    """Undo `checkpoint_blocks`: a plain `nn.ModuleList` of the same blocks; returns `model`."""
    blocks = _blocks(model)
    if isinstance(blocks, CheckpointedBlocks):
        model.blocks = nn.ModuleList(blocks.children())
    return model
