"""A long run on a cluster: checkpoints every interval, failures, restarts and the work lost.

`simulate_run` plays the model behind `mlsys.accounting.resilience.lost_fraction` forward in
time: the job computes; after every `interval_s` of work since its last checkpoint it writes one,
which takes `checkpoint_s`; a failure throws away everything since the last *completed*
checkpoint (the work, and a save in progress), then the job restarts (`restart_s`) and resumes
from that checkpoint. Over many failures its share of time spent saving and redoing approaches
the first-order formula delta / tau + tau / (2 M) (Young, 1974), whose minimum
`resilience.young_interval_s` gives. The same model in units of steps (a step takes 1, a save 0)
is the chapter's killed run: `executed_steps` lists the steps it runs, in order, repeats
included, as the training log does. `failure_times` draws failures of a job whose mean time
between failures is M, seeded. `draw_run` draws one lane per run: the work, the work lost
(hatched), the restarts, a tick per completed checkpoint and a cross per failure, each lane
labelled with its shares of time. `draw_interval_tradeoff` draws the formula's two costs and
their sum against the interval, Young's and Daly's optima marked, with the lost share of long
simulated runs beside it. Seconds throughout (any unit, if all arguments share it).
Used in: §sec-cluster (chapter 10).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from mlsys import checks
from mlsys.accounting import resilience
from mlsys.book import num
from mlsys.plotting import COLORS, CYCLE, finish, subplots

KINDS = ("work", "checkpoint", "lost", "restart")
"""What a stretch of wall time was spent on. "lost": work (or a save) a failure threw away."""


@dataclass(frozen=True)
class Segment:
    """One stretch of wall time: its kind, start and end, and the progress (work done and kept
    so far, in the same unit) at its start."""

    kind: str
    start_s: float
    end_s: float
    progress_s: float


@dataclass(frozen=True)
class RunTimeline:
    """`simulate_run`'s result: the segments tiling [0, total_s], the failures, the inputs."""

    total_s: float
    interval_s: float
    checkpoint_s: float
    restart_s: float
    failures_s: tuple[float, ...]
    segments: tuple[Segment, ...]

    def seconds(self, kind: str) -> float:
        """Wall time spent on `kind` (one of KINDS)."""
        checks.choice(kind, "kind", KINDS)
        return sum(s.end_s - s.start_s for s in self.segments if s.kind == kind)

    def share(self, kind: str) -> float:
        """`seconds(kind)` over the run's length."""
        return self.seconds(kind) / self.total_s

    def checkpoints_s(self) -> list[float]:
        """Wall times at which a checkpoint completed."""
        return [s.end_s for s in self.segments if s.kind == "checkpoint"]

    def lost_fraction(self) -> float:
        """The share of time not spent on work that was kept: saving, redoing, restarting."""
        return 1.0 - self.share("work")


def failure_times(mtbf_s: float, total_s: float, *, seed: int = 0) -> tuple[float, ...]:
    """Failures in [0, total_s) of a job failing at random at rate 1 / `mtbf_s` (a Poisson
    process: exponential gaps of mean M), drawn from `seed`."""
    m, total = checks.positive(mtbf_s, "mtbf_s"), checks.positive(total_s, "total_s")
    rng, t, out = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(1.0 / m)) < total:
        out.append(t)
    return tuple(out)


def simulate_run(total_s: float, *, interval_s: float, checkpoint_s: float,
                 failures_s: Sequence[float] = (), restart_s: float = 0.0) -> RunTimeline:
    """The run of `total_s` wall seconds (module docstring) with failures at `failures_s`."""
    total = checks.positive(total_s, "total_s")
    tau = checks.positive(interval_s, "interval_s")
    delta = checks.nonnegative(checkpoint_s, "checkpoint_s")
    restart = checks.nonnegative(restart_s, "restart_s")
    fails = sorted(checks.nonnegative(f, "failures_s[i]") for f in failures_s)
    if fails and fails[-1] >= total:
        raise ValueError(f"failures_s must lie in [0, total_s={total}), got {fails[-1]}")
    segments: list[Segment] = []
    pending: list[int] = []  # segments since the last completed checkpoint
    t, kept, done, i = 0.0, 0.0, 0.0, 0  # wall time, progress saved, progress, next failure

    def add(kind: str, end: float) -> None:
        segments.append(Segment(kind, t, end, done))

    while t < total:
        failure = fails[i] if i < len(fails) else math.inf
        work_end = t + (kept + tau - done)
        save_end = work_end + delta
        if failure < min(work_end, total):  # fails during the work
            add("work", failure)
            pending.append(len(segments) - 1)
        elif failure < save_end:  # fails during the save (it began before the run's end)
            add("work", work_end)
            t, done = work_end, kept + tau
            add("checkpoint", failure)
            pending += [len(segments) - 2, len(segments) - 1]
        else:  # no failure before the save completes, or the run ends first
            end = min(work_end, total)
            add("work", end)
            done += end - t
            t = end
            if t < total:
                add("checkpoint", min(save_end, total))
                if save_end <= total:
                    kept, pending = done, []
                else:
                    pending.append(len(segments) - 1)
                t = min(save_end, total)
            continue
        for k in pending:  # the failure throws away what was not saved
            s = segments[k]
            segments[k] = Segment("lost", s.start_s, s.end_s, s.progress_s)
        pending, t, done, i = [], failure, kept, i + 1
        while i < len(fails) and fails[i] < min(t + restart, total):  # fails again restarting
            add("restart", fails[i])
            t, i = fails[i], i + 1
        add("restart", min(t + restart, total))
        t = min(t + restart, total)
    return RunTimeline(total, tau, delta, restart, tuple(fails),
                       tuple(s for s in segments if s.end_s > s.start_s or s.kind == "checkpoint"))


def executed_steps(run: RunTimeline) -> list[int]:
    """The steps (1-based) a run in units of steps runs, in wall order, repeats included: a work
    or lost segment from progress p over w steps runs steps p + 1 ... p + w."""
    out = []
    for s in run.segments:
        if s.kind in ("work", "lost"):
            first = round(s.progress_s)
            out += list(range(first + 1, first + 1 + round(s.end_s - s.start_s)))
    return out


def draw_run(runs: dict[str, RunTimeline], *, unit_s: float = 3600.0, unit: str = "hours",
             label_steps: bool = False, title: str | None = None, ax=None):
    """One lane per run (top to bottom in the dict's order): work (blue), work lost to a failure
    (hatched red), restarts (grey), a tick per completed checkpoint, a cross per failure, and the
    lane's shares of time above it. `label_steps` numbers each unit of work (a run in steps).
    Returns the figure."""
    if not runs or not all(isinstance(r, RunTimeline) for r in runs.values()):
        raise TypeError("runs must map lane names to RunTimeline (simulate_run's result)")
    checks.positive(unit_s, "unit_s")
    if ax is None:
        _, ax = subplots(width=9.0, height=1.1 + 1.0 * len(runs))
    style = {"work": {"facecolor": CYCLE[0], "edgecolor": "white", "lw": 0.4},
             "lost": {"facecolor": "white", "hatch": "////", "edgecolor": COLORS["predicted"],
                      "lw": 0.6},
             "restart": {"facecolor": COLORS["muted"], "edgecolor": "none"}}
    for lane, (name, run) in enumerate(runs.items()):
        y = -1.3 * lane
        for j, s in enumerate(run.segments):
            a, b = s.start_s / unit_s, s.end_s / unit_s
            if s.kind == "checkpoint":
                ax.plot([b, b], [y - 0.34, y + 0.34], color=COLORS["accent"], lw=1.2,
                        gid=f"checkpoint {lane} {j}")
                continue
            ax.add_patch(Rectangle((a, y - 0.3), b - a, 0.6, gid=f"{s.kind} {lane} {j}",
                                   **style[s.kind]))
            if label_steps and s.kind in ("work", "lost"):
                for k in range(round(s.end_s - s.start_s)):
                    ax.text(a + (k + 0.5) / unit_s, y, str(round(s.progress_s) + k + 1),
                            ha="center", va="center", fontsize=8,
                            color="white" if s.kind == "work" else COLORS["predicted"])
        ax.plot([f / unit_s for f in run.failures_s], [y + 0.52] * len(run.failures_s), "x",
                color=COLORS["predicted"], ms=7, mew=2, gid=f"failures {lane}")
        shares = ", ".join(f"{word} {run.share(kind):.1%}" for word, kind in (
            ("saving", "checkpoint"), ("redone", "lost"), ("restarting", "restart"))
                           if run.seconds(kind) > 0)
        ax.text(0, y + 0.72, f"{name}: {shares or 'nothing lost'}", ha="left", va="bottom",
                fontsize=8)
    total = max(r.total_s for r in runs.values()) / unit_s
    ax.set_xlim(0, total)
    ax.set_ylim(-1.3 * (len(runs) - 1) - 0.6, 1.25)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.grid(False, axis="y")
    drawn = {s.kind for r in runs.values() for s in r.segments} | (
        {"failure"} if any(r.failures_s for r in runs.values()) else set())
    handles = {"work": Patch(**style["work"], label="work kept"),
               "lost": Patch(**style["lost"], label="work lost"),
               "restart": Patch(**style["restart"], label="restart"),
               "checkpoint": Line2D([], [], color=COLORS["accent"], lw=1.2,
                                    label="checkpoint saved"),
               "failure": Line2D([], [], color=COLORS["predicted"], marker="x", ls="none", mew=2,
                                 label="failure")}
    shown = [h for kind, h in handles.items() if kind in drawn]
    ax.legend(handles=shown, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(shown),
              frameon=False, fontsize=8)
    finish(ax, xlabel=unit, title=title, legend=False)
    return ax.figure


def draw_interval_tradeoff(checkpoint_s: float, mtbf_s: float, *, failures: int = 400,
                           points: int = 7, seed: int = 0, ax=None):
    """The share of time lost against the interval between checkpoints (minutes, log axis): the
    saves, delta / tau, the work redone, tau / (2 M), and their sum
    (`resilience.lost_fraction`), with Young's and Daly's optima marked; beside them, `points`
    intervals from a quarter to four times Young's, each simulated over about `failures`
    failures (`simulate_run`, one failure draw for all). Returns the figure."""
    delta, m = checks.positive(checkpoint_s, "checkpoint_s"), checks.positive(mtbf_s, "mtbf_s")
    checks.integer(failures, "failures", minimum=1)
    checks.integer(points, "points", minimum=2)
    young, daly = resilience.young_interval_s(delta, m), resilience.daly_interval_s(delta, m)
    if ax is None:
        _, ax = subplots(width=7.0, height=3.6)
    grid = [young / 8 * 64 ** (k / 199) for k in range(200)]  # young / 8 to 8 young
    minutes = [t / 60 for t in grid]
    ax.plot(minutes, [100 * delta / t for t in grid], ":", color=CYCLE[0],
            label="saving: δ/τ")
    ax.plot(minutes, [100 * t / (2 * m) for t in grid], "--", color=CYCLE[1],
            label="redoing: τ/(2M)")
    ax.plot(minutes, [100 * resilience.lost_fraction(t, delta, m) for t in grid], "-",
            color=COLORS["ceiling"], label="lost: their sum", gid="formula")
    total = failures * m
    fails = failure_times(m, total, seed=seed)
    tried = [young / 4 * 16 ** (k / (points - 1)) for k in range(points)]
    lost = [simulate_run(total, interval_s=t, checkpoint_s=delta, failures_s=fails)
            .lost_fraction() for t in tried]
    ax.plot([t / 60 for t in tried], [100 * x for x in lost], "o", color=COLORS["measured"],
            label=f"simulated, {len(fails)} failures", gid="simulated")
    best = 100 * resilience.lost_fraction(young, delta, m)
    for name, t, style in (("Young", young, "-"), ("Daly", daly, ":")):
        ax.axvline(t / 60, color=COLORS["accent"], ls=style, lw=1, gid=name)
    ax.annotate(f"Young: τ = {num(young / 60)} min,\n{best:.2g}% lost", (young / 60, best),
                xytext=(12, -34), textcoords="offset points", ha="left", fontsize=8,
                arrowprops={"arrowstyle": "->", "color": COLORS["accent"]})
    ax.set_ylim(0, 100 * max(lost + [3 * best / 100]))
    finish(ax, xlabel="interval between checkpoints τ (minutes)", ylabel="% of the run lost",
           logx=True, legend=False,
           title=f"δ = {num(delta)} s per save, M = {num(m / 3600)} h between failures")
    ticks = [x for x in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500) if
             minutes[0] <= x <= minutes[-1]]
    ax.set_xticks(ticks, [num(x) for x in ticks])
    ax.minorticks_off()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return ax.figure
