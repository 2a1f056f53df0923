"""The chapter 07 experiments (smoke sizes): amp_speed, autocast_overhead, amp_memory,
autocast_dtypes: rows, tables, verdicts computed from the numbers and withheld when noisy."""

import copy
import importlib

import pytest
import torch

from mlsys import experiments
from mlsys.experiments import amp_memory, amp_speed, autocast_dtypes, autocast_overhead
from mlsys.models.config import TransformerConfig

MINE = ("amp_speed", "autocast_overhead", "amp_memory", "autocast_dtypes")


def _quiet(rows):
    """The rows with every noise finding removed and every timing made steady."""
    rows = copy.deepcopy(rows)
    for r in rows:
        if "problems" in r:
            r["problems"] = []
    return rows


def test_each_belongs_to_the_chapter_with_a_gpu_budget():
    for name in MINE:
        e = importlib.import_module(f"mlsys.experiments.{name}").EXPERIMENT
        assert e.chapter == "07_mixed_precision" and set(e.sizes) == {"smoke", "cpu", "gpu"}
        assert 0 < e.gpu_seconds <= experiments.CHUNK_S
    assert amp_speed.EXPERIMENT.sizes["gpu"].presets[-1] == "2.7B"


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
    text = amp_speed.verdicts(_quiet(speed_rows))
    assert set(text) == {"speed", "floor", "memory"}
    assert "says nothing about a GPU" in text["speed"]  # a CPU never claims a speed-up
    assert "fp32 " in text["floor"] and "x the tokens" in text["floor"]
    noisy = _quiet(speed_rows)
    noisy[1]["problems"] = ["forward: p80 / p20 = 3.00 (more than 1.5)"]
    assert amp_speed.verdicts(noisy)["speed"].startswith("no verdict")


def test_amp_speed_reads_a_gpu_record_without_the_cpu_caveat(speed_rows):
    rows = _quiet(speed_rows)
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


@pytest.fixture(scope="module")
def overhead_rows():
    return autocast_overhead.run(autocast_overhead.SIZES["smoke"], device="cpu")


def test_autocast_adds_exactly_its_casts(overhead_rows):
    p = autocast_overhead.presets(overhead_rows)["debug"]
    cfg = TransformerConfig.preset("debug")
    linear = 7 * cfg.n_layers + 1  # q k v o w1 w3 w2 per block, and the head
    assert p["matmul_weights"] == linear and p["weight_cast_bytes"] == 6 * p[
        "matmul_weight_params"]
    for seq in autocast_overhead.SIZES["smoke"].seqs:
        f32 = autocast_overhead.counts(overhead_rows, "debug", seq, "fp32")
        amp = autocast_overhead.counts(overhead_rows, "debug", seq, "bf16 autocast")
        for phase in ("forward", "backward"):
            assert amp[phase]["ops"] - f32[phase]["ops"] == amp[phase]["cast_ops"]
            assert f32[phase]["cast_ops"] == 0
        assert amp["forward"]["cast_ops"] >= linear  # every matmul weight, cast once
        assert amp["forward"]["cast_bytes"] >= p["weight_cast_bytes"]
        assert amp["optimizer"]["ops"] == f32["optimizer"]["ops"]  # the update is fp32 either way
    assert len(autocast_overhead.table(overhead_rows).rows) == 2 * len(
        autocast_overhead.SIZES["smoke"].seqs)


def test_autocast_overhead_verdicts_follow_the_numbers(overhead_rows):
    rows = _quiet(overhead_rows)
    text = autocast_overhead.verdicts(rows)["debug"]
    c = autocast_overhead.counts(rows, "debug", 8, "bf16 autocast")
    assert f"runs {sum(v['ops'] for v in c.values())} ops" in text
    p = autocast_overhead.presets(rows)["debug"]
    slow = {"median_s": 1.0, "p20_s": 1.0, "p80_s": 1.0, "samples_s": [1.0] * 3}
    p["timings"]["weight casts"] = {**slow, "median_s": 0.9, "samples_s": [0.9] * 3}
    p["timings"]["bf16 autocast step 8"] = slow
    assert "the floor is the weight casts" in autocast_overhead.verdicts(rows)["debug"]
    p["problems"] = ["copy: moved by 40% during the run (more than 25%)"]
    assert autocast_overhead.verdicts(rows)["debug"].startswith("no verdict")


def test_the_seed_floor_is_not_autocasts():
    text = autocast_overhead.seed_verdict()
    assert "142 ms in fp32 and 157 ms in bf16 at 128 tokens" in text
    assert "took 0.98x as long at 512 tokens" in text
    assert "took 0.91x the large preset's time" in text


@pytest.fixture(scope="module")
def memory_rows():
    return amp_memory.run(amp_memory.SIZES["smoke"], device="cpu")


def test_amp_memory_counts_and_verdicts(memory_rows):
    rs = amp_memory.runs(memory_rows)
    n = rs[("debug", "fp32")]["n_params"]
    assert rs[("debug", "fp32")]["states_bytes"] == 16 * n
    assert rs[("debug", "pure bf16")]["states_bytes"] == 8 * n
    amp = rs[("debug", "bf16 autocast")]
    cfg = TransformerConfig.preset("debug")
    linear = cfg.n_layers * (4 * cfg.d_model**2 + 3 * cfg.d_model * cfg.d_ff) + \
        cfg.d_model * cfg.vocab_size
    assert amp["cast_cache_bytes"] == 2 * linear
    rise = (amp_memory.peak(memory_rows, "debug", "bf16 autocast", "inference forward")
            - amp_memory.peak(memory_rows, "debug", "fp32", "inference forward"))
    assert 0.8 * amp["cast_cache_bytes"] < rise < 1.2 * amp["cast_cache_bytes"]
    assert amp["saved_bytes"] > 0 and len(amp_memory.table(memory_rows).rows) == 3
    text = amp_memory.verdicts(memory_rows)
    assert set(text) == {"inference", "training", "split"}
    assert "cached bf16 copies of the matmul weights" in text["inference"]
    assert "the states stay" in text["training"]


@pytest.fixture(scope="module")
def dtype_rows():
    return autocast_dtypes.run(autocast_dtypes.SIZES["smoke"], device="cpu")


def test_autocast_dtypes_on_this_cpu(dtype_rows):
    for dtype in autocast_dtypes.DTYPES:
        assert autocast_dtypes.module(dtype_rows, "toy", dtype, "ln")["output"] == dtype
        assert autocast_dtypes.loss_dtype(dtype_rows, "transformer", dtype) == "fp32"
    check = autocast_dtypes.seed_check(dtype_rows)
    assert check["ln output"] == "measured fp16 (the seed: fp32)"  # CPU autocast differs here
    assert check["loss"] == "measured fp32, as the seed says"
    assert check["gradients"] == "measured fp32, as the seed says"
    table = autocast_dtypes.table(dtype_rows)
    assert len(table.rows) == 2 * 4 + 2
    assert len(autocast_dtypes.table(dtype_rows, model="transformer").rows) > 20
