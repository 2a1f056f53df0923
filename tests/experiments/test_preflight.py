"""The preflight (`mlsys.experiments.preflight`, `python -m mlsys.experiments --check`): every
kernel against its reference and every experiment at smoke sizes, nothing written; a failing check
is a row and the others still run.

`--check` runs once per session (tests/experiment_cases.py); the other experiments' tests read the
records it built.
"""

import contextlib
import dataclasses
import io

import experiment_cases
import pytest

from mlsys import env, experiments
from mlsys.experiments import __main__ as cli
from mlsys.experiments import preflight
from mlsys.kernels._triton import HAS_TRITON


@pytest.fixture(scope="module")
def checked():
    """`--check` run once per session: its rows, what it printed, the files it left in results/."""
    return experiment_cases.checked()


def test_check_runs_every_kernel_and_experiment_and_all_pass(checked):
    rows = checked["rows"]
    assert all(set(r) >= {"check", "kind", "ok", "seconds", "error"} for r in rows)
    assert [r["check"] for r in rows if r["kind"] == "experiment"] == list(experiments.NAMES)
    dtypes = ("bfloat16" if env.device() == "cuda" else "float16", "float32")
    kernels = [f"{op} {d}" for op in ("softmax", "rmsnorm", "repeat_unary fma", "repeat_unary cos",
                                      "flash_attention causal", "flash_attention full")
               for d in dtypes]
    assert [r["check"] for r in rows if r["kind"] == "kernel"] == kernels
    for r in rows:
        if r["kind"] == "kernel" and not HAS_TRITON:  # macOS, Windows: kernels cannot run
            assert not r["ok"] and "Triton is not installed" in r["error"]
        else:
            assert r["ok"] and r["error"] == "", r
        assert r["seconds"] >= 0
    assert cli.exit_status(rows) == int(not HAS_TRITON)


def test_check_prints_a_line_per_check_and_a_count(checked):
    lines = checked["printed"].splitlines()
    assert lines[0] == preflight.HEADER
    assert lines[1:-1] == [preflight.row_line(r) for r in checked["rows"]]
    passed = sum(r["ok"] for r in checked["rows"])
    assert lines[-1].startswith(f"{passed} of {len(checked['rows'])} checks passed, "
                                f"{len(checked['rows']) - passed} failed (")


def test_check_writes_nothing_under_results(checked):
    assert checked["new_files"] == set()


def test_a_failing_check_is_a_row_and_the_others_still_run(monkeypatch):
    """A kernel that computes wrongly, one that raises, an experiment that raises: each is a FAIL
    row with a one-line error, and every other check still runs and passes."""
    from mlsys.experiments import dot_accumulation
    from mlsys.kernels import rmsnorm, softmax

    def boom(*args, **kwargs):
        raise RuntimeError("out of memory\n" + "details " * 50)

    monkeypatch.setattr(softmax, "softmax", lambda x: x * 1.0)
    monkeypatch.setattr(rmsnorm, "rmsnorm", boom)
    monkeypatch.setattr(dot_accumulation, "EXPERIMENT",
                        dataclasses.replace(dot_accumulation.EXPERIMENT, run=boom))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = cli.main(["--check", "dot_accumulation", "autocast_dtypes"])
    failed = {r["check"]: r["error"] for r in rows if not r["ok"]}
    assert set(failed) == {"softmax float16", "softmax float32", "rmsnorm float16",
                           "rmsnorm float32", "dot_accumulation"} or not HAS_TRITON
    assert failed["softmax float32"].startswith(
        "AssertionError: softmax y differs from float64: Tensor-likes are not close!")
    assert failed["dot_accumulation"] == "RuntimeError: out of memory"
    assert [r["check"] for r in rows if r["kind"] == "experiment"] == ["dot_accumulation",
                                                                        "autocast_dtypes"]
    assert rows[-1]["ok"] and rows[-2]["record"] is None
    assert all(len(e) <= preflight.ERROR_CHARS and "\n" not in e for e in failed.values())
    assert cli.exit_status(rows) == 1
    assert "FAIL" in printed.getvalue() and f"{len(failed)} failed" in printed.getvalue()


def test_error_line_is_one_short_line():
    assert preflight.error_line(ValueError("x is wrong\nmore")) == "ValueError: x is wrong"
    assert preflight.error_line(KeyError()) == "KeyError"
    long = preflight.error_line(RuntimeError("y" * 500))
    assert len(long) == preflight.ERROR_CHARS and long.endswith("...")
