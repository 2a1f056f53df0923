"""mlsys.distributed.comms, .ddp and .zero on 2 and 4 gloo ranks, against one process.

One file, so that one launch of 2 ranks and one of 4 serve every case (a launch costs seconds):
each rank function below runs many cases and returns plain values; the tests compare them with a
single process training on the whole batch, with `torch.distributed` itself, and with the
accounting. The small models cover a tied weight (one parameter used twice) and frozen parameters
(a frozen weight and a frozen bias). Rank functions live at module level: ranks import this file.
"""

import contextlib
import copy
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mlsys.accounting import comms as C
from mlsys.accounting import zero as Z
from mlsys.distributed import comms, ddp, launch, zero
from mlsys.training import training_state_bytes

PER_RANK, STEPS, SMALL_BUCKET_MB = 4, 3, 0.0003  # 0.0003 MiB: buckets of a few tensors


class Tied(nn.Module):
    """An embedding whose weight is also the output layer's."""

    def __init__(self, vocab=11, width=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(self.embed(x))))


class Frozen(nn.Module):
    """Two layers with a frozen weight and a frozen bias."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(5, 7), nn.Linear(7, 3)
        self.first.weight.requires_grad_(False)
        self.second.bias.requires_grad_(False)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def mlp():
    return nn.Sequential(nn.Linear(5, 9), nn.ReLU(), nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 3))


MODELS = {"mlp": mlp, "tied": Tied, "frozen": Frozen}


def build(name, seed):
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(name, samples, step):
    g = torch.Generator().manual_seed(100 + step)
    if name == "tied":
        return torch.randint(11, (samples, 4), generator=g), torch.randint(11, (samples, 4),
                                                                           generator=g)
    return torch.randn(samples, 5, generator=g), torch.randn(samples, 3, generator=g)


def loss_of(name, out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten()) if name == "tied" else \
        F.mse_loss(out, y)


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def single_process(name, world, optimizer):
    """The reference: one process, the whole batch of every step."""
    model = build(name, 0)
    opt = optimizer(model.parameters())
    for step in range(STEPS):
        x, y = batch(name, PER_RANK * world, step)
        loss_of(name, model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def my_slice(rank, name, step):
    x, y = batch(name, PER_RANK * rank.world_size, step)
    return x.chunk(rank.world_size)[rank.rank], y.chunk(rank.world_size)[rank.rank]


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


def zero_bitwise(rank, name):
    """ZeRO-1 and plain AdamW on the same gradients (every rank the same batch): equal bits.
    The param groups include frozen parameters and change the learning rate mid-way."""
    model = build(name, 0)
    twin = copy.deepcopy(model)

    def groups(m):
        params = list(m.parameters())
        return [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}]

    opt = zero.ShardedOptimizer(groups(model), torch.optim.AdamW, group=rank.group, lr=0.01)
    ref = adamw(groups(twin))
    for step in range(STEPS):
        x, y = batch(name, PER_RANK, step)
        for m in (model, twin):
            loss_of(name, m(x), y).backward()
        if step == 1:  # as a scheduler would
            opt.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = 0.003
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    return {"equal": all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                            twin.parameters(), strict=True)),
            "owned": opt.owned_numel, "state": sum(len(s) > 0 for s in opt.state.values()),
            "owned_tensors": sum(opt.owner[id(p)] == rank.rank for p in opt._trainable),
            "grads_cleared": all(p.grad is None for p in model.parameters())}


def zero_train(rank, name, stage, micro, over_ddp):
    """ZeRO stage 1 or 2 from different weights, against one process; held bytes and sent
    bytes of the first step."""
    model = build(name, seed=rank.rank * 17)
    if over_ddp:  # gradients averaged by a DDP wrapper, the optimizer only shards its state
        wrapped = ddp.NaiveDDP(model, rank.group)
        opt = zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW, group=rank.group,
                                    lr=0.01)
    else:
        wrapped = None
        opt = zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW, group=rank.group,
                                    stage=stage, reduce_gradients=True, lr=0.01)
    for step in range(STEPS):
        x, y = my_slice(rank, name, step)
        with comms.count_bytes() as count:
            for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro), strict=True)):
                with contextlib.nullcontext() if i == micro - 1 else opt.no_sync():
                    (loss_of(name, (wrapped or model)(xm), ym) / micro).backward()
            if wrapped is not None:
                wrapped.finish_gradient_synchronization()
            opt.step()
        if step == 0:
            held, sent = training_state_bytes(model, opt), count.sent_bytes
        opt.zero_grad()
    return {"params": [p.detach() for p in model.parameters()], "held": held, "sent": sent,
            "owned": opt.owned_numel}


def zero_cases(rank, cases):
    return {"bitwise": {name: zero_bitwise(rank, name) for name in ("mlp", "frozen", "tied")},
            "train": [zero_train(rank, *case) for case in cases]}


# --- tests ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def job(request):
    with launch.start(request.param, timeout_s=60, collective_timeout_s=30) as started:
        yield started


DDP_CASES = [(v, name, micro) for v in ddp.VARIANTS for name in MODELS for micro in (1, 2)]
ZERO_CASES = [("mlp", 1, 1, False), ("mlp", 2, 1, False), ("mlp", 1, 1, True),
              ("tied", 2, 2, False), ("frozen", 1, 2, False), ("frozen", 2, 1, False)]


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
        total = C.collective_cost("all_reduce", sum(r["grad_bytes"]), world).sent_bytes
        assert r["sent"] == pytest.approx(total, rel=1e-12)
        trainable = {"mlp": 6, "tied": 3, "frozen": 2}[name]  # tied: once; frozen: skipped
        assert len(r["grad_bytes"]) == trainable
        launches = {"naive": trainable, "overlapped": trainable, "flat": 1,
                    "bucketed": r["buckets"]}[variant]
        assert r["all_reduces"] == launches, (variant, name)
    bucketed = per_rank[0][DDP_CASES.index(("bucketed", "mlp", 1))]
    assert bucketed["buckets"] == len(C.buckets(bucketed["grad_bytes"][::-1],
                                                SMALL_BUCKET_MB * 2**20)) > 1


def test_a_forgotten_finish_is_a_clear_error(job):
    for message in job.run(forgets_to_finish):
        assert "call finish_gradient_synchronization() after every backward" in message


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
                assert sent == C.collective_cost("all_reduce", m, n).sent_bytes
            assert calls == {"isend": 2 * (n - 1), "recv": 2 * (n - 1)}
        assert torch.equal(out["matrix"], torch.arange(12.0).reshape(3, 4) * n * (n + 1) / 2)
        assert "must be contiguous" in out["not contiguous"]


def test_the_counter_sees_every_collective_and_matches_the_accounting(job):
    n = job.world_size
    m = 8 * n * 4  # bytes of the full buffer
    expected = sum(C.collective_cost(c, m, n).sent_bytes for c in (
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


@pytest.fixture(scope="module")
def zero_results(job):
    return job.world_size, job.run(zero_cases, args=(ZERO_CASES,), timeout_s=120)


def test_sharded_adamw_equals_adamw_bit_for_bit(zero_results):
    world, per_rank = zero_results
    for name in ("mlp", "frozen", "tied"):
        results = [r["bitwise"][name] for r in per_rank]
        assert all(r["equal"] and r["grads_cleared"] for r in results), name
        trainable = [p.numel() for p in build(name, 0).parameters() if p.requires_grad]
        assert [r["owned"] for r in results] == list(Z.shard_numels(trainable, world))
        for r in results:  # state for the tensors this rank owns, and no other
            assert r["state"] == r["owned_tensors"]


def test_zero_stages_train_like_one_process(zero_results):
    world, per_rank = zero_results
    for i, (name, stage, micro, _) in enumerate(ZERO_CASES):
        expected = single_process(name, world, adamw)
        for r in per_rank:
            for a, b in zip(r["train"][i]["params"], expected, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg=f"{name} stage {stage} micro {micro}")


def test_each_rank_holds_what_the_accounting_predicts(zero_results):
    world, per_rank = zero_results
    for i, (name, stage, _, _) in enumerate(ZERO_CASES):
        if name != "mlp":
            continue
        n_params = sum(p.numel() for p in build(name, 0).parameters())
        for r in per_rank:
            run = r["train"][i]
            predicted = Z.zero_memory_breakdown(n_params, world, stage, "fp32_adamw",
                                                shard_params=run["owned"])
            for kind in ("weights", "grads", "optimizer"):
                assert run["held"][kind] == predicted[kind], (stage, kind)


def test_stages_one_and_two_send_what_data_parallelism_sends(zero_results):
    world, per_rank = zero_results
    for i, (name, stage, _, over_ddp) in enumerate(ZERO_CASES):
        n_params = sum(p.numel() for p in build(name, 0).parameters() if p.requires_grad)
        dp = sum(Z.zero_sent_bytes(n_params, world, 0).values())
        for r in per_rank:
            sent = r["train"][i]["sent"]
            if over_ddp:  # DDP's all-reduce and then the broadcast: 1.5x
                assert sent == pytest.approx(1.5 * dp)
            else:
                assert sent == pytest.approx(sum(Z.zero_sent_bytes(n_params, world,
                                                                   stage).values()))
                assert sent == pytest.approx(dp)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: ddp.NaiveDDP("model"), TypeError, "module must be a torch.nn.Module"),
    (lambda: ddp.NaiveDDP(mlp()), RuntimeError, "torch.distributed is not initialized"),
    (lambda: ddp.apply_ddp(mlp(), "fast"), ValueError, "variant='fast' is not one of"),
    (lambda: ddp.BucketedDDP(mlp(), bucket_size_mb=0), ValueError, "bucket_size_mb must be > 0"),
    (lambda: zero.ShardedOptimizer(mlp().parameters(), "AdamW"), TypeError,
     "optimizer_cls must be a torch.optim.Optimizer class"),
    (lambda: zero.ShardedOptimizer(mlp().parameters(), torch.optim.AdamW, stage=3), ValueError,
     "stage=3 is not one of"),
    (lambda: zero.ShardedOptimizer(mlp().parameters(), torch.optim.AdamW, stage=2,
                                   reduce_gradients=False), ValueError, "must be True"),
    (lambda: comms.ring_all_reduce([1, 2]), TypeError, "tensor must be a torch.Tensor"),
])
def test_bad_arguments_fail_before_any_communication(call, error, message):
    with pytest.raises(error, match=message):
        call()
