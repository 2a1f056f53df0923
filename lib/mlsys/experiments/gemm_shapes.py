"""The step model's GEMM times against measured GEMMs: a real model's block, and a wave sweep.

`accounting.step_model` prices every GEMM from its shape: T = ceil(M / b_m) ceil(N / b_n) tiles
of `hardware.GEMM_TILES` run in ceil(T / S) waves on the S SMs at `gemm_fraction` of the dense
peak, or at the HBM roof if that is longer. Its constants were fitted on Megatron-LM's Table 1
only, so this is the model's first check against a measurement of single GEMMs. Timed, in the
sizes' dtype (bf16 on a GPU):
- the forward GEMMs of one block and the output head of named models (`models.catalog`: Llama 3
  8B, Megatron-LM's 1.7B GPT) on one rank of TP 1 and TP 8, micro-batch x seq tokens, exactly as
  `step_model` lists them (fused q/k/v, fused gate and up projection; `model_gemms`);
- M x N x N GEMMs with M every `sweep_step` rows: each wave boundary of the model (a tile more
  than the SMs hold) should show as a drop in TFLOP/s, a saw-tooth.
All GEMMs are timed round-robin (`bench.measure_consistently`), each sample at least
`bench.MIN_SAMPLE_S` of back-to-back calls (no launch gaps: the model leaves them out; operands
may sit in L2 between calls, which a compute-bound GEMM does not feel). The prediction is the
step model's for `hardware.detect()`'s GPU; on a CPU or an unknown GPU a row says why it has
none and no verdict is drawn. A run faster than the dense peak, or too noisy, withholds it too.
Used in: chapter 09 (the planner against published runs).

A little over 300 lines: the shapes, their timing and the readings of their rows (table, verdict,
plot) are one experiment, as in every module of this package.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env, hardware
from mlsys.accounting import step_model
from mlsys.book import Table, num, verdict
from mlsys.dtypes import bytes_per_element, torch_dtype
from mlsys.experiments import Experiment, kit, timing_fields
from mlsys.models import catalog
from mlsys.models.config import PRESETS, TransformerConfig

TOLERANCE = 0.15
"""A GEMM is "within" the model when |measured / predicted - 1| <= this."""
SYSTEMATIC_SHARE = 0.75
"""The model is "systematically" off when the geometric mean ratio is outside the tolerance and at
least this share of the block GEMMs miss on the same side."""
MIN_DROP = 0.05
"""A drop in TFLOP/s across a wave boundary counts when it is at least this large and the two
timings' p20-p80 ranges do not overlap."""


@dataclass(frozen=True)
class Sizes:
    models: tuple[tuple[str, int, int], ...]  # (named model or preset, micro_batch, seq)
    tps: tuple[int, ...]  # tensor-parallel degrees: one rank's shard of each GEMM
    sweep_nk: int  # N = K of the wave sweep
    sweep_step: int  # its M: step, 2 step, ..., count x step
    sweep_count: int
    dtype: str
    warmup: int
    repeats: int
    attempts: int


SIZES = {
    "smoke": Sizes((("debug", 2, 32),), (1, 2), 64, 16, 8, "fp32", 1, 5, 2),
    "cpu": Sizes((("laptop", 4, 256), ("small", 1, 256)), (1, 4), 512, 64, 16, "fp32", 2, 9, 3),
    "gpu": Sizes((("llama3-8b", 1, 8_192), ("megatron-1.7b", 16, 2_048)), (1, 8), 4_096, 128, 40,
                 "bf16", 5, 25, 3),
}


def config(name: str) -> TransformerConfig:
    """A named model of `models.catalog`, or one of the book's presets."""
    checks.choice(name, "model", (*catalog.NAMED_MODELS, *PRESETS))
    if name in catalog.NAMED_MODELS:
        return catalog.named_config(name)
    return TransformerConfig.preset(name)


def model_gemms(cfg, *, tp: int, micro_batch: int, seq: int,
                dtype: str = "bf16") -> list[step_model.Gemm]:
    """The forward GEMMs of one block of `cfg` on one of `tp` ranks for micro_batch x seq tokens
    (no context parallelism), then its output head's, as `step_model.step_time` prices them
    (`step_model.forward_gemms`): M = tokens, N and K of the rank's shard."""
    return step_model.forward_gemms(cfg, micro_batch=micro_batch, seq=seq, tp=tp, dtype=dtype)


def sweep_gemms(s: Sizes) -> list[step_model.Gemm]:
    """The wave sweep: M x nk x nk for M = step, 2 step, ..., count x step."""
    e = float(bytes_per_element(s.dtype))
    return [step_model.Gemm("sweep", s.sweep_step * i, s.sweep_nk, s.sweep_nk, 1, e, e, e)
            for i in range(1, s.sweep_count + 1)]


def predictor(dtype: str, device: str) -> tuple[hardware.Accelerator | None, str]:
    """The GPU the step model prices this run on, or None and why there is no prediction."""
    if device != "cuda":
        return None, ("the step model prices a GEMM from a GPU's SMs and tiles, and this run "
                      f"is on {env.device_name() if device == env.device() else device}")
    acc = hardware.detect()
    if acc is None:
        return None, hardware.match_report(torch.cuda.get_device_name())
    if acc.sm_count is None or dtype not in acc.dense_flop_per_s:
        return None, f"the {acc.name} has no SM count or no {dtype} peak in mlsys.hardware"
    return acc, ""


def predict(g: step_model.Gemm, acc: hardware.Accelerator, dtype: str) -> dict[str, Any]:
    """The step model's time of `g` on `acc` (`step_model.gemm_time_s`, `STEP_CONSTANTS`), and
    the waves and tiles of its best tile shape."""
    c, sms = hardware.STEP_CONSTANTS, acc.sm_count
    tiles = {t: g.batch * step_model.tile_count(g.m, g.n, t) for t in hardware.GEMM_TILES}
    best = min(tiles, key=lambda t: math.ceil(tiles[t] / sms) * t[0] * t[1])
    return {"predicted_s": step_model.gemm_time_s(g, acc, acc.peak_flop_per_s(dtype), c),
            "waves": math.ceil(tiles[best] / sms), "tiles": tiles[best]}


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Time every GEMM round-robin until consistent; each row with the model's prediction."""
    device = device or env.device()
    acc, reason = predictor(s.dtype, device)
    entries = [({"group": "model", "model": name, "tp": tp, "tokens": mb * seq}, g)
               for name, mb, seq in s.models for tp in s.tps
               for g in model_gemms(config(name), tp=tp, micro_batch=mb, seq=seq,
                                    dtype=s.dtype)]
    entries += [({"group": "sweep", "model": "", "tp": 1, "tokens": g.m}, g)
                for g in sweep_gemms(s)]
    gen = torch.Generator(device=device).manual_seed(0)
    made: dict[tuple[int, ...], torch.Tensor] = {}

    def tensor(*shape: int) -> torch.Tensor:  # inputs of one shape are shared (same values)
        if shape not in made:
            made[shape] = torch.randn(shape, generator=gen, device=device,
                                      dtype=torch_dtype(s.dtype))
        return made[shape]

    fns = {}
    for fields, g in entries:
        a, b = tensor(g.batch, g.m, g.k), tensor(g.batch, g.k, g.n)
        key = _key(fields, g)
        fns[key] = (lambda a=a[0], b=b[0]: a @ b) if g.batch == 1 else (
            lambda a=a, b=b: torch.bmm(a, b))

    def check(timings: dict[str, bench.Timing]) -> list[str]:
        problems = bench.noise_problems(timings)
        for fields, g in entries if acc is not None else ():
            rate = g.flops / timings[_key(fields, g)].median_s
            if rate > acc.peak_flop_per_s(s.dtype):
                problems.append(f"{_key(fields, g)}: {rate / 1e12:,.0f} TFLOP/s, above the "
                                f"{acc.name}'s dense {s.dtype} peak")
        return problems

    timings, consistency = bench.measure_consistently(
        fns, check, attempts=s.attempts, warmup=s.warmup, repeats=s.repeats, device=device,
        min_sample_s=bench.MIN_SAMPLE_S)
    c = hardware.STEP_CONSTANTS
    rows: list[dict[str, Any]] = [{
        "kind": "setup", "device": env.device_name(), "dtype": s.dtype,
        "accelerator": acc.name if acc else None, "sm_count": acc.sm_count if acc else None,
        "peak_flop_per_s": acc.peak_flop_per_s(s.dtype) if acc else None,
        "gemm_fraction": c.gemm_fraction, "hbm_fraction": c.hbm_fraction,
        "gemm_tiles": [list(t) for t in hardware.GEMM_TILES], "no_prediction": reason}]
    for fields, g in entries:
        model = predict(g, acc, s.dtype) if acc else {"predicted_s": None, "waves": None,
                                                      "tiles": None}
        rows.append({"kind": "gemm", **fields, "name": g.name, "m": g.m, "n": g.n, "k": g.k,
                     "batch": g.batch, "flops": g.flops, **timing_fields(timings[_key(fields, g)]),
                     **model, "no_prediction": reason})
    rows.append({"kind": "consistency", "problems": list(consistency.problems),
                 "attempts": consistency.attempts})
    return rows


def _key(fields: dict[str, Any], g: step_model.Gemm) -> str:
    if fields["group"] == "sweep":
        return f"sweep M={g.m}"
    return f"{fields['model']} tp {fields['tp']}: {g.name}"


# --- reading the rows (live or recorded) ----------------------------------------------------------


def gemms(rows: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """The GEMM rows of `group` ("model" or "sweep"; the sweep by M)."""
    checks.choice(group, "group", ("model", "sweep"))
    out = [r for r in rows if r["kind"] == "gemm" and r["group"] == group]
    return sorted(out, key=lambda r: r["m"]) if group == "sweep" else out


def ratio(r: dict[str, Any]) -> float:
    """Measured / predicted time (above 1: the model is optimistic)."""
    return r["median_s"] / r["predicted_s"]


def tflops(r: dict[str, Any], seconds: float | None = None) -> float:
    return r["flops"] / (r["median_s"] if seconds is None else seconds) / 1e12


def table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in gemms(rows, "model") + gemms(rows, "sweep"):
        label = "sweep" if r["group"] == "sweep" else f"{r['model']} tp {r['tp']}: {r['name']}"
        shape = f"{r['m']:,} x {r['n']:,} x {r['k']:,}"
        known = r["predicted_s"] is not None
        out.append([label, shape if r["batch"] == 1 else f"{r['batch']} x {shape}",
                    num(r["flops"] / 1e9), num(r["median_s"] * 1e3),
                    f"{num(r['p20_s'] * 1e3)} – {num(r['p80_s'] * 1e3)}",
                    num(r["predicted_s"] * 1e3) if known else "no prediction",
                    f"{ratio(r):.2f}" if known else "-", num(tflops(r)),
                    r["waves"] if known else "-"])
    return Table(["GEMM", "M x N x K", "GFLOP", "measured ms", "p20 – p80 ms", "predicted ms",
                  "measured / predicted", "TFLOP/s", "waves (model)"], out)


def boundaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep's steps where the model's waves grow: M before and after, the measured and the
    predicted drop in TFLOP/s (1 - after / before), and whether the measured one is clear."""
    sweep, out = gemms(rows, "sweep"), []
    for a, b in zip(sweep, sweep[1:], strict=False):
        if a["waves"] is None or b["waves"] <= a["waves"]:
            continue
        drop = 1 - tflops(b) / tflops(a)
        apart = tflops(b, b["p20_s"]) < tflops(a, a["p80_s"])  # b's best below a's worst
        predicted = 1 - tflops(b, b["predicted_s"]) / tflops(a, a["predicted_s"])
        out.append({"m_before": a["m"], "m_after": b["m"], "waves": b["waves"],
                    "measured_drop": drop, "clear": drop >= MIN_DROP and apart,
                    "predicted_drop": predicted})
    return out


def accuracy_text(rows: list[dict[str, Any]]) -> str:
    """How the block GEMMs and the sweep compare with the model, from their ratios."""
    block = gemms(rows, "model")
    ratios = [ratio(r) for r in block]
    n, lo, hi = len(block), min(ratios), max(ratios)
    within = sum(abs(x - 1) <= TOLERANCE for x in ratios)
    mean = math.exp(statistics.fmean(math.log(x) for x in ratios))
    slow = sum(x > 1 + TOLERANCE for x in ratios)
    fast = sum(x < 1 - TOLERANCE for x in ratios)
    spread = f"measured / predicted {lo:.2f} to {hi:.2f}, geometric mean {mean:.2f}"
    if mean > 1 + TOLERANCE and slow >= SYSTEMATIC_SHARE * n:
        text = (f"the model is systematically {mean:.2f}x optimistic: the block GEMMs run slower "
                f"than predicted ({spread}; within {TOLERANCE:.0%} on {within} of {n})")
    elif mean < 1 - TOLERANCE and fast >= SYSTEMATIC_SHARE * n:
        text = (f"the model is systematically {1 / mean:.2f}x pessimistic: the block GEMMs run "
                f"faster than predicted ({spread}; within {TOLERANCE:.0%} on {within} of {n})")
    elif within == n:
        text = (f"the block GEMMs are within {TOLERANCE:.0%} of the model on all {n} shapes "
                f"({spread})")
    else:
        worst = max(block, key=lambda r: abs(math.log(ratio(r))))
        text = (f"the block GEMMs are within {TOLERANCE:.0%} of the model on {within} of {n} "
                f"shapes ({spread}); the worst, {worst['model']} tp {worst['tp']} "
                f"{worst['name']}, takes {ratio(worst):.2f}x its prediction")
    sweep = gemms(rows, "sweep")
    near = sum(abs(ratio(r) - 1) <= TOLERANCE for r in sweep)
    return text + f"; the sweep's shapes: {near} of {len(sweep)} within {TOLERANCE:.0%}"


def sawtooth_text(rows: list[dict[str, Any]]) -> str:
    """Whether the sweep's TFLOP/s drop where the model's waves grow, from the numbers."""
    found, sweep = boundaries(rows), gemms(rows, "sweep")
    if not found:
        return "the sweep crosses none of the model's wave boundaries on this device"
    drops = [(1 - tflops(b) / tflops(a), a["m"], b["m"]) for a, b in zip(sweep, sweep[1:],
                                                                          strict=False)]
    big = max(drops, key=lambda d: round(d[0], 4))  # a tie: the first
    largest = (f"the largest measured drop is {big[0]:.0%}, from M = {big[1]:,} to {big[2]:,}"
               if big[0] >= MIN_DROP else f"no step of the sweep drops by {MIN_DROP:.0%} or more")
    measured = statistics.median(b["measured_drop"] for b in found)
    predicted = statistics.median(b["predicted_drop"] for b in found)
    clear = sum(b["clear"] for b in found)
    at = ", ".join(f"{b['m_before']:,} to {b['m_after']:,}" for b in found)
    if 2 * clear >= len(found):
        return (f"the wave saw-tooth is visible: TFLOP/s drops by {measured:.0%} after a wave "
                f"boundary (median of {len(found)}, M = {at}; the model predicts {predicted:.0%}),"
                f" clearly at {clear} of {len(found)}; {largest}")
    change = round(-measured, 4) + 0.0  # no "-0%"
    return (f"no wave saw-tooth is visible where the model puts one (M = {at}): TFLOP/s changes "
            f"by {change:+.0%} there (median; the model predicts {-predicted:+.0%}), a clear "
            f"drop at {clear} of {len(found)}; {largest}")


def model_verdict(rows: list[dict[str, Any]]) -> str:
    """The accuracy and the saw-tooth in words; withheld without a prediction or when the run
    was not consistent (noisy, or faster than the dense peak)."""
    reason = kit.setup(rows)["no_prediction"]
    if reason:
        return f"no verdict: there is no prediction to check ({reason})"
    problems = kit.first(rows, "consistency")["problems"]
    return verdict(f"{accuracy_text(rows)}; {sawtooth_text(rows)}", problems)


def plot(rows: list[dict[str, Any]], ax, *, label: str = "") -> None:
    """The sweep's measured TFLOP/s (median, p20-p80) and the model's, against M; dotted lines
    at the model's wave boundaries."""
    from mlsys.plotting import COLORS, finish  # matplotlib: only when a page draws

    sweep, setup = gemms(rows, "sweep"), kit.setup(rows)
    ms = [r["m"] for r in sweep]
    mid = [tflops(r) for r in sweep]
    low = [m - tflops(r, r["p80_s"]) for m, r in zip(mid, sweep, strict=True)]
    high = [tflops(r, r["p20_s"]) - m for m, r in zip(mid, sweep, strict=True)]
    ax.errorbar(ms, mid, yerr=[low, high],
                fmt="o-", ms=4, color=COLORS["measured"], capsize=2,
                label=f"measured (median, p20–p80){label}")
    if not setup["no_prediction"]:
        ax.plot(ms, [tflops(r, r["predicted_s"]) for r in sweep], "s--", ms=3,
                color=COLORS["predicted"],
                label=f"step model ({setup['accelerator']}, {setup['gemm_fraction']:.2f} of peak)")
        for b in boundaries(rows):
            ax.axvline((b["m_before"] + b["m_after"]) / 2, color=COLORS["muted"], lw=0.8, ls=":")
    n, k = sweep[0]["n"], sweep[0]["k"]
    finish(ax, title=f"Wave quantization: M x {n:,} x {k:,} GEMMs in {setup['dtype']}",
           xlabel="M (rows)", ylabel="TFLOP/s")


EXPERIMENT = Experiment(
    name="gemm_shapes",
    chapter="09_parallelism",
    description=("the forward GEMMs of Llama 3 8B and Megatron's 1.7B GPT (TP 1 and 8) and a "
                 "wave sweep, against the step model's GEMM times"),
    gpu_seconds=60,
    sizes=SIZES,
    run=run,
)
