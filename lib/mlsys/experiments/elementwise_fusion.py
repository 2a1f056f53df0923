"""Fusion, measured: k fma steps per element, fused or eager, and `x.cos().cos()` in one kernel or
two.

The k-sweep walks one kernel along the roofline: `repeat_unary(x, k, "fma")` reads each element
once, applies y <- a*y + b k times in registers and writes once (2k FLOPs for 2b bytes), so it is
memory-bound for small k and compute-bound for large k. The eager chain (`repeat_unary_ref`, k
separate ops) makes k round trips through memory at every k. "Fused" is the Triton kernel on a GPU
and `torch.compile` of the chain on a CPU (inductor fuses it into one loop); the smoke profile does
not compile, and then only the eager half runs.

The two roofs are measured in the same interleaved run, independently of the sweep they judge: the
copy bandwidth (`mlsys.probes.copy_probe`) and the vector roof, the fused chain at a large k on a
tensor small enough to stay in cache, so that memory is out of the way (never a roof fitted from
the sweep itself). On a GPU the spec's fp32 CUDA-core peak is shown beside it. On a CPU the run
keeps freed memory mapped (`bench.kept_cpu_memory`), as `roofline_ops` does: every eager op and
every compiled call writes a fresh output of tens of MB, and without it each would be new memory
that the OS maps and zeroes page by page, several times the time its bytes need.
The verdicts tell apart what the rows can show: noise (spread, drift), a sweep faster than the
vector-roof probe (the probe reads the roof too low), and a systematic miss (every low-k row slower
than its prediction by more than `MISS`: a cost the model leaves out); the cos(cos(x)) verdict is
judged on its own rows.
Longer than 300 lines, and one module: the sweep, cos(cos(x)) and both roofs are timed in one
interleaved run that is repeated until consistent, so they share one record and its readers.
Used in: §sec-bytes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env, hardware, roofline
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.probes import Probe, copy_probe


@dataclass(frozen=True)
class Sizes:
    numel: int  # fp32 elements of the sweep and of cos(cos(x)): far above the last-level cache
    ks: tuple[int, ...]  # fma steps per element
    copy_bytes: int
    roof_numel: int  # elements of the vector-roof probe: small enough to stay in cache
    roof_k: int  # fma steps of the vector-roof probe: far into the compute-bound regime
    fuse: bool  # time a fused version (Triton on a GPU, torch.compile on a CPU)
    warmup: int
    repeats: int
    attempts: int


SIZES = {
    "smoke": Sizes(2**24, (1, 2, 4, 8), 2**27, 2**15, 128, False, 1, 5, 2),
    "cpu": Sizes(2**24, (1, 2, 4, 8, 16, 32, 64), 2**28, 2**15, 256, True, 2, 7, 3),
    # roof_numel: 16 MiB in and out stay in a 50 MiB L2, and fill every SM (2**20 did not: the
    # H200 sweep beat that probe by 1.3-1.5x)
    "gpu": Sizes(2**26, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512), 2**31, 2**22, 1024, True,
                 5, 20, 3),
}
DTYPE = "fp32"  # fma in fp32 arithmetic: the vector units' fp32 rate is the compute roof
MISS = 2.0
"""Measured / predicted time above this at the sweep's lowest k is a systematic miss, not noise:
noise scatters both ways and rarely doubles a median, a cost the model leaves out (page faults, a
slow path) pushes every row the same way."""


def _fused_chain(k: int, device: str):
    """One fused kernel for the k-step chain: Triton on a GPU, torch.compile elsewhere."""
    from mlsys.kernels import elementwise  # Triton (may be absent): where a kernel runs

    if device == "cuda":
        return lambda t: elementwise.repeat_unary(t, k, "fma")
    # k is baked into the unrolled chain: a fresh graph per k
    return kit.compile_fresh(lambda t: elementwise.repeat_unary_ref(t, k, "fma"), dynamic=False)


def _cos_cos(t: torch.Tensor) -> torch.Tensor:
    return t.cos().cos()


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Measure the sweep, cos(cos(x)) and both roofs, interleaved, until consistent (on a CPU
    with freed memory kept mapped)."""
    device = device or env.device()
    with bench.kept_cpu_memory() if device == "cpu" else contextlib.nullcontext(False) as kept:
        rows = _measure(s, device)
    rows[-1].update(device=device, kept_memory=bool(kept))
    return rows


def _measure(s: Sizes, device: str) -> list[dict[str, Any]]:
    from mlsys.kernels import elementwise  # Triton (may be absent): where a kernel runs

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(s.numel, generator=gen).to(device)
    impl = ("triton" if device == "cuda" else "torch.compile") if s.fuse else None
    probes: dict[str, Probe] = {}
    copy = copy_probe(s.copy_bytes, device=device)
    probes[copy.name] = copy
    if impl is not None:
        small = torch.randn(s.roof_numel, generator=gen).to(device)
        chain = _fused_chain(s.roof_k, device)
        torch.testing.assert_close(chain(small),
                                   elementwise.repeat_unary_ref(small, s.roof_k, "fma"))
        name = (f"vector roof: fused chain, k = {s.roof_k}, "
                f"{s.roof_numel:,} elements (in cache)")
        probes[name] = Probe(name, lambda: chain(small),
                             elementwise.repeat_unary_flops(s.roof_numel, s.roof_k), "flop")
    fns = {name: p.fn for name, p in probes.items()}
    sweep = []  # (name, impl, k)
    for k in s.ks:
        fns[f"eager k={k}"] = lambda k=k: elementwise.repeat_unary_ref(x, k, "fma")
        sweep.append((f"eager k={k}", "eager", k))
        if impl is not None:
            fused = _fused_chain(k, device)
            torch.testing.assert_close(fused(x), elementwise.repeat_unary_ref(x, k, "fma"))
            fns[f"fused k={k}"] = lambda fused=fused: fused(x)
            sweep.append((f"fused k={k}", impl, k))
    cos = {"eager x.cos().cos() (2 ops)": ("eager", lambda: _cos_cos(x)),
           "eager x.cos() (1 op, for scale)": ("eager, one op", lambda: x.cos())}
    if impl == "torch.compile":
        compiled = kit.compile_fresh(_cos_cos, dynamic=False)
        torch.testing.assert_close(compiled(x), _cos_cos(x))
        cos["torch.compile (1 fused kernel)"] = ("fused", lambda: compiled(x))
    if impl == "triton":
        torch.testing.assert_close(elementwise.repeat_unary(x, 2, "cos"), _cos_cos(x))
        cos["Triton repeat_unary(x, 2, 'cos')"] = ("fused",
                                                   lambda: elementwise.repeat_unary(x, 2, "cos"))
    fns.update({name: fn for name, (_, fn) in cos.items()})
    n_bytes = elementwise.repeat_unary_bytes(s.numel, DTYPE)

    def check(timings: dict[str, bench.Timing]) -> list[str]:
        problems = bench.noise_problems(timings)
        roof = _roof(timings, probes)
        if roof is not None:
            points = [(name, elementwise.repeat_unary_flops(s.numel, k),
                       n_bytes * (k if kind == "eager" else 1), timings[name].median_s)
                      for name, kind, k in sweep]
            problems += roofline.roof_problems(points, roof)
        return problems

    time = dict(warmup=s.warmup, repeats=s.repeats, device=device, min_sample_s=bench.MIN_SAMPLE_S)
    timings, consistency = bench.measure_consistently(fns, check, attempts=s.attempts, **time)
    rows = [{"kind": "probe", "name": n, "unit": p.unit, "work": p.work,
             **timing_fields(timings[n])}
            for n, p in probes.items()]
    rows += [{"kind": "sweep", "name": name, "impl": kind, "k": k, "numel": s.numel,
              "flops": elementwise.repeat_unary_flops(s.numel, k),
              "bytes": (elementwise.eager_chain_bytes(s.numel, DTYPE, k) if kind == "eager"
                        else n_bytes),
              **timing_fields(timings[name])} for name, kind, k in sweep]
    rows += [{"kind": "cos", "name": name, "impl": kind, "numel": s.numel,
              **timing_fields(timings[name])}
             for name, (kind, _) in cos.items()]
    rows.append({"kind": "consistency", "problems": list(consistency.problems),
                 "attempts": consistency.attempts, "fused_impl": impl})
    return rows


def _roof(timings: dict[str, bench.Timing], probes: dict[str, Probe]) -> roofline.Ceilings | None:
    bw = max(p.rate(timings[n].median_s) for n, p in probes.items() if p.unit == "bytes")
    flop = [p.rate(timings[n].median_s) for n, p in probes.items() if p.unit == "flop"]
    return roofline.Ceilings(max(flop), bw, "fused elementwise") if flop else None


# --- reading the rows (live or recorded) ----------------------------------------------------------


def consistency(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return kit.first(rows, "consistency")


def ceilings(rows: list[dict[str, Any]]) -> roofline.Ceilings | None:
    """Copy bandwidth and the in-cache vector roof of the run; None when nothing was fused."""
    flop = [r["work"] / r["median_s"] for r in rows if r["kind"] == "probe" and r["unit"] == "flop"]
    return roofline.Ceilings(max(flop), copy_bandwidth(rows), "measured") if flop else None


def copy_bandwidth(rows: list[dict[str, Any]]) -> float:
    return max(r["work"] / r["median_s"]
               for r in rows if r["kind"] == "probe" and r["unit"] == "bytes")


def sweep(rows: list[dict[str, Any]], impl: str) -> list[dict[str, Any]]:
    """The sweep rows of one implementation ("eager", "triton", "torch.compile"), by k."""
    return sorted((r for r in rows if r["kind"] == "sweep" and r["impl"] == impl),
                  key=lambda r: r["k"])


def predicted_s(row: dict[str, Any], roof: roofline.Ceilings) -> float:
    """Roofline time of a sweep row; the eager chain is k ops of one FMA step each."""
    if row["impl"] == "eager":
        per_op = roofline.estimate(row["flops"] / row["k"], row["bytes"] / row["k"], roof)
        return row["k"] * per_op.time_s
    return roofline.estimate(row["flops"], row["bytes"], roof).time_s


def ridge_k(rows: list[dict[str, Any]]) -> float | None:
    """k* = b * P_vector / beta: where the fused kernel's intensity k / b reaches the ridge."""
    roof = ceilings(rows)
    return None if roof is None else 4 * roof.ridge_intensity


def table(rows: list[dict[str, Any]]) -> Table:
    roof = ceilings(rows)
    fused_impl = consistency(rows)["fused_impl"]
    fused = {r["k"]: r for r in sweep(rows, fused_impl)} if fused_impl else {}
    out = []
    for e in sweep(rows, "eager"):
        k = e["k"]
        f = fused.get(k)
        cells = [k, f"{k / 4:.3g}"]
        if f is not None and roof is not None:
            cells += [roofline.estimate(f["flops"], f["bytes"], roof).bound,
                      num(1e3 * predicted_s(f, roof)), num(1e3 * f["median_s"]),
                      num(f["flops"] / f["median_s"] / 1e9)]
        else:
            cells += ["-", "-", "not run", "-"]
        cells += [num(1e3 * e["median_s"]), num(e["flops"] / e["median_s"] / 1e9),
                  num(e["bytes"] / e["median_s"] / 1e9)]
        out.append(cells)
    return Table(["k", "I fused (FLOP/B)", "fused: bound", "fused predicted ms",
                  "fused measured ms", "fused GFLOP/s", "eager measured ms", "eager GFLOP/s",
                  "eager GB/s"], out)


def cos_table(rows: list[dict[str, Any]]) -> Table:
    cos = [r for r in rows if r["kind"] == "cos"]
    eager = next(r for r in cos if r["impl"] == "eager")
    return Table(["implementation", "measured ms", "p20 – p80", "eager / this"],
                 [[r["name"], num(1e3 * r["median_s"]),
                   f"{num(1e3 * r['p20_s'])} – {num(1e3 * r['p80_s'])}",
                   f"{eager['median_s'] / r['median_s']:.2f}"] for r in cos])


def _noise(rows: list[dict[str, Any]], kinds: tuple[str, ...]) -> list[str]:
    """Spread and drift of the timings of `kinds` (and of the probes), recomputed from the rows."""
    return bench.noise_problems({r["name"]: timing_of(r) for r in rows
                                 if r["kind"] in kinds or r["kind"] == "probe"})


def misses(rows: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """(k, measured / predicted) at the sweep's lowest k, per implementation timed ("eager" and
    the fused one). Without a vector roof (nothing fused) the eager prediction is its bytes over
    the copy bandwidth: each of its ops is memory-bound on any device."""
    roof = ceilings(rows)
    impls = ["eager"] + ([consistency(rows)["fused_impl"]] if roof is not None else [])
    out = {}
    for impl in impls:
        low = sweep(rows, impl)[0]
        predicted = (predicted_s(low, roof) if roof is not None
                     else low["bytes"] / copy_bandwidth(rows))
        out[impl] = (low["k"], low["median_s"] / predicted)
    return out


def _miss_text(rows: list[dict[str, Any]]) -> str:
    """The systematic miss at low k in words, with its cause where the rows name one; "" if none."""
    missed = {impl: m for impl, m in misses(rows).items() if m[1] > MISS}
    if not missed:
        return ""
    c = consistency(rows)
    parts = [f"{'the eager chain' if impl == 'eager' else 'the fused kernel'} {x:.1f}x at k = {k}"
             for impl, (k, x) in missed.items()]
    text = (f"a systematic miss: measured / predicted is {' and '.join(parts)}, more than "
            f"{MISS:g}x and in one direction, so the ops did not run at the copy bandwidth")
    if c.get("device") == "cpu" and c.get("kept_memory") is False:
        return text + (" (freed memory was not kept mapped: every output was new memory the OS "
                       "mapped and zeroed page by page)")
    return text + " (a cost the model leaves out, which these rows do not name)"


def sweep_verdict(rows: list[dict[str, Any]]) -> str:
    """How the eager chain's time grew with k and, when one ran, where the fused kernel turned
    compute-bound and how it compares with the eager chain: computed from the numbers. Withheld
    for noise; a sweep that beats the vector-roof probe, or misses its prediction by more than
    `MISS` at low k, is named as such (neither is noise)."""
    eager = {r["k"]: r for r in sweep(rows, "eager")}
    k0, k1 = min(eager), max(eager)
    growth = eager[k1]["median_s"] / eager[k0]["median_s"]
    rates = [r["flops"] / r["median_s"] / 1e9 for r in eager.values()]
    follows = ("as its round trips predict" if growth >= (k1 / k0) / 1.5 else
               "less than its round trips predict")
    eager_text = (f"the eager chain's time grew {growth:.1f}x from k = {k0} to k = {k1}, "
                  f"{follows} ({k1 // k0}x), at {num(min(rates), 2)} to {num(max(rates), 2)} "
                  "GFLOP/s")
    noise = _noise(rows, ("sweep",))
    roof = ceilings(rows)
    if roof is None:
        none = ("; no fused version was timed in this profile (the smoke profile does not compile, "
                "and Triton is timed only on a GPU)")
        text = eager_text + none
    else:
        fused = sweep(rows, consistency(rows)["fused_impl"])
        flat = [r["k"] for r in fused if r["median_s"] <= 1.5 * fused[0]["median_s"]]
        last = fused[-1]
        speed = compare_speed("the fused kernel", last["median_s"],
                              "the eager chain", eager[last["k"]]["median_s"])
        text = (f"the fused kernel's time stays within 1.5x of its k = {fused[0]['k']} time "
                f"up to k = {max(flat)} (predicted turn: k* = {ridge_k(rows):.0f}), "
                f"and at k = {last['k']} {speed}; {eager_text}")
        beat = roofline.roof_problems([(r["name"], r["flops"], r["bytes"], r["median_s"])
                                       for r in rows if r["kind"] == "sweep"], roof)
        if beat and not noise:
            text += (f"; but the sweep beat the in-cache vector-roof probe ({'; '.join(beat[:2])}"
                     f"{'; ...' if len(beat) > 2 else ''}): that probe reads this device's vector "
                     "roof too low, so the predicted turn comes too early")
    miss = _miss_text(rows)
    return verdict(f"{text}; {miss}" if miss else text, noise)


def model_sentence(rows: list[dict[str, Any]]) -> str:
    """The roofline's explanation of the sweep, stated only as far as the rows bear it out."""
    model = ("below the turn a fused kernel runs at the copy bandwidth and extra FLOPs are free, "
             "above it bytes/s falls as 1/k; the eager chain never gets there, since each of its "
             "ops is memory-bound whatever k is")
    if _noise(rows, ("sweep",)):
        return ("What the model predicts, which these numbers can neither confirm nor refute: "
                f"{model}.")
    if _miss_text(rows):
        return ("The model does not describe this run, whose ops missed the copy bandwidth by "
                f"more than {MISS:g}x; it predicts that {model}.")
    if ceilings(rows) is None:
        return f"What the model predicts, with no fused kernel timed here to check it: {model}."
    return f"The model says why: {model}."


def cos_verdict(rows: list[dict[str, Any]]) -> str:
    """Fused cos(cos(x)) against the eager pair, read against the byte ratio of 2; judged on its
    own rows (their timings and the copy probe's), not on the sweep's problems."""
    cos = [r for r in rows if r["kind"] == "cos"]
    eager = next(r for r in cos if r["impl"] == "eager")
    fused = [r for r in cos if r["impl"] == "fused"]
    # two round trips of 4-byte floats
    predicted_eager_s = 4 * eager["numel"] * 4 / copy_bandwidth(rows)
    eager_slowdown = eager["median_s"] / predicted_eager_s
    if not fused:
        return ("no fused version was timed in this profile; the eager pair took "
                f"{eager_slowdown:.1f}x the time its bytes need at the copy bandwidth")
    best = min(fused, key=lambda r: r["median_s"])
    ratio = eager["median_s"] / best["median_s"]
    if ratio < 1 / 1.1:
        why = ("the fused kernel is slower than eager: here the time is set by how each version "
               "computes cos, not by the bytes they move")
    elif ratio < 2 / 1.5:
        why = ("less than the byte ratio of 2: the cosine's arithmetic, not memory, sets much of "
               f"the time (the eager pair took {eager_slowdown:.1f}x what its bytes need)")
    elif ratio <= 2 * 1.5:
        why = "close to the byte ratio of 2: the ops are memory-bound here, so time follows bytes"
    else:
        why = ("more than the bytes explain: the eager ops were not memory-bound "
               f"({eager_slowdown:.1f}x what their bytes need) and the fused code also "
               "computes cos faster")
    speed = compare_speed(best["name"], best["median_s"], "the eager pair", eager["median_s"])
    return verdict(f"{speed}: {why}", _noise(rows, ("cos",)))


def recorded_cos_text() -> str:
    """What the GPU records of this experiment (`results/`) say of cos(cos(x)), or that none
    exists yet and how to make one."""
    from mlsys.experiments import recorded  # the records' reader (results/)

    records = recorded(EXPERIMENT.name)
    if not records:
        return (f"No GPU run of it is recorded yet (`python -m mlsys.experiments "
                f"{EXPERIMENT.name}` on a CUDA GPU records one)")
    return "; ".join(f"Recorded on {r['provenance']['device']}: {cos_verdict(r['results'])}"
                     for r in records)


def plot(rows: list[dict[str, Any]], axes, *,
         accelerator: hardware.Accelerator | None = None) -> None:
    """Achieved FLOP/s and bytes/s against k: measured, predicted, and the two roofs."""
    from mlsys.plotting import COLORS, finish  # matplotlib: only when a page draws

    ax1, ax2 = axes
    roof = ceilings(rows)
    impl = consistency(rows)["fused_impl"]
    eager = sweep(rows, "eager")
    ks = [r["k"] for r in eager]
    ax1.plot(ks, [r["flops"] / r["median_s"] for r in eager], "s--", color=COLORS["measured"],
             mfc="none", label="eager chain, measured")
    if roof is not None:
        fused = sweep(rows, impl)
        ax1.plot(ks, [r["flops"] / predicted_s(r, roof) for r in fused], "-",
                 color=COLORS["predicted"], label="fused, predicted")
        ax1.plot(ks, [r["flops"] / predicted_s(r, roof) for r in eager], "--",
                 color=COLORS["predicted"], label="eager, predicted")
        ax1.plot(ks, [r["flops"] / r["median_s"] for r in fused], "o-", color=COLORS["measured"],
                 label=f"fused ({impl}), measured")
        ax1.axhline(roof.flop_per_s, color=COLORS["ceiling"], lw=1,
                    label="vector roof (in-cache probe)")
        ax1.axvline(ridge_k(rows), color=COLORS["muted"], ls=":", lw=1)
        ax2.plot(ks, [r["bytes"] / r["median_s"] for r in fused], "o-", color=COLORS["measured"],
                 label=f"fused ({impl}), measured")
    if accelerator is not None:
        ax1.axhline(accelerator.peak_flop_per_s("fp32"), color=COLORS["muted"], lw=1, ls="--",
                    label=f"{accelerator.name} fp32 peak (spec)")
    ax2.plot(ks, [r["bytes"] / r["median_s"] for r in eager], "s--", color=COLORS["measured"],
             mfc="none", label="eager chain, measured (its own bytes)")
    ax2.axhline(copy_bandwidth(rows), color=COLORS["ceiling"], lw=1, label="copy bandwidth (probe)")
    finish(ax1, title="Achieved FLOP/s against k", xlabel="k (fma steps per element)",
           ylabel="FLOP/s", logx=2, logy=True)
    finish(ax2, title="Achieved bytes/s against k", xlabel="k (fma steps per element)",
           ylabel="bytes/s", logx=2, logy=True)
    for ax in axes:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)


EXPERIMENT = Experiment(
    name="elementwise_fusion",
    chapter="04_bytes",
    description="k fma steps per element, fused vs eager, and cos(cos(x)); roofs probed alongside",
    gpu_seconds=35,
    sizes=SIZES,
    run=run,
)
