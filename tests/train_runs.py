"""What the tests of `python -m mlsys.train` share (tests/train/test_main.py, test_options.py):
real torchrun jobs on the CPU (5-10 s each on 2 cores), writing under a given directory, their
logged rows and final weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mlsys.train import checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MLSYS_PROFILE": "smoke"}
RUN_TIMEOUT_S = 240
BASE = ["--preset", "debug", "--steps", "10", "--global-batch", "8", "--seq-len", "32",
        "--quiet"]


def torchrun(*args: str, nproc: int = 1, extra: tuple[str, ...] = ("--standalone",),
             timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *extra, f"--nproc-per-node={nproc}",
           "-m", "mlsys.train", *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def trained(tmp: Path, name: str, *args: str, nproc: int = 1, **kw) -> tuple[list, dict, Path]:
    """Run; the logged rows, the final weights (exported from the last checkpoint), the
    checkpoint directory."""
    ckpt = tmp / name
    done = torchrun(*BASE, "--ckpt", str(ckpt), *args, nproc=nproc, **kw)
    assert done.returncode == 0, done.stderr[-4000:]
    return rows(ckpt / "log.jsonl"), checkpoint.latest_weights(ckpt), ckpt
