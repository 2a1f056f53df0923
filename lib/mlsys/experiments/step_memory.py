"""Where a training step's memory goes: the timeline, the peak by length, and checkpointing.

For each sequence length a fresh model takes one warm-up step (AdamW makes its moments there), then
one step whose phases (forward, backward, optimizer) are read by `mlsys.profiling.memory_timeline`:
the bytes live at the end of each phase and the peak during it, counted from the start of the step,
on top of what is resident before it (weights, AdamW moments, buffers, the token batch: summed from
the tensors themselves). The forward's saved tensors are counted (`counters.SavedTensors`) and
predicted (`accounting.activations.saved_bytes`). One length keeps the whole timeline (on a GPU, the
allocator's history): the curve, the largest allocations, and what is live at the peak, sorted by
where it was made: in the forward and still live (saved activations), in the backward and live when
it ends (gradients), or anything else (temporaries).

At that length the step runs again with the blocks checkpointed in segments
(`models.checkpointing`): saved bytes and peak, and the step time of each variant, timed
round-robin on the same model (checkpointing is switched on and off between calls).
`third_party.CS336_STUDENT_MEMORY` holds a seed's arithmetic for the 2.7B model; `seed_rows` sets
it beside the exact count. What runs is `step_memory_run`; this module reads the rows (`step_parts`:
the step by part over time, measured and predicted, for `diagrams.step_memory`).
Used in: §sec-profiling.
"""

from __future__ import annotations

from typing import Any

from mlsys import bench, third_party
from mlsys.accounting import activations, memory, recompute
from mlsys.accounting.params import count_params
from mlsys.book import Table, num, verdict
from mlsys.diagrams import step_memory as step_parts_model
from mlsys.diagrams.step_memory import StepMemory
from mlsys.experiments import Experiment, timing_of
from mlsys.experiments.kit import setup
from mlsys.experiments.step_memory_run import AT_PEAK, SIZES, run
from mlsys.models.config import TransformerConfig
from mlsys.profiling import memory_timeline

# --- reading the rows (live or recorded) ----------------------------------------------------------


def config(rows: list[dict[str, Any]]) -> TransformerConfig:
    return TransformerConfig.preset(setup(rows)["preset"])


def steps(rows: list[dict[str, Any]], *, segment: int | None = None,
          ok: bool = True) -> list[dict[str, Any]]:
    """The step rows without (segment None) or with checkpointing, by length."""
    return [r for r in rows if r["kind"] == "step" and r["segment"] == segment
            and (not ok or r["status"] == "ok")]


def predicted(rows: list[dict[str, Any]], seq: int,
              segment: int | None = None) -> activations.ActivationBytes:
    return activations.saved_bytes(config(rows), setup(rows)["batch"], seq,
                                   checkpoint_segment=segment)


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
        share = 0.0 if segment is None else recompute.recompute_overhead(
            cfg, batch, seq, checkpoint_segment=segment)
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
    from mlsys.plotting import COLORS, finish  # matplotlib: only when a page draws

    ok = steps(rows)
    seqs = [r["seq"] for r in ok]
    ax.plot(seqs, [(resident(r) + peak(r)[0]) / 1e9 for r in ok], "o-",
            color=COLORS["measured"], label="measured peak")
    ax.plot(seqs, [napkin_bytes(rows, q) / 1e9 for q in seqs], ":", color=COLORS["predicted"],
            label="16 B/param + saved activations")
    finish(ax, title=title or "peak memory of a step", xlabel="sequence length", ylabel="GB",
           logx=2)
    ax.legend(fontsize=7)


def step_parts(rows: list[dict[str, Any]]) -> tuple[StepMemory, StepMemory]:
    """The timeline's step by part (parameters, optimizer state, gradients, activations,
    temporaries): measured, and predicted from the accounting on the measured phases."""
    r = next(r for r in steps(rows) if "parts" in r)
    got = StepMemory.from_record(r["parts"])
    return got, step_parts_model.predicted(
        n_params=setup(rows)["n_params"], recipe="fp32_adamw",
        activation_bytes=predicted(rows, r["seq"]).total_bytes, phases=got.phases)


def plot(rows: list[dict[str, Any]], axes) -> None:
    """Left: the timeline of one step (`plot_timeline`); right: the peak by length (`plot_peak`)."""
    plot_timeline(rows, axes[0])
    plot_peak(rows, axes[1])


# --- the seed's arithmetic for the 2.7B model --------------------------------------------------


def seed_rows(batch: int = 4) -> list[dict[str, Any]]:
    """The seed's 2.7B table beside its own formula, the exact count and the napkin (GB, 1e9)."""
    cfg = TransformerConfig.preset("2.7B")
    n = count_params(cfg)
    out = []
    for t in third_party.CS336_STUDENT_MEMORY:
        mib = batch * t.seq * (third_party.CS336_STUDENT_MIB_PER_TOKEN
                               + third_party.CS336_STUDENT_MIB_PER_TOKEN_SQUARED * t.seq)
        exact = activations.saved_bytes(cfg, batch, t.seq)
        out.append({"seq": t.seq, "claimed_forward_gb": t.claimed_forward_gb,
                    "formula_gb": mib * 2**20 / 1e9, "formula_gib": mib / 1024,
                    "exact_gb": exact.total_bytes / 1e9,
                    "claimed_training_gb": t.claimed_training_gb,
                    "napkin_gb": (memory.model_state_bytes(n, "fp32_adamw")
                                  + exact.total_bytes) / 1e9,
                    "measured_training_gb": t.measured_training_gb})
    return out


def seed_values(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The page's numbers from `seed_rows`: their table against their formula at 256, 512 and
    1,024 tokens (glue name: value)."""
    at = {r["seq"]: r for r in rows}
    return ({f"seed_{seq}_claim": at[seq]["claimed_forward_gb"] for seq in (256, 512, 1024)}
            | {f"seed_{seq}_formula": at[seq]["formula_gib"] for seq in (256, 1024)}
            | {"seed_512_gib": at[512]["formula_gib"], "seed_512_gb": at[512]["formula_gb"]})


def table(rows: list[dict[str, Any]]) -> Table:
    """The summary `python -m mlsys.experiments` prints: `peak_table`."""
    return peak_table(rows)

EXPERIMENT = Experiment(
    name="step_memory",
    chapter="05_benchmarking",
    description="memory timeline of a step, peak by length vs 16 B/param + activations, "
                "checkpointing",
    gpu_seconds=35,
    sizes=SIZES,
    run=run,
)
