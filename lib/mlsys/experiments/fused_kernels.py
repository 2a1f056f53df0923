"""The book's Triton kernels against eager PyTorch and torch.compile, in effective bandwidth.

For each kernel (the fma chain `repeat_unary` over k, cos(cos(x)), softmax, RMSNorm forward) and
each shape and dtype, every implementation is timed round-robin with the copy-bandwidth probe, and
each time becomes an effective bandwidth: the kernel's cost model (one read of each input, one write
of each output; the same bytes for every implementation) over the time, and a fraction of the copy
bandwidth measured in the same run. The targets of the kernels chapter: softmax and RMSNorm at 80%
of the copy bandwidth or more, and at least as fast as torch.compile. On a GPU each timed sample
repeats the kernel until it lasts about a millisecond (`bench.benchmark_interleaved`'s
`min_sample_s`), so the launch overhead overlaps the previous kernel instead of being timed. Without
a GPU the kernels run in Triton's CPU interpreter and the times say nothing about speed (the rows
say so).
Used in: §sec-bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.book import Table
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit, timing_fields
from mlsys.probes import copy_probe


@dataclass(frozen=True)
class Sizes:
    numel: int  # elements per input tensor (rows = numel // row length)
    copy_bytes: int
    rows: tuple[int, ...]  # row lengths of softmax and RMSNorm
    dtypes: tuple[str, ...]
    ks: tuple[int, ...]  # fma steps of the repeat_unary sweep
    compile: bool
    warmup: int
    repeats: int


SIZES = {
    "smoke": Sizes(4096, 2**16, (61, 130), ("fp32",), (0, 1, 4), False, 1, 3),
    "cpu": Sizes(2**14, 2**20, (61, 1000), ("fp32", "fp16"), (0, 1, 4, 16), False, 1, 3),
    "gpu": Sizes(2**26, 2**31, (1024, 4096, 8192), ("fp32", "bf16"),
                 (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512), True, 5, 30),
}
MIN_SAMPLE_S = 1e-3
"""On a GPU each sample repeats the kernel until it lasts about this long (times are per call); the
interpreter on a CPU is never timed for speed, so there each sample is one call."""


def _implementations(kernel: str) -> dict[str, Any]:
    from mlsys.kernels import elementwise, rmsnorm, softmax  # Triton (may be absent)

    return {
        "cos_cos": {"triton": lambda t: elementwise.repeat_unary(t, 2, "cos"), "eager": _cos_cos,
                    "compiled": _cos_cos},
        "softmax": {"triton": softmax.softmax, "torch": softmax.softmax_ref,
                    "naive": softmax.naive_softmax, "compiled": softmax.softmax_ref},
        "rmsnorm": {"triton": rmsnorm.rmsnorm, "eager": rmsnorm.rmsnorm_ref,
                    "compiled": rmsnorm.rmsnorm_ref},
    }[kernel]


def _cos_cos(t: torch.Tensor) -> torch.Tensor:
    return t.cos().cos()


def _group(fns: dict[str, Any], copy, s: Sizes, device: str) -> dict[str, bench.Timing]:
    """Time a group of implementations and the copy probe interleaved (seconds per call)."""
    min_sample_s = MIN_SAMPLE_S if device == "cuda" else 0.0
    return bench.benchmark_interleaved({**fns, "copy": copy.fn}, warmup=s.warmup, repeats=s.repeats,
                                       device=device, min_sample_s=min_sample_s)


def _rows(kernel: str, group: dict, copy, **fields: Any) -> list[dict[str, Any]]:
    copy_bw = copy.rate(group["copy"].median_s)
    out = []
    for impl, timing in group.items():
        if impl == "copy":
            continue
        row = {"kernel": kernel, "impl": impl, **fields, **timing_fields(timing)}
        row["bytes_per_s"] = row["model_bytes"] / timing.median_s
        if row.get("model_flops") is not None:
            row["flop_per_s"] = row["model_flops"] / timing.median_s
        row["copy_bytes_per_s"] = copy_bw
        row["fraction_of_copy_bandwidth"] = row["bytes_per_s"] / copy_bw
        out.append(row)
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    from mlsys.kernels import elementwise, rmsnorm, softmax  # Triton (may be absent)

    device = device or ("cuda" if env.device() == "cuda" else "cpu")
    gen = torch.Generator().manual_seed(0)
    copy = copy_probe(s.copy_bytes, device=device)
    rows: list[dict[str, Any]] = []

    def implementations(kernel: str) -> dict[str, Any]:
        fns = dict(_implementations(kernel))
        if "compiled" in fns:
            if s.compile:  # afresh: earlier shapes must not use up the recompile limit
                fns["compiled"] = kit.compile_fresh(fns["compiled"], dynamic=False)
            else:
                del fns["compiled"]
        return fns

    for name in s.dtypes:
        dt = torch_dtype(name)
        x = torch.randn(s.numel, generator=gen).to(device=device, dtype=dt)
        fma = {f"k={k}": (lambda k=k, x=x: elementwise.repeat_unary(x, k, "fma")) for k in s.ks}
        group = _group(fma, copy, s, device)
        for k in s.ks:
            rows += _rows("repeat_unary_fma", {"triton": group[f"k={k}"], "copy": group["copy"]},
                          copy, shape=[s.numel], dtype=name, k=k,
                          model_bytes=elementwise.repeat_unary_bytes(s.numel, name),
                          model_flops=elementwise.repeat_unary_flops(s.numel, k, "fma"))
        cos = implementations("cos_cos")
        timings = _group({i: (lambda f=f, x=x: f(x)) for i, f in cos.items()}, copy, s, device)
        rows += _rows("cos_cos", timings, copy, shape=[s.numel], dtype=name, k=2,
                      model_bytes=elementwise.repeat_unary_bytes(s.numel, name),
                      model_flops=elementwise.repeat_unary_flops(s.numel, 2, "cos"),
                      eager_traffic_bytes=elementwise.eager_chain_bytes(s.numel, name, 2))
        for cols in s.rows:
            shape = (max(1, s.numel // cols), cols)
            xm = torch.randn(shape, generator=gen).to(device=device, dtype=dt)
            sm = implementations("softmax")
            timings = _group({i: (lambda f=f, xm=xm: f(xm)) for i, f in sm.items()},
                             copy, s, device)
            rows += _rows("softmax", timings, copy, shape=list(shape), dtype=name,
                          model_bytes=softmax.softmax_bytes(shape, name),
                          model_flops=softmax.softmax_flops(shape),
                          naive_traffic_bytes=softmax.naive_softmax_bytes(shape, name))
            w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(device=device, dtype=dt)
            rn = implementations("rmsnorm")
            timings = _group({i: (lambda f=f, xm=xm, w=w: f(xm, w)) for i, f in rn.items()},
                             copy, s, device)
            rows += _rows("rmsnorm", timings, copy, shape=list(shape), dtype=name,
                          model_bytes=rmsnorm.rmsnorm_bytes(shape, name),
                          model_flops=rmsnorm.rmsnorm_flops(shape))
    interpreted = device != "cuda"
    for r in rows:
        r["interpreted"] = interpreted
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    """One line per kernel, implementation, shape and dtype (GB/s = 1e9 bytes/s)."""
    out = []
    for r in rows:
        out.append([r["kernel"], r["impl"], "x".join(map(str, r["shape"])), r["dtype"],
                    r.get("k", ""), f"{r['median_s'] * 1e6:.1f}", f"{r['bytes_per_s'] / 1e9:.4g}",
                    f"{100 * r['fraction_of_copy_bandwidth']:.1f}",
                    f"{r['flop_per_s'] / 1e9:.4g}" if "flop_per_s" in r else "-"])
    return Table(["kernel", "impl", "shape", "dtype", "k", "median µs", "GB/s", "% of copy",
                  "GFLOP/s"], out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Softmax and RMSNorm Triton rows against the targets: >= 80% of copy bandwidth, >= compiled
    speed."""
    out = []
    for r in rows:
        if r["kernel"] not in ("softmax", "rmsnorm") or r["impl"] != "triton":
            continue
        compiled = next((c for c in rows if c["kernel"] == r["kernel"] and c["impl"] == "compiled"
                         and c["shape"] == r["shape"] and c["dtype"] == r["dtype"]), None)
        out.append({"kernel": r["kernel"], "shape": r["shape"], "dtype": r["dtype"],
                    "fraction_of_copy_bandwidth": r["fraction_of_copy_bandwidth"],
                    "speedup_over_compiled": (compiled["median_s"] / r["median_s"]
                                              if compiled else None)})
    return out


EXPERIMENT = Experiment(
    name="fused_kernels",
    chapter="04_bytes",
    description="Triton kernels vs eager and torch.compile, in GB/s and % of the copy bandwidth",
    gpu_seconds=240,
    sizes=SIZES,
    run=run,
)
