"""The roofline model: is a kernel limited by arithmetic, by memory traffic, or by neither?

    attainable FLOP/s = min(peak FLOP/s, intensity * memory bytes/s)          (Williams et al. 2009)

A kernel doing `flops` work while moving `n_bytes` takes at least max(T_math, T_bytes) with
T_math = flops / peak and T_bytes = n_bytes / bandwidth; the ridge point peak / bandwidth is the
intensity where the two are equal. Ceilings come either from a spec (`mlsys.hardware`) or from
`mlsys.probes`, measured on the reader's own device.

A third roof, communication: a kernel that also sends `comm_bytes` over a link of `link_bytes_per_s`
takes at least T_comm = comm_bytes / link_bytes_per_s, and the slowest of the three bounds it (the
Scaling Book's "communication intensity", FLOPs per byte sent, against the link's ridge
peak / link bandwidth). `tile_waves` is what the roofline leaves out of a matmul: its output is
computed in whole tiles, and the tiles run in whole waves over the SMs.

The model is also a check: no kernel can beat its roof. `roof_problems` lists the measurements
that do (by more than `ROOF_TOLERANCE`), which means the roof or the measurement is wrong (a noisy
machine, a cache the probe did not see). Where a measured time sits, in words, and the ridge
points as a table are `mlsys.tables`. Pure: numbers in, numbers out (and a sentence per
contradiction). Used in: §sec-bytes, §sec-flops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mlsys import checks
from mlsys.hardware import Accelerator

ROOF_TOLERANCE = 1.25
"""A measurement may beat its roofline estimate by this factor before it counts as a contradiction:
the bytes model counts each tensor once (a CPU's write-allocate reads and a GPU's L2 re-reads make
the real roof a little different), and the probes have noise of their own."""


@dataclass(frozen=True)
class Ceilings:
    """The two roofs of a device: peak FLOP/s for one dtype and memory bytes/s (read + write)."""

    flop_per_s: float
    bytes_per_s: float
    label: str  # e.g. "H100 SXM spec (bf16)" or "measured on CPU (x86_64, 2 cores)"

    def __post_init__(self) -> None:
        checks.positive(self.flop_per_s, "flop_per_s")
        checks.positive(self.bytes_per_s, "bytes_per_s")

    @classmethod
    def from_spec(cls, accelerator: Accelerator, dtype: str = "bf16") -> Ceilings:
        label = f"{accelerator.name} spec ({dtype})"
        return cls(accelerator.peak_flop_per_s(dtype), accelerator.hbm_bytes_per_s, label)

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte where memory time equals math time."""
        return self.flop_per_s / self.bytes_per_s

    def attainable_flop_per_s(self, intensity: float) -> float:
        """min(peak, intensity * bandwidth)."""
        checks.nonnegative(intensity, "intensity")
        return min(self.flop_per_s, intensity * self.bytes_per_s)

    def bound(self, intensity: float) -> str:
        """"memory-bound" below the ridge point, "compute-bound" at or above it."""
        checks.nonnegative(intensity, "intensity")
        return "compute-bound" if intensity >= self.ridge_intensity else "memory-bound"


@dataclass(frozen=True)
class Estimate:
    """Roofline time estimate of one kernel (and of what it sends over a link, if anything)."""

    math_s: float
    memory_s: float
    comm_s: float = 0.0

    @property
    def time_s(self) -> float:
        """Lower bound on the kernel's time: max(T_math, T_bytes, T_comm) (perfect overlap)."""
        return max(self.math_s, self.memory_s, self.comm_s)

    @property
    def bound(self) -> str:
        if self.comm_s > max(self.math_s, self.memory_s):
            return "communication-bound"
        return "compute-bound" if self.math_s >= self.memory_s else "memory-bound"


def estimate(flops: float, n_bytes: float, ceilings: Ceilings, *, comm_bytes: float = 0.0,
             link_bytes_per_s: float | None = None) -> Estimate:
    """T_math = flops / peak, T_bytes = n_bytes / bandwidth and, for a kernel that sends
    `comm_bytes` over a link of `link_bytes_per_s`, T_comm = comm_bytes / link_bytes_per_s."""
    checks.nonnegative(flops, "flops")
    checks.nonnegative(n_bytes, "n_bytes")
    checks.nonnegative(comm_bytes, "comm_bytes")
    if not isinstance(ceilings, Ceilings):
        raise TypeError(f"ceilings must be a Ceilings, got {type(ceilings).__name__}")
    if comm_bytes and link_bytes_per_s is None:
        raise ValueError("comm_bytes needs link_bytes_per_s (the link's bytes/s per direction)")
    if link_bytes_per_s is not None:
        checks.positive(link_bytes_per_s, "link_bytes_per_s")
    comm_s = comm_bytes / link_bytes_per_s if comm_bytes else 0.0
    return Estimate(math_s=flops / ceilings.flop_per_s, memory_s=n_bytes / ceilings.bytes_per_s,
                    comm_s=comm_s)


@dataclass(frozen=True)
class TileWaves:
    """An m x n matmul output cut into tile_m x tile_n tiles, run in waves of `slots` tiles."""

    tiles: int
    slots: int  # tiles running at once: SMs x tiles per SM
    useful_fraction: float  # m n over the elements of the whole tiles (tile quantization)

    @property
    def waves(self) -> int:
        return -(-self.tiles // self.slots)

    @property
    def wave_fraction(self) -> float:
        """Tiles over the slots of all waves (wave quantization): 1 when the last wave is full."""
        return self.tiles / (self.waves * self.slots)


def tile_waves(m: int, n: int, *, tile_m: int, tile_n: int, sms: int,
               tiles_per_sm: int = 1) -> TileWaves:
    """How an m x n output falls into whole tiles, and the tiles into whole waves over `sms` SMs
    (`tiles_per_sm` resident on each). A dimension one past a tile multiple costs a whole row of
    tiles; a tile one past a full wave costs a whole wave (NVIDIA's "Matrix Multiplication
    Background" guide: tile and wave quantization)."""
    for value, name in ((m, "m"), (n, "n"), (tile_m, "tile_m"), (tile_n, "tile_n"), (sms, "sms"),
                        (tiles_per_sm, "tiles_per_sm")):
        checks.positive_int(value, name)
    rows, cols = -(-m // tile_m), -(-n // tile_n)
    return TileWaves(rows * cols, sms * tiles_per_sm, m * n / (rows * tile_m * cols * tile_n))


def overhead_time_s(n_bytes: float, overhead_s: float, bytes_per_s: float) -> float:
    """Time of a small memory-bound op: a fixed per-op overhead plus its bytes over the bandwidth.

    Below n_bytes ~ overhead_s * bytes_per_s the overhead dominates and doubling the size barely
    changes the time (the overhead-bound regime).
    """
    checks.nonnegative(n_bytes, "n_bytes")
    checks.nonnegative(overhead_s, "overhead_s")
    return overhead_s + n_bytes / checks.positive(bytes_per_s, "bytes_per_s")


def roof_problems(
    points: Iterable[tuple[str, float, float, float]],
    ceilings: Ceilings,
    *,
    tolerance: float = ROOF_TOLERANCE,
) -> list[str]:
    """The measurements that beat the roof: each point is (name, flops, n_bytes, measured seconds).

    A point whose measured time is below its roofline estimate / `tolerance` is a contradiction (a
    memory-bound op faster than the copy bandwidth allows, a matmul above the matmul ceiling). One
    sentence per offender, with the numbers.
    """
    checks.number(tolerance, "tolerance", minimum=1.0)
    problems = []
    for name, flops, n_bytes, seconds in points:
        predicted = estimate(flops, n_bytes, ceilings)
        if checks.positive(seconds, f"seconds of {name}") * tolerance < predicted.time_s:
            problems.append(
                f"{name} ran {predicted.time_s / seconds:.2f}x faster than the {predicted.bound} "
                f"roof allows (tolerance {tolerance:g}x)"
            )
    return problems
