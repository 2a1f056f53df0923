"""mlsys.distributed.tp on 2 gloo ranks: Megatron tensor parallelism by hand (with and without
sequence parallelism) and DTensor's `parallelize_module` train like one process; the bytes are the
accounting's.

One launch serves every case; rank functions live at module level (the ranks import this file).
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
    loss_of,
    optimizer,
    reference,
    tokens,
)

from mlsys.accounting import parallel as P
from mlsys.distributed import comms, launch, tp
from mlsys.models.transformer import Transformer, TransformerConfig

CASES = {"tp": {}, "tp + sp": {"sequence_parallel": True}, "dtensor": {"dtensor": True}}


def _full(tensors: dict, model, rank, dtensor: bool) -> dict:
    if dtensor:
        return {n: t.full_tensor() if hasattr(t, "full_tensor") else t for n, t in
                tensors.items()}
    return tp.unsharded(tensors, model, rank.group)


def train(rank, sequence_parallel=False, dtensor=False):
    """STEPS AdamW steps; every TP rank sees the whole batch."""
    model = build()
    if dtensor:
        tp.apply_dtensor_tp(model, rank.group)
    else:
        tp.apply_tp(model, rank.group, sequence_parallel=sequence_parallel)
    local = {n: p.numel() for n, p in model.named_parameters()}
    opt = optimizer(model.parameters())
    out = {"losses": [], "local": local, "heads": model.blocks[0].attn.n_heads}
    for step in range(STEPS):
        batch = tokens(step)
        with comms.count_bytes() as count:
            loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
            loss.backward()
        out["losses"].append(loss.item())
        if step == 0:
            out["sent"], out["calls"] = count.sent_bytes, dict(count.calls)
            out["grads"] = _full({n: p.grad for n, p in model.named_parameters()}, model, rank,
                                 dtensor)
        opt.step()
        opt.zero_grad()
    out["params"] = _full({n: p.detach() for n, p in model.named_parameters()}, model, rank,
                          dtensor)
    return out


def misuse(rank):
    messages = []
    one_head = TransformerConfig(vocab_size=64, context_length=16, d_model=16, n_layers=1,
                                 n_heads=1, d_ff=24)
    sp = tp.apply_tp(build(), rank.group, sequence_parallel=True)
    for call in (lambda: tp.apply_tp(Transformer(one_head), rank.group),
                 lambda: tp.apply_tp(build(), rank.group, sequence_parallel=1),
                 lambda: sp(tokens(0)[:, :7])):
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


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallelism_trains_like_one_process(results, name):
    ref = reference()
    for r in results:
        assert r[name]["losses"] == pytest.approx(ref["losses"], rel=1e-6)  # every rank: all
        assert_matches(r[name]["grads"], ref["grads"], what=f"{name} grads")
        assert_matches(r[name]["params"], ref["params"], what=f"{name} params")
        assert r[name]["heads"] == CFG.n_heads // 2


def test_each_rank_holds_half_of_every_matrix(results):
    full = {n: p.numel() for n, p in build().named_parameters()}
    for r in results:
        for name, numel in r["tp"]["local"].items():
            split = any(k in name for k in ("_proj", "ffn.w"))
            assert numel == (full[name] // 2 if split else full[name]), name
        shape = P.model_shape(CFG)
        assert sum(r["tp"]["local"].values()) == shape.stage_params(0, 1, tp=2)


def test_bytes_are_the_accountings(results):
    for name, sp in (("tp", False), ("tp + sp", True)):
        expected = P.tp_sent_bytes(CFG.d_model, 2, tokens=BATCH * SEQ, n_blocks=CFG.n_layers,
                                   sequence_parallel=sp)
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
        tp.apply_tp(build(), None)
    with pytest.raises(TypeError, match="blocks"):
        tp.apply_tp(torch.nn.Linear(2, 2), None)
