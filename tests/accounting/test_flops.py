"""mlsys.accounting.flops, the FLOP formulas, against torch.utils.flop_counter on the real model
(meta device: no data)."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import flops
from mlsys.accounting.params import count_params, param_counts
from mlsys.models.catalog import NAMED_MODELS, named_config
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


# --- the architectures beyond the book's model ----------------------------------------------------

GPT = dict(mlp="gelu", norm="layernorm", positions="learned", tie_embeddings=True, bias=True)
ARCHITECTURES = {
    "gqa": dict(n_kv_heads=2), "mqa": dict(n_kv_heads=1), "gelu": dict(mlp="gelu"),
    "relu-bias": dict(mlp="relu", bias=True), "gpt": GPT,
    "moe": dict(n_experts=4, experts_per_token=2),
    "moe-shared-gqa": dict(n_experts=8, experts_per_token=2, n_shared_experts=1, d_ff_expert=48,
                           n_kv_heads=2),
    "moe-gelu-bias": dict(n_experts=4, experts_per_token=1, **GPT),
}


def _arch(name, **more):
    return TransformerConfig.preset("debug", **{**ARCHITECTURES[name], **more})


def _linear(d_in, d_out, bias):
    return torch.nn.Linear(d_in, d_out, bias=bias)


def _counted_block(cfg, batch, seq, routes=None):
    """torch.utils.flop_counter over one block of `cfg` written from torch.nn parts: GQA by
    repeating k and v per group; the MLP, or a router and each expert run on its routed tokens
    (`routes`: tokens x top_k expert ids) and the shared experts on every token."""
    d, f, h, dh = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head
    kv, group = cfg.kv_heads, cfg.n_heads // cfg.kv_heads
    x = torch.randn(batch * seq, d)
    proj = {n: _linear(d, w, cfg.bias) for n, w in (("q", d), ("k", kv * dh), ("v", kv * dh))}
    o = _linear(d, d, cfg.bias)

    def mlp(rows, width):
        up = _linear(d, width, cfg.bias)(rows)
        if cfg.mlp == "swiglu":
            up = torch.nn.functional.silu(up) * _linear(d, width, cfg.bias)(rows)
        else:
            up = torch.nn.functional.gelu(up) if cfg.mlp == "gelu" else torch.relu(up)
        return _linear(width, d, cfg.bias)(up)

    with FlopCounterMode(display=False) as counter:
        q = proj["q"](x).view(batch, seq, h, dh).transpose(1, 2)
        k, v = (proj[n](x).view(batch, seq, kv, dh).transpose(1, 2).repeat_interleave(group, 1)
                for n in ("k", "v"))
        y = torch.softmax(q @ k.transpose(-2, -1) / dh**0.5, dim=-1) @ v
        x = x + o(y.transpose(1, 2).reshape(batch * seq, d))
        if not cfg.is_moe:
            mlp(x, f)
        else:
            _linear(d, cfg.n_experts, False)(x)  # the router
            for e in range(cfg.n_experts):
                rows = (routes == e).any(dim=1)
                if rows.any():
                    mlp(x[rows], cfg.expert_d_ff)
            for _ in range(cfg.n_shared_experts):
                mlp(x, cfg.expert_d_ff)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_block_matmuls_of_every_architecture_equal_the_counter(name):
    cfg, batch, seq = _arch(name), 2, 24
    routes = None
    if cfg.is_moe:  # each token to top_k distinct experts at random: unevenly spread
        generator = torch.Generator().manual_seed(0)
        routes = torch.stack([torch.randperm(cfg.n_experts, generator=generator)
                              [:cfg.experts_per_token] for _ in range(batch * seq)])
    lf = flops.layer_flops(cfg, batch, seq)
    assert _counted_block(cfg, batch, seq, routes) == lf.matmul_flops
    # the GEMM shapes carry the same FLOPs, term by term
    gemms = flops.block_gemms(cfg, batch, seq)
    by_term = {}
    for g in gemms:
        by_term[g.name] = by_term.get(g.name, 0) + g.flops
        assert [b.flops for b in g.backward()] == [g.flops, g.flops]
    assert by_term == {t: getattr(lf, t) for t in by_term}
    assert sum(by_term.values()) == lf.matmul_flops
    head = flops.transformer_flops(cfg, batch, seq).lm_head
    assert flops.head_gemm(cfg, batch, seq).flops == head


def test_gqa_narrows_k_and_v_and_leaves_attention_per_query_head():
    batch, seq = 2, 64
    mha = flops.layer_flops(TransformerConfig.preset("small"), batch, seq)
    gqa = flops.layer_flops(TransformerConfig.preset("small", n_kv_heads=3), batch, seq)
    tokens, d = batch * seq, 768
    assert gqa.k_proj == gqa.v_proj == flops.linear_flops(tokens, d, 3 * 64) == mha.k_proj // 4
    assert (gqa.q_proj, gqa.o_proj) == (mha.q_proj, mha.o_proj)
    same = ("attention_scores", "attention_values", "attention_scale", "softmax", "ffn_w1")
    assert all(getattr(gqa, t) == getattr(mha, t) for t in same)
    assert gqa.rope == flops.ROPE_OPS_PER_ELEMENT * tokens * (d + 3 * 64)  # on q and the k heads


def test_a_two_matrix_mlp_and_gpts_elementwise_terms():
    batch, seq = 2, 32
    cfg = TransformerConfig.preset("small", **GPT)
    lf, tokens, d, f = flops.layer_flops(cfg, batch, seq), batch * seq, 768, 3072
    assert lf.ffn_w3 == 0 and lf.ffn_flops == 4 * tokens * d * f
    assert lf.ffn_flops == flops.claimed_ffn_flops(batch, seq, d, f)  # right for two matrices
    assert (lf.swiglu_gate, lf.rope) == (0, 0)
    assert lf.mlp_activation == flops.GELU_OPS_PER_HIDDEN * tokens * f
    assert lf.norms == 2 * flops.layernorm_flops(tokens, d)
    assert lf.biases == tokens * (4 * d + f + d)  # q, k, v, o; w1; w2
    assert {"mlp_activation", "biases"} <= set(lf.as_dict()) and "router" not in lf.as_dict()
    mf = flops.transformer_flops(cfg, batch, seq)
    assert mf.positions == tokens * d and mf.final_norm == flops.layernorm_flops(tokens, d)
    assert mf.lm_head == flops.linear_flops(tokens, d, cfg.vocab_size)  # tied: still a matmul
    assert set(mf.module_flops()) >= {"blocks.0.ffn.w1", "blocks.0.ffn.w2"}
    assert "blocks.0.ffn.w3" not in mf.module_flops()
    shares = flops.forward_shares(cfg, 512)
    assert math.isclose(sum(shares.values()), 1.0) and "GeLU MLP (2 matrices)" in shares


def test_experts_cost_their_top_k_not_their_number():
    batch, seq = 2, 32
    four = flops.layer_flops(_arch("moe"), batch, seq)
    eight = flops.layer_flops(_arch("moe", n_experts=8), batch, seq)
    dense = flops.layer_flops(TransformerConfig.preset("debug"), batch, seq)
    tokens, d = batch * seq, 64
    assert four.ffn_w1 == eight.ffn_w1 == 2 * dense.ffn_w1  # top-2: each token through 2 MLPs
    assert eight.router - four.router == flops.linear_flops(tokens, d, 4)
    assert four.attention_flops == dense.attention_flops
    assert four.routing == flops.softmax_flops(tokens, 4) + 2 * tokens * 2 * d
    mf = flops.transformer_flops(_arch("moe"), batch, seq)
    assert set(mf.module_flops()) == {f"blocks.{i}{m}" for i in range(2)
                                      for m in ("", ".attn", ".attn.q_proj", ".attn.k_proj",
                                                ".attn.v_proj", ".attn.o_proj", ".ffn")} | {
        "lm_head"}
    assert "experts and router" in flops.forward_shares(_arch("moe"), 64)


@pytest.mark.parametrize("name", ["gqa", "gpt", "moe-shared-gqa", "moe-gelu-bias"])
def test_per_token_training_flops_are_6_active_matmul_params_plus_attention(name):
    cfg, seq = _arch(name), 96
    expected = 6 * param_counts(cfg).active_matmul + 12 * cfg.n_layers * seq * cfg.d_model
    assert flops.training_flops_per_token(cfg, seq) == expected
    assert flops.six_n_ratio(cfg, seq) == expected / (6 * param_counts(cfg).active)


def test_mixtral_per_token_flops_follow_its_published_active_parameters():
    cfg, seq = named_config("mixtral-8x7b"), 4096
    counts = param_counts(cfg)
    assert NAMED_MODELS["mixtral-8x7b"].agrees(counts.active, 12_900_000_000)
    attention = 12 * 32 * seq * 4096
    assert flops.training_flops_per_token(cfg, seq) == 6 * counts.active_matmul + attention


@pytest.mark.parametrize(("heads", "h", "layers"), [(24, 2304, 24), (96, 12288, 80),
                                                    (160, 25600, 128)])
def test_megatron_gpt_flops_equal_the_published_formulas(heads, h, layers):
    """Korthikanti et al. 2022 (model FLOPs) and Narayanan et al. 2021, Eq. 3 (full recomputation:
    the blocks' forward counted twice), both for GPT with d_ff = 4h and vocabulary V."""
    batch, seq, vocab = 3, 2048, 51_200
    cfg = TransformerConfig(vocab_size=vocab, context_length=seq, d_model=h, n_layers=layers,
                            n_heads=heads, d_ff=4 * h, **GPT)
    mf = flops.transformer_flops(cfg, batch, seq)
    bslh2 = batch * seq * layers * h * h
    model = 72 * bslh2 * (1 + seq / (6 * h) + vocab / (12 * h * layers))
    assert math.isclose(mf.training_matmul_flops, model, rel_tol=1e-12)
    recompute = mf.training_matmul_flops + layers * mf.layer.matmul_flops
    megatron = 96 * bslh2 * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    assert math.isclose(recompute, megatron, rel_tol=1e-12)


def test_gemm_shapes_and_their_checks():
    cfg = _arch("moe-shared-gqa")
    gemms = {(g.name, g.groups): g for g in flops.block_gemms(cfg, 2, 8)}
    routed = gemms[("ffn_w1", 8)]
    assert (routed.m, routed.n, routed.k) == (2 * 8 * 2, 48, 64)  # tokens x top-2 rows
    assert (gemms[("ffn_w2", 1)].m, gemms[("ffn_w2", 1)].k) == (16, 48)  # the shared expert
    scores = gemms[("attention_scores", 1)]
    assert (scores.m, scores.n, scores.k, scores.count) == (8, 8, 16, 2 * 4)
    assert gemms[("k_proj", 1)].n == 2 * 16
    grad_a, grad_b = scores.backward()
    assert (grad_a.m, grad_a.n, grad_a.k) == (8, 16, 8) and (grad_b.m, grad_b.n, grad_b.k) == (
        16, 8, 8)
    d_input, d_weight = routed.backward()  # an expert's weight gradient contracts its tokens
    assert (d_input.split, d_weight.split, d_weight.k, d_weight.groups) == ("m", "k", 32, 8)
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        flops.block_gemms(cfg, 2, 0)
    with pytest.raises(TypeError, match="cfg needs a 'vocab_size' attribute"):
        flops.head_gemm(object(), 1, 1)
    with pytest.raises(ValueError, match="cfg.mlp='geglu'"):
        flops.layer_flops(type("Geglu", (Sizes,), {"mlp": "geglu"})(), 1, 1)


@pytest.mark.parametrize("name", ["gqa", "mqa", "gelu", "relu-bias", "gpt"])
def test_the_built_model_of_each_dense_architecture_matches_module_by_module(name):
    cfg, batch, seq = _arch(name), 3, 17
    counted = _count(cfg, batch, seq)
    predicted = flops.transformer_flops(cfg, batch, seq)
    assert counted.get_total_flops() == predicted.forward_matmul_flops
    by_module = counted.get_flop_counts()
    for module, value in predicted.module_flops().items():
        assert sum(by_module[f"Transformer.{module}"].values()) == value, module
