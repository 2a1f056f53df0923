"""FlashAttention-2's tiles: the autotune space, what the compile report removed, the launcher.

Each of the three tiled kernels of `mlsys.kernels.flash_attention` ("fwd", "dkdv", "dq") is
autotuned on a GPU over `tile_configs`, pruned by the compile report (no tile that spills
registers, overflows shared memory or misses the tensor cores: `mlsys.kernels.tile_space`) and by
the device's shared memory (`tile_smem_bytes`). Under the interpreter, autotuning fails (Triton
3.7: "0 active drivers") and `INTERPRETER_TILES` is used. `tiled` wraps a kernel so that one call,
`kernel.launch(grid, tiles, *args, **constexprs)`, does either. Used in:
`mlsys.kernels.flash_attention`, `mlsys.kernels.compile_report`; chapter 06.
"""

from __future__ import annotations

import functools
from typing import Any

from mlsys import dtypes, hardware
from mlsys.accounting import tiles
from mlsys.kernels import tile_space
from mlsys.kernels._triton import HAS_TRITON, INTERPRETED, triton

INTERPRETER_TILES = (32, 32)
"""(BLOCK_M, BLOCK_N) under the CPU interpreter, where nothing is tuned."""
TILES: dict[str, tuple[tuple[int, int], ...]] = {
    "fwd": ((64, 32), (64, 64), (128, 32), (128, 64)),  # (query tile held, key tile streamed)
    "dkdv": ((32, 64), (32, 128), (64, 64), (64, 128)),  # (query tile streamed, key tile held)
    "dq": ((64, 32), (64, 64), (128, 32), (128, 64)),  # (query tile held, key tile streamed)
}
"""(BLOCK_M, BLOCK_N) tried per kernel for 16-bit inputs, each with 4 or 8 warps and 2 or 3
pipeline stages."""
TILES_FP32 = ((16, 32), (32, 16), (32, 32), (32, 64), (64, 32))
"""(BLOCK_M, BLOCK_N) tried for fp32 inputs, each with 8 warps and 1 or 2 stages. The IEEE fp32
dot runs on the FMA units with each thread's slices of both operands in registers, so the 16-bit
space's tiles spill, or leave nothing at head dim 128 (compile report); 8 warps halve each
thread's share. fp32 is the exact path, not the fast one: a small space costs little to tune."""
GPU_FIXED_LAUNCH = {"num_warps": 8, "num_stages": 2}
"""Launch options when tiles are given explicitly on a GPU (no tuning): 8 warps, because 4-warp
programs of the larger tiles spill (compile report)."""


def tile_configs(kernel: str, dtype: str = "bf16") -> list[Any]:
    """The autotune space of one kernel ("fwd", "dkdv", "dq") for inputs of `dtype`."""
    if dtypes.canonical(dtype) == "fp32":
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=8, num_stages=s)
                for m, n in TILES_FP32 for s in (1, 2)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n in TILES[kernel] for w in (4, 8) for s in (2, 3)]


def tile_smem_bytes(kernel: str, block_m: int, block_n: int, head_dim: int, elem_bytes: int,
                    num_stages: int, arch: str = "sm_90") -> int:
    """Shared memory of one program on `arch` (16-bit inputs; fp32 ones use less):
    `mlsys.accounting.tiles.flash_smem_bytes`, checked against the compiler for every tile."""
    return tiles.flash_smem_bytes(kernel, block_m, block_n, head_dim, elem_bytes, num_stages,
                                  arch)


@functools.cache
def _device_smem_bytes(index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def keep_tiles(configs: list[Any], kernel: str, head_dim: int, dtype: str, target: str,
               smem_bytes: int | None = None) -> list[Any]:
    """The configs of `dtype`'s space (`tile_configs`) that the compile report did not remove for
    (kernel, dtype, head_dim, target) and whose `tile_smem_bytes` fit `smem_bytes` (default: the
    target's opt-in maximum per block); if none is left, the one needing the least memory."""
    dtype = dtypes.canonical(dtype)
    limit = smem_bytes or hardware.sm_architecture(target).shared_per_block_bytes
    gone = tile_space.removed(f"flash_attention.{kernel}", dtype, target, head_dim=head_dim)
    space = {tile_space.tile_key(c.kwargs, c.num_warps, c.num_stages)
             for c in tile_configs(kernel, dtype)}
    configs = [c for c in configs
               if tile_space.tile_key(c.kwargs, c.num_warps, c.num_stages) in space]
    if not configs:
        raise ValueError(f"none of the configs is in the {dtype} space of the {kernel} kernel "
                         "(tile_configs(kernel, dtype))")

    def need(c):
        return tile_smem_bytes(kernel, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], head_dim,
                               dtypes.bytes_per_element(dtype), c.num_stages, target)

    kept = [c for c in configs if need(c) <= limit
            and tile_space.tile_key(c.kwargs, c.num_warps, c.num_stages) not in gone]
    return kept or [min(configs, key=need)]


def launchable_tiles(kernel: str, head_dim: int, dtype: str, target: str) -> list[Any]:
    """The tiles the autotuner may time for this kernel, head dim, dtype and target."""
    return keep_tiles(tile_configs(kernel, dtype), kernel, head_dim, dtype, target)


def _prune(configs, named_args, kernel: str, **kwargs):
    q = named_args["q_ptr"]
    return keep_tiles(configs, kernel, kwargs["HEAD_DIM"], dtypes.canonical(q.dtype),
                      tile_space.device_target(q.device),
                      _device_smem_bytes(q.device.index or 0))


class TileKernel:
    """A flash kernel launched as `kernel.launch(grid, tiles, *args, **constexprs)`: autotuned on
    a GPU when `tiles` is None; with the given (BLOCK_M, BLOCK_N) otherwise, and always under the
    interpreter (`INTERPRETER_TILES`), whose autotuner cannot run."""

    def __init__(self, fn: Any, kernel: str):
        self.fn, self.kernel, self.tuned = fn, kernel, None
        if HAS_TRITON and not INTERPRETED:
            self.tuned = triton.autotune(
                configs=tile_configs(kernel) + tile_configs(kernel, "fp32"),
                key=["n_q", "n_k", "HEAD_DIM", "IS_CAUSAL"],
                prune_configs_by={"early_config_prune": functools.partial(_prune, kernel=kernel)},
            )(fn)

    def launch(self, grid: Any, tiles: tuple[int, int] | None, *args: Any, **constexprs: Any):
        if tiles is None and self.tuned is not None:
            return self.tuned[grid](*args, **constexprs)
        block_m, block_n = tiles or INTERPRETER_TILES
        meta = {**constexprs, "BLOCK_M": block_m, "BLOCK_N": block_n}
        options = {} if INTERPRETED else GPU_FIXED_LAUNCH
        return self.fn[grid(meta)](*args, **meta, **options)


def tiled(kernel: str):
    """Decorator: the flash kernel `kernel` ("fwd", "dkdv", "dq") as a `TileKernel`."""
    return lambda fn: TileKernel(fn, kernel)
