"""mlsys.accounting.attention_variants, the attention cost models added for the one-pager "The
attention block": grouped-query parameters and the KV cache, a decoding step's traffic,
sliding-window and strided-sparse pair counts (against brute force over the mask), linear
attention (against `FlopCounterMode`), and the argument checks.
"""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic, attention_variants
from mlsys.accounting.params import param_counts
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.ops.attention import causal_mask


def _randn(*shape, seed=0, dtype=torch.float32):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x.to(dtype).requires_grad_()


# --- grouped-query attention: parameters and the KV cache -----------------------------------------


def test_attention_params_match_the_model_and_the_param_count():
    for name in PRESETS:
        cfg = TransformerConfig.preset(name)
        got = attention_variants.attention_params(cfg.d_model, cfg.n_heads)
        assert sum(got.values()) == param_counts(cfg).attention_per_layer == 4 * cfg.d_model**2
    cfg = TransformerConfig.preset("debug")
    with torch.device("meta"):
        attn = Transformer(cfg).blocks[0].attn
    shapes = {name: getattr(attn, name).weight.numel() for name in ("q_proj", "k_proj", "v_proj",
                                                                    "o_proj")}
    assert shapes == attention_variants.attention_params(cfg.d_model, cfg.n_heads)


def test_grouped_and_multi_query_params():
    d_model, heads, d = 4096, 32, 128
    mha = attention_variants.attention_params(d_model, heads)
    for n_kv in (32, 8, 1):
        got = attention_variants.attention_params(d_model, heads, n_kv_heads=n_kv)
        assert got["q_proj"] == got["o_proj"] == d_model**2
        assert got["k_proj"] == got["v_proj"] == d_model * n_kv * d
        assert sum(got.values()) == 2 * d_model**2 + 2 * d_model * n_kv * d
        assert mha["k_proj"] == heads // n_kv * got["k_proj"]
    # a head width that is not D / H (as in Gemma): q and o are D x H d
    wide = attention_variants.attention_params(2048, 8, n_kv_heads=1, d_head=256)
    assert wide == {"q_proj": 2048 * 8 * 256, "k_proj": 2048 * 256, "v_proj": 2048 * 256,
                    "o_proj": 8 * 256 * 2048}


def test_kv_cache_bytes_closed_form_and_real_tensors():
    n_layers, n_kv, d, batch, tokens = 4, 2, 16, 3, 37
    per_token = attention_variants.kv_cache_bytes_per_token(n_layers, n_kv, d, "bf16")
    assert per_token == 2 * n_layers * n_kv * d * 2
    cache = [torch.empty(batch, n_kv, tokens, d, dtype=torch.bfloat16) for _ in range(2 * n_layers)]
    real = sum(t.numel() * t.element_size() for t in cache)
    assert attention_variants.kv_cache_bytes(batch, tokens, n_layers, n_kv, d, "bf16") == real
    assert real == batch * tokens * per_token
    # a window caps the tokens kept; a window longer than the sequence changes nothing
    assert attention_variants.kv_cache_bytes(batch, tokens, n_layers, n_kv, d,
                                             window=8) == batch * 8 * per_token
    assert attention_variants.kv_cache_bytes(batch, tokens, n_layers, n_kv, d,
                                             window=tokens + 1) == real
    assert attention_variants.kv_cache_bytes(1, 1, 1, 1, 1, "fp32") == 8


def test_decode_step_traffic_is_a_one_query_flash_forward_without_l():
    batch, heads, context, d = 2, 8, 300, 64
    step = attention_variants.decode_attention_traffic(batch, heads, context, d, "bf16")
    flash = attention_traffic.flash_forward_traffic(batch, heads, 1, context, d, "bf16", block_q=1,
                                    block_k=context, causal=True)
    lse = batch * heads * attention_traffic.LSE_BYTES
    assert (step.read_bytes, step.write_bytes) == (flash.read_bytes, flash.write_bytes - lse)
    kv = 2 * batch * heads * context * d * 2
    for n_kv in (8, 2, 1):  # grouped keys: the cache read shrinks by the group size
        grouped = attention_variants.decode_attention_traffic(batch, heads, context, d, "bf16",
                                                              n_kv_heads=n_kv)
        assert grouped.read_bytes == step.read_bytes - kv + kv * n_kv // heads
        assert grouped.write_bytes == step.write_bytes
    # the one query sees every key (bottom-right causal): 4 B H context d FLOPs
    flops = attention_cost.attention_forward_flops(batch, heads, 1, context, d, causal=True)
    assert flops == 4 * batch * heads * context * d
    for ctx, n_kv in ((context, 2), (10**6, 2), (10**6, heads)):
        step = attention_variants.decode_attention_traffic(batch, heads, ctx, d, "bf16",
                                                           n_kv_heads=n_kv)
        intensity = attention_cost.attention_forward_flops(batch, heads, 1, ctx, d, causal=True) / \
            step.total_bytes
        assert intensity == 4 * heads * ctx / (2 * (2 * n_kv * ctx + 2 * heads))
        assert intensity == pytest.approx(2 * (heads / n_kv) / 2, rel=heads / ctx)


# --- sliding-window, strided sparse, linear -------------------------------------------------------


@pytest.mark.parametrize("n_q", [1, 2, 5, 16, 17])
@pytest.mark.parametrize("n_k", [1, 3, 16, 29])
def test_sliding_window_pairs_count_the_banded_mask(n_q, n_k):
    for window in (1, 2, 4, 7, 16, 40):
        causal = causal_mask(n_q, n_k)
        too_old = causal_mask(n_q, n_k).tril(diagonal=n_k - n_q - window)  # j <= i + off - w
        band = causal & ~too_old
        assert attention_variants.sliding_window_pairs(n_q, n_k, window=window) == band.sum().item()
        assert band.sum(dim=1).max().item() <= window
    assert attention_variants.sliding_window_pairs(n_q, n_k, window=n_k) == \
        attention_cost.score_pairs(n_q, n_k, causal=True)
    # the diagonal only
    assert attention_variants.sliding_window_pairs(n_q, n_k, window=1) == min(n_q, n_k)


def test_sliding_window_is_linear_in_the_sequence():
    for seq, window in ((4096, 1024), (10_000, 7), (5, 5)):
        expected = window * seq - window * (window - 1) // 2
        assert attention_variants.sliding_window_pairs(seq, seq, window=window) == expected
    assert (attention_variants.sliding_window_pairs(2**16, 2**16, window=512)
            - attention_variants.sliding_window_pairs(2**15, 2**15, window=512)) == 512 * 2**15


def test_strided_sparse_pairs_against_brute_force():
    for seq in (1, 2, 3, 10, 33, 64):
        i = torch.arange(seq)[:, None]
        j = torch.arange(seq)[None, :]
        for stride in (1, 2, 3, 8, 70):
            gap = i - j
            mask = (gap >= 0) & ((gap <= stride) | (gap % stride == 0))
            assert attention_variants.strided_sparse_pairs(seq, stride=stride) == mask.sum().item()
        assert attention_variants.strided_sparse_pairs(seq, stride=seq) == \
            attention_cost.score_pairs(seq, seq, causal=True)
    seq = 2**16
    stride = math.isqrt(seq)
    assert attention_variants.strided_sparse_pairs(seq, stride=stride) == pytest.approx(
        1.5 * seq * stride, rel=0.01)


def test_masked_flops_agree_with_the_dense_and_causal_counts():
    batch, heads, n, d = 2, 3, 50, 16
    for causal in (False, True):
        pairs = attention_cost.score_pairs(n, n, causal=causal)
        assert attention_variants.masked_attention_forward_flops(batch, heads, d, pairs) == \
            attention_cost.attention_forward_flops(batch, heads, n, n, d, causal=causal)
    assert attention_variants.masked_attention_forward_flops(1, 1, 8, 0) == 0


@pytest.mark.parametrize(("feature_dim", "n_k"), [(None, 13), (24, 13)])
def test_linear_attention_flops_match_the_flop_counter(feature_dim, n_k):
    batch, heads, d = 2, 3, 8
    d_phi = d if feature_dim is None else feature_dim
    phi_q, phi_k = (_randn(batch, heads, n_k, d_phi, seed=s).detach().relu() for s in (1, 2))
    v = _randn(batch, heads, n_k, d, seed=3).detach()
    ones = torch.ones(batch, heads, n_k, 1)
    with FlopCounterMode(display=False) as counter:
        state = phi_k.transpose(-2, -1) @ torch.cat((v, ones), dim=-1)  # (d_phi, d + 1) per head
        out = phi_q @ state
        out = out[..., :d] / out[..., d:]
    assert counter.get_total_flops() == attention_variants.linear_attention_flops(
        batch, heads, n_k, d, feature_dim=feature_dim)
    assert attention_variants.linear_attention_state_bytes(
        batch, heads, d, "fp32", feature_dim=feature_dim) == state.numel() * state.element_size()
    # no quadratic term: the same as softmax attention's 4 T^2 d at T = d + 1 (d_phi = d)
    assert attention_variants.linear_attention_flops(1, 1, d + 1, d) == \
        attention_cost.attention_forward_flops(1, 1, d + 1, d + 1, d)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attention_variants.attention_params(4096, 32, n_kv_heads=5), ValueError,
         r"n_heads \(32\) is not divisible by n_kv_heads \(5\): 32 / 5 = 6.4"),
        (lambda: attention_variants.attention_params(4096, 32, n_kv_heads=64), ValueError,
         r"n_heads \(32\) is not divisible by n_kv_heads \(64\)"),
        (lambda: attention_variants.attention_params(1000, 16), ValueError,
         r"d_model \(1000\) is not divisible by n_heads \(16\): 1000 / 16 = 62.5"),
        (lambda: attention_variants.attention_params(512, 8, n_kv_heads=0), ValueError,
         "n_kv_heads must be a positive integer"),
        (lambda: attention_variants.attention_params(512, 8, d_head=True), TypeError,
         "d_head must be an integer"),
        (lambda: attention_variants.kv_cache_bytes_per_token(2, 1, 64, "fp12"), ValueError,
         "unknown dtype"),
        (lambda: attention_variants.kv_cache_bytes(1, 0, 2, 1, 64), ValueError,
         "tokens must be a positive"),
        (lambda: attention_variants.kv_cache_bytes(1, 8, 2, 1, 64, window=0), ValueError,
         "window must be a positive integer"),
        (lambda: attention_variants.decode_attention_traffic(1, 8, 16, 64, n_kv_heads=3),
         ValueError, r"n_heads \(8\) is not divisible by n_kv_heads \(3\)"),
        (lambda: attention_variants.decode_attention_traffic(1, 8, 16.0, 64), TypeError,
         "context must be an integer"),
        (lambda: attention_variants.sliding_window_pairs(4, 4, window=0), ValueError,
         "window must be a positive integer"),
        (lambda: attention_variants.sliding_window_pairs(4, 4), TypeError, "window"),
        (lambda: attention_variants.strided_sparse_pairs(16, stride=-1), ValueError,
         "stride must be a positive integer"),
        (lambda: attention_variants.masked_attention_forward_flops(1, 1, 8, -3), ValueError,
         "pairs must be an integer >= 0"),
        (lambda: attention_variants.linear_attention_flops(1, 1, 16, 8, feature_dim=0), ValueError,
         "feature_dim must be a positive integer"),
        (lambda: attention_variants.linear_attention_state_bytes(1, 1, 8, "fp99"), ValueError,
         "unknown dtype"),
    ],
)
def test_bad_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
