"""`python -m mlsys.experiments`: run the book's experiments and record them.

    python -m mlsys.experiments --list         # names, chapters, expected GPU minutes, chunks
    python -m mlsys.experiments --check        # preflight, anywhere (aims at < 3 min on a GPU):
                                               # every experiment at smoke sizes, every Triton
                                               # kernel against its reference; writes nothing
    python -m mlsys.experiments --all          # on a CUDA GPU: every experiment, GPU sizes,
                                               # records written under results/<device>/
    python -m mlsys.experiments --chunk 2      # the second group of at most 8 minutes
    python -m mlsys.experiments --missing      # every experiment with no record for this GPU yet
    python -m mlsys.experiments roofline_ops train_step --out /tmp/records
    python -m mlsys.experiments train_step --force   # replace an existing record
    python -m mlsys.experiments --smoke --all  # anywhere: tiny sizes, records in a temp dir

Records under `results/` come only from real GPUs at GPU sizes: without CUDA this refuses GPU
sizes, and a smoke or CPU record is refused there (pass `--out DIR`). An existing record is never
replaced without `--force`; both rules are checked for every selected experiment before the first
one runs, and so is `--out` (a file, or a path this process cannot write, is refused). Each
experiment prints its table.

`--check` prints one pass/fail line per check (a failure's error in one line; a failure does not
stop the others) and a count, and exits with status 1 if any check failed. With names, `--all` or
`--chunk` it runs only those experiments (every kernel still); `--out` and `--force` do not apply.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlsys import env, experiments, results
from mlsys.experiments import preflight


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlsys.experiments",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"experiments to run: {', '.join(experiments.NAMES)}")
    p.add_argument("--all", action="store_true", help="run every experiment")
    p.add_argument("--chunk", type=int, metavar="K", help="run the K-th chunk of --list (1-based)")
    p.add_argument("--missing", action="store_true",
                   help="run every experiment with no record for this device yet (under --out)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (runs on a CPU in seconds)")
    p.add_argument("--out", type=Path, help="write records under DIR instead of results/")
    p.add_argument("--force", action="store_true", help="overwrite existing records")
    p.add_argument("--check", action="store_true",
                   help="preflight: every experiment at smoke sizes and every Triton kernel "
                        "against its reference; writes nothing, exits 1 if any check fails")
    return p


def _list() -> str:
    lines = [f"{'name':<20} {'chapter':<18} {'GPU min':>7}  description"]
    for name in experiments.NAMES:
        e = experiments.get(name)
        lines.append(f"{name:<20} {e.chapter:<18} {e.gpu_seconds / 60:>7.1f}  {e.description}")
    lines.append("")
    for k, group in enumerate(experiments.chunks(), start=1):
        minutes = sum(experiments.get(n).gpu_seconds for n in group) / 60
        lines.append(f"chunk {k} ({minutes:.1f} min): {' '.join(group)}")
    return "\n".join(lines)


def _unwritable(out: Path) -> str | None:
    """Why records cannot be written under `out` (None if they can): a file where a directory
    must be, or a directory this process cannot create or write in (tried: `out` is made, as
    the first record would make it, and a temporary file written in it and removed)."""
    folder = next(f for f in (out, *out.parents) if f.exists() or f == f.parent)
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        return f"records cannot be written there ({error.strerror or error})"
    return None


def _check(names: list[str], argv: list[str]) -> list[dict[str, Any]]:
    """The preflight: print each check's line as it ends, then the count."""
    print(preflight.HEADER, flush=True)
    rows = preflight.run(names, argv, report=lambda row: print(preflight.row_line(row), flush=True))
    print(preflight.count_line(rows), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> list[Path] | list[dict[str, Any]]:
    """Parse `argv`, refuse what cannot be trusted, run, print, write; returns the record paths
    (with `--check`: the check rows, see `mlsys.experiments.preflight`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print(_list())
        return []
    selected = [*args.names]
    for name in selected:
        if name not in experiments.NAMES:
            parser.error(f"unknown experiment {name!r}; known: {', '.join(experiments.NAMES)}")
    if args.all:
        selected = list(experiments.NAMES)
    if args.chunk is not None:
        groups = experiments.chunks()
        if not 1 <= args.chunk <= len(groups):
            parser.error(f"--chunk must be between 1 and {len(groups)}, got {args.chunk}")
        selected += groups[args.chunk - 1]
    if args.missing:
        selected += experiments.missing(env.device_name(), args.out)
    selected = list(dict.fromkeys(selected))  # each once, in order
    if args.check:
        if args.out is not None or args.force:
            parser.error("--check writes no record: --out and --force do not apply to it")
        return _check(selected or list(experiments.NAMES), argv)
    if not selected:
        parser.error("name at least one experiment, or pass --all, --chunk K, --missing, --check "
                     "or --list")
    on_gpu = env.device() == "cuda"
    if not args.smoke and not on_gpu:
        parser.error("GPU sizes need a CUDA GPU (records under results/ come only from real GPUs); "
                     "pass --smoke to run the tiny sizes here")
    out = args.out
    if args.smoke and out is None:
        out = Path(tempfile.mkdtemp(prefix="mlsys-experiments-"))
    profile = "smoke" if args.smoke else "gpu"
    # refuse up front, not after a long run: a non-GPU record under results/, an existing record
    provenance = {"profile": profile, "device": env.device_name(), "device_type": env.device()}
    for name in selected:
        path = experiments.record_path(name, provenance["device"], out)
        try:
            results.check_destination(path, provenance, force=args.force)
        except (ValueError, FileExistsError) as exc:
            parser.error(str(exc))
    if args.out is not None and (why := _unwritable(args.out)):
        parser.error(f"--out {args.out}: {why}; pass a directory this process can write "
                     "(records go to DIR/<device>/<name>.json)")
    paths = []
    for name in selected:
        experiment = experiments.get(name)
        print(f"\n== {name} ({experiment.chapter}): {experiment.description}", flush=True)
        start = time.perf_counter()
        record = experiments.run_record(name, profile, argv)
        print(repr(experiments.module(name).table(record["results"])))
        path = experiments.write(record, out, force=args.force)
        print(f"{time.perf_counter() - start:.1f} s; wrote {path}", flush=True)
        paths.append(path)
    return paths


def exit_status(result: list[Path] | list[dict[str, Any]]) -> int:
    """The process's exit status for `main`'s result: 1 if a check failed, else 0."""
    return int(any(isinstance(r, dict) and not r["ok"] for r in result))


if __name__ == "__main__":
    sys.exit(exit_status(main()))
