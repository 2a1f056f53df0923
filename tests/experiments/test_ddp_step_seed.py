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
