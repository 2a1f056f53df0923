"""mlsys.accounting.pipeline: the schedules (GPipe, 1F1B) simulated against the bubble formula,
the micro-batches in flight, and the argument checks. Pure: no ranks."""

import pytest

from mlsys.accounting import parallel, pipeline


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_the_simulated_bubble_is_the_formula(schedule, p, m):
    for tf, tb in ((1.0, 1.0), (1.0, 2.0), (1.0, 3.5)):
        assert pipeline.simulated_bubble_fraction(p, m, schedule, forward_s=tf, backward_s=tb) == \
            pytest.approx(pipeline.bubble_fraction(p, m))
    for s in range(p):
        ops = pipeline.pipeline_schedule(s, p, m, schedule)
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        held, peak = 0, 0
        for op, _ in ops:
            held += 1 if op == "F" else -1
            peak = max(peak, held)
        assert peak == (m if schedule == "gpipe" else min(m, p - s))
        assert peak == pipeline.in_flight(s, p, m, schedule) or p == 1


def test_pipeline_arguments_are_checked():
    with pytest.raises(ValueError, match=r"stage \(2\) must be < n_stages \(2\)"):
        pipeline.pipeline_schedule(2, 2, 4)
    with pytest.raises(ValueError, match="schedule='interleaved' is not one of"):
        pipeline.pipeline_schedule(0, 2, 4, "interleaved")
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        pipeline.bubble_fraction(2, 0)
    assert parallel.bubble_fraction is pipeline.bubble_fraction  # re-exported by parallel


def test_interleaving_and_zero_bubble_shrink_the_bubble():
    """Narayanan et al. (2021), "Efficient Large-Scale Language Model Training on GPU Clusters
    Using Megatron-LM", section 2.2.2: the interleaved schedule's bubble is (p - 1) / v of a
    micro-batch's time, so its idle share is (p - 1) / (v m + p - 1). Qi et al. (2024),
    "Zero Bubble Pipeline Parallelism", ZB-H1: (p - 1) (t_F + t_B - t_W) idle per stage."""
    p, m = 8, 32
    assert pipeline.interleaved_bubble_fraction(p, m, 1) == pipeline.bubble_fraction(p, m)
    for v in (2, 4):
        ideal = m * 1.0  # a step of m micro-batch times, the bubble (p - 1) / v on top of it
        assert pipeline.interleaved_bubble_fraction(p, m, v) == pytest.approx(
            ((p - 1) / v) / (ideal + (p - 1) / v))
    assert pipeline.interleaved_bubble_fraction(p, m, 4) < pipeline.interleaved_bubble_fraction(
        p, m, 2) < pipeline.bubble_fraction(p, m)
    # equal F, B and W: 1F1B idles (p - 1) 3 t_F, ZB-H1 a third of that
    one_f_one_b = (p - 1) * 3 / (m * 3 + (p - 1) * 3)
    assert one_f_one_b == pytest.approx(pipeline.bubble_fraction(p, m))
    assert pipeline.zero_bubble_fraction(p, m) == pytest.approx((p - 1) / (3 * m + p - 1))
    assert pipeline.zero_bubble_fraction(p, m, weight_grad_s=2.0) == 0.0
    with pytest.raises(ValueError, match=r"microbatches \(12\) must be a multiple of n_stages"):
        pipeline.interleaved_bubble_fraction(8, 12, 2)
    with pytest.raises(ValueError, match=r"weight_grad_s \(3.0\) must be <= forward_s"):
        pipeline.zero_bubble_fraction(4, 8, weight_grad_s=3.0)
    with pytest.raises(ValueError, match="chunks must be a positive integer"):
        pipeline.interleaved_bubble_fraction(4, 8, 0)
