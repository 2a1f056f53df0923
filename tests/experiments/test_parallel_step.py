"""The chapter 09 experiment's planner verdict (`parallel_step.planner_verdict`), on launch rows
built here (tests/experiment_cases.py): it follows the numbers, or is withheld."""

import pytest
from experiment_cases import measured, per_rank, planner_case, planner_timing

from mlsys import hardware
from mlsys.accounting import compute_bound, memory, parallel
from mlsys.experiments import parallel_step
from mlsys.models.config import TransformerConfig


def test_the_planner_verdict_follows_the_numbers():
    rows = planner_case(per_rank(), measured())
    text = parallel_step.planner_verdict(rows)
    runs = [r for r in rows if r["kind"] == "planner"]
    ratios = [r["predicted_s"] / r["step"]["median_s"] for r in runs]
    assert f"{min(ratios):.2f}x the measured one" in text and f"to {max(ratios):.2f}x" in text
    above = sum(r["step"]["median_s"] > r["serial_s"] for r in runs)
    assert f"{above} above both" in text and "of 10 pairs of runs" in text
    assert "us latency left out" in text
    noisy = planner_case(per_rank(), measured(spread=3.0))
    assert parallel_step.planner_verdict(noisy).startswith("no verdict: the machine was too noisy")
    no_link = planner_case(per_rank(link=False), measured())
    assert [r["kind"] for r in no_link if r["kind"] in ("calibration", "planner")] == [
        "calibration"]
    assert "gave no link to calibrate on" in parallel_step.planner_verdict(no_link)


def test_the_planner_table_fits_a_column_and_carries_every_term():
    rows = planner_case(per_rank(), measured())
    table = parallel_step.planner_table(rows)
    runs = [r for r in rows if r["kind"] == "planner"]
    assert len(table.header) == 5 and len(table.rows) == len(runs)
    for row, r in zip(table.rows, runs, strict=True):
        assert row[0] == r["run"]
        assert row[2].endswith(f"({r['predicted_s'] / r['step']['median_s']:.2f}x)")
        assert row[4].count(" + ") == 2


def test_the_order_of_the_runs_is_judged_against_chance():
    """Kendall's rank test: with 7 runs and 21 pairs, 11 in order is what a prediction that
    knows nothing gets half the time; all 21 happens once in 5,040 orderings."""
    measured = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert parallel_step.order_agreement(measured, measured) == (21, 21, 1 / 5040)
    assert parallel_step.order_agreement(measured[::-1], measured) == (0, 21, 1.0)
    eleven = [1.0, 2.0, 7.0, 6.0, 5.0, 4.0, 3.0]  # 11 of the 21 pairs in order, as the record
    assert parallel_step.order_agreement(eleven, measured) == (11, 21, 0.5)
    tie = parallel_step.order_agreement([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert tie[0] == 0 and tie[2] == 1.0  # a prediction that ties everything orders nothing
    big = list(range(12))
    assert parallel_step.order_agreement(big, big)[2] < 1e-4  # the normal approximation
    assert parallel_step.order_agreement(big[::-1], big)[2] > 0.999
    with pytest.raises(ValueError, match="same length >= 2"):
        parallel_step.order_agreement([1.0], [1.0])


def test_the_planner_verdict_says_chance_when_the_order_is_chance():
    rows = planner_case(per_rank(), measured())
    runs = [r for r in rows if r["kind"] == "planner"]
    steps = sorted(r["step"]["median_s"] for r in runs)
    for r, s in zip(sorted(runs, key=lambda r: r["step"]["median_s"]), steps[::-1], strict=True):
        r["predicted_s"] = s  # the prediction in the reverse of the measured order
    assert "0 of 10 pairs of runs in the measured order, no better than chance" in \
        parallel_step.planner_verdict(rows)
    for r, s in zip(sorted(runs, key=lambda r: r["step"]["median_s"]), steps, strict=True):
        r["predicted_s"] = 5 * s  # a systematic 5x miss, but every pair in order
    text = parallel_step.planner_verdict(rows)
    assert "10 of 10 pairs of runs in the measured order, better than chance" in text
    assert "5.00x the measured one" in text


def test_the_chapters_tables_of_the_accounting():
    xxl, tpu = parallel.XXL, hardware.TPU_V5P
    states = memory.model_state_bytes(xxl.n_params, "fp32_adamw")
    per_token = xxl.n_layers * 2 * (xxl.d_model + xxl.d_ff)
    fits = parallel_step.fsdp_fit_table(tpu.hbm_bytes, states, per_token, (0, 2_048, 20_000))
    assert str(fits.rows[0][1]) == str(parallel.min_shards_to_fit(tpu.hbm_bytes, states))
    assert fits.rows[-1][1:] == ["never", "-"]  # the unsharded half alone fills the device
    kw = {"flop_per_s": tpu.peak_flop_per_s("bf16"),
          "link_bytes_per_s": hardware.LINKS["ici-v5p-axis"].bytes_per_s}
    split = parallel_step.split_table(xxl.d_ff, [(16, 4, 1), (16, 4, 0.5)], **kw)
    assert split.rows[0][1] == "2, 1" and "fp8" in split.rows[1][0]
    assert split.rows[0][3] == parallel_step.num(compute_bound.compute_bound_batch(
        xxl.d_ff, x=16, y=4, m_x=2, **kw))
    cfg = TransformerConfig.preset("debug")
    cases = {"TP": ({"tp": 2}, 1), "TP + SP": ({"tp": 2}, 1, True)}
    table = parallel_step.strategy_table(cfg, cases, world_size=2, batch=2, seq=16)
    assert table.header[-1] == "sent per step (GB, bf16)"
    assert float(table.rows[1][2]) <= float(table.rows[0][2])  # SP shards the norms' inputs


def test_the_bytes_verdict_says_calls_and_sizes_and_follows_the_counts():
    """The check is on the calls and their sizes (both sides use the ring formula per call): a
    count that misses its prediction must say "not"."""
    rows = planner_case(per_rank(), measured())
    rows += [{"kind": "bubble", "schedule": s, "stages": 2, "microbatches": m,
              "measured": 0.5 / m, "predicted": 1 / (m + 1), "span": planner_timing(0.01)}
             for s in ("gpipe",) for m in (1, 4)]
    rows += [{"kind": "fsdp", "variant": "ours, no prefetch", "step": planner_timing(0.02)},
             {"kind": "tp", "variant": "dtensor", "step": planner_timing(0.02)}]
    for r in rows:
        if r["kind"] == "bubble":
            r.setdefault("stages", 2)
            r.setdefault("measured", 0.4 / r["microbatches"])
            r.setdefault("predicted", 1 / (r["microbatches"] + 1))
        if r["kind"] in ("fsdp", "tp"):
            r.update(sent_bytes=None if r["variant"] in ("fully_shard", "dtensor") else 100,
                     predicted_sent_bytes=100)
    assert parallel_step.verdicts(rows)["bytes"] == (
        "our FSDP and TP made exactly the calls, with the message sizes, that "
        "accounting.parallel predicts")
    next(r for r in rows if r["kind"] == "tp" and r["variant"] == "ours")["sent_bytes"] = 500
    assert "did not make the calls" in parallel_step.verdicts(rows)["bytes"]
