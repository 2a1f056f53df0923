"""A model's FLOPs counted by PyTorch's own counter on the meta device
(`mlsys.models.counting`), against the formula of `mlsys.accounting.flops`."""

from mlsys.models.counting import count_model_flops


def test_count_model_flops_on_meta_matches_the_formula():
    from mlsys.accounting.flops import transformer_flops
    from mlsys.models.config import TransformerConfig

    cfg = TransformerConfig.preset("small")
    expected = transformer_flops(cfg, 2, 33).forward_matmul_flops
    assert count_model_flops(cfg, 2, 33).get_total_flops() == expected
    import pytest

    with pytest.raises(ValueError, match="seq must be a positive integer"):
        count_model_flops(cfg, 1, 0)
