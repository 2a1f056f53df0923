"""Parameter accounting (`mlsys.accounting.params`) against golden counts and the real model."""

import subprocess
import sys

import pytest
import torch

from mlsys.accounting.params import ParamCounts, config_sizes, count_params, param_counts
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import Transformer

# CS336 assignment-2 model table, counted with untied embedding and head, no biases.
GOLDEN_TOTALS = {
    "small": 128_625_408,
    "medium": 423_183_360,
    "large": 969_411_840,
    "xl": 1_998_235_200,
    "2.7B": 3_406_809_600,
}


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def meta_model(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(TransformerConfig.preset(name))


@pytest.mark.parametrize("name", list(GOLDEN_TOTALS))
def test_golden_totals(name):
    assert count_params(TransformerConfig.preset(name)) == GOLDEN_TOTALS[name]


@pytest.mark.parametrize("name", list(PRESETS))
def test_formula_equals_real_model_on_meta(name):
    model = meta_model(name)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert count_params(model.config) == numel(model) == model.num_params()


@pytest.mark.parametrize("name", ["debug", "small"])
def test_components_equal_real_modules(name):
    model = meta_model(name)
    counts = param_counts(model.config)
    block = model.blocks[0]
    assert counts.embedding == numel(model.token_embedding)
    assert counts.attention_per_layer == numel(block.attn)
    assert counts.ffn_per_layer == numel(block.ffn)
    assert counts.norms_per_layer == numel(block.attn_norm) + numel(block.ffn_norm)
    assert counts.per_layer == numel(block)
    assert counts.final_norm == numel(model.final_norm)
    assert counts.lm_head == numel(model.lm_head)
    assert counts.n_layers == len(model.blocks)
    assert numel(model.rope) == 0  # RoPE tables are buffers, not parameters
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    linear_weights = sum(m.weight.numel() for m in linears)
    assert counts.matmul == linear_weights


def test_breakdown_sums_to_total_and_non_embedding_convention():
    counts = param_counts(TransformerConfig.preset("small"))
    parts = counts.as_dict()
    assert list(parts) == ["embedding", "attention", "ffn", "norms", "lm_head"]
    assert sum(parts.values()) == counts.total
    assert counts.non_embedding == counts.total - parts["embedding"] - parts["lm_head"]
    model = meta_model("small")
    assert model.num_params(non_embedding=True) == counts.non_embedding
    blocks_and_final_norm = numel(model.blocks) + numel(model.final_norm)
    assert counts.non_embedding == blocks_and_final_norm


def test_non_embedding_is_16_d_squared_per_layer_when_d_ff_is_4d():
    # With d_ff = 4 d, a block holds 4 d^2 + 12 d^2 + 2 d = 16 d^2 + 2 d parameters (SwiGLU's three
    # matrices make it 16, not GPT-2's 12). Checked exactly, not approximately.
    cfg = TransformerConfig.preset("xl")
    d, n_layers = cfg.d_model, cfg.n_layers
    assert param_counts(cfg).non_embedding == n_layers * (16 * d * d + 2 * d) + d


def test_duck_typed_config_and_bad_input():
    class Sizes:
        vocab_size, d_model, n_layers, d_ff = 10, 4, 1, 8

    counts = param_counts(Sizes())
    assert isinstance(counts, ParamCounts)
    assert counts.total == 10 * 4 + (4 * 16 + 3 * 4 * 8 + 2 * 4) + 4 + 4 * 10

    class NoFeedForward:
        vocab_size, d_model, n_layers = 10, 4, 1

    with pytest.raises(TypeError, match="d_ff"):
        param_counts(NoFeedForward())

    class Bad(Sizes):
        d_model = 0

    with pytest.raises(ValueError, match="d_model"):
        param_counts(Bad())


class Sizes:
    vocab_size, d_model, n_layers, d_ff = 10, 4, 1, 8


def _sizes(**fields):
    return type("Custom", (Sizes,), fields)()


@pytest.mark.parametrize(
    ("cfg", "error", "message"),
    [
        (object(), TypeError, "cfg needs a 'vocab_size' attribute"),
        (None, TypeError, "cfg needs a 'vocab_size' attribute"),
        (dict(PRESETS["debug"]), TypeError, "cfg needs a 'vocab_size' attribute"),
        (_sizes(d_model=0), ValueError, "cfg.d_model must be a positive integer, got 0"),
        (_sizes(d_model=True), TypeError, "cfg.d_model must be an integer, got True"),
        (_sizes(d_ff=4.0), TypeError, "cfg.d_ff must be an integer"),
        (_sizes(vocab_size=-1), ValueError, "cfg.vocab_size must be a positive integer"),
        (_sizes(n_layers="2"), TypeError, "cfg.n_layers must be an integer"),
    ],
)
def test_bad_configs_are_refused(cfg, error, message):
    with pytest.raises(error, match=message):
        count_params(cfg)


def test_config_sizes_reads_only_the_named_fields():
    assert config_sizes(Sizes(), "d_model", "d_ff") == (4, 8)
    with pytest.raises(TypeError, match="cfg needs a 'n_heads' attribute"):
        config_sizes(Sizes(), "n_heads")


def test_accounting_and_config_do_not_import_torch():
    code = (
        "import sys, mlsys.models.config, mlsys.models, mlsys.hardware\n"
        "import mlsys.accounting.params, mlsys.accounting.memory\n"
        "import mlsys.accounting.flops, mlsys.accounting.bytes\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
