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
