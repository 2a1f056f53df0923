"""Bytes moved to and from main memory (HBM, or DRAM on a CPU) by common operations.

Each function counts the *minimum* traffic of one kernel that reads every input once and writes
every output once (the ideal a fused, well-tiled kernel approaches), unless its name says
otherwise (`naive_*`, `eager_*`). Arithmetic intensity = FLOPs / bytes; the FLOP counts come from
`mlsys.accounting.flops`. `accounting.op_costs` puts the book's operations side by side (chapter 04
and the one-pager "Byte movement and intensity").

Pure functions: ints and dtype names in, ints, floats or small dataclasses out. Used in:
§sec-bytes, book page "Byte-movement formulas".
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.flops import matmul_flops
from mlsys.dtypes import bytes_per_element

STATS_BYTES = 4
"""Bytes of one per-row statistic a norm saves for its backward (fp32: rstd, and the mean too for
LayerNorm), whatever the dtype of x."""


@dataclass(frozen=True)
class Traffic:
    """Bytes read and written by one operation."""

    read_bytes: int
    write_bytes: int

    def __post_init__(self) -> None:
        checks.nonnegative_int(self.read_bytes, "read_bytes")
        checks.nonnegative_int(self.write_bytes, "write_bytes")

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)


def intensity(flops: float, traffic: Traffic | int) -> float:
    """Arithmetic intensity in FLOP per byte of memory traffic (`traffic`: a Traffic or bytes)."""
    work = checks.nonnegative(flops, "flops")
    n_bytes = traffic.total_bytes if isinstance(traffic, Traffic) else traffic
    return work / checks.positive(n_bytes, "bytes moved")


def _elements(read: int, write: int, dtype: object) -> Traffic:
    """Traffic of `read` and `write` elements of `dtype`."""
    b = bytes_per_element(dtype)
    return Traffic(read_bytes=read * b, write_bytes=write * b)


# --- matrix multiplication ------------------------------------------------------------------------


def matmul_traffic(m: int, n: int, k: int, dtype: object = "bf16") -> Traffic:
    """C[m, n] = A[m, k] @ B[k, n]: read A and B once, write C once (all in `dtype`)."""
    checks.positive_ints(m=m, n=n, k=k)
    return _elements(m * k + k * n, m * n, dtype)


def matmul_intensity(m: int, n: int, k: int, dtype: object = "bf16") -> float:
    """2mnk FLOPs over the minimum traffic; a square N-matmul gives 2N / (3 * bytes_per_element)."""
    return intensity(matmul_flops(m, n, k), matmul_traffic(m, n, k, dtype))


def batched_matmul_traffic(
    batch: int, m: int, n: int, k: int, dtype: object = "bf16", *, shared_b: bool
) -> Traffic:
    """C[batch, m, n] = A[batch, m, k] @ B, with B [k, n] shared by the batch or [batch, k, n].

    A shared operand is read once for the whole batch: that is why stacking a batch into one
    matmul (a linear layer over batch*seq tokens) raises intensity, and per-sample weights do not.
    """
    checks.positive_ints(batch=batch, m=m, n=n, k=k)
    checks.choice(shared_b, "shared_b", (True, False))
    b_elements = k * n if shared_b else batch * k * n
    return _elements(batch * m * k + b_elements, batch * m * n, dtype)


# --- elementwise and row-wise operations ----------------------------------------------------------


def elementwise_traffic(
    n_elements: int, dtype: object = "fp32", *, n_inputs: int = 1, n_outputs: int = 1
) -> Traffic:
    """An elementwise op on `n_elements`: each input read once, each output written once."""
    checks.positive_ints(n_elements=n_elements, n_inputs=n_inputs, n_outputs=n_outputs)
    return _elements(n_inputs * n_elements, n_outputs * n_elements, dtype)


def elementwise_intensity(
    flops_per_element: float, dtype: object = "fp32", *, n_inputs: int = 1
) -> float:
    """FLOP per *byte* of an elementwise op: flops_per_element / ((n_inputs + 1) * b), b = bytes
    per element.

    Not "1 FLOP/byte": a unary fp32 op doing one FLOP per element moves 8 bytes per element, so
    its intensity is 1/8; a binary fp32 add is 1/12.
    """
    work = checks.nonnegative(flops_per_element, "flops_per_element")
    return intensity(work, elementwise_traffic(1, dtype, n_inputs=n_inputs))


def fused_chain_traffic(n_elements: int, dtype: object) -> Traffic:
    """A chain of unary ops fused in one kernel (`mlsys.kernels.elementwise`): read the n elements
    once and write them once, whatever the chain's length."""
    n = checks.nonnegative_int(n_elements, "n_elements")
    return _elements(n, n, dtype)


def eager_chain_traffic(n_elements: int, dtype: object, k: int) -> Traffic:
    """The same chain as k eager ops: each reads the n elements and writes n (k = 0: nothing)."""
    steps = checks.nonnegative_int(k, "k")
    one = fused_chain_traffic(n_elements, dtype)
    return Traffic(steps * one.read_bytes, steps * one.write_bytes)


def softmax_traffic(rows: int, cols: int, dtype: object = "fp32") -> Traffic:
    """Fused row-wise softmax: read the [rows, cols] input once, write the output once."""
    checks.positive_ints(rows=rows, cols=cols)
    return _elements(rows * cols, rows * cols, dtype)


def naive_softmax_traffic(rows: int, cols: int, dtype: object = "fp32") -> Traffic:
    """Softmax as five eager ops (max, subtract, exp, sum, divide): reads 5MN + 2M, writes 3MN + 2M.

    With M = rows, N = cols: amax reads MN, writes M; subtract reads MN + M, writes MN; exp reads
    MN, writes MN; sum reads MN, writes M; divide reads MN + M, writes MN.
    """
    checks.positive_ints(rows=rows, cols=cols)
    mn = rows * cols
    return _elements(5 * mn + 2 * rows, 3 * mn + 2 * rows, dtype)


def softmax_backward_traffic(rows: int, cols: int, dtype: object = "fp32") -> Traffic:
    """Fused softmax backward dx = y * (dy - <dy, y>): read y and dy, write dx."""
    checks.positive_ints(rows=rows, cols=cols)
    return _elements(2 * rows * cols, rows * cols, dtype)


def norm_traffic(
    rows: int,
    cols: int,
    dtype: object = "fp32",
    *,
    has_bias: bool = False,
    save_stats: bool = False,
) -> Traffic:
    """Fused RMSNorm (LayerNorm with `has_bias`) forward: read x and the weight (and bias), write y.

    With `save_stats`, also write the fp32 per-row statistics the backward reads (STATS_BYTES
    each): rstd for RMSNorm, as `mlsys.kernels.rmsnorm` does; mean and rstd for LayerNorm.
    """
    checks.positive_ints(rows=rows, cols=cols)
    checks.choice(has_bias, "has_bias", (True, False))
    checks.choice(save_stats, "save_stats", (True, False))
    params = 2 if has_bias else 1
    stats = rows * params * STATS_BYTES if save_stats else 0
    traffic = _elements(rows * cols + params * cols, rows * cols, dtype)
    return traffic + Traffic(0, stats)


def rmsnorm_backward_traffic(rows: int, cols: int, dtype: object = "fp32") -> Traffic:
    """Fused RMSNorm backward, as `mlsys.kernels.rmsnorm` runs it: read x, dy, the weight and the
    saved fp32 rstd; write dx and dweight.

    Excludes the kernel's fp32 partial sums of dweight (P x N written and read, P = programs),
    under 1% of the total when rows >> P.
    """
    checks.positive_ints(rows=rows, cols=cols)
    traffic = _elements(2 * rows * cols + cols, rows * cols + cols, dtype)
    return traffic + Traffic(rows * STATS_BYTES, 0)


# --- a linear layer, forward and backward ---------------------------------------------------------


@dataclass(frozen=True)
class LinearTraffic:
    """Traffic of Y = X W^T with X [tokens, d_in], W [d_out, d_in], split by matmul."""

    forward: Traffic  # Y = X W^T: read X, W; write Y
    grad_input: Traffic  # dX = dY W: read dY, W; write dX
    grad_weight: Traffic  # dW = dY^T X: read dY, X; write dW (read dW too when accumulating)

    @property
    def total(self) -> Traffic:
        return self.forward + self.grad_input + self.grad_weight

    @property
    def weight_reads(self) -> int:
        """How many times W itself is read: twice (forward and dX), not three times."""
        return 2


def linear_traffic(
    tokens: int, d_in: int, d_out: int, dtype: object = "bf16", *, accumulate_grad: bool = False
) -> LinearTraffic:
    """Reads and writes of a linear layer's forward and backward (three matmuls).

    The weight matrix is read twice (forward, grad_input) and a weight-sized gradient is written
    once (grad_weight): 3 * d_in * d_out elements of weight-shaped traffic, of which only two are
    reads of W. With gradient accumulation (`dW += ...`) the old dW is read as well.
    """
    checks.positive_ints(tokens=tokens, d_in=d_in, d_out=d_out)
    checks.choice(accumulate_grad, "accumulate_grad", (True, False))
    b = bytes_per_element(dtype)
    x, w, y = tokens * d_in * b, d_in * d_out * b, tokens * d_out * b
    return LinearTraffic(
        forward=Traffic(read_bytes=x + w, write_bytes=y),
        grad_input=Traffic(read_bytes=y + w, write_bytes=x),
        grad_weight=Traffic(read_bytes=y + x + (w if accumulate_grad else 0), write_bytes=w),
    )


# --- attention ------------------------------------------------------------------------------------


def naive_attention_traffic(
    batch: int, heads: int, seq: int, d_head: int, dtype: object = "bf16"
) -> Traffic:
    """Unfused (non-causal) attention forward as three kernels: S = QK^T, P = softmax(S), O = PV.

    Reads Q, K (write S: seq^2), reads S (write P: seq^2), reads P and V (write O). The two
    seq x seq matrices make it 4 * seq^2 elements per head beyond Q, K, V and O.
    """
    checks.positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    bh, qkvo, scores = batch * heads, seq * d_head, seq * seq
    read = bh * (2 * qkvo + scores + scores + qkvo)  # Q, K | S | P, V
    write = bh * (scores + scores + qkvo)  # S | P | O
    return _elements(read, write, dtype)


def tiled_attention_traffic(
    batch: int,
    heads: int,
    seq: int,
    d_head: int,
    dtype: object = "bf16",
    *,
    block_q: int | None = None,
) -> Traffic:
    """FlashAttention-style forward: the seq x seq scores never leave on-chip memory.

    With `block_q=None` the ideal: read Q, K, V once, write O once (4 * seq * d_head per head).
    With a query block size, each of the ceil(seq / block_q) query blocks streams all of K and V.
    """
    checks.positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    kv_passes = 1 if block_q is None else -(-seq // checks.positive_int(block_q, "block_q"))
    bh, qkvo = batch * heads, seq * d_head
    return _elements(bh * (qkvo + 2 * qkvo * kv_passes), bh * qkvo, dtype)


# --- the optimizer step ---------------------------------------------------------------------------


def adamw_traffic(n_params: int, dtype: object = "fp32") -> Traffic:
    """One fused AdamW update of `n_params` parameters, everything in `dtype`: read the parameter,
    its gradient and both moments, write the parameter and both moments (7 tensors per parameter:
    28 bytes in fp32). Memory-bound (about 10 FLOPs per parameter): its time is these bytes over
    the bandwidth, at best. PyTorch's multi-tensor (`foreach`) AdamW makes several passes, so it
    moves a few times more."""
    n = checks.positive_int(n_params, "n_params")
    return _elements(4 * n, 3 * n, dtype)
