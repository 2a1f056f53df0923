"""The chapter 09 experiment's planner verdict (`parallel_step.planner_verdict`), on launch rows
built here (tests/experiment_cases.py): it follows the numbers, or is withheld."""

from experiment_cases import measured, per_rank, planner_case

from mlsys.experiments import parallel_step


def test_the_planner_verdict_follows_the_numbers():
    rows = planner_case(per_rank(), measured())
    text = parallel_step.planner_verdict(rows)
    runs = [r for r in rows if r["kind"] == "planner"]
    ratios = [r["predicted_s"] / r["step"]["median_s"] for r in runs]
    assert f"{min(ratios):.2f}x the measured one" in text and f"to {max(ratios):.2f}x" in text
    above = sum(r["step"]["median_s"] > r["serial_s"] for r in runs)
    assert f"{above} above both" in text and "of 10 pairs of runs" in text
    assert "us latency left out" in text
    noisy = planner_case(per_rank(), measured(spread=3.0))
    assert parallel_step.planner_verdict(noisy).startswith("no verdict: the machine was too noisy")
    no_link = planner_case(per_rank(link=False), measured())
    assert [r["kind"] for r in no_link if r["kind"] in ("calibration", "planner")] == [
        "calibration"]
    assert "gave no link to calibrate on" in parallel_step.planner_verdict(no_link)


def test_the_planner_table_fits_a_column_and_carries_every_term():
    rows = planner_case(per_rank(), measured())
    table = parallel_step.planner_table(rows)
    runs = [r for r in rows if r["kind"] == "planner"]
    assert len(table.header) == 5 and len(table.rows) == len(runs)
    for row, r in zip(table.rows, runs, strict=True):
        assert row[0] == r["run"]
        assert row[2].endswith(f"({r['predicted_s'] / r['step']['median_s']:.2f}x)")
        assert row[4].count(" + ") == 2
