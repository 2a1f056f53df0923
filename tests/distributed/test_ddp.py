"""mlsys.distributed.ddp on 2 and 4 gloo ranks, against one process: every variant (naive, flat,
overlapped, bucketed) trains like one process on the whole batch, with and without no_sync
micro-batches, and moves the accounted bytes in its number of all-reduces.

One launch per rank count serves every case (a launch costs seconds): the rank function below runs
many cases and returns plain values. The small models (data_parallel_cases.py) cover a tied weight
and frozen parameters. Rank functions live at module level: ranks import this file.
"""

import contextlib

import pytest
import torch
from data_parallel_cases import (
    MODELS,
    SMALL_BUCKET_MB,
    STEPS,
    build,
    loss_of,
    mlp,
    my_slice,
    sgd,
    single_process,
)

from mlsys.accounting import buckets
from mlsys.accounting import comms as comms_cost
from mlsys.distributed import comms, ddp, launch

# --- rank functions -------------------------------------------------------------------------------


def train_ddp(rank, variant, name, micro):
    """Train with a DDP variant from deliberately different weights (rank 0's must win);
    `micro` micro-batches per step, all but the last under no_sync. Counts the first step."""
    model = build(name, seed=rank.rank * 17)
    wrapped = ddp.apply_ddp(model, variant, group=rank.group, bucket_size_mb=SMALL_BUCKET_MB)
    opt = sgd(model.parameters())
    for step in range(STEPS):
        x, y = my_slice(rank, name, step)
        with comms.count_bytes() as count:
            for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro), strict=True)):
                with contextlib.nullcontext() if i == micro - 1 else wrapped.no_sync():
                    (loss_of(name, wrapped(xm), ym) / micro).backward()
                    wrapped.finish_gradient_synchronization()  # a no-op inside no_sync
        if step == 0:
            first = count
        opt.step()
        opt.zero_grad()
    return {"params": [p.detach() for p in wrapped.parameters()],
            "all_reduces": first.calls["all_reduce"], "sent": first.sent_bytes,
            "grad_bytes": [p.numel() * 4 for p in wrapped.trainable],
            "buckets": len(getattr(wrapped, "buckets", [])),
            "added_params": len(list(wrapped.parameters())) - len(list(model.parameters()))}


def ddp_cases(rank, cases):
    return [train_ddp(rank, *case) for case in cases]


def forgets_to_finish(rank):
    wrapped = ddp.BucketedDDP(mlp(), rank.group)
    x = torch.randn(4, 5)
    wrapped(x).sum().backward()
    try:
        wrapped(x).sum().backward()
    except RuntimeError as error:
        return str(error)
    return "no error"


# --- tests ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def job(request):
    with launch.start(request.param, timeout_s=60, collective_timeout_s=30) as started:
        yield started


DDP_CASES = [(v, name, micro) for v in ddp.VARIANTS for name in MODELS for micro in (1, 2)]


@pytest.fixture(scope="module")
def ddp_results(job):
    return job.world_size, job.run(ddp_cases, args=(DDP_CASES,), timeout_s=120)


def test_every_ddp_variant_trains_like_one_process_on_the_whole_batch(ddp_results):
    world, per_rank = ddp_results
    for i, (variant, name, micro) in enumerate(DDP_CASES):
        expected = single_process(name, world, sgd)
        for r in per_rank:
            got = r[i]["params"]
            assert len(got) == len(expected)
            for a, b in zip(got, expected, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg=f"{variant} {name} micro={micro}")
        for a, b in zip(per_rank[0][i]["params"], per_rank[-1][i]["params"], strict=True):
            assert torch.equal(a, b), f"{variant} {name}: the ranks disagree"
        assert per_rank[0][i]["added_params"] == 0


def test_each_variant_moves_the_accounted_bytes_in_its_number_of_launches(ddp_results):
    world, per_rank = ddp_results
    for i, (variant, name, _) in enumerate(DDP_CASES):
        r = per_rank[0][i]
        total = comms_cost.collective_cost("all_reduce", sum(r["grad_bytes"]), world).sent_bytes
        assert r["sent"] == pytest.approx(total, rel=1e-12)
        trainable = {"mlp": 6, "tied": 3, "frozen": 2}[name]  # tied: once; frozen: skipped
        assert len(r["grad_bytes"]) == trainable
        launches = {"naive": trainable, "overlapped": trainable, "flat": 1,
                    "bucketed": r["buckets"]}[variant]
        assert r["all_reduces"] == launches, (variant, name)
    bucketed = per_rank[0][DDP_CASES.index(("bucketed", "mlp", 1))]
    assert bucketed["buckets"] == len(buckets.buckets(bucketed["grad_bytes"][::-1],
                                                      SMALL_BUCKET_MB * 2**20)) > 1


def test_a_forgotten_finish_is_a_clear_error(job):
    for message in job.run(forgets_to_finish):
        assert "call finish_gradient_synchronization() after every backward" in message


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: ddp.NaiveDDP("model", None), TypeError, "module must be a torch.nn.Module"),
    (lambda: ddp.NaiveDDP(mlp(), None), RuntimeError, "torch.distributed is not initialized"),
    (lambda: ddp.apply_ddp(mlp(), "fast", group=None), ValueError, "variant='fast' is not one of"),
    (lambda: ddp.apply_ddp(mlp(), "naive", group="world"), TypeError,
     r"group must be a torch.distributed.ProcessGroup \(e.g. Rank.group or a mesh axis\), got "
     "str 'world'"),
    (lambda: ddp.BucketedDDP(mlp(), None, bucket_size_mb=0), ValueError,
     "bucket_size_mb must be > 0"),
])
def test_bad_arguments_fail_before_any_communication(call, error, message):
    with pytest.raises(error, match=message):
        call()
