"""mlsys.train.checkpoint on DCP: a bitwise round trip in one process, a save killed half-way,
resharding from 2 FSDP2 ranks to one process and to 2 tensor-parallel ranks, refusal of another
model's checkpoint, export to one file, and the clear errors.

Rank functions live at module level (the ranks import this file).
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from mlsys.distributed import fsdp, launch, tp
from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.train import checkpoint

CFG = TransformerConfig.preset("debug")
ROOT = Path(__file__).resolve().parents[1]


def build(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CFG)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train_step(model, optimizer, step: int, rank: int = 0, world: int = 1) -> None:
    tokens = torch.randint(CFG.vocab_size, (4, 17), generator=torch.Generator().manual_seed(step))
    tokens = tokens.chunk(world)[rank]
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def weights_and_moments(model, optimizer) -> dict:
    """Every parameter and its AdamW state (exp_avg, exp_avg_sq, step), whole, by name."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = full(p)
        for key, value in optimizer.state[p].items():
            out[f"{name}/{key}"] = full(value)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def trained(seed: int = 0, steps: int = 2):
    model = build(seed)
    optimizer = adamw(model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
    for step in range(steps):
        train_step(model, optimizer, step)
        schedule.step()
    return model, optimizer, schedule


def test_round_trip_in_one_process_is_bitwise_and_resumes_exactly(tmp_path):
    model, optimizer, schedule = trained()
    extra = {"step": 2, "sampler": {"seed": 0, "step": 2, "tokens": 8_388_608},
             "schedule": schedule.state_dict(), "config": dataclasses.asdict(CFG), "x": 0.1 + 0.2}
    torch.manual_seed(123)
    t0 = time.perf_counter()
    path = checkpoint.save(tmp_path, 2, model, optimizer, extra=extra)
    saved_s = time.perf_counter() - t0
    draw = torch.rand(4)
    assert path == tmp_path / "step_00000002" and checkpoint.latest(tmp_path) == path
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
    info = json.loads((path / checkpoint.INFO).read_text())
    assert info["step"] == 2 and info["world_size"] == 1
    assert info["model_config"] == dataclasses.asdict(CFG)
    with pytest.raises(FileExistsError, match="already a complete checkpoint"):
        checkpoint.save(tmp_path, 2, model, optimizer, extra=extra)


_BIG_SAVE = textwrap.dedent("""
    import sys, torch
    from mlsys.train import checkpoint
    params = [torch.nn.Parameter(torch.ones(2**23)) for _ in range(4)]  # 4 x 32 MiB
    model = torch.nn.ParameterList(params)
    checkpoint.save(sys.argv[1], 2, model, torch.optim.SGD(params, lr=0.1), extra={})
""")


@pytest.mark.timeout(60)
def test_a_save_killed_half_way_is_never_chosen_nor_loaded(tmp_path):
    model, optimizer, _ = trained()
    first = checkpoint.save(tmp_path, 1, model, optimizer, extra={"step": 1})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _BIG_SAVE, str(tmp_path)], cwd=ROOT, env=env)
    half = tmp_path / "step_00000002"
    shard = half / "__0_0.distcp"
    try:
        deadline = time.monotonic() + 45
        while not (shard.is_file() and shard.stat().st_size > 0):
            assert proc.poll() is None and time.monotonic() < deadline, "the save never began"
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not checkpoint.is_complete(half), "the save finished before it was killed"
    assert shard.stat().st_size < 4 * 2**25  # partial data, written in place
    assert checkpoint.latest(tmp_path) == first
    model2, optimizer2 = build(1), None
    optimizer2 = adamw(model2)
    assert checkpoint.load(first, model2, optimizer2) == {"step": 1}
    assert_same(weights_and_moments(model2, optimizer2), weights_and_moments(model, optimizer))
    for call in (lambda: checkpoint.load(half, model2, optimizer2),
                 lambda: checkpoint.check_compatible(half, None, {}),
                 lambda: checkpoint.export(half, tmp_path / "out.pt")):
        with pytest.raises(checkpoint.CheckpointError, match="is not a complete checkpoint"):
            call()
    again = checkpoint.save(tmp_path, 2, model, optimizer, extra={"step": 2})  # the step re-done
    assert checkpoint.latest(tmp_path) == again == half
    assert sorted(p.name for p in half.iterdir()) == [".metadata", "__0_0.distcp",
                                                      "checkpoint.json"]
    assert shard.stat().st_size == (first / "__0_0.distcp").stat().st_size  # the same state


def save_fsdp(rank, ckpt_dir):
    """FSDP2 over 2 ranks, one AdamW step, saved; the whole weights and moments, an RNG draw."""
    model = build(0)
    fsdp.apply_fully_shard(model, rank.group)
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
    tp.apply_dtensor_tp(model, rank.group)
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


def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path):
    model, optimizer, _ = trained(steps=1)
    path = checkpoint.save(tmp_path, 1, model, optimizer, extra={})
    same = dataclasses.replace(CFG, attention="sdpa")  # another kernel, the same weights
    checkpoint.check_compatible(path, dataclasses.asdict(same), checkpoint.model_shapes(same))
    deeper = dataclasses.replace(CFG, n_layers=3)
    with pytest.raises(checkpoint.CheckpointError, match=r"(?s)n_layers: checkpoint 2, this run "
                                                         r"3.*missing keys.*blocks\.2\.attn"):
        checkpoint.check_compatible(path, dataclasses.asdict(deeper),
                                    checkpoint.model_shapes(deeper))
    wider = dataclasses.replace(CFG, d_model=128, d_ff=352)
    with pytest.raises(checkpoint.CheckpointError, match=r"(?s)d_ff: checkpoint 176, this run "
                       r"352; d_model: checkpoint 64, this run 128.*different shapes: "
                       r"blocks.0.attn.k_proj.weight: checkpoint \(64, 64\), model \(128, 128\)"
                       r".* and 13 more"):
        checkpoint.check_compatible(path, dataclasses.asdict(wider),
                                    checkpoint.model_shapes(wider))
    shallow = {k: v for k, v in checkpoint.model_shapes(model).items() if "blocks.1." not in k}
    with pytest.raises(checkpoint.CheckpointError, match=r"unexpected keys .*blocks\.1\."):
        checkpoint.check_compatible(path, None, shallow)
    small = Transformer(deeper)
    with pytest.raises(checkpoint.CheckpointError, match="does not fit this model"):
        checkpoint.load(path, small, adamw(small))


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
    assert checkpoint.check_writable(tmp_path / "new" / "dir").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(PermissionError, match=r"ckpt_dir='.*file/ck' is not a writable "
                                              r"directory"):
        checkpoint.check_writable(tmp_path / "file" / "ck")
    model, optimizer, _ = trained(steps=1)
    with pytest.raises(TypeError, match=r"not extra\['sampler'\]\['shape'\] \(tuple\)"):
        checkpoint.save(tmp_path, 1, model, optimizer, extra={"sampler": {"shape": (1, 2)}})
    with pytest.raises(TypeError, match=r"not extra \(key 0 is not a str\)"):
        checkpoint.save(tmp_path, 1, model, optimizer, extra={0: 1})
    assert checkpoint.latest(tmp_path) is None and not (tmp_path / "step_00000001").exists()
    with pytest.raises(checkpoint.CheckpointError, match="not a checkpoint directory"):
        checkpoint.load(tmp_path / "nope", model, optimizer)


def test_latest_weights_of_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
        checkpoint.latest_weights(tmp_path)
