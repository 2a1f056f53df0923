"""Every heavy measurement of the book as a function: sizes in, rows out.

A chapter calls an experiment with its profile's sizes and shows the rows it gets back (the reader's
own machine, live); `python -m mlsys.experiments` calls the same function with GPU sizes on a GPU
and writes the rows as a record under `results/<device>/<name>.json`; the chapter then shows that
record beside the live run through the same table and plot functions. One code path, so a recorded
GPU figure and the reader's CPU figure mean the same thing.

Each module `mlsys.experiments.<name>` defines `EXPERIMENT` (an `Experiment`: its chapter, sizes per
profile, expected GPU duration and `run`), a `Sizes` dataclass and the functions that read its rows
(tables, plots, verdicts; `table(rows)` is the summary the entry point prints). The whole GPU run
is longer than one device session: `--chunk N` runs one group of at most `CHUNK_S`, and sessions
take the chunks in turn, after `--check` (the module `preflight`: every experiment at smoke sizes
and every kernel against its reference, nothing written). Only full-size GPU records go under
`results/`, and none is replaced without `--force`. Rows are JSON-ready dicts; timings are stored
with every sample so a verdict can be recomputed from a record. Nothing runs at import.
Used in: every measuring chapter.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsys import bench, checks, env, results

NAMES = (
    "dot_accumulation",
    "training_memory",
    "train_step",
    "roofline_ops",
    "elementwise_fusion",
    "op_overhead",
    "fused_kernels",
    "timing_pitfalls",
    "step_benchmark",
    "step_profile",
    "step_memory",
    "compile_step",
    "attention_sweep",
    "flash_benchmark",
    "attention_model_step",
    "autocast_dtypes",
    "amp_speed",
    "autocast_overhead",
    "amp_memory",
    "allreduce_bench",
    "ddp_step",
    "parallel_step",
    "gemm_shapes",
    "cluster_train",
)
"""Every experiment, in chapter order (each is the module `mlsys.experiments.<name>`)."""

Rows = list[dict[str, Any]]
"""An experiment's rows, or a list of records: JSON-ready dicts."""

CHUNK_S = 8 * 60
"""`--chunk` groups experiments so that each group runs within this many seconds on one H100."""


@dataclass(frozen=True)
class Experiment:
    """One measurement: what it is, who reads it, how big it runs, and the function that runs it."""

    name: str
    chapter: str  # the notebook (stem) that shows its live run and its records
    description: str
    gpu_seconds: float  # expected duration of the GPU-size run on one H100 (1.5x the H200
    # run's where one was recorded, process start included: results/nvidia-h200/)
    sizes: Mapping[str, Any]  # profile ("smoke", "cpu", "gpu") -> the module's Sizes
    run: Callable[..., list[dict[str, Any]]]  # run(sizes) -> rows

    def sizes_for(self, profile: str | None = None) -> Any:
        """The sizes of `profile` (default: this machine's, `mlsys.env.profile()`)."""
        return self.sizes[checks.choice(profile or env.profile(), "profile", env.PROFILES)]


def get(name: str) -> Experiment:
    """The experiment called `name` (imports its module)."""
    checks.choice(name, "name", NAMES)
    return importlib.import_module(f"mlsys.experiments.{name}").EXPERIMENT


def recorded(name: str) -> list[dict[str, Any]]:
    """Every full-size GPU record of experiment `name` under `results/` (profile "gpu", device
    type "cuda"), validated ([] if none): `results.load_records`."""
    checks.choice(name, "name", NAMES)
    return results.load_records(name)


def chunks(names: tuple[str, ...] = NAMES, *, max_s: float = CHUNK_S) -> list[list[str]]:
    """Experiments packed in order into groups whose expected GPU time stays within `max_s`."""
    groups: list[list[str]] = [[]]
    total = 0.0
    for name in names:
        seconds = get(name).gpu_seconds
        if groups[-1] and total + seconds > max_s:
            groups.append([])
            total = 0.0
        groups[-1].append(name)
        total += seconds
    return groups


# --- rows: timings in, timings out ----------------------------------------------------------------


def timing_fields(timing: bench.Timing) -> dict[str, Any]:
    """The JSON fields of a timing: median, p20, p80 and every sample (seconds)."""
    return {"median_s": timing.median_s, "p20_s": timing.p20_s, "p80_s": timing.p80_s,
            "samples_s": list(timing.samples_s)}


def timing_of(row: Mapping[str, Any]) -> bench.Timing:
    """The timing stored in a row by `timing_fields` (so verdicts can be recomputed from a
    record)."""
    return bench.Timing(samples_s=tuple(row["samples_s"]), warmup=0, device="recorded")


# --- records --------------------------------------------------------------------------------------


def record_of(
    experiment: Experiment, rows: list[dict[str, Any]], sizes: Any, profile: str, argv: list[str]
) -> dict:
    """The record of one run: provenance (device, versions, date, commit, the command with its
    arguments `argv`, sizes) and rows."""
    provenance = results.provenance()
    provenance["command"] = shlex.join(["python", "-m", "mlsys.experiments", *argv])
    provenance["profile"] = profile
    provenance["sizes"] = dataclasses.asdict(sizes)
    provenance["triton_interpreted"] = env.triton_interpreted()
    record = {"experiment": experiment.name, "provenance": provenance, "results": rows}
    results.validate_record(json.loads(json.dumps(record)), experiment=experiment.name)
    return record


def run_record(name: str, profile: str, argv: Sequence[str]) -> dict[str, Any]:
    """Run experiment `name` at `profile`'s sizes: its record (`record_of`, validated; not
    written). `argv`: the command line's arguments, stored in the record."""
    experiment = get(name)
    sizes = experiment.sizes_for(profile)
    return record_of(experiment, experiment.run(sizes), sizes, profile, list(argv))


def record_path(name: str, device: str, out_dir: Path | None = None) -> Path:
    """Where the record of experiment `name` run on `device` (its name) goes:
    `<out_dir>/<device-slug>/<name>.json`, `out_dir` default `results/`."""
    root = results.RESULTS_DIR if out_dir is None else Path(out_dir)
    return root / results.device_slug(device) / f"{name}.json"


def missing(device: str, out_dir: Path | None = None) -> list[str]:
    """The experiments, in chapter order, with no record yet for `device` (its name) under
    `out_dir` (default `results/`): what a GPU session runs next."""
    return [name for name in NAMES if not record_path(name, device, out_dir).exists()]


def write(record: dict[str, Any], out_dir: Path | None = None, *, force: bool = False) -> Path:
    """Write a record at `record_path` under `out_dir` (default `results/`). Refused before
    anything is written (`results.check_destination`): a record that is not a full-size GPU run
    under `results/`, or replacing an existing file without `force`."""
    path = record_path(record["experiment"], record["provenance"]["device"], out_dir)
    results.check_destination(path, record["provenance"], force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def provenance_line(record: Mapping[str, Any]) -> str:
    """Two lines naming what produced a record, each short enough for the page: device,
    versions and date; then the commit and the command."""
    p = record["provenance"]
    return (f"{p['device']} | torch {p['torch_version']} | triton {p['triton_version']} | "
            f"CUDA {p['cuda_version']} | {p['date'][:10]}\n"
            f"commit {p['git_commit']} | $ {p['command']}")


def no_record_text(name: str) -> str:
    """What a page says where no GPU record of `name` exists yet, and how to make one."""
    checks.choice(name, "name", NAMES)
    return (f"No GPU record of `{name}` exists yet. On a machine with a CUDA GPU, "
            f"`python -m mlsys.experiments {name}` writes `results/<device>/{name}.json`, "
            "and this page then shows it here beside the live run.")


def show_records(names: Sequence[str], *,
                 tables: Mapping[str, Sequence[Callable[[Rows], Any]]] | None = None,
                 shows: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None) -> str:
    """A chapter's "Recorded GPU results" for experiments `names`: every record of each shown by
    `show_recorded` (with `tables[name]` and `shows[name]` where given). Returns one sentence
    naming the experiments not recorded yet and the command that records them, "" when every
    one has a record: the page glues it instead of printing a "No GPU record" per experiment."""
    for name in names:
        checks.choice(name, "names", NAMES)
    tables, shows = tables or {}, shows or {}
    missing = [name for name in names if not recorded(name)]
    for name in (name for name in names if name not in missing):
        show_recorded(name, tables=tables.get(name), show=shows.get(name))
    if not missing:
        return ""
    return (f"Not recorded yet: {', '.join(missing)} (`python -m mlsys.experiments "
            f"{' '.join(missing)}` on a CUDA GPU records {'it' if len(missing) == 1 else 'them'}).")


def module(name: str) -> Any:
    """The module of experiment `name`, whose functions read its rows (`table`, `plot`,
    verdicts)."""
    checks.choice(name, "name", NAMES)
    return importlib.import_module(f"mlsys.experiments.{name}")


def show_recorded(name: str, *, tables: Sequence[Callable[[Rows], Any]] | None = None,
                  show: Callable[[dict[str, Any]], Any] | None = None,
                  would_show: str = "") -> None:
    """A page's "Recorded GPU results" of experiment `name`: how many records there are, then per
    record its `provenance_line`, each of `tables` of its rows (default: the module's `table`) and
    what `show(record)` gives back (a figure it drew and showed; then a sentence, a table, or a
    list of them: a str is printed, anything else displayed). With no record, `no_record_text`
    and `would_show`, what a GPU run would add. Returns nothing, so a cell shows no value."""
    from IPython.display import display  # IPython: a page has it, the command line never calls this

    records = recorded(name)
    print(f"{name}: {len(records)} record(s)" if records
          else " ".join(filter(None, (no_record_text(name), would_show))))
    tables = [module(name).table] if tables is None else tables
    for record in records:
        print(provenance_line(record))
        for table in tables:
            display(table(record["results"]))
        shown = show(record) if show is not None else None
        for item in shown if isinstance(shown, list) else [] if shown is None else [shown]:
            if isinstance(item, str):
                print(item)
            else:
                display(item)
