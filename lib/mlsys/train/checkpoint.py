"""Checkpoints on torch.distributed.checkpoint (DCP): saved sharded, loaded under any mesh
(resharded), exported to one file. Where and how they lie on disk, and the refusal of another
model's, is `mlsys.train.checkpoint_layout`.

DCP holds (keys flattened with dots) `model.<fqn>`, `optim.state.<fqn>.exp_avg` ... from
`state_dict.get_state_dict` (under FSDP2 or TP, sharded DTensors: each rank writes its shards, none
is gathered) and `rng.rank<r>.cpu` (and `.cuda`), each rank's generator state under its own key so
that DCP's de-duplication of replicated entries keeps them all. A rank restores its RNG state only
when as many ranks load as saved; a resharded load restores none (a warning says so). Batches do
not depend on it (`data.Sampler` seeds each step), only dropout-like noise would.

A complete step directory is never written again (FileExistsError); one left without `.metadata`
by a killed save is no checkpoint, and is removed when its step is saved again. Reference:
https://pytorch.org/docs/stable/distributed.checkpoint.html (`save`, `load`,
`state_dict.get_state_dict` / `set_state_dict`); measured on this CPU in
shared/notes/torchrun-and-dcp-on-cpu.md, sections 3-4. Export from the shell:

    python -m mlsys.train.checkpoint export CKPT_DIR_OR_STEP_DIR OUT.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from mlsys.train.checkpoint_layout import (
    INFO,
    CheckpointError,
    atomic,
    complete,
    differences,
    is_complete,
    json_path,
    json_writer,
    latest,
    model_entries,
    read_metadata,
    step_dir,
)


def _dist() -> tuple[int, int, bool]:
    """(rank, world size, whether a process group is up)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def _dcp(fn, state: dict, path: Path, on: bool) -> None:
    """DCP's save or load `fn` of `state` at `path`, with a process group if `on`."""
    with warnings.catch_warnings():  # no group: DCP warns it "assumes a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        fn(state, checkpoint_id=path, no_dist=not on)


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
    path = step_dir(ckpt_dir, step)
    extra = {} if extra is None else extra
    if not isinstance(extra, dict) or (bad := json_path(extra, "extra")):
        where = bad if isinstance(extra, dict) else f"extra ({type(extra).__name__})"
        raise TypeError(f"extra must be a dict of plain JSON values (str keys; dict, list, str, "
                        f"int, float, bool, None), not {where}")
    config = _config_of(model) if model_config is None else model_config
    if config is not None and (bad := json_path(config, "model_config")):
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
        atomic(path / INFO, json_writer({"step": step, "world_size": world,
                                         "model_config": config, "torch": torch.__version__,
                                         "extra": extra}))
    if on:
        dist.barrier()  # nobody writes into the directory before it is fresh
    _dcp(dcp_save, state, path, on)
    return path


def load(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load a complete checkpoint into `model` and `optimizer` under any mesh (DCP reshards);
    every rank calls it. Restores this rank's RNG state when the saving world size equals this
    one (else warns). Returns the `extra` given to `save`."""
    path = complete(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # FQNs, as saved
    shapes = {k: tuple(v.shape) for k, v in model_sd.items()}
    if problems := differences(path, shapes, None, part=True):
        raise CheckpointError(f"checkpoint {path} does not fit this model:\n  "
                              + "\n  ".join(problems))
    info = json.loads((path / INFO).read_text())
    rank, world, on = _dist()
    state: dict = {"model": model_sd, "optim": optim_sd}
    if info["world_size"] == world:
        metadata = read_metadata(path)
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
    path = complete(path)
    out = Path(out_file)
    info = json.loads((path / INFO).read_text())
    weights = {k: torch.empty(m.size, dtype=m.properties.dtype)
               for k, m in model_entries(read_metadata(path)).items()}
    _dcp(dcp_load, {"model": weights}, path, False)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic(out, lambda f: torch.save(weights, f))
    atomic(out.with_name(out.name + ".json"), json_writer({"model_config": info["model_config"],
                                                          "step": info["step"],
                                                          "source": str(path)}))
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
