"""The dot_accumulation experiment: a smoke run checked against Higham's bounds, and its readers."""

import json

import matplotlib
import pytest

from mlsys import summation as S
from mlsys.experiments import dot_accumulation as D
from mlsys.precision import FORMATS

matplotlib.use("Agg")
U16 = FORMATS["fp16"].unit_roundoff
LOOP16, KAHAN, LOOP32 = D.LOOPS


@pytest.fixture(scope="module")
def rows():
    return D.run(D.SIZES["smoke"], device="cpu")


def test_rows_are_json_and_cover_every_length_and_method(rows):
    assert json.loads(json.dumps(rows)) == rows
    curves = D.curves(rows)
    lengths = list(D.SIZES["smoke"].lengths)
    assert {LOOP16, KAHAN, LOOP32} <= set(curves)
    assert all([k for k, _ in errs] == lengths for errs in curves.values())
    assert D.unsupported(rows) == {}  # on a CPU every method runs
    assert D.setup(rows)["rows"] * D.setup(rows)["cols"] == 16 * 16


def test_the_loops_obey_highams_bounds(rows):
    """Positive terms: relative error <= gamma_(K-1) (exact products) or gamma_K (rounded ones)."""
    curves = D.curves(rows)
    for k, err in curves[LOOP32]:
        assert err <= S.recursive_sum_error_bound(k, "fp32")
    for k, err in curves[LOOP16]:
        bound = D.higham_bound(k, "fp16", rounded_products=True)
        assert bound >= 1 or err <= bound


def test_the_fp16_loop_grows_worse_and_kahan_stays_near_one_rounding(rows):
    curves = D.curves(rows)
    fp16 = [e for _, e in curves[LOOP16]]
    assert fp16[-1] > 10 * fp16[0]  # the running sum's error grows with K
    for k, err in curves[KAHAN]:
        # rounded products (u) + Kahan's first-order bound (2u) + a second-order allowance (K u^2)
        assert err <= 3 * U16 + k * U16**2
    assert curves[KAHAN][-1][1] < fp16[-1] / 10


def test_highams_bound_is_vacuous_for_fp16_from_k_1025():
    first = next(
        k for k in range(2, 5000) if D.higham_bound(k, "fp16", rounded_products=False) >= 1
    )
    assert first == 2**10 + 1  # gamma_(K-1) >= 1 once (K-1) u >= 1/2
    first_rounded = next(
        k for k in range(2, 5000) if D.higham_bound(k, "fp16", rounded_products=True) >= 1
    )
    assert first_rounded == 2**10


def test_the_table_hides_vacuous_bounds_and_the_plot_draws(rows):
    import matplotlib.pyplot as plt

    t = D.table(rows)
    assert len(t.rows) == len(D.SIZES["smoke"].lengths)
    by_k = {r[0]: r for r in t.rows}
    assert by_k["1,024"][-2] == "-" and by_k["256"][-2] != "-"
    fig, ax = plt.subplots()
    D.plot(rows, ax, title="t")
    assert len(ax.lines) >= len(D.curves(rows)) + 2
    plt.close(fig)
    assert "256 dot products per K" in D.describe(rows)


def _synthetic(err, out):
    rows = [
        {"kind": "dot", "method": LOOP16, "output": "fp16", "K": 4096, "max_rel_error": 0.1},
        {"kind": "dot", "method": LOOP32, "output": "fp32", "K": 4096, "max_rel_error": 1e-6},
        {"kind": "dot", "method": "device", "output": out, "K": 4096, "max_rel_error": err},
    ]
    return D.accumulator_verdict(rows, "device")


def test_the_verdict_follows_the_numbers():
    assert "hides how wide the accumulator is" in _synthetic(4e-4, "fp16")
    assert "below the fp32 running sum" in _synthetic(5e-7, "fp32")
    assert "close to the fp32 running sum" in _synthetic(1.5e-6, "fp32")
    assert "fewer bits than fp32" in _synthetic(1e-3, "fp32") and "100x" in _synthetic(1e-3, "fp32")
    assert "no better than the fp16 running sum" in _synthetic(0.2, "fp32")


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="ascend"):
        D.Sizes((64, 16), 16, 16)
    with pytest.raises(ValueError, match="exact int64"):
        D.Sizes((16, 2**15), 16, 16)
    with pytest.raises(ValueError, match="multiples of 16"):
        D.Sizes((16, 40), 16, 16)
    assert D.EXPERIMENT.sizes_for("smoke") == D.SIZES["smoke"]


def test_a_method_that_fails_is_reported_and_the_readers_cope(monkeypatch):
    original = D._device_methods

    def broken(a, b):
        raise RuntimeError("no kernel for this\nsecond line")

    def with_a_broken_method(device):
        return {**original(device), "broken (cpu)": ("fp16", "fp32", broken)}

    monkeypatch.setattr(D, "_device_methods", with_a_broken_method)
    rows = D.run(D.Sizes((16, 32), 16, 16), device="cpu")
    assert D.unsupported(rows) == {"broken (cpu)": "no kernel for this"}
    assert "broken (cpu)" not in D.curves(rows)
    partial = [r for r in rows if not (r.get("method") == LOOP32 and r.get("K") == 32)]
    assert D.table(partial).rows[1][3] == "-"  # a missing measurement shows as "-"
