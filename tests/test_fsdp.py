"""mlsys.distributed.fsdp on 2 gloo ranks: FSDP by hand (with and without prefetch, fp32 and bf16
compute, bf16 from a precision policy) and PyTorch's FSDP2 train like one process; the bytes are
the accounting's. Other modules, wrap policies and tied weights: test_fsdp_any_module.py.

One launch serves every case; rank functions live at module level (the ranks import this file).
"""

import pytest
import torch
from parallel_cases import CFG, STEPS, assert_matches, build, loss_of, optimizer, reference, tokens
from torch import nn

from mlsys.accounting import parallel as P
from mlsys.distributed import comms, fsdp, launch

CASES = {"prefetch": {"prefetch": True}, "no prefetch": {"prefetch": False},
         "bf16": {"compute": "bf16"}, "bf16 policy": {"policy": "bf16_mixed_adamw_fp32_grads"},
         "fully_shard": {"torch_fsdp": True}}


def train(rank, prefetch=True, compute=None, torch_fsdp=False, policy=None):
    """STEPS AdamW steps on this rank's half of each batch."""
    model = build()
    dtype = torch.bfloat16 if compute == "bf16" else None
    if torch_fsdp:
        fsdp.apply_fully_shard(model, rank.group, param_dtype=dtype)
    else:
        fsdp.apply_fsdp(model, rank.group, compute_dtype=dtype, prefetch=prefetch, policy=policy)
    shards = [(n, p.numel(), p.dtype) for n, p in model.named_parameters()]
    opt = optimizer(model.parameters())
    out = {"losses": [], "shards": shards}
    for step in range(STEPS):
        batch = tokens(step).chunk(rank.world_size)[rank.rank]
        with comms.count_bytes() as count:
            loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
            loss.backward()
        out["losses"].append(loss.item())
        if step == 0:
            out["sent"], out["calls"] = count.sent_bytes, dict(count.calls)
            out["grads"] = ({n: p.grad.full_tensor() for n, p in model.named_parameters()}
                            if torch_fsdp else model.fsdp.unsharded(grads=True))
        opt.step()
        opt.zero_grad()
    out["params"] = ({n: p.full_tensor() for n, p in model.named_parameters()} if torch_fsdp
                     else model.fsdp.unsharded())
    return out


def misuse(rank):
    """Errors that need a running group: each call's message."""
    messages = []
    for call in (lambda: fsdp.apply_fsdp(build(), None),
                 lambda: fsdp.apply_fsdp(build(), rank.group, compute_dtype=torch.int32),
                 lambda: fsdp.apply_fsdp(fsdp.apply_fsdp(build(), rank.group), rank.group)):
        try:
            call()
            messages.append("no error")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages


def all_cases(rank):
    return {name: train(rank, **kw) for name, kw in CASES.items()} | {"misuse": misuse(rank)}


@pytest.fixture(scope="module")
def results():
    with launch.start(2, timeout_s=60, collective_timeout_s=30) as job:
        return job.run(all_cases, timeout_s=120)


def _mean_losses(per_rank, name):
    return [sum(r[name]["losses"][s] for r in per_rank) / len(per_rank) for s in range(STEPS)]


@pytest.mark.timeout(200)  # past the launcher's deadlines (60 s + 120 s)
@pytest.mark.parametrize("name", ["prefetch", "no prefetch", "fully_shard"])
def test_fsdp_trains_like_one_process_in_fp32(results, name):
    ref = reference()
    assert _mean_losses(results, name) == pytest.approx(ref["losses"], rel=1e-6)
    for r in results:
        assert_matches(r[name]["grads"], ref["grads"], what=f"{name} grads")
        assert_matches(r[name]["params"], ref["params"], what=f"{name} params")


@pytest.mark.timeout(200)
def test_bf16_compute_keeps_fp32_master_shards_and_stays_close(results):
    ref = reference()
    assert _mean_losses(results, "bf16") == pytest.approx(ref["losses"], rel=1e-2)
    for r in results:
        assert {dtype for _, _, dtype in r["bf16"]["shards"]} == {torch.float32}
        assert_matches(r["bf16"]["grads"], ref["grads"], "bf16", "bf16 grads")
        assert_matches(r["bf16"]["params"], ref["params"], "bf16", "bf16 params")


@pytest.mark.timeout(200)
def test_a_policy_gives_the_dtypes_it_names(results):
    """bf16_mixed_adamw_fp32_grads: bf16 gathers and compute, fp32 reduction and master shards,
    the same run as compute_dtype=bf16 (reduce_dtype's default is fp32), bit for bit."""
    for r in results:
        assert r["bf16 policy"]["losses"] == r["bf16"]["losses"]
        assert r["bf16 policy"]["shards"] == r["bf16"]["shards"]
        for what in ("grads", "params"):
            for name, tensor in r["bf16"][what].items():
                assert torch.equal(r["bf16 policy"][what][name], tensor), (what, name)


def test_each_rank_holds_one_padded_shard_per_unit():
    dims = P.ParallelDims(dp_shard=2)
    units = P.fsdp_units(CFG, dims)
    assert len(units) == 1 + CFG.n_layers  # the root (embedding, final norm, head), each block
    assert sum(units) == sum(p.numel() for p in build().parameters())


@pytest.mark.timeout(200)
def test_shards_and_bytes_are_the_accountings(results):
    units = P.fsdp_units(CFG, P.ParallelDims(dp_shard=2))
    for name, param_dtype in (("prefetch", "fp32"), ("no prefetch", "fp32"), ("bf16", "bf16")):
        expected = P.fsdp_sent_bytes(units, 2, param_dtype=param_dtype, reduce_dtype="fp32")
        for r in results:
            assert [k for _, k, _ in r[name]["shards"]] == [P.padded(u, 2) // 2 for u in units]
            assert r[name]["sent"] == pytest.approx(sum(expected.values()), rel=1e-12), name
            # per unit: all-gather before the forward and the backward, one reduce-scatter
            assert r[name]["calls"] == {comms.ALL_GATHER_SINGLE: 2 * len(units),
                                        comms.REDUCE_SCATTER_SINGLE: len(units)}
    bf16, fp32 = (sum(P.fsdp_sent_bytes(units, 2, param_dtype=d).values()) for d in ("bf16",
                                                                                     "fp32"))
    assert bf16 < fp32  # bf16 gathers move half the weight bytes


@pytest.mark.timeout(200)
def test_bad_arguments_are_clear_errors(results):
    messages = results[0]["misuse"]
    assert "group must be a torch.distributed.ProcessGroup" in messages[0]
    assert "compute_dtype must be a floating-point torch.dtype" in messages[1]
    assert "already applied" in messages[2]
    with pytest.raises(TypeError, match="blocks"):
        fsdp.apply_fsdp(nn.Linear(2, 2), None)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        fsdp.apply_fsdp(build(), None)
