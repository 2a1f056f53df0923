"""`python -m mlsys.train`, under torchrun or alone (one rank): see `mlsys.train`.

Every flag is checked on every rank before `init_process_group` (`options.resolve`,
`options.check_paths`), so a bad flag is one clear error and no rank waits for another. Ranks
raise rather than `sys.exit`, and `record` (with `AtomicErrorHandler`) hands torchrun the failing
rank's traceback.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from mlsys.train import loop, options

COLLECTIVE_TIMEOUT_S = 300
"""Seconds a collective may wait for a peer before it fails (a lost rank surfaces, no hang)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(run: options.Run) -> None:
    """The process group from torchrun's env:// variables; alone, a one-rank group."""
    if "RANK" not in os.environ:  # not under torchrun: one rank on a free local port
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if run.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    backend = "nccl" if run.device == "cuda" else "gloo"
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    # Under torchrun the ranks share the agent's store, and with its rendezvous store shared
    # (torch's default) a restarted group finds the dead ranks' addresses of the last attempt
    # there: gloo then fails with "Connection refused" (seen on 2 cores, torch 2.13, about one
    # restart in two). Every attempt gets its own prefix.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"mlsys/attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)


class AtomicErrorHandler(ErrorHandler):
    """torch's error handler, writing the rank's error file atomically (a temporary file, then a
    rename). torchrun stops the other ranks when one dies, and read the error file of a rank it
    stopped halfway through writing it: its agent then crashed with a JSONDecodeError instead of
    restarting the group (seen once in about ten restarts, on 2 busy cores, torch 2.13)."""

    def _write_error_file(self, file_path: str, error_msg: str) -> None:
        partial = f"{file_path}.{os.getpid()}.partial"
        super()._write_error_file(partial, error_msg)
        if os.path.exists(partial):
            os.replace(partial, file_path)


def main(argv: list[str] | None = None) -> list[dict]:
    """Parse, check, join the group, train, leave; rank 0 prints where the run stands."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    run = options.resolve(options.parse(argv), world)
    options.check_paths(run)
    if "OMP_NUM_THREADS" not in os.environ:  # else the user's (torchrun sets 1 for N > 1)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get(
            "LOCAL_WORLD_SIZE", "1"))))
    init(run)
    try:
        if dist.get_rank() == 0:
            print(options.describe(run), flush=True)
        rows = loop.train(run)
        if dist.get_rank() == 0 and rows:
            last = rows[-1]
            print(f"step {last['step']}: loss {last['loss']:.4f}, "
                  f"{last['tokens_per_s']:,.0f} tokens/s, MFU {last['mfu']:.2%} "
                  f"(vs {last['mfu_peak']})", flush=True)
        return rows
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    record(main, error_handler=AtomicErrorHandler())()
