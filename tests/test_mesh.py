"""mlsys.distributed.mesh: the strategies composed on 4 ranks (FSDP x TP, with and without
sequence parallelism; HSDP) and on 8 (PP x CP x TP, FSDP over the context ranks) train like one
process, and every rank sends exactly what `accounting.parallel.sent_bytes` predicts.

One launch per world size; the 8-rank case is one tiny model, two steps. Rank functions live at
module level (the ranks import this file).
"""

import pytest
import torch
from parallel_cases import (
    BATCH,
    CFG,
    SEQ,
    STEPS,
    assert_matches,
    build,
    optimizer,
    reference,
    tokens,
)

from mlsys.accounting import parallel as P
from mlsys.distributed import comms, launch, mesh

M = 2  # micro-batches
CASES = {
    4: {"fsdp x tp": (dict(dp_shard=2, tp=2), False),
        "fsdp x tp + sp": (dict(dp_shard=2, tp=2), True),
        "hsdp": (dict(dp_replicate=2, dp_shard=2), False)},
    8: {"pp x cp x tp": (dict(pp=2, cp=2, tp=2), False)},
}


def train(rank, degrees, sequence_parallel):
    dims = P.ParallelDims(**degrees, world_size=rank.world_size)
    where = mesh.build_mesh(dims)
    stage = mesh.parallelize(build(), where, seq=SEQ, sequence_parallel=sequence_parallel)
    opt = optimizer(stage.parameters())
    out = {"losses": [], "held": sum(p.numel() for p in stage.parameters())}
    for step in range(STEPS):
        with comms.count_bytes() as count:
            result = mesh.train_step(stage, where, tokens(step), microbatches=M)
        out["losses"].append(result.loss)
        if step == 0:
            out["sent"] = count.sent_bytes
            out["grads"] = mesh.full_state(stage, where, grads=True)
        opt.step()
        opt.zero_grad()
    out["params"] = mesh.full_state(stage, where)
    return out


def misuse(rank):
    messages = []
    wrong = P.ParallelDims(tp=2, world_size=2)
    pp_sp = mesh.build_mesh(P.ParallelDims(pp=2, tp=rank.world_size // 2))
    for call in (lambda: mesh.build_mesh(wrong),
                 lambda: mesh.parallelize(build(), pp_sp, seq=SEQ, sequence_parallel=True),
                 lambda: mesh.local_batch(tokens(0, batch=3), mesh.build_mesh(
                     P.ParallelDims(dp_shard=rank.world_size)))):
        try:
            call()
            messages.append("no error")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages


def all_cases(rank):
    return {name: train(rank, *case) for name, case in CASES[rank.world_size].items()} | {
        "misuse": misuse(rank)}


@pytest.fixture(scope="module", params=[4, 8], ids=["4 ranks", "8 ranks"])
def results(request):
    with launch.start(request.param, timeout_s=60, collective_timeout_s=30) as job:
        return request.param, job.run(all_cases, timeout_s=120)


def test_every_composition_trains_like_one_process(results):
    world, per_rank = results
    ref = reference()
    for name, (degrees, _) in CASES[world].items():
        dims = P.ParallelDims(**degrees, world_size=world)
        last = [r[name]["losses"] for i, r in enumerate(per_rank)
                if dims.coords(i)["pp"] == dims.pp - 1]
        losses = [sum(r[s] for r in last) / len(last) for s in range(STEPS)]
        assert losses == pytest.approx(ref["losses"], rel=1e-6), name
        grads, params = {}, {}
        for r in per_rank:  # the stages' names together make the whole model
            grads.update(r[name]["grads"])
            params.update(r[name]["params"])
        assert_matches(grads, ref["grads"], what=f"{name} grads")
        assert_matches(params, ref["params"], what=f"{name} params")


def test_every_rank_sends_the_accounted_bytes_and_holds_its_shard(results):
    world, per_rank = results
    for name, (degrees, sp) in CASES[world].items():
        dims = P.ParallelDims(**degrees, world_size=world)
        for rank, r in enumerate(per_rank):
            expected = P.sent_bytes(CFG, dims, rank, batch=BATCH, seq=SEQ, microbatches=M,
                                    sequence_parallel=sp)
            assert r[name]["sent"] == pytest.approx(sum(expected.values()), rel=1e-12), \
                (name, rank, expected)
            units = P.fsdp_units(CFG, dims, dims.coords(rank)["pp"])
            assert r[name]["held"] == sum(P.padded(u, dims.fsdp) // dims.fsdp for u in units)


def test_groups_follow_the_mesh_order():
    dims = P.ParallelDims(pp=2, dp_shard=2, tp=2)
    assert dims.group_ranks(5, "tp") == (4, 5)  # tp innermost: neighbours
    assert dims.group_ranks(5, "dp_shard") == (5, 7)
    assert dims.group_ranks(5, "pp") == (1, 5)
    assert set(mesh.GROUPS) == {*P.MESH_AXES, "fsdp"}


def test_bad_arguments_are_clear_errors(results):
    world, per_rank = results
    wrong, pp_sp, batch = per_rank[0]["misuse"]
    assert f"dims describe 2 ranks but the world has {world}" in wrong
    assert "sequence_parallel needs pp = 1 here, got pp = 2" in pp_sp
    assert f"batch (3) is not divisible by dp_replicate * dp_shard = {world}" in batch
    with pytest.raises(TypeError, match="dims must be a ParallelDims"):
        mesh.build_mesh({"tp": 2})
    with pytest.raises(TypeError, match="mesh must be a Mesh"):
        mesh.parallelize(build(), None, seq=SEQ)
    with pytest.raises(ValueError, match=r"dp_shard \(2\) \* cp \(1\) \* tp \(3\) = 6 != "
                                         r"world_size \(4\)"):
        P.ParallelDims(dp_shard=2, tp=3, world_size=4)
    assert torch.distributed.is_initialized() is False
