"""FlashAttention-2 in Triton: exact attention without the n_q x n_k matrices in main memory.

O = softmax(S) V with S = Q K^T / sqrt(d), L = logsumexp(S) per query (natural log, fp32).
Forward (`_flash_fwd_kernel`, grid: query tiles x batch * heads): a program loads its BLOCK_M
query rows once and streams K and V in tiles of BLOCK_N keys. Per tile: S = Q K^T (fp32), then the
online softmax: m_new = max(m, rowmax S), P = exp(S - m_new), l = l e^(m - m_new) + rowsum P,
acc = acc e^(m - m_new) + P V. At the end O = acc / l and L = m + log l. Causal (bottom-right,
`mlsys.ops.attention`): key tiles past the tile's last row are never loaded (the loop bound),
tiles crossing the diagonal are masked; ragged sequence ends are masked the same way.
Backward, from q, k, v, O, L and dO, with P = exp(S - L) recomputed per tile:
    `_flash_bwd_preprocess_kernel`  D = rowsum(dO * O) (= rowsum(P * dP)), one fp32 per query;
    `_flash_bwd_dkdv_kernel`        one program per key tile: dV += P^T dO, dP = dO V^T,
                                    dS = P (dP - D), dK += dS^T Q, over the query tiles that see it;
    `_flash_bwd_dq_kernel`          one program per query tile: dQ += dS K over its key tiles.
dQ sums over key tiles, which the dK/dV programs own. Two ways: (1) atomics: each dK/dV program
adds its dS K into an fp32 dQ buffer (FlashAttention-2's CUDA code): 5 matmuls per tile pair, but
atomic traffic, an fp32 buffer to zero and convert, and a summation order that changes from run
to run; (2) a second kernel that recomputes S and dP per tile (done here): 7 matmuls instead of 5
(`accounting.attention.BACKWARD_MATMULS`), no atomics, deterministic gradients bit for bit, and
each kernel one plain loop to read. Chosen for the determinism and the reading.

Costs for n = n_q = n_k, d, b bytes: naive (`accounting.attention_traffic.naive_attention_ops`)
moves ~6 n^2 elements per head (8 causal: S and P written and read by each eager op); this kernel
reads Q once, K and V once per query tile and writes O and L: 2 n d + 2 n d ceil(n / BLOCK_M)
elements + 4n bytes (`flash_forward_traffic`). FLOPs 4 n^2 d (half when causal); backward 3.5x
(`flash_attention_flops`, `flash_attention_backward_flops`).

Tiles are autotuned on a GPU, or fixed under the interpreter (`mlsys.kernels.flash_tiles`: the
space, and what the compile report removed from it). Head dims 16, 32, 64, 128
(tl.arange needs a power of two, tl.dot K >= 16, 128 bounds the registers per program); others
are refused (use `FlashAttentionTorch`).
Dtypes fp16, bf16, fp32 (fp32 statistics and accumulators always); under the CPU interpreter
fp16 and fp32 only (its bf16 arithmetic is wrong: `check_input` refuses it). fp32 inputs use
`tl.dot(..., input_precision="ieee")`: on NVIDIA GPUs Triton's default is TF32 (10-bit mantissa,
~1e-3 relative error), which fp32 tolerances would not pass; for speed, use bf16/fp16 inputs.
References: Dao et al., "FlashAttention" (2022), arXiv:2205.14135; Dao, "FlashAttention-2"
(2023), arXiv:2307.08691; Triton tutorial 06 (fused attention). Used in: chapter 06, and as the
model's "flash_triton" backend (`mlsys.models.attention`).

One module, longer than most: the forward and the three backward kernels share their argument
layout, masks and tiles, and the host code that checks, launches and differentiates them (with
`aot_args`, which hands the compiler exactly the launchers' arguments) is read beside them.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic
from mlsys.kernels._triton import check_input, require_triton, tl, triton
from mlsys.kernels.flash_tiles import tiled
from mlsys.ops.attention import attention, check_backward, check_qkv

HEAD_DIMS = (16, 32, 64, 128)
"""Head dims the kernels take."""
FP32_DOT_PRECISION = "ieee"
"""tl.dot on fp32 tiles in full fp32 ("tf32" would be faster on a GPU, ~1e-3 relative error)."""


def flash_attention_ref(
    q: Float[Tensor, "*batch n_q d"], k: Float[Tensor, "*batch n_k d"],
    v: Float[Tensor, "*batch n_k d"], is_causal: bool = False,
) -> tuple[Float[Tensor, "*batch n_q d"], Float[Tensor, "*batch n_q"]]:
    """(O, L) from `mlsys.ops.attention.attention` (float64 inputs: the test oracle)."""
    return attention(q, k, v, is_causal=is_causal, return_lse=True)


# --- cost models (defined in mlsys.accounting.attention) ------------------------------------------


def flash_attention_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                          is_causal: bool = False, convention: str = "exact") -> int:
    """Forward matmul FLOPs, 4 d per attended pair: `attention.attention_forward_flops`."""
    return attention_cost.attention_forward_flops(batch, heads, n_q, n_k, d_head,
                                                  causal=is_causal, convention=convention)


def flash_attention_backward_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                                   is_causal: bool = False, convention: str = "exact") -> int:
    """Backward matmul FLOPs with the separate dQ kernel: 3.5x the forward's."""
    return attention_cost.attention_backward_flops(batch, heads, n_q, n_k, d_head,
                                                   causal=is_causal, convention=convention,
                                                   strategy="separate_dq")


def flash_attention_bytes(batch: int, heads: int, n_q: int, n_k: int, d_head: int, dtype: object,
                          *, block_m: int, block_n: int, is_causal: bool = False) -> int:
    """Forward traffic for tiles (block_m, block_n): `attention_traffic.flash_forward_traffic`."""
    return attention_traffic.flash_forward_traffic(batch, heads, n_q, n_k, d_head, dtype,
                                                   block_q=block_m, block_k=block_n,
                                                   causal=is_causal).total_bytes


def flash_attention_backward_bytes(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                                   dtype: object, *, block_m: int, block_n: int,
                                   is_causal: bool = False) -> int:
    """Backward traffic of the three kernels: `attention_traffic.flash_backward_traffic`."""
    return attention_traffic.flash_backward_traffic(batch, heads, n_q, n_k, d_head, dtype,
                                                    block_q=block_m, block_k=block_n,
                                                    causal=is_causal,
                                                    strategy="separate_dq").total_bytes


# --- the kernels ----------------------------------------------------------------------------------


@tiled("fwd")
@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                      stride_qb, stride_qh, stride_qm, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_ob, stride_oh, stride_om, stride_od,
                      n_heads, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program per (query tile, batch * head): move the pointers to this batch and head
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    q_ptr += b * stride_qb + h * stride_qh
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_vb + h * stride_vh
    o_ptr += b * stride_ob + h * stride_oh
    lse_ptr += bh.to(tl.int64) * n_q
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_q
    # load the query tile once; rows past n_q read 0 and are never stored
    q = tl.load(q_ptr + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of each row's scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of exp(s - m_i) v
    offset = n_k - n_q  # causal: query i sees keys j <= i + offset
    hi = n_k
    if IS_CAUSAL:  # key tiles past the last row's diagonal are skipped: never loaded
        hi = tl.minimum(n_k, start_m + BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_k
        # load K^T (HEAD_DIM, BLOCK_N) and V (BLOCK_N, HEAD_DIM) of this key tile
        kt = tl.load(k_ptr + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                     mask=col_ok[None, :], other=0.0)
        v = tl.load(v_ptr + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_ok[:, None], other=0.0)
        # scores in fp32; keys past n_k, and (causal) in a row's future, get -inf
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
        keep = col_ok[None, :]
        if IS_CAUSAL:  # changes only the tile crossing the diagonal (and the ragged last one)
            keep = keep & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(keep, s, float("-inf"))
        # online softmax: raise the max, rescale the old sum and output by exp(m_old - m_new)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    # normalize; store O in the output's dtype and L = m + log l (-inf: the row attended nothing)
    attended = l_i > 0
    l_safe = tl.where(attended, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + rows[:, None] * stride_om + dims[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + rows, tl.where(attended, m_i + tl.log(l_safe), float("-inf")), mask=row_ok)


@triton.jit
def _flash_bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr,
                                 stride_ob, stride_oh, stride_om, stride_od,
                                 stride_dob, stride_doh, stride_dom, stride_dod,
                                 n_heads, n_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # D = rowsum(dO * O), one fp32 per query row: the backward's only use of O
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_q
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_om
                + dims[None, :] * stride_od, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows[:, None] * stride_dom
                 + dims[None, :] * stride_dod, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh.to(tl.int64) * n_q + rows, tl.sum(o * do, axis=1), mask=row_ok)


@tiled("dkdv")
@triton.jit
def _flash_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                           stride_qb, stride_qh, stride_qm, stride_qd,
                           stride_kb, stride_kh, stride_kn, stride_kd,
                           stride_vb, stride_vh, stride_vn, stride_vd,
                           stride_dob, stride_doh, stride_dom, stride_dod,
                           stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                           n_heads, n_q, n_k, scale, HEAD_DIM: tl.constexpr,
                           IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program per (key tile, batch * head); dk and dv (same strides) accumulate on chip
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    q_ptr += b * stride_qb + h * stride_qh
    do_ptr += b * stride_dob + h * stride_doh
    lse_ptr += bh.to(tl.int64) * n_q
    delta_ptr += bh.to(tl.int64) * n_q
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    col_ok = cols < n_k
    # load this key tile's K and V once
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn
                + dims[None, :] * stride_kd, mask=col_ok[:, None], other=0.0)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn
                + dims[None, :] * stride_vd, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offset = n_k - n_q
    lo = 0
    if IS_CAUSAL:  # query tiles whose last row precedes this tile's first key see none of it
        lo = tl.maximum(0, start_n - offset) // BLOCK_M * BLOCK_M
    for start_m in range(lo, n_q, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < n_q
        q = tl.load(q_ptr + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                    mask=row_ok[:, None], other=0.0)
        do = tl.load(do_ptr + rows[:, None] * stride_dom + dims[None, :] * stride_dod,
                     mask=row_ok[:, None], other=0.0)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        delta = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)
        # P^T (BLOCK_N, BLOCK_M) recomputed from L; 0 where masked (and for rows with L = -inf)
        st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * scale
        keep = col_ok[:, None] & row_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[:, None] <= rows[None, :] + offset)
        pt = tl.where(keep, tl.exp(st - lse[None, :]), 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=DOT_PRECISION)
        # dS^T = P^T (dP^T - D), dP^T = V dO^T
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q, input_precision=DOT_PRECISION)
    out = b * stride_dkb + h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :] * stride_dkd
    tl.store(dk_ptr + out, (dk * scale).to(dk_ptr.dtype.element_ty), mask=col_ok[:, None])
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=col_ok[:, None])


@tiled("dq")
@triton.jit
def _flash_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                         stride_qb, stride_qh, stride_qm, stride_qd,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         stride_dob, stride_doh, stride_dom, stride_dod,
                         stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                         n_heads, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    # one program per (query tile, batch * head): the forward's loop, recomputing S and dP
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_vb + h * stride_vh
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_q
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qm
                + dims[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows[:, None] * stride_dom
                 + dims[None, :] * stride_dod, mask=row_ok[:, None], other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * n_q + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * n_q + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = n_k - n_q
    hi = n_k
    if IS_CAUSAL:
        hi = tl.minimum(n_k, start_m + BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_k
        k = tl.load(k_ptr + cols[:, None] * stride_kn + dims[None, :] * stride_kd,
                    mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptr + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        keep = row_ok[:, None] & col_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + offset)
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqm
             + dims[None, :] * stride_dqd, (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None])


# --- host side: checks, launches, autograd ------------------------------------------------------


def _check(q: object, k: object, v: object, is_causal: object) -> None:
    """Everything a launch needs, checked before it: Triton present, shapes (`check_qkv`), dtype
    and device (`check_input`; any strides), and a head dim the kernels take."""
    require_triton("flash_attention")
    check_qkv(q, k, v, is_causal)
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_input(x, name, contiguous=False)
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        raise ValueError(f"q has head dim d = {d}; the Triton kernels take d in "
                         f"{', '.join(map(str, HEAD_DIMS))} (a power of two for tl.arange, at "
                         "least 16 for tl.dot); use FlashAttentionTorch (attention='flash_torch')")


def _check_tiles(tiles: object) -> tuple[int, int] | None:
    if tiles is None:
        return None
    ok = isinstance(tiles, tuple) and len(tiles) == 2 and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 16 and t & (t - 1) == 0
        for t in tiles)
    if not ok:
        raise ValueError(f"tiles must be None or (BLOCK_M, BLOCK_N), powers of two >= 16, "
                         f"got {tiles!r}")
    return tiles


def _4d(x: Tensor) -> Tensor:
    return x if x.ndim == 4 else x.unsqueeze(1)  # (batch, seq, d): one head, a view


def _forward_args(q4: Tensor, k4: Tensor, v4: Tensor, out: Tensor, lse: Tensor,
                  is_causal: bool) -> tuple[tuple, dict]:
    """(arguments, constexprs) of the forward kernel on 4-d (batch, heads, seq, d) tensors."""
    heads, n_q, d = q4.shape[1:]
    args = (q4, k4, v4, out, lse, *q4.stride(), *k4.stride(), *v4.stride(), *out.stride(), heads,
            n_q, k4.shape[2], 1.0 / math.sqrt(d))
    return args, dict(HEAD_DIM=d, IS_CAUSAL=is_causal, DOT_PRECISION=FP32_DOT_PRECISION)


PREPROCESS_BLOCK_M = 64
"""Query rows per program of `_flash_bwd_preprocess_kernel`."""
PREPROCESS_WARPS = 8
"""Its warps: with 4, fp32 O and dO tiles at head dim 128 (128 values a thread each) spill on
sm_80 (compile report)."""


def _preprocess_args(o4: Tensor, do4: Tensor, delta: Tensor) -> tuple[tuple, dict]:
    heads, n_q, d = o4.shape[1:]
    return ((o4, do4, delta, *o4.stride(), *do4.stride(), heads, n_q),
            dict(HEAD_DIM=d, BLOCK_M=PREPROCESS_BLOCK_M))


def _backward_args(q4: Tensor, k4: Tensor, v4: Tensor, do4: Tensor, lse: Tensor, delta: Tensor,
                   grads: tuple[Tensor, ...], is_causal: bool) -> tuple[tuple, dict]:
    """(arguments, constexprs) of the dK/dV kernel (`grads` = (dk, dv)) or the dQ kernel
    (`grads` = (dq,)); dk and dv share strides."""
    heads, n_q, d = q4.shape[1:]
    args = (q4, k4, v4, do4, lse, delta, *grads, *q4.stride(), *k4.stride(), *v4.stride(),
            *do4.stride(), *grads[0].stride(), heads, n_q, k4.shape[2], 1.0 / math.sqrt(d))
    return args, dict(HEAD_DIM=d, IS_CAUSAL=is_causal, DOT_PRECISION=FP32_DOT_PRECISION)


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                   tiles: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward on checked inputs: O (q's shape, dtype) and L (fp32, q's shape[:-1])."""
    q4, k4, v4 = _4d(q), _4d(k), _4d(v)
    batch, heads, n_q, _ = q4.shape
    out = torch.empty(q4.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads)
    args, constexprs = _forward_args(q4, k4, v4, out, lse, is_causal)
    _flash_fwd_kernel.launch(grid, tiles, *args, **constexprs)
    return out.view(q.shape), lse.view(q.shape[:-1])


def _flash_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor,
                    is_causal: bool, tiles: tuple[int, int] | None = None):
    """Launch the three backward kernels: (dQ, dK, dV) in the inputs' shapes and dtype. O, L
    and dO are checked first (`check_backward`): a wrong shape would be read out of bounds."""
    check_backward(q, k, v, out, lse, grad_out)
    q4, k4, v4, o4, do4 = (_4d(t) for t in (q, k, v, out, grad_out))
    batch, heads, n_q, _ = q4.shape
    n_k = k4.shape[2]
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    args, constexprs = _preprocess_args(o4, do4, delta)
    _flash_bwd_preprocess_kernel[(triton.cdiv(n_q, PREPROCESS_BLOCK_M), batch * heads)](
        *args, **constexprs, num_warps=PREPROCESS_WARPS)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q4, k4, v4))
    args, constexprs = _backward_args(q4, k4, v4, do4, lse, delta, (dk, dv), is_causal)
    _flash_bwd_dkdv_kernel.launch(
        lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), batch * heads), tiles, *args,
        **constexprs)
    args, constexprs = _backward_args(q4, k4, v4, do4, lse, delta, (dq,), is_causal)
    _flash_bwd_dq_kernel.launch(
        lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads), tiles, *args,
        **constexprs)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


AOT_KERNELS = {"fwd": "_flash_fwd_kernel", "preprocess": "_flash_bwd_preprocess_kernel",
               "dkdv": "_flash_bwd_dkdv_kernel", "dq": "_flash_bwd_dq_kernel"}
"""The kernels compiled ahead of time (`mlsys.kernels.aot`), by name: the module's attribute."""


def aot_args(kernel: str, dtype: torch.dtype, *, batch: int, heads: int, seq: int,
             head_dim: int, causal: bool) -> tuple[tuple, dict]:
    """(arguments, constexprs) of `kernel` (a key of AOT_KERNELS) for (batch, heads, seq,
    head_dim) inputs of `dtype`, as the launchers pass them, on stand-in CPU tensors (only their
    dtype, strides and alignment are read)."""
    q4 = torch.empty(batch, heads, seq, head_dim, dtype=dtype)
    k4, v4, o4, do4 = (torch.empty_like(q4) for _ in range(4))
    stats = torch.empty(batch, heads, seq, dtype=torch.float32)  # L, and D = rowsum(dO * O)
    if kernel == "fwd":
        return _forward_args(q4, k4, v4, o4, stats, causal)
    if kernel == "preprocess":
        return _preprocess_args(o4, do4, stats)
    grads = (torch.empty_like(q4), torch.empty_like(q4)) if kernel == "dkdv" else (o4,)
    return _backward_args(q4, k4, v4, do4, stats, stats, grads, causal)


class FlashAttentionTriton(torch.autograd.Function):
    """`FlashAttentionTriton.apply(q, k, v, is_causal[, tiles])`: O, saving exactly q, k, v, O
    and L. q, k, v: (batch, [heads,] seq, d), any strides; tiles: (BLOCK_M, BLOCK_N) or None."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                tiles: tuple[int, int] | None = None) -> Tensor:
        _check(q, k, v, is_causal)
        tiles = _check_tiles(tiles)
        out, lse = _flash_forward(q, k, v, is_causal, tiles)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (is_causal, tiles)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, tiles = ctx.config
        # upstream gradients may be broadcast views or another dtype: any strides work, not dtypes
        grads = _flash_backward(q, k, v, out, lse, grad_out.to(q.dtype), is_causal, tiles)
        return *grads, None, None


def flash_attention(
    q: Float[Tensor, "batch *heads n_q d"], k: Float[Tensor, "batch *heads n_k d"],
    v: Float[Tensor, "batch *heads n_k d"], is_causal: bool = False,
) -> Float[Tensor, "batch *heads n_q d"]:
    """FlashAttention-2 with the Triton kernels (forward and backward), tiles autotuned.

    q (batch, [heads,] n_q, d), k and v (batch, [heads,] n_k, d): fp16/bf16/fp32 on a CUDA GPU
    (fp16/fp32 on the CPU under the interpreter), d in HEAD_DIMS, any strides. O in q's dtype.
    Costs: `flash_attention_flops`, `flash_attention_bytes`.
    """
    return FlashAttentionTriton.apply(q, k, v, is_causal)
