"""`python -m mlsys` (mlsys.__main__) in a subprocess: `napkin` and `plan` print what the
library returns; bad arguments are one-line errors with status 2."""

import subprocess
import sys

import pytest

from mlsys import tables
from mlsys.accounting import planner
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
    expected = tables.napkin_lines(napkin(xl, "h100", batch=8, seq=1_024, n_devices=8, mfu=0.4,
                                          name="xl"))
    assert done.stdout.splitlines() == expected
    for needle in ("N = 1,998,235,200", "sharded over 8: 4 GB", "12.8 GFLOP", "0.266 s"):
        assert needle in done.stdout, needle


def test_names_are_case_insensitive_and_options_reach_the_library():
    done = _run("napkin", "--preset", "small", "--gpu", "a100", "--batch", "2", "--seq", "256",
                "--recipe", "fp32_adamw", "--dtype", "fp32", "--mfu", "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = napkin(TransformerConfig.preset("small"), "A100", batch=2, seq=256,
                      recipe="fp32_adamw", dtype="fp32", mfu=0.5, name="small")
    assert done.stdout.splitlines() == tables.napkin_lines(expected)


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


# --- plan -----------------------------------------------------------------------------------------


SMALL = TransformerConfig.preset("small")  # 12 heads, d_ff 3,072
KW = {"n_devices": 16, "batch": 64, "seq": 1024}

# the `plan` command and its arguments, for `_run`
ARGS = ["plan", "--preset", "small", "--cluster", "DGX-H100", "--devices", "16", "--batch", "64",
        "--seq", "1024"]


@pytest.fixture(scope="module")
def plans():
    return planner.plan(SMALL, "dgx-h100", **KW)


def test_the_command_prints_the_planners_table(plans):
    done = _run(*ARGS, "--top", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: small (") and "16 x H100 SXM" in lines[0]
    assert f"{len(plans)} valid meshes" in lines[1]
    assert lines[2:] == tables.plan_table(plans, top=5)


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--tp", "3"], "tp (3) does not divide the devices (16)"),
    (["--tp", "8", "--pp", "4"], "= 32 != world_size (16)"),
    (["--cluster", "dgx-v100"], "cluster='dgx-v100' is not one of"),
    (["--efficiency", "0"], "efficiency must be > 0"),
])
def test_the_command_rejects_impossible_meshes_in_one_line(extra, fragment):
    done = _run(*ARGS, *extra)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], done.stderr


def test_a_sequence_longer_than_the_preset_raises_its_context_and_says_so():
    args = [a if a != "1024" else "4096" for a in ARGS]
    done = _run(*args, "--top", "2")
    assert done.returncode == 0, done.stderr
    assert "(context length raised to 4096: no parameter depends on it)" in done.stdout
    cfg = TransformerConfig.preset("small", context_length=4096)
    expected = planner.plan(cfg, "dgx-h100", n_devices=16, batch=64, seq=4096)
    assert done.stdout.splitlines()[2:] == tables.plan_table(expected, top=2)


def test_the_command_draws_the_plans_when_asked(tmp_path):
    path = tmp_path / "plans.png"
    done = _run(*ARGS, "--top", "2", "--plot", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"figure: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad, fragment in ((tmp_path / "plans.jpg", "plot must end in .png, .svg, .pdf"),
                          (tmp_path / "nope" / "plans.png", "does not exist")):
        done = _run(*ARGS, "--plot", str(bad))
        assert done.returncode == 2 and fragment in done.stderr and not bad.exists()
