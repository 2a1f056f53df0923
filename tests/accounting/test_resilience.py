"""accounting.resilience: checkpoint bytes, Young's and Daly's intervals against the optimum of the
expected-time model they approximate, and the straggler's expected maximum against sampling."""

import math

import pytest
import torch

from mlsys.accounting import resilience


def test_checkpoint_holds_master_and_moments_not_gradients():
    assert resilience.checkpoint_bytes_per_param("bf16_mixed_adamw") == 4 + 8
    assert resilience.checkpoint_bytes_per_param("fp32_adamw") == 4 + 8
    assert resilience.checkpoint_bytes_per_param("bf16_pure_adamw") == 2 + 4
    # 70B parameters at 12 B each written at 100 GB/s: 8.4 s
    assert resilience.checkpoint_seconds(70e9, "bf16_mixed_adamw", 100e9) == pytest.approx(8.4)


def exact_waste(tau: float, delta: float, m: float) -> float:
    """Daly (2006), eq. 8 for one unit of work: wall time per unit of solve time with
    exponential failures, restart time 0: M (exp((tau + delta) / M) - 1) / tau."""
    return m * math.expm1((tau + delta) / m) / tau


def argmin(f, lo: float, hi: float) -> float:
    for _ in range(200):  # golden-section search on a unimodal function
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    return (lo + hi) / 2


@pytest.mark.parametrize(("delta", "m"), [(60, 24 * 3600), (600, 3 * 3600), (1800, 3600)])
def test_daly_is_the_optimum_of_the_exponential_model_and_young_its_first_order(delta, m):
    best = argmin(lambda t: exact_waste(t, delta, m), 1.0, 10 * m)
    assert resilience.daly_interval_s(delta, m) == pytest.approx(best, rel=0.02)
    young = resilience.young_interval_s(delta, m)
    assert young == pytest.approx(math.sqrt(2 * delta * m))
    # Young's tau minimizes the first-order loss exactly
    assert young == pytest.approx(
        argmin(lambda t: resilience.lost_fraction(t, delta, m), 1.0, 10 * m), rel=1e-6)
    assert abs(young - best) / best < (0.05 if delta / m < 0.01 else 0.6)


def test_job_mtbf_falls_with_its_gpus():
    assert resilience.job_mtbf_s(1, 1e-4) == pytest.approx(3600 / 1e-4)
    assert resilience.job_mtbf_s(16_384, 1e-4) == pytest.approx(3600 / 1.6384)


def test_expected_maximum_matches_sampling():
    assert resilience.expected_max_of_normals(1) == pytest.approx(0.0, abs=1e-7)
    assert resilience.expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    g = torch.Generator().manual_seed(0)
    for n in (8, 64, 1024):
        sampled = torch.randn(4000, n, generator=g, dtype=torch.float64).amax(1).mean().item()
        assert resilience.expected_max_of_normals(n) == pytest.approx(sampled, abs=0.02)
    assert resilience.straggler_step_s(1.0, 0.05, 2) == pytest.approx(1 + 0.05 / math.sqrt(math.pi))


@pytest.mark.parametrize(("call", "match"), [
    (lambda: resilience.checkpoint_seconds(-1, "bf16_mixed_adamw", 1e9), "n_params"),
    (lambda: resilience.checkpoint_seconds(1e9, "nope", 1e9), "recipe"),
    (lambda: resilience.job_mtbf_s(0, 1e-4), "n_gpus"),
    (lambda: resilience.young_interval_s(0, 10), "checkpoint_s"),
    (lambda: resilience.straggler_step_s(1.0, -0.1, 8), "std_s"),
    (lambda: resilience.expected_max_of_normals(0), "n"),
])
def test_bad_input_is_a_clear_error(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
