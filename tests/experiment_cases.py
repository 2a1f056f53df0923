"""What the tests of `mlsys.experiments` share (tests/experiments/): the `--check` preflight run
once per session, with every experiment's smoke record it builds; the all-reduce benchmark's smoke
rows (read by test_allreduce_bench.py and test_ddp_step.py); steady and quiet timings for verdicts;
and the planner check's hand-built launch rows (test_parallel_step.py, test_parallel_step_run.py).

A smoke run here happens at most once per session (`functools.cache`), however many test files
read it: `--check` runs every experiment and every kernel (about a minute on the CPU).
"""

import contextlib
import copy
import functools
import io
import json

from mlsys import results
from mlsys.accounting import comms as comms_cost
from mlsys.experiments import __main__ as cli
from mlsys.experiments import allreduce_bench, parallel_step, parallel_step_run


def files_under(root):
    return {p for p in root.rglob("*") if p.is_file()}


@functools.cache
def checked():
    """`--check` run once, as on a GPU machine before the real run: its rows, what it printed, and
    the files it left under results/."""
    before = files_under(results.RESULTS_DIR)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = cli.main(["--check"])
    return {"rows": rows, "printed": printed.getvalue(),
            "new_files": files_under(results.RESULTS_DIR) - before}


@functools.cache
def smoke_records():
    """Every experiment's smoke record, built (not written) by `--check`, as JSON gives it back."""
    return {r["check"]: json.loads(json.dumps(r["record"]))
            for r in checked()["rows"] if r["kind"] == "experiment"}


@functools.cache
def allreduce_rows():
    """`allreduce_bench` at smoke sizes on the CPU (2 gloo ranks)."""
    return allreduce_bench.run(allreduce_bench.SIZES["smoke"], device="cpu")


def steady(seconds, n=5):
    return {"median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * n}


def quiet(rows):
    """The rows with every noise finding removed and every timing made steady."""
    rows = copy.deepcopy(rows)
    for r in rows:
        if "problems" in r:
            r["problems"] = []
    return rows


# --- the planner check of parallel_step, on launch rows built by hand -----------------------------

S = parallel_step.SIZES["smoke"]
ALPHA, BETA = 2e-4, 1.5e9


def planner_timing(seconds, spread=1.0):
    samples = [seconds / spread, seconds, seconds * spread]
    return {"median_s": seconds, "p20_s": samples[0], "p80_s": samples[-1], "samples_s": samples}


def per_rank(alone_s=0.02, dp_s=0.015, link=True):
    """What each rank of the launch returns for the calibration: times alone, under DP, and the
    all-reduces (alpha ALPHA, beta BETA; with `link=False`, times that do not grow with the
    size)."""
    times = {m: [comms_cost.collective_time_s("all_reduce", m, S.world_size, alpha_s=ALPHA,
                                              bytes_per_s=BETA)] * 3 for m in S.link_bytes}
    if not link:  # times that do not grow with the size: no fit
        times = {m: [1e-3] * 3 for m in S.link_bytes}
    return [{"alone": {"times": [alone_s] * S.steps}, "dp": {"times": [dp_s] * S.steps},
             "all_reduce": times} for _ in range(S.world_size)]


def measured(spread=1.0):
    """The measured meshes' rows: pipeline spans, FSDP and TP steps."""
    rows = [{"kind": "bubble", "schedule": "1f1b", "microbatches": m,
             "span": planner_timing(0.012 + 0.002 * m, spread)} for m in S.microbatches]
    rows += [{"kind": "fsdp", "variant": "ours, prefetch", "step": planner_timing(0.018, spread)},
             {"kind": "fsdp", "variant": "fully_shard", "step": planner_timing(0.02, spread)},
             {"kind": "tp", "variant": "ours", "step": planner_timing(0.016, spread)}]
    return rows


def planner_case(ranks, meshes):
    """A record's rows: the measured meshes, `parallel_step_run.planner_rows` on them, a setup."""
    setup = {"kind": "setup", "world_size": S.world_size}
    return [*meshes, *parallel_step_run.planner_rows(S, ranks, meshes), setup]
