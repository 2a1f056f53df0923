"""Attention in plain PyTorch: the reference, the naive eager version, the causal mask, the checks.

softmax(q k^T * scale + mask) v, scale = 1/sqrt(d) by default. Conventions, shared by every
implementation in the book (this module, `mlsys.ops.flash_attention` and
`mlsys.kernels.flash_attention`):
- causal is bottom-right aligned: query i attends key j when j <= i + (n_k - n_q), as in
  FlashAttention-2 (>= 2.1): the last query sees every key, as when decoding with a KV cache.
  At n_q = n_k it is the usual j <= i. PyTorch's `scaled_dot_product_attention(is_causal=True)`
  aligns top-left (j <= i) and differs when n_q != n_k; its `causal_lower_right` bias matches ours.
- a query that may attend no key (a mask row of False; causal with n_q > n_k, the first
  n_q - n_k queries) gets O = 0 and L = -inf, and passes no gradient.
- L is the natural log-sum-exp of the scaled, masked scores of each query, in fp32 (fp64 for
  fp64 inputs): what a fused kernel keeps for its backward instead of the n_q x n_k matrix P.

`attention` is the reference every other implementation is checked against (`max_error`, in
float64); `naive_attention` is the eager version whose n x n scores and probabilities are written
out. Costs: `mlsys.accounting.attention`. Used in: `mlsys.models.attention`, the kernels' tests,
`mlsys.distributed.cp`; §sec-bytes; chapter 06.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mlsys import checks


def naive_attention(
    q: Float[Tensor, "batch heads seq d_head"],
    k: Float[Tensor, "batch heads seq d_head"],
    v: Float[Tensor, "batch heads seq d_head"],
    *,
    is_causal: bool = False,
) -> Float[Tensor, "batch heads seq d_head"]:
    """softmax(q k^T / sqrt(d_head) [+ causal mask]) v as eager ops, the (seq x seq) scores and
    probabilities materialized: the version whose bytes
    `accounting.attention_traffic.naive_attention_ops` counts and whose backward keeps P
    (`attention_saved_tensors(..., backend="naive")`). q, k, v: one float dtype and device.
    Causal is bottom-right, as everywhere here, for n_q <= n_k; n_q > n_k is refused (its first
    queries would attend no key, a softmax of -inf only: NaN; `attention` gives them O = 0)."""
    check_shapes(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype (the eager matmuls do not mix them), "
                        f"got {q.dtype}, {k.dtype}, {v.dtype}")
    n_q, n_k, d_head = q.shape[-2], k.shape[-2], q.shape[-1]
    if check_flag(is_causal, "is_causal") and n_q > n_k:
        raise ValueError(f"is_causal=True needs n_q <= n_k here, got n_q = {n_q}, n_k = {n_k} "
                         "(queries without a key); attention() gives those rows O = 0")
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (batch, heads, n_q, n_k)
    if is_causal:  # query i may not look at keys j > i + (n_k - n_q)
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(n_k - n_q + 1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v


# --- masks, dtypes and checks, shared with the tiled versions -------------------------------------


def causal_mask(
    n_q: int, n_k: int, device: torch.device | str | None = None
) -> Bool[Tensor, "n_q n_k"]:
    """True where query i may attend key j: j <= i + (n_k - n_q) (bottom-right alignment)."""
    checks.nonnegative_int(n_q, "n_q")
    checks.nonnegative_int(n_k, "n_k")
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


def future_mask(rows: range, cols: range, offset: int, device: torch.device) -> Tensor:
    """The causal mask of one tile (query rows x key cols), True where key j is in query i's
    future: j > i + offset, offset = n_k - n_q."""
    i = torch.arange(rows.start, rows.stop, device=device)
    j = torch.arange(cols.start, cols.stop, device=device)
    return j[None, :] > i[:, None] + offset


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where scores, the softmax and L are computed: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def resolve_scale(scale: float | None, d: int) -> float:
    """The scores' scale: 1/sqrt(d) for None, else `scale` (ValueError unless finite and
    positive: an infinite scale makes every score +-inf and the softmax NaN)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if (isinstance(scale, bool) or not isinstance(scale, (int, float))
            or not (math.isfinite(scale) and scale > 0)):
        raise ValueError(f"scale must be a finite positive number or None (1/sqrt(d)), "
                         f"got {scale!r}")
    return float(scale)


def check_flag(value: object, name: str) -> bool:
    """`value` must be True or False (TypeError otherwise); returns it."""
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


def check_shapes(q: object, k: object, v: object) -> None:
    """q, k, v floating-point tensors (..., seq, d) on one device; q and k share d, k and v the
    number of keys, and their leading (batch) dims broadcast together."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _tensor(x, name)
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}; they must match")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q and k "
                         "need the same last dim d, k and v the same number of keys")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: the batch "
                         "dims (all but the last two) must broadcast together") from None


def check_backward(q: object, k: object, v: object, out: object, lse: object,
                   grad_out: object) -> None:
    """The inputs of a flash backward: q, k, v as `check_shapes` wants them; O and dO of shape
    (*q.shape[:-1], d_v), L of shape q.shape[:-1] (one log-sum-exp per query), all
    floating-point on q's device. ValueError/TypeError naming the tensor and the shape it
    needs."""
    check_shapes(q, k, v)
    rows = tuple(q.shape[:-1])
    for x, name, shape, what in ((out, "out", (*rows, v.shape[-1]), "O's shape"),
                                 (grad_out, "grad_out", (*rows, v.shape[-1]), "O's shape"),
                                 (lse, "lse", rows, "one log-sum-exp per query")):
        if not isinstance(x, Tensor) or not torch.is_floating_point(x):
            what_got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a floating-point tensor, got {what_got}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} ({what}: q {tuple(q.shape)}, "
                             f"v {tuple(v.shape)}), got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}; they must match")


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
    check_flag(is_causal, "is_causal")


# --- the reference --------------------------------------------------------------------------------


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
    check_shapes(q, k, v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = resolve_scale(scale, q.shape[-1])
    wide = compute_dtype(q.dtype)
    scores = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * scale  # (..., n_q, n_k)
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if check_flag(is_causal, "is_causal"):
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
    if n_k:  # softmax is shift-invariant: the max needs no gradient
        row_max = scores.detach().amax(dim=-1, keepdim=True)
    else:  # no keys at all: every row attends nothing (amax of an empty row is an error)
        row_max = scores.new_full((*scores.shape[:-1], 1), float("-inf"))
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)  # rows that attend nothing
    weights = torch.exp(scores - row_max)  # unnormalized P; 0 where masked
    total = weights.sum(dim=-1, keepdim=True)  # l: 0 for rows that attend nothing
    out = (weights @ v.to(wide)) / torch.where(total > 0, total, 1.0)
    if not check_flag(return_lse, "return_lse"):
        return out.to(q.dtype)
    return out.to(q.dtype), (row_max + torch.log(total)).squeeze(-1)  # log(0) = -inf


# --- checking an implementation against the reference ---------------------------------------------


def max_error(fn, shapes: tuple[tuple[int, int, int], ...], *, dtype: torch.dtype,
              causal: bool, generator: torch.Generator, batch: int = 2, heads: int = 3,
              device: str = "cpu") -> float:
    """The largest |error| of fn(q, k, v, causal)'s O, dq, dk and dv against `attention` in
    float64, over random inputs of each (n_q, n_k, d) in `shapes` (§sec-attention; the tests
    check every kernel the same way, per dtype)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(q, k, v, is_causal), got {type(fn).__name__}")
    check_flag(causal, "causal")
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
