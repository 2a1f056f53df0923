"""mlsys.cluster_file: a cluster read from JSON equals the named one in every number the planner
reads; every bad file is a ValueError naming the field and the file."""

import json
import pathlib

import pytest

from mlsys import hardware
from mlsys.cluster_file import load_cluster, read_cluster

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _numbers(cluster: hardware.Cluster) -> dict:
    """What the planner reads of a cluster: peaks, memory, SMs, node size and the links."""
    acc = cluster.accelerator
    return {"peaks": acc.dense_flop_per_s, "hbm": acc.hbm_bytes, "hbm_bw": acc.hbm_bytes_per_s,
            "sms": acc.sm_count, "sm_arch": acc.sm_arch, "per_node": cluster.per_node,
            "intra": cluster.intra_node.bytes_per_s, "inter": cluster.inter_node.bytes_per_s,
            "interconnect": acc.interconnect_bytes_per_s, "pcie": acc.pcie_bytes_per_s,
            # the across-node rule, on groups of every kind
            "rings": [cluster.ring_link(n, stride=s).bytes_per_s
                      for n in (2, 8, 16, 64) for s in (1, 8)],
            "send": [cluster.send_link(n).bytes_per_s for n in (2, 8, 9, 64)]}


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100"])
def test_the_example_files_reproduce_the_named_clusters(name):
    read = load_cluster(EXAMPLES / f"{name}.json")
    assert _numbers(read) == _numbers(hardware.get_cluster(name))
    assert read.name == hardware.get_cluster(name).name


def _write(tmp_path, data) -> pathlib.Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    return path


def _h100() -> dict:
    return json.loads((EXAMPLES / "dgx-h100.json").read_text())


def test_fewer_nics_than_devices_share_the_nodes_egress(tmp_path):
    data = _h100()
    data.update(nic_bytes_per_s=100e9, nics_per_node=4)  # 4 x 100 GB/s = 400 GB/s per node
    cluster = load_cluster(_write(tmp_path, data))
    assert cluster.inter_node.bytes_per_s == 100e9 * 4 / 8
    assert cluster.ring_link(16).bytes_per_s == 400e9  # whole nodes: the node's egress
    del data["name"], data["accelerator"]["sm_count"]  # optional fields
    cluster = load_cluster(_write(tmp_path, data))
    assert cluster.name == "cluster" and cluster.accelerator.sm_count is None


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("devices_per_node"), "field 'devices_per_node' is missing"),
    (lambda d: d.pop("nics_per_node"), "field 'nics_per_node' is missing"),
    (lambda d: d["accelerator"].pop("hbm_bytes"), "field 'accelerator.hbm_bytes' is missing"),
    (lambda d: d["accelerator"].pop("peak_flop_per_s"),
     "field 'accelerator.peak_flop_per_s' is missing"),
    (lambda d: d.update(devices_per_node=8.5),
     "field 'devices_per_node' must be an integer, got 8.5"),
    (lambda d: d.update(nic_bytes_per_s="50 GB/s"),
     "field 'nic_bytes_per_s' must be a number, got '50 GB/s'"),
    (lambda d: d.update(intra_node_bytes_per_s=True),
     "field 'intra_node_bytes_per_s' must be a number, got True"),
    (lambda d: d.update(nic_bytes_per_s=0), "field 'nic_bytes_per_s' must be > 0, got 0"),
    (lambda d: d["accelerator"]["peak_flop_per_s"].update(bf16=-1.0),
     "field 'accelerator.peak_flop_per_s.bf16' must be > 0"),
    (lambda d: d["accelerator"].update(peak_flop_per_s={}), "must name at least one dtype"),
    (lambda d: d["accelerator"].update(sm_arch="sm_99"), "'accelerator.sm_arch' must be one of"),
    (lambda d: d.update(nic_bw=50e9), "unknown field 'nic_bw'; known: name, accelerator"),
    (lambda d: d.update(accelerator=[]), "field 'accelerator' must be an object"),
])
def test_a_bad_field_is_named_with_the_file(tmp_path, change, message):
    data = _h100()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match="cluster file .*cluster.json") as error:
        load_cluster(path)
    assert message in str(error.value)


def test_a_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"cluster file .*nope.json does not exist"):
        load_cluster(tmp_path / "nope.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{\"name\": ")
    with pytest.raises(ValueError, match=r"cluster file .*broken.json is not valid JSON"):
        load_cluster(broken)
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        read_cluster([1, 2], "list.json")
