"""Memory under mixed precision: why a forward-only peak can rise under autocast while the
training peak does not fall by half.

For each preset and run (fp32, bf16 autocast, pure bf16: the policies of `experiments.amp_speed`)
one fresh model takes a warm-up step (AdamW makes its moments), then the allocator is read
(`memory_meter.meter`: the CPU profiler's events or the CUDA allocator) around a forward pass
without gradients (inference) and around the phases of a training step. Beside the readings, the
counts that explain them: model-state bytes from the policy's recipe, the bytes autograd saves
for backward (`counters.SavedTensors`), and the bf16 copies autocast makes of every matmul
weight (2 bytes per weight parameter), which its cache keeps until the autocast region ends,
gradients or not. Used in: §sec-mixed-precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import checks, env
from mlsys.accounting.params import count_params
from mlsys.book import Table, num
from mlsys.counters import SavedTensors
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit
from mlsys.experiments.amp_speed import RUNS
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.profiling import memory_meter
from mlsys.training import make_policy_step, next_token_loss, policy

PHASES = ("inference forward", "forward", "backward", "optimizer step")


@dataclass(frozen=True)
class Sizes:
    presets: tuple[str, ...]
    batch: int
    seq: int

    def __post_init__(self) -> None:
        for i, p in enumerate(self.presets):
            checks.choice(p, f"presets[{i}]", PRESETS)
        checks.positive_ints(batch=self.batch, seq=self.seq)


SIZES = {
    "smoke": Sizes(("debug",), 1, 8),
    "cpu": Sizes(("debug", "laptop"), 4, 128),
    "gpu": Sizes(("small", "medium", "large", "xl"), 4, 512),
}


def _measure(meter, preset: str, label: str, s: Sizes, device: str) -> dict[str, Any]:
    name, autocast = RUNS[label]
    cfg = TransformerConfig.preset(preset)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
    model = kit.fresh_model(cfg, device)
    step = make_policy_step(model, tokens, policy(name, autocast=autocast))
    step()  # the moments exist from here on
    model.zero_grad(set_to_none=True)
    chosen, low = step.policy, torch_dtype(step.policy.compute_dtype)
    counter = SavedTensors(model, exclude=[tokens])
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    labels = {"kind": "phase", "preset": preset, "run": label}
    with meter.recording():
        with meter.phase("inference forward", **labels), torch.no_grad():
            with torch.autocast(device, dtype=low, enabled=chosen.autocast):
                model(tokens[:, :-1])
        with meter.phase("forward", **labels), counter:
            with torch.autocast(device, dtype=low, enabled=chosen.autocast):
                loss = next_token_loss(model, tokens)
        with meter.phase("backward", **labels):
            loss.backward()
            del loss
        with meter.phase("optimizer step", **labels):
            step.optimizer.step()
    n = count_params(cfg)
    row = {"kind": "run", "preset": preset, "run": label, "policy": name, "n_params": n,
           "states_bytes": n * sum(chosen.breakdown().values()),
           "resident_bytes": n * (sum(chosen.breakdown().values()) - chosen.breakdown()["grads"]),
           "cast_cache_bytes": 2 * linear if chosen.autocast else 0,
           "saved_bytes": counter.activation_bytes, "status": "ok"}
    del model, step, counter
    return row


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every preset x run: its counts (a "run" row) and its phases (the meter's rows)."""
    device = device or env.device()
    meter = memory_meter.meter(device)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "method": meter.method,
                                   "batch": s.batch, "seq": s.seq}]
    for preset in s.presets:
        for label in RUNS:
            with kit.OutOfMemory() as oom:
                rows.append(_measure(meter, preset, label, s, device))
            if oom.happened:
                rows.append({"kind": "run", "preset": preset, "run": label,
                             "status": kit.OUT_OF_MEMORY})
            kit.free(device)
    return rows + meter.rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def runs(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(preset, run) -> its run row, measured ones only."""
    return {(r["preset"], r["run"]): r for r in rows if r["kind"] == "run" and r["status"] == "ok"}


def peak(rows: list[dict[str, Any]], preset: str, run: str, phase: str) -> int:
    """Peak bytes during `phase` above what was allocated when the recording began: the
    resident weights, master copy, optimizer moments, buffers and batch (no gradients yet)."""
    return next(r["peak_bytes"] for r in rows if r["kind"] == "phase" and
                (r["preset"], r["run"], r["phase"]) == (preset, run, phase))


def table(rows: list[dict[str, Any]]) -> Table:
    """Per preset and run: model states, saved activations, cast cache (counted) and the peaks
    above the resident state during the inference forward and the training step (MB)."""
    body = []
    for (preset, run), r in runs(rows).items():
        step_peak = max(peak(rows, preset, run, ph) for ph in PHASES[1:])
        body.append([preset, run, num(r["states_bytes"] / 1e6), num(r["saved_bytes"] / 1e6),
                     num(r["cast_cache_bytes"] / 1e6),
                     num(peak(rows, preset, run, "inference forward") / 1e6),
                     num(step_peak / 1e6), f"{r['saved_bytes'] / r['states_bytes']:.2f}"])
    return Table(["preset", "run", "model states MB", "saved for backward MB",
                  "autocast weight copies MB", "inference forward peak MB",
                  "training step peak MB", "activations / states"], body)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """"inference": the no-grad forward's peak under autocast against fp32's, and the cast
    copies that explain the difference; "training": the step's peak with the model states
    counted in, and why it does not halve; "split": activations against states by preset."""
    rs = runs(rows)
    preset = next(iter(rs))[0]
    f32, amp, pure = (rs.get((preset, run)) for run in RUNS)
    p32, pamp = (peak(rows, preset, run, "inference forward") for run in ("fp32",
                                                                         "bf16 autocast"))
    inference = (f"{preset}'s inference forward peaked {num(pamp / 1e6)} MB above its resident "
                 f"state under bf16 autocast against {num(p32 / 1e6)} MB in fp32 "
                 f"({pamp / p32:.2f}x): autocast's cached bf16 copies of the matmul weights are "
                 f"{num(amp['cast_cache_bytes'] / 1e6)} MB, ")
    if pamp > p32:
        inference += f"{amp['cast_cache_bytes'] / (pamp - p32):.2f}x the rise"
    else:
        inference += ("outweighed here by the halved activations of the longer input: the rise "
                      "shows when the weights dominate, as in a short-sequence forward")

    def total(r: dict[str, Any], run: str) -> int:  # resident states + the step's peak above them
        return r["resident_bytes"] + max(peak(rows, preset, run, ph) for ph in PHASES[1:])

    t32, tamp = total(f32, "fp32"), total(amp, "bf16 autocast")
    training = (f"with the resident states counted in, the training step peaks at "
                f"{num(tamp / 1e6)} MB under autocast against {num(t32 / 1e6)} MB in fp32 "
                f"({tamp / t32:.2f}x): the states stay {num(amp['states_bytes'] / 1e6)} MB (fp32 "
                f"weights, gradients and moments), while the bytes saved for backward go from "
                f"{num(f32['saved_bytes'] / 1e6)} to {num(amp['saved_bytes'] / 1e6)} MB "
                f"({amp['saved_bytes'] / f32['saved_bytes']:.2f}x, the cast weights included)")
    if pure is not None:
        training += (f"; pure bf16 peaks at {num(total(pure, 'pure bf16') / 1e6)} MB "
                     f"({total(pure, 'pure bf16') / t32:.2f}x)")
    split = ", ".join(f"{p}: {r['saved_bytes'] / r['states_bytes']:.2f}x" for (p, run), r in
                      rs.items() if run == "fp32")
    return {"inference": inference, "training": training,
            "split": f"fp32 activations saved for backward / model states: {split}"}


EXPERIMENT = Experiment(
    name="amp_memory",
    chapter="07_mixed_precision",
    description="inference and training peaks under fp32, bf16 autocast, pure bf16; cast cache",
    gpu_seconds=30,
    sizes=SIZES,
    run=run,
)
