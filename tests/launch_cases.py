"""What the tests of mlsys.distributed.launch and its parts share (tests/distributed/test_launch.py,
test_launch_job.py, test_launch_rank.py, test_launch_lifeline.py): a rank function, the processes
below this one and whether they are gone, and victims: tests/launch_victim.py running in a process
of its own, to be killed or timed from outside, every process below it watched with psutil.

Imported by the test files and by their ranks (the tests directory is on the ranks' path).
"""

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

FAST = {"timeout_s": 30, "collective_timeout_s": 5}
VICTIM = Path(__file__).with_name("launch_victim.py")
LIB = Path(__file__).resolve().parents[1] / "lib"
GONE_S = 5.0  # the promise: nothing outlives the launching process by more than this
READY_S = 90.0  # for a victim to get its ranks running (several at once on 2 busy cores)


def whoami(rank, offset):
    import torch.distributed as dist

    return (rank.rank, rank.world_size, rank.backend, str(rank.device),
            dist.get_world_size(rank.group) + offset, os.getpid())


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
        try:  # a compiler's tool may end between the listing and the look (its command line
            # then reads empty: its name still says what it was)
            command = " ".join(p.cmdline()) + " " + p.name()
            server = "multiprocessing.forkserver" in command and p.ppid() == os.getpid()
            if p.status() != psutil.STATUS_ZOMBIE and not server and not any(
                    h in command for h in helpers):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def alive(proc):
    """Still running (a zombie is not; a new process that took the pid is not `proc`)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(procs, within_s=GONE_S):
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
