"""The chapter 06 experiments (smoke sizes) and the naive-attention memory model they check."""

import pytest
import torch

from mlsys import memory_timeline
from mlsys.accounting import attention as A
from mlsys.experiments import attention_model_step, attention_sweep, flash_benchmark
from mlsys.models.attention import FlashAttentionTorch, attention, max_error, naive_attention


@pytest.mark.parametrize("shape", [(2, 1, 64, 16), (3, 2, 37, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_memory_is_what_the_allocator_holds(shape, causal):
    batch, heads, n, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen)
    meter = memory_timeline.meter("cpu")
    with meter.recording():
        with meter.phase("forward"):
            out = naive_attention(q, k, v, is_causal=causal)
        with meter.phase("backward"):
            out.backward(grad)
    rows = {r["phase"]: r for r in meter.rows}
    predicted = A.naive_memory(batch, heads, n, n, d, "fp32", causal=causal)
    assert rows["forward"]["live_bytes"] == predicted.before_backward_bytes
    assert rows["backward"]["peak_bytes"] == predicted.backward_peak_bytes
    assert predicted.backward_peak_bytes - predicted.before_backward_bytes == (
        2 * predicted.matrix_bytes + predicted.output_bytes)  # dP, dS and dV


def test_naive_attention_is_the_reference_and_checks_its_flag():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 19, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(naive_attention(q, k, v, is_causal=causal),
                                   attention(q, k, v, is_causal=causal))
    with pytest.raises(TypeError, match="is_causal"):
        naive_attention(q, k, v, is_causal="yes")


def test_max_error_finds_a_wrong_implementation():
    gen = torch.Generator().manual_seed(2)
    shapes = ((5, 7, 8), (9, 9, 16))
    good = max_error(FlashAttentionTorch.apply, shapes, dtype=torch.float64, causal=True,
                     generator=gen)
    assert good < 1e-10

    def off_by_scale(q, k, v, causal):
        return attention(q * 1.01, k, v, is_causal=causal)

    assert max_error(off_by_scale, shapes, dtype=torch.float64, causal=True,
                     generator=gen) > 1e-3
    with pytest.raises(TypeError, match="fn must be callable"):
        max_error(3, shapes, dtype=torch.float64, causal=False, generator=gen)


@pytest.fixture(scope="module")
def sweep_rows():
    return attention_sweep.run(attention_sweep.SIZES["smoke"], device="cpu")


def test_attention_sweep_rows_equal_the_prediction(sweep_rows):
    rows = attention_sweep.measured(sweep_rows, "eager")
    s = attention_sweep.SIZES["smoke"]
    assert len(rows) == len(s.d_heads) * len(s.seqs)
    for r in rows:
        p = attention_sweep.predicted(sweep_rows, r)
        assert (r["before_backward_bytes"], r["backward_peak_bytes"]) == (
            p.before_backward_bytes, p.backward_peak_bytes)
        assert r["forward"]["p20_s"] <= r["forward"]["median_s"] <= r["forward"]["p80_s"]
    text = attention_sweep.verdicts(sweep_rows)
    assert text["memory"].startswith("every eager row is within 0.0% of the prediction")
    assert "did not run" in text["compiled"]
    assert len(attention_sweep.table(sweep_rows).rows) == len(rows)


def test_attention_sweep_records_out_of_memory_and_skips_longer(monkeypatch):
    real = attention_sweep._memory

    def failing(fn, s, seq, d, device, gen):
        if seq >= 128:
            raise RuntimeError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(fn, s, seq, d, device, gen)

    monkeypatch.setattr(attention_sweep, "_memory", failing)
    rows = attention_sweep.run(attention_sweep.SIZES["smoke"], device="cpu")
    status = [(r["d_head"], r["seq"], r["status"]) for r in rows if r["kind"] == "row"]
    assert (16, 128, "out of memory") in status
    assert (16, 256, "skipped (a shorter length ran out of memory)") in status


def test_flash_benchmark_rows_and_targets():
    rows = flash_benchmark.run(flash_benchmark.SIZES["smoke"], device="cpu")
    names = {r["implementation"] for r in flash_benchmark.measured(rows)}
    assert {"naive", "flash_torch", "sdpa_math"} <= names
    r = flash_benchmark.measured(rows)[0]
    assert flash_benchmark.flops(rows, r, "backward") == 2 * flash_benchmark.flops(rows, r,
                                                                                   "forward")
    assert "targets are read from a GPU record" in flash_benchmark.targets(rows)
    assert set(flash_benchmark.verdicts(rows)) == {"speed", "memory"}
    fake = [dict(x) for x in rows]  # a GPU-like record at the target configuration
    base = {"kind": "row", "status": "ok", "problems": [], "batch": 1,
            **flash_benchmark.TARGET}
    fast = {"median_s": 1e-3, "p20_s": 1e-3, "p80_s": 1e-3, "samples_s": [1e-3] * 4}
    slow = {**fast, "median_s": 2e-3, "p20_s": 2e-3, "p80_s": 2e-3}
    fake += [{**base, "implementation": "flash_triton", "forward": fast,
              "forward+backward": slow},
             {**base, "implementation": "sdpa_flash", "forward": slow, "forward+backward": fast}]
    text = flash_benchmark.targets(fake)
    assert "forward 2.00x the speed of the best SDPA backend (sdpa_flash; target >= 1): met" in text
    assert "forward + backward 0.50x" in text and "missed" in text


def test_attention_model_step_matches_saved_bytes():
    rows = attention_model_step.run(attention_model_step.SIZES["smoke"], device="cpu")
    for backend, m in attention_model_step.memory(rows).items():
        assert m["saved_bytes"] == attention_model_step.predicted_saved(rows, backend)
    mem = attention_model_step.memory(rows)
    assert mem["sdpa"]["saved_bytes"] == mem["flash_torch"]["saved_bytes"] < mem["naive"][
        "saved_bytes"]
    assert set(attention_model_step.verdicts(rows)) == {"memory", "time"}


def test_recorded_forward_seconds_reads_only_the_named_gpus_records(tmp_path, monkeypatch):
    from mlsys import hardware, results
    from mlsys.experiments import flash_benchmark

    rows = [{"kind": "row", "status": "ok", "implementation": "flash_triton", "dtype": "bf16",
             "causal": True, "d_head": 128, "seq": 512, "batch": 8, "problems": [],
             "forward": {"median_s": 2e-3, "p20_s": 2e-3, "p80_s": 2e-3, "samples_s": [2e-3]}}]
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"):
        folder = tmp_path / results.device_slug(name)
        folder.mkdir()
        record = {"experiment": "flash_benchmark", "results": rows, "provenance": {
            "device": name, "device_type": "cuda", "profile": "gpu", "torch_version": "2.13",
            "triton_version": "3.7.1", "cuda_version": "12.8", "date": "2026-11-25",
            "git_commit": "x", "command": "python -m mlsys.experiments flash_benchmark"}}
        (folder / "flash_benchmark.json").write_text(__import__("json").dumps(record))
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    assert flash_benchmark.recorded_forward_seconds(hardware.H100_SXM) == {(8, 512): 2e-3}
    assert flash_benchmark.recorded_forward_seconds(hardware.H200_SXM) == {}
