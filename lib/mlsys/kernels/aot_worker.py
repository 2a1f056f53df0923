"""The worker of `mlsys.kernels.aot`: compiles launches where Triton is not interpreted.

`python -m mlsys.kernels.aot_worker MODE` (started by `aot`, with TRITON_INTERPRET=0) reads one
`Launch` as JSON per line from stdin and answers one JSON line per launch: the `Compiled` record
(MODE "--worker", or "--ptx-only": tensor-core instructions counted in the PTX, no disassembly),
or the PTX and SASS listing ("--asm"). Each compile binds the kernel's arguments exactly as a real
launch does (the kernel module's `aot_args`), runs `triton.compile` for the named target with
ptxas's log on, and reads registers, spills and shared memory from it; `cuobjdump -sass` (shipped
in the Triton wheel) gives the machine code. Only this process imports Triton's compiler, so this
module is never imported by the parent. Used in: `mlsys.kernels.aot`.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (the kernels' tensors; imported before Triton, as in a real launch)
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from mlsys import dtypes, hardware
from mlsys.kernels.aot import (
    ASYNC_COPY_SASS,
    PTX_OPCODES,
    TENSOR_CORE_SASS,
    Compiled,
    Launch,
    parse_ptxas_log,
    sass_opcodes,
)
from mlsys.kernels.aot_cache import kernel_object, unwrap


def _tool(name: str) -> str:
    """The path of a tool Triton ships (ptxas, cuobjdump, nvdisasm)."""
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _one_line(error: Exception, width: int = 200) -> str:
    """An error in one line: its first line, and its last where they differ (Triton's
    CompilationError puts the source position first and the reason last)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text[:width]


def _compile_here(launch: Launch, workdir: Path, asm: dict[str, str] | None = None,
                  sass: bool = True) -> Compiled:
    """Compile `launch` in this process (TRITON_INTERPRET must be off); the record, or the error.
    With `asm`, also fill it with the PTX and the SASS listing; without `sass`, count the
    tensor-core instructions and asynchronous copies in the PTX and skip the disassembly."""
    start = time.perf_counter()
    try:
        module_name, _, name = launch.kernel.partition(".")
        module = importlib.import_module(f"mlsys.kernels.{module_name}")
        jit = unwrap(kernel_object(launch.kernel), JITFunction)
        args, constexprs = module.aot_args(name, dtypes.torch_dtype(launch.dtype),
                                           **launch.problem)
        target = GPUTarget("cuda", hardware.sm_architecture(launch.target).capability, 32)
        backend = make_backend(target)
        # bind and specialize the arguments exactly as JITFunction.run does for a real launch
        binder = create_function_from_signature(jit.signature, jit.params, backend)
        kwargs = {**constexprs, **launch.tile, "num_warps": launch.num_warps,
                  "num_stages": launch.num_stages}
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, consts, attrs = jit._pack_args(backend, options, bound,
                                                           specialization, options)
        knobs.nvidia.dump_ptxas_log = True
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(jit, signature, consts, attrs), target=target,
                                      options=options.__dict__)
        seconds = time.perf_counter() - start
        resources = {**parse_ptxas_log(log.getvalue()),
                     "shared_bytes": int(compiled.metadata.shared), "compile_s": round(seconds, 3)}
        if not sass:
            ptx = compiled.asm["ptx"]
            counts = {name: len(re.findall(rx, ptx)) for name, rx in PTX_OPCODES.items()}
            return Compiled(launch=launch, **resources,
                            opcodes={k: n for k, n in counts.items() if n})
        cubin = workdir / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        listing = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True,
                                 text=True, check=True, timeout=120).stdout
        if asm is not None:
            asm.update(ptx=compiled.asm["ptx"], sass=listing)
        counts = sass_opcodes(listing)
        wanted = TENSOR_CORE_SASS + ASYNC_COPY_SASS
        return Compiled(launch=launch, **resources, sass_instructions=sum(counts.values()),
                        opcodes={op: counts[op] for op in wanted if counts[op]})
    except Exception as error:  # a failed compile is a result: the report shows it
        return Compiled(launch=launch, compile_s=round(time.perf_counter() - start, 3),
                        error=f"{type(error).__name__}: {_one_line(error)}")


def _worker_main(mode: str) -> None:
    """Read one launch (JSON) per line from stdin, answer one JSON line on the original stdout.

    Anything else that prints (Triton's dumps) goes to stderr, so the protocol stays clean."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        raise SystemExit("the aot worker needs TRITON_INTERPRET=0")
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    with tempfile.TemporaryDirectory(prefix="mlsys-aot-") as tmp:
        for line in sys.stdin:
            launch = Launch.from_dict(json.loads(line))
            asm: dict[str, str] = {}
            # a fresh Triton cache for every compile: a hit (two launches that compile to the
            # same kernel) would skip ptxas, and with it the log of registers and spills
            triton_cache = Path(tmp) / "triton"
            shutil.rmtree(triton_cache, ignore_errors=True)
            os.environ["TRITON_CACHE_DIR"] = str(triton_cache)
            compiled = _compile_here(launch, Path(tmp), asm, sass=mode != "--ptx-only")
            out = {**asm, "error": compiled.error} if mode == "--asm" else compiled.as_dict()
            answer.write(json.dumps(out) + "\n")
            answer.flush()


if __name__ == "__main__":
    _worker_main(sys.argv[1] if len(sys.argv) > 1 else "--worker")
