"""The autocast_dtypes experiment (chapter 07, smoke sizes): the dtypes autocast gives on this CPU,
against the seed's."""

import pytest
import torch

from mlsys import experiments
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


@pytest.fixture(scope="module")
def op_rows():
    return (autocast_dtypes.op_lists("fp16", device_type="cpu")
            + autocast_dtypes.op_lists("fp16", device_type="cuda"))


def test_autocast_op_lists_asked_of_torch(op_rows):
    """CUDA's lists (fake tensors where there is no GPU) against torch's documented ones: the
    autocast op reference, https://pytorch.org/docs/stable/amp.html#autocast-op-reference."""
    lists = {(r["device_type"], r["op"]): r["list"] for r in op_rows}
    for op in ("linear", "matmul"):
        assert lists[("cuda", op)] == lists[("cpu", op)] == "lower precision"
    for op in ("layer_norm", "softmax", "cross_entropy", "sum", "exp", "log"):
        assert lists[("cuda", op)] == "fp32", op
    for op in ("batch_norm", "mean", "add", "mul", "relu", "gelu"):
        assert lists[("cuda", op)] == lists[("cpu", op)] == "none", op
    assert lists[("cuda", "addcmul")] == "promote" and lists[("cpu", "cat")] == "promote"
    assert lists[("cpu", "layer_norm")] == "none"  # the CPU's list leaves it to its input
    cuda = [r for r in op_rows if r["device_type"] == "cuda"]
    assert {r["tensors"] for r in cuda} == {"real" if torch.cuda.is_available() else "fake"}
    assert not torch.is_autocast_enabled("cuda")  # switched back off
    table = autocast_dtypes.op_table(op_rows)
    assert len(table.rows) == len(autocast_dtypes.OPS) and len(table.header) == 4
    assert autocast_dtypes.members(op_rows, "cuda", "promote") == "`addcmul`"


def test_the_seeds_lists_against_torchs(op_rows):
    wrong = autocast_dtypes.seed_list_errors(op_rows)
    assert wrong == {"batch_norm": ("fp32", "none"), "mean": ("fp32", "none"),
                     **{op: ("promote", "none") for op in ("add", "mul", "relu", "gelu")}}
    assert autocast_dtypes.seed_list_right(op_rows) == (
        "`linear`, `matmul`, `layer_norm`, `softmax`, `cross_entropy`, `sum`, `exp`, `log`")


def test_the_lists_explain_the_recorded_map(op_rows, dtype_rows):
    live = autocast_dtypes.op_lists("fp16", device_type="cpu") + autocast_dtypes.op_lists(
        "bf16", device_type="cpu")
    assert autocast_dtypes.op_record_agreement(live, dtype_rows) == []
    for record in experiments.recorded("autocast_dtypes"):
        assert autocast_dtypes.op_record_agreement(op_rows, record["results"]) == []
    fake = [dict(r) for r in dtype_rows]
    for r in fake:  # a record whose LayerNorm followed its input on a GPU would contradict
        r["device_type"] = "cuda"
    assert autocast_dtypes.op_record_agreement(op_rows, fake) == [
        "toy ln under fp16: recorded fp16, the fp32 list gives fp32"]


def test_op_lists_refuse_bad_arguments():
    with pytest.raises(ValueError, match="dtype='fp8' is not one of"):
        autocast_dtypes.op_lists("fp8")
    with pytest.raises(ValueError, match="device_type='tpu' is not one of"):
        autocast_dtypes.op_lists(device_type="tpu")
    with pytest.raises(ValueError, match=r"ops\[0\]='conv9d' is not one of"):
        autocast_dtypes.op_lists(ops=("conv9d",))
    with pytest.raises(ValueError, match="listed='fp64' is not one of"):
        autocast_dtypes.members([], "cuda", "fp64")
