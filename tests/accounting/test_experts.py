"""mlsys.accounting.experts, the expert-parallel functions (ep_*): expert parameters per rank,
the bytes of the four all-to-alls of a MoE layer, and the expert width at which compute hides
them, against their closed forms, hand-counted small cases and the time model of
accounting.comms."""

import math

import pytest

from mlsys import hardware
from mlsys.accounting import experts
from mlsys.accounting.comms import collective_time_s
from mlsys.accounting.params import param_counts
from mlsys.models.catalog import named_config
from mlsys.models.config import TransformerConfig

H100 = hardware.H100_SXM
MOE = TransformerConfig.preset("debug", n_experts=4, experts_per_token=2)


def test_expert_params_are_the_ranks_share_of_the_experts():
    assert experts.ep_expert_params(16, 24, 8, 1) == 8 * 3 * 16 * 24
    assert experts.ep_expert_params(16, 24, 8, 4) == 2 * 3 * 16 * 24
    total = experts.ep_expert_params(2_560, 10_240, 64, 1)
    per_rank = [experts.ep_expert_params(2_560, 10_240, 64, e) * e for e in (1, 2, 8, 64)]
    assert per_rank == [total] * 4
    with pytest.raises(ValueError, match=r"n_experts \(6\) is not divisible by ep \(4\): "
                                         r"6 / 4 = 1.5 experts per rank"):
        experts.ep_expert_params(16, 24, 6, 4)
    with pytest.raises(ValueError, match="ep must be a positive integer"):
        experts.ep_expert_params(16, 24, 8, 0)


def test_all_to_all_bytes_by_hand():
    # 4 ranks, 10 tokens of width 3 in fp32, top-2: each rank's buffer is 2 x 10 x 3 x 4 = 240 B,
    # a quarter of it stays home, 180 B leave, 4 times per layer (dispatch, combine, x2 backward)
    assert experts.ep_sent_bytes(3, 4, tokens=10, top_k=2, act_dtype="fp32") == 4 * 180
    assert experts.ep_sent_bytes(3, 4, tokens=10, top_k=2, act_dtype="fp32", n_moe_layers=5,
                           microbatches=3) == 3 * 5 * 4 * 180
    assert experts.ep_sent_bytes(3, 4, tokens=10, top_k=2, act_dtype="fp32",
                           capacity_factor=1.25) == pytest.approx(1.25 * 4 * 180)
    assert experts.ep_sent_bytes(3, 1, tokens=10, top_k=2) == 0  # one rank holds every expert
    assert experts.ep_sent_bytes(3, 4, tokens=10, n_moe_layers=0) == 0


@pytest.mark.parametrize("ep", [2, 8, 64])
def test_all_to_all_bytes_closed_form(ep):
    d, tokens, k, layers, b = 2_560, 8_192, 2, 16, 2
    sent = experts.ep_sent_bytes(d, ep, tokens=tokens, top_k=k, n_moe_layers=layers)
    assert sent == pytest.approx(4 * layers * k * tokens * d * b * (ep - 1) / ep, rel=1e-12)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        experts.ep_sent_bytes(8, 2, tokens=0)
    with pytest.raises(ValueError, match="capacity_factor"):
        experts.ep_sent_bytes(8, 2, tokens=4, capacity_factor=0)
    with pytest.raises(ValueError, match="n_moe_layers"):
        experts.ep_sent_bytes(8, 2, tokens=4, n_moe_layers=-1)
    with pytest.raises(ValueError, match="act_dtype|dtype"):
        experts.ep_sent_bytes(8, 2, tokens=4, act_dtype="bf17")
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        experts.ep_compute_bound_d_ff(8, flop_per_s=1e15, link_bytes_per_s=0)


@pytest.mark.parametrize("link", ["nvlink4", "ib-ndr"])
def test_the_expert_width_threshold_balances_compute_and_all_to_all(link):
    c, w = H100.peak_flop_per_s("bf16"), hardware.LINKS[link].bytes_per_s
    ep, d, tokens, k = 8, 4_096, 16_384, 2
    f_min = experts.ep_compute_bound_d_ff(ep, flop_per_s=c, link_bytes_per_s=w)
    assert f_min == pytest.approx(2 / 9 * 2 * 7 / 8 * c / w)
    sent = experts.ep_sent_bytes(d, ep, tokens=tokens, top_k=k)
    for factor, bound in ((1.01, True), (0.99, False)):
        expert_s = 18 * d * f_min * factor * k * tokens / c  # forward + backward of the experts
        assert (expert_s > sent / w) is bound
    # the bytes are the bus bytes of four all-to-alls: the alpha-beta time with alpha = 0
    one = collective_time_s("all_to_all", k * tokens * d * 2, ep, alpha_s=0.0, bytes_per_s=w)
    assert math.isclose(4 * one, sent / w)
    assert experts.ep_compute_bound_d_ff(1, flop_per_s=c, link_bytes_per_s=w) == 0
    assert experts.ep_compute_bound_d_ff(ep, flop_per_s=c, link_bytes_per_s=w,
                                   act_dtype="fp32") == pytest.approx(2 * f_min)


# --- from a mixture-of-experts config -------------------------------------------------------------


def test_a_configs_experts_per_rank_and_what_stays_replicated():
    cfg = named_config("mixtral-8x7b")
    one = experts.expert_params(cfg)
    assert one == 3 * 4_096 * 14_336 == experts.ep_expert_params(4_096, 14_336, 1, 1)
    assert [experts.ep_rank_params(cfg, ep) * ep for ep in (1, 2, 4, 8)] == [32 * 8 * one] * 4
    # the experts are all of the feed-forward but the router
    counts = param_counts(cfg)
    assert experts.ep_rank_params(cfg, 1) == 32 * (counts.ffn_per_layer - 4_096 * 8)
    gelu = TransformerConfig.preset("debug", n_experts=4, experts_per_token=1, mlp="gelu",
                                    bias=True, d_ff_expert=32)
    assert experts.expert_params(gelu) == 2 * 64 * 32 + 32 + 64
    with pytest.raises(ValueError, match=r"cfg.n_experts \(8\) is not divisible by ep \(3\)"):
        experts.ep_rank_params(cfg, 3)


def test_a_configs_all_to_all_bytes_are_top_k_tokens_over_every_layer():
    cfg, ep, tokens = named_config("mixtral-8x7b"), 8, 4_096
    sent = experts.moe_sent_bytes(cfg, ep, tokens=tokens, microbatches=2)
    assert sent == pytest.approx(2 * 32 * 4 * 2 * tokens * 4_096 * 2 * (ep - 1) / ep, rel=1e-12)
    assert sent == experts.ep_sent_bytes(4_096, ep, tokens=tokens, top_k=2, n_moe_layers=32,
                                         microbatches=2)
    assert experts.moe_sent_bytes(cfg, 1, tokens=tokens) == 0
    assert experts.moe_sent_bytes(cfg, 2, tokens=tokens, act_dtype="fp32") == pytest.approx(
        2 * experts.moe_sent_bytes(cfg, 2, tokens=tokens))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: experts.moe_sent_bytes(TransformerConfig(), 2, tokens=8), ValueError,
         r"cfg.n_experts must be >= 1 for expert parallelism, got 0"),
        (lambda: experts.expert_params(TransformerConfig()), ValueError, "n_experts"),
        (lambda: experts.moe_sent_bytes(MOE, 3, tokens=8), ValueError,
         r"n_experts \(4\) is not divisible by ep \(3\)"),
        (lambda: experts.moe_sent_bytes(MOE, 0, tokens=8), ValueError, "ep must be a positive"),
        (lambda: experts.moe_sent_bytes(MOE, 2, tokens=0), ValueError, "tokens must be a posit"),
        (lambda: experts.ep_rank_params(object(), 2), TypeError, "cfg needs a 'd_model'"),
    ],
)
def test_config_functions_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
