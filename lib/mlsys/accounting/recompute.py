"""The FLOPs activation checkpointing reruns in the backward, and their share of the step.

Checkpointing the blocks in segments of k (`mlsys.models.checkpointing.checkpoint_blocks`; what
the segments keep and hold is `accounting.activations`) reruns each segment's forward once in the
backward, less the segment's last w2: PyTorch stops once every saved tensor is back
(`early_stop`, the default of non-reentrant checkpointing). The "+33% FLOPs" holds only for a full
recomputation of every forward matmul (4 forwards instead of 3;
`utilization.hardware_training_flops(recompute="full")`); checkpointing the blocks leaves the head
out, and early stop skips one w2 per segment: for 2.7B at S = 512, one block per segment reruns
25.0% of the step's matmul FLOPs (33.1% without early stop).

Pure: configs and ints in, numbers out. Used in: chapter 05, the memory one-pager.
"""

from __future__ import annotations

import math

from mlsys import checks
from mlsys.accounting.flops import transformer_flops


def recompute_flops(cfg, batch: int, seq: int, *, checkpoint_segment: int,
                    early_stop: bool = True) -> int:
    """Matmul FLOPs of the forward rerun in backward with `checkpoint_segment` blocks per segment.

    Every block is recomputed once; with `early_stop` (PyTorch's default for non-reentrant
    checkpointing) each segment stops when its last saved tensor (w2's input) is back, so its last
    w2 is not rerun. The head is not checkpointed. What `torch.utils.flop_counter` sees as
    forward FLOPs inside the backward.
    """
    k = checks.positive_int(checkpoint_segment, "checkpoint_segment")
    checks.choice(early_stop, "early_stop", (True, False))
    mf = transformer_flops(cfg, batch, seq)
    skipped = math.ceil(mf.n_layers / k) * mf.layer.ffn_w2 if early_stop else 0
    return mf.n_layers * mf.layer.matmul_flops - skipped


def recompute_overhead(cfg, batch: int, seq: int, *, checkpoint_segment: int,
                       early_stop: bool = True) -> float:
    """Recomputed FLOPs / the step's matmul FLOPs without checkpointing (3 forwards).

    1/3 (the "+33%") only if every forward matmul were rerun; below it here (the docstring).
    """
    step = transformer_flops(cfg, batch, seq).training_matmul_flops
    return recompute_flops(cfg, batch, seq, checkpoint_segment=checkpoint_segment,
                           early_stop=early_stop) / step
