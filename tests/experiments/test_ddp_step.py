"""The ddp_step experiment (chapter 08, smoke sizes, 2 gloo ranks): its rows against the accounting,
its tables and verdicts (withheld when noisy), and the chapter's plots and target."""

import copy

import pytest
from experiment_cases import allreduce_rows, steady

from mlsys.accounting import buckets
from mlsys.accounting import comms as comms_cost
from mlsys.accounting import zero as zero_cost
from mlsys.experiments import allreduce_bench, ddp_step, ddp_step_run


@pytest.fixture(scope="module")
def bench_rows():
    """allreduce_bench's smoke rows, run once per session (test_allreduce_bench.py's)."""
    return allreduce_rows()


@pytest.fixture(scope="module")
def step_rows():
    return ddp_step.run(ddp_step.SIZES["smoke"], device="cpu")


def test_ddp_step_counts_and_holds_what_the_accounting_says(step_rows):
    st = ddp_step.setup(step_rows)
    n, grads = st["world_size"], sum(st["tensor_bytes"])
    assert grads == 4 * st["n_params"] and len(st["tensor_bytes"]) == 21  # the debug preset
    every = comms_cost.collective_cost("all_reduce", grads, n).sent_bytes
    variants = {r["variant"]: r for r in step_rows if r["kind"] == "variant"}
    assert set(variants) == set(ddp_step_run.VARIANTS)
    assert variants["naive"]["all_reduce_calls"] == variants["overlapped"]["all_reduce_calls"] \
        == 21
    n_buckets = len(buckets.buckets(st["tensor_bytes"], st["bucket_mb"] * 2**20))
    assert variants["flat"]["all_reduce_calls"] == 1 and n_buckets == 4  # the smoke cap: several
    assert variants["bucketed"]["all_reduce_calls"] == n_buckets
    for r in variants.values():
        assert r["sent_bytes"] == pytest.approx(every)
        for phase in (*ddp_step.PHASES, "step"):
            assert r[phase]["p20_s"] <= r[phase]["median_s"] <= r[phase]["p80_s"]
        assert ddp_step.predicted_communication_s(step_rows, r["variant"]) > 0
    naive_pred = ddp_step.predicted_communication_s(step_rows, "naive")
    flat_pred = ddp_step.predicted_communication_s(step_rows, "flat")
    assert naive_pred > flat_pred  # 21 latencies instead of 1, the same bytes
    for r in (r for r in step_rows if r["kind"] == "bucket"):
        groups = buckets.buckets(st["tensor_bytes"], r["bucket_size_mb"] * 2**20)
        assert len(r["bucket_bytes"]) == len(groups) == r["all_reduce_calls"]
    for r in (r for r in step_rows if r["kind"] == "accumulation"):
        assert r["sent_bytes"] == pytest.approx(comms_cost.accumulation_sent_bytes(
            grads, n, r["micro_batches"], sync_each_micro_batch=r["sync_each"]))
    for r in (r for r in step_rows if r["kind"] == "zero"):
        for kind in ("weights", "grads", "optimizer"):
            assert r["held"][kind] == r["predicted"][kind]
        assert r["sent_bytes"] == pytest.approx(r["predicted_sent_bytes"])
        assert r["predicted_sent_bytes"] == pytest.approx(sum(zero_cost.zero_sent_bytes(
            st["n_params"], n, 0).values()))  # stages 1 and 2: data parallelism's bytes
    torch_row = next(r for r in step_rows if r["kind"] == "torch")
    assert torch_row["max_param_diff"] < 1e-5


def test_ddp_step_tables_and_verdicts(step_rows):
    assert [r[0] for r in ddp_step.table(step_rows).rows] == list(ddp_step_run.VARIANTS)
    assert len(ddp_step.bucket_table(step_rows).rows) == len(ddp_step.SIZES["smoke"]
                                                             .bucket_sizes_mb)
    assert len(ddp_step.zero_table(step_rows).rows) == 3 * ddp_step.setup(step_rows)["world_size"]
    text = ddp_step.verdicts(step_rows)
    assert set(text) == {"breakdown", "miss", "flat", "overlap", "buckets", "torch",
                         "accumulation", "zero"}
    assert text["miss"].startswith("communication took naive ")  # never withheld: it reads bands
    assert "(bucketed: 4 buckets of at most 0.25 MiB)" in ddp_step.verdicts(
        quiet_steps(step_rows))["overlap"]  # the smoke cap makes several buckets
    assert text["zero"].startswith("every rank held exactly the predicted")
    assert "stages 1 and 2 sent 1.00x and 1.00x stage 0's bytes" in text["zero"]
    assert "sent 0.872 MiB per optimizer step and syncing each micro-batch 1.74 MiB" in \
        text["accumulation"]


def quiet_steps(rows, communication=None):
    """`rows` with every phase steady; each variant's communication set to
    `communication(variant, predicted)` (a timing row) when given."""
    rows = copy.deepcopy(rows)
    for r in (r for r in rows if r["kind"] == "variant"):
        for phase in (*ddp_step.PHASES, "step"):
            r[phase] = steady(r[phase]["median_s"])
        if communication is not None:
            r["communication"] = communication(r["variant"], ddp_step.predicted_communication_s(
                rows, r["variant"]))
    return rows


def band(median, low, high):
    return {"median_s": median, "p20_s": low, "p80_s": high, "samples_s": [low, median, high]}


def test_a_miss_every_variant_shares_is_named_systematic_and_never_called_noise():
    """Rows that would contradict a noise verdict: every variant's communication 5x its
    prediction, each beyond its own p20-p80 band; then 1.8x beyond the band in one variant only;
    a tie; misses both ways."""
    pred = {"naive": 0.1, "flat": 0.05, "overlapped": 0.01, "bucketed": 0.02}
    five = {n: band(5 * t, 4 * t, 6 * t) for n, t in pred.items()}
    text, systematic = ddp_step.communication_miss(five, pred, "likely cause: two ranks, 2 cores")
    assert systematic and "slower in every variant" in text and "not noise" in text
    assert text.endswith("likely cause: two ranks, 2 cores") and "naive 5.00x" in text
    faster = {n: band(t / 5, t / 6, t / 4) for n, t in pred.items()}
    assert "faster in every variant" in ddp_step.communication_miss(faster, pred)[0]
    one = {**{n: band(t, 0.9 * t, 1.1 * t) for n, t in pred.items()},
           "flat": band(0.09, 0.085, 0.095)}  # 1.8x, beyond its band, in flat only
    text, systematic = ddp_step.communication_miss(one, pred)
    assert not systematic and "slower beyond the noise: flat" in text and "not one bias" in text
    wide = {**five, "naive": band(0.5, 0.05, 0.9)}  # 5x, but the prediction is inside its band
    assert not ddp_step.communication_miss(wide, pred)[1]
    tie = {n: band(t, 0.8 * t, 1.2 * t) for n, t in pred.items()}
    text, systematic = ddp_step.communication_miss(tie, pred)
    assert not systematic and "no variant misses it" in text
    both = {**five, "flat": band(0.005, 0.004, 0.006)}
    text, systematic = ddp_step.communication_miss(both, pred)
    assert not systematic and "slower beyond the noise" in text and "faster beyond" in text
    with pytest.raises(ValueError, match=r"predicted\['naive'\] must be > 0"):
        ddp_step.communication_miss(five, {**pred, "naive": 0.0})


def test_a_systematic_miss_is_shown_even_on_a_noisy_machine(step_rows):
    slow = quiet_steps(step_rows, lambda n, p: band(5 * p, 4 * p, 6 * p))
    naive = next(r for r in slow if r.get("variant") == "naive")
    naive["step"] = band(naive["step"]["median_s"], 0.5 * naive["step"]["median_s"],
                         2 * naive["step"]["median_s"])  # noisy: p80 / p20 = 4
    text = ddp_step.verdicts(slow)
    assert "a systematic miss of the model, not noise" in text["miss"]
    assert "gloo ranks share" in text["miss"]  # the cause names this machine's crowding
    assert "took 5.00x the" in text["breakdown"] and "model" in text["overlap"]
    assert text["flat"].startswith("no verdict") and text["buckets"].startswith("no verdict")
    one = copy.deepcopy(slow)
    ddp_step.setup(one)["bucket_mb"] = 1e3  # a cap that holds every gradient: one bucket
    assert "one bucket overlaps nothing" in ddp_step.verdicts(one)["overlap"]


def test_ddp_step_verdicts_are_withheld_when_noisy(step_rows):
    rows = quiet_steps(step_rows, lambda n, p: band(p, 0.9 * p, 1.1 * p))  # on the model: no miss
    naive = next(r for r in rows if r.get("variant") == "naive")
    naive["step"] = {**naive["step"], "samples_s": [1e-3, 1e-3, 5e-3, 9e-3, 9e-3],
                     "p20_s": 1e-3, "p80_s": 9e-3}
    text = ddp_step.verdicts(rows)
    assert all(text[k].startswith("no verdict") for k in ("breakdown", "flat", "overlap",
                                                          "buckets"))
    quiet = copy.deepcopy(step_rows)
    for r in (r for r in quiet if r["kind"] == "variant"):
        for phase in (*ddp_step.PHASES, "step"):
            r[phase] = steady(r[phase]["median_s"])
    assert not ddp_step.verdicts(quiet)["flat"].startswith("no verdict")
    assert "flat DDP launched 1 all-reduce instead of 21" in ddp_step.verdicts(quiet)["flat"]


def test_the_chapter_reads_the_rows_through_tables_plots_and_the_target(bench_rows, step_rows):
    import matplotlib

    matplotlib.use("Agg")
    from mlsys import plotting

    _, axes = plotting.subplots(1, 3)
    allreduce_bench.plot(bench_rows, axes[:2])
    ddp_step.plot(step_rows, axes[2])
    assert axes[0].lines and axes[2].patches
    acc = ddp_step.accumulation_table(step_rows)  # 4 buckets: 4 all-reduces per sync
    assert [r[:3] for r in acc.rows] == [["1", "last only", "4"], ["2", "last only", "4"],
                                         ["2", "every micro-batch", "8"]]
    quiet = copy.deepcopy(step_rows)
    t = next(r for r in quiet if r["kind"] == "torch")
    t["ours"], t["torch"] = steady(1.04), steady(1.0)
    assert ddp_step.torch_target(quiet).startswith("1.04x, within the target of 1.05x")
    t["ours"] = steady(1.2)
    assert "above the target" in ddp_step.torch_target(quiet)
    t["torch"] = {**t["torch"], "samples_s": [1.0, 1.0, 3.0, 5.0, 5.0], "p20_s": 1.0,
                  "p80_s": 5.0}
    assert ddp_step.torch_target(quiet).startswith("no verdict")


def test_the_pages_sentences_and_record_views(monkeypatch):
    table = ddp_step.sentences({"fit": "one rank only", "bandwidths": "one rank only",
                                "zero": "each rank holds a shard"})
    assert table.rows == [["fit", "one rank only"], ["zero", "each rank holds a shard"]]
    views = ddp_step.record_views()
    assert set(views["tables"]) == set(views["shows"]) == {"allreduce_bench", "ddp_step"}
    monkeypatch.setattr(ddp_step, "verdicts", lambda rows: {"fit": f"{len(rows)} rows"})
    said = views["shows"]["ddp_step"]({"results": [{}, {}]})  # the record's verdicts, as a table
    assert said.rows == [["fit", "2 rows"]]
