"""mlsys.distributed.zero on 2 and 4 gloo ranks, against one process: ZeRO-1's sharded AdamW equals
AdamW bit for bit; stages 1 and 2 (alone and over a DDP wrapper) train like one process, each rank
holds what `accounting.zero` predicts and sends what data parallelism sends.

One launch per rank count serves every case (a launch costs seconds): the rank function below runs
many cases and returns plain values. The small models (data_parallel_cases.py) cover a tied weight
and frozen parameters. Rank functions live at module level: ranks import this file.
"""

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from data_parallel_cases import (
    PER_RANK,
    STEPS,
    adamw,
    batch,
    build,
    loss_of,
    mlp,
    my_slice,
    single_process,
)

from mlsys.accounting import zero as zero_cost
from mlsys.distributed import comms, ddp, launch, zero
from mlsys.training import training_state_bytes

# --- rank functions -------------------------------------------------------------------------------


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


ZERO_CASES = [("mlp", 1, 1, False), ("mlp", 2, 1, False), ("mlp", 1, 1, True),
              ("tied", 2, 2, False), ("frozen", 1, 2, False), ("frozen", 2, 1, False)]


@pytest.fixture(scope="module")
def zero_results(job):
    return job.world_size, job.run(zero_cases, args=(ZERO_CASES,), timeout_s=120)


def test_sharded_adamw_equals_adamw_bit_for_bit(zero_results):
    world, per_rank = zero_results
    for name in ("mlp", "frozen", "tied"):
        results = [r["bitwise"][name] for r in per_rank]
        assert all(r["equal"] and r["grads_cleared"] for r in results), name
        trainable = [p.numel() for p in build(name, 0).parameters() if p.requires_grad]
        assert [r["owned"] for r in results] == list(zero_cost.shard_numels(trainable, world))
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
            predicted = zero_cost.zero_memory_breakdown(n_params, world, stage, "fp32_adamw",
                                                        shard_params=run["owned"])
            for kind in ("weights", "grads", "optimizer"):
                assert run["held"][kind] == predicted[kind], (stage, kind)


def test_stages_one_and_two_send_what_data_parallelism_sends(zero_results):
    world, per_rank = zero_results
    for i, (name, stage, _, over_ddp) in enumerate(ZERO_CASES):
        n_params = sum(p.numel() for p in build(name, 0).parameters() if p.requires_grad)
        dp = sum(zero_cost.zero_sent_bytes(n_params, world, 0).values())
        for r in per_rank:
            sent = r["train"][i]["sent"]
            if over_ddp:  # DDP's all-reduce and then the broadcast: 1.5x
                assert sent == pytest.approx(1.5 * dp)
            else:
                assert sent == pytest.approx(sum(zero_cost.zero_sent_bytes(n_params, world,
                                                                           stage).values()))
                assert sent == pytest.approx(dp)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: zero.ShardedOptimizer(mlp().parameters(), "AdamW", group=None), TypeError,
     "optimizer_cls must be a torch.optim.Optimizer class"),
    (lambda: zero.ShardedOptimizer(mlp().parameters(), torch.optim.AdamW, group=None, stage=3),
     ValueError, "stage=3 is not one of"),
    (lambda: zero.ShardedOptimizer(mlp().parameters(), torch.optim.AdamW, group=None, stage=2,
                                   reduce_gradients=False), ValueError, "must be True"),
])
def test_bad_arguments_fail_before_any_communication(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_parameter_passed_twice_is_an_error_naming_it():
    """torch only warns of a duplicate inside a group; ZeRO would own, update and broadcast it
    twice. Refused before the group is looked at (none here)."""
    model = mlp()
    a, b = list(model.parameters())[:2]
    for params, message in [
        ([a, b, a], r"params\[2\], of shape \(9, 5\), is the same parameter as params\[0\]"),
        ([{"params": [a]}, {"params": [b, a]}],
         r"params\[1\]\['params'\]\[1\], .* same parameter as params\[0\]\['params'\]\[0\]"),
        (list(model.named_parameters()) + [("again", a)],
         r"params\[6\] \('again'\), .* same parameter as params\[0\] \('0.weight'\)"),
    ]:
        with pytest.raises(ValueError, match=message + ": each parameter must be passed once"):
            zero.ShardedOptimizer(params, torch.optim.AdamW, group=None)


def test_a_parameter_added_twice_later_is_an_error_naming_it():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = mlp()
        a, b = list(model.parameters())[:2]
        opt = zero.ShardedOptimizer([a], torch.optim.AdamW, group=dist.group.WORLD)
        with pytest.raises(ValueError, match=r"param_group\['params'\]\[1\], of shape "
                                             r"\(9, 5\), is the same parameter as a parameter "
                                             r"of param_groups\[0\]"):
            opt.add_param_group({"params": [b, a]})
        with pytest.raises(ValueError, match=r"param_group\['params'\]\[1\], .* same "
                                             r"parameter as param_group\['params'\]\[0\]"):
            opt.add_param_group({"params": [b, b]})
        assert len(opt.param_groups) == 1 and opt.owned_numel == a.numel()
    finally:
        dist.destroy_process_group()
