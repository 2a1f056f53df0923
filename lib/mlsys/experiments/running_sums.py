"""Chapter 01's live runs (not recorded experiments): the running sum of one addend in every
variant of addend and accumulator format, measured with torch and predicted bit for bit.

A variant is (label, addend, n, addend format, accumulator format, explicit cast). `run` adds the
addend n times with one torch addition per step (`summation.running_sum`) and asserts that every
partial sum equals `summation.plateau_sum`'s prediction, computed without torch arithmetic;
`table` and `plot` show the results, `readings` the numbers the page reads off them.
Also the page's other live checks: `format_rows` and `bit_rows` (every format's limits and a few
numbers' stored bits, against torch), `stochastic_table` and `stochastic_verdict` (a running sum
rounded stochastically, trial after trial, against round to nearest:
`mlsys.numerics.stochastic`) and `scaling_table` (an fp8 cast of a tensor with outliers, without a
scale, with one per tensor and with one per block of 32: `mlsys.numerics.scaling`). Used in:
§sec-precision.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from mlsys import plotting
from mlsys.book import Table, num
from mlsys.diagrams.formats import WORDS
from mlsys.numerics import bit_fields, precision, scaling, stochastic, summation

Variant = tuple[str, float, int, str, str, bool]
"""(label, addend, n, addend format, accumulator format, explicit cast)."""

TRACED = ("fp32", "fp16", "bf16")
"""The variants whose whole trajectory `plot` draws, with their colors' places in the cycle."""


class Sum(NamedTuple):
    """One variant's running sum: the prediction, the measured final value, every partial sum."""

    predicted: summation.SumPrediction
    final: float
    trajectory: list[float]


def run(variants: Sequence[Variant]) -> dict[tuple[str, float], Sum]:
    """(label, addend) -> its `Sum`, each variant measured and asserted equal, partial sum by
    partial sum, to its prediction."""
    out = {}
    for label, a, n, addend_format, accumulator, explicit in variants:
        predicted = summation.plateau_sum(a, n, accumulator, addend_format=addend_format)
        measured = summation.running_sum(a, n, addend_format, accumulator, explicit_cast=explicit)
        trajectory = measured.double().tolist()
        assert trajectory == predicted.trajectory()  # every partial sum, bit for bit
        out[(label, a)] = Sum(predicted, measured[-1].item(), trajectory)
    return out


RUNS = {"fp16_lo": ("fp16", 4, 8), "fp16_hi": ("fp16", 8, 16), "bf16_lo": ("bf16", 2, 4)}
"""The runs of equal additions `readings` reports: (format, where the run starts: lo, hi)."""


def readings(sums: dict[tuple[str, float], Sum], addend: float,
             small_addend: float) -> dict[str, float]:
    """The numbers the page reads off the sums of `addend` and `small_addend` (the `TRACED`
    variants, labelled by their format, must be among them): for each of `RUNS`, the amount every
    addition of the run adds ("<run>_step") and its bias against the stored addend
    ("<run>_bias"); half an ulp of bf16 at its final sum ("bf16_half_ulp_at_plateau"); for each
    traced format, the final sum measured ("final_<fmt>", "final_<fmt>_small"), the additions that
    counted ("stall_<fmt>_run", ..., 0: all of them) and the addend as stored ("a_<fmt>", ...)."""
    out: dict[str, float] = {}
    for tag, (fmt, lo, hi) in RUNS.items():
        predicted = sums[(fmt, addend)].predicted
        run = predicted.run_starting_in(lo, hi)
        out[f"{tag}_step"] = run.increment
        out[f"{tag}_bias"] = (run.increment - predicted.addend) / predicted.addend
    out["bf16_half_ulp_at_plateau"] = precision.ulp(sums[("bf16", addend)].final, "bf16") / 2
    for fmt, (suffix, a) in itertools.product(TRACED, (("", addend), ("_small", small_addend))):
        s = sums[(fmt, a)]
        out[f"final_{fmt}{suffix}"] = s.final
        out[f"stall_{fmt}{suffix}_run"] = s.predicted.stall_step or 0
        out[f"a_{fmt}{suffix}"] = s.predicted.addend
    return out


def table(sums: dict[tuple[str, float], Sum]) -> Table:
    """Per variant: the addend as stored, the final sum predicted and measured, its distance from
    n * addend, and where the sum stops growing."""
    rows = []
    for (label, a), s in sums.items():
        p = s.predicted
        stall = "-" if p.stall_step is None else f"{p.stall_step} ({p.final:g})"
        rows.append([f"{a} x {p.n}", label, repr(p.addend), repr(p.final), repr(s.final),
                     f"{s.final - p.n * a:+.3g}", stall])
    return Table(["sum", "variant", "addend as stored", "predicted", "measured",
                  "measured - intended", "stops growing after"], rows)


def plot(sums: dict[tuple[str, float], Sum], axes, *, cases: Sequence[tuple[float, int]]) -> None:
    """One axes per (addend, n) of `cases`: the `TRACED` variants' trajectories measured (wide)
    and predicted (dashed, on top), the exact n * addend, and each format's plateau s* where the
    sum reaches it."""
    colors = dict(zip(TRACED, (plotting.CYCLE[0], plotting.CYCLE[2], plotting.CYCLE[3]),
                      strict=True))
    for ax, (a, n) in zip(axes, cases, strict=True):
        ax.plot([0, n], [0, n * a], color=plotting.COLORS["muted"], lw=1, label="exact n·a")
        for fmt, color in colors.items():
            s = sums[(fmt, a)]
            ax.plot(range(1, n + 1), s.trajectory, color=color, lw=3, alpha=0.5,
                    label=f"{fmt} measured")
            ax.plot(range(1, n + 1), s.predicted.trajectory(), color=plotting.COLORS["predicted"],
                    lw=1, ls="--", label="predicted (plateau_sum)" if fmt == "bf16" else None)
            plateau = summation.plateau_value(s.predicted.addend, fmt)
            if plateau <= n * a:
                ax.axhline(plateau, color=color, ls=":", lw=1.2, label=f"{fmt} plateau s*")
        plotting.finish(ax, title=f"{a} added {n:,} times", xlabel="additions",
                        ylabel="running sum")


# --- the formats and their bits, against torch ---------------------------------------------------


def format_rows() -> list[list[object]]:
    """One row per format of `precision.FORMATS`: bias, max, smallest normal and subnormal, eps,
    (inf, NaN) counts and torch's dtype. Asserts every limit against `torch.finfo`, and for the
    formats of 16 bits or fewer the (inf, NaN) counts against every bit pattern decoded by torch:
    an IEEE format has 2 infinities and 2 (2^m - 1) NaNs, e4m3fn none and 2 (S.1111.111)."""
    rows = []
    for r in precision.format_table():
        f = precision.FORMATS[r["format"]]
        special = (0, 2) if f.finite_only else (2, 2 * (2**f.mantissa_bits - 1))  # (inf, NaN)
        if r["torch_dtype"] != "-":  # derived values against torch's own
            info = torch.finfo(f.dtype)
            assert (f.bits, f.max, f.smallest_normal, f.eps) == (
                info.bits, info.max, info.smallest_normal, info.eps), f.name
        if r["torch_dtype"] != "-" and f.bits <= 16:  # every bit pattern, decoded by torch
            values = torch.arange(2**f.bits).to(WORDS[f.bits]).view(f.dtype).float()
            assert special == (int(values.isinf().sum()), int(values.isnan().sum())), f.name
        rows.append([f.name, f.bias, num(f.max, 4), num(f.smallest_normal, 4),
                     num(f.smallest_subnormal, 4), num(f.eps, 4), f"{special[0]}, {special[1]}",
                     r["torch_dtype"]])
    e4m3 = torch.arange(256).to(torch.uint8)
    nan_codes = e4m3[e4m3.view(torch.float8_e4m3fn).float().isnan()].tolist()
    assert nan_codes == [0x7F, 0xFF]  # S.1111.111, either sign
    return rows


def bit_rows(values: Sequence[float], names: Sequence[str]) -> list[list[object]]:
    """For each value and format: `bit_fields.decompose`'s pattern, kind, unbiased exponent and
    stored value, each pattern asserted equal to the bits torch stores (e4m3 saturating, as
    `precision.saturating_cast` casts) and each value to its reconstruction from the fields."""
    rows = []
    for x, name in itertools.product(values, names):
        b, f = bit_fields.decompose(x, name), precision.FORMATS[name]
        cast = precision.saturating_cast(torch.tensor([x]), name)
        stored = cast.view(WORDS[f.bits]).item() % 2**f.bits
        assert int(b.pattern.replace(" ", ""), 2) == stored and b.reconstruct() == b.value
        exponent = "-" if b.unbiased_exponent is None else b.unbiased_exponent
        rows.append([x, name, b.pattern, b.kind, exponent, repr(b.value)])
    return rows


# --- stochastic rounding against round to nearest ------------------------------------------------

BIAS_LIMIT = 4.0
"""A mean this many standard errors (`StochasticSums.standard_error`) from the exact sum, or more,
is a bias, not chance (by Chebyshev, at most 1/16 of seeds stray that far by chance)."""


def stochastic_verdict(sums: stochastic.StochasticSums, nearest: float) -> str:
    """Words for one stochastic sum against its round-to-nearest twin, from the numbers: unbiased
    (mean within `BIAS_LIMIT` standard errors of the exact sum) or not, the spread against its
    sqrt(n) bound, and how far round to nearest lands."""
    off = abs(sums.mean - sums.exact) / sums.standard_error
    if off < BIAS_LIMIT:
        bias = (f"unbiased: the mean of {sums.trials} trials, {sums.mean:.4g}, is "
                f"{off:.1f} standard errors from the exact {sums.exact:.6g}")
    else:
        bias = (f"biased: the mean of {sums.trials} trials, {sums.mean:.4g}, is {off:.0f} "
                f"standard errors from the exact {sums.exact:.6g}")
    spread = ("within" if sums.std <= sums.std_bound else "above") + (
        f" its sqrt(n) bound ({sums.std:.2g} against {sums.std_bound:.2g})")
    return (f"{bias}, with a spread {spread}; round to nearest ends at {nearest:g}, "
            f"{abs(nearest - sums.exact) / sums.exact:.0%} from it")


def stochastic_table(cases: Sequence[tuple[str, float, int, float]], fmt: str, *, trials: int,
                     seed: int) -> tuple[Table, dict[str, tuple[stochastic.StochasticSums, float]]]:
    """Per case (label, addend, n, start): the exact sum of the stored numbers, round to nearest,
    and `trials` stochastic sums (mean, spread and its bound). Returns the table and, per label,
    (the stochastic sums, the round-to-nearest sum)."""
    gen = torch.Generator().manual_seed(seed)
    out, rows = {}, []
    for label, addend, n, start in cases:
        sums = stochastic.stochastic_sum(addend, n, fmt, trials=trials, generator=gen, start=start)
        nearest = stochastic.nearest_sum(addend, n, fmt, start=start)
        out[label] = (sums, nearest)
        rows.append([label, repr(sums.exact), repr(nearest), f"{sums.mean:.4f}",
                     f"{sums.std:.3f} (bound {sums.std_bound:.3f})",
                     f"{min(sums.finals):g} – {max(sums.finals):g}"])
    return Table(["sum", "exact (stored addends)", "round to nearest",
                  f"stochastic: mean of {trials}", "spread (std)", "range"], rows), out


# --- fp8 scaling of a tensor with outliers -------------------------------------------------------


def scaling_table(fmt: str, ratios: Sequence[float], *, n: int, std: float, outliers: int,
                  seed: int) -> tuple[Table, dict[tuple[float, str], scaling.ScalingError]]:
    """Per outlier ratio: a tensor of n entries N(0, std^2) with `outliers` entries at +-ratio *
    std, cast to `fmt` under every scaling of `scaling.SCALINGS` (blocks of `scaling.MX_BLOCK`);
    the mean relative error and the share flushed to zero. Returns the table and the errors."""
    out, rows = {}, []
    for ratio in ratios:
        gen = torch.Generator().manual_seed(seed)  # the same bulk for every ratio
        x = scaling.outlier_tensor(n, std=std, outliers=outliers, ratio=ratio, generator=gen)
        cells = []
        for name in scaling.SCALINGS:
            err = out[(ratio, name)] = scaling.errors(x, scaling.quantize(x, fmt, name))
            cells.append(f"{err.mean_relative:.1%} ({err.flushed:.1%})")
        rows.append([num(ratio), *cells])
    return Table(["outliers (x the std of the rest)", "no scale", "one scale per tensor",
                  f"one per {scaling.MX_BLOCK} (MX)"], rows), out


def scaling_readings(errors: dict[tuple[float, str], scaling.ScalingError],
                     fmt: str) -> dict[str, float]:
    """The numbers the page reads off `scaling_table`'s errors: at the mildest outliers, the share
    flushed without a scale ("none_flushed") and the per-tensor error ("clean_err"); at the largest
    ("big_ratio"), the per-tensor error and share flushed ("tensor_err", "tensor_flushed") and the
    per-block error ("block_err"); the block size, and the format's range ("fp8_min_normal",
    "fp8_min_sub", "fp8_octaves": log2 of max over the smallest subnormal)."""
    ratios = sorted({ratio for ratio, _ in errors})
    small, big = ratios[0], ratios[-1]
    f = precision.FORMATS[fmt]
    return {"mx_block": scaling.MX_BLOCK, "big_ratio": big,
            "none_flushed": errors[(small, "none")].flushed,
            "clean_err": errors[(small, "tensor")].mean_relative,
            "tensor_err": errors[(big, "tensor")].mean_relative,
            "tensor_flushed": errors[(big, "tensor")].flushed,
            "block_err": errors[(big, "block")].mean_relative,
            "fp8_min_normal": f.smallest_normal, "fp8_min_sub": f.smallest_subnormal,
            "fp8_octaves": math.log2(f.max / f.smallest_subnormal)}
