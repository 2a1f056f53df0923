"""mlsys.distributed.launch when the launching process is killed (SIGTERM, SIGKILL, SIGHUP: a
kernel restart, `kill`, a closed terminal): its ranks, fork server and resource tracker are gone
within 5 s, other children it has or not; and a start that cannot finish in time raises within
its timeout, even while a new fork server is still importing torch.

Each test runs tests/launch_victim.py in a process of its own and watches every process below it
with psutil. The victims start together, once per module (each takes 5-10 s on a busy 2-core
machine, mostly importing torch), and whatever they leave is killed at the end, pass or fail.
"""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

VICTIM = Path(__file__).with_name("launch_victim.py")
LIB = Path(__file__).resolve().parents[1] / "lib"
GONE_S = 5.0  # the promise: nothing outlives the launching process by more than this
READY_S = 90.0  # for a victim to get its ranks running (several at once on 2 busy cores)
COLD_TIMEOUT_S = 0.5  # a start cannot finish in this while a new fork server imports torch
RAISE_GRACE_S = 1.0  # how far past its timeout a start may raise
SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGHUP)


def alive(proc):
    """Still running (a zombie is not; a new process that took the pid is not `proc`)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(procs, within_s):
    """Those of `procs` still running after waiting up to `within_s` seconds for them to end."""
    deadline = time.monotonic() + within_s
    while True:
        left = [p for p in procs if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def command(proc):
    """Its command line, or "" once it has ended (a zombie has none)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def describe(procs):
    return "; ".join(f"{p.pid}: {command(p)[-90:] or '(gone)'}" for p in procs)


class Victim:
    """tests/launch_victim.py running with `args`; its output lines arrive in a queue."""

    def __init__(self, *args):
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(LIB),
                                                            os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, str(VICTIM), *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.me = psutil.Process(self.proc.pid)
        self.lines: list[str] = []
        self.seen: dict[int, psutil.Process] = {}  # every process found below it, to clean up
        self._queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, done, timeout_s=READY_S):
        """Read lines until `done(lines)` holds; fail with the output if it never does."""
        deadline = time.monotonic() + timeout_s
        while not done(self.lines):
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"victim not ready after {timeout_s} s:\n" + "\n".join(self.lines))
            if line is None:
                pytest.fail(f"victim exited ({self.proc.wait()}):\n" + "\n".join(self.lines))
            self.lines.append(line)
        return self.lines

    def pids(self, word):
        return [int(pid) for line in self.lines if line.startswith(word + " ")
                for pid in line.split()[1:]]

    def below(self):
        """Every process below the victim now (and remembered for the clean-up)."""
        found = self.me.children(recursive=True)
        self.seen.update({p.pid: p for p in found})
        return found

    def kill(self, sig):
        self.below()
        os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)

    def clean_up(self):
        """Kill the victim and everything ever seen below it (pass or fail)."""
        if self.proc.poll() is None:
            self.below()
            self.proc.kill()
            self.proc.wait(timeout=30)
        for p in self.seen.values():
            if alive(p):
                p.kill()
        self._reader.join(timeout=10)  # its output ends once nothing holds the pipe
        if not self._reader.is_alive():
            self.proc.stdout.close()


def ranks_running(lines):
    return sum(line.startswith("rank ") for line in lines) == 2


@pytest.fixture(scope="module")
def victims():
    """The victims of this module, started together; killed at the end whatever happened."""
    started = {sig: Victim("mlsys") for sig in SIGNALS}
    started["other children"] = Victim("mlsys", "--other-children")
    started["cold start"] = Victim("cold-start", COLD_TIMEOUT_S)
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
