"""The tiles a kernel may launch with: its candidates, minus those the compile report removed.

`mlsys.kernels.compile_report` compiles every candidate tile of every kernel for sm_80 and sm_90
and judges each one (`aot.verdict`): a tile that spills registers, overflows shared memory, fails
to compile or (16-bit flash) misses the tensor cores is removed. The autotuners' pruning functions
(`row_tiles.keep_row_tiles`, `flash_tiles.keep_tiles`) ask `removed` here, so those tiles are
never timed, and never chosen. The report is the committed `compile_report.json` beside this
module, written only by `python -m mlsys.kernels.compile_report` (`make compile-report`).

A device whose target the report lacks borrows the nearest one's judgement: sm_80's below compute
capability 9.0 (sm_86, sm_89: the same mma.sync code), sm_90's from 9.0 up. Used in: chapters 04
and 06 (through the kernels' autotuners).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from mlsys import checks

REPORT_PATH = Path(__file__).with_name("compile_report.json")
"""The committed compile report (written only by `python -m mlsys.kernels.compile_report`)."""

SAME_AS = {"fp16": "bf16"}
"""fp16 borrows bf16's judgement: the same 16-bit loads, stores and tensor-core shapes (the report
compiles bf16 only)."""

Tile = tuple[tuple[tuple[str, int], ...], int, int]
"""A tile as the report keys it: (sorted constexpr items, num_warps, num_stages)."""


def tile_key(tile: dict[str, int], num_warps: int, num_stages: int) -> Tile:
    return tuple(sorted(tile.items())), num_warps, num_stages


def report_target(capability: int) -> str:
    """The report's target that judges a device of compute capability `capability` x 10 (86)."""
    checks.positive_int(capability, "capability")
    return "sm_90" if capability >= 90 else "sm_80"


@functools.cache
def _report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"columns": [], "rows": []}


def removed(kernel: str, dtype: str, target: str, *, path: Path = REPORT_PATH,
            **problem: Any) -> dict[Tile, str]:
    """Tile -> why it was removed, for `kernel` ("softmax.fwd"), input `dtype` ("bf16") and
    `target` ("sm_90"), over every report entry whose problem has the given items (e.g.
    head_dim=128: removed if it was removed with or without a causal mask). {} if none, or if the
    report has no such entry."""
    report = _report(Path(path))
    dtype = SAME_AS.get(dtype, dtype)
    col = {name: i for i, name in enumerate(report["columns"])}
    out: dict[Tile, str] = {}
    for row in report["rows"]:
        if (row[col["kernel"]], row[col["dtype"]], row[col["target"]]) != (kernel, dtype, target):
            continue
        if any(row[col["problem"]].get(k) != v for k, v in problem.items()):
            continue
        if row[col["verdict"]] != "kept":
            key = tile_key(row[col["tile"]], row[col["num_warps"]], row[col["num_stages"]])
            out.setdefault(key, row[col["verdict"]])
    return out


def device_target(device: Any) -> str:
    """The report target of a CUDA device (a torch.device or index)."""
    major, minor = torch.cuda.get_device_capability(device)
    return report_target(10 * major + minor)
