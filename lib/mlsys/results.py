"""Recorded measurements, `results/<device-slug>/<experiment>.json` (schema: results/README.md),
and the provenance every measurement carries.

`provenance()` says what produced a number: device, versions, profile, date, git commit and
command line (`REQUIRED_PROVENANCE` are the keys a record must have). Only benchmark entry points
call `write_record`, on real hardware; chapters call `load_records` to plot a recorded GPU run
beside the reader's own measurement. Rules: a record names its profile ("smoke", "cpu" or "gpu")
and device; only full-size GPU records (`is_gpu_record`) are written under `RESULTS_DIR` or read
back from it; an existing record is replaced only with `force`. Used in: measuring chapters,
`mlsys.bench` (every `Timing`), `mlsys.experiments`.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlsys import env

RESULTS_DIR = Path(__file__).resolve().parents[2] / "results"
REQUIRED_PROVENANCE = (
    "device",
    "device_type",
    "profile",
    "torch_version",
    "triton_version",
    "cuda_version",
    "date",
    "git_commit",
    "command",
)
EXPERIMENT_NAME = re.compile(r"[a-z0-9_]+")
"""An experiment's name, also its file's stem: lower-case letters, digits and underscores."""


def git_commit(repo: Path | None = None) -> str:
    """Short commit hash of the checkout (with "+dirty" for uncommitted changes), or "unknown"."""
    cwd = repo or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=cwd, capture_output=True, text=True, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """What produced a measurement: device, versions, profile, date (UTC), commit and command
    line."""
    record: dict[str, Any] = {
        "device": env.device_name(),
        "device_type": env.device(),
        "profile": env.profile(),
        **{f"{k}_version": v for k, v in env.versions().items()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": shlex.join(sys.argv),
    }
    if env.device() == "cuda":
        record["driver_cuda"] = env.versions()["cuda"]
        record["capability"] = env.cuda_capability()
    return record


def device_slug(device_name: str) -> str:
    """File-system name for a device: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string, got {device_name!r}")
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"device_name={device_name!r} has no letters or digits")
    return slug


def _experiment_name(experiment: object) -> str:
    if not isinstance(experiment, str) or not EXPERIMENT_NAME.fullmatch(experiment):
        raise ValueError(f"experiment={experiment!r} must be lower-case letters, digits and "
                         "underscores")
    return experiment


def validate_record(record: dict[str, Any], *, experiment: str | None = None) -> None:
    """Raise ValueError naming the first rule the record breaks (see results/README.md)."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
    for key in ("experiment", "provenance", "results"):
        if key not in record:
            raise ValueError(f"record lacks the key {key!r}")
    _experiment_name(record["experiment"])
    if experiment is not None and record["experiment"] != _experiment_name(experiment):
        raise ValueError(f"record says experiment={record['experiment']!r} but its file is "
                         f"{experiment!r}")
    provenance = record["provenance"]
    if not isinstance(provenance, dict):
        raise ValueError(f"provenance must be a JSON object, got {type(provenance).__name__}")
    missing = [k for k in REQUIRED_PROVENANCE if k not in provenance or provenance[k] == ""]
    if missing:
        raise ValueError(f"provenance lacks {', '.join(missing)}")
    for key in REQUIRED_PROVENANCE:
        if not isinstance(provenance[key], str):
            raise ValueError(f"provenance[{key!r}] must be a string, got {provenance[key]!r} "
                             f"({type(provenance[key]).__name__})")
    if provenance["profile"] not in env.PROFILES:
        raise ValueError(f"provenance['profile']={provenance['profile']!r} must be one of "
                         f"{', '.join(env.PROFILES)}")
    if not isinstance(record["results"], list) or not record["results"]:
        raise ValueError("results must be a non-empty list of measurement records")
    if not all(isinstance(r, dict) for r in record["results"]):
        raise ValueError("every entry of results must be an object")


def is_gpu_record(provenance: Mapping[str, Any]) -> bool:
    """Is this the provenance of a full-size GPU run (profile "gpu", device_type "cuda")? Only
    such records belong under RESULTS_DIR."""
    return provenance.get("profile") == "gpu" and provenance.get("device_type") == "cuda"


def validate_gpu_record(record: dict[str, Any], *, experiment: str | None = None) -> None:
    """`validate_record`, and a full-size GPU run (`is_gpu_record`): the rule of RESULTS_DIR."""
    validate_record(record, experiment=experiment)
    provenance = record["provenance"]
    if not is_gpu_record(provenance):
        raise ValueError(f"record has profile={provenance['profile']!r} and device_type="
                         f"{provenance['device_type']!r}; {RESULTS_DIR.name}/ holds only "
                         "full-size GPU records (profile 'gpu', device_type 'cuda')")


def check_destination(path: Path, provenance: Mapping[str, Any], *, force: bool = False) -> None:
    """Raise before a record with `provenance` is written at `path`: ValueError if it is not a
    full-size GPU run and `path` lies under RESULTS_DIR, FileExistsError if `path` exists and
    not `force`."""
    path = Path(path).resolve()
    root = RESULTS_DIR.resolve()
    if (root == path or root in path.parents) and not is_gpu_record(provenance):
        raise ValueError(f"a record with profile={provenance.get('profile')!r} on "
                         f"{provenance.get('device')!r} (device_type="
                         f"{provenance.get('device_type')!r}) cannot go under {root}: it holds "
                         "only full-size GPU records; pass --out DIR to write it elsewhere")
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")


def write_record(
    experiment: str, results: list[dict[str, Any]], provenance: dict[str, Any], *,
    force: bool = False,
) -> Path:
    """Write `results/<device-slug>/<experiment>.json`; for benchmark entry points on real
    hardware. Checked first (nothing is written otherwise): a valid record, of a full-size GPU
    run, replacing an existing file only with `force` (`check_destination`)."""
    record = {"experiment": _experiment_name(experiment), "provenance": provenance,
              "results": results}
    validate_record(record)
    path = RESULTS_DIR / device_slug(provenance["device"]) / f"{experiment}.json"
    check_destination(path, provenance, force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def load_records(experiment: str) -> list[dict[str, Any]]:
    """Every full-size GPU record of `experiment`, one per device folder, validated; [] if none.
    Any other record there is skipped (tests/test_results.py refuses it)."""
    records = []
    for path in sorted(RESULTS_DIR.glob(f"*/{_experiment_name(experiment)}.json")):
        record = json.loads(path.read_text())
        validate_record(record, experiment=experiment)
        if is_gpu_record(record["provenance"]):
            records.append(record)
    return records
