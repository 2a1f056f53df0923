"""Measuring this device's ceilings: copy bandwidth, matmul FLOP/s and the per-op overhead.

Each probe is a `Probe`: a no-argument callable plus the work one call does (bytes moved or FLOPs),
so it can be timed alone (`measure_*`) or interleaved with the operations it is compared with
(`mlsys.bench.benchmark_interleaved`), which is how the chapters use them: a roof measured minutes
apart from the kernels it judges is a roof of another machine when the load changes.

- Bandwidth: `dst.copy_(src)` on a buffer far larger than the last-level cache, counting the bytes
  read plus the bytes written (a copy of Q bytes moves 2Q).
- Compute: square matmuls in the chosen dtype (2 N^3 FLOPs); the best size is the roof. A
  model's own matmul shape (`gemm_probe`) in fp32 and bf16 says how fast bf16 runs here.
- Overhead: `ops_per_call` in-place `mul_(1.0)` on a tiny tensor back to back, so the timer's own
  cost is spread over many ops.

Used in: §sec-bytes, §sec-flops, §sec-mixed-precision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env
from mlsys.dtypes import canonical, torch_dtype
from mlsys.roofline import Ceilings

MATMUL_DTYPES = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Probe:
    """A callable that does a known amount of work per call: `work` bytes or FLOPs (`unit`)."""

    name: str
    fn: Callable[[], Any]
    work: float
    unit: str  # "bytes" (moved, read + write) or "flop"

    def rate(self, seconds: float) -> float:
        """Bytes/s or FLOP/s of one call that took `seconds`."""
        return self.work / checks.positive(seconds, "seconds")


def copy_probe(n_bytes: int, *, device: str | None = None) -> Probe:
    """`dst.copy_(src)` of `n_bytes` (fp32): moves 2 * n_bytes per call (read + write)."""
    checks.integer(n_bytes, "n_bytes", minimum=4)
    device = device or env.device()
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    name = f"copy {n_bytes / 2**20:,.0f} MiB"
    return Probe(name, lambda: dst.copy_(src), 2.0 * src.nbytes, "bytes")


def matmul_probe(n: int, *, dtype: str = "fp32", device: str | None = None, seed: int = 0) -> Probe:
    """An N x N x N matmul in `dtype`: 2 N^3 FLOPs per call."""
    checks.positive_int(n, "n")
    checks.choice(canonical(dtype), "dtype", MATMUL_DTYPES)
    device = device or env.device()
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype)) for _ in range(2))
    return Probe(f"matmul {n}", lambda: a @ b, 2.0 * n**3, "flop")


def gemm_probe(m: int, k: int, n: int, *, dtype: str = "fp32", device: str | None = None,
               seed: int = 0) -> Probe:
    """An (m, k) @ (k, n) matmul in `dtype`, a model's own shape: 2 m k n FLOPs per call. Timed
    in fp32 and bf16 side by side, it says how fast this device's bf16 matmuls of that shape are
    (`matmul_probe` is the square case)."""
    checks.positive_ints(m=m, k=k, n=n)
    checks.choice(canonical(dtype), "dtype", MATMUL_DTYPES)
    device = device or env.device()
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(device, torch_dtype(dtype))
    b = torch.randn(k, n, generator=gen).to(device, torch_dtype(dtype))
    return Probe(f"matmul {m}x{k}x{n} {canonical(dtype)}", lambda: a @ b, 2.0 * m * k * n, "flop")


def op_overhead_probe(n_elements: int, *, ops_per_call: int = 20,
                      device: str | None = None) -> Probe:
    """`ops_per_call` in-place `t.mul_(1.0)` on `n_elements` fp32 values; work = ops per call."""
    checks.positive_int(n_elements, "n_elements")
    checks.positive_int(ops_per_call, "ops_per_call")
    t = torch.ones(n_elements, device=device or env.device())

    def run() -> None:
        for _ in range(ops_per_call):
            t.mul_(1.0)

    return Probe(f"{ops_per_call} x mul_ on {n_elements:,}", run, float(ops_per_call), "op")


def measure_copy_bandwidth(n_bytes: int, *, device: str | None = None, repeats: int = 10) -> float:
    """Bytes/s of a large copy (read + write), the memory roof. Use a buffer well above the LLC."""
    probe = copy_probe(n_bytes, device=device)
    return probe.rate(bench.benchmark(probe.fn, warmup=2, repeats=repeats, device=device).median_s)


def measure_matmul_flop_per_s(
    sizes: Sequence[int], *, dtype: str = "fp32", device: str | None = None, repeats: int = 5
) -> dict[int, float]:
    """FLOP/s of square N x N matmuls for each N in `sizes`; the best is the compute roof."""
    probes = {n: matmul_probe(n, dtype=dtype, device=device)
              for n in checks.int_sequence(sizes, "sizes", minimum=1)}
    return {
        n: p.rate(bench.benchmark(p.fn, warmup=2, repeats=repeats, device=device).median_s)
        for n, p in probes.items()
    }


def measure_op_time_s(
    n_elements: int, *, ops_per_sample: int = 20, device: str | None = None, warmup: int = 2,
    repeats: int = 10
) -> float:
    """Median seconds per in-place `t.mul_(1.0)` on `n_elements` fp32 values (the per-op overhead
    for tiny tensors)."""
    probe = op_overhead_probe(n_elements, ops_per_call=ops_per_sample, device=device)
    timing = bench.benchmark(probe.fn, warmup=warmup, repeats=repeats, device=device)
    return timing.median_s / ops_per_sample


def measure_ceilings(
    *, copy_bytes: int, matmul_sizes: Sequence[int], dtype: str = "fp32", device: str | None = None
) -> Ceilings:
    """Both roofs of the running device, measured one after the other: best matmul FLOP/s and copy
    bandwidth. (Chapters interleave the probes with their operations instead.)"""
    flop_per_s = max(measure_matmul_flop_per_s(matmul_sizes, dtype=dtype, device=device).values())
    bytes_per_s = measure_copy_bandwidth(copy_bytes, device=device)
    label = f"measured on {env.device_name()} ({canonical(dtype)})"
    return Ceilings(flop_per_s, bytes_per_s, label)
