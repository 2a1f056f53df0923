"""The compile report: current with the kernels' source, complete, and agreeing with the formulas;
and every tile the kernels keep compiled for sm_80 and sm_90 in this run (`aot_compile`, last)."""

import json
import time

import pytest
from aot_build import AOT_BUILD, start_ci_compile

from mlsys.kernels import aot, compile_report, compile_tables, rmsnorm, softmax, tile_space
from mlsys.kernels._triton import HAS_TRITON
from mlsys.kernels.aot import Compiled, Launch
from mlsys.kernels.compile_report import verdict

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="compiling needs Triton (Linux)")


@pytest.fixture(scope="module")
def report():
    return compile_report.load()


def _key(launch: Launch) -> str:
    return json.dumps(launch.as_dict(), sort_keys=True)


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
    wanted = {_key(launch) for launch in compile_report.candidates("full", every=True)}
    have = {_key(c.launch) for c in report.entries}
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


def test_the_shared_memory_rule_is_exact_for_every_16_bit_flash_tile(report):
    check = compile_tables.shared_memory_check(report)
    # exact, or larger by one 16-bit P tile that the compiler moves between layouts through
    # shared memory (sm_80, head dim 128, 64-row tiles)
    assert check.total > 500 and check.exact + check.plus_p_tile == check.total
    assert check.exact > 0.9 * check.total


def test_the_register_floor_against_ptxas(report):
    for sixteen in (True, False):
        check = compile_tables.register_check(report, sixteen_bit=sixteen)
        assert check.total > 100
        assert check.below_floor == 0  # a floor: no clean tile ever used fewer registers
        assert check.must_spill_and_spilled == check.must_spill  # the compiler agrees
    sixteen = compile_tables.register_check(report)
    assert sixteen.must_spill > 0 and sixteen.spilled > sixteen.must_spill  # it spills earlier


def test_row_kernels_keep_their_tiles_in_registers(report):
    # shared memory holds the cross-warp reductions' partials (4 bytes per row and warp), or, for
    # some layouts, a tile on its way between layouts: never more than the tile in fp32
    check = compile_tables.row_shared_check(report)
    assert check.within_tile == check.total > 1000
    assert check.reduction_only > 0.7 * check.total


def test_max_cols_is_the_widest_row_the_row_kernels_keep_a_clean_tile_for(report):
    for module in (softmax, rmsnorm):
        name = module.__name__.rsplit(".", 1)[1]
        for width, clean in ((module.MAX_COLS, True), (2 * module.MAX_COLS, False)):
            kept = [all(any(verdict(c) == "kept"
                            for c in report.select(f"{name}.{d}", dtype, target, n_cols=width))
                        for d in ("fwd", "bwd"))
                    for dtype in ("fp32", "bf16") for target in ("sm_80", "sm_90")]
            assert all(kept) if clean else not all(kept), (name, width)


def test_the_autotuners_never_see_a_removed_tile(report):
    for c in report.removed()[:200]:
        gone = tile_space.removed(c.launch.kernel, c.launch.dtype, c.launch.target,
                                  **c.launch.problem)
        assert tile_space.tile_key(c.launch.tile, c.launch.num_warps, c.launch.num_stages) in gone
    kept = {_key(launch) for launch in compile_report.candidates("ci")}
    assert not kept & {_key(c.launch) for c in report.removed()}


def test_tables_and_the_why_this_tile_verdict_are_computed(report):
    table = compile_tables.flash_table(report, "sm_90")
    assert len(table.rows) == 48 and table.header[-1] == "verdict"
    best, text = compile_tables.why_this_tile(report, "sm_90")
    assert verdict(best) == "kept" and "compute-bound" in text and "predicts" in text
    assert len(compile_tables.removal_table(report).rows) > 20
    more, both = compile_tables.more_registers(report, "sm_80", "sm_90", dtype="bf16",
                                               head_dim=128, causal=True)
    assert both == 48 and 0 < more <= both


def _fake(**kw):
    launch = Launch("flash_attention.fwd", "bf16",
                    {"batch": 1, "heads": 1, "seq": 128, "head_dim": 64, "causal": False},
                    {"BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, "sm_90")
    fields = {"registers": 128, "shared_bytes": 24576, "opcodes": {"HGMMA": 6}, **kw}
    return Compiled(launch=launch, **fields)


def test_verdicts_follow_the_numbers():
    assert verdict(_fake()) == "kept"
    assert verdict(_fake(spill_store_bytes=4)).startswith("removed: spills 4 B")
    assert "past the maximum" in verdict(_fake(shared_bytes=300_000))
    assert "tensor cores" in verdict(_fake(opcodes={}))
    assert "does not compile" in verdict(_fake(error="CompilationError: x"))


def test_the_prediction_counts_the_last_wave():
    c = _fake()  # 128 registers x 4 warps: 4 blocks per SM by registers; 132 SMs -> 528 slots
    assert c.occupancy().blocks_per_sm == 4
    one_wave = compile_tables.predict(c, 1e12, 1e6, 528)
    a_bit_more = compile_tables.predict(c, 1e12, 1e6, 529)
    assert one_wave.waves == 1 and one_wave.wave_efficiency == 1.0
    assert a_bit_more.waves == 2 and a_bit_more.wave_efficiency == pytest.approx(529 / 1056)
    assert a_bit_more.time_s == pytest.approx(one_wave.time_s * 1056 / 529)
    with pytest.raises(ValueError, match="cannot launch: no block fits an SM"):
        compile_tables.predict(_fake(registers=256), 1e12, 1e6, 10)


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
        committed = {_key(c.launch): c for c in report.entries}
        for c in fresh.entries:
            old = committed[_key(c.launch)]
            assert (c.registers, c.spill_store_bytes, c.shared_bytes) == (
                old.registers, old.spill_store_bytes, old.shared_bytes), c.launch.label()
