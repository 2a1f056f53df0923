"""Row-tile pruning for the row kernels (`mlsys.kernels.row_tiles`): the kept configs are sane for
every shape, and the interpreter keeps one."""

import pytest
from kernel_cases import needs_triton

from mlsys.kernels import row_tiles
from mlsys.kernels.row_tiles import default_row_tile, keep_row_tiles, row_tile_configs


@needs_triton
@pytest.mark.parametrize("n_rows", [1, 3, 1000, 100_000])
@pytest.mark.parametrize("block_n", [1, 64, 1024, 4096, 65536])
def test_row_tile_pruning_keeps_sane_tiles(monkeypatch, n_rows, block_n):
    monkeypatch.setattr(row_tiles, "INTERPRETED", False)
    kept = keep_row_tiles(row_tile_configs(), n_rows, block_n)
    assert kept, "pruning must leave at least one config"
    fallback = default_row_tile(n_rows, block_n)
    for config in kept:
        m, w = config.kwargs["BLOCK_M"], config.num_warps
        assert m <= max(1, 2 ** (n_rows - 1).bit_length())
        assert m == 1 or m * block_n <= row_tiles.MAX_TILE_ELEMENTS
        low, high = row_tiles.ROW_VALUES_PER_THREAD
        assert low <= m * block_n // (32 * w) <= high or (m, w) == fallback
    block_m, warps = default_row_tile(n_rows, block_n)
    tile = block_m * block_n
    assert tile <= max(block_n, 4096)
    # as many rows as fit in ~4096 elements, unless the rows or the BLOCK_M range run out first
    assert 2 * tile > 4096 or block_m >= n_rows or block_m == row_tiles.ROW_BLOCK_M[-1]
    # 16 to 32 elements per thread, unless num_warps hits its range
    assert 16 <= tile / (32 * warps) < 32 or warps in (1, row_tiles.ROW_NUM_WARPS[-1])


@needs_triton
def test_interpreted_pruning_keeps_one_config(monkeypatch):
    monkeypatch.setattr(row_tiles, "INTERPRETED", True)
    kept = keep_row_tiles(row_tile_configs(), 1823, 1024)
    assert len(kept) == 1
    assert kept[0].kwargs["BLOCK_M"] == default_row_tile(1823, 1024)[0] == 64
