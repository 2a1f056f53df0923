"""The compile report (`mlsys.kernels.compile_report`): current with the kernels' source, complete,
its verdicts following the numbers; and every tile the kernels keep compiled for sm_80 and sm_90 in
this run (`aot_compile`, last)."""

import json
import time

import pytest
from aot_build import AOT_BUILD, start_ci_compile
from compile_cases import fake_compiled, launch_key

from mlsys.kernels import aot, compile_report, rmsnorm, softmax
from mlsys.kernels._triton import HAS_TRITON
from mlsys.kernels.compile_report import verdict

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="compiling needs Triton (Linux)")


@pytest.fixture(scope="module")
def report():
    return compile_report.load()


def test_the_report_was_written_by_the_entry_point_for_this_source(report):
    stale = compile_report.stale_sources(report)
    assert not stale, (f"the kernels changed since the compile report was written: {stale}; "
                       "regenerate it with `make compile-report`")
    prov = report.provenance
    assert prov["command"].startswith("python -m mlsys.kernels.compile_report")
    assert prov["matrix"] == "full" and prov["every_candidate"] and prov["triton_version"]
    assert set(prov["targets"]) == {"sm_80", "sm_90"}
    # every kernel of the library is in it
    kernels = {f"{m}.{k}" for m in aot.KERNEL_MODULES
               for k in __import__(f"mlsys.kernels.{m}", fromlist=["AOT_KERNELS"]).AOT_KERNELS}
    assert set(report.sources) == kernels


@needs_triton
def test_the_report_holds_every_candidate_tile_and_nothing_else(report):
    wanted = {launch_key(launch) for launch in compile_report.candidates("full", every=True)}
    have = {launch_key(c.launch) for c in report.entries}
    assert wanted - have == set(), "candidates missing from the report: `make compile-report`"
    assert have - wanted == set(), "the report holds tiles that are no longer candidates"


def _max_cols(kernel: str) -> int:
    return (softmax.MAX_COLS if kernel.startswith("softmax") else rmsnorm.MAX_COLS)


def test_every_problem_keeps_at_least_one_tile(report):
    groups = {}
    for c in report.entries:
        if c.launch.kernel in compile_report.ROW_KERNELS and (
                c.launch.problem["n_cols"] > _max_cols(c.launch.kernel)):
            continue  # wider rows are refused before launch (MAX_COLS)
        key = (c.launch.kernel, c.launch.dtype, c.launch.target,
               json.dumps(c.launch.problem, sort_keys=True))
        groups.setdefault(key, []).append(verdict(c) == "kept")
    empty = [k for k, kept in groups.items() if not any(kept)]
    assert not empty, f"problems with no clean tile: {empty[:5]}"


def test_16_bit_flash_reaches_the_tensor_cores_and_fp32_is_exact_fp32(report):
    for c in report.entries:
        if not compile_report.uses_tensor_cores(c.launch) or not c.ok:
            continue
        opcode = "HGMMA" if c.launch.target == "sm_90" else "HMMA"  # wgmma on sm_90, mma.sync
        assert c.opcodes.get(opcode, 0) > 0, c.launch.label()  # kept or removed, every tile
    fp32 = report.select("flash_attention.fwd", "fp32")
    assert fp32 and all(c.tensor_core_instructions == 0 for c in fp32)  # FP32_FLASH: kept so
    assert "IEEE" in compile_report.FP32_FLASH


def test_max_cols_is_the_widest_row_the_row_kernels_keep_a_clean_tile_for(report):
    for module in (softmax, rmsnorm):
        name = module.__name__.rsplit(".", 1)[1]
        for width, clean in ((module.MAX_COLS, True), (2 * module.MAX_COLS, False)):
            kept = [all(any(verdict(c) == "kept"
                            for c in report.select(f"{name}.{d}", dtype, target, n_cols=width))
                        for d in ("fwd", "bwd"))
                    for dtype in ("fp32", "bf16") for target in ("sm_80", "sm_90")]
            assert all(kept) if clean else not all(kept), (name, width)


def test_verdicts_follow_the_numbers():
    assert verdict(fake_compiled()) == "kept"
    assert verdict(fake_compiled(spill_store_bytes=4)).startswith("removed: spills 4 B")
    assert "past the maximum" in verdict(fake_compiled(shared_bytes=300_000))
    assert "tensor cores" in verdict(fake_compiled(opcodes={}))
    assert "does not compile" in verdict(fake_compiled(error="CompilationError: x"))


@pytest.mark.aot_compile
@needs_triton
def test_every_kept_tile_compiles_clean_for_sm_80_and_sm_90(request, report):
    """The tiles the library keeps for the problems the chapters launch, compiled in this run:
    no spills, shared memory within the target's maximum, tensor cores in 16-bit flash."""
    build = request.config.stash.get(AOT_BUILD, None) or start_ci_compile()
    process, out, log = build
    start = time.perf_counter()
    process.wait(timeout=1800)
    assert process.returncode == 0, log.read_text()[-3000:]
    fresh = compile_report.load(out)
    waited = time.perf_counter() - start
    print(f"\ncompiled {len(fresh.entries)} kept tiles in {fresh.provenance['wall_s']} s "
          f"(waited {waited:.0f} s at the end of the session)")
    assert len(fresh.entries) == len(compile_report.candidates("ci"))
    assert compile_report.failures(fresh.entries) == []
    # the same compiler gives the same code: the committed report agrees, tile by tile
    if fresh.provenance["triton_version"] == report.provenance["triton_version"]:
        committed = {launch_key(c.launch): c for c in report.entries}
        for c in fresh.entries:
            old = committed[launch_key(c.launch)]
            assert (c.registers, c.spill_store_bytes, c.shared_bytes) == (
                old.registers, old.spill_store_bytes, old.shared_bytes), c.launch.label()
