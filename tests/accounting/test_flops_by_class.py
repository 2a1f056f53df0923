"""mlsys.accounting.flops_by_class: the model's FLOPs mapped onto the profiler's classes of
operation, a partition of `accounting.flops` whatever the attention backend."""

import pytest

from mlsys.accounting import flops, flops_by_class
from mlsys.models.config import TransformerConfig
from mlsys.profiling import classes, profiler


def test_class_flops_partition_the_accounting():
    for attention in ("naive", "sdpa"):
        cfg = TransformerConfig.preset("small", attention=attention)
        got = flops_by_class.class_flops(cfg, 4, 512)
        assert set(got) == set(flops_by_class.CLASSES) == set(classes.CLASSES)
        loss = flops.softmax_flops(4 * 512, cfg.vocab_size)
        assert sum(got.values()) == flops.transformer_flops(cfg, 4, 512).forward_flops + loss
        training = flops_by_class.class_flops(cfg, 4, 512, training=True)
        assert training == {k: 3 * v for k, v in got.items()}
        assert got["optimizer"] == got["copy/cast"] == got["communication"] == 0
    naive, sdpa = (flops_by_class.class_flops(TransformerConfig.preset("small", attention=a),
                                              4, 512)
                   for a in ("naive", "sdpa"))
    assert naive["attention"] == 0 and sdpa["softmax"] == loss  # the loss's log-softmax only
    moved = naive["softmax"] - loss + (naive["matmul"] - sdpa["matmul"])
    assert sdpa["attention"] == moved + (naive["elementwise"] - sdpa["elementwise"])
    # He's "a fraction of a percent of FLOPs"
    assert profiler.shares(naive)["normalization"] < 0.005
    assert flops_by_class.class_flops(cfg, 4, 512, attention="naive") == naive


def test_every_backend_but_naive_is_one_fused_op():
    cfg = TransformerConfig.preset("debug")
    fused = [flops_by_class.class_flops(cfg, 2, 16, attention=a)
             for a in ("sdpa", "flash_torch", "flash_triton")]
    assert fused[0] == fused[1] == fused[2] and fused[0]["attention"] > 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="attention"):
        flops_by_class.class_flops(TransformerConfig(), 1, 8, attention="flash")
    with pytest.raises(ValueError, match="training"):
        flops_by_class.class_flops(TransformerConfig(), 1, 8, training="yes")
