"""Chapter 01's live runs (`mlsys.experiments.running_sums`): every partial sum measured with torch
equals its prediction, and the table and figure read the sums."""

import matplotlib
import pytest

from mlsys import plotting
from mlsys.experiments import running_sums

matplotlib.use("Agg")
VARIANTS = [("fp32", 0.01, 400, "fp32", "fp32", False), ("fp16", 0.01, 400, "fp16", "fp16", False),
            ("bf16", 0.01, 400, "bf16", "bf16", False),
            ("fp32 acc += bf16 addend", 0.01, 400, "bf16", "fp32", True)]


@pytest.fixture(scope="module")
def sums():
    return running_sums.run(VARIANTS)


def test_every_partial_sum_is_predicted(sums):
    assert list(sums) == [(v[0], v[1]) for v in VARIANTS]
    for s in sums.values():
        assert s.trajectory == s.predicted.trajectory() and s.final == s.trajectory[-1]
    predicted, final = sums[("bf16", 0.01)][:2]  # still a (prediction, final) pair
    assert (predicted.stall_step, final) == (350, 4.0)  # bf16 freezes at its plateau


def test_a_wrong_prediction_stops_the_run(monkeypatch):
    real = running_sums.summation.running_sum
    monkeypatch.setattr(running_sums.summation, "running_sum",
                        lambda *args, **kwargs: real(*args, **kwargs) * 1.5)
    with pytest.raises(AssertionError):
        running_sums.run(VARIANTS[:1])


def test_the_table_and_the_figure_read_the_sums(sums):
    table = running_sums.table(sums)
    assert [row[1] for row in table.rows] == [v[0] for v in VARIANTS]
    assert table.rows[2][-1].startswith(f"{sums[('bf16', 0.01)].predicted.stall_step} (")
    _, axes = plotting.subplots(1, 2)
    running_sums.plot(sums, axes[:1], cases=[(0.01, 400)])
    assert len(axes[0].lines) == 1 + 2 * len(running_sums.TRACED) + 1  # and bf16's plateau


def test_readings_are_the_runs_and_finals_the_page_quotes():
    sums = running_sums.run([(fmt, a, n, fmt, fmt, False) for fmt in running_sums.TRACED
                             for a, n in ((0.01, 1000), (0.001, 300))])
    got = running_sums.readings(sums, 0.01, 0.001)
    fp16 = sums[("fp16", 0.01)].predicted
    assert got["a_fp16"] == fp16.addend == 0.01000213623046875  # 0.01 as fp16 stores it
    run = fp16.run_starting_in(4, 8)  # between 4 and 8 the ulp is 2^-8: each step adds 3 ulps
    assert got["fp16_lo_step"] == run.increment == 3 * 2.0**-8
    assert got["fp16_lo_bias"] == (3 * 2.0**-8 - fp16.addend) / fp16.addend
    assert got["final_bf16"] == 4.0 and got["stall_bf16_run"] == 350  # frozen at the plateau
    assert got["bf16_half_ulp_at_plateau"] == 2.0**-6 > got["a_bf16"]  # half of bf16's ulp at 4
    assert got["stall_fp32_run"] == 0 and got["final_fp32_small"] == sums[("fp32", 0.001)].final
    with pytest.raises(KeyError):
        running_sums.readings(sums, 0.01, 0.002)  # no sums of that addend
