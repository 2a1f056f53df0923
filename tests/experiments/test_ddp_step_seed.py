"""The seed's 2-GPU DDP runs predicted from its own all-reduce table
(`mlsys.experiments.ddp_step_seed`)."""

import pytest

from mlsys import third_party
from mlsys.accounting import comms as comms_cost
from mlsys.experiments import allreduce_bench, ddp_step_seed


def test_the_seeds_xl_run_predicted_from_its_own_all_reduce_table():
    rows = ddp_step_seed.third_party_rows()
    assert rows[0]["n_tensors"] == 435 and rows[0]["grad_bytes"] == 4 * 1_998_235_200
    naive = next(r for r in rows if r["mode_flag"] == "naive")
    assert naive["predicted_naive_s"] == pytest.approx(naive["communication_s"], rel=0.05)
    assert naive["predicted_flat_s"] == pytest.approx(0.0521, abs=0.001)
    naive_run, flat_run = (r for r in rows if r["mode_flag"] == "naive")
    assert flat_run["communication_s"] / naive_run["communication_s"] == pytest.approx(1.0,
                                                                                      abs=0.001)
    assert third_party.CS336_STUDENT_DDP_CLAIMED_MB == pytest.approx(4 * 1_998_235_200 / 2**20,
                                                                     abs=0.01)
    table = ddp_step_seed.third_party_table(rows)
    numbers = ddp_step_seed.third_party_numbers(rows)  # asserts what the runs show
    assert numbers["xl_naive_ms"] == pytest.approx(1e3 * naive_run["communication_s"])
    assert [row[1] for row in table.rows] == [r["mode_flag"] or "not shown" for r in rows]


def test_the_seeds_overlapped_runs_leave_more_than_the_tail_the_model_predicts():
    rows = ddp_step_seed.third_party_rows()
    first = rows[0]
    assert first["mode_flag"] is None
    assert first["predicted_bucketed_s"] < first["communication_s"] < first["predicted_flat_s"]
    tail = comms_cost.collective_time_s("all_reduce", 10_000 * 1_600 * 4, 2,
                                        alpha_s=allreduce_bench.third_party_fit().alpha_s,
                                        bytes_per_s=allreduce_bench.third_party_fit().bytes_per_s)
    assert first["predicted_bucketed_s"] == pytest.approx(tail)  # the embedding, ready last


def test_the_same_step_in_bf16_on_h100s_and_its_bucket_sweeps():
    from mlsys import hardware
    from mlsys.accounting import buckets, flops
    from mlsys.models.config import TransformerConfig

    case = ddp_step_seed.bf16_case(hardware.H100_SXM, 4, 512)
    fp32 = ddp_step_seed.grad_bytes("xl")
    assert case["sizes"] == [b // 2 for b in fp32[::-1]] and sum(case["sizes"]) == 2 * 1_998_235_200
    fwd = flops.transformer_flops(TransformerConfig.preset("xl"), 4, 512).forward_matmul_flops
    assert case["backward_s"] == pytest.approx(2 * fwd / hardware.H100_SXM.peak_flop_per_s("bf16"))
    assert set(case["links"]) == {"nvlink4", "pcie5"}
    caps = [c * 2**20 for c in (1, 25, 1_024)]
    sweeps, numbers = ddp_step_seed.bucket_sweeps(caps, case, 0.53)
    fast = sweeps["2 H100s, bf16, backward at peak"]
    assert [p.cap_bytes for p in fast] == caps and numbers["valley"] == "25"
    assert numbers["best_ms"] == pytest.approx(1e3 * fast[1].exposed_s)
    assert numbers["best_ms"] == pytest.approx(1e3 * buckets.overlap_exposed_s(
        buckets.bucket_bytes(case["sizes"], 25 * 2**20), case["backward_s"], 2,
        **case["links"]["nvlink4"]))
    assert len(ddp_step_seed.sweep_table(fast).rows) == 3
    with pytest.raises(AssertionError):  # a backward that hides everything: the claims fail
        ddp_step_seed.bucket_sweeps(caps, {**case, "backward_s": 10.0}, 0.53)


def test_zero_traffic_against_the_seeds_formulas():
    numbers, table = ddp_step_seed.zero_traffic(1_998_235_200, 8, 48)
    assert numbers["claim_s1"] > 2 and numbers["claim_s2"] < 1 and numbers["claim_s3"] > 3
    assert [row[2] for row in table.rows] == ["1.00", "1.00", "1.00", "1.50"]


def test_the_seeds_overlap_miss_is_stated_and_no_bucket_cap_explains_it():
    numbers = ddp_step_seed.third_party_numbers(ddp_step_seed.third_party_rows())
    assert numbers["xl_overlap_x"] > 10 and numbers["xl_overlap_ms"] > 5 * numbers["xl_gb_cap_ms"]
    assert numbers["xl_overlap_lo_ms"] == pytest.approx(7.083)  # the second run
    assert numbers["xl_hidden_pct"] == pytest.approx(100 * (1 - 7.419 / 70.061))
    assert 1_000 < numbers["xl_alone_mib"] < 1_200  # one all-reduce of ~1 GiB at their beta


def test_the_seeds_gpus_are_inferred_from_their_bandwidth_and_memory():
    gpu = ddp_step_seed.seed_gpu()
    assert gpu["seed_busbw_gb"] > 4 * gpu["pcie4_gb"]  # NVLink, not PCIe
    assert 40 < gpu["seed_need_gb"] < 80  # the 80 GB part, not the 40 GB one


def test_the_data_parallel_roofline_matches_the_bucket_queue_and_the_scaling_book():
    """Compute-bound when tokens per GPU > (n-1)/n x C / W: the Scaling Book's "Training"
    chapter, pure data parallelism: B / X > C / W_ici."""
    from mlsys import hardware

    case = ddp_step_seed.bf16_case(hardware.H100_SXM, 4, 512)
    dgx = hardware.get_cluster("dgx-h100")
    numbers, table = ddp_step_seed.dp_roofline(case, hardware.H100_SXM, 4, 512, dgx)
    peak = hardware.H100_SXM.peak_flop_per_s("bf16")
    assert numbers["roof_ridge_0"] == pytest.approx(peak / 450e9)
    n_fac = numbers["roof_per_token_n"]
    assert 4 < n_fac < 4.3  # 4 N of backward matmuls per token, and a little attention
    # 2 ranks: (n-1)/n = 1/2 of C / W, in units of the backward's 4N per token
    assert numbers["roof_critical_0"] == pytest.approx(peak / 450e9 * 2 * 0.5 * 2 / n_fac)
    assert [row[-1] for row in table.rows] == ["hides", "exposed", "exposed", "exposed"]
    assert numbers["roof_critical_3"] == pytest.approx(8 * numbers["roof_critical_2"])
    bigger = ddp_step_seed.bf16_case(hardware.H100_SXM, 8, 512)  # 4,096 tokens pass 2 nodes
    assert ddp_step_seed.dp_roofline(bigger, hardware.H100_SXM, 8, 512, dgx)[1].rows[2][-1] == \
        "hides"


def test_cross_node_all_reduces_egress_hierarchy_and_in_network_reduction():
    from mlsys import hardware

    dgx = hardware.get_cluster("dgx-h100")
    numbers, table = ddp_step_seed.cross_node(4e9, dgx, 16, alpha_s=0.0)
    assert numbers["cn_port_ms"] == pytest.approx(8 * numbers["cn_egress_ms"])
    assert numbers["cn_two_ms"] == pytest.approx(numbers["cn_egress_ms"] * (15 / 16) / (127 / 128))
    assert numbers["cn_sharp_ms"] < 0.6 * numbers["cn_two_ms"]
    assert (numbers["cn_steps_flat"], numbers["cn_steps_two"]) == (254, 44)
    assert len(table.rows) == 4
    with pytest.raises(ValueError, match="nodes must be a positive"):
        ddp_step_seed.cross_node(4e9, dgx, 0, alpha_s=0.0)
