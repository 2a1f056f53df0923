"""The dtype recorder (`mlsys.numerics.dtype_recorder`): autocast's real behaviour on the CPU,
recorded."""

import pytest
import torch
import torch.nn.functional as F

from mlsys.experiments.autocast_dtypes import ToyModel
from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.numerics.dtype_recorder import DtypeRecorder, exact_in
from mlsys.training import next_token_loss


def _record(model, loss_fn, dtype):
    model.zero_grad(set_to_none=True)
    with DtypeRecorder(model) as rec:
        with torch.autocast("cpu", dtype=dtype):
            loss = rec.note("loss", loss_fn(model))
        loss.backward()
    return rec


def _cells(rec):
    table = rec.table()
    return {row[0]: dict(zip(table.header, row, strict=True)) for row in table.rows}


def test_the_seed_toy_model_under_cpu_autocast():
    """fc1 -> ReLU -> LayerNorm -> fc2 under CPU autocast: matmuls and LayerNorm in the low dtype
    (CPU autocast lets layer_norm follow its input), fp32 loss, fp32-stored gradients whose
    values come from low-precision matmuls."""
    torch.manual_seed(0)
    toy = ToyModel(8, 4)
    x, y = torch.randn(64, 8), torch.randint(4, (64,))
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        rec = _record(toy, lambda m: F.cross_entropy(m(x), y), dtype)
        cells = _cells(rec)
        assert [cells[m]["output"] for m in ("fc1", "relu", "ln", "fc2")] == [name] * 4
        assert cells["fc1"]["input"] == "fp32" and cells["fc1"]["matmul reads"] == name
        assert cells["fc1"]["parameters"] == cells["ln"]["parameters"] == "fp32"
        assert cells["fc1"]["parameter grads (stored/exact in)"] == f"fp32/{name}"
        assert cells["fc2"]["output's gradient"] == name
        assert rec.notes["loss"] == "fp32"
        assert {d for d, _ in rec.grads.values()} == {"fp32"}
        casts = [o for o in rec.module_ops("fc1") if o.op == "_to_copy"]
        assert [(o.inputs, o.outputs) for o in casts] == [(("fp32",), (name,))] * 2  # x and W
        mm = next(o for o in rec.module_ops("fc1") if o.op == "mm")
        assert mm.inputs == (name, name) and mm.outputs == (name,)
        assert any(o.phase == "backward" and o.op == "mm" for o in rec.ops)


def test_the_book_transformer_under_cpu_autocast():
    model = Transformer(TransformerConfig())
    tokens = torch.randint(1000, (2, 9), generator=torch.Generator().manual_seed(0))
    cells = _cells(_record(model, lambda m: next_token_loss(m, tokens), torch.bfloat16))
    assert cells["blocks.0.attn.q_proj"]["output"] == "bf16"
    assert cells["blocks.0.attn.q_proj"]["input"] == "fp32"  # the residual stream stays fp32
    assert cells["blocks.0.attn_norm"]["output"] == "fp32"  # the book's RMSNorm computes in fp32
    assert cells["lm_head"]["matmul reads"] == "bf16"
    assert cells["token_embedding"]["parameter grads (stored/exact in)"] == "fp32/fp32"
    assert cells["blocks.1.ffn.w2"]["parameter grads (stored/exact in)"] == "fp32/bf16"
    assert "blocks.0" not in cells  # leaves only; the whole tree with leaves_only=False
    rec = _record(model, lambda m: next_token_loss(m, tokens), torch.bfloat16)
    assert "blocks.0" in {row[0] for row in rec.table(leaves_only=False).rows}


def test_exact_in_and_recorder_errors():

    assert exact_in(torch.tensor([1.5, 0.25])) == "bf16"
    assert exact_in(torch.tensor([1 + 2**-9])) == "fp16"
    assert exact_in(torch.tensor([1 + 2**-20])) == "fp32"
    assert exact_in(torch.tensor([0.1], dtype=torch.float16)) == "fp16"
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        DtypeRecorder("model")
    with pytest.raises(TypeError, match="floating-point tensor"):
        exact_in(torch.ones(2, dtype=torch.int64))
    rec = _record(torch.nn.Linear(3, 2), lambda m: m(torch.ones(4, 3)).sum(), torch.bfloat16)
    with pytest.raises(ValueError, match="phase must be 'forward' or 'backward'"):
        rec.module_ops("", phase="both")
    with pytest.raises(ValueError, match="path='fc9' did not run"):
        rec.module_ops("fc9")
    with pytest.raises(TypeError, match="tensor must be a tensor"):
        rec.note("loss", 1.0)
