"""The planner check of the chapter 09 experiment (`parallel_step_run.planner_rows`), on launch rows
built here (tests/experiment_cases.py): the calibration is the launch's own measurements, and every
prediction is `planner.evaluate` on the measured cluster. (The launch itself runs in the smoke
records of tests/experiments/test_preflight.py.)"""

import pytest
from experiment_cases import ALPHA, BETA, S, measured, per_rank, planner_case

from mlsys.accounting import parallel, planner
from mlsys.experiments import parallel_step
from mlsys.models.config import TransformerConfig


def test_the_planner_is_calibrated_on_the_launch_and_predicts_every_mesh_that_ran():
    rows = planner_case(per_rank(), measured())
    cal = parallel_step.calibration(rows)
    cfg = TransformerConfig.preset(S.preset)
    per_token = parallel.model_shape(cfg, seq=S.seq, dtype="fp32").training_flops_per_token
    flops = per_token * S.batch * S.seq
    assert cal["flop_per_s"] == pytest.approx(flops / 0.02)
    assert cal["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert cal["bytes_per_s"] == pytest.approx(BETA, rel=1e-6)
    predicted = [r for r in rows if r["kind"] == "planner"]
    assert [r["run"] for r in predicted] == ["dp", "1f1b, m = 1", "1f1b, m = 4", "fsdp", "tp"]
    cluster = planner.measured_cluster("x", flop_per_s=cal["flop_per_s"], dtype="fp32",
                                       link_bytes_per_s=cal["bytes_per_s"], per_node=2,
                                       memory_bytes=1e12)
    axes = {"dp": {"dp_replicate": 2}, "fsdp": {"dp_shard": 2}, "tp": {"tp": 2}}
    for r in predicted:
        dims = parallel.ParallelDims(**axes.get(r["run"], {"pp": 2}), world_size=2)
        plan = planner.evaluate(cfg, cluster, dims, batch=S.batch, seq=S.seq,
                                microbatches=r["microbatches"], recipe="fp32_adamw",
                                dtype="fp32")
        assert (r["predicted_s"], r["serial_s"]) == pytest.approx((plan.step_s,
                                                                   plan.serial_step_s))
        assert r["compute_s"] == pytest.approx(flops / 2 / cal["flop_per_s"])
    assert next(r for r in predicted if r["run"] == "dp")["step"]["median_s"] == 0.015
    assert len(parallel_step.planner_table(rows).rows) == 5
