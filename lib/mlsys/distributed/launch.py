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
- **Never hangs.** Every wait in the parent has a deadline (`timeout_s` for the start and for each
  call), and every collective has one too (`collective_timeout_s`, given to `init_process_group`).
- **Failures reach the caller.** A rank that raises sends its traceback; the parent then stops the
  other ranks and raises `RankFailed` with the tracebacks, earliest first. A rank that dies
  without a word (a signal, `os._exit`) or runs past the deadline gives `RankFailed` too.
- **No orphans.** Ranks are stopped (SIGTERM, then SIGKILL) on any error, timeout or interrupt;
  each rank also asks the kernel to kill it if its parent dies (Linux `PR_SET_PDEATHSIG`).
- **Starting is cheap after the first time.** On Linux, ranks are forked from multiprocessing's
  fork server, which imports torch once (`start_method="forkserver"`); `spawn` makes every rank
  import torch again (about 2 s per rank on a 2-core machine). The fork server is shared by the
  process and preloads torch only if this module starts it.

Used in: §sec-data-parallel (chapter 08) and the parallelism chapters.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import traceback
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


def _report(conn: Connection, message: tuple) -> None:
    try:
        conn.send(message)
    except (OSError, EOFError):  # the parent is gone or stopped listening: nothing to tell
        os._exit(1)


def _rank_main(rank: int, world_size: int, port: int, backend: str, device: str,
               collective_timeout_s: float, threads: int, environ: dict[str, str],
               conn: Connection) -> None:
    """The body of each rank: join the group, then run the calls the parent sends until None."""
    _die_with_parent()
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

        self.world_size = world_size
        self.device, self.backend = device, backend
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._stopped: str | None = None
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
        environ = dict(os.environ)
        try:
            for rank in range(world_size):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_rank_main, name=f"mlsys-rank-{rank}", daemon=True,
                                   args=(rank, world_size, self.port, backend, device,
                                         collective_timeout_s, threads_per_rank, environ, theirs))
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(ours)
            self._collect("start", time.monotonic() + timeout_s, expect="ready")
        except BaseException:
            self._stop("its start failed")
            raise

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
        """Stop every rank: SIGTERM, then SIGKILL after `STOP_GRACE_S`; close the store."""
        self._stopped = self._stopped or why
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self._procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0.01))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=STOP_GRACE_S)
        for conn in self._conns:
            conn.close()
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

    `device` "cpu" (gloo) or "cuda" (NCCL, one GPU per rank); `timeout_s` bounds the start,
    `collective_timeout_s` every collective; `threads_per_rank` defaults to the cores shared out
    (at least 1). `port=None` lets the OS pick a free one.
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
