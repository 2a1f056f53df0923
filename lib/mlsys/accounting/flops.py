"""FLOP counts of matmuls, linear layers, row-wise kernels and the book's transformer, by component.

Conventions: one multiply-add = 2 FLOPs, so C[m, n] = A[m, k] @ B[k, n] costs 2mnk. A linear layer's
backward does two matmuls of the forward's size (grad input and grad weight), so forward + backward
= 3x forward for every matmul term. Attention is counted without the causal saving (as written in
`mlsys.models.transformer` and as `torch.utils.flop_counter` counts it: the full seq x seq scores).

Matmul terms are exact and checked against `torch.utils.flop_counter` module by module (tests
and §sec-flops). Elementwise terms (norms, RoPE, softmax, SwiGLU's gate, residual adds) are
estimates in operations per element, defined once below (exp, rsqrt, sigmoid count as one op
each); the FLOP counter does not count them. The row-wise kernels (`mlsys.kernels`) count with
the same constants.

Pure functions; `cfg` is any object with vocab_size, d_model, n_layers, n_heads, d_ff (a
`TransformerConfig`). What a FLOP count becomes against a peak (MFU, HFU, wall-clock time) is
`accounting.utilization`. A little over 300 lines: the per-operation counts, the transformer's
built from them, and the widely shared formulas checked against both read best side by side.
Used in: §sec-flops, §sec-bytes, book page "FLOPs per layer".
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mlsys import checks
from mlsys.accounting.params import config_sizes, count_params

# Elementwise operations per element: the book's one convention (exp, rsqrt, sigmoid = one op each).
SOFTMAX_OPS_PER_ELEMENT = 5  # max compare, subtract the max, exp, add into the sum, divide
SOFTMAX_BACKWARD_OPS_PER_ELEMENT = 4  # dy*y, add into the row sum <dy, y>, subtract it, times y
ATTENTION_SCALE_OPS_PER_SCORE = 1  # scores * 1/sqrt(d_head), an operation of its own before softmax
RMSNORM_OPS_PER_ELEMENT = 4  # square, add into the sum, times 1/rms, times the gain
RMSNORM_OPS_PER_ROW = 3  # divide the sum by N, add eps, rsqrt
RMSNORM_BACKWARD_OPS_PER_ELEMENT = 9  # xhat, g = dy*w, g*xhat and its row sum, xhat*c, -, *rstd,
#                                       dy*xhat and its sum over rows (dweight)
RMSNORM_BACKWARD_OPS_PER_ROW = 1  # the mean's divide by N
LAYERNORM_OPS_PER_ELEMENT = 7  # add into the mean, subtract it, square, add into the variance,
#                                scale, gain, bias
ROPE_OPS_PER_ELEMENT = 3  # x_even*cos - x_odd*sin: two multiplies and one add per output element
SWIGLU_OPS_PER_HIDDEN = 6  # silu(a) = a * sigmoid(a): 5 (negate, exp, add, divide, times a); * b: 1
RESIDUAL_OPS_PER_ELEMENT = 2  # two residual additions per block
UNARY_CHAIN_OPS_PER_STEP = {
    "fma": 2,  # y = y*a + b: one fused multiply-add, 2 FLOPs
    "cos": 1,  # y = cos(y): many instructions, counted as one "op" (not a FLOP count)
}
"""Arithmetic per element per step of the elementwise chain of `mlsys.kernels.elementwise`."""


def matmul_flops(m: int, n: int, k: int) -> int:
    """2mnk: C[m, n] = A[m, k] @ B[k, n], one multiply and one add per term of each dot product."""
    checks.positive_ints(m=m, n=n, k=k)
    return 2 * m * n * k


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """Forward of a bias-free linear layer over `tokens` rows: 2 * tokens * d_in * d_out."""
    checks.positive_ints(tokens=tokens, d_in=d_in, d_out=d_out)
    return matmul_flops(tokens, d_out, d_in)


def linear_backward_flops(tokens: int, d_in: int, d_out: int) -> int:
    """Backward = grad input (dY W) + grad weight (dY^T X): two matmuls of the forward's size."""
    return 2 * linear_flops(tokens, d_in, d_out)


# --- row-wise and elementwise kernels (estimates in operations per element) -----------------------


def softmax_flops(rows: int, cols: int) -> int:
    """Row-wise softmax forward over [rows, cols]: SOFTMAX_OPS_PER_ELEMENT (5) per element."""
    checks.positive_ints(rows=rows, cols=cols)
    return SOFTMAX_OPS_PER_ELEMENT * rows * cols


def softmax_backward_flops(rows: int, cols: int) -> int:
    """dx = y * (dy - <dy, y>) per row: SOFTMAX_BACKWARD_OPS_PER_ELEMENT (4) per element."""
    checks.positive_ints(rows=rows, cols=cols)
    return SOFTMAX_BACKWARD_OPS_PER_ELEMENT * rows * cols


def rmsnorm_flops(rows: int, cols: int) -> int:
    """RMSNorm forward over [rows, cols]: 4 per element and 3 per row (/N, +eps, rsqrt)."""
    checks.positive_ints(rows=rows, cols=cols)
    return RMSNORM_OPS_PER_ELEMENT * rows * cols + RMSNORM_OPS_PER_ROW * rows


def rmsnorm_backward_flops(rows: int, cols: int) -> int:
    """RMSNorm backward (dx and dweight) over [rows, cols]: 9 per element and 1 per row."""
    checks.positive_ints(rows=rows, cols=cols)
    return RMSNORM_BACKWARD_OPS_PER_ELEMENT * rows * cols + RMSNORM_BACKWARD_OPS_PER_ROW * rows


def layernorm_flops(rows: int, cols: int) -> int:
    """LayerNorm forward over [rows, cols]: LAYERNORM_OPS_PER_ELEMENT (7) per element."""
    checks.positive_ints(rows=rows, cols=cols)
    return LAYERNORM_OPS_PER_ELEMENT * rows * cols


def repeat_unary_flops(n_elements: int, k: int, op: str = "fma") -> int:
    """A unary op applied k times to n elements: fma 2 FLOPs, cos 1 op, per element per step."""
    n = checks.nonnegative_int(n_elements, "n_elements")
    steps = checks.nonnegative_int(k, "k")
    return UNARY_CHAIN_OPS_PER_STEP[checks.choice(op, "op", UNARY_CHAIN_OPS_PER_STEP)] * steps * n


def scaled_dot_product_flops(batch: int, heads: int, seq: int, d_head: int) -> int:
    """softmax(Q K^T / sqrt(d_head)) V, non-causal: the two matmuls (2 * 2 * seq^2 * d_head per
    head), the scale (1 per score) and the softmax (5 per score)."""
    checks.positive_ints(batch=batch, heads=heads, seq=seq, d_head=d_head)
    scores = batch * heads * seq * seq
    matmuls = 2 * batch * heads * matmul_flops(seq, seq, d_head)  # Q K^T and P V
    softmax = softmax_flops(batch * heads * seq, seq)
    return matmuls + ATTENTION_SCALE_OPS_PER_SCORE * scores + softmax


# --- the transformer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one transformer block for a (batch, seq) input."""

    q_proj: int
    k_proj: int
    v_proj: int
    o_proj: int
    attention_scores: int  # Q K^T over all heads: 2 * batch * seq^2 * d_model
    attention_values: int  # P V over all heads: 2 * batch * seq^2 * d_model
    ffn_w1: int
    ffn_w3: int
    ffn_w2: int
    # estimates of elementwise work (not counted by torch.utils.flop_counter)
    norms: int
    rope: int
    attention_scale: int  # 1 per score: batch * heads * seq^2
    softmax: int  # 5 per score: batch * heads * seq^2
    swiglu_gate: int
    residual: int

    MATMUL_TERMS = ("q_proj", "k_proj", "v_proj", "o_proj", "attention_scores", "attention_values",
                    "ffn_w1", "ffn_w3", "ffn_w2")  # fmt: skip
    ELEMENTWISE_TERMS = ("norms", "rope", "attention_scale", "softmax", "swiglu_gate", "residual")

    @property
    def matmul_flops(self) -> int:
        return sum(getattr(self, name) for name in self.MATMUL_TERMS)

    @property
    def elementwise_flops(self) -> int:
        return sum(getattr(self, name) for name in self.ELEMENTWISE_TERMS)

    @property
    def attention_flops(self) -> int:
        """Matmul FLOPs of the attention sub-layer (projections, scores, weighted values)."""
        return sum(getattr(self, n) for n in self.MATMUL_TERMS[:6])

    @property
    def ffn_flops(self) -> int:
        return self.ffn_w1 + self.ffn_w3 + self.ffn_w2

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def layer_flops(cfg, batch: int, seq: int) -> LayerFlops:
    """Per-component forward FLOPs of one block of `cfg` at this batch and sequence length."""
    d, n_heads, f = config_sizes(cfg, "d_model", "n_heads", "d_ff")
    checks.positive_ints(batch=batch, seq=seq)
    tokens, scores = batch * seq, batch * n_heads * seq * seq
    proj = linear_flops(tokens, d, d)
    return LayerFlops(
        q_proj=proj,
        k_proj=proj,
        v_proj=proj,
        o_proj=proj,
        # per head: 2 * seq * seq * d_head; summed over heads d_head * heads = d_model
        attention_scores=2 * batch * seq * seq * d,
        attention_values=2 * batch * seq * seq * d,
        ffn_w1=linear_flops(tokens, d, f),
        ffn_w3=linear_flops(tokens, d, f),
        ffn_w2=linear_flops(tokens, f, d),
        norms=2 * RMSNORM_OPS_PER_ELEMENT * tokens * d,
        rope=2 * ROPE_OPS_PER_ELEMENT * tokens * d,  # on q and on k
        attention_scale=ATTENTION_SCALE_OPS_PER_SCORE * scores,
        softmax=SOFTMAX_OPS_PER_ELEMENT * scores,
        swiglu_gate=SWIGLU_OPS_PER_HIDDEN * tokens * f,
        residual=RESIDUAL_OPS_PER_ELEMENT * tokens * d,
    )


@dataclass(frozen=True)
class ModelFlops:
    """Forward FLOPs of the whole model for a (batch, seq) input, and derived training totals."""

    batch: int
    seq: int
    n_layers: int
    layer: LayerFlops
    final_norm: int
    lm_head: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def forward_matmul_flops(self) -> int:
        """What `torch.utils.flop_counter` counts for the forward (the embedding lookup costs 0)."""
        return self.n_layers * self.layer.matmul_flops + self.lm_head

    @property
    def forward_flops(self) -> int:
        """Matmuls plus the elementwise estimates."""
        elementwise = self.n_layers * self.layer.elementwise_flops + self.final_norm
        return self.forward_matmul_flops + elementwise

    @property
    def training_matmul_flops(self) -> int:
        """Forward + backward of the matmuls: exactly 3x the forward (backward = 2x)."""
        return 3 * self.forward_matmul_flops

    @property
    def training_flops(self) -> int:
        """Forward + backward, the elementwise backward taken as 2x its forward (an estimate)."""
        return 3 * self.forward_flops

    def module_flops(self) -> dict[str, int]:
        """Forward matmul FLOPs by module path of `mlsys.models.transformer.Transformer`, as the
        counter names them ("blocks.0.attn.q_proj", ..., "lm_head")."""
        out: dict[str, int] = {}
        lf = self.layer
        for i in range(self.n_layers):
            p = f"blocks.{i}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{p}.attn.{proj}"] = getattr(lf, proj)
            out[f"{p}.attn"] = lf.attention_flops
            for w in ("w1", "w3", "w2"):
                out[f"{p}.ffn.{w}"] = getattr(lf, f"ffn_{w}")
            out[f"{p}.ffn"] = lf.ffn_flops
            out[p] = lf.matmul_flops
        out["lm_head"] = self.lm_head
        return out


def transformer_flops(cfg, batch: int, seq: int) -> ModelFlops:
    """Forward FLOP breakdown of the book's transformer (conventions: the module docstring)."""
    vocab, d, n_layers = config_sizes(cfg, "vocab_size", "d_model", "n_layers")
    checks.positive_ints(batch=batch, seq=seq)
    tokens = batch * seq
    return ModelFlops(
        batch=batch,
        seq=seq,
        n_layers=n_layers,
        layer=layer_flops(cfg, batch, seq),
        final_norm=RMSNORM_OPS_PER_ELEMENT * tokens * d,
        lm_head=linear_flops(tokens, d, vocab),
    )


def training_flops_per_token(cfg, seq: int) -> float:
    """Detailed forward + backward matmul FLOPs per token at sequence length `seq`.

    = 6 * N_matmul + 12 * n_layers * seq * d_model, where N_matmul counts the parameters used in
    matmuls (all but the embedding table and the norm gains) and the second term is attention.
    """
    return transformer_flops(cfg, 1, seq).training_matmul_flops / seq


def attention_share(cfg, seq: int) -> float:
    """Fraction of the forward matmul FLOPs spent on attention scores and weighted values at `seq`
    (the part that grows with seq^2); one half near seq = N_matmul / (2 n_layers d_model)."""
    mf = transformer_flops(cfg, 1, seq)
    attention = mf.n_layers * (mf.layer.attention_scores + mf.layer.attention_values)
    return attention / mf.forward_matmul_flops


def six_n_ratio(cfg, seq: int) -> float:
    """Detailed training FLOPs per token / the 6N rule (N = every parameter) at sequence `seq`."""
    return training_flops_per_token(cfg, seq) / six_n_flops_per_token(count_params(cfg))


SHARE_GROUPS: dict[str, tuple[str, ...]] = {
    "q, k, v projections": ("q_proj", "k_proj", "v_proj"),
    "attention scores QKᵀ": ("attention_scores",),
    "attention values PV": ("attention_values",),
    "output projection": ("o_proj",),
    "SwiGLU (3 matrices)": ("ffn_w1", "ffn_w3", "ffn_w2"),
}
"""How `forward_shares` groups the matmul terms of a block."""


def forward_shares(cfg, seq: int) -> dict[str, float]:
    """Where one sequence's forward FLOPs go: each group of `SHARE_GROUPS` over all layers, the
    output head and the elementwise estimates, as fractions that sum to 1."""
    mf = transformer_flops(cfg, 1, seq)
    terms = mf.layer.as_dict()
    shares = {group: mf.n_layers * sum(terms[t] for t in names) / mf.forward_flops
              for group, names in SHARE_GROUPS.items()}
    shares["output head"] = mf.lm_head / mf.forward_flops
    elementwise = mf.forward_flops - mf.forward_matmul_flops
    shares["elementwise (estimate)"] = elementwise / mf.forward_flops
    return shares


def six_n_flops_per_token(n_params: int) -> int:
    """The rule of thumb: 6N training FLOPs per token (forward 2N, backward 4N), no attention."""
    return 6 * checks.positive_int(n_params, "n_params")


# --- formulas as commonly shared, kept so the book can check them against the counter -------------


def claimed_linear_flops(batch: int, d_in: int, d_out: int) -> int:
    """As often written: 2 * B * D_in * D_out. Right per token; a sequence needs the factor seq."""
    checks.positive_ints(batch=batch, d_in=d_in, d_out=d_out)
    return 2 * batch * d_in * d_out


def claimed_attention_flops(batch: int, seq: int, d_model: int, heads: int) -> int:
    """As often written: 2 * B * S * D * (4D + 2 * S * H). The S^2 term should be 2S, not 2SH."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model, heads=heads)
    return 2 * batch * seq * d_model * (4 * d_model + 2 * seq * heads)


def claimed_ffn_flops(batch: int, seq: int, d_model: int, d_ff: int) -> int:
    """As often written: 4 * B * S * D * D_ff. Right for a two-matrix MLP; SwiGLU has three
    matrices: 6 * B * S * D * D_ff."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model, d_ff=d_ff)
    return 4 * batch * seq * d_model * d_ff
