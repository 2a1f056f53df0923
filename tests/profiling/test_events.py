"""The profile's events read once (`mlsys.profiling.events`): on a GPU, kernel rows take the class
and phase of the op that launched them, unless a rule of their own names their class."""

from types import SimpleNamespace

import pytest

from mlsys.profiling import events


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
    norm = events.Where("forward", "blocks.0.attn_norm", "RMSNorm", None, False)
    where = {id(mul): norm,
             id(mm): events.Where("backward", "lm_head", "Linear", "MmBackward0", False),
             id(copy): norm, id(rng): events.Where("forward", None, None, None, False)}
    rows = events.op_rows([mul, mm, copy, rng], lambda e: where[id(e)], kernels=True)
    got = {(r.name, r.op_class, r.phase, r.calls): r.self_s for r in rows}
    assert got == {("ampere_sgemm_128x64_tn", "matmul", "backward", 2): pytest.approx(200e-6),
                   ("vectorized_elementwise_kernel<MulFunctor>", "normalization", "forward", 1):
                       pytest.approx(30e-6),
                   ("direct_copy_kernel_cuda", "copy/cast", "forward", 1): pytest.approx(5e-6)}
