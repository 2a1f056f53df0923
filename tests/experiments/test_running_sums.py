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
