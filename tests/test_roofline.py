"""mlsys.roofline: the ceilings, the estimate, the overhead model, and the check that
nothing measured beats the roof."""

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


def test_bad_inputs():
    with pytest.raises(ValueError, match="flop_per_s must be > 0"):
        Ceilings(0.0, 1.0, "x")
    with pytest.raises(ValueError, match="intensity must be >= 0"):
        Ceilings(1.0, 1.0, "x").attainable_flop_per_s(-1)
    with pytest.raises(ValueError, match="intensity must be finite"):
        Ceilings(1e12, 1e9, "x").attainable_flop_per_s(float("nan"))


def test_overhead_model():
    assert roofline.overhead_time_s(0, 5e-6, 1e9) == 5e-6
    assert roofline.overhead_time_s(1e9, 5e-6, 1e9) == 1.0 + 5e-6
    with pytest.raises(ValueError, match="bytes_per_s must be > 0"):
        roofline.overhead_time_s(1, 1e-6, 0)


def test_roof_problems_flags_only_what_beats_the_roof():
    roof = Ceilings(flop_per_s=1e12, bytes_per_s=1e10, label="toy")
    points = [
        ("copy-like", 0.0, 1e10, 1.05),  # at the memory roof: 1 s predicted, 1.05 s measured
        ("too fast", 0.0, 1e10, 0.5),  # twice the bandwidth: impossible
        ("slow matmul", 1e12, 1e6, 3.0),  # below the roof is allowed
    ]
    problems = roofline.roof_problems(points, roof)
    assert len(problems) == 1
    assert problems[0].startswith("too fast ran 2.00x faster than the memory-bound roof")
    assert roofline.roof_problems(points[:1], roof, tolerance=1.0) == []


def test_communication_is_a_third_roof():
    # The Scaling Book's "communication intensity": FLOPs per byte sent against the link's ridge
    # (Austin et al. 2025, "All About Rooflines").
    roof = Ceilings(flop_per_s=1e12, bytes_per_s=1e11, label="toy")
    est = roofline.estimate(1e12, 1e10, roof, comm_bytes=2e10, link_bytes_per_s=1e10)
    assert (est.math_s, est.memory_s, est.comm_s) == (1.0, 0.1, 2.0)
    assert est.time_s == 2.0 and est.bound == "communication-bound"
    est = roofline.estimate(1e12, 1e10, roof, comm_bytes=5e9, link_bytes_per_s=1e10)
    assert est.bound == "compute-bound" and est.time_s == 1.0  # the link hides under the math
    assert roofline.estimate(1e9, 1e11, roof).comm_s == 0.0  # nothing sent: two roofs as before
    with pytest.raises(ValueError, match="comm_bytes needs link_bytes_per_s"):
        roofline.estimate(1.0, 1.0, roof, comm_bytes=1.0)
    with pytest.raises(ValueError, match="link_bytes_per_s must be > 0"):
        roofline.estimate(1.0, 1.0, roof, comm_bytes=1.0, link_bytes_per_s=0.0)
    with pytest.raises(ValueError, match="comm_bytes must be >= 0"):
        roofline.estimate(1.0, 1.0, roof, comm_bytes=-1.0, link_bytes_per_s=1.0)


def test_tile_and_wave_quantization():
    # NVIDIA, "Matrix Multiplication Background User's Guide": tile and wave quantization.
    one_wave = roofline.tile_waves(1536, 1408, tile_m=128, tile_n=128, sms=132)
    assert (one_wave.tiles, one_wave.waves, one_wave.wave_fraction) == (132, 1, 1.0)
    two = roofline.tile_waves(1536, 1536, tile_m=128, tile_n=128, sms=132)
    assert (two.tiles, two.waves) == (144, 2) and two.wave_fraction == pytest.approx(144 / 264)
    ragged = roofline.tile_waves(129, 128, tile_m=128, tile_n=128, sms=132)
    assert ragged.tiles == 2 and ragged.useful_fraction == pytest.approx(129 / 256)
    assert roofline.tile_waves(8192, 50257, tile_m=128, tile_n=128, sms=132).tiles == \
        roofline.tile_waves(8192, 50304, tile_m=128, tile_n=128, sms=132).tiles == 64 * 393
    assert roofline.tile_waves(256, 256, tile_m=128, tile_n=128, sms=2, tiles_per_sm=2).waves == 1
    with pytest.raises(ValueError, match="tile_n"):
        roofline.tile_waves(8, 8, tile_m=128, tile_n=0, sms=132)
    with pytest.raises(ValueError, match="sms"):
        roofline.tile_waves(8, 8, tile_m=128, tile_n=128, sms=-1)
