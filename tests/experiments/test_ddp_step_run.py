"""What ddp_step runs (`mlsys.experiments.ddp_step_run`): the parent's rows are the slowest rank's
samples, step by step, and sizes that cannot split into micro-batches are refused before any rank
starts. (The launch itself runs in test_ddp_step.py.)"""

import dataclasses

import pytest

from mlsys.experiments import ddp_step_run


def test_a_phase_row_takes_the_slowest_rank_step_by_step():
    fast = [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]
    slow = [[2.0, 1.0, 3.0, 4.0], [1.0, 5.0, 3.0, 4.0], [1.0, 2.0, 3.0, 9.0]]
    per_rank = [{"phases": fast, "calls": 21, "sent_bytes": 1000},
                {"phases": slow, "calls": 21, "sent_bytes": 1000}]
    row = ddp_step_run._phase_rows(per_rank)
    assert set(row) == {*ddp_step_run.PHASES, "step", "all_reduce_calls", "sent_bytes"}
    assert row["forward"]["samples_s"] == [2.0, 1.0, 1.0]
    assert row["backward"]["samples_s"] == [2.0, 5.0, 2.0]
    assert row["optimizer"]["samples_s"] == [4.0, 4.0, 9.0]
    # the step is the slowest rank's whole step, not the sum of each phase's slowest rank
    assert row["step"]["samples_s"] == [10.0, 13.0, 15.0]
    assert row["step"]["median_s"] == 13.0
    assert (row["all_reduce_calls"], row["sent_bytes"]) == (21, 1000)


def test_a_batch_that_micro_batches_cannot_split_is_refused_before_the_launch():
    sizes = dataclasses.replace(ddp_step_run.SIZES["smoke"], batch=3)
    with pytest.raises(ValueError, match=r"batch \(3\) must be divisible by every micro-batch"):
        ddp_step_run.run(sizes, device="cpu")
    for s in ddp_step_run.SIZES.values():
        assert all(s.batch % k == 0 for k in s.micro_batches)
