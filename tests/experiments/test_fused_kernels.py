"""The fused_kernels experiment (chapter 04): its smoke record's rows use the kernels' cost
models."""

import experiment_cases
import pytest


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_fused_kernels_rows_use_the_cost_models(records):
    from mlsys.kernels.softmax import softmax_bytes

    rows = records["fused_kernels"]["results"]
    for r in rows:
        assert r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["bytes_per_s"] == pytest.approx(r["model_bytes"] / r["median_s"])
        if r["kernel"] == "softmax":
            assert r["model_bytes"] == softmax_bytes(tuple(r["shape"]), r["dtype"])
    assert {r["kernel"] for r in rows} == {"repeat_unary_fma", "cos_cos", "softmax", "rmsnorm"}
