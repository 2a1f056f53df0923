"""The train_step experiment (chapter 03): MFU follows from its smoke record's rows."""

import experiment_cases
import pytest

from mlsys.accounting import flops
from mlsys.experiments import train_step


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_train_step_mfu_follows_from_the_rows(records):
    rows = records["train_step"]["results"]
    s = train_step.SIZES["smoke"]
    steps = train_step.steps(rows)
    assert [r["seq"] for r in steps] == list(s.seqs)
    ceiling = train_step.ceiling(rows)
    for r in steps:
        forward = flops.transformer_flops(s.config, s.batch, r["seq"]).forward_matmul_flops
        assert r["flops"] == 3 * forward
        mfu = r["flops"] / r["median_s"] / ceiling
        assert train_step.mfus(rows)[r["seq"]] == pytest.approx(mfu)
    text = train_step.mfu_verdict(rows)
    assert text.startswith("no verdict") or "of the matmul ceiling" in text
