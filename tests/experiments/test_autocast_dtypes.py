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


def test_the_map_of_the_live_run_and_of_a_record(dtype_rows):
    m = autocast_dtypes.dtype_map(dtype_rows, dtype="fp16")
    modules = sum(len(paths) for paths in autocast_dtypes.MAP_MODULES.values())
    assert len(m) == modules + 2  # and one loss per model
    assert m["toy fc1 (Linear)"] == {"weights": "fp32", "matmul reads": "fp16", "output": "fp16",
                                     "weight grads stored/values": "fp32/fp16"}
    assert m["toy ln (LayerNorm)"]["output"] == "fp16"  # this CPU's list: ln follows its input
    assert m["LM loss"] == {"weights": "-", "matmul reads": "-", "output": "fp32",
                            "weight grads stored/values": "-"}
    record = {"provenance": {"device": "NVIDIA H200"}, "results": dtype_rows}
    panels = autocast_dtypes.map_panels(dtype_rows, [record])
    assert list(panels) == ["cpu (live, fp16 autocast)", "NVIDIA H200 (recorded)"]
    assert panels["NVIDIA H200 (recorded)"] == m
    with pytest.raises(ValueError, match="dtype='fp8' is not one of"):
        autocast_dtypes.dtype_map(dtype_rows, dtype="fp8")
