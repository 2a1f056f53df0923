"""Forward, forward + backward and full training step of the book's presets, against their FLOPs.

For each model and sequence length, three callables are timed round-robin with the ceiling probes
of the same device (a square matmul in the run's dtype and a large copy): the forward pass (with
autograd on, as in training), the forward and backward pass, and the full step with AdamW. Each
time is predicted before it is read: forward matmul FLOPs over the measured matmul ceiling,
forward + backward as 3x that, and the step as that plus the optimizer's minimum traffic
(`accounting.bytes.adamw_traffic`) over the measured copy bandwidth. A row that runs out of memory
is recorded as such and the sweep goes on. `third_party_rows` puts the seed's Ampere-GPU table
(`mlsys.third_party`) beside the book's predictions for that GPU; `seed_gpu` infers which GPU it
was, and `seed_summary` gives the page its numbers, asserting the lessons it draws from the table.
Over 300 lines as one module: the seed's table is read with the same predictions as the book's own
rows, and both feed one section of the page. `show_records` shows the GPU
records of the chapter's five experiments (this one, `timing_pitfalls`, `step_profile`,
`step_memory`, `compile_step`) and says which are missing.
Used in: §sec-benchmarking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env, hardware, third_party
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops, memory
from mlsys.accounting.params import count_params
from mlsys.book import Table, num, verdict
from mlsys.experiments import (
    Experiment,
    kit,
    step_memory,
    step_profile,
    timing_fields,
)
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.probes import copy_probe, matmul_probe
from mlsys.training import make_train_step, next_token_loss

MODES = ("forward", "forward+backward", "step")


@dataclass(frozen=True)
class Sizes:
    models: tuple[tuple[str, TransformerConfig], ...]  # (name, config) in order of size
    seqs: tuple[int, ...]
    batch: int
    dtype: str  # "fp32", or "bf16" (matmuls under torch.autocast)
    ceiling_size: int  # N of the square matmul probe
    copy_bytes: int  # the bandwidth probe
    warmup: int
    repeats: int


def _presets(*names: str) -> tuple[tuple[str, TransformerConfig], ...]:
    return tuple((name, TransformerConfig.preset(name)) for name in names)


SIZES = {
    "smoke": Sizes(_presets("debug"), (32, 64, 128), 2, "fp32", 512, 2**27, 1, 3),
    "cpu": Sizes(_presets("debug", "laptop"), (64, 128, 256), 4, "fp32",
                 1_024, 2**28, 1, 5),
    "gpu": Sizes(_presets("small", "medium", "large", "xl", "2.7B"), (128, 256, 512, 1_024), 4,
                 "fp32", 8_192, 2**31, 1, 4),
}


def _callables(model, optimizer, tokens: torch.Tensor, dtype: str) -> dict[str, Any]:
    autocast = "bf16" if dtype == "bf16" else None
    device_type = tokens.device.type

    def forward() -> None:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast is not None):
            model(tokens[:, :-1])  # autograd on, as in training; the graph is freed at once

    def forward_backward() -> None:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast is not None):
            loss = next_token_loss(model, tokens)
        loss.backward()
        model.zero_grad(set_to_none=True)

    step = make_train_step(model, optimizer, tokens, autocast_dtype=autocast)
    return {"forward": forward, "forward+backward": forward_backward, "step": step}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every model x sequence row (or its out-of-memory record), with the probes of each row."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    probes = {p.name: p for p in (matmul_probe(s.ceiling_size, dtype=s.dtype, device=device),
                                  copy_probe(s.copy_bytes, device=device))}
    rows: list[dict[str, Any]] = []
    for name, cfg in bench.progress(s.models, desc="models"):
        base = {"kind": "row", "model": name, "batch": s.batch, "n_params": count_params(cfg)}
        model = None
        with kit.OutOfMemory() as oom:
            model = Transformer(cfg).to(device)
            model.init_weights(seed=0)
            optimizer = torch.optim.AdamW(model.parameters())
            adamw_bytes = bytes_moved.adamw_traffic(base["n_params"], "fp32").total_bytes
            for seq in (q for q in s.seqs if q <= cfg.context_length):
                forward = flops.transformer_flops(cfg, s.batch, seq).forward_matmul_flops
                row = {**base, "seq": seq, "forward_flops": forward,
                       "optimizer_bytes": adamw_bytes}
                with kit.OutOfMemory() as step_oom:
                    tokens = torch.randint(cfg.vocab_size, (s.batch, seq + 1), generator=gen)
                    fns = _callables(model, optimizer, tokens.to(device), s.dtype)
                    timings = bench.benchmark_interleaved(
                        {**fns, **{n: p.fn for n, p in probes.items()}}, warmup=s.warmup,
                        repeats=s.repeats, device=device)
                if step_oom.happened:
                    rows.append({**row, "status": kit.OUT_OF_MEMORY})
                    kit.free(device)
                    continue
                row["status"] = "ok"
                row["problems"] = bench.noise_problems(timings)
                for mode in MODES:
                    row[mode] = timing_fields(timings[mode])
                for probe_name, probe in probes.items():
                    row[probe.unit] = probe.rate(timings[probe_name].median_s)
                rows.append(row)
        if oom.happened:
            rows += [{**base, "seq": seq, "status": kit.OUT_OF_MEMORY} for seq in s.seqs
                     if seq <= cfg.context_length and seq not in {r["seq"] for r in rows
                                                                 if r["model"] == name}]
        del model
        kit.free(device)
    rows.append({"kind": "setup", "dtype": s.dtype, "device": env.device_name()})
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "row" and r["status"] == "ok"]


def predicted_times(forward_flops: float, optimizer_bytes: float, *, flop_per_s: float,
                    bytes_per_s: float) -> dict[str, float]:
    """Seconds per mode: the forward's matmul FLOPs at `flop_per_s`; forward + backward 3x that
    (backward = 2x forward for every matmul); the step adds AdamW's minimum traffic
    (`accounting.bytes.adamw_traffic`) at `bytes_per_s`."""
    forward = forward_flops / flop_per_s
    return {"forward": forward, "forward+backward": 3 * forward,
            "step": 3 * forward + optimizer_bytes / bytes_per_s}


def predicted_s(row: dict[str, Any], mode: str) -> float:
    """The row's time predicted from its FLOPs, bytes and its own measured ceilings."""
    return predicted_times(row["forward_flops"], row["optimizer_bytes"], flop_per_s=row["flop"],
                           bytes_per_s=row["bytes"])[mode]


def backward_ratio(row: dict[str, Any]) -> float:
    """Backward time / forward time, the backward being (forward + backward) - forward."""
    fwd = row["forward"]["median_s"]
    return (row["forward+backward"]["median_s"] - fwd) / fwd


def table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in (r for r in rows if r["kind"] == "row"):
        if r["status"] != "ok":
            out.append([r["model"], r["seq"], r["status"], "", "", "", "", ""])
            continue
        cells = [r["model"], r["seq"]]
        for mode in MODES:
            t = r[mode]
            spread = f"{num(t['p20_s'] * 1e3)}–{num(t['p80_s'] * 1e3)}"
            cells.append(f"{num(t['median_s'] * 1e3)} ({spread})")
        cells += [f"{r['step']['median_s'] / predicted_s(r, 'step'):.2f}",
                  f"{r['forward']['median_s'] / predicted_s(r, 'forward'):.2f}",
                  f"{backward_ratio(r):.2f}"]
        out.append(cells)
    return Table(["model", "seq", "forward ms (p20–p80)", "fwd + bwd ms", "step ms",
                  "step: measured / predicted", "forward: measured / predicted",
                  "backward / forward"], out)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The overhead regime, the backward/forward ratio and the distance to the roof, in words."""
    ok = measured(rows)
    problems = [f"{r['model']} at {r['seq']}: {p}" for r in ok for p in r["problems"]]
    first = ok[0]
    same_model = [r for r in ok if r["model"] == first["model"]]
    short = sorted(same_model, key=lambda r: r["seq"])[:2]
    growth = short[1]["forward"]["median_s"] / short[0]["forward"]["median_s"]
    tokens = short[1]["seq"] / short[0]["seq"]
    regime = ("overhead-bound: the time barely follows the work" if growth < 0.5 * (1 + tokens)
              else "the time follows the work")
    overhead = (f"{first['model']}'s forward took {growth:.2f}x as long at {short[1]['seq']} "
                f"tokens as at {short[0]['seq']} ({tokens:.0f}x the tokens): {regime}")
    by_work = sorted(ok, key=lambda r: r["forward_flops"])
    ratios = [backward_ratio(r) for r in by_work]
    backward = (f"backward / forward went from {ratios[0]:.2f} ({by_work[0]['model']}, "
                f"{by_work[0]['seq']} tokens) to {ratios[-1]:.2f} ({by_work[-1]['model']}, "
                f"{by_work[-1]['seq']} tokens); the matmul count says 2")
    big = by_work[-1]
    ratio = big["step"]["median_s"] / predicted_s(big, "step")
    roof = (f"the largest row's step took {ratio:.2f}x its prediction from the measured matmul "
            "ceiling and copy bandwidth")
    return {name: verdict(text, problems) for name, text in
            {"overhead": overhead, "backward": backward, "roof": roof}.items()}


def third_party_rows(accelerator: hardware.Accelerator, batch: int = 4) -> list[dict[str, Any]]:
    """The seed's Ampere table with the FLOP/s its forward times imply at `batch` and the times the
    fp32 CUDA-core and TF32 peaks of `accelerator` would give."""
    out = []
    for t in third_party.CS336_STUDENT_BENCHMARK:
        forward = flops.transformer_flops(TransformerConfig.preset(t.preset), batch, t.seq)
        f = forward.forward_matmul_flops
        out.append({"preset": t.preset, "seq": t.seq, "forward_s": t.forward_s,
                    "backward_s": t.backward_s, "forward_flops": f,
                    "achieved_flop_per_s": f / t.forward_s,
                    "fp32_s": f / accelerator.peak_flop_per_s("fp32"),
                    "tf32_s": f / accelerator.peak_flop_per_s("tf32")})
    return out


def third_party_verdict(accelerator: hardware.Accelerator, batch: int = 4) -> str:
    """Which peak the seed's fp32 run can have reached, and its overhead and backward ratios."""
    rows = third_party_rows(accelerator, batch)
    rates = [r["achieved_flop_per_s"] for r in rows]
    fp32, tf32 = accelerator.peak_flop_per_s("fp32"), accelerator.peak_flop_per_s("tf32")
    by = {(r["preset"], r["seq"]): r for r in rows}
    small = by[("small", 256)]["forward_s"] / by[("small", 128)]["forward_s"]
    ratios = [r["backward_s"] / r["forward_s"] for r in rows]
    return (f"at batch {batch}, its forward passes reached {min(rates) / 1e12:.1f} to "
            f"{max(rates) / 1e12:.1f} TFLOP/s: up to {max(rates) / fp32:.0%} of the "
            f"{accelerator.name}'s {fp32 / 1e12:.1f} TFLOP/s fp32 (CUDA-core) peak and at most "
            f"{max(rates) / tf32:.0%} of its {tf32 / 1e12:.0f} TFLOP/s TF32 peak; small took "
            f"{small:.2f}x as long at 256 tokens as at 128, and backward / forward ran from "
            f"{min(ratios):.2f} to {max(ratios):.2f}")


def seed_gpu() -> tuple[str, str]:
    """(name, reasoning) of the seed's GPU: Ampere by its kernel names, and holding its largest
    measured peak, which only one Ampere GPU does."""
    peak = max(r.measured_training_gb for r in third_party.CS336_STUDENT_MEMORY
               if r.measured_training_gb) * 1e9
    states = memory.model_state_bytes(count_params(TransformerConfig.preset("2.7B")), "fp32_adamw")
    fits = [name for name, size in hardware.AMPERE_MEMORY_BYTES.items() if size > peak]
    if len(fits) != 1:
        raise AssertionError(f"the seed's peak of {peak / 1e9:.0f} GB fits {fits}: no single GPU")
    return fits[0], (f"the seed names no GPU: its kernels (`ampere_sgemm_*`) say Ampere, and its "
                     f"2.7B step at 512 tokens peaked at about {peak / 1e9:.0f} GB (the model "
                     f"states alone are {states / 1e9:.1f} GB), which of the Ampere GPUs only the "
                     f"{fits[0]} holds (SXM or PCIe: the book takes the SXM's figures)")


def seed_summary(accelerator: hardware.Accelerator, batch: int = 4) -> tuple[dict[str, Any], Table]:
    """The page's numbers from the seed's table read against `accelerator` (glue name: value), and
    the table. Asserts what the page says of it: the inferred GPU is `accelerator`; small takes
    the same time at 128 and 256 tokens, more than 3x its time at the fp32 peak; backward /
    forward runs from under 1.6 to over 2; no row passes the fp32 peak."""
    rows = third_party_rows(accelerator, batch)
    by = {(r["preset"], r["seq"]): r for r in rows}
    small_128, small_256 = by[("small", 128)], by[("small", 256)]
    name, reasoning = seed_gpu()
    bwd = [r["backward_s"] / r["forward_s"] for r in rows]
    assert accelerator.name.startswith(name), (accelerator.name, name)
    assert small_256["forward_s"] < 1.1 * small_128["forward_s"]  # twice the tokens, same time
    assert small_128["forward_s"] > 3 * small_128["fp32_s"]
    assert min(bwd) < 1.6 and max(bwd) > 2
    assert max(r["achieved_flop_per_s"] for r in rows) < accelerator.peak_flop_per_s("fp32")
    values = {"q_small_128_ms": small_128["forward_s"] * 1e3,
              "q_small_256_ms": small_256["forward_s"] * 1e3,
              "q_fp32_ms": small_128["fp32_s"] * 1e3,
              "a100_fp32": accelerator.peak_flop_per_s("fp32") / 1e12,
              "a100_tf32": accelerator.peak_flop_per_s("tf32") / 1e12,
              "seed_verdict": third_party_verdict(accelerator, batch), "seed_gpu_text": reasoning,
              "seed_small_over": small_128["forward_s"] / small_128["fp32_s"]}
    table = Table(["preset", "seq", "forward ms (theirs)", "backward / forward",
                   "at fp32 peak (ms)", "at TF32 peak (ms)", "achieved TFLOP/s"],
                  [[r["preset"], r["seq"], num(r["forward_s"] * 1e3),
                    f"{r['backward_s'] / r['forward_s']:.2f}", num(r["fp32_s"] * 1e3),
                    num(r["tf32_s"] * 1e3), num(r["achieved_flop_per_s"] / 1e12)] for r in rows])
    return values, table


def _show_trace(record: dict[str, Any]) -> str | None:
    """Draw a step_profile record's trace and return its sentence (None: it keeps no trace)."""
    if (trace := step_profile.trace(record["results"])) is not None:
        import matplotlib.pyplot as plt  # matplotlib: only when a page draws

        from mlsys.diagrams.trace import draw_trace  # (the same: diagrams import matplotlib)

        draw_trace(trace)
        plt.show()
        return step_profile.trace_sentence(record["results"])
    return None


def record_views() -> dict[str, Any]:
    """How the chapter shows each record of its experiments (`experiments.show_records`'s
    `tables` and `shows`): the profile's and the memory's tables, a step_profile record's trace
    drawn."""
    return {"tables": {"step_profile": [step_profile.phase_table, step_profile.class_table,
                                        step_profile.core_table],
                       "step_memory": [step_memory.peak_table, step_memory.breakdown_table,
                                       step_memory.checkpoint_table]},
            "shows": {"step_profile": _show_trace}}


def plot(rows: list[dict[str, Any]], ax, *, mode: str = "step") -> None:
    """Measured time against sequence length per model, with the predicted line."""
    from mlsys.plotting import COLORS, CYCLE, finish  # matplotlib: only when a page draws

    ok = measured(rows)
    for color, name in zip(CYCLE, dict.fromkeys(r["model"] for r in ok), strict=False):
        mine = [r for r in ok if r["model"] == name]
        seqs = [r["seq"] for r in mine]
        ax.plot(seqs, [r[mode]["median_s"] * 1e3 for r in mine], "o-", color=color,
                label=f"{name}, measured")
        ax.plot(seqs, [predicted_s(r, mode) * 1e3 for r in mine], ":", color=color,
                label=f"{name}, predicted")
    ax.plot([], [], ":", color=COLORS["predicted"], label="predicted: FLOPs / measured ceiling")
    finish(ax, title=f"{mode}: measured and predicted", xlabel="sequence length", ylabel="ms",
           logx=2, logy=True)
    ax.legend(fontsize=7, ncol=2)


EXPERIMENT = Experiment(
    name="step_benchmark",
    chapter="05_benchmarking",
    description="forward, forward+backward and AdamW step of each preset and length; OOM rows kept",
    gpu_seconds=300,
    sizes=SIZES,
    run=run,
)
