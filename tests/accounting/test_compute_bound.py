"""mlsys.accounting.compute_bound: when FSDP and tensor parallelism are compute-bound, against the
Scaling Book's worked figures and part c of the CS336 4D-parallelism question (XXL), and the
curves `plotting.plot_compute_bound` draws. Source: Austin et al. (2025), "How to Scale Your
Model", the Training section (https://jax-ml.github.io/scaling-book/training/), subsections on
FSDP, tensor parallelism and "Mixed FSDP and Tensor Parallelism". Pure: no ranks."""

import math

import pytest

from mlsys import hardware
from mlsys.accounting import compute_bound, parallel

V5P_C = hardware.TPU_V5P.peak_flop_per_s("bf16")
V5P_W = hardware.LINKS["ici-v5p-axis"].bytes_per_s
SEED_C = 4.6e14  # the CS336 question's rounding of the v5p's 459 TFLOP/s
ALPHA = 2550  # the Book's C / W_ici on a TPU v5p


def test_the_books_mixed_condition_adds_the_two_communications():
    """The Book: "we become comms bound when T_FSDP comms + T_MP comms = T_math", a quadratic in
    X whose discriminant vanishes at B / N = 4 alpha^2 / (F M_X M_Y); with M_X = 2, M_Y = 1 its
    takeaway "a batch size per device of 2 * 2550^2 / F", "around 396" for F = 32,768 and 432 for
    LLaMA-3 70B's F = 30,000."""
    kw = {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W, "m_x": 2, "m_y": 1}
    assert compute_bound.ici_intensity(V5P_C, V5P_W) == pytest.approx(ALPHA)
    assert compute_bound.optimal_compute_bound_batch(32_768, **kw) == pytest.approx(
        2 * ALPHA**2 / 32_768) == pytest.approx(396.9, abs=0.1)
    assert compute_bound.optimal_compute_bound_batch(30_000, **kw) == pytest.approx(433.5, abs=0.1)
    # the overlapped model ("max") promises a quarter of it
    assert compute_bound.optimal_compute_bound_batch(32_768, model="max", **kw) == pytest.approx(
        ALPHA**2 / (2 * 32_768))
    # the double root of alpha F M_Y X^2 - B F M_X M_Y X + alpha B N M_X = 0: X = B M_X / (2 alpha)
    f, n = 32_768, 64
    b = compute_bound.optimal_compute_bound_batch(f, **kw) * n
    x = compute_bound.optimal_fsdp_degree(b, f, n, m_x=2, m_y=1)
    assert x == pytest.approx(b * 2 / (2 * ALPHA))
    quadratic = ALPHA * f * x**2 - b * f * 2 * x + ALPHA * b * n * 2
    assert quadratic == pytest.approx(0, abs=1e-6 * b * f)
    t = compute_bound.layer_times(b, 8192, f, x=round(x), y=n // round(x), **kw)
    assert t.comms_s == t.fsdp_s + t.tp_s and t.comms("max") == max(t.fsdp_s, t.tp_s)


def test_xxl_part_c_compute_bound_batch_for_fsdp_16_tp_4():
    assert V5P_W == 2 * hardware.LINKS["ici-v5p"].bytes_per_s == 1.8e11  # W_ici = 2 x 9e10
    kw = {"x": 16, "y": 4, "link_bytes_per_s": V5P_W, "m_x": 2, "m_y": 1}
    xxl = parallel.XXL
    tp_share = 4 * ALPHA / xxl.d_ff  # T_TP / T_math, whatever the batch
    book = compute_bound.compute_bound_batch(xxl.d_ff, flop_per_s=V5P_C, **kw)
    assert book == pytest.approx(ALPHA / (4 * 2) / (1 - tp_share))  # 394.3 tokens
    overlapped = compute_bound.compute_bound_batch(xxl.d_ff, flop_per_s=V5P_C, model="max", **kw)
    assert overlapped == pytest.approx(ALPHA / (4 * 2))  # alpha / (Y M_X) = 318.75 tokens
    assert compute_bound.compute_bound_batch(xxl.d_ff, flop_per_s=SEED_C, model="max", **kw) \
        * 64 == pytest.approx(20_444.4, rel=1e-5)
    for model, per_device in (("sum", book), ("max", overlapped)):
        for factor, bound in ((1.01, True), (0.99, False)):
            t = compute_bound.layer_times(per_device * 64 * factor, xxl.d_model, xxl.d_ff,
                                          flop_per_s=V5P_C, **kw)
            assert t.is_compute_bound(model) is bound and t.tp_s < t.math_s
    # the closed form holds at the best split only, far from X = 16 here
    best = compute_bound.optimal_compute_bound_batch(xxl.d_ff, flop_per_s=V5P_C,
                                                     link_bytes_per_s=V5P_W, m_x=2, m_y=1)
    assert best == pytest.approx(4 * ALPHA**2 / (2 * xxl.d_ff)) and best < book


def test_the_torus_axes_each_group_spans():
    """The Book's M_X and M_Y, "the number of mesh axes over which we do FSDP and MP (these
    should roughly sum to 3)", on a 4 x 4 x 4 slice."""
    assert compute_bound.torus_axes(16, 4) == (2.0, 1.0)  # the question's M_X = 2, M_Y = 1
    assert compute_bound.torus_axes(4, 16) == (1.0, 2.0)
    assert compute_bound.torus_axes(8, 8) == pytest.approx((1.5, 1.5))  # one axis split 2 x 2
    assert compute_bound.torus_axes(2, 32) == pytest.approx((0.5, 2.5))
    assert compute_bound.torus_axes(64, 1) == (3.0, 0.0)
    with pytest.raises(ValueError, match=r"x \* y \(4 \* 4\) must equal the torus's chips"):
        compute_bound.torus_axes(4, 4)
    with pytest.raises(ValueError, match=r"x \(6\) cannot be laid along the axes"):
        compute_bound.torus_axes(6, 4, (4, 6))
    with pytest.raises(ValueError, match="m_x must be > 0"):
        compute_bound.compute_bound_batch(1024, x=2, flop_per_s=1.0, link_bytes_per_s=1.0, m_x=0)
    with pytest.raises(ValueError, match="model='both' is not one of"):
        compute_bound.compute_bound_batch(1024, flop_per_s=1.0, link_bytes_per_s=1.0,
                                          model="both")


def test_the_scaling_books_worked_figures():
    # pure FSDP / DP: B / X > alpha / M_X; three axes: about 850
    assert compute_bound.compute_bound_batch(8192, x=64, flop_per_s=V5P_C, link_bytes_per_s=V5P_W,
                                             m_x=3) == pytest.approx(850)
    # TP: Y < M_Y F / alpha; LLaMA-3 70B's F ~ 30k: 8-way fine, 16-way not
    kw = {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W}
    assert compute_bound.compute_bound_batch(28_672, y=8, **kw) == 0.0
    assert compute_bound.compute_bound_batch(28_672, y=16, **kw) == math.inf
    assert compute_bound.compute_bound_batch(28_672, x=2, y=16, model="max", **kw) == math.inf
    # at X_opt, the two communications take the same time
    x = compute_bound.optimal_fsdp_degree(48_000, 32_768, 64, m_x=2)
    fsdp = 4 * 8192 * 32_768 / ((64 / x) * V5P_W * 2)
    tp = 4 * 48_000 * 8192 / (x * V5P_W)
    assert fsdp == pytest.approx(tp)


def test_the_compute_to_comms_curves_are_the_layer_times():
    """The numbers `plotting.plot_compute_bound` draws: T_math / T_comms per tokens per device."""
    xxl, kw = parallel.XXL, {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W, "m_x": 2}
    per_device = [1.0, 61.1, 318.75, 10_000.0]
    for model in compute_bound.COMMS_MODELS:
        curves = compute_bound.compute_to_comms_curves(per_device, xxl.d_model, xxl.d_ff, 64,
                                                       fixed_xy=(16, 4), model=model, **kw)
        assert list(curves) == ["fsdp", "tp", "optimal", "fixed"]
        for key, (x, y) in {"fsdp": (64, 1), "tp": (1, 64), "fixed": (16, 4)}.items():
            for b, ratio in zip(per_device, curves[key], strict=True):
                t = compute_bound.layer_times(b * 64, xxl.d_model, xxl.d_ff, x=x, y=y, **kw)
                assert ratio == pytest.approx(t.math_s / t.comms(model))
        # the optimal split (T_FSDP = T_TP) is the best any split of 64 devices does
        for best, fsdp, tp in zip(curves["optimal"], curves["fsdp"], curves["tp"], strict=True):
            assert best >= max(fsdp, tp) * (1 - 1e-12)
    overlapped = compute_bound.compute_to_comms_curves([318.75], xxl.d_model, xxl.d_ff, 64,
                                                       fixed_xy=(16, 4), model="max", **kw)
    assert overlapped["fixed"][0] == pytest.approx(1.0)  # compute = the larger of the two
    alone = compute_bound.compute_to_comms_curves([8.0], 16, 64, 1, **kw)
    assert alone == {"fsdp": [math.inf], "tp": [math.inf], "optimal": [math.inf]}
    with pytest.raises(TypeError, match="X must be an integer"):
        compute_bound.compute_to_comms_curves([8.0], 16, 64, 4, fixed_xy=(1.5, 2), **kw)


def test_split_thresholds_tie_m_to_the_torus_and_give_both_models():
    """Part (d): each split of 64 v5p chips with the M_X and M_Y of the axes it spans."""
    xxl, kw = parallel.XXL, {"flop_per_s": V5P_C, "link_bytes_per_s": V5P_W}
    rows = compute_bound.split_thresholds(xxl.d_ff, [(16, 4, 1), (4, 16, 1), (16, 4, 0.5)], **kw)
    for r in rows:
        mx, my = compute_bound.torus_axes(r["x"], r["y"])
        assert (r["m_x"], r["m_y"]) == (mx, my)
        assert r["tp_share"] == pytest.approx(r["y"] * ALPHA / (xxl.d_ff * my))
        for model in compute_bound.COMMS_MODELS:
            assert r[model] == compute_bound.compute_bound_batch(
                xxl.d_ff, x=r["x"], y=r["y"], m_x=mx / r["gather"], m_y=my, model=model, **kw)
    assert rows[1]["sum"] < rows[0]["sum"]  # Y = 16 on two axes beats Y = 4 on one
    assert rows[2]["sum"] == pytest.approx(rows[0]["sum"] / 2)  # fp8 gathers halve T_FSDP
    with pytest.raises(ValueError, match="gather must be > 0"):
        compute_bound.split_thresholds(xxl.d_ff, [(16, 4, 0)], **kw)
