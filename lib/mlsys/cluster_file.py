"""A cluster described in a JSON file, read into a `hardware.Cluster` (`python -m mlsys plan
--cluster PATH`).

The file holds one object; numbers in SI units (FLOP/s, bytes, bytes/s per direction), dense
peaks (no 2:4 sparsity), "GB" as 1e9 bytes, as `mlsys.hardware` counts them:

    {
      "name": "DGX H100 nodes",                        (optional; default: the file's name)
      "accelerator": {
        "name": "H100 SXM",
        "peak_flop_per_s": {"bf16": ..., "fp8": ...},  (dense FLOP/s, per dtype)
        "hbm_bytes": ...,
        "hbm_bytes_per_s": ...,
        "sm_count": 132,                               (optional)
        "sm_arch": "sm_90",                            (optional: a key of SM_ARCHITECTURES)
        "pcie_bytes_per_s": 64e9                       (optional; default: the NIC's bandwidth)
      },
      "devices_per_node": 8,
      "intra_node_bytes_per_s": 450e9,                 (per device, inside a node: NVLink)
      "nic_bytes_per_s": 50e9,                         (one NIC, across nodes)
      "nics_per_node": 8
    }

The planner's across-node rule (`hardware.Cluster.ring_link`) sees one port per device: a node
of `devices_per_node` devices and `nics_per_node` NICs becomes one port per device of
nic_bytes_per_s x nics_per_node / devices_per_node (the node's egress shared evenly), which is
the NIC itself when there is one per device (DGX A100, DGX H100). `examples/clusters/` holds
files that reproduce the named clusters, with their numbers. A missing field, a field of the
wrong type, a number that is not positive, or a field the reader does not know: a ValueError
naming the field and the file, before anything is built. Pure Python (json). Used by:
`python -m mlsys plan`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mlsys import hardware

TOP_FIELDS = {"name": str, "accelerator": dict, "devices_per_node": int,
              "intra_node_bytes_per_s": float, "nic_bytes_per_s": float, "nics_per_node": int}
"""Fields of the file's object and their types (a float field takes an integer too)."""
ACCELERATOR_FIELDS = {"name": str, "peak_flop_per_s": dict, "hbm_bytes": float,
                      "hbm_bytes_per_s": float, "sm_count": int, "sm_arch": str,
                      "pcie_bytes_per_s": float, "vendor": str}
"""Fields of "accelerator" and their types."""
OPTIONAL = {"name", "accelerator.sm_count", "accelerator.sm_arch", "accelerator.pcie_bytes_per_s",
            "accelerator.vendor"}
"""Fields that may be left out."""


def _field(obj: dict, key: str, kind: type, where: str, path: str) -> Any:
    """obj[key] of type `kind` (int, float or str; numbers positive), or None when optional and
    absent; ValueError naming `where` and `path` otherwise."""
    if key not in obj:
        if where in OPTIONAL:
            return None
        raise ValueError(f"cluster file {path}: field {where!r} is missing")
    value = obj[key]
    numeric = kind in (int, float)
    ok = (isinstance(value, kind) or (kind is float and isinstance(value, int))) and not (
        isinstance(value, bool))
    if not ok:
        want = {int: "an integer", float: "a number", str: "a string", dict: "an object"}[kind]
        raise ValueError(f"cluster file {path}: field {where!r} must be {want}, got {value!r}")
    if numeric and value <= 0:
        raise ValueError(f"cluster file {path}: field {where!r} must be > 0, got {value!r}")
    if kind is str and not value.strip():
        raise ValueError(f"cluster file {path}: field {where!r} must not be empty")
    return float(value) if kind is float else value


def _unknown(obj: dict, known: dict, prefix: str, path: str) -> None:
    extra = sorted(set(obj) - set(known))
    if extra:
        raise ValueError(f"cluster file {path}: unknown field {prefix}{extra[0]!r}; known: "
                         f"{', '.join(prefix + k for k in known)}")


def read_cluster(data: Any, path: str = "<data>") -> hardware.Cluster:
    """The `hardware.Cluster` of a parsed cluster description (the module docstring's object);
    `path` names it in errors."""
    if not isinstance(data, dict):
        raise ValueError(f"cluster file {path}: must hold a JSON object, got "
                         f"{type(data).__name__}")
    _unknown(data, TOP_FIELDS, "", path)
    top = {k: _field(data, k, kind, k, path) for k, kind in TOP_FIELDS.items()}
    acc_in = top["accelerator"]
    _unknown(acc_in, ACCELERATOR_FIELDS, "accelerator.", path)
    acc = {k: _field(acc_in, k, kind, f"accelerator.{k}", path)
           for k, kind in ACCELERATOR_FIELDS.items()}
    peaks = {}
    for dtype in acc["peak_flop_per_s"]:
        peaks[dtype] = _field(acc["peak_flop_per_s"], dtype, float,
                              f"accelerator.peak_flop_per_s.{dtype}", path)
    if not peaks:
        raise ValueError(f"cluster file {path}: field 'accelerator.peak_flop_per_s' must name at "
                         "least one dtype, such as {\"bf16\": <dense FLOP/s>}")
    if acc["sm_arch"] is not None and acc["sm_arch"] not in hardware.SM_ARCHITECTURES:
        raise ValueError(f"cluster file {path}: field 'accelerator.sm_arch' must be one of "
                         f"{', '.join(hardware.SM_ARCHITECTURES)}, got {acc['sm_arch']!r}")
    name = top["name"] or os.path.splitext(os.path.basename(path))[0]
    source = f"cluster file {path}"
    intra = hardware.Link(f"{name}: inside a node", top["intra_node_bytes_per_s"], source)
    per_node, nics = top["devices_per_node"], top["nics_per_node"]
    port = top["nic_bytes_per_s"] * nics / per_node
    inter = hardware.Link(f"{name}: {nics} NICs of {top['nic_bytes_per_s'] / 1e9:g} GB/s per "
                          f"node, {port / 1e9:g} GB/s per device", port, source)
    accelerator = hardware.Accelerator(
        name=acc["name"], vendor=acc["vendor"] or "unknown", dense_flop_per_s=peaks,
        hbm_bytes=acc["hbm_bytes"], hbm_bytes_per_s=acc["hbm_bytes_per_s"], l2_bytes=None,
        smem_per_sm_bytes=None, sm_count=acc["sm_count"],
        interconnect_bytes_per_s=top["intra_node_bytes_per_s"],
        interconnect_name=f"{name}: inside a node",
        pcie_bytes_per_s=acc["pcie_bytes_per_s"] or top["nic_bytes_per_s"],
        notes=f"read from {path}", sources=(source,), sm_arch=acc["sm_arch"])
    return hardware.Cluster(name, accelerator, per_node, intra, inter)


def load_cluster(path: str | os.PathLike) -> hardware.Cluster:
    """The `hardware.Cluster` a JSON file describes (the module docstring); ValueError naming the
    file (and the field) when it is missing, not JSON, or breaks a rule."""
    text_path = os.fspath(path)
    if not os.path.isfile(text_path):
        raise ValueError(f"cluster file {text_path} does not exist")
    try:
        with open(text_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"cluster file {text_path} is not valid JSON: {error}") from None
    return read_cluster(data, text_path)
