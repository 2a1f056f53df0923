"""Parameter count of the book's transformer (`mlsys.models.transformer`), component by component.

With V = vocab_size, d = d_model, f = d_ff, L = n_layers (no biases anywhere, untied head):

    embedding          V d
    per layer          4 d^2  (attention: q, k, v, o projections, each d x d; RoPE has none)
                     + 3 d f  (SwiGLU feed-forward: w1, w3 are d x f, w2 is f x d)
                     + 2 d    (two RMSNorm gains)
    final norm         d
    lm_head            V d    (untied from the embedding)

The same formula is checked against `sum(p.numel())` of the real module in the tests, so the napkin
math and the model cannot drift apart. Pure Python: the config is duck-typed (anything with
`vocab_size`, `d_model`, `n_layers`, `d_ff` attributes), nothing is imported from `mlsys.models`.

Used in: §sec-tensors-memory (chapter 02), and the FLOP and memory chapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlsys import checks


@dataclass(frozen=True)
class ParamCounts:
    """Parameters per component of the transformer; see `param_counts`."""

    embedding: int  # token embedding, vocab_size x d_model
    attention_per_layer: int  # q, k, v, o projections of one block
    ffn_per_layer: int  # w1, w2, w3 of one block's SwiGLU
    norms_per_layer: int  # the two RMSNorm gains of one block
    final_norm: int  # the RMSNorm after the last block
    lm_head: int  # output projection, d_model x vocab_size
    n_layers: int

    @property
    def per_layer(self) -> int:
        """Parameters of one transformer block."""
        return self.attention_per_layer + self.ffn_per_layer + self.norms_per_layer

    @property
    def total(self) -> int:
        """Every parameter of the model: `sum(p.numel() for p in model.parameters())`."""
        return self.embedding + self.n_layers * self.per_layer + self.final_norm + self.lm_head

    @property
    def non_embedding(self) -> int:
        """Parameters outside the two vocabulary-sized matrices: total - embedding - lm_head.

        Convention: like Kaplan et al. (2020), the vocabulary matrices are left out, so the count
        depends only on the blocks (and the final norm). Kaplan's models tie the head to the
        embedding; ours is untied, and we leave out both. Note that the head, unlike the embedding
        lookup, still costs FLOPs: for FLOP estimates use `matmul`.
        """
        return self.total - self.embedding - self.lm_head

    @property
    def matmul(self) -> int:
        """Parameters used in matmuls (each costs 2 FLOPs per token forward): every linear weight.

        total - embedding (a lookup) - norm gains (elementwise); the N of a detailed 6N count.
        """
        return self.total - self.embedding - self.n_layers * self.norms_per_layer - self.final_norm

    def as_dict(self) -> dict[str, int]:
        """Whole-model totals per component, in model order; the values sum to `total`."""
        return {
            "embedding": self.embedding,
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


def param_counts(cfg: Any) -> ParamCounts:
    """Parameter counts per component for `cfg` (needs vocab_size, d_model, n_layers, d_ff)."""
    vocab, d, f, n_layers = config_sizes(cfg, "vocab_size", "d_model", "d_ff", "n_layers")
    return ParamCounts(
        embedding=vocab * d,
        attention_per_layer=4 * d * d,
        ffn_per_layer=3 * d * f,
        norms_per_layer=2 * d,
        final_norm=d,
        lm_head=d * vocab,
        n_layers=n_layers,
    )


def count_params(cfg: Any) -> int:
    """Total parameters of the transformer described by `cfg` (e.g. 128,625,408 for "small")."""
    return param_counts(cfg).total
