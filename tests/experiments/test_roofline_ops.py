"""The roofline_ops experiment (chapter 03): its smoke record's rows against the accounting, and
verdicts that follow the numbers or are withheld."""

import experiment_cases
import pytest

from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.experiments import roofline_ops


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_roofline_ops_rows_carry_the_accounting(records):
    rows = records["roofline_ops"]["results"]
    s = roofline_ops.SIZES["smoke"]
    ops = {r["name"]: r for r in rows if r["kind"] == "op"}
    xy = ops["x + y"]
    assert (xy["read_bytes"], xy["write_bytes"]) == (2 * 4 * s.numel, 4 * s.numel)
    n = s.matmul_sizes[0]
    assert ops[f"matmul {n}"]["flops"] == flops.matmul_flops(n, n, n)
    batch, heads, seq, d = s.attention
    naive = ops[f"naive attention, seq {seq}"]
    traffic = bytes_moved.naive_attention_traffic(batch, heads, seq, d, "fp32")
    assert naive["read_bytes"] + naive["write_bytes"] == traffic.total_bytes
    assert {r["name"] for r in rows if r["kind"] == "allocation"} == {
        "fresh output", "existing output", "fresh output, freed memory kept"}
    table = roofline_ops.table(rows)
    assert len(table.rows) == len(ops)


def _synthetic_roofline_rows(op_seconds, problems=()):
    """Rows as `roofline_ops.run` writes them: a 10 GB/s copy, a 100 GFLOP/s matmul, and the ops."""
    def timing(seconds):
        return {"median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * 4}

    rows = [{"kind": "probe", "name": "copy", "unit": "bytes", "work": 1e10, **timing(1.0)},
            {"kind": "probe", "name": "matmul", "unit": "flop", "work": 1e11, **timing(1.0)}]
    ops = {"x * 2": ("elementwise", 1e9, 1e10), "softmax": ("row-wise", 5e9, 1e10),
           "matmul 64": ("matmul", 1e10, 1e7), "naive attention, seq 8": ("attention", 1e9, 1e9),
           "SDPA (fused attention), seq 8": ("attention", 1e9, 1e7)}
    for name, (group, f, n_bytes) in ops.items():
        rows.append({"kind": "op", "name": name, "group": group, "flops": f, "read_bytes": n_bytes,
                     "write_bytes": 0, **timing(op_seconds[name])})
    rows.append({"kind": "consistency", "problems": list(problems), "attempts": 1, "dtype": "fp32"})
    return rows


def test_roofline_verdicts_follow_the_numbers():
    seconds = {"x * 2": 1.1, "softmax": 3.0, "matmul 64": 0.12, "naive attention, seq 8": 0.2,
               "SDPA (fused attention), seq 8": 0.05}
    v = roofline_ops.verdicts(_synthetic_roofline_rows(seconds))
    assert "x * 2 is at the memory roof (1.10x the predicted time)" in v["memory"]
    assert "softmax is 3.0x slower than the memory roof predicts" in v["memory"]
    assert ("matmul 64 reaches 83 GFLOP/s, at the compute roof (1.20x the predicted time)"
            == v["matmul"])
    assert v["attention"].startswith("SDPA is 4.00x faster than naive attention "
                                     "while moving 100x fewer bytes")
    problems = ["x * 2 ran 2.00x faster than ..."]
    withheld = roofline_ops.verdicts(_synthetic_roofline_rows(seconds, problems))
    assert all(text.startswith("no verdict") for text in withheld.values())
