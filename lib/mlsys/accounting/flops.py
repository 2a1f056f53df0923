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
`TransformerConfig`), and its architecture fields where present (`params.architecture`):
grouped-query attention narrows the k and v projections (the scores cost the same per query
head), a GeLU or ReLU MLP has two matrices, LayerNorm, biases and learned positions add
elementwise work, and a mixture of experts runs the router and, per token, its top-k experts and
the shared ones. `block_gemms` gives every matmul of a block as a shape (m, n, k) for a
GEMM-by-GEMM time model; their FLOPs are `layer_flops`'s matmul terms. What a FLOP count becomes
against a peak (MFU, HFU, wall-clock time) is `accounting.utilization`. Over 300 lines: the
per-operation counts, the transformer's built from them, and the widely shared formulas checked
against both read best side by side.
Used in: §sec-flops, §sec-bytes, book page "FLOPs per layer".
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mlsys import checks
from mlsys.accounting.params import architecture, config_sizes, param_counts

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
GELU_OPS_PER_HIDDEN = 5  # 0.5 a (1 + erf(a / sqrt 2)): scale, erf, add 1, times a, times 0.5
RELU_OPS_PER_HIDDEN = 1  # max(a, 0)
BIAS_OPS_PER_OUTPUT = 1  # a linear's bias: one add per output element
POSITION_OPS_PER_ELEMENT = 1  # learned positions: the table's row added to the token's embedding
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
    """Forward FLOPs of one transformer block for a (batch, seq) input.

    For a mixture of experts, ffn_w1, ffn_w3 and ffn_w2 are the experts' matmuls over the tokens
    routed to them (top-k per token) and the shared experts' (every token): each token's share is
    what it multiplies, not every expert's weights."""

    q_proj: int
    k_proj: int  # d_model -> kv_heads * d_head (narrower than q_proj with GQA)
    v_proj: int
    o_proj: int
    attention_scores: int  # Q K^T over all query heads: 2 * batch * seq^2 * d_model
    attention_values: int  # P V over all query heads: 2 * batch * seq^2 * d_model
    ffn_w1: int
    ffn_w3: int  # SwiGLU's value projection; 0 for a GeLU or ReLU MLP
    ffn_w2: int
    # estimates of elementwise work (not counted by torch.utils.flop_counter)
    norms: int
    rope: int  # on q and k; 0 with learned positions
    attention_scale: int  # 1 per score: batch * heads * seq^2
    softmax: int  # 5 per score: batch * heads * seq^2
    swiglu_gate: int  # 0 for a GeLU or ReLU MLP (see mlp_activation)
    residual: int
    # terms of the other architectures: 0 for the book's model, and then left out of as_dict
    router: int = 0  # matmul: d_model -> n_experts per token (MoE)
    mlp_activation: int = 0  # GeLU's or ReLU's activation per hidden unit
    biases: int = 0  # one add per output element of every biased linear
    routing: int = 0  # the router's softmax, and each expert output weighted and summed

    MATMUL_TERMS = ("q_proj", "k_proj", "v_proj", "o_proj", "attention_scores", "attention_values",
                    "ffn_w1", "ffn_w3", "ffn_w2")  # fmt: skip
    ELEMENTWISE_TERMS = ("norms", "rope", "attention_scale", "softmax", "swiglu_gate", "residual")
    EXTRA_MATMUL_TERMS = ("router",)
    EXTRA_ELEMENTWISE_TERMS = ("mlp_activation", "biases", "routing")
    """The terms of architectures beyond the book's model (MoE, GeLU, biases)."""

    @property
    def matmul_flops(self) -> int:
        names = self.MATMUL_TERMS + self.EXTRA_MATMUL_TERMS
        return sum(getattr(self, name) for name in names)

    @property
    def elementwise_flops(self) -> int:
        names = self.ELEMENTWISE_TERMS + self.EXTRA_ELEMENTWISE_TERMS
        return sum(getattr(self, name) for name in names)

    @property
    def attention_flops(self) -> int:
        """Matmul FLOPs of the attention sub-layer (projections, scores, weighted values)."""
        return sum(getattr(self, n) for n in self.MATMUL_TERMS[:6])

    @property
    def ffn_flops(self) -> int:
        """Matmul FLOPs of the feed-forward: the MLP's, or the router's and the experts'."""
        return self.ffn_w1 + self.ffn_w3 + self.ffn_w2 + self.router

    def as_dict(self) -> dict[str, int]:
        """Every term of the book's model, and the other terms where they are not 0."""
        extras = self.EXTRA_MATMUL_TERMS + self.EXTRA_ELEMENTWISE_TERMS
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in extras or getattr(self, f.name)}


@dataclass(frozen=True)
class Gemm:
    """One matmul of a block's forward: `count` independent products C[m, n] = A[m, k] @ B[k, n],
    2 m n k FLOPs each.

    `groups` > 1 (the experts of a MoE layer): dimension `split` ("m" in the forward: the tokens
    routed to every expert together) is divided among `groups` products, m / groups rows each on
    average (balanced routing); the FLOPs are the same however it divides."""

    name: str  # the `LayerFlops` term it belongs to ("q_proj", ..., "ffn_w2", "router")
    m: int
    n: int
    k: int
    count: int = 1  # independent products of this shape (batch x heads for attention)
    groups: int = 1  # products dividing dimension `split` among them (experts); 1 for one
    split: str = "m"  # the dimension the groups divide: "m", or "k" for an expert's grad weight

    @property
    def flops(self) -> int:
        return self.count * matmul_flops(self.m, self.n, self.k)

    def backward(self) -> tuple[Gemm, Gemm]:
        """The backward's two products: grad A = dC B^T, shape (m, k, n), and grad B = A^T dC,
        shape (k, n, m) (for experts, each expert's weight gradient contracts its own rows:
        split "k"); each costs the forward's FLOPs."""
        moved = {"m": "k", "k": "m"}[self.split]
        return (Gemm(self.name, self.m, self.k, self.n, self.count, self.groups, self.split),
                Gemm(self.name, self.k, self.n, self.m, self.count, self.groups, moved))


def block_gemms(cfg, batch: int, seq: int) -> tuple[Gemm, ...]:
    """Every matmul of one block's forward of `cfg` at (batch, seq), as shapes, in model order:
    q, k, v, o projections (tokens x d_model @ d_model x width), the scores and the weighted
    values (seq x d_head @ d_head x seq, and seq x seq @ seq x d_head, batch x n_heads times,
    non-causal), then the MLP, or the router, the routed experts (tokens x top_k rows over
    n_experts groups) and the shared experts (tokens x n_shared rows). Their FLOPs are the
    matmul terms of `layer_flops` (tested), for a GEMM-by-GEMM time model."""
    d, n_heads, f = config_sizes(cfg, "d_model", "n_heads", "d_ff")
    arch = architecture(cfg)
    checks.positive_ints(batch=batch, seq=seq)
    tokens, d_head = batch * seq, d // n_heads
    out = [Gemm("q_proj", tokens, d, d), Gemm("k_proj", tokens, arch.kv_dim, d),
           Gemm("v_proj", tokens, arch.kv_dim, d), Gemm("o_proj", tokens, d, d),
           Gemm("attention_scores", seq, seq, d_head, batch * n_heads),
           Gemm("attention_values", seq, d_head, seq, batch * n_heads)]
    up = ("ffn_w1", "ffn_w3") if arch.mlp == "swiglu" else ("ffn_w1",)
    if not arch.is_moe:
        return (*out, *(Gemm(name, tokens, f, d) for name in up), Gemm("ffn_w2", tokens, d, f))
    out.append(Gemm("router", tokens, arch.n_experts, d))
    fe = arch.expert_d_ff
    routed = tokens * arch.experts_per_token
    out += [Gemm(name, routed, fe, d, groups=arch.n_experts) for name in up]
    out.append(Gemm("ffn_w2", routed, d, fe, groups=arch.n_experts))
    if arch.n_shared_experts:
        shared = tokens * arch.n_shared_experts
        out += [Gemm(name, shared, fe, d, groups=arch.n_shared_experts) for name in up]
        out.append(Gemm("ffn_w2", shared, d, fe, groups=arch.n_shared_experts))
    return tuple(out)


def head_gemm(cfg, batch: int, seq: int) -> Gemm:
    """The output head's matmul: tokens x d_model @ d_model x vocab (tied or not)."""
    vocab, d = config_sizes(cfg, "vocab_size", "d_model")
    checks.positive_ints(batch=batch, seq=seq)
    return Gemm("lm_head", batch * seq, vocab, d)


def layer_flops(cfg, batch: int, seq: int) -> LayerFlops:
    """Per-component forward FLOPs of one block of `cfg` at this batch and sequence length."""
    d, n_heads, f = config_sizes(cfg, "d_model", "n_heads", "d_ff")
    arch = architecture(cfg)
    checks.positive_ints(batch=batch, seq=seq)
    tokens, scores = batch * seq, batch * n_heads * seq * seq
    matmuls = dict.fromkeys(("ffn_w1", "ffn_w3", "ffn_w2", "router"), 0)
    for gemm in block_gemms(cfg, batch, seq):
        matmuls[gemm.name] = matmuls.get(gemm.name, 0) + gemm.flops
    # hidden units each token computes, and biased outputs: the MLP's, or its experts'
    mlps = arch.experts_per_token + arch.n_shared_experts if arch.is_moe else 1
    hidden = tokens * mlps * (arch.expert_d_ff if arch.is_moe else f)
    up_widths = arch.mlp_matrices - 1  # f-wide outputs of the up-projections per hidden unit
    norm_ops = RMSNORM_OPS_PER_ELEMENT if arch.norm == "rmsnorm" else LAYERNORM_OPS_PER_ELEMENT
    activation = GELU_OPS_PER_HIDDEN if arch.mlp == "gelu" else RELU_OPS_PER_HIDDEN
    biased = tokens * (2 * d + 2 * arch.kv_dim) + up_widths * hidden + tokens * mlps * d
    routing = 0
    if arch.is_moe:  # softmax over the experts; each expert output scaled and added (2 per element)
        routing = softmax_flops(tokens, arch.n_experts) + 2 * tokens * mlps * d
    return LayerFlops(
        q_proj=matmuls["q_proj"],
        k_proj=matmuls["k_proj"],
        v_proj=matmuls["v_proj"],
        o_proj=matmuls["o_proj"],
        # per head: 2 * seq * seq * d_head; summed over query heads d_head * heads = d_model
        attention_scores=matmuls["attention_scores"],
        attention_values=matmuls["attention_values"],
        ffn_w1=matmuls["ffn_w1"],
        ffn_w3=matmuls["ffn_w3"],
        ffn_w2=matmuls["ffn_w2"],
        norms=2 * norm_ops * tokens * d,
        rope=ROPE_OPS_PER_ELEMENT * tokens * (d + arch.kv_dim) if arch.positions == "rope" else 0,
        attention_scale=ATTENTION_SCALE_OPS_PER_SCORE * scores,
        softmax=SOFTMAX_OPS_PER_ELEMENT * scores,
        swiglu_gate=SWIGLU_OPS_PER_HIDDEN * hidden if arch.mlp == "swiglu" else 0,
        residual=RESIDUAL_OPS_PER_ELEMENT * tokens * d,
        router=matmuls["router"],
        mlp_activation=0 if arch.mlp == "swiglu" else activation * hidden,
        biases=BIAS_OPS_PER_OUTPUT * biased if arch.bias else 0,
        routing=routing,
    )


@dataclass(frozen=True)
class ModelFlops:
    """Forward FLOPs of the whole model for a (batch, seq) input, and derived training totals."""

    batch: int
    seq: int
    n_layers: int
    layer: LayerFlops
    final_norm: int
    lm_head: int  # the head's matmul, tied to the embedding or not
    positions: int = 0  # learned positions: the table's rows added to the embeddings
    ffn_modules: tuple[str, ...] = ("w1", "w3", "w2")  # the MLP's linears, as the model names them

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
        return self.forward_matmul_flops + elementwise + self.positions

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
        counter names them ("blocks.0.attn.q_proj", ..., "lm_head"); a mixture of experts, which
        the model does not build, has its feed-forward as "blocks.<i>.ffn" only."""
        out: dict[str, int] = {}
        lf = self.layer
        for i in range(self.n_layers):
            p = f"blocks.{i}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{p}.attn.{proj}"] = getattr(lf, proj)
            out[f"{p}.attn"] = lf.attention_flops
            for w in self.ffn_modules:
                out[f"{p}.ffn.{w}"] = getattr(lf, f"ffn_{w}")
            out[f"{p}.ffn"] = lf.ffn_flops
            out[p] = lf.matmul_flops
        out["lm_head"] = self.lm_head
        return out


def transformer_flops(cfg, batch: int, seq: int) -> ModelFlops:
    """Forward FLOP breakdown of the book's transformer (conventions: the module docstring)."""
    vocab, d, n_layers = config_sizes(cfg, "vocab_size", "d_model", "n_layers")
    arch = architecture(cfg)
    checks.positive_ints(batch=batch, seq=seq)
    tokens = batch * seq
    norm_ops = RMSNORM_OPS_PER_ELEMENT if arch.norm == "rmsnorm" else LAYERNORM_OPS_PER_ELEMENT
    if arch.is_moe:
        modules: tuple[str, ...] = ()
    else:
        modules = ("w1", "w3", "w2") if arch.mlp == "swiglu" else ("w1", "w2")
    return ModelFlops(
        batch=batch,
        seq=seq,
        n_layers=n_layers,
        layer=layer_flops(cfg, batch, seq),
        final_norm=norm_ops * tokens * d,
        lm_head=head_gemm(cfg, batch, seq).flops,
        positions=POSITION_OPS_PER_ELEMENT * tokens * d if arch.positions == "learned" else 0,
        ffn_modules=modules,
    )


def training_flops_per_token(cfg, seq: int) -> float:
    """Detailed forward + backward matmul FLOPs per token at sequence length `seq`.

    = 6 * N_matmul + 12 * n_layers * seq * d_model, where N_matmul counts the parameters a token
    multiplies (`params.ParamCounts.active_matmul`: all but the embedding table, the norm gains
    and the biases; of a mixture of experts the router, the top-k and the shared experts) and the
    second term is attention, per query head whatever the key/value heads.
    """
    return transformer_flops(cfg, 1, seq).training_matmul_flops / seq


def attention_share(cfg, seq: int) -> float:
    """Fraction of the forward matmul FLOPs spent on attention scores and weighted values at `seq`
    (the part that grows with seq^2); one half near seq = N_matmul / (2 n_layers d_model)."""
    mf = transformer_flops(cfg, 1, seq)
    attention = mf.n_layers * (mf.layer.attention_scores + mf.layer.attention_values)
    return attention / mf.forward_matmul_flops


def six_n_ratio(cfg, seq: int) -> float:
    """Detailed training FLOPs per token / the 6N rule at sequence `seq`; N = every parameter a
    token passes through (`ParamCounts.active`: every parameter of a dense model)."""
    return training_flops_per_token(cfg, seq) / six_n_flops_per_token(param_counts(cfg).active)


SHARE_GROUPS: dict[str, tuple[str, ...]] = {
    "q, k, v projections": ("q_proj", "k_proj", "v_proj"),
    "attention scores QKᵀ": ("attention_scores",),
    "attention values PV": ("attention_values",),
    "output projection": ("o_proj",),
    "SwiGLU (3 matrices)": ("ffn_w1", "ffn_w3", "ffn_w2"),
}
"""How `forward_shares` groups the matmul terms of a block (the last group named by the MLP:
`FFN_GROUP_NAMES`)."""
FFN_GROUP_NAMES = {"swiglu": "SwiGLU (3 matrices)", "gelu": "GeLU MLP (2 matrices)",
                   "relu": "ReLU MLP (2 matrices)", "moe": "experts and router"}


def forward_shares(cfg, seq: int) -> dict[str, float]:
    """Where one sequence's forward FLOPs go: each group of `SHARE_GROUPS` over all layers (the
    feed-forward's named by `FFN_GROUP_NAMES`), the output head and the elementwise estimates, as
    fractions that sum to 1."""
    mf = transformer_flops(cfg, 1, seq)
    arch = architecture(cfg)
    terms = mf.layer.as_dict()
    ffn_name = FFN_GROUP_NAMES["moe" if arch.is_moe else arch.mlp]
    groups = {g: names for g, names in SHARE_GROUPS.items() if g != "SwiGLU (3 matrices)"}
    groups[ffn_name] = ("ffn_w1", "ffn_w3", "ffn_w2", "router")
    shares = {group: mf.n_layers * sum(terms.get(t, 0) for t in names) / mf.forward_flops
              for group, names in groups.items()}
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
