"""Named models beyond the book's presets, kept as data with their source and published size.

`named_config("llama3-70b")` is the `TransformerConfig` of a published model; `NAMED_MODELS` holds
each one's configuration, where it comes from, and its parameter total as published, with the
rounding of that figure (1 where the source gives an exact count). The tests count every one with
`mlsys.accounting.params` and hold it to the published total, so a wrong field shows.

- Llama 3 8B, 70B, 405B: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (layers, widths,
  heads, 8 KV heads, RoPE base 500,000); vocabulary 128,256 and the exact totals from the model
  cards (the Llama 3.1 releases: same shapes as Llama 3, a context of 131,072).
- GPT-3 175B: Brown et al. 2020, Table 2.1 (96 layers, d_model 12,288, 96 heads, context 2,048)
  and GPT-2's 50,257-token vocabulary; GPT-2's architecture (LayerNorm, GeLU, d_ff = 4 d, biases,
  learned positions, tied head). Its alternating banded sparse attention is not modelled.
- Mixtral 8x7B: Jiang et al. 2024, Table 1; totals from Mistral AI's announcement.
- The ten GPT models of Megatron-LM's Table 1 (Narayanan et al. 2021), the issue's calibration
  models: GPT-2's architecture with vocabulary 51,200 and sequence 2,048.

Pure Python (no torch). Used in: `python -m mlsys plan --model`, chapter 09.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mlsys import checks
from mlsys.models.config import TransformerConfig

LLAMA3_SOURCE = ("Dubey et al. 2024, The Llama 3 Herd of Models, Table 3, "
                 "https://arxiv.org/abs/2407.21783; totals: the model card, "
                 "https://huggingface.co/meta-llama/Llama-3.1-{size}")
GPT3_SOURCE = ("Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 and "
               "abstract, https://arxiv.org/abs/2005.14165")
MIXTRAL_SOURCE = ("Jiang et al. 2024, Mixtral of Experts, Table 1, "
                  "https://arxiv.org/abs/2401.04088; totals: Mistral AI, Mixtral of experts "
                  "(2023), https://mistral.ai/news/mixtral-of-experts")
MEGATRON_SOURCE = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU "
                   "Clusters Using Megatron-LM (SC21), Table 1, https://arxiv.org/abs/2104.04473")

GPT_ARCHITECTURE = dict(mlp="gelu", norm="layernorm", positions="learned", tie_embeddings=True,
                        bias=True)
"""GPT-2's, GPT-3's and Megatron's GPT: LayerNorm, GeLU MLP, learned positions, tied, biases."""
BILLION = 1_000_000_000


@dataclass(frozen=True)
class NamedModel:
    """A published model: its `TransformerConfig` fields and its parameter total as published.

    `published_params` is the figure as the source prints it, in parameters (175.0B ->
    175_000_000_000); `rounding` the unit of its last digit (1: an exact count; 100_000_000: a
    figure to 0.1B). `published_active_params` is the parameters per token of a mixture of
    experts, rounded the same way."""

    config: dict[str, Any]
    source: str
    published_params: int
    rounding: int = 1
    published_active_params: int | None = None
    note: str = ""

    def agrees(self, count: int, published: int | None = None) -> bool:
        """Whether `count` rounds to the published figure: |count - published| <= rounding / 2
        (`published` defaults to `published_params`)."""
        figure = self.published_params if published is None else published
        return 2 * abs(checks.nonnegative_int(count, "count") - figure) <= self.rounding


def _llama3(size: str, d: int, layers: int, heads: int, d_ff: int, total: int) -> NamedModel:
    return NamedModel(
        dict(vocab_size=128_256, context_length=131_072, d_model=d, n_layers=layers,
             n_heads=heads, n_kv_heads=8, d_ff=d_ff, rope_theta=500_000.0),
        LLAMA3_SOURCE.format(size=size), total)


MEGATRON_TABLE1 = (  # published size (B), attention heads, hidden size, layers
    (1.7, 24, 2_304, 24), (3.6, 32, 3_072, 30), (7.5, 32, 4_096, 36), (18.4, 48, 6_144, 40),
    (39.1, 64, 8_192, 48), (76.1, 80, 10_240, 60), (145.6, 96, 12_288, 80),
    (310.1, 128, 16_384, 96), (529.6, 128, 20_480, 105), (1008.0, 160, 25_600, 128),
)
"""The model columns of Narayanan et al. 2021, Table 1 (the parallel columns: the planner's)."""


def _megatron(billions: float, heads: int, d: int, layers: int) -> NamedModel:
    return NamedModel(
        dict(vocab_size=51_200, context_length=2_048, d_model=d, n_layers=layers, n_heads=heads,
             d_ff=4 * d, **GPT_ARCHITECTURE),
        MEGATRON_SOURCE, round(billions * 10) * BILLION // 10, BILLION // 10)


def _megatron_name(billions: float) -> str:
    return f"megatron-{billions:g}b"


NAMED_MODELS: dict[str, NamedModel] = {
    "llama3-8b": _llama3("8B", 4_096, 32, 32, 14_336, 8_030_261_248),
    "llama3-70b": _llama3("70B", 8_192, 80, 64, 28_672, 70_553_706_496),
    "llama3-405b": _llama3("405B", 16_384, 126, 128, 53_248, 405_853_388_800),
    "gpt3-175b": NamedModel(
        dict(vocab_size=50_257, context_length=2_048, d_model=12_288, n_layers=96, n_heads=96,
             d_ff=4 * 12_288, **GPT_ARCHITECTURE),
        GPT3_SOURCE, 175 * BILLION, BILLION,
        note="The abstract's '175 billion'. Table 2.1 prints 175.0B, but its own shapes count "
             "174.6B (12 l d^2 = 173.9B, plus 0.64B of embeddings): the figure is nominal to "
             "1B, not exact to 0.1B."),
    "mixtral-8x7b": NamedModel(
        dict(vocab_size=32_000, context_length=32_768, d_model=4_096, n_layers=32, n_heads=32,
             n_kv_heads=8, d_ff=14_336, rope_theta=1_000_000.0, n_experts=8,
             experts_per_token=2),
        MIXTRAL_SOURCE, 46_700_000_000, BILLION // 10, published_active_params=12_900_000_000,
        note="46.7B parameters in all, 12.9B used per token (router, 2 of 8 experts)."),
    **{_megatron_name(row[0]): _megatron(*row) for row in MEGATRON_TABLE1},
}
"""Named models: name -> `NamedModel` (config fields, source, published total and rounding)."""


def named_config(name: str, **overrides: Any) -> TransformerConfig:
    """The `TransformerConfig` of a model of `NAMED_MODELS`, with any field replaced by
    `overrides` (`named_config("llama3-8b", attention="sdpa")`); ValueError listing the known
    names for an unknown one."""
    if not isinstance(name, str) or name not in NAMED_MODELS:
        raise ValueError(f"unknown model name {name!r}; known: {', '.join(NAMED_MODELS)}")
    unknown = sorted(set(overrides) - {f.name for f in fields(TransformerConfig)})
    if unknown:
        raise ValueError(f"unknown TransformerConfig field(s) {unknown} in the overrides of "
                         f"{name!r}")
    return TransformerConfig(**{**NAMED_MODELS[name].config, **overrides})
