"""`python -m mlsys napkin` in a subprocess: the numbers on success; one-line errors, status 2."""

import subprocess
import sys

import pytest

from mlsys.accounting.napkin import napkin
from mlsys.models.config import TransformerConfig

XL_ON_8_H100 = "--preset xl --gpu H100 --batch 8 --seq 1024 --devices 8".split()


def _run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlsys", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_napkin_prints_the_library_summary():
    done = _run("napkin", *XL_ON_8_H100, "--mfu", "0.4")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    xl = TransformerConfig.preset("xl")
    expected = napkin(xl, "h100", batch=8, seq=1_024, n_devices=8, mfu=0.4, name="xl").lines()
    assert done.stdout.splitlines() == expected
    for needle in ("N = 1,998,235,200", "sharded over 8: 4 GB", "12.8 GFLOP", "0.266 s"):
        assert needle in done.stdout, needle


def test_names_are_case_insensitive_and_options_reach_the_library():
    done = _run("napkin", "--preset", "small", "--gpu", "a100", "--batch", "2", "--seq", "256",
                "--recipe", "fp32_adamw", "--dtype", "fp32", "--mfu", "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = napkin(TransformerConfig.preset("small"), "A100", batch=2, seq=256,
                      recipe="fp32_adamw", dtype="fp32", mfu=0.5, name="small")
    assert done.stdout.splitlines() == expected.lines()


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (("--preset", "huge"), ("argument --preset:", "'huge'", "xl")),
        (("--gpu", "X100"), ("argument --gpu:", "'X100'", "h100")),
        (("--batch", "0"), ("argument --batch:", "batch must be a positive integer, got 0")),
        (("--batch", "eight"), ("argument --batch:", "positive integer, got 'eight'")),
        (("--seq", "2048"), ("seq (2048) must be <= context_length (1024)",)),
        (("--devices", "-1"), ("argument --devices:", "positive integer, got -1")),
        (("--mfu", "1.5"), ("argument --mfu:", "mfu must be <= 1, got 1.5")),
        (("--recipe", "adam"), ("argument --recipe:", "'adam'", "bf16_mixed_adamw")),
        (("--dtype", "fp9"), ("argument --dtype:", "'fp9'")),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_argument(change, fragments):
    args = list(XL_ON_8_H100)
    flag, value = change
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    done = _run("napkin", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    error_lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])


def test_a_command_is_required_and_help_lists_napkin():
    done = _run()
    assert done.returncode == 2 and "required" in done.stderr
    helped = _run("--help")
    assert helped.returncode == 0 and "napkin" in helped.stdout
