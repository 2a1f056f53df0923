"""The tiles the autotuners may time (`mlsys.kernels.tile_space`): a tile the compile report
removed is never a candidate."""

import pytest
from compile_cases import launch_key

from mlsys.kernels import compile_report, tile_space


@pytest.fixture(scope="module")
def report():
    return compile_report.load()


def test_the_autotuners_never_see_a_removed_tile(report):
    for c in report.removed()[:200]:
        gone = tile_space.removed(c.launch.kernel, c.launch.dtype, c.launch.target,
                                  **c.launch.problem)
        assert tile_space.tile_key(c.launch.tile, c.launch.num_warps, c.launch.num_stages) in gone
    kept = {launch_key(launch) for launch in compile_report.candidates("ci")}
    assert not kept & {launch_key(c.launch) for c in report.removed()}
