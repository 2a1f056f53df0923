"""mlsys.distributed.launch_job, the launching process's side of a launch: one launch serves many
calls; a rank that raises, hangs (in a collective, or alone past the call's deadline) or dies, and
a taken port, each give a clear error within seconds and leave no process behind; a rank that
dies is named first, before the peer whose collective then breaks; every launch
gets its own free port; a start that cannot finish in time raises within its timeout and leaves
nothing, even while a new fork server is still importing torch (tests/launch_victim.py, in a
process of its own).

Rank functions live at module level (the ranks import them: here and in launch_cases.py).
"""

import os
import socket
import subprocess
import threading
import time

import psutil
import pytest
from launch_cases import (
    FAST,
    GONE_S,
    Victim,
    command,
    describe,
    gone,
    rank_descendants,
    survivors,
    whoami,
)

from mlsys.distributed import launch
from mlsys.distributed.launch_job import DEATH_LAG_S, LaunchError, RankFailed, death_time

COLD_TIMEOUT_S = 0.5  # a start cannot finish in this while a new fork server imports torch
RAISE_GRACE_S = 1.0  # how far past its timeout a start may raise


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


def killed_mid_collective(rank, launcher=None):
    """Rank 1 dies by SIGKILL; rank 0 then meets the broken all_reduce and reports it. With a
    `launcher` pid, rank 1 first stops the launching process (SIGSTOP) and rank 0 wakes it
    (SIGCONT) only after its report is sent: the launching process finds both at one look, as
    on a busy machine where it looks late."""
    import signal
    import threading

    import torch
    import torch.distributed as dist

    if rank.rank == 1:
        if launcher is not None:
            os.kill(launcher, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(4), group=rank.group)
    finally:
        if launcher is not None:  # from a thread: rank 0's report goes out first
            threading.Timer(0.3, os.kill, args=(launcher, signal.SIGCONT)).start()


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
        with pytest.raises(RankFailed, match="rank 1 failed first") as info:
            job.run(raises)
        pids = job.pids
        with pytest.raises(LaunchError, match="stopped"):  # the launch is over
            job.run(whoami, args=(0,))
    assert time.monotonic() - start < 60
    assert "ValueError: rank 1 was told to fail" in str(info.value)
    assert "Traceback" in info.value.failures[1]
    assert gone(pids)


def test_a_rank_that_hangs_in_a_collective_times_out():
    start = time.monotonic()
    with launch.start(2, timeout_s=30, collective_timeout_s=2) as job:
        with pytest.raises(RankFailed) as info:
            job.run(hangs_in_collective, timeout_s=30)
        pids = job.pids
    assert time.monotonic() - start < 60
    text = str(info.value)
    assert "rank 0 failed first" in text and "Timed out" in text and "ranks [1]" in text
    assert gone(pids)


def test_a_rank_that_hangs_alone_runs_into_the_calls_deadline():
    start = time.monotonic()
    with launch.start(2, **FAST) as job:
        with pytest.raises(RankFailed, match="rank 0 failed first") as info:
            job.run(hangs_alone, timeout_s=2)
        pids = job.pids
    assert time.monotonic() - start < 60
    assert "still running after the deadline of hangs_alone" in info.value.failures[0]
    assert 1 not in info.value.failures  # rank 1 returned in time
    assert gone(pids)


@pytest.mark.timeout(90)
def test_a_rank_that_dies_is_named_before_the_peer_that_then_fails():
    """The headline names the rank that died, not the survivor whose collective broke after it,
    also when the launching process sees both at one look (it was stopped meanwhile)."""
    backstop = subprocess.Popen(["sh", "-c", f"sleep 60; kill -CONT {os.getpid()}"])
    try:
        for launcher in (None, None, os.getpid()):
            with launch.start(2, **FAST) as job:
                with pytest.raises(RankFailed, match="rank 1 failed first") as info:
                    job.run(killed_mid_collective, args=(launcher,))
                pids = job.pids
            text = str(info.value)
            assert "killed by signal SIGKILL" in info.value.failures[1]
            assert "all_reduce" in info.value.failures[0]  # rank 0's traceback: it reported
            assert text.index("--- rank 1 ---") < text.index("--- rank 0 ---")
            assert gone(pids)
    finally:
        backstop.kill()
        backstop.wait()


def test_a_death_counts_from_before_the_last_look_that_missed_it():
    """A peer's report can reach the launching process up to 25 ms (measured) before the dead
    rank's end of file: the death is put before reports raised after the last clear look, less
    DEATH_LAG_S, and after reports raised well before it."""
    last_clear = 1_000.0  # the launching process's last look that did not see the death
    died = death_time(last_clear)
    assert died == last_clear - DEATH_LAG_S < last_clear - 0.025
    peer_report = last_clear + 0.004  # raised on meeting the broken collective, seen first
    unrelated = last_clear - 2 * DEATH_LAG_S  # raised well before: not caused by the death
    assert sorted([peer_report, died, unrelated]) == [unrelated, died, peer_report]


def test_a_rank_that_dies_without_a_word():
    with launch.start(2, **FAST) as job:
        with pytest.raises(RankFailed, match="rank 1 exited with code 3"):
            job.run(dies)
        pids = job.pids
    assert gone(pids)


def test_a_taken_port_is_a_clear_error_and_starts_nothing():
    before = {p.pid for p in rank_descendants()}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(LaunchError, match=f"port {port} is taken"):
            launch.start(2, port=port, **FAST)
    assert time.monotonic() - start < 60
    assert {p.pid for p in rank_descendants()} <= before


def test_each_launch_gets_its_own_free_port():
    with launch.start(2, **FAST) as a, launch.start(2, **FAST) as b:
        assert a.port != b.port
        assert a.run(whoami, args=(0,))[0][:2] == b.run(whoami, args=(0,))[0][:2] == (0, 2)


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
    with pytest.raises(RankFailed, match="^start: .*every rank was stopped"):
        launch.start(2, timeout_s=timeout_s, collective_timeout_s=5, start_method=start_method)
    assert time.monotonic() - start < timeout_s + 1.0
    for thread in threading.enumerate():  # the ranks' starter, where a rank was still starting
        if thread.name == "mlsys-launch-start":
            thread.join(timeout=30)
    left = survivors([p for p in rank_descendants() if p.pid not in before])
    assert left == [], [" ".join(p.cmdline())[-80:] for p in left]


@pytest.fixture
def victims():
    """The cold start's victim, killed at the end of its test whatever happened (before the last
    test of this module looks for processes left behind)."""
    started = {"cold start": Victim("cold-start", COLD_TIMEOUT_S)}
    try:
        yield started
    finally:
        for victim in started.values():
            victim.clean_up()


@pytest.mark.timeout(120)
def test_a_first_start_honours_its_timeout_while_the_fork_server_imports_torch(victims):
    victim = victims["cold start"]
    lines = victim.wait_for(lambda lines: "starter done" in lines)
    said = next(line for line in lines if line.startswith(("raised", "started")))
    assert said.startswith("raised"), "\n".join(lines)
    assert float(said.split()[1]) < COLD_TIMEOUT_S + RAISE_GRACE_S, said
    assert f"within timeout_s={COLD_TIMEOUT_S} s" in said or "deadline of start" in said
    server = [p for p in victim.below() if "forkserver" in command(p)]
    assert len(server) == 1, describe(victim.below())
    left = survivors(server[0].children(recursive=True), GONE_S)  # ranks started too late
    assert not left, f"ranks alive {GONE_S} s after the start gave up: {describe(left)}"


@pytest.mark.skipif(psutil.cpu_count() is None, reason="psutil cannot see this machine")
def test_no_rank_is_left_behind():
    """After every launch above, no process below this one is a rank."""
    assert rank_descendants() == []
