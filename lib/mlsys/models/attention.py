"""Attention as the model calls it: four causal backends, chosen by name.

The model's `attention` field (`mlsys.models.config.ATTENTION_BACKENDS`) names one of `BACKENDS`,
resolved by `backend(name)`. Each is causal and takes q, k, v of shape (batch, heads, seq, d_head):
"naive" writes the seq x seq scores and probabilities out (`mlsys.ops.attention.naive_attention`);
"sdpa" is PyTorch's fused kernel; "flash_torch" is FlashAttention-2 tiled in PyTorch
(`mlsys.ops.flash_attention.FlashAttentionTorch`); "flash_triton" the Triton kernels of
`mlsys.kernels.flash_attention` (a CUDA GPU, or the CPU under Triton's interpreter; elsewhere a
clear error naming what to use). A backend is chosen explicitly, never swapped quietly. The
reference they are checked against, and the conventions they share (causal bottom-right), are in
`mlsys.ops.attention`. Used in: `mlsys.models.transformer`; chapter 06.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from mlsys.ops.attention import naive_attention
from mlsys.ops.flash_attention import FlashAttentionTorch

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def naive_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The model's "naive" backend: `naive_attention(q, k, v, is_causal=True)`."""
    return naive_attention(q, k, v, is_causal=True)


def sdpa_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The same function through PyTorch's fused kernel (flash / memory-efficient / math, its
    choice)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash_torch_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The "flash_torch" backend: causal `FlashAttentionTorch` with the default tiles."""
    return FlashAttentionTorch.apply(q, k, v, True)


def flash_triton_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The "flash_triton" backend: causal `flash_attention`. Runs where Triton does (a CUDA GPU,
    or the CPU under the interpreter), else a clear error naming what to use."""
    # heavy and optional: the kernels import and set up Triton (`mlsys.kernels._triton`), which
    # a model that never runs this backend should not pay for
    from mlsys.kernels.flash_attention import flash_attention

    return flash_attention(q, k, v, True)


BACKENDS: dict[str, AttentionFn] = {
    "naive": naive_causal_attention,
    "sdpa": sdpa_causal_attention,
    "flash_torch": flash_torch_causal_attention,
    "flash_triton": flash_triton_causal_attention,
}
"""The attention function of each name in `ATTENTION_BACKENDS` (the names live in the torch-free
config, the functions here; tests/models/test_attention.py checks that they agree)."""


def backend(name: str) -> AttentionFn:
    """The attention function named `name` in `BACKENDS`; ValueError for others."""
    if name not in BACKENDS:
        raise ValueError(f"attention={name!r} is not a known backend; "
                         f"known: {', '.join(BACKENDS)}")
    return BACKENDS[name]
