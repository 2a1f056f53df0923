"""Compile a kernel of the book ahead of time for a GPU that is not here, and read what came out.

Triton compiles for a named target with no GPU and no driver: Python -> Triton IR -> LLVM -> PTX,
then `ptxas` (shipped inside the Triton wheel) -> a cubin of SASS, the GPU's machine code. What the
compiler decided is then plain to read:

- registers per thread, and the bytes it spilled to local memory when they ran out (ptxas -v);
- the shared memory a block asks for at launch (`metadata.shared`: the software pipeline's staged
  tiles and the layout conversions);
- the SASS itself (`cuobjdump -sass`): how many instructions, whether the dot products became
  tensor-core instructions (HMMA on sm_80, HGMMA = wgmma on sm_90) and whether loads were issued
  as asynchronous copies into shared memory (LDGSTS = cp.async; UTMALDG = TMA);
- from those, the occupancy a block allows (`mlsys.accounting.occupancy`).

A `Launch` names one kernel of `KERNEL_MODULES` (e.g. "flash_attention.fwd"), the problem whose
arguments it is launched with, its tile constexprs, num_warps, num_stages and the target. Its
arguments come from the kernel module's own `aot_args` (the launcher's code), so the signature is
specialized exactly as a real launch's: ints divisible by 16 and 16-byte aligned pointers get
`tt.divisibility`, a unit stride becomes the constant 1 (hand-written signatures give other code).

Compiling needs Triton out of its interpreter, which `mlsys.env` turns on without a GPU: the work
runs in worker processes (`mlsys.kernels.aot_worker`, TRITON_INTERPRET=0), `jobs` at a time,
each compile with a timeout, so this can run beside interpreted kernels. Results are cached on
disk (`mlsys.kernels.aot_cache`), keyed by the launch, the kernel's source and the Triton
version. Facts and pitfalls: shared/notes/triton-ahead-of-time.md. A little over 300 lines:
the launch's signature, its compile and the reading of the result are one round trip.
Used in: chapters 04 and 06 through `mlsys.kernels.compile_report`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlsys import checks, hardware
from mlsys.accounting import occupancy
from mlsys.kernels.aot_cache import cache_dir, cache_key, source_hash, triton_version

KERNEL_MODULES = ("elementwise", "softmax", "rmsnorm", "flash_attention")
"""Modules of `mlsys.kernels` whose kernels compile ahead of time; each defines `AOT_KERNELS`
(name -> attribute) and `aot_args(name, dtype, **problem) -> (args, constexprs)`."""
TARGETS = tuple(hardware.SM_ARCHITECTURES)
"""Compiler targets: sm_80 (A100), sm_89 (L40S), sm_90 (H100; Triton emits sm_90a for wgmma)."""
COMPILE_TIMEOUT_S = 600.0
"""A compile that takes longer is stopped and recorded as failed (fp32 tiles have taken 107 s)."""
TENSOR_CORE_SASS = ("HMMA", "HGMMA", "IMMA", "QGMMA")
"""SASS opcodes of the tensor cores: mma.sync (HMMA), wgmma (HGMMA), integer and fp8 forms."""
ASYNC_COPY_SASS = ("LDGSTS", "UTMALDG")
"""SASS opcodes that copy global -> shared memory asynchronously: cp.async (LDGSTS), TMA."""
PTX_OPCODES = {"mma.sync": r"\bmma\.sync\.aligned", "wgmma": r"\bwgmma\.mma_async\.sync",
               "cp.async": r"\bcp\.async\.c[ag]\.shared",
               "cp.async.bulk": r"\bcp\.async\.bulk\.tensor"}
"""Without the SASS (`sass=False`, quicker): the same facts counted in the PTX, name -> regex."""
TENSOR_CORE_OPS = (*TENSOR_CORE_SASS, "mma.sync", "wgmma")
ASYNC_COPY_OPS = (*ASYNC_COPY_SASS, "cp.async", "cp.async.bulk")


@dataclass(frozen=True)
class Launch:
    """One kernel launch to compile: kernel, problem, tile constexprs, warps, stages, target."""

    kernel: str  # "<module>.<name>", e.g. "flash_attention.fwd"
    dtype: str  # input dtype: "fp32", "bf16" or "fp16"
    problem: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments of aot_args
    tile: Mapping[str, Any] = field(default_factory=dict)  # tuned constexprs, e.g. BLOCK_M
    num_warps: int = 4  # Triton's defaults for a plain launch and for triton.Config
    num_stages: int = 3
    target: str = "sm_90"

    def __post_init__(self) -> None:
        module, _, name = self.kernel.partition(".")
        if module not in KERNEL_MODULES or not name:
            raise ValueError(f"kernel={self.kernel!r} must be '<module>.<name>' with the module "
                             f"one of {', '.join(KERNEL_MODULES)}")
        checks.choice(self.dtype, "dtype", ("fp32", "bf16", "fp16"))
        checks.choice(self.target, "target", TARGETS)
        checks.positive_int(self.num_warps, "num_warps")
        checks.positive_int(self.num_stages, "num_stages")
        if self.num_warps & (self.num_warps - 1) or self.num_warps > 32:
            raise ValueError(f"num_warps must be a power of two <= 32, got {self.num_warps}")

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "dtype": self.dtype, "problem": dict(self.problem),
                "tile": dict(self.tile), "num_warps": self.num_warps,
                "num_stages": self.num_stages, "target": self.target}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Launch:
        return cls(**{k: d[k] for k in ("kernel", "dtype", "problem", "tile", "num_warps",
                                         "num_stages", "target")})

    def label(self) -> str:
        """Short name: 'flash_attention.fwd bf16 BLOCK_M=64 BLOCK_N=32 w4 s2 sm_90'."""
        tile = " ".join(f"{k}={v}" for k, v in self.tile.items())
        return (f"{self.kernel} {self.dtype} {tile} w{self.num_warps} s{self.num_stages} "
                f"{self.target}").replace("  ", " ")


@dataclass(frozen=True)
class Compiled:
    """What the compiler made of one `Launch` (error non-empty: it did not compile)."""

    launch: Launch
    registers: int = 0  # per thread
    spill_store_bytes: int = 0  # per thread, to local memory
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0  # dynamic shared memory per block, asked for at launch
    sass_instructions: int = 0
    opcodes: Mapping[str, int] = field(default_factory=dict)  # tensor-core and async-copy counts
    compile_s: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    @property
    def tensor_core_instructions(self) -> int:
        return sum(self.opcodes.get(op, 0) for op in TENSOR_CORE_OPS)

    @property
    def async_copies(self) -> int:
        return sum(self.opcodes.get(op, 0) for op in ASYNC_COPY_OPS)

    @property
    def fits_shared(self) -> bool:
        """Does a block's shared memory fit the target's opt-in maximum (else: no launch)?"""
        return self.shared_bytes <= hardware.sm_architecture(self.launch.target) \
            .shared_per_block_bytes

    def occupancy(self) -> occupancy.Occupancy:
        """Blocks and warps per SM that these registers and this shared memory allow."""
        return occupancy.occupancy(self.registers, self.shared_bytes, self.launch.num_warps,
                                   self.launch.target)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["launch"] = self.launch.as_dict()
        out["opcodes"] = dict(self.opcodes)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Compiled:
        return cls(**{**d, "launch": Launch.from_dict(d["launch"])})


# --- reading the compiler's output ----------------------------------------------------------------

_PTXAS_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "stack_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
}
_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def parse_ptxas_log(log: str) -> dict[str, int]:
    """Registers, stack and spill bytes per thread from a `ptxas -v` log (ValueError if absent)."""
    out = {}
    for key, pattern in _PTXAS_PATTERNS.items():
        found = re.findall(pattern, log)
        if len(found) != 1:
            raise ValueError(f"the ptxas log has {len(found)} matches of {pattern!r}, expected 1 "
                             f"(is TRITON's dump_ptxas_log on?): {log[-300:]!r}")
        out[key] = int(found[0])
    return out


def sass_opcodes(sass: str) -> Counter:
    """Opcode -> count over the instructions of a `cuobjdump -sass` listing (modifiers dropped:
    'HMMA.16816.F32.BF16' counts as HMMA)."""
    return Counter(_SASS_LINE.findall(sass))


def compiled_asm(*launches: Launch) -> list[dict[str, str]]:
    """PTX and SASS listing of each launch, compiled in one worker process (not cached): dicts
    with keys "ptx", "sass" and "error" (empty when it compiled)."""
    for launch in launches:
        if not isinstance(launch, Launch):
            raise TypeError(f"launches must be Launch objects, got {type(launch).__name__}")
    answers = _run_workers(list(launches), jobs=1, mode="--asm")
    return [{"ptx": "", "sass": "", **answer} for answer in answers]


# --- the parent: cache, worker pool, timeouts ----------------------------------------------------


def _worker_env() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    lib = str(Path(__file__).resolve().parents[2])  # lib/, so the worker imports this mlsys
    env["PYTHONPATH"] = os.pathsep.join(p for p in (lib, env.get("PYTHONPATH", "")) if p)
    return env


def _start_worker(mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlsys.kernels.aot_worker", mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_worker_env())


def _run_workers(launches: list[Launch], *, jobs: int, mode: str = "--worker",
                 timeout_s: float = COMPILE_TIMEOUT_S,
                 on_answer: Callable[[int, dict], None] | None = None) -> list[dict[str, Any]]:
    """Send each launch to one of `jobs` worker processes; answers in the launches' order (each
    also passed to `on_answer(index, answer)` as it comes). A launch that takes longer than
    `timeout_s` (or kills its worker) gets an error answer."""
    todo: queue.Queue = queue.Queue()
    for index, launch in enumerate(launches):
        todo.put((index, launch))
    answers: list[dict[str, Any] | None] = [None] * len(launches)

    def serve() -> None:
        worker = None
        try:
            while True:
                try:
                    index, launch = todo.get_nowait()
                except queue.Empty:
                    return
                worker = worker or _start_worker(mode)
                worker.stdin.write(json.dumps(launch.as_dict()) + "\n")
                worker.stdin.flush()
                ready, _, _ = select.select([worker.stdout], [], [], timeout_s)
                line = worker.stdout.readline() if ready else ""
                if line:
                    answers[index] = json.loads(line)
                else:
                    why = f"timed out after {timeout_s:.0f} s" if not ready else "the worker died"
                    answers[index] = Compiled(launch=launch,
                                              error=f"CompileError: {why}").as_dict()
                    worker.kill()
                    worker.wait()
                    worker = None
                if on_answer is not None:
                    on_answer(index, answers[index])
        finally:
            if worker is not None:
                worker.stdin.close()
                worker.wait(timeout=60)

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [a for a in answers if a is not None]


def compile_launches(launches: Iterable[Launch], *, jobs: int | None = None,
                     use_cache: bool = True, sass: bool = True,
                     timeout_s: float = COMPILE_TIMEOUT_S) -> list[Compiled]:
    """Compile every launch (cached ones are read back), `jobs` worker processes at a time
    (default: one per CPU core); records in the launches' order. Without `sass` the SASS is not
    disassembled (a third quicker): tensor-core instructions and asynchronous copies are counted
    in the PTX (`PTX_OPCODES`) and `sass_instructions` is 0."""
    launches = list(launches)
    for launch in launches:
        if not isinstance(launch, Launch):
            raise TypeError(f"launches must hold Launch objects, got {type(launch).__name__}")
    jobs = (os.cpu_count() or 1) if jobs is None else checks.positive_int(jobs, "jobs")
    timeout_s = checks.positive(timeout_s, "timeout_s")
    triton = triton_version()
    sources = {k: source_hash(k) for k in {launch.kernel for launch in launches}}
    keys = [cache_key(launch, sources[launch.kernel], triton + ("" if sass else "+ptx-only"))
            for launch in launches]
    folder = cache_dir()
    found: dict[int, Compiled] = {}
    if use_cache:
        for i, key in enumerate(keys):
            path = folder / f"{key}.json"
            if path.exists():
                found[i] = Compiled.from_dict(json.loads(path.read_text()))
    missing = [i for i in range(len(launches)) if i not in found]

    def keep(index: int, answer: dict) -> None:  # cache each record as it comes
        i = missing[index]
        found[i] = Compiled.from_dict(answer)
        if use_cache and "timed out" not in found[i].error:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{keys[i]}.json").write_text(json.dumps(answer))

    _run_workers([launches[i] for i in missing], jobs=jobs, timeout_s=timeout_s, on_answer=keep,
                 mode="--worker" if sass else "--ptx-only")
    return [found[i] for i in range(len(launches))]

