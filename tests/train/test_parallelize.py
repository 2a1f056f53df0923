"""mlsys.train.parallelize: FSDP shards over the data-parallel axes after the copies. (Every mesh
it builds trains like one process in test_main.py.)"""

import pytest

from mlsys.accounting.parallel import ParallelDims
from mlsys.train import parallelize


def test_fsdp_shards_over_the_fsdp_axes_after_the_copies():
    mesh = {"dp_shard": "shard", ("dp_replicate", "dp_shard"): "replicate x shard"}
    assert parallelize.dp_mesh(mesh, ParallelDims(dp_shard=2, tp=2)) == "shard"
    assert parallelize.dp_mesh(mesh, ParallelDims(tp=2)) == "shard"
    assert parallelize.dp_mesh(mesh, ParallelDims(dp_replicate=2)) == "replicate x shard"
    with pytest.raises(ValueError, match="several axes"):
        parallelize.dp_mesh(mesh, ParallelDims(dp_shard=2, cp=2))
