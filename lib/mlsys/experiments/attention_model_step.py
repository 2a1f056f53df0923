"""One training step of the book's model with each attention backend: time and memory.

The same model (same initial weights, same batch) is built once per backend of
`models.config.ATTENTION_BACKENDS`; each takes a warm-up step, then one step read by
`memory_meter.meter` (the peak above what is resident, and the forward's saved bytes against
`accounting.activations.saved_bytes`), then all the steps are timed round-robin. The attention
backends change only what one attention call keeps and moves, so the differences between rows are
the n x n matrices of the naive backend. On a CPU the Triton kernel would run in the interpreter:
it is left out there. Used in: §sec-attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.accounting import activations
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.experiments.kit import setup
from mlsys.models.config import TransformerConfig
from mlsys.profiling import memory_meter
from mlsys.training import make_train_step


@dataclass(frozen=True)
class Sizes:
    preset: str
    batch: int
    seq: int
    backends: tuple[str, ...]
    autocast: str | None  # "bf16": the step under torch.autocast (the kernels then see bf16)
    warmup: int
    repeats: int


SIZES = {
    "smoke": Sizes("debug", 2, 64, ("naive", "sdpa", "flash_torch"), None, 1, 3),
    "cpu": Sizes("laptop", 2, 256, ("naive", "sdpa", "flash_torch"), None, 1, 5),
    "gpu": Sizes("small", 4, 1_024, ("naive", "sdpa", "flash_torch", "flash_triton"), "bf16",
                 2, 10),
}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """A memory reading and a timing per backend (a backend that fails to run is recorded)."""
    device = device or env.device()
    backends = [b for b in s.backends if b != "flash_triton" or device == "cuda"]
    gen = torch.Generator().manual_seed(0)
    base = TransformerConfig.preset(s.preset)
    tokens = torch.randint(base.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "preset": s.preset, "batch": s.batch,
                                   "seq": s.seq, "autocast": s.autocast}]
    steps = {}
    for backend in backends:
        cfg = TransformerConfig.preset(s.preset, attention=backend)
        model = kit.fresh_model(cfg, device)
        optimizer = torch.optim.AdamW(model.parameters())
        step = make_train_step(model, optimizer, tokens, autocast_dtype=s.autocast)
        step()  # AdamW's moments exist from here on
        meter = memory_meter.meter(device)
        counter = kit.metered_step(meter, model, optimizer, tokens,
                                   autocast=s.autocast is not None)  # bf16 autocast
        peak = max(meter.rows, key=lambda r: r["peak_bytes"])
        rows.append({"kind": "memory", "backend": backend, "saved_bytes": counter.activation_bytes,
                     "peak_bytes": peak["peak_bytes"], "peak_phase": peak["phase"]})
        steps[backend] = step
    timings = bench.benchmark_interleaved(steps, warmup=s.warmup, repeats=s.repeats, device=device)
    rows.append({"kind": "time", "problems": bench.noise_problems(timings),
                 **{b: timing_fields(t) for b, t in timings.items()}})
    del steps
    kit.free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def memory(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["backend"]: r for r in rows if r["kind"] == "memory"}


def predicted_saved(rows: list[dict[str, Any]], backend: str) -> int | None:
    """`saved_bytes` of the step's model (fp32 only: under autocast the dtypes mix)."""
    st = setup(rows)
    if st["autocast"] is not None:
        return None
    cfg = TransformerConfig.preset(st["preset"], attention=backend)
    return activations.saved_bytes(cfg, st["batch"], st["seq"]).total_bytes


def table(rows: list[dict[str, Any]]) -> Table:
    times = kit.first(rows, "time")
    body = []
    for backend, m in memory(rows).items():
        t = times[backend]
        p = predicted_saved(rows, backend)
        body.append([backend, f"{num(t['median_s'] * 1e3)} ({num(t['p20_s'] * 1e3)}–"
                              f"{num(t['p80_s'] * 1e3)})", num(m["saved_bytes"] / 1e6),
                     "-" if p is None else num(p / 1e6),
                     f"{num(m['peak_bytes'] / 1e6)} ({m['peak_phase']})"])
    return Table(["backend", "step ms (p20–p80)", "saved for backward (MB)", "predicted (MB)",
                  "peak over resident (MB)"], body)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each fused backend against naive: memory (always) and time (withheld when noisy)."""
    mem, times = memory(rows), kit.first(rows, "time")
    naive = mem["naive"]
    parts_m, parts_t = [], []
    for backend, m in mem.items():
        if backend == "naive":
            continue
        parts_m.append(f"{backend} keeps {m['saved_bytes'] / naive['saved_bytes']:.0%} of naive's "
                       f"saved bytes and peaks at {m['peak_bytes'] / naive['peak_bytes']:.0%} of "
                       "its peak")
        parts_t.append(compare_speed(backend, times[backend]["median_s"], "naive",
                                     times["naive"]["median_s"]))
    problems = times["problems"] + bench.noise_problems(
        {b: timing_of(times[b]) for b in mem})
    return {"memory": "; ".join(parts_m),
            "time": verdict("; ".join(parts_t), sorted(set(problems)))}


EXPERIMENT = Experiment(
    name="attention_model_step",
    chapter="06_attention",
    description="a training step of the model with each attention backend: time, saved bytes, peak",
    gpu_seconds=70,
    sizes=SIZES,
    run=run,
)
