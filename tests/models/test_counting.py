"""A model's FLOPs counted by PyTorch's own counter on the meta device
(`mlsys.models.counting`), against the formula of `mlsys.accounting.flops`: the book's presets,
then grouped-query attention, GeLU and ReLU MLPs and GPT's shape, module by module, forward and
backward."""

import pytest

from mlsys.accounting.flops import transformer_flops
from mlsys.models.config import TransformerConfig
from mlsys.models.counting import count_model_flops

GPT = dict(norm="layernorm", positions="learned", bias=True, tie_embeddings=True, mlp="gelu")
KINDS = {"gqa": dict(n_kv_heads=3), "mqa": dict(n_kv_heads=1), "gelu": dict(mlp="gelu"),
         "relu": dict(mlp="relu"), "gpt": GPT, "gpt_gqa": {**GPT, "n_kv_heads": 2}}


def test_count_model_flops_on_meta_matches_the_formula():
    cfg = TransformerConfig.preset("small")
    expected = transformer_flops(cfg, 2, 33).forward_matmul_flops
    assert count_model_flops(cfg, 2, 33).get_total_flops() == expected
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        count_model_flops(cfg, 1, 0)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_other_shapes_match_the_formula_module_by_module(kind, attention):
    """k and v narrower with GQA (the repeated heads are copies: no FLOPs), two MLP matrices for
    GeLU and ReLU; the attention core over all query heads; backward = 2 x forward."""
    cfg = TransformerConfig.preset("small", n_heads=12, attention=attention, **KINDS[kind])
    batch, seq = 3, 37
    predicted = transformer_flops(cfg, batch, seq)
    counter = count_model_flops(cfg, batch, seq)
    assert counter.get_total_flops() == predicted.forward_matmul_flops
    counted = counter.get_flop_counts()
    for module, value in predicted.module_flops().items():
        assert sum(counted[f"Transformer.{module}"].values()) == value, module
    both = count_model_flops(cfg, batch, seq, backward=True).get_total_flops()
    assert both == predicted.training_matmul_flops
