"""mlsys.accounting.utilization: MFU, HFU, the hardware FLOPs of recomputation and the training
time at a given MFU, and their argument checks."""

import pytest

from mlsys import hardware
from mlsys.accounting import utilization


def test_utilization_and_time():
    h100 = hardware.H100_SXM
    peak = h100.peak_flop_per_s("bf16")
    assert utilization.mfu(peak, 2.0, peak) == 0.5
    assert utilization.hfu(peak, 1.0, peak, n_devices=4) == 0.25
    assert utilization.hardware_training_flops(10, recompute="full") == 40
    days = utilization.training_time_s(6 * 70e9 * 15e12, 1024, h100.peak_flop_per_s("bf16"),
                                       0.5) / 86_400
    assert 140 < days < 148


NAN, INF = float("nan"), float("inf")

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: utilization.mfu(-1e12, 1, 1e15), ValueError, "model_flops must be >= 0"),
    (lambda: utilization.mfu(1e12, NAN, 1e15), ValueError, "seconds must be finite, got nan"),
    (lambda: utilization.mfu(1.0, 0.0, 1.0), ValueError, "seconds must be > 0"),
    (lambda: utilization.mfu(1.0, 1.0, INF), ValueError, "peak_flop_per_s must be finite"),
    (lambda: utilization.mfu(1.0, 1.0, -1.0), ValueError, "peak_flop_per_s must be > 0"),
    (lambda: utilization.mfu(1.0, 1.0, 1.0, 0), ValueError, "n_devices must be a positive integer"),
    (lambda: utilization.mfu(1.0, 1.0, 1.0, True), TypeError, "n_devices must be an integer"),
    (lambda: utilization.mfu("1", 1.0, 1.0), TypeError, "model_flops must be a real number"),
    (lambda: utilization.hfu(-1.0, 1.0, 1.0), ValueError, "hardware_flops must be >= 0"),
    (lambda: utilization.hardware_training_flops(1.0, recompute="half"), ValueError,
     "recompute='half'"),
    (lambda: utilization.hardware_training_flops(NAN), ValueError, "forward_flops must be finite"),
    (lambda: utilization.training_time_s(1.0, 1, 1.0, 1.5), ValueError,
     "mfu must be <= 1, got 1.5"),
    (lambda: utilization.training_time_s(1.0, 1, 1.0, 0.0), ValueError, "mfu must be > 0"),
    (lambda: utilization.training_time_s(1.0, 0, 1.0, 0.5), ValueError,
     "n_devices must be a positive"),
    (lambda: utilization.training_time_s(-1.0, 1, 1.0, 0.5), ValueError,
     "total_flops must be >= 0"),
    (lambda: utilization.training_time_s(1.0, 2.0, 1.0, 0.5), TypeError,
     "n_devices must be an integer"),
    (lambda: utilization.training_time_s(1.0, 1, NAN, 0.5), ValueError,
     "peak_flop_per_s must be finite"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_before_any_work(call, error, message):
    with pytest.raises(error, match=message):
        call()
