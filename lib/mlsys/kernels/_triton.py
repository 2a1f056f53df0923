"""The one place Triton is imported, plus the input checks and tolerances every kernel shares.

Import-time step (the only one in the library, and deliberate): `mlsys.env.setup_triton()` runs
before `import triton`. Without a CUDA device it sets `TRITON_INTERPRET=1`, because Triton reads
that variable when a `@triton.jit` function is defined; kernels then run in Triton's CPU
interpreter (slow, for correctness only). Triton may have been imported before that, in compiled
mode, by anything that imports it early (building a model on the meta device, `torch.compile`,
`torch.utils.flop_counter`): then the `@jit` helpers of `triton.language` (`tl.max`, `tl.sum`, ...)
were defined for the compiler and fail inside an interpreted kernel ("Cannot call @triton.jit'd
outside of the scope of a kernel"). `_interpret_triton_language` re-wraps those helpers for the
interpreter, so the kernels work whatever was imported first.

Where Triton is not installed (macOS, Windows), `triton` and `tl` are stand-ins whose `jit` and
`autotune` decorators let the kernel modules import; every launcher calls `require_triton`, which
raises a clear `RuntimeError` naming the reference to use instead. Nothing falls back silently.

Flags: `HAS_TRITON` (installed and usable), `INTERPRETED` (kernels run in the CPU interpreter).
Used in: §sec-bytes (chapter 04) and every kernel module.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mlsys import checks, env

HAS_TRITON: bool = env.setup_triton()

if HAS_TRITON:
    import triton
    import triton.language as tl
else:  # macOS, Windows (tested in a subprocess that hides Triton)

    def _decorator(*args: Any, **kwargs: Any) -> Any:
        """Stand-in for `triton.jit` and `triton.autotune`: both leave the function as it is."""
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

    triton = types.SimpleNamespace(  # type: ignore[assignment]
        jit=_decorator,
        autotune=_decorator,
        Config=lambda *args, **kwargs: (args, kwargs),
        cdiv=lambda a, b: -(-a // b),
        next_power_of_2=lambda n: 1 << max(0, int(n) - 1).bit_length(),
    )
    tl = types.SimpleNamespace(constexpr=int)  # type: ignore[assignment]

INTERPRETED: bool = HAS_TRITON and env.triton_interpreted()


def _interpret_triton_language() -> int:
    """Re-wrap `triton.language`'s compiled-mode `@jit` helpers for the interpreter; returns how
    many. Needed only when `triton.language` was imported before `TRITON_INTERPRET` was set (see
    the module docstring); idempotent, and a no-op when all was imported in interpreter mode.
    """
    from triton.runtime.interpreter import InterpretedFunction  # Triton may be absent: run only
    from triton.runtime.jit import JITFunction  # where it is present and interpreted

    rewrapped = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if type(value) is JITFunction:
                setattr(module, attr, InterpretedFunction(value.fn))
                rewrapped += 1
    return rewrapped


if INTERPRETED:
    _interpret_triton_language()

KERNEL_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
"""Input dtypes the book's kernels accept; they compute in fp32 and store in the input dtype."""

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    # fp32: fp32 arithmetic against float64; a few ulps of a row reduction, and the GPU's fast exp.
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    # fp16: one rounding of the output is 2**-11 ~ 4.9e-4 relative; room for inputs near zero.
    torch.float16: {"rtol": 2e-3, "atol": 1e-3},
    # bf16: 8 significand bits, one rounding is 2**-8 ~ 3.9e-3 relative (GPU only: `check_input`).
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
}
"""Per-dtype `torch.testing.assert_close` tolerances of a kernel's output against float64."""

ATTENTION_TOLERANCES: dict[torch.dtype, dict[str, dict[str, float]]] = {
    # fp64 (FlashAttentionTorch only): exact algorithm, only the order of the sums differs.
    torch.float64: {"forward": {"rtol": 1e-10, "atol": 1e-10},
                    "grad": {"rtol": 1e-10, "atol": 1e-10}},
    torch.float32: {"forward": TOLERANCES[torch.float32], "grad": TOLERANCES[torch.float32]},
    # 16-bit: dS = P (dP - D) subtracts D = rowsum(dO * O), O rounded to the input dtype (every
    # FlashAttention does this): the gradients' error is a rounding of |dO| |O| |K|, not of dQ
    # itself, up to ~1.3x the kernel tolerance on random inputs (seq <= 40): 2.5x given.
    **{dt: {"forward": TOLERANCES[dt], "grad": {k: 2.5 * t for k, t in TOLERANCES[dt].items()}}
       for dt in (torch.float16, torch.bfloat16)},
}
"""Tolerances of attention (flash_torch, flash_triton) against the float64 reference, per input
dtype: "forward" for O and L, "grad" for dQ, dK and dV."""


def require_triton(op: str) -> None:
    """Raise RuntimeError if kernels cannot run here; `op` names the reference to use instead."""
    if not HAS_TRITON:
        raise RuntimeError(
            f"Triton is not installed (Linux only); use {op}_ref, the plain PyTorch reference, "
            "on this machine"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(x: object, name: str) -> torch.Tensor:
    """`x` must be a floating-point torch.Tensor (TypeError otherwise), on any device: the rule of
    the references. Returns it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def rows_cols(shape: Sequence[int]) -> tuple[int, int]:
    """(rows, cols) = (prod(shape[:-1]), shape[-1]) of a row-wise op over the last dim of `shape`.

    The cost models of the row-wise kernels take a shape; every dim must be a positive int.
    """
    dims = checks.int_sequence(shape, "shape", minimum=1)
    if not dims:
        raise ValueError("shape must have at least one dim (the rows' length), got ()")
    return math.prod(dims[:-1]), dims[-1]


def check_input(
    x: object,
    name: str,
    *,
    dtypes: Iterable[torch.dtype] = KERNEL_DTYPES,
    min_ndim: int = 1,
    contiguous: bool = True,
) -> torch.Tensor:
    """Validate a kernel input before launch; returns it. Errors name the argument and the rule.

    Rules: a torch.Tensor (TypeError); of one of `dtypes`, and not bfloat16 when interpreted
    (TypeError); with at least `min_ndim` dimensions, on a CUDA device (or on the CPU when Triton
    runs interpreted), non-empty and, with `contiguous`, contiguous in memory (ValueError; kernels
    that take every stride pass `contiguous=False`).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    allowed = tuple(dtypes)
    if x.dtype not in allowed:
        names = ", ".join(_dtype_name(d) for d in allowed)
        raise TypeError(f"{name} has dtype {x.dtype}; expected one of {names}")
    if INTERPRETED and x.dtype == torch.bfloat16:
        raise TypeError(
            f"{name} has dtype torch.bfloat16, which Triton's CPU interpreter computes wrongly (it "
            "truncates fp32 -> bf16 and does bf16 arithmetic on bit patterns); use float16 or "
            "float32 here, bfloat16 on a GPU"
        )
    if x.dim() < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}"
        )
    if x.device.type != "cuda" and not (INTERPRETED and x.device.type == "cpu"):
        where = "a CUDA device" + (" or the CPU (Triton interpreter)" if INTERPRETED else "")
        raise ValueError(f"{name} is on {x.device}; Triton kernels here need a tensor on {where}")
    if x.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(x.shape)}); kernels need at least one element"
        )
    if contiguous and not x.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous; call .contiguous() first (strides {x.stride()})"
        )
    return x


def check_same(x: torch.Tensor, name_x: str, other: torch.Tensor, name_other: str) -> None:
    """`other` must share `x`'s dtype and device (ValueError naming both otherwise)."""
    if other.dtype != x.dtype:
        raise ValueError(
            f"{name_other} has dtype {other.dtype} but {name_x} has {x.dtype}; they must match"
        )
    if other.device != x.device:
        raise ValueError(
            f"{name_other} is on {other.device} but {name_x} is on {x.device}; they must match"
        )
