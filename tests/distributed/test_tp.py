"""mlsys.distributed.tp on 2 gloo ranks: Megatron tensor parallelism by hand (with and without
sequence parallelism) and DTensor's `parallelize_module` (`torch_strategies.apply_dtensor_tp`)
train like one process; the bytes are the accounting's.

One launch serves every case; rank functions live at module level (the ranks import this file).
"""

import pytest
import torch
from parallel_cases import SETUP, assert_matches, errors, reference

from mlsys.accounting import parallel, parallel_traffic
from mlsys.distributed import comms, harness, torch_strategies, tp
from mlsys.models.transformer import Transformer, TransformerConfig

CFG = SETUP.cfg
CASES = {"tp": {}, "tp + sp": {"sequence_parallel": True}, "dtensor": {"dtensor": True}}


def _full(tensors: dict, model, rank, dtensor: bool) -> dict:
    if dtensor:
        return {n: t.full_tensor() if hasattr(t, "full_tensor") else t for n, t in
                tensors.items()}
    return tp.unsharded(tensors, model, rank.group)


def train(rank, sequence_parallel=False, dtensor=False):
    """SETUP's AdamW steps; every TP rank sees the whole batch."""
    model = SETUP.model()
    if dtensor:
        torch_strategies.apply_dtensor_tp(model, rank.group)
    else:
        tp.apply_tp(model, rank.group, sequence_parallel=sequence_parallel)
    local = {n: p.numel() for n, p in model.named_parameters()}

    def step(i):
        batch = SETUP.tokens(i)
        loss = harness.loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        return loss.item()

    def full(grads):
        return _full({n: p.grad if grads else p.detach() for n, p in model.named_parameters()},
                     model, rank, dtensor)

    out = harness.train(SETUP, model.parameters(), step, full)
    return out | {"local": local, "heads": model.blocks[0].attn.n_heads}


def misuse(rank):
    one_head = TransformerConfig(vocab_size=64, context_length=16, d_model=16, n_layers=1,
                                 n_heads=1, d_ff=24)
    sp = tp.apply_tp(SETUP.model(), rank.group, sequence_parallel=True)
    return errors(lambda: tp.apply_tp(Transformer(one_head), rank.group),
                  lambda: tp.apply_tp(SETUP.model(), rank.group, sequence_parallel=1),
                  lambda: sp(SETUP.tokens(0)[:, :7]))


def all_cases(rank):
    return {name: train(rank, **kw) for name, kw in CASES.items()} | {"misuse": misuse(rank)}


@pytest.fixture(scope="module")
def results():
    return harness.on_ranks(all_cases, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallelism_trains_like_one_process(results, name):
    ref = reference()
    for r in results:
        assert r[name]["losses"] == pytest.approx(ref["losses"], rel=1e-6)  # every rank: all
        assert_matches(r[name]["grads"], ref["grads"], what=f"{name} grads")
        assert_matches(r[name]["params"], ref["params"], what=f"{name} params")
        assert r[name]["heads"] == CFG.n_heads // 2


def test_each_rank_holds_half_of_every_matrix(results):
    full = {n: p.numel() for n, p in SETUP.model().named_parameters()}
    for r in results:
        for name, numel in r["tp"]["local"].items():
            split = any(k in name for k in ("_proj", "ffn.w"))
            assert numel == (full[name] // 2 if split else full[name]), name
        shape = parallel.model_shape(CFG)
        assert sum(r["tp"]["local"].values()) == shape.stage_params(0, 1, tp=2)


def test_bytes_are_the_accountings(results):
    for name, sp in (("tp", False), ("tp + sp", True)):
        expected = parallel_traffic.tp_sent_bytes(CFG.d_model, 2, tokens=SETUP.batch * SETUP.seq,
                                                  n_blocks=CFG.n_layers, sequence_parallel=sp)
        for r in results:
            assert r[name]["sent"] == pytest.approx(expected, rel=1e-12), name
    # 2 all-reduces per block forward (g) and 2 backward (f)
    assert results[0]["tp"]["calls"] == {"all_reduce": 4 * CFG.n_layers}
    # sequence parallel: each becomes an all-gather and a reduce-scatter (same bytes), plus the
    # gains' all-reduces and one all-gather at each end of the split stream
    sp_calls = results[0]["tp + sp"]["calls"]
    assert sp_calls == {comms.ALL_GATHER_SINGLE: 4 * CFG.n_layers + 2,  # its name in this torch
                        comms.REDUCE_SCATTER_SINGLE: 4 * CFG.n_layers,
                        "all_reduce": 2 * CFG.n_layers}


def test_bad_arguments_are_clear_errors(results):
    heads, flag, seq = results[0]["misuse"]
    assert "n_heads (1) is not divisible by the TP degree (2)" in heads
    assert "sequence_parallel must be True or False" in flag
    assert "seq (7) divisible by the tensor-parallel degree (2)" in seq
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        tp.apply_tp(SETUP.model(), None)
    with pytest.raises(TypeError, match="blocks"):
        tp.apply_tp(torch.nn.Linear(2, 2), None)
