"""The seed's attention sweep: naive attention, eager and compiled, time and memory by length.

One head, a batch of sequences, head dims and lengths as in the CS336 assignment's
`pytorch_attention` question (batch 8, d in {16, 32, 64, 128}, 256 to 16,384 tokens on a GPU). Per
row: the forward and the forward + backward timed round-robin (backward = their difference), and
the memory of one forward and backward read by `memory_meter.meter` from fresh inputs: what is
live when the forward ends (what autograd keeps for the backward) and the peak during the
backward, both above the inputs. Each is predicted before it is read
(`accounting.attention.naive_memory`). The same function compiled (`torch.compile`) is a second
variant: Inductor fuses the softmax and its backward, and may keep fewer n x n matrices. A length
that runs out of memory is recorded and the longer ones of that variant are skipped.
Used in: §sec-attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.accounting import attention as attention_cost
from mlsys.book import Table, num, verdict
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.experiments.kit import setup
from mlsys.ops.attention import naive_attention
from mlsys.profiling import memory_meter

VARIANTS = ("eager", "compiled")


@dataclass(frozen=True)
class Sizes:
    batch: int
    d_heads: tuple[int, ...]
    seqs: tuple[int, ...]
    dtype: str
    causal: bool
    compile: bool  # False: eager only (a cold compile costs seconds per shape on a CPU)
    warmup: int
    repeats: int


SIZES = {
    "smoke": Sizes(2, (16, 64), (64, 128, 256), "fp32", False, False, 1, 3),
    "cpu": Sizes(8, (16, 64), (128, 256, 512, 1_024), "fp32", False, True, 1, 5),
    "gpu": Sizes(8, (16, 32, 64, 128), (256, 1_024, 4_096, 8_192, 16_384, 32_768), "fp32",
                 False, True, 2, 10),
}


def _inputs(s: Sizes, seq: int, d: int, device: str, gen: torch.Generator):
    shape = (s.batch, 1, seq, d)
    dtype = torch_dtype(s.dtype)
    q, k, v = (torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(shape, generator=gen).to(device, dtype)


def _memory(fn, s: Sizes, seq: int, d: int, device: str, gen) -> dict[str, int]:
    """One forward and backward from fresh inputs, read by a meter (bytes above the inputs)."""
    q, k, v, grad = _inputs(s, seq, d, device, gen)
    meter = memory_meter.meter(device)
    with meter.recording():
        with meter.phase("forward"):
            out = fn(q, k, v)
        with meter.phase("backward"):
            out.backward(grad)
    rows = {r["phase"]: r for r in meter.rows}
    del out, q, k, v, grad
    return {"before_backward_bytes": rows["forward"]["live_bytes"],
            "backward_peak_bytes": rows["backward"]["peak_bytes"]}


def _timings(fn, s: Sizes, seq: int, d: int, device: str, gen) -> dict[str, bench.Timing]:
    q, k, v, grad = _inputs(s, seq, d, device, gen)

    def forward() -> None:
        fn(q, k, v)

    def forward_backward() -> None:
        fn(q, k, v).backward(grad)

    return bench.benchmark_interleaved({"forward": forward, "forward+backward": forward_backward},
                                       warmup=s.warmup, repeats=s.repeats, device=device)


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every variant x head dim x length (out-of-memory rows kept, longer lengths skipped)."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)

    def eager(q, k, v):
        return naive_attention(q, k, v, is_causal=s.causal)

    variants = {"eager": eager}
    if s.compile:
        variants["compiled"] = kit.compile_fresh(eager, dynamic=False)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "batch": s.batch, "dtype": s.dtype,
                                   "causal": s.causal, "compiled": s.compile}]
    for name, fn in variants.items():
        for d in s.d_heads:
            failed = False
            for seq in bench.progress(s.seqs, desc=f"{name}, d={d}"):
                row = {"kind": "row", "variant": name, "d_head": d, "seq": seq}
                if failed:
                    rows.append({**row, "status": "skipped (a shorter length ran out of memory)"})
                    continue
                with kit.OutOfMemory() as oom:
                    if name == "compiled":  # compile outside the measurements
                        q, k, v, grad = _inputs(s, seq, d, device, gen)
                        fn(q, k, v).backward(grad)
                        del q, k, v, grad
                    memory = _memory(fn, s, seq, d, device, gen)
                    timings = _timings(fn, s, seq, d, device, gen)
                if oom.happened:
                    rows.append({**row, "status": kit.OUT_OF_MEMORY})
                    failed = True
                else:
                    rows.append({**row, "status": "ok", **memory,
                                 "problems": bench.noise_problems(timings),
                                 **{m: timing_fields(t) for m, t in timings.items()}})
                kit.free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def measured(rows: list[dict[str, Any]], variant: str | None = None) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "row" and r["status"] == "ok"
            and variant in (None, r["variant"])]


def predicted(rows: list[dict[str, Any]], r: dict[str, Any]) -> attention_cost.NaiveMemory:
    st = setup(rows)
    return attention_cost.naive_memory(st["batch"], 1, r["seq"], r["seq"], r["d_head"],
                                       st["dtype"], causal=st["causal"])


def backward_s(r: dict[str, Any]) -> float:
    return r["forward+backward"]["median_s"] - r["forward"]["median_s"]


def table(rows: list[dict[str, Any]]) -> Table:
    """Per variant, head dim and length: times, memory measured and predicted (MB), and the
    measured bytes per n^2 before the backward."""
    body = []
    for r in (r for r in rows if r["kind"] == "row"):
        cells = [r["variant"], r["d_head"], f"{r['seq']:,}"]
        if r["status"] != "ok":
            body.append(cells + [r["status"]] + [""] * 6)
            continue
        p = predicted(rows, r)
        eager = r["variant"] == "eager"  # the prediction is eager autograd's
        body.append(cells + [num(r["forward"]["median_s"] * 1e3), num(backward_s(r) * 1e3),
                             num(r["before_backward_bytes"] / 1e6),
                             num(p.before_backward_bytes / 1e6) if eager else "-",
                             num(r["backward_peak_bytes"] / 1e6),
                             num(p.backward_peak_bytes / 1e6) if eager else "-",
                             f"{r['before_backward_bytes'] / r['seq'] ** 2:.1f}"])
    return Table(["variant", "d", "seq", "forward ms", "backward ms", "before backward (MB)",
                  "predicted (MB)", "backward peak (MB)", "predicted (MB)",
                  "bytes / n² before backward"], body)


def matrices(rows: list[dict[str, Any]], r: dict[str, Any], key: str) -> float:
    """A row's memory reading in n x n matrices of the run's dtype (batch x n^2 x b bytes)."""
    return r[key] / predicted(rows, r).matrix_bytes


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The prediction checked, n x n matrices held before and during the backward by each variant,
    and the time ratio of compiled to eager at the longest common length."""
    eager = measured(rows, "eager")
    worst = max(max(abs(r[k] / getattr(predicted(rows, r), k) - 1)
                    for k in ("before_backward_bytes", "backward_peak_bytes")) for r in eager)
    longest = max(eager, key=lambda r: (r["seq"], r["d_head"]))
    per_pair = longest["before_backward_bytes"] / longest["seq"] ** 2
    memory = (f"every eager row is within {worst:.1%} of the prediction; at {longest['seq']:,} "
              f"tokens the forward leaves {per_pair:.1f} bytes per (query, key) pair for the "
              f"backward: {matrices(rows, longest, 'before_backward_bytes'):.2f} n x n matrices "
              f"of {setup(rows)['batch']} sequences, and "
              f"{matrices(rows, longest, 'backward_peak_bytes'):.2f} at the backward's peak")
    out = {"memory": memory}
    compiled = {(r["d_head"], r["seq"]): r for r in measured(rows, "compiled")}
    both = [r for r in eager if (r["d_head"], r["seq"]) in compiled]
    if not both:
        out["compiled"] = "torch.compile did not run in this profile"
        return out
    e = max(both, key=lambda r: (r["seq"], r["d_head"]))
    c = compiled[(e["d_head"], e["seq"])]
    problems = [f"{r['variant']} d={r['d_head']} at {r['seq']}: {p}" for r in (e, c)
                for p in r["problems"]]
    text = (f"at {e['seq']:,} tokens and d = {e['d_head']}, compiled attention keeps "
            f"{matrices(rows, c, 'before_backward_bytes'):.2f} n x n matrices before the backward "
            f"and {matrices(rows, c, 'backward_peak_bytes'):.2f} at its peak (eager: "
            f"{matrices(rows, e, 'before_backward_bytes'):.2f} and "
            f"{matrices(rows, e, 'backward_peak_bytes'):.2f}); its forward + backward took "
            f"{c['forward+backward']['median_s'] / e['forward+backward']['median_s']:.2f}x "
            "eager's time")
    out["compiled"] = verdict(text, problems + bench.noise_problems(
        {"eager": timing_of(e["forward+backward"]), "compiled": timing_of(c["forward+backward"])}))
    return out


def plot(rows: list[dict[str, Any]], axes) -> None:
    """Left: forward + backward time by length; right: memory before and during the backward,
    with the eager prediction dotted."""
    from mlsys.plotting import COLORS, CYCLE, finish  # matplotlib: only when a page draws

    for color, (variant, d) in zip(CYCLE, dict.fromkeys((r["variant"], r["d_head"])
                                                        for r in measured(rows)), strict=False):
        mine = [r for r in measured(rows, variant) if r["d_head"] == d]
        seqs = [r["seq"] for r in mine]
        label = f"{variant}, d={d}"
        axes[0].plot(seqs, [r["forward+backward"]["median_s"] * 1e3 for r in mine], "o-",
                     color=color, label=label)
        axes[1].plot(seqs, [r["backward_peak_bytes"] / 1e6 for r in mine], "^-", color=color,
                     label=f"{label}: backward peak")
        axes[1].plot(seqs, [r["before_backward_bytes"] / 1e6 for r in mine], "o--", color=color,
                     mfc="none", label=f"{label}: before backward")
    eager = measured(rows, "eager")
    if eager:
        d0 = eager[0]["d_head"]
        mine = [r for r in eager if r["d_head"] == d0]
        axes[1].plot([r["seq"] for r in mine],
                     [predicted(rows, r).backward_peak_bytes / 1e6 for r in mine], ":",
                     color=COLORS["predicted"], label=f"predicted peak, eager, d={d0}")
    finish(axes[0], title="forward + backward", xlabel="sequence length", ylabel="ms", logx=2,
           logy=True)
    finish(axes[1], title="memory above the inputs", xlabel="sequence length", ylabel="MB",
           logx=2, logy=True)
    for ax in axes:
        ax.legend(fontsize=6)


EXPERIMENT = Experiment(
    name="attention_sweep",
    chapter="06_attention",
    description="naive attention, eager and compiled: time and memory by length and head dim",
    gpu_seconds=160,
    sizes=SIZES,
    run=run,
)
