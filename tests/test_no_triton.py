"""Everything works where Triton is not installed (macOS): checked here by hiding it.

A child process starts with `sys.modules["triton"] = None` before anything can import Triton, so
`import triton` fails and `importlib.util.find_spec("triton")` is None, as on a machine without it;
`TRITON_INTERPRET` is unset. In that process (a) the kernel tests must pass or skip with a reason,
never fail or error, and (b) every chapter that uses `mlsys.kernels`, run as a plain Python script
in the smoke profile, must finish: it says that Triton is missing and takes the reference path.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = ("test_elementwise.py", "test_softmax.py", "test_rmsnorm.py",
                "test_kernels_common.py")  # fmt: skip
HIDE_TRITON = "import sys; sys.modules['triton'] = None\n"  # "import triton" now raises ImportError


def _chapters_using_kernels() -> list[Path]:
    chapters = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    return [c for c in chapters if "mlsys.kernels" in c.read_text()]


def _run_without_triton(code: str, cwd: Path, timeout_s: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(MLSYS_PROFILE="smoke", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-c", HIDE_TRITON + code]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def _tail(done: subprocess.CompletedProcess, n_lines: int = 40) -> str:
    return "\n".join((done.stdout + done.stderr).splitlines()[-n_lines:])


def test_triton_is_really_hidden_in_the_child():
    code = (
        "import importlib.util\n"
        "assert importlib.util.find_spec('triton') is None\n"
        "from mlsys import env\n"
        "assert not env.has_triton() and not env.setup_triton()\n"
        "from mlsys.kernels import _triton\n"
        "assert not _triton.HAS_TRITON\n"
        "import os; assert 'TRITON_INTERPRET' not in os.environ\n"
    )
    done = _run_without_triton(code, ROOT, timeout_s=120)
    assert done.returncode == 0, _tail(done)


@pytest.mark.slow
def test_kernel_tests_pass_or_skip_without_triton():
    files = [str(ROOT / "tests" / name) for name in KERNEL_TESTS]
    args = [*files, "-q", "--tb=line", "-p", "no:cacheprovider", "-o", "addopts=-ra"]
    code = f"import pytest\nsys.exit(pytest.main({args!r}))\n"
    done = _run_without_triton(code, ROOT, timeout_s=600)
    assert done.returncode == 0, f"kernel tests failed without Triton:\n{_tail(done)}"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", _chapters_using_kernels(), ids=lambda p: p.stem)
def test_chapters_using_kernels_run_as_scripts_without_triton(chapter, tmp_path):
    import jupytext

    script = tmp_path / chapter.name
    jupytext.write(jupytext.read(chapter), script, fmt="py:percent")  # a plain Python script
    code = f"import runpy\nrunpy.run_path({str(script)!r}, run_name='__main__')\n"
    done = _run_without_triton(code, tmp_path, timeout_s=600)
    assert done.returncode == 0, f"{chapter.name} failed without Triton:\n{_tail(done)}"


def test_some_chapter_uses_the_kernels():
    assert _chapters_using_kernels(), "no chapter imports mlsys.kernels: is the search stale?"
