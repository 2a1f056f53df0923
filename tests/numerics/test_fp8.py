"""fp8 matmuls simulated on the CPU (`mlsys.numerics.fp8`): scaling, round-trip bounds, E4M3/E5M2
linear."""

import pytest
import torch

from mlsys.numerics import fp8


def _x(*shape, scale=1.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize(("fmt", "bound"), [("fp8_e4m3", 2**-4), ("fp8_e5m2", 2**-3)])
def test_a_scaled_round_trip_stays_within_half_an_ulp(fmt, bound):
    x = _x(4096, scale=1e-5)  # gradient-sized values: fp8 would flush them without a scale
    rt = fp8.roundtrip(x, fmt, fp8.scale_for(float(x.abs().max()), fmt))
    assert 0 < rt.max_rel_error <= bound  # 2^-(m+1): one rounding to nearest
    assert rt.saturated == 0.0 and rt.flushed < 1e-3
    unscaled = fp8.roundtrip(x, fmt, 1.0)
    assert unscaled.flushed > 0.5 and unscaled.median_rel_error == 1.0  # mostly zeros


def test_saturation_instead_of_inf_and_the_scale_rules():
    big = torch.tensor([1e5, -1e6, 3.0])
    assert fp8.quantize(big, "fp8_e5m2", 1.0).float().tolist() == [57344.0, -57344.0, 3.0]
    assert fp8.quantize(big, "fp8_e4m3", 1.0).float().tolist() == [448.0, -448.0, 3.0]
    assert fp8.scale_for(2.0, "fp8_e4m3") == 224.0
    assert fp8.scale_for(2.0, "fp8_e4m3", margin=1) == 112.0 and fp8.scale_for(0.0, "fp8_e5m2") == 1
    q = fp8.quantize(torch.tensor([3.14159]), "fp8_e4m3", 1.0)
    assert fp8.dequantize(q, 1.0).item() == 3.25


def test_delayed_scaling_clips_a_spike_that_current_scaling_absorbs():
    h = fp8.AmaxHistory(length=4)
    assert h.scale("fp8_e4m3") == 1.0  # nothing seen yet
    for _ in range(3):
        h.record(_x(256))  # amax about 3
    spike = _x(256, scale=10.0)
    delayed = fp8.roundtrip(spike, "fp8_e4m3", h.scale("fp8_e4m3"))
    current = fp8.roundtrip(spike, "fp8_e4m3", fp8.scale_for(float(spike.abs().max()),
                                                             "fp8_e4m3"))
    assert delayed.saturated > 0.3 and current.saturated == 0.0
    h.record(spike)
    assert h.scale("fp8_e4m3") == fp8.scale_for(float(spike.abs().max()), "fp8_e4m3")
    assert len(h.amaxes) == 4


def test_scaled_mm_equals_the_simulated_fp8_matmul():
    a, b = _x(24, 40, seed=1), _x(40, 8, seed=2)
    sa, sb = fp8.scale_for(float(a.abs().max()), "fp8_e4m3"), 7.0
    qa, qb = fp8.quantize(a, "fp8_e4m3", sa), fp8.quantize(b, "fp8_e5m2", sb)
    sim = fp8.fp8_mm(qa, sa, qb, sb, backend="simulated")
    real = fp8.fp8_mm(qa, sa, qb, sb, backend="scaled_mm")
    torch.testing.assert_close(real, sim, rtol=1e-6, atol=1e-6)


def test_fp8_linear_forward_and_gradients_against_fp32():
    x, w = _x(64, 48, seed=3), _x(32, 48, scale=0.02, seed=4)
    grad = _x(64, 32, scale=1e-5, seed=5)
    errors = {}
    for scaling in ("delayed", "none"):
        layer = fp8.Fp8Linear(w, scaling=scaling)
        xx = x.clone().requires_grad_()
        y = layer(xx)
        y.backward(grad)
        errors[scaling] = (fp8.relative_error(y, x @ w.t()),
                           fp8.relative_error(xx.grad, grad @ w),
                           fp8.relative_error(layer.weight.grad, grad.t() @ x))
    assert all(e < 0.08 for e in errors["delayed"])  # a few % per element, averaged down
    assert errors["none"][1] > 0.3 and errors["none"][2] > 0.3  # E5M2 flushes 1e-5 gradients
    layer = fp8.Fp8Linear(w, scaling="current", backend="scaled_mm")
    assert layer(x[None]).shape == (1, 64, 32)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: fp8.quantize([1.0], "fp8_e4m3", 1.0), TypeError, "floating-point tensor"),
    (lambda: fp8.quantize(torch.ones(2), "bf16", 1.0), ValueError, "not an fp8 format"),
    (lambda: fp8.quantize(torch.ones(2), "fp8_e4m3", 0.0), ValueError, "scale must be > 0"),
    (lambda: fp8.dequantize(torch.ones(2), 1.0), TypeError, "fp8 tensor"),
    (lambda: fp8.dequantize(torch.ones(2, dtype=torch.uint8), 1.0), TypeError,
     r"q must be an fp8 tensor \(torch.float8_e4m3fn or torch.float8_e5m2, from quantize\), "
     "got torch.uint8"),
    (lambda: fp8.fp8_mm(torch.ones(2, 3), 1.0, torch.ones(2, 3), 1.0), ValueError, r"\(m, k\)"),
    (lambda: fp8.Fp8Linear(torch.ones(3)), ValueError, "2-D"),
    (lambda: fp8.Fp8Linear(torch.ones(2, 3), scaling="tensor"), ValueError, "scaling='tensor'"),
    (lambda: fp8.Fp8Linear(torch.ones(2, 3))(torch.ones(4, 2)), ValueError, "last dim 2"),
])
def test_invalid_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
