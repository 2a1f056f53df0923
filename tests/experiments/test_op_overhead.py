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


def _rows(per_op: dict[int, float], *, in_place: bool = True) -> list[dict]:
    """A sweep whose time per op at n (and 2n) is `per_op[n]` (and `per_op[2n]`), with a bandwidth
    probe of 1e10 B/s (in place, or a copy as in records made before the in-place probe)."""
    probe = {"kind": "probe", "name": "bw", "unit": "bytes", "work": 1e8, "median_s": 1e-2,
             "in_place": in_place}
    if not in_place:
        del probe["in_place"]
    rows = [probe]
    for n in sorted(k for k in per_op if 2 * k in per_op):
        for size in (n, 2 * n):
            rows.append({"kind": "size", "n": size, "of": n, "per_op_s": per_op[size]})
    return rows


T0 = 1e-6  # the overhead; 8n / 1e10 passes it at n = 1,250


def _per_op(**override: float) -> dict[int, float]:
    times = {n: T0 + 8 * n / 1e10 for n in (1, 2, 4, 8, 1024, 2048, 2**14, 2**15, 2**20, 2**21)}
    times.update({int(k[1:]): v for k, v in override.items()})
    return times


def test_every_row_under_0p8x_the_model_is_named_with_its_cause():
    cached = _per_op(n16384=0.3 * (T0 + 8 * 2**14 / 1e10))  # beats the bandwidth: a cache
    text = op_overhead.fast_text(_rows(cached))
    assert "at n = 16,384 (0.30x) the measurement is under 0.8x the model, faster than beta " \
        "allows, so those tensors stay in a cache" in text
    largest = _per_op(n1048576=0.57 * (T0 + 8 * 2**20 / 1e10))  # the 0.57x of a large tensor
    text = op_overhead.fast_text(_rows(largest, in_place=False))
    assert "at the largest, n = 1,048,576 (4 MiB, beyond the caches), it is 0.57x the model" in text
    assert "write-allocate" in text  # beta read from a copy
    assert "this op gets more than the probe did" in op_overhead.fast_text(_rows(largest))
    overlap = _per_op(n1024=max(T0, 8 * 1024 / 1e10))  # max(T0, bytes), not their sum
    assert "the overhead overlapped the transfer" in op_overhead.fast_text(_rows(overlap))
    assert op_overhead.fast_text(_rows(_per_op())) == "no size runs under 0.8x the model"


def test_beta_comes_from_the_in_place_probe_when_there_is_one():
    rows = _rows(_per_op(), in_place=False)
    copy = {**rows[0], "name": "copy", "median_s": 2e-2}  # a copy probe at half the bandwidth
    assert op_overhead.model([copy, {**rows[0], "in_place": True}, *rows[1:]]).bytes_per_s == 1e10
    assert op_overhead.model([copy, *rows[1:]]).beta_from == "copy"
