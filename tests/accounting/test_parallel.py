"""mlsys.accounting.parallel: the mesh, the model's rules and what each device holds, against
golden numbers, the real model and the CS336 4D-parallelism question (XXL), parts a and b.
Pure: no ranks."""

import math

import pytest
from parallel_cases import SETUP

from mlsys import hardware
from mlsys.accounting import parallel
from mlsys.accounting.memory import model_state_bytes
from mlsys.accounting.params import count_params
from mlsys.models.config import TransformerConfig

CFG = SETUP.cfg  # the parallelism tests' model: 4 blocks, 4 heads, d_ff 24


# --- the mesh -------------------------------------------------------------------------------------


def test_dims_check_the_product_and_show_the_arithmetic():
    dims = parallel.ParallelDims(dp_replicate=2, dp_shard=4, tp=8, pp=2, cp=2)
    assert dims.world_size == 256 and dims.dp == 8 and dims.fsdp == 8
    assert dims.shape == (2, 2, 4, 2, 8)  # MESH_AXES order: pp, dp_replicate, dp_shard, cp, tp
    with pytest.raises(ValueError, match=r"pp \(1\) \* dp_replicate \(1\) \* dp_shard \(2\) \* "
                                         r"cp \(1\) \* tp \(3\) = 6 != world_size \(8\)"):
        parallel.ParallelDims(dp_shard=2, tp=3, world_size=8)
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        parallel.ParallelDims(tp=0)
    with pytest.raises(TypeError, match="pp must be an integer"):
        parallel.ParallelDims(pp=2.0)


def test_coordinates_groups_and_spans():
    dims = parallel.ParallelDims(pp=2, dp_shard=2, cp=2, tp=2)
    for rank in range(dims.world_size):
        assert dims.rank_of(dims.coords(rank)) == rank
    assert dims.coords(13) == {"pp": 1, "dp_replicate": 0, "dp_shard": 1, "cp": 0, "tp": 1}
    assert dims.group_ranks(13, "tp") == (12, 13)
    assert dims.group_ranks(13, "dp_shard", "cp") == (9, 11, 13, 15)  # same pp, same tp
    assert dims.span("tp") == 2 and dims.span("cp") == 4 and dims.span("pp") == 16
    with pytest.raises(ValueError, match=r"rank \(16\) must be < world_size \(16\)"):
        dims.coords(16)
    with pytest.raises(ValueError, match="axis='ep' is not one of"):
        dims.group_ranks(0, "ep")


def test_model_rules_are_checked_with_their_numbers():
    ok = parallel.ParallelDims(tp=2, pp=2, cp=2, dp_shard=2)
    parallel.check_model(CFG, ok, batch=4, seq=8, microbatches=2)
    for dims, kw, message in (
            (parallel.ParallelDims(tp=8), {}, r"n_heads \(4\) is not divisible by tp \(8\)"),
            (parallel.ParallelDims(pp=5), {}, r"pp \(5\) must be <= n_layers \(4\)"),
            (ok, {"batch": 6}, r"batch \(6\) is not divisible by dp_replicate \* dp_shard \* "
                               r"microbatches = 2 \* 2 = 4"),
            (ok, {"seq": 9}, r"seq \(9\) is not divisible by cp \(2\)"),
            (ok, {"seq": 32}, r"seq \(32\) must be <= context_length \(16\)")):
        with pytest.raises(ValueError, match=message):
            parallel.check_model(CFG, dims, **{"batch": 4, "seq": 8, "microbatches": 2, **kw})
    assert parallel.stage_layers(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))


# --- what each device holds -----------------------------------------------------------------------


def test_the_model_shape_adds_up_to_the_real_model():
    shape = parallel.model_shape(CFG)
    for pp in (1, 2, 4):
        assert sum(shape.stage_params(s, pp, 1) for s in range(pp)) == count_params(CFG)
    xl = TransformerConfig.preset("xl")
    assert parallel.model_shape(xl).block_tp_params == 4 * 1600**2 + 3 * 1600 * 6400
    assert parallel.model_shape(xl).block_other_params == 2 * 1600


def test_device_memory_shards_states_and_activations_as_documented():
    xl = TransformerConfig.preset("xl")
    kw = {"micro_batch": 4, "seq": 1024}
    one = parallel.device_memory(xl, parallel.ParallelDims(), **kw)
    assert one.states == model_state_bytes(count_params(xl), "bf16_mixed_adamw")
    assert one.gathered == 0
    fsdp = parallel.device_memory(xl, parallel.ParallelDims(dp_shard=8), **kw)
    assert fsdp.states == pytest.approx(one.states / 8)
    assert fsdp.activations == one.activations  # FSDP does not shard activations
    tp = parallel.device_memory(xl, parallel.ParallelDims(tp=5), **kw)
    sp = parallel.device_memory(xl, parallel.ParallelDims(tp=5), sequence_parallel=True, **kw)
    assert sp.activations < tp.activations < one.activations
    cp = parallel.device_memory(xl, parallel.ParallelDims(cp=2), **kw)
    assert cp.activations == pytest.approx(one.activations / 2)
    gpipe = parallel.device_memory(xl, parallel.ParallelDims(pp=4), microbatches=8,
                                   schedule="gpipe", **kw)
    ofob = parallel.device_memory(xl, parallel.ParallelDims(pp=4), microbatches=8, **kw)
    assert gpipe.activations > ofob.activations  # 8 micro-batches in flight against 4
    assert sum(one.as_dict().values()) == one.total


# --- the CS336 4D question (the XXL model) --------------------------------------------------------


def test_xxl_part_a_states_and_saved_activations():
    assert parallel.XXL.n_params == 219_848_638_464
    states = model_state_bytes(parallel.XXL.n_params, "fp32_adamw")  # fp32 weights, grads, m and v
    assert states == 3_517_578_215_424
    assert math.ceil(states / hardware.H100_SXM.hbm_bytes) == 44
    # saved for backward: x (D) and w_in x (F)
    shape = parallel.model_shape(parallel.XXL, dtype="bf16")
    per_token = parallel.XXL.n_layers * (shape.act_tp_bytes + shape.act_other_bytes)
    assert per_token == 126 * (16_384 + 53_248) * 2 == 17_547_264


def test_xxl_part_b_fsdp_shards_to_fit_a_v5p():
    states = model_state_bytes(parallel.XXL.n_params, "fp32_adamw")
    hbm = hardware.TPU_V5P.hbm_bytes
    assert parallel.min_shards_to_fit(hbm, states) == 38  # 3,517.6 GB / 95 GB = 37.03
    tokens = 2_048
    act = 17_547_264 * tokens
    n = parallel.min_shards_to_fit(hbm, states, act, activation_shard_fraction=0.5)
    for shards, fits in ((n, True), (n - 1, False)):
        mem = parallel.device_memory(parallel.XXL, parallel.ParallelDims(dp_shard=shards),
                                     micro_batch=tokens, seq=1, recipe="fp32_adamw",
                                     activation_shard_fraction=0.5, gathered_units=0)
        assert mem.total == pytest.approx(states / shards + act * (0.5 + 0.5 / shards))
        assert (mem.total <= hbm) is fits
    with pytest.raises(ValueError, match="no number of shards fits"):
        parallel.min_shards_to_fit(hbm, states, 2 * hbm, activation_shard_fraction=0.5)


def test_device_memory_refuses_an_impossible_mesh_before_counting():
    small = TransformerConfig.preset("small")  # 12 heads, d_ff 3072, 12 blocks
    kw = {"micro_batch": 1, "seq": 1024}
    with pytest.raises(ValueError, match=r"^n_heads \(12\) is not divisible by tp \(5\)$"):
        parallel.device_memory(small, parallel.ParallelDims(tp=5), **kw)
    with pytest.raises(ValueError, match=r"^d_ff \(24\) is not divisible by tp \(5\)$"):
        parallel.device_memory(parallel.model_shape(parallel.FeedForwardStack(8, 24, 2)),
                               parallel.ParallelDims(tp=5), **kw)  # a ModelShape, checked too
    with pytest.raises(ValueError, match=r"pp \(13\) must be <= n_layers \(12\)"):
        parallel.device_memory(small, parallel.ParallelDims(pp=13), **kw)
    with pytest.raises(ValueError, match=r"^seq \(1024\) is not divisible by cp \(3\)$"):
        parallel.device_memory(small, parallel.ParallelDims(cp=3), **kw)
    with pytest.raises(TypeError, match="dims must be a ParallelDims, got dict"):
        parallel.device_memory(small, {"tp": 4}, **kw)
    with pytest.raises(ValueError, match="gathered_units must be an integer >= 0, got -1"):
        parallel.device_memory(small, parallel.ParallelDims(dp_shard=2), gathered_units=-1, **kw)
    assert parallel.device_memory(small, parallel.ParallelDims(tp=4), **kw).total > 0


# --- the extended config: GQA, experts, tied heads; the rules of their degrees ------------------

LLAMA_LIKE = TransformerConfig(vocab_size=512, context_length=64, d_model=192, n_layers=8,
                               n_heads=12, n_kv_heads=4, d_ff=384)
MOE = TransformerConfig(vocab_size=512, context_length=64, d_model=64, n_layers=4, n_heads=4,
                        d_ff=128, n_experts=8, experts_per_token=2, d_ff_expert=98)
GPT_LIKE = TransformerConfig(vocab_size=512, context_length=64, d_model=64, n_layers=4,
                             n_heads=4, d_ff=256, mlp="gelu", norm="layernorm",
                             positions="learned", tie_embeddings=True, bias=True)


@pytest.mark.parametrize(("cfg", "dims", "kw", "message"), [
    (LLAMA_LIKE, parallel.ParallelDims(tp=6), {},
     r"n_kv_heads \(4\) and tp \(6\) must divide one another"),
    (LLAMA_LIKE, parallel.ParallelDims(pp=4), {"virtual_stages": 3},
     r"pp \* virtual_stages = 4 \* 3 = 12 must be <= n_layers \(8\)"),
    (LLAMA_LIKE, parallel.ParallelDims(pp=3), {"virtual_stages": 2},
     r"n_layers \(8\) is not divisible by pp \* virtual_stages = 3 \* 2 = 6"),
    (LLAMA_LIKE, parallel.ParallelDims(), {"virtual_stages": 2},
     r"virtual_stages \(2\) > 1 needs pp > 1"),
    (LLAMA_LIKE, parallel.ParallelDims(dp_shard=2), {"ep": 2},
     r"ep \(2\) > 1 needs a mixture of experts"),
    (MOE, parallel.ParallelDims(dp_shard=6), {"ep": 3, "batch": 6},
     r"n_experts \(8\) is not divisible by ep \(3\)"),
    (MOE, parallel.ParallelDims(dp_shard=2, tp=2), {"ep": 4},
     r"ep \(4\) does not divide dp_replicate \* dp_shard \* cp = 1 \* 2 \* 1 = 2"),
    (MOE, parallel.ParallelDims(tp=4, dp_shard=2), {"ep": 2},
     r"d_ff_expert \(98\) is not divisible by tp \(4\)"),
    (LLAMA_LIKE, parallel.ParallelDims(dp_shard=2), {"virtual_stages": 0},
     "virtual_stages must be a positive integer, got 0"),
])
def test_the_extended_rules_name_the_degree_and_the_rule(cfg, dims, kw, message):
    with pytest.raises(ValueError, match=message):
        parallel.check_model(cfg, dims, **{"batch": 4, "seq": 8, **kw})


def test_the_extended_rules_pass_what_megatron_and_torchtitan_run():
    parallel.check_model(LLAMA_LIKE, parallel.ParallelDims(tp=12, dp_shard=2), batch=4, seq=8)
    parallel.check_model(LLAMA_LIKE, parallel.ParallelDims(pp=2), batch=4, seq=8,
                         virtual_stages=4)
    parallel.check_model(MOE, parallel.ParallelDims(dp_replicate=2, dp_shard=2, tp=2), batch=4,
                         seq=8, ep=4)  # ep over the copies and the shards (Megatron-Core)


def test_gqa_replicates_the_kv_heads_once_tp_exceeds_them():
    shape = parallel.model_shape(LLAMA_LIKE)
    d, d_head = 192, 16
    kv = 2 * d * 4 * d_head  # k and v: 4 heads of 16
    assert shape.block_kv_params == kv and shape.kv_heads == 4
    q_o, mlp = 2 * d * d, 3 * d * 384
    for tp in (1, 2, 4):  # the KV heads split
        assert shape.block_params(tp) == (q_o + kv + mlp) / tp + 2 * d
    # tp = 12 > 4 KV heads: every rank holds one KV head (k and v: 2 x d x d_head)
    assert shape.block_params(12) == pytest.approx((q_o + mlp) / 12 + 2 * d * d_head + 2 * d)
    assert sum(shape.stage_params(s, 2, 1) for s in range(2)) == count_params(LLAMA_LIKE)


def test_experts_are_split_by_ep_and_sharded_by_what_fsdp_has_left():
    shape = parallel.model_shape(MOE)
    expert = 3 * 64 * 98  # one SwiGLU expert
    assert shape.block_expert_params == 8 * expert
    assert shape.block_other_params == 2 * 64 + 64 * 8  # norms and the router
    assert sum(shape.stage_params(s, 2, 1) for s in range(2)) == count_params(MOE)
    assert shape.block_params(2, 4) - shape.block_params(2, 1) == pytest.approx(
        8 * expert / 8 - 8 * expert / 2)
    kw = {"micro_batch": 1, "seq": 16, "gathered_units": 0}
    for dims, ep, expert_share in (
            (parallel.ParallelDims(dp_shard=8), 8, 1 / 8),  # experts spread, FSDP left: 1
            (parallel.ParallelDims(dp_shard=8), 2, 1 / 8),  # 2 x 4 shards
            (parallel.ParallelDims(dp_replicate=4, dp_shard=2), 8, 1 / 8),
            (parallel.ParallelDims(dp_replicate=4), 4, 1 / 4)):
        mem = parallel.device_memory(MOE, dims, ep=ep, **kw)
        dense = count_params(MOE) - 4 * 8 * expert
        fsdp = dims.fsdp
        want = (dense / fsdp + 4 * 8 * expert * expert_share) * 2  # bf16 weights
        assert mem.weights == pytest.approx(want), (dims, ep)


def test_a_tied_head_is_copied_to_the_last_stage():
    shape = parallel.model_shape(GPT_LIKE)
    embedding = 512 * 64 + 64 * 64  # tokens and learned positions
    assert shape.first_params == embedding and shape.tied_params == 512 * 64
    assert shape.stage_params(0, 1, 1) == count_params(GPT_LIKE)  # one stage: one copy
    two = sum(shape.stage_params(s, 2, 1) for s in range(2))
    assert two == count_params(GPT_LIKE) + 512 * 64  # Megatron keeps the head's copy


# --- recomputation, interleaving, ZeRO and fp8 in memory ----------------------------------------

S, B, H, A, L = 2_048, 1, 4_096, 32, 16  # Korthikanti et al.'s symbols: seq, micro-batch, hidden


def _korthikanti_shape() -> parallel.ModelShape:
    """Their GPT layer (Korthikanti et al. 2022, Section 4.1), 16-bit, per token: split by TP the
    attention core (Q, K: 4h; softmax 2as, its dropout mask as and output 2as; V 2h; the output
    projection's input 2h) and the MLP (GeLU input 8h, second linear's input 8h): 24h + 5as; the
    rest, 10h (two LayerNorm inputs 4h, two dropout masks 2h, the QKV and first-linear inputs
    4h), split only by sequence parallelism, as Megatron stores the linears' inputs sharded."""
    return parallel.ModelShape(
        n_layers=L, d_model=H, block_tp_params=12 * H * H, block_other_params=0,
        first_params=0, last_params=0, tp_must_divide=(("heads", A),),
        act_tp_bytes=24 * H + 5 * A * S, act_norm_bytes=10 * H, act_other_bytes=0,
        act_last_bytes=0, training_flops_per_token=1.0, act_core_bytes=5 * A * S,
        act_input_bytes=2 * H)


@pytest.mark.parametrize(("t", "sp", "recompute", "per_layer"), [
    # Korthikanti et al. 2022, Table 2: activation memory per layer, in units of s b h
    (1, False, "none", 34 + 5 * A * S / H),
    (8, False, "none", 10 + 24 / 8 + 5 * A * S / (H * 8)),
    (8, True, "none", 34 / 8 + 5 * A * S / (H * 8)),
    (8, False, "selective", 10 + 24 / 8),
    (8, True, "selective", 34 / 8),
])
def test_activation_memory_follows_korthikantis_table(t, sp, recompute, per_layer):
    mem = parallel.device_memory(_korthikanti_shape(), parallel.ParallelDims(tp=t),
                                 micro_batch=B, seq=S, sequence_parallel=sp, recompute=recompute)
    assert mem.activations == pytest.approx(S * B * H * L * per_layer)


def test_full_recomputation_keeps_the_inputs_and_one_layer():
    shape = _korthikanti_shape()
    for t, sp in ((1, False), (8, True)):
        dims = parallel.ParallelDims(tp=t)
        kw = {"micro_batch": B, "seq": S, "sequence_parallel": sp}
        one_layer = parallel.device_memory(shape, dims, **kw).activations / L
        full = parallel.device_memory(shape, dims, recompute="full", **kw)
        assert full.activations - one_layer == pytest.approx(2 * S * B * H * L / t)  # Table 2


def test_interleaving_holds_korthikantis_extra_factor_on_the_first_stage():
    shape = _korthikanti_shape()
    p, m = 4, 8
    for v in (1, 2, 4):
        mem = parallel.device_memory(shape, parallel.ParallelDims(pp=p), micro_batch=B, seq=S,
                                     microbatches=m, virtual_stages=v)
        # Korthikanti et al. 2022, Section 4.2.3: L (1 + (p - 1) / (p v)) layers for v > 1
        factor = 1 + (p - 1) / (p * v) if v > 1 else 1
        assert mem.activations == pytest.approx(S * B * H * (34 + 5 * A * S / H) * L * factor)


def test_full_recomputation_matches_the_books_checkpointed_saved_bytes():
    from mlsys.accounting.activations import saved_bytes

    small = TransformerConfig.preset("small")
    mb, seq = 4, 1024
    saved = saved_bytes(small, mb, seq, dtype="bf16", attention="sdpa", checkpoint_segment=1)
    full = parallel.device_memory(small, parallel.ParallelDims(), micro_batch=mb, seq=seq,
                                  recompute="full")
    # the planner leaves out the token ids (int64, embedding) and counts the loss's targets per
    # token as at batch 1 (no copy): 8 bytes a token against the (N, V) fp32 log-probabilities
    assert full.activations == pytest.approx(
        saved.peak_bytes - saved.outside_components()["embedding"], rel=1e-3)
    none = parallel.device_memory(small, parallel.ParallelDims(), micro_batch=mb, seq=seq)
    assert none.activations == pytest.approx(
        saved.total_bytes - saved.segment_input.nbytes * 12 + 12 * saved.block_bytes
        - saved.outside_components()["embedding"], rel=1e-3)


def test_selective_recomputation_drops_the_fused_cores_output_and_log_sum_exp():
    small = TransformerConfig.preset("small")  # 12 blocks, d 768, 12 heads
    kw = {"micro_batch": 2, "seq": 512}
    for tp in (1, 4):
        dims = parallel.ParallelDims(tp=tp)
        none = parallel.device_memory(small, dims, **kw)
        sel = parallel.device_memory(small, dims, recompute="selective", **kw)
        per_token = (768 * 2 + 12 * 4) / tp  # O in bf16, the log-sum-exp in fp32, per head
        assert none.activations - sel.activations == pytest.approx(12 * 2 * 512 * per_token)
        assert none.states == sel.states


def test_zero_stages_shard_the_copies_states():
    xl = TransformerConfig.preset("xl")
    n = count_params(xl)
    dims = parallel.ParallelDims(dp_replicate=4)
    kw = {"micro_batch": 1, "seq": 256}
    old = parallel.device_memory(xl, dims, **kw)
    assert parallel.device_memory(xl, dims, zero=0, **kw) == old
    z1 = parallel.device_memory(xl, dims, zero=1, **kw)
    z2 = parallel.device_memory(xl, dims, zero=2, **kw)
    # bf16_mixed_adamw: bf16 weights (2), bf16 grads (2), fp32 master (4), two fp32 moments (8)
    assert (z1.weights, z1.grads, z1.master, z1.optimizer) == pytest.approx(
        (2 * n, 2 * n, 4 * n / 4, 8 * n / 4))
    assert (z2.weights, z2.grads) == pytest.approx((2 * n, 2 * n / 4))
    with pytest.raises(ValueError, match="zero must be None, 0, 1 or 2"):
        parallel.device_memory(xl, dims, zero=3, **kw)
    with pytest.raises(ValueError, match="recompute='some' is not one of"):
        parallel.device_memory(xl, dims, recompute="some", **kw)


def test_fp8_saves_the_linear_inputs_in_one_byte_and_keeps_cast_weights():
    from mlsys.accounting.activations import saved_bytes

    small = TransformerConfig.preset("small")
    kw = {"micro_batch": 2, "seq": 512}
    bf16 = parallel.device_memory(small, parallel.ParallelDims(), **kw)
    fp8 = parallel.device_memory(small, parallel.ParallelDims(), act_dtype="fp8", **kw)
    parts = saved_bytes(small, 2, 512, dtype="bf16", attention="sdpa").components()
    linear_inputs = sum(parts[k] for k in parallel.LINEAR_INPUTS)
    assert bf16.activations - fp8.activations == pytest.approx(12 * linear_inputs / 2)
    matrices = 12 * (4 * 768**2 + 3 * 768 * 3072)
    assert fp8.gathered == 2 * matrices and fp8.states == bf16.states
