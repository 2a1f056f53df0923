"""The compile report: every kernel of the book, every tile it may launch with, compiled for the
A100 (sm_80) and the H100 (sm_90) on a CPU, and what the compiler made of each.

`candidates(matrix)` lists the launches: for each kernel, its problems (dtypes, head dims, row
widths, chain lengths) and every tile the library's own pruning would let it launch with (the
autotune spaces and the untuned defaults). `matrix="full"` takes every head dim and width the
kernels accept, in bf16 (standing for fp16 too) and fp32; `matrix="ci"` what the chapters and
experiments launch, which `make test` compiles (`tests/kernels/test_compile_report.py`). Each
candidate is judged by `verdict`:

- kept: it compiled with no register spills, its shared memory fits, and a 16-bit flash kernel's
  dot products reached the tensor cores (fp32 flash is exact fp32, which has no tensor-core path:
  kept for that reason, stated in `FP32_FLASH`);
- removed, with the reason: spills, shared memory past the opt-in maximum, a failed compile, or
  no tensor-core instruction.

The autotuners never time a removed tile (`tile_space.removed`), and the test fails if one comes
back. `python -m mlsys.kernels.compile_report` writes the report (`REPORT_PATH`, JSON) with the
versions, the date, the command and each kernel's source hash; `make compile-report` regenerates
the full one. Chapters read it through `load` and `mlsys.kernels.compile_tables`.
A little over 300 lines: the report's schema, its writer and its reader share one format.
Used in: chapters 04 and 06.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsys import checks, env, results
from mlsys.kernels import aot, aot_cache, flash_attention, flash_tiles, rmsnorm, row_tiles
from mlsys.kernels._triton import triton
from mlsys.kernels.aot import Compiled, Launch
from mlsys.kernels.tile_space import REPORT_PATH

MATRICES = ("ci", "full")
CI_TARGETS = ("sm_80", "sm_90")
FLASH_PROBLEM = {"batch": 2, "heads": 16, "seq": 1024}
"""Representative flash launch: seq divisible by 16 (as most are), so n_q, n_k specialize as the
JIT does for such lengths."""
ROW_ROWS = 4096
"""Rows of the representative row-kernel launch: enough that every BLOCK_M up to 64 is allowed."""
FLASH_KERNELS = ("fwd", "dkdv", "dq")
ROW_KERNELS = ("softmax.fwd", "softmax.bwd", "rmsnorm.fwd", "rmsnorm.bwd")
FP32_FLASH = ("fp32 flash computes tl.dot in IEEE fp32 (input_precision='ieee', for fp32 "
              "tolerances); the tensor cores have no IEEE fp32 mode, so it runs on the FMA units: "
              "kept for exactness, not speed (use bf16 or fp16 for speed)")

MATRIX = {
    # what the chapters and experiments launch on a GPU (ci), everything the kernels accept (full)
    "ci": {"flash": (*(("bf16", d, c) for d in (64, 128) for c in (False, True)),
                     ("fp32", 64, False), ("fp32", 64, True)),
           "row_dtypes": ("fp32", "bf16"), "row_cols": (1024, 4096, 8192),
           "chains": (("fma", 0), ("fma", 1), ("fma", 16), ("fma", 512), ("cos", 2))},
    "full": {"flash": tuple(itertools.product(("bf16", "fp32"), (16, 32, 64, 128),
                                              (False, True))),
             "row_dtypes": ("fp32", "bf16"),
             "row_cols": tuple(2**p for p in range(4, 17)),
             "chains": (*(("fma", k) for k in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)),
                        ("cos", 1), ("cos", 2), ("cos", 64))},
}
"""The problems of each matrix: flash (dtype, head dim, causal), row-kernel dtypes and widths, and
the elementwise chains (op, k). fp16 is left out: its loads, stores and tensor-core instructions
have bf16's widths and shapes, so it borrows bf16's judgement (`tile_space.removed`).
ci: flash in bf16 at d = 64 and 128 (chapter 06's correctness check and the model step at 64,
the benchmark at 128; with and without the mask) and in fp32 at d = 64 (the check, the
benchmark's fp32 rows); the row kernels at the widths `fused_kernels` times, in fp32 and bf16;
the fma chain's ends and chapter 04's cos-cos kernel."""


def _configs_as_launches(kernel: str, dtype: str, problem: dict, configs: Iterable[Any],
                         targets: Iterable[str]) -> list[Launch]:
    return [Launch(kernel, dtype, problem, dict(c.kwargs), c.num_warps, c.num_stages, t)
            for c in configs for t in targets]


def _row_candidates(kernel: str, dtype: str, n_cols: int, target: str, *,
                    every: bool) -> list[Launch]:
    """The row tiles of one kernel and width: those the library keeps on `target`, or (`every`)
    those its heuristics allow plus the untuned default, before the report's removals."""
    block_n = 1 << (n_cols - 1).bit_length()
    configs = row_tiles.row_tile_configs()
    if every:
        chosen = row_tiles.keep_row_tiles(configs, ROW_ROWS, block_n, compiled=True)
        m, w = row_tiles.default_row_tile(ROW_ROWS, block_n, compiled=True)
        if (m, w) not in {(c.kwargs["BLOCK_M"], c.num_warps) for c in chosen}:
            chosen.append(triton.Config({"BLOCK_M": m}, num_warps=w))
    else:
        chosen = row_tiles.keep_row_tiles(configs, ROW_ROWS, block_n, compiled=True,
                                          kernel=kernel, dtype=dtype, target=target)
    problem = {"n_rows": ROW_ROWS, "n_cols": n_cols}
    return _configs_as_launches(kernel, dtype, problem, chosen, (target,))


def candidates(matrix: str = "ci", targets: Iterable[str] = CI_TARGETS, *,
               every: bool = False) -> list[Launch]:
    """The launches of `matrix` ("ci" or "full") for `targets`. Tiles: those the library's
    pruning keeps (`every=False`), or every candidate its heuristics allow before the compile
    report's removals (`every=True`: what the full report judges)."""
    spec = MATRIX[checks.choice(matrix, "matrix", MATRICES)]
    targets = tuple(checks.choice(t, "targets", aot.TARGETS) for t in targets)
    out: list[Launch] = []
    for dtype, d, causal in spec["flash"]:
        problem = {**FLASH_PROBLEM, "head_dim": d, "causal": causal}
        for kernel in FLASH_KERNELS:
            for target in targets:
                configs = (flash_tiles.tile_configs(kernel, dtype) if every else
                           flash_tiles.launchable_tiles(kernel, d, dtype, target))
                out += _configs_as_launches(f"flash_attention.{kernel}", dtype, problem,
                                            configs, (target,))
        if not causal:  # D = rowsum(dO * O) does not depend on the mask: one per head dim
            out += [Launch("flash_attention.preprocess", dtype, problem, {},
                           flash_attention.PREPROCESS_WARPS, 3, t) for t in targets]
    for dtype, n_cols in itertools.product(spec["row_dtypes"], spec["row_cols"]):
        for kernel, target in itertools.product(ROW_KERNELS, targets):
            out += _row_candidates(kernel, dtype, n_cols, target, every=every)
    for dtype in spec["row_dtypes"]:  # its fixed tile reads fp32 partial rows: one width will do
        tile = rmsnorm.COLUMN_SUM_TILE
        out += [Launch("rmsnorm.column_sum", dtype, {"n_rows": ROW_ROWS, "n_cols": 1024},
                       {}, tile["num_warps"], 3, t) for t in targets]
    for dtype in spec["row_dtypes"]:
        for op, k in spec["chains"]:
            problem = {"n_elements": 2**24, "k": k, "op": op}
            out += [Launch("elementwise.repeat_unary", dtype, problem, {}, 4, 3, t)
                    for t in targets]
    return out


# --- judging one compile -------------------------------------------------------------------------


def uses_tensor_cores(launch: Launch) -> bool:
    """Should this launch's dot products run on the tensor cores? The 16-bit flash kernels."""
    return launch.kernel in {f"flash_attention.{k}" for k in FLASH_KERNELS} \
        and launch.dtype != "fp32"


def verdict(compiled: Compiled) -> str:
    """"kept", or why the tile is removed from the search space (one line)."""
    if not compiled.ok:
        return f"removed: does not compile ({compiled.error})"
    if compiled.spills:
        return (f"removed: spills {compiled.spill_store_bytes} B per thread to local memory at "
                f"{compiled.registers} registers")
    if not compiled.fits_shared:
        return f"removed: asks for {compiled.shared_bytes} B of shared memory, past the maximum"
    if uses_tensor_cores(compiled.launch) and not compiled.tensor_core_instructions:
        return "removed: its dot products do not reach the tensor cores"
    return "kept"


# --- the report: build, save, load, check ---------------------------------------------------------

COLUMNS = ("kernel", "dtype", "problem", "tile", "num_warps", "num_stages", "target", "registers",
           "spill_store_bytes", "spill_load_bytes", "stack_bytes", "shared_bytes",
           "sass_instructions", "opcodes", "compile_s", "error", "verdict")
"""One row per compiled launch; `verdict` is `verdict(compiled)`, stored for the autotuners."""


@dataclass(frozen=True)
class Report:
    """Every compiled launch of a matrix, with what produced the report."""

    provenance: Mapping[str, Any]  # versions, date, commit, command, matrix, targets
    sources: Mapping[str, str]  # kernel -> `aot_cache.source_hash` when compiled
    entries: tuple[Compiled, ...]

    def select(self, kernel: str | None = None, dtype: str | None = None,
               target: str | None = None, **problem: Any) -> list[Compiled]:
        """The entries of `kernel`, `dtype`, `target` whose problem has the given items."""
        return [c for c in self.entries
                if kernel in (None, c.launch.kernel) and dtype in (None, c.launch.dtype)
                and target in (None, c.launch.target)
                and all(c.launch.problem.get(k) == v for k, v in problem.items())]

    def removed(self) -> list[Compiled]:
        return [c for c in self.entries if verdict(c) != "kept"]


def build(matrix: str = "full", targets: Iterable[str] = CI_TARGETS, *, every: bool = True,
          jobs: int | None = None, sass: bool = True, command: str = "") -> Report:
    """Compile the launches of `matrix` for `targets` (all candidates with `every`, else only
    the tiles the library keeps; without `sass`, tensor cores counted in the PTX) and return
    the report."""
    targets = tuple(targets)
    launches = candidates(matrix, targets, every=every)
    start = time.perf_counter()
    entries = tuple(aot.compile_launches(launches, jobs=jobs, sass=sass))
    provenance = {
        "matrix": matrix, "targets": list(targets), "every_candidate": every, "sass": sass,
        "triton_version": aot_cache.triton_version(), "torch_version": env.versions()["torch"],
        "python_version": env.versions()["python"], "host": env.device_name(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": results.git_commit(), "command": command,
        "wall_s": round(time.perf_counter() - start, 1),  # this run (cached compiles: ~0)
        "compile_s_total": round(sum(c.compile_s for c in entries), 1),  # when each was compiled
    }
    sources = {k: aot_cache.source_hash(k) for k in sorted({c.launch.kernel for c in entries})}
    return Report(provenance, sources, entries)


def save(report: Report, path: Path = REPORT_PATH) -> Path:
    """Write the report as compact JSON: one row per launch under `COLUMNS`."""
    rows = []
    for c in report.entries:
        d = {**c.as_dict(), **c.launch.as_dict(), "verdict": verdict(c)}
        rows.append([d[name] for name in COLUMNS])
    text = json.dumps({"format": aot_cache.FORMAT, "provenance": dict(report.provenance),
                       "sources": dict(report.sources), "columns": list(COLUMNS),
                       "rows": rows}, separators=(",", ":"))
    path = Path(path)
    path.write_text(text.replace('],["', '],\n["') + "\n")  # a line per launch: readable diffs
    return path


def load(path: Path = REPORT_PATH) -> Report:
    """The report at `path` (default: the committed one); FileNotFoundError naming the command
    that writes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no compile report at {path}; `make compile-report` writes it")
    data = json.loads(path.read_text())
    entries = []
    for row in data["rows"]:
        d = dict(zip(data["columns"], row, strict=True))
        launch = Launch.from_dict(d)
        fields = {k: d[k] for k in COLUMNS if k in Compiled.__dataclass_fields__}
        entries.append(Compiled(launch=launch, **fields))
    return Report(data["provenance"], data["sources"], tuple(entries))


def stale_sources(report: Report) -> dict[str, tuple[str, str]]:
    """Kernels whose source changed since the report was written: kernel -> (then, now)."""
    now = {k: aot_cache.source_hash(k) for k in report.sources}
    return {k: (v, now[k]) for k, v in report.sources.items() if now[k] != v}


def failures(entries: Iterable[Compiled]) -> list[str]:
    """One line per entry that is not "kept": label and why."""
    return [f"{c.launch.label()} {dict(c.launch.problem)}: {verdict(c)}" for c in entries
            if verdict(c) != "kept"]


def compare(other: Report, base: Report) -> list[str]:
    """Lines describing how `other` (another Triton, say) differs from `base` on the launches
    both hold: verdicts that changed, and how registers and shared memory moved."""
    mine = {json.dumps(c.launch.as_dict(), sort_keys=True): c for c in base.entries}
    pairs = [(c, mine[k]) for c in other.entries
             if (k := json.dumps(c.launch.as_dict(), sort_keys=True)) in mine]
    changed = [f"  {c.launch.label()} {dict(c.launch.problem)}: {verdict(b)} -> {verdict(c)}"
               for c, b in pairs if verdict(c) != verdict(b)]
    regs = [c.registers - b.registers for c, b in pairs if c.ok and b.ok]
    smem = [c.shared_bytes - b.shared_bytes for c, b in pairs if c.ok and b.ok]
    v_other, v_base = other.provenance["triton_version"], base.provenance["triton_version"]
    lines = [f"Triton {v_other} against {v_base}: {len(pairs)} launches in both, "
             f"{sum(c.ok for c, _ in pairs)} compiled, {len(changed)} verdicts changed",
             f"registers: {sum(r == 0 for r in regs)} equal, {sum(r < 0 for r in regs)} fewer, "
             f"{sum(r > 0 for r in regs)} more (range {min(regs, default=0)} to "
             f"{max(regs, default=0)})",
             f"shared memory: {sum(m == 0 for m in smem)} equal, range {min(smem, default=0)} to "
             f"{max(smem, default=0)} bytes"]
    return lines + changed


def main(argv: list[str] | None = None) -> Report:
    """`python -m mlsys.kernels.compile_report [--matrix full|ci] [--kept] [--out PATH]`."""
    parser = argparse.ArgumentParser(
        prog="python -m mlsys.kernels.compile_report",
        description="Compile every kernel and tile for sm_80 and sm_90 (no GPU needed) and "
                    "write the compile report.")
    parser.add_argument("--matrix", choices=MATRICES, default="full")
    parser.add_argument("--targets", default=",".join(CI_TARGETS),
                        help=f"comma-separated, of {', '.join(aot.TARGETS)}")
    parser.add_argument("--kept", action="store_true",
                        help="only the tiles the library keeps (default: every candidate)")
    parser.add_argument("--no-sass", action="store_true",
                        help="count tensor-core instructions in the PTX; skip disassembling")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: "
                        "one per core)")
    parser.add_argument("--out", type=Path, default=REPORT_PATH)
    parser.add_argument("--compare", type=Path, metavar="REPORT",
                        help="compare REPORT with the committed one and exit (nothing compiled)")
    args = parser.parse_args(argv)
    if args.compare is not None:
        other = load(args.compare)
        print("\n".join(compare(other, load())))
        return other
    targets = tuple(t.strip() for t in args.targets.split(","))
    for target in targets:
        if target not in aot.TARGETS:
            parser.error(f"--targets: {target!r} is not one of {', '.join(aot.TARGETS)}")
    command = " ".join(["python -m mlsys.kernels.compile_report", *(argv or sys.argv[1:])])
    report = build(args.matrix, targets, every=not args.kept, jobs=args.jobs,
                   sass=not args.no_sass, command=command)
    path = save(report, args.out)
    removed = report.removed()
    print(f"{len(report.entries)} launches compiled for {', '.join(targets)} in "
          f"{report.provenance['wall_s']} s ({report.provenance['compile_s_total']} s of "
          f"compiling, cached ones included); {len(removed)} removed; wrote {path}")
    for line in failures(removed)[:20]:
        print("  " + line)
    return report


if __name__ == "__main__":
    main()
