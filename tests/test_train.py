"""`python -m mlsys.train` under torchrun on the CPU: the smoke run's loss falls; every mesh trains
like one process; a rank killed with SIGKILL is restarted by torchrun and the run resumes from
its checkpoint bit for bit; two torchrun "nodes" on one machine train a 2-D mesh; bad flags are
clear errors before any process-group work.

Each run is a real torchrun job (5-10 s on 2 cores); all of them write under tmp_path.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mlsys.models.transformer import Transformer
from mlsys.train import checkpoint, loop, options

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MLSYS_PROFILE": "smoke"}
RUN_TIMEOUT_S = 240
BASE = ["--preset", "debug", "--steps", "10", "--global-batch", "8", "--seq-len", "32",
        "--quiet"]


def torchrun(*args: str, nproc: int = 1, extra: tuple[str, ...] = ("--standalone",),
             timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *extra, f"--nproc-per-node={nproc}",
           "-m", "mlsys.train", *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def trained(tmp: Path, name: str, *args: str, nproc: int = 1, **kw) -> tuple[list, dict, Path]:
    """Run; the logged rows, the final weights (exported from the last checkpoint), the
    checkpoint directory."""
    ckpt = tmp / name
    done = torchrun(*BASE, "--ckpt", str(ckpt), *args, nproc=nproc, **kw)
    assert done.returncode == 0, done.stderr[-4000:]
    return rows(ckpt / "log.jsonl"), checkpoint.latest_weights(ckpt), ckpt


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("single"), "one")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The smoke run: no --mesh (FSDP over both ranks), timed; also the killed run's reference."""
    start = time.perf_counter()
    out = trained(tmp_path_factory.mktemp("two"), "two", "--ckpt-every", "3", nproc=2)
    print(f"torchrun --standalone --nproc-per-node=2, {len(out[0])} steps: "
          f"{time.perf_counter() - start:.1f} s")
    return out


def same_run(got: list, weights: dict, ref: tuple) -> None:
    """Loss and global gradient norm step by step, then the final weights, against `ref`."""
    for a, b in zip(got, ref[0], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a["step"], a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), (a["step"], a, b)
    assert weights.keys() == ref[1].keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, ref[1][name], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_smoke_run_on_two_ranks_loss_falls_and_equals_one_process(two_ranks, single):
    got = two_ranks[0]
    assert [r["step"] for r in got] == list(range(1, 11))
    first, last = got[0]["loss"], sum(r["loss"] for r in got[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_memory_bytes"] > 0
               for r in got)
    same_run(two_ranks[0], two_ranks[1], single)


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
@pytest.mark.parametrize("mesh", ["tp=2", "pp=2", "dp_replicate=2", "tp=2 --sequence-parallel"])
def test_every_mesh_trains_like_one_process(tmp_path, single, mesh):
    args = ["--mesh", *mesh.split(" ")]
    if mesh.startswith("pp"):
        args += ["--micro-batch", "2"]
    got, weights, _ = trained(tmp_path, "mesh", *args, nproc=2)
    same_run(got, weights, single)


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_bf16_mixed_precision_keeps_fp32_masters_and_tracks_fp32(tmp_path, single):
    got, weights, _ = trained(tmp_path, "bf16", "--precision", "bf16_mixed_adamw", nproc=2)
    assert all(t.dtype == torch.float32 for t in weights.values())  # the shards are the masters
    for a, b in zip(got, single[0], strict=True):  # bf16 matmuls: within 2% of fp32 training
        assert a["loss"] == pytest.approx(b["loss"], rel=0.02), (a["step"], a, b)
    assert any(a["loss"] != b["loss"] for a, b in zip(got, single[0], strict=True))


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_killed_rank_is_restarted_and_resumes_bit_for_bit(tmp_path, two_ranks):
    log, killed, _ = trained(tmp_path, "killed", "--ckpt-every", "3", "--kill-rank-at", "1:5",
                          nproc=2, extra=("--standalone", "--max-restarts=1"))
    steps = [r["step"] for r in log]
    assert steps == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10], steps  # resumed from step 3
    for name, tensor in two_ranks[1].items():
        assert torch.equal(killed[name], tensor), name


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_two_nodes_on_one_machine_train_a_2d_mesh(tmp_path, single):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt = tmp_path / "two"
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes",
            "-m", "mlsys.train", *BASE, "--mesh", "dp_shard=2,tp=2", "--ckpt", str(ckpt)]
    procs = [subprocess.Popen(node, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    same_run(rows(ckpt / "log.jsonl"), checkpoint.latest_weights(ckpt), single)


def test_export_loads_into_the_book_model(tmp_path, single):
    model = Transformer(options.resolve(options.parse(BASE), 1).config)
    model.load_state_dict(single[1])


def test_schedule_warms_up_then_follows_a_cosine():
    lrs = [loop.lr_at(s, peak=1.0, warmup=4, steps=20, min_ratio=0.1) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))


@pytest.mark.parametrize(("argv", "world", "match"), [
    (["--mesh", "dp_shard=3"], 2, "product must equal the world size"),
    (["--mesh", "tp=3"], 3, "not divisible by tp"),
    (["--mesh", "cp=2"], 2, "context parallelism"),
    (["--mesh", "dp_shard=2,ep=2"], 4, "AXIS=N"),
    (["--preset", "2.7B", "--device", "cpu", "--seq-len", "1024", "--global-batch", "64"], 1,
     "does not fit"),
    (["--global-batch", "6"], 4, "divisible by dp"),
    (["--seq-len", "4096"], 1, "context_length"),
    (["--warmup", "9", "--steps", "9"], 1, "--warmup"),
    (["--sequence-parallel"], 2, "needs tp > 1"),
    (["--kill-rank-at", "3:2"], 2, "rank must be < the world size"),
])
def test_bad_flags_are_clear_errors_before_any_process_group(argv, world, match):
    with pytest.raises(ValueError, match=match):
        options.resolve(options.parse(argv), world)
    assert not torch.distributed.is_initialized()


def test_bad_paths_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    for argv, error in ((["--data", str(tmp_path / "missing.bin")], FileNotFoundError),
                        (["--data", str(empty)], ValueError)):
        with pytest.raises(error, match="data|empty|missing"):
            options.check_paths(options.resolve(options.parse(argv), 1))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    with pytest.raises(PermissionError, match="not a writable directory"):
        options.check_paths(options.resolve(options.parse(["--ckpt", str(a_file / "ck")]), 1))


def test_the_sbatch_example_flags_are_valid(monkeypatch):
    text = (Path(__file__).resolve().parents[1] / "examples" / "train.sbatch").read_text()
    flags = text.split("-m mlsys.train", 1)[1].replace("\\\n", " ").split()
    monkeypatch.setattr(options, "memory_limit_bytes", lambda device: (80e9, "an H100's"))
    run = options.resolve(options.parse([f.strip('"') for f in flags]), 32)
    assert run.dims.world_size == 32 and run.why_mesh.startswith("--mesh auto")


def test_a_checkpoint_of_another_model_is_refused(single):
    ckpt = single[2]
    with pytest.raises(ValueError, match="vocab_size|shape|differ"):
        options.check_paths(options.resolve(options.parse(
            ["--preset", "laptop", "--ckpt", str(ckpt)]), 1))
