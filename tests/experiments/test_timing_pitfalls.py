"""The timing_pitfalls experiment (chapter 05, smoke sizes): one sentence per pitfall; the
simulated kernel that the chapter's timer exercise is checked on."""

import pytest

from mlsys import bench
from mlsys.experiments import timing_pitfalls


def test_timing_pitfalls_give_one_sentence_each():
    rows = timing_pitfalls.run(timing_pitfalls.SIZES["smoke"], device="cpu")
    text = timing_pitfalls.sentences(rows)
    assert set(text) == {"warmup: eager forward", "sync", "clock", "spread", "cache"}
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
