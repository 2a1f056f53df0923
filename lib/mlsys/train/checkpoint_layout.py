"""A checkpoint on disk: one directory per step, the commit marker, the latest complete step, and
the refusal of another model's checkpoint, read from its index alone.

    ckpt_dir/step_00000012/  .metadata        DCP's index, written LAST by the coordinator: the
                                              commit marker (no .metadata = not a checkpoint)
                             __<rank>_0.distcp each rank's shards, written in place by DCP
                             checkpoint.json  step, world size, model config, `extra`; written
                                              (temp file + rename) by rank 0 BEFORE dcp.save

A complete step directory is never written again; one left without `.metadata` by a killed save
is no checkpoint. `latest` picks the highest complete step; `check_compatible` compares a model's
config and shapes with what a checkpoint holds, reading only `.metadata` and `checkpoint.json` (no
process group, no tensor data), so the entry point refuses a checkpoint before any group forms.
Writing and reading the tensors is `mlsys.train.checkpoint` (DCP). Reference:
https://pytorch.org/docs/stable/distributed.checkpoint.html (`FileSystemReader`). Used in:
chapter 10 (§sec-cluster).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from mlsys import checks
from mlsys.models.transformer import Transformer

MARKER = ".metadata"
INFO = "checkpoint.json"
IGNORED_CONFIG_FIELDS = ("attention",)
"""Config fields that change how the model computes, not its weights: not compared on load."""
_STEP = re.compile(r"step_(\d+)")
_SHOWN = 8  # keys listed per kind of difference in an error


class CheckpointError(ValueError):
    """Not a complete checkpoint, or one of another model."""


def step_dir(ckpt_dir: str | os.PathLike, step: int) -> Path:
    """`ckpt_dir/step_<step, 8 digits>`."""
    return Path(ckpt_dir) / f"step_{checks.nonnegative_int(step, 'step'):08d}"


def is_complete(path: str | os.PathLike) -> bool:
    """True when `path` holds DCP's `.metadata` (written last, so the save finished)."""
    return (Path(path) / MARKER).is_file()


def complete(path: object) -> Path:
    """`path` as a Path if it is a complete checkpoint; CheckpointError saying why not."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"path={str(path)!r} is not a checkpoint directory (it does not "
                              "exist or is a file)")
    if not is_complete(path) or not (path / INFO).is_file():
        raise CheckpointError(f"path={str(path)!r} is not a complete checkpoint: no {MARKER} or "
                              f"{INFO} (its save did not finish); use latest(ckpt_dir)")
    return path


def json_path(value: object, where: str) -> str | None:
    """Where in `value` something does not survive JSON unchanged (None if nothing)."""
    if value is None or isinstance(value, (str, bool, int, float)):  # NaN, inf: JSON's too
        return None
    if isinstance(value, dict) and (bad := [k for k in value if not isinstance(k, str)]):
        return f"{where} (key {bad[0]!r} is not a str)"
    if isinstance(value, (list, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return next((p for k, v in items if (p := json_path(v, f"{where}[{k!r}]"))), None)
    return f"{where} ({type(value).__name__})"


def atomic(path: Path, write) -> None:
    """`write(file)` into a temp file beside `path`, synced, then renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes it private
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def json_writer(obj: object):
    """A `write(file)` for `atomic` that writes `obj` as indented JSON."""
    return lambda f: f.write(json.dumps(obj, indent=1).encode())


def check_writable(ckpt_dir: str | os.PathLike) -> Path:
    """Create `ckpt_dir` if needed and write a probe file in it; PermissionError if either
    fails. Call it before any process-group work."""
    if not isinstance(ckpt_dir, (str, os.PathLike)):
        raise TypeError(f"ckpt_dir must be a str or os.PathLike, got {type(ckpt_dir).__name__}")
    path = Path(ckpt_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".writable."):
            pass
    except OSError as error:
        raise PermissionError(f"ckpt_dir={str(path)!r} is not a writable directory: "
                              f"{error.strerror or error}") from None
    return path


def latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """The highest `step_*` directory of `ckpt_dir` that holds `.metadata`; None if none."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP.fullmatch(p.name)) and is_complete(p)]
    return max(steps)[1] if steps else None


def model_shapes(model: object) -> dict[str, tuple[int, ...]]:
    """Global shape of every state-dict entry of `model` (DTensors by their full shape), or of a
    `Transformer` of config `model` built on the meta device (nothing allocated)."""
    if not isinstance(model, nn.Module):
        with torch.device("meta"):
            model = Transformer(model)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def read_metadata(path: Path) -> dict:
    """DCP's index of a checkpoint: state-dict key -> its metadata (sizes, dtypes)."""
    return FileSystemReader(path).read_metadata().state_dict_metadata


def model_entries(metadata: dict) -> dict:
    """`model.<fqn>` tensor entries of DCP's metadata, by fqn."""
    return {k[len("model."):]: m for k, m in metadata.items()
            if k.startswith("model.") and hasattr(m, "size")}


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" ... and {len(items) - _SHOWN} more"
                                        if len(items) > _SHOWN else "")


def differences(path: Path, shapes: dict, config: dict | None, part: bool = False) -> list[str]:
    """What differs between the checkpoint at `path` and a model of `shapes` (and `config`);
    `part`: the model may be a part (a pipeline stage): no unexpected keys."""
    saved = {k: tuple(m.size) for k, m in model_entries(read_metadata(path)).items()}
    out, theirs = [], json.loads((path / INFO).read_text()).get("model_config")
    if config is not None and theirs is not None:
        fields = sorted((set(config) | set(theirs)) - set(IGNORED_CONFIG_FIELDS))
        diff = [f"{k}: checkpoint {theirs.get(k, '<absent>')!r}, this run "
                f"{config.get(k, '<absent>')!r}" for k in fields if theirs.get(k) != config.get(k)]
        if diff:
            out.append("config fields that differ: " + "; ".join(diff))
    if missing := sorted(set(shapes) - set(saved)):
        out.append(f"missing keys (in the model, not the checkpoint): {_listed(missing)}")
    if not part and (unexpected := sorted(set(saved) - set(shapes))):
        out.append(f"unexpected keys (in the checkpoint, not the model): {_listed(unexpected)}")
    if shaped := [f"{k}: checkpoint {saved[k]}, model {tuple(shapes[k])}"
                  for k in sorted(set(saved) & set(shapes)) if saved[k] != tuple(shapes[k])]:
        out.append(f"different shapes: {_listed(shaped)}")
    return out


def check_compatible(path: str | os.PathLike, model_config: dict | None,
                     shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse (CheckpointError naming fields, keys and shapes) a checkpoint of another model.

    Reads only `.metadata` and `checkpoint.json`: no process group, no tensor data. `shapes`:
    `model_shapes(model)`, e.g. of the model built on the meta device; `model_config`: a dict
    such as `dataclasses.asdict(config)` (None: compare shapes only)."""
    path = complete(path)
    if not isinstance(shapes, dict):
        raise TypeError(f"shapes must be a dict name -> shape, got {type(shapes).__name__}")
    if model_config is not None and not isinstance(model_config, dict):
        raise TypeError(f"model_config must be a dict or None, got {type(model_config).__name__}")
    if problems := differences(path, shapes, model_config):
        raise CheckpointError(f"checkpoint {path} was saved from another model:\n  "
                              + "\n  ".join(problems))
