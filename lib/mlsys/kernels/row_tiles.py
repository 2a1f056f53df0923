"""The row kernels' tiles: the autotune space, its pruning per shape, the interpreter's choice.

The row-wise kernels (`mlsys.kernels.softmax`, `mlsys.kernels.rmsnorm`) process BLOCK_M rows of
BLOCK_N columns per program. On a GPU, `row_autotune` times the tiles of `row_tile_configs` kept
by `keep_row_tiles` for the shape at hand (elements per thread in range, tile size bounded, none
the compile report removed: `mlsys.kernels.tile_space`); under the interpreter nothing is tuned
and `default_row_tile` picks one. Used in: the row kernels, `mlsys.kernels.compile_report`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from mlsys import checks, dtypes
from mlsys.kernels import tile_space
from mlsys.kernels._triton import HAS_TRITON, INTERPRETED, triton

ROW_BLOCK_M: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""Rows per program tried by the row-wise kernels (softmax, RMSNorm); short rows share a program."""
ROW_NUM_WARPS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
ROW_VALUES_PER_THREAD = (4, 32)
"""The range of a row tile's elements per thread that the autotuner tries (both ends included)."""
MAX_TILE_ELEMENTS = 16384
"""Largest multi-row tile (rows x padded columns); one row may be longer (the module's limit)."""


def row_tile_configs() -> list[Any]:
    """Autotune space of the row-wise kernels: BLOCK_M (rows per program) x num_warps."""
    return [triton.Config({"BLOCK_M": m}, num_warps=w) for m in ROW_BLOCK_M for w in ROW_NUM_WARPS]


def default_row_tile(n_rows: int, block_n: int, *, compiled: bool | None = None) -> tuple[int, int]:
    """(BLOCK_M, num_warps) without tuning: a tile of ~4096 elements (or one row), ~16 per thread.

    Interpreted, tiles grow to ~65536 elements: the interpreter's cost is mostly per program.
    `compiled` picks the rule (default: compiled unless this process interprets).
    """
    checks.positive_ints(n_rows=n_rows, block_n=block_n)
    compiled = not INTERPRETED if compiled is None else compiled
    target = 4096 if compiled else 65536
    block_m = max(1, min(ROW_BLOCK_M[-1], target // block_n, triton.next_power_of_2(n_rows)))
    warps = max(1, (block_m * block_n) // (32 * 16))
    return block_m, min(ROW_NUM_WARPS[-1], 1 << (warps.bit_length() - 1))


def keep_row_tiles(configs: list[Any], n_rows: int, block_n: int, *,
                   compiled: bool | None = None, kernel: str | None = None,
                   dtype: str | None = None, target: str | None = None) -> list[Any]:
    """Prune the row-tile space for one shape; interpreted, keep only `default_row_tile`.

    Kept: BLOCK_M no larger than the rows present, multi-row tiles of at most MAX_TILE_ELEMENTS,
    `ROW_VALUES_PER_THREAD` elements per thread (fewer wastes threads; with Triton 3.7.1, one in
    six tiles of 64 a thread spilled on sm_80/sm_90, and they left the search space), and, given
    `kernel` ("softmax.fwd"), `dtype` and `target`, none that the compile report removed
    (`tile_space.removed`: spills). `compiled` picks the rule (default: compiled unless this
    process interprets). If nothing is left, the default tile.
    """
    compiled = not INTERPRETED if compiled is None else compiled
    block_m, warps = default_row_tile(n_rows, block_n, compiled=compiled)
    fallback = [triton.Config({"BLOCK_M": block_m}, num_warps=warps)]
    if not compiled:  # the interpreter would run every config on the CPU
        return fallback
    gone = {} if kernel is None else tile_space.removed(kernel, dtype, target, n_cols=block_n)
    kept = []
    for config in configs:
        m, w = config.kwargs["BLOCK_M"], config.num_warps
        tile = m * block_n
        if m > triton.next_power_of_2(n_rows) or (m > 1 and tile > MAX_TILE_ELEMENTS):
            continue
        if tile_space.tile_key(config.kwargs, w, config.num_stages) in gone:
            continue
        if ROW_VALUES_PER_THREAD[0] <= tile // (32 * w) <= ROW_VALUES_PER_THREAD[1]:
            kept.append(config)
    return kept or fallback


def _keep_for_shape(configs, named_args, kernel: str, **kwargs):
    x = next(v for v in named_args.values() if isinstance(v, torch.Tensor))
    return keep_row_tiles(configs, named_args["n_rows"], named_args["BLOCK_N"], kernel=kernel,
                          dtype=dtypes.canonical(x.dtype),
                          target=tile_space.device_target(x.device))


class _InterpretedRowKernel:
    """A row kernel launched with `default_row_tile`, not through the autotuner (interpreter only).

    Triton 3.6 and 3.7's autotuner asks the GPU driver for a benchmarker even when pruning leaves a
    single config, which fails in the interpreter ("0 active drivers"); the tile is chosen here.
    """

    def __init__(self, fn: Any):
        self.fn = fn

    def __getitem__(self, grid: Any):
        def launch(*args: Any, **kwargs: Any) -> Any:
            named = {**dict(zip(self.fn.arg_names, args, strict=False)), **kwargs}
            block_m, warps = default_row_tile(named["n_rows"], named["BLOCK_N"])
            launch_grid = grid({**named, "BLOCK_M": block_m}) if callable(grid) else grid
            return self.fn[launch_grid](*args, BLOCK_M=block_m, num_warps=warps, **kwargs)

        return launch


def row_autotune(kernel: str) -> Any:
    """Decorator: autotune the row kernel called `kernel` ("softmax.fwd"; arguments `n_rows`,
    `n_cols`, `BLOCK_N`, `BLOCK_M`) over `row_tile_configs()`.

    Keyed on n_cols and pruned per shape by `keep_row_tiles`, which drops the tiles the compile
    report removed for this kernel. Interpreted, there is nothing to tune: the launch uses
    `default_row_tile` directly (see `_InterpretedRowKernel`).
    """

    def wrap(fn: Any) -> Any:
        if not HAS_TRITON:
            return fn
        if INTERPRETED:
            return _InterpretedRowKernel(fn)
        return triton.autotune(
            configs=row_tile_configs(),
            key=["n_cols"],
            prune_configs_by={"early_config_prune": functools.partial(_keep_for_shape,
                                                                      kernel=kernel)},
        )(fn)

    return wrap
