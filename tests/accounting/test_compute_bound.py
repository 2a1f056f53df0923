"""mlsys.accounting.compute_bound: when FSDP and tensor parallelism are compute-bound, against the
Scaling Book's worked figures and part c of the CS336 4D-parallelism question (XXL), and the
curves `plotting.plot_compute_bound` draws. Pure: no ranks."""

import math

import pytest

from mlsys import hardware
from mlsys.accounting import compute_bound, parallel

V5P_C = hardware.TPU_V5P.peak_flop_per_s("bf16")
V5P_W = hardware.LINKS["ici-v5p-axis"].bytes_per_s
SEED_C = 4.6e14  # the CS336 question's rounding of the v5p's 459 TFLOP/s


def test_xxl_part_c_compute_bound_batch_for_fsdp_16_tp_4():
    assert V5P_W == 2 * hardware.LINKS["ici-v5p"].bytes_per_s == 1.8e11  # W_ici = 2 x 9e10
    # the Scaling Book's alpha
    assert compute_bound.ici_intensity(V5P_C, V5P_W) == pytest.approx(2550)
    kw = {"x": 16, "y": 4, "link_bytes_per_s": V5P_W, "m_x": 2, "m_y": 1}
    per_device = compute_bound.compute_bound_batch(parallel.XXL.d_ff, flop_per_s=V5P_C, **kw)
    assert per_device == pytest.approx(2550 / (4 * 2))  # alpha / (Y M_X) = 318.75 tokens
    assert per_device * 64 == pytest.approx(20_400)
    assert compute_bound.compute_bound_batch(parallel.XXL.d_ff, flop_per_s=SEED_C, **kw) * 64 == \
        pytest.approx(20_444.4, rel=1e-5)
    for factor, bound in ((1.01, True), (0.99, False)):
        t = compute_bound.layer_times(per_device * 64 * factor, parallel.XXL.d_model,
                                      parallel.XXL.d_ff, flop_per_s=V5P_C, **kw)
        assert t.compute_bound is bound and t.tp_s < t.math_s  # TP alone is never the limit
    # the book's closed form assumes its optimal split, far from X = 16 here
    best = compute_bound.optimal_compute_bound_batch(parallel.XXL.d_ff, flop_per_s=V5P_C,
                                                     link_bytes_per_s=V5P_W, m_x=2, m_y=1)
    assert best == pytest.approx(2550**2 / (2 * 53_248))  # 61.1 tokens per device
    assert compute_bound.optimal_fsdp_degree(best * 64, parallel.XXL.d_ff, 64,
                                             m_x=2) == pytest.approx(3.07, abs=0.01)


def test_the_scaling_books_worked_figures():
    # pure FSDP / DP: B / X > alpha / M_X; three axes: about 850
    assert compute_bound.compute_bound_batch(8192, x=64, flop_per_s=V5P_C, link_bytes_per_s=V5P_W,
                                  m_x=3) == pytest.approx(850)
    # TP: Y < M_Y F / alpha; LLaMA-3 70B's F ~ 30k: 8-way fine, 16-way not
    kw = {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W}
    assert compute_bound.compute_bound_batch(28_672, y=8, **kw) == 0.0
    assert compute_bound.compute_bound_batch(28_672, y=16, **kw) == math.inf
    # mixed at the optimum: F = 32,768, M_X M_Y = 2: "roughly B/N > 99"
    assert compute_bound.optimal_compute_bound_batch(32_768, m_x=2, **kw) == pytest.approx(
        99.2, abs=0.1)
    # at X_opt, the two communications take the same time
    x = compute_bound.optimal_fsdp_degree(48_000, 32_768, 64, m_x=2)
    fsdp = 4 * 8192 * 32_768 / ((64 / x) * V5P_W * 2)
    tp = 4 * 48_000 * 8192 / (x * V5P_W)
    assert fsdp == pytest.approx(tp)


def test_the_compute_to_comms_curves_are_the_layer_times():
    """The numbers `plotting.plot_compute_bound` draws: T_math / T_comms per tokens per device."""
    xxl, kw = parallel.XXL, {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W, "m_x": 2}
    per_device = [1.0, 61.1, 318.75, 10_000.0]
    curves = compute_bound.compute_to_comms_curves(per_device, xxl.d_model, xxl.d_ff, 64,
                                                   fixed_xy=(16, 4), **kw)
    assert list(curves) == ["fsdp", "tp", "optimal", "fixed"]
    for key, (x, y) in {"fsdp": (64, 1), "tp": (1, 64), "fixed": (16, 4)}.items():
        for b, ratio in zip(per_device, curves[key], strict=True):
            t = compute_bound.layer_times(b * 64, xxl.d_model, xxl.d_ff, x=x, y=y, **kw)
            assert ratio == pytest.approx(t.math_s / t.comms_s)
    # the optimal split (T_FSDP = T_TP) is the best any split of 64 devices does
    for best, fsdp, tp in zip(curves["optimal"], curves["fsdp"], curves["tp"], strict=True):
        assert best >= max(fsdp, tp) * (1 - 1e-12)
    assert curves["fixed"][2] == pytest.approx(1.0)  # 318.75 tokens: compute = comms (part c)
    alone = compute_bound.compute_to_comms_curves([8.0], 16, 64, 1, **kw)
    assert alone == {"fsdp": [math.inf], "tp": [math.inf], "optimal": [math.inf]}
    with pytest.raises(TypeError, match="X must be an integer"):
        compute_bound.compute_to_comms_curves([8.0], 16, 64, 4, fixed_xy=(1.5, 2), **kw)
