"""mlsys.distributed.comms on 2 and 4 gloo ranks: the ring all-reduce equals `torch.distributed`'s
and moves the accounted bytes; `count_bytes` sees every collective and matches the accounting.

One launch per rank count serves every case. Rank functions live at module level: ranks import
this file.
"""

import warnings

import pytest
import torch
import torch.distributed as dist

from mlsys.accounting import comms as comms_cost
from mlsys.distributed import comms, launch

# --- rank functions -------------------------------------------------------------------------------


def ring_cases(rank):
    out = {}
    for numel in (24, 13, 3):
        for dtype in (torch.int64, torch.float32):
            g = torch.Generator().manual_seed(7 * rank.rank + numel)
            x = torch.randn(numel, generator=g) * 100
            x = x.to(dtype)
            y = x.clone()
            with comms.count_bytes() as count:
                comms.ring_all_reduce(x, rank.group)
            dist.all_reduce(y, group=rank.group)
            out[(numel, str(dtype))] = (x, y, count.sent_bytes, count.received_bytes,
                                        dict(count.calls))
    matrix = torch.arange(12.0).reshape(3, 4) * (rank.rank + 1)
    out["matrix"] = comms.ring_all_reduce(matrix, rank.group)
    try:
        comms.ring_all_reduce(torch.ones(4, 4).t(), rank.group)
    except ValueError as error:
        out["not contiguous"] = str(error)
    return out


def counted_collectives(rank):
    n, r, g = rank.world_size, rank.rank, rank.group
    original = dist.all_reduce
    with comms.count_bytes() as count, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's rename
        x = torch.ones(8 * n)
        dist.all_reduce(x, group=g)
        dist.broadcast(x, src=0, group=g)
        dist.reduce(x, dst=0, group=g)
        dist.all_gather_into_tensor(torch.empty(8 * n), torch.ones(8), group=g)
        dist.all_gather(list(torch.empty(8 * n).chunk(n)), torch.ones(8), group=g)
        dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * n), group=g)
        dist.all_to_all_single(torch.empty(8 * n), torch.ones(8 * n), group=g)
        incoming = torch.empty(5)
        ops = [dist.P2POp(dist.isend, torch.ones(5), (r + 1) % n, g),
               dist.P2POp(dist.irecv, incoming, (r - 1) % n, g)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        dist.barrier(group=g)
    return {"calls": dict(count.calls), "message": dict(count.message_bytes),
            "sent": count.sent_bytes, "received": count.received_bytes,
            "restored": dist.all_reduce is original, "received_ok": bool(incoming.eq(1).all())}


# --- tests ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def job(request):
    with launch.start(request.param, timeout_s=60, collective_timeout_s=30) as started:
        yield started


def test_ring_all_reduce_equals_all_reduce_and_moves_the_accounted_bytes(job):
    n = job.world_size
    for r, out in enumerate(job.run(ring_cases)):
        for (numel, dtype), (x, y, sent, received, calls) in ((k, v) for k, v in out.items()
                                                               if isinstance(k, tuple)):
            if "int" in dtype or n == 2:
                assert torch.equal(x, y)  # integers, or a + b = b + a: the same bits
            else:
                torch.testing.assert_close(x, y)
            chunks = [len(c) * (8 if "int" in dtype else 4)
                      for c in torch.arange(numel).tensor_split(n)]
            m = sum(chunks)
            # a rank sends every chunk but r + 1 (reduce-scatter) and every chunk but r + 2
            # (all-gather); it receives what its left neighbour sends
            assert sent == 2 * m - chunks[(r + 1) % n] - chunks[(r + 2) % n]
            assert received == 2 * m - chunks[r] - chunks[(r + 1) % n]
            if numel % n == 0:
                assert sent == comms_cost.collective_cost("all_reduce", m, n).sent_bytes
            assert calls == {"isend": 2 * (n - 1), "recv": 2 * (n - 1)}
        assert torch.equal(out["matrix"], torch.arange(12.0).reshape(3, 4) * n * (n + 1) / 2)
        assert "must be contiguous" in out["not contiguous"]


def test_the_counter_sees_every_collective_and_matches_the_accounting(job):
    n = job.world_size
    m = 8 * n * 4  # bytes of the full buffer
    expected = sum(comms_cost.collective_cost(c, m, n).sent_bytes for c in (
        "all_reduce", "broadcast", "reduce", "all_gather", "all_gather", "reduce_scatter",
        "all_to_all")) + 5 * 4
    for out in job.run(counted_collectives):
        assert out["restored"] and out["received_ok"]
        assert out["sent"] == pytest.approx(expected) and out["received"] == pytest.approx(
            expected)
        assert out["calls"] == {"all_reduce": 1, "broadcast": 1, "reduce": 1,
                                "all_gather_into_tensor": 1, "all_gather": 1,
                                "reduce_scatter_tensor": 1, "all_to_all_single": 1, "isend": 1,
                                "irecv": 1, "barrier": 1}
        assert out["message"]["all_gather"] == 2 * m and out["message"]["send"] == 20


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: comms.ring_all_reduce([1, 2], None), TypeError, "tensor must be a torch.Tensor"),
])
def test_bad_arguments_fail_before_any_communication(call, error, message):
    with pytest.raises(error, match=message):
        call()
