"""The timing_pitfalls experiment (chapter 05, smoke sizes): one sentence per pitfall."""

from mlsys.experiments import timing_pitfalls


def test_timing_pitfalls_give_one_sentence_each():
    rows = timing_pitfalls.run(timing_pitfalls.SIZES["smoke"], device="cpu")
    text = timing_pitfalls.sentences(rows)
    assert set(text) == {"warmup: eager forward", "sync", "clock", "spread", "cache"}
    warm = next(r for r in rows if r["kind"] == "warmup")
    assert len(warm["first_s"]) == timing_pitfalls.SIZES["smoke"].first_calls
    assert "they agree" in text["sync"] or "too small" in text["sync"] or "misses" in text["sync"]
    assert "no events to compare" in text["clock"]  # a CPU has none
