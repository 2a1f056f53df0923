"""The FLOP formulas against torch.utils.flop_counter on the real model (meta device: no weights)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys import hardware
from mlsys.accounting import flops
from mlsys.accounting.params import count_params, param_counts
from mlsys.models.counting import count_model_flops
from mlsys.models.transformer import TransformerConfig

PRESETS_UP_TO_XL = ["debug", "small", "medium", "large", "xl"]


def _count(cfg, batch, seq, *, backward=False):
    return count_model_flops(cfg, batch, seq, backward=backward)


@pytest.mark.parametrize("preset", PRESETS_UP_TO_XL)
def test_forward_breakdown_equals_the_counter_module_by_module(preset):
    cfg = TransformerConfig.preset(preset)
    batch, seq = 3, 37  # irregular on purpose
    counter = _count(cfg, batch, seq)
    predicted = flops.transformer_flops(cfg, batch, seq)
    counted = counter.get_flop_counts()
    assert counter.get_total_flops() == predicted.forward_matmul_flops
    for module, value in predicted.module_flops().items():
        assert sum(counted[f"Transformer.{module}"].values()) == value, module


@pytest.mark.parametrize("preset", ["debug", "small"])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_forward_plus_backward_is_three_forwards(preset, attention):
    cfg = TransformerConfig.preset(preset, attention=attention)
    counter = _count(cfg, 2, 64, backward=True)
    assert counter.get_total_flops() == flops.transformer_flops(cfg, 2, 64).training_matmul_flops


def test_matmul_and_linear_laws():
    assert flops.matmul_flops(2, 3, 4) == 48
    assert flops.linear_backward_flops(5, 7, 11) == 2 * flops.linear_flops(5, 7, 11)
    a, b = torch.randn(13, 17), torch.randn(17, 19)
    with FlopCounterMode(display=False) as counter:
        a @ b
    assert counter.get_total_flops() == flops.matmul_flops(13, 19, 17)


def test_detailed_per_token_count_is_6n_plus_attention():
    cfg = TransformerConfig.preset("small")
    seq = 512
    counts = param_counts(cfg)
    n_matmul = counts.matmul
    expected = 6 * n_matmul + 12 * cfg.n_layers * seq * cfg.d_model
    assert flops.training_flops_per_token(cfg, seq) == expected


def test_six_n_drifts_where_expected():
    # long sequences: attention adds 12 L T D per token, so 6N undercounts
    xl = TransformerConfig.preset("xl")
    n = count_params(xl)
    short = flops.training_flops_per_token(xl, 128) / flops.six_n_flops_per_token(n)
    long = flops.training_flops_per_token(xl, 16_384) / flops.six_n_flops_per_token(n)
    assert 0.9 < short < 1.05
    assert long > 1.5
    # a small model: the embedding table is a large share of N but costs no FLOPs, so 6N overcounts
    debug = TransformerConfig.preset("debug")
    assert flops.training_flops_per_token(debug, 16) / flops.six_n_flops_per_token(count_params(debug)) < 0.8


def test_claimed_formulas_versus_the_counter():
    cfg = TransformerConfig.preset("small")
    batch, seq = 2, 256
    layer = flops.layer_flops(cfg, batch, seq)
    # attention: the claimed S^2 term carries an extra factor of heads
    claimed = flops.claimed_attention_flops(batch, seq, cfg.d_model, cfg.n_heads)
    corrected = 2 * batch * seq * cfg.d_model * (4 * cfg.d_model + 2 * seq)
    assert layer.attention_flops == corrected != claimed
    # feed-forward: SwiGLU has three matrices, not two
    assert layer.ffn_flops == 6 * batch * seq * cfg.d_model * cfg.d_ff
    assert flops.claimed_ffn_flops(batch, seq, cfg.d_model, cfg.d_ff) * 3 == 2 * layer.ffn_flops
    # linear: the claimed form misses the sequence length
    assert flops.claimed_linear_flops(batch, cfg.d_model, cfg.d_model) * seq == layer.q_proj


def test_utilization_and_time():
    h100 = hardware.H100_SXM
    assert flops.mfu(h100.peak_flop_per_s("bf16"), 2.0, h100.peak_flop_per_s("bf16")) == 0.5
    assert flops.hardware_training_flops(10, recompute="full") == 40
    days = flops.training_time_s(6 * 70e9 * 15e12, 1024, h100.peak_flop_per_s("bf16"), 0.5) / 86_400
    assert 140 < days < 148


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: flops.matmul_flops(0, 1, 1), "m must be a positive integer"),
        (lambda: flops.transformer_flops(TransformerConfig(), 1, -3), "seq must be a positive integer"),
        (lambda: flops.six_n_flops_per_token(0), "n_params"),
        (lambda: flops.mfu(1.0, 0.0, 1.0), "seconds"),
        (lambda: flops.training_time_s(1.0, 1, 1.0, 1.5), "mfu must be in"),
        (lambda: flops.hardware_training_flops(1.0, recompute="half"), "recompute='half'"),
    ],
)
def test_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_attention_share_crosses_one_half_where_12ltd_equals_6n_matmul():
    cfg = TransformerConfig.preset("small")
    t_half = param_counts(cfg).matmul / (2 * cfg.n_layers * cfg.d_model)
    assert flops.attention_share(cfg, int(t_half)) < 0.5 <= flops.attention_share(cfg, int(t_half) + 1)
    assert 0 < flops.attention_share(cfg, 16) < flops.attention_share(cfg, 4096) < 1
