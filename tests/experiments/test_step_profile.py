"""The step_profile experiment (chapter 05, smoke sizes): the step split into phases and op classes,
the attention core's FLOPs, and verdicts that follow the numbers."""

import pytest

from mlsys.accounting import flops_by_class
from mlsys.experiments import step_profile


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
    assert step_profile.class_flops(profile_rows) == flops_by_class.class_flops(
        cfg, s.batch, s.seq, training=True)
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
    assert set(text) == {"matmul", "normalization", "attention", "overhead", "launch"}
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


def test_step_profile_keeps_a_trace_of_the_first_forward(profile_rows):
    trace = step_profile.trace(profile_rows)
    assert len(trace.host) == step_profile.TRACE_OPS and trace.device
    assert "forward of `debug`" in trace.source and 0 < trace.idle_fraction() < 1
    assert step_profile.trace([r for r in profile_rows if r["kind"] != "trace"]) is None


def _steady(seconds: float, slow: float = 1.0) -> dict:
    samples = [seconds] * 3 + [seconds * slow] * 3
    return {"median_s": sorted(samples)[3], "p20_s": seconds, "p80_s": seconds * slow,
            "samples_s": samples}


def test_a_25x_flop_gap_gives_the_attention_verdict_despite_noise(profile_rows):
    rows = [dict(r) for r in profile_rows]
    core = next(r for r in rows if r["kind"] == "core")
    core.update(scores=_steady(1e-3, 1.3), softmax=_steady(2e-3, 1.3), values=_steady(1e-3))
    text = step_profile.verdicts(rows)["attention"]  # noisy (1.3x), yet 25x apart in FLOP/s
    assert not text.startswith("no verdict") and "so FLOPs do not predict its time" in text
    assert "the timings are noisy, but at their worst the softmax would still run at" in text
    core.update(scores=_steady(1e-3, 3.0), softmax=_steady(1e-4, 3.0))  # near: noise decides
    assert step_profile.verdicts(rows)["attention"].startswith("no verdict")


def test_the_profiler_cost_sentence_follows_the_ratio(profile_rows):
    rows = [dict(r) for r in profile_rows]
    oh = next(r for r in rows if r["kind"] == "overhead")
    for ratio, words in ((0.85, "faster, which a profiler cannot make a step"),
                         (0.93, "within 10%: on this run the profiler's cost is lost"),
                         (1.05, "within 10%: on this run the profiler's cost is lost"),
                         (1.8, "the profiler costs time of its own")):
        oh.update(plain=_steady(1e-2), profiled=_steady(ratio * 1e-2))
        assert f"took {ratio:.2f}x the plain one" in step_profile.overhead_text(rows)
        assert words in step_profile.overhead_text(rows)


def test_launch_text_counts_the_ops_of_each_phase(profile_rows):
    n_f, n_b = (step_profile.phase_ops(profile_rows, p) for p in ("forward", "backward"))
    assert n_b > n_f > 0
    text = step_profile.launch_text(profile_rows)
    assert f"issued {n_b / n_f:.2f}x the forward's ops ({n_b:,} against {n_f:,} a step)" in text
    rows = [dict(r, op_s=r["wall_s"] * 0.1) if r["kind"] == "phase" else r for r in profile_rows]
    assert "spent 90% of its time outside ops: launch-bound" in step_profile.launch_text(rows)
    rows = [dict(r, op_s=r["wall_s"] * 0.9) if r["kind"] == "phase" else r for r in profile_rows]
    assert "not launch-bound, so time follows the work" in step_profile.launch_text(rows)


def test_phase_shares_split_the_classes_by_phase(profile_rows):
    forward = step_profile.phase_shares(profile_rows, ("forward",))
    both = step_profile.phase_shares(profile_rows, ("forward", "backward"))
    assert sum(forward.values()) == pytest.approx(1) == sum(both.values())
    assert forward["optimizer"] == 0 and forward != both
    assert forward["matmul"] == pytest.approx(step_profile.share(profile_rows, "matmul", "forward"))
    assert sum(step_profile.SEED_COMBINED_GEMMS) == pytest.approx(0.861)
