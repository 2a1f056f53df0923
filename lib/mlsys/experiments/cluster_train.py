"""The training entry point run by torchrun on 1 rank and on every rank the machine has: loss,
tokens/s, MFU and peak memory per step, beside the planner's prediction for the same mesh.

Each world size is one `torchrun --standalone --nproc-per-node=N -m mlsys.train` job (FSDP over
every rank, the sizes' preset, batch and recipe); its JSON-lines log becomes the "step" rows. A
"run" row sums a job up over its steady steps (the first quarter is warm-up: allocator, autotuning,
the first all-gathers) and holds the planner's predicted step time and MFU: on a GPU in the
`mlsys.hardware` table, its spec and node links at 100% efficiency (an upper bound); elsewhere
there is no spec, and the prediction is left out rather than invented. On a machine with fewer
GPUs than a world size asks for, a "skipped" row says so. `train_expecting` runs the entry point's
loop in a rank of `mlsys.distributed.launch` with an expected warning caught and handed back
(resuming on 1 rank a checkpoint that 2 saved: the RNG states are not restored), so that a page
can say it rather than print it. Used in: chapter 10 (§sec-cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import torch

from mlsys import env, hardware, plotting, probes
from mlsys.accounting import planner
from mlsys.accounting.parallel import ParallelDims
from mlsys.book import Table, num
from mlsys.experiments import Experiment
from mlsys.models.config import TransformerConfig
from mlsys.train import loop

JOB_TIMEOUT_S = 900
WARMUP_SHARE = 0.25
"""The first quarter of the steps is left out of the steady figures."""
CLUSTERS = {"a100": "dgx-a100", "h100": "dgx-h100", "h200": "dgx-h100", "b200": "dgx-b200"}
RNG_NOT_RESTORED = "RNG states are not restored"
"""What `train.checkpoint` warns when a checkpoint is loaded by another number of ranks."""


def train_expecting(rank: Any, argv: list[str], expected: str) -> tuple[list[dict], list[str]]:
    """`loop.train_in_launch(rank, argv)` with every warning whose message contains `expected`
    caught: (the rows, those messages). Other warnings are shown as usual."""
    with warnings.catch_warnings(record=True) as caught:  # the filters in force still apply
        rows = loop.train_in_launch(rank, argv)
    said = [str(w.message) for w in caught if expected in str(w.message)]
    for w in caught:
        if expected not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return rows, said


@dataclass(frozen=True)
class Sizes:
    preset: str
    precision: str
    world_sizes: tuple[int, ...]  # the rank counts to run (0: every GPU of the machine)
    steps: int
    global_batch: int
    micro_batch: int
    seq_len: int


SIZES = {
    "smoke": Sizes("debug", "fp32_adamw", (1, 2), 8, 8, 4, 32),
    "cpu": Sizes("laptop", "fp32_adamw", (1, 2), 24, 16, 4, 128),
    "gpu": Sizes("xl", "bf16_mixed_adamw", (1, 8), 60, 64, 4, 1024),
}


def argv(s: Sizes, world: int, log: Path) -> list[str]:
    """The entry point's flags for one job of `world` ranks."""
    micro = min(s.micro_batch, s.global_batch // world)
    return ["--preset", s.preset, "--precision", s.precision, "--steps", str(s.steps),
            "--global-batch", str(s.global_batch), "--micro-batch", str(micro),
            "--seq-len", str(s.seq_len), "--log-file", str(log), "--quiet"]


def job(s: Sizes, world: int) -> tuple[list[dict[str, Any]], float]:
    """One torchrun job: its logged rows and its wall-clock seconds (start-up included)."""
    with tempfile.TemporaryDirectory(prefix="mlsys-cluster-train-") as tmp:
        log = Path(tmp) / "log.jsonl"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world}", "-m", "mlsys.train", *argv(s, world, log)]
        environ = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        start = time.perf_counter()
        done = subprocess.run(cmd, env=environ, capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"torchrun with {world} ranks failed (exit {done.returncode}):\n"
                               f"{done.stderr[-3000:]}")
        return [json.loads(line) for line in log.read_text().splitlines()], seconds


def prediction(s: Sizes, world: int, *, flop_per_s: float | None = None) -> dict[str, Any]:
    """The planner's step time and MFU for FSDP over `world` ranks: on a GPU of the
    `mlsys.hardware` table at its spec; elsewhere, given `flop_per_s` (the run's measured matmul
    ceiling), on this machine as measured, its copy bandwidth standing in for the link (labelled:
    gloo's loopback moves bytes through memory copies, and at least that slowly)."""
    cfg = TransformerConfig.preset(s.preset)
    micro = min(s.micro_batch, s.global_batch // world)
    dtype = "bf16" if "bf16" in s.precision else "fp32"
    acc = hardware.detect()
    if acc is not None:
        key = next(k for k, v in hardware.ACCELERATORS.items() if v is acc)
        cluster = hardware.get_cluster(CLUSTERS.get(key, "dgx-h100"))
        label = f"planner at 100% of the {acc.name} spec (an upper bound)"
    elif flop_per_s:
        copy = probes.measure_copy_bandwidth(64 * 2**20, device="cpu")
        cluster = planner.measured_cluster("this CPU", flop_per_s=flop_per_s, dtype=dtype,
                                           link_bytes_per_s=copy, per_node=max(world, 1),
                                           memory_bytes=1e12)
        label = ("planner on this CPU's measured matmul ceiling, its copy bandwidth as the link "
                 "(labelled: no spec)")
    else:
        return {"predicted_step_s": None, "predicted_mfu": None,
                "prediction": "no spec for this device and no measured ceiling: no prediction"}
    plan = planner.evaluate(cfg, cluster, ParallelDims(dp_shard=world), batch=s.global_batch,
                            seq=s.seq_len, microbatches=s.global_batch // world // micro,
                            recipe=s.precision, dtype=dtype)
    return {"predicted_step_s": plan.step_s, "predicted_mfu": plan.mfu, "prediction": label}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """A job per world size; "step", "run" and "skipped" rows."""
    device = device or env.device()
    available = None
    if device == "cuda":
        available = torch.cuda.device_count()
    rows: list[dict[str, Any]] = []
    for world in s.world_sizes:
        if available is not None and world > available:
            rows.append({"kind": "skipped", "world_size": world,
                         "why": f"{world} ranks need {world} GPUs; this machine has {available}"})
            continue
        steps, seconds = job(s, world)
        rows += [{"kind": "step", "world_size": world, **r} for r in steps]
        steady = steps[int(len(steps) * WARMUP_SHARE):]
        rows.append({"kind": "run", "world_size": world, "preset": s.preset,
                     "precision": s.precision, "steps": s.steps, "global_batch": s.global_batch,
                     "seq_len": s.seq_len, "job_s": seconds,
                     "step_s": median(r["step_s"] for r in steady),
                     "tokens_per_s": median(r["tokens_per_s"] for r in steady),
                     "mfu": median(r["mfu"] for r in steady), "mfu_peak": steady[-1]["mfu_peak"],
                     "peak_memory_bytes": max(r["peak_memory_bytes"] for r in steps),
                     "first_loss": steps[0]["loss"], "last_loss": steps[-1]["loss"],
                     **prediction(s, world, flop_per_s=steady[-1]["peak_flop_per_s"])})
    return rows


def runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "run"]


def table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in rows:
        if r["kind"] == "skipped":
            out.append([r["world_size"], r["why"], "", "", "", "", ""])
        elif r["kind"] == "run":
            predicted = (f"{num(r['predicted_step_s'] * 1e3)} ms, {r['predicted_mfu']:.0%}"
                         if r["predicted_step_s"] else "none")
            out.append([r["world_size"], f"{num(r['first_loss'])} → {num(r['last_loss'])}",
                        num(r["step_s"] * 1e3), num(r["tokens_per_s"]), f"{r['mfu']:.1%}",
                        predicted, num(r["peak_memory_bytes"] / 2**20)])
    return Table(["ranks", "loss", "step ms", "tokens/s", "MFU", "planner", "peak MiB"], out)


def steps_of(rows: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "step" and r["world_size"] == world]


def plot(curves: dict[str, list[dict[str, Any]]], axes) -> None:
    """Loss and tokens/s against the step, one line per labelled run (rows as logged)."""
    for label, logged in curves.items():
        steps = [r["step"] for r in logged]
        axes[0].plot(steps, [r["loss"] for r in logged], marker=".", label=label)
        axes[1].plot(steps, [r["tokens_per_s"] for r in logged], marker=".", label=label)
    plotting.finish(axes[0], title="training loss", xlabel="step", ylabel="loss (nats / token)")
    plotting.finish(axes[1], title="throughput", xlabel="step", ylabel="tokens / s", logy=True)


def mfu_verdict(run_row: dict[str, Any]) -> str:
    """The measured MFU against the planner's, in words computed from the two numbers."""
    if not run_row.get("predicted_mfu"):
        return f"Measured MFU {run_row['mfu']:.1%}; {run_row['prediction']}."
    ratio = run_row["mfu"] / run_row["predicted_mfu"]
    how = ("about what the planner predicts" if 0.8 <= ratio <= 1.25 else
           "below the planner's bound: time goes where its model has no term (launch overhead, "
           "Python, small kernels)" if ratio < 0.8 else
           "above the planner's prediction: its link or ceiling is too pessimistic here")
    return (f"Measured MFU {run_row['mfu']:.1%} against {run_row['predicted_mfu']:.1%} from the "
            f"{run_row['prediction']}: {ratio:.2f}x, {how}.")


def scaling_verdict(rows: list[dict[str, Any]]) -> str:
    """How throughput grew from the fewest ranks to the most, in the rows' own numbers."""
    done = sorted(runs(rows), key=lambda r: r["world_size"])
    if len(done) < 2:
        return "One world size ran: nothing to compare."
    a, b = done[0], done[-1]
    gain = b["tokens_per_s"] / a["tokens_per_s"]
    ideal = b["world_size"] / a["world_size"]
    how = ("scaled better than linearly: the smaller run was held back by something the larger "
           "escaped (its step times show what)" if gain > 1.2 * ideal else
           "scaled almost linearly" if gain >= 0.8 * ideal else
           "gained, but well short of linear" if gain > 1.05 else
           "did not speed up" if gain >= 0.95 else "slowed down")
    return (f"From {a['world_size']} to {b['world_size']} ranks the throughput went from "
            f"{num(a['tokens_per_s'])} to {num(b['tokens_per_s'])} tokens/s ({gain:.2f}x, "
            f"linear would be {ideal:g}x): it {how}.")


EXPERIMENT = Experiment(
    name="cluster_train",
    chapter="10_cluster",
    description="python -m mlsys.train under torchrun on 1 rank and on all: loss, tokens/s, MFU, "
                "memory vs the planner",
    gpu_seconds=240,
    sizes=SIZES,
    run=run,
)
