"""mlsys.distributed.fsdp on 2 gloo ranks: FSDP by hand (with and without prefetch, fp32 and bf16
compute, bf16 from a precision policy) and PyTorch's FSDP2 train like one process; the bytes are
the accounting's. Then FSDP on models it was not written for (fsdp_cases.py): a stack of Linear
layers in `.layers` (also run last layer first, and skipping a layer every second step) and a
language model whose embedding is its head (tied weights), cut by wrap policies, in fp32 and in
bf16/fp16 from a chapter-07 precision policy, trains like one process that computes the same way;
bad arguments are clear errors before any collective. PyTorch's FSDP2 on the same models:
test_torch_strategies.py; the units themselves: test_fsdp_units.py.

One launch serves every case; rank functions live at module level (the ranks import this file).
"""

import fsdp_cases
import pytest
import torch
import torch.nn.functional as F
from fsdp_cases import CASES, UNITS, assert_close, batch, build, check_bad_arguments, loss_of
from parallel_cases import SETUP, assert_matches, errors, reference
from torch import nn

from mlsys.accounting import parallel, parallel_traffic
from mlsys.distributed import comms, fsdp, harness, torch_strategies

CFG = SETUP.cfg

TINY_CASES = {"prefetch": {"prefetch": True}, "no prefetch": {"prefetch": False},
              "bf16": {"compute": "bf16"},
              "bf16 policy": {"policy": "bf16_mixed_adamw_fp32_grads"},
              "fully_shard": {"torch_fsdp": True}}


def train(rank, prefetch=True, compute=None, torch_fsdp=False, policy=None):
    """SETUP's AdamW steps on this rank's half of each batch."""
    model = SETUP.model()
    dtype = torch.bfloat16 if compute == "bf16" else None
    if torch_fsdp:
        torch_strategies.apply_fully_shard(model, rank.group, param_dtype=dtype)
    else:
        fsdp.apply_fsdp(model, rank.group, compute_dtype=dtype, prefetch=prefetch, policy=policy)
    shards = [(n, p.numel(), p.dtype) for n, p in model.named_parameters()]

    def step(i):
        batch = SETUP.tokens(i).chunk(rank.world_size)[rank.rank]
        loss = harness.loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        return loss.item()

    def full(grads):
        if torch_fsdp:
            return {n: (p.grad if grads else p).full_tensor() for n, p in model.named_parameters()}
        return model.fsdp.unsharded(grads=grads)

    return harness.train(SETUP, model.parameters(), step, full) | {"shards": shards}


def misuse(rank):
    """Errors that need a running group: each call's message."""
    return errors(lambda: fsdp.apply_fsdp(SETUP.model(), None),
                  lambda: fsdp.apply_fsdp(SETUP.model(), rank.group, compute_dtype=torch.int32),
                  lambda: fsdp.apply_fsdp(fsdp.apply_fsdp(SETUP.model(), rank.group), rank.group))


def all_cases(rank):
    """The tiny model's cases, its misuses, and the cases of fsdp_cases.py."""
    return ({name: train(rank, **kw) for name, kw in TINY_CASES.items()} | {"misuse": misuse(rank)}
            | fsdp_cases.all_cases(rank))


@pytest.fixture(scope="module")
def results():
    return harness.on_ranks(all_cases, 2)


def _mean_losses(per_rank, name):
    dims = parallel.ParallelDims(dp_shard=len(per_rank))
    return harness.combine([r[name] for r in per_rank], dims)["losses"]


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
    dims = parallel.ParallelDims(dp_shard=2)
    units = parallel_traffic.fsdp_units(CFG, dims)
    assert len(units) == 1 + CFG.n_layers  # the root (embedding, final norm, head), each block
    assert sum(units) == sum(p.numel() for p in SETUP.model().parameters())


@pytest.mark.timeout(200)
def test_shards_and_bytes_are_the_accountings(results):
    units = parallel_traffic.fsdp_units(CFG, parallel.ParallelDims(dp_shard=2))
    for name, param_dtype in (("prefetch", "fp32"), ("no prefetch", "fp32"), ("bf16", "bf16")):
        expected = parallel_traffic.fsdp_sent_bytes(units, 2, param_dtype=param_dtype,
                                                    reduce_dtype="fp32")
        for r in results:
            assert [k for _, k, _ in r[name]["shards"]] == [parallel_traffic.padded(u, 2) // 2
                                                            for u in units]
            assert r[name]["sent"] == pytest.approx(sum(expected.values()), rel=1e-12), name
            # per unit: all-gather before the forward and the backward, one reduce-scatter
            assert r[name]["calls"] == {comms.ALL_GATHER_SINGLE: 2 * len(units),
                                        comms.REDUCE_SCATTER_SINGLE: len(units)}
    bf16, fp32 = (sum(parallel_traffic.fsdp_sent_bytes(units, 2, param_dtype=d).values())
                  for d in ("bf16", "fp32"))
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
        fsdp.apply_fsdp(SETUP.model(), None)


# --- models FSDP was not written for (fsdp_cases.py) ----------------------------------------------


@pytest.mark.timeout(200)  # past the launcher's own deadlines (60 s start + 120 s run)
@pytest.mark.parametrize("case", [c for c, (_, _, impl, _) in CASES.items() if impl == "ours"])
def test_fsdp_on_any_module_trains_like_one_process(results, case):
    model_name, _, _, precision = CASES[case]
    ref = fsdp_cases.reference(model_name, precision)
    moved = {n: (ref["params"][n] - ref["start"][n]).abs().max().item() for n in ref["params"]}
    assert min(moved.values()) > 1e-3  # every tensor moves: a missed update cannot pass
    largest = {n: g.abs().max().item() for n, g in ref["grads"].items()}
    for r in results:
        assert_close(r[case]["grads"], ref["grads"], largest, precision, f"{case} grads")
        assert_close(r[case]["params"], ref["params"], moved, precision, f"{case} params")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", [c for c, (model, _, impl, _) in CASES.items()
                                  if impl == "ours" and model != "skipping"])
def test_units_follow_the_wrap_policy_with_fp32_master_shards(results, case):
    model_name, wrap, _, _ = CASES[case]
    units, root = UNITS[("stack" if model_name == "backwards" else model_name, wrap)]
    names = [n.removesuffix("flat_shard").rstrip(".") for n, _ in results[0][case]["shards"]]
    assert names == ([""] if root else []) + units  # the root first, then registration order
    for r in results:
        assert {dtype for _, dtype in r[case]["shards"]} == {torch.float32}
        # per unit and step: 2 all-gathers and 1 reduce-scatter, no more (prefetch included)
        for calls in r[case]["calls"]:
            assert calls == {comms.ALL_GATHER_SINGLE: 2 * len(names),
                             comms.REDUCE_SCATTER_SINGLE: len(names)}, case
        # prefetch follows the order the forward ran the units, recorded at each forward: the
        # backwards stack's first forward guessed registration order and gathered units early
        # (held until their backward); from the second on, no unit is held after the forward
        forward = units[-2::-1] + ["readout"] if model_name == "backwards" else units
        assert r[case]["order"] == ([""] if root else []) + forward
        held = r[case]["held"][1:] if model_name == "backwards" else r[case]["held"]
        assert held == [[]] * len(held), case
    if model_name == "backwards":
        assert results[0][case]["held"][0] != []  # the check above can see held units


@pytest.mark.timeout(200)
def test_tied_weight_gets_both_uses_gradients(results):
    """The head's use of the shared weight matters: leaving it out of the gradient would be far
    outside the tolerance of the training test above."""
    ref = fsdp_cases.reference("tied", "fp32")["grads"]["embed.weight"]
    model = build("tied")
    x, y = batch("tied", 0)
    hidden = model.norm(model.layers[1](model.layers[0](model.embed(x))))
    loss_of(F.linear(hidden, model.head.weight.detach()), y).backward()  # the embedding's use
    head_only = ref - model.embed.weight.grad
    assert head_only.abs().max() > 0.1 * ref.abs().max()
    for r in results:
        for case in ("tied, MLP, fp32", "tied, {Linear}, fp16", "FSDP2 tied, {Linear}, bf16, mesh"):
            assert "head.weight" not in r[case]["params"]  # one parameter, under its first name


@pytest.mark.timeout(200)
def test_a_policy_without_master_keeps_low_precision_shards(results):
    for r in results:
        assert r["extras"]["pure shards"] == {(torch.bfloat16, torch.bfloat16)}
        assert r["extras"]["pure output"] == torch.bfloat16


APPLY = {"apply_fsdp": (fsdp.apply_fsdp, "compute_dtype")}
"""PyTorch's `apply_fully_shard` takes the same arguments: test_torch_strategies.py."""


@pytest.mark.parametrize("which", list(APPLY))
def test_bad_arguments_are_clear_errors_before_any_collective(which):
    """No process group here: each error must come before the group is even looked at (which
    would be 'torch.distributed is not initialized'), and leave the module as it was."""
    apply, dtype_arg = APPLY[which]
    check_bad_arguments(apply, dtype_arg)
