"""What the memory allocator holds during training steps, per precision recipe, against the count.

The book's model trains for a few steps per recipe (fp32 AdamW, pure bf16 AdamW, fp32 AdamW with
bf16 autocast) and the allocator is read around every phase of every step (forward, backward,
optimizer step, zero_grad): the bytes live when the phase ends and the peak during it. On a CUDA
GPU that is `torch.cuda.memory_allocated()` / `max_memory_allocated()` (after
`reset_peak_memory_stats`); on a CPU it is the allocation and free events of PyTorch's profiler
(`profile_memory=True`), whose running sum is the live bytes at every moment; both are read by
`mlsys.profiling.memory_meter.meter`, and count from zero before the model is built.
`mlsys.accounting.memory` predicts the model states (weights, gradients, optimizer moments); the
allocator also sees what the count leaves out: the saved activations and logits at the peak,
temporaries of the optimizer, buffers (RoPE tables), the token batch and AdamW's step counters.
The forward pass's growth is checked against the tensors autograd saves for backward (counted
with `torch.autograd.graph.saved_tensors_hooks`), and the first block's share of them is kept
(`block_saved_bytes`) for the page's closed form of one block. `recipe_needs` is the page's
arithmetic at a larger size: every recipe's states and activations per GPU, replicated or sharded.
A little over 300 lines: one experiment, the readings and checks of its rows, and that arithmetic,
all of chapter 02's measurement. Used in: §sec-tensors-memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import checks, env, hardware
from mlsys.accounting import memory
from mlsys.accounting.activations import saved_bytes
from mlsys.accounting.params import count_params
from mlsys.book import Table, num
from mlsys.counters import SavedTensors
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import memory_meter
from mlsys.training import next_token_loss


@dataclass(frozen=True)
class Sizes:
    preset: str  # the model (`TransformerConfig.preset`)
    batch: int  # sequences per step
    seq: int  # tokens per sequence (at most the preset's context_length)
    steps: int = 2  # step 1 creates the optimizer state; step 2 is the steady state
    seed: int = 0

    def __post_init__(self) -> None:
        checks.choice(self.preset, "preset", PRESETS)
        checks.positive_ints(batch=self.batch, seq=self.seq, steps=self.steps)
        if self.steps < 2:
            raise ValueError(f"steps must be >= 2 (the second step is the steady state), "
                             f"got {self.steps}")
        context = TransformerConfig.preset(self.preset).context_length
        if self.seq > context:
            raise ValueError(f"seq ({self.seq}) exceeds the {self.preset} context_length "
                             f"({context})")


SIZES = {
    "smoke": Sizes("debug", 2, 16),
    "cpu": Sizes("debug", 8, 128),
    "gpu": Sizes("small", 8, 512),
}

RUNS = {  # label -> (parameter dtype, autocast dtype or None, accounting recipe of its states)
    "fp32 AdamW": ("fp32", None, "fp32_adamw"),
    "pure bf16 AdamW": ("bf16", None, "bf16_pure_adamw"),
    "fp32 AdamW + bf16 autocast": ("fp32", "bf16", "fp32_adamw"),
}
PHASES = ("forward", "backward", "optimizer step", "zero_grad")
"""The phases of one step; before them, the phase "model" builds the model and the token batch."""
SCALARS_BYTES = 64
"""Slack between the forward pass's growth and the bytes it saves: the loss, a few 0-d tensors."""


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _train(meter, label: str, s: Sizes, device: str) -> dict[str, Any]:
    """Build the model and the batch, then `s.steps` training steps, each phase read by `meter`."""
    param_dtype, autocast_dtype, recipe = RUNS[label]
    cfg = TransformerConfig.preset(s.preset)
    saved, block_saved = [], []
    with meter.recording():
        with meter.phase("model", kind="phase", run=label, step=0):
            model = Transformer(cfg).to(device=device, dtype=torch_dtype(param_dtype))
            model.init_weights(seed=s.seed)
            optimizer = torch.optim.AdamW(model.parameters())
            gen = torch.Generator().manual_seed(s.seed)
            tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
        low = torch_dtype(autocast_dtype or "bf16")
        for step in range(1, s.steps + 1):
            counter = SavedTensors(model, exclude=[tokens])  # parameters and buffers apart
            with meter.phase("forward", kind="phase", run=label, step=step), counter:
                with torch.autocast(device, dtype=low, enabled=autocast_dtype is not None):
                    loss = next_token_loss(model, tokens)
            saved.append(counter.activation_bytes)
            block_saved.append(counter.by_module(depth=2).get("blocks.0", 0))
            with meter.phase("backward", kind="phase", run=label, step=step):
                loss.backward()
                del loss
            with meter.phase("optimizer step", kind="phase", run=label,
                             step=step):
                optimizer.step()
            with meter.phase("zero_grad", kind="phase", run=label, step=step):
                optimizer.zero_grad(set_to_none=True)
    params = list(model.parameters())
    row = {"kind": "run", "run": label, "recipe": recipe, "param_dtype": param_dtype,
           "autocast": autocast_dtype, "n_params": sum(p.numel() for p in params),
           "param_tensors": len(params), "param_bytes": _nbytes(params),
           "buffer_bytes": _nbytes(model.buffers()), "token_bytes": _nbytes([tokens]),
           "step_counter_bytes": _nbytes(v for st in optimizer.state.values() for v in st.values()
                                         if isinstance(v, torch.Tensor) and v.dim() == 0
                                         and v.device.type == device),
           "saved_bytes": saved, "block_saved_bytes": block_saved}
    del model, optimizer, tokens, params
    kit.free(device)
    return row


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Train each recipe of `RUNS` for `s.steps` steps, reading the allocator around every phase."""
    device = device or env.device()
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu' (an allocator this can read), "
                         f"got {device!r}")
    meter = memory_meter.meter(device)
    cfg = TransformerConfig.preset(s.preset)
    rows: list[dict[str, Any]] = [{
        "kind": "setup", "device": env.device_name(), "device_type": device, "method": meter.method,
        "preset": s.preset, "batch": s.batch, "seq": s.seq, "vocab": cfg.vocab_size,
        "n_layers": cfg.n_layers, "d_model": cfg.d_model}]
    runs = [_train(meter, label, s, device) for label in RUNS]
    return rows + runs + meter.rows


def recipe_needs(cfg: TransformerConfig, batch: int, seq: int,
                 n_devices: int) -> dict[str, dict[str, float]]:
    """Per recipe of `memory.RECIPES`, bytes: its model states, the activations of every layer
    (naive attention; fp32 for recipes that keep 4-byte weights, bf16 otherwise), and per GPU the
    states replicated plus the activations, and sharded over `n_devices` plus the activations."""
    n_devices = checks.positive_int(n_devices, "n_devices")
    layer = {dt: saved_bytes(cfg, batch, seq, dtype=dt, attention="naive").block_bytes
             for dt in ("fp32", "bf16")}
    out = {}
    for r in memory.RECIPES.values():
        states = memory.model_state_bytes(count_params(cfg), r)
        acts = cfg.n_layers * layer["fp32" if r.weight_bytes == 4 else "bf16"]
        out[r.name] = {"states": states, "activations": acts, "replicated": states + acts,
                       "sharded": states / n_devices + acts}
    return out


def needs_table(needs: dict[str, dict[str, float]], hbm_bytes: float) -> Table:
    """`recipe_needs` in GB, a per-GPU figure over `hbm_bytes` marked ✗."""
    def cell(key: str, value: float) -> str:
        over = key in ("replicated", "sharded") and value > hbm_bytes
        return f"{value / hardware.GIGA:.1f}" + (" ✗" if over else "")

    return Table(["recipe", "states", "activations", "per GPU, replicated", "per GPU, sharded"],
                 [[f"`{name}`", *(cell(k, v) for k, v in need.items())]
                  for name, need in needs.items()])


def mixed_answers(n_devices: int, hbm_bytes: float) -> str:
    """How each 16-bit recipe moves the fp32 AdamW answer to "the largest model whose states fit
    on `n_devices` of `hbm_bytes`" (`memory.max_trainable_params`), in words."""
    answers = {r.name: memory.max_trainable_params(n_devices, hbm_bytes, r)
               for r in memory.RECIPES.values()}
    fp32 = answers["fp32_adamw"]
    return "; ".join(
        f"{name} ({memory.recipe(name).bytes_per_param} B/param) gives " + (
            "the same answer" if answers[name] == fp32 else
            f"{answers[name] / fp32:.2f}x the answer ({answers[name] / hardware.GIGA:.1f} billion)")
        for name in ("bf16_mixed_adamw", "bf16_mixed_adamw_fp32_grads", "bf16_pure_adamw"))


def shared_lines() -> str:
    """Which recipes cost the same bytes per parameter, as a plot of them draws them: the later
    names dashed on the first."""
    by_bytes: dict[int, list[str]] = {}
    for r in memory.RECIPES.values():
        by_bytes.setdefault(r.bytes_per_param, []).append(r.name)
    return "; ".join(f"{', '.join(names[1:])} dashed on {names[0]}"
                     for names in by_bytes.values() if len(names) > 1)


# --- reading the rows (live or recorded) ----------------------------------------------------------


def runs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["run"]: r for r in rows if r["kind"] == "run"}


def phases(rows: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    """The phase rows of one run, in order (step 0 is building the model)."""
    return [r for r in rows if r["kind"] == "phase" and r["run"] == run]


def phase(rows: list[dict[str, Any]], run: str, step: int, name: str) -> dict[str, Any]:
    return next(r for r in phases(rows, run) if r["step"] == step and r["phase"] == name)


@dataclass(frozen=True)
class Reading:
    """One run's allocator numbers next to the accounting's prediction (bytes)."""

    run: str
    recipe: str
    predicted_states: int  # accounting.memory: weights + grads + master + optimizer
    after_step: int  # live when the last optimizer step ends: every model state exists
    extras: int  # what else is known to be live then: buffers, token batch, step counters
    forward_growth: int  # live after the last forward minus live before it
    saved: int  # bytes autograd saved for backward in that forward (new storages)
    peak: int  # the largest peak of the last step
    peak_phase: str

    @property
    def unexplained(self) -> int:
        """Allocator after the step, minus the prediction and the known extras (0 on a CPU)."""
        return self.after_step - self.predicted_states - self.extras


def readings(rows: list[dict[str, Any]]) -> list[Reading]:
    out = []
    for label, r in runs(rows).items():
        ph = phases(rows, label)
        last = max(p["step"] for p in ph)
        before_forward = phase(rows, label, last - 1, "zero_grad" if last > 1 else "model")
        forward = phase(rows, label, last, "forward")
        peak = max((p for p in ph if p["step"] == last), key=lambda p: p["peak_bytes"])
        out.append(Reading(
            run=label, recipe=r["recipe"],
            predicted_states=memory.model_state_bytes(r["n_params"], r["recipe"]),
            after_step=phase(rows, label, last, "optimizer step")["live_bytes"],
            extras=r["buffer_bytes"] + r["token_bytes"] + r["step_counter_bytes"],
            forward_growth=forward["live_bytes"] - before_forward["live_bytes"],
            saved=r["saved_bytes"][-1], peak=peak["peak_bytes"], peak_phase=peak["phase"]))
    return out


def _mb(n: float) -> str:
    return num(n / 1e6)


def table(rows: list[dict[str, Any]]) -> Table:
    """Per recipe, one column each (a narrow table): predicted model states, the allocator after
    the step, what else is known to be live, the forward pass against what it saves, the peak."""
    rs = readings(rows)
    quantities = {
        "recipe": lambda r: f"`{r.recipe}`",
        "bytes per parameter": lambda r: memory.recipe(r.recipe).bytes_per_param,
        "model states, predicted": lambda r: _mb(r.predicted_states),
        "allocator after the step": lambda r: _mb(r.after_step),
        "after the step / predicted": lambda r: f"{r.after_step / r.predicted_states:.4f}",
        "buffers, batch, step counters": lambda r: _mb(r.extras),
        "unexplained": lambda r: _mb(r.unexplained),
        "saved for backward": lambda r: _mb(r.saved),
        "forward growth": lambda r: _mb(r.forward_growth),
        "peak of the last step": lambda r: f"{_mb(r.peak)} ({r.peak_phase})",
        "peak / predicted": lambda r: f"{r.peak / r.predicted_states:.2f}",
    }
    return Table(["MB, unless marked", *(r.run for r in rs)],
                 [[name, *(cell(r) for r in rs)] for name, cell in quantities.items()])


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the numbers: states, forward growth, peak, recipes compared, and
    how exactly the allocator matches the count ("exactness")."""
    rs = {r.run: r for r in readings(rows)}
    fp32, bf16, amp = rs["fp32 AdamW"], rs["pure bf16 AdamW"], rs["fp32 AdamW + bf16 autocast"]
    each = ", ".join
    if all(r.unexplained == 0 for r in rs.values()):
        states = ("in every run the allocator holds exactly the predicted model states plus the "
                  "buffers, the token batch and the step counters ("
                  + each(f"{_mb(r.predicted_states)} + {_mb(r.extras)} MB" for r in rs.values())
                  + ")")
    else:
        states = "; ".join(f"{r.run}: {_mb(r.after_step)} MB held, {_mb(r.predicted_states)} MB "
                           f"predicted, {_mb(r.extras)} MB of buffers, batch and step counters and "
                           f"{_mb(r.unexplained)} MB not itemized here" for r in rs.values())
    slack = max(r.forward_growth - r.saved for r in rs.values())
    if all(0 <= r.forward_growth - r.saved <= SCALARS_BYTES for r in rs.values()):
        forward = (f"in every run it grows the allocation by what autograd saves for backward, to "
                   f"within {slack} bytes (the loss and a few scalars): "
                   + each(f"{_mb(r.saved)} MB" for r in rs.values()))
    else:
        forward = each(f"{r.run} grows the allocation by {r.forward_growth / r.saved:.3f}x the "
                       f"{_mb(r.saved)} MB autograd saves for backward" for r in rs.values())
    peak = each(f"{r.run} {r.peak / r.predicted_states:.2f}x the model states (during the "
                f"{r.peak_phase})" for r in rs.values())
    compare = (f"pure bf16 holds {bf16.after_step / fp32.after_step:.2f}x the bytes of fp32 after "
               f"the step; autocast holds {amp.after_step / fp32.after_step:.2f}x (its states are "
               f"fp32 AdamW's) while its forward pass saves {amp.saved / fp32.saved:.2f}x as many "
               "bytes")
    worst = max(abs(r.unexplained) for r in rs.values())
    exactness = "to the byte" if worst == 0 else f"to within {worst:,} bytes"
    return {"states": states, "forward": forward, "peak": peak, "compare": compare,
            "exactness": exactness}


def check_laws(rows: list[dict[str, Any]]) -> None:
    """The laws every run obeys, else AssertionError naming the run: predicted states <= the
    allocator after the step <= the peak; on a CPU (its allocator reports the bytes requested)
    nothing is unexplained, and the forward grows by what it saves, within `SCALARS_BYTES`."""
    cpu = kit.setup(rows)["device_type"] == "cpu"
    for r in readings(rows):
        if not r.predicted_states <= r.after_step <= r.peak:
            raise AssertionError(f"{r.run}: predicted states {r.predicted_states:,} B, after the "
                                 f"step {r.after_step:,} B, peak {r.peak:,} B: not in that order")
        if cpu and not (r.unexplained == 0 and 0 <= r.forward_growth - r.saved <= SCALARS_BYTES):
            raise AssertionError(f"{r.run}: {r.unexplained:,} B unexplained, forward growth "
                                 f"{r.forward_growth:,} B against {r.saved:,} B saved")


def page_numbers(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a page says of a run, by name: its preset, batch, seq, parameters (every run trains
    the same model), device and method of reading the allocator, and the `verdicts`."""
    s, first = kit.setup(rows), next(iter(runs(rows).values()))
    return {**{k: s[k] for k in ("preset", "batch", "seq", "device", "method")},
            "params": first["n_params"], **verdicts(rows)}


def plot(rows: list[dict[str, Any]], ax, *, title: str) -> None:
    """Live bytes at the end of every phase (lines) and the peak during it (markers), per run, with
    each run's predicted model states dashed."""
    from mlsys import plotting  # matplotlib: only when a page draws

    for color, (label, r) in zip(plotting.CYCLE, runs(rows).items(), strict=False):
        ph = phases(rows, label)
        xs = range(len(ph))
        ax.plot(xs, [p["live_bytes"] / 1e6 for p in ph], "-", color=color, label=f"{label}: live")
        ax.plot(xs, [p["peak_bytes"] / 1e6 for p in ph], "^", color=color, ms=6, mfc="none",
                label=f"{label}: peak during the phase")
        ax.axhline(memory.model_state_bytes(r["n_params"], r["recipe"]) / 1e6, color=color, ls="--",
                   lw=1, label=f"{label}: model states predicted ({r['recipe']})")
    ph = phases(rows, next(iter(runs(rows))))
    labels = [f"{p['step']}: {p['phase']}" if p["step"] else p["phase"] for p in ph]
    ax.set_xticks(range(len(ph)), labels, rotation=35, ha="right", fontsize=8)
    plotting.finish(ax, title=title, ylabel="allocated (MB)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


EXPERIMENT = Experiment(
    name="training_memory",
    chapter="02_tensors_memory",
    description="allocator live/peak bytes per training phase, three recipes, vs accounting",
    gpu_seconds=20,
    sizes=SIZES,
    run=run,
)
