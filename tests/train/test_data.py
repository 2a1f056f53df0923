"""mlsys.train.data: the stdlib corpus (its rule, written once and atomically), token files and
their checks, and the sampler (windows of the file, sharded by rank, resumable exactly)."""

import json
import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from mlsys.train import data


def _stdlib_prefix(n: int) -> bytes:
    """The rule, stated apart: the sorted stdlib *.py files (no site-packages), first n bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "dist-packages")]
        names += [os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/")
                  for f in files if f.endswith(".py")]
    out = b""
    for name in sorted(names):
        out += (root / name).read_bytes()
        if len(out) >= n:
            return out[:n]
    return out


def test_stdlib_corpus_is_the_sorted_stdlib_source_one_token_per_byte(tmp_path):
    path = data.stdlib_corpus(tmp_path / "c.u16", max_bytes=100_000)
    tokens = np.fromfile(path, dtype=np.uint16)
    assert tokens.shape == (100_000,) and tokens.max() < 256
    assert tokens.astype(np.uint8).tobytes() == _stdlib_prefix(100_000)
    info = json.loads(Path(f"{path}.json").read_text())
    assert info["bytes"] == 100_000 and info["dtype"] == "uint16" and info["files"] >= 1


def test_stdlib_corpus_is_written_once_and_rebuilt_when_incomplete(tmp_path, monkeypatch):
    path = data.stdlib_corpus(tmp_path / "c.u16", max_bytes=20_000)
    before = path.stat()
    assert data.stdlib_corpus(path, max_bytes=20_000) == path
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    path.write_bytes(path.read_bytes()[:100])  # a truncated file is not reused
    data.stdlib_corpus(path, max_bytes=20_000)
    assert path.stat().st_size == 40_000
    Path(f"{path}.json").unlink()  # no sidecar: not complete either
    data.stdlib_corpus(path, max_bytes=20_000)
    assert Path(f"{path}.json").is_file()
    monkeypatch.setenv(data.DATA_DIR_VARIABLE, str(tmp_path / "cache"))
    default = data.stdlib_corpus(max_bytes=20_000)
    assert default.parent == tmp_path / "cache" and default.stat().st_size == 40_000


def test_stdlib_corpus_called_by_many_at_once_gives_one_whole_file(tmp_path):
    path = tmp_path / "c.u16"
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: data.stdlib_corpus(path, max_bytes=300_000), range(4)))
    assert paths == [path] * 4
    assert np.fromfile(path, dtype=np.uint16).astype(np.uint8).tobytes() == _stdlib_prefix(
        300_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.u16", "c.u16.json"]  # no temp left


def _file(tmp_path, values, dtype="uint16", name="t.bin") -> Path:
    path = tmp_path / name
    np.asarray(values, dtype=dtype).tofile(path)
    return path


@pytest.mark.parametrize("case, error, message", [
    ("missing", FileNotFoundError, "no such token file"),
    ("empty", ValueError, "is empty"),
    ("odd", ValueError, "3 bytes, not a multiple of 2"),
    ("int16", ValueError, "dtype='int16' is not one of"),
    ("float", ValueError, "dtype='float32' is not one of"),
    ("path", TypeError, "path must be a str or os.PathLike"),
])
def test_bad_token_files_are_clear_errors(tmp_path, case, error, message):
    path = tmp_path / "t.bin"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "odd":
        path.write_bytes(b"abc")
    else:
        _file(tmp_path, [1, 2, 3])
    args = {"missing": (tmp_path / "nope.bin",), "int16": (path, "int16"),
            "float": (path, np.float32), "path": (3,)}.get(case, (path,))
    with pytest.raises(error, match=message):
        data.TokenData(*args)


def test_check_vocab_names_the_first_bad_token_and_its_position(tmp_path, monkeypatch):
    tokens = data.TokenData(_file(tmp_path, [1, 2, 3, 4, 70_000, 5, 300], "uint32"), "uint32")
    assert len(tokens) == 7
    tokens.check_vocab(70_001)
    monkeypatch.setattr(data, "_SCAN_TOKENS", 3)  # the bad token in the second chunk
    with pytest.raises(ValueError, match=r"token 70000 at position 4 is >= the model's "
                                         r"vocab_size \(1000\)"):
        tokens.check_vocab(1_000)
    with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
        tokens.check_vocab(0)


def _arange_data(tmp_path, n=10_000) -> data.TokenData:
    return data.TokenData(_file(tmp_path, np.arange(n), "uint32", "arange.bin"), "uint32")


def test_batches_are_windows_of_the_file_drawn_from_seed_and_step(tmp_path):
    tokens = _arange_data(tmp_path)
    sampler = data.Sampler(tokens, seq_len=16, global_batch=8, seed=3)
    batch = sampler.global_batch(5)
    assert batch.dtype == torch.int64 and batch.shape == (8, 17)
    assert torch.all(batch[:, 1:] - batch[:, :-1] == 1)  # contiguous tokens of the file
    assert batch.min() >= 0 and batch.max() < 10_000
    again = data.Sampler(data.TokenData(tokens.path, "uint32"), seq_len=16, global_batch=8,
                         seed=3)
    assert torch.equal(again.global_batch(5), batch)  # a pure function of (seed, step)
    assert not torch.equal(sampler.global_batch(6), batch)
    assert not torch.equal(data.Sampler(tokens, seq_len=16, global_batch=8,
                                        seed=4).global_batch(5), batch)
    exact = data.Sampler(data.TokenData(_file(tmp_path, np.arange(17), "uint32"), "uint32"),
                         seq_len=16, global_batch=2)
    assert torch.equal(exact.global_batch(0), torch.arange(17).repeat(2, 1))  # one window


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_ranks_micro_batches_make_up_the_global_batch(tmp_path, dp):
    sampler = data.Sampler(_arange_data(tmp_path), seq_len=8, global_batch=8)
    parts = [sampler.rank_micro_batches(2, dp_rank=r, dp_size=dp, micro_batch=2)
             for r in range(dp)]
    assert all(len(p) == 8 // dp // 2 and p[0].shape == (2, 9) for p in parts)
    assert torch.equal(torch.cat([mb for p in parts for mb in p]), sampler.global_batch(2))


def test_bad_sampler_arguments_are_clear_errors(tmp_path):
    tokens = _arange_data(tmp_path, n=20)
    with pytest.raises(ValueError, match=r"has 20 tokens, too few for one sequence of "
                                         r"seq_len \+ 1 = 21"):
        data.Sampler(tokens, seq_len=20, global_batch=4)
    sampler = data.Sampler(tokens, seq_len=4, global_batch=8)
    with pytest.raises(ValueError, match=r"global_batch \(8\) must be divisible by dp_size \* "
                                         r"micro_batch = 3 \* 1 = 3"):
        sampler.rank_micro_batches(0, dp_rank=0, dp_size=3, micro_batch=1)
    with pytest.raises(ValueError, match=r"dp_rank must be in \[0, dp_size\)"):
        sampler.rank_micro_batches(0, dp_rank=2, dp_size=2, micro_batch=1)
    with pytest.raises(TypeError, match="data must be a TokenData"):
        data.Sampler(np.arange(100), seq_len=4, global_batch=8)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        data.Sampler(tokens, seq_len=4, global_batch=8, seed=-1)


def test_a_resumed_sampler_sees_the_batches_of_an_uninterrupted_run(tmp_path):
    def run(sampler, steps, dp):
        out = []
        for _ in range(steps):
            out.append(torch.cat([mb for r in range(dp) for mb in sampler.rank_micro_batches(
                sampler.step, dp_rank=r, dp_size=dp, micro_batch=1)]))
            sampler.advance()
        return out

    tokens = _arange_data(tmp_path)
    reference = run(data.Sampler(tokens, seq_len=8, global_batch=4, seed=1), 6, dp=2)
    first = data.Sampler(tokens, seq_len=8, global_batch=4, seed=1)
    before = run(first, 3, dp=2)
    state = json.loads(json.dumps(first.state_dict()))  # as saved in checkpoint.json
    resumed = data.Sampler(data.TokenData(tokens.path, "uint32"), seq_len=8, global_batch=4,
                           seed=1)
    resumed.load_state_dict(state)
    assert resumed.step == 3
    after = run(resumed, 3, dp=4)  # resumed on another number of ranks
    assert all(torch.equal(a, b) for a, b in zip(before + after, reference, strict=True))


def test_an_incompatible_sampler_state_is_refused(tmp_path):
    sampler = data.Sampler(_arange_data(tmp_path), seq_len=8, global_batch=4, seed=1)
    state = sampler.state_dict()
    other = data.Sampler(_arange_data(tmp_path, n=5_000), seq_len=16, global_batch=4, seed=1)
    with pytest.raises(ValueError, match=r"seq_len: checkpoint 8, this run 16; tokens: "
                                         r"checkpoint 10000, this run 5000"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"lacks \['seed'\]"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != "seed"})
    with pytest.raises(TypeError, match="state must be a dict"):
        sampler.load_state_dict([1])
    assert sampler.step == 0
