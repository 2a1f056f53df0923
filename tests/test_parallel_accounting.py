"""mlsys.accounting.parallel, .pipeline and .compute_bound: the mesh, memory and bytes per device,
the bubble, and the compute-bound conditions, against golden numbers, the real model, the
Scaling Book's worked figures and the CS336 4D-parallelism question (XXL). Pure: no ranks."""

import math

import pytest
from parallel_cases import CFG

from mlsys import hardware
from mlsys.accounting import compute_bound as CB
from mlsys.accounting import parallel as P
from mlsys.accounting import pipeline as PL
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.memory import model_state_bytes
from mlsys.accounting.params import count_params
from mlsys.models.config import TransformerConfig

V5P_C = hardware.TPU_V5P.peak_flop_per_s("bf16")
V5P_W = hardware.LINKS["ici-v5p-axis"].bytes_per_s
SEED_C = 4.6e14  # the CS336 question's rounding of the v5p's 459 TFLOP/s


# --- the mesh -------------------------------------------------------------------------------------


def test_dims_check_the_product_and_show_the_arithmetic():
    dims = P.ParallelDims(dp_replicate=2, dp_shard=4, tp=8, pp=2, cp=2)
    assert dims.world_size == 256 and dims.dp == 8 and dims.fsdp == 8
    assert dims.shape == (2, 2, 4, 2, 8)  # MESH_AXES order: pp, dp_replicate, dp_shard, cp, tp
    with pytest.raises(ValueError, match=r"pp \(1\) \* dp_replicate \(1\) \* dp_shard \(2\) \* "
                                         r"cp \(1\) \* tp \(3\) = 6 != world_size \(8\)"):
        P.ParallelDims(dp_shard=2, tp=3, world_size=8)
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        P.ParallelDims(tp=0)
    with pytest.raises(TypeError, match="pp must be an integer"):
        P.ParallelDims(pp=2.0)


def test_coordinates_groups_and_spans():
    dims = P.ParallelDims(pp=2, dp_shard=2, cp=2, tp=2)
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
    ok = P.ParallelDims(tp=2, pp=2, cp=2, dp_shard=2)
    P.check_model(CFG, ok, batch=4, seq=8, microbatches=2)
    for dims, kw, message in (
            (P.ParallelDims(tp=8), {}, r"n_heads \(4\) is not divisible by tp \(8\)"),
            (P.ParallelDims(pp=5), {}, r"pp \(5\) must be <= n_layers \(4\)"),
            (ok, {"batch": 6}, r"batch \(6\) is not divisible by dp_replicate \* dp_shard \* "
                               r"microbatches = 2 \* 2 = 4"),
            (ok, {"seq": 9}, r"seq \(9\) is not divisible by cp \(2\)"),
            (ok, {"seq": 32}, r"seq \(32\) must be <= context_length \(16\)")):
        with pytest.raises(ValueError, match=message):
            P.check_model(CFG, dims, **{"batch": 4, "seq": 8, "microbatches": 2, **kw})
    assert P.stage_layers(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))


# --- what each device holds -----------------------------------------------------------------------


def test_the_model_shape_adds_up_to_the_real_model():
    shape = P.model_shape(CFG)
    for pp in (1, 2, 4):
        assert sum(shape.stage_params(s, pp, 1) for s in range(pp)) == count_params(CFG)
    xl = TransformerConfig.preset("xl")
    assert P.model_shape(xl).block_tp_params == 4 * 1600**2 + 3 * 1600 * 6400
    assert P.model_shape(xl).block_other_params == 2 * 1600


def test_device_memory_shards_states_and_activations_as_documented():
    xl = TransformerConfig.preset("xl")
    kw = {"micro_batch": 4, "seq": 1024}
    one = P.device_memory(xl, P.ParallelDims(), **kw)
    assert one.states == model_state_bytes(count_params(xl), "bf16_mixed_adamw")
    assert one.gathered == 0
    fsdp = P.device_memory(xl, P.ParallelDims(dp_shard=8), **kw)
    assert fsdp.states == pytest.approx(one.states / 8)
    assert fsdp.activations == one.activations  # FSDP does not shard activations
    tp = P.device_memory(xl, P.ParallelDims(tp=5), **kw)
    sp = P.device_memory(xl, P.ParallelDims(tp=5), sequence_parallel=True, **kw)
    assert sp.activations < tp.activations < one.activations
    cp = P.device_memory(xl, P.ParallelDims(cp=2), **kw)
    assert cp.activations == pytest.approx(one.activations / 2)
    gpipe = P.device_memory(xl, P.ParallelDims(pp=4), microbatches=8, schedule="gpipe", **kw)
    ofob = P.device_memory(xl, P.ParallelDims(pp=4), microbatches=8, **kw)
    assert gpipe.activations > ofob.activations  # 8 micro-batches in flight against 4
    assert sum(one.as_dict().values()) == one.total


# --- the CS336 4D question (the XXL model) -------------------------------------------------------


def test_xxl_part_a_states_and_saved_activations():
    assert P.XXL.n_params == 219_848_638_464
    states = model_state_bytes(P.XXL.n_params, "fp32_adamw")  # fp32 weights, grads, m and v
    assert states == 3_517_578_215_424
    assert math.ceil(states / hardware.H100_SXM.hbm_bytes) == 44
    shape = P.model_shape(P.XXL, dtype="bf16")  # saved for backward: x (D) and w_in x (F)
    per_token = P.XXL.n_layers * (shape.act_tp_bytes + shape.act_other_bytes)
    assert per_token == 126 * (16_384 + 53_248) * 2 == 17_547_264


def test_xxl_part_b_fsdp_shards_to_fit_a_v5p():
    states = model_state_bytes(P.XXL.n_params, "fp32_adamw")
    hbm = hardware.TPU_V5P.hbm_bytes
    assert P.min_shards_to_fit(hbm, states) == 38  # 3,517.6 GB / 95 GB = 37.03
    tokens = 2_048
    act = 17_547_264 * tokens
    n = P.min_shards_to_fit(hbm, states, act, activation_shard_fraction=0.5)
    for shards, fits in ((n, True), (n - 1, False)):
        mem = P.device_memory(P.XXL, P.ParallelDims(dp_shard=shards), micro_batch=tokens, seq=1,
                              recipe="fp32_adamw", activation_shard_fraction=0.5,
                              gathered_units=0)
        assert mem.total == pytest.approx(states / shards + act * (0.5 + 0.5 / shards))
        assert (mem.total <= hbm) is fits
    with pytest.raises(ValueError, match="no number of shards fits"):
        P.min_shards_to_fit(hbm, states, 2 * hbm, activation_shard_fraction=0.5)


def test_xxl_part_c_compute_bound_batch_for_fsdp_16_tp_4():
    assert V5P_W == 2 * hardware.LINKS["ici-v5p"].bytes_per_s == 1.8e11  # W_ici = 2 x 9e10
    assert CB.ici_intensity(V5P_C, V5P_W) == pytest.approx(2550)  # the Scaling Book's alpha
    kw = {"x": 16, "y": 4, "link_bytes_per_s": V5P_W, "m_x": 2, "m_y": 1}
    per_device = CB.compute_bound_batch(P.XXL.d_ff, flop_per_s=V5P_C, **kw)
    assert per_device == pytest.approx(2550 / (4 * 2))  # alpha / (Y M_X) = 318.75 tokens
    assert per_device * 64 == pytest.approx(20_400)
    assert CB.compute_bound_batch(P.XXL.d_ff, flop_per_s=SEED_C, **kw) * 64 == \
        pytest.approx(20_444.4, rel=1e-5)
    for factor, bound in ((1.01, True), (0.99, False)):
        t = CB.layer_times(per_device * 64 * factor, P.XXL.d_model, P.XXL.d_ff,
                           flop_per_s=V5P_C, **kw)
        assert t.compute_bound is bound and t.tp_s < t.math_s  # TP alone is never the limit
    # the book's closed form assumes its optimal split, far from X = 16 here
    best = CB.optimal_compute_bound_batch(P.XXL.d_ff, flop_per_s=V5P_C, link_bytes_per_s=V5P_W,
                                          m_x=2, m_y=1)
    assert best == pytest.approx(2550**2 / (2 * 53_248))  # 61.1 tokens per device
    assert CB.optimal_fsdp_degree(best * 64, P.XXL.d_ff, 64, m_x=2) == pytest.approx(3.07,
                                                                                   abs=0.01)


def test_the_scaling_books_worked_figures():
    # pure FSDP / DP: B / X > alpha / M_X; three axes: about 850
    assert CB.compute_bound_batch(8192, x=64, flop_per_s=V5P_C, link_bytes_per_s=V5P_W,
                                  m_x=3) == pytest.approx(850)
    # TP: Y < M_Y F / alpha; LLaMA-3 70B's F ~ 30k: 8-way fine, 16-way not
    kw = {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W}
    assert CB.compute_bound_batch(28_672, y=8, **kw) == 0.0
    assert CB.compute_bound_batch(28_672, y=16, **kw) == math.inf
    # mixed at the optimum: F = 32,768, M_X M_Y = 2: "roughly B/N > 99"
    assert CB.optimal_compute_bound_batch(32_768, m_x=2, **kw) == pytest.approx(99.2, abs=0.1)
    # at X_opt, the two communications take the same time
    x = CB.optimal_fsdp_degree(48_000, 32_768, 64, m_x=2)
    fsdp = 4 * 8192 * 32_768 / ((64 / x) * V5P_W * 2)
    tp = 4 * 48_000 * 8192 / (x * V5P_W)
    assert fsdp == pytest.approx(tp)


# --- bytes each rank sends ------------------------------------------------------------------------


def test_traffic_formulas():
    ar = collective_cost("all_reduce", 32 * 16 * 4, 2).sent_bytes
    assert P.tp_sent_bytes(16, 2, tokens=32, n_blocks=3) == 3 * 4 * ar
    ag = collective_cost("all_gather", 32 * 16 * 4, 2).sent_bytes
    gains = collective_cost("all_reduce", 16 * 4, 2).sent_bytes
    assert P.tp_sent_bytes(16, 2, tokens=32, n_blocks=3, sequence_parallel=True) == \
        3 * (4 * ar + 2 * gains) + 2 * ag
    assert P.tp_sent_bytes(16, 1, tokens=32, n_blocks=3) == 0
    kv = 32 * 16 * 4
    assert P.cp_sent_bytes(16, 4, tokens=32, n_blocks=1) == 2 * 3 * 2 * kv + 4 * 2 * kv
    assert [P.pp_sent_bytes(s, 3, activation_bytes=10, microbatches=4) for s in range(3)] == \
        [40, 80, 40]
    assert P.padded(10, 4) == 12
    units = P.fsdp_units(CFG, P.ParallelDims(pp=2, tp=2), 1)
    assert len(units) == 1 + 2  # last stage: root (final norm, head) and two blocks


def test_communication_time_takes_the_slowest_link_each_group_crosses():
    cluster = hardware.get_cluster("dgx-h100")  # 8 GPUs per node: NVLink inside, IB between
    small = TransformerConfig.preset("small")
    dims = P.ParallelDims(dp_shard=2, tp=4)  # 8 ranks: one node
    kw = {"batch": 8, "seq": 1024, "act_dtype": "bf16", "param_dtype": "bf16"}
    sent, times = P.sent_bytes(small, dims, 0, **kw), P.comm_time_s(small, dims, cluster, 0, **kw)
    nvlink, ib = hardware.LINKS["nvlink4"].bytes_per_s, hardware.LINKS["ib-ndr"].bytes_per_s
    assert times["tp"] == pytest.approx(sent["tp"] / nvlink)
    assert times["all_gather"] == pytest.approx(sent["all_gather"] / nvlink)
    wide = P.ParallelDims(dp_shard=4, tp=4)  # 16 ranks: the FSDP group spans two nodes
    times = P.comm_time_s(small, wide, cluster, 0, **kw)
    assert times["all_gather"] == pytest.approx(P.sent_bytes(small, wide, 0, **kw)["all_gather"]
                                                / ib)
    assert times["cp"] == times["pp"] == 0.0
    with pytest.raises(TypeError, match="cluster must be a hardware.Cluster"):
        P.comm_time_s(small, dims, "dgx-h100", 0, **kw)


# --- the pipeline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", PL.SCHEDULES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_the_simulated_bubble_is_the_formula(schedule, p, m):
    for tf, tb in ((1.0, 1.0), (1.0, 2.0), (1.0, 3.5)):
        assert PL.simulated_bubble_fraction(p, m, schedule, forward_s=tf, backward_s=tb) == \
            pytest.approx(PL.bubble_fraction(p, m))
    for s in range(p):
        ops = PL.pipeline_schedule(s, p, m, schedule)
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        held, peak = 0, 0
        for op, _ in ops:
            held += 1 if op == "F" else -1
            peak = max(peak, held)
        assert peak == (m if schedule == "gpipe" else min(m, p - s))
        assert peak == PL.in_flight(s, p, m, schedule) or p == 1


def test_pipeline_arguments_are_checked():
    with pytest.raises(ValueError, match=r"stage \(2\) must be < n_stages \(2\)"):
        PL.pipeline_schedule(2, 2, 4)
    with pytest.raises(ValueError, match="schedule='interleaved' is not one of"):
        PL.pipeline_schedule(0, 2, 4, "interleaved")
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        PL.bubble_fraction(2, 0)
    assert P.bubble_fraction is PL.bubble_fraction  # re-exported by parallel
