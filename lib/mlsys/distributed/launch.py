"""Start N ranks on this machine, run a function on each, and get every rank's return value back.

    results = launch.run(fn, world_size=2, args=(x,), timeout_s=60)   # [fn's value on rank 0, 1]

    with launch.start(world_size=4, timeout_s=60) as job:            # one start, many calls
        a = job.run(fn_a, args=(...,))
        b = job.run(fn_b)

`fn(rank, *args, **kwargs)` runs in every rank with a `Rank` (its number, the world size, its
device and the process group of all ranks, to be passed on explicitly). It must be importable (a
module-level function in `lib/` or a test file, not a notebook cell), and its arguments and return
values picklable. Backends: gloo on the CPU, NCCL on CUDA GPUs (one GPU per rank). Ranks are
daemon processes, so a rank cannot start processes of its own (no DataLoader workers).

What this launcher promises, and how:
- **A free port per run.** The parent opens the rendezvous store on port 0, so the OS picks a free
  port, and holds it for the whole launch: no other run can take it in between (an explicit `port`
  that is taken is a clear `LaunchError`).
- **Never hangs.** Every wait in the parent has a deadline: `timeout_s` bounds the whole start (a
  new fork server's import of torch included: the ranks are started from a thread while the caller
  waits; only the caller's own first import of torch comes before) and each call; every
  collective has one too (`collective_timeout_s`, given to `init_process_group`).
- **No world it cannot run.** On the CPU at most `cpu_rank_limit()` ranks: 4 per core
  (`os.cpu_count()`), and at least 8; on CUDA one GPU per rank. More is a `ValueError` before any
  process starts.
- **Failures reach the caller.** A rank that raises sends its traceback; the parent then stops the
  other ranks and raises `RankFailed` with the tracebacks, earliest first. A rank that dies
  without a word (a signal, `os._exit`) or runs past the deadline gives `RankFailed` too.
- **No orphans.** Ranks are stopped (SIGTERM, then SIGKILL) on any error, timeout or interrupt.
  If the launching process itself is killed (a kernel restart, `kill -9`, a closed terminal),
  its ranks notice within milliseconds: each holds the read end of a "lifeline" pipe whose write
  end only the launching process holds (not inherited by its other children), and a thread kills
  the rank, and its fork server, at end of file; the resource tracker then exits by itself. Each
  rank also asks the kernel to kill it if its parent dies (Linux `PR_SET_PDEATHSIG`). A child
  the launching process forked (not a subprocess) keeps multiprocessing's resource tracker alive
  until it exits, since it holds the tracker's pipe; it holds no rank.
- **Starting is cheap after the first time.** On Linux, ranks are forked from multiprocessing's
  fork server, which imports torch once (`start_method="forkserver"`); `spawn` makes every rank
  import torch again (about 2 s per rank on a 2-core machine). The fork server is shared by the
  process and preloads torch only if this module starts it.

**Why not PyTorch's launcher.** Measured on a 2-core CPU (busy: load 4 to 7) with torch
2.13.0+cpu, for 2 ranks that do one all_reduce, start and stop included
(`launch_compare.compare_launchers` re-measures): `launch.run` takes 4.4-6.1 s the first time in a
process (its fork server imports torch) and 0.13-0.19 s after; a call on ranks already started
takes under 0.03 s. `torch.distributed.launcher.api.elastic_launch` takes 0.33-0.54 s every time
with `start_method="fork"` and 3.8-8.8 s with "spawn"; `torch.multiprocessing.start_processes`
(spawn) 7.1-7.4 s. When rank 1 raises while rank 0 waits in an all_reduce, `elastic_launch`
reports one failure only, and in 2 of 4 "fork" runs that was rank 0's "Connection closed by
peer", without rank 1's ValueError; `start_processes` gives the traceback of the first process it
sees fail. Killed by SIGTERM, SIGKILL or SIGHUP, the launching process leaves nothing behind after
0.05 s with elastic's "fork", 1.3 s with its "spawn", 1.5 s with `start_processes`; this launcher
left its ranks, fork server and resource tracker running for 20-21.5 s (until the rank function
returned) before the lifeline, and for at most 0.2 s since. So this launcher stays: one start
serves many calls (ranks keep their state between calls), every failing rank's traceback arrives,
earliest first, each call has a timeout, and ranks are forked from a clean fork server rather than
from the caller (a kernel with threads, perhaps CUDA, which a forked child cannot use); it also
leaves no signal handlers behind in the caller, as `elastic_launch` does (SIGTERM and others).
Scripts for a cluster use `torchrun` (§sec-cluster, chapter 10).

Used in: §sec-data-parallel (chapter 08) and the parallelism chapters.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from mlsys import checks

HOST = "127.0.0.1"
DEVICES = ("cpu", "cuda")
START_METHODS = ("forkserver", "spawn")
STOP_GRACE_S = 3.0
"""Seconds a rank has to exit after SIGTERM before it gets SIGKILL."""
REPORT_GRACE_S = 1.0
"""After a first failure, how long the other ranks have to report theirs (a rank that raised
usually makes its peers fail within a fraction of a second: their traceback says why)."""
CPU_RANKS_PER_CORE = 4
"""On the CPU, `start` refuses more than this many ranks per core (`os.cpu_count()`), and at
least `MIN_CPU_RANK_LIMIT`: every rank is a process with its own torch and gloo threads."""
MIN_CPU_RANK_LIMIT = 8
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "mlsys.distributed.launch")
"""What the fork server imports once, so that forked ranks start with it already imported
(torch._dynamo is imported by the first optimizer a process builds: 3.5 s on a 2-core machine)."""


class LaunchError(RuntimeError):
    """The launch itself failed: the port, the start-up, a launch already stopped."""


class RankFailed(RuntimeError):
    """A rank raised, died or ran past its deadline; the message holds what each rank said."""

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures  # rank -> its traceback or what happened to it


@dataclass(frozen=True)
class Rank:
    """What a rank knows about itself; `fn(rank, ...)` receives it."""

    rank: int
    world_size: int
    backend: str  # "gloo" or "nccl"
    device: Any  # torch.device: cpu, or cuda:<rank>
    group: Any  # the ProcessGroup of all ranks: pass it on explicitly


def default_backend(device: str) -> str:
    """gloo on the CPU, NCCL on CUDA GPUs."""
    return {"cpu": "gloo", "cuda": "nccl"}[checks.choice(device, "device", DEVICES)]


def default_start_method() -> str:
    """"forkserver" where the platform has it (Linux, macOS), else "spawn"."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def cpu_rank_limit() -> int:
    """The most ranks `start` accepts on the CPU: `CPU_RANKS_PER_CORE` per core, at least 8."""
    return max(MIN_CPU_RANK_LIMIT, CPU_RANKS_PER_CORE * (os.cpu_count() or 1))


def _check_fn(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise ValueError(f"fn={getattr(fn, '__name__', fn)!r} is defined in an interactive "
                         "session (a notebook cell); ranks cannot import it: define it in a module")


def _dumps(what: str, obj: object) -> bytes:
    try:
        return pickle.dumps(obj)
    except Exception as error:  # PicklingError, AttributeError (local objects), TypeError
        raise TypeError(f"{what} must be picklable to reach the ranks: {error}") from None


# --- the lifeline: ranks die with the launching process ------------------------------------------
# A pipe per launch: only the launching process holds its write end (close-on-exec, and closed in
# any child it forks), every rank a read end, and a thread in each rank blocks reading it. Stopping
# a launch writes one byte per rank, then closes it: a rank reading a byte kills itself. End of
# file without a byte means the launching process died, however it died (SIGKILL included): the
# rank kills itself and its fork server (which serves nobody else once the launching process is
# gone; left alone it does exit, but only after 1 to 4 s of interpreter shutdown with torch
# loaded, measured on a busy 2-core machine). The resource tracker exits by itself once its pipe
# closes, within 0.2 s; it is left alone, as its job is to clean up after the dead.

class _Lifeline:
    """A launch's lifeline, seen from the launching process: `reader` goes to the ranks (and is
    closed here once they hold it), `cut` ends it."""

    holding: set[_Lifeline] = set()  # those whose write end this process holds open
    at_fork_registered = False

    def __init__(self) -> None:
        if not _Lifeline.at_fork_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_Lifeline.drop_all)
            _Lifeline.at_fork_registered = True
        read, self._write = os.pipe()  # both close-on-exec: no exec'd child inherits them
        self.reader = Connection(read, writable=False)
        _Lifeline.holding.add(self)

    def cut(self, ranks: int) -> None:
        """Tell up to `ranks` ranks that the launch stopped, then close the write end (once, and
        only in the process that opened it): every rank still holding a read end kills itself."""
        if self in _Lifeline.holding:
            _Lifeline.holding.discard(self)
            try:
                os.write(self._write, b"x" * ranks)  # a few bytes into an empty pipe: no wait
            except OSError:  # no rank holds a read end any more
                pass
            os.close(self._write)

    @staticmethod
    def drop_all() -> None:
        """In a child this process forked: let go of every write end, so that the child cannot
        keep ranks alive after the launching process died."""
        for lifeline in _Lifeline.holding:
            try:
                os.close(lifeline._write)
            except OSError:
                pass
        _Lifeline.holding.clear()


# --- the rank side --------------------------------------------------------------------------------


def _die_with_parent() -> None:
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


def _watch_lifeline(lifeline: Connection, server: int | None) -> None:
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


def _report(conn: Connection, message: tuple) -> None:
    try:
        conn.send(message)
    except (OSError, EOFError):  # the parent is gone or stopped listening: nothing to tell
        os._exit(1)


def _rank_main(rank: int, world_size: int, port: int, backend: str, device: str,
               collective_timeout_s: float, threads: int, environ: dict[str, str],
               start_method: str, conn: Connection, lifeline: Connection) -> None:
    """The body of each rank: join the group, then run the calls the parent sends until None."""
    _die_with_parent()  # when its parent (the fork server, or the launching process) dies
    _watch_lifeline(lifeline, os.getppid() if start_method == "forkserver" else None)
    os.environ.update(environ)  # the parent's environment now, not the fork server's
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if device == "cuda":
            torch.cuda.set_device(rank)
        timeout = timedelta(seconds=collective_timeout_s)
        store = dist.TCPStore(HOST, port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        me = Rank(rank, world_size, backend, torch.device(device, rank) if device == "cuda"
                  else torch.device("cpu"), dist.group.WORLD)
    except BaseException:
        _report(conn, ("error", traceback.format_exc(), time.time()))
        return
    _report(conn, ("ready", None, time.time()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
        try:
            fn, args, kwargs = pickle.loads(task)
            value = fn(me, *args, **kwargs)
            try:
                payload = pickle.dumps(value)
            except Exception as error:
                raise TypeError(f"rank {rank}'s return value cannot be pickled: {error}") from None
            _report(conn, ("ok", payload, time.time()))
        except BaseException:
            _report(conn, ("error", traceback.format_exc(), time.time()))
    dist.destroy_process_group()


# --- the parent side ------------------------------------------------------------------------------


class Launch:
    """N running ranks in one process group; `run` calls a function on all of them.

    Made by `start`. A failure or a timeout stops every rank, and the launch with them: start a
    new one. Use it as a context manager (or call `close`) so the ranks always stop.
    """

    def __init__(self, world_size: int, *, device: str, backend: str, port: int | None,
                 timeout_s: float, collective_timeout_s: float, threads_per_rank: int,
                 start_method: str):
        import torch.distributed as dist

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
        lifeline = _Lifeline()  # cut when the launch stops, or when it is garbage
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
                proc = ctx.Process(target=_rank_main, name=f"mlsys-rank-{rank}", daemon=True,
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
        _check_fn(fn)
        checks.positive(timeout_s, "timeout_s")
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple of arguments, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
        task = _dumps("fn, args and kwargs", (fn, tuple(args), kwargs or {}))
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
        timeout."""
        values: dict[int, Any] = {}
        failures: dict[int, tuple[float, str]] = {}
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        closed: set[int] = set()  # ranks whose pipe reached its end: their sentinel says why
        first_failure: float | None = None
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
            for ready in wait(waiting + sentinels, timeout=min(0.2, max(deadline - now, 0))):
                if isinstance(ready, Connection):
                    r = by_conn[id(ready)]
                    try:
                        kind, payload, stamp = ready.recv()
                    except (EOFError, OSError):
                        closed.add(r)
                        continue
                    if kind == expect:
                        values[r] = payload
                    else:
                        failures[r] = (stamp, payload)
                else:
                    r = by_sentinel[ready]
                    if r not in closed and self._conns[r].poll():  # it reported first: read it
                        continue
                    self._procs[r].join(timeout=1.0)
                    code = self._procs[r].exitcode
                    how = (f"killed by signal {signal.Signals(-code).name}" if code and code < 0
                           else f"exited with code {code}")
                    failures[r] = (time.time(), f"rank {r} {how} without reporting an error")
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


def start(world_size: int, *, device: str = "cpu", backend: str | None = None,
          port: int | None = None, timeout_s: float = 60.0, collective_timeout_s: float = 60.0,
          threads_per_rank: int | None = None, start_method: str | None = None) -> Launch:
    """Start `world_size` ranks that stay up for several `Launch.run` calls.

    `device` "cpu" (gloo; at most `cpu_rank_limit()` ranks: 4 per core, at least 8) or "cuda"
    (NCCL, one GPU per rank); a larger `world_size` is a ValueError before any process starts.
    `timeout_s` (seconds) bounds the whole start, a new fork server's import of torch included
    (not this process's own first import of torch, 1.5-3 s, which comes before);
    `collective_timeout_s` (seconds) every collective; `threads_per_rank` defaults to the cores
    shared out (at least 1). `port=None` lets the OS pick a free one.
    """
    world = checks.positive_int(world_size, "world_size")
    checks.choice(device, "device", DEVICES)
    backend = default_backend(device) if backend is None else backend
    checks.choice(backend, "backend", ("gloo", "nccl"))
    if port is not None:
        checks.integer(port, "port", minimum=1)
        if port > 65_535:
            raise ValueError(f"port must be at most 65535, got {port}")
    checks.positive(timeout_s, "timeout_s")
    checks.positive(collective_timeout_s, "collective_timeout_s")
    threads = (max(1, (os.cpu_count() or 1) // world) if threads_per_rank is None
               else checks.positive_int(threads_per_rank, "threads_per_rank"))
    method = default_start_method() if start_method is None else start_method
    checks.choice(method, "start_method", START_METHODS)
    if device == "cuda":
        import torch

        available = torch.cuda.device_count()
        if world > available:
            raise ValueError(f"world_size ({world}) needs one GPU per rank; {available} present")
    elif backend == "nccl":
        raise ValueError("backend='nccl' needs device='cuda'")
    elif world > cpu_rank_limit():
        raise ValueError(f"world_size ({world}) is more ranks than this CPU can run: at most "
                         f"{CPU_RANKS_PER_CORE} per core x {os.cpu_count()} cores "
                         f"(os.cpu_count()), and never fewer than {MIN_CPU_RANK_LIMIT}, gives "
                         f"{cpu_rank_limit()}")
    return Launch(world, device=device, backend=backend, port=port, timeout_s=timeout_s,
                  collective_timeout_s=collective_timeout_s, threads_per_rank=threads,
                  start_method=method)


def run(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None, timeout_s: float = 120.0,
        collective_timeout_s: float | None = None, **options: Any) -> list[Any]:
    """Start `world_size` ranks, run `fn(rank, *args, **kwargs)` on each, stop them; the values.

    `timeout_s` bounds the start and the call together; `collective_timeout_s` defaults to it.
    Other options as for `start` (device, backend, port, threads_per_rank, start_method).
    """
    _check_fn(fn)
    _dumps("fn, args and kwargs", (fn, tuple(args), kwargs or {}))  # before any rank starts
    checks.positive(timeout_s, "timeout_s")
    deadline = time.monotonic() + timeout_s
    collective = timeout_s if collective_timeout_s is None else collective_timeout_s
    with start(world_size, timeout_s=timeout_s, collective_timeout_s=collective,
               **options) as job:
        return job.run(fn, args=args, kwargs=kwargs,
                       timeout_s=max(deadline - time.monotonic(), 1e-3))
