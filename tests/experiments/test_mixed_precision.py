"""The mixed-precision chapter's live runs (`mlsys.experiments.mixed_precision`) on tiny models."""

import math

import pytest
import torch

from mlsys.experiments import mixed_precision as mp
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
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
