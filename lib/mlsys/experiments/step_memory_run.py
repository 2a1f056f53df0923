"""What `step_memory` runs: per sequence length a fresh model, one warm-up step, then one step read
phase by phase by `mlsys.profiling.memory_timeline` with its saved tensors counted
(`counters.SavedTensors`); at the timeline's length the whole allocation history kept, the peak's
live bytes sorted by origin, the step's bytes by part over time (`diagrams.step_memory.measured`),
and the step again with the blocks checkpointed in segments, each
variant timed round-robin. A length that runs out of memory is kept as such. The module docstring
of `step_memory` says what the rows mean. Used in: §sec-profiling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env
from mlsys.accounting.params import count_params
from mlsys.diagrams import step_memory as step_parts
from mlsys.experiments import kit, timing_fields
from mlsys.models.checkpointing import checkpoint_blocks, uncheckpoint_blocks
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.profiling import memory_meter, memory_timeline
from mlsys.training import make_train_step

PHASES = ("forward", "backward", "optimizer")
AT_PEAK = ("activations", "gradients", "temporaries")


@dataclass(frozen=True)
class Sizes:
    preset: str
    batch: int
    seqs: tuple[int, ...]  # the peak by length
    timeline_seq: int  # the length whose timeline is kept and whose checkpointing is measured
    segments: tuple[int, ...]  # blocks per checkpointed segment to compare with none
    repeats: int  # timed steps per variant

    def __post_init__(self) -> None:
        checks.choice(self.preset, "preset", PRESETS)
        checks.positive_ints(batch=self.batch, timeline_seq=self.timeline_seq,
                             repeats=self.repeats)
        if self.timeline_seq not in self.seqs:
            raise ValueError(f"timeline_seq ({self.timeline_seq}) must be one of seqs {self.seqs}")


SIZES = {
    "smoke": Sizes("debug", 2, (32, 64), 64, (1,), 3),
    "cpu": Sizes("laptop", 4, (64, 128, 256), 128, (1, 2), 5),
    "gpu": Sizes("2.7B", 4, (128, 256, 512, 1_024), 128, (1, 6), 3),
}


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _set_segment(model, segment: int | None) -> None:
    if segment is None:
        uncheckpoint_blocks(model)
    else:
        checkpoint_blocks(model, segment)


def _at_peak(timeline: memory_timeline.Timeline) -> dict[str, int]:
    """Live bytes at the peak by origin (`diagrams.step_memory.origin`); they sum to the curve's
    peak when nothing older than the recording was freed before it."""
    t_peak, _ = timeline.peak()
    ends = {f"{p}_end_ns": next(s.end_ns for s in timeline.phases if s.name == p)
            for p in ("forward", "backward")}
    out = dict.fromkeys(AT_PEAK, 0)
    for a in timeline.live_allocations(t_peak):
        out[step_parts.origin(a, **ends)] += a.nbytes
    return out


def _measure(model, optimizer, tokens, seq: int, segment: int | None, device: str, *,
             timeline: bool) -> dict[str, Any]:
    """One recorded step (after the caller's warm-up) and what was resident before it."""
    _set_segment(model, segment)
    states = [v for st in optimizer.state.values() for v in st.values()
              if isinstance(v, torch.Tensor) and v.device.type == device]
    row = {"param_bytes": _nbytes(model.parameters()), "optimizer_bytes": _nbytes(states),
           "buffer_bytes": _nbytes(model.buffers()), "token_bytes": _nbytes([tokens])}
    if device == "cuda":
        torch.cuda.synchronize()
        row["allocated_before"] = torch.cuda.memory_allocated()
    meter = memory_meter.meter(device, model=model if device == "cpu" else None,
                               history=timeline)
    counter = kit.metered_step(meter, model, optimizer, tokens)
    row["saved_bytes"] = counter.activation_bytes
    row["phases"] = [{k: r[k] for k in ("phase", "live_bytes", "peak_bytes")} for r in meter.rows]
    if timeline:
        tl = meter.timelines[0]
        row["timeline"] = tl.to_record()
        row["at_peak"] = _at_peak(tl)
        row["parts"] = step_parts.measured(tl, param_bytes=row["param_bytes"],
                                           optimizer_bytes=row["optimizer_bytes"]).to_record()
    return row


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """The step at every length (out-of-memory rows kept), then the checkpointed variants and their
    step times at `s.timeline_seq`."""
    device = device or env.device()
    cfg = TransformerConfig.preset(s.preset)
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = [{
        "kind": "setup", "device": env.device_name(), "device_type": device, "preset": s.preset,
        "batch": s.batch, "n_params": count_params(cfg), "timeline_seq": s.timeline_seq,
        "segments": list(s.segments), "device_memory_bytes": torch.cuda.get_device_properties(0)
        .total_memory if device == "cuda" else None}]
    for seq in bench.progress(s.seqs, desc="lengths"):
        model = optimizer = None
        plan = [None, *s.segments] if seq == s.timeline_seq else [None]
        with kit.OutOfMemory() as oom:
            model = kit.fresh_model(cfg, device)
            optimizer = torch.optim.AdamW(model.parameters())
            tokens = torch.randint(cfg.vocab_size, (s.batch, seq + 1), generator=gen).to(device)
            make_train_step(model, optimizer, tokens)()  # the moments exist from here on
            for segment in plan:
                measured = _measure(model, optimizer, tokens, seq, segment, device,
                                    timeline=seq == s.timeline_seq and segment is None)
                rows.append({"kind": "step", "seq": seq, "segment": segment, "status": "ok",
                             **measured})
            if seq == s.timeline_seq:
                step = make_train_step(model, optimizer, tokens)

                def variant(segment, step=step, model=model):
                    return lambda: (_set_segment(model, segment), step())

                fns = {str(k): variant(k) for k in plan}
                timings = bench.benchmark_interleaved(fns, warmup=1, repeats=s.repeats,
                                                      device=device)
                rows.append({"kind": "checkpoint_time", "seq": seq,
                             "problems": bench.noise_problems(timings),
                             **{k: timing_fields(t) for k, t in timings.items()}})
        if oom.happened:
            done = {r["segment"] for r in rows if r["kind"] == "step" and r["seq"] == seq}
            rows += [{"kind": "step", "seq": seq, "segment": k, "status": kit.OUT_OF_MEMORY}
                     for k in plan if k not in done]
        del model, optimizer
        kit.free(device)
    return rows
