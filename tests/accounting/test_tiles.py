"""Tile resources on paper (`mlsys.accounting.tiles`): the formulas by hand; against the compiler
in tests/kernels/test_compile_report.py."""

import pytest

from mlsys.accounting import tiles


def test_flash_shared_memory_by_hand():
    # forward, d = 64, bf16, BLOCK_M = 128, BLOCK_N = 64, 3 stages: Q held, K and V streamed
    q, kv = 128 * 64 * 2, 2 * 64 * 64 * 2
    assert tiles.flash_smem_bytes("fwd", 128, 64, 64, 2, 3, "sm_90") == q + 3 * kv
    assert tiles.flash_smem_bytes("fwd", 128, 64, 64, 2, 3, "sm_80") == q + 2 * kv
    # dK/dV: K, V held; Q, dO streamed; and L, D (fp32, one per query row) two stages deep
    held, streamed, vectors = 2 * 128 * 128 * 2, 2 * 32 * 128 * 2, 2 * 32 * 4
    assert tiles.flash_smem_bytes("dkdv", 32, 128, 128, 2, 3, "sm_90") == (
        held + 3 * streamed + 2 * vectors)
    assert tiles.pipeline_buffers(2, "sm_89") == 1 and tiles.pipeline_buffers(2, "sm_90") == 2


def test_registers_a_thread_may_have():
    assert [tiles.max_registers_per_thread(w) for w in (1, 4, 8, 16, 32)] == [255, 255, 255,
                                                                             128, 64]


def test_the_register_floor_and_which_tiles_must_spill():
    # dK/dV at d = 128 with 128-key tiles and 4 warps: dK and dV alone are 2 x 128 x 128 fp32
    # over 128 threads = 256 registers, past 255 before anything else: it must spill
    floor = tiles.flash_register_floor("dkdv", 64, 128, 128, 4)
    assert floor.parts == {"accumulators": 256, "scores": 64} and floor.must_spill
    assert not tiles.flash_register_floor("dkdv", 64, 128, 128, 8).must_spill  # 160 of 255
    fwd = tiles.flash_register_floor("fwd", 128, 64, 64, 4)
    assert fwd.total == 128 * 64 // 128 + 128 * 64 // 128 and not fwd.must_spill
    # 16 warps: 128 registers a thread at most; dQ (128 x 128) and P (128 x 128) are 64 + 64
    dq = tiles.flash_register_floor("dq", 128, 128, 128, 16)
    assert (dq.total, dq.limit, dq.must_spill) == (64, 128, False)


def test_bad_input_names_the_rule():
    with pytest.raises(ValueError, match="kernel='bwd' is not one of"):
        tiles.flash_smem_bytes("bwd", 64, 64, 64, 2, 2)
    with pytest.raises(ValueError, match="block_m must be a positive integer, got 0"):
        tiles.flash_register_floor("fwd", 0, 64, 64, 4)
    with pytest.raises(ValueError, match="name='sm_75' is not one of"):
        tiles.flash_smem_bytes("fwd", 64, 64, 64, 2, 2, "sm_75")
