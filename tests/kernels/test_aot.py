"""Ahead-of-time compiles (`mlsys.kernels.aot`): reading ptxas and SASS, a real compile for sm_80
and sm_90 in worker processes, read back from the cache, timeouts and failures recorded, bad
input."""


import pytest

from mlsys.kernels import aot, aot_cache
from mlsys.kernels._triton import HAS_TRITON

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="compiling needs Triton (Linux)")

PTXAS_LOG = """ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function '_flash_fwd_kernel' for 'sm_80'
ptxas info    : Function properties for _flash_fwd_kernel
    48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 472 bytes cmem[0]
"""

SASS = """
        /*0a40*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR16][R4.64], P3 ;
        /*0a50*/              @!P0 HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0a60*/               @P1 HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0a70*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0a80*/                   BRA 0xa80;
"""


def test_the_ptxas_log_gives_registers_stack_and_spills():
    assert aot.parse_ptxas_log(PTXAS_LOG) == {"registers": 255, "stack_bytes": 48,
                                              "spill_store_bytes": 40, "spill_load_bytes": 36}
    with pytest.raises(ValueError, match="the ptxas log has 0 matches of 'Used"):
        aot.parse_ptxas_log("ptxas info : nothing")


def test_sass_opcodes_drop_predicates_and_modifiers():
    counts = aot.sass_opcodes(SASS)
    assert counts == {"LDGSTS": 1, "HMMA": 2, "HGMMA": 1, "BRA": 1}


def test_a_launch_is_checked_before_any_work():
    with pytest.raises(ValueError, match="kernel='nope.fwd' must be '<module>.<name>'"):
        aot.Launch("nope.fwd", "bf16")
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        aot.Launch("softmax.fwd", "int8")
    with pytest.raises(ValueError, match="target='sm_70' is not one of"):
        aot.Launch("softmax.fwd", "bf16", target="sm_70")
    with pytest.raises(ValueError, match="num_warps must be a power of two <= 32, got 6"):
        aot.Launch("softmax.fwd", "bf16", num_warps=6)
    with pytest.raises(ValueError, match="mlsys.kernels.softmax has no kernel 'mid'"):
        aot_cache.kernel_object("softmax.mid")
    with pytest.raises(TypeError, match="launches must hold Launch objects, got dict"):
        aot.compile_launches([{"kernel": "softmax.fwd"}])


@needs_triton
def test_a_real_compile_for_both_targets(tmp_path, monkeypatch):
    monkeypatch.setenv("MLSYS_AOT_CACHE", str(tmp_path))
    problem = {"n_elements": 2**20, "k": 4, "op": "fma"}
    launches = [aot.Launch("elementwise.repeat_unary", "fp32", problem, {}, 4, 3, t)
                for t in ("sm_80", "sm_90")]
    bad = aot.Launch("softmax.fwd", "fp32", {"n_rows": 64, "n_cols": 100}, {"BLOCK_M": 3})
    first = aot.compile_launches([*launches, bad], jobs=2)
    for c in first[:2]:
        assert c.ok and not c.spills and c.registers > 0 and c.sass_instructions > 10
        assert c.tensor_core_instructions == 0 and c.shared_bytes == 0
        assert c.occupancy().warps_per_sm == 64  # a light kernel fills the SM
    # BLOCK_M = 3 is no power of two: tl.arange refuses it, and the report says so
    assert not first[2].ok and "arange" in first[2].error
    assert len(list(tmp_path.glob("*.json"))) == 3  # every result cached, failures too
    again = aot.compile_launches(launches, jobs=1)
    assert again == first[:2]  # read back from the cache, the same records


@needs_triton
def test_a_compile_that_runs_too_long_is_stopped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("MLSYS_AOT_CACHE", str(tmp_path))
    launch = aot.Launch("elementwise.repeat_unary", "fp32",
                        {"n_elements": 1024, "k": 512, "op": "cos"}, {}, 4, 3, "sm_90")
    (c,) = aot.compile_launches([launch], jobs=1, timeout_s=0.5)
    assert c.error.startswith("CompileError: timed out after") and not c.ok
    assert not list(tmp_path.glob("*.json"))  # a timeout is not cached
