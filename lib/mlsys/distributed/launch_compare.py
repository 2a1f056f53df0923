"""The project's launcher beside PyTorch's own, re-measured: how long a small job takes to start.

    rows = launch_compare.compare_launchers(world_size=2)   # a list of dicts, one per job

Every job starts `world_size` ranks, does one all_reduce of a one-element tensor (rank r gives
r + 1) and stops them, all timed together (wall-clock seconds, measured in this process). Each
launcher runs `calls` times in a row (2 by default), so that the second call shows what a notebook
pays once the first start (a fork server that imports torch, a first rendezvous) is behind it; a
spawning launcher runs once, as every one of its calls imports torch in every rank anew (measured:
7.7 s, then 6.5 s, on a busy 2-core CPU):

- "mlsys": `launch.run` (ranks forked from a fork server that preloaded torch);
- "mlsys-started": one `Launch.run` on ranks already up from `launch.start` (start not timed);
- "elastic-fork", "elastic-spawn": `torch.distributed.launcher.api.elastic_launch` with the c10d
  rendezvous on a free port (`localhost:0`), the ranks forked from this process or spawned;
- "torch-mp-spawn": `torch.multiprocessing.start_processes(start_method="spawn")` (not in the
  default list: it costs what "elastic-spawn" costs, 4-9 s a call on a busy 2-core CPU).

The functions the ranks run are defined here (a spawned rank imports them). `elastic_launch` leaves
its own SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers in the calling process, and
TORCHELASTIC_SIGNALS_TO_HANDLE in its environment; both are put back after each job.

Meant for §sec-cluster (chapter 10), beside `mlsys.distributed.launch`.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from mlsys import checks
from mlsys.distributed import launch

LAUNCHERS = ("mlsys", "mlsys-started", "elastic-fork", "elastic-spawn", "torch-mp-spawn")
DEFAULT_LAUNCHERS = ("mlsys", "mlsys-started", "elastic-fork", "elastic-spawn")
HOST = "127.0.0.1"
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                 if hasattr(signal, name))


# --- what the ranks run ---------------------------------------------------------------------------


def _all_reduce(group: Any, rank: int) -> float:
    value = torch.full((1,), float(rank + 1))
    dist.all_reduce(value, group=group)
    return float(value.item())


def mlsys_rank(rank: Any) -> float:
    """The job under `mlsys.distributed.launch`: the group is already there."""
    return _all_reduce(rank.group, rank.rank)


def elastic_rank() -> float:
    """The job under `elastic_launch`: the group comes from the env:// variables it sets."""
    dist.init_process_group("gloo")
    try:
        return _all_reduce(dist.group.WORLD, dist.get_rank())
    finally:
        dist.destroy_process_group()


def torch_mp_rank(rank: int, world_size: int, port: int) -> None:
    """The job under `torch.multiprocessing.start_processes`: the group from a store the parent
    holds on `port` (it has no rendezvous of its own, nor a way to return a value)."""
    store = dist.TCPStore(HOST, port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        _all_reduce(dist.group.WORLD, rank)
    finally:
        dist.destroy_process_group()


# --- the launchers, timed -------------------------------------------------------------------------


def _elastic(world_size: int, start_method: str, call: int) -> float:
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world_size,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          run_id=f"compare-{os.getpid()}-{start_method}-{call}", max_restarts=0,
                          start_method=start_method)
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    environ = dict(os.environ)
    try:
        values = elastic_launch(config, elastic_rank)()
    finally:  # what elastic_launch leaves in this process: its signal handlers, an env variable
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
    return values[0]


def _torch_mp(world_size: int) -> float:
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    torch_mp.start_processes(torch_mp_rank, args=(world_size, store.port), nprocs=world_size,
                             start_method="spawn")
    return float("nan")  # no value comes back


def compare_launchers(world_size: int = 2, *, launchers: tuple[str, ...] = DEFAULT_LAUNCHERS,
                      calls: int = 2, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Time `calls` jobs with each of `launchers` (one with a spawning launcher: see the module
    docstring); one row per job.

    Row keys: launcher, call (1, 2, ...), seconds (wall clock of the whole job), value (the
    all_reduce on rank 0: world_size (world_size + 1) / 2, NaN where no value comes back),
    world_size, cpus (os.cpu_count()), torch (its version). 12-18 s on a busy 2-core CPU with
    the defaults, the first start of the fork server included (4-6 s of it).
    """
    world = checks.positive_int(world_size, "world_size")
    repeats = checks.positive_int(calls, "calls")
    checks.positive(timeout_s, "timeout_s")
    for name in launchers:
        checks.choice(name, "launchers", LAUNCHERS)
    rows = []
    for name in launchers:
        job = launch.start(world, timeout_s=timeout_s) if name == "mlsys-started" else None
        try:
            for call in range(1, (1 if name.endswith("-spawn") else repeats) + 1):
                start = time.perf_counter()
                if name == "mlsys":
                    value = launch.run(mlsys_rank, world, timeout_s=timeout_s)[0]
                elif job is not None:
                    value = job.run(mlsys_rank, timeout_s=timeout_s)[0]
                elif name == "torch-mp-spawn":
                    value = _torch_mp(world)
                else:
                    value = _elastic(world, name.removeprefix("elastic-"), call)
                rows.append({"launcher": name, "call": call,
                             "seconds": time.perf_counter() - start, "value": value,
                             "world_size": world, "cpus": os.cpu_count(),
                             "torch": torch.__version__})
        finally:
            if job is not None:
                job.close()
    return rows
