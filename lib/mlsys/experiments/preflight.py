"""The GPU preflight behind `python -m mlsys.experiments --check`: does everything run here?

Before a GPU session spends its minutes on `--all`, `--check` runs every experiment at its smoke
sizes (building its record and its table, writing nothing) and every Triton kernel of the library
once against its float64 reference, forward and backward where the op has one, natively on this
machine: compiled on a CUDA GPU (bfloat16 and float32), in Triton's interpreter on a CPU (float16
and float32; the interpreter refuses bfloat16). Shapes are small and not multiples of the block
sizes; tolerances are the kernels' own (`TOLERANCES`, `ATTENTION_TOLERANCES`).

Each check gives one row {"check": name, "kind": "experiment" | "kernel", "ok": bool,
"seconds": float, "error": "" or "Type: first line of the message"}; an experiment's row also
holds its "record" (None if it failed). A failure is caught and recorded, and the next check runs.
Kernel modules are imported inside the checks: nothing runs at import.
Used in: the GPU sessions (before `--all` or `--chunk`), tests/experiments/test_preflight.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mlsys import experiments

ERROR_CHARS = 160
"""A failure's message is cut to this many characters (one line)."""


def error_line(exc: BaseException) -> str:
    """`exc` in one line: "Type: first line of its message", at most ERROR_CHARS characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def timed(check: str, kind: str, fn: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
    """Run `fn()`: its row (ok, seconds, error) and its result (None if it raised)."""
    start = time.perf_counter()
    result, error = None, ""
    try:
        result = fn()
    except Exception as exc:  # a failing check is a row, never the end of the run
        error = error_line(exc)
    row = {"check": check, "kind": kind, "ok": not error,
           "seconds": time.perf_counter() - start, "error": error}
    return row, result


# --- experiments ----------------------------------------------------------------------------------


def check_experiment(name: str, argv: Sequence[str] = ("--check",)) -> list[dict[str, Any]]:
    """Experiment `name` at its smoke sizes: its record (validated, not written; `argv` is the
    command's arguments) and its table are built. One row, with the record under "record"."""
    def run() -> dict[str, Any]:
        record = experiments.run_record(name, "smoke", argv)
        repr(experiments.module(name).table(record["results"]))
        return record

    row, record = timed(name, "experiment", run)
    return [{**row, "record": record}]


# --- kernels --------------------------------------------------------------------------------------


def kernel_device() -> str:
    """Where the kernels run: "cuda" with a CUDA GPU, else "cpu" (Triton's interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def kernel_dtypes(device: str) -> tuple[Any, ...]:
    """The dtypes checked on `device`: bfloat16 and float32 on CUDA, float16 and float32 else."""
    return (torch.bfloat16 if device == "cuda" else torch.float16, torch.float32)


def _random(shape: tuple[int, ...], seed: int, dtype: Any, device: str) -> Any:
    """Standard normal values, drawn on the CPU (the same on every device), rounded to `dtype`."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.to(device=device, dtype=dtype)


def _close(actual: Any, expected: Any, tol: dict[str, float], what: str) -> None:
    """`actual` within `tol` of the float64 `expected`, else AssertionError in one line."""
    torch.testing.assert_close(actual.double().cpu(), expected.cpu(), **tol,
                               msg=lambda m: f"{what} differs from float64: {' '.join(m.split())}")


def _softmax_case(dtype: Any, device: str) -> None:
    from mlsys.kernels._triton import TOLERANCES  # Triton (may be absent): only in the check
    from mlsys.kernels.softmax import softmax, softmax_ref  # (the same)

    x, dy = (_random((3, 5, 37), seed, dtype, device) for seed in (1, 2))
    x.requires_grad_()
    y = softmax(x)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = softmax_ref(x64)
    y64.backward(dy.double())
    _close(y, y64, TOLERANCES[dtype], "softmax y")
    _close(x.grad, x64.grad, TOLERANCES[dtype], "softmax dx")


def _rmsnorm_case(dtype: Any, device: str) -> None:
    from mlsys.kernels._triton import TOLERANCES  # Triton (may be absent): only in the check
    from mlsys.kernels.rmsnorm import rmsnorm, rmsnorm_ref  # (the same)

    shape = (7, 45)
    x, dy = (_random(shape, seed, dtype, device) for seed in (3, 4))
    weight = 1 + 0.3 * _random(shape[-1:], 5, dtype, device)
    x.requires_grad_()
    weight.requires_grad_()
    y = rmsnorm(x, weight)
    y.backward(dy)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, weight))
    y64 = rmsnorm_ref(x64, w64)
    y64.backward(dy.double())
    tol = TOLERANCES[dtype]
    # dweight sums the rows: its rounding error grows like sqrt(rows)
    dw_tol = {"rtol": tol["rtol"], "atol": tol["atol"] * math.sqrt(shape[0])}
    _close(y, y64, tol, "rmsnorm y")
    _close(x.grad, x64.grad, tol, "rmsnorm dx")
    _close(weight.grad, w64.grad, dw_tol, "rmsnorm dweight")


def _repeat_unary_case(op: str, dtype: Any, device: str) -> None:
    from mlsys.kernels._triton import TOLERANCES  # Triton (may be absent): only in the check
    from mlsys.kernels.elementwise import repeat_unary, repeat_unary_ref  # (the same)

    x = 2 * _random((5, 3, 129), 6, dtype, device)
    _close(repeat_unary(x, 3, op), repeat_unary_ref(x.double(), 3, op), TOLERANCES[dtype],
           f"repeat_unary {op}")


def _flash_attention_case(causal: bool, dtype: Any, device: str) -> None:
    from mlsys.kernels._triton import ATTENTION_TOLERANCES  # Triton (may be absent): in the check
    from mlsys.kernels.flash_attention import flash_attention, flash_attention_ref  # (the same)

    # n_q != n_k (the causal mask aligns bottom-right), seq <= 40 as the tolerances assume,
    # neither a multiple of the tiles
    q, k, v = (_random((2, 3, n, 32), seed, dtype, device)
               for seed, n in ((7, 29), (8, 37), (9, 37)))
    do = _random(q.shape, 10, dtype, device)
    for t in (q, k, v):
        t.requires_grad_()
    out = flash_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64, _ = flash_attention_ref(q64, k64, v64, is_causal=causal)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), do.double())
    tol = ATTENTION_TOLERANCES[dtype]
    _close(out, out64, tol["forward"], "flash_attention O")
    for name, g, g64 in zip(("dq", "dk", "dv"), grads, grads64, strict=True):
        _close(g, g64, tol["grad"], f"flash_attention {name}")


def _kernel_rows(label: str, case: Callable[..., None], device: str | None,
                 variants: Sequence[tuple[str, tuple[Any, ...]]] = (("", ()),)
                 ) -> list[dict[str, Any]]:
    """One row per variant and dtype: `case(*args, dtype, device)` named "label[ variant] dtype"."""
    device = device or kernel_device()
    rows = []
    for variant, args in variants:
        for dtype in kernel_dtypes(device):
            name = " ".join(filter(None, (label, variant, str(dtype).removeprefix("torch."))))
            rows.append(timed(name, "kernel", lambda a=args, d=dtype: case(*a, d, device))[0])
    return rows


def check_softmax(device: str | None = None) -> list[dict[str, Any]]:
    """`softmax` against `softmax_ref` in float64: y and dx; one row per dtype."""
    return _kernel_rows("softmax", _softmax_case, device)


def check_rmsnorm(device: str | None = None) -> list[dict[str, Any]]:
    """`rmsnorm` against `rmsnorm_ref` in float64: y, dx and dweight; one row per dtype."""
    return _kernel_rows("rmsnorm", _rmsnorm_case, device)


def check_repeat_unary(device: str | None = None) -> list[dict[str, Any]]:
    """`repeat_unary` (k = 3) against `repeat_unary_ref` in float64, ops fma and cos (no backward:
    the op has none); one row per op and dtype."""
    return _kernel_rows("repeat_unary", _repeat_unary_case, device,
                        [(op, (op,)) for op in ("fma", "cos")])


def check_flash_attention(device: str | None = None) -> list[dict[str, Any]]:
    """`flash_attention` against `flash_attention_ref` in float64: O, dq, dk and dv, causal and
    not; one row per mask and dtype."""
    return _kernel_rows("flash_attention", _flash_attention_case, device,
                        [("causal", (True,)), ("full", (False,))])


KERNEL_CHECKS = (check_softmax, check_rmsnorm, check_repeat_unary, check_flash_attention)
"""Every kernel check: each Triton kernel of `mlsys.kernels` against its reference."""


def run(names: Sequence[str] = experiments.NAMES, argv: Sequence[str] = ("--check",),
        report: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every kernel check, then experiments `names` at smoke sizes: all rows, each passed to
    `report` as it is made (to print progress)."""
    rows = []
    checks = [*KERNEL_CHECKS, *(lambda n=n: check_experiment(n, argv) for n in names)]
    for check in checks:
        for row in check():
            rows.append(row)
            if report is not None:
                report(row)
    return rows


HEADER = f"{'check':<32} {'kind':<10} {'result':<6} {'seconds':>8}  error"


def row_line(row: dict[str, Any]) -> str:
    """One line of the pass/fail table: name, kind, pass/FAIL, seconds and the error."""
    result = "pass" if row["ok"] else "FAIL"
    return (f"{row['check']:<32} {row['kind']:<10} {result:<6} {row['seconds']:>8.2f}  "
            f"{row['error']}").rstrip()


def count_line(rows: Sequence[dict[str, Any]]) -> str:
    """The final line: how many checks passed and failed, and the total time."""
    failed = sum(not r["ok"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    return (f"{len(rows) - failed} of {len(rows)} checks passed, {failed} failed "
            f"({seconds:.1f} s)")
