"""Occupancy against the CUDA Occupancy Calculator's arithmetic, and its argument checks."""

import pytest

from mlsys import hardware
from mlsys.accounting import occupancy


def test_register_allocation_rounds_each_warp_up_to_256():
    assert occupancy.registers_per_warp(32) == 1024
    assert occupancy.registers_per_warp(36) == 1280  # 36 x 32 = 1152 -> 5 units of 256
    assert occupancy.registers_per_warp(255) == 8192
    assert occupancy.registers_per_warp(0) == 0


def test_the_calculators_classic_case_64_registers_256_threads_is_half_an_sm():
    # CUDA Occupancy Calculator, cc 8.0: 256 threads, 64 registers, no shared memory:
    # 2,048 registers a warp, 16,384 a block, 4 blocks = 32 of 64 warps.
    o = occupancy.occupancy(64, 0, 8, "sm_80")
    assert (o.blocks_per_sm, o.warps_per_sm, o.fraction, o.limiter) == (4, 32, 0.5, "registers")


def test_each_resource_can_be_the_limit():
    # 8 blocks by warps, 16 by registers
    assert occupancy.occupancy(16, 0, 8, "sm_90").limiter == "warps"
    assert occupancy.occupancy(32, 0, 8, "sm_90").limiter == "registers"  # a tie names registers
    assert occupancy.occupancy(16, 0, 1, "sm_90").limiter == "blocks"  # 32 one-warp blocks
    o = occupancy.occupancy(64, 100 * 1024, 4, "sm_90")  # (100 + 1) KiB a block of 228 KiB
    assert (o.blocks_per_sm, o.limiter) == (2, "shared")
    o = occupancy.occupancy(64, 48 * 1024, 4, "sm_80")  # 49 KiB of 164 KiB
    assert (o.blocks_per_sm, o.limiter) == (3, "shared")
    assert occupancy.occupancy(32, 0, 4, "sm_89").warps_per_sm == 48  # Ada holds 48 warps


def test_a_block_past_an_sm_cannot_launch():
    sm90 = hardware.sm_architecture("sm_90")
    assert occupancy.occupancy(64, sm90.shared_per_block_bytes, 4, "sm_90").blocks_per_sm == 1
    assert occupancy.occupancy(64, sm90.shared_per_block_bytes + 1, 4, "sm_90").blocks_per_sm == 0
    assert occupancy.occupancy(256, 0, 4, "sm_90").blocks_per_sm == 0  # 255 registers at most
    assert occupancy.block_shared_bytes(1, "sm_90") == 1152  # 1 + 1024 reserved, in 128-byte units


def test_bad_input_is_refused_with_the_rule():
    with pytest.raises(ValueError, match="num_warps=128 is more than an sm_80 SM holds"):
        occupancy.occupancy(32, 0, 128, "sm_80")
    with pytest.raises(ValueError, match="name='sm_70' is not one of"):
        occupancy.occupancy(32, 0, 4, "sm_70")
    with pytest.raises(ValueError, match="regs_per_thread must be an integer >= 0"):
        occupancy.occupancy(-1, 0, 4)
    with pytest.raises(TypeError, match="shared_bytes must be an integer"):
        occupancy.occupancy(32, 1.5, 4)
