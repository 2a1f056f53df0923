"""Bytes attention moves to and from main memory, naive and tiled, and the IO-complexity bound.

Sizes and the causal convention as in `accounting.attention`. `naive_attention_ops` is the forward
as `naive_causal_attention` runs it, one eager kernel per line, each reading and writing an
n_q x n_k matrix, and `naive_attention_backward_ops` its backward under autograd;
`flash_forward_traffic` reads Q once and K, V once per query tile, and writes O and the fp32
log-sum-exp L; `flash_backward_traffic` the backward kernels. IO complexity (Dao et al. 2022,
Theorem 2): standard attention Theta(N d + N^2) accesses, FlashAttention Theta(N^2 d^2 / M) for
on-chip memory of M elements, d <= M <= N d, and no exact algorithm does better for all such M
(their Prop. 3). The seeds' byte formulas (`claimed_*`) are kept to be set beside these.

Pure: ints and dtype names in, ints, floats and `Traffic` out. References: Dao et al.,
"FlashAttention" (NeurIPS 2022), arXiv:2205.14135; Dao, "FlashAttention-2" (2023),
arXiv:2307.08691. Used in: chapter 06, `mlsys.kernels.flash_attention`, the attention one-pager.
"""

from __future__ import annotations

from mlsys import checks
from mlsys.accounting.attention import _blocks, _causal, _sizes, keys_in_tiles
from mlsys.accounting.bytes import STATS_BYTES, Traffic
from mlsys.dtypes import bytes_per_element, canonical

TRAFFIC_STRATEGIES = ("atomic_dq", "separate_dq")
"""Tiled backward schedules whose traffic `flash_backward_traffic` counts."""
LSE_BYTES = STATS_BYTES
"""Bytes of one log-sum-exp (and of one D = rowsum(dO * O)): fp32 whatever the inputs' dtype."""


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
    keys = sum(keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
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
        keys = sum(keys_in_tiles(start, n_q, n_k, block_q, block_k, causal)
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
