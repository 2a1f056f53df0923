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


def test_step_profile_keeps_a_trace_of_the_first_forward(profile_rows):
    trace = step_profile.trace(profile_rows)
    assert len(trace.host) == step_profile.TRACE_OPS and trace.device
    assert "forward of `debug`" in trace.source and 0 < trace.idle_fraction() < 1
    assert step_profile.trace([r for r in profile_rows if r["kind"] != "trace"]) is None
