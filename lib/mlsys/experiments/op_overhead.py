"""The overhead regime: when an op's size stops mattering, and what removes the per-op cost.

`x.mul_(1.0)` (read and write n fp32 elements, in place) is timed `ops_per_call` times back to back
per sample at sizes n and 2n, from one element up, with n and 2n interleaved with each other and
with two bandwidth probes, so a change of load affects all alike. The model is
T(n) = T0 + 8n / beta, T0 the per-op overhead (the median of the smallest sizes) and beta the
bandwidth of the same op in place on a buffer far above the caches (`inplace_probe`), measured in
the same run; doubling n barely changes T while 8n / beta << T0. The copy probe is kept beside it:
a copy reads each destination line before writing it (write-allocate, on a CPU), an in-place op
does not, so the copy's bandwidth understates what `mul_` gets (records made before the in-place
probe use the copy's). Every size measured under `FAST` times the model is named with its cause:
a cache, or the overhead overlapping the transfer (`fast_text`).
Remedies, on a chain of small fma ops: bigger ops, `torch.compile` (one fused kernel), and on a GPU
a CUDA graph (the launches recorded once and replayed with one call).
A little over 300 lines as one module: the sweep, its two probes and the remedies are one run and
one record, and its verdicts read them together.
Used in: §sec-bytes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env, roofline
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.experiments import Experiment, kit, timing_fields
from mlsys.probes import Probe, copy_probe, op_overhead_probe


@dataclass(frozen=True)
class Sizes:
    sizes: tuple[int, ...]  # n, fp32 elements (each also timed at 2n)
    ops_per_call: int  # ops per timed sample: spreads the timer's cost over many ops
    copy_bytes: int
    chain_len: int  # ops in the small chain of the remedies
    chain_numel: int  # its elements
    big_factor: int  # "bigger ops": the same chain on this many times the elements
    compile: bool  # time torch.compile of the chain (costs ~10-25 s cold on a CPU)
    warmup: int
    repeats: int
    attempts: int


SIZES = {
    "smoke": Sizes(tuple(4**i for i in range(13)), 20, 2**27, 10, 4096, 64, False, 2, 7, 2),
    "cpu": Sizes(tuple(4**i for i in range(13)), 20, 2**28, 10, 4096, 64, True, 3, 11, 3),
    "gpu": Sizes(tuple(4**i for i in range(15)), 20, 2**31, 10, 4096, 64, True, 5, 21, 3),
}
SMALLEST = 4
"""T0 is the median time per op of the `SMALLEST` smallest sizes."""
FAST = 0.8
"""A size whose measured time is under this fraction of the model's runs faster than beta allows."""


def inplace_probe(n_bytes: int, *, device: str) -> Probe:
    """`t.mul_(1.0)` on `n_bytes` of fp32, the op of the sweep on a buffer far above the caches:
    2 * n_bytes per call (read + write of the same lines)."""
    t = torch.ones(n_bytes // 4, device=device)
    return Probe(f"in-place mul_ {n_bytes / 2**20:,.0f} MiB", lambda: t.mul_(1.0),
                 2.0 * t.nbytes, "bytes")


def _chain(t: torch.Tensor, k: int) -> torch.Tensor:
    from mlsys.kernels import elementwise  # Triton (may be absent): its module imports it

    return elementwise.repeat_unary_ref(t, k, "fma")


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Measure the size sweep with its copy probe, then the remedies."""
    device = device or env.device()
    copy, inplace = copy_probe(s.copy_bytes, device=device), inplace_probe(s.copy_bytes,
                                                                           device=device)
    probes = {n: (op_overhead_probe(n, ops_per_call=s.ops_per_call, device=device),
                  op_overhead_probe(2 * n, ops_per_call=s.ops_per_call, device=device))
              for n in s.sizes}
    fns = {copy.name: copy.fn, inplace.name: inplace.fn}
    for n, (p_n, p_2n) in probes.items():
        fns[f"n={n}"], fns[f"2n={n}"] = p_n.fn, p_2n.fn
    time = dict(warmup=s.warmup, repeats=s.repeats, device=device, min_sample_s=bench.MIN_SAMPLE_S)
    # The verdict reads the probe, the smallest sizes (T0) and the largest pair: those must be
    # steady. Sizes in between cross the caches and are shown, not judged.
    judged = [copy.name, inplace.name, *(f"n={n}" for n in s.sizes[:SMALLEST]),
              f"n={s.sizes[-1]}", f"2n={s.sizes[-1]}"]

    def check(timings: dict[str, bench.Timing]) -> list[str]:
        return bench.noise_problems({name: timings[name] for name in judged})

    timings, consistency = bench.measure_consistently(fns, check, attempts=s.attempts, **time)
    rows = [{"kind": "probe", "name": p.name, "unit": "bytes", "work": p.work,
             "in_place": p is inplace, **timing_fields(timings[p.name])} for p in (copy, inplace)]
    for n in s.sizes:
        for label, size in ((f"n={n}", n), (f"2n={n}", 2 * n)):
            t = timings[label]
            rows.append({"kind": "size", "n": size, "of": n,
                         "per_op_s": t.median_s / s.ops_per_call, **timing_fields(t)})
    rows += _remedies(s, device, time)
    rows.append({"kind": "consistency", "problems": list(consistency.problems),
                 "attempts": consistency.attempts, "ops_per_call": s.ops_per_call})
    return rows


def _remedies(s: Sizes, device: str, time: dict) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    small = torch.randn(s.chain_numel, generator=gen).to(device)
    big = torch.randn(s.chain_numel * s.big_factor, generator=gen).to(device)
    fns = {f"eager, {s.chain_len} ops on {s.chain_numel:,} elements":
               (s.chain_numel, lambda: _chain(small, s.chain_len)),
           f"bigger ops: eager, {s.chain_len} ops on {s.big_factor}x the elements":
               (s.chain_numel * s.big_factor, lambda: _chain(big, s.chain_len))}
    notes = {}
    if s.compile:
        compiled = kit.compile_fresh(lambda t: _chain(t, s.chain_len), dynamic=False)
        torch.testing.assert_close(compiled(small), _chain(small, s.chain_len))
        fns["torch.compile: one fused kernel"] = (s.chain_numel, lambda: compiled(small))
    else:
        notes["torch.compile: one fused kernel"] = ("not run in this profile "
                                                    "(compiling costs ~10-25 s on a CPU)")
    if device == "cuda":
        graph, replay = _cuda_graph(small, s.chain_len)
        if graph is None:
            notes["CUDA graph: the eager chain, replayed"] = f"capture failed: {replay}"
        else:
            fns["CUDA graph: the eager chain, replayed"] = (s.chain_numel, replay)
    else:
        notes["CUDA graph: the eager chain, replayed"] = "needs a CUDA GPU"
    calls = {name: fn for name, (_, fn) in fns.items()}
    timings, consistency = bench.measure_consistently(calls, bench.noise_problems,
                                                      attempts=s.attempts, **time)
    rows = [{"kind": "remedy", "name": name, "numel": n, "chain_len": s.chain_len,
             **timing_fields(timings[name])}
            for name, (n, _) in fns.items()]
    rows += [{"kind": "remedy", "name": name, "note": note} for name, note in notes.items()]
    return rows + [{"kind": "remedy consistency", "problems": list(consistency.problems),
                    "attempts": consistency.attempts}]


def _cuda_graph(x: torch.Tensor, k: int):
    """(graph, replay) of the eager chain captured as a CUDA graph, or (None, the error)."""
    try:
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # warm up on a side stream before capture, as the CUDA docs advise
        with torch.cuda.stream(side):
            for _ in range(3):
                _chain(static_x, k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = _chain(static_x, k)
        graph.replay()
        torch.testing.assert_close(static_y, _chain(static_x, k))
        return graph, graph.replay
    except RuntimeError as err:  # reported in the rows, never hidden
        return None, str(err)


# --- reading the rows (live or recorded) ----------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """T(n) = overhead_s + 8 n / bytes_per_s, from the smallest sizes and the in-place probe of the
    run (the copy probe in older records: `beta_from`)."""

    overhead_s: float
    bytes_per_s: float
    beta_from: str = "in-place"  # or "copy"

    def time_s(self, n: int) -> float:
        return roofline.overhead_time_s(8 * n, self.overhead_s, self.bytes_per_s)

    @property
    def flat_n(self) -> float:
        """Where moving the bytes takes as long as the overhead: n = T0 * beta / 8."""
        return self.overhead_s * self.bytes_per_s / 8


def per_op(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Median seconds per op at each n and 2n."""
    return {r["n"]: r["per_op_s"] for r in rows if r["kind"] == "size"}


def model(rows: list[dict[str, Any]]) -> Model:
    sizes = sorted({r["of"] for r in rows if r["kind"] == "size"})
    t = per_op(rows)
    probes = [r for r in rows if r["kind"] == "probe"]
    probe = next((r for r in probes if r.get("in_place")), probes[0])
    return Model(statistics.median(t[n] for n in sizes[:SMALLEST]),
                 probe["work"] / probe["median_s"], "in-place" if probe.get("in_place") else "copy")


def doubling(rows: list[dict[str, Any]]) -> dict[int, float]:
    """T(2n) / T(n) at each n of the sweep."""
    t = per_op(rows)
    return {r["of"]: t[2 * r["of"]] / t[r["of"]]
            for r in rows if r["kind"] == "size" and r["n"] == r["of"]}


def table(rows: list[dict[str, Any]]) -> Table:
    m, t, d = model(rows), per_op(rows), doubling(rows)
    return Table(["n (fp32 elements)", "measured µs / op", "model µs / op",
                  "T(2n) / T(n) measured", "T(2n) / T(n) model"],
                 [[f"{n:,}", num(t[n] * 1e6), num(m.time_s(n) * 1e6), f"{d[n]:.2f}",
                   f"{m.time_s(2 * n) / m.time_s(n):.2f}"] for n in d])


def remedy_table(rows: list[dict[str, Any]]) -> Table:
    remedies = [r for r in rows if r["kind"] == "remedy"]
    base = remedies[0]["median_s"]
    out = []
    for r in remedies:
        if "note" in r:
            out.append([r["name"], r["note"], "-", "-"])
        else:
            out.append([r["name"], num(r["median_s"] * 1e6),
                        num(r["median_s"] / (r["chain_len"] * r["numel"]) * 1e9),
                        f"{base / r['median_s']:.2f}"])
    return Table(["version", "µs per chain", "ns per element-op", "speed-up over eager"], out)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The doubling test and the remedies, in words computed from the numbers."""
    c = kit.first(rows, "consistency")
    m, d = model(rows), doubling(rows)
    small = [n for n in d if m.time_s(n) < 2 * m.overhead_s]
    flat = [n for n in d if d[n] < 1.25]
    largest = max(d)
    doubling_text = (f"below about {m.flat_n:,.0f} elements an op costs its overhead, "
                     f"{m.overhead_s * 1e6:.2f} µs: doubling n changed the time by at most "
                     f"{max((d[n] for n in small), default=1):.2f}x there "
                     f"(flat up to n = {max(flat, default=0):,}), while at n = {largest:,} "
                     f"doubling costs {d[largest]:.2f}x")
    doubling_text += "; " + fast_text(rows)
    remedies = [r for r in rows if r["kind"] == "remedy" and "median_s" in r]
    remedy_problems = kit.first(rows, "remedy consistency")["problems"]
    base = remedies[0]
    parts = [compare_speed(r["name"].split(":")[0], r["median_s"], "the eager chain",
                           base["median_s"])
             for r in remedies[2:]]
    big = remedies[1]
    remedy_text = (f"{big['numel'] // base['numel']}x the data took "
                   f"{big['median_s'] / base['median_s']:.1f}x the time"
                   + (f"; {'; '.join(parts)}" if parts else
                      "; neither torch.compile nor a CUDA graph ran in this profile"))
    return {"doubling": verdict(doubling_text, c["problems"]),
            "remedies": verdict(remedy_text, remedy_problems)}


def fast_text(rows: list[dict[str, Any]]) -> str:
    """Every size measured under `FAST` times the model, in words. Under `FAST` times its bytes'
    time alone, 8n / beta, it beats the bandwidth: its tensor stays in a cache (at the largest
    size, beyond the caches, beta itself falls short). Otherwise the overhead overlapped the
    transfer (T near max(T0, 8n / beta), not their sum: on a GPU the launches run ahead of the
    kernels)."""
    m, t, d = model(rows), per_op(rows), doubling(rows)
    ratio = {n: t[n] / m.time_s(n) for n in d}
    fast = [n for n in d if ratio[n] < FAST]
    if not fast:
        return f"no size runs under {FAST:g}x the model"
    beats = {n for n in fast if t[n] < FAST * 8 * n / m.bytes_per_s}
    named = [n for n in fast if n != max(d) or n not in beats]
    parts = []
    for label, group in (("faster than beta allows, so those tensors stay in a cache",
                          [n for n in named if n in beats]),
                         ("slower than their bytes alone, faster than the overhead plus the bytes:"
                          " the overhead overlapped the transfer", [n for n in named
                                                                    if n not in beats])):
        if group:
            parts.append(f"at n = {', '.join(f'{n:,} ({ratio[n]:.2f}x)' for n in group)} the "
                         f"measurement is under {FAST:g}x the model, {label}")
    if max(d) in beats:
        why = ("the copy it was read from also reads each destination line before writing it "
               "(write-allocate), and an in-place op does not" if m.beta_from == "copy" else
               "this op gets more than the probe did")
        parts.append(f"at the largest, n = {max(d):,} ({4 * max(d) / 2**20:,.0f} MiB, beyond the "
                     f"caches), it is {ratio[max(d)]:.2f}x the model: beta understates this op's "
                     f"bandwidth, since {why}")
    return "; ".join(parts)


def plot(rows: list[dict[str, Any]], axes) -> None:
    from mlsys.plotting import COLORS, finish  # matplotlib: only when a page draws

    ax1, ax2 = axes
    m, t, d = model(rows), per_op(rows), doubling(rows)
    ns = list(d)
    ax1.plot(ns, [t[n] * 1e6 for n in ns], "o-", color=COLORS["measured"], label="measured")
    ax1.plot(ns, [m.time_s(n) * 1e6 for n in ns], "-", color=COLORS["predicted"],
             label=r"model $T_0 + 8n/\beta$ (measured $T_0$, $\beta$)")
    ax1.axhline(m.overhead_s * 1e6, color=COLORS["ceiling"], lw=1, ls=":",
                label="per-op overhead $T_0$")
    ax1.axvline(m.flat_n, color=COLORS["muted"], lw=1, ls=":")
    finish(ax1, title="Time per op against size", xlabel="n (fp32 elements)", ylabel="µs per op",
           logx=2, logy=True)
    ax2.plot(ns, [d[n] for n in ns], "o-", color=COLORS["measured"], label="measured")
    ax2.plot(ns, [m.time_s(2 * n) / m.time_s(n) for n in ns], "-", color=COLORS["predicted"],
             label="model")
    for level in (1, 2):
        ax2.axhline(level, color=COLORS["muted"], lw=1)
    finish(ax2, title="Double the size: T(2n) / T(n)", xlabel="n (fp32 elements)", ylabel="ratio",
           logx=2)


EXPERIMENT = Experiment(
    name="op_overhead",
    chapter="04_bytes",
    description=("time per op from 1 element up (overhead regime); "
                 "compile and CUDA graphs as remedies"),
    gpu_seconds=45,
    sizes=SIZES,
    run=run,
)
