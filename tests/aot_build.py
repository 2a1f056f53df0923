"""The background compile of every kept kernel tile, shared by tests/conftest.py (which starts it
when collection ends) and tests/kernels/test_compile_report.py (which reads it, last)."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

AOT_BUILD = pytest.StashKey[tuple]()
"""(process, report path, log path) of the background compile, when one was started."""


def start_ci_compile(jobs: int = 2) -> tuple:
    """Start `python -m mlsys.kernels.compile_report --matrix ci --kept --no-sass` with a fresh
    cache (tensor cores counted in the PTX: a third quicker than disassembling every cubin)."""
    folder = Path(tempfile.mkdtemp(prefix="mlsys-ci-compile-"))
    out, log = folder / "ci_report.json", folder / "compile.log"
    env = {**os.environ, "MLSYS_AOT_CACHE": str(folder / "cache")}
    command = [sys.executable, "-m", "mlsys.kernels.compile_report", "--matrix", "ci", "--kept",
               "--no-sass", "--jobs", str(jobs), "--out", str(out)]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return process, out, log
