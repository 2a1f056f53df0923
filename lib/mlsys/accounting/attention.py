"""Cost models of attention and FlashAttention-2: which pairs are computed, FLOPs, saved tensors.

Sizes: batch B, heads H, n_q queries, n_k keys, head dim d (d_head), b bytes per element. The
causal convention is the book's everywhere (`mlsys.ops.attention`): bottom-right, query i
attends key j when j <= i + (n_k - n_q), as FlashAttention-2 (>= 2.1) does; at n_q = n_k it is the
usual j <= i. With n_q > n_k the first n_q - n_k queries attend nothing.

FLOPs count the two forward matmuls only, 2 per multiply-add: S = Q K^T and O = P V cost 4 d per
(query, key) pair. The softmax's ~6 elementwise ops per score (`flops.scaled_dot_product_flops`)
are left out, as the FlashAttention papers and `torch.utils.flop_counter` leave them out. How a
causal mask is counted (`CAUSAL_CONVENTIONS`):
    "exact"  the pairs attended: N (N + 1) / 2 at n_q = n_k = N, the useful work;
    "half"   half of the dense count, N^2 / 2: the convention of the FlashAttention-2 paper's and
             the Triton tutorial's benchmarks (`total_flops *= 0.5`);
    "dense"  n_q n_k, mask ignored: what a naive kernel computes and the FLOP counter reports for
             the naive path and for SDPA;
    tiles    (`tiled_*`) the pairs in the tiles a tiled kernel computes: tiles above the diagonal
             are skipped, tiles crossing it computed whole (ragged edges are not padded here).
The backward (`BACKWARD_MATMULS`, matmuls of the forward's size, 2 in the forward):
    "stored_p"     P kept from the forward (autograd on the naive path): dV = P^T dO, dP = dO V^T,
                   dQ = dS K, dK = dS^T Q; 4 matmuls, 2x the forward;
    "atomic_dq"    FlashAttention-2 (Dao 2023, Algorithm 2): S recomputed from Q, K and L, then the
                   same four, dQ accumulated across key tiles (atomics on a GPU, a plain add in
                   `flash_attention_torch`): 5 matmuls, 2.5x (the tutorial's `*= 2.5`);
    "separate_dq"  the book's Triton kernels: a dK/dV kernel (S, dP, dV, dK) and a dQ kernel that
                   recomputes S and dP (S, dP, dQ): 7 matmuls, 3.5x, no atomics.

Saved for backward (`attention_saved_tensors`): naive keeps q, k, v, P and the causal mask; SDPA
(on a CPU) and both flash backends keep q, k, v, O and L (B, H, n_q) in fp32 (fp64 for an fp64
model): no n_q x n_k matrix. `naive_memory`: what the naive kernel sequence allocates.

Bytes moved and the IO bound live in `accounting.attention_traffic`; grouped-query attention, the
KV cache and sparse and linear variants in `accounting.attention_variants`.
Pure: ints and dtype names in, ints, floats and small dataclasses out. References: Dao et al.,
"FlashAttention" (NeurIPS 2022), arXiv:2205.14135; Dao, "FlashAttention-2" (2023),
arXiv:2307.08691. Used in: the attention chapter (06), `mlsys.kernels.flash_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.memory import tensor_bytes
from mlsys.dtypes import bytes_per_element, canonical

CAUSAL_CONVENTIONS = ("exact", "half", "dense")
"""How a causal mask's FLOPs are counted (the module docstring)."""
BACKWARD_MATMULS: dict[str, int] = {"stored_p": 4, "atomic_dq": 5, "separate_dq": 7}
"""Backward matmuls of the forward's size per strategy (the forward has 2)."""
BACKENDS = ("naive", "sdpa", "flash_torch", "flash_triton")
"""Attention backends with a saved-tensor formula (`mlsys.models.config.ATTENTION_BACKENDS`)."""


def _sizes(batch: int, heads: int, n_q: int, n_k: int, d_head: int) -> None:
    checks.positive_ints(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d_head=d_head)


def _causal(causal: object) -> bool:
    return checks.choice(causal, "causal", (False, True))


def _blocks(block_q: int, block_k: int) -> None:
    checks.positive_ints(block_q=block_q, block_k=block_k)


# --- which (query, key) pairs are computed --------------------------------------------------------


def causal_offset(n_q: int, n_k: int) -> int:
    """n_k - n_q: causal query i attends keys j <= i + offset (bottom-right alignment)."""
    checks.positive_ints(n_q=n_q, n_k=n_k)
    return n_k - n_q


def score_pairs(n_q: int, n_k: int, *, causal: bool = False, convention: str = "exact") -> float:
    """(query, key) pairs a forward computes, under `convention` when causal (an int, except
    "half" of an odd n_q n_k). Exact causal: with m = min(n_q, n_k), m (2 n_k - m + 1) / 2."""
    checks.positive_ints(n_q=n_q, n_k=n_k)
    checks.choice(convention, "convention", CAUSAL_CONVENTIONS)
    if not _causal(causal) or convention == "dense":
        return n_q * n_k
    if convention == "half":
        return n_q * n_k // 2 if n_q * n_k % 2 == 0 else n_q * n_k / 2
    m = min(n_q, n_k)  # rows attending something: the last m; they see n_k - m + 1 ... n_k keys
    return m * (2 * n_k - m + 1) // 2


def keys_in_tiles(q_start: int, n_q: int, n_k: int, block_q: int, block_k: int,
                   causal: bool) -> int:
    """Keys covered by the key tiles computed for the query tile starting at row `q_start`: all
    of them, or (causal) up to the last key its last row sees, rounded up to a whole tile."""
    hi = n_k
    if causal:  # the kernels' loop bound: tiles past the diagonal are skipped
        hi = min(n_k, max(0, q_start + block_q + n_k - n_q))
    return min(n_k, -(-hi // block_k) * block_k)


def tiled_score_pairs(n_q: int, n_k: int, *, block_q: int, block_k: int,
                      causal: bool = False) -> int:
    """Pairs in the (block_q x block_k) tiles a tiled kernel computes: every pair when not
    causal; causal, the tiles on or below the diagonal, whole (the mask zeroes the rest)."""
    checks.positive_ints(n_q=n_q, n_k=n_k)
    _blocks(block_q, block_k)
    causal = _causal(causal)
    return sum(min(block_q, n_q - start) * keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
               for start in range(0, n_q, block_q))


# --- FLOPs ----------------------------------------------------------------------------------------


def _matmul_flops(batch: int, heads: int, d_head: int, matmuls: int, twice_pairs: int) -> int:
    """`matmuls` matmuls of 2 d FLOPs per pair; pairs passed doubled so "half" stays an int."""
    return matmuls * d_head * twice_pairs * batch * heads


def attention_forward_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                            causal: bool = False, convention: str = "exact") -> int:
    """Matmul FLOPs of the forward, S = Q K^T and O = P V: 4 d per pair, pairs per `convention`
    (causal only; see `CAUSAL_CONVENTIONS`)."""
    _sizes(batch, heads, n_q, n_k, d_head)
    twice = round(2 * score_pairs(n_q, n_k, causal=causal, convention=convention))
    return _matmul_flops(batch, heads, d_head, 2, twice)


def attention_backward_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                             causal: bool = False, convention: str = "exact",
                             strategy: str = "atomic_dq") -> int:
    """Matmul FLOPs of the backward: BACKWARD_MATMULS[strategy] / 2 times the forward's."""
    checks.choice(strategy, "strategy", BACKWARD_MATMULS)
    forward = attention_forward_flops(batch, heads, n_q, n_k, d_head, causal=causal,
                                      convention=convention)
    return forward * BACKWARD_MATMULS[strategy] // 2


def tiled_attention_forward_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                                  block_q: int, block_k: int, causal: bool = False) -> int:
    """Matmul FLOPs a tiled forward executes: 4 d per pair of `tiled_score_pairs`."""
    _sizes(batch, heads, n_q, n_k, d_head)
    pairs = tiled_score_pairs(n_q, n_k, block_q=block_q, block_k=block_k, causal=causal)
    return _matmul_flops(batch, heads, d_head, 2, 2 * pairs)


def tiled_attention_backward_flops(batch: int, heads: int, n_q: int, n_k: int, d_head: int, *,
                                   block_q: int, block_k: int, causal: bool = False,
                                   strategy: str = "separate_dq") -> int:
    """Matmul FLOPs a tiled backward executes: every computed tile pair does
    BACKWARD_MATMULS[strategy] matmuls (the dK/dV and dQ loops visit the forward's tile pairs)."""
    checks.choice(strategy, "strategy", BACKWARD_MATMULS)
    forward = tiled_attention_forward_flops(batch, heads, n_q, n_k, d_head, block_q=block_q,
                                            block_k=block_k, causal=causal)
    return forward * BACKWARD_MATMULS[strategy] // 2


# --- what each backend saves for backward ---------------------------------------------------------


def attention_saved_tensors(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                            dtype: object = "fp32", *, backend: str,
                            causal: bool = True) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """(what, shape, dtype) of each tensor one attention call keeps for backward, in the order
    saved. naive: q, k, the causal mask (bool, when causal), P (n_q x n_k per head) and v; sdpa,
    flash_torch, flash_triton: q, k, v, the output O and L, fp32 (fp64 for fp64 inputs)."""
    _sizes(batch, heads, n_q, n_k, d_head)
    name = canonical(dtype)
    checks.choice(backend, "backend", BACKENDS)
    q, kv = (batch, heads, n_q, d_head), (batch, heads, n_k, d_head)
    if backend == "naive":
        mask = (("causal mask", (n_q, n_k), "bool"),) if _causal(causal) else ()
        return (("q", q, name), ("k", kv, name), *mask,
                ("P = softmax(q k^T / sqrt(d_head))", (batch, heads, n_q, n_k), name),
                ("v", kv, name))
    wide = "fp64" if name == "fp64" else "fp32"
    return (("q", q, name), ("k", kv, name), ("v", kv, name), ("output", q, name),
            ("logsumexp L", (batch, heads, n_q), wide))


def attention_saved_bytes(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                          dtype: object = "fp32", *, backend: str, causal: bool = True) -> int:
    """Bytes of `attention_saved_tensors`: naive grows with n_q n_k, the others with n_q + n_k."""
    return sum(tensor_bytes(shape, dt) for _, shape, dt in attention_saved_tensors(
        batch, heads, n_q, n_k, d_head, dtype, backend=backend, causal=causal))


# --- memory of the naive kernel sequence, forward and backward ---------------------------------


@dataclass(frozen=True)
class NaiveMemory:
    """Bytes `mlsys.ops.attention.naive_attention` allocates above its inputs, under eager
    autograd (checked exactly against the CPU allocator by the tests and §sec-attention)."""

    matrix_bytes: int  # one n_q x n_k matrix per (batch, head): B H n_q n_k b
    output_bytes: int  # O, and each of dQ, dK, dV: B H n d b
    mask_bytes: int  # the causal mask, n_q n_k bools shared by every batch and head; 0 if none

    @property
    def before_backward_bytes(self) -> int:
        """Live when the forward ends: P (kept by softmax and by P V), O, the mask, and the
        8-byte 0-d divisor autograd keeps for the scaling."""
        return self.matrix_bytes + self.output_bytes + self.mask_bytes + SCALAR_BYTES

    @property
    def backward_peak_bytes(self) -> int:
        """The backward's peak, inside the softmax's backward: P, dP = dO V^T and dS all live
        (3 matrices), with O and dV = P^T dO already made."""
        return self.before_backward_bytes + 2 * self.matrix_bytes + self.output_bytes


SCALAR_BYTES = 8
"""A 0-d float64 tensor: the divisor sqrt(d) that autograd keeps for the scaling's backward."""


def naive_memory(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                 dtype: object = "fp32", *, causal: bool = False) -> NaiveMemory:
    """What naive attention holds for its backward and at the backward's peak (`NaiveMemory`)."""
    _sizes(batch, heads, n_q, n_k, d_head)
    b = bytes_per_element(dtype)
    return NaiveMemory(batch * heads * n_q * n_k * b, batch * heads * n_q * d_head * b,
                       n_q * n_k if _causal(causal) else 0)
