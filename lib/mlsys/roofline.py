"""The roofline model: is a kernel limited by arithmetic, by memory traffic, or by neither?

    attainable FLOP/s = min(peak FLOP/s, intensity * memory bytes/s)          (Williams et al. 2009)

A kernel doing `flops` work while moving `n_bytes` takes at least max(T_math, T_bytes) with
T_math = flops / peak and T_bytes = n_bytes / bandwidth; the ridge point peak / bandwidth is the
intensity where the two are equal. Ceilings come either from a spec (`mlsys.hardware`) or from
the probes below, measured on the reader's own device. Used in: §sec-bytes, §sec-flops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlsys.hardware import Accelerator


@dataclass(frozen=True)
class Ceilings:
    """The two roofs of a device: peak FLOP/s for one dtype and memory bytes/s (read + write)."""

    flop_per_s: float
    bytes_per_s: float
    label: str  # e.g. "H100 SXM spec (bf16)" or "measured on CPU (x86_64, 2 cores)"

    def __post_init__(self) -> None:
        if self.flop_per_s <= 0 or self.bytes_per_s <= 0:
            raise ValueError(f"ceilings must be positive, got {self.flop_per_s} FLOP/s and {self.bytes_per_s} B/s")

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
        if intensity < 0:
            raise ValueError(f"intensity must be >= 0, got {intensity}")
        return min(self.flop_per_s, intensity * self.bytes_per_s)

    def bound(self, intensity: float) -> str:
        """"memory-bound" below the ridge point, "compute-bound" at or above it."""
        return "compute-bound" if intensity >= self.ridge_intensity else "memory-bound"


@dataclass(frozen=True)
class Estimate:
    """Roofline time estimate of one kernel."""

    math_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        """Lower bound on the kernel's time: max(T_math, T_bytes) (perfect overlap)."""
        return max(self.math_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute-bound" if self.math_s >= self.memory_s else "memory-bound"


def estimate(flops: float, n_bytes: float, ceilings: Ceilings) -> Estimate:
    """T_math = flops / peak and T_bytes = n_bytes / bandwidth for one kernel."""
    if flops < 0 or n_bytes < 0:
        raise ValueError(f"flops ({flops}) and n_bytes ({n_bytes}) must be >= 0")
    return Estimate(math_s=flops / ceilings.flop_per_s, memory_s=n_bytes / ceilings.bytes_per_s)


def overhead_time_s(n_bytes: float, overhead_s: float, bytes_per_s: float) -> float:
    """Time of a small memory-bound op: a fixed per-op overhead plus its bytes over the bandwidth.

    Below n_bytes ~ overhead_s * bytes_per_s the overhead dominates and doubling the size barely
    changes the time (the overhead-bound regime).
    """
    if n_bytes < 0 or overhead_s < 0 or bytes_per_s <= 0:
        raise ValueError(f"n_bytes ({n_bytes}) and overhead_s ({overhead_s}) must be >= 0, bytes_per_s > 0")
    return overhead_s + n_bytes / bytes_per_s


# --- probes: measure the roofs of the running device ------------------------------------------------


def measure_op_time_s(
    n_elements: int, *, ops_per_sample: int = 20, device: str | None = None, warmup: int = 2, repeats: int = 10
) -> float:
    """Median seconds per in-place `t.mul_(1.0)` on `n_elements` fp32 values.

    Each timed sample runs `ops_per_sample` ops back to back, so the timer's own cost (and on a GPU
    the synchronization) is spread over many ops; for tiny tensors this is the per-op overhead.
    """
    import torch

    from mlsys import bench, env

    if n_elements < 1 or ops_per_sample < 1:
        raise ValueError(f"n_elements ({n_elements}) and ops_per_sample ({ops_per_sample}) must be positive")
    device = device or env.device()
    t = torch.ones(n_elements, device=device)

    def run() -> None:
        for _ in range(ops_per_sample):
            t.mul_(1.0)

    return bench.benchmark(run, warmup=warmup, repeats=repeats, device=device).median_s / ops_per_sample


def measure_copy_bandwidth(n_bytes: int, *, device: str | None = None, repeats: int = 10) -> float:
    """Bytes/s of `dst.copy_(src)` on a buffer of `n_bytes`, counting read + write (2 * n_bytes per copy).

    Use a buffer several times larger than the last-level cache, or the probe measures the cache.
    """
    import torch

    from mlsys import bench, env

    if n_bytes < 4:
        raise ValueError(f"n_bytes must be at least 4, got {n_bytes}")
    device = device or env.device()
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = bench.benchmark(lambda: dst.copy_(src), warmup=2, repeats=repeats, device=device)
    return bench.achieved_bytes_per_s(2 * src.numel() * 4, timing.median_s)


def measure_matmul_flop_per_s(
    sizes: Sequence[int], *, dtype: str = "fp32", device: str | None = None, repeats: int = 5
) -> dict[int, float]:
    """FLOP/s of square N x N matmuls for each N in `sizes` (2 N^3 FLOPs each); the best is the roof."""
    import torch

    from mlsys import bench, env

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be 'fp32', 'fp16' or 'bf16', got {dtype!r}")
    device = device or env.device()
    out: dict[int, float] = {}
    for n in sizes:
        if n < 1:
            raise ValueError(f"matmul sizes must be positive, got {n}")
        a = torch.randn(n, n, device=device, dtype=torch_dtype)
        b = torch.randn(n, n, device=device, dtype=torch_dtype)
        timing = bench.benchmark(lambda a=a, b=b: a @ b, warmup=2, repeats=repeats, device=device)
        out[n] = bench.achieved_flop_per_s(2 * n**3, timing.median_s)
    return out


def measured_ceilings(
    *, copy_bytes: int, matmul_sizes: Sequence[int], dtype: str = "fp32", device: str | None = None
) -> Ceilings:
    """Both roofs of the running device, measured: best matmul FLOP/s and copy bandwidth."""
    from mlsys import env

    flop_per_s = max(measure_matmul_flop_per_s(matmul_sizes, dtype=dtype, device=device).values())
    bytes_per_s = measure_copy_bandwidth(copy_bytes, device=device)
    return Ceilings(flop_per_s, bytes_per_s, f"measured on {env.device_name()} ({dtype})")
