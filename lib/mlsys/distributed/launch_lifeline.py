"""The lifeline: a launch's ranks die with the launching process, however it dies.

A pipe per launch: only the launching process holds its write end (close-on-exec, and closed in
any child it forks), every rank a read end, and a thread in each rank blocks reading it. Stopping
a launch writes one byte per rank, then closes it: a rank reading a byte kills itself. End of
file without a byte means the launching process died, however it died (SIGKILL included): the
rank kills itself and its fork server (which serves nobody else once the launching process is
gone; left alone it does exit, but only after 1 to 4 s of interpreter shutdown with torch
loaded, measured on a busy 2-core machine). The resource tracker exits by itself once its pipe
closes, within 0.2 s; it is left alone, as its job is to clean up after the dead.

`Lifeline` is the launching process's side (`launch_job.Launch` holds one per launch);
`die_with_parent` and `watch_lifeline` run in each rank (`launch_rank.rank_main`). Linux's
`PR_SET_PDEATHSIG` backs it up: a rank is also killed when its parent (the fork server) exits.
Used by `mlsys.distributed.launch` (chapters 08 to 10).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection


class Lifeline:
    """A launch's lifeline, seen from the launching process: `reader` goes to the ranks (and is
    closed here once they hold it), `cut` ends it."""

    holding: set[Lifeline] = set()  # those whose write end this process holds open
    at_fork_registered = False

    def __init__(self) -> None:
        if not Lifeline.at_fork_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=Lifeline.drop_all)
            Lifeline.at_fork_registered = True
        read, self._write = os.pipe()  # both close-on-exec: no exec'd child inherits them
        self.reader = Connection(read, writable=False)
        Lifeline.holding.add(self)

    def cut(self, ranks: int) -> None:
        """Tell up to `ranks` ranks that the launch stopped, then close the write end (once, and
        only in the process that opened it): every rank still holding a read end kills itself."""
        if self in Lifeline.holding:
            Lifeline.holding.discard(self)
            try:
                os.write(self._write, b"x" * ranks)  # a few bytes into an empty pipe: no wait
            except OSError:  # no rank holds a read end any more
                pass
            os.close(self._write)

    @staticmethod
    def drop_all() -> None:
        """In a child this process forked: let go of every write end, so that the child cannot
        keep ranks alive after the launching process died."""
        for lifeline in Lifeline.holding:
            try:
                os.close(lifeline._write)
            except OSError:
                pass
        Lifeline.holding.clear()


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def watch_lifeline(lifeline: Connection, server: int | None) -> None:
    """A daemon thread that SIGKILLs this rank once the lifeline gives a byte (the launch
    stopped) or reaches its end (the launching process died: then also the fork server `server`,
    this rank's parent)."""
    def watch() -> None:
        try:
            said = os.read(lifeline.fileno(), 1)
        except OSError:
            said = b""
        if not said and server is not None and os.getppid() == server:
            os.kill(server, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="mlsys-lifeline", daemon=True).start()
