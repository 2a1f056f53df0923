"""Chapter 03's live checks (`mlsys.experiments.flop_counts`): the formulas against the counter on
the smallest preset, and the figures."""

import matplotlib
import pytest

from mlsys import plotting
from mlsys.accounting import flops
from mlsys.experiments import flop_counts
from mlsys.models.config import TransformerConfig
from mlsys.models.counting import count_model_flops

matplotlib.use("Agg")
CFG = TransformerConfig.preset("debug")


def test_every_block_term_has_its_written_out_formula():
    assert set(flop_counts.BLOCK_FORMULAS) == set(flops.layer_flops(CFG, 2, 16).as_dict())
    table = flop_counts.block_table(CFG, 3, 17)  # asserts each term
    assert table.rows[-1][:2] == ["block", ""]
    assert len(table.rows) == len(flop_counts.BLOCK_FORMULAS) + 1


def test_the_counter_agrees_with_the_analytic_count():
    table, counted = flop_counts.preset_counts(["debug"], 2, 9, backward=["debug"])
    assert counted["debug"] == flops.transformer_flops(CFG, 2, 9).forward_matmul_flops
    assert table.rows[0][-1] == "3"
    table, _ = flop_counts.preset_counts(["debug"], 2, 9, backward=[])
    assert table.rows[0][-2] == "(not run in this profile)"
    assert [r[0] for r in flop_counts.six_n_table(["debug", "small"]).rows] == ["`debug`",
                                                                                "`small`"]


def test_the_circulating_formulas_are_off_as_the_page_says():
    block = count_model_flops(CFG, 2, 16).get_flop_counts()
    checks = flop_counts.claimed_checks(CFG, 2, 16, block)
    claim, claimed, _, fixed, counted = checks["linear (D x D)"]
    assert claimed * 16 == counted == fixed
    assert [r[0] for r in flop_counts.claimed_table(checks).rows] == list(checks)
    with pytest.raises(KeyError):
        flop_counts.claimed_checks(CFG, 2, 16, {})


def test_the_figures_draw():
    _, axes = plotting.subplots(1, 2)
    flop_counts.plot_six_n(["debug"], axes[0], seqs=[64, 128], counted={"debug": 10**9}, batch=2,
                           seq=64, shape_70b=CFG)
    flop_counts.plot_shares(["debug", "small"], axes[1], seq=64)
    assert axes[0].lines and axes[1].patches
