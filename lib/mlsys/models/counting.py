"""Counting a model's FLOPs with PyTorch's own counter, on the meta device.

`count_model_flops` builds the book's transformer with no storage and runs it under
`torch.utils.flop_counter.FlopCounterMode`: the real counter that checks `mlsys.accounting.flops`
module by module (tests and §sec-flops).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys.checks import positive_ints
from mlsys.models.checkpointing import checkpoint_blocks
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer


def count_model_flops(cfg: TransformerConfig, batch: int, seq: int, *, backward: bool = False,
                      checkpoint_segment: int | None = None) -> FlopCounterMode:
    """Build `Transformer(cfg)` on the meta device and run it under `FlopCounterMode`.

    Meta tensors have shapes but no storage: even the largest preset costs no memory and no
    arithmetic runs, yet every operator dispatches, so the counter sees each matmul with its shapes
    and attributes it to the module that ran it. Returns the counter (`get_total_flops()`,
    `get_flop_counts()` keyed "Transformer.blocks.0.attn.q_proj", ...). With `backward`, the
    backward of `logits.sum()` is counted too; with `checkpoint_segment`, the blocks are
    checkpointed in segments of that many (`mlsys.models.checkpointing`), so the backward's
    count includes the forward it reruns.
    """
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
    positive_ints(batch=batch, seq=seq)
    with torch.device("meta"):
        model = Transformer(cfg)
        if checkpoint_segment is not None:
            checkpoint_blocks(model, checkpoint_segment)
        tokens = torch.zeros(batch, seq, dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            logits = model(tokens)
            if backward:
                logits.sum().backward()
    return counter
