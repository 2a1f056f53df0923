"""mlsys.profiling.profiler: one training step of the debug model, classified op by op and phase
by phase; shares and tables (with FLOPs by class, `accounting.flops_by_class`); module ranges;
argument checks."""

import contextlib
import re

import pytest
import torch

from mlsys.accounting import flops_by_class
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import classes, overhead, profiler
from mlsys.training import next_token_loss

BATCH, SEQ = 2, 16
GENERIC = re.compile(r"view|reshape|as_strided|slice|select|empty|zero|fill_")
"""Helper ops (views, allocations) that take the class of the layer they serve."""


def _setup(attention: str = "naive"):
    cfg = TransformerConfig.preset("debug", attention=attention)
    model = Transformer(cfg)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.vocab_size, (BATCH, SEQ + 1), generator=generator)
    return cfg, model, optimizer, tokens


def _step(model, optimizer, tokens, prof=None):
    phase = prof.phase if prof is not None else (lambda name: contextlib.nullcontext())
    with phase("forward"):
        loss = next_token_loss(model, tokens)
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _profile(attention: str):
    cfg, model, optimizer, tokens = _setup(attention)
    _step(model, optimizer, tokens)  # warm-up: the optimizer state exists from here on
    with profiler.Profile(device="cpu", model=model) as prof:
        _step(model, optimizer, tokens, prof)
    return cfg, model, prof


@pytest.fixture(scope="module")
def naive():
    return _profile("naive")


def _calls(prof, name, phase):
    return sum(r.calls for r in prof.ops() if r.name == name and r.phase == phase)


def _classes(prof, name, phase):
    return {r.op_class for r in prof.ops() if r.name == name and r.phase == phase}


def test_phases_are_the_named_ranges(naive):
    _, _, prof = naive
    phases = prof.phases()
    assert [p.phase for p in phases] == ["forward", "backward", "optimizer"]
    for p in phases:
        assert p.occurrences == 1 and 0 < p.op_s <= p.wall_s and p.outside_ops_s >= 0
    assert [s.name for s in prof.phase_spans()] == ["forward", "backward", "optimizer"]
    assert {r.phase for r in prof.ops()} == {"forward", "backward", "optimizer"}


def test_every_op_is_classified_and_other_is_only_lookups_and_the_loss(naive):
    _, _, prof = naive
    rows = prof.ops()
    assert rows == sorted(rows, key=lambda r: -r.self_s)
    assert {r.op_class for r in rows} <= set(profiler.CLASSES)
    assert not {r.op_class for r in rows} & {"communication", "attention"}  # one process, naive
    for r in rows:
        if r.op_class == "other":  # the embedding, nll_loss, the token check, and their helpers
            assert classes.name_class(r.name) == "other" or GENERIC.search(r.name), r
    assert all(r.op_class == "optimizer" for r in rows if r.phase == "optimizer")


def test_ops_get_the_class_of_what_they_compute_and_where_they_ran(naive):
    _, _, prof = naive
    assert _classes(prof, "aten::mm", "forward") == {"matmul"}
    assert _classes(prof, "aten::bmm", "backward") == {"matmul"}
    assert _classes(prof, "aten::rsqrt", "forward") == {"normalization"}
    assert _classes(prof, "aten::mean", "forward") == {"normalization"}  # inside RMSNorm
    assert _classes(prof, "aten::_softmax", "forward") == {"softmax"}
    assert _classes(prof, "aten::_softmax_backward_data", "backward") == {"softmax"}
    assert _classes(prof, "aten::silu", "forward") == {"elementwise"}
    assert _classes(prof, "aten::masked_fill", "forward") == {"elementwise"}
    assert _classes(prof, "aten::mul", "forward") == {"normalization", "elementwise"}  # RoPE too
    # the backward finds RMSNorm through the node's sequence number: no name says "norm" here
    assert _classes(prof, "autograd::engine::evaluate_function: MeanBackward1",
                    "backward") == {"normalization"}
    assert _classes(prof, "MulBackward0", "backward") == {"normalization", "elementwise"}
    assert _classes(prof, "aten::t", "backward") == {"matmul"}  # inside MmBackward0


def test_matmul_calls_match_the_linear_layers(naive):
    cfg, model, prof = naive
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert linears == 7 * cfg.n_layers + 1
    assert _calls(prof, "aten::mm", "forward") == linears
    assert _calls(prof, "aten::mm", "backward") == 2 * linears  # grad input and grad weight
    assert _calls(prof, "aten::bmm", "forward") == 2 * cfg.n_layers  # QK^T and PV
    assert _calls(prof, "aten::bmm", "backward") == 4 * cfg.n_layers


def test_shares_sum_to_one_per_phase_and_tables_render(naive):
    cfg, _, prof = naive
    by_phase = {}
    for s in prof.classes():
        by_phase.setdefault(s.phase, []).append(s)
    assert list(by_phase) == ["forward", "backward", "optimizer", "all"]
    for shares in by_phase.values():
        assert [s.op_class for s in shares] == list(profiler.CLASSES)
        assert sum(s.share for s in shares) == pytest.approx(1.0)
    total = sum(r.self_s for r in prof.ops())
    assert sum(s.self_s for s in by_phase["all"]) == pytest.approx(total)
    table = prof.class_table(flops_by_class.class_flops(cfg, BATCH, SEQ, training=True))
    assert table.header[-1] == "FLOPs" and {r[0] for r in table.rows} >= {"matmul", "optimizer"}
    assert len(prof.op_table(top=5).rows) == 5
    with pytest.raises(ValueError, match="not classes"):
        prof.class_table({"matmuls": 1})


def test_sdpa_is_one_attention_op():
    _, _, prof = _profile("sdpa")
    attention = {r.name for r in prof.ops() if r.op_class == "attention"}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in attention
    assert _calls(prof, "aten::bmm", "forward") == 0


def test_ops_outside_phases_and_without_a_model():
    x = torch.ones(8, 8, requires_grad=True)
    with profiler.Profile(device="cpu") as prof:
        torch.nn.functional.layer_norm(x @ x, (8,)).sum().backward()
    assert {r.phase for r in prof.ops()} == {profiler.NO_PHASE}
    assert [p.phase for p in prof.phases()] == [profiler.NO_PHASE] and prof.phase_spans() == []
    assert _classes(prof, "aten::mm", profiler.NO_PHASE) == {"matmul"}
    assert _classes(prof, "aten::native_layer_norm", profiler.NO_PHASE) == {"normalization"}
    backward = _classes(prof, "aten::native_layer_norm_backward", profiler.NO_PHASE)
    assert backward == {"normalization"}


def test_where_names_module_node_and_phase(naive):
    _, _, prof = naive
    by_id = prof._results().by_id
    mean_node = next(e for e in by_id.values() if e.name == "MeanBackward1")
    w = prof.where(mean_node.id)
    assert w.phase == "backward" and w.node == "MeanBackward1" and w.module_type == "RMSNorm"
    assert re.fullmatch(r"blocks\.\d\.(attn|ffn)_norm|final_norm", w.module)
    assert prof.where(-1) is None


def test_shares_of_a_sum():
    assert profiler.shares({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}
    assert profiler.shares({"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}


def test_module_ranges_remove_their_hooks():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    with profiler.module_ranges(model) as names:
        assert names["module::0 (Linear)"] == ("0", "Linear")
        assert names["module::model (Sequential)"] == ("model", "Sequential")
        assert all(m._forward_pre_hooks for m in model.modules())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="device"):
        profiler.Profile(device="tpu")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        profiler.Profile(device="cpu", model="gpt")
    with pytest.raises(ValueError, match="record_memory"):
        profiler.Profile(device="cpu", record_memory="yes")
    with pytest.raises(TypeError, match="fn must be callable"):
        overhead.profiler_overhead(3)
    prof = profiler.Profile(device="cpu")
    with pytest.raises(RuntimeError, match="inside the `with Profile"):
        with prof.phase("forward"):
            pass
    with prof:
        with pytest.raises(RuntimeError, match="after the `with Profile"):
            prof.ops()
        with pytest.raises(TypeError, match="non-empty string"):
            with prof.phase(""):
                pass
        with prof.phase("a"), pytest.raises(ValueError, match="do not nest"):
            with prof.phase("b"):
                pass
    with pytest.raises(RuntimeError, match="records once"), prof:
        pass
    with pytest.raises(ValueError, match="top"):
        prof.op_table(top=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            profiler.Profile(device="cuda")


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_gpu_kernels_are_classified_by_phase():
    cfg, model, optimizer, tokens = _setup("sdpa")
    model, tokens = model.cuda(), tokens.cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    _step(model, optimizer, tokens)
    with profiler.Profile(device="cuda", model=model) as prof:
        _step(model, optimizer, tokens, prof)
    rows = prof.ops()
    assert {r.phase for r in rows} == {"forward", "backward", "optimizer"}
    assert {r.op_class for r in rows} >= {"matmul", "attention", "normalization", "optimizer"}
    assert not any(r.name.startswith(("phase::", "module::")) for r in rows)
    for p in prof.phases():
        assert 0 < p.op_s <= p.wall_s
