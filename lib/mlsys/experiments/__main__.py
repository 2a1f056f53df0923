"""`python -m mlsys.experiments`: run the book's experiments and record them.

    python -m mlsys.experiments --list         # names, chapters, expected GPU minutes, chunks
    python -m mlsys.experiments --all          # on a CUDA GPU: every experiment, GPU sizes,
                                               # records written under results/<device>/
    python -m mlsys.experiments --chunk 2      # the second group of at most 8 minutes
    python -m mlsys.experiments roofline_ops train_step --out /tmp/records
    python -m mlsys.experiments --smoke --all  # anywhere: tiny sizes, records in a temp dir

Records under `results/` come only from real GPUs: without CUDA this refuses GPU sizes, and smoke
sizes are never written there. Each experiment prints its table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mlsys import env, experiments


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlsys.experiments",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"experiments to run: {', '.join(experiments.NAMES)}")
    p.add_argument("--all", action="store_true", help="run every experiment")
    p.add_argument("--chunk", type=int, metavar="K", help="run the K-th chunk of --list (1-based)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (runs on a CPU in seconds)")
    p.add_argument("--out", type=Path, help="write records under DIR instead of results/")
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


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Parse `argv`, refuse what cannot be trusted, run, print, write; returns the record paths."""
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
    if not selected:
        parser.error("name at least one experiment, or pass --all, --chunk K or --list")
    on_gpu = env.device() == "cuda"
    if not args.smoke and not on_gpu:
        parser.error("GPU sizes need a CUDA GPU (records under results/ come only from real GPUs); "
                     "pass --smoke to run the tiny sizes here")
    out = args.out
    if args.smoke and out is None:
        out = Path(tempfile.mkdtemp(prefix="mlsys-experiments-"))
    profile = "smoke" if args.smoke else "gpu"
    paths = []
    for name in dict.fromkeys(selected):  # each once, in order
        experiment = experiments.get(name)
        sizes = experiment.sizes_for(profile)
        print(f"\n== {name} ({experiment.chapter}): {experiment.description}", flush=True)
        start = time.perf_counter()
        rows = experiment.run(sizes)
        record = experiments.record_of(experiment, rows, sizes, profile, argv)
        module = sys.modules[f"mlsys.experiments.{name}"]
        print(repr(module.table(rows)))
        path = experiments.write(record, out)
        print(f"{time.perf_counter() - start:.1f} s; wrote {path}", flush=True)
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
