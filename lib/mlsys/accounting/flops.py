"""FLOP counts of matmuls, linear layers and the book's transformer, per component.

Conventions: one multiply-add = 2 FLOPs, so C[m, n] = A[m, k] @ B[k, n] costs 2mnk. A linear layer's
backward does two matmuls of the forward's size (grad input and grad weight), so forward + backward
= 3x forward for every matmul term. Attention is counted without the causal saving (as written in
`mlsys.models.transformer` and as `torch.utils.flop_counter` counts it: the full seq x seq scores).

Matmul terms are exact and checked against `torch.utils.flop_counter` module by module (tests and
§sec-flops). Elementwise terms (norms, RoPE, softmax, SwiGLU's gate, residual adds) are estimates in
operations per element, stated at each term; the FLOP counter does not count them.

Pure functions; `cfg` is any object with vocab_size, d_model, n_layers, n_heads, d_ff (a
`TransformerConfig`). Used in: §sec-flops, book page "FLOPs per layer".
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mlsys.checks import positive_ints

# Elementwise operations per element, documented estimates (exp, rsqrt, sigmoid counted as one op each).
RMSNORM_OPS_PER_ELEMENT = 4  # square, add into the mean, scale by 1/rms, scale by the gain
LAYERNORM_OPS_PER_ELEMENT = 7  # add into the mean, subtract it, square, add into the variance, scale, gain, bias
ROPE_OPS_PER_ELEMENT = 3  # x_even*cos - x_odd*sin: two multiplies and one add per output element
SOFTMAX_OPS_PER_SCORE = 6  # scale by 1/sqrt(d_head), max, subtract, exp, sum, divide
SWIGLU_OPS_PER_HIDDEN = 6  # silu(a) = a * sigmoid(a) ~ 5 (negate, exp, add, divide, multiply), times b: 1
RESIDUAL_OPS_PER_ELEMENT = 2  # two residual additions per block


def matmul_flops(m: int, n: int, k: int) -> int:
    """2mnk: C[m, n] = A[m, k] @ B[k, n], one multiply and one add per term of each dot product."""
    positive_ints(m=m, n=n, k=k)
    return 2 * m * n * k


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """Forward of a bias-free linear layer over `tokens` rows: 2 * tokens * d_in * d_out."""
    return matmul_flops(tokens, d_out, d_in)


def linear_backward_flops(tokens: int, d_in: int, d_out: int) -> int:
    """Backward = grad input (dY W) + grad weight (dY^T X): two matmuls of the forward's size."""
    return 2 * linear_flops(tokens, d_in, d_out)


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
    softmax: int
    swiglu_gate: int
    residual: int

    MATMUL_TERMS = ("q_proj", "k_proj", "v_proj", "o_proj", "attention_scores", "attention_values",
                    "ffn_w1", "ffn_w3", "ffn_w2")  # fmt: skip

    @property
    def matmul_flops(self) -> int:
        return sum(getattr(self, name) for name in self.MATMUL_TERMS)

    @property
    def elementwise_flops(self) -> int:
        return self.norms + self.rope + self.softmax + self.swiglu_gate + self.residual

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
    positive_ints(batch=batch, seq=seq)
    tokens, d, f = batch * seq, cfg.d_model, cfg.d_ff
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
        softmax=SOFTMAX_OPS_PER_SCORE * batch * cfg.n_heads * seq * seq,
        swiglu_gate=SWIGLU_OPS_PER_HIDDEN * tokens * f,
        residual=RESIDUAL_OPS_PER_ELEMENT * tokens * d,
    )


@dataclass(frozen=True)
class ModelFlops:
    """Forward FLOPs of the whole model for a (batch, seq) input, and the derived training totals."""

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
        return self.forward_matmul_flops + self.n_layers * self.layer.elementwise_flops + self.final_norm

    @property
    def training_matmul_flops(self) -> int:
        """Forward + backward of the matmuls: exactly 3x the forward (backward = 2x)."""
        return 3 * self.forward_matmul_flops

    @property
    def training_flops(self) -> int:
        """Forward + backward, taking the elementwise backward as 2x its forward too (an estimate)."""
        return 3 * self.forward_flops

    def module_flops(self) -> dict[str, int]:
        """Forward matmul FLOPs by module path of `mlsys.models.transformer.Transformer` (as the counter names them)."""
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
    """Forward FLOP breakdown of the book's transformer (see the module docstring for conventions)."""
    positive_ints(batch=batch, seq=seq)
    tokens = batch * seq
    return ModelFlops(
        batch=batch,
        seq=seq,
        n_layers=cfg.n_layers,
        layer=layer_flops(cfg, batch, seq),
        final_norm=RMSNORM_OPS_PER_ELEMENT * tokens * cfg.d_model,
        lm_head=linear_flops(tokens, cfg.d_model, cfg.vocab_size),
    )


def training_flops_per_token(cfg, seq: int) -> float:
    """Detailed forward + backward matmul FLOPs per token at sequence length `seq`.

    = 6 * N_matmul + 12 * n_layers * seq * d_model, where N_matmul counts the parameters used in
    matmuls (everything but the embedding table and the norm gains) and the second term is attention.
    """
    return transformer_flops(cfg, 1, seq).training_matmul_flops / seq


def attention_share(cfg, seq: int) -> float:
    """Fraction of the forward matmul FLOPs spent on attention scores and weighted values at `seq`
    (the part that grows with seq^2); it passes one half near seq = N_matmul / (2 n_layers d_model)."""
    mf = transformer_flops(cfg, 1, seq)
    return mf.n_layers * (mf.layer.attention_scores + mf.layer.attention_values) / mf.forward_matmul_flops


def six_n_flops_per_token(n_params: int) -> int:
    """The rule of thumb: 6N training FLOPs per token (forward 2N, backward 4N), attention ignored."""
    if not isinstance(n_params, int) or n_params <= 0:
        raise ValueError(f"n_params must be a positive integer, got {n_params!r}")
    return 6 * n_params


# --- utilization and time -------------------------------------------------------------------------


def mfu(model_flops: float, seconds: float, peak_flop_per_s: float, n_devices: int = 1) -> float:
    """Model FLOPs utilization: the model's required FLOPs (no recomputation) / (time * peak * devices)."""
    if seconds <= 0 or peak_flop_per_s <= 0 or n_devices < 1:
        raise ValueError(
            f"seconds ({seconds}) and peak_flop_per_s ({peak_flop_per_s}) must be positive, "
            f"n_devices ({n_devices}) >= 1"
        )
    return model_flops / (seconds * peak_flop_per_s * n_devices)


def hfu(hardware_flops: float, seconds: float, peak_flop_per_s: float, n_devices: int = 1) -> float:
    """Hardware FLOPs utilization: like MFU, but counting every FLOP executed (recomputation included)."""
    return mfu(hardware_flops, seconds, peak_flop_per_s, n_devices)


def hardware_training_flops(forward_flops: float, *, recompute: str = "none") -> float:
    """FLOPs executed by one training step: 3x forward, or 4x with full activation recomputation."""
    factors = {"none": 3, "full": 4}
    if recompute not in factors:
        raise ValueError(f"recompute={recompute!r}; expected one of {sorted(factors)}")
    return factors[recompute] * forward_flops


def training_time_s(total_flops: float, n_devices: int, peak_flop_per_s: float, mfu: float) -> float:
    """Wall-clock seconds to execute `total_flops` on `n_devices` at utilization `mfu` of their peak."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    if n_devices < 1 or peak_flop_per_s <= 0 or total_flops < 0:
        raise ValueError(f"n_devices ({n_devices}) >= 1, peak_flop_per_s ({peak_flop_per_s}) > 0, total_flops >= 0")
    return total_flops / (n_devices * peak_flop_per_s * mfu)


# --- formulas as commonly shared, kept here so the book can check them against the counter ----------


def claimed_linear_flops(batch: int, d_in: int, d_out: int) -> int:
    """As often written: 2 * B * D_in * D_out. Right per token; a sequence needs the factor seq too."""
    return 2 * batch * d_in * d_out


def claimed_attention_flops(batch: int, seq: int, d_model: int, heads: int) -> int:
    """As often written: 2 * B * S * D * (4D + 2 * S * H). The S^2 term should be 2 * S, not 2 * S * H."""
    return 2 * batch * seq * d_model * (4 * d_model + 2 * seq * heads)


def claimed_ffn_flops(batch: int, seq: int, d_model: int, d_ff: int) -> int:
    """As often written: 4 * B * S * D * D_ff. Right for a two-matrix MLP; SwiGLU has three: 6 * B * S * D * D_ff."""
    return 4 * batch * seq * d_model * d_ff
