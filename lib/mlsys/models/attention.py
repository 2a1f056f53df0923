"""Attention: the reference, the naive and fused backends, and FlashAttention-2 tiled in PyTorch.

softmax(q k^T * scale + mask) v, scale = 1/sqrt(d) by default. Conventions, shared by every
implementation in the book (this module and `mlsys.kernels.flash_attention`):
- causal is bottom-right aligned: query i attends key j when j <= i + (n_k - n_q), as in
  FlashAttention-2 (>= 2.1): the last query sees every key, as when decoding with a KV cache.
  At n_q = n_k it is the usual j <= i. PyTorch's `scaled_dot_product_attention(is_causal=True)`
  aligns top-left (j <= i) and differs when n_q != n_k; its `causal_lower_right` bias matches ours.
- a query that may attend no key (a mask row of False; causal with n_q > n_k, the first
  n_q - n_k queries) gets O = 0 and L = -inf, and passes no gradient.
- L is the natural log-sum-exp of the scaled, masked scores of each query, in fp32 (fp64 for
  fp64 inputs): what a fused kernel keeps for its backward instead of the n_q x n_k matrix P.

The model's backends, chosen by name in `mlsys.models.config.ATTENTION_BACKENDS` and resolved by
`backend(name)`, are causal and take q, k, v of shape (batch, heads, seq, d_head): "naive" writes
the seq x seq scores and probabilities out; "sdpa" is PyTorch's fused kernel; "flash_torch" is
`FlashAttentionTorch` below; "flash_triton" the Triton kernels of `mlsys.kernels.flash_attention`.

`flash_attention_torch` is FlashAttention-2's forward (Dao 2023, Algorithm 1) written with PyTorch
ops on tiles, to be read: one query tile at a time, an online softmax over the key tiles (running
max m, running sum l, earlier sums rescaled when the max grows; Milakov & Gimelshein 2018).
`flash_attention_torch_backward` is Algorithm 2: P recomputed per tile from L, D = rowsum(dO * O),
dK and dV accumulated per key tile, dQ per query tile. Loops run in Python, so it is slow; the
point is the schedule, which the Triton kernels run in parallel. Costs:
`mlsys.accounting.attention`. Used in: `mlsys.models.transformer`; §sec-bytes; chapter 06.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

from mlsys.models.config import ATTENTION_BACKENDS

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]
BLOCK_Q = 64
"""Default query rows per tile of `flash_attention_torch` (a GPU kernel would take 64 to 128)."""
BLOCK_K = 64
"""Default key rows per tile."""


def naive_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
    *,
    is_causal: bool = False,
) -> Float[Tensor, "batch heads seq d_head"]:
    """softmax(q k^T / sqrt(d_head) [+ causal mask]) v as eager ops, the (seq x seq) scores and
    probabilities materialized: the version whose bytes `accounting.attention.naive_attention_ops`
    counts and whose backward keeps P (`attention_saved_tensors(..., backend="naive")`)."""
    seq, d_head = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (batch, heads, seq, seq)
    if _check_bool(is_causal, "is_causal"):
        future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))  # query i may not look at keys j > i
    return scores.softmax(dim=-1) @ v


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


def backend(name: str) -> AttentionFn:
    """The attention function registered as `name` in `ATTENTION_BACKENDS`; ValueError for
    others."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={name!r} is not a known backend; "
                         f"known: {', '.join(ATTENTION_BACKENDS)}")
    module, function = ATTENTION_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)


# --- the reference --------------------------------------------------------------------------------


def causal_mask(
    n_q: int, n_k: int, device: torch.device | str | None = None
) -> Bool[Tensor, "n_q n_k"]:
    """True where query i may attend key j: j <= i + (n_k - n_q) (bottom-right alignment)."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


def _future(rows: range, cols: range, offset: int, device: torch.device) -> Tensor:
    """The causal mask of one tile, True where key j is in query i's future: j > i + offset."""
    i = torch.arange(rows.start, rows.stop, device=device)
    j = torch.arange(cols.start, cols.stop, device=device)
    return j[None, :] > i[:, None] + offset


def _wide(dtype: torch.dtype) -> torch.dtype:
    """Where scores, the softmax and L are computed: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _scale(scale: float | None, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive number or None (1/sqrt(d)), got {scale!r}")
    return float(scale)


def _check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _tensor(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., seq, d), got {tuple(x.shape)}")
    return x


def _check_shapes(q: object, k: object, v: object) -> None:
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _tensor(x, name)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q and k "
                         "need the same last dim d, k and v the same number of keys")


def attention(
    q: Float[Tensor, "*batch n_q d"],
    k: Float[Tensor, "*batch n_k d"],
    v: Float[Tensor, "*batch n_k d_v"],
    mask: Bool[Tensor, "..."] | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
) -> Float[Tensor, "*batch n_q d_v"] | tuple[Tensor, Tensor]:
    """The reference: softmax(q k^T * scale, masked) v, written out, for any leading dims.

    mask: bool, broadcastable to (..., n_q, n_k), True = may attend; with `is_causal` both apply.
    Computed in fp32 (fp64 for fp64 inputs: the test oracle); O in q's dtype. With `return_lse`
    also L (..., n_q), the natural log-sum-exp of each row's scores. Rows that attend nothing:
    O = 0, L = -inf (the module docstring).
    """
    _check_shapes(q, k, v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = _scale(scale, q.shape[-1])
    wide = _wide(q.dtype)
    scores = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * scale  # (..., n_q, n_k)
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if _check_bool(is_causal, "is_causal"):
        allowed = causal_mask(n_q, n_k, q.device)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), got "
                            f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
        try:
            torch.broadcast_shapes(mask.shape, scores.shape)
        except RuntimeError:
            raise ValueError(f"mask {tuple(mask.shape)} does not broadcast to the scores "
                             f"{tuple(scores.shape)}") from None
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.detach().amax(dim=-1, keepdim=True)  # softmax is shift-invariant: no grad
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)  # rows that attend nothing
    weights = torch.exp(scores - row_max)  # unnormalized P; 0 where masked
    total = weights.sum(dim=-1, keepdim=True)  # l: 0 for rows that attend nothing
    out = (weights @ v.to(wide)) / torch.where(total > 0, total, 1.0)
    if not _check_bool(return_lse, "return_lse"):
        return out.to(q.dtype)
    return out.to(q.dtype), (row_max + torch.log(total)).squeeze(-1)  # log(0) = -inf


# --- FlashAttention-2 in PyTorch, one tile at a time ----------------------------------------------


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
    _check_shapes(q, k, v)
    is_causal = _check_bool(is_causal, "is_causal")
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale, offset, wide = _scale(scale, q.shape[-1]), n_k - n_q, _wide(q.dtype)
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
                s = s.masked_fill(_future(range(i0, i1), range(j0, j1), offset, q.device),
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
    """
    n_q, n_k, dtype = q.shape[-2], k.shape[-2], q.dtype
    scale, offset, wide = _scale(scale, q.shape[-1]), n_k - n_q, _wide(dtype)
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
                p = p.masked_fill(_future(range(i0, i1), range(j0, j1), offset, q.device), 0.0)
            do_i = do[..., i0:i1, :]
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_i
            ds = p * (do_i @ v_j.transpose(-2, -1) - delta[..., i0:i1, None])  # dS = P (dP - D)
            dq[..., i0:i1, :] += scale * ds @ k_j  # across key tiles: atomics on a GPU
            dk[..., j0:j1, :] += scale * ds.transpose(-2, -1) @ q[..., i0:i1, :]
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


def check_qkv(q: object, k: object, v: object, is_causal: object) -> None:
    """The inputs of the flash Functions: q (batch, [heads,] n_q, d), k and v (batch, [heads,]
    n_k, d), one float dtype and device; is_causal a bool. TypeError/ValueError naming the rule."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _tensor(x, name)
        if x.ndim not in (3, 4):
            raise ValueError(f"{name} must have shape (batch, seq, d) or (batch, heads, seq, d), "
                             f"got {tuple(x.shape)}")
        if x.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"{name} is {x.dtype} on {x.device} but q is {q.dtype} on "
                             f"{q.device}; they must match")
    if not (q.ndim == k.ndim == v.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1] == v.shape[-1]):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share "
                         "batch (and heads) and d; k and v the number of keys")
    _check_bool(is_causal, "is_causal")


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


def flash_torch_causal_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """The "flash_torch" backend: causal `FlashAttentionTorch` with the default tiles."""
    return FlashAttentionTorch.apply(q, k, v, True)


# --- checking an implementation against the reference ---------------------------------------------


def max_error(fn, shapes: tuple[tuple[int, int, int], ...], *, dtype: torch.dtype,
              causal: bool, generator: torch.Generator, batch: int = 2, heads: int = 3,
              device: str = "cpu") -> float:
    """The largest |error| of fn(q, k, v, causal)'s O, dq, dk and dv against `attention` in
    float64, over random inputs of each (n_q, n_k, d) in `shapes` (§sec-attention; the tests
    check every kernel the same way, per dtype)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(q, k, v, is_causal), got {type(fn).__name__}")
    _check_bool(causal, "causal")
    worst = 0.0
    for n_q, n_k, d in shapes:
        q, k, v = (torch.randn(batch, heads, n, d, generator=generator, dtype=torch.float64)
                   for n in (n_q, n_k, n_k))
        grad = torch.randn(batch, heads, n_q, d, generator=generator, dtype=torch.float64)
        mine = [t.to(device, dtype, copy=True).requires_grad_() for t in (q, k, v)]
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*mine, causal)
        out.backward(grad.to(device, dtype))
        expected = attention(*ref, is_causal=causal)
        expected.backward(grad)
        pairs = zip([out, *(t.grad for t in mine)], [expected, *(t.grad for t in ref)],
                    strict=True)
        worst = max(worst, *((a.double().cpu() - b).abs().max().item() for a, b in pairs))
    return worst
