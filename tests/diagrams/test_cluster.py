"""mlsys.diagrams.cluster: the simulated run against the chapter's killed run and the resilience
formula, its segments, and the lanes drawn against the simulation."""

import math

import matplotlib.pyplot as plt
import pytest

from mlsys.accounting import resilience
from mlsys.diagrams import cluster


def _tiles(run):
    """The segments cover [0, total] end to end, in order, with nothing left out."""
    t = 0.0
    for s in run.segments:
        assert math.isclose(s.start_s, t, abs_tol=1e-9) and s.end_s >= s.start_s
        t = s.end_s
    assert math.isclose(t, run.total_s, abs_tol=1e-9)


def test_the_killed_run_of_chapter_10_in_steps():
    # kill before step index 5, a checkpoint every 3 steps, 8 steps: the log's sequence
    run = cluster.simulate_run(10, interval_s=3, checkpoint_s=0, failures_s=[5])
    assert cluster.executed_steps(run) == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8]
    assert run.seconds("lost") == 2 and run.checkpoints_s() == [3, 8]
    _tiles(run)


def test_without_failures_the_run_saves_every_interval():
    run = cluster.simulate_run(100, interval_s=9, checkpoint_s=1)
    assert run.checkpoints_s() == [10.0 * k for k in range(1, 11)]
    assert run.share("checkpoint") == pytest.approx(0.1) and run.seconds("lost") == 0
    _tiles(run)


def test_a_failure_during_a_save_loses_the_save_and_the_work_before_it():
    run = cluster.simulate_run(30, interval_s=5, checkpoint_s=2, failures_s=[13], restart_s=3)
    # saved at 7; work 7-12, save 12-13 interrupted: both lost; restart 13-16; resume from 5
    kinds = [(s.kind, s.start_s, s.end_s) for s in run.segments[:5]]
    assert kinds == [("work", 0, 5), ("checkpoint", 5, 7), ("lost", 7, 12), ("lost", 12, 13),
                     ("restart", 13, 16)]
    assert run.segments[5].progress_s == 5
    _tiles(run)


def test_a_failure_while_restarting_restarts_again():
    run = cluster.simulate_run(40, interval_s=10, checkpoint_s=1, failures_s=[4, 6], restart_s=5)
    restarts = [(s.start_s, s.end_s) for s in run.segments if s.kind == "restart"]
    assert restarts == [(4, 6), (6, 11)]
    _tiles(run)


@pytest.mark.parametrize("interval", ["young", 3600.0])
def test_a_long_run_loses_what_the_formula_says(interval):
    ckpt_s, mtbf = 8.4, 3.1 * 3600
    tau = resilience.young_interval_s(ckpt_s, mtbf) if interval == "young" else interval
    total = 3000 * mtbf
    run = cluster.simulate_run(total, interval_s=tau, checkpoint_s=ckpt_s,
                               failures_s=cluster.failure_times(mtbf, total, seed=3))
    assert run.lost_fraction() == pytest.approx(resilience.lost_fraction(tau, ckpt_s, mtbf),
                                                rel=0.1)
    assert len(run.failures_s) == pytest.approx(3000, rel=0.1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="interval_s"):
        cluster.simulate_run(10, interval_s=0, checkpoint_s=1)
    with pytest.raises(ValueError, match=r"failures_s must lie in \[0, total_s=10"):
        cluster.simulate_run(10, interval_s=2, checkpoint_s=1, failures_s=[12])
    with pytest.raises(ValueError, match="mtbf_s"):
        cluster.failure_times(-1, 10)
    with pytest.raises(TypeError, match="RunTimeline"):
        cluster.draw_run({"x": 3})


def test_the_lanes_drawn_match_the_simulation():
    runs = {"hourly": cluster.simulate_run(20, interval_s=3, checkpoint_s=0.5,
                                           failures_s=[4.2, 11.0], restart_s=1),
            "steps": cluster.simulate_run(10, interval_s=3, checkpoint_s=0, failures_s=[5])}
    fig = cluster.draw_run(runs, unit_s=1, unit="steps", label_steps=True)
    ax = fig.axes[0]
    for lane, run in enumerate(runs.values()):
        ticks = [ln for ln in ax.lines if (ln.get_gid() or "").startswith(f"checkpoint {lane} ")]
        assert [ln.get_xdata()[0] for ln in ticks] == run.checkpoints_s()
        lost = [p for p in ax.patches if (p.get_gid() or "").startswith(f"lost {lane} ")]
        assert sum(p.get_width() for p in lost) == pytest.approx(run.seconds("lost"))
        crosses = next(ln for ln in ax.lines if ln.get_gid() == f"failures {lane}")
        assert list(crosses.get_xdata()) == list(run.failures_s)
    numbers = [int(t.get_text()) for t in ax.texts if t.get_text().isdigit()]
    expected = [s for run in runs.values() for s in cluster.executed_steps(run)]
    assert sorted(numbers) == sorted(expected)
    lanes = [t.get_text() for t in ax.texts if ":" in t.get_text()]
    assert lanes[1] == "steps: redone 20.0%"
    plt.close(fig)


def test_the_tradeoff_is_lowest_at_young_and_the_simulation_follows_it():
    ckpt_s, mtbf = 8.4, 3.1 * 3600
    fig = cluster.draw_interval_tradeoff(ckpt_s, mtbf, failures=300, points=5, seed=1)
    ax = fig.axes[0]
    formula = next(ln for ln in ax.lines if ln.get_gid() == "formula")
    x, y = formula.get_xdata(), formula.get_ydata()
    young = resilience.young_interval_s(ckpt_s, mtbf) / 60
    assert x[list(y).index(min(y))] == pytest.approx(young, rel=0.03)
    assert next(ln for ln in ax.lines if ln.get_gid() == "Young").get_xdata()[0] == young
    simulated = next(ln for ln in ax.lines if ln.get_gid() == "simulated")
    for t, lost in zip(simulated.get_xdata(), simulated.get_ydata(), strict=True):
        assert lost == pytest.approx(100 * resilience.lost_fraction(60 * t, ckpt_s, mtbf),
                                     rel=0.15)
    plt.close(fig)
    with pytest.raises(ValueError, match="mtbf_s"):
        cluster.draw_interval_tradeoff(1, 0)
