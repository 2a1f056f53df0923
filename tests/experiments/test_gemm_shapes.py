"""The gemm_shapes experiment (chapter 09): its GEMMs are the step model's, its smoke run works
on a CPU without a prediction, and its verdict follows the numbers of rows that would contradict
it (a systematic miss either way, a tie, a flat sweep, noise, a run faster than the peak)."""

import dataclasses
import math

import pytest
from experiment_cases import steady

from mlsys import hardware
from mlsys.accounting import flops, step_model
from mlsys.accounting.parallel import ParallelDims
from mlsys.experiments import gemm_shapes
from mlsys.models import catalog

H100 = hardware.get("h100")
GPU = gemm_shapes.SIZES["gpu"]
SMOKE = gemm_shapes.SIZES["smoke"]


@pytest.fixture(scope="module")
def smoke_rows():
    return gemm_shapes.run(SMOKE, device="cpu")


def _recorded_forward_gemms(monkeypatch, cfg, tp, micro_batch, seq):
    """The GEMMs `step_model.step_time` prices for one block and the head, forward only."""
    seen = []
    real = step_model.gemm_time_s

    def record(g, *args):
        seen.append(g)
        return real(g, *args)

    monkeypatch.setattr(step_model, "gemm_time_s", record)
    step_model.step_time(cfg, hardware.get_cluster("dgx-h100"), ParallelDims(tp=tp),
                         batch=micro_batch, seq=seq, micro_batch=micro_batch)
    monkeypatch.undo()
    return [g for g in seen if not g.name.endswith(("dgrad", "wgrad"))]


@pytest.mark.parametrize("name, micro_batch, seq", GPU.models)
@pytest.mark.parametrize("tp", GPU.tps)
def test_the_gemms_are_those_the_step_model_prices(monkeypatch, name, micro_batch, seq, tp):
    cfg = catalog.named_config(name)
    listed = gemm_shapes.model_gemms(cfg, tp=tp, micro_batch=micro_batch, seq=seq)
    assert listed == _recorded_forward_gemms(monkeypatch, cfg, tp, micro_batch, seq)
    # and they are the block's linear layers of `accounting.flops`, fused and split over tp
    full = {g.name: g for g in flops.block_gemms(cfg, micro_batch, seq)}
    by = {g.name: g for g in listed}
    tokens = micro_batch * seq
    assert all(g.m == tokens for g in listed)
    assert by["qkv"].n * tp == sum(full[n].n for n in ("q_proj", "k_proj", "v_proj"))
    assert by["mlp.w_in"].n * tp == sum(g.n for n, g in full.items() if n in ("ffn_w1", "ffn_w3"))
    assert by["mlp.w_out"].k * tp == full["ffn_w2"].k and by["o_proj"].k * tp == cfg.d_model
    linear = sum(g.flops for g in full.values() if not g.name.startswith("attention"))
    assert tp * sum(g.flops for g in listed if g.name != "lm_head") == linear
    assert by["lm_head"].n == math.ceil(cfg.vocab_size / tp)


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match=r"n_heads \(24\) is not divisible by tp \(5\)"):
        gemm_shapes.model_gemms(catalog.named_config("megatron-1.7b"), tp=5, micro_batch=1,
                                seq=8)
    with pytest.raises(ValueError, match="model='nope' is not one of"):
        gemm_shapes.config("nope")
    with pytest.raises(ValueError, match="micro_batch"):
        gemm_shapes.model_gemms(gemm_shapes.config("debug"), tp=1, micro_batch=0, seq=8)


def test_the_smoke_run_works_on_a_cpu_and_predicts_nothing(smoke_rows):
    rows = [r for r in smoke_rows if r["kind"] == "gemm"]
    cfg = gemm_shapes.config("debug")
    expected = [g for _, mb, seq in SMOKE.models for tp in SMOKE.tps
                for g in gemm_shapes.model_gemms(cfg, tp=tp, micro_batch=mb, seq=seq,
                                                 dtype="fp32")]
    expected += gemm_shapes.sweep_gemms(SMOKE)
    assert [(r["name"], r["m"], r["n"], r["k"], r["flops"]) for r in rows] == \
        [(g.name, g.m, g.n, g.k, g.flops) for g in expected]
    assert all(r["median_s"] > 0 and r["predicted_s"] is None for r in rows)
    assert all("this run is on CPU" in r["no_prediction"] for r in rows)
    text = repr(gemm_shapes.table(smoke_rows))
    assert text.count("no prediction") == len(rows)
    assert gemm_shapes.model_verdict(smoke_rows).startswith(
        "no verdict: there is no prediction to check (the step model prices a GEMM from a GPU")


def test_with_a_gpu_spec_the_rows_carry_its_predictions_and_a_faster_run_is_caught(monkeypatch):
    slow = dataclasses.replace(H100, dense_flop_per_s={"fp32": 1e3})  # a "peak" any run beats
    monkeypatch.setattr(gemm_shapes, "predictor", lambda dtype, device: (slow, ""))
    rows = gemm_shapes.run(dataclasses.replace(SMOKE, attempts=1), device="cpu")
    for r in (r for r in rows if r["kind"] == "gemm"):
        g = step_model.Gemm(r["name"], r["m"], r["n"], r["k"], 1, 4.0, 4.0, 4.0)
        assert r["predicted_s"] == step_model.gemm_time_s(g, slow, 1e3, hardware.STEP_CONSTANTS)
        assert r["waves"] == 1  # a few tiles on 132 SMs
    assert any(p.endswith(f"above the {H100.name}'s dense fp32 peak") for p in rows[-1]["problems"])
    assert gemm_shapes.model_verdict(rows).startswith("no verdict: the machine was too noisy")


# --- the verdict, fed rows as an H100 would give them ----------------------------------------


def _rows(block=lambda r: 1.0, sweep=None, problems=()):
    """The GPU sizes' rows priced for an H100, each timed (steadily) at block(row) x its
    prediction; the sweep at `sweep(row)` seconds if given, else like the block GEMMs."""
    c = hardware.STEP_CONSTANTS
    rows = [{"kind": "setup", "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16",
             "accelerator": H100.name, "sm_count": H100.sm_count, "gemm_fraction": c.gemm_fraction,
             "no_prediction": ""}]
    entries = [("model", name, tp, g) for name, mb, seq in GPU.models for tp in GPU.tps
               for g in gemm_shapes.model_gemms(catalog.named_config(name), tp=tp,
                                                micro_batch=mb, seq=seq)]
    entries += [("sweep", "", 1, g) for g in gemm_shapes.sweep_gemms(GPU)]
    for i, (group, name, tp, g) in enumerate(entries):
        r = {"kind": "gemm", "group": group, "model": name, "tp": tp, "name": g.name, "m": g.m,
             "n": g.n, "k": g.k, "batch": g.batch, "flops": g.flops, "index": i,
             **gemm_shapes.predict(g, H100, "bf16"), "no_prediction": ""}
        seconds = (sweep(r) if sweep and group == "sweep" else block(r) * r["predicted_s"])
        rows.append({**r, **steady(seconds)})
    rows.append({"kind": "consistency", "problems": list(problems), "attempts": 1})
    return rows


def test_a_run_that_follows_the_model_is_within_and_shows_the_saw_tooth():
    rows = _rows()
    text = gemm_shapes.model_verdict(rows)
    assert text.startswith("the block GEMMs are within 15% of the model on all 20 shapes")
    assert "the sweep's shapes: 40 of 40 within 15%" in text
    found = gemm_shapes.boundaries(rows)
    # 128 x 256 tiles: 16 per 128 rows of N = 4,096; a wave is 132 tiles, so the waves grow
    # where 16 M / 128 first passes 132 k: 144 > 132, 272 > 264, 400 > 396, 544 > 528
    assert [b["m_after"] for b in found] == [1152, 2176, 3200, 4352]
    drop = sorted(b["predicted_drop"] for b in found)
    assert f"TFLOP/s drops by {(drop[1] + drop[2]) / 2:.0%} after a wave boundary" in text
    assert "the wave saw-tooth is visible" in text and "clearly at 4 of 4" in text
    assert "systematically" not in text


@pytest.mark.parametrize("factor, words", [(2.0, "systematically 2.00x optimistic"),
                                           (0.5, "systematically 2.00x pessimistic")])
def test_a_systematic_miss_is_named_with_its_size(factor, words):
    text = gemm_shapes.model_verdict(_rows(block=lambda r: factor))
    assert words in text and "within 15% on 0 of 20" in text
    assert "the sweep's shapes: 0 of 40 within 15%" in text
    assert "the wave saw-tooth is visible" in text  # a uniform factor keeps its shape


def test_a_tie_is_neither_within_nor_systematic():
    text = gemm_shapes.model_verdict(_rows(block=lambda r: 1.0 if r["index"] % 2 else 2.0))
    assert text.startswith("the block GEMMs are within 15% of the model on 10 of 20 shapes")
    assert "systematically" not in text and "takes 2.00x its prediction" in text
    edge = gemm_shapes.model_verdict(_rows(block=lambda r: 1.14 if r["index"] % 2 else 1.16))
    assert "within 15% of the model on 10 of 20 shapes" in edge  # 1.14 within, 1.16 not


def test_a_flat_sweep_shows_no_saw_tooth():
    rate = 600e12  # the same TFLOP/s at every M
    text = gemm_shapes.model_verdict(_rows(sweep=lambda r: r["flops"] / rate))
    assert "no wave saw-tooth is visible where the model puts one" in text
    assert "TFLOP/s changes by +0% there" in text and "a clear drop at 0 of 4" in text
    assert text.endswith("no step of the sweep drops by 5% or more")


def test_a_saw_tooth_elsewhere_is_not_the_models():
    def late(r):  # a dip of a third one step after each of the model's boundaries
        return r["flops"] / (400e12 if r["m"] in (1280, 2304, 3328, 4480) else 600e12)

    text = gemm_shapes.sawtooth_text(_rows(sweep=late))
    assert text.startswith("no wave saw-tooth is visible where the model puts one")
    assert text.endswith("the largest measured drop is 33%, from M = 1,152 to 1,280")


def test_noise_or_no_prediction_withholds_the_verdict():
    noisy = _rows(problems=["sweep M=128: p80 / p20 = 2.00 (more than 1.5)"])
    assert gemm_shapes.model_verdict(noisy).startswith("no verdict: the machine was too noisy")
    rows = _rows()
    rows[0] = {**rows[0], "no_prediction": "NVIDIA H100 PCIe is not in the table"}
    assert gemm_shapes.model_verdict(rows) == (
        "no verdict: there is no prediction to check (NVIDIA H100 PCIe is not in the table)")


def test_the_plot_draws_the_sweep_the_model_and_its_boundaries():
    import matplotlib

    matplotlib.use("Agg")
    from mlsys import plotting

    rows = _rows()
    _, ax = plotting.subplots()
    gemm_shapes.plot(rows, ax)
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(label.startswith("step model (H100") for label in labels)
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == len(gemm_shapes.boundaries(rows)) == 4
