"""mlsys.models.catalog: every named model counted by mlsys.accounting.params against the
parameter total its source publishes, Megatron's own count formula, and the lookup's refusals."""

import re

import pytest

from mlsys.accounting.params import megatron_gpt_params, param_counts
from mlsys.models.catalog import MEGATRON_TABLE1, NAMED_MODELS, named_config
from mlsys.models.config import TransformerConfig


@pytest.mark.parametrize("name", list(NAMED_MODELS))
def test_every_named_model_counts_its_published_total(name):
    entry = NAMED_MODELS[name]
    cfg = named_config(name)
    assert isinstance(cfg, TransformerConfig)
    total = param_counts(cfg).total
    assert entry.agrees(total), (name, total, entry.published_params, entry.rounding)
    if entry.rounding == 1:  # an exact published count: equal to the parameter
        assert total == entry.published_params
    assert re.search(r"https://\S+", entry.source), name


def test_the_names_and_their_exact_or_rounded_figures():
    megatron = [f"megatron-{b:g}b" for b, *_ in MEGATRON_TABLE1]
    assert list(NAMED_MODELS) == ["llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b",
                                  "mixtral-8x7b", *megatron]
    assert megatron[0] == "megatron-1.7b" and megatron[-1] == "megatron-1008b"
    exact = [name for name, e in NAMED_MODELS.items() if e.rounding == 1]
    assert exact == ["llama3-8b", "llama3-70b", "llama3-405b"]


def test_mixtral_uses_a_quarter_of_its_experts_per_token():
    entry, counts = NAMED_MODELS["mixtral-8x7b"], param_counts(named_config("mixtral-8x7b"))
    assert entry.agrees(counts.active, entry.published_active_params)
    assert not entry.agrees(counts.total, entry.published_active_params)
    assert counts.total > 3.5 * counts.active


@pytest.mark.parametrize(("billions", "heads", "d", "layers"), MEGATRON_TABLE1)
def test_megatron_models_are_megatrons_formula_plus_the_final_layernorm(billions, heads, d,
                                                                       layers):
    cfg = named_config(f"megatron-{billions:g}b")
    assert (cfg.n_heads, cfg.d_model, cfg.n_layers, cfg.d_ff) == (heads, d, layers, 4 * d)
    published = megatron_gpt_params(layers, d, cfg.vocab_size, cfg.context_length)
    assert param_counts(cfg).total == published + 2 * d  # P leaves out the final LayerNorm
    assert round(published / 1e8) / 10 == billions  # Table 1's sizes are P to 0.1B


def test_gpt3s_table_figure_is_nominal():
    entry, total = NAMED_MODELS["gpt3-175b"], param_counts(named_config("gpt3-175b")).total
    assert entry.agrees(total) and entry.rounding == 1_000_000_000
    assert round(total / 1e8) / 10 == 174.6 != 175.0  # Table 2.1's "175.0B" is not to 0.1B
    assert "174.6B" in entry.note


def test_agrees_is_half_a_unit_of_the_last_digit():
    entry = NAMED_MODELS["megatron-1.7b"]
    assert entry.agrees(1_650_000_000) and entry.agrees(1_749_999_999)
    assert not entry.agrees(1_649_999_999) and not entry.agrees(1_750_000_001)
    with pytest.raises(TypeError, match="count must be an integer"):
        entry.agrees(1.7e9)


def test_lookup_overrides_and_refusals():
    assert named_config("llama3-8b", attention="sdpa").attention == "sdpa"
    with pytest.raises(ValueError, match="unknown model name 'llama3-7b'; known: llama3-8b, "):
        named_config("llama3-7b")
    with pytest.raises(ValueError, match="megatron-1008b"):
        named_config(None)
    with pytest.raises(ValueError, match=r"unknown TransformerConfig field\(s\) \['heads'\]"):
        named_config("llama3-8b", heads=8)
