"""Causal self-attention implementations, chosen by name from the one registry.

`mlsys.models.config.ATTENTION_BACKENDS` maps each backend's name to its function; `backend(name)`
resolves it. Every backend takes q, k, v of shape (batch, heads, seq, d_head), already rotated by
RoPE, and returns softmax(q k^T / sqrt(d_head) + causal mask) v in the same shape:

- "naive": the (seq x seq) scores and probabilities are written out, as the formula reads;
- "sdpa": PyTorch's fused `scaled_dot_product_attention` (flash / memory-efficient / math kernels,
  PyTorch's choice by device, dtype and shape).

Used in: `mlsys.models.transformer`; §sec-bytes (the S^2 terms), the attention chapter.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from mlsys.models.config import ATTENTION_BACKENDS

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def naive_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """softmax(q k^T / sqrt(d_head) + causal mask) v, with the (seq x seq) score matrix
    materialized."""
    seq, d_head = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (batch, heads, seq, seq)
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))  # query i may not look at keys j > i
    return scores.softmax(dim=-1) @ v


def sdpa_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The same function through PyTorch's fused kernel (flash / memory-efficient / math, its
    choice)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def backend(name: str) -> AttentionFn:
    """The attention function registered as `name` in `ATTENTION_BACKENDS`; ValueError for
    others."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={name!r} is not a known backend; "
                         f"known: {', '.join(ATTENTION_BACKENDS)}")
    module, function = ATTENTION_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)
