"""Chapter 01's live runs (`mlsys.experiments.running_sums`): every partial sum measured with torch
equals its prediction, and the table and figure read the sums."""

import math

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


def test_the_format_rows_are_checked_against_torch():
    rows = running_sums.format_rows()
    assert [r[0] for r in rows] == list(running_sums.precision.FORMATS)
    by_name = {r[0]: r for r in rows}
    assert by_name["fp16"][6] == "2, 2046" and by_name["fp8_e4m3"][6] == "0, 2"
    assert by_name["tf32"][-1] == "-"  # no torch dtype: its limits are derived, not compared


def test_the_bit_rows_match_torchs_bits():
    rows = running_sums.bit_rows([0.1, 65504.0], ["bf16", "fp8_e4m3"])
    assert [r[:2] for r in rows] == [[0.1, "bf16"], [0.1, "fp8_e4m3"], [65504.0, "bf16"],
                                     [65504.0, "fp8_e4m3"]]
    assert rows[3][-1] == "448.0"  # e4m3 saturates
    assert rows[0][2].replace(" ", "") == "0011110111001101"  # 0.1 in bf16


CASES = [("sum", 0.01, 400, 0.0), ("weight", 1e-3, 300, 1.0)]


def test_stochastic_rounding_keeps_what_round_to_nearest_loses():
    table, out = running_sums.stochastic_table(CASES, "bf16", trials=64, seed=0)
    assert [r[0] for r in table.rows] == ["sum", "weight"]
    sums, nearest = out["weight"]
    assert nearest == 1.0 and sums.exact > 1.25  # round to nearest loses every update
    for sums, nearest in out.values():
        words = running_sums.stochastic_verdict(sums, nearest)
        assert words.startswith("unbiased") and "within its sqrt(n) bound" in words


def _shifted(sums, by):
    return running_sums.stochastic.StochasticSums(
        sums.fmt, sums.start, sums.addend, sums.n, tuple(v + by for v in sums.finals),
        sums.largest + abs(by))


def test_the_verdict_cannot_call_a_biased_or_too_wide_sum_unbiased():
    _, out = running_sums.stochastic_table(CASES[:1], "bf16", trials=64, seed=0)
    sums, nearest = out["sum"]
    # a systematic miss of 5 standard errors: the words say biased, whatever the spread
    off = _shifted(sums, 5 * sums.standard_error)
    assert running_sums.stochastic_verdict(off, nearest).startswith("biased")
    # a miss just inside the limit stays unbiased; at the limit it does not (no tie to chance)
    inside = _shifted(sums, (running_sums.BIAS_LIMIT - 0.5) * sums.standard_error - (
        sums.mean - sums.exact))
    assert running_sums.stochastic_verdict(inside, nearest).startswith("unbiased")
    at = _shifted(sums, running_sums.BIAS_LIMIT * sums.standard_error * 1.001 - (
        sums.mean - sums.exact))
    assert running_sums.stochastic_verdict(at, nearest).startswith("biased")
    # a spread 1.8x the bound is reported as above it
    wide = running_sums.stochastic.StochasticSums(
        sums.fmt, sums.start, sums.addend, sums.n,
        (sums.exact - 1.8 * sums.std_bound, sums.exact + 1.8 * sums.std_bound), sums.largest)
    assert "above its sqrt(n) bound" in running_sums.stochastic_verdict(wide, nearest)


def test_the_scaling_table_and_its_readings():
    table, errors = running_sums.scaling_table("fp8_e4m3", (1, 1e6), n=1024, std=1e-3,
                                               outliers=2, seed=0)
    assert [r[0] for r in table.rows] == ["1", "1,000,000"]
    assert set(errors) == {(r, s) for r in (1, 1e6) for s in running_sums.scaling.SCALINGS}
    got = running_sums.scaling_readings(errors, "fp8_e4m3")
    assert got["big_ratio"] == 1e6 and got["mx_block"] == 32
    assert got["tensor_err"] > 10 * got["block_err"] and got["none_flushed"] > 0.5
    assert got["fp8_octaves"] == pytest.approx(math.log2(448 / 2.0**-9))
