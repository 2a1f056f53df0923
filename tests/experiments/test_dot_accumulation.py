"""The dot_accumulation experiment: a smoke run checked against Higham's bounds, and its readers."""

import json

import matplotlib
import pytest

from mlsys.experiments import dot_accumulation, pages
from mlsys.numerics import summation
from mlsys.numerics.precision import FORMATS

matplotlib.use("Agg")
U16 = FORMATS["fp16"].unit_roundoff
LOOP16, KAHAN, LOOP32 = dot_accumulation.LOOPS


@pytest.fixture(scope="module")
def rows():
    return dot_accumulation.run(dot_accumulation.SIZES["smoke"], device="cpu")


def test_rows_are_json_and_cover_every_length_and_method(rows):
    assert json.loads(json.dumps(rows)) == rows
    curves = dot_accumulation.curves(rows)
    lengths = list(dot_accumulation.SIZES["smoke"].lengths)
    assert {LOOP16, KAHAN, LOOP32} <= set(curves)
    assert all([k for k, _ in errs] == lengths for errs in curves.values())
    assert dot_accumulation.unsupported(rows) == {}  # on a CPU every method runs
    assert dot_accumulation.setup(rows)["rows"] * dot_accumulation.setup(rows)["cols"] == 16 * 16


def test_the_loops_obey_highams_bounds(rows):
    """Positive terms: relative error <= gamma_(K-1) (exact products) or gamma_K (rounded ones)."""
    curves = dot_accumulation.curves(rows)
    for k, err in curves[LOOP32]:
        assert err <= summation.recursive_sum_error_bound(k, "fp32")
    for k, err in curves[LOOP16]:
        bound = dot_accumulation.higham_bound(k, "fp16", rounded_products=True)
        assert bound >= 1 or err <= bound


def test_the_fp16_loop_grows_worse_and_kahan_stays_near_one_rounding(rows):
    curves = dot_accumulation.curves(rows)
    fp16 = [e for _, e in curves[LOOP16]]
    assert fp16[-1] > 10 * fp16[0]  # the running sum's error grows with K
    for k, err in curves[KAHAN]:
        # rounded products (u) + Kahan's first-order bound (2u) + a second-order allowance (K u^2)
        assert err <= 3 * U16 + k * U16**2
    assert curves[KAHAN][-1][1] < fp16[-1] / 10


def test_highams_bound_is_vacuous_for_fp16_from_k_1025():
    first = next(k for k in range(2, 5000)
                 if dot_accumulation.higham_bound(k, "fp16", rounded_products=False) >= 1)
    assert first == 2**10 + 1  # gamma_(K-1) >= 1 once (K-1) u >= 1/2
    first_rounded = next(k for k in range(2, 5000)
                         if dot_accumulation.higham_bound(k, "fp16", rounded_products=True) >= 1)
    assert first_rounded == 2**10


def test_the_table_hides_vacuous_bounds_and_the_plot_draws(rows):
    import matplotlib.pyplot as plt

    t = dot_accumulation.table(rows)
    assert len(t.rows) == len(dot_accumulation.SIZES["smoke"].lengths)
    by_k = {r[0]: r for r in t.rows}
    assert by_k["1,024"][-2] == "-" and by_k["256"][-2] != "-"
    fig, ax = plt.subplots()
    dot_accumulation.plot(rows, ax, title="t")
    assert len(ax.lines) >= len(dot_accumulation.curves(rows)) + 2
    plt.close(fig)
    assert "256 dot products per K" in dot_accumulation.describe(rows)


def _synthetic(err, out):
    rows = [
        {"kind": "dot", "method": LOOP16, "output": "fp16", "K": 4096, "max_rel_error": 0.1},
        {"kind": "dot", "method": LOOP32, "output": "fp32", "K": 4096, "max_rel_error": 1e-6},
        {"kind": "dot", "method": "device", "output": out, "K": 4096, "max_rel_error": err},
    ]
    return dot_accumulation.accumulator_verdict(rows, "device")


def test_the_verdict_follows_the_numbers():
    assert "hides how wide the accumulator is" in _synthetic(4e-4, "fp16")
    assert "below the fp32 running sum" in _synthetic(5e-7, "fp32")
    assert "close to the fp32 running sum" in _synthetic(1.5e-6, "fp32")
    assert "fewer bits than fp32" in _synthetic(1e-3, "fp32") and "100x" in _synthetic(1e-3, "fp32")
    assert "no better than the fp16 running sum" in _synthetic(0.2, "fp32")


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="ascend"):
        dot_accumulation.Sizes((64, 16), 16, 16)
    with pytest.raises(ValueError, match="exact int64"):
        dot_accumulation.Sizes((16, 2**15), 16, 16)
    with pytest.raises(ValueError, match="multiples of 16"):
        dot_accumulation.Sizes((16, 40), 16, 16)
    assert dot_accumulation.EXPERIMENT.sizes_for("smoke") == dot_accumulation.SIZES["smoke"]


def test_a_method_that_fails_is_reported_and_the_readers_cope(monkeypatch):
    original = dot_accumulation._device_methods

    def broken(a, b):
        raise RuntimeError("no kernel for this\nsecond line")

    def with_a_broken_method(device):
        return {**original(device), "broken (cpu)": ("fp16", "fp32", broken)}

    monkeypatch.setattr(dot_accumulation, "_device_methods", with_a_broken_method)
    rows = dot_accumulation.run(dot_accumulation.Sizes((16, 32), 16, 16), device="cpu")
    assert dot_accumulation.unsupported(rows) == {"broken (cpu)": "no kernel for this"}
    assert "broken (cpu)" not in dot_accumulation.curves(rows)
    partial = [r for r in rows if not (r.get("method") == LOOP32 and r.get("K") == 32)]
    assert dot_accumulation.table(partial).rows[1][3] == "-"  # a missing measurement shows as "-"


def test_the_page_reads_the_headline_and_draws_a_record(rows, monkeypatch):
    head = dot_accumulation.headline(rows)
    curves = dot_accumulation.curves(rows)
    assert head["dot_count"] == 16 * 16
    assert head["dot_k_max"] == dot_accumulation.SIZES["smoke"].lengths[-1]
    assert head["dot_fp16_error"] == curves[LOOP16][-1][1]
    assert head["dot_kahan_u"] == pytest.approx(curves[KAHAN][-1][1] / U16)
    assert head["dot_device_verdicts"] == dot_accumulation.device_verdicts(rows)
    record = {"results": rows, "provenance": {"device": "cpu"}}
    assert pages.show_dot_accumulation(record) == dot_accumulation.device_verdicts(rows) + "."
