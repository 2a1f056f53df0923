"""The book's operations side by side at one size: FLOPs, minimum bytes moved, intensity.

Square, skinny and batched matmuls, a linear layer's forward and backward, elementwise ops, fused
softmax and norms, and naive and tiled attention, each with its FLOPs (`accounting.flops`), its
minimum traffic (`accounting.bytes`) and its intensity in closed form (LaTeX, b = bytes per
element), the rows of chapter 04's table and figure and of the one-pager "Byte movement and
intensity". Pure: ints and dtype names in, `OpCost` records out.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.bytes import (
    Traffic,
    batched_matmul_traffic,
    elementwise_traffic,
    intensity,
    linear_traffic,
    matmul_traffic,
    naive_attention_traffic,
    norm_traffic,
    softmax_traffic,
    tiled_attention_traffic,
)
from mlsys.accounting.flops import (
    LAYERNORM_OPS_PER_ELEMENT,
    RMSNORM_OPS_PER_ELEMENT,
    SOFTMAX_OPS_PER_ELEMENT,
    layernorm_flops,
    linear_backward_flops,
    linear_flops,
    matmul_flops,
    rmsnorm_flops,
    scaled_dot_product_flops,
    softmax_flops,
)


@dataclass(frozen=True)
class OpCost:
    """FLOPs and minimum traffic of one operation, with its intensity in closed form."""

    name: str  # e.g. "square matmul N = 4096"
    flops: int
    traffic: Traffic
    formula: str  # the intensity in LaTeX, b = bytes per element, e.g. r"2N/(3b)"

    def __post_init__(self) -> None:
        checks.nonnegative_int(self.flops, "flops")
        if not isinstance(self.traffic, Traffic):
            raise TypeError(f"traffic must be a Traffic, got {type(self.traffic).__name__}")

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return intensity(self.flops, self.traffic)


def op_costs(
    dtype: object = "bf16",
    *,
    tokens: int = 4096,
    d_model: int = 4096,
    skinny_rows: int = 16,
    small_n: int = 64,
    batch: int = 64,
    rows_per_item: int = 128,
    attention: tuple[int, int, int, int] = (1, 32, 4096, 128),
) -> list[OpCost]:
    """The book's operations at one size: FLOPs, traffic and intensity (chapter 04, one-pager).

    Matmuls are D = d_model wide; t = `tokens` rows feed the linear layer, the elementwise ops (t x
    D elements) and the row-wise kernels; a batched matmul has B = `batch` items of m rows against
    W; `attention` is (batch, heads, seq T, d_head), non-causal,
    its FLOPs `flops.scaled_dot_product_flops`. Every formula is exact except the norms' (per-row
    terms and the weight read left out: marked \\approx).
    """
    checks.positive_ints(tokens=tokens, d_model=d_model, skinny_rows=skinny_rows,
                         small_n=small_n, batch=batch, rows_per_item=rows_per_item)
    attn = checks.int_sequence(attention, "attention", minimum=1)
    if len(attn) != 4:
        raise ValueError(f"attention must be (batch, heads, seq, d_head), got {attention!r}")
    T, D, N, m, n = tokens, d_model, small_n, skinny_rows, tokens * d_model
    items, rows = batch, rows_per_item
    batched_flops = items * matmul_flops(rows, D, D)
    attn_flops = scaled_dot_product_flops(*attn)
    rowwise = f"{T} rows of {D}"
    return [
        OpCost(f"square matmul N = {D}", matmul_flops(D, D, D),
               matmul_traffic(D, D, D, dtype), r"2N/(3b)"),
        OpCost(f"square matmul N = {N}", matmul_flops(N, N, N),
               matmul_traffic(N, N, N, dtype), r"2N/(3b)"),
        OpCost(f"skinny matmul {m} x {D} x {D}", matmul_flops(m, D, D),
               matmul_traffic(m, D, D, dtype), r"2mD/(b(2m + D)) \approx 2m/b"),
        OpCost(f"batched matmul, shared W ({items} x {rows} rows)", batched_flops,
               batched_matmul_traffic(items, rows, D, D, dtype, shared_b=True),
               r"2BmD/(b(2Bm + D))"),
        OpCost(f"batched matmul, one W per item ({items} x {rows} rows)", batched_flops,
               batched_matmul_traffic(items, rows, D, D, dtype, shared_b=False),
               r"2mD/(b(2m + D))"),
        OpCost(f"linear forward + backward ({T} x {D} x {D})",
               linear_flops(T, D, D) + linear_backward_flops(T, D, D),
               linear_traffic(T, D, D, dtype).total, r"2tD/(b(2t + D))"),
        OpCost("elementwise unary (1 FLOP/element)", n, elementwise_traffic(n, dtype), r"1/(2b)"),
        OpCost("elementwise binary add", n, elementwise_traffic(n, dtype, n_inputs=2), r"1/(3b)"),
        OpCost(f"fused softmax ({rowwise})", softmax_flops(T, D), softmax_traffic(T, D, dtype),
               rf"{SOFTMAX_OPS_PER_ELEMENT}/(2b)"),
        OpCost(f"fused RMSNorm ({rowwise})", rmsnorm_flops(T, D), norm_traffic(T, D, dtype),
               rf"\approx {RMSNORM_OPS_PER_ELEMENT}/(2b)"),
        OpCost(f"fused LayerNorm ({rowwise})", layernorm_flops(T, D),
               norm_traffic(T, D, dtype, has_bias=True),
               rf"\approx {LAYERNORM_OPS_PER_ELEMENT}/(2b)"),
        OpCost(f"naive attention (T = {attn[2]})", attn_flops,
               naive_attention_traffic(*attn, dtype),
               r"T(2d_\text{head} + 3)/(2b(T + d_\text{head}))"),
        OpCost(f"tiled attention, ideal (T = {attn[2]})", attn_flops,
               tiled_attention_traffic(*attn, dtype), r"T(2d_\text{head} + 3)/(2bd_\text{head})"),
    ]
