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


def _timed(seconds: float, spread: float = 1.0) -> dict:
    """Timing fields of six samples: steady, or half of them `spread` times slower."""
    samples = [seconds] * 3 + [seconds * spread] * 3
    return {"median_s": seconds * (1 + spread) / 2, "p20_s": seconds, "p80_s": seconds * spread,
            "samples_s": samples} if spread != 1.0 else {
        "median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": samples}


def _rows(eager_s, fused_s, *, ks=(1, 2, 4, 8), numel=10**6, problems=(), kept=False,
          cos=(1.0, 0.5), cos_spread=1.0):
    """Rows of a run on a device with a copy bandwidth of 1e10 B/s and a vector roof of 1e11
    FLOP/s (k* = 40): the fused and eager times at each k are `fused_s(k)` and `eager_s(k)`."""
    rows = [{"kind": "probe", "name": "copy", "unit": "bytes", "work": 1e8, **_timed(1e-2)},
            {"kind": "probe", "name": "vector roof", "unit": "flop", "work": 1e9, **_timed(1e-2)}]
    for k in ks:
        rows.append({"kind": "sweep", "name": f"eager k={k}", "impl": "eager", "k": k,
                     "numel": numel, "flops": 2 * k * numel, "bytes": 8 * k * numel,
                     **_timed(eager_s(k))})
        rows.append({"kind": "sweep", "name": f"fused k={k}", "impl": "torch.compile", "k": k,
                     "numel": numel, "flops": 2 * k * numel, "bytes": 8 * numel,
                     **_timed(fused_s(k))})
    rows += [{"kind": "cos", "name": "eager x.cos().cos() (2 ops)", "impl": "eager",
              "numel": numel, **_timed(cos[0], cos_spread)},
             {"kind": "cos", "name": "torch.compile (1 fused kernel)", "impl": "fused",
              "numel": numel, **_timed(cos[1])}]
    rows.append({"kind": "consistency", "problems": list(problems), "attempts": 3,
                 "fused_impl": "torch.compile", "device": "cpu", "kept_memory": kept})
    return rows


BYTES_S = 8 * 10**6 / 1e10  # one round trip of 10**6 fp32 elements at the copy bandwidth


def test_a_systematic_5x_miss_is_named_not_called_noise():
    rows = _rows(lambda k: 5 * k * BYTES_S, lambda k: 5 * BYTES_S)
    text = elementwise_fusion.sweep_verdict(rows)
    assert not text.startswith("no verdict") and "a systematic miss" in text
    assert "the eager chain 5.0x at k = 1 and the fused kernel 5.0x at k = 1" in text
    assert "freed memory was not kept mapped" in text  # the cause these rows name
    assert elementwise_fusion.model_sentence(rows).startswith("The model does not describe")
    kept = _rows(lambda k: 5 * k * BYTES_S, lambda k: 5 * BYTES_S, kept=True)
    assert "which these rows do not name" in elementwise_fusion.sweep_verdict(kept)
    near = _rows(lambda k: 1.2 * k * BYTES_S, lambda k: 1.2 * BYTES_S)  # within MISS: no miss
    assert "systematic" not in elementwise_fusion.sweep_verdict(near)
    assert elementwise_fusion.model_sentence(near).startswith("The model says why")


def test_a_growth_of_1p8x_for_8x_the_round_trips_is_not_called_proportional():
    rows = _rows(lambda k: (1 + 0.8 * (k - 1) / 7) * BYTES_S, lambda k: BYTES_S)
    text = elementwise_fusion.sweep_verdict(rows)
    assert "grew 1.8x from k = 1 to k = 8, less than its round trips predict (8x)" in text
    proportional = _rows(lambda k: k * BYTES_S, lambda k: BYTES_S)
    assert "grew 8.0x from k = 1 to k = 8, as its round trips predict" in \
        elementwise_fusion.sweep_verdict(proportional)


def test_a_tie_at_the_largest_k_is_called_a_tie():
    rows = _rows(lambda k: BYTES_S, lambda k: BYTES_S)  # eager no slower than fused at k = 8
    assert "at k = 8 the fused kernel and the eager chain take the same time" in \
        elementwise_fusion.sweep_verdict(rows)


def test_noise_withholds_the_sweep_and_the_model_sentence_says_so():
    rows = _rows(lambda k: k * BYTES_S, lambda k: BYTES_S)
    noisy = [dict(r, samples_s=[r["median_s"]] * 3 + [3 * r["median_s"]] * 3, p80_s=3 *
                  r["median_s"]) if r.get("name") == "eager k=4" else r for r in rows]
    assert elementwise_fusion.sweep_verdict(noisy).startswith("no verdict")
    assert elementwise_fusion.model_sentence(noisy).startswith("What the model predicts, which")


def test_a_sweep_faster_than_the_vector_probe_blames_the_probe():
    fast = _rows(lambda k: k * BYTES_S, lambda k: max(BYTES_S, 2 * k * 10**6 / 1e11 / 2),
                 ks=(1, 8, 64, 128))  # at k = 128, twice the probe's FLOP/s
    text = elementwise_fusion.sweep_verdict(fast)
    assert not text.startswith("no verdict")
    assert "but the sweep beat the in-cache vector-roof probe (fused k=64 ran 1.60x" in text
    assert "fused k=128 ran 2.00x" in text


def test_the_cos_verdict_is_judged_on_its_own_rows():
    sweep_noise = ["eager k=4: p80 / p20 = 3.00 (more than 1.5)"]
    rows = _rows(lambda k: k * BYTES_S, lambda k: BYTES_S, problems=sweep_noise, cos=(1.0, 0.58))
    text = elementwise_fusion.cos_verdict(rows)  # 1.72x: clean rows, given despite the sweep's
    assert "is 1.72x faster than the eager pair: close to the byte ratio of 2" in text
    tie = _rows(lambda k: k * BYTES_S, lambda k: BYTES_S, cos=(1.0, 1.02))
    assert "take the same time" in elementwise_fusion.cos_verdict(tie)
    noisy = _rows(lambda k: k * BYTES_S, lambda k: BYTES_S, cos_spread=3.0)
    assert elementwise_fusion.cos_verdict(noisy).startswith("no verdict")


def test_the_recorded_sentence_depends_on_a_record(monkeypatch):
    import mlsys.experiments as experiments

    monkeypatch.setattr(experiments, "recorded", lambda name: [])
    assert elementwise_fusion.recorded_cos_text().startswith("No GPU run of it is recorded yet")
    record = {"provenance": {"device": "NVIDIA H200"},
              "results": _rows(lambda k: k * BYTES_S, lambda k: BYTES_S, cos=(1.0, 0.55))}
    monkeypatch.setattr(experiments, "recorded", lambda name: [record])
    assert elementwise_fusion.recorded_cos_text().startswith(
        "Recorded on NVIDIA H200: torch.compile (1 fused kernel) is 1.82x faster")
