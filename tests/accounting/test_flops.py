"""mlsys.accounting.flops, the FLOP formulas, against torch.utils.flop_counter on the real model
(meta device: no data)."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

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
    six_n = flops.six_n_flops_per_token(count_params(debug))
    assert flops.training_flops_per_token(debug, 16) / six_n < 0.8


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


class Sizes:  # a duck-typed config
    vocab_size, d_model, n_layers, n_heads, d_ff = 100, 16, 2, 4, 48


class ZeroWidth(Sizes):
    d_model = 0


class FloatHeads(Sizes):
    n_heads = 4.0


CFG = TransformerConfig()

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: flops.matmul_flops(0, 1, 1), ValueError, "m must be a positive integer, got 0"),
    (lambda: flops.matmul_flops(1, 1.5, 1), TypeError, "n must be an integer"),
    (lambda: flops.matmul_flops(1, 1, True), TypeError, "k must be an integer, got True"),
    (lambda: flops.linear_flops(-1, 4, 4), ValueError, "tokens must be a positive integer"),
    (lambda: flops.linear_flops(4, "4", 4), TypeError, "d_in must be an integer"),
    (lambda: flops.linear_backward_flops(4, 4, 0), ValueError, "d_out must be a positive"),
    (lambda: flops.softmax_flops(0, 5), ValueError, "rows must be a positive integer"),
    (lambda: flops.softmax_flops(5, 2.0), TypeError, "cols must be an integer"),
    (lambda: flops.softmax_backward_flops(-1, 3), ValueError, "rows must be a positive"),
    (lambda: flops.rmsnorm_flops(True, 3), TypeError, "rows must be an integer, got True"),
    (lambda: flops.rmsnorm_backward_flops(3, None), TypeError, "cols must be an integer"),
    (lambda: flops.layernorm_flops(3, -1), ValueError, "cols must be a positive integer"),
    (lambda: flops.repeat_unary_flops(2.5, 1), TypeError, "n_elements must be an integer, got 2.5"),
    (lambda: flops.repeat_unary_flops(10, -1), ValueError, "k must be an integer >= 0"),
    (lambda: flops.repeat_unary_flops(10, 1, "exp"), ValueError, "op='exp' is not one of"),
    (lambda: flops.scaled_dot_product_flops(1, 1, 0, 8), ValueError, "seq must be a positive"),
    (lambda: flops.scaled_dot_product_flops(1, 2.0, 8, 8), TypeError, "heads must be an integer"),
    (lambda: flops.layer_flops(object(), 1, 1), TypeError, "cfg needs a 'd_model' attribute"),
    (lambda: flops.layer_flops(CFG, 0, 1), ValueError, "batch must be a positive integer"),
    (lambda: flops.layer_flops(FloatHeads(), 1, 1), TypeError, "cfg.n_heads must be an integer"),
    (lambda: flops.transformer_flops(object(), 1, 1), TypeError, "cfg needs a 'vocab_size'"),
    (lambda: flops.transformer_flops(None, 1, 1), TypeError, "cfg needs a 'vocab_size'"),
    (lambda: flops.transformer_flops(ZeroWidth(), 1, 1), ValueError, "cfg.d_model must be a posi"),
    (lambda: flops.transformer_flops(CFG, 1, -3), ValueError, "seq must be a positive integer"),
    (lambda: flops.transformer_flops(CFG, 1.0, 3), TypeError, "batch must be an integer"),
    (lambda: flops.training_flops_per_token(CFG, 0), ValueError, "seq must be a positive"),
    (lambda: flops.attention_share(CFG, "4"), TypeError, "seq must be an integer"),
    (lambda: flops.six_n_flops_per_token(True), TypeError, "n_params must be an integer, got True"),
    (lambda: flops.six_n_flops_per_token(0), ValueError, "n_params must be a positive integer"),
    (lambda: flops.six_n_flops_per_token(1.5e9), TypeError, "n_params must be an integer"),
    (lambda: flops.claimed_linear_flops(0, 1, 1), ValueError, "batch must be a positive"),
    (lambda: flops.claimed_attention_flops(1, 1, 1, 0), ValueError, "heads must be a positive"),
    (lambda: flops.claimed_ffn_flops(1, 1, 1, -1), ValueError, "d_ff must be a positive"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_before_any_work(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_one_softmax_convention_and_the_scale_apart():
    assert flops.SOFTMAX_OPS_PER_ELEMENT == 5 and flops.ATTENTION_SCALE_OPS_PER_SCORE == 1
    assert not hasattr(flops, "SOFTMAX_OPS_PER_SCORE")
    cfg, batch, seq = TransformerConfig.preset("small"), 2, 64
    lf = flops.layer_flops(cfg, batch, seq)
    scores = batch * cfg.n_heads * seq * seq
    assert (lf.softmax, lf.attention_scale) == (5 * scores, scores)
    # the block total counts 6 elementwise ops per score, as before the split
    others = lf.norms + lf.rope + lf.swiglu_gate + lf.residual
    assert lf.elementwise_flops == others + 6 * scores
    assert set(lf.as_dict()) == set(lf.MATMUL_TERMS) | set(lf.ELEMENTWISE_TERMS)


def test_row_wise_and_chain_flops():
    assert flops.softmax_flops(3, 7) == 5 * 21 and flops.softmax_backward_flops(3, 7) == 4 * 21
    assert flops.rmsnorm_flops(3, 7) == 4 * 21 + 3 * 3
    assert flops.rmsnorm_backward_flops(3, 7) == 9 * 21 + 3
    assert flops.layernorm_flops(3, 7) == flops.LAYERNORM_OPS_PER_ELEMENT * 21
    assert flops.repeat_unary_flops(10, 4, "fma") == 80
    assert flops.repeat_unary_flops(10, 4, "cos") == 40
    # attention as the naive module runs it: two matmuls, the scale, the softmax (non-causal)
    b, h, s, d = 2, 3, 16, 8
    expected = 2 * b * h * 2 * s * s * d + b * h * s * s * (1 + 5)
    assert flops.scaled_dot_product_flops(b, h, s, d) == expected


def test_attention_matmuls_match_the_counter_on_the_naive_module():
    b, h, s, d = 2, 3, 16, 8
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        torch.softmax(q @ k.transpose(-2, -1) / d**0.5, dim=-1) @ v
    per_score = flops.SOFTMAX_OPS_PER_ELEMENT + flops.ATTENTION_SCALE_OPS_PER_SCORE
    elementwise = b * h * s * s * per_score
    assert counter.get_total_flops() == flops.scaled_dot_product_flops(b, h, s, d) - elementwise


def test_duck_typed_config():
    mf = flops.transformer_flops(Sizes(), 2, 8)
    assert mf.lm_head == flops.linear_flops(16, 16, 100) and mf.n_layers == 2


def test_attention_share_crosses_one_half_where_12ltd_equals_6n_matmul():
    cfg = TransformerConfig.preset("small")
    t_half = param_counts(cfg).matmul / (2 * cfg.n_layers * cfg.d_model)
    share = flops.attention_share
    assert share(cfg, int(t_half)) < 0.5 <= share(cfg, int(t_half) + 1)
    assert 0 < flops.attention_share(cfg, 16) < flops.attention_share(cfg, 4096) < 1


def test_forward_shares_sum_to_one_and_follow_the_breakdown():
    cfg = TransformerConfig.preset("small")
    shares = flops.forward_shares(cfg, 512)
    assert math.isclose(sum(shares.values()), 1.0)
    mf = flops.transformer_flops(cfg, 1, 512)
    assert shares["output head"] == mf.lm_head / mf.forward_flops
    swiglu = mf.n_layers * mf.layer.ffn_flops / mf.forward_flops
    assert math.isclose(shares["SwiGLU (3 matrices)"], swiglu)
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        flops.forward_shares(cfg, 0)
