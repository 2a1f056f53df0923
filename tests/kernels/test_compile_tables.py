"""The compile report's tables and checks (`mlsys.kernels.compile_tables`): the shared-memory rule
and the register floor against every compiled tile, the row kernels' shared memory, and the tables
the chapter shows."""

import pytest

from mlsys.kernels import compile_predictions, compile_report, compile_tables
from mlsys.kernels.compile_report import verdict


@pytest.fixture(scope="module")
def report():
    return compile_report.load()


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


def test_tables_and_the_why_this_tile_verdict_are_computed(report):
    table = compile_tables.flash_table(report, "sm_90")
    assert len(table.rows) == 48 and table.header[-1] == "verdict"
    best, text = compile_predictions.why_this_tile(report, "sm_90")
    assert verdict(best) == "kept" and "compute-bound" in text and "predicts" in text
    assert len(compile_tables.removal_table(report).rows) > 20
    more, both = compile_tables.more_registers(report, "sm_80", "sm_90", dtype="bf16",
                                               head_dim=128, causal=True)
    assert both == 48 and 0 < more <= both
