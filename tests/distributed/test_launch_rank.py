"""mlsys.distributed.launch_rank, what each rank runs: a value the rank cannot pickle is named in
the error that reaches the caller.

Rank functions live at module level (the ranks import this file).
"""

import pytest
from launch_cases import FAST

from mlsys.distributed import launch
from mlsys.distributed.launch_job import RankFailed


def unpicklable(rank):
    return lambda: rank.rank


def test_a_value_that_cannot_be_pickled_is_named():
    with pytest.raises(RankFailed, match="return value cannot be pickled"):
        launch.run(unpicklable, 2, **FAST)
