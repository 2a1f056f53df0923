"""Chapter 04's live checks (`mlsys.experiments.byte_checks`): a linear layer's touches of W and dW
and its bytes against `bytes.linear_traffic`, and the fused kernels against their references."""

import pytest
import torch
from kernel_cases import needs_triton

from mlsys import hardware
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


def test_ops_per_element_gives_hes_count_and_its_correction():
    # He, "Making Deep Learning Go Brrrr" (2022): 19.5 TFLOP/s against 1.5 TB/s of fp32 numbers.
    a100 = hardware.A100_80GB_SXM
    reads_40 = byte_checks.ops_per_element(19.5e12, hardware.A100_40GB_HBM_BYTES_PER_S, 4)
    assert round(reads_40) == 50  # the notes' "about 50": reads only, on the 40 GB
    assert byte_checks.ops_per_element(19.5e12, hardware.A100_40GB_HBM_BYTES_PER_S, 8) == \
        pytest.approx(2 * reads_40)  # with the write back: about 100
    assert byte_checks.ops_per_element(a100.peak_flop_per_s("fp32"), a100.hbm_bytes_per_s, 8) \
        == pytest.approx(76.5, abs=0.1)
    with pytest.raises(ValueError, match="moved_bytes must be > 0"):
        byte_checks.ops_per_element(1e12, 1e12, 0)
    with pytest.raises(ValueError, match="bytes_per_s must be > 0"):
        byte_checks.ops_per_element(1e12, -1.0, 4)
