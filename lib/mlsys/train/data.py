"""Training data with no download: a byte-level corpus from the Python standard library's source,
a user's own token file, and a deterministic sampler sharded by data-parallel rank.

- `stdlib_corpus()` writes the `*.py` files of the running Python's standard library
  (`sysconfig.get_paths()["stdlib"]`, without site-packages), in sorted order of their relative
  paths and capped at `STDLIB_CORPUS_BYTES`, to a token file: one uint16 token per byte, so the
  vocabulary is 256. It lives in `MLSYS_DATA_DIR` (default `~/.cache/mlsys`), is written once
  (temp file + `os.replace`, then a JSON sidecar as the commit marker, so ranks may call it at the
  same time) and reused while the sidecar matches. Its text depends on the Python version.
- `TokenData(path, dtype)` memory-maps a flat token file (uint16 or uint32, like nanoGPT's
  `train.bin`) and checks it before any work starts.
- `Sampler` draws step s's global batch, `global_batch` windows of seq_len + 1 tokens at random
  offsets, from a `torch.Generator` seeded by (seed, s) alone: the batch does not depend on the
  number of ranks, and a resumed run sees the batches an uninterrupted one would have seen.
  Data-parallel rank r takes rows [r G / dp, (r + 1) G / dp), cut into micro-batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

from mlsys import checks

STDLIB_CORPUS_BYTES = 8 * 2**20
"""Bytes of source (= tokens) in the stdlib corpus: 8 MiB, about a quarter of the standard library,
read and written in well under a second."""
DATA_DIR_VARIABLE = "MLSYS_DATA_DIR"
"""Environment variable naming the folder of `stdlib_corpus`'s file (default ~/.cache/mlsys)."""
DTYPES = ("uint16", "uint32")
_SCAN_TOKENS = 1 << 24  # tokens per chunk when scanning a file for out-of-vocabulary ids
_EXCLUDED = {"site-packages", "dist-packages", "__pycache__"}  # not the standard library's source


def data_dir() -> Path:
    """`$MLSYS_DATA_DIR` if set, else `~/.cache/mlsys`."""
    return Path(os.environ.get(DATA_DIR_VARIABLE) or Path.home() / ".cache" / "mlsys")


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write to a unique temp file in the same folder, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stdlib_corpus(path: str | os.PathLike | None = None, *,
                  max_bytes: int = STDLIB_CORPUS_BYTES) -> Path:
    """The stdlib corpus as a uint16 token file (vocabulary 256); its path, written if needed.

    `path` defaults to `data_dir() / "stdlib-py<major>.<minor>-<max_bytes>.u16"`. A JSON sidecar
    (`<path>.json`: Python version, files, bytes) is written after the data and marks it complete;
    a file without a matching sidecar, or of the wrong size, is rebuilt.
    """
    checks.positive_int(max_bytes, "max_bytes")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if path is None:
        path = data_dir() / f"stdlib-py{version}-{max_bytes}.u16"
    path = Path(path)
    expected = {"python": version, "max_bytes": max_bytes, "dtype": "uint16"}
    try:
        info = json.loads(_sidecar(path).read_text())
        if ({k: info.get(k) for k in expected} == expected
                and path.stat().st_size == 2 * info["bytes"]):
            return path
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or incomplete: build it
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _EXCLUDED]  # not walked at all
        where = Path(folder).relative_to(root)
        files += [(where / n).as_posix() for n in names if n.endswith(".py")]
    files.sort()
    chunks, total, used = [], 0, 0
    for name in files:
        if total >= max_bytes:
            break
        text = (root / name).read_bytes()[: max_bytes - total]
        chunks.append(text)
        total += len(text)
        used += 1
    if total == 0:
        raise RuntimeError(f"no *.py files found under the standard library at {root}")
    tokens = np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, tokens.tobytes())
    info = {**expected, "bytes": total, "files": used, "source": str(root)}
    _write_atomic(_sidecar(path), json.dumps(info, indent=1).encode())
    return path


class TokenData:
    """A flat file of token ids (numpy memmap, read-only): `len(data)` tokens in `data.tokens`."""

    def __init__(self, path: str | os.PathLike, dtype: str = "uint16"):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        numpy_type = isinstance(dtype, np.dtype) or (isinstance(dtype, type)
                                                     and issubclass(dtype, np.generic))
        name = np.dtype(dtype).name if numpy_type else dtype
        checks.choice(name, "dtype", DTYPES)
        self.path, self.dtype = Path(path), np.dtype(name)
        if not self.path.is_file():
            raise FileNotFoundError(f"path={str(self.path)!r}: no such token file")
        size = self.path.stat().st_size
        if size == 0:
            raise ValueError(f"path={str(self.path)!r} is empty: a token file needs >= 1 token")
        if size % self.dtype.itemsize:
            raise ValueError(f"path={str(self.path)!r} has {size} bytes, not a multiple of "
                             f"{self.dtype.itemsize} (dtype={name}): wrong dtype or a "
                             "truncated file")
        self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __repr__(self) -> str:
        return f"TokenData({str(self.path)!r}, dtype={self.dtype.name!r}, tokens={len(self)})"

    def check_vocab(self, vocab_size: int) -> None:
        """Every token id must be < `vocab_size`: the file is scanned in chunks of 16 Mi tokens,
        and the first offending token and its position are named."""
        vocab = checks.positive_int(vocab_size, "vocab_size")
        for start in range(0, len(self), _SCAN_TOKENS):
            chunk = self.tokens[start:start + _SCAN_TOKENS]
            if int(chunk.max()) >= vocab:
                i = int(np.argmax(chunk >= vocab))
                raise ValueError(f"{self.path}: token {int(chunk[i])} at position {start + i} "
                                 f"is >= the model's vocab_size ({vocab})")


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step) alone: the same on every machine and rank."""
    digest = hashlib.sha256(f"mlsys.train.data:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Sampler:
    """Global batch of step s = `global_batch` windows of seq_len + 1 tokens, a pure function of
    (seed, s); `rank_micro_batches` gives one data-parallel rank its share. `step` is the next step
    to train on (the loop calls `advance()` after it), saved with `state_dict()`."""

    def __init__(self, data: TokenData, *, seq_len: int, global_batch: int, seed: int = 0):
        if not isinstance(data, TokenData):
            raise TypeError(f"data must be a TokenData, got {type(data).__name__}")
        self.data = data
        self.seq_len = checks.positive_int(seq_len, "seq_len")
        self.global_batch_size = checks.positive_int(global_batch, "global_batch")
        self.seed = checks.nonnegative_int(seed, "seed")
        if len(data) < seq_len + 1:
            raise ValueError(f"{data.path} has {len(data)} tokens, too few for one sequence of "
                             f"seq_len + 1 = {seq_len + 1}")
        self.step = 0

    def _starts(self, step: int) -> torch.Tensor:
        checks.nonnegative_int(step, "step")
        generator = torch.Generator().manual_seed(_step_seed(self.seed, step))
        high = len(self.data) - self.seq_len  # starts in [0, high): the window's end fits
        return torch.randint(0, high, (self.global_batch_size,), generator=generator)

    def _rows(self, starts: torch.Tensor) -> torch.Tensor:
        index = starts.numpy()[:, None] + np.arange(self.seq_len + 1)
        return torch.from_numpy(self.data.tokens[index].astype(np.int64))

    def global_batch(self, step: int) -> torch.Tensor:
        """Step `step`'s whole batch: int64, shape (global_batch, seq_len + 1)."""
        return self._rows(self._starts(step))

    def rank_micro_batches(self, step: int, *, dp_rank: int, dp_size: int,
                           micro_batch: int) -> list[torch.Tensor]:
        """Rank `dp_rank`'s rows [r G / dp, (r + 1) G / dp) of step `step`'s global batch, as
        G / (dp * micro_batch) int64 tensors of shape (micro_batch, seq_len + 1)."""
        dp = checks.positive_int(dp_size, "dp_size")
        rank = checks.nonnegative_int(dp_rank, "dp_rank")
        micro = checks.positive_int(micro_batch, "micro_batch")
        if rank >= dp:
            raise ValueError(f"dp_rank must be in [0, dp_size) = [0, {dp}), got {rank}")
        g = self.global_batch_size
        if g % (dp * micro):
            raise ValueError(f"global_batch ({g}) must be divisible by dp_size * micro_batch "
                             f"= {dp} * {micro} = {dp * micro}")
        share = g // dp
        rows = self._rows(self._starts(step)[rank * share:(rank + 1) * share])
        return list(rows.split(micro))

    def advance(self) -> int:
        """Move to the next step (after the optimizer step); returns the new `step`."""
        self.step += 1
        return self.step

    def state_dict(self) -> dict:
        """Plain JSON-able values: the position and what the batches depend on."""
        return {"seed": self.seed, "step": self.step, "seq_len": self.seq_len,
                "global_batch": self.global_batch_size, "tokens": len(self.data),
                "dtype": self.data.dtype.name}

    def load_state_dict(self, state: dict) -> None:
        """Resume at `state["step"]`; refuses a state whose batches would differ from this
        sampler's (another seed, seq_len, global_batch or data)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from Sampler.state_dict(), "
                            f"got {type(state).__name__}")
        mine = self.state_dict()
        missing = sorted(set(mine) - set(state))
        if missing:
            raise ValueError(f"sampler state lacks {missing}: not from Sampler.state_dict()")
        differ = [f"{k}: checkpoint {state[k]!r}, this run {v!r}" for k, v in mine.items()
                  if k != "step" and state[k] != v]
        if differ:
            raise ValueError("the checkpoint's sampler does not match this run's, so resuming "
                             "would change the batches: " + "; ".join(differ))
        self.step = checks.nonnegative_int(state["step"], "state['step']")
