"""A started launch, seen from the launching process: N ranks in one process group, the calls
sent to them, the values and failures collected back, every wait under a deadline, and the stop.

`Launch` is what `launch.start` returns. It opens the rendezvous store (port 0: the OS picks a
free port, held until the launch stops), starts the ranks (`launch_rank.rank_main`, from a
thread while this one waits for the deadline), and holds their lifeline (`launch_lifeline`).
`Launch.run` pickles a call (`check_call`), sends it to every rank, and collects one message
from each (`_collect`): values in rank order, or `RankFailed` with every failing rank's traceback,
earliest first (a rank that died before the peers that met the broken collective: `death_time`),
once the others have had `REPORT_GRACE_S` to report theirs; a rank that dies without a word or
runs past the deadline fails too. Any failure stops every rank (SIGTERM, then SIGKILL after
`STOP_GRACE_S`). Used by `mlsys.distributed.launch`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.distributed as dist

from mlsys import checks
from mlsys.distributed.launch_lifeline import Lifeline
from mlsys.distributed.launch_rank import HOST, rank_main

STOP_GRACE_S = 3.0
"""Seconds a rank has to exit after SIGTERM before it gets SIGKILL."""
DEATH_LAG_S = 0.25
"""How long after a peer's report of the broken collective a dead rank's end (its pipe's end of
file) may reach the launching process: measured up to 25 ms on a loaded 2-core machine."""
REPORT_GRACE_S = 1.0
"""After a first failure, how long the other ranks have to report theirs (a rank that raised
usually makes its peers fail within a fraction of a second: their traceback says why)."""
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "mlsys.distributed.launch_rank")
"""What the fork server imports once, so that forked ranks start with it already imported
(torch._dynamo is imported by the first optimizer a process builds: 3.5 s on a 2-core machine)."""


class LaunchError(RuntimeError):
    """The launch itself failed: the port, the start-up, a launch already stopped."""


class RankFailed(RuntimeError):
    """A rank raised, died or ran past its deadline; the message holds what each rank said."""

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures  # rank -> its traceback or what happened to it


def check_call(fn: object, args: object, kwargs: object) -> bytes:
    """The call `fn(rank, *args, **kwargs)` pickled for the ranks, or a clear error before any
    is sent: `fn` a callable the ranks can import (not one defined in a notebook cell), `args` a
    tuple or list, `kwargs` a dict or None, all picklable."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise ValueError(f"fn={getattr(fn, '__name__', fn)!r} is defined in an interactive "
                         "session (a notebook cell); ranks cannot import it: define it in a module")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple (or list) of arguments, such as args=(x,), got "
                        f"{type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    try:
        return pickle.dumps((fn, tuple(args), kwargs or {}))
    except Exception as error:  # PicklingError, AttributeError (local objects), TypeError
        raise TypeError(f"fn, args and kwargs must be picklable for the ranks: {error}") from None


def death_time(last_clear: float) -> float:
    """The earliest time a rank may have died whose end the launching process first saw at a
    look after the one that ended at `last_clear` (wall clock, as the ranks' report times)."""
    return last_clear - DEATH_LAG_S


class Launch:
    """N running ranks in one process group; `run` calls a function on all of them.

    Made by `start`. A failure or a timeout stops every rank, and the launch with them: start a
    new one. Use it as a context manager (or call `close`) so the ranks always stop.
    """

    def __init__(self, world_size: int, *, device: str, backend: str, port: int | None,
                 timeout_s: float, collective_timeout_s: float, threads_per_rank: int,
                 start_method: str):
        deadline = time.monotonic() + timeout_s
        self.world_size = world_size
        self.device, self.backend = device, backend
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._stopped: str | None = None
        self._lock = threading.Lock()  # between `_stop` and a start still under way
        try:  # the rendezvous store: port 0 lets the OS pick a free one, held until close
            self._store = dist.TCPStore(HOST, port or 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=collective_timeout_s))
        except (RuntimeError, OSError) as error:
            self._stopped = "its port could not be opened"
            raise LaunchError(f"port {port} is taken or cannot be opened on {HOST} ({error}); "
                              "pass port=None to let the OS pick a free one") from None
        self.port = self._store.port
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(list(PRELOAD))
        lifeline = Lifeline()  # cut when the launch stops, or when it is garbage
        self._cut_lifeline = weakref.finalize(self, lifeline.cut, world_size)
        rank_args = (world_size, self.port, backend, device, collective_timeout_s,
                     threads_per_rank, dict(os.environ), start_method)
        started: list[BaseException | None] = []  # the starter's outcome, once it has one
        # Starting a rank from a fork server can block for seconds (a new one imports torch
        # first), so a thread starts them and this one waits until the deadline. Spawned ranks
        # start at once, and from this thread: their PR_SET_PDEATHSIG fires when the *thread*
        # that started them ends.
        starter = threading.Thread(target=self._start_ranks, name="mlsys-launch-start",
                                   args=(ctx, rank_args, lifeline.reader, started),
                                   daemon=True)
        try:
            if start_method == "spawn":
                starter.run()
            else:
                starter.start()
                starter.join(timeout=max(deadline - time.monotonic(), 0))
            if not started:
                missing = list(range(len(self._procs), world_size))
                raise RankFailed(
                    f"start: ranks {missing} were not started within timeout_s={timeout_s} s "
                    "(a new fork server imports torch first: a few seconds); every rank was "
                    "stopped", {r: "not started by the deadline of start" for r in missing})
            if started[0] is not None:
                raise started[0]
            self._collect("start", deadline, expect="ready")
        except BaseException:
            self._stop("its start failed")
            raise

    def _start_ranks(self, ctx: Any, rank_args: tuple, lifeline: Connection,
                     started: list[BaseException | None]) -> None:
        """Start every rank (in a thread of its own); append the outcome to `started`."""
        error = None
        try:
            for rank in range(self.world_size):
                with self._lock:
                    if self._stopped:
                        return
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=rank_main, name=f"mlsys-rank-{rank}", daemon=True,
                                   args=(rank, *rank_args, theirs, lifeline))
                proc.start()
                theirs.close()
                with self._lock:
                    if self._stopped:  # given up meanwhile: its lifeline is cut already
                        proc.kill()
                        proc.join(timeout=STOP_GRACE_S)
                        ours.close()
                        return
                    self._procs.append(proc)
                    self._conns.append(ours)
        except BaseException as caught:  # reported by the waiting thread
            error = caught
        finally:
            lifeline.close()  # the ranks hold their own copies
            started.append(error)

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks (for checks that none is left behind)."""
        return [p.pid for p in self._procs]

    def run(self, fn: Callable[..., Any], *, args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0) -> list[Any]:
        """`fn(rank, *args, **kwargs)` on every rank; their return values, by rank.

        Raises `RankFailed` (with the tracebacks) if a rank raises, dies or is still running
        after `timeout_s`; the launch is then stopped.
        """
        if self._stopped:
            raise LaunchError(f"this launch was stopped ({self._stopped}); start a new one")
        task = check_call(fn, args, kwargs)
        checks.positive(timeout_s, "timeout_s")
        try:
            for conn in self._conns:
                conn.send(task)
            payloads = self._collect(getattr(fn, "__name__", "fn"),
                                     time.monotonic() + timeout_s, expect="ok")
        except BaseException:
            self._stop("a call failed")
            raise
        return [pickle.loads(p) for p in payloads]

    def _collect(self, what: str, deadline: float, *, expect: str) -> list[Any]:
        """One message from every rank before `deadline`; RankFailed on an error, death or
        timeout, earliest first: a report at the time its rank raised, a death at `death_time`
        of the last look that did not see it (a rank's death has no time of its own)."""
        values: dict[int, Any] = {}
        failures: dict[int, tuple[float, str]] = {}
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        closed: dict[int, float] = {}  # rank -> its death_time, once its pipe reached its end
        first_failure: float | None = None
        clear = time.time()  # when the last look ended
        while len(values) + len(failures) < self.world_size:
            now = time.monotonic()
            if first_failure is not None and now > first_failure + REPORT_GRACE_S:
                break
            if now > deadline:
                for r in range(self.world_size):
                    if r not in values and r not in failures:
                        failures[r] = (time.time(), f"still running after the deadline of {what}")
                break
            waiting = [c for r, c in enumerate(self._conns) if r not in values and r not in
                       failures and r not in closed]
            sentinels = [p.sentinel for r, p in enumerate(self._procs) if r not in values and
                         r not in failures]
            ready_now = wait(waiting + sentinels, timeout=min(0.2, max(deadline - now, 0)))
            died, clear = death_time(clear), time.time()
            for ready in ready_now:
                if isinstance(ready, Connection):
                    r = by_conn[id(ready)]
                    try:
                        kind, payload, stamp = ready.recv()
                    except (EOFError, OSError):
                        closed[r] = died
                        continue
                    if kind == expect:
                        values[r] = payload
                    else:
                        failures[r] = (stamp, payload)
                else:
                    r = by_sentinel[ready]
                    if r not in closed and self._conns[r].poll():  # a report, or its pipe's end
                        continue
                    self._procs[r].join(timeout=1.0)
                    code = self._procs[r].exitcode
                    how = (f"killed by signal {signal.Signals(-code).name}" if code and code < 0
                           else f"exited with code {code}")
                    failures[r] = (closed.get(r, died),
                                   f"rank {r} {how} without reporting an error")
            if failures and first_failure is None:
                first_failure = time.monotonic()
        if failures:
            ordered = sorted(failures.items(), key=lambda item: item[1][0])
            text = "\n".join(f"--- rank {r} ---\n{message.rstrip()}" for r, (_, message)
                             in ordered)
            first = ordered[0][0]
            running = [r for r in range(self.world_size) if r not in values and r not in failures]
            still = f"; ranks {running} were still running" if running else ""
            raise RankFailed(f"{what}: rank {first} failed first ({len(failures)} of "
                             f"{self.world_size} ranks failed{still}); every rank was stopped\n"
                             f"{text}", {r: m for r, (_, m) in failures.items()})
        return [values[r] for r in range(self.world_size)]

    def _stop(self, why: str) -> None:
        """Stop every rank: SIGTERM, then SIGKILL after `STOP_GRACE_S`; cut the lifeline (a
        rank still being started kills itself) and close the store."""
        with self._lock:
            self._stopped = self._stopped or why
            procs, conns = list(self._procs), list(self._conns)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0.01))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=STOP_GRACE_S)
        for conn in conns:
            conn.close()
        self._cut_lifeline()
        self._store = None

    def close(self) -> None:
        """Let the ranks leave the group and exit (bounded wait), then stop any that remain."""
        if self._stopped is None:
            for conn in self._conns:
                try:
                    conn.send(None)
                except (OSError, EOFError):
                    pass
            deadline = time.monotonic() + 2 * STOP_GRACE_S
            for proc in self._procs:
                proc.join(timeout=max(deadline - time.monotonic(), 0.01))
        self._stop("it was closed")

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
