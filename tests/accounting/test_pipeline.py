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
