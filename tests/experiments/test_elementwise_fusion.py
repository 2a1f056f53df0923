"""The elementwise_fusion experiment (chapter 04): its smoke record's sweep and verdicts, and the
cos verdict on rows built here."""

import experiment_cases
import pytest

from mlsys.experiments import elementwise_fusion


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


def test_fusion_rows_and_verdicts(records):
    rows = records["elementwise_fusion"]["results"]
    s = elementwise_fusion.SIZES["smoke"]
    eager = elementwise_fusion.sweep(rows, "eager")
    assert [r["k"] for r in eager] == list(s.ks)
    for r in eager:  # k round trips of the tensor, 2k FLOPs per element
        assert r["bytes"] == r["k"] * 2 * 4 * s.numel and r["flops"] == 2 * r["k"] * s.numel
    if not s.fuse:  # the smoke profile times no fused version, and says so
        assert elementwise_fusion.ceilings(rows) is None
        text = elementwise_fusion.sweep_verdict(rows)
        assert text.startswith("no verdict") or "no fused version was timed" in text
        assert text.startswith("no verdict") or "the eager chain's time grew" in text
    assert "eager pair" in elementwise_fusion.cos_verdict(rows)


def test_cos_verdict_explains_a_fused_kernel_slower_than_eager():
    def row(name, impl, seconds):
        return {"kind": "cos", "name": name, "impl": impl, "numel": 1000, "median_s": seconds,
                "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * 4}

    base = [{"kind": "probe", "name": "copy", "unit": "bytes", "work": 1e6, "median_s": 1e-4,
             "p20_s": 1e-4, "p80_s": 1e-4, "samples_s": [1e-4] * 4},
            {"kind": "consistency", "problems": [], "attempts": 1, "fused_impl": "torch.compile"}]
    slower = base + [row("eager x.cos().cos() (2 ops)", "eager", 1.0),
                     row("compiled", "fused", 1.0 / 0.88)]
    assert "compiled is 1.14x slower than the eager pair: the fused kernel is slower" in \
        elementwise_fusion.cos_verdict(slower)
    twice = base + [row("eager x.cos().cos() (2 ops)", "eager", 1.0), row("compiled", "fused", 0.5)]
    assert "close to the byte ratio of 2" in elementwise_fusion.cos_verdict(twice)
