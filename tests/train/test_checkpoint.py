"""mlsys.train.checkpoint on DCP: a bitwise round trip in one process, resharding from 2 FSDP2
ranks to one process and to 2 tensor-parallel ranks, export to one file, and the clear errors.
(The layout on disk, a save killed half-way, another model's checkpoint:
test_checkpoint_layout.py.)

Rank functions live at module level (the ranks import this file).
"""

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch
from checkpoint_cases import (
    CFG,
    adamw,
    assert_same,
    build,
    train_step,
    trained,
    weights_and_moments,
)
from torch.distributed.tensor import DTensor

from mlsys.distributed import launch, torch_strategies
from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.train import checkpoint
from mlsys.train.checkpoint_layout import INFO, CheckpointError, check_writable, latest


def test_round_trip_in_one_process_is_bitwise_and_resumes_exactly(tmp_path):
    model, optimizer, schedule = trained()
    extra = {"step": 2, "sampler": {"seed": 0, "step": 2, "tokens": 8_388_608},
             "schedule": schedule.state_dict(), "config": dataclasses.asdict(CFG), "x": 0.1 + 0.2}
    torch.manual_seed(123)
    t0 = time.perf_counter()
    path = checkpoint.save(tmp_path, 2, model, optimizer, extra=extra)
    saved_s = time.perf_counter() - t0
    draw = torch.rand(4)
    assert path == tmp_path / "step_00000002" and latest(tmp_path) == path
    model2 = build(1)
    optimizer2 = adamw(model2)
    torch.manual_seed(999)
    t0 = time.perf_counter()
    got = checkpoint.load(path, model2, optimizer2)
    print(f"debug preset: save {saved_s:.3f} s, load {time.perf_counter() - t0:.3f} s")
    assert got == extra and type(got["x"]) is float
    assert torch.equal(torch.rand(4), draw)  # this rank's RNG state came back
    assert_same(weights_and_moments(model2, optimizer2), weights_and_moments(model, optimizer))
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] != 1e-2
    train_step(model, optimizer, 2)  # one more step from either state: the same weights
    train_step(model2, optimizer2, 2)
    assert_same(weights_and_moments(model2, optimizer2), weights_and_moments(model, optimizer))
    info = json.loads((path / INFO).read_text())
    assert info["step"] == 2 and info["world_size"] == 1
    assert info["model_config"] == dataclasses.asdict(CFG)
    with pytest.raises(FileExistsError, match="already a complete checkpoint"):
        checkpoint.save(tmp_path, 2, model, optimizer, extra=extra)


def save_fsdp(rank, ckpt_dir):
    """FSDP2 over 2 ranks, one AdamW step, saved; the whole weights and moments, an RNG draw."""
    model = build(0)
    torch_strategies.apply_fully_shard(model, rank.group)
    optimizer = adamw(model)
    train_step(model, optimizer, 0, rank.rank, rank.world_size)
    torch.manual_seed(100 + rank.rank)
    t0 = time.perf_counter()
    checkpoint.save(ckpt_dir, 1, model, optimizer, extra={"by": "fsdp"})
    seconds = time.perf_counter() - t0
    return {"state": weights_and_moments(model, optimizer), "draw": torch.rand(3), "s": seconds}


def load_tp(rank, path):
    """The same checkpoint into tensor parallelism over 2 ranks."""
    model = build(1)
    torch_strategies.apply_dtensor_tp(model, rank.group)
    optimizer = adamw(model)
    torch.manual_seed(7)
    t0 = time.perf_counter()
    extra = checkpoint.load(path, model, optimizer)
    seconds = time.perf_counter() - t0
    draw = torch.rand(3)
    sharded = isinstance(model.blocks[0].attn.q_proj.weight, DTensor)
    return {"state": weights_and_moments(model, optimizer), "draw": draw, "extra": extra,
            "sharded": sharded, "s": seconds}


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("reshard")
    with launch.start(2, timeout_s=60, collective_timeout_s=60) as job:
        saved = job.run(save_fsdp, args=(str(ckpt),), timeout_s=90)
        loaded = job.run(load_tp, args=(str(ckpt / "step_00000001"),), timeout_s=90)
    print(f"2 ranks: FSDP2 save {max(r['s'] for r in saved):.3f} s, "
          f"TP load {max(r['s'] for r in loaded):.3f} s")
    return ckpt / "step_00000001", saved, loaded


@pytest.mark.timeout(150)
def test_fsdp_checkpoint_loads_into_one_process_without_a_group(resharded):
    path, saved, _ = resharded
    assert sorted(p.name for p in path.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert_same(saved[1]["state"], saved[0]["state"])  # gathered whole on each rank
    model, optimizer = build(2), None
    optimizer = adamw(model)
    with pytest.warns(UserWarning, match="saved by 2 ranks and is loaded by 1: RNG states are "
                                         "not restored"):
        assert checkpoint.load(path, model, optimizer) == {"by": "fsdp"}
    assert_same(weights_and_moments(model, optimizer), saved[0]["state"])  # weights and AdamW


@pytest.mark.timeout(150)
def test_fsdp_checkpoint_loads_into_tensor_parallel_ranks(resharded):
    _, saved, loaded = resharded
    for r in range(2):
        assert loaded[r]["sharded"] and loaded[r]["extra"] == {"by": "fsdp"}
        assert_same(loaded[r]["state"], saved[0]["state"])  # weights and AdamW moments
        assert torch.equal(loaded[r]["draw"], saved[r]["draw"])  # each rank's own RNG state
    assert not torch.equal(saved[0]["draw"], saved[1]["draw"])


def test_export_writes_one_file_a_fresh_transformer_loads(tmp_path):
    model, optimizer, _ = trained(steps=1)
    checkpoint.save(tmp_path / "ck", 1, model, optimizer, extra={})
    checkpoint.save(tmp_path / "ck", 3, model, optimizer, extra={})
    out = checkpoint.export(tmp_path / "ck" / "step_00000001", tmp_path / "model.pt")
    config = TransformerConfig(**json.loads(Path(f"{out}.json").read_text())["model_config"])
    fresh = Transformer(config)
    fresh.load_state_dict(torch.load(out))  # strict: the same keys
    assert_same(dict(fresh.state_dict()), dict(model.state_dict()))
    assert checkpoint.main(["export", str(tmp_path / "ck"), str(tmp_path / "cli.pt")]) == 0
    assert json.loads((tmp_path / "cli.pt.json").read_text())["step"] == 3  # the latest step


def test_bad_paths_and_extras_are_clear_errors(tmp_path):
    assert check_writable(tmp_path / "new" / "dir").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(PermissionError, match=r"ckpt_dir='.*file/ck' is not a writable "
                                              r"directory"):
        check_writable(tmp_path / "file" / "ck")
    model, optimizer, _ = trained(steps=1)
    with pytest.raises(TypeError, match=r"not extra\['sampler'\]\['shape'\] \(tuple\)"):
        checkpoint.save(tmp_path, 1, model, optimizer, extra={"sampler": {"shape": (1, 2)}})
    with pytest.raises(TypeError, match=r"not extra \(key 0 is not a str\)"):
        checkpoint.save(tmp_path, 1, model, optimizer, extra={0: 1})
    assert latest(tmp_path) is None and not (tmp_path / "step_00000001").exists()
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        checkpoint.load(tmp_path / "nope", model, optimizer)


def test_latest_weights_of_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoint.latest_weights(tmp_path)
