"""The classes of operation (`mlsys.profiling.classes`): the rules on aten, autograd and GPU kernel
names, the names no rule claims, and the precedence of name, node, module and optimizer."""

import pytest

from mlsys.profiling import classes


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
    assert classes.name_class(name) == cls


@pytest.mark.parametrize("name", [
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
    "float, at::native::binary_internal::MulFunctor<float>>, std::array<char *, 3ul>>(int, T2, T3)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "aten::mul", "aten::silu", "MulBackward0", "aten::masked_fill", "aten::view",
])
def test_generic_names_have_no_rule(name):
    assert classes.name_class(name) is None


def test_classify_precedence():
    assert classes.classify("aten::mul") == classes.DEFAULT_CLASS == "elementwise"
    assert classes.classify("aten::mul", module="RMSNorm") == "normalization"
    assert classes.classify("aten::view", module="Linear") == "matmul"
    # the name wins over the module
    assert classes.classify("aten::mm", module="RMSNorm") == "matmul"
    assert classes.classify("aten::t", node="MmBackward0", module="RMSNorm") == "matmul"
    assert classes.classify("aten::mul", optimizer=True) == "optimizer"
    assert classes.classify("aten::copy_", optimizer=True) == "optimizer"
    assert classes.classify("c10d::allreduce_", optimizer=True) == "communication"
    assert classes.classify("some_kernel", fallback="normalization") == "normalization"
