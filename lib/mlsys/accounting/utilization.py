"""What a FLOP count becomes against a peak: MFU, HFU, recomputation, and wall-clock time.

Model FLOPs utilization (MFU) counts the model's FLOPs (`accounting.flops`: forward + backward,
no recomputation) over seconds x peak x devices; hardware FLOPs utilization (HFU) counts every
FLOP executed, the recomputed forward too. A step without recomputation is 3 forwards, with full
activation recomputation 4 (`RECOMPUTE_FACTORS`).
Pure: numbers in, numbers out. Used in: §sec-flops, the napkin, the FLOPs one-pager.
"""

from __future__ import annotations

from mlsys import checks


def mfu(model_flops: float, seconds: float, peak_flop_per_s: float, n_devices: int = 1) -> float:
    """Model FLOPs utilization: model FLOPs (no recomputation) / (seconds * peak * devices)."""
    flops = checks.nonnegative(model_flops, "model_flops")
    time_s = checks.positive(seconds, "seconds")
    peak = checks.positive(peak_flop_per_s, "peak_flop_per_s")
    return flops / (time_s * peak * checks.positive_int(n_devices, "n_devices"))


def hfu(hardware_flops: float, seconds: float, peak_flop_per_s: float, n_devices: int = 1) -> float:
    """Hardware FLOPs utilization: like MFU, counting every FLOP executed (recomputation too)."""
    flops = checks.nonnegative(hardware_flops, "hardware_flops")
    return mfu(flops, seconds, peak_flop_per_s, n_devices)


RECOMPUTE_FACTORS = {"none": 3, "full": 4}
"""A training step in forwards: forward + backward (2x), plus a second forward if recomputed."""


def hardware_training_flops(forward_flops: float, *, recompute: str = "none") -> float:
    """FLOPs executed by one training step: 3x forward, or 4x with full activation recomputation."""
    factor = RECOMPUTE_FACTORS[checks.choice(recompute, "recompute", RECOMPUTE_FACTORS)]
    return factor * checks.nonnegative(forward_flops, "forward_flops")


def training_time_s(
    total_flops: float, n_devices: int, peak_flop_per_s: float, mfu: float
) -> float:
    """Wall-clock seconds to execute `total_flops` on `n_devices` at utilization `mfu` of peak."""
    flops = checks.nonnegative(total_flops, "total_flops")
    devices = checks.positive_int(n_devices, "n_devices")
    peak, share = checks.positive(peak_flop_per_s, "peak_flop_per_s"), checks.fraction(mfu, "mfu")
    return flops / (devices * peak * share)
