"""The op_overhead experiment (chapter 04): the overhead model and verdicts of its smoke
record."""

import experiment_cases
import pytest

from mlsys.experiments import op_overhead


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_overhead_model_and_verdicts(records):
    rows = records["op_overhead"]["results"]
    s = op_overhead.SIZES["smoke"]
    assert set(op_overhead.doubling(rows)) == set(s.sizes)
    m = op_overhead.model(rows)
    assert m.overhead_s > 0 and m.flat_n == pytest.approx(m.overhead_s * m.bytes_per_s / 8)
    text = op_overhead.verdicts(rows)["doubling"]
    assert text.startswith("no verdict") or f"{m.overhead_s * 1e6:.2f} µs" in text
    assert len(op_overhead.remedy_table(rows).rows) == 4
