"""Speed (and, on a GPU, peak memory) of fp32, bf16 autocast and pure bf16 training, by preset.

Each run is a precision policy of `mlsys.training`: "fp32" (`fp32_adamw`), "bf16 autocast" (fp32
weights and AdamW, matmuls under torch.autocast: `policy("fp32_adamw", autocast="bf16")`) and
"pure bf16" (`bf16_pure_adamw`: weights, gradients and moments in bf16). For every preset, run and
sequence length, three callables are timed round-robin: the forward pass (autograd on, as in
training), forward and backward, and the whole step. On a GPU each callable's peak allocation is
read too. A row that runs out of memory is kept as such. Two probes run in the same rounds: the
model's w1 matmul ((batch x seq, d_model) @ (d_model, d_ff)) in fp32 and in bf16, so the rows say
how fast this device's bf16 matmuls of the model's shape are, measured, beside the steps. A CPU's
rows say what runs there; the GPU record answers the speed question. Used in:
§sec-mixed-precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env
from mlsys.accounting import flops
from mlsys.accounting.params import count_params
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.experiments.kit import setup
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.probes import gemm_probe
from mlsys.training import make_policy_step, next_token_loss, policy

RUNS = {"fp32": ("fp32_adamw", None), "bf16 autocast": ("fp32_adamw", "bf16"),
        "pure bf16": ("bf16_pure_adamw", None)}
"""Run label -> (policy name, autocast dtype)."""
MODES = ("forward", "forward+backward", "step")
PROBE_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Sizes:
    presets: tuple[str, ...]
    seqs: tuple[int, ...]
    batch: int
    warmup: int
    repeats: int

    def __post_init__(self) -> None:
        for i, p in enumerate(self.presets):
            checks.choice(p, f"presets[{i}]", PRESETS)
        checks.int_sequence(self.seqs, "seqs", minimum=1)
        checks.positive_ints(batch=self.batch, repeats=self.repeats)
        checks.nonnegative_int(self.warmup, "warmup")


SIZES = {
    "smoke": Sizes(("debug",), (8, 16), 1, 1, 3),
    "cpu": Sizes(("debug",), (32, 128), 4, 1, 5),
    "gpu": Sizes(("small", "medium", "large", "xl", "2.7B"), (128, 256, 512), 4, 1, 5),
}


def _callables(step, tokens: torch.Tensor) -> dict[str, Any]:
    """forward, forward+backward and the policy's step on `tokens`."""
    model, chosen = step.model, step.policy
    low = torch_dtype(chosen.compute_dtype)

    def forward() -> None:
        with torch.autocast(tokens.device.type, dtype=low, enabled=chosen.autocast):
            model(tokens[:, :-1])

    def forward_backward() -> None:
        with torch.autocast(tokens.device.type, dtype=low, enabled=chosen.autocast):
            loss = next_token_loss(model, tokens)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return {"forward": forward, "forward+backward": forward_backward, "step": lambda: step(tokens)}


def _peak_bytes(fn, model, device: str) -> int | None:
    """The most bytes allocated during one call of `fn`, gradients cleared before (GPU only):
    weights, optimizer state and batch included."""
    if device != "cuda":
        return None
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every preset x run x length row (or its out-of-memory record)."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "batch": s.batch}]
    for preset in bench.progress(s.presets, desc="presets"):
        cfg = TransformerConfig.preset(preset)
        seqs = [q for q in s.seqs if q <= cfg.context_length]
        batches = {q: torch.randint(cfg.vocab_size, (s.batch, q + 1), generator=gen).to(device)
                   for q in seqs}
        for label, (name, autocast) in RUNS.items():
            base = {"kind": "row", "preset": preset, "run": label, "policy": name,
                    "n_params": count_params(cfg)}
            done: set[int] = set()
            model = step = None
            with kit.OutOfMemory() as oom:
                model = kit.fresh_model(cfg, device)
                step = make_policy_step(model, batches[seqs[0]], policy(name, autocast=autocast))
                for seq in seqs:
                    fns = _callables(step, batches[seq])
                    for dt in PROBE_DTYPES:  # the model's w1 matmul, timed in the same rounds
                        fns[f"matmul {dt}"] = gemm_probe(s.batch * seq, cfg.d_model, cfg.d_ff,
                                                         dtype=dt, device=device).fn
                    timings = bench.benchmark_interleaved(fns, warmup=s.warmup,
                                                          repeats=s.repeats, device=device)
                    row = {**base, "seq": seq, "status": "ok",
                           "forward_flops": flops.transformer_flops(cfg, s.batch, seq)
                           .forward_matmul_flops,
                           "problems": bench.noise_problems(timings)}
                    for mode in MODES:
                        row[mode] = timing_fields(timings[mode])
                        row[f"{mode} peak_bytes"] = _peak_bytes(fns[mode], model, device)
                    for dt in PROBE_DTYPES:
                        row[f"matmul {dt}"] = timing_fields(timings[f"matmul {dt}"])
                    rows.append(row)
                    done.add(seq)
            if oom.happened:
                rows += [{**base, "seq": q, "status": kit.OUT_OF_MEMORY} for q in seqs
                         if q not in done]
            del model, step
            kit.free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "row" and r["status"] == "ok"]


def _row(rows, preset: str, run: str, seq: int) -> dict[str, Any] | None:
    return next((r for r in measured(rows) if (r["preset"], r["run"], r["seq"]) ==
                 (preset, run, seq)), None)


def table(rows: list[dict[str, Any]]) -> Table:
    """ms per mode (median, p20–p80) per preset, length and run; GPU peaks in MB."""
    body = []
    for r in (r for r in rows if r["kind"] == "row"):
        if r["status"] != "ok":
            body.append([r["preset"], r["seq"], r["run"], r["status"], "", "", ""])
            continue
        cells = [r["preset"], r["seq"], r["run"]]
        for mode in MODES:
            t = r[mode]
            cells.append(f"{num(t['median_s'] * 1e3)} ({num(t['p20_s'] * 1e3)}–"
                         f"{num(t['p80_s'] * 1e3)})")
        peak = r["step peak_bytes"]
        cells.append("-" if peak is None else num(peak / 1e6))
        body.append(cells)
    return Table(["preset", "seq", "run", "forward ms (p20–p80)", "fwd + bwd ms", "step ms",
                  "step peak MB (GPU)"], body)


def speedups(rows: list[dict[str, Any]], mode: str = "step") -> list[dict[str, Any]]:
    """fp32 time / low-precision time per preset and length (> 1: the low-precision run is
    faster)."""
    checks.choice(mode, "mode", MODES)
    out = []
    for r in measured(rows):
        if r["run"] == "fp32":
            continue
        ref = _row(rows, r["preset"], "fp32", r["seq"])
        if ref is not None:
            out.append({"preset": r["preset"], "seq": r["seq"], "run": r["run"],
                        "speedup": ref[mode]["median_s"] / r[mode]["median_s"]})
    return out


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """"speed": the largest row's runs compared, and the bf16/fp32 matmul probe timed with them;
    "floor": how each run's step time follows the tokens at the first preset; "memory": peaks
    compared (GPU); "text": the first two as the page's sentence (once when both are withheld).
    Withheld when noisy."""
    ok = measured(rows)
    problems = [f"{r['preset']} {r['run']} at {r['seq']}: {p}" for r in ok for p in r["problems"]]
    cpu = setup(rows)["device_type"] == "cpu"
    big = max(ok, key=lambda r: r["forward_flops"])
    same = {r["run"]: r for r in ok if (r["preset"], r["seq"]) == (big["preset"], big["seq"])}
    parts = [compare_speed(run, same[run]["step"]["median_s"], "fp32",
                           same["fp32"]["step"]["median_s"]) for run in same if run != "fp32"]
    speed = f"{big['preset']} at {big['seq']} tokens, one step: " + "; ".join(parts)
    probe = matmul_speedup(big)
    if probe is not None:
        speed += (f"; the model's w1 matmul ran {probe:.2f}x as fast in bf16 as in fp32 in the "
                  "same rounds")
    if cpu:
        speed += " (a CPU: this says nothing about a GPU, whose record answers the question)"
    first = ok[0]["preset"]
    floor = []
    for run in RUNS:
        mine = sorted((r for r in ok if (r["preset"], r["run"]) == (first, run)),
                      key=lambda r: r["seq"])
        if len(mine) >= 2:
            grew = mine[-1]["step"]["median_s"] / mine[0]["step"]["median_s"]
            tokens = mine[-1]["seq"] / mine[0]["seq"]
            floor.append(f"{run} {grew:.2f}x for {tokens:.0f}x the tokens")
    floor_text = (f"{first}'s step time from {min(r['seq'] for r in ok)} tokens up: "
                  + ", ".join(floor)) if floor else "only one length measured"
    peaks = {run: same[run]["step peak_bytes"] for run in same}
    if any(p is None for p in peaks.values()):
        memory = "peaks are read on a GPU only (see amp_memory for the CPU's allocator)"
    else:
        memory = ", ".join(f"{run} {peaks[run] / peaks['fp32']:.2f}x" for run in peaks
                           if run != "fp32") + " the fp32 step's peak"
    out = {"speed": verdict(speed, problems), "floor": verdict(floor_text, problems),
           "memory": memory}
    withheld = out["speed"] == out["floor"]  # both withheld for the same noise: say it once
    out["text"] = (out["speed"][0].upper() + out["speed"][1:] + "." if withheld else
                   f"On this machine: {out['speed']}. How the step time follows the tokens: "
                   f"{out['floor']}.")
    return out


def matmul_speedup(row: dict[str, Any]) -> float | None:
    """fp32 time / bf16 time of the w1 matmul probe timed with `row` (None in rows without it)."""
    if any(f"matmul {dt}" not in row for dt in PROBE_DTYPES):
        return None
    return row["matmul fp32"]["median_s"] / row["matmul bf16"]["median_s"]


def plot(rows: list[dict[str, Any]], ax, *, mode: str = "step") -> None:
    """Time per `mode` against length, one line per preset and run."""
    from mlsys.plotting import CYCLE, finish  # matplotlib: only when a page draws

    ok = measured(rows)
    styles = dict(zip(RUNS, ("o-", "s--", "^:"), strict=True))
    for color, preset in zip(CYCLE, dict.fromkeys(r["preset"] for r in ok), strict=False):
        for run in RUNS:
            mine = [r for r in ok if (r["preset"], r["run"]) == (preset, run)]
            if mine:
                ax.plot([r["seq"] for r in mine],
                        [timing_of(r[mode]).median_s * 1e3 for r in mine], styles[run],
                        color=color, label=f"{preset}, {run}")
    finish(ax, title=f"{mode}: fp32, bf16 autocast, pure bf16", xlabel="sequence length",
           ylabel="ms", logx=2, logy=True)
    ax.legend(fontsize=7, ncol=2)


EXPERIMENT = Experiment(
    name="amp_speed",
    chapter="07_mixed_precision",
    description="fp32 vs bf16 autocast vs pure bf16: forward, fwd+bwd, step time and GPU peak",
    gpu_seconds=210,
    sizes=SIZES,
    run=run,
)
