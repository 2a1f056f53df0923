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
