"""Occupancy: how many blocks of a kernel one SM can hold at once, from what one block needs.

An SM runs every resident block's warps, switching between them to hide memory latency; the more
warps are resident, the more latency it can hide. Residency is capped four ways, and the smallest
cap wins:

- registers: a warp is given `ceil(regs_per_thread * 32 / 256) * 256` registers (the allocation
  unit), out of 65,536 per SM, so a block of w warps fits `65536 // (w * per_warp)` times;
- shared memory: a block takes its dynamic shared memory plus 1 KiB the system reserves, rounded
  up to 128 bytes, out of the SM's (228 KiB on sm_90, 164 KiB on sm_80);
- warps: at most 64 per SM (48 on sm_89);
- blocks: at most 32 per SM (24 on sm_89).

A block asking for more than one SM gives (registers past 255 per thread, shared memory past the
opt-in maximum) cannot launch at all: 0 blocks. The per-architecture numbers live in
`mlsys.hardware.SM_ARCHITECTURES` with their sources. This is the arithmetic of the CUDA Occupancy
Calculator (and of `cudaOccupancyMaxActiveBlocksPerMultiprocessor`), without its per-kernel
extras (a kernel's own static shared memory is part of `shared_bytes` here).
Used in: chapters 04 and 06 (`mlsys.kernels.compile_report`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsys import checks, hardware

WARP_SIZE = 32


@dataclass(frozen=True)
class Occupancy:
    """Blocks of one kernel resident on one SM, and which resource caps them."""

    arch: str
    blocks_by: dict[str, int]  # cap from each resource: registers, shared, warps, blocks
    blocks_per_sm: int  # the smallest cap
    warps_per_sm: int
    max_warps_per_sm: int

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's maximum (the Occupancy Calculator's "occupancy")."""
        return self.warps_per_sm / self.max_warps_per_sm

    @property
    def limiter(self) -> str:
        """The resource that caps the blocks ("registers", "shared", "warps" or "blocks"); ties
        name the first of those in that order."""
        return min(self.blocks_by, key=lambda k: self.blocks_by[k])


def registers_per_warp(regs_per_thread: int, arch: str = "sm_90") -> int:
    """Registers one warp is given: regs per thread x 32, rounded up to the allocation unit."""
    sm = hardware.sm_architecture(arch)
    checks.nonnegative_int(regs_per_thread, "regs_per_thread")
    unit = sm.register_unit
    return -(-regs_per_thread * WARP_SIZE // unit) * unit


def block_shared_bytes(shared_bytes: int, arch: str = "sm_90") -> int:
    """Shared memory one resident block takes: its own plus the reserved, in allocation units."""
    sm = hardware.sm_architecture(arch)
    checks.nonnegative_int(shared_bytes, "shared_bytes")
    unit = sm.shared_unit_bytes
    return -(-(shared_bytes + sm.shared_reserved_per_block_bytes) // unit) * unit


def occupancy(regs_per_thread: int, shared_bytes: int, num_warps: int,
              arch: str = "sm_90") -> Occupancy:
    """Blocks and warps per SM of a kernel using `regs_per_thread` registers, `shared_bytes` of
    shared memory per block and `num_warps` warps per block, on target `arch` ("sm_80", ...)."""
    sm = hardware.sm_architecture(arch)
    checks.positive_int(num_warps, "num_warps")
    checks.nonnegative_int(regs_per_thread, "regs_per_thread")
    checks.nonnegative_int(shared_bytes, "shared_bytes")
    if num_warps > sm.max_warps_per_sm:
        raise ValueError(f"num_warps={num_warps} is more than an {arch} SM holds "
                         f"({sm.max_warps_per_sm})")
    fits = (regs_per_thread <= sm.max_registers_per_thread
            and shared_bytes <= sm.shared_per_block_bytes)
    per_block_regs = num_warps * registers_per_warp(regs_per_thread, arch)
    blocks_by = {
        "registers": sm.registers_per_sm // per_block_regs if per_block_regs else
        sm.max_blocks_per_sm,
        "shared": sm.shared_per_sm_bytes // block_shared_bytes(shared_bytes, arch),
        "warps": sm.max_warps_per_sm // num_warps,
        "blocks": sm.max_blocks_per_sm,
    }
    blocks = min(blocks_by.values()) if fits else 0
    return Occupancy(arch=arch, blocks_by=blocks_by, blocks_per_sm=blocks,
                     warps_per_sm=blocks * num_warps, max_warps_per_sm=sm.max_warps_per_sm)
