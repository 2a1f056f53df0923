"""mlsys.distributed.mesh: the strategies composed on 4 ranks (FSDP x TP, with and without
sequence parallelism; HSDP) and on 8 (PP x CP x TP, FSDP over the context ranks) train like one
process, and every rank sends exactly what `accounting.parallel_traffic.sent_bytes` predicts.

One launch per world size; the 8-rank case is one tiny model, two steps. Rank functions live at
module level (the ranks import this file).
"""

import dataclasses

import pytest
import torch
from parallel_cases import SETUP, assert_matches, errors, reference

from mlsys.accounting import parallel, parallel_traffic
from mlsys.distributed import check, harness, mesh

CFG, SEQ, M = SETUP.cfg, SETUP.seq, SETUP.microbatches
CASES = {
    4: {"fsdp x tp": (dict(dp_shard=2, tp=2), False),
        "fsdp x tp + sp": (dict(dp_shard=2, tp=2), True),
        "hsdp": (dict(dp_replicate=2, dp_shard=2), False)},
    8: {"pp x cp x tp": (dict(pp=2, cp=2, tp=2), False)},
}


def misuse(rank):
    wrong = parallel.ParallelDims(tp=2, world_size=2)
    pp_sp = mesh.build_mesh(parallel.ParallelDims(pp=2, tp=rank.world_size // 2))
    three = dataclasses.replace(SETUP, batch=3).tokens(0)
    return errors(lambda: mesh.build_mesh(wrong),
                  lambda: mesh.parallelize(SETUP.model(), pp_sp, seq=SEQ, sequence_parallel=True),
                  lambda: mesh.local_batch(three, mesh.build_mesh(
                      parallel.ParallelDims(dp_shard=rank.world_size))))


def all_cases(rank):
    return {name: check.train_on_mesh(rank, *case, SETUP)
            for name, case in CASES[rank.world_size].items()} | {"misuse": misuse(rank)}


@pytest.fixture(scope="module", params=[4, 8], ids=["4 ranks", "8 ranks"])
def results(request):
    return request.param, harness.on_ranks(all_cases, request.param)


def test_every_composition_trains_like_one_process(results):
    world, per_rank = results
    ref = reference()
    for name, (degrees, _) in CASES[world].items():
        dims = parallel.ParallelDims(**degrees, world_size=world)
        got = harness.combine([r[name] for r in per_rank], dims)
        assert got["losses"] == pytest.approx(ref["losses"], rel=1e-6), name
        assert_matches(got["grads"], ref["grads"], what=f"{name} grads")
        assert_matches(got["params"], ref["params"], what=f"{name} params")


def test_every_rank_sends_the_accounted_bytes_and_holds_its_shard(results):
    world, per_rank = results
    for name, (degrees, sp) in CASES[world].items():
        dims = parallel.ParallelDims(**degrees, world_size=world)
        for rank, r in enumerate(per_rank):
            expected = parallel_traffic.sent_bytes(CFG, dims, rank, batch=SETUP.batch, seq=SEQ,
                                                   microbatches=M, sequence_parallel=sp)
            assert r[name]["sent"] == pytest.approx(sum(expected.values()), rel=1e-12), \
                (name, rank, expected)
            units = parallel_traffic.fsdp_units(CFG, dims, dims.coords(rank)["pp"])
            assert r[name]["held"] == sum(parallel_traffic.padded(u, dims.fsdp) // dims.fsdp
                                          for u in units)


def test_groups_follow_the_mesh_order():
    dims = parallel.ParallelDims(pp=2, dp_shard=2, tp=2)
    assert dims.group_ranks(5, "tp") == (4, 5)  # tp innermost: neighbours
    assert dims.group_ranks(5, "dp_shard") == (5, 7)
    assert dims.group_ranks(5, "pp") == (1, 5)
    assert set(mesh.GROUPS) == {*parallel.MESH_AXES, "fsdp"}
    assert mesh.GROUPS["fsdp"] == parallel.FSDP_AXES == parallel_traffic.STRATEGY_AXES["all_gather"]


def test_bad_arguments_are_clear_errors(results):
    world, per_rank = results
    wrong, pp_sp, batch = per_rank[0]["misuse"]
    assert f"dims describe 2 ranks but the world has {world}" in wrong
    assert "sequence_parallel needs pp = 1 here, got pp = 2" in pp_sp
    assert f"batch (3) is not divisible by dp_replicate * dp_shard = {world}" in batch
    with pytest.raises(TypeError, match="dims must be a ParallelDims"):
        mesh.build_mesh({"tp": 2})
    with pytest.raises(TypeError, match="mesh must be a Mesh"):
        mesh.parallelize(SETUP.model(), None, seq=SEQ)
    with pytest.raises(ValueError, match=r"dp_shard \(2\) \* cp \(1\) \* tp \(3\) = 6 != "
                                         r"world_size \(4\)"):
        parallel.ParallelDims(dp_shard=2, tp=3, world_size=4)
    assert torch.distributed.is_initialized() is False
