"""The chapter 05 experiments (smoke sizes): step_benchmark, timing_pitfalls, compile_step,
step_profile, step_memory."""

import pytest
import torch

from mlsys import hardware, memory_timeline, profiling, third_party
from mlsys.accounting import activations, flops
from mlsys.accounting import bytes as B
from mlsys.experiments import (
    compile_step,
    step_benchmark,
    step_memory,
    step_profile,
    timing_pitfalls,
)


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
        assert r["optimizer_bytes"] == B.adamw_traffic(r["n_params"]).total_bytes
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


def test_timing_pitfalls_give_one_sentence_each():
    rows = timing_pitfalls.run(timing_pitfalls.SIZES["smoke"], device="cpu")
    text = timing_pitfalls.sentences(rows)
    assert set(text) == {"warmup: eager forward", "sync", "clock", "spread", "cache"}
    warm = next(r for r in rows if r["kind"] == "warmup")
    assert len(warm["first_s"]) == timing_pitfalls.SIZES["smoke"].first_calls
    assert "they agree" in text["sync"] or "too small" in text["sync"] or "misses" in text["sync"]
    assert "no events to compare" in text["clock"]  # a CPU has none


def test_compile_verdicts_refuse_overlapping_spreads():
    def timing(median, lo, hi):
        return {"median_s": median, "p20_s": lo, "p80_s": hi, "samples_s": [lo, median, hi]}

    rows = [{"kind": "mode", "mode": "forward", "first_s": [9.0, 0.1, 0.1],
             "eager": timing(1.0, 0.9, 1.1), "compiled": timing(0.95, 0.8, 1.0), "problems": []},
            {"kind": "shape", "seq": 64, "first_s": 3.0, "new_graphs": 1}]
    text = compile_step.verdicts(rows)
    assert "the p20–p80 ranges overlap: not a speed-up to report" in text["speed"]
    assert "its first call took 9 s" in text["speed"]
    assert text["shapes"] == "seq 64: 1 new graph(s), first call 3,000 ms"


def test_compile_step_smoke_runs_eager_only():
    rows = compile_step.run(compile_step.SIZES["smoke"], device="cpu")
    assert all(r["compiled"] is None for r in rows if r["kind"] == "mode")
    assert compile_step.verdicts(rows)["speed"].startswith("torch.compile did not run")


@pytest.fixture(scope="module")
def profile_rows():
    return step_profile.run(step_profile.SIZES["smoke"], device="cpu")


def test_step_profile_rows_split_the_step_into_phases_and_classes(profile_rows):
    s = step_profile.SIZES["smoke"]
    phases = [r["phase"] for r in profile_rows if r["kind"] == "phase"]
    assert phases[:3] == list(step_profile.PHASES)
    for phase in (*step_profile.PHASES, "all"):
        shares = [c.share for c in step_profile.classes(profile_rows) if c.phase == phase]
        assert sum(shares) == pytest.approx(1.0)
    assert step_profile.share(profile_rows, "optimizer", "optimizer") == pytest.approx(1.0)
    assert step_profile.share(profile_rows, "optimizer", "forward") == 0.0
    assert step_profile.share(profile_rows, "matmul", "forward") > 0
    cfg = step_profile.TransformerConfig.preset(s.preset)
    assert step_profile.class_flops(profile_rows) == profiling.class_flops(cfg, s.batch, s.seq,
                                                                           training=True)
    table = step_profile.class_table(profile_rows)
    assert table.header[-1] == "FLOPs" and "matmul" in {r[0] for r in table.rows}
    no_matmul = step_profile.op_table(profile_rows, top=5, exclude=("matmul",))
    assert len(no_matmul.rows) == 5 and all(r[1] != "matmul" for r in no_matmul.rows)
    assert [r[0] for r in step_profile.phase_table(profile_rows).rows] == list(step_profile.PHASES)


def test_step_profile_attention_core_flops_and_sentences(profile_rows):
    st = step_profile.setup(profile_rows)
    fl = step_profile.core_flops(profile_rows)
    assert fl["scores"] / fl["softmax"] == pytest.approx(2 * st["d_head"] / 5)
    assert fl["scores"] == fl["values"]
    assert [r[0] for r in step_profile.core_table(profile_rows).rows] == list(step_profile.CORE)
    text = step_profile.verdicts(profile_rows)
    assert set(text) == {"matmul", "normalization", "attention", "overhead"}
    ratio = 2 * st["d_head"] / 5
    assert f"{ratio:.1f}x the softmax's FLOPs" in text["attention"] or "no verdict" in \
        text["attention"]


def test_step_profile_verdicts_follow_the_numbers(profile_rows):
    rows = [dict(r) for r in profile_rows]
    core = next(r for r in rows if r["kind"] == "core")
    fast = {"median_s": 1e-3, "p20_s": 1e-3, "p80_s": 1e-3, "samples_s": [1e-3] * 6}
    slow = {**fast, "median_s": 4e-3, "p20_s": 4e-3, "p80_s": 4e-3, "samples_s": [4e-3] * 6}
    core.update(scores=slow, softmax=fast, values=slow)
    oh = next(r for r in rows if r["kind"] == "overhead")
    oh.update(plain=fast, profiled=slow)
    text = step_profile.verdicts(rows)
    assert "takes 4.00x its time (longer than it)" in text["attention"]
    assert "took 4.00x the plain one" in text["overhead"]
    core.update(scores={**fast, "samples_s": [1e-3, 1e-3, 1e-3, 9e-3, 9e-3, 9e-3]})
    assert "no verdict" in step_profile.verdicts(rows)["attention"]


@pytest.fixture(scope="module")
def memory_rows():
    return step_memory.run(step_memory.SIZES["smoke"], device="cpu")


def test_step_memory_counts_the_saved_bytes_exactly(memory_rows):
    s = step_memory.SIZES["smoke"]
    cfg = step_memory.TransformerConfig.preset(s.preset)
    for segment in (None, *s.segments):
        for r in step_memory.steps(memory_rows, segment=segment):
            exact = activations.saved_bytes(cfg, s.batch, r["seq"], checkpoint_segment=segment)
            assert r["saved_bytes"] == exact.total_bytes
    plain = step_memory.steps(memory_rows)
    assert [r["seq"] for r in plain] == list(s.seqs)
    assert all(r["param_bytes"] * 2 == r["optimizer_bytes"] - r["optimizer_bytes"] % 4
               or r["optimizer_bytes"] >= 2 * r["param_bytes"] for r in plain)
    assert "exactly" in step_memory.verdicts(memory_rows)["saved"]


def test_step_memory_peak_parts_sum_to_the_timeline_peak(memory_rows):
    r = next(r for r in step_memory.steps(memory_rows) if "timeline" in r)
    tl = memory_timeline.Timeline.from_record(r["timeline"])
    _, top = tl.peak()
    assert sum(r["at_peak"].values()) == top == step_memory.peak(r)[0]
    parts = step_memory.breakdown(memory_rows)
    # made in the forward and live at the peak (early in backward): saved tensors, the loss's
    # already freed, and the 0-d loss itself; the token batch is resident, not made in forward
    assert 0.9 * r["saved_bytes"] < parts["activations"] <= r["saved_bytes"] - r["token_bytes"] + 64
    table = step_memory.breakdown_table(memory_rows)
    assert table.rows[-1][0] == "total"
    assert len(step_memory.checkpoint_table(memory_rows).rows) == 1 + len(
        step_memory.SIZES["smoke"].segments)
    assert set(step_memory.verdicts(memory_rows)) == {"saved", "napkin", "holds", "checkpoint"}


def test_step_memory_keeps_an_out_of_memory_length(monkeypatch):
    real = step_memory._measure

    def failing(model, optimizer, tokens, seq, *args, **kwargs):
        if seq == 32:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate "
                               "... out of memory")
        return real(model, optimizer, tokens, seq, *args, **kwargs)

    monkeypatch.setattr(step_memory, "_measure", failing)
    rows = step_memory.run(step_memory.SIZES["smoke"], device="cpu")
    status = {r["seq"]: r["status"] for r in rows if r["kind"] == "step" and r["segment"] is None}
    assert status == {32: "out of memory", 64: "ok"}
    assert "out of memory" in repr(step_memory.peak_table(rows))


def test_the_seed_2p7b_arithmetic_is_checked():
    rows = {r["seq"]: r for r in step_memory.seed_rows()}
    assert rows[512]["formula_gib"] == pytest.approx(20_352 / 1024)  # their own verification
    assert rows[256]["formula_gib"] > rows[256]["claimed_forward_gb"] + 0.8  # 7.94 vs 7.1
    assert rows[1024]["formula_gib"] < rows[1024]["claimed_forward_gb"] - 17  # 55.75 vs 73.7
    assert all(r["exact_gb"] != pytest.approx(r["formula_gb"], rel=0.02) for r in rows.values())
    # their measured peaks sit below 16 B/param + all activations: the two never peak together
    assert all(r["measured_training_gb"] < r["napkin_gb"] for r in rows.values()
               if r["measured_training_gb"])


def test_timeline_record_round_trip_keeps_the_peak():
    events = [(i * 10, 100 if i % 3 else -50, i, "x") for i in range(1, 400)]
    tl = memory_timeline._timeline("cpu", "hand-made", events, [])
    back = memory_timeline.Timeline.from_record(tl.to_record(max_points=20, top=3))
    assert len(back.times_ns) <= 40 and back.peak()[1] == tl.peak()[1]
    assert back.allocated_bytes[-1] == tl.allocated_bytes[-1] and len(back.allocations) == 3
