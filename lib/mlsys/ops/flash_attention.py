"""FlashAttention-2 tiled in PyTorch, to be read: the schedule the Triton kernels run in parallel.

`flash_attention_torch` is FlashAttention-2's forward (Dao 2023, Algorithm 1) written with PyTorch
ops on tiles: one query tile at a time, an online softmax over the key tiles (running max m,
running sum l, earlier sums rescaled when the max grows; Milakov & Gimelshein 2018).
`flash_attention_torch_backward` is Algorithm 2: P recomputed per tile from L, D = rowsum(dO * O),
dK and dV accumulated per key tile, dQ per query tile. `FlashAttentionTorch` is the autograd
Function that runs both and saves exactly q, k, v, O and L. Loops run in Python, so it is slow;
the point is the schedule (`mlsys.kernels.flash_attention` runs it on a GPU). Conventions (causal
bottom-right, rows that attend nothing): `mlsys.ops.attention`. Costs:
`mlsys.accounting.attention`. Used in: `mlsys.models.attention` ("flash_torch"); chapter 06.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys.ops.attention import (
    check_backward,
    check_flag,
    check_qkv,
    check_shapes,
    compute_dtype,
    future_mask,
    resolve_scale,
)

BLOCK_Q = 64
"""Default query rows per tile of `flash_attention_torch` (a GPU kernel would take 64 to 128)."""
BLOCK_K = 64
"""Default key rows per tile."""


def _block(block: object, name: str) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{name} must be a positive integer, got {block!r}")
    return block


def flash_attention_torch(
    q: Float[Tensor, "*batch n_q d"],
    k: Float[Tensor, "*batch n_k d"],
    v: Float[Tensor, "*batch n_k d_v"],
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> tuple[Float[Tensor, "*batch n_q d_v"], Float[Tensor, "*batch n_q"]]:
    """FlashAttention-2 forward, tiled: (O, L) without ever holding more than one score tile.

    Equal to `attention(..., return_lse=True)` up to rounding (O in q's dtype, L in fp32; fp64
    for fp64 inputs). Tiles: `block_q` query rows x `block_k` key rows.
    """
    check_shapes(q, k, v)
    is_causal = check_flag(is_causal, "is_causal")
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale, offset, wide = resolve_scale(scale, q.shape[-1]), n_k - n_q, compute_dtype(q.dtype)
    block_q, block_k = _block(block_q, "block_q"), _block(block_k, "block_k")
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=wide, device=q.device)
    for i0 in range(0, n_q, block_q):  # each query tile is independent: a GPU runs them in parallel
        i1 = min(i0 + block_q, n_q)
        q_i = q[..., i0:i1, :].to(wide)  # "load" the query tile: it stays on chip for the loop
        m_i = torch.full(q_i.shape[:-1], float("-inf"), dtype=wide, device=q.device)  # row max
        l_i = torch.zeros_like(m_i)  # running sum of exp(s - m_i)
        acc = q_i.new_zeros((*q_i.shape[:-1], v.shape[-1]))  # running sum of exp(s - m_i) v
        # causal: the tile's last row sees keys up to i1 - 1 + offset; later key tiles are skipped
        hi = min(n_k, max(0, i1 + offset)) if is_causal else n_k
        for j0 in range(0, hi, block_k):
            j1 = min(j0 + block_k, n_k)
            k_j, v_j = k[..., j0:j1, :].to(wide), v[..., j0:j1, :].to(wide)
            s = (q_i @ k_j.transpose(-2, -1)) * scale  # (..., tile rows, tile keys), on chip only
            if is_causal and j1 - 1 > i0 + offset:  # a tile crossing the diagonal: mask its future
                s = s.masked_fill(future_mask(range(i0, i1), range(j0, j1), offset, q.device),
                                  float("-inf"))
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m_i - m_safe)  # rescales what was summed under the old max
            l_i = alpha * l_i + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v_j
            m_i = m_new
        out[..., i0:i1, :] = (acc / torch.where(l_i > 0, l_i, 1.0)[..., None]).to(q.dtype)
        lse[..., i0:i1] = m_i + torch.log(l_i)  # -inf + log(0) = -inf where nothing was attended
    return out, lse


def flash_attention_torch_backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
    is_causal: bool = False, scale: float | None = None, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2 backward from q, k, v, O, L and dO: (dQ, dK, dV), in q's dtype.

    With P = exp(S - L) recomputed per tile and D = rowsum(dO * O) (= rowsum(P * dP)):
    dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q.
    O and dO have O's shape, L q's shape without d (`check_backward`, before any work).
    """
    check_backward(q, k, v, out, lse, grad_out)
    is_causal = check_flag(is_causal, "is_causal")
    n_q, n_k, dtype = q.shape[-2], k.shape[-2], q.dtype
    scale, offset, wide = resolve_scale(scale, q.shape[-1]), n_k - n_q, compute_dtype(dtype)
    block_q, block_k = _block(block_q, "block_q"), _block(block_k, "block_k")
    q, k, v, do = (t.to(wide) for t in (q, k, v, grad_out))
    delta = (do * out.to(wide)).sum(dim=-1)  # D, one number per query row
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j0 in range(0, n_k, block_k):  # outer loop over key tiles: dK_j, dV_j stay on chip
        j1 = min(j0 + block_k, n_k)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
        # causal: query tiles whose last row is before this tile's first key see none of it
        first = max(0, j0 - offset) // block_q * block_q if is_causal else 0
        for i0 in range(first, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            s = (q[..., i0:i1, :] @ k_j.transpose(-2, -1)) * scale
            p = torch.exp(s - lse[..., i0:i1, None])  # P, recomputed from L: no max, no sum
            if is_causal and j1 - 1 > i0 + offset:
                p = p.masked_fill(future_mask(range(i0, i1), range(j0, j1), offset, q.device),
                                  0.0)
            do_i = do[..., i0:i1, :]
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_i
            ds = p * (do_i @ v_j.transpose(-2, -1) - delta[..., i0:i1, None])  # dS = P (dP - D)
            dq[..., i0:i1, :] += scale * ds @ k_j  # across key tiles: atomics on a GPU
            dk[..., j0:j1, :] += scale * ds.transpose(-2, -1) @ q[..., i0:i1, :]
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


class FlashAttentionTorch(torch.autograd.Function):
    """`FlashAttentionTorch.apply(q, k, v, is_causal)`: O, saving exactly q, k, v, O and L."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Tensor:
        check_qkv(q, k, v, is_causal)
        out, lse = flash_attention_torch(q, k, v, is_causal=is_causal, block_q=block_q,
                                         block_k=block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (is_causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, block_q, block_k = ctx.config
        grads = flash_attention_torch_backward(q, k, v, out, lse, grad_out.to(q.dtype),
                                               is_causal=is_causal, block_q=block_q,
                                               block_k=block_k)
        return *grads, None, None, None
