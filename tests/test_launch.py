"""mlsys.distributed.launch: values come back; a rank that raises, hangs or dies, and a taken port,
each give a clear error within seconds and leave no process behind.

Rank functions live at module level: the ranks import this file to find them.
"""

import os
import socket
import time

import psutil
import pytest

from mlsys.distributed import launch

FAST = {"timeout_s": 30, "collective_timeout_s": 5}


def whoami(rank, offset):
    import torch.distributed as dist

    return (rank.rank, rank.world_size, rank.backend, str(rank.device),
            dist.get_world_size(rank.group) + offset, os.getpid())


def raises(rank):
    import torch
    import torch.distributed as dist

    if rank.rank == 1:
        raise ValueError("rank 1 was told to fail")
    dist.all_reduce(torch.ones(4), group=rank.group)  # rank 0 waits here for rank 1


def hangs_in_collective(rank):
    import torch
    import torch.distributed as dist

    if rank.rank == 1:
        time.sleep(3_600)
    dist.all_reduce(torch.ones(4), group=rank.group)


def hangs_alone(rank):
    if rank.rank == 0:
        time.sleep(3_600)
    return rank.rank


def dies(rank):
    if rank.rank == 1:
        os._exit(3)
    time.sleep(3_600)


def unpicklable(rank):
    return lambda: rank.rank


def gone(pids):
    """True when none of `pids` runs any more (a zombie is not running)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def rank_descendants():
    """Processes below this one other than multiprocessing's fork server and resource tracker,
    and the background compile of the kernels' tiles (tests/conftest.py) with its tools."""
    helpers = ("forkserver", "resource_tracker", "mlsys.kernels.compile_report",
               "mlsys.kernels.aot", "ptxas", "cuobjdump", "nvdisasm")
    found = []
    for p in psutil.Process().children(recursive=True):
        try:  # a compiler's tool may end between the listing and the look
            if p.status() != psutil.STATUS_ZOMBIE and not any(
                    h in " ".join(p.cmdline()) for h in helpers):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def test_run_returns_every_ranks_value_and_leaves_nothing():
    values = launch.run(whoami, 2, args=(100,), **FAST)
    assert [v[:5] for v in values] == [(0, 2, "gloo", "cpu", 102), (1, 2, "gloo", "cpu", 102)]
    assert gone([v[5] for v in values])


def test_one_launch_serves_many_calls():
    with launch.start(2, **FAST) as job:
        first = job.run(whoami, args=(0,))
        second = job.run(whoami, kwargs={"offset": 1})
        pids = job.pids
    assert [v[5] for v in first] == [v[5] for v in second] == pids  # the same processes
    assert gone(pids)


def test_a_rank_that_raises_stops_every_rank_with_its_traceback():
    start = time.monotonic()
    with launch.start(2, **FAST) as job:
        with pytest.raises(launch.RankFailed, match="rank 1 failed first") as info:
            job.run(raises)
        pids = job.pids
        with pytest.raises(launch.LaunchError, match="stopped"):  # the launch is over
            job.run(whoami, args=(0,))
    assert time.monotonic() - start < 60
    assert "ValueError: rank 1 was told to fail" in str(info.value)
    assert "Traceback" in info.value.failures[1]
    assert gone(pids)


def test_a_rank_that_hangs_in_a_collective_times_out():
    start = time.monotonic()
    with launch.start(2, timeout_s=30, collective_timeout_s=2) as job:
        with pytest.raises(launch.RankFailed) as info:
            job.run(hangs_in_collective, timeout_s=30)
        pids = job.pids
    assert time.monotonic() - start < 60
    text = str(info.value)
    assert "rank 0 failed first" in text and "Timed out" in text and "ranks [1]" in text
    assert gone(pids)


def test_a_rank_that_hangs_alone_runs_into_the_calls_deadline():
    start = time.monotonic()
    with launch.start(2, **FAST) as job:
        with pytest.raises(launch.RankFailed, match="rank 0 failed first") as info:
            job.run(hangs_alone, timeout_s=2)
        pids = job.pids
    assert time.monotonic() - start < 60
    assert "still running after the deadline of hangs_alone" in info.value.failures[0]
    assert 1 not in info.value.failures  # rank 1 returned in time
    assert gone(pids)


def test_a_rank_that_dies_without_a_word():
    with launch.start(2, **FAST) as job:
        with pytest.raises(launch.RankFailed, match="rank 1 exited with code 3"):
            job.run(dies)
        pids = job.pids
    assert gone(pids)


def test_a_value_that_cannot_be_pickled_is_named():
    with pytest.raises(launch.RankFailed, match="return value cannot be pickled"):
        launch.run(unpicklable, 2, **FAST)


def test_a_taken_port_is_a_clear_error_and_starts_nothing():
    before = {p.pid for p in rank_descendants()}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(launch.LaunchError, match=f"port {port} is taken"):
            launch.start(2, port=port, **FAST)
    assert time.monotonic() - start < 60
    assert {p.pid for p in rank_descendants()} <= before


def test_each_launch_gets_its_own_free_port():
    with launch.start(2, **FAST) as a, launch.start(2, **FAST) as b:
        assert a.port != b.port
        assert a.run(whoami, args=(0,))[0][:2] == b.run(whoami, args=(0,))[0][:2] == (0, 2)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: launch.start(0), ValueError, "world_size must be a positive integer, got 0"),
    (lambda: launch.start(2, device="tpu"), ValueError, "device='tpu' is not one of"),
    (lambda: launch.start(2, backend="mpi"), ValueError, "backend='mpi' is not one of"),
    (lambda: launch.start(2, backend="nccl"), ValueError, "needs device='cuda'"),
    (lambda: launch.start(2, timeout_s=0), ValueError, "timeout_s must be > 0"),
    (lambda: launch.start(2, port=70_000), ValueError, "port must be at most 65535"),
    (lambda: launch.start(2, start_method="fork"), ValueError, "start_method='fork'"),
    (lambda: launch.run(lambda rank: 1, 2), TypeError, "must be picklable"),
    (lambda: launch.run("whoami", 2), TypeError, "fn must be a callable"),
])
def test_bad_arguments_fail_before_anything_starts(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.skipif(psutil.cpu_count() is None, reason="psutil cannot see this machine")
def test_no_rank_is_left_behind():
    """After every launch above, no process below this one is a rank."""
    assert rank_descendants() == []
