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
    assert variants["flat"]["all_reduce_calls"] == variants["bucketed"]["all_reduce_calls"] == 1
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
    assert set(text) == {"breakdown", "flat", "overlap", "buckets", "torch", "accumulation",
                         "zero"}
    assert text["zero"].startswith("every rank held exactly the predicted")
    assert "stages 1 and 2 sent 1.00x and 1.00x stage 0's bytes" in text["zero"]
    assert "sent 0.872 MiB per optimizer step and syncing each micro-batch 1.74 MiB" in \
        text["accumulation"]


def test_ddp_step_verdicts_are_withheld_when_noisy(step_rows):
    rows = copy.deepcopy(step_rows)
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
    acc = ddp_step.accumulation_table(step_rows)
    assert [r[:3] for r in acc.rows] == [["1", "last only", "1"], ["2", "last only", "1"],
                                         ["2", "every micro-batch", "2"]]
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
