"""mlsys.accounting.calibration: the stored constants are the fit's, the calibration rows are
predicted within the issue's bounds (mean 10%, each row 20%) and better than their own mean,
left-out rows are predicted by a fit without them, and Llama 3 405B (not fitted) is predicted."""

from dataclasses import asdict, replace

import pytest

from mlsys import hardware, third_party
from mlsys.accounting import calibration, flops, params, step_model
from mlsys.models.config import TransformerConfig

ROWS = third_party.MEGATRON_TABLE1


def test_the_rows_models_are_the_books_gpt_configs():
    for build in (lambda: calibration.megatron_config(ROWS[0]), calibration.llama3_config):
        sizes = build()
        cfg = TransformerConfig(**asdict(sizes))
        assert step_model.step_flops(sizes, batch=1, seq=2048) == step_model.step_flops(
            cfg, batch=1, seq=2048) == (flops.transformer_flops(cfg, 1, 2048)
                                        .training_matmul_flops,) * 2
    gpt = TransformerConfig(**asdict(calibration.megatron_config(ROWS[0])))
    assert gpt.mlp == "gelu" and gpt.tie_embeddings and gpt.positions == "learned"
    assert round(params.count_params(gpt) / 1e9, 1) == ROWS[0].params_b
    llama = TransformerConfig(**asdict(calibration.llama3_config()))
    assert round(params.count_params(llama) / 1e9) == 406  # "405B": 405.85e9 in Table 3's count


def test_the_stored_constants_are_the_fit():
    fitted = calibration.fit()
    stored = hardware.STEP_CONSTANTS
    for name in calibration.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(stored, name), abs=1e-9), name
    assert fitted.intra_latency_s == stored.intra_latency_s  # assumed, not fitted


def test_the_calibration_rows_are_predicted_within_the_bounds():
    res = calibration.residuals()
    assert len(res) == len(ROWS) == 10
    assert calibration.mean_abs_error(res) <= 0.10
    assert max(abs(r.error) for r in res) <= 0.20
    for r, row in zip(res, ROWS, strict=True):
        assert r.published == row.tflops_per_gpu and r.params_b == row.params_b
        b = calibration.predict(row)
        flops = step_model.megatron_flops(calibration.megatron_config(row), batch=row.batch,
                                          seq=third_party.MEGATRON_SEQ)
        assert r.predicted == pytest.approx(flops / (b.step_s * row.gpus) / 1e12)
        assert b.hardware_flops == pytest.approx(flops)  # Eq. 3 is the full-recompute count


def test_the_model_beats_the_rows_own_mean():
    model = calibration.mean_abs_error(calibration.residuals())
    null = calibration.mean_abs_error(calibration.null_model())
    assert model < null / 2


def test_the_breakdown_of_the_largest_row():
    b = calibration.predict(ROWS[-1])  # 1T on 3,072 GPUs: p = 64 stages, m = 512, v = 1
    assert b.microbatches == 512
    assert b.bubble_s / (b.step_s - b.bubble_s) == pytest.approx(63 / 512, rel=0.15)
    assert b.recompute_s > 0.2 * (b.compute_s - b.recompute_s)
    assert b.exposed_s["tp"] > b.exposed_s["dp"] > 0


@pytest.mark.parametrize("i", [0, len(ROWS) - 1])
def test_a_left_out_row_is_predicted_by_the_others(i):
    rows = ROWS[:i] + ROWS[i + 1:]
    fitted = calibration.fit(rows)
    (left,) = calibration.residuals(fitted, (ROWS[i],))
    assert abs(left.error) <= 0.20


def test_llama3_405b_is_predicted_without_being_fitted():
    for row in third_party.LLAMA3_405B_RUN:
        b = calibration.llama3_prediction(row)
        tflops = b.model_flops / (b.step_s * row.gpus) / 1e12
        assert abs(tflops - row.tflops_per_gpu) / row.tflops_per_gpu <= 0.20
        assert b.mfu == pytest.approx(tflops * 1e12 / 989.4e12, rel=1e-3)
    flat = calibration.llama3_prediction(third_party.LLAMA3_405B_RUN[0], virtual_stages=1)
    assert flat.bubble_s > calibration.llama3_prediction(third_party.LLAMA3_405B_RUN[0]).bubble_s


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="PublishedRun"):
        calibration.predict("1.7B")
    with pytest.raises(TypeError, match="Llama3Run"):
        calibration.llama3_prediction(ROWS[0])
    with pytest.raises(ValueError, match="rows"):
        calibration.fit([])
    with pytest.raises(ValueError, match="residuals"):
        calibration.mean_abs_error([])
    with pytest.raises(ValueError, match="two rows"):
        calibration.leave_one_out(ROWS[:1])
    with pytest.raises(ValueError, match="gemm_fraction"):
        replace(hardware.STEP_CONSTANTS, gemm_fraction=0.0)
