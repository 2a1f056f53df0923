"""The compile cache (`mlsys.kernels.aot_cache`): its key changes with the launch, the kernel's
source and Triton's version; a launch survives the trip through JSON."""

import json

from mlsys.kernels import aot, aot_cache


def test_the_cache_key_changes_with_the_launch_the_source_and_the_version():
    a = aot.Launch("softmax.fwd", "bf16", {"n_rows": 64, "n_cols": 128}, {"BLOCK_M": 1})
    b = aot.Launch("softmax.fwd", "bf16", {"n_rows": 64, "n_cols": 128}, {"BLOCK_M": 2})
    keys = {aot_cache.cache_key(a, "s1", "3.7.1"), aot_cache.cache_key(b, "s1", "3.7.1"),
            aot_cache.cache_key(a, "s2", "3.7.1"), aot_cache.cache_key(a, "s1", "3.6.0")}
    assert len(keys) == 4
    assert aot.Launch.from_dict(json.loads(json.dumps(a.as_dict()))) == a
    # the hash covers the kernel's own source only, from its `def` line
    assert len(aot_cache.source_hash("softmax.fwd")) == 16
    assert aot_cache.source_hash("softmax.fwd") != aot_cache.source_hash("softmax.bwd")
