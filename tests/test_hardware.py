import dataclasses
import math

import pytest

from mlsys import hardware
from mlsys.hardware import ACCELERATORS, Accelerator


@pytest.mark.parametrize("key", list(ACCELERATORS))
def test_every_spec_is_complete_and_consistent(key):
    acc = ACCELERATORS[key]
    assert acc.sources, f"{key} has no source"
    assert "bf16" in acc.dense_flop_per_s
    assert 1e9 < acc.hbm_bytes < 1e12
    assert 1e11 < acc.hbm_bytes_per_s < 1e14
    for rate in acc.dense_flop_per_s.values():
        assert 1e12 < rate < 1e17
    assert acc.interconnect_bytes_per_s > acc.pcie_bytes_per_s


@pytest.mark.parametrize("key", [k for k, a in ACCELERATORS.items() if a.vendor == "NVIDIA"])
def test_nvidia_ordering_of_dtype_peaks(key):
    peaks = ACCELERATORS[key].dense_flop_per_s
    assert peaks["fp16"] == peaks["bf16"]
    assert math.isclose(peaks["bf16"], 2 * peaks["tf32"], rel_tol=0.03)
    assert peaks["tf32"] > peaks["fp32"]
    if "fp8" in peaks:
        assert math.isclose(peaks["fp8"], 2 * peaks["bf16"], rel_tol=0.01)


def test_h100_dense_versus_sparse():
    h100 = hardware.H100_SXM
    # The spec sheet headlines 1,979 TFLOP/s bf16: that is with 2:4 sparsity; dense is half.
    assert round(h100.sparse_flop_per_s("bf16") / 1e12) == 1979
    assert round(h100.peak_flop_per_s("bf16") / 1e12) == 989


def test_a100_fp16_ridge_point():
    # 312 TFLOP/s over 2,039 GB/s: 153 FLOP per byte (156 with the rounded "2 TB/s").
    assert 150 < hardware.A100_80GB_SXM.ridge_intensity("fp16") < 160


def test_h200_is_an_h100_with_more_memory():
    h100, h200 = hardware.H100_SXM, hardware.H200_SXM
    assert h200.dense_flop_per_s == h100.dense_flop_per_s
    assert h200.hbm_bytes > h100.hbm_bytes and h200.hbm_bytes_per_s > h100.hbm_bytes_per_s


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.H100_SXM.hbm_bytes = 1  # type: ignore[misc]


def test_unknown_dtype_and_name_are_clear_errors():
    with pytest.raises(ValueError, match="A100.*fp8"):
        hardware.A100_80GB_SXM.peak_flop_per_s("fp8")
    with pytest.raises(ValueError, match="name='v100'"):
        hardware.get("v100")
    with pytest.raises(ValueError, match="NVIDIA"):
        hardware.TPU_V5P.sparse_flop_per_s("bf16")


def test_invalid_spec_is_rejected():
    fields = {f.name: getattr(hardware.H100_SXM, f.name) for f in dataclasses.fields(Accelerator)}
    with pytest.raises(ValueError, match="hbm_bytes_per_s"):
        Accelerator(**{**fields, "hbm_bytes_per_s": 0})


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA H100 PCIe", None),  # lower clocks and bandwidth than the SXM part: not matched
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_device_name_matching(device_name, key):
    expected = None if key is None else ACCELERATORS[key]
    assert hardware.match_device_name(device_name) is expected


def test_detect_on_this_machine():
    import torch

    if not torch.cuda.is_available():
        assert hardware.detect() is None
    else:
        assert hardware.detect() is hardware.match_device_name(torch.cuda.get_device_name())


def test_peak_numbers_live_only_in_hardware_py():
    """The design's rule: no hard-coded peak figures outside lib/mlsys/hardware.py."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    forbidden = ("312e12", "989e12", "3.35e12", "80e9", "989.4e12", "2039e9")
    offenders = []
    for folder in ("lib", "notebooks", "book"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in (".py", ".md") or path.name == "hardware.py":
                continue
            text = path.read_text(encoding="utf-8")
            offenders += [f"{path.relative_to(root)}: {n}" for n in forbidden if n in text]
    assert not offenders, offenders
