"""The disk cache of ahead-of-time compiles, and what keys it: the kernel's source, the Triton
version.

A compile of `mlsys.kernels.aot` is a pure function of the launch, the kernel's Python source
(`source_hash`: from its `def` line, decorators excluded), the Triton version and `FORMAT`, so its
record is kept on disk (`MLSYS_AOT_CACHE`, default ~/.cache/mlsys/aot) under `cache_key` of the
four and read back instead of compiling again. `kernel_object` finds a kernel by its name
("softmax.fwd") in the module that defines it. Used in: `mlsys.kernels.aot`,
`mlsys.kernels.aot_worker`, `mlsys.kernels.compile_report` (the report's source hashes).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = 1
"""Version of the records `mlsys.kernels.aot` writes; a change invalidates the disk cache."""


def kernel_object(kernel: str) -> Any:
    """The kernel `kernel` ("softmax.fwd") as its module defines it (a wrapper or JIT function)."""
    module_name, _, name = kernel.partition(".")
    module = importlib.import_module(f"mlsys.kernels.{module_name}")
    attr = module.AOT_KERNELS.get(name)
    if attr is None:
        raise ValueError(f"kernel={kernel!r}: mlsys.kernels.{module_name} has no kernel {name!r}; "
                         f"it has {', '.join(module.AOT_KERNELS)}")
    return getattr(module, attr)


def unwrap(kernel: Any, until: type | None = None) -> Any:
    """Unwrap Triton's autotuner, JIT and interpreted functions and the book's launch wrappers (all
    keep the wrapped object in `.fn`) down to an instance of `until`, or to the Python function."""
    while not (until is not None and isinstance(kernel, until)) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    if until is not None and not isinstance(kernel, until):
        raise TypeError(f"{kernel!r} holds no {until.__name__} (is TRITON_INTERPRET on?)")
    return kernel


def source_hash(kernel: str) -> str:
    """sha256 (16 hex digits) of the kernel's Python source from its `def` line: what Triton
    compiles (decorators and everything around the function excluded)."""
    source = textwrap.dedent(inspect.getsource(unwrap(kernel_object(kernel))))
    body = source[source.index("def "):]
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def triton_version() -> str:
    """The installed Triton's version (PackageNotFoundError where it is absent: macOS)."""
    return metadata.version("triton")


def cache_dir() -> Path:
    """Where compile records are kept: $MLSYS_AOT_CACHE, else ~/.cache/mlsys/aot."""
    return Path(os.environ.get("MLSYS_AOT_CACHE") or Path.home() / ".cache" / "mlsys" / "aot")


def cache_key(launch: Any, source: str, triton: str) -> str:
    """sha256 of the launch (an `aot.Launch`), the kernel's source hash, the Triton version and
    `FORMAT`: the name of its record in `cache_dir()`."""
    text = json.dumps({"launch": launch.as_dict(), "source": source, "triton": triton,
                       "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
