"""Parameter count of the book's transformer (`mlsys.models.transformer`), component by component.

With V = vocab_size, d = d_model, f = d_ff, L = n_layers, and the book's defaults (no biases,
untied head, RMSNorm, RoPE, SwiGLU, multi-head attention, dense):

    embedding          V d
    per layer          4 d^2  (attention: q, k, v, o projections, each d x d; RoPE has none)
                     + 3 d f  (SwiGLU feed-forward: w1, w3 are d x f, w2 is f x d)
                     + 2 d    (two RMSNorm gains)
    final norm         d
    lm_head            V d    (untied from the embedding)

The other architectures of `TransformerConfig` change single terms (h = d_head, g = kv_heads):

    grouped-query attention   k and v are d x g h each: attention = 2 d^2 + 2 d g h
    GeLU / ReLU MLP           2 d f (w1, w2) instead of 3 d f
    biases                    + 2 d + 2 g h (q, k, v, o) + f + d (GeLU) or 2 f + d (SwiGLU) per
                              layer; the router and the head have none (GPT-2, OPT, Megatron)
    LayerNorm                 2 d per norm (gain and bias) instead of d
    learned positions         + context_length x d (the table, next to the embedding)
    tied embeddings           lm_head = 0: the head reuses the embedding (counted once)
    mixture of experts        feed-forward = router d x E + E experts + S shared experts, each
                              an MLP of width d_ff_expert; a token uses the router, its top-k
                              experts and the shared ones (`ParamCounts.active`)

Megatron-LM's GPT count, P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)) (Narayanan et al.
2021, §5.1), is this one for LayerNorm, GeLU, d_ff = 4h, biases, learned positions and a tied head,
less the final LayerNorm's 2h (tested). The same formula is checked against `sum(p.numel())` of
the real module in the tests, so the napkin math and the model cannot drift apart. Pure Python:
the config is duck-typed (anything with `vocab_size`, `d_model`, `n_layers`, `d_ff`; the
architecture fields of `TransformerConfig` are read where present, the defaults above otherwise),
nothing is imported from `mlsys.models`.

Used in: §sec-tensors-memory (chapter 02), and the FLOP and memory chapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlsys import checks

MLP_MATRICES = {"swiglu": 3, "gelu": 2, "relu": 2}
"""Weight matrices of d_model x d_ff in one feed-forward of each kind (`TransformerConfig.mlp`)."""
NORM_PARAMS_PER_ELEMENT = {"rmsnorm": 1, "layernorm": 2}
"""Parameters per element of the normalized vector: RMSNorm a gain, LayerNorm a gain and a bias."""


@dataclass(frozen=True)
class Architecture:
    """The architecture fields of a config, read once with the book's defaults (`architecture`)."""

    n_heads: int | None  # None when the config has none and attention is multi-head
    kv_dim: int  # width of the k and of the v projection: kv_heads x d_head (d_model for MHA)
    mlp: str  # "swiglu", "gelu" or "relu"
    norm: str  # "rmsnorm" or "layernorm"
    positions: str  # "rope" or "learned"
    tie_embeddings: bool
    bias: bool
    n_experts: int  # 0 = dense
    experts_per_token: int
    expert_d_ff: int
    n_shared_experts: int

    @property
    def mlp_matrices(self) -> int:
        """d_model x d_ff matrices per MLP: 3 for SwiGLU, 2 for GeLU and ReLU."""
        return MLP_MATRICES[self.mlp]

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0


def architecture(cfg: Any) -> Architecture:
    """The architecture of a duck-typed config: `n_kv_heads`, `mlp`, `norm`, `positions`,
    `tie_embeddings`, `bias`, `n_experts`, `experts_per_token`, `d_ff_expert`,
    `n_shared_experts` where the config has them, the book's defaults (MHA, SwiGLU, RMSNorm, RoPE,
    untied, no bias, dense) where it does not; each checked (ValueError / TypeError naming it)."""
    d, f = config_sizes(cfg, "d_model", "d_ff")
    n_kv = getattr(cfg, "n_kv_heads", None)
    n_heads = None
    kv_dim = d
    if n_kv is not None or hasattr(cfg, "n_heads"):
        (n_heads,) = config_sizes(cfg, "n_heads")
    if n_kv is not None:
        n_kv = checks.positive_int(n_kv, "cfg.n_kv_heads")
        if n_heads % n_kv or d % n_heads:
            raise ValueError(f"cfg.n_kv_heads ({n_kv}) must divide cfg.n_heads ({n_heads}), "
                             f"which must divide cfg.d_model ({d})")
        kv_dim = n_kv * (d // n_heads)
    mlp = checks.choice(getattr(cfg, "mlp", "swiglu"), "cfg.mlp", MLP_MATRICES)
    norm = checks.choice(getattr(cfg, "norm", "rmsnorm"), "cfg.norm", NORM_PARAMS_PER_ELEMENT)
    positions = checks.choice(getattr(cfg, "positions", "rope"), "cfg.positions",
                              ("rope", "learned"))
    flags = {}
    for name in ("tie_embeddings", "bias"):
        flags[name] = getattr(cfg, name, False)
        if not isinstance(flags[name], bool):
            raise TypeError(f"cfg.{name} must be True or False, got {flags[name]!r}")
    n_experts = checks.nonnegative_int(getattr(cfg, "n_experts", 0), "cfg.n_experts")
    top_k = checks.nonnegative_int(getattr(cfg, "experts_per_token", 0), "cfg.experts_per_token")
    shared = checks.nonnegative_int(getattr(cfg, "n_shared_experts", 0), "cfg.n_shared_experts")
    d_ff_expert = getattr(cfg, "d_ff_expert", None)
    expert_f = f if d_ff_expert is None else checks.positive_int(d_ff_expert, "cfg.d_ff_expert")
    if n_experts and not 1 <= top_k <= n_experts:
        raise ValueError(f"cfg.experts_per_token ({top_k}) must be in 1..cfg.n_experts "
                         f"({n_experts}) for a mixture of experts")
    return Architecture(n_heads, kv_dim, mlp, norm, positions, flags["tie_embeddings"],
                        flags["bias"], n_experts, top_k if n_experts else 0, expert_f,
                        shared if n_experts else 0)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters per component of the transformer; see `param_counts`.

    Three totals: `total` (every parameter, each counted once: what the model stores),
    `active` (the parameters one token passes through: for a mixture of experts the router, its
    top-k experts and the shared ones; = total for a dense model), and `matmul` / `active_matmul`
    (the linear weights, each costing 2 FLOPs per token forward: the N of a detailed 6N count;
    the head's weight is in them even when it is tied to the embedding)."""

    embedding: int  # token embedding, vocab_size x d_model
    attention_per_layer: int  # q, k, v, o projections of one block (weights and biases)
    ffn_per_layer: int  # one block's MLP; for MoE router + every expert + shared experts
    norms_per_layer: int  # the two norms of one block (RMSNorm gains, or LayerNorm's 2 d each)
    final_norm: int  # the norm after the last block
    lm_head: int  # output projection, d_model x vocab_size; 0 when tied to the embedding
    n_layers: int
    position_embedding: int = 0  # learned positions: context_length x d_model; 0 for RoPE
    ffn_active_per_layer: int | None = None  # per token: router + top-k + shared; None = ffn
    biases_per_layer: int = 0  # the biases inside attention_per_layer and ffn_per_layer
    active_biases_per_layer: int | None = None  # those a token passes through; None = all
    head_weights: int | None = None  # the head's matmul weight, d x V tied or not; None = lm_head

    @property
    def per_layer(self) -> int:
        """Parameters of one transformer block."""
        return self.attention_per_layer + self.ffn_per_layer + self.norms_per_layer

    @property
    def active_per_layer(self) -> int:
        """Parameters of one block that one token passes through (= per_layer when dense)."""
        ffn = self.ffn_per_layer if self.ffn_active_per_layer is None else \
            self.ffn_active_per_layer
        return self.attention_per_layer + ffn + self.norms_per_layer

    @property
    def total(self) -> int:
        """Every parameter of the model: `sum(p.numel() for p in model.parameters())`."""
        return (self.embedding + self.position_embedding + self.n_layers * self.per_layer
                + self.final_norm + self.lm_head)

    @property
    def active(self) -> int:
        """Parameters one token passes through (Mixtral 8x7B: 12.9B of 46.7B); = total if dense."""
        return (self.total - self.n_layers * self.per_layer
                + self.n_layers * self.active_per_layer)

    @property
    def non_embedding(self) -> int:
        """Parameters outside the vocabulary and position matrices: total - embedding -
        position_embedding - lm_head.

        Convention: like Kaplan et al. (2020), the vocabulary and position matrices are left out,
        so the count depends only on the blocks (and the final norm). Kaplan's models tie the head
        to the embedding; ours is untied by default, and we leave out both. Note that the head,
        unlike the embedding lookup, still costs FLOPs: for FLOP estimates use `matmul`.
        """
        return self.total - self.embedding - self.position_embedding - self.lm_head

    @property
    def _head_weights(self) -> int:
        return self.lm_head if self.head_weights is None else self.head_weights

    @property
    def matmul(self) -> int:
        """Parameters used in matmuls (each costs 2 FLOPs per token forward): every linear weight,
        the head's included when it is tied; for a mixture of experts every expert's.

        For the book's model: total - embedding (a lookup) - norm gains (elementwise).
        """
        return self.n_layers * (self.per_layer - self.norms_per_layer
                                - self.biases_per_layer) + self._head_weights

    @property
    def active_matmul(self) -> int:
        """The linear weights one token multiplies: `matmul` with only the router, its top-k
        experts and the shared ones of each MoE layer; the N of 6N for a mixture of experts."""
        biases = self.biases_per_layer if self.active_biases_per_layer is None else \
            self.active_biases_per_layer
        return self.n_layers * (self.active_per_layer - self.norms_per_layer
                                - biases) + self._head_weights

    def as_dict(self) -> dict[str, int]:
        """Whole-model totals per component, in model order; the values sum to `total`
        ("positions" only for learned positions)."""
        out = {"embedding": self.embedding}
        if self.position_embedding:
            out["positions"] = self.position_embedding
        return out | {
            "attention": self.n_layers * self.attention_per_layer,
            "ffn": self.n_layers * self.ffn_per_layer,
            "norms": self.n_layers * self.norms_per_layer + self.final_norm,
            "lm_head": self.lm_head,
        }


def config_sizes(cfg: Any, *names: str) -> tuple[int, ...]:
    """The size fields `names` of a duck-typed config, each checked to be a positive int.

    `config_sizes(cfg, "d_model", "d_ff")`; TypeError naming the first missing attribute.
    """
    checks.attributes(cfg, "cfg", names, example="e.g. a TransformerConfig")
    return tuple(checks.positive_int(getattr(cfg, name), f"cfg.{name}") for name in names)


def mlp_params(d_model: int, d_ff: int, mlp: str = "swiglu", bias: bool = False) -> int:
    """Parameters of one feed-forward (or one expert) of width `d_ff`: 3 d f for SwiGLU, 2 d f
    for GeLU and ReLU, plus its biases (one per output: f per up-projection, d for w2)."""
    checks.positive_ints(d_model=d_model, d_ff=d_ff)
    matrices = MLP_MATRICES[checks.choice(mlp, "mlp", MLP_MATRICES)]
    return matrices * d_model * d_ff + (mlp_biases(d_model, d_ff, mlp) if bias else 0)


def mlp_biases(d_model: int, d_ff: int, mlp: str = "swiglu") -> int:
    """The biases of one feed-forward: d_ff per up-projection (2 for SwiGLU, 1 otherwise) + d."""
    return (MLP_MATRICES[checks.choice(mlp, "mlp", MLP_MATRICES)] - 1) * d_ff + d_model


def param_counts(cfg: Any) -> ParamCounts:
    """Parameter counts per component for `cfg` (needs vocab_size, d_model, n_layers, d_ff; the
    architecture fields of `TransformerConfig` where present, see the module docstring)."""
    vocab, d, f, n_layers = config_sizes(cfg, "vocab_size", "d_model", "d_ff", "n_layers")
    arch = architecture(cfg)
    attn_biases = 2 * d + 2 * arch.kv_dim if arch.bias else 0
    attention = 2 * d * d + 2 * d * arch.kv_dim + attn_biases
    if arch.is_moe:
        expert = mlp_params(d, arch.expert_d_ff, arch.mlp, arch.bias)
        expert_biases = mlp_biases(d, arch.expert_d_ff, arch.mlp) if arch.bias else 0
        router = d * arch.n_experts  # a linear without bias (Mixtral, Switch)
        ffn = router + (arch.n_experts + arch.n_shared_experts) * expert
        ffn_active = router + (arch.experts_per_token + arch.n_shared_experts) * expert
        ffn_biases = (arch.n_experts + arch.n_shared_experts) * expert_biases
        active_ffn_biases = (arch.experts_per_token + arch.n_shared_experts) * expert_biases
    else:
        ffn = ffn_active = mlp_params(d, f, arch.mlp, arch.bias)
        ffn_biases = active_ffn_biases = mlp_biases(d, f, arch.mlp) if arch.bias else 0
    norm = NORM_PARAMS_PER_ELEMENT[arch.norm] * d
    positions = 0
    if arch.positions == "learned":
        (context,) = config_sizes(cfg, "context_length")
        positions = context * d
    return ParamCounts(
        embedding=vocab * d,
        attention_per_layer=attention,
        ffn_per_layer=ffn,
        norms_per_layer=2 * norm,
        final_norm=norm,
        lm_head=0 if arch.tie_embeddings else d * vocab,
        n_layers=n_layers,
        position_embedding=positions,
        ffn_active_per_layer=ffn_active,
        biases_per_layer=attn_biases + ffn_biases,
        active_biases_per_layer=attn_biases + active_ffn_biases,
        head_weights=d * vocab,
    )


def count_params(cfg: Any) -> int:
    """Total parameters of the transformer described by `cfg` (e.g. 128,625,408 for "small")."""
    return param_counts(cfg).total


def megatron_gpt_params(n_layers: int, d_model: int, vocab_size: int, seq: int) -> int:
    """Megatron-LM's count of its GPT models (Narayanan et al. 2021, §5.1):
    P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)), as published (the final LayerNorm's 2h
    left out); the sizes of its Table 1 are this, rounded to 0.1B."""
    checks.positive_ints(n_layers=n_layers, d_model=d_model, vocab_size=vocab_size, seq=seq)
    l, h = n_layers, d_model  # noqa: E741 (the paper's symbols)
    return 12 * l * h * h + 13 * l * h + (vocab_size + seq) * h  # the product expanded: exact
