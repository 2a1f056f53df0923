"""The attention_sweep experiment (chapter 06, smoke sizes) and the naive-attention memory model it
checks: the allocator's bytes equal the prediction, a length out of memory is kept."""

import pytest

from mlsys.experiments import attention_sweep


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
