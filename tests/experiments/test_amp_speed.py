"""The amp_speed experiment (chapter 07, smoke sizes): rows, tables, verdicts computed from the
numbers and withheld when noisy; a GPU record read without the CPU caveat."""

import pytest
import torch
from experiment_cases import quiet, steady

from mlsys.experiments import amp_speed


@pytest.fixture(scope="module")
def speed_rows():
    return amp_speed.run(amp_speed.SIZES["smoke"], device="cpu")


def test_amp_speed_rows_tables_and_verdicts(speed_rows):
    s = amp_speed.SIZES["smoke"]
    ok = amp_speed.measured(speed_rows)
    assert {(r["run"], r["seq"]) for r in ok} == {(run, q) for run in amp_speed.RUNS
                                                  for q in s.seqs}
    for r in ok:
        for mode in amp_speed.MODES:
            assert r[mode]["p20_s"] <= r[mode]["median_s"] <= r[mode]["p80_s"]
        assert r["step peak_bytes"] is None  # read on a GPU only
    assert len(amp_speed.table(speed_rows).rows) == len(ok)
    assert len(amp_speed.speedups(speed_rows)) == 2 * len(s.seqs)
    text = amp_speed.verdicts(quiet(speed_rows))
    assert set(text) == {"speed", "floor", "memory", "text"}
    assert "says nothing about a GPU" in text["speed"]  # a CPU never claims a speed-up
    assert "fp32 " in text["floor"] and "x the tokens" in text["floor"]
    assert text["text"] == (f"On this machine: {text['speed']}. How the step time follows the "
                            f"tokens: {text['floor']}.")
    noisy = quiet(speed_rows)
    noisy[1]["problems"] = ["forward: p80 / p20 = 3.00 (more than 1.5)"]
    withheld = amp_speed.verdicts(noisy)
    assert withheld["speed"].startswith("no verdict")
    assert withheld["text"].lower().count("no verdict") == 1  # once, not for speed and floor


@pytest.mark.parametrize("bf16_s, words", [(1e-3, "ran 2.00x as fast in bf16"),
                                           (4e-3, "ran 0.50x as fast in bf16")])
def test_the_cpu_caveat_is_the_measured_matmul_probe(speed_rows, bf16_s, words):
    """Whatever this CPU's bf16 matmuls do, the sentence reports the probe, never a claim."""
    rows = quiet(speed_rows)
    for r in amp_speed.measured(rows):
        r["matmul fp32"] = steady(2e-3)
        r["matmul bf16"] = steady(bf16_s)
    text = amp_speed.verdicts(rows)["speed"]
    assert f"the model's w1 matmul {words} as in fp32" in text
    assert "for want of" not in text and "no matrix units" not in text
    for r in amp_speed.measured(rows):  # a record from before the probe: no sentence about it
        del r["matmul bf16"]
    assert "w1 matmul" not in amp_speed.verdicts(rows)["speed"]


def test_amp_speed_reads_a_gpu_record_without_the_cpu_caveat(speed_rows):
    rows = quiet(speed_rows)
    rows[0]["device_type"] = "cuda"
    for r in amp_speed.measured(rows):
        for mode in amp_speed.MODES:
            r[f"{mode} peak_bytes"] = {"fp32": 4000, "bf16 autocast": 3000, "pure bf16": 2000}[
                r["run"]]
        t = 4e-3 if r["run"] == "fp32" else 1e-3  # a GPU's bf16 runs: 4x faster
        for mode in amp_speed.MODES:
            r[mode] = {"median_s": t, "p20_s": t, "p80_s": t, "samples_s": [t] * 3}
    text = amp_speed.verdicts(rows)
    assert "bf16 autocast is 4.00x faster than fp32" in text["speed"]
    assert "GPU" not in text["speed"]
    assert text["memory"] == "bf16 autocast 0.75x, pure bf16 0.50x the fp32 step's peak"


def test_amp_speed_keeps_an_out_of_memory_row(monkeypatch):
    real = amp_speed._callables

    def failing(step, tokens):
        if step.policy.param_dtype == "bf16" and tokens.shape[1] == 17:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(step, tokens)

    monkeypatch.setattr(amp_speed, "_callables", failing)
    rows = amp_speed.run(amp_speed.SIZES["smoke"], device="cpu")
    status = {(r["run"], r["seq"]): r["status"] for r in rows if r["kind"] == "row"}
    assert status[("pure bf16", 16)] == "out of memory" and status[("pure bf16", 8)] == "ok"
    assert "out of memory" in repr(amp_speed.table(rows))
