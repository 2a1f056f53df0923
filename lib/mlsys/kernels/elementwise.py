"""A fused elementwise chain: apply one unary op k times to every element, in registers.

Eager PyTorch runs `x.cos().cos()` as two kernels: each reads its input from memory and writes its
output back, so a chain of k ops moves k reads + k writes (`eager_chain_bytes`). Fused, the chain
reads once and writes once (`repeat_unary_bytes`) whatever k is, while the arithmetic grows with k
(`repeat_unary_flops`). Sweeping k walks one kernel along the roofline: memory-bound for small k,
compute-bound once 2k FLOP per element outweigh the bytes.

Ops: "fma" is y = y*a + b with `a`, `b` passed at run time so the compiler cannot fold the chain
(one fused multiply-add = 2 FLOP per element per step); "cos" is y = cos(y), a special-function
evaluation of many instructions, counted as one "op" per element per step (not a FLOP count).
The cost models live in `mlsys.accounting` (flops: `repeat_unary_flops`; bytes:
`fused_chain_traffic`, `eager_chain_traffic`); the functions here delegate to them.

Naive (eager) cost for n elements of s bytes: read k*n*s, write k*n*s. Fused: read n*s, write n*s.
References: Triton tutorial 01 (vector add),
https://triton-lang.org/main/getting-started/tutorials/ ; Williams, Waterman, Patterson,
"Roofline" (CACM 2009). Used in: §sec-bytes.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.kernels._triton import check_input, check_tensor, require_triton, tl, triton

OPS = tuple(flops.UNARY_CHAIN_OPS_PER_STEP)
"""The chain's ops, "fma" and "cos"; their cost per step is in `mlsys.accounting.flops`."""
FMA_SCALE = 0.75
"""`a` in y = y*a + b: |a| < 1 keeps the chain bounded (it converges to b / (1 - a) = 1)."""
FMA_SHIFT = 0.25
"""`b` in y = y*a + b."""


def repeat_unary_ref(x: Float[Tensor, "..."], k: int, op: str = "fma") -> Float[Tensor, "..."]:
    """Eager reference: k separate torch ops, so k round trips through memory, in `x`'s dtype.

    Pass `x.double()` for the float64 oracle. Each fma step is one op (`torch.add(b, y, alpha=a)`,
    `b` a 0-d CPU tensor that reaches the kernel as a scalar argument, not as memory traffic).
    """
    check_tensor(x, "x")
    checks.nonnegative_int(k, "k")
    checks.choice(op, "op", OPS)
    y = x.clone() if k == 0 else x
    shift = torch.tensor(FMA_SHIFT)
    for _ in range(k):
        y = torch.add(shift, y, alpha=FMA_SCALE) if op == "fma" else torch.cos(y)
    return y


def repeat_unary_flops(n_elements: int, k: int, op: str = "fma") -> int:
    """Arithmetic of the chain (fma 2k FLOPs, cos k ops per element): `flops.repeat_unary_flops`."""
    return flops.repeat_unary_flops(n_elements, k, op)


def repeat_unary_bytes(n_elements: int, dtype: object) -> int:
    """Bytes the fused kernel moves (read once, write once, any k): `bytes.fused_chain_traffic`."""
    return bytes_moved.fused_chain_traffic(n_elements, dtype).total_bytes


def eager_chain_bytes(n_elements: int, dtype: object, k: int) -> int:
    """Bytes the eager chain of k ops moves (k reads + k writes): `bytes.eager_chain_traffic`."""
    return bytes_moved.eager_chain_traffic(n_elements, dtype, k).total_bytes


BLOCK = 1024
"""Elements per program: with 4 warps, 8 per thread (two 16-byte loads of fp32)."""
NUM_WARPS = 4


@triton.jit
def _repeat_unary_kernel(x_ptr, y_ptr, n_elements, a, b, K: tl.constexpr, OP: tl.constexpr,
                         BLOCK: tl.constexpr):
    # one program per BLOCK contiguous elements; 64-bit offsets so n_elements may exceed 2**31
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    # load once, convert to fp32 at once
    y = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # compute: K steps in registers, unrolled at compile time; no memory traffic in between
    for _ in tl.static_range(K):
        if OP == "fma":
            y = y * a + b
        else:
            y = tl.cos(y)
    # store once, in the output's dtype
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def repeat_unary(x: Float[Tensor, "..."], k: int, op: str = "fma") -> Float[Tensor, "..."]:
    """Apply `op` k times to every element of `x` in one fused Triton kernel (k = 0 is a copy).

    Any shape, contiguous, fp16/bf16/fp32, on CUDA (or CPU under the interpreter); fp32 arithmetic
    inside, output in `x`'s dtype and shape. Cost: `repeat_unary_bytes`, `repeat_unary_flops`.
    """
    require_triton("repeat_unary")
    checks.nonnegative_int(k, "k")
    checks.choice(op, "op", OPS)
    check_input(x, "x", min_ndim=0)
    y = torch.empty_like(x)
    args, consts = _launch_args(x, y, k, op)
    _repeat_unary_kernel[(triton.cdiv(x.numel(), BLOCK),)](*args, **consts, num_warps=NUM_WARPS)
    return y


def _launch_args(x: Tensor, y: Tensor, k: int, op: str) -> tuple[tuple, dict]:
    return (x, y, x.numel(), FMA_SCALE, FMA_SHIFT), {"K": k, "OP": op, "BLOCK": BLOCK}


AOT_KERNELS = {"repeat_unary": "_repeat_unary_kernel"}
"""The kernel compiled ahead of time (`mlsys.kernels.aot`), by name: the module's attribute."""


def aot_args(kernel: str, dtype: torch.dtype, *, n_elements: int, k: int,
             op: str) -> tuple[tuple, dict]:
    """(arguments, constexprs) of the chain of `k` `op`s on `n_elements` of `dtype`, as
    `repeat_unary` passes them, on stand-in CPU tensors (only dtype and alignment are read)."""
    x = torch.empty(n_elements, dtype=dtype)
    return _launch_args(x, torch.empty_like(x), k, op)
