"""Cost models of attention and FlashAttention-2: FLOPs, bytes moved, the IO bound, saved tensors.

Sizes: batch B, heads H, n_q queries, n_k keys, head dim d (d_head), b bytes per element. The
causal convention is the book's everywhere (`mlsys.models.attention`): bottom-right, query i
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

Bytes (main memory): `naive_attention_ops` is the forward as `naive_causal_attention` runs it, one
eager kernel per line, each reading and writing an n_q x n_k matrix; `flash_forward_traffic`
reads Q once and K, V once per query tile, and writes O and the fp32 log-sum-exp L;
`flash_backward_traffic` the backward kernels. IO complexity (Dao et al. 2022, Theorem 2): standard
attention Theta(N d + N^2) accesses, FlashAttention Theta(N^2 d^2 / M) for on-chip memory of M
elements, d <= M <= N d, and no exact algorithm does better for all such M (their Prop. 3).

Saved for backward (`attention_saved_tensors`): naive keeps q, k, v, P and the causal mask; SDPA
(on a CPU) and both flash backends keep q, k, v, O and L (B, H, n_q) in fp32 (fp64 for an fp64
model): no n_q x n_k matrix.

Pure: ints and dtype names in, ints, floats and `Traffic` out. References: Dao et al.,
"FlashAttention" (NeurIPS 2022), arXiv:2205.14135; Dao, "FlashAttention-2" (2023),
arXiv:2307.08691. Used in: the attention chapter (06), `mlsys.kernels.flash_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.bytes import STATS_BYTES, Traffic
from mlsys.accounting.memory import tensor_bytes
from mlsys.dtypes import bytes_per_element, canonical

CAUSAL_CONVENTIONS = ("exact", "half", "dense")
"""How a causal mask's FLOPs are counted (the module docstring)."""
BACKWARD_MATMULS: dict[str, int] = {"stored_p": 4, "atomic_dq": 5, "separate_dq": 7}
"""Backward matmuls of the forward's size per strategy (the forward has 2)."""
TRAFFIC_STRATEGIES = ("atomic_dq", "separate_dq")
"""Tiled backward schedules whose traffic `flash_backward_traffic` counts."""
BACKENDS = ("naive", "sdpa", "flash_torch", "flash_triton")
"""Attention backends with a saved-tensor formula (`mlsys.models.config.ATTENTION_BACKENDS`)."""
LSE_BYTES = STATS_BYTES
"""Bytes of one log-sum-exp (and of one D = rowsum(dO * O)): fp32 whatever the inputs' dtype."""


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


def _keys_in_tiles(q_start: int, n_q: int, n_k: int, block_q: int, block_k: int,
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
    return sum(min(block_q, n_q - start) * _keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
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


# --- bytes moved ----------------------------------------------------------------------------------


def naive_attention_ops(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                        dtype: object = "bf16", *, causal: bool = False) -> dict[str, Traffic]:
    """The forward as `mlsys.models.attention.naive_causal_attention` runs it, op by op:

        scores   S = Q K^T             read Q, K       write S (B H n_q n_k)
        scale    S / sqrt(d)           read S          write S
        mask     ones, then triu       (causal)        n_q n_k bools written, read, written
        masked   masked_fill(S, mask)  (causal)        read S and the mask, write S
        softmax  P = softmax(S)        read S          write P
        values   O = P V               read P, V       write O
    Every op after the first reads and writes an n_q x n_k matrix: 6 B H n_q n_k elements moved
    when not causal (8 causal), against 2 B H (n_q + n_k) d for Q, K, V and O.
    """
    _sizes(batch, heads, n_q, n_k, d_head)
    b = bytes_per_element(dtype)
    bh = batch * heads
    q = o = bh * n_q * d_head * b
    kv = bh * n_k * d_head * b
    s = bh * n_q * n_k * b
    mask = n_q * n_k  # one byte per bool, shared by every batch and head
    ops = {"scores": Traffic(q + kv, s), "scale": Traffic(s, s)}
    if _causal(causal):
        ops["mask"] = Traffic(mask, 2 * mask)
        ops["masked"] = Traffic(s + mask, s)
    ops["softmax"] = Traffic(s, s)
    ops["values"] = Traffic(s + kv, o)
    return ops


def naive_attention_forward_traffic(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                                    dtype: object = "bf16", *, causal: bool = False) -> Traffic:
    """The sum of `naive_attention_ops`."""
    ops = naive_attention_ops(batch, heads, n_q, n_k, d_head, dtype, causal=causal)
    return sum(ops.values(), Traffic(0, 0))


def flash_forward_traffic(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                          dtype: object = "bf16", *, block_q: int, block_k: int,
                          causal: bool = False) -> Traffic:
    """A tiled forward (`mlsys.kernels.flash_attention`): each query tile reads its Q rows once
    and streams the K and V rows of its computed key tiles; writes O (dtype) and L (fp32).

    Not causal: Q once, K and V ceil(n_q / block_q) times. Causal: each query tile reads the keys
    up to its diagonal tile (`tiled_score_pairs`' tiles), about half as much.
    """
    _sizes(batch, heads, n_q, n_k, d_head)
    _blocks(block_q, block_k)
    causal = _causal(causal)
    b, bh = bytes_per_element(dtype), batch * heads
    keys = sum(_keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
               for start in range(0, n_q, block_q))  # K (and V) rows read, summed over tiles
    read = bh * (n_q + 2 * keys) * d_head * b
    write = bh * (n_q * d_head * b + n_q * LSE_BYTES)
    return Traffic(read, write)


def _queries_from(k_start: int, n_q: int, n_k: int, block_q: int, causal: bool) -> int:
    """Query rows the dK/dV loop reads for the key tile starting at `k_start`: from the first query
    tile whose last row sees that key (causal) to the end."""
    if not causal:
        return n_q
    first = max(0, k_start - (n_k - n_q)) // block_q * block_q
    return n_q - first


def flash_backward_traffic(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                           dtype: object = "bf16", *, block_q: int, block_k: int,
                           causal: bool = False, strategy: str = "separate_dq") -> Traffic:
    """The tiled backward's main-memory traffic (dtype b; L and D = rowsum(dO * O) fp32):

        preprocess   read O, dO                          write D
        dK, dV       per key tile: read K, V once, and Q, dO, L, D of the query tiles that see
                     it; write dK, dV
        "separate_dq" a dQ kernel per query tile: read Q, dO, L, D once, and K, V of its computed
                     key tiles; write dQ
        "atomic_dq"  zero an fp32 dQ buffer; inside the dK/dV loop, per tile pair, read and
                     write its query rows (atomic adds); then convert: read fp32, write dQ
    """
    _sizes(batch, heads, n_q, n_k, d_head)
    _blocks(block_q, block_k)
    causal = _causal(causal)
    checks.choice(strategy, "strategy", TRAFFIC_STRATEGIES)
    b, bh, d = bytes_per_element(dtype), batch * heads, d_head
    row = 2 * d * b + 2 * LSE_BYTES  # one query row: q, dO, L, D
    pre = Traffic(2 * n_q * d * b, n_q * LSE_BYTES)
    rows_read = sum(_queries_from(start, n_q, n_k, block_q, causal)
                    for start in range(0, n_k, block_k))  # query rows, summed over key tiles
    dkdv = Traffic(2 * n_k * d * b + rows_read * row, 2 * n_k * d * b)
    if strategy == "separate_dq":
        keys = sum(_keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
                   for start in range(0, n_q, block_q))
        dq = Traffic(n_q * row + 2 * keys * d * b, n_q * d * b)
    else:
        rmw = rows_read * d * 4  # the fp32 dQ rows of every computed tile pair
        dq = Traffic(rmw + n_q * d * 4, n_q * d * 4 + rmw + n_q * d * b)
    total = pre + dkdv + dq
    return Traffic(bh * total.read_bytes, bh * total.write_bytes)


# --- the IO-complexity bound (Dao et al. 2022, Theorem 2) -----------------------------------------


def _sram_elements(sram_bytes: int, d_head: int, dtype: object) -> int:
    m = checks.positive_int(sram_bytes, "sram_bytes") // bytes_per_element(dtype)
    if m < checks.positive_int(d_head, "d_head"):
        raise ValueError(f"sram_bytes ({sram_bytes}) holds {m} elements of {canonical(dtype)}, "
                         f"fewer than one row of d_head ({d_head}): the bound needs M >= d")
    return m


def paper_block_sizes(sram_bytes: int, d_head: int, dtype: object = "bf16") -> tuple[int, int]:
    """(B_r, B_c) of FlashAttention's Algorithm 1 for M = sram_bytes / b elements on chip:
    B_c = ceil(M / 4d) key rows, B_r = min(B_c, d) query rows. FlashAttention-2 swaps the loops
    (query tiles outside), so its query tile plays B_c's part in the IO count."""
    m = _sram_elements(sram_bytes, d_head, dtype)
    block_c = -(-m // (4 * d_head))
    return min(block_c, d_head), block_c


def flash_io_bound_elements(seq: int, d_head: int, sram_bytes: int,
                            dtype: object = "bf16") -> float:
    """N^2 d^2 / M: FlashAttention's main-memory accesses up to a constant (Theorem 2), with
    M = sram_bytes / b elements; stated for d <= M <= N d (ValueError outside)."""
    checks.positive_ints(seq=seq, d_head=d_head)
    m = _sram_elements(sram_bytes, d_head, dtype)
    if m > seq * d_head:
        raise ValueError(f"sram_bytes ({sram_bytes}) holds M = {m} elements > N d = {seq} * "
                         f"{d_head} = {seq * d_head}: everything fits on chip, the bound needs "
                         "M <= N d")
    return seq**2 * d_head**2 / m


def standard_io_elements(seq: int, d_head: int) -> int:
    """N d + N^2: standard attention's accesses up to a constant (Theorem 2)."""
    checks.positive_ints(seq=seq, d_head=d_head)
    return seq * d_head + seq**2


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
    """Bytes `mlsys.models.attention.naive_attention` allocates above its inputs, under eager
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


# --- the naive backward, op by op -----------------------------------------------------------------


def naive_attention_backward_ops(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                                 dtype: object = "bf16", *,
                                 causal: bool = False) -> dict[str, Traffic]:
    """The backward of `naive_attention_ops` as autograd runs it (P and the mask saved), op by op:

        dv       dV = P^T dO            read P, dO       write dV (n_k d)
        dp       dP = dO V^T            read dO, V       write dP (n_q n_k)
        softmax  dS = P * (dP - rowsum(dP * P))   read P, dP   write dS
        masked   dS masked to 0         (causal)         read dS and the bool mask, write dS
        scale    dS / sqrt(d)           read dS          write dS
        dq       dQ = dS K              read dS, K       write dQ
        dk       dK = dS^T Q            read dS, Q       write dK
    11 B H n_q n_k elements of the score matrices moved when causal (9 not) and the mask's n_q n_k
    bytes once, against 3 n_q d + 2 n_k d read and n_q d + 2 n_k d written per head.
    """
    _sizes(batch, heads, n_q, n_k, d_head)
    b = bytes_per_element(dtype)
    bh = batch * heads
    q = bh * n_q * d_head * b  # Q, dO, dQ
    kv = bh * n_k * d_head * b  # K, V, dK, dV
    s = bh * n_q * n_k * b  # P, dP, dS
    ops = {"dv": Traffic(s + q, kv), "dp": Traffic(q + kv, s), "softmax": Traffic(2 * s, s)}
    if _causal(causal):
        ops["masked"] = Traffic(s + n_q * n_k, s)
    ops["scale"] = Traffic(s, s)
    ops["dq"] = Traffic(s + kv, q)
    ops["dk"] = Traffic(s + q, kv)
    return ops


def naive_attention_backward_traffic(batch: int, heads: int, n_q: int, n_k: int, d_head: int,
                                     dtype: object = "bf16", *, causal: bool = False) -> Traffic:
    """The sum of `naive_attention_backward_ops`."""
    ops = naive_attention_backward_ops(batch, heads, n_q, n_k, d_head, dtype, causal=causal)
    return sum(ops.values(), Traffic(0, 0))


# --- variants of the block: grouped-query, the KV cache, sliding-window, sparse, linear ----------
#
# Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245) lets each group of
# n_heads / n_kv_heads query heads share one key head and one value head; multi-query attention
# (Shazeer 2019, arXiv:1911.02150) is n_kv_heads = 1, multi-head attention n_kv_heads = n_heads.
# The k and v projections and the KV cache shrink by the group size; the score and value matmuls
# do not (every query head still attends every key). A sliding window of w keys (Beltagy et al.
# 2020, arXiv:2004.05150; Mistral 7B) caps each query's keys at w: pairs grow like w T, not T^2,
# and the cache keeps w tokens. The Sparse Transformer's strided pattern (Child et al. 2019,
# arXiv:1904.10509) at stride sqrt(T) gives a query at most ~2 sqrt(T) keys. Linear attention
# (Katharopoulos et al. 2020, arXiv:2006.16236) replaces softmax(Q K^T) V by phi(Q) (phi(K)^T V):
# 4 T d_phi (d + 1) FLOPs per head, no T^2 term, and a d_phi x (d + 1) state instead of a cache.
# Used in: the book page "The attention block: one page" (§sec-attention-onepager), with the naive
# backward above; tests in tests/test_accounting_attention_extra.py.


def _kv_heads(n_heads: int, n_kv_heads: object) -> int:
    """n_kv_heads (n_heads when None), checked to divide n_heads."""
    n_heads = checks.positive_int(n_heads, "n_heads")
    if n_kv_heads is None:
        return n_heads
    n_kv = checks.positive_int(n_kv_heads, "n_kv_heads")
    if n_heads % n_kv:
        raise ValueError(f"n_heads ({n_heads}) is not divisible by n_kv_heads ({n_kv}): "
                         f"{n_heads} / {n_kv} = {n_heads / n_kv:g}; each key head serves a whole "
                         "group of query heads")
    return n_kv


def attention_params(d_model: int, n_heads: int, *, n_kv_heads: int | None = None,
                     d_head: int | None = None) -> dict[str, int]:
    """Parameters of the four bias-free projections, by module name: q_proj D x H d, k_proj and
    v_proj D x H_kv d each, o_proj H d x D. d_head defaults to D / H (which must divide), n_kv_heads
    to n_heads: 4 D^2 for multi-head attention (`params.param_counts(cfg).attention_per_layer`),
    2 D^2 + 2 D H_kv d with grouped-query attention."""
    d_model = checks.positive_int(d_model, "d_model")
    n_kv = _kv_heads(n_heads, n_kv_heads)
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) is not divisible by n_heads ({n_heads}): "
                             f"{d_model} / {n_heads} = {d_model / n_heads:g}; pass d_head")
        d_head = d_model // n_heads
    d_head = checks.positive_int(d_head, "d_head")
    q, kv = d_model * n_heads * d_head, d_model * n_kv * d_head
    return {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": q}


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int,
                             dtype: object = "bf16") -> int:
    """Bytes one token adds to the KV cache of the whole model: a key and a value of d_head per
    key head per layer, 2 L H_kv d b."""
    checks.positive_ints(n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head)
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_element(dtype)


def kv_cache_bytes(batch: int, tokens: int, n_layers: int, n_kv_heads: int, d_head: int,
                   dtype: object = "bf16", *, window: int | None = None) -> int:
    """The KV cache of `batch` sequences of `tokens` tokens: B T 2 L H_kv d b; with a sliding
    `window` each sequence keeps only its last min(T, window) tokens (a rolling buffer)."""
    checks.positive_ints(batch=batch, tokens=tokens)
    kept = tokens if window is None else min(tokens, checks.positive_int(window, "window"))
    return batch * kept * kv_cache_bytes_per_token(n_layers, n_kv_heads, d_head, dtype)


def decode_attention_traffic(batch: int, heads: int, context: int, d_head: int,
                             dtype: object = "bf16", *, n_kv_heads: int | None = None) -> Traffic:
    """One decoding step of one layer's attention kernel: one new query per sequence attends the
    `context` cached keys (itself included). Reads q (B H d) and the cached K and V
    (2 B H_kv context d), writes O (B H d); appending the new k, v to the cache is the
    projection's write, not counted here. Its FLOPs: `attention_forward_flops(batch, heads, 1,
    context, d_head, causal=True)`, 4 B H context d: intensity about 2 (H / H_kv) / b FLOP/byte."""
    checks.positive_ints(batch=batch, context=context, d_head=d_head)
    n_kv = _kv_heads(heads, n_kv_heads)
    b = bytes_per_element(dtype)
    q = batch * heads * d_head * b
    return Traffic(q + 2 * batch * n_kv * context * d_head * b, q)


def _window_sum(n: int, window: int) -> int:
    """sum of min(t, window) for t = 1 ... n."""
    if n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def sliding_window_pairs(n_q: int, n_k: int, *, window: int) -> int:
    """(query, key) pairs of causal attention in which each query attends at most its last
    `window` keys, itself included (bottom-right: query i sees keys i + (n_k - n_q) - window + 1
    ... i + (n_k - n_q)); flash-attn's window_size=(window - 1, 0). Row i sees
    min(i + n_k - n_q + 1, window) keys: w T - w (w - 1) / 2 at n_q = n_k = T >= w, linear in T;
    window >= n_k gives `score_pairs(n_q, n_k, causal=True)`."""
    checks.positive_ints(n_q=n_q, n_k=n_k, window=window)
    first = max(1, n_k - n_q + 1)  # keys seen by the first query that sees any
    return _window_sum(n_k, window) - _window_sum(first - 1, window)


def strided_sparse_pairs(seq: int, *, stride: int) -> int:
    """Pairs of the Sparse Transformer's causal strided pattern (Child et al. 2019) with stride l,
    both of its sets in one head: query i attends the keys i - l ... i (local, min(i, l) + 1 of
    them) and every key j < i - l with (i - j) a multiple of l (max(0, floor(i / l) - 1) more).
    About T l + T^2 / (2 l) pairs, 1.5 T sqrt(T) at l = sqrt(T), instead of T (T + 1) / 2."""
    checks.positive_ints(seq=seq, stride=stride)
    local = seq + _window_sum(seq - 1, stride)  # sum over i of min(i, l) + 1
    blocks, rest = divmod(seq, stride)  # sum over i of floor(i / l), then less one per i >= l
    strided = stride * blocks * (blocks - 1) // 2 + rest * blocks - max(0, seq - stride)
    return local + strided


def masked_attention_forward_flops(batch: int, heads: int, d_head: int, pairs: int) -> int:
    """Forward matmul FLOPs of attention restricted to `pairs` (query, key) pairs per head (a
    sliding window's, a sparse pattern's): 4 d per pair, S = Q K^T and O = P V, as
    `attention_forward_flops` counts them."""
    checks.positive_ints(batch=batch, heads=heads, d_head=d_head)
    return 4 * batch * heads * d_head * checks.nonnegative_int(pairs, "pairs")


def linear_attention_flops(batch: int, heads: int, seq: int, d_head: int, *,
                           feature_dim: int | None = None) -> int:
    """Forward matmul FLOPs of linear attention, phi(Q) (phi(K)^T [V 1]) per head, the column of
    ones giving the normalizer phi(q_i) . sum_j phi(k_j): 2 T d_phi (d + 1) to build the state
    and as much to apply it, 4 B H T d_phi (d + 1) in all, causal (running sums) or not;
    d_phi = feature_dim, d_head by default. The feature map and the division are left out."""
    checks.positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    d_phi = d_head if feature_dim is None else checks.positive_int(feature_dim, "feature_dim")
    return 4 * batch * heads * seq * d_phi * (d_head + 1)


def linear_attention_state_bytes(batch: int, heads: int, d_head: int, dtype: object = "fp32", *,
                                 feature_dim: int | None = None) -> int:
    """What causal linear attention keeps per layer while decoding, instead of a KV cache: the
    running sum of phi(k_j) [v_j 1]^T, a d_phi x (d + 1) matrix per head, whatever the length."""
    checks.positive_ints(batch=batch, heads=heads, d_head=d_head)
    d_phi = d_head if feature_dim is None else checks.positive_int(feature_dim, "feature_dim")
    return batch * heads * d_phi * (d_head + 1) * bytes_per_element(dtype)


# --- formulas as the seeds write them, kept so the book can check them ---------------------------


def claimed_attention_layer_bytes(batch: int, seq: int, d_model: int) -> int:
    """As a byte-movement one-pager totals an attention layer: "~4 B S D + 4 D^2 + 2 B S^2 bytes".
    Elements, not bytes; its own terms add up to 10 B S D; the scores are per head (B H S^2);
    scale, mask and softmax move the S^2 matrices again; no backward."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model)
    return 4 * batch * seq * d_model + 4 * d_model**2 + 2 * batch * seq**2


def claimed_flash_attention_bytes(batch: int, seq: int, d_model: int) -> int:
    """As the same one-pager writes FlashAttention's traffic: "B S D (just inputs and outputs)".
    Q, K, V and O alone are 4 B S D elements, and K, V are read once per query tile."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model)
    return batch * seq * d_model
