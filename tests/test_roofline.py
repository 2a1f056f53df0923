import pytest

from mlsys import hardware, roofline
from mlsys.roofline import Ceilings


def test_roofline_shape():
    roof = Ceilings(flop_per_s=100.0, bytes_per_s=10.0, label="toy")
    assert roof.ridge_intensity == 10.0
    assert roof.attainable_flop_per_s(1.0) == 10.0  # memory-bound: intensity x bandwidth
    assert roof.attainable_flop_per_s(50.0) == 100.0  # compute-bound: the peak
    assert roof.bound(9.99) == "memory-bound" and roof.bound(10.0) == "compute-bound"


def test_ridge_points_from_spec():
    a100 = Ceilings.from_spec(hardware.A100_80GB_SXM, "fp16")
    assert 150 < a100.ridge_intensity < 160
    h100 = Ceilings.from_spec(hardware.H100_SXM, "bf16")
    assert 290 < h100.ridge_intensity < 300  # 989 TFLOP/s over 3.35 TB/s


def test_estimate_takes_the_larger_time():
    roof = Ceilings(flop_per_s=1e12, bytes_per_s=1e11, label="toy")
    est = roofline.estimate(flops=1e12, n_bytes=1e10, ceilings=roof)
    assert (est.math_s, est.memory_s, est.time_s, est.bound) == (1.0, 0.1, 1.0, "compute-bound")
    est = roofline.estimate(flops=1e9, n_bytes=1e11, ceilings=roof)
    assert est.bound == "memory-bound" and est.time_s == 1.0


def test_probes_measure_something_plausible_on_this_machine():
    bandwidth = roofline.measure_copy_bandwidth(16 * 2**20, device="cpu", repeats=3)
    assert 1e8 < bandwidth < 1e13
    rates = roofline.measure_matmul_flop_per_s([64, 128], device="cpu", repeats=2)
    assert set(rates) == {64, 128} and all(1e6 < r < 1e14 for r in rates.values())


def test_bad_inputs():
    with pytest.raises(ValueError, match="ceilings must be positive"):
        Ceilings(0.0, 1.0, "x")
    with pytest.raises(ValueError, match="intensity must be >= 0"):
        Ceilings(1.0, 1.0, "x").attainable_flop_per_s(-1)
    with pytest.raises(ValueError, match="dtype must be"):
        roofline.measure_matmul_flop_per_s([8], dtype="int8")
    with pytest.raises(ValueError, match="n_bytes"):
        roofline.measure_copy_bandwidth(2)


def test_overhead_model_and_probe():
    assert roofline.overhead_time_s(0, 5e-6, 1e9) == 5e-6
    assert roofline.overhead_time_s(1e9, 5e-6, 1e9) == 1.0 + 5e-6
    per_op = roofline.measure_op_time_s(16, ops_per_sample=5, device="cpu", repeats=3)
    assert 1e-8 < per_op < 1e-2  # a tiny op costs at least a few ns and far less than 10 ms
    with pytest.raises(ValueError, match="bytes_per_s > 0"):
        roofline.overhead_time_s(1, 1e-6, 0)
    with pytest.raises(ValueError, match="ops_per_sample"):
        roofline.measure_op_time_s(16, ops_per_sample=0)
