"""mlsys.distributed.launch_compare: the start time of a small job under `launch` and under
PyTorch's own launchers, one row per job, leaving no signal handler or variable behind."""

import os
import signal

import pytest

from mlsys.distributed import launch_compare


@pytest.mark.timeout(120)
def test_compare_launchers_gives_a_row_per_job():
    handler, environ = signal.getsignal(signal.SIGTERM), dict(os.environ)
    rows = launch_compare.compare_launchers(2, launchers=("mlsys-started", "elastic-fork"))
    assert [(r["launcher"], r["call"]) for r in rows] == [
        ("mlsys-started", 1), ("mlsys-started", 2), ("elastic-fork", 1), ("elastic-fork", 2)]
    for row in rows:
        assert set(row) == {"launcher", "call", "seconds", "value", "world_size", "cpus", "torch"}
        assert row["seconds"] > 0 and row["value"] == 3.0 and row["world_size"] == 2
    assert signal.getsignal(signal.SIGTERM) is handler  # elastic_launch's handler was taken back
    assert dict(os.environ) == environ  # and the variable it sets
    with pytest.raises(ValueError, match="launchers='torchrun' is not one of"):
        launch_compare.compare_launchers(2, launchers=("torchrun",))
