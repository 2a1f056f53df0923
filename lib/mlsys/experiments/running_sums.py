"""Chapter 01's live runs (not recorded experiments): the running sum of one addend in every
variant of addend and accumulator format, measured with torch and predicted bit for bit.

A variant is (label, addend, n, addend format, accumulator format, explicit cast). `run` adds the
addend n times with one torch addition per step (`summation.running_sum`) and asserts that every
partial sum equals `summation.plateau_sum`'s prediction, computed without torch arithmetic;
`table` and `plot` show the results, `readings` the numbers the page reads off them. Used in:
§sec-precision.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from mlsys import plotting
from mlsys.book import Table
from mlsys.numerics import precision, summation

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
