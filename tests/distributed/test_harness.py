"""mlsys.distributed.harness: the reference (one process training the tiny model) learns, is the
same run every time and sends nothing; its setup is checked; `combine` and `max_diff` put the ranks'
results together and compare them. (`check.against_one_process`, which runs on it, refuses a bad
mesh before any launch.)"""

import pytest
import torch

from mlsys.accounting import parallel
from mlsys.distributed import check, harness


def test_the_reference_learns_and_bad_meshes_fail_before_any_launch():
    ref = harness.one_process(harness.Setup(steps=3))
    assert len(ref["losses"]) == 3 and ref["losses"][-1] < ref["losses"][0]
    assert ref["sent"] == 0 and ref["calls"] == {}  # one process: no collective
    with pytest.raises(ValueError, match="world_size"):
        check.against_one_process({"bad": (dict(tp=3), False)}, 2)
    with pytest.raises(ValueError, match="lr"):
        harness.Setup(lr=0)


def test_the_reference_is_the_same_run_every_time():
    a, b = harness.one_process(harness.Setup()), harness.one_process(harness.Setup())
    assert a["losses"] == b["losses"]
    assert all(torch.equal(a["params"][n], t) for n, t in b["params"].items())
    assert torch.equal(harness.Setup().tokens(1), harness.Setup().tokens(1))
    assert not torch.equal(harness.Setup().tokens(0), harness.Setup().tokens(1))


def test_combine_takes_the_losses_of_the_last_stage_and_every_stages_tensors():
    one = torch.zeros(1)
    per_rank = [{"losses": [None, None], "grads": {"a": one}, "params": {"a": one}},
                {"losses": [1.0, 3.0], "grads": {"b": one}, "params": {"b": one}}]
    got = harness.combine(per_rank, parallel.ParallelDims(pp=2))
    assert got["losses"] == [1.0, 3.0] and set(got["grads"]) == set(got["params"]) == {"a", "b"}
    got = harness.combine([per_rank[1], per_rank[1]], parallel.ParallelDims(dp_shard=2))
    assert got["losses"] == [1.0, 3.0]
    assert harness.max_diff({"a": torch.ones(2)}, {"a": torch.zeros(2)}) == 1.0
    with pytest.raises(RuntimeError, match="other tensors"):
        harness.max_diff({"a": one}, {"b": one})
