"""The compile_step experiment (chapter 05): verdicts refused on overlapping spreads, and the smoke
run eager only."""

from mlsys.experiments import compile_step


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
