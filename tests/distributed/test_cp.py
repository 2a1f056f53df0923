"""mlsys.distributed.cp on 2 and 4 gloo ranks: ring attention equals one process's attention
(forward and backward, both layouts), context-parallel training equals one process's, and the
ring sends the accounting's bytes.

One launch per rank count serves every case; rank functions live at module level.
"""

import pytest
import torch
from parallel_cases import SETUP, assert_matches, errors, reference

from mlsys.accounting import parallel, parallel_traffic
from mlsys.accounting.comms import collective_cost
from mlsys.distributed import comms, cp, harness
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.ops.attention import attention

CFG, SEQ = SETUP.cfg, SETUP.seq

SHAPE = (2, 3, 24, 8)  # batch, heads, seq (divisible by 2 x 4 ranks), d_head
TOL64 = {"rtol": 1e-12, "atol": 1e-12}  # float64: the merge is exact, up to rounding


def qkv_and_grad():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(SHAPE, generator=g, dtype=torch.float64) for _ in range(4)]


def ring_case(rank, layout):
    """This rank's share of q, k, v through the ring; its output and gradients, and the bytes."""
    n, r = rank.world_size, rank.rank
    everyone = [cp.positions(SHAPE[2], n, j, layout) for j in range(n)]
    mine = everyone[r]
    q, k, v, grad = qkv_and_grad()
    q, k, v = (t[:, :, mine].clone().requires_grad_() for t in (q, k, v))
    with comms.count_bytes() as count:
        out = cp.ring_attention(q, k, v, everyone, rank.group)
        out.backward(grad[:, :, mine])
    return {"positions": mine, "out": out.detach(), "grads": (q.grad, k.grad, v.grad),
            "sent": count.sent_bytes}


def train(rank, layout):
    model = cp.apply_cp(SETUP.model(), rank.group, seq=SEQ, layout=layout)

    def step(i):
        inputs, targets = cp.shard_tokens(SETUP.tokens(i), rank.world_size, rank.rank, layout)
        loss = harness.loss_of(model(inputs), targets)
        loss.backward()
        cp.average_gradients(model, rank.group)
        return loss.item()

    def full(grads):
        return {n: p.grad.clone() if grads else p.detach() for n, p in model.named_parameters()}

    out = harness.train(SETUP, model.parameters(), step, full)
    return out | {"backend": model.blocks[0].attn.backend}


def misuse(rank):
    q = torch.zeros(1, 1, 4, 2)
    return errors(lambda: cp.ring_attention(q, q, q, [torch.arange(4)], rank.group),
                  lambda: cp.apply_cp(SETUP.model(), rank.group, seq=6, layout="zigzag"),
                  lambda: cp.apply_cp(SETUP.model(), rank.group, seq=SEQ)(
                      torch.zeros(1, SEQ, dtype=torch.long)))


def all_cases(rank):
    return {"ring": {layout: ring_case(rank, layout) for layout in cp.LAYOUTS},
            "train": {layout: train(rank, layout) for layout in cp.LAYOUTS},
            "misuse": misuse(rank)}


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def results(request):
    return harness.on_ranks(all_cases, request.param)


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_ring_attention_equals_attention_forward_and_backward(results, layout):
    q, k, v, grad = (t.requires_grad_() for t in qkv_and_grad())
    expected = attention(q, k, v, is_causal=True)
    expected.backward(grad.detach())
    n = len(results)
    for r in results:
        got, pos = r["ring"][layout], r["ring"][layout]["positions"]
        torch.testing.assert_close(got["out"], expected.detach()[:, :, pos], **TOL64)
        for mine, whole in zip(got["grads"], (q.grad, k.grad, v.grad), strict=True):
            torch.testing.assert_close(mine, whole[:, :, pos], **TOL64)
        tokens_here = SHAPE[0] * SHAPE[2] // n
        assert got["sent"] == parallel_traffic.cp_sent_bytes(
            SHAPE[1] * SHAPE[3], n, tokens=tokens_here, n_blocks=1, act_dtype="fp64",
            grad_dtype="fp64")


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_context_parallel_training_is_one_process_training(results, layout):
    ref = reference()
    n = len(results)
    losses = harness.combine([r["train"][layout] for r in results],
                             parallel.ParallelDims(cp=n))["losses"]
    assert losses == pytest.approx(ref["losses"], rel=1e-6)
    n_params = sum(p.numel() for p in SETUP.model().parameters())
    ring = parallel_traffic.cp_sent_bytes(CFG.d_model, n, tokens=SETUP.batch * SEQ // n,
                                          n_blocks=CFG.n_layers)
    grads = collective_cost("all_reduce", n_params * 4, n).sent_bytes
    for r in results:
        assert r["train"][layout]["backend"] == f"ring ({layout}, {n} ranks)"
        assert_matches(r["train"][layout]["grads"], ref["grads"], what=f"{layout} grads")
        assert_matches(r["train"][layout]["params"], ref["params"], what=f"{layout} params")
        assert r["train"][layout]["sent"] == pytest.approx(ring + grads, rel=1e-12)


def test_zigzag_balances_the_causal_work():
    for n in (2, 4, 8):
        contiguous, zigzag = cp.causal_work(1024, n, "contiguous"), cp.causal_work(1024, n)
        assert sum(contiguous) == sum(zigzag) == 1024 * 1025 // 2
        assert len(set(zigzag)) == 1  # every rank the same
        block = (1024 // n) ** 2
        assert max(contiguous) / min(contiguous) == pytest.approx(2 * n - 1, rel=0.01)
        assert zigzag[0] == pytest.approx(n / 2 * block, rel=0.01)


def test_a_rank_outside_the_group_is_a_clear_error():
    for layout in cp.LAYOUTS:  # zig-zag would return chunks 4 and 3 of 8: another rank's
        with pytest.raises(ValueError, match=r"^rank \(4\) must be < n_ranks \(4\): ranks are "
                                             "numbered from 0$"):
            cp.positions(16, 4, rank=4, layout=layout)
    with pytest.raises(ValueError, match="rank must be an integer >= 0, got -1"):
        cp.positions(16, 4, rank=-1)
    assert cp.positions(16, 4, rank=3).tolist() == [6, 7, 8, 9]  # the last rank: chunks 3 and 4


def test_bad_arguments_are_clear_errors(results):
    positions, divisible, length = results[0]["misuse"]
    assert "all_positions must hold one tensor per rank" in positions
    assert "seq (6) must be divisible by" in divisible
    assert "this rank holds" in length
    with pytest.raises(ValueError, match="layout='striped' is not one of"):
        cp.positions(8, 2, 0, "striped")
    with pytest.raises(ValueError, match=r"tokens must be a \(batch, seq \+ 1\) tensor"):
        cp.shard_tokens(torch.zeros(3), 2, 0)


def test_a_model_with_learned_positions_is_refused():
    """The ring remaps RoPE's tables to each rank's positions; a learned table it cannot."""
    gpt = Transformer(TransformerConfig(positions="learned", norm="layernorm", mlp="gelu"))
    with pytest.raises(ValueError, match="positions='learned'"):
        cp.apply_cp(gpt, None, seq=8)
