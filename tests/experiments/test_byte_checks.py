"""Chapter 04's live checks (`mlsys.experiments.byte_checks`): a linear layer's touches of W and dW
and its bytes against `bytes.linear_traffic`, and the fused kernels against their references."""

import torch
from kernel_cases import needs_triton

from mlsys.experiments import byte_checks


def test_a_linear_layer_reads_w_twice_and_writes_dw_once():
    touches = byte_checks.linear_touches(7, 11, 13, seed=0)  # asserts the byte count as well
    assert touches.count("W", kind="read") == 2
    assert (touches.count("dW", kind="read"), touches.count("dW", kind="write")) == (1, 1)
    table = byte_checks.touches_table(touches)
    assert table.header == ["aten op (forward + backward)", "reads", "writes"]
    assert len(table.rows) == len(touches.touches)
    assert any(row[1:] == ["dW", "dW"] for row in table.rows)  # accumulation reads and writes dW
    assert all(row[1] != "-" or row[2] != "-" for row in table.rows)


def test_the_same_seed_gives_the_same_touches():
    ops = [[t.op for t in byte_checks.linear_touches(3, 5, 4, seed=s).touches] for s in (1, 1)]
    assert ops[0] == ops[1] and ops[0]


@needs_triton
def test_every_kernel_matches_its_float64_reference():
    table = byte_checks.kernel_table(torch.Generator().manual_seed(0), "cpu")
    assert table.header == ["kernel", "dtype", "max |error| vs float64"]
    assert [row[:2] for row in table.rows] == [
        [kernel, dtype] for dtype in ("float32", "float16")
        for kernel in ("repeat_unary fma, k=5", "softmax (37, 61)", "rmsnorm (37, 61)")]
    assert all(float(row[2]) < 1e-2 for row in table.rows)
