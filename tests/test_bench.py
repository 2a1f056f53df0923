import platform
import resource
import time

import pytest
import torch

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
    timing = bench.benchmark(lambda: time.sleep(0.002), warmup=0, repeats=1, min_time_s=0.02, device="cpu")
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
    for key in ("device", "torch_version", "triton_version", "date", "git_commit", "command", "profile"):
        assert key in record and record[key], key


def test_bad_arguments_are_rejected_before_running():
    calls = []
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        bench.benchmark(lambda: calls.append(1), repeats=0)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        bench.benchmark(lambda: calls.append(1), warmup=-1)
    with pytest.raises(ValueError, match="device must be"):
        bench.benchmark(lambda: calls.append(1), device="tpu")
    with pytest.raises(TypeError, match="callable"):
        bench.benchmark(42)  # type: ignore[arg-type]
    assert calls == []


def test_derived_rates():
    assert bench.achieved_flop_per_s(2e12, 0.5) == 4e12
    assert bench.achieved_bytes_per_s(1e9, 2.0) == 5e8
    with pytest.raises(ValueError, match="seconds must be positive"):
        bench.achieved_flop_per_s(1.0, 0.0)


def test_str_is_readable():
    timing = bench.Timing(samples_s=(1e-3, 2e-3, 3e-3), warmup=0, device="cpu")
    assert str(timing).startswith("2 ms median")


def _minor_faults(fn, times=20) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_kept_cpu_memory_stops_page_faults_on_fresh_outputs():
    x = torch.randn(8 * 2**20)  # 32 MiB: above glibc's mmap threshold, 8,192 pages of 4 KiB
    pages = x.nbytes // resource.getpagesize()
    faults_default = _minor_faults(lambda: torch.mul(x, 2.0))
    with bench.kept_cpu_memory() as applied:
        assert applied
        faults_kept = _minor_faults(lambda: torch.mul(x, 2.0))
    # by default every one of the 20 fresh outputs is new memory, mapped page by page
    assert faults_default >= 19 * pages
    # kept: the heap grows during the first few calls (seen: 1 to 4 outputs' worth), then is reused
    assert faults_kept <= 8 * pages
