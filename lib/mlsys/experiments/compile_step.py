"""`torch.compile` of the whole model: what it costs, what it buys, and when it compiles again.

The model is compiled once (`torch.compile(model)`: TorchDynamo captures the forward, AOTAutograd
derives the backward, Inductor generates fused kernels; the optimizer step stays eager) and timed
against the eager model in three modes: forward, forward + backward, and the full AdamW step, each
interleaved with its eager twin. The first calls of the compiled model are timed one by one: they
contain the compilation. Then the sequence length changes, twice: the first new shape recompiles
the graph (and marks the dimension dynamic), the second runs on that dynamic graph; the number of
compiled graphs is read from TorchDynamo's counters. The lesson of the seed's table: a mean that
includes compilation, or that hides a spread as large as the difference, is not a speed-up.
Used in: §sec-benchmarking.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.book import Table, compare_speed, num, verdict
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.training import next_token_loss

MODES = ("forward", "forward+backward", "step")


@dataclass(frozen=True)
class Sizes:
    model: TransformerConfig
    batch: int
    seqs: tuple[int, int, int]  # the compiled shape, then two new lengths
    first_calls: int
    warmup: int
    repeats: int
    compile: bool  # False: only the eager model (a cold compile costs tens of seconds on a CPU)


SIZES = {
    "smoke": Sizes(TransformerConfig.preset("debug"), 2, (64, 96, 128), 3, 1, 5, False),
    "cpu": Sizes(TransformerConfig.preset("debug"), 4, (128, 96, 64), 3, 2, 9, True),
    "gpu": Sizes(TransformerConfig.preset("small"), 8, (512, 384, 256), 3, 3, 20, True),
}


def _graphs() -> int:
    """Graphs TorchDynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters  # heavy (seconds): only once a compile has run

    return int(counters["stats"]["unique_graphs"])


def _modes(model, optimizer, tokens: torch.Tensor) -> dict[str, Any]:
    def forward() -> None:
        model(tokens[:, :-1])

    def forward_backward() -> None:
        next_token_loss(model, tokens).backward()
        model.zero_grad(set_to_none=True)

    def step() -> None:
        next_token_loss(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {"forward": forward, "forward+backward": forward_backward, "step": step}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    model = Transformer(s.model).to(device)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(s.model.vocab_size, (s.batch, s.seqs[0] + 1), generator=gen).to(device)
    eager = _modes(model, optimizer, tokens)
    rows: list[dict[str, Any]] = []
    if not s.compile:
        timings = bench.benchmark_interleaved(eager, warmup=s.warmup, repeats=s.repeats,
                                              device=device)
        rows += [{"kind": "mode", "mode": m, "eager": timing_fields(timings[m]), "compiled": None}
                 for m in MODES]
        return rows + [{"kind": "setup", "compiled": False, "seq": s.seqs[0]}]
    compiled_model = kit.compile_fresh(model)
    compiled = _modes(compiled_model, optimizer, tokens)
    for mode in MODES:
        first = [bench.benchmark(compiled[mode], warmup=0, repeats=1, device=device).median_s
                 for _ in range(s.first_calls)]
        timings = bench.benchmark_interleaved({"eager": eager[mode], "compiled": compiled[mode]},
                                              warmup=s.warmup, repeats=s.repeats, device=device)
        rows.append({"kind": "mode", "mode": mode, "first_s": first,
                     "eager": timing_fields(timings["eager"]),
                     "compiled": timing_fields(timings["compiled"]),
                     "problems": bench.noise_problems(timings)})
    for seq in s.seqs:  # new shapes: does it compile again?
        before = _graphs()
        batch = torch.randint(s.model.vocab_size, (s.batch, seq + 1), generator=gen).to(device)
        other = batch[:, :-1]  # the inputs as a training step slices them (same strides)
        first = bench.benchmark(lambda other=other: compiled_model(other), warmup=0, repeats=1,
                                device=device).median_s
        rows.append({"kind": "shape", "seq": seq, "first_s": first,
                     "new_graphs": _graphs() - before})
    return rows + [{"kind": "setup", "compiled": True, "seq": s.seqs[0]}]


# --- reading the rows (live or recorded) ----------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in (r for r in rows if r["kind"] == "mode"):
        e = timing_of(r["eager"])
        cells = [r["mode"],
                 f"{num(e.median_s * 1e3)} ({num(e.p20_s * 1e3)}–{num(e.p80_s * 1e3)})"]
        if r["compiled"] is None:
            cells += ["not compiled in this profile", "-", "-"]
        else:
            c = timing_of(r["compiled"])
            cells += [f"{num(c.median_s * 1e3)} ({num(c.p20_s * 1e3)}–{num(c.p80_s * 1e3)})",
                      f"{num(r['first_s'][0])} s", f"{e.median_s / c.median_s:.2f}"]
        out.append(cells)
    return Table(["mode", "eager ms (p20–p80)", "compiled ms (p20–p80)", "first compiled call",
                  "eager / compiled"], out)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Speed-up per mode (withheld when the spreads overlap), compile cost and recompilations."""
    modes = [r for r in rows if r["kind"] == "mode"]
    if modes[0]["compiled"] is None:
        return {"speed": "torch.compile did not run in this profile (a cold compile costs tens of "
                         "seconds on a CPU); the eager times are in the table",
                "shapes": "no recompilation test without a compiled model"}
    parts = []
    for r in modes:
        e, c = timing_of(r["eager"]), timing_of(r["compiled"])
        overlap = c.p20_s <= e.p80_s and e.p20_s <= c.p80_s
        text = compare_speed(f"compiled {r['mode']}", c.median_s, "eager", e.median_s)
        if overlap:
            text += " (the p20–p80 ranges overlap: not a speed-up to report)"
        mean_with_first = statistics.fmean([*r["first_s"], *c.samples_s])
        text += (f"; its first call took {num(r['first_s'][0])} s, and a mean that includes it "
                 f"would read {num(mean_with_first * 1e3)} ms")
        parts.append(f"{r['mode']}: {verdict(text, r['problems'])}")
    shapes = [r for r in rows if r["kind"] == "shape"]
    shape_text = "; ".join(f"seq {r['seq']}: {r['new_graphs']} new graph(s), first call "
                           f"{num(r['first_s'] * 1e3)} ms" for r in shapes)
    return {"speed": "; ".join(parts), "shapes": shape_text}


EXPERIMENT = Experiment(
    name="compile_step",
    chapter="05_benchmarking",
    description="torch.compile of the model: fwd, fwd+bwd, step vs eager; compile time, recompiles",
    gpu_seconds=180,
    sizes=SIZES,
    run=run,
)
