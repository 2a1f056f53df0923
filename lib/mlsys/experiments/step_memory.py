"""Where a training step's memory goes: the timeline, the peak by length, and checkpointing.

For each sequence length a fresh model takes one warm-up step (AdamW makes its moments there),
then one step whose phases (forward, backward, optimizer) are read by `mlsys.memory_timeline`: the
bytes live at the end of each phase and the peak during it, counted from the start of the step,
on top of what is resident before it (weights, AdamW moments, buffers, the token batch: summed
from the tensors themselves). The forward's saved tensors are counted (`counters.SavedTensors`)
and predicted (`accounting.activations.saved_bytes`). One length keeps the whole timeline (on a
GPU, the allocator's history): the curve, the largest allocations, and what is live at the peak,
sorted by where it was made: in the forward and still live (saved activations), in the backward
and live when it ends (gradients), or anything else (temporaries).

At that length the step runs again with the blocks checkpointed in segments
(`models.checkpointing`): saved bytes and peak, and the step time of each variant, timed
round-robin on the same model (checkpointing is switched on and off between calls).
`third_party.CS336_STUDENT_MEMORY` holds a seed's arithmetic for the 2.7B model; `seed_rows` sets
it beside the exact count. Used in: §sec-profiling.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env, memory_timeline, third_party
from mlsys.accounting import activations as A
from mlsys.accounting import memory
from mlsys.accounting.params import count_params
from mlsys.book import Table, num, verdict
from mlsys.counters import SavedTensors
from mlsys.experiments import Experiment, timing_fields, timing_of
from mlsys.models.config import PRESETS, TransformerConfig

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


def _is_oom(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _set_segment(model, segment: int | None) -> None:
    from mlsys.models.checkpointing import checkpoint_blocks, uncheckpoint_blocks

    if segment is None:
        uncheckpoint_blocks(model)
    else:
        checkpoint_blocks(model, segment)


def _at_peak(timeline: memory_timeline.Timeline) -> dict[str, int]:
    """Live bytes at the peak by origin (see the module docstring); they sum to the curve's peak
    when nothing older than the recording was freed before it."""
    t_peak, _ = timeline.peak()
    backward_end = max((p.end_ns for p in timeline.phases if p.name == "backward"), default=0)
    out = dict.fromkeys(AT_PEAK, 0)
    for a in timeline.live_allocations(t_peak):
        outlives_backward = a.end_ns is None or a.end_ns > backward_end
        origin = ("activations" if a.phase == "forward" else
                  "gradients" if a.phase == "backward" and outlives_backward else "temporaries")
        out[origin] += a.nbytes
    return out


def _measure(model, optimizer, tokens, seq: int, segment: int | None, device: str, *,
             timeline: bool) -> dict[str, Any]:
    """One recorded step (after the caller's warm-up) and what was resident before it."""
    from mlsys.training import next_token_loss

    _set_segment(model, segment)
    states = [v for st in optimizer.state.values() for v in st.values()
              if isinstance(v, torch.Tensor) and v.device.type == device]
    row = {"param_bytes": _nbytes(model.parameters()), "optimizer_bytes": _nbytes(states),
           "buffer_bytes": _nbytes(model.buffers()), "token_bytes": _nbytes([tokens])}
    if device == "cuda":
        torch.cuda.synchronize()
        row["allocated_before"] = torch.cuda.memory_allocated()
    meter = memory_timeline.meter(device, model=model if device == "cpu" else None,
                                  history=timeline)
    counter = SavedTensors(model)
    with meter.recording():
        with meter.phase("forward"), counter:
            loss = next_token_loss(model, tokens)
        with meter.phase("backward"):
            loss.backward()
            del loss
        with meter.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    row["saved_bytes"] = counter.activation_bytes
    row["phases"] = [{k: r[k] for k in ("phase", "live_bytes", "peak_bytes")} for r in meter.rows]
    if timeline:
        tl = meter.timelines[0]
        row["timeline"] = tl.to_record()
        row["at_peak"] = _at_peak(tl)
    return row


def _model(cfg: TransformerConfig, device: str):
    from mlsys.models.transformer import Transformer

    with torch.device(device):
        model = Transformer(cfg)
    model.init_weights(seed=0)
    return model


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """The step at every length (out-of-memory rows kept), then the checkpointed variants and their
    step times at `s.timeline_seq`."""
    from mlsys.training import make_train_step

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
        try:
            model = _model(cfg, device)
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
        except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
            if not _is_oom(error):
                raise
            done = {r["segment"] for r in rows if r["kind"] == "step" and r["seq"] == seq}
            rows += [{"kind": "step", "seq": seq, "segment": k, "status": "out of memory"}
                     for k in plan if k not in done]
        finally:
            del model, optimizer
            _free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def setup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == "setup")


def config(rows: list[dict[str, Any]]) -> TransformerConfig:
    return TransformerConfig.preset(setup(rows)["preset"])


def steps(rows: list[dict[str, Any]], *, segment: int | None = None,
          ok: bool = True) -> list[dict[str, Any]]:
    """The step rows without (segment None) or with checkpointing, by length."""
    return [r for r in rows if r["kind"] == "step" and r["segment"] == segment
            and (not ok or r["status"] == "ok")]


def predicted(rows: list[dict[str, Any]], seq: int,
              segment: int | None = None) -> A.ActivationBytes:
    return A.saved_bytes(config(rows), setup(rows)["batch"], seq, checkpoint_segment=segment)


def resident(r: dict[str, Any]) -> int:
    """Bytes live before the step: weights, AdamW moments (and step counters), buffers, batch."""
    return r["param_bytes"] + r["optimizer_bytes"] + r["buffer_bytes"] + r["token_bytes"]


def peak(r: dict[str, Any]) -> tuple[int, str]:
    """(the step's peak over its resident bytes, the phase it happened in)."""
    top = max(r["phases"], key=lambda p: p["peak_bytes"])
    return top["peak_bytes"], top["phase"]


def napkin_bytes(rows: list[dict[str, Any]], seq: int) -> int:
    """16 B/param (fp32 AdamW: weights, gradients, two moments) + the saved activations."""
    n = setup(rows)["n_params"]
    return memory.model_state_bytes(n, "fp32_adamw") + predicted(rows, seq).total_bytes


def _mb(n: float) -> str:
    return num(n / 1e6)


def peak_table(rows: list[dict[str, Any]]) -> Table:
    """By length: saved activations counted and predicted, the peak (over resident and in all),
    and the napkin's 16 B/param + activations (MB)."""
    body = []
    for r in (r for r in rows if r["kind"] == "step" and r["segment"] is None):
        if r["status"] != "ok":
            body.append([r["seq"], r["status"], "", "", "", "", "", ""])
            continue
        over, phase = peak(r)
        total = resident(r) + over
        body.append([r["seq"], _mb(r["saved_bytes"]), _mb(predicted(rows, r["seq"]).total_bytes),
                     _mb(resident(r)), f"{_mb(over)} ({phase})", _mb(total),
                     _mb(napkin_bytes(rows, r["seq"])),
                     f"{total / napkin_bytes(rows, r['seq']):.2f}"])
    return Table(["seq", "saved, counted (MB)", "saved, predicted (MB)", "resident (MB)",
                  "peak over resident (MB)", "peak (MB)", "16 B/param + saved (MB)",
                  "peak / napkin"], body)


def breakdown(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The peak of the timeline's step in parts: weights, moments, other resident, and what is
    live at the peak by origin (bytes)."""
    r = next(r for r in steps(rows) if "at_peak" in r)
    return {"weights": r["param_bytes"], "AdamW moments": r["optimizer_bytes"],
            "buffers + batch": r["buffer_bytes"] + r["token_bytes"], **r["at_peak"]}


def breakdown_table(rows: list[dict[str, Any]]) -> Table:
    """The peak's parts beside the napkin's (MB): 4 + 8 B/param resident, 4 B/param of
    gradients, the predicted saved activations."""
    r = next(r for r in steps(rows) if "at_peak" in r)
    n = setup(rows)["n_params"]
    napkin = {"weights": 4 * n, "AdamW moments": 8 * n, "buffers + batch": None,
              "activations": predicted(rows, r["seq"]).total_bytes, "gradients": 4 * n,
              "temporaries": None}
    parts = breakdown(rows)
    body = [[k, _mb(v), "" if napkin[k] is None else _mb(napkin[k])] for k, v in parts.items()]
    body.append(["total", _mb(sum(parts.values())), _mb(napkin_bytes(rows, r["seq"]))])
    return Table(["at the peak", "measured (MB)", "napkin (MB)"], body)


def checkpoint_table(rows: list[dict[str, Any]]) -> Table:
    """Per checkpointing plan at the timeline's length: saved and peak bytes, recomputed FLOPs
    (a share of the step's matmul FLOPs) and the step time."""
    st = setup(rows)
    seq = st["timeline_seq"]
    times = next((r for r in rows if r["kind"] == "checkpoint_time"), None)
    cfg, batch = config(rows), st["batch"]
    body = []
    for segment in [None, *st["segments"]]:
        r = next(r for r in rows if r["kind"] == "step" and r["seq"] == seq
                 and r["segment"] == segment)
        name = "none" if segment is None else f"segments of {segment}"
        if r["status"] != "ok":
            body.append([name, r["status"], "", "", "", "", ""])
            continue
        p = predicted(rows, seq, segment)
        share = 0.0 if segment is None else A.recompute_overhead(cfg, batch, seq,
                                                                 checkpoint_segment=segment)
        t = times[str(segment)]["median_s"] if times else None
        base = times["None"]["median_s"] if times else None
        body.append([name, _mb(r["saved_bytes"]), _mb(p.total_bytes), _mb(peak(r)[0]),
                     f"{share:.1%}", num(t * 1e3) if t else "",
                     f"{t / base:.2f}" if t else ""])
    return Table(["checkpointing", "saved, counted (MB)", "saved, predicted (MB)",
                  "peak over resident (MB)", "recomputed FLOPs", "step (ms)", "step / none"],
                 body)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences from the rows: the count against the prediction, the peak against the napkin,
    what holds the peak, and what checkpointing bought and cost."""
    ok = steps(rows)
    exact = all(r["saved_bytes"] == predicted(rows, r["seq"]).total_bytes for r in ok)
    saved = ("at every length the tensors autograd saved add up exactly to the prediction"
             if exact else "the saved tensors differ from the prediction at " +
             ", ".join(str(r["seq"]) for r in ok
                       if r["saved_bytes"] != predicted(rows, r["seq"]).total_bytes))
    ratios = [(resident(r) + peak(r)[0]) / napkin_bytes(rows, r["seq"]) for r in ok]
    phases = sorted({peak(r)[1] for r in ok})
    napkin = (f"the measured peak was {min(ratios):.2f}x to {max(ratios):.2f}x the napkin's 16 "
              f"B/param + saved activations, reached during the {' or '.join(phases)}")
    parts = breakdown(rows)
    at = {k: parts[k] for k in AT_PEAK}
    largest = max(at, key=at.get)
    holds = (f"at the peak, {_mb(at['activations'])} MB of forward tensors, "
             f"{_mb(at['gradients'])} MB of gradients and {_mb(at['temporaries'])} MB of "
             f"temporaries were live: {largest} the most")
    st = setup(rows)
    seq = st["timeline_seq"]
    plain = next(r for r in ok if r["seq"] == seq)
    times = next((r for r in rows if r["kind"] == "checkpoint_time"), None)
    sentences = []
    for segment in st["segments"]:
        r = next((r for r in steps(rows, segment=segment) if r["seq"] == seq), None)
        if r is None:
            continue
        text = (f"segments of {segment} kept {r['saved_bytes'] / plain['saved_bytes']:.0%} of the "
                f"saved bytes and a peak {peak(r)[0] / peak(plain)[0]:.0%} of the plain step's")
        if times:
            slower = times[str(segment)]["median_s"] / times["None"]["median_s"]
            text += f", at {slower:.2f}x its time"
        sentences.append(text)
    problems = ([f"checkpointing at {seq}: {p}" for p in times["problems"]] if times else [])
    if times:
        problems += bench.noise_problems({k: timing_of(v) for k, v in times.items()
                                          if isinstance(v, dict)})
    return {"saved": saved, "napkin": napkin, "holds": holds,
            "checkpoint": verdict("; ".join(sentences), sorted(set(problems)))}


def plot_timeline(rows: list[dict[str, Any]], ax, *, title: str | None = None) -> None:
    r = next(r for r in steps(rows) if "timeline" in r)
    memory_timeline.plot(memory_timeline.Timeline.from_record(r["timeline"]), ax, top=4,
                         title=title or f"one step at {r['seq']} tokens (above resident)")


def plot_peak(rows: list[dict[str, Any]], ax, *, title: str | None = None) -> None:
    """Peak by length: measured in all, and the napkin's 16 B/param + saved activations."""
    from mlsys.plotting import COLORS, finish

    ok = steps(rows)
    seqs = [r["seq"] for r in ok]
    ax.plot(seqs, [(resident(r) + peak(r)[0]) / 1e9 for r in ok], "o-",
            color=COLORS["measured"], label="measured peak")
    ax.plot(seqs, [napkin_bytes(rows, q) / 1e9 for q in seqs], ":", color=COLORS["predicted"],
            label="16 B/param + saved activations")
    finish(ax, title=title or "peak memory of a step", xlabel="sequence length", ylabel="GB",
           logx=2)
    ax.legend(fontsize=7)


# --- the seed's arithmetic for the 2.7B model --------------------------------------------------


def seed_rows(batch: int = 4) -> list[dict[str, Any]]:
    """The seed's 2.7B table beside its own formula, the exact count and the napkin (GB, 1e9)."""
    cfg = TransformerConfig.preset("2.7B")
    n = count_params(cfg)
    out = []
    for t in third_party.CS336_STUDENT_MEMORY:
        mib = batch * t.seq * (third_party.CS336_STUDENT_MIB_PER_TOKEN
                               + third_party.CS336_STUDENT_MIB_PER_TOKEN_SQUARED * t.seq)
        exact = A.saved_bytes(cfg, batch, t.seq)
        out.append({"seq": t.seq, "claimed_forward_gb": t.claimed_forward_gb,
                    "formula_gb": mib * 2**20 / 1e9, "formula_gib": mib / 1024,
                    "exact_gb": exact.total_bytes / 1e9,
                    "claimed_training_gb": t.claimed_training_gb,
                    "napkin_gb": (memory.model_state_bytes(n, "fp32_adamw")
                                  + exact.total_bytes) / 1e9,
                    "measured_training_gb": t.measured_training_gb})
    return out


def table(rows: list[dict[str, Any]]) -> Table:
    """The summary `python -m mlsys.experiments` prints: `peak_table`."""
    return peak_table(rows)

EXPERIMENT = Experiment(
    name="step_memory",
    chapter="05_benchmarking",
    description="memory timeline of a step, peak by length vs 16 B/param + activations, "
                "checkpointing",
    gpu_seconds=150,
    sizes=SIZES,
    run=run,
)
