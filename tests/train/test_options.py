"""mlsys.train.options: bad flags and bad paths are clear errors before any process-group work, a
checkpoint of another model is refused, and the flags of the sbatch example are valid. The
refused checkpoint is a real run's (a torchrun job, train_runs.py)."""

from pathlib import Path

import pytest
import torch
from train_runs import trained

from mlsys.train import options


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("single"), "one")


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
    text = (Path(__file__).resolve().parents[2] / "examples" / "train.sbatch").read_text()
    flags = text.split("-m mlsys.train", 1)[1].replace("\\\n", " ").split()
    monkeypatch.setattr(options, "memory_limit_bytes", lambda device: (80e9, "an H100's"))
    run = options.resolve(options.parse([f.strip('"') for f in flags]), 32)
    assert run.dims.world_size == 32 and run.why_mesh.startswith("--mesh auto")


def test_a_checkpoint_of_another_model_is_refused(single):
    ckpt = single[2]
    with pytest.raises(ValueError, match="vocab_size|shape|differ"):
        options.check_paths(options.resolve(options.parse(
            ["--preset", "laptop", "--ckpt", str(ckpt)]), 1))
