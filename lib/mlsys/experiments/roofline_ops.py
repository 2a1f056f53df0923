"""Operations of every kind against this device's measured roofs, measured in one interleaved run.

The copy-bandwidth probe, a matmul probe (the compute roof) and a dozen eager PyTorch operations
(elementwise, softmax, RMSNorm, matmuls of other shapes, naive and fused attention) are timed
round-robin, so the roofs and the operations share the same moments of the machine. Each operation
sits at its analytic intensity (`mlsys.accounting`); its prediction is the roofline estimate on the
measured roofs. Before any verdict, `check` looks for what cannot be: an operation faster than its
roof allows, a probe that drifted during the run, timings too spread to read. The run repeats (up to
`attempts` times) until the check passes; if it never does, the rows say so and the chapter
withholds its verdict. The compute roof is a matmul size that is not among the operations judged
against it. Also measured: the cost of fresh output memory on a CPU (`allocation` rows).
Used in: §sec-bytes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mlsys import bench, env, hardware, roofline
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.probes import copy_probe, matmul_probe
from mlsys.tables import roofline_position


@dataclass(frozen=True)
class Sizes:
    dtype: str  # of every tensor (the matmul roof is this dtype's)
    copy_bytes: int  # bandwidth probe buffer, far above the last-level cache
    roof_matmul: int  # N of the compute-roof probe (not among the judged matmuls)
    matmul_sizes: tuple[int, ...]  # square matmuls judged against the roof
    skinny_rows: int  # rows of a skinny matmul against a roof_matmul x roof_matmul weight
    numel: int  # elements of the elementwise tensors
    row: int  # row length of softmax and RMSNorm
    attention: tuple[int, int, int, int]  # batch, heads, seq, d_head
    warmup: int
    repeats: int
    attempts: int


SIZES = {
    "smoke": Sizes("fp32", 2**27, 512, (64, 256), 16, 2**24, 1024, (1, 4, 512, 64), 1, 5, 2),
    "cpu": Sizes("fp32", 2**28, 1024, (64, 256, 512), 16, 2**24, 1024, (1, 8, 1024, 64), 2, 9, 3),
    "gpu": Sizes("bf16", 2**31, 8192, (256, 1024, 4096), 16, 2**26, 4096, (4, 16, 2048, 64),
                 5, 30, 3),
}


def _operations(s: Sizes, device: str) -> list[tuple[str, str, Any, int, bytes_moved.Traffic]]:
    """(name, group, fn, flops, traffic) of every judged operation, on fresh random inputs."""
    gen = torch.Generator().manual_seed(0)
    dt = torch_dtype(s.dtype)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt)

    x, y, w = randn(s.numel), randn(s.numel), randn(s.row)
    rows = s.numel // s.row
    xm = x.view(rows, s.row)
    batch, heads, seq, d_head = s.attention
    q, k, v = (randn(batch, heads, seq, d_head) for _ in range(3))
    skinny, weight = randn(s.skinny_rows, s.roof_matmul), randn(s.roof_matmul, s.roof_matmul)
    attn_flops = flops.scaled_dot_product_flops(batch, heads, seq, d_head)
    ops = []
    for n in s.matmul_sizes:
        a, b = randn(n, n), randn(n, n)
        ops.append((f"matmul {n}", "matmul", lambda a=a, b=b: a @ b, flops.matmul_flops(n, n, n),
                    bytes_moved.matmul_traffic(n, n, n, s.dtype)))
    r, n = s.skinny_rows, s.roof_matmul
    ops += [
        (f"skinny matmul {r}x{n}x{n}", "matmul", lambda: skinny @ weight,
         flops.matmul_flops(r, n, n), bytes_moved.matmul_traffic(r, n, n, s.dtype)),
        ("x * 2", "elementwise", lambda: x * 2.0, s.numel,
         bytes_moved.elementwise_traffic(s.numel, s.dtype)),
        ("x + y", "elementwise", lambda: x + y, s.numel,
         bytes_moved.elementwise_traffic(s.numel, s.dtype, n_inputs=2)),
        (f"softmax, rows of {s.row}", "row-wise", lambda: torch.softmax(xm, dim=-1),
         flops.softmax_flops(rows, s.row), bytes_moved.softmax_traffic(rows, s.row, s.dtype)),
        (f"RMSNorm (F.rms_norm), rows of {s.row}", "row-wise",
         lambda: F.rms_norm(xm, (s.row,), w, 1e-5), flops.rmsnorm_flops(rows, s.row),
         bytes_moved.norm_traffic(rows, s.row, s.dtype)),
        (f"naive attention, seq {seq}", "attention",
         lambda: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v, attn_flops,
         bytes_moved.naive_attention_traffic(batch, heads, seq, d_head, s.dtype)),
        (f"SDPA (fused attention), seq {seq}", "attention",
         lambda: F.scaled_dot_product_attention(q, k, v), attn_flops,
         bytes_moved.tiled_attention_traffic(batch, heads, seq, d_head, s.dtype)),
    ]
    return ops


def _ceilings(timings: dict[str, bench.Timing], probes: dict[str, Any],
              dtype: str) -> roofline.Ceilings:
    bytes_per_s = max(p.rate(timings[name].median_s)
                      for name, p in probes.items() if p.unit == "bytes")
    flop_per_s = max(p.rate(timings[name].median_s)
                     for name, p in probes.items() if p.unit == "flop")
    return roofline.Ceilings(flop_per_s, bytes_per_s, f"measured on {env.device_name()} ({dtype})")


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Measure the probes and the operations interleaved, re-measuring until consistent."""
    device = device or env.device()
    time = dict(warmup=s.warmup, repeats=s.repeats, device=device, min_sample_s=bench.MIN_SAMPLE_S)
    with contextlib.ExitStack() as stack:
        rows = _allocation_rows(s, device, stack, time)
        probes = {p.name: p for p in (copy_probe(s.copy_bytes, device=device),
                                      matmul_probe(s.roof_matmul, dtype=s.dtype, device=device))}
        ops = _operations(s, device)

        def check(timings: dict[str, bench.Timing]) -> list[str]:
            roof = _ceilings(timings, probes, s.dtype)
            points = [(name, f, tr.total_bytes, timings[name].median_s)
                      for name, _, _, f, tr in ops]
            return bench.noise_problems(timings) + roofline.roof_problems(points, roof)

        fns = {**{n: p.fn for n, p in probes.items()}, **{name: fn for name, _, fn, _, _ in ops}}
        timings, consistency = bench.measure_consistently(fns, check, attempts=s.attempts, **time)
    rows += [{"kind": "probe", "name": n, "unit": p.unit, "work": p.work,
              **timing_fields(timings[n])}
             for n, p in probes.items()]
    rows += [{"kind": "op", "name": name, "group": group, "flops": f, "read_bytes": tr.read_bytes,
              "write_bytes": tr.write_bytes, **timing_fields(timings[name])}
             for name, group, _, f, tr in ops]
    rows.append({"kind": "consistency", "problems": list(consistency.problems),
                 "attempts": consistency.attempts, "dtype": s.dtype})
    return rows


def _allocation_rows(s: Sizes, device: str, stack: contextlib.ExitStack, time: dict) -> list[dict]:
    """`x * 2` into a fresh output vs into an existing one, before and after keeping freed memory
    mapped (`bench.kept_cpu_memory`, entered on `stack` for the rest of the run on a CPU)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(s.numel, generator=gen).to(device, torch_dtype(s.dtype))
    out = torch.empty_like(x)
    fns = {"fresh output": lambda: torch.mul(x, 2.0),
           "existing output": lambda: torch.mul(x, 2.0, out=out)}
    first = bench.benchmark_interleaved(fns, **time)
    kept = device == "cpu" and stack.enter_context(bench.kept_cpu_memory())
    after = bench.benchmark_interleaved({"fresh output, freed memory kept": fns["fresh output"]},
                                        **time)
    return [{"kind": "allocation", "name": n, "kept": bool(kept), **timing_fields(t)}
            for n, t in {**first, **after}.items()]


# --- reading the rows (live or recorded) ----------------------------------------------------------


@dataclass(frozen=True)
class OpResult:
    name: str
    group: str
    flops: int
    n_bytes: int
    timing: bench.Timing
    estimate: roofline.Estimate

    @property
    def intensity(self) -> float:
        return self.flops / self.n_bytes

    @property
    def ratio(self) -> float:
        """Measured / predicted time (1 = at the roof; below 1 is a contradiction)."""
        return self.timing.median_s / self.estimate.time_s


def ceilings(rows: list[dict[str, Any]]) -> roofline.Ceilings:
    """The measured roofs of a run: the copy probe's bandwidth and the matmul probe's FLOP/s."""
    probes = [r for r in rows if r["kind"] == "probe"]
    bw = max(r["work"] / r["median_s"] for r in probes if r["unit"] == "bytes")
    peak = max(r["work"] / r["median_s"] for r in probes if r["unit"] == "flop")
    return roofline.Ceilings(peak, bw, "measured")


def consistency(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return kit.first(rows, "consistency")


def results(rows: list[dict[str, Any]]) -> list[OpResult]:
    roof = ceilings(rows)
    return [OpResult(r["name"], r["group"], r["flops"], r["read_bytes"] + r["write_bytes"],
                     timing_of(r),
                     roofline.estimate(r["flops"], r["read_bytes"] + r["write_bytes"], roof))
            for r in rows if r["kind"] == "op"]


def table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in results(rows):
        t = r.timing
        out.append([r.name, f"{r.intensity:.3g}", r.estimate.bound, num(1e3 * r.estimate.time_s),
                    num(1e3 * t.median_s), f"{num(1e3 * t.p20_s)} – {num(1e3 * t.p80_s)}",
                    f"{r.ratio:.2f}", num(r.flops / t.median_s / 1e9),
                    num(r.n_bytes / t.median_s / 1e9)])
    return Table(["op", "I (FLOP/B)", "bound (measured roofs)", "predicted ms", "measured ms",
                  "p20 – p80", "measured / predicted", "GFLOP/s", "GB/s"], out)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the numbers, each withheld if the run was not consistent."""
    problems = consistency(rows)["problems"]
    res = {r.name: r for r in results(rows)}
    memory = [r for r in res.values() if r.group in ("elementwise", "row-wise")]
    matmuls = [r for r in res.values() if r.group == "matmul"]
    naive = next(r for r in res.values() if r.name.startswith("naive attention"))
    fused = next(r for r in res.values() if r.name.startswith("SDPA"))
    at_roof = [r.name for r in memory if r.ratio <= 1.5]
    slow = [f"{r.name} ({r.ratio:.1f}x)" for r in memory if r.ratio > 1.5]
    memory_text = "; ".join(f"{r.name} is {roofline_position(r.timing.median_s, r.estimate)}"
                            for r in memory)
    if slow:
        memory_text += (f". At the roof: {', '.join(at_roof) or 'none'}; "
                        f"slower than their bytes need: {', '.join(slow)}, which do work beyond "
                        "the minimum traffic (several passes, costly exponentials or reductions on "
                        "this device)")
    matmul_text = "; ".join(f"{r.name} reaches {r.flops / r.timing.median_s / 1e9:,.0f} GFLOP/s, "
                            f"{roofline_position(r.timing.median_s, r.estimate)}" for r in matmuls)
    speed = compare_speed("SDPA", fused.timing.median_s, "naive attention", naive.timing.median_s)
    attention_text = (f"{speed} while moving {naive.n_bytes / fused.n_bytes:.0f}x fewer bytes; "
                      f"naive attention is {naive.estimate.bound} here "
                      f"(intensity {naive.intensity:.3g} FLOP/byte)")
    return {name: verdict(text, problems) for name, text in
            {"memory": memory_text, "matmul": matmul_text, "attention": attention_text}.items()}


def allocation_text(rows: list[dict[str, Any]]) -> str:
    """What fresh output memory cost, from the `allocation` rows."""
    t = {r["name"]: r["median_s"] for r in rows if r["kind"] == "allocation"}
    fresh, existing = t["fresh output"], t["existing output"]
    kept = t["fresh output, freed memory kept"]
    text = f"a fresh output took {fresh / existing:.2f}x as long as an existing one"
    if any(r.get("kept") for r in rows if r["kind"] == "allocation"):
        text += f"; with freed memory kept mapped, {kept / existing:.2f}x"
    return text


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's numbers: the allocator's note, the measured roofs (GFLOP/s, GB/s, ridge), the
    attempts to a consistent run and the verdicts ("verdict_memory", ...)."""
    roof = ceilings(rows)
    return {"allocation_text": allocation_text(rows), "meas_gflops": roof.flop_per_s / 1e9,
            "meas_gbps": roof.bytes_per_s / 1e9, "meas_ridge": roof.ridge_intensity,
            "ops_attempts": consistency(rows)["attempts"],
            **{f"verdict_{k}": v for k, v in verdicts(rows).items()}}


def plot(rows: list[dict[str, Any]], ax, *, title: str,
         accelerator: hardware.Accelerator | None = None) -> None:
    """Achieved FLOP/s of each operation at its intensity, under the measured roof (and the
    spec's)."""
    from mlsys import plotting  # matplotlib: only when a page draws

    res = results(rows)
    roof = ceilings(rows)
    intensities = [r.intensity for r in res]
    lo = math.floor(math.log2(min(intensities))) - 1
    hi = math.ceil(math.log2(max(intensities + [roof.ridge_intensity]))) + 2
    plotting.roofline(ax, roof, lo=lo, hi=hi, lw=2,
                      label=f"measured roof: {roof.flop_per_s / 1e9:,.0f} GFLOP/s, "
                            f"{roof.bytes_per_s / 1e9:,.1f} GB/s")
    dtype = consistency(rows)["dtype"]
    if accelerator is not None and dtype in accelerator.dense_flop_per_s:
        spec = roofline.Ceilings.from_spec(accelerator, dtype)
        plotting.roofline(ax, spec, lo=lo, hi=hi, lw=1.2, ls="--",
                          label=f"{accelerator.name} spec roof ({dtype})")
    for color, marker, r in zip(plotting.CYCLE * 2, plotting.MARKERS, res, strict=False):
        ax.plot([r.intensity], [r.flops / r.timing.median_s], marker, color=color, ms=7,
                label=r.name)
        ax.plot([r.intensity], [r.flops / r.estimate.time_s], "x",
                color=plotting.COLORS["predicted"], ms=7)
    ax.plot([], [], "x", color=plotting.COLORS["predicted"],
            label="predicted (on the measured roofs)")
    plotting.finish(ax, title=title, xlabel="arithmetic intensity (FLOP/byte)",
                    ylabel="achieved FLOP/s", logx=2, logy=True)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


EXPERIMENT = Experiment(
    name="roofline_ops",
    chapter="04_bytes",
    description="copy and matmul roofs interleaved with a dozen eager ops; measured / predicted",
    gpu_seconds=15,
    sizes=SIZES,
    run=run,
)
