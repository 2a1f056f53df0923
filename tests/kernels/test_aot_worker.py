"""The compile worker (`mlsys.kernels.aot_worker`, run by `mlsys.kernels.aot`): the PTX and SASS of
one launch, the PTX-only mode counting the same facts, errors in one line, and its refusal to run
under Triton's interpreter."""

import os
import subprocess
import sys

import pytest

from mlsys.kernels import aot
from mlsys.kernels._triton import HAS_TRITON

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="compiling needs Triton (Linux)")


@needs_triton
def test_the_asm_of_one_launch_shows_tensor_cores_and_async_copies():
    launch = aot.Launch("flash_attention.fwd", "bf16",
                        {"batch": 1, "heads": 2, "seq": 256, "head_dim": 64, "causal": True},
                        {"BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, "sm_80")
    (asm,) = aot.compiled_asm(launch)
    assert asm["error"] == ""
    assert "mma.sync" in asm["ptx"] and "cp.async" in asm["ptx"]
    assert "HMMA" in asm["sass"] and "LDGSTS" in asm["sass"]


@needs_triton
def test_without_the_sass_the_ptx_counts_the_same_facts(tmp_path, monkeypatch):
    monkeypatch.setenv("MLSYS_AOT_CACHE", str(tmp_path))
    launches = [aot.Launch("flash_attention.fwd", "bf16",
                           {"batch": 1, "heads": 2, "seq": 256, "head_dim": 64, "causal": True},
                           {"BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, t) for t in ("sm_80", "sm_90")]
    full = aot.compile_launches(launches, jobs=2)
    quick = aot.compile_launches(launches, jobs=2, sass=False)
    for a, b in zip(full, quick, strict=True):
        assert (a.registers, a.spill_store_bytes, a.shared_bytes) == (
            b.registers, b.spill_store_bytes, b.shared_bytes)
        assert b.sass_instructions == 0 and b.tensor_core_instructions > 0
        assert a.async_copies > 0 and b.async_copies > 0
    assert set(quick[0].opcodes) == {"mma.sync", "cp.async"}
    assert set(quick[1].opcodes) == {"wgmma", "cp.async"}


@needs_triton
def test_an_error_is_one_line_its_first_and_its_last():
    from mlsys.kernels import aot_worker  # imports Triton's compiler: only where Triton is

    error = ValueError("at 3:4:\n  x = tl.arange(0, 3)\n\narange's range must be a power of 2")
    assert aot_worker._one_line(error) == "at 3:4: ... arange's range must be a power of 2"
    assert aot_worker._one_line(RuntimeError("one line")) == "one line"
    assert aot_worker._one_line(RuntimeError("")) == ""
    assert aot_worker._one_line(RuntimeError("x" * 300), width=20) == "x" * 20


@needs_triton
def test_the_worker_refuses_to_run_interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "mlsys.kernels.aot_worker", "--worker"],
                          input="", capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert "the aot worker needs TRITON_INTERPRET=0" in done.stderr
