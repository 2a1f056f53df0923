"""The timing_pitfalls experiment (chapter 05, smoke sizes): one sentence per pitfall; the
simulated kernel that the chapter's timer exercise is checked on."""

import statistics

import pytest
import torch

from mlsys import bench
from mlsys.experiments import timing_pitfalls


def test_timing_pitfalls_give_one_sentence_each():
    rows = timing_pitfalls.run(timing_pitfalls.SIZES["smoke"], device="cpu")
    text = timing_pitfalls.sentences(rows)
    assert set(text) == {"warmup: eager forward", "sync", "clock", "spread", "cache", "precision"}
    warm = next(r for r in rows if r["kind"] == "warmup")
    assert len(warm["first_s"]) == timing_pitfalls.SIZES["smoke"].first_calls
    assert "they agree" in text["sync"] or "too small" in text["sync"] or "misses" in text["sync"]
    assert "no events to compare" in text["clock"]  # a CPU has none


def test_the_simulated_kernel_gives_bench_an_exact_answer():
    kernel = timing_pitfalls.SimulatedKernel(timing_pitfalls.SIMULATED_COSTS_S)
    timing = bench.benchmark(kernel, warmup=5, repeats=7, device="cpu", clock=kernel.clock)
    assert timing.median_s == pytest.approx(1e-3) and max(timing.samples_s) == pytest.approx(0.04)
    assert kernel.calls == 12  # the last cost repeats past the end of the list
    cold = timing_pitfalls.SimulatedKernel(timing_pitfalls.SIMULATED_COSTS_S)
    assert bench.benchmark(cold, warmup=0, repeats=7, device="cpu",
                           clock=cold.clock).median_s == pytest.approx(0.02)
    with pytest.raises(ValueError, match="costs_s must be one or more positive seconds"):
        timing_pitfalls.SimulatedKernel((1e-3, 0.0))


def test_the_clock_sentence_sets_the_launch_beside_the_kernel():
    def timed(seconds):
        return {"median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * 5}

    clock = {"kind": "clock", "host": timed(20e-6), "events": timed(15e-6), "unsynced": timed(4e-6)}
    text = timing_pitfalls.clock_sentence(clock)
    assert "20 µs by the synchronized host clock, 15 µs by CUDA events" in text
    assert "without synchronizing it reads 4 µs, the launch alone, less than the kernel's" in text
    del clock["unsynced"]  # a record made before the unsynchronized clock was kept
    assert "without synchronizing" not in timing_pitfalls.clock_sentence(clock)


def test_the_precision_sentence_says_whether_tf32_ran():
    def row(t_high, err_high):
        timed = {"median_s": 1e-2, "p20_s": 1e-2, "p80_s": 1e-2, "samples_s": [1e-2] * 3}
        return {"kind": "precision", "matmul": 8192, "highest": timed, "error_highest": 1e-6,
                "high": {**timed, "median_s": t_high}, "error_high": err_high}

    assert "'high' ran in TF32, 6.0x as fast and 300x less exact" in \
        timing_pitfalls.precision_sentence(row(1e-2 / 6, 3e-4))
    assert "did not change the arithmetic here" in \
        timing_pitfalls.precision_sentence(row(1e-2, 1e-6))


def test_the_cpu_run_measures_the_precision_switch_and_restores_it():
    before = torch.get_float32_matmul_precision()
    rows = timing_pitfalls.run(timing_pitfalls.SIZES["smoke"], device="cpu")
    assert torch.get_float32_matmul_precision() == before
    row = next(r for r in rows if r["kind"] == "precision")
    assert 0 < row["error_highest"] < 1e-5 and set(timing_pitfalls.PRECISIONS) <= set(row)
    assert "precision" in timing_pitfalls.sentences(rows)


def test_slow_calls_explain_a_mean_and_a_deviation_together():
    # the seed's compiled 2.7B step at 128 tokens: mean 1.072 ± 0.155 s, its parts say 0.971 s
    share, slow = timing_pitfalls.slow_calls(1.072056, 0.155152, 0.971428)
    assert share == pytest.approx(0.296, abs=1e-3) and slow == pytest.approx(0.340, abs=1e-3)
    # three calls in ten, 0.34 s slow, give that mean and that (population) deviation back
    calls = [0.971428] * 7 + [0.971428 + slow] * 3
    assert statistics.fmean(calls) == pytest.approx(1.072056, abs=3e-3)
    assert statistics.pstdev(calls) == pytest.approx(0.155152, abs=3e-3)
    one = [0.971428] * 9 + [0.971428 + 0.155152 * 10 / 3]  # one slow call: the std, not the mean
    assert statistics.pstdev(one) == pytest.approx(0.155152)
    assert statistics.fmean(one) < 1.072056 - 0.045
    with pytest.raises(ValueError, match="mean_s .* must exceed typical_s"):
        timing_pitfalls.slow_calls(0.9, 0.1, 1.0)
    with pytest.raises(ValueError, match="std_s"):
        timing_pitfalls.slow_calls(1.1, 0.0, 1.0)
