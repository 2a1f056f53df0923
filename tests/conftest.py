"""Test-session settings: the smoke profile, a non-interactive matplotlib backend, and the
ahead-of-time compile of every kept kernel tile started in the background.

The compile check (`tests/kernels/test_compile_report.py`, marked `aot_compile`) compiles every
tile the kernels keep for sm_80 and sm_90: minutes of work in worker processes. It starts when
collection ends, beside the other tests (which run on one core), and its test runs last, reading
the result.
"""

import os

import pytest
from aot_build import AOT_BUILD, start_ci_compile

os.environ.setdefault("MLSYS_PROFILE", "smoke")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.hookimpl(trylast=True)  # after `-m` and `--deselect` have dropped what will not run
def pytest_collection_modifyitems(session, config, items):
    late = [item for item in items if item.get_closest_marker("aot_compile")]
    if not late or config.option.collectonly or hasattr(config, "workerinput"):
        return
    from mlsys.kernels._triton import HAS_TRITON

    if HAS_TRITON:
        config.stash[AOT_BUILD] = start_ci_compile()
    items[:] = [item for item in items if item not in late] + late  # run them last


def pytest_unconfigure(config):
    build = config.stash.get(AOT_BUILD, None)
    if build is not None and build[0].poll() is None:
        build[0].kill()  # the session ended early: leave no compile behind
