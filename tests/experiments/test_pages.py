"""The pages' readers of records (`mlsys.experiments.pages`), on the smoke records `--check`
builds."""

import experiment_cases
import pytest

from mlsys.experiments import pages, roofline_ops, train_step


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_the_pages_read_every_record_through_headlines_and_show_record(records):
    """What `experiments.show_recorded` calls for a record beyond its tables (`pages`), on the
    smoke records (figures drawn with Agg), and the headline numbers a page glues."""
    import matplotlib  # this test only: the figures of the pages' callbacks

    matplotlib.use("Agg")
    rows = records["roofline_ops"]["results"]
    head = roofline_ops.headline(rows)
    assert head["ops_attempts"] == roofline_ops.consistency(rows)["attempts"]
    assert head["meas_gbps"] == roofline_ops.ceilings(rows).bytes_per_s / 1e9
    assert {k for k in head if k.startswith("verdict_")} == {
        f"verdict_{k}" for k in roofline_ops.verdicts(rows)}
    shown = {name: getattr(pages, f"show_{name}")(records[name]) for name in
             ("dot_accumulation", "training_memory", "train_step", "roofline_ops",
              "flash_benchmark")}
    assert shown["dot_accumulation"].endswith(".") and shown["training_memory"].endswith(".")
    assert shown["roofline_ops"] is None
    assert shown["flash_benchmark"].startswith("targets: no flash_triton row")
    table, verdict = shown["train_step"]
    assert table.rows and verdict == train_step.mfu_verdict(records["train_step"]["results"])
