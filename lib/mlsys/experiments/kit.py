"""What the experiments share, one home each: reading rows, surviving out-of-memory, freeing and
compiling afresh, and timing all-reduces on a rank.

- `first(rows, kind)` and `setup(rows)`: the first row of a kind (every experiment writes one
  "setup" row naming its device and sizes);
- `OutOfMemory` and `is_oom`: a sweep catches an allocation that fails (CUDA's allocator, or the
  CPU's "can't allocate memory") and records the row as `OUT_OF_MEMORY` instead of a timing; any
  other error still raises;
- `free(device)`: the garbage collector, then on CUDA the caching allocator's cache emptied;
- `compile_fresh(fn)`: `torch.compile` after `torch._dynamo.reset()`, so earlier shapes and graphs
  neither use up the recompile limit nor leak into the next measurement;
- `draw(plot, rows)`: an experiment's `plot(rows, ax)` in a figure of its own, shown (a page's);
- `fresh_model(cfg, device)` and `metered_step`: the book's model built on the device with seeded
  weights, and one training step read phase by phase by a `memory_meter` meter;
- `time_all_reduces` (runs in a rank of `distributed.launch`), `slowest`, `fit_row`: seconds per
  `dist.all_reduce` by message size, the slowest rank's sample, the alpha-beta fit as a row
  (`accounting.comms`). Used in: `allreduce_bench`, `ddp_step`, `parallel_step`.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from mlsys import bench
from mlsys.accounting import comms as comms_cost
from mlsys.counters import SavedTensors
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.training import next_token_loss

OUT_OF_MEMORY = "out of memory"
"""The status of a row whose allocation failed (its timing is missing)."""

# --- reading rows ---------------------------------------------------------------------------------


def first(rows: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The first row whose "kind" is `kind` (StopIteration if there is none)."""
    return next(r for r in rows if r["kind"] == kind)


def setup(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run's "setup" row: its device and sizes."""
    return first(rows, "setup")


# --- memory ---------------------------------------------------------------------------------------


def is_oom(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: CUDA's `OutOfMemoryError`, or a RuntimeError
    saying "out of memory" (CUDA, cuBLAS) or "can't allocate memory" (the CPU allocator)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text
                                                or "can't allocate memory" in text)


class OutOfMemory:
    """`with OutOfMemory() as oom: ...` swallows an out-of-memory error (`is_oom`) and sets
    `oom.happened`; any other error passes through. Only a flag is kept, never the error, whose
    traceback would hold the failed step's tensors."""

    def __init__(self) -> None:
        self.happened = False

    def __enter__(self) -> OutOfMemory:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if error is not None and is_oom(error):
            self.happened = True
            return True
        return False


def free(device: str) -> None:
    """Collect garbage, then on CUDA hand the allocator's cached blocks back to the device."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def compile_fresh(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """`torch.compile(fn, **options)` after `torch._dynamo.reset()`: no graph, guard or recompile
    count of an earlier compile carries over."""
    torch._dynamo.reset()
    return torch.compile(fn, **options)


def draw(plot: Callable[..., None], rows: Any, *, width: float, height: float, nrows: int = 1,
         ncols: int = 1, **options: Any) -> None:
    """`plot(rows, axes, **options)` in a figure of its own (`plotting.subplots`: `width` x
    `height` inches, one axes or an array of `nrows` x `ncols`), then shown. `rows`: what `plot`
    reads first, an experiment's rows or the presets of a page's figure."""
    import matplotlib.pyplot as plt  # matplotlib: only when a page draws

    from mlsys import plotting  # (the same)

    _, axes = plotting.subplots(nrows, ncols, width=width, height=height)
    plot(rows, axes, **options)
    plt.show()


# --- the model, and one step read by the allocator ----------------------------------------------


def fresh_model(cfg: TransformerConfig, device: str) -> Transformer:
    """The book's model of `cfg` built on `device` (no copy from the CPU), weights drawn from
    seed 0 (`Transformer.init_weights`)."""
    with torch.device(device):
        model = Transformer(cfg)
    model.init_weights(seed=0)
    return model


def metered_step(meter, model: Transformer, optimizer: torch.optim.Optimizer,
                 tokens: torch.Tensor, *, autocast: bool = False) -> SavedTensors:
    """One training step inside `meter.recording()` (a `profiling.memory_meter` meter), in its
    phases "forward" (the loss, under bf16 autocast if `autocast`), "backward" and "optimizer"
    (step and zero_grad); the loss is freed in the backward. Returns the forward's saved-tensor
    counter."""
    counter = SavedTensors(model)
    low = (torch.autocast(tokens.device.type, dtype=torch.bfloat16) if autocast
           else contextlib.nullcontext())
    with meter.recording():
        with meter.phase("forward"), counter, low:
            loss = next_token_loss(model, tokens)
        with meter.phase("backward"):
            loss.backward()
            del loss
        with meter.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return counter


# --- all-reduces on ranks -------------------------------------------------------------------------

SAMPLE_BYTES = 4 * 2**20
MAX_CALLS = 64


def calls_per_sample(message_bytes: int) -> int:
    """All-reduces timed back to back in one sample: enough for `SAMPLE_BYTES`, at most
    `MAX_CALLS` (as nccl-tests averages many iterations), so a small message's sample measures
    its latency in a stream of calls, not the wake-up after a barrier."""
    return max(1, min(MAX_CALLS, SAMPLE_BYTES // message_bytes))


def time_all_reduces(rank, message_bytes: tuple[int, ...], warmup: int,
                     repeats: int) -> dict[int, list[float]]:
    """On one rank: seconds per `dist.all_reduce`, per sample, per message size (runs in a rank).
    A sample is a barrier, then `calls_per_sample` calls and a device sync."""
    cuda = rank.device.type == "cuda"
    out = {}
    for size in message_bytes:
        x = torch.ones(size // 4, device=rank.device)
        calls, samples = calls_per_sample(size), []
        for i in range(warmup + repeats):
            dist.barrier(group=rank.group)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x, group=rank.group)
            if cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                samples.append((time.perf_counter() - start) / calls)
        out[size] = samples
        del x
    return out


def slowest(per_rank: Sequence[Sequence[float]], *, warmup: int = 0,
            device: str = "ranks") -> bench.Timing:
    """Sample by sample, the slowest rank's seconds: a collective step is done when its last rank
    is. `per_rank[r][i]` is rank r's i-th sample."""
    return bench.Timing(tuple(max(v) for v in zip(*per_rank, strict=True)), warmup, device)


def fit_row(message_bytes: list[int], times_s: list[float], n_ranks: int) -> dict[str, Any]:
    """The alpha-beta fit as a row, or the reason there is none (a noisy run whose times do not
    grow with the size)."""
    try:
        fit = comms_cost.fit_alpha_beta(message_bytes, times_s, n_ranks=n_ranks)
    except ValueError as error:
        return {"kind": "fit", "error": str(error)}
    return {"kind": "fit", "alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s,
            "per_call_s": fit.per_call_s, "relative_errors": list(fit.relative_errors)}
