"""Operators written in plain PyTorch: the references the kernels are tested against, and
FlashAttention-2's schedule tiled in PyTorch.

- `attention`: the reference attention (any mask, causal bottom-right, the log-sum-exp), the
  naive eager version whose bytes chapter 06 counts, the causal mask, the input checks, and
  `max_error`, which checks any implementation against the reference.
- `flash_attention`: FlashAttention-2's forward and backward tiled in PyTorch, and the autograd
  Function that runs them (`FlashAttentionTorch`).

They sit on the kernels' floor, so `mlsys.kernels` tests against them and `mlsys.models` chooses
among them and the kernels by name (`mlsys.models.attention`). This package imports nothing.
"""
