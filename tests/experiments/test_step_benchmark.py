"""The step_benchmark experiment (chapter 05, smoke sizes): rows against the accounting, a length
that runs out of memory kept, and the seed's table read against the A100."""

import pytest
import torch

from mlsys import hardware, third_party
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops
from mlsys.experiments import step_benchmark


@pytest.fixture(scope="module")
def bench_rows():
    return step_benchmark.run(step_benchmark.SIZES["smoke"], device="cpu")


def test_step_benchmark_rows_carry_the_accounting(bench_rows):
    s = step_benchmark.SIZES["smoke"]
    rows = step_benchmark.measured(bench_rows)
    assert [r["seq"] for r in rows] == list(s.seqs)
    cfg = s.models[0][1]
    for r in rows:
        forward = flops.transformer_flops(cfg, s.batch, r["seq"]).forward_matmul_flops
        assert r["forward_flops"] == forward
        assert r["optimizer_bytes"] == bytes_moved.adamw_traffic(r["n_params"]).total_bytes
        forward = step_benchmark.predicted_s(r, "forward")
        assert step_benchmark.predicted_s(r, "forward+backward") == pytest.approx(3 * forward)
        assert step_benchmark.predicted_s(r, "step") > 3 * forward  # plus the optimizer's bytes
        for mode in step_benchmark.MODES:
            assert r[mode]["p20_s"] <= r[mode]["median_s"] <= r[mode]["p80_s"]
    assert len(step_benchmark.table(bench_rows).rows) == len(rows)
    text = step_benchmark.verdicts(bench_rows)
    assert set(text) == {"overhead", "backward", "roof"}


def test_a_row_that_runs_out_of_memory_is_recorded_and_the_sweep_goes_on(monkeypatch):
    real = step_benchmark._callables

    def failing(model, optimizer, tokens, dtype):
        if tokens.shape[1] == 65:  # seq 64
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, optimizer, tokens, dtype)

    monkeypatch.setattr(step_benchmark, "_callables", failing)
    rows = step_benchmark.run(step_benchmark.SIZES["smoke"], device="cpu")
    status = {r["seq"]: r["status"] for r in rows if r["kind"] == "row"}
    assert status == {32: "ok", 64: "out of memory", 128: "ok"}
    assert "out of memory" in repr(step_benchmark.table(rows))


def test_other_errors_are_not_swallowed(monkeypatch):
    def broken(*args):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(step_benchmark, "_callables", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        step_benchmark.run(step_benchmark.SIZES["smoke"], device="cpu")


def test_the_seed_table_is_read_against_the_a100():
    rows = step_benchmark.third_party_rows(hardware.A100_80GB_SXM)
    assert len(rows) == len(third_party.CS336_STUDENT_BENCHMARK) == 18
    fp32 = hardware.A100_80GB_SXM.peak_flop_per_s("fp32")
    assert max(r["achieved_flop_per_s"] for r in rows) < fp32  # an fp32 run below its fp32 peak
    text = step_benchmark.third_party_verdict(hardware.A100_80GB_SXM)
    assert "small took 1.02x as long at 256 tokens as at 128" in text
    assert "backward / forward ran from 1.53 to" in text


def test_record_views_draw_the_trace_and_give_the_tables():
    views = step_benchmark.record_views()
    assert set(views["tables"]) == {"step_profile", "step_memory"}
    assert views["shows"]["step_profile"]({"results": []}) is None  # an old record: no trace


def test_the_seed_gpu_is_inferred_and_the_summary_asserts_it():
    name, reasoning = step_benchmark.seed_gpu()
    assert name == "A100 80GB" and "`ampere_sgemm_*`" in reasoning and "70 GB" in reasoning
    values, table = step_benchmark.seed_summary(hardware.A100_80GB_SXM)
    assert values["seed_gpu_text"] == reasoning and len(table.rows) == len(
        third_party.CS336_STUDENT_BENCHMARK)
    assert values["q_small_128_ms"] == pytest.approx(24.99)
    with pytest.raises(AssertionError, match="H100"):  # the table says Ampere, 80 GB
        step_benchmark.seed_summary(hardware.H100_SXM)
