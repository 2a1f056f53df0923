import pytest

from mlsys import probes


def test_probes_measure_something_plausible_on_this_machine():
    bandwidth = probes.measure_copy_bandwidth(16 * 2**20, device="cpu", repeats=3)
    assert 1e8 < bandwidth < 1e13
    rates = probes.measure_matmul_flop_per_s([64, 128], device="cpu", repeats=2)
    assert set(rates) == {64, 128} and all(1e6 < r < 1e14 for r in rates.values())
    per_op = probes.measure_op_time_s(16, ops_per_sample=5, device="cpu", repeats=3)
    assert 1e-8 < per_op < 1e-2  # a tiny op costs at least a few ns and far less than 10 ms


def test_probe_work_is_the_cost_model():
    assert probes.copy_probe(4096, device="cpu").work == 2 * 4096  # read + write
    assert probes.matmul_probe(7, device="cpu").work == 2 * 7**3
    assert probes.op_overhead_probe(3, ops_per_call=5, device="cpu").work == 5
    with pytest.raises(ValueError, match="seconds must be > 0"):
        probes.copy_probe(4096, device="cpu").rate(0.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        probes.measure_matmul_flop_per_s([8], dtype="int8")
    with pytest.raises(ValueError, match="n_bytes must be an integer >= 4"):
        probes.measure_copy_bandwidth(2)
    with pytest.raises(ValueError, match="ops_per_call must be a positive integer"):
        probes.measure_op_time_s(16, ops_per_sample=0)
    with pytest.raises(TypeError, match="sizes must be a sequence"):
        probes.measure_matmul_flop_per_s(64)


def test_gemm_probe_runs_a_models_own_shape():
    p = probes.gemm_probe(5, 3, 7, dtype="bf16", device="cpu")
    assert p.work == 2 * 5 * 3 * 7 and p.unit == "flop"
    out = p.fn()
    assert out.shape == (5, 7) and str(out.dtype) == "torch.bfloat16"
    with pytest.raises(ValueError, match="k must be a positive integer"):
        probes.gemm_probe(5, 0, 7)
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        probes.gemm_probe(5, 3, 7, dtype="int8")
