"""Start N ranks on this machine, run a function on each, and get every rank's return value back.

    results = launch.run(fn, world_size=2, args=(x,), timeout_s=60)   # [fn's value on rank 0, 1]

    with launch.start(world_size=4, timeout_s=60) as job:            # one start, many calls
        a = job.run(fn_a, args=(...,))
        b = job.run(fn_b)

`fn(rank, *args, **kwargs)` runs in every rank with a `launch_rank.Rank` (its number, the world
size, its device and the process group of all ranks, to be passed on explicitly). It must be
importable (a module-level function in `lib/` or a test file, not a notebook cell), and its
arguments and return values picklable. Backends: gloo on the CPU, NCCL on CUDA GPUs (one GPU per
rank). Ranks are daemon processes, so a rank cannot start processes of its own (no DataLoader
workers). Errors: `launch_job.LaunchError` and `launch_job.RankFailed`.

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
  without a word (a signal, `os._exit`) or runs past the deadline gives `RankFailed` too, and a
  rank that died is named before the peers that then met the broken collective
  (`launch_job.death_time`).
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

The launch itself lives beside this module: `launch_job` (the launching process's side: the
store, the calls, collecting values and failures under deadlines, stopping), `launch_rank` (what
each rank runs) and `launch_lifeline` (ranks die with the launching process).
Used in: §sec-data-parallel (chapter 08) and the parallelism chapters.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mlsys import checks
from mlsys.distributed.launch_job import Launch, check_call

DEVICES = ("cpu", "cuda")
START_METHODS = ("forkserver", "spawn")
CPU_RANKS_PER_CORE = 4
"""On the CPU, `start` refuses more than this many ranks per core (`os.cpu_count()`), and at
least `MIN_CPU_RANK_LIMIT`: every rank is a process with its own torch and gloo threads."""
MIN_CPU_RANK_LIMIT = 8


def default_backend(device: str) -> str:
    """gloo on the CPU, NCCL on CUDA GPUs."""
    return {"cpu": "gloo", "cuda": "nccl"}[checks.choice(device, "device", DEVICES)]


def default_start_method() -> str:
    """"forkserver" where the platform has it (Linux, macOS), else "spawn"."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def cpu_rank_limit() -> int:
    """The most ranks `start` accepts on the CPU: `CPU_RANKS_PER_CORE` per core, at least 8."""
    return max(MIN_CPU_RANK_LIMIT, CPU_RANKS_PER_CORE * (os.cpu_count() or 1))


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
    check_call(fn, args, kwargs)  # before any rank starts
    checks.positive(timeout_s, "timeout_s")
    deadline = time.monotonic() + timeout_s
    collective = timeout_s if collective_timeout_s is None else collective_timeout_s
    with start(world_size, timeout_s=timeout_s, collective_timeout_s=collective,
               **options) as job:
        return job.run(fn, args=args, kwargs=kwargs,
                       timeout_s=max(deadline - time.monotonic(), 1e-3))
