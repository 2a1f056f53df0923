"""Chapter 03's live checks (`mlsys.experiments.flop_counts`): the formulas against the counter on
the smallest preset, and the figures."""

import matplotlib
import pytest

from mlsys import plotting, third_party
from mlsys.accounting import flops
from mlsys.accounting.params import param_counts
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


def test_the_causal_conventions_and_what_they_do_to_mfu():
    # dense = the counter's T^2; half = T^2 / 2 (FlashAttention-2's benchmarks, Dao 2023);
    # exact = T (T + 1) / 2 pairs: the attention term 12 L T D becomes 6 L T D or 6 L D (T + 1)
    per = flop_counts.causal_flops_per_token(CFG, 64)
    L, D, T = CFG.n_layers, CFG.d_model, 64
    assert per["dense"] - per["half"] == 6 * L * T * D
    assert per["exact"] - per["half"] == 6 * L * D
    table = flop_counts.causal_table([("debug", CFG, 64)], 0.5)
    dense_mfu, half_mfu = (float(c.rstrip("%")) / 100 for c in table.rows[0][5:7])
    assert dense_mfu == 0.5 and half_mfu == pytest.approx(0.5 * per["half"] / per["dense"],
                                                          abs=5e-4)


def test_recompute_ratios_match_the_counter():
    # Megatron-style full recompute: 4 forwards for 3 (Narayanan et al. 2021); PyTorch's
    # non-reentrant checkpoint of every block: counted with the checkpointed model
    ratios = flop_counts.recompute_ratios(CFG, 2, 16)
    assert list(ratios) == list(flop_counts.RECOMPUTE_CONVENTIONS)
    assert ratios[flop_counts.RECOMPUTE_CONVENTIONS[1]] == pytest.approx(4 / 3)
    plain = count_model_flops(CFG, 2, 16, backward=True).get_total_flops()
    checkpointed = count_model_flops(CFG, 2, 16, backward=True,
                                     checkpoint_segment=1).get_total_flops()
    assert ratios[flop_counts.RECOMPUTE_CONVENTIONS[-1]] == pytest.approx(checkpointed / plain)
    table = flop_counts.recompute_table(CFG, 2, 16, 0.4)
    assert table.rows[1][1:] == ["33.3%", "1.333", "53.3%"]


def test_decode_flops_are_counted_and_a_third_of_a_training_token():
    for context in (1, 7, CFG.context_length):
        d = flop_counts.decode_flops(CFG, context)
        assert d["total"] == 2 * param_counts(CFG).matmul + 4 * CFG.n_layers * CFG.d_model * context
        assert 3 * d["total"] == flops.training_flops_per_token(CFG, context)
    rows = flop_counts.decode_table(CFG, (1, 64)).rows
    assert rows[0][-1] == "1x" and rows[1][-1] == "64x"  # no cache: the whole prefix again
    for bad in (0, CFG.context_length + 1):
        with pytest.raises(ValueError, match="context must be in"):
            flop_counts.decode_flops(CFG, bad)


def test_the_published_table_lists_every_run_then_the_measured_ones():
    table = flop_counts.published_mfu_table([("here", "1 CPU", 0.125, "vs the ceiling")])
    assert len(table.rows) == len(third_party.PUBLISHED_MFU) + 1
    assert table.rows[-1][:3] == ["here", "1 CPU", "12.5%"]
    palm = next(r for r in table.rows if r[0] == "PaLM 540B")
    assert palm[1:4] == ["6,144 TPU v4", "46.2%", "57.8%"]
