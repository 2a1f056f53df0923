"""Configuration of the book's decoder-only language model, and its named presets.

Pure Python (no torch import): the accounting functions take a `TransformerConfig` to count
parameters, FLOPs and bytes for a model that is never built. The presets follow the model-size
table of Stanford CS336 (2025), assignment 2, whose sizes are those of GPT-2 small ... XL plus a
2.7B model, with a 10,000-token vocabulary and a context of 1,024 tokens. The default (`debug`)
runs on a CPU in milliseconds.

Used in: §sec-tensors-memory (chapter 02) and every chapter that builds or costs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mlsys import checks

ATTENTION_BACKENDS: tuple[str, ...] = ("naive", "sdpa", "flash_torch", "flash_triton")
"""The names of the attention implementations (their functions: `mlsys.models.attention.BACKENDS`,
so this file stays torch-free). The model's `attention` field takes any of these names; a backend
is chosen explicitly, never swapped quietly. Each is causal, (batch, heads, seq, d_head) in and
out: "naive" writes the scores out, "sdpa" is PyTorch's fused kernel, "flash_torch"
FlashAttention-2 tiled in PyTorch, "flash_triton" the Triton kernels (a CUDA GPU, or the CPU under
Triton's interpreter; d_head 16 to 128, a power of two)."""

_SIZE_FIELDS = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff")

MLP_KINDS: tuple[str, ...] = ("swiglu", "gelu", "relu")
"""The feed-forward kinds: "swiglu" is w2(silu(w1 x) * w3 x), three d_model x d_ff matrices
(Llama, Mistral, Qwen); "gelu" and "relu" are w2(act(w1 x)), two (GPT-2, GPT-3, OPT, BLOOM)."""
NORM_KINDS: tuple[str, ...] = ("rmsnorm", "layernorm")
"""RMSNorm has a gain (d parameters); LayerNorm a gain and a bias (2 d)."""
POSITION_KINDS: tuple[str, ...] = ("rope", "learned")
"""RoPE has no parameters; learned positions are a context_length x d_model table (GPT)."""


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a pre-norm decoder LM; defaults = `debug` (RMSNorm, RoPE, SwiGLU, multi-head
    attention, untied head, no biases, dense). The fields after `attention` describe the models
    the planner costs (GPT-3's LayerNorm, biases, GeLU and learned positions; Llama's grouped-query
    attention; Mixtral's experts); the runnable `Transformer` builds every one of them but the
    experts (`n_experts > 0` is costed, not built)."""

    vocab_size: int = 1_000  # tokens in the vocabulary (rows of the embedding, columns of the head)
    context_length: int = 128  # longest sequence the model accepts; the RoPE tables' length
    d_model: int = 64  # width of the residual stream
    n_layers: int = 2  # number of transformer blocks
    n_heads: int = 4  # attention heads; each has d_head = d_model / n_heads dimensions
    d_ff: int = 176  # hidden width of the SwiGLU feed-forward (about 8/3 d_model, rounded to 16)
    rope_theta: float = 10_000.0  # RoPE base: pair i rotates by position * theta ** (-2i / d_head)
    norm_eps: float = 1e-5  # added to the mean square inside RMSNorm
    attention: str = "naive"  # a name in ATTENTION_BACKENDS: "naive", "sdpa", "flash_torch", ...
    n_kv_heads: int | None = None  # key/value heads (GQA); None = n_heads (MHA), 1 = MQA
    mlp: str = "swiglu"  # a name in MLP_KINDS; d_ff is the hidden width of either kind
    norm: str = "rmsnorm"  # a name in NORM_KINDS
    positions: str = "rope"  # a name in POSITION_KINDS
    tie_embeddings: bool = False  # the head reuses the embedding matrix (GPT-2, Megatron's GPT)
    bias: bool = False  # every linear layer has a bias (GPT-2, GPT-3, OPT, BLOOM)
    n_experts: int = 0  # routed experts per MoE layer; 0 = a dense feed-forward (no MoE)
    experts_per_token: int = 0  # top-k experts each token is routed to (>= 1 when n_experts > 0)
    d_ff_expert: int | None = None  # an expert's hidden width; None = d_ff
    n_shared_experts: int = 0  # experts every token passes through besides its top-k

    def __post_init__(self) -> None:
        for name in _SIZE_FIELDS:
            checks.positive_int(getattr(self, name), name)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}): "
                f"{self.d_model} / {self.n_heads} = {self.d_model / self.n_heads:g}"
            )
        if self.d_head % 2 != 0:
            raise ValueError(
                f"d_head = d_model / n_heads = {self.d_model} / {self.n_heads} = {self.d_head} "
                "must be even (RoPE rotates pairs of dimensions)"
            )
        for name in ("rope_theta", "norm_eps"):
            checks.positive(getattr(self, name), name)
        checks.choice(self.attention, "attention", ATTENTION_BACKENDS)
        checks.choice(self.mlp, "mlp", MLP_KINDS)
        checks.choice(self.norm, "norm", NORM_KINDS)
        checks.choice(self.positions, "positions", POSITION_KINDS)
        for name in ("tie_embeddings", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.n_kv_heads is not None:
            checks.positive_int(self.n_kv_heads, "n_kv_heads")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                                 f"({self.n_kv_heads}): each key/value head serves "
                                 "n_heads / n_kv_heads query heads")
        checks.nonnegative_int(self.n_experts, "n_experts")
        checks.nonnegative_int(self.experts_per_token, "experts_per_token")
        checks.nonnegative_int(self.n_shared_experts, "n_shared_experts")
        if self.d_ff_expert is not None:
            checks.positive_int(self.d_ff_expert, "d_ff_expert")
        if self.n_experts and not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be in 1.."
                             f"n_experts ({self.n_experts}) for a mixture of experts")
        if not self.n_experts and (self.experts_per_token or self.n_shared_experts
                                   or self.d_ff_expert is not None):
            raise ValueError("experts_per_token, n_shared_experts and d_ff_expert need "
                             f"n_experts >= 1, got n_experts = {self.n_experts}")

    @property
    def d_head(self) -> int:
        """Dimensions per attention head: d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when it is None (multi-head attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def expert_d_ff(self) -> int:
        """An expert's hidden width: d_ff_expert, or d_ff when it is None."""
        return self.d_ff if self.d_ff_expert is None else self.d_ff_expert

    @property
    def is_moe(self) -> bool:
        """True when the feed-forward is a mixture of experts (n_experts >= 1)."""
        return self.n_experts > 0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """The named preset (see `PRESETS`), with any field replaced by `overrides`.

        `TransformerConfig.preset("small", attention="sdpa")`; unknown names raise ValueError.
        """
        checks.choice(name, "preset", PRESETS)
        known_fields = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known_fields)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s) {unknown}; "
                             f"known: {sorted(known_fields)}")
        return cls(**{**PRESETS[name], **overrides})


def _cs336(d_model: int, d_ff: int, n_layers: int, n_heads: int) -> dict[str, int]:
    return dict(vocab_size=10_000, context_length=1_024, d_model=d_model, d_ff=d_ff,
                n_layers=n_layers, n_heads=n_heads)


PRESETS: dict[str, dict[str, Any]] = {
    # tiny, for CPU tests and smoke runs (= the dataclass defaults)
    "debug": dict(vocab_size=1_000, context_length=128, d_model=64, d_ff=176, n_layers=2,
                  n_heads=4),
    # a few tens of milliseconds per training step on a laptop CPU: the chapters' cpu profile
    "laptop": dict(vocab_size=4_096, context_length=256, d_model=256, d_ff=1_024, n_layers=4,
                   n_heads=4),
    # CS336 assignment-2 model table (d_ff = 4 d_model for every standard size)
    "small": _cs336(d_model=768, d_ff=3_072, n_layers=12, n_heads=12),
    "medium": _cs336(d_model=1_024, d_ff=4_096, n_layers=24, n_heads=16),
    "large": _cs336(d_model=1_280, d_ff=5_120, n_layers=36, n_heads=20),
    "xl": _cs336(d_model=1_600, d_ff=6_400, n_layers=48, n_heads=25),
    "2.7B": _cs336(d_model=2_560, d_ff=10_240, n_layers=32, n_heads=32),
}
"""Named model sizes: preset name -> TransformerConfig keyword arguments."""
