"""Checkpoints on torch.distributed.checkpoint (DCP): one directory per step, sharded, resharded on
load, refused for another model, exported to one file.

    ckpt_dir/step_00000012/  .metadata        DCP's index, written LAST by the coordinator: the
                                              commit marker (no .metadata = not a checkpoint)
                             __<rank>_0.distcp each rank's shards, written in place by DCP
                             checkpoint.json  step, world size, model config, `extra`; written
                                              (temp file + rename) by rank 0 BEFORE dcp.save

DCP holds (keys flattened with dots) `model.<fqn>`, `optim.state.<fqn>.exp_avg` ... from
`state_dict.get_state_dict` (under FSDP2 or TP, sharded DTensors: each rank writes its shards, none
is gathered) and `rng.rank<r>.cpu` (and `.cuda`), each rank's generator state under its own key so
that DCP's de-duplication of replicated entries keeps them all. A rank restores its RNG state only
when as many ranks load as saved; a resharded load restores none (a warning says so). Batches do
not depend on it (`data.Sampler` seeds each step), only dropout-like noise would.

A complete step directory is never written again (FileExistsError); one left without `.metadata`
by a killed save is no checkpoint, and is removed when its step is saved again. `latest` picks the
highest complete step. Reference: https://pytorch.org/docs/stable/distributed.checkpoint.html
(`save`, `load`, `FileSystemReader`, `state_dict.get_state_dict` / `set_state_dict`); measured on
this CPU in shared/notes/torchrun-and-dcp-on-cpu.md, sections 3-4. Export from the shell:

    python -m mlsys.train.checkpoint export CKPT_DIR_OR_STEP_DIR OUT.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from mlsys import checks

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


def _complete(path: object) -> Path:
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


def _dist() -> tuple[int, int, bool]:
    """(rank, world size, whether a process group is up)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def _dcp(fn, state: dict, path: Path, on: bool) -> None:
    with warnings.catch_warnings():  # no group: DCP warns it "assumes a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        fn(state, checkpoint_id=path, no_dist=not on)


def _json_path(value: object, where: str) -> str | None:
    """Where in `value` something does not survive JSON unchanged (None if nothing)."""
    if value is None or isinstance(value, (str, bool, int, float)):  # NaN, inf: JSON's too
        return None
    if isinstance(value, dict) and (bad := [k for k in value if not isinstance(k, str)]):
        return f"{where} (key {bad[0]!r} is not a str)"
    if isinstance(value, (list, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return next((p for k, v in items if (p := _json_path(v, f"{where}[{k!r}]"))), None)
    return f"{where} ({type(value).__name__})"


def _atomic(path: Path, write) -> None:
    """`write(file)` into a temp file beside `path`, synced, then renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes it private
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json(obj: object):
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
        from mlsys.models.transformer import Transformer

        with torch.device("meta"):
            model = Transformer(model)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _metadata(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(path).read_metadata().state_dict_metadata


def _model_entries(metadata: dict) -> dict:
    """`model.<fqn>` tensor entries of DCP's metadata, by fqn."""
    return {k[len("model."):]: m for k, m in metadata.items()
            if k.startswith("model.") and hasattr(m, "size")}


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" ... and {len(items) - _SHOWN} more"
                                        if len(items) > _SHOWN else "")


def _differences(path: Path, shapes: dict, config: dict | None, part: bool = False) -> list[str]:
    """What differs; `part`: the model may be a part (a pipeline stage): no unexpected keys."""
    saved = {k: tuple(m.size) for k, m in _model_entries(_metadata(path)).items()}
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
    path = _complete(path)
    if not isinstance(shapes, dict):
        raise TypeError(f"shapes must be a dict name -> shape, got {type(shapes).__name__}")
    if model_config is not None and not isinstance(model_config, dict):
        raise TypeError(f"model_config must be a dict or None, got {type(model_config).__name__}")
    if problems := _differences(path, shapes, model_config):
        raise CheckpointError(f"checkpoint {path} was saved from another model:\n  "
                              + "\n  ".join(problems))


def _config_of(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None


def _rng_states() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def save(ckpt_dir: str | os.PathLike, step: int, model: nn.Module,
         optimizer: torch.optim.Optimizer, *, extra: dict | None = None,
         model_config: dict | None = None) -> Path:
    """Save model, optimizer, every rank's RNG and `extra` (plain JSON values) into
    `ckpt_dir/step_<step>`; every rank of the process group (if any) calls it. Returns the
    directory. `model_config` defaults to `asdict(model.config)` where the model has one."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = step_dir(ckpt_dir, step)
    extra = {} if extra is None else extra
    if not isinstance(extra, dict) or (bad := _json_path(extra, "extra")):
        where = bad if isinstance(extra, dict) else f"extra ({type(extra).__name__})"
        raise TypeError(f"extra must be a dict of plain JSON values (str keys; dict, list, str, "
                        f"int, float, bool, None), not {where}")
    config = _config_of(model) if model_config is None else model_config
    if config is not None and (bad := _json_path(config, "model_config")):
        raise TypeError(f"model_config must be a dict of plain JSON values, not {bad}")
    if is_complete(path):
        raise FileExistsError(f"{path} is already a complete checkpoint: checkpoints are never "
                              "overwritten (remove it, or save another step)")
    rank, world, on = _dist()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "rng": {f"rank{rank}": _rng_states()}}
    if rank == 0:
        if path.exists():  # left by a killed save: not a checkpoint
            shutil.rmtree(path)
        path.mkdir(parents=True)
        _atomic(path / INFO, _json({"step": step, "world_size": world, "model_config": config,
                                    "torch": torch.__version__, "extra": extra}))
    if on:
        dist.barrier()  # nobody writes into the directory before it is fresh
    _dcp(dcp_save, state, path, on)
    return path


def load(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load a complete checkpoint into `model` and `optimizer` under any mesh (DCP reshards);
    every rank calls it. Restores this rank's RNG state when the saving world size equals this
    one (else warns). Returns the `extra` given to `save`."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = _complete(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # FQNs, as saved
    shapes = {k: tuple(v.shape) for k, v in model_sd.items()}
    if problems := _differences(path, shapes, None, part=True):
        raise CheckpointError(f"checkpoint {path} does not fit this model:\n  "
                              + "\n  ".join(problems))
    info = json.loads((path / INFO).read_text())
    rank, world, on = _dist()
    state: dict = {"model": model_sd, "optim": optim_sd}
    if info["world_size"] == world:
        metadata = _metadata(path)
        rng = {kind: torch.empty(m.size, dtype=m.properties.dtype)
               for kind in ("cpu", "cuda") if (m := metadata.get(f"rng.rank{rank}.{kind}"))
               and (kind == "cpu" or torch.cuda.is_available())}
        state["rng"] = {f"rank{rank}": rng}
    elif rank == 0:
        warnings.warn(f"{path} was saved by {info['world_size']} ranks and is loaded by {world}: "
                      "RNG states are not restored (weights, optimizer and extra are)",
                      stacklevel=2)
    _dcp(dcp_load, state, path, on)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    for kind, value in state.get("rng", {}).get(f"rank{rank}", {}).items():
        (torch.set_rng_state if kind == "cpu" else torch.cuda.set_rng_state)(value)
    return info["extra"]


def export(path: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Write the model's weights as one `torch.save` file: a plain dict with the keys of
    `Transformer.state_dict()` (load with `Transformer(config).load_state_dict(torch.load(out))`),
    and `<out_file>.json` beside it (model config, step). One process; no group needed."""
    from torch.distributed.checkpoint import load as dcp_load

    path = _complete(path)
    out = Path(out_file)
    info = json.loads((path / INFO).read_text())
    weights = {k: torch.empty(m.size, dtype=m.properties.dtype)
               for k, m in _model_entries(_metadata(path)).items()}
    _dcp(dcp_load, {"model": weights}, path, False)
    out.parent.mkdir(parents=True, exist_ok=True)
    _atomic(out, lambda f: torch.save(weights, f))
    _atomic(out.with_name(out.name + ".json"), _json({"model_config": info["model_config"],
                                                      "step": info["step"], "source": str(path)}))
    return out


def latest_weights(ckpt_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model weights of the latest complete checkpoint under `ckpt_dir`, as one state dict
    (`export` to `<ckpt_dir>.pt`, then loaded): what a run ended with."""
    last = latest(ckpt_dir)
    if last is None:
        raise CheckpointError(f"{ckpt_dir} holds no complete checkpoint")
    return torch.load(export(last, Path(ckpt_dir).with_suffix(".pt")), weights_only=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m mlsys.train.checkpoint export CKPT OUT.pt` (CKPT: a step directory, or a
    checkpoint directory whose latest complete step is taken)."""
    parser = argparse.ArgumentParser(prog="python -m mlsys.train.checkpoint")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("export", help="write the model's weights to one torch.save file")
    cmd.add_argument("ckpt", type=Path)
    cmd.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    source = args.ckpt if is_complete(args.ckpt) else latest(args.ckpt) or args.ckpt
    try:
        out = export(source, args.out)
    except CheckpointError as error:
        parser.error(str(error))  # exit status 2, no traceback
    print(f"exported {source} to {out} ({out.stat().st_size / 2**20:.1f} MiB) and {out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
