"""mlsys.profiling: one training step of the debug model, classified op by op; the class rules on
aten, autograd and GPU kernel names; FLOPs by class; the profiler's overhead; argument checks."""

import contextlib
import os
import re
from types import SimpleNamespace

import pytest
import torch

from mlsys import profiling as P
from mlsys.accounting import flops
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
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
    with P.Profile(device="cpu", model=model) as prof:
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
    assert {r.op_class for r in rows} <= set(P.CLASSES)
    assert not {r.op_class for r in rows} & {"communication", "attention"}  # one process, naive
    for r in rows:
        if r.op_class == "other":  # the embedding, nll_loss, the token check, and their helpers
            assert P.name_class(r.name) == "other" or GENERIC.search(r.name), r
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
        assert [s.op_class for s in shares] == list(P.CLASSES)
        assert sum(s.share for s in shares) == pytest.approx(1.0)
    total = sum(r.self_s for r in prof.ops())
    assert sum(s.self_s for s in by_phase["all"]) == pytest.approx(total)
    table = prof.class_table(P.class_flops(cfg, BATCH, SEQ, training=True))
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
    with P.Profile(device="cpu") as prof:
        torch.nn.functional.layer_norm(x @ x, (8,)).sum().backward()
    assert {r.phase for r in prof.ops()} == {P.NO_PHASE}
    assert [p.phase for p in prof.phases()] == [P.NO_PHASE] and prof.phase_spans() == []
    assert _classes(prof, "aten::mm", P.NO_PHASE) == {"matmul"}
    assert _classes(prof, "aten::native_layer_norm", P.NO_PHASE) == {"normalization"}
    assert _classes(prof, "aten::native_layer_norm_backward", P.NO_PHASE) == {"normalization"}


def test_where_names_module_node_and_phase(naive):
    _, _, prof = naive
    by_id = prof._results().by_id
    mean_node = next(e for e in by_id.values() if e.name == "MeanBackward1")
    w = prof.where(mean_node.id)
    assert w.phase == "backward" and w.node == "MeanBackward1" and w.module_type == "RMSNorm"
    assert re.fullmatch(r"blocks\.\d\.(attn|ffn)_norm|final_norm", w.module)
    assert prof.where(-1) is None


@pytest.mark.parametrize("name, cls", [
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)", "matmul"),
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopB_TNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float>", "matmul"),
    ("aten::addmm", "matmul"), ("AddmmBackward0", "matmul"), ("aten::linear", "matmul"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    ("aten::_scaled_dot_product_efficient_attention", "attention"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false>", "softmax"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "softmax"),
    ("LogSoftmaxBackward0", "softmax"), ("_softmax_fwd_kernel", "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>",
     "normalization"),
    ("_rmsnorm_fwd_kernel", "normalization"), ("RsqrtBackward0", "normalization"),
    ("void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>", "copy/cast"),
    ("Memcpy HtoD (Pageable -> Device)", "copy/cast"), ("aten::to", "copy/cast"),
    ("ToCopyBackward0", "copy/cast"), ("aten::cat", "copy/cast"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>",
     "optimizer"),
    ("aten::_foreach_mul_", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "communication"),
    ("c10d::allreduce_", "communication"), ("reduce_scatter_tensor", "communication"),
    ("void at::native::indexSelectLargeIndex<float, long>", "other"),
    ("aten::embedding_dense_backward", "other"), ("NllLossBackward0", "other"),
])
def test_name_rules(name, cls):
    assert P.name_class(name) == cls


@pytest.mark.parametrize("name", [
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
    "float, at::native::binary_internal::MulFunctor<float>>, std::array<char *, 3ul>>(int, T2, T3)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "aten::mul", "aten::silu", "MulBackward0", "aten::masked_fill", "aten::view",
])
def test_generic_names_have_no_rule(name):
    assert P.name_class(name) is None


def test_classify_precedence():
    assert P.classify("aten::mul") == P.DEFAULT_CLASS == "elementwise"
    assert P.classify("aten::mul", module="RMSNorm") == "normalization"
    assert P.classify("aten::view", module="Linear") == "matmul"
    assert P.classify("aten::mm", module="RMSNorm") == "matmul"  # the name wins over the module
    assert P.classify("aten::t", node="MmBackward0", module="RMSNorm") == "matmul"
    assert P.classify("aten::mul", optimizer=True) == "optimizer"
    assert P.classify("aten::copy_", optimizer=True) == "optimizer"
    assert P.classify("c10d::allreduce_", optimizer=True) == "communication"
    assert P.classify("some_kernel", fallback="normalization") == "normalization"


def test_kernel_rows_take_the_launching_ops_class_and_phase():
    """The GPU path of the rows, on events shaped like torch's: kernels with their own rule keep
    it, the others take the class of the op that launched them; a range's GPU copy is dropped."""
    kernel = SimpleNamespace

    def event(name, kernels, user=False):
        return SimpleNamespace(name=name, kernels=kernels, is_user_annotation=user,
                               self_cpu_time_total=1.0)

    mul = event("aten::mul", [kernel(name="vectorized_elementwise_kernel<MulFunctor>",
                                     duration=30.0)])
    mm = event("aten::mm", [kernel(name="ampere_sgemm_128x64_tn", duration=100.0)] * 2)
    copy = event("aten::copy_", [kernel(name="direct_copy_kernel_cuda", duration=5.0)])
    rng = event("phase::forward", [kernel(name="phase::forward", duration=999.0)], user=True)
    norm = P.Where("forward", "blocks.0.attn_norm", "RMSNorm", None, False)
    where = {id(mul): norm, id(mm): P.Where("backward", "lm_head", "Linear", "MmBackward0", False),
             id(copy): norm, id(rng): P.Where("forward", None, None, None, False)}
    rows = P._rows([mul, mm, copy, rng], lambda e: where[id(e)], kernels=True)
    got = {(r.name, r.op_class, r.phase, r.calls): r.self_s for r in rows}
    assert got == {("ampere_sgemm_128x64_tn", "matmul", "backward", 2): pytest.approx(200e-6),
                   ("vectorized_elementwise_kernel<MulFunctor>", "normalization", "forward", 1):
                       pytest.approx(30e-6),
                   ("direct_copy_kernel_cuda", "copy/cast", "forward", 1): pytest.approx(5e-6)}


def test_class_flops_partition_the_accounting():
    for attention in ("naive", "sdpa"):
        cfg = TransformerConfig.preset("small", attention=attention)
        got = P.class_flops(cfg, 4, 512)
        assert set(got) == set(P.CLASSES)
        loss = flops.softmax_flops(4 * 512, cfg.vocab_size)
        assert sum(got.values()) == flops.transformer_flops(cfg, 4, 512).forward_flops + loss
        assert P.class_flops(cfg, 4, 512, training=True) == {k: 3 * v for k, v in got.items()}
        assert got["optimizer"] == got["copy/cast"] == got["communication"] == 0
    naive, sdpa = (P.class_flops(TransformerConfig.preset("small", attention=a), 4, 512)
                   for a in ("naive", "sdpa"))
    assert naive["attention"] == 0 and sdpa["softmax"] == loss  # the loss's log-softmax only
    moved = naive["softmax"] - loss + (naive["matmul"] - sdpa["matmul"])
    assert sdpa["attention"] == moved + (naive["elementwise"] - sdpa["elementwise"])
    assert P.shares(naive)["normalization"] < 0.005  # He's "a fraction of a percent of FLOPs"
    assert P.class_flops(cfg, 4, 512, attention="naive") == naive
    assert P.shares({"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}


def test_module_ranges_remove_their_hooks():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    with P.module_ranges(model) as names:
        assert names["module::0 (Linear)"] == ("0", "Linear")
        assert names["module::model (Sequential)"] == ("model", "Sequential")
        assert all(m._forward_pre_hooks for m in model.modules())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_kineto_level_is_restored_and_overhead_is_measured():
    before = os.environ.get("KINETO_LOG_LEVEL")
    x = torch.ones(64, 64)
    overhead = P.profiler_overhead(lambda: x @ x, device="cpu", warmup=1, repeats=3, rounds=2)
    assert len(overhead.plain.samples_s) == len(overhead.profiled.samples_s) == 6
    assert overhead.ratio == overhead.profiled.median_s / overhead.plain.median_s > 0
    assert os.environ.get("KINETO_LOG_LEVEL") == before


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="device"):
        P.Profile(device="tpu")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        P.Profile(device="cpu", model="gpt")
    with pytest.raises(ValueError, match="record_memory"):
        P.Profile(device="cpu", record_memory="yes")
    with pytest.raises(ValueError, match="attention"):
        P.class_flops(TransformerConfig(), 1, 8, attention="flash")
    with pytest.raises(ValueError, match="training"):
        P.class_flops(TransformerConfig(), 1, 8, training="yes")
    with pytest.raises(TypeError, match="fn must be callable"):
        P.profiler_overhead(3)
    prof = P.Profile(device="cpu")
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
            P.Profile(device="cuda")


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_gpu_kernels_are_classified_by_phase():
    cfg, model, optimizer, tokens = _setup("sdpa")
    model, tokens = model.cuda(), tokens.cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    _step(model, optimizer, tokens)
    with P.Profile(device="cuda", model=model) as prof:
        _step(model, optimizer, tokens, prof)
    rows = prof.ops()
    assert {r.phase for r in rows} == {"forward", "backward", "optimizer"}
    assert {r.op_class for r in rows} >= {"matmul", "attention", "normalization", "optimizer"}
    assert not any(r.name.startswith(("phase::", "module::")) for r in rows)
    for p in prof.phases():
        assert 0 < p.op_s <= p.wall_s
