"""mlsys.accounting.recompute: the FLOPs activation checkpointing reruns, against the FLOP
accounting, and the seed's "+33%" claim beside PyTorch's early stop."""

import pytest

from mlsys.accounting import recompute
from mlsys.models.config import TransformerConfig


def test_recompute_flops_and_the_33_percent_claim():
    cfg = TransformerConfig.preset("2.7B")
    from mlsys.accounting.flops import transformer_flops

    mf = transformer_flops(cfg, 4, 512)
    assert recompute.recompute_flops(cfg, 4, 512, checkpoint_segment=1, early_stop=False) == (
        32 * mf.layer.matmul_flops)
    assert recompute.recompute_flops(cfg, 4, 512, checkpoint_segment=4) == (
        32 * mf.layer.matmul_flops - 8 * mf.layer.ffn_w2)
    # +33% needs every forward matmul rerun (the head too): 4 forwards instead of 3
    assert mf.forward_matmul_flops / mf.training_matmul_flops == pytest.approx(1 / 3)
    for k in (1, 6, 32):
        assert recompute.recompute_overhead(cfg, 4, 512, checkpoint_segment=k,
                                            early_stop=False) < 1 / 3
    # per block, PyTorch's early stop skips every w2 as well: a quarter, not a third
    per_block = recompute.recompute_overhead(cfg, 4, 512, checkpoint_segment=1)
    assert per_block == pytest.approx(0.2502, abs=1e-4)
