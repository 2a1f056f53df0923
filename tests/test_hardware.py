"""mlsys.hardware: the accelerators' specs, links and clusters, the device-name match, and
the argument checks."""

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


FIELDS = {f.name: getattr(hardware.H100_SXM, f.name) for f in dataclasses.fields(Accelerator)}


def _spec(**changes):
    return lambda: Accelerator(**{**FIELDS, **changes})


INVALID_CALLS = [  # (call, error, message fragment)
    (_spec(hbm_bytes_per_s=0), ValueError, "H100 SXM: hbm_bytes_per_s must be > 0"),
    (_spec(hbm_bytes=float("nan")), ValueError, "hbm_bytes must be finite"),
    (_spec(pcie_bytes_per_s="64e9"), TypeError, "pcie_bytes_per_s must be a real number"),
    (_spec(sm_count=1.5), TypeError, "sm_count must be an integer"),
    (_spec(l2_bytes=-1), ValueError, "l2_bytes must be > 0"),
    (_spec(dense_flop_per_s={}), TypeError, "dense_flop_per_s must be a non-empty dict"),
    (_spec(dense_flop_per_s={"bf16": 0}), ValueError, r"dense_flop_per_s\['bf16'\] must be > 0"),
    (_spec(name=""), TypeError, "name must be a non-empty string"),
    (_spec(vendor=None), TypeError, "vendor must be a non-empty string"),
    (lambda: hardware.get(None), TypeError, "name must be a registry key such as 'h100', got None"),
    (lambda: hardware.get(3), TypeError, "name must be a registry key"),
    (lambda: hardware.get("v100"), ValueError, "name='v100'"),
    (lambda: hardware.match_device_name(None), TypeError, "device_name must be a string"),
    (lambda: hardware.match_device_name(b"NVIDIA H200"), TypeError, "device_name must be a str"),
    (lambda: hardware.match_report(0), TypeError, "device_name must be a string"),
    (lambda: hardware.H100_SXM.peak_flop_per_s(None), TypeError, "dtype must be a name"),
    (lambda: hardware.H100_SXM.peak_flop_per_s(["bf16"]), TypeError, "dtype must be a name"),
    (lambda: hardware.A100_80GB_SXM.peak_flop_per_s("fp8"), ValueError, "A100.*fp8"),
    (lambda: hardware.H100_SXM.ridge_intensity("int4"), ValueError, "no dense peak"),
    (lambda: hardware.TPU_V5P.sparse_flop_per_s("bf16"), ValueError, "NVIDIA"),
    (lambda: hardware.get_cluster("dgx-v100"), ValueError, "cluster='dgx-v100'"),
    (lambda: hardware.get_cluster("tpu-v5p").ring_link(10_000), ValueError, "does not fit"),
    (lambda: hardware.get_cluster("tpu-v5p").send_link(10_000), ValueError, "does not fit"),
    (lambda: hardware.get_cluster("dgx-h100").ring_link(16, stride=0), ValueError,
     "stride must be a positive integer"),
    (lambda: hardware.get_cluster("dgx-h100").ring_link(0), ValueError,
     "n_ranks must be a positive"),
    (lambda: hardware.get_cluster("dgx-h100").send_link(1.5), TypeError, "span must be"),
    (lambda: hardware.get_cluster("dgx-h100").group_link([]), ValueError, "at least one rank"),
    (lambda: hardware.get_cluster("dgx-h100").group_link([0, -8]), ValueError,
     r"ranks\[1\] must be an integer >= 0"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        (" NVIDIA B200\n", "b200"),  # surrounding spaces are ignored
        ("NVIDIA H100 PCIe", None),  # lower clocks and bandwidth than the SXM part: not matched
        ("NVIDIA GeForce RTX 4090", None),
        # contain the name of a part in the table, but are other parts: no spec is borrowed
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA A100-SXM4-40GB", None),
        ("nvidia h100 80gb hbm3", None),  # exact names: torch reports this one capitalized
    ],
)
def test_device_name_matching(device_name, key):
    expected = None if key is None else ACCELERATORS[key]
    assert hardware.match_device_name(device_name) is expected
    report = hardware.match_report(device_name)
    if key is None:
        assert report.endswith("; no spec is used") and "is not in the table" in report
    else:
        assert f"is the {expected.name} of mlsys.hardware" in report


def test_every_exact_name_points_into_the_registry():
    assert set(hardware.CUDA_DEVICE_NAMES.values()) <= set(ACCELERATORS)


@pytest.mark.parametrize(
    ("device_name", "reason"),
    [
        ("NVIDIA H200 NVL", "an NVL part has other clocks and links than the SXM part"),
        ("NVIDIA GH200 480GB", "a Grace Hopper superchip"),
        ("NVIDIA A100 80GB PCIe", "a PCIe card has lower clocks"),
        ("NVIDIA A100-SXM4-40GB", "the 40 GB part"),
        ("Tesla V100-SXM2-16GB", "the table holds only NVIDIA H100 80GB HBM3"),
    ],
)
def test_match_report_says_why_no_spec_is_used(device_name, reason):
    report = hardware.match_report(device_name)
    assert report.startswith(f"{device_name} is not in the table: ") and reason in report
    if device_name == "NVIDIA H200 NVL":
        assert report == ("NVIDIA H200 NVL is not in the table: an NVL part has other clocks and "
                          "links than the SXM part; no spec is used")


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


@pytest.mark.parametrize("key", list(hardware.LINKS))
def test_every_link_has_a_source_and_a_per_direction_figure(key):
    link = hardware.LINKS[key]
    assert link.source.startswith("https://") and link.name
    assert 1e10 <= link.bytes_per_s <= 1e12  # per direction: 25 GB/s (IB HDR) to 900 GB/s


def test_clusters_use_their_accelerators_links():
    for key, cluster in hardware.CLUSTERS.items():
        assert cluster.intra_node.bytes_per_s == cluster.accelerator.interconnect_bytes_per_s, key
        assert cluster.ring_link(cluster.per_node) is cluster.intra_node
    dgx = hardware.get_cluster("dgx-a100")
    assert dgx.ring_link(9) is hardware.LINKS["ib-hdr"]  # the ninth GPU's node: one port
    assert hardware.LINKS["nvlink4"].bytes_per_s * 2 == 900e9  # NVIDIA's "900 GB/s" is both ways
    with pytest.raises(ValueError, match="cluster='dgx-v100' is not one of"):
        hardware.get_cluster("dgx-v100")
    with pytest.raises(TypeError, match="must be Links"):
        hardware.Cluster("x", hardware.H100_SXM, 8, "NVLink", None)


def test_a_ring_across_nodes_runs_at_the_ports_it_has_in_each_node():
    """Cross-node collectives cost at the node's egress: the Scaling Book, "How to Think About
    GPUs" (https://jax-ml.github.io/scaling-book/gpus/), W_node = 8 x 400 Gb/s = 400 GB/s per
    DGX H100 node; NCCL runs one ring per NIC, each leaving the node through another GPU's port."""
    dgx = hardware.get_cluster("dgx-h100")
    port = hardware.LINKS["ib-ndr"].bytes_per_s
    whole = dgx.ring_link(16)  # two whole nodes
    assert whole.bytes_per_s == 8 * port == 400e9 and "egress" in whole.name
    assert dgx.ring_link(1024).bytes_per_s == 400e9  # the egress does not fall with more nodes
    assert dgx.ring_link(12).bytes_per_s == 4 * port  # the second node holds 4 of the ring
    assert dgx.ring_link(16, stride=8) is hardware.LINKS["ib-ndr"]  # one GPU per node: one port
    assert dgx.ring_link(32, stride=4).bytes_per_s == 2 * port  # tp = 4 inside: 2 per node
    assert dgx.ring_link(4, stride=2) is dgx.intra_node  # spans 7 ranks: still one node
    assert dgx.send_link(16) is hardware.LINKS["ib-ndr"] and dgx.send_link(8) is dgx.intra_node
    assert dgx.group_link([6, 7, 8]) is hardware.LINKS["ib-ndr"]  # straddles: 1 rank in node 1
    assert dgx.group_link(range(8, 24)).bytes_per_s == 8 * port  # nodes 1 and 2, whole
    assert dgx.group_link([3, 4, 5]) is dgx.intra_node
    a100 = hardware.get_cluster("dgx-a100")  # 8 x 25 GB/s = 200 GB/s, under NVLink 3's 300
    assert a100.ring_link(64).bytes_per_s == 200e9
    fat = hardware.Cluster("8 ports of 100 GB/s", hardware.H100_SXM, 8, hardware.LINKS["nvlink4"],
                           hardware.Link("fast NIC", 100e9, "https://example.org"))
    assert fat.ring_link(16).bytes_per_s == 450e9  # 8 x 100 GB/s, capped by NVLink 4 inside


def test_sm_architectures_hold_the_programming_guides_limits():
    sm80, sm89, sm90 = (hardware.sm_architecture(n) for n in ("sm_80", "sm_89", "sm_90"))
    for sm in (sm80, sm89, sm90):
        assert sm.registers_per_sm == 65536 and sm.max_registers_per_thread == 255
        assert sm.shared_per_sm_bytes - sm.shared_per_block_bytes == 1024  # the reserved KiB
    # Triton's launcher refuses a block past these (the opt-in maximum per block)
    assert (sm80.shared_per_block_bytes, sm90.shared_per_block_bytes) == (166_912, 232_448)
    assert (sm80.max_warps_per_sm, sm89.max_warps_per_sm, sm90.max_warps_per_sm) == (64, 48, 64)
    assert hardware.A100_80GB_SXM.sm_arch == "sm_80" and hardware.H100_SXM.sm_arch == "sm_90"
    assert hardware.H100_SXM.smem_per_sm_bytes == sm90.shared_per_sm_bytes
    with pytest.raises(ValueError, match="name='sm_100' is not one of"):
        hardware.sm_architecture("sm_100")
    with pytest.raises(ValueError, match="sm_arch='sm_99' is not one of"):
        dataclasses.replace(hardware.H100_SXM, sm_arch="sm_99")


def test_the_step_constants_are_fractions_with_their_source():
    c = hardware.STEP_CONSTANTS
    for name in ("gemm_fraction", "hbm_fraction", "nccl_fraction"):
        assert 0.5 <= getattr(c, name) < 1.0
    assert "Table 1" in c.source and 0 < c.intra_latency_s < c.inter_latency_s < 1e-4
    for bad, message in (({"gemm_fraction": 0.0}, "gemm_fraction must be > 0"),
                         ({"nccl_fraction": 1.5}, "nccl_fraction"),
                         ({"inter_latency_s": -1.0}, "inter_latency_s")):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(c, **bad)


def test_gemm_tiles_and_flash_fractions():
    assert all(m % 64 == 0 and n % 64 == 0 for m, n in hardware.GEMM_TILES)
    assert hardware.flash_fraction(hardware.A100_80GB_SXM) == 0.60
    assert hardware.flash_fraction(hardware.H100_SXM) == 0.50
    assert hardware.flash_fraction(hardware.TPU_V5P) == 0.50  # no sm_arch: the default
    with pytest.raises(TypeError, match="Accelerator"):
        hardware.flash_fraction("h100")
