"""The training loop every rank runs: data, step, clipping, schedule, logging, checkpoints.

`train(run)` runs inside an initialized process group (torchrun's env://, or the notebook
launcher's) and returns the rows it logged. One step is `run.accumulation` micro-batches of
`run.micro_batch` sequences on each data-parallel rank (through the pipeline schedule when
pp > 1), the gradient clipped to `--clip` on its global norm, then AdamW (fused on CUDA) at the
learning rate of `lr_at`: linear warm-up, then a cosine to `min_lr_ratio` of the peak. Rank 0
logs each step (loss, learning rate, gradient norm, tokens/s, MFU, peak memory) to a JSON-lines
file and a progress bar. With `--ckpt`, a run resumes from the last complete checkpoint: the
model, optimizer, sampler position and step come back, so the resumed run computes what the
uninterrupted one would have, bit for bit (tests/train/test_main.py). Used in: chapter 10.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm  # the plain bar: tqdm.auto warns in a notebook without ipywidgets

from mlsys import hardware, probes
from mlsys.accounting import flops
from mlsys.train import checkpoint, checkpoint_layout, data, options, parallelize
from mlsys.train.options import Run


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines log written by `train` (a restarted run repeats some steps)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def lr_at(step: int, *, peak: float, warmup: int, steps: int, min_ratio: float) -> float:
    """Learning rate of optimizer step `step` (0-based): peak * (step + 1) / warmup during the
    warm-up, then a cosine from peak down to peak * min_ratio at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy, in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def peak_flop_per_s(run: Run) -> tuple[float, str]:
    """The peak MFU is measured against: the GPU's spec at the compute dtype, else a matmul
    ceiling measured here (labelled: a CPU has no spec in `mlsys.hardware`)."""
    if run.device == "cuda":
        acc = hardware.detect()
        if acc is not None:
            return acc.peak_flop_per_s(run.policy.compute_dtype), f"{acc.name} spec peak"
    dtype = run.policy.compute_dtype
    measured = probes.measure_matmul_flop_per_s((256,), dtype=dtype, device=run.device)[256]
    return measured, f"measured {dtype} matmul ceiling ({run.device}, {measured / 1e9:.3g} GFLOP/s)"


def peak_memory_bytes(device: str) -> int:
    """Peak bytes: the CUDA allocator's, else this process's peak resident set (Linux: KiB)."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _optimizer(stage: torch.nn.Module, run: Run) -> torch.optim.Optimizer:
    params = [p for p in stage.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": run.options.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    fused = run.device == "cuda"
    return torch.optim.AdamW(groups, lr=run.options.lr, betas=(0.9, 0.95), fused=fused)


class Logger:
    """Rank 0's JSON-lines log and progress bar; every rank calls it, only rank 0 writes."""

    def __init__(self, run: Run, rank: int, start: int):
        o = run.options
        path = o.log or (str(Path(o.ckpt) / "log.jsonl") if o.ckpt else None)
        self.file = open(path, "a") if rank == 0 and path else None  # noqa: SIM115
        self.bar = None
        if rank == 0 and not o.quiet:
            self.bar = tqdm(total=run.steps, initial=start, desc="train", unit="step")

    def __call__(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", mfu=f"{row['mfu']:.1%}")
            self.bar.update(1)

    def close(self) -> None:
        for thing in (self.file, self.bar):
            if thing is not None:
                thing.close()


def _sampler(run: Run) -> data.Sampler:
    o = run.options
    path = Path(o.data) if o.data else data.stdlib_corpus()
    tokens = data.TokenData(path, dtype=o.data_dtype if o.data else "uint16")
    return data.Sampler(tokens, seq_len=o.seq_len, global_batch=o.global_batch, seed=o.seed)


def train(run: Run, mesh: Any | None = None) -> list[dict[str, Any]]:
    """Train `run` on this rank (process group initialized); the rows rank 0 logged."""
    o, d = run.options, run.dims
    mesh = mesh if mesh is not None else parallelize.device_mesh(d, run.device)
    rank = dist.get_rank()
    stage = parallelize.build(run, mesh)
    optimizer = _optimizer(stage, run)
    sampler = _sampler(run)
    dp_mesh = parallelize.dp_mesh(mesh, d)
    dp_rank = dp_mesh.get_local_rank() if d.dp_replicate == 1 else (
        mesh["dp_replicate"].get_local_rank() * d.dp_shard + mesh["dp_shard"].get_local_rank())
    schedule = parallelize.pipeline(stage, run, mesh, loss_fn) if d.pp > 1 else None
    pp_group = mesh["pp"].get_group() if d.pp > 1 else None
    start = 0
    if o.ckpt and (last := checkpoint_layout.latest(Path(o.ckpt))) is not None:
        extra = checkpoint.load(last, stage, optimizer)
        sampler.load_state_dict(extra["sampler"])
        start = sampler.step
    flop_per_step = flops.training_flops_per_token(run.config, o.seq_len) * o.global_batch * \
        o.seq_len
    peak, peak_label = peak_flop_per_s(run)
    device = next(stage.parameters()).device
    log = Logger(run, rank, start)
    rows = []
    try:
        for step in range(start, run.steps):
            if o.kill_rank_at == (rank, step) and os.environ.get(
                    "TORCHELASTIC_RESTART_COUNT", "0") == "0":
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a lost rank
            t0 = time.perf_counter()
            lr = lr_at(step, peak=o.lr, warmup=run.warmup, steps=run.steps,
                       min_ratio=o.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batches = sampler.rank_micro_batches(step, dp_rank=dp_rank, dp_size=d.dp,
                                                 micro_batch=run.micro_batch)
            loss = _forward_backward(stage, schedule, batches, device, run)
            norm = parallelize.grad_norm(stage, pp_group)
            if o.clip > 0:
                parallelize.clip_(stage, o.clip, norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dist.all_reduce(loss)  # the last stage's ranks hold the loss: mean over them
            loss = loss / (dist.get_world_size() // d.pp)
            if run.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            row = {"step": step + 1, "loss": loss.item(), "lr": lr, "grad_norm": norm.item(),
                   "step_s": seconds, "tokens_per_s": o.global_batch * o.seq_len / seconds,
                   "mfu": flop_per_step / (seconds * peak * dist.get_world_size()),
                   "mfu_peak": peak_label, "peak_flop_per_s": peak,
                   "peak_memory_bytes": peak_memory_bytes(run.device)}
            rows.append(row)
            log(row)
            sampler.advance()
            done = step + 1 == run.steps
            if o.ckpt and (done or (o.ckpt_every and (step + 1) % o.ckpt_every == 0)):
                checkpoint.save(Path(o.ckpt), step + 1, stage, optimizer,
                                extra={"step": step + 1, "sampler": sampler.state_dict(),
                                       "schedule": {"name": "warmup_cosine", "peak": o.lr,
                                                    "warmup": run.warmup, "steps": run.steps,
                                                    "min_ratio": o.min_lr_ratio},
                                       "config": run.as_dict()})
    finally:
        log.close()
    return rows


def _forward_backward(stage: torch.nn.Module, schedule: Any, batches: list[Tensor],
                      device: torch.device, run: Run) -> Tensor:
    """Forward and backward of this rank's micro-batches; the sum of their mean losses / count
    (a 0-d fp32 tensor; 0 on ranks that are not the pipeline's last stage)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    if schedule is not None:
        tokens = torch.cat(batches).to(device)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        losses: list[Tensor] = []
        if stage.is_first:
            schedule.step(inputs)
        elif stage.is_last:
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        for loss in losses:
            total += loss.detach().float()
        return total / len(batches)
    for i, batch in enumerate(batches):
        batch = batch.to(device)
        stage.set_requires_gradient_sync(i == len(batches) - 1)
        loss = loss_fn(stage(batch[:, :-1]), batch[:, 1:]) / len(batches)
        loss.backward()
        total += loss.detach()
    return total


def train_in_launch(rank: Any, argv: list[str]) -> list[dict[str, Any]]:
    """The entry point inside a rank of `mlsys.distributed.launch` (a notebook cell): the same
    flags, checks and loop as `python -m mlsys.train`, in the launcher's process group."""
    run = options.resolve(options.parse(argv), rank.world_size)
    options.check_paths(run)
    return train(run)
