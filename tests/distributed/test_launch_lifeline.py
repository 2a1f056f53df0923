"""mlsys.distributed.launch_lifeline: when the launching process is killed (SIGTERM, SIGKILL,
SIGHUP: a kernel restart, `kill`, a closed terminal), its ranks, fork server and resource tracker
are gone within 5 s, other children it has or not; and what a stopped launch writes on the
lifeline.

The tests of a killed launcher run tests/launch_victim.py in a process of its own and watch
every process below it with psutil (launch_cases.py). The victims start together, once per module
(each takes 5-10 s on a busy 2-core machine, mostly importing torch), and whatever they leave is
killed at the end, pass or fail.
"""

import os
import signal

import psutil
import pytest
from launch_cases import GONE_S, Victim, alive, command, describe, survivors

from mlsys.distributed.launch_lifeline import Lifeline

SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGHUP)


def ranks_running(lines):
    return sum(line.startswith("rank ") for line in lines) == 2


@pytest.fixture(scope="module")
def victims():
    """The victims of this module, started together; killed at the end whatever happened."""
    started = {sig: Victim("mlsys") for sig in SIGNALS}
    started["other children"] = Victim("mlsys", "--other-children")
    try:
        yield started
    finally:
        for victim in started.values():
            victim.clean_up()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_killing_the_launcher_leaves_no_rank_fork_server_or_tracker(victims, sig):
    victim = victims[sig]
    victim.wait_for(ranks_running)
    ranks = victim.pids("rank")
    below = victim.below()
    helpers = [p for p in below if p.pid not in ranks]
    assert set(ranks) <= {p.pid for p in below}
    assert any("forkserver" in command(p) for p in helpers), describe(helpers)
    assert any("resource_tracker" in command(p) for p in helpers), describe(helpers)
    victim.kill(sig)
    left = survivors(below, GONE_S)
    assert not left, f"alive {GONE_S} s after {sig.name} to the launcher: {describe(left)}"


@pytest.mark.timeout(120)
def test_children_of_the_launcher_do_not_keep_its_ranks_alive(victims):
    """A forked child inherits every descriptor the launcher held, but not the ranks' lifeline:
    ranks and fork server still go. The child keeps multiprocessing's resource tracker (it holds
    its pipe) until it exits; the tracker holds no rank."""
    victim = victims["other children"]
    victim.wait_for(lambda lines: ranks_running(lines) and victim.pids("other"))
    others = [psutil.Process(pid) for pid in victim.pids("other")]
    ranks = victim.pids("rank")
    below = victim.below()
    ours = [p for p in below if p.pid in ranks or "forkserver" in command(p)]
    assert len(ours) == 3, describe(below)  # two ranks and their fork server
    victim.kill(signal.SIGKILL)
    left = survivors(ours, GONE_S)
    assert not left, f"alive {GONE_S} s after SIGKILL to the launcher: {describe(left)}"
    assert all(alive(p) for p in others)  # the children it had are still there: not ours to end


def test_cutting_a_lifeline_gives_each_rank_a_byte_then_the_end_of_the_pipe():
    """In this process: the bytes a stopped launch writes (one per rank, then end of file: what a
    rank's watcher reads), and a second cut that does nothing."""
    line = Lifeline()
    assert line in Lifeline.holding
    try:
        line.cut(2)
        assert line not in Lifeline.holding
        assert os.read(line.reader.fileno(), 16) == b"xx"
        assert os.read(line.reader.fileno(), 16) == b""  # the write end is closed
        line.cut(2)  # once only, and only where it was opened
    finally:
        line.reader.close()
