"""mlsys.accounting.step_model: tile and wave counts by hand, each GEMM's roofline, the GEMMs'
FLOPs against `accounting.flops`, the bubble against `accounting.pipeline`, the collectives
against `accounting.comms`, the overlap rules, and the argument checks."""

from dataclasses import replace

import pytest

from mlsys import hardware
from mlsys.accounting import calibration, comms, flops, pipeline, step_model
from mlsys.accounting.parallel import ParallelDims
from mlsys.models.config import TransformerConfig

A100 = hardware.get_cluster("dgx-a100")
H100 = hardware.get_cluster("dgx-h100")
C = hardware.STEP_CONSTANTS
SMALL = TransformerConfig.preset("small")
GQA = TransformerConfig(vocab_size=1_000, context_length=256, d_model=256, n_layers=4, n_heads=8,
                        n_kv_heads=2, d_ff=512)
MOE = replace(GQA, n_experts=8, experts_per_token=2, n_shared_experts=1, d_ff_expert=128)
GPT = TransformerConfig(vocab_size=51_200, context_length=2_048, d_model=2_304, n_layers=24,
                        n_heads=24, d_ff=9_216, mlp="gelu", norm="layernorm",
                        positions="learned", tie_embeddings=True, bias=True)


def test_tiles_and_waves_by_hand():
    # the 1T model's qkv GEMM on one of 8 TP ranks: 2,048 tokens x 9,600 columns
    assert step_model.tile_count(2048, 9600, (256, 128)) == 8 * 75
    assert step_model.wave_efficiency(600, 108) == pytest.approx(600 / (6 * 108))
    assert step_model.wave_efficiency(216, 108) == 1.0  # two full waves
    assert step_model.wave_efficiency(109, 108) == pytest.approx(109 / 216)  # one tile over
    assert step_model.tile_count(1, 1, (256, 128)) == 1  # a padded tile is a whole tile


def test_a_gemm_runs_in_whole_waves_under_its_roofline():
    acc, peak = A100.accelerator, A100.accelerator.peak_flop_per_s("bf16")
    full = step_model.Gemm("one wave", 256 * 12, 128 * 9, 8192)  # 108 tiles on 108 SMs
    assert step_model.gemm_time_s(full, acc, peak, C) == pytest.approx(
        full.flops / (peak * C.gemm_fraction))
    over = step_model.Gemm("a row of tiles more", 256 * 13, 128 * 9, 8192)  # 117: 2 waves
    assert step_model.gemm_time_s(over, acc, peak, C) == pytest.approx(
        2 * step_model.gemm_time_s(full, acc, peak, C))
    thin = step_model.Gemm("memory-bound", 8192, 8192, 8)  # intensity ~ 4 FLOP/B
    assert thin.bytes == 2 * (8192 * 8 + 8 * 8192 + 8192 * 8192)  # A, B and C, 2 bytes each
    assert step_model.gemm_time_s(thin, acc, peak, C) == pytest.approx(
        thin.bytes / (acc.hbm_bytes_per_s * C.hbm_fraction))


@pytest.mark.parametrize("cfg", [SMALL, GPT, GQA, MOE], ids=["small", "gpt", "gqa", "moe"])
def test_the_gemms_flops_are_the_accountings(cfg):
    model, hw = step_model.step_flops(cfg, batch=2, seq=256)
    assert model == hw == flops.transformer_flops(cfg, 2, 256).training_matmul_flops
    _, full = step_model.step_flops(cfg, batch=2, seq=256, recompute="full")
    mf = flops.transformer_flops(cfg, 2, 256)
    assert full - model == mf.n_layers * mf.layer.matmul_flops  # the blocks' forward, once more


def test_full_recomputation_in_the_papers_convention_is_eq_3():
    for row in calibration.third_party.MEGATRON_TABLE1:
        cfg = calibration.megatron_config(row)
        _, hw = step_model.step_flops(cfg, batch=row.batch, seq=2048, recompute="full")
        assert hw == pytest.approx(step_model.megatron_flops(cfg, batch=row.batch, seq=2048))


def test_tp_splits_the_gemms_and_nothing_is_lost():
    b = step_model.step_time(GPT, A100, ParallelDims(tp=8), batch=8, seq=2048, micro_batch=8)
    one = step_model.step_time(GPT, A100, ParallelDims(), batch=8, seq=2048, micro_batch=8)
    assert b.model_flops == one.model_flops
    assert one.compute_s / 8 < b.compute_s < one.compute_s  # quantization and unsplit kernels


def test_the_bubble_is_the_interleaved_schedules():
    dims = ParallelDims(pp=4)
    for v in (1, 2):
        b = step_model.step_time(SMALL, A100, dims, batch=16, seq=1024, micro_batch=2,
                                 virtual_stages=v)
        m = b.microbatches
        fraction = pipeline.interleaved_bubble_fraction(4, m, v)
        ideal = b.compute_s  # tp = cp = ep = 1: a micro-batch is its compute
        assert b.bubble_s / (ideal + b.bubble_s) == pytest.approx(fraction)


def test_collectives_are_comms_bus_bytes_with_latency():
    link = A100.intra_node
    cost = comms.collective_cost("all_reduce", 1e8, 8)
    assert step_model.collective_s("all_reduce", 1e8, link, 8, C, crosses=False) == \
        pytest.approx(14 * C.intra_latency_s + cost.bus_bytes / (link.bytes_per_s
                                                                  * C.nccl_fraction))
    assert step_model.collective_s("all_reduce", 1e8, link, 1, C, crosses=False) == 0.0


def test_tp_all_reduces_are_exposed_four_a_block_six_with_full_recomputation():
    dims = ParallelDims(tp=8)
    kw = dict(batch=8, seq=2048, micro_batch=4, sequence_parallel=False)
    link = A100.intra_node
    ar = step_model.collective_s("all_reduce", 4 * 2048 * 2304 * 2, link, 8, C, crosses=False)
    for recompute, per_block in (("none", 4), ("full", 6)):
        b = step_model.step_time(GPT, A100, dims, recompute=recompute, **kw)
        assert b.exposed_s["tp"] == pytest.approx(2 * 24 * per_block * ar)  # m = 2 of 24
        assert b.exposed_s["tp"] == b.communication_s["tp"]


def test_recomputation_is_the_forward_again():
    kw = dict(batch=8, seq=1024, micro_batch=4)
    none = step_model.step_time(SMALL, A100, ParallelDims(), recompute="none", **kw)
    full = step_model.step_time(SMALL, A100, ParallelDims(), recompute="full", **kw)
    sel = step_model.step_time(SMALL, A100, ParallelDims(), recompute="selective", **kw)
    assert none.recompute_s == 0 and none.mfu == none.hfu
    assert full.compute_s == pytest.approx(none.compute_s + full.recompute_s)
    assert 0 < sel.recompute_s < full.recompute_s
    assert full.mfu < none.mfu and full.hfu > full.mfu


def test_data_parallel_reduction_hides_behind_the_backward_unless_told_not_to():
    dims = ParallelDims(dp_replicate=16)
    kw = dict(batch=64, seq=1024, micro_batch=4)
    hidden = step_model.step_time(SMALL, A100, dims, **kw)
    after = step_model.step_time(SMALL, A100, dims, software=replace(
        step_model.MODERN, overlap_grad_reduce=False), **kw)
    assert after.exposed_s["dp"] == pytest.approx(after.communication_s["dp"])
    assert hidden.exposed_s["dp"] < after.exposed_s["dp"]
    zero1 = step_model.step_time(SMALL, A100, dims, zero=1, **kw)
    assert zero1.optimizer_s == pytest.approx(hidden.optimizer_s / 16)


def test_fp8_runs_the_linear_layers_faster():
    big = TransformerConfig(vocab_size=32_000, context_length=4096, d_model=8192, n_layers=4,
                            n_heads=64, d_ff=28_672)
    kw = dict(batch=8, seq=4096, micro_batch=1)
    bf16 = step_model.step_time(big, H100, ParallelDims(dp_replicate=8), **kw)
    fp8 = step_model.step_time(big, H100, ParallelDims(dp_replicate=8), dtype="fp8", **kw)
    assert 0.5 * bf16.compute_s < fp8.compute_s < bf16.compute_s
    assert fp8.model_flops == bf16.model_flops and fp8.peak_flop_per_s == bf16.peak_flop_per_s


def test_context_and_expert_parallelism_cost_what_they_send():
    cp = step_model.step_time(SMALL, H100, ParallelDims(cp=4), batch=4, seq=1024,
                              micro_batch=1)
    assert cp.communication_s["cp"] > 0 and cp.exposed_s["cp"] <= cp.communication_s["cp"]
    moe = step_model.step_time(MOE, H100, ParallelDims(dp_shard=8), batch=8, seq=256,
                               micro_batch=1, ep=8)
    assert moe.exposed_s["ep"] > 0 and moe.exposed_s["fsdp"] > 0


@pytest.mark.parametrize(("kw", "message"), [
    ({"recompute": "some"}, "recompute"),
    ({"dtype": "fp32"}, "dtype"),
    ({"zero": 3}, "zero"),
    ({"micro_batch": 3}, r"batch \(8\) is not divisible by dp x micro_batch"),
    ({"virtual_stages": 2}, "virtual_stages"),
    ({"ep": 2}, "ep"),
    ({"micro_batch": 0}, "micro_batch"),
])
def test_bad_input_is_a_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        step_model.step_time(SMALL, A100, ParallelDims(), **{"batch": 8, "seq": 1024,
                                                             "micro_batch": 1, **kw})


def test_bad_software_and_constants_are_clear_errors():
    with pytest.raises(ValueError, match="attention"):
        step_model.Software("x", attention="sparse")
    with pytest.raises(TypeError, match="constants"):
        step_model.step_time(SMALL, A100, ParallelDims(), batch=8, seq=1024, micro_batch=1,
                             constants={"gemm_fraction": 0.7})
    with pytest.raises(TypeError, match="dims"):
        step_model.step_time(SMALL, A100, (1, 1), batch=8, seq=1024, micro_batch=1)
