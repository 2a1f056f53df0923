"""The mixed-precision chapter's live runs (`mlsys.experiments.mixed_precision`) on tiny models."""

import math

import pytest
import torch

from mlsys.experiments import mixed_precision as mp
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.numerics import fp8
from mlsys.numerics.loss_scaling import DynamicLossScaler

TINY = TransformerConfig(vocab_size=128, context_length=32, d_model=32, n_layers=1, n_heads=2,
                         d_ff=64)


@pytest.fixture(scope="module")
def agreement():
    rows = mp.amp_agreement(TINY, steps=8, init_scale=2.0**22, growth_interval=2, batch=2, seq=8)
    return {name: [r for r in rows if r["run"] == name]
            for name in ("torch", "book scaler", "hand-written")}


def test_the_book_scaler_on_autocast_is_torch_grad_scaler_bit_for_bit(agreement):
    torch_rows, ours = agreement["torch"], agreement["book scaler"]
    assert [r["scale"] for r in ours] == [r["scale"] for r in torch_rows]
    assert [r["skipped"] for r in ours] == [r["skipped"] for r in torch_rows]
    assert [r["loss"] for r in ours] == [r["loss"] for r in torch_rows]
    assert all(r["max_weight_diff"] == 0.0 for r in ours)  # identical weights after every step
    skipped = [r["skipped"] for r in torch_rows]
    assert any(skipped) and not all(skipped)  # overflows backed off, then steps were taken
    scales = [r["scale"] for r in torch_rows]
    assert any(b > a for a, b in zip(scales, scales[1:], strict=False))  # and the scale grew


def test_hand_written_fp16_copies_agree_until_their_fp16_backward_overflows_sooner(agreement):
    """Documented differences: every op runs in fp16 there (autocast keeps the residual stream
    and the norms in fp32), so it overflows at scales autocast survives, and its weights differ
    by fp16 rounding once it updates; it starts from the same unrounded fp32 master weights."""
    torch_rows, hand = agreement["torch"], agreement["hand-written"]
    untouched = True  # neither run has updated its weights yet
    for t, h in zip(torch_rows, hand, strict=True):
        if t["scale"] != h["scale"]:
            break
        assert h["skipped"] >= t["skipped"]  # whatever overflows under autocast overflows here
        untouched = untouched and h["skipped"] and t["skipped"]
        if untouched:
            assert h["max_weight_diff"] == 0.0  # both still hold the initial fp32 weights
            assert h["loss"] == pytest.approx(t["loss"], rel=1e-4)  # fp16 vs autocast forward
    updated = [h for h in hand if not h["skipped"]]
    assert updated and all(0 < h["max_weight_diff"] < 1e-2 for h in updated)
    assert hand[-1]["loss"] == pytest.approx(torch_rows[-1]["loss"], rel=0.05)


def test_the_loss_scale_trace_backs_off_then_grows():
    rows = mp.trace_loss_scale(TINY, steps=8, init_scale=2.0**22, growth_interval=2, batch=2,
                               seq=8)
    actions = [r["action"] for r in rows]
    first_ok = actions.index("keep")
    assert first_ok > 0 and set(actions[:first_ok]) == {"skip and back off"}
    assert "grow" in actions[first_ok:]
    assert all(b["scale"] == a["scale"] / 2 for a, b in zip(rows, rows[1:], strict=False)
               if a["action"] == "skip and back off")
    assert rows[-1]["loss"] < rows[0]["loss"]  # the updates that were taken trained the model


def test_loss_scaling_lifts_fp16_gradients_out_of_the_subnormals():
    rows = mp.gradient_underflow(TINY, batch=4, seq=16, scales=(1.0, 2.0**12))
    by = {(r["scale"], r["parameter"]): r for r in rows}
    names = {r["parameter"] for r in rows}
    sub1 = sum(by[(1.0, n)]["subnormal"] * by[(1.0, n)]["numel"] for n in names)
    sub12 = sum(by[(2.0**12, n)]["subnormal"] * by[(2.0**12, n)]["numel"] for n in names)
    assert sub1 > 100 * max(sub12, 1e-9) and sub1 > 0
    q = "blocks.0.attn.q_proj.weight"  # the smallest gradients of the model
    assert by[(2.0**12, q)]["median_rel_error"] < by[(1.0, q)]["median_rel_error"] / 3
    assert all(r["overflowed"] == 0 for r in rows)


def test_bf16_weights_stall_where_master_kahan_and_stochastic_rounding_move():
    out = mp.stagnation(TINY, steps=12, lr=1e-5, batch=2, seq=16)
    moved = {k: v["changed_fraction"] for k, v in out.items()}
    assert moved["none"] == 1.0
    assert moved["nearest"] < 0.25  # AdamW moves each weight by ~1e-5: most round back
    assert moved["master"] > 0.8 and moved["kahan"] > 0.8 and moved["stochastic"] > 0.6
    drop = {k: v["losses"][0] - v["final_loss"] for k, v in out.items()}
    assert drop["nearest"] < 0.3 * drop["none"]  # the lost updates are lost learning
    for k in ("master", "kahan", "stochastic"):
        assert drop[k] == pytest.approx(drop["none"], rel=0.2), k
    assert [out[k]["extra_bytes_per_param"] for k in ("master", "kahan", "stochastic")] == \
        [4, 2, 0]


def test_runs_refuse_bad_arguments():
    with pytest.raises(ValueError, match="roundings\\[0\\]='up' is not one of"):
        mp.stagnation(TINY, roundings=("up",), steps=1)
    with pytest.raises(TypeError, match="cfg must be a TransformerConfig"):
        mp.trace_loss_scale({"d_model": 8})
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        mp.amp_agreement(TINY, steps=0)
    assert torch.get_default_dtype() == torch.float32


def test_fp8_errors_on_a_real_layer_of_the_model():
    rows = mp.fp8_linear_errors(TINY, layer="blocks.0.ffn.w1", batch=2, seq=16)
    by = {(r["scaling"], r["tensor"]): r for r in rows}
    for tensor in ("output", "input grad", "weight grad"):
        assert by[("current", tensor)]["rel_error"] < 0.08  # E4M3 / E5M2 roundings, averaged
        # delayed has seen these very tensors: the same scale (a spike: fp8_amax_trace)
        assert by[("delayed", tensor)]["rel_error"] == by[("current", tensor)]["rel_error"]
        assert by[("none", tensor)]["rel_error"] >= by[("current", tensor)]["rel_error"]
    assert by[("current", "output")]["grad_flushed"] == 0.0
    assert by[("none", "output")]["grad_flushed"] > 0.05  # tiny gradients vanish unscaled
    with pytest.raises(ValueError, match="must name an nn.Linear"):
        mp.fp8_linear_errors(TINY, layer="blocks.0.ffn_norm")


def test_the_trace_keeps_the_largest_stored_gradient_of_every_step():
    rows = mp.trace_loss_scale(TINY, steps=40, init_scale=2.0**24, growth_interval=4, batch=2,
                               seq=8)
    assert [r["finite"] for r in rows] == [math.isfinite(r["grad_amax"]) for r in rows]
    kept = [r for r in rows if r["finite"]]
    assert kept and all(r["grad_amax"] <= 65_504 for r in kept)  # stored in fp16
    overflowed = [r for r in rows if not r["finite"]]
    assert overflowed and all(r["scale"] > 2.0**10 for r in overflowed)
    # the stored amax is the scale times a true amax that changes slowly from step to step
    true = [r["grad_amax"] / r["scale"] for r in kept]
    assert max(true) / min(true) < 100


@pytest.mark.parametrize("finite, growth_interval", [
    ([False, False, True, True, True, True, False, True], 2),
    ([True] * 7 + [False] + [True] * 3, 3),
    ([False] * 5, 1),
])
def test_gradscaler_scales_follow_the_rule_of_the_books_scaler(finite, growth_interval):
    torch_scales = mp.gradscaler_scales(finite, init_scale=2.0**10,
                                        growth_interval=growth_interval)
    ours = DynamicLossScaler(2.0**10, growth_interval=growth_interval)
    for ok in finite:
        ours.update(ok)
    assert torch_scales == [e.scale for e in ours.history]
    with pytest.raises(TypeError, match=r"finite\[0\] must be a bool"):
        mp.gradscaler_scales([1])


def test_fp32_gradients_and_the_tables():
    grads = mp.gradients(TINY, batch=2, seq=8)
    assert set(grads) == {n for n, _ in Transformer(TINY).named_parameters()}
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    under = mp.gradient_underflow(TINY, batch=2, seq=8, scales=(1.0, 2.0**8))
    table = mp.underflow_table(under)
    assert [row[0] for row in table.rows] == ["1", "256"]
    out = mp.stagnation(TINY, roundings=("none", "nearest"), steps=2, batch=2, seq=8)
    rows = mp.stagnation_table(out).rows
    assert [r[0] for r in rows] == [mp.STAGNATION_LABELS[k] for k in ("none", "nearest")]
    assert rows[0][2] == "1.00"


def test_the_sawtooth_summary_and_the_powers_as_text():
    rows = [{"scale": 2.0**s, "finite": ok} for s, ok in
            ((20, False), (19, False), (18, True), (18, True), (19, False), (18, True))]
    assert mp.sawtooth_summary(rows) == {"settling": 2, "settled": "2¹⁸", "final": "2¹⁸",
                                         "skips": 1, "skip_rate": 25.0}
    with pytest.raises(ValueError, match="no step of the trace had finite gradients"):
        mp.sawtooth_summary(rows[:2])
    assert (mp.power_text(2.0**-25), mp.power_text(1.0), mp.power_text(3.0)) == ("2⁻²⁵", "2⁰", "3")
    with pytest.raises(ValueError, match="x must be"):
        mp.power_text(0.0)


def test_norm_errors_and_first_step_stalls_of_the_model():
    rows = mp.norm_errors(TINY, batch=2, seq=8)
    by = {(r["dtype"], r["accumulate"]): r for r in rows}
    assert by[("bf16", "torch")]["median_rel_error"] > by[("fp16", "torch")]["median_rel_error"]
    assert len(mp.norm_table(rows).rows) == len(rows)
    small, large = (mp.first_step_stalls(TINY, lr=lr) for lr in (1e-6, 1e-2))
    assert 0 <= large < small <= 1  # larger steps move more of the bf16 weights


def test_settled_is_the_first_finite_scale_not_a_later_one():
    """The review's case: six overflows from 2^24 end at 2^18 (262,144), three finite steps there,
    then growth to 2^19 (524,288): the scale the back-off settled at is 2^18."""
    rows = [{"scale": 2.0**s, "finite": s <= 18} for s in range(24, 18, -1)]
    rows += [{"scale": 2.0**s, "finite": True} for s in (18, 18, 18, 19, 19)]
    summary = mp.sawtooth_summary(rows)
    assert (summary["settling"], summary["settled"], summary["final"]) == (6, "2¹⁸", "2¹⁹")


def test_the_two_ways_to_overflow_an_fp16_mean_square():
    for d in (16, 4_096):
        first = mp.first_overflow_rms(d)
        sum_first, mean_first = first["sum kept in the format, then / d"], first[
            "x.pow(2).mean()"]
        assert sum_first == pytest.approx(math.sqrt(65_504 / d), rel=2e-3)  # sqrt(max / d)
        assert mean_first == 256.0  # sqrt(65,504) = 255.94: the next fp16 value, whatever d
        at = torch.full((d,), sum_first, dtype=torch.float16)
        assert torch.isinf(at.pow(2).sum() / d) and torch.isfinite(at.pow(2).mean())
    assert mp.first_overflow_rms(16, "bf16")["x.pow(2).mean()"] > 1e18  # fp32's range
    with pytest.raises(ValueError, match="fmt='fp8' is not one of"):
        mp.first_overflow_rms(16, "fp8")


def test_tf32_rounding_is_fp16s_precision_with_fp32s_range():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mp.round_mantissa(x, 7), x.to(torch.bfloat16).float())  # ties to even
    assert torch.equal(mp.round_mantissa(x, 10), x.to(torch.float16).float())  # within range
    big = torch.tensor([1e30, -3e-30, float("inf")])
    assert torch.equal(mp.round_mantissa(big, 10)[2:], big[2:])
    assert torch.allclose(mp.round_mantissa(big, 10)[:2], big[:2], rtol=2**-11)
    rows = {r["format"]: r for r in mp.tf32_matmul_errors(m=32, k=512, n=32)}
    assert rows["fp32"]["input_rel_error"] == 0
    assert rows["tf32"]["matmul_rel_error"] == pytest.approx(rows["fp16"]["matmul_rel_error"],
                                                             rel=0.2)
    assert rows["tf32"]["matmul_rel_error"] < rows["bf16"]["matmul_rel_error"] / 4
    assert mp.tf32_defaults()["float32_matmul_precision"] == "highest"
    with pytest.raises(TypeError, match="x must be an fp32 tensor"):
        mp.round_mantissa(x.double(), 10)
    with pytest.raises(ValueError, match="bits must be in 0..23"):
        mp.round_mantissa(x, 24)


def test_delayed_scaling_misses_a_spike_that_current_scaling_sees():
    rows = mp.fp8_amax_trace(TINY, factors=(1, 1, 16, 1), batch=2, seq=16)
    by = {(r["step"], r["scaling"]): r for r in rows}
    for step in (0, 1):  # a steady amax: the two agree
        assert by[(step, "delayed")]["rel_error"] == by[(step, "current")]["rel_error"]
    assert by[(2, "current")]["saturated"] == 0 < by[(2, "delayed")]["saturated"]
    assert by[(2, "delayed")]["rel_error"] > 5 * by[(2, "current")]["rel_error"]
    assert by[(3, "delayed")]["scale"] == pytest.approx(by[(3, "current")]["scale"] / 16)
    assert len(mp.fp8_trace_table(rows).rows) == 4
    facts = mp.fp8_trace_facts(rows)
    assert (facts["f8_step"], facts["f8_factor"], facts["f8_cur_sat"]) == (2, "16", 0)
    assert facts["f8_spike"] == 100 * by[(2, "delayed")]["rel_error"]
    with pytest.raises(ValueError, match=r"factors\[1\] must be"):
        mp.fp8_amax_trace(TINY, factors=(1, 0))


def test_block_scales_confine_an_outlier():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mp.block_quantize(x[:1], 64), mp.block_quantize(x[:1], None))
    assert fp8.relative_error(mp.block_quantize(x, None), x) < 0.05
    rows = {(r["outlier_log2"], r["block"]): r for r in
            mp.block_scaling_errors(TINY, outliers=(0, 16), batch=2, seq=16)}
    assert rows[(16, 32)]["flushed"] < rows[(16, None)]["flushed"]
    assert rows[(16, 32)]["rel_error"] < rows[(16, None)]["rel_error"]
    assert rows[(0, 32)]["flushed"] == rows[(0, None)]["flushed"] == 0
    assert len(mp.block_table(list(rows.values())).rows) == 4
    facts = mp.block_facts(list(rows.values()), outlier_log2=16)
    assert facts["blk_outlier"] == "2¹⁶" and facts["blk_flush_b"] < facts["blk_flush_t"]
    with pytest.raises(ValueError, match="block=24 must divide the row length 64"):
        mp.block_quantize(x, 24)
    with pytest.raises(ValueError, match="x must be a 2-D"):
        mp.block_quantize(x[0], 32)


def test_closeness_after_as_many_updates_not_a_max_difference(agreement):
    rows = [r for name in agreement for r in agreement[name]]
    hand, ours = mp.agreement_summary(rows), mp.agreement_summary(rows, "book scaler")
    assert ours["sooner"] is None and ours["update_rel_diff"] == 0.0
    assert hand["compared_updates"] == min(hand["updates"], hand["torch_updates"])
    assert 0 < hand["update_rel_diff"] < 0.5
    # a run that skipped the one update torch took: one AdamW step apart, nothing to compare yet
    torch_rows = [{"run": "torch", "step": 1, "scale": 8.0, "skipped": False, "updates": 1,
                   "max_weight_diff": 0.0, "update_rel_diff": 0.0}]
    late = [{**torch_rows[0], "run": "hand-written", "skipped": True, "updates": 0,
             "max_weight_diff": 1e-3, "update_rel_diff": None}]
    assert mp.agreement_summary(torch_rows + late) == {
        "sooner": 8.0, "updates": 0, "torch_updates": 1, "max_weight_diff": 1e-3,
        "compared_updates": 0, "update_rel_diff": None}
    with pytest.raises(ValueError, match="as many steps of run 'hand-written'"):
        mp.agreement_summary(torch_rows)


def test_the_numbers_the_prose_quotes():
    out = mp.stagnation(TINY, roundings=("none", "nearest"), steps=2, batch=2, seq=8)
    moved, drop = mp.stagnation_shares(out)
    assert drop["none"] == 1.0 and moved["none"] == out["none"]["changed_fraction"]
    f8 = mp.fp8_linear_errors(TINY, batch=2, seq=16, scalings=("current", "none"))
    facts = mp.fp8_facts(f8)
    assert facts["fp8_flushed"] > 5 and 0 < facts["fp8_out"] < 8
    grads = list(mp.gradients(TINY, batch=2, seq=8).values())
    under = mp.gradient_underflow(TINY, batch=2, seq=8, scales=(1.0, 2.0**8))
    facts = mp.underflow_facts(under, grads, (1.0, 2.0**8))
    assert facts["under_scale"] == "256" and facts["hist_sub8"] < facts["hist_sub1"]
    assert facts["under_layer_scaled"] <= facts["under_layer_sub"]
    table = mp.eps_table((1e-5, 1e-8))
    assert [r[:4] for r in table.rows if r[1] == "fp16"] == [
        ["1e-05", "fp16", "1.00136e-05", "subnormal"], ["1e-08", "fp16", "0", "zero"]]
    tf32 = mp.tf32_facts(mp.tf32_matmul_errors(m=16, k=256, n=16))
    assert tf32["tf32_vs_bf16"] > 4 and tf32["tf32_default"] == '"highest"'
