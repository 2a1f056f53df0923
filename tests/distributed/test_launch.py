"""mlsys.distributed.launch: `run` gives every rank's value back and leaves no process behind; bad
arguments, and a world larger than this machine can run, fail before anything starts. (The launch
itself, its failures and deadlines: test_launch_job.py; the ranks: test_launch_rank.py; ranks that
die with a killed launcher: test_launch_lifeline.py.)

Rank functions live at module level (the ranks import them: here and in launch_cases.py).
"""

import os
import time

import psutil
import pytest
from launch_cases import FAST, gone, rank_descendants, whoami

from mlsys.distributed import launch


def test_run_returns_every_ranks_value_and_leaves_nothing():
    values = launch.run(whoami, 2, args=(100,), **FAST)
    assert [v[:5] for v in values] == [(0, 2, "gloo", "cpu", 102), (1, 2, "gloo", "cpu", 102)]
    assert gone([v[5] for v in values])


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: launch.start(0), ValueError, "world_size must be a positive integer, got 0"),
    (lambda: launch.start(2, device="tpu"), ValueError, "device='tpu' is not one of"),
    (lambda: launch.start(2, backend="mpi"), ValueError, "backend='mpi' is not one of"),
    (lambda: launch.start(2, backend="nccl"), ValueError, "needs device='cuda'"),
    (lambda: launch.start(2, timeout_s=0), ValueError, "timeout_s must be > 0"),
    (lambda: launch.start(2, port=70_000), ValueError, "port must be at most 65535"),
    (lambda: launch.start(2, start_method="fork"), ValueError, "start_method='fork'"),
    (lambda: launch.start(launch.cpu_rank_limit() + 1), ValueError,
     r"world_size \(\d+\) is more ranks than this CPU can run: at most 4 per core"),
    (lambda: launch.run(lambda rank: 1, 2), TypeError, "must be picklable"),
    (lambda: launch.run("whoami", 2), TypeError, "fn must be a callable"),
    (lambda: launch.run(whoami, 2, args=5), TypeError,
     r"args must be a tuple \(or list\) of arguments, such as args=\(x,\), got int"),
    (lambda: launch.run(whoami, 2, args="ab"), TypeError, "args must be a tuple .* got str"),
    (lambda: launch.run(whoami, 2, args=(0,), kwargs=[1]), TypeError,
     "kwargs must be a dict or None, got list"),
])
def test_bad_arguments_fail_before_anything_starts(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_cpu_rank_limit_is_the_rule_the_docstring_states():
    assert launch.cpu_rank_limit() == max(8, 4 * (os.cpu_count() or 1))


def test_a_world_far_beyond_the_machine_is_refused_before_anything_starts():
    before = {p.pid for p in rank_descendants()}
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"gives {launch.cpu_rank_limit()}$"):
        launch.run(whoami, 10_000, args=(0,), **FAST)
    assert time.monotonic() - start < 1.0
    assert {p.pid for p in rank_descendants()} <= before


@pytest.mark.skipif(psutil.cpu_count() is None, reason="psutil cannot see this machine")
def test_no_rank_is_left_behind():
    """After every launch above, no process below this one is a rank."""
    assert rank_descendants() == []
