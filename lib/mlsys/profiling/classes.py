"""The class of an operation: which of `CLASSES` an aten op, autograd node or GPU kernel is.

Classes follow what an op computes, decided in this order (`classify`):
1. a name rule of `NAME_RULES` on the op or kernel, then on the autograd node it ran in (every op
   a node runs is the node's, the add summing gradients that reach it included); communication
   always wins, and inside the optimizer's `step` and `zero_grad` the rest is "optimizer";
2. else the innermost module that ran it (`MODULE_RULES`: a norm, a linear layer, an embedding),
   in the backward through the autograd node's sequence number, which names its forward op;
3. else "elementwise" (pointwise ops, reductions, views: RoPE, SwiGLU's gate, residual adds).
Written-out attention is split into its matmuls, softmax and elementwise ops; "attention" is a
fused kernel (SDPA, FlashAttention). The classes themselves are the cost models' too
(`mlsys.accounting.flops_by_class`), so FLOP shares and time shares line up.
Used in: `mlsys.profiling.profiler`, §sec-profiling (chapter 05).
"""

from __future__ import annotations

import re

from mlsys.accounting.flops_by_class import CLASSES

__all__ = ["CLASSES", "DEFAULT_CLASS", "MODULE_RULES", "NAME_RULES", "classify", "name_class"]

NAME_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"),
    ("attention", r"scaled_dot_product|flash|efficient_attention|fmha|attention|_attn|sdpa"),
    ("optimizer", r"_foreach_|_fused_adam|_fused_sgd|multi_tensor_apply"),
    ("softmax", r"softmax"),  # also log_softmax (the loss), softmax_warp_*, cunn_SoftMax*
    ("matmul", r"gemm|gemv|matmul|nvjet|xmma|splitkreduce|cublas|addmm|mmbackward"
               r"|\b(aten::)?(mm|bmm|mv|dot|linear|baddbmm|_scaled_mm)\b"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|rsqrt|gammabeta"
                      r"|rowwisemoments"),  # rsqrt appears in a transformer only inside norms
    ("copy/cast", r"copy|clone|contiguous|memcpy|memset|catarray|aten::(to|cat|stack)\b"),
    ("other", r"embedding|index_select|index_add|gather|scatter|nll_?loss|aminmax"
              r"|_local_scalar_dense|indexselect"),  # lookups, the loss's pick, the token check
)
"""(class, regex searched case-insensitively): aten ops, autograd nodes and GPU kernel names."""
MODULE_RULES: tuple[tuple[str, str], ...] = (
    ("normalization", r"Norm"), ("matmul", r"Linear"), ("other", r"Embedding"))
"""(class, regex on the module's type name) for ops no name rule claims."""
DEFAULT_CLASS = "elementwise"
_COMPILED = [(cls, re.compile(rx, re.IGNORECASE)) for cls, rx in NAME_RULES]


def name_class(name: str) -> str | None:
    """The class of the first `NAME_RULES` entry matching `name`, or None."""
    return next((cls for cls, rx in _COMPILED if rx.search(name)), None)


def classify(name: str, *, node: str | None = None, module: str | None = None,
             optimizer: bool = False, fallback: str = DEFAULT_CLASS) -> str:
    """The class of op (or kernel) `name`. `node`: the autograd node it ran in; `module`: the
    type name of the module it ran in; `optimizer`: inside the optimizer's `step` or `zero_grad`.
    Precedence: the module docstring."""
    rule = name_class(name)
    if rule == "communication":
        return rule
    if optimizer:
        return "optimizer"
    rule = rule or (name_class(node) if node else None)
    if rule is None and module:
        rule = next((c for c, rx in MODULE_RULES if re.search(rx, module)), None)
    return rule or fallback
