"""What a kernel's tiles ask of one SM, on paper: shared memory and registers.

A Triton program works on tiles: blocks of rows held in registers (accumulators, scores) or staged
in shared memory (the operands its dot products read). Both are finite per SM, so the tile sizes
decide whether a kernel fits, how many copies of it an SM holds at once (`occupancy`), and whether
the compiler runs out of registers and spills to slow local memory. These formulas say it before
compiling; `mlsys.kernels.compile_report` checks them against the compiler for every tile.

Shared memory of the FlashAttention kernels (16-bit inputs; each tile is rows x head_dim elements):
    held tiles (loaded once per program)
    + buffers x streamed tiles (the loop's next K, V or Q, dO tiles, in flight while it computes)
    + (num_stages - 1) x streamed fp32 row vectors (L and D in the dK/dV kernel)
with buffers = num_stages on sm_90 and num_stages - 1 on sm_80/sm_89: the rule Triton 3.7's software
pipeline follows (`compile_report` finds it exact for every 16-bit tile on both targets). fp32
inputs go through the FMA units with operands in registers, so they use less than this.

Registers: a tile of R x C fp32 values spread over the program's 32 x num_warps threads costs each
thread R x C / (32 num_warps) registers. The accumulators, which live through the whole loop, and
the one score tile a loop step must hold whole (S, or P in the backward; dP can be consumed
fragment by fragment as the tensor cores produce it) give a floor. Past the most a thread may
have (255, or 65,536 / threads when that is smaller: 128 at 16 warps, 64 at 32) the tile must
spill on paper. The compiler needs more than the floor (operand fragments, addresses, masks), so
a tile can spill below it too; it never needs less.
Used in: chapter 06 (the compile table, why this tile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys import checks, hardware

FLASH_KERNELS = ("fwd", "dkdv", "dq")
_HELD_STREAMED = {  # tiles of head_dim elements per row: (held, streamed), as rows per (M, N)
    "fwd": ((1, 0), (0, 2)),  # holds Q (BLOCK_M rows); streams K, V (BLOCK_N rows each)
    "dkdv": ((0, 2), (2, 0)),  # holds K, V; streams Q, dO
    "dq": ((2, 0), (0, 2)),  # holds Q, dO; streams K, V
}
_STREAMED_VECTORS = {"fwd": 0, "dkdv": 2, "dq": 0}  # fp32 vectors of BLOCK_M streamed: L, D
_FP32_TILES = {  # (rows of the accumulators, how many of rows x head_dim, score tiles held)
    "fwd": ("M", 1, 1),  # acc (BLOCK_M x d); S, then P in its place
    "dkdv": ("N", 2, 1),  # dK, dV (BLOCK_N x d each); P^T, until dS^T is formed from it
    "dq": ("M", 1, 1),  # dQ (BLOCK_M x d); P, until dS is formed from it
}


def _check_tile(kernel: str, block_m: int, block_n: int, head_dim: int) -> None:
    checks.choice(kernel, "kernel", FLASH_KERNELS)
    checks.positive_ints(block_m=block_m, block_n=block_n, head_dim=head_dim)


def pipeline_buffers(num_stages: int, arch: str) -> int:
    """Copies of each streamed tile in shared memory: num_stages on sm_90, one fewer before."""
    checks.positive_int(num_stages, "num_stages")
    return num_stages if hardware.sm_architecture(arch).capability >= 90 else num_stages - 1


def flash_smem_bytes(kernel: str, block_m: int, block_n: int, head_dim: int, elem_bytes: int,
                     num_stages: int, arch: str = "sm_90") -> int:
    """Shared memory of one program of flash `kernel` ("fwd", "dkdv", "dq"), 16-bit inputs:
    held tiles + buffers x streamed tiles + (num_stages - 1) x streamed fp32 vectors (bytes)."""
    _check_tile(kernel, block_m, block_n, head_dim)
    checks.positive_int(elem_bytes, "elem_bytes")
    (hq, hk), (sq, sk) = _HELD_STREAMED[kernel]
    held = (hq * block_m + hk * block_n) * head_dim * elem_bytes
    streamed = (sq * block_m + sk * block_n) * head_dim * elem_bytes
    vectors = _STREAMED_VECTORS[kernel] * block_m * 4
    return held + pipeline_buffers(num_stages, arch) * streamed + (num_stages - 1) * vectors


def max_registers_per_thread(num_warps: int, arch: str = "sm_90") -> int:
    """The most registers a thread of a `num_warps` block can have: 255, or fewer when the
    block's threads would otherwise not fit one SM's register file (64 at 32 warps)."""
    sm = hardware.sm_architecture(arch)
    checks.positive_int(num_warps, "num_warps")
    per_thread = sm.registers_per_sm // (32 * num_warps)
    return min(sm.max_registers_per_thread, per_thread // 8 * 8)


@dataclass(frozen=True)
class RegisterFloor:
    """Registers per thread that a tile's live fp32 values need at least, and the cap."""

    parts: dict[str, int]  # name -> registers per thread
    limit: int

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def must_spill(self) -> bool:
        """The floor alone is past the cap: the compiler has to spill."""
        return self.total > self.limit


def flash_register_floor(kernel: str, block_m: int, block_n: int, head_dim: int,
                         num_warps: int, arch: str = "sm_90") -> RegisterFloor:
    """The fp32 accumulators and score tiles one loop step of flash `kernel` holds, per thread."""
    _check_tile(kernel, block_m, block_n, head_dim)
    threads = 32 * checks.positive_int(num_warps, "num_warps")
    rows, n_acc, n_scores = _FP32_TILES[kernel]
    acc_rows = block_m if rows == "M" else block_n
    parts = {"accumulators": math.ceil(n_acc * acc_rows * head_dim / threads),
             "scores": math.ceil(n_scores * block_m * block_n / threads)}
    return RegisterFloor(parts, max_registers_per_thread(num_warps, arch))
