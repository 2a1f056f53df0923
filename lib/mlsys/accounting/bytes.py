"""Bytes moved to and from main memory (HBM, or DRAM on a CPU) by common operations.

Each function counts the *minimum* traffic of one kernel that reads every input once and writes
every output once (the ideal a fused, well-tiled kernel approaches), unless its name says
otherwise (`naive_*`, `*_with_rereads`). Arithmetic intensity = FLOPs / bytes; the FLOP counts come
from `mlsys.accounting.flops` where they exist, or are stated here per element.

Pure functions: ints and dtype names in, ints or floats out. Used in: §sec-bytes, book page
"Byte-movement formulas".
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys.checks import positive_ints
from mlsys.dtypes import bytes_per_element


@dataclass(frozen=True)
class Traffic:
    """Bytes read and written by one operation."""

    read_bytes: int
    write_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)


def intensity(flops: float, traffic: Traffic | int) -> float:
    """Arithmetic intensity in FLOP per byte of memory traffic."""
    n_bytes = traffic.total_bytes if isinstance(traffic, Traffic) else traffic
    if n_bytes <= 0:
        raise ValueError(f"bytes moved must be positive, got {n_bytes}")
    return flops / n_bytes


# --- matrix multiplication -------------------------------------------------------------------------


def matmul_traffic(m: int, n: int, k: int, dtype: object = "bf16") -> Traffic:
    """C[m, n] = A[m, k] @ B[k, n]: read A and B once, write C once (all in `dtype`)."""
    positive_ints(m=m, n=n, k=k)
    b = bytes_per_element(dtype)
    return Traffic(read_bytes=(m * k + k * n) * b, write_bytes=m * n * b)


def matmul_intensity(m: int, n: int, k: int, dtype: object = "bf16") -> float:
    """2mnk FLOPs over the minimum traffic; for a square N-matmul this is 2N / (3 * bytes_per_element)."""
    return intensity(2 * m * n * k, matmul_traffic(m, n, k, dtype))


def batched_matmul_traffic(batch: int, m: int, n: int, k: int, dtype: object = "bf16", *, shared_b: bool) -> Traffic:
    """C[batch, m, n] = A[batch, m, k] @ B: B is [k, n] shared by the batch, or [batch, k, n] when not shared.

    A shared operand is read once for the whole batch: that is why stacking a batch into one
    matmul (a linear layer over batch*seq tokens) raises intensity, and per-sample weights do not.
    """
    positive_ints(batch=batch, m=m, n=n, k=k)
    b = bytes_per_element(dtype)
    b_elements = k * n if shared_b else batch * k * n
    return Traffic(read_bytes=(batch * m * k + b_elements) * b, write_bytes=batch * m * n * b)


# --- elementwise and row-wise operations -----------------------------------------------------------


def elementwise_traffic(n_elements: int, dtype: object = "fp32", *, n_inputs: int = 1, n_outputs: int = 1) -> Traffic:
    """An elementwise op on `n_elements`: each input read once, each output written once."""
    positive_ints(n_elements=n_elements, n_inputs=n_inputs, n_outputs=n_outputs)
    b = bytes_per_element(dtype)
    return Traffic(read_bytes=n_inputs * n_elements * b, write_bytes=n_outputs * n_elements * b)


def elementwise_intensity(flops_per_element: float, dtype: object = "fp32", *, n_inputs: int = 1) -> float:
    """FLOP per *byte* of an elementwise op: flops_per_element / ((n_inputs + 1) * bytes_per_element).

    Not "1 FLOP/byte": a unary fp32 op doing one FLOP per element moves 8 bytes per element, so
    its intensity is 1/8; a binary fp32 add is 1/12.
    """
    if flops_per_element < 0:
        raise ValueError(f"flops_per_element must be >= 0, got {flops_per_element}")
    per_element = elementwise_traffic(1, dtype, n_inputs=n_inputs)
    return flops_per_element / per_element.total_bytes


def softmax_traffic(rows: int, cols: int, dtype: object = "fp32") -> Traffic:
    """Fused row-wise softmax: read the [rows, cols] input once, write the output once."""
    return elementwise_traffic(rows * cols, dtype)


def norm_traffic(rows: int, cols: int, dtype: object = "fp32", *, has_bias: bool = False) -> Traffic:
    """Fused RMSNorm (or LayerNorm with `has_bias`) forward: read x and the weight (and bias), write y."""
    positive_ints(rows=rows, cols=cols)
    b = bytes_per_element(dtype)
    params = cols * (2 if has_bias else 1)
    return Traffic(read_bytes=(rows * cols + params) * b, write_bytes=rows * cols * b)


# --- a linear layer, forward and backward ----------------------------------------------------------


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
    positive_ints(tokens=tokens, d_in=d_in, d_out=d_out)
    b = bytes_per_element(dtype)
    x, w, y = tokens * d_in * b, d_in * d_out * b, tokens * d_out * b
    return LinearTraffic(
        forward=Traffic(read_bytes=x + w, write_bytes=y),
        grad_input=Traffic(read_bytes=y + w, write_bytes=x),
        grad_weight=Traffic(read_bytes=y + x + (w if accumulate_grad else 0), write_bytes=w),
    )


# --- attention ---------------------------------------------------------------------------------------


def naive_attention_traffic(batch: int, heads: int, seq: int, d_head: int, dtype: object = "bf16") -> Traffic:
    """Unfused (non-causal) attention forward as three kernels: S = QK^T, P = softmax(S), O = PV.

    Reads Q, K (write S: seq^2), reads S (write P: seq^2), reads P and V (write O). The two
    seq x seq matrices make it 4 * seq^2 elements per head beyond Q, K, V and O.
    """
    positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    b = bytes_per_element(dtype)
    bh = batch * heads
    qkvo = seq * d_head
    scores = seq * seq
    read = bh * (2 * qkvo + scores + scores + qkvo)  # Q, K | S | P, V
    write = bh * (scores + scores + qkvo)  # S | P | O
    return Traffic(read_bytes=read * b, write_bytes=write * b)


def tiled_attention_traffic(
    batch: int, heads: int, seq: int, d_head: int, dtype: object = "bf16", *, block_q: int | None = None
) -> Traffic:
    """FlashAttention-style forward: the seq x seq scores never leave on-chip memory.

    With `block_q=None` the ideal: read Q, K, V once, write O once (4 * seq * d_head per head).
    With a query block size, each of the ceil(seq / block_q) query blocks streams all of K and V.
    """
    positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    b = bytes_per_element(dtype)
    if block_q is not None:
        positive_ints(block_q=block_q)
    kv_passes = 1 if block_q is None else -(-seq // block_q)
    bh = batch * heads
    qkvo = seq * d_head
    return Traffic(read_bytes=bh * (qkvo + 2 * qkvo * kv_passes) * b, write_bytes=bh * qkvo * b)
