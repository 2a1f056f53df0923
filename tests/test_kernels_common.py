"""Shared kernel machinery: Triton set-up, input checks, tolerances, row-tile pruning.

`tally_bytes` (used by the other kernel tests) runs a function under `mlsys.counters.ByteCounter`,
which records the bytes every aten op reads and writes, to check the byte cost models against.
`needs_triton` skips a test that launches a kernel where Triton is not installed (macOS, Windows);
the references and cost models are tested everywhere. `DEVICE` is where kernel inputs live.
"""

import os
import subprocess
import sys

import pytest
import torch

from mlsys import env
from mlsys.counters import ByteCounter, count_bytes
from mlsys.kernels import _triton
from mlsys.kernels._triton import (
    HAS_TRITON,
    INTERPRETED,
    KERNEL_DTYPES,
    TOLERANCES,
    check_input,
    check_same,
    check_tensor,
    default_row_tile,
    keep_row_tiles,
    row_tile_configs,
    rows_cols,
)

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CAN_LAUNCH = HAS_TRITON and (INTERPRETED or torch.cuda.is_available())
"""Kernels run here: interpreted on the CPU, or compiled for a CUDA GPU that is present."""
needs_triton = pytest.mark.skipif(
    not CAN_LAUNCH,
    reason="Triton is not installed (Linux only): kernels cannot run here" if not HAS_TRITON
    else "Triton compiles for a GPU (TRITON_INTERPRET is off) and there is none",
)
DEVICE = "cuda" if CAN_LAUNCH and not INTERPRETED else "cpu"
"""Where kernel inputs live: a CUDA device when Triton compiles, else the CPU."""


def tally_bytes(fn, *args) -> ByteCounter:
    """Run fn(*args) under a ByteCounter and return it."""
    return count_bytes(fn, *args)


def test_tally_counts_reads_and_writes_of_each_op():
    a, b = torch.ones(3, 5), torch.ones(1, 5, dtype=torch.float16)
    tally = tally_bytes(lambda: torch.exp(a + b))
    # add reads 15*4 + 5*2 bytes and writes 15*4; exp reads and writes 15*4
    ops = [(op.op, op.read_bytes, op.write_bytes) for op in tally.ops]
    assert ops == [("add", 70, 60), ("exp", 60, 60)]
    assert tally.total_bytes == 250


def test_triton_is_set_up_before_import():
    assert _triton.HAS_TRITON == env.has_triton()
    assert INTERPRETED == (HAS_TRITON and env.triton_interpreted())
    if HAS_TRITON and env.device() != "cuda":  # set to 1 before Triton, unless the user chose
        assert "TRITON_INTERPRET" in os.environ


def test_tolerances_cover_every_kernel_dtype_and_exceed_one_rounding():
    assert set(TOLERANCES) == set(KERNEL_DTYPES)
    for dtype, tol in TOLERANCES.items():
        # an output rounded once to `dtype` is off by up to half an ulp, eps/2 relative
        assert tol["rtol"] >= torch.finfo(dtype).eps / 2, dtype
    ordered = [TOLERANCES[d]["rtol"] for d in (torch.float32, torch.float16, torch.bfloat16)]
    assert ordered == sorted(ordered)


WRONG_DTYPE = "^x has dtype torch.int32; expected one of float16, bfloat16, float32$"


@needs_triton
@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        ([1.0, 2.0], TypeError, "x must be a torch.Tensor, got list"),
        (torch.ones(3, dtype=torch.int32), TypeError, WRONG_DTYPE),
        (torch.ones(3, dtype=torch.float64), TypeError, "x has dtype torch.float64"),
        (torch.ones(4, 3).t(), ValueError, r"x must be contiguous; call \.contiguous\(\) first"),
        (torch.ones(0, 3), ValueError, r"x is empty \(shape \(0, 3\)\)"),
        (torch.tensor(1.0), ValueError, "x must have at least 1 dimension"),
    ],
)
def test_check_input_names_the_argument_and_the_rule(x, error, message):
    with pytest.raises(error, match=message):
        check_input(x, "x")


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's bf16 rule applies only interpreted")
def test_bf16_is_refused_by_the_interpreter():
    with pytest.raises(TypeError, match="bfloat16, which Triton's CPU interpreter computes wrong"):
        check_input(torch.ones(3, dtype=torch.bfloat16), "x")


@pytest.mark.skipif(INTERPRETED, reason="under the interpreter CPU tensors are accepted")
def test_cpu_tensors_are_refused_when_compiled():
    with pytest.raises(ValueError, match="x is on cpu; Triton kernels here need a tensor on a"):
        check_input(torch.ones(3), "x")


def test_check_same_compares_dtype():
    with pytest.raises(ValueError, match="weight has dtype torch.float16 but x has torch.float32"):
        check_same(torch.ones(2), "x", torch.ones(2, dtype=torch.float16), "weight")
    check_same(torch.ones(2), "x", torch.zeros(5), "weight")  # same dtype and device: no error


def test_rows_cols_of_a_shape():
    assert rows_cols((3, 5, 7)) == (15, 7) and rows_cols((4,)) == (1, 4)
    assert rows_cols(torch.Size([2, 9])) == (2, 9)
    assert check_tensor(x := torch.ones(2), "x") is x


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: rows_cols(()), ValueError, "at least one dim"),
        (lambda: rows_cols((3, 0)), ValueError, r"shape\[1\] must be a positive integer, got 0"),
        (lambda: rows_cols((3, -1)), ValueError, r"shape\[1\] must be a positive integer"),
        (lambda: rows_cols((2.0, 3)), TypeError, r"shape\[0\] must be an integer"),
        (lambda: rows_cols((True, 3)), TypeError, r"shape\[0\] must be an integer, got True"),
        (lambda: rows_cols("37"), TypeError, "shape must be a sequence of integers"),
        (lambda: rows_cols(12), TypeError, "shape must be a sequence of integers"),
        (lambda: check_tensor([1.0], "x"), TypeError, "x must be a torch.Tensor, got list"),
        (lambda: check_tensor(torch.arange(3), "y"), TypeError, "y must be a floating-point"),
        (lambda: check_same(torch.ones(2), "x", torch.ones(2, device="meta"), "w"), ValueError,
         "w is on meta but x is on cpu"),
    ],
)
def test_shared_checks_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_missing_triton_is_a_clear_error_never_a_silent_fallback(monkeypatch):
    """Runs everywhere: with Triton hidden (monkeypatched), every launcher names its reference."""
    from mlsys.kernels.elementwise import repeat_unary
    from mlsys.kernels.rmsnorm import rmsnorm
    from mlsys.kernels.softmax import softmax

    monkeypatch.setattr(_triton, "HAS_TRITON", False)
    x = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"Triton is not installed \(Linux only\); use softmax"):
        softmax(x)
    with pytest.raises(RuntimeError, match="use rmsnorm_ref"):
        rmsnorm(x, torch.ones(3))
    with pytest.raises(RuntimeError, match="use repeat_unary_ref"):
        repeat_unary(x, 1)


@needs_triton
@pytest.mark.parametrize("n_rows", [1, 3, 1000, 100_000])
@pytest.mark.parametrize("block_n", [1, 64, 1024, 4096, 65536])
def test_row_tile_pruning_keeps_sane_tiles(monkeypatch, n_rows, block_n):
    monkeypatch.setattr(_triton, "INTERPRETED", False)
    kept = keep_row_tiles(row_tile_configs(), n_rows, block_n)
    assert kept, "pruning must leave at least one config"
    fallback = default_row_tile(n_rows, block_n)
    for config in kept:
        m, w = config.kwargs["BLOCK_M"], config.num_warps
        assert m <= max(1, 2 ** (n_rows - 1).bit_length())
        assert m == 1 or m * block_n <= _triton.MAX_TILE_ELEMENTS
        low, high = _triton.ROW_VALUES_PER_THREAD
        assert low <= m * block_n // (32 * w) <= high or (m, w) == fallback
    block_m, warps = default_row_tile(n_rows, block_n)
    tile = block_m * block_n
    assert tile <= max(block_n, 4096)
    # as many rows as fit in ~4096 elements, unless the rows or the BLOCK_M range run out first
    assert 2 * tile > 4096 or block_m >= n_rows or block_m == _triton.ROW_BLOCK_M[-1]
    # 16 to 32 elements per thread, unless num_warps hits its range
    assert 16 <= tile / (32 * warps) < 32 or warps in (1, _triton.ROW_NUM_WARPS[-1])


@needs_triton
def test_interpreted_pruning_keeps_one_config(monkeypatch):
    monkeypatch.setattr(_triton, "INTERPRETED", True)
    kept = keep_row_tiles(row_tile_configs(), 1823, 1024)
    assert len(kept) == 1
    assert kept[0].kwargs["BLOCK_M"] == default_row_tile(1823, 1024)[0] == 64


def test_kernel_modules_import_without_triton():
    # macOS and Windows have no Triton: modules must import, references work, launchers say what
    # to use
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from mlsys.kernels import _triton, elementwise, flash_attention, rmsnorm, softmax\n"
        "assert not _triton.HAS_TRITON and not _triton.INTERPRETED\n"
        "x = torch.randn(3, 5)\n"
        "assert torch.allclose(softmax.softmax_ref(x).sum(-1), torch.ones(3))\n"
        "q = torch.randn(1, 4, 16)\n"
        "assert flash_attention.flash_attention_ref(q, q, q)[0].shape == q.shape\n"
        "try:\n"
        "    softmax.softmax(x)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    env_vars = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env_vars, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Triton is not installed (Linux only); use softmax_ref" in done.stdout


IMPORTED_FIRST = {
    "triton itself": "import torch, triton",
    "a model built on the meta device": (
        "import torch\nfrom mlsys.models.transformer import Transformer, TransformerConfig\n"
        "with torch.device('meta'):\n    Transformer(TransformerConfig())"
    ),
    "torch._dynamo (torch.compile)": "import torch, torch._dynamo",
    "torch.utils.flop_counter": "import torch, torch.utils.flop_counter",
}


@pytest.mark.skipif(not INTERPRETED, reason="the import-order problem exists only interpreted")
@pytest.mark.parametrize("trigger", IMPORTED_FIRST)
def test_kernels_work_whatever_imported_triton_first(trigger):
    """Importing Triton before TRITON_INTERPRET is set used to break every kernel calling tl.max or
    tl.sum for the rest of the process (InterpreterError: Cannot call @triton.jit'd outside of the
    scope of a kernel)."""
    code = IMPORTED_FIRST[trigger] + (
        "\nimport torch\nfrom mlsys.kernels.rmsnorm import rmsnorm\n"
        "from mlsys.kernels.softmax import softmax\n"
        "x = torch.randn(3, 5)\n"
        "torch.testing.assert_close(softmax(x), torch.softmax(x, -1))\n"
        "rms = x * torch.rsqrt(x.pow(2).mean(-1, True) + 1e-5)\n"
        "torch.testing.assert_close(rmsnorm(x, torch.ones(5)), rms)\n"
        "print('ok')\n"
    )
    env_vars = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env_vars, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
