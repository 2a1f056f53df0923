"""MFU of full training steps, against a matmul ceiling measured in the same interleaved run.

A training step (forward, cross-entropy, backward, AdamW) of the book's transformer is timed at
several sequence lengths, round-robin with square matmul probes in the step's dtype: the ceiling
and the steps share the same moments of the machine, and a probe that drifts during the run is
caught and re-measured (a ceiling measured minutes apart moved threefold on a shared CPU). The
model FLOPs of a step come from `mlsys.accounting.flops` (3x the forward matmuls); MFU is those
FLOPs over time and ceiling, and, on a GPU the library knows, over the spec's dense peak too.
Used in: §sec-flops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env, hardware
from mlsys.accounting import flops, utilization
from mlsys.book import Table, num, verdict
from mlsys.experiments import Experiment, kit, timing_fields
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.probes import matmul_probe
from mlsys.training import make_train_step

MFU_TOLERANCE = 1.25
"""A step whose MFU against the measured ceiling exceeds this contradicts the ceiling
(re-measured)."""


@dataclass(frozen=True)
class Sizes:
    config: TransformerConfig
    batch: int
    seqs: tuple[int, ...]
    dtype: str  # "fp32", or "bf16" (matmuls under torch.autocast)
    ceiling_sizes: tuple[int, ...]  # N of the square matmul probes (the ceiling is the best)
    warmup: int
    repeats: int
    attempts: int


SIZES = {
    "smoke": Sizes(TransformerConfig.preset("debug"), 4, (32, 64, 128), "fp32", (256, 512),
                   1, 5, 2),
    "cpu": Sizes(TransformerConfig.preset("laptop"), 4, (64, 128, 256), "fp32", (512, 1_024),
                 2, 7, 3),
    "gpu": Sizes(TransformerConfig.preset("small"), 8, (128, 256, 512, 1_024), "bf16",
                 (4_096, 8_192), 5, 20, 3),
}


def step_flops(s: Sizes, seq: int) -> int:
    """Model FLOPs of one step: forward + backward matmuls, 3x the forward (`accounting.flops`)."""
    return flops.transformer_flops(s.config, s.batch, seq).training_matmul_flops


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Time the steps and the ceiling probes interleaved, until consistent."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    model = Transformer(s.config).to(device)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    autocast = "bf16" if s.dtype == "bf16" else None
    fns = {}
    for seq in s.seqs:
        tokens = torch.randint(s.config.vocab_size, (s.batch, seq + 1), generator=gen).to(device)
        fns[f"step seq={seq}"] = make_train_step(model, optimizer, tokens, autocast_dtype=autocast)
    probes = {p.name: p
              for p in (matmul_probe(n, dtype=s.dtype, device=device) for n in s.ceiling_sizes)}
    fns.update({name: p.fn for name, p in probes.items()})

    def check(timings: dict[str, bench.Timing]) -> list[str]:
        ceiling = max(p.rate(timings[n].median_s) for n, p in probes.items())
        problems = bench.noise_problems(timings)
        for seq in s.seqs:
            mfu = utilization.mfu(step_flops(s, seq), timings[f"step seq={seq}"].median_s,
                                  ceiling)
            if mfu > MFU_TOLERANCE:
                problems.append(f"the step at seq {seq} ran at {mfu:.2f}x "
                                "the measured matmul ceiling")
        return problems

    time = dict(warmup=s.warmup, repeats=s.repeats, device=device, min_sample_s=bench.MIN_SAMPLE_S)
    timings, consistency = bench.measure_consistently(fns, check, attempts=s.attempts, **time)
    rows = [{"kind": "probe", "name": n, "unit": "flop", "work": p.work,
             **timing_fields(timings[n])}
            for n, p in probes.items()]
    rows += [{"kind": "step", "seq": seq, "batch": s.batch, "flops": step_flops(s, seq),
              **timing_fields(timings[f"step seq={seq}"])} for seq in s.seqs]
    rows.append({"kind": "consistency", "problems": list(consistency.problems),
                 "attempts": consistency.attempts, "dtype": s.dtype,
                 "model": f"d_model {s.config.d_model}, {s.config.n_layers} layers"})
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def ceiling(rows: list[dict[str, Any]]) -> float:
    """The best matmul probe's FLOP/s in the run."""
    return max(r["work"] / r["median_s"] for r in rows if r["kind"] == "probe")


def steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "step"]


def mfus(rows: list[dict[str, Any]], peak_flop_per_s: float | None = None) -> dict[int, float]:
    """MFU per sequence length, against `peak_flop_per_s` (default: the measured ceiling)."""
    peak = peak_flop_per_s or ceiling(rows)
    return {r["seq"]: utilization.mfu(r["flops"], r["median_s"], peak) for r in steps(rows)}


def table(rows: list[dict[str, Any]], accelerator: hardware.Accelerator | None = None) -> Table:
    c = kit.first(rows, "consistency")
    spec = accelerator.peak_flop_per_s(c["dtype"]) if accelerator is not None else None
    out = []
    for r in steps(rows):
        fastest = r["flops"] / ceiling(rows)
        out.append([r["seq"], num(r["flops"] / 1e9), num(fastest * 1e3), num(r["median_s"] * 1e3),
                    f"{num(r['p20_s'] * 1e3)} – {num(r['p80_s'] * 1e3)}",
                    f"{r['median_s'] / fastest:.2f}", f"{mfus(rows)[r['seq']]:.1%}",
                    f"{mfus(rows, spec)[r['seq']]:.1%}" if spec else "-"])
    return Table(["seq", "model GFLOP / step", "predicted at ceiling (ms)", "measured median (ms)",
                  "p20 – p80 (ms)", "measured / predicted", "MFU vs measured ceiling",
                  "MFU vs spec peak"], out)


def mfu_verdict(rows: list[dict[str, Any]]) -> str:
    """Best MFU and what the matmul FLOPs at the ceiling leave unexplained, from the numbers."""
    c = kit.first(rows, "consistency")
    by_seq = mfus(rows)
    best = max(by_seq, key=by_seq.get)
    probes = [r for r in rows if r["kind"] == "probe"]
    drift = max(bench.Timing(tuple(r["samples_s"]), 0, "recorded").drift for r in probes)
    text = (f"the best step reached {by_seq[best]:.0%} of the matmul ceiling "
            f"({ceiling(rows) / 1e9:,.0f} GFLOP/s, which moved by at most {drift:.0%} during the "
            f"run) at sequence {best}: its matmul FLOPs at the ceiling account for "
            f"{by_seq[best]:.0%} of the step's time, and the other {1 - by_seq[best]:.0%} is "
            "time the FLOP count does not explain (the profiling chapter shows where it goes)")
    return verdict(text, c["problems"])


def plot(rows: list[dict[str, Any]], ax, *, accelerator: hardware.Accelerator | None = None,
         label: str = "") -> None:
    from mlsys.plotting import COLORS, finish  # matplotlib: only when a page draws

    st = steps(rows)
    seqs = [r["seq"] for r in st]
    ax.errorbar(seqs, [r["median_s"] * 1e3 for r in st],
                yerr=[[(r["median_s"] - r["p20_s"]) * 1e3 for r in st],
                      [(r["p80_s"] - r["median_s"]) * 1e3 for r in st]],
                fmt="o", color=COLORS["measured"], capsize=3,
                label=f"measured (median, p20–p80){label}")
    ax.plot(seqs, [r["flops"] / ceiling(rows) * 1e3 for r in st], "-", color=COLORS["predicted"],
            label=f"model FLOPs at the measured ceiling ({ceiling(rows) / 1e9:,.0f} GFLOP/s)")
    c = kit.first(rows, "consistency")
    if accelerator is not None:
        peak = accelerator.peak_flop_per_s(c["dtype"])
        ax.plot(seqs, [r["flops"] / peak * 1e3 for r in st], "--", color=COLORS["ceiling"],
                label=f"model FLOPs at the {accelerator.name} spec peak")
    finish(ax, title="Training step time: measured versus FLOPs / ceiling",
           xlabel="sequence length", ylabel="ms per step", logx=2, logy=True)
    ax.legend(fontsize=7)


EXPERIMENT = Experiment(
    name="train_step",
    chapter="03_flops",
    description=("training steps (fwd, bwd, AdamW) at several lengths, "
                 "interleaved with the matmul ceiling"),
    gpu_seconds=25,
    sizes=SIZES,
    run=run,
)
