"""What runs in each rank of a launch: join the process group, then run the calls the launching
process sends, and report each value or traceback back through a pipe.

`rank_main` is the body of every rank process (forked from the fork server, or spawned); `Rank`
is what the rank function receives. Messages to the launching process are (kind, payload, time):
("ready", None, t) once the group is up, ("ok", pickled value, t) or ("error", traceback, t) per
call. Used by `mlsys.distributed.launch_job` (the launching process's side).
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from mlsys.distributed.launch_lifeline import die_with_parent, watch_lifeline

HOST = "127.0.0.1"
"""The rendezvous store's address: every rank of a launch is on this machine."""


@dataclass(frozen=True)
class Rank:
    """What a rank knows about itself; `fn(rank, ...)` receives it."""

    rank: int
    world_size: int
    backend: str  # "gloo" or "nccl"
    device: Any  # torch.device: cpu, or cuda:<rank>
    group: Any  # the ProcessGroup of all ranks: pass it on explicitly


def report(conn: Connection, message: tuple) -> None:
    """Send `message` to the launching process; exit at once if it no longer listens."""
    try:
        conn.send(message)
    except (OSError, EOFError):  # the parent is gone or stopped listening: nothing to tell
        os._exit(1)


def rank_main(rank: int, world_size: int, port: int, backend: str, device: str,
              collective_timeout_s: float, threads: int, environ: dict[str, str],
              start_method: str, conn: Connection, lifeline: Connection) -> None:
    """The body of each rank: join the group, then run the calls the parent sends until None."""
    die_with_parent()  # when its parent (the fork server, or the launching process) dies
    watch_lifeline(lifeline, os.getppid() if start_method == "forkserver" else None)
    os.environ.update(environ)  # the parent's environment now, not the fork server's
    try:
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
        report(conn, ("error", traceback.format_exc(), time.time()))
        return
    report(conn, ("ready", None, time.time()))
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
            report(conn, ("ok", payload, time.time()))
        except BaseException:
            report(conn, ("error", traceback.format_exc(), time.time()))
    dist.destroy_process_group()
