"""mlsys.distributed.launch: values come back; a rank that raises, hangs or dies, and a taken port,
each give a clear error within seconds and leave no process behind.

Rank functions live at module level: the ranks import this file to find them.
"""

import os
import signal
import socket
import threading
import time

import psutil
import pytest

from mlsys.distributed import launch, launch_compare

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
    and the background compile of the kernels' tiles (tests/conftest.py) with its tools. Ranks
    forked by the fork server share its command line, so only the server itself (a child of this
    process) is left out."""
    helpers = ("resource_tracker", "mlsys.kernels.compile_report", "mlsys.kernels.aot", "ptxas",
               "cuobjdump", "nvdisasm")
    found = []
    for p in psutil.Process().children(recursive=True):
        try:  # a compiler's tool may end between the listing and the look
            command = " ".join(p.cmdline())
            server = "multiprocessing.forkserver" in command and p.ppid() == os.getpid()
            if p.status() != psutil.STATUS_ZOMBIE and not server and not any(
                    h in command for h in helpers):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def running(proc):
    """Still running (a zombie is not; a new process that took the pid is not `proc`)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(procs, within_s=5.0):
    """Those of `procs` (psutil processes) still running after waiting up to `within_s` s."""
    deadline = time.monotonic() + within_s
    while True:
        left = [p for p in procs if running(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


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
    (lambda: launch.start(launch.cpu_rank_limit() + 1), ValueError,
     r"world_size \(\d+\) is more ranks than this CPU can run: at most 4 per core"),
    (lambda: launch.run(lambda rank: 1, 2), TypeError, "must be picklable"),
    (lambda: launch.run("whoami", 2), TypeError, "fn must be a callable"),
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("start_method", "timeout_s"), [
    ("forkserver", 1e-3),  # the ranks are not even forked by then
    ("spawn", 0.3),  # spawned ranks are still importing torch (1.5 s or more)
])
def test_a_start_that_cannot_finish_in_time_raises_within_it_and_leaves_nothing(start_method,
                                                                                timeout_s):
    import torch.distributed  # noqa: F401  (this process's own import is not part of timeout_s)

    before = {p.pid for p in rank_descendants()}
    start = time.monotonic()
    with pytest.raises(launch.RankFailed, match="^start: .*every rank was stopped"):
        launch.start(2, timeout_s=timeout_s, collective_timeout_s=5, start_method=start_method)
    assert time.monotonic() - start < timeout_s + 1.0
    for thread in threading.enumerate():  # the ranks' starter, where a rank was still starting
        if thread.name == "mlsys-launch-start":
            thread.join(timeout=30)
    left = still_running([p for p in rank_descendants() if p.pid not in before])
    assert left == [], [" ".join(p.cmdline())[-80:] for p in left]


@pytest.mark.timeout(120)
def test_compare_launchers_gives_a_row_per_job():
    handler, environ = signal.getsignal(signal.SIGTERM), dict(os.environ)
    rows = launch_compare.compare_launchers(2, launchers=("mlsys-started", "elastic-fork"))
    assert [(r["launcher"], r["call"]) for r in rows] == [
        ("mlsys-started", 1), ("mlsys-started", 2), ("elastic-fork", 1), ("elastic-fork", 2)]
    for row in rows:
        assert set(row) == {"launcher", "call", "seconds", "value", "world_size", "cpus", "torch"}
        assert row["seconds"] > 0 and row["value"] == 3.0 and row["world_size"] == 2
    assert signal.getsignal(signal.SIGTERM) is handler  # elastic_launch's handler was taken back
    assert dict(os.environ) == environ  # and the variable it sets
    with pytest.raises(ValueError, match="launchers='torchrun' is not one of"):
        launch_compare.compare_launchers(2, launchers=("torchrun",))


@pytest.mark.skipif(psutil.cpu_count() is None, reason="psutil cannot see this machine")
def test_no_rank_is_left_behind():
    """After every launch above, no process below this one is a rank."""
    assert rank_descendants() == []
