"""The autocast_dtypes experiment (chapter 07, smoke sizes): the dtypes autocast gives on this CPU,
against the seed's."""

import pytest

from mlsys.experiments import autocast_dtypes


@pytest.fixture(scope="module")
def dtype_rows():
    return autocast_dtypes.run(autocast_dtypes.SIZES["smoke"], device="cpu")


def test_autocast_dtypes_on_this_cpu(dtype_rows):
    for dtype in autocast_dtypes.DTYPES:
        assert autocast_dtypes.module(dtype_rows, "toy", dtype, "ln")["output"] == dtype
        assert autocast_dtypes.loss_dtype(dtype_rows, "transformer", dtype) == "fp32"
    check = autocast_dtypes.seed_check(dtype_rows)
    assert check["ln output"] == "measured fp16 (the seed: fp32)"  # CPU autocast differs here
    assert check["loss"] == "measured fp32, as the seed says"
    assert check["gradients"] == "measured fp32, as the seed says"
    table = autocast_dtypes.table(dtype_rows)
    assert len(table.rows) == 2 * 4 + 2
    assert len(autocast_dtypes.table(dtype_rows, model="transformer").rows) > 20
