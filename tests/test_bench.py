import json
import platform
import subprocess
import sys
import time

import pytest

from mlsys import bench


def test_benchmark_measures_a_known_sleep():
    timing = bench.benchmark(lambda: time.sleep(0.01), warmup=1, repeats=5, device="cpu")
    assert len(timing.samples_s) == 5
    # sleep never returns early; allow generous scheduling slack above
    assert 0.01 <= timing.median_s < 0.05
    assert timing.p20_s <= timing.median_s <= timing.p80_s
    assert timing.min_s <= timing.p20_s


def test_warmup_calls_are_not_timed():
    calls = []

    def fn():
        calls.append(None)
        if len(calls) == 1:  # the first call is slow (think: compilation)
            time.sleep(0.05)

    timing = bench.benchmark(fn, warmup=1, repeats=4, device="cpu")
    assert len(calls) == 5
    assert max(timing.samples_s) < 0.05


def test_min_time_keeps_repeating():
    timing = bench.benchmark(lambda: time.sleep(0.002), warmup=0, repeats=1, min_time_s=0.02,
                             device="cpu")
    assert sum(timing.samples_s) >= 0.02
    assert len(timing.samples_s) > 1


def test_quantiles_match_numpy():
    import numpy as np

    samples = (5.0, 1.0, 4.0, 2.0, 3.0, 10.0)
    for q in (0.2, 0.5, 0.8):
        assert bench._quantile(samples, q) == pytest.approx(np.quantile(samples, q))


def test_provenance_says_what_produced_the_number():
    timing = bench.benchmark(lambda: None, warmup=0, repeats=2, device="cpu")
    record = timing.provenance
    keys = ("device", "torch_version", "triton_version", "date", "git_commit", "command", "profile")
    for key in keys:
        assert key in record and record[key], key


def test_bad_arguments_are_rejected_before_running():
    calls = []
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        bench.benchmark(lambda: calls.append(1), repeats=0)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        bench.benchmark(lambda: calls.append(1), warmup=-1)
    with pytest.raises(ValueError, match="device='tpu' is not one of"):
        bench.benchmark(lambda: calls.append(1), device="tpu")
    with pytest.raises(TypeError, match="callable"):
        bench.benchmark(42)  # type: ignore[arg-type]
    assert calls == []


def test_derived_rates():
    assert bench.achieved_flop_per_s(2e12, 0.5) == 4e12
    assert bench.achieved_bytes_per_s(1e9, 2.0) == 5e8
    with pytest.raises(ValueError, match="seconds must be > 0"):
        bench.achieved_flop_per_s(1.0, 0.0)
    with pytest.raises(ValueError, match="flops must be finite"):
        bench.achieved_flop_per_s(float("nan"), 1.0)


def test_str_is_readable():
    timing = bench.Timing(samples_s=(1e-3, 2e-3, 3e-3), warmup=0, device="cpu")
    assert str(timing).startswith("2 ms median")


PAGE_FAULTS = """
import json, resource
import torch
from mlsys import bench


def minor_faults(fn, times=20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


x = torch.randn(8 * 2**20)  # 32 MiB: above glibc's mmap threshold, 8,192 pages of 4 KiB
default = minor_faults(lambda: torch.mul(x, 2.0))
with bench.kept_cpu_memory() as applied:
    kept = minor_faults(lambda: torch.mul(x, 2.0))
print(json.dumps({"pages": x.nbytes // resource.getpagesize(), "default": default,
                  "kept": kept, "applied": applied}))
"""
"""Run in a fresh process: the allocator's state is process-wide, and free heap blocks left by
earlier tests (anything that ran inside `kept_cpu_memory`) would serve some of the fresh outputs."""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_kept_cpu_memory_stops_page_faults_on_fresh_outputs():
    done = subprocess.run([sys.executable, "-c", PAGE_FAULTS], capture_output=True, text=True,
                          timeout=120, check=True)
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    assert faults["applied"]
    pages = faults["pages"]
    # by default every one of the 20 fresh outputs is new memory, mapped page by page
    assert faults["default"] >= 19 * pages
    # kept: the heap grows during the first few calls (seen: 1 to 4 outputs' worth), then is reused
    assert faults["kept"] <= 8 * pages


# --- interleaving and the consistency check, driven by a fake clock -------------------------------


class FakeClock:
    """A clock that only moves when a fake operation runs: each op advances it by its next
    duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def op(self, durations):
        it = iter(durations)

        def run():
            self.now += next(it)

        return run


def _steady(seconds):
    while True:
        yield seconds


def _alternating(a, b):
    while True:
        yield a
        yield b


def _sentence(durations_of_op):
    """The chain a chapter runs: interleaved copy probe and op, noise and roof checks, then a
    verdict."""
    from mlsys import book, roofline, tables

    clock = FakeClock()
    copy_bytes, op_bytes = 1e10, 1e10  # both move 10 GB per call
    fns = {"copy": clock.op(_steady(1.0)), "x * 2": clock.op(durations_of_op)}

    def check(timings):
        roof = roofline.Ceilings(1e12, copy_bytes / timings["copy"].median_s, "fake")
        points = [("x * 2", 0.0, op_bytes, timings["x * 2"].median_s)]
        return bench.noise_problems(timings) + roofline.roof_problems(points, roof)

    timings, consistency = bench.measure_consistently(fns, check, attempts=2, warmup=1, repeats=8,
                                                      clock=clock, device="cpu")
    roof = roofline.Ceilings(1e12, copy_bytes / timings["copy"].median_s, "fake")
    est = roofline.estimate(0.0, op_bytes, roof)
    position = tables.roofline_position(timings["x * 2"].median_s, est)
    text = book.verdict(f"x * 2 is {position}", consistency.problems)
    return text, consistency


def test_fake_clock_times_exactly_what_the_ops_take():
    clock = FakeClock()
    fns = {"a": clock.op(_steady(2.0)), "b": clock.op(_steady(0.5))}
    timings = bench.benchmark_interleaved(fns, warmup=2, repeats=5, clock=clock, device="cpu")
    assert timings["a"].samples_s == (2.0,) * 5 and timings["b"].median_s == 0.5
    timing = bench.benchmark(clock.op(_steady(3.0)), warmup=1, repeats=3, clock=clock, device="cpu")
    assert timing.median_s == 3.0


def test_interleaving_rotates_the_order():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    bench.benchmark_interleaved(fns, warmup=0, repeats=3, device="cpu")
    assert order == list("abc" + "bca" + "cab")


def test_consistent_timings_give_the_verdict():
    text, consistency = _sentence(_steady(1.1))
    assert consistency.ok and consistency.attempts == 1
    assert text == "x * 2 is at the memory roof (1.10x the predicted time)"


def test_noisy_timings_withhold_the_verdict_after_bounded_retries():
    text, consistency = _sentence(_alternating(1.0, 3.0))
    assert not consistency.ok and consistency.attempts == 2
    assert text.startswith("no verdict") and "p80 / p20" in text
    assert "at the memory roof" not in text


def test_contradictory_timings_withhold_the_verdict():
    text, consistency = _sentence(_steady(0.4))  # 2.5x faster than the copy probe: impossible
    assert not consistency.ok
    assert text.startswith("no verdict") and "ran 2.50x faster than the memory-bound roof" in text


def test_a_retry_that_settles_gives_the_verdict():
    # attempt 1: warm-up + 8 noisy samples; then steady
    first_noisy = iter([1.0, 3.0] * 5 + [1.2] * 100)
    text, consistency = _sentence(first_noisy)
    assert consistency.ok and consistency.attempts == 2
    assert text == "x * 2 is at the memory roof (1.20x the predicted time)"


def test_drift_catches_a_load_that_starts_mid_run():
    clock = FakeClock()
    ramp = iter([1.0] * 5 + [2.0] * 5)  # warm-up 1, then 4 fast samples and 5 slow ones
    timings = bench.benchmark_interleaved({"probe": clock.op(ramp)}, warmup=1, repeats=9,
                                          clock=clock, device="cpu")
    problems = bench.noise_problems(timings)
    assert any("moved by" in p for p in problems)


def test_flush_runs_before_every_timed_call_and_outside_the_timing(monkeypatch):
    clock = FakeClock()
    flushes = []
    monkeypatch.setattr(bench, "_flusher", lambda n, device: (lambda: flushes.append(clock.now)))
    timing = bench.benchmark(clock.op(_steady(2.0)), warmup=1, repeats=3, flush_bytes=1024,
                             clock=clock, device="cpu")
    assert len(flushes) == 3 and timing.samples_s == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="flush_bytes must be an integer >= 0"):
        bench.benchmark(lambda: None, flush_bytes=-1)


def test_a_real_flush_buffer_is_written(monkeypatch):
    flush = bench._flusher(4096, "cpu")
    assert flush is not None and bench._flusher(0, "cpu") is None
    assert flush().numel() == 4096


def test_progress_bars_follow_the_switch(monkeypatch):
    monkeypatch.setenv("MLSYS_PROGRESS", "0")
    items = [1, 2, 3]
    assert bench.progress(items, desc="x") is items  # off: the iterable itself
    monkeypatch.setenv("MLSYS_PROGRESS", "1")
    wrapped = bench.progress(items, desc="x")
    assert wrapped is not items and list(wrapped) == items


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_device_the_machine_lacks_is_refused_before_running(monkeypatch, device):
    monkeypatch.setattr(bench.env, "device", lambda: "cpu")  # a machine with neither
    calls = []
    message = f"device='{device}', but torch finds no {device} device on this machine"
    with pytest.raises(ValueError, match=message):
        bench.benchmark(lambda: calls.append(1), device=device)
    with pytest.raises(ValueError, match=message):
        bench.benchmark_interleaved({"a": lambda: calls.append(1)}, device=device)
    assert calls == []
