"""Time the book's Triton kernels against eager PyTorch and torch.compile; write a `results/` record.

    python -m mlsys.kernels.benchmark                       # on a CUDA GPU: results/<device>/fused_kernels.json
    python -m mlsys.kernels.benchmark --smoke --no-compile --out /tmp/bench   # anywhere, tiny sizes

Measured: the copy bandwidth (`y.copy_(x)`, bytes = read + write), which is the ceiling for
memory-bound kernels; `repeat_unary` "fma" for a sweep of k (achieved FLOP/s and bytes/s against k);
cos(cos(x)) fused vs eager vs compiled; softmax vs `torch.softmax`, the naive five-op version and
compiled; RMSNorm forward vs the eager reference and compiled. Each time becomes an effective
bandwidth `bytes_per_s = model_bytes / median_s`, where `model_bytes` is the kernel's cost model (one
read of each input, one write of each output), the same for every implementation, and a fraction of
the measured copy bandwidth.

Records go under `results/` only from a CUDA device (files there come from real GPUs); elsewhere
pass `--out DIR` and `--smoke`: the kernels then run in Triton's CPU interpreter and the timings say
nothing about performance. Nothing runs at import. Used in: §sec-bytes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mlsys import bench, env, hardware, results
from mlsys.dtypes import canonical as canonical_dtype
from mlsys.kernels import elementwise, rmsnorm, softmax

EXPERIMENT = "fused_kernels"
KERNELS = ("repeat_unary_fma", "cos_cos", "softmax", "rmsnorm")
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

FULL = {"numel": 1 << 26, "copy_numel": 1 << 28, "sizes": softmax.BENCHMARKS[0]["n_cols"],
        "dtypes": softmax.BENCHMARKS[0]["dtype"], "ks": elementwise.BENCHMARKS[0]["k"], "warmup": 5, "repeats": 50}
SMOKE = {"numel": 4096, "copy_numel": 1 << 14, "sizes": [61, 130], "dtypes": ["fp32"], "ks": [0, 1, 4],
         "warmup": 1, "repeats": 3}
"""Default sizes: FULL on a GPU (fp32 tensors of 256 MiB, far larger than any L2; row lengths, dtypes and
k from the kernel modules' BENCHMARKS specs), SMOKE for `--smoke`."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mlsys.kernels.benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes and few repeats (tests, CPU interpreter)")
    p.add_argument("--out", type=Path, default=None, help="write the record under DIR instead of results/")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (costs ~25 s cold on a CPU)")
    p.add_argument("--sizes", type=int, nargs="+", help="row lengths for softmax and RMSNorm")
    p.add_argument("--numel", type=int, help="elements per input tensor (rows = numel // row length)")
    p.add_argument("--ks", type=int, nargs="+", help="repeat counts k for the fma sweep")
    p.add_argument("--dtypes", nargs="+", choices=sorted(TORCH_DTYPES), help="input dtypes")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS), help="kernels to time")
    p.add_argument("--repeats", type=int, help="timed calls per measurement")
    args = p.parse_args(argv)
    defaults = SMOKE if args.smoke else FULL
    for key in ("numel", "sizes", "ks", "dtypes", "repeats"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    args.copy_numel = max(defaults["copy_numel"], args.numel)
    args.warmup = defaults["warmup"]
    if args.numel < 1 or min(args.sizes) < 1 or min(args.ks) < 0 or args.repeats < 1:
        p.error("--numel, --sizes and --repeats must be >= 1 and --ks >= 0")
    return args


MIN_SAMPLE_S = 1e-3
"""On a GPU each timed sample runs the op back to back until it lasts about this long, so the launch
overhead on the CPU (tens of microseconds for a Triton launch) overlaps the previous kernel's run
instead of being timed; the times reported are per call."""


def _time(fn: Callable[[], Any], args: argparse.Namespace, device: str) -> dict[str, Any]:
    calls = 1
    if device == "cuda":
        probe = bench.benchmark(fn, warmup=max(1, args.warmup), repeats=3, device=device)
        calls = max(1, math.ceil(MIN_SAMPLE_S / probe.median_s))

    def sample() -> None:
        for _ in range(calls):
            fn()

    timing = bench.benchmark(sample, warmup=args.warmup, repeats=args.repeats, device=device)
    return {"median_s": timing.median_s / calls, "p20_s": timing.p20_s / calls, "p80_s": timing.p80_s / calls,
            "samples_s": [t / calls for t in timing.samples_s], "calls_per_sample": calls}


def _row(kernel: str, impl: str, *, timing: dict[str, Any], shape: Sequence[int], dtype: str, model_bytes: int,
         model_flops: int | None, copy_bytes_per_s: float | None, **extra: Any) -> dict[str, Any]:
    """One measurement record: inputs, cost model, timing and the derived rates (units in the keys)."""
    row = {"kernel": kernel, "impl": impl, "shape": list(shape), "dtype": dtype, **extra,
           "model_bytes": model_bytes, **timing}
    row["bytes_per_s"] = bench.achieved_bytes_per_s(model_bytes, timing["median_s"])
    if model_flops is not None:
        row["model_flops"] = model_flops
        row["flop_per_s"] = bench.achieved_flop_per_s(model_flops, timing["median_s"])
    if copy_bytes_per_s is not None:
        row["fraction_of_copy_bandwidth"] = row["bytes_per_s"] / copy_bytes_per_s
    return row


def _cos_cos(t: torch.Tensor) -> torch.Tensor:
    return t.cos().cos()


IMPLEMENTATIONS: dict[str, dict[str, Callable[..., Any]]] = {
    "cos_cos": {"triton": lambda t: elementwise.repeat_unary(t, 2, "cos"), "eager": _cos_cos, "compiled": _cos_cos},
    "softmax": {"triton": softmax.softmax, "torch": softmax.softmax_ref, "naive": softmax.naive_softmax,
                "compiled": softmax.softmax_ref},
    "rmsnorm": {"triton": rmsnorm.rmsnorm, "eager": rmsnorm.rmsnorm_ref, "compiled": rmsnorm.rmsnorm_ref},
}
"""What each kernel is timed against; "compiled" entries are passed through torch.compile first."""


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A fresh torch.compile of `fn`; resetting dynamo keeps earlier shapes from using up its recompile limit."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _measure_all(kernel: str, inputs: tuple[torch.Tensor, ...], args: argparse.Namespace, dev: str,
                 **row_fields: Any) -> list[dict[str, Any]]:
    """Time every implementation of `kernel` on the same inputs; one row each."""
    out = []
    for impl, fn in IMPLEMENTATIONS[kernel].items():
        if impl == "compiled":
            if args.no_compile:
                continue
            fn = _compiled(fn)
        out.append(_row(kernel, impl, timing=_time(functools.partial(fn, *inputs), args, dev), **row_fields))
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure everything `args` asks for; returns the result rows (the copy row first)."""
    dev = "cuda" if env.device() == "cuda" else "cpu"
    gen = torch.Generator(device="cpu").manual_seed(0)

    src = torch.randn(args.copy_numel, generator=gen).to(dev)
    dst = torch.empty_like(src)
    copy = _row("copy", "torch", timing=_time(functools.partial(dst.copy_, src), args, dev), shape=list(src.shape),
                dtype="fp32", model_bytes=2 * src.nbytes, model_flops=None, copy_bytes_per_s=None)
    rows = [copy]
    bw = copy["bytes_per_s"]
    del src, dst

    for name in args.dtypes:
        dtype = TORCH_DTYPES[name]
        x = torch.randn(args.numel, generator=gen).to(device=dev, dtype=dtype)
        n = x.numel()
        if "repeat_unary_fma" in args.kernels:
            for k in args.ks:
                t = _time(functools.partial(elementwise.repeat_unary, x, k, "fma"), args, dev)
                rows.append(_row("repeat_unary_fma", "triton", timing=t, shape=[n], dtype=name, k=k,
                                 model_bytes=elementwise.repeat_unary_bytes(n, dtype),
                                 model_flops=elementwise.repeat_unary_flops(n, k, "fma"), copy_bytes_per_s=bw))
        if "cos_cos" in args.kernels:
            rows += _measure_all("cos_cos", (x,), args, dev, shape=[n], dtype=name, k=2,
                                 model_bytes=elementwise.repeat_unary_bytes(n, dtype),
                                 model_flops=elementwise.repeat_unary_flops(n, 2, "cos"), copy_bytes_per_s=bw,
                                 eager_traffic_bytes=elementwise.eager_chain_bytes(n, dtype, 2))
        for cols in args.sizes:
            shape = (max(1, args.numel // cols), cols)
            xm = torch.randn(shape, generator=gen).to(device=dev, dtype=dtype)
            if "softmax" in args.kernels:
                rows += _measure_all("softmax", (xm,), args, dev, shape=list(shape), dtype=name,
                                     model_bytes=softmax.softmax_bytes(shape, dtype),
                                     model_flops=softmax.softmax_flops(shape), copy_bytes_per_s=bw,
                                     naive_traffic_bytes=softmax.naive_softmax_bytes(shape, dtype))
            if "rmsnorm" in args.kernels:
                w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(device=dev, dtype=dtype)
                rows += _measure_all("rmsnorm", (xm, w), args, dev, shape=list(shape), dtype=name,
                                     model_bytes=rmsnorm.rmsnorm_bytes(shape, dtype),
                                     model_flops=rmsnorm.rmsnorm_flops(shape), copy_bytes_per_s=bw)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table (GB/s = 1e9 bytes/s)."""
    lines = [f"{'kernel':<17} {'impl':<9} {'shape':<14} {'dtype':<5} {'k':>4} {'median':>11} {'GB/s':>9} "
             f"{'% copy':>7} {'GFLOP/s':>9}"]
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        pct = f"{100 * r['fraction_of_copy_bandwidth']:.1f}" if "fraction_of_copy_bandwidth" in r else "ref"
        flops = f"{r['flop_per_s'] / 1e9:.4g}" if "flop_per_s" in r else "-"
        lines.append(f"{r['kernel']:<17} {r['impl']:<9} {shape:<14} {r['dtype']:<5} {r.get('k', ''):>4} "
                     f"{r['median_s'] * 1e6:>9.1f}us {r['bytes_per_s'] / 1e9:>9.4g} {pct:>7} {flops:>9}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Path:
    """Parse `argv`, refuse what cannot be trusted, measure, print a table, write the record; returns its path."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    on_gpu = env.device() == "cuda"
    if args.out is None and not on_gpu:
        raise SystemExit(
            "refusing to write under results/ without a CUDA device (files there come only from real GPUs); "
            "pass --out DIR (with --smoke) to try the benchmark here"
        )
    if args.out is None and args.smoke:
        raise SystemExit("--smoke sizes are not recorded under results/; pass --out DIR")
    if not on_gpu and not args.smoke:
        raise SystemExit("without a CUDA device the kernels run in Triton's CPU interpreter: pass --smoke")
    rows = run(args)
    print(table(rows))
    provenance = bench.provenance()
    provenance["command"] = shlex.join(["python", "-m", "mlsys.kernels.benchmark", *argv])
    provenance["triton_interpreted"] = env.triton_interpreted()
    provenance["sizes"] = {k: getattr(args, k) for k in ("numel", "copy_numel", "sizes", "ks", "repeats", "warmup")}
    provenance["dtypes"] = [canonical_dtype(d) for d in args.dtypes]
    spec = hardware.detect()
    if spec is not None:
        provenance["accelerator"] = spec.name
        provenance["spec_hbm_bytes_per_s"] = spec.hbm_bytes_per_s
    if not on_gpu:
        print("NOTE: no GPU: Triton ran in its CPU interpreter; these timings say nothing about performance.")
    if args.out is None:
        path = results.write_record(EXPERIMENT, rows, provenance)
    else:
        record = {"experiment": EXPERIMENT, "provenance": provenance, "results": rows}
        results.validate_record(record, experiment=EXPERIMENT)
        path = args.out / results.device_slug(provenance["device"]) / f"{EXPERIMENT}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
