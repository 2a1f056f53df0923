"""The chapter 09 experiment's planner check (`parallel_step.planner_rows` and its verdict), on
rows built here: the calibration is the launch's own measurements, every prediction is
`planner.evaluate` on the measured cluster, and the verdict follows the numbers or is withheld.
(The launch itself runs in the smoke records of test_experiments.py.)"""

import pytest

from mlsys.accounting import comms as C
from mlsys.accounting import parallel as P
from mlsys.accounting import planner
from mlsys.experiments import parallel_step
from mlsys.models.config import TransformerConfig

S = parallel_step.SIZES["smoke"]
ALPHA, BETA = 2e-4, 1.5e9


def _timing(seconds, spread=1.0):
    samples = [seconds / spread, seconds, seconds * spread]
    return {"median_s": seconds, "p20_s": samples[0], "p80_s": samples[-1], "samples_s": samples}


def _per_rank(alone_s=0.02, dp_s=0.015, link=True):
    times = {m: [C.collective_time_s("all_reduce", m, S.world_size, alpha_s=ALPHA,
                                     bytes_per_s=BETA)] * 3 for m in S.link_bytes}
    if not link:  # times that do not grow with the size: no fit
        times = {m: [1e-3] * 3 for m in S.link_bytes}
    return [{"alone": {"times": [alone_s] * S.steps}, "dp": {"times": [dp_s] * S.steps},
             "all_reduce": times} for _ in range(S.world_size)]


def _measured(spread=1.0):
    rows = [{"kind": "bubble", "schedule": "1f1b", "microbatches": m,
             "span": _timing(0.012 + 0.002 * m, spread)} for m in S.microbatches]
    rows += [{"kind": "fsdp", "variant": "ours, prefetch", "step": _timing(0.018, spread)},
             {"kind": "fsdp", "variant": "fully_shard", "step": _timing(0.02, spread)},
             {"kind": "tp", "variant": "ours", "step": _timing(0.016, spread)}]
    return rows


def _rows(per_rank, measured):
    setup = {"kind": "setup", "world_size": S.world_size}
    return [*measured, *parallel_step.planner_rows(S, per_rank, measured), setup]


def test_the_planner_is_calibrated_on_the_launch_and_predicts_every_mesh_that_ran():
    rows = _rows(_per_rank(), _measured())
    cal = parallel_step.calibration(rows)
    cfg = TransformerConfig.preset(S.preset)
    flops = P.model_shape(cfg, seq=S.seq, dtype="fp32").training_flops_per_token * S.batch * S.seq
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
        dims = P.ParallelDims(**axes.get(r["run"], {"pp": 2}), world_size=2)
        plan = planner.evaluate(cfg, cluster, dims, batch=S.batch, seq=S.seq,
                                microbatches=r["microbatches"], recipe="fp32_adamw",
                                dtype="fp32")
        assert (r["predicted_s"], r["serial_s"]) == pytest.approx((plan.step_s,
                                                                   plan.serial_step_s))
        assert r["compute_s"] == pytest.approx(flops / 2 / cal["flop_per_s"])
    assert next(r for r in predicted if r["run"] == "dp")["step"]["median_s"] == 0.015
    assert len(parallel_step.planner_table(rows).rows) == 5


def test_the_planner_verdict_follows_the_numbers():
    rows = _rows(_per_rank(), _measured())
    text = parallel_step.planner_verdict(rows)
    runs = [r for r in rows if r["kind"] == "planner"]
    ratios = [r["predicted_s"] / r["step"]["median_s"] for r in runs]
    assert f"{min(ratios):.2f}x the measured one" in text and f"to {max(ratios):.2f}x" in text
    above = sum(r["step"]["median_s"] > r["serial_s"] for r in runs)
    assert f"{above} above both" in text and "of 10 pairs of runs" in text
    assert "us latency left out" in text
    noisy = _rows(_per_rank(), _measured(spread=3.0))
    assert parallel_step.planner_verdict(noisy).startswith("no verdict: the machine was too noisy")
    no_link = _rows(_per_rank(link=False), _measured())
    assert [r["kind"] for r in no_link if r["kind"] in ("calibration", "planner")] == [
        "calibration"]
    assert "gave no link to calibrate on" in parallel_step.planner_verdict(no_link)
