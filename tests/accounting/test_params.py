"""Parameter accounting (`mlsys.accounting.params`) against golden counts and the real model."""

import subprocess
import sys

import pytest
import torch

from mlsys.accounting.params import (
    ParamCounts,
    architecture,
    config_sizes,
    count_params,
    megatron_gpt_params,
    mlp_params,
    param_counts,
)
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


# --- the architectures beyond the book's model, against a reference built of torch.nn parts -----


def _mlp(d: int, width: int, kind: str, bias: bool) -> torch.nn.ModuleDict:
    parts = {"w1": torch.nn.Linear(d, width, bias=bias), "w2": torch.nn.Linear(width, d, bias=bias)}
    if kind == "swiglu":
        parts["w3"] = torch.nn.Linear(d, width, bias=bias)
    return torch.nn.ModuleDict(parts)


def reference(cfg: TransformerConfig) -> torch.nn.ModuleDict:
    """The model `cfg` describes, written from torch.nn parts on the meta device: what
    `param_counts` must count, module by module (the tied head is the embedding: not built)."""
    d, kv = cfg.d_model, cfg.kv_heads * cfg.d_head

    def norm():
        if cfg.norm == "layernorm":
            return torch.nn.LayerNorm(d)
        return torch.nn.RMSNorm(d)

    def ffn():
        if not cfg.is_moe:
            return _mlp(d, cfg.d_ff, cfg.mlp, cfg.bias)
        return torch.nn.ModuleDict({
            "router": torch.nn.Linear(d, cfg.n_experts, bias=False),
            "experts": torch.nn.ModuleList(_mlp(d, cfg.expert_d_ff, cfg.mlp, cfg.bias)
                                           for _ in range(cfg.n_experts)),
            "shared": torch.nn.ModuleList(_mlp(d, cfg.expert_d_ff, cfg.mlp, cfg.bias)
                                          for _ in range(cfg.n_shared_experts)),
        })

    with torch.device("meta"):
        widths = {"q": d, "k": kv, "v": kv, "o": d}
        blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "attn": torch.nn.ModuleDict({name: torch.nn.Linear(d, width, bias=cfg.bias)
                                         for name, width in widths.items()}),
            "ffn": ffn(), "attn_norm": norm(), "ffn_norm": norm()}) for _ in range(cfg.n_layers))
        model = {"embedding": torch.nn.Embedding(cfg.vocab_size, d), "blocks": blocks,
                 "final_norm": norm()}
        if cfg.positions == "learned":
            model["positions"] = torch.nn.Embedding(cfg.context_length, d)
        if not cfg.tie_embeddings:
            model["lm_head"] = torch.nn.Linear(d, cfg.vocab_size, bias=False)
        return torch.nn.ModuleDict(model)


def _active(model: torch.nn.ModuleDict, cfg: TransformerConfig) -> int:
    """Parameters one token passes through: every module but the experts it is not routed to."""
    unused = 0
    if cfg.is_moe:
        expert = numel(model["blocks"][0]["ffn"]["experts"][0])
        unused = cfg.n_layers * (cfg.n_experts - cfg.experts_per_token) * expert
    return numel(model) - unused


def _linear_weights(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


VARIANTS = {  # small configs: each architecture field alone, then together
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "gelu": dict(mlp="gelu"),
    "relu": dict(mlp="relu", d_ff=100),
    "layernorm": dict(norm="layernorm"),
    "learned": dict(positions="learned"),
    "tied": dict(tie_embeddings=True),
    "bias": dict(bias=True),
    "gpt": dict(mlp="gelu", norm="layernorm", positions="learned", tie_embeddings=True, bias=True),
    "moe": dict(n_experts=4, experts_per_token=2),
    "moe-shared": dict(n_experts=8, experts_per_token=2, d_ff_expert=48, n_shared_experts=1,
                       n_kv_heads=2),
    "moe-gelu-bias": dict(n_experts=4, experts_per_token=1, mlp="gelu", bias=True,
                          norm="layernorm"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_architecture_counts_what_torch_builds(variant):
    cfg = TransformerConfig.preset("debug", **VARIANTS[variant])
    model, counts = reference(cfg), param_counts(cfg)
    block = model["blocks"][0]
    assert counts.total == numel(model)
    assert counts.attention_per_layer == numel(block["attn"])
    assert counts.ffn_per_layer == numel(block["ffn"])
    assert counts.norms_per_layer == numel(block["attn_norm"]) + numel(block["ffn_norm"])
    assert counts.final_norm == numel(model["final_norm"])
    assert counts.embedding == numel(model["embedding"])
    positions = model["positions"] if "positions" in model else torch.nn.Identity()
    assert counts.position_embedding == numel(positions)
    assert counts.lm_head == (numel(model["lm_head"]) if "lm_head" in model else 0)
    assert counts.active == _active(model, cfg)
    # matmul weights: every Linear's, and the head's even when it is the embedding
    head = cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0
    assert counts.matmul == _linear_weights(model) + head
    assert sum(counts.as_dict().values()) == counts.total
    assert counts.non_embedding == numel(model["blocks"]) + numel(model["final_norm"])


def test_active_and_matmul_of_a_mixture_of_experts():
    cfg = TransformerConfig.preset("debug", n_experts=8, experts_per_token=2, n_shared_experts=1)
    counts, d, f = param_counts(cfg), cfg.d_model, cfg.d_ff
    expert = 3 * d * f
    assert counts.ffn_per_layer == d * 8 + 9 * expert
    assert counts.ffn_active_per_layer == d * 8 + 3 * expert
    assert counts.total - counts.active == cfg.n_layers * 6 * expert
    assert counts.matmul - counts.active_matmul == cfg.n_layers * 6 * expert
    dense = param_counts(TransformerConfig.preset("debug"))
    assert (dense.active, dense.active_matmul) == (dense.total, dense.matmul)


def test_gqa_narrows_only_k_and_v():
    mha, gqa = (param_counts(TransformerConfig.preset("small", n_kv_heads=k)) for k in (12, 3))
    d = 768
    assert mha.attention_per_layer == 4 * d * d
    assert mha.attention_per_layer - gqa.attention_per_layer == 2 * d * (d - 3 * 64)
    assert mha.ffn_per_layer == gqa.ffn_per_layer


def test_megatron_formula_is_the_gpt_count_without_the_final_layernorm():
    for layers, d, heads in ((2, 64, 4), (24, 2304, 24), (96, 12288, 96)):
        cfg = TransformerConfig(vocab_size=51_200, context_length=2_048, d_model=d,
                                n_layers=layers, n_heads=heads, d_ff=4 * d, mlp="gelu",
                                norm="layernorm", positions="learned", tie_embeddings=True,
                                bias=True)
        assert count_params(cfg) == megatron_gpt_params(layers, d, 51_200, 2_048) + 2 * d
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        megatron_gpt_params(0, 64, 100, 16)


def test_mlp_params_and_a_duck_typed_architecture():
    assert mlp_params(4, 8) == 3 * 4 * 8 and mlp_params(4, 8, "gelu") == 2 * 4 * 8
    assert mlp_params(4, 8, "swiglu", bias=True) == 3 * 32 + 2 * 8 + 4
    assert mlp_params(4, 8, "relu", bias=True) == 2 * 32 + 8 + 4
    with pytest.raises(ValueError, match="mlp='geglu' is not one of"):
        mlp_params(4, 8, "geglu")

    class GqaSizes(Sizes):
        n_heads, n_kv_heads = 2, 1

    assert param_counts(GqaSizes()).attention_per_layer == 2 * 16 + 2 * 4 * 2
    arch = architecture(Sizes())
    assert (arch.kv_dim, arch.mlp, arch.norm, arch.bias, arch.is_moe) == (
        4, "swiglu", "rmsnorm", False, False)


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (dict(mlp="geglu"), ValueError, "cfg.mlp='geglu' is not one of"),
        (dict(norm="batchnorm"), ValueError, "cfg.norm='batchnorm'"),
        (dict(positions="alibi"), ValueError, "cfg.positions='alibi'"),
        (dict(bias=1), TypeError, "cfg.bias must be True or False"),
        (dict(tie_embeddings="yes"), TypeError, "cfg.tie_embeddings must be True or False"),
        (dict(n_heads=2, n_kv_heads=3), ValueError, "cfg.n_kv_heads \\(3\\) must divide"),
        (dict(n_kv_heads=1), TypeError, "cfg needs a 'n_heads' attribute"),
        (dict(n_experts=-1), ValueError, "cfg.n_experts must be an integer >= 0"),
        (dict(n_experts=4, experts_per_token=5), ValueError, "cfg.experts_per_token \\(5\\)"),
        (dict(n_experts=4, experts_per_token=1, d_ff_expert=0), ValueError, "cfg.d_ff_expert"),
        (dict(positions="learned"), TypeError, "cfg needs a 'context_length' attribute"),
    ],
)
def test_bad_architecture_fields_of_a_duck_typed_config(fields, error, message):
    with pytest.raises(error, match=message):
        param_counts(_sizes(**fields))
