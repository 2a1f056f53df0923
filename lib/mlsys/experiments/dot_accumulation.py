"""Dot products of length K in narrow formats: what the accumulator does to the answer.

`rows x cols` dot products per length K of uniform [0, 1) inputs, every one compared with its exact
value (integer arithmetic: each fp16 or fp8 input in [0, 1] is a whole multiple of 2^-24, so the
scaled products and their sums are exact in int64 up to K = 2^14). Summed four ways on the CPU,
where every rounding is the format's own (`mlsys.numerics.summation`): fp16 products added in an
fp16 running sum, the same with Kahan's compensation, exact products added in fp32; and by the
device's own matrix multiply: `torch.matmul` on fp16 inputs and `torch._scaled_mm` on fp8 e4m3
inputs with an fp32 output. On a CUDA GPU two more: `torch.mm(..., out_dtype=float32)` shows the
fp16 tensor-core accumulator without the final rounding to fp16, and `_scaled_mm` with
`use_fast_accum=True` lets the fp8 tensor cores accumulate without periodic promotion to fp32
(cuBLAS's "fast accumulation"). Positive inputs are the hard case for a running sum: nothing
cancels, every partial sum grows. References: Higham (2002), ch. 3-4; Kahan (1965); DeepSeek-AI,
DeepSeek-V3 technical report (2024), sec. 3.3.2. Used in: §sec-precision.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from mlsys import checks, env
from mlsys.book import Table
from mlsys.experiments import Experiment
from mlsys.experiments.kit import setup
from mlsys.numerics import summation
from mlsys.numerics.precision import FORMATS

SCALE_BITS = 24  # fp16 and fp8 values in [0, 1] are whole multiples of 2^-24 (fp16 subnormal step)
MAX_K = 2**14  # K * (2^24)^2 < 2^63: exact int64 sums of scaled products up to this length


@dataclass(frozen=True)
class Sizes:
    lengths: tuple[int, ...]  # K of the dot products, ascending
    rows: int  # A is (rows, K)
    cols: int  # B is (K, cols): rows * cols dot products per K
    seed: int = 0

    def __post_init__(self) -> None:
        lengths = checks.int_sequence(self.lengths, "lengths", minimum=16)
        if list(lengths) != sorted(set(lengths)) or lengths[-1] > MAX_K:
            raise ValueError(f"lengths must ascend, each in [16, {MAX_K}] (exact int64 reference), "
                             f"got {self.lengths}")
        if any(k % 16 for k in lengths) or self.rows % 16 or self.cols % 16:
            raise ValueError(f"lengths, rows ({self.rows}) and cols ({self.cols}) must be "
                             "multiples of 16 (fp8 matmuls need it)")
        checks.positive_ints(rows=self.rows, cols=self.cols)


SIZES = {
    "smoke": Sizes((16, 64, 256, 1024, 2048), 16, 16),
    "cpu": Sizes((16, 64, 256, 1024, 4096, 8192), 32, 32),
    "gpu": Sizes((16, 64, 256, 1024, 4096, 16384), 64, 64),
}

LOOPS = {  # the CPU loops: name -> accumulator (every partial sum rounded to it)
    "fp16 products, fp16 sum": "fp16",
    "fp16 products, Kahan fp16 sum": "fp16",
    "exact products, fp32 sum": "fp32",
}


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b exactly (float64 of an exact int64 result) for inputs that are multiples of 2^-24."""
    scale = 2.0**SCALE_BITS
    ai, bi = (x.double().cpu() * scale for x in (a, b))
    assert torch.equal(ai, ai.round()) and torch.equal(bi, bi.round()), "inputs off the 2^-24 grid"
    return (ai.long() @ bi.long()).double() / scale**2


def _errors(value: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    rel = ((value.double().cpu() - exact) / exact).abs().flatten().tolist()
    return {"max_rel_error": max(rel), "median_rel_error": statistics.median(rel)}


@contextlib.contextmanager
def _no_reduced_precision_reduction():
    """cuBLAS may not split K into fp16 partial sums while this is on (restored afterwards)."""
    flags = torch.backends.cuda.matmul
    before = flags.allow_fp16_reduced_precision_reduction
    flags.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        flags.allow_fp16_reduced_precision_reduction = before


def _device_methods(device: str) -> dict[str, tuple[str, str, Any]]:
    """name -> (inputs, output dtype, fn(a, b)) of the device's own matrix multiplies."""
    one = torch.ones((), device=device)

    def scaled_mm(fast: bool):
        return lambda a, b: torch._scaled_mm(a, b.t().contiguous().t(), scale_a=one, scale_b=one,
                                             out_dtype=torch.float32, use_fast_accum=fast)

    methods = {f"torch.matmul, fp16 ({device})": ("fp16", "fp16", torch.matmul)}
    if device == "cuda":
        methods["torch.mm, fp16 in, fp32 out (cuda)"] = (
            "fp16", "fp32", lambda a, b: torch.mm(a, b, out_dtype=torch.float32))
        methods["torch._scaled_mm, fp8 e4m3, fast accumulation (cuda)"] = (
            "fp8_e4m3", "fp32", scaled_mm(True))
    methods[f"torch._scaled_mm, fp8 e4m3, fp32 out ({device})"] = (
        "fp8_e4m3", "fp32", scaled_mm(False))
    return methods


def _unsupported_reason(inputs: str, device: str) -> str | None:
    if inputs == "fp8_e4m3" and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        return "fp8 matmuls need compute capability 8.9 or newer"
    if inputs == "fp8_e4m3" and device not in ("cuda", "cpu"):
        return f"no fp8 matmul on {device}"
    return None


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Errors of every summation method for every K (loops on the CPU, matmuls on `device`)."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(s.seed)
    k_max = s.lengths[-1]
    a32, b32 = torch.rand(s.rows, k_max, generator=gen), torch.rand(k_max, s.cols, generator=gen)
    inputs = {"fp16": (a32.half(), b32.half()),
              "fp8_e4m3": (a32.to(torch.float8_e4m3fn), b32.to(torch.float8_e4m3fn))}
    rows: list[dict[str, Any]] = [{
        "kind": "setup", "device": env.device_name(), "device_type": device, "rows": s.rows,
        "cols": s.cols, "torch": torch.__version__,
        "capability": (".".join(map(str, torch.cuda.get_device_capability()))
                       if device == "cuda" else None),
    }]
    methods = _device_methods(device)
    failed: dict[str, str] = {}  # method -> why it cannot run here (reported in the rows)
    for name, (fmt, _, _) in methods.items():
        reason = _unsupported_reason(fmt, device)
        if reason:
            failed[name] = reason
    for k in s.lengths:
        a16, b16 = inputs["fp16"][0][:, :k], inputs["fp16"][1][:k]
        exact16 = _exact(a16, b16)
        products = a16[:, None, :] * b16.t()[None, :, :]  # (rows, cols, K), each rounded to fp16
        exact_products = a16.float()[:, None, :] * b16.t().float()[None, :, :]  # exact in fp32
        loops = (summation.sequential_sum(products, "fp16"), summation.kahan_sum(products, "fp16"),
                 summation.sequential_sum(exact_products, "fp32"))
        for (name, acc), value in zip(LOOPS.items(), loops, strict=True):
            rows.append({"kind": "dot", "method": name, "inputs": "fp16", "output": acc,
                         "where": "cpu", "K": k, **_errors(value, exact16)})
        for name, (fmt, out, fn) in methods.items():
            if name in failed:
                continue
            a, b = inputs[fmt][0][:, :k], inputs[fmt][1][:k]
            exact = exact16 if fmt == "fp16" else _exact(a.float(), b.float())
            context = (_no_reduced_precision_reduction() if device == "cuda"
                       else contextlib.nullcontext())
            try:
                with context:
                    value = fn(a.to(device), b.to(device))
            except (RuntimeError, NotImplementedError, TypeError) as err:  # reported, never skipped
                failed[name] = str(err).splitlines()[0]
                continue
            rows.append({"kind": "dot", "method": name, "inputs": fmt, "output": out,
                         "where": device, "K": k, **_errors(value, exact)})
    rows += [{"kind": "unsupported", "method": m, "reason": why} for m, why in failed.items()]
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """method -> [(K, max relative error)], in the order the rows give them."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["kind"] == "dot":
            out.setdefault(r["method"], []).append((r["K"], r["max_rel_error"]))
    return out


def unsupported(rows: list[dict[str, Any]]) -> dict[str, str]:
    """method -> why it did not run on this device."""
    return {r["method"]: r["reason"] for r in rows if r["kind"] == "unsupported"}


def higham_bound(k: int, accumulator: str, *, rounded_products: bool) -> float:
    """Higham's bound on the relative error of a left-to-right dot product of positive terms:
    gamma_(K-1) with exact products, gamma_K when each product is rounded to the accumulator too."""
    return summation.recursive_sum_error_bound(k + (1 if rounded_products else 0), accumulator)


def table(rows: list[dict[str, Any]]) -> Table:
    """One row per K: the max relative error of every method, Higham's bounds ("-" once >= 1)."""
    c = {method: dict(errs) for method, errs in curves(rows).items()}
    lengths = sorted({k for errs in c.values() for k in errs})
    header = ["K", *c, "bound γ_K, fp16", "bound γ_(K-1), fp32"]
    body = []
    for k in lengths:
        bounds = (higham_bound(k, "fp16", rounded_products=True),
                  higham_bound(k, "fp32", rounded_products=False))
        body.append([f"{k:,}", *(f"{errs[k]:.2e}" if k in errs else "-" for errs in c.values()),
                     *("-" if b >= 1 else f"{b:.2e}" for b in bounds)])
    return Table(header, body)


def accumulator_verdict(rows: list[dict[str, Any]], method: str) -> str:
    """What a device method's error at the largest K says about its accumulator (from numbers)."""
    errs = {m: e[-1][1] for m, e in curves(rows).items()}
    k = curves(rows)[method][-1][0]
    out = next(r["output"] for r in rows if r.get("method") == method and r["kind"] == "dot")
    err = errs[method]
    fp32, fp16 = errs["exact products, fp32 sum"], errs["fp16 products, fp16 sum"]
    one_rounding = FORMATS[out].unit_roundoff
    text = f"{method}: max relative error {err:.2e} at K = {k:,}"
    if out != "fp32" and err <= one_rounding:
        return (f"{text}, within one rounding of its {out} output ({one_rounding:.1e}): that final "
                f"rounding hides how wide the accumulator is, but the sum is {fp16 / err:,.0f}x "
                "more accurate than an fp16 running sum")
    if err <= 2 * fp32:
        relation = "below" if err < fp32 else "close to"
        return (f"{text}, {relation} the fp32 running sum's {fp32:.2e}: an accumulator at least as "
                "wide as fp32")
    if err < fp16:
        return (f"{text}: {err / fp32:,.0f}x the fp32 running sum's error, so it accumulates with "
                f"fewer bits than fp32 (or rounds its partial sums more often), yet "
                f"{fp16 / err:,.0f}x less than the fp16 running sum")
    return f"{text}: no better than the fp16 running sum ({fp16:.2e})"


def plot(rows: list[dict[str, Any]], ax, *, title: str) -> None:
    """Max relative error against K for every method, Higham's bounds dashed where they are < 1."""
    from mlsys import plotting  # matplotlib: only when a page draws

    c = curves(rows)
    styles = zip(plotting.CYCLE * 2, plotting.MARKERS, c.items(), strict=False)
    for color, marker, (name, errs) in styles:
        ax.plot([k for k, _ in errs], [e for _, e in errs], marker + "-", color=color, ms=5,
                label=name)
    lengths = sorted({k for errs in c.values() for k, _ in errs})
    for fmt, rounded, color in [("fp16", True, plotting.CYCLE[0]),
                                ("fp32", False, plotting.CYCLE[2])]:
        pts = [(k, higham_bound(k, fmt, rounded_products=rounded)) for k in lengths]
        pts = [(k, b) for k, b in pts if b < 1]
        ax.plot([k for k, _ in pts], [b for _, b in pts], "--", color=color,
                label=f"Higham bound, {fmt} sum (prediction, shown while < 1)")
    ax.axhline(FORMATS["fp16"].unit_roundoff, color=plotting.COLORS["ceiling"], lw=0.8, ls=":",
               label="one fp16 rounding (2^-11)")
    plotting.finish(ax, title=title, xlabel="K (terms per dot product)",
                    ylabel="max relative error", logx=2, logy=True)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


def describe(rows: list[dict[str, Any]]) -> str:
    """"rows x cols dot products per K on DEVICE" for captions."""
    s = setup(rows)
    return f"{s['rows'] * s['cols']:,} dot products per K, matmuls on {s['device']}"


def device_verdicts(rows: list[dict[str, Any]]) -> str:
    """`accumulator_verdict` of every device matmul, in one sentence."""
    return "; ".join(accumulator_verdict(rows, m) for m in curves(rows) if m not in LOOPS)


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's numbers: how many dot products, the largest K, the loops' errors there (Kahan's
    also in fp16 unit roundoffs) and `device_verdicts`."""
    s, last = setup(rows), {m: errs[-1] for m, errs in curves(rows).items()}
    k_max, fp32 = last["exact products, fp32 sum"]
    kahan = last["fp16 products, Kahan fp16 sum"][1]
    return {"dot_count": s["rows"] * s["cols"], "dot_k_max": k_max,
            "dot_fp16_error": last["fp16 products, fp16 sum"][1], "dot_kahan_error": kahan,
            "dot_kahan_u": kahan / FORMATS["fp16"].unit_roundoff,
            "dot_fp32_error": fp32,
            "dot_device_verdicts": device_verdicts(rows)}


EXPERIMENT = Experiment(
    name="dot_accumulation",
    chapter="01_precision",
    description="dot products of fp16/fp8 inputs: fp16 loop, Kahan, fp32 loop, device matmuls",
    gpu_seconds=15,
    sizes=SIZES,
    run=run,
)
