"""Where a training step's time goes, by phase and by class of operation, against its FLOPs.

One model trains a few warm-up steps, then `steps` steps run inside
`mlsys.profiling.profiler.Profile`, each split into the phases "forward", "backward" and "optimizer"
(AdamW's step and zero_grad). The rows keep every op (CPU) or kernel (GPU) by phase and class, the
wall and op time of each phase, and the model's FLOPs by the same classes (`flops_by_class`,
forward and training), so a page sets time share beside FLOP share: Ivanov et al. ("Data Movement
Is All You Need", MLSys 2021) measured the statistical normalizations (softmax, layer norm) of a
BERT layer at 0.17% of its FLOPs and 25.5% of its runtime, which He ("Making Deep Learning Go
Brrrr", 2022) quotes.
The rows also keep the first `TRACE_OPS` host ops of the first profiled forward as a trace
(`diagrams.trace.Trace`: the host's calls against the device's kernels, or on a CPU the ops' own
bodies), which `trace` reads back for `diagrams.trace.draw_trace`.

Two more measurements, each timed round-robin (`bench.benchmark_interleaved`):
- the profiler's own cost: the same training step with and without the profiler running
  (`overhead.profiler_overhead`);
- the core of written-out attention at the model's shapes, op by op: scores q k^T, the masked
  softmax, and P v. Each matmul does 2 d_head FLOPs per score and the softmax about 5, so the FLOP
  ratio of one matmul to the softmax is 2 d_head / 5 (25.6 at d_head = 64), and of both matmuls
  0.8 d_head; the seed's "64x" divides d_model by n_heads and calls that the ratio.
The verdicts are computed from the rows: the attention core's is given despite noise when the
FLOP gap is far larger than the worst the noise can do (`GAP`); the profiler's cost is stated only
as the measured ratio bears it out (`TIE`); `launch_text` reads the ops each phase issued against
its wall time; `phase_shares` splits the class shares by phase (a forward-only question needs the
forward's).
Longer than 300 lines as one module: the profile, its trace, the profiler's cost and the attention
core come from one model in one run, and one section of the page reads them together.
Used in: §sec-profiling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from mlsys import bench, env
from mlsys.accounting import flops, flops_by_class
from mlsys.book import Table, num, verdict
from mlsys.diagrams.trace import Trace
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.experiments.kit import setup
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import profiler
from mlsys.profiling.overhead import profiler_overhead
from mlsys.training import make_train_step, next_token_loss

PHASES = ("forward", "backward", "optimizer")
TRACE_OPS = 40  # host ops of the first forward kept as a trace (`diagrams.trace`)
CORE = ("scores", "softmax", "values")  # q @ k^T, masked softmax, P @ v
SOFTMAX_OPS_PER_SCORE = flops.SOFTMAX_OPS_PER_ELEMENT
GAP = 0.5
"""The softmax's FLOP/s over the matmul's, at the noise's worst, below which the attention verdict
stands however noisy the timings: each timing moved by its own p80 / p20 or drift."""
TIE = 1.1
"""A profiled / plain step ratio within [1 / TIE, TIE] says the profiler's cost is lost in the
noise."""
SEED_FORWARD_SHARES = {"ampere_sgemm_128x64_tn": 0.43, "ampere_sgemm_32x128_tn": 0.43}
SEED_COMBINED_SHARES = {  # the non-matmul kernels of the seed's forward+backward list
    "direct_copy_kernel": 0.036, "vectorized MulFunctor": 0.024, "elementwise MulFunctor": 0.013,
    "CUDAFunctor_add": 0.013}
SEED_COMBINED_GEMMS = (0.140, 0.136, 0.135, 0.131, 0.100, 0.068, 0.064, 0.064, 0.012, 0.011)
"""The seed's nsys answers (document 003, 'nsys_profile' (b), (c)): the forward-only list names two
GEMM kernels at 43% each; the answer to (c), a forward-only question, quotes the shares of a
forward+backward list."""


@dataclass(frozen=True)
class Sizes:
    preset: str  # the model (`TransformerConfig.preset`)
    batch: int
    seq: int
    steps: int  # profiled training steps
    warmup: int  # training steps before the profile
    repeats: int  # samples per callable for the overhead and the attention-core timings


SIZES = {
    "smoke": Sizes("debug", 2, 64, 1, 1, 3),
    "cpu": Sizes("laptop", 4, 128, 2, 2, 5),
    "gpu": Sizes("small", 4, 512, 3, 3, 20),
}


def _profile_steps(model, optimizer, tokens, s: Sizes, device: str) -> profiler.Profile:
    with profiler.Profile(device=device, model=model) as prof:
        for _ in range(s.steps):
            with prof.phase("forward"):
                loss = next_token_loss(model, tokens)
            with prof.phase("backward"):
                loss.backward()
            with prof.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return prof


def _attention_core(cfg: TransformerConfig, s: Sizes, device: str) -> dict[str, bench.Timing]:
    """The three steps of written-out causal attention at the model's shapes, timed apart."""
    gen = torch.Generator().manual_seed(1)
    shape = (s.batch, cfg.n_heads, s.seq, cfg.d_head)
    q, k, v = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
    future = torch.ones(s.seq, s.seq, dtype=torch.bool, device=device).triu(diagonal=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(cfg.d_head)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    fns = {"scores": lambda: q @ k.transpose(-2, -1),
           "softmax": lambda: scores.masked_fill(future, float("-inf")).softmax(dim=-1),
           "values": lambda: probs @ v}
    return bench.benchmark_interleaved(fns, warmup=2, repeats=s.repeats, device=device)


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Profile `s.steps` steps after `s.warmup`; then the profiler's overhead; then the attention
    core. Rows: setup, phase, op, class, flops, overhead, core."""
    device = device or env.device()
    cfg = TransformerConfig.preset(s.preset)
    if s.seq > cfg.context_length:
        raise ValueError(f"seq ({s.seq}) exceeds the {s.preset} context_length "
                         f"({cfg.context_length})")
    model = Transformer(cfg).to(device)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
    step = make_train_step(model, optimizer, tokens)
    for _ in range(s.warmup):
        step()
    prof = _profile_steps(model, optimizer, tokens, s, device)
    rows: list[dict[str, Any]] = [{
        "kind": "setup", "device": env.device_name(), "device_type": device, "preset": s.preset,
        "batch": s.batch, "seq": s.seq, "steps": s.steps, "d_head": cfg.d_head,
        "n_heads": cfg.n_heads, "attention": cfg.attention}]
    rows += [{"kind": "phase", **asdict(p)} for p in prof.phases()]
    rows += [{"kind": "op", **asdict(o)} for o in prof.ops()]
    rows += [{"kind": "class", **asdict(c)} for c in prof.classes()]
    where = "GPU" if device == "cuda" else "CPU"
    first = Trace.from_profile(prof, phase="forward", first_ops=TRACE_OPS,
                               source=f"torch.profiler, {where}, forward of `{s.preset}`")
    rows.append({"kind": "trace", **first.to_record()})
    for training in (False, True):
        rows.append({"kind": "flops", "training": training,
                     "by_class": flops_by_class.class_flops(cfg, s.batch, s.seq,
                                                            training=training)})
    overhead = profiler_overhead(step, device=device, model=model, warmup=1, repeats=s.repeats)
    rows.append({"kind": "overhead", "plain": timing_fields(overhead.plain),
                 "profiled": timing_fields(overhead.profiled)})
    core = _attention_core(cfg, s, device)
    rows.append({"kind": "core", "problems": bench.noise_problems(core),
                 **{name: timing_fields(t) for name, t in core.items()}})
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def _of(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "kind"} for r in rows if r["kind"] == kind]


def trace(rows: list[dict[str, Any]]) -> Trace | None:
    """The first forward's first `TRACE_OPS` host ops and their device spans (None in a record
    made before traces were kept)."""
    found = _of(rows, "trace")
    return Trace.from_record(found[0]) if found else None


def trace_sentence(rows: list[dict[str, Any]]) -> str:
    """What the trace shows, computed from it: the window, the busy and idle shares, the
    longest gap, and which side sets the pace."""
    t = trace(rows)
    if t is None:
        return "this record keeps no trace"
    start, end = t.window
    idle, gaps = t.idle_fraction(), t.gaps()
    longest = max(b - a for a, b in gaps) if gaps else 0.0
    lane = "the device" if t.device_label == "kernels" else "the ops' own kernels"
    pace = ("the host's calls, not the arithmetic, set the pace" if idle > 0.5 else
            "the kernels fill most of the window: the arithmetic sets the pace")
    return (f"over {num((end - start) / 1e3)} ms and {len(t.host)} ops, {lane} ran "
            f"{1 - idle:.0%} of the time and waited {idle:.0%} (the longest gap "
            f"{num(longest)} µs): {pace}")


def classes(rows: list[dict[str, Any]]) -> list[profiler.ClassShare]:
    return [profiler.ClassShare(**r) for r in _of(rows, "class")]


def ops(rows: list[dict[str, Any]]) -> list[profiler.OpRow]:
    return [profiler.OpRow(**r) for r in _of(rows, "op")]


def class_flops(rows: list[dict[str, Any]], *, training: bool = True) -> dict[str, int]:
    return next(r["by_class"] for r in _of(rows, "flops") if r["training"] == training)


def share(rows: list[dict[str, Any]], op_class: str, phase: str = "all") -> float:
    """The time share of `op_class` in `phase` ("all": the whole profile)."""
    return next(c.share for c in classes(rows) if c.phase == phase and c.op_class == op_class)


def class_table(rows: list[dict[str, Any]]) -> Table:
    """Time share of every class per phase, beside its share of the training FLOPs."""
    return profiler.class_table(classes(rows), class_flops(rows, training=True))


def op_table(rows: list[dict[str, Any]], *, top: int = 10, exclude: tuple[str, ...] = ()) -> Table:
    """The `top` slowest ops (kernels on a GPU) of the profile, leaving out classes `exclude`."""
    kept = [o for o in ops(rows) if o.op_class not in exclude]
    return profiler.op_table(kept, top=top, kernels=setup(rows)["device_type"] == "cuda")


def phase_table(rows: list[dict[str, Any]]) -> Table:
    """Per phase: wall time, time inside ops (kernels), and the rest, per step (ms)."""
    steps = setup(rows)["steps"]
    body = []
    for p in (profiler.PhaseTime(**r) for r in _of(rows, "phase")):
        if p.phase == profiler.NO_PHASE:
            continue
        body.append([p.phase, num(p.wall_s / steps * 1e3), num(p.op_s / steps * 1e3),
                     f"{p.outside_ops_s / p.wall_s:.0%}"])
    ops_name = "kernels" if setup(rows)["device_type"] == "cuda" else "ops"
    return Table(["phase", "wall (ms/step)", f"in {ops_name} (ms/step)", f"outside {ops_name}"],
                 body)


def core_flops(rows: list[dict[str, Any]]) -> dict[str, int]:
    """FLOPs of the three attention-core steps at the profiled shapes."""
    st = setup(rows)
    scores = st["batch"] * st["n_heads"] * st["seq"] ** 2
    return {"scores": 2 * scores * st["d_head"], "softmax": SOFTMAX_OPS_PER_SCORE * scores,
            "values": 2 * scores * st["d_head"]}


def core_table(rows: list[dict[str, Any]]) -> Table:
    """The attention core op by op: time, FLOPs, rate, and both as multiples of the softmax's."""
    core = kit.first(rows, "core")
    fl = core_flops(rows)
    soft_t, soft_f = core["softmax"]["median_s"], fl["softmax"]
    body = [[name, num(core[name]["median_s"] * 1e6),
             f"{num(core[name]['p20_s'] * 1e6)}–{num(core[name]['p80_s'] * 1e6)}",
             num(fl[name] / 1e6), num(fl[name] / core[name]["median_s"] / 1e9),
             f"{core[name]['median_s'] / soft_t:.2f}", f"{fl[name] / soft_f:.1f}"]
            for name in CORE]
    return Table(["step", "median (µs)", "p20–p80 (µs)", "MFLOP", "GFLOP/s",
                  "time / softmax's", "FLOPs / softmax's"], body)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the rows: matmul share by phase, normalization time vs FLOPs (He),
    the attention core against its FLOP ratio, and the profiler's overhead."""
    fl = profiler.shares(class_flops(rows, training=True))
    phases = [p for p in PHASES if any(c.phase == p for c in classes(rows))]
    matmul_s = {c.phase: c.self_s for c in classes(rows) if c.op_class == "matmul"}
    backward = matmul_s.get("backward", 0.0) / matmul_s["all"] if matmul_s["all"] else 0.0
    matmul = ("matmuls take " + ", ".join(f"{share(rows, 'matmul', p):.0%} of the {p}'s"
                                          for p in phases)
              + f" op time and {share(rows, 'matmul'):.0%} of the whole step's, for "
              f"{fl['matmul']:.1%} of its FLOPs; the backward holds {backward:.0%} of the matmul "
              "time, where the FLOP count puts two thirds")
    norm_t, norm_f = share(rows, "normalization"), fl["normalization"]
    norm = (f"normalization takes {norm_t:.1%} of the op time for {norm_f:.2%} of the FLOPs: "
            f"{norm_t / norm_f:.0f}x its FLOP share" if norm_f else
            f"normalization takes {norm_t:.1%} of the op time")
    core = kit.first(rows, "core")
    fl_core = core_flops(rows)
    t_ratio = core["scores"]["median_s"] / core["softmax"]["median_s"]
    f_ratio = fl_core["scores"] / fl_core["softmax"]
    softmax_rate = fl_core["softmax"] / core["softmax"]["median_s"]
    matmul_rate = fl_core["scores"] / core["scores"]["median_s"]
    relation = "longer than" if t_ratio > 1 else "shorter than"
    attention = (f"q k^T does {f_ratio:.1f}x the softmax's FLOPs (2 d_head / 5 with d_head = "
                 f"{setup(rows)['d_head']}) yet takes {t_ratio:.2f}x its time ({relation} it): "
                 f"the softmax runs at {softmax_rate / matmul_rate:.1%} of the matmul's FLOP/s")
    timings = {k: timing_of(core[k]) for k in CORE}
    oh = kit.first(rows, "overhead")
    worst = (softmax_rate / matmul_rate * _moved(timings["softmax"]) * _moved(timings["scores"]))
    if worst < GAP:
        attention += (", so FLOPs do not predict its time: it reads and writes the whole score "
                      "matrix for a handful of FLOPs per element")
    core_problems = bench.noise_problems(timings)
    if core_problems and worst < GAP:  # the gap dwarfs what the noise can do
        attention += (f" (the timings are noisy, but at their worst the softmax would still run "
                      f"at {worst:.0%} of the matmul's FLOP/s)")
        core_problems = []
    overhead_problems = bench.noise_problems({"plain step": timing_of(oh["plain"]),
                                              "profiled step": timing_of(oh["profiled"])})
    return {"matmul": matmul, "normalization": norm,
            "attention": verdict(attention, core_problems),
            "overhead": verdict(overhead_text(rows), overhead_problems),
            "launch": launch_text(rows)}


def _moved(t: bench.Timing) -> float:
    """How far noise can have moved a median: its p80 / p20 or its drift, whichever is larger."""
    return max(t.spread_ratio, 1 + t.drift)


def overhead_text(rows: list[dict[str, Any]]) -> str:
    """The profiled step against the plain one, and what that says of the profiler's cost."""
    oh = kit.first(rows, "overhead")
    profiled, plain = oh["profiled"]["median_s"], oh["plain"]["median_s"]
    text = (f"the profiled step took {profiled / plain:.2f}x the plain one ({num(profiled * 1e3)} "
            f"vs {num(plain * 1e3)} ms)")
    if profiled / plain > TIE:
        return text + (": the profiler costs time of its own, so its tables are for shares, plain "
                       "timing for durations")
    if profiled / plain >= 1 / TIE:
        return text + (f", within {TIE - 1:.0%}: on this run the profiler's cost is lost in the "
                       "variation between steps")
    return text + (": faster, which a profiler cannot make a step, so on this run the variation "
                   "between steps is larger than the profiler's cost")


def phase_ops(rows: list[dict[str, Any]], phase: str) -> int:
    """Ops (kernels on a GPU) `phase` issued per step."""
    return sum(c.calls for c in classes(rows) if c.phase == phase) // setup(rows)["steps"]


def launch_text(rows: list[dict[str, Any]]) -> str:
    """The backward's ops and wall time against the forward's, and whether time followed the ops."""
    wall = {p.phase: p.wall_s for p in (profiler.PhaseTime(**r) for r in _of(rows, "phase"))}
    outside = {p.phase: p.outside_ops_s / p.wall_s
               for p in (profiler.PhaseTime(**r) for r in _of(rows, "phase"))}
    n_f, n_b = phase_ops(rows, "forward"), phase_ops(rows, "backward")
    t_ratio, n_ratio = wall["backward"] / wall["forward"], n_b / n_f
    what = "kernels" if setup(rows)["device_type"] == "cuda" else "ops"
    text = (f"the backward issued {n_ratio:.2f}x the forward's {what} ({n_b:,} against {n_f:,} "
            f"a step) and took {t_ratio:.2f}x its wall time, {num(wall['backward'] / n_b * 1e6)} "
            f"µs per {what[:-1]} against {num(wall['forward'] / n_f * 1e6)} µs in the forward")
    if outside["forward"] > 0.5:
        return text + (f"; the forward spent {outside['forward']:.0%} of its time outside "
                       f"{what}: launch-bound, so its time follows how many {what} it issues "
                       "and what each costs the host, not its FLOPs")
    return text + (f"; the forward spent {outside['forward']:.0%} of its time outside {what}: "
                   "not launch-bound, so time follows the work")


def phase_shares(rows: list[dict[str, Any]], phases: tuple[str, ...]) -> dict[str, float]:
    """Each class's share of the op (kernel) time of `phases` together."""
    spent = {c.op_class: 0.0 for c in classes(rows)}
    for c in classes(rows):
        if c.phase in phases:
            spent[c.op_class] += c.self_s
    total = sum(spent.values())
    return {k: v / total for k, v in spent.items()}


def plot(rows: list[dict[str, Any]], ax) -> None:
    """Time share per class in each phase and the whole step, with the FLOP share beside."""
    from mlsys.plotting import CYCLE, finish  # matplotlib: only when a page draws

    flop = profiler.shares(class_flops(rows, training=True))
    shown = [c for c in profiler.CLASSES if share(rows, c) > 0.005 or flop.get(c, 0) > 0.005]
    bars = [p for p in PHASES if any(c.phase == p for c in classes(rows))] + ["all"]
    width = 0.8 / (len(bars) + 1)
    for i, phase in enumerate(bars):
        ax.bar([x + i * width for x in range(len(shown))],
               [100 * share(rows, c, phase) for c in shown], width, color=CYCLE[i],
               label=f"time: {'whole step' if phase == 'all' else phase}")
    ax.bar([x + len(bars) * width for x in range(len(shown))],
           [100 * flop.get(c, 0.0) for c in shown], width, color="none", edgecolor="black",
           hatch="//", label="FLOPs: training step")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shown))], shown, rotation=20)
    finish(ax, title="time share and FLOP share by class", ylabel="% of the phase")
    ax.legend(fontsize=7)


def table(rows: list[dict[str, Any]]) -> Table:
    """The summary `python -m mlsys.experiments` prints: `class_table`."""
    return class_table(rows)

EXPERIMENT = Experiment(
    name="step_profile",
    chapter="05_benchmarking",
    description="profiler tables of a training step by phase and class; attention core; overhead",
    gpu_seconds=40,
    sizes=SIZES,
    run=run,
)
