"""The chapter 08 experiments (smoke sizes, 2 gloo ranks): allreduce_bench and ddp_step; their rows
against the accounting, their verdicts, and the seed's tables read through them."""

import copy

import pytest

from mlsys import third_party
from mlsys.accounting import comms as C
from mlsys.accounting import zero as Z
from mlsys.experiments import allreduce_bench, ddp_step


@pytest.fixture(scope="module")
def bench_rows():
    return allreduce_bench.run(allreduce_bench.SIZES["smoke"], device="cpu")


@pytest.fixture(scope="module")
def step_rows():
    return ddp_step.run(ddp_step.SIZES["smoke"], device="cpu")


def test_allreduce_rows_carry_both_bandwidths_and_a_fit(bench_rows):
    s = allreduce_bench.SIZES["smoke"]
    points = [r for r in bench_rows if r["kind"] == "point"]
    assert [(r["world_size"], r["message_bytes"]) for r in points] == [
        (w, m) for w in s.world_sizes for m in s.message_bytes]
    for r in points:
        assert len(r["samples_s"]) == s.repeats and r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["algbw_bytes_per_s"] == pytest.approx(r["message_bytes"] / r["median_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(
            r["algbw_bytes_per_s"] * C.bus_factor("all_reduce", r["world_size"]))
    fit = allreduce_bench.fits(bench_rows)[2]
    assert fit.alpha_s >= 0 and fit.bytes_per_s > 0
    assert allreduce_bench.setup(bench_rows)["link"] is None  # loopback on a CPU: no spec
    assert len(allreduce_bench.table(bench_rows).rows) == len(points)
    assert set(allreduce_bench.verdicts(bench_rows)) == {"fit", "bandwidths"}


def _steady(seconds, n=5):
    return {"median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * n}


def test_allreduce_verdicts_follow_the_numbers():
    alpha, beta = 10e-6, 20e9
    rows = []
    for w in (2, 4):
        for m in (2**20, 2**26):
            t = C.collective_time_s("all_reduce", m, w, alpha_s=alpha, bytes_per_s=beta)
            rows.append({"kind": "point", "world_size": w, "message_bytes": m, **_steady(t),
                         "algbw_bytes_per_s": C.algorithm_bandwidth(m, t),
                         "busbw_bytes_per_s": C.bus_bandwidth("all_reduce", m, t, w),
                         "problems": []})
        fit = C.fit_alpha_beta([2**20, 2**26], [r["median_s"] for r in rows[-2:]], n_ranks=w)
        rows.append({"kind": "fit", "world_size": w, "alpha_s": fit.alpha_s,
                     "bytes_per_s": fit.bytes_per_s, "per_call_s": fit.per_call_s,
                     "relative_errors": list(fit.relative_errors)})
    rows.append({"kind": "setup", "device": "test", "backend": "nccl", "link": "NVLink",
                 "link_bytes_per_s": 40e9})
    text = allreduce_bench.verdicts(rows)
    assert "2 ranks: alpha = 10 µs per step, beta = 20 GB/s" in text["fit"]
    assert "of the link's spec" in text["fit"]
    assert "algorithm bandwidth changed" in text["bandwidths"]
    assert "(a ring on equal links: 0.67x and 1x)" in text["bandwidths"]
    rows[0]["problems"] = ["1048576 B: p80 / p20 = 3.00 (more than 1.5)"]
    assert allreduce_bench.verdicts(rows)["fit"].startswith("no verdict")
    alone = [{"kind": "skipped", "world_size": 2, "why": "2 ranks need 2 GPUs; this machine "
              "has 1"}, {**rows[0], "world_size": 1, "problems": []}, rows[-1]]
    assert allreduce_bench.verdicts(alone)["fit"].startswith("one rank only")
    assert "2 ranks need 2 GPUs" in repr(allreduce_bench.table(alone))


def test_the_seeds_all_reduce_table_fits_and_its_units_are_named():
    fit = allreduce_bench.third_party_fit()
    assert fit.alpha_s * 1e6 == pytest.approx(20.6, abs=0.1)
    assert fit.bytes_per_s / 1e9 == pytest.approx(153.5, abs=0.5)
    rows = allreduce_bench.third_party_rows()
    assert len(rows) == len(third_party.CS336_STUDENT_ALLREDUCE) == 6
    text = allreduce_bench.third_party_verdict()
    assert "148.26 'GB/s' at 2 ranks is 159 GB/s" in text
    assert "a bus bandwidth of 163 GB/s for an algorithm bandwidth of 109 GB/s" in text
    assert "51% of the A100 80GB SXM's 300 GB/s per direction" in text
    table = allreduce_bench.third_party_table(rows)
    assert len(table.rows) == 6 and sum(row[1].endswith("*") for row in table.rows) == sum(
        not r["size_stated"] for r in rows)


def test_ddp_step_counts_and_holds_what_the_accounting_says(step_rows):
    st = ddp_step.setup(step_rows)
    n, grads = st["world_size"], sum(st["tensor_bytes"])
    assert grads == 4 * st["n_params"] and len(st["tensor_bytes"]) == 21  # the debug preset
    every = C.collective_cost("all_reduce", grads, n).sent_bytes
    variants = {r["variant"]: r for r in step_rows if r["kind"] == "variant"}
    assert set(variants) == set(ddp_step.VARIANTS)
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
        groups = C.buckets(st["tensor_bytes"], r["bucket_size_mb"] * 2**20)
        assert len(r["bucket_bytes"]) == len(groups) == r["all_reduce_calls"]
    for r in (r for r in step_rows if r["kind"] == "accumulation"):
        assert r["sent_bytes"] == pytest.approx(C.accumulation_sent_bytes(
            grads, n, r["micro_batches"], sync_each_micro_batch=r["sync_each"]))
    for r in (r for r in step_rows if r["kind"] == "zero"):
        for kind in ("weights", "grads", "optimizer"):
            assert r["held"][kind] == r["predicted"][kind]
        assert r["sent_bytes"] == pytest.approx(r["predicted_sent_bytes"])
        assert r["predicted_sent_bytes"] == pytest.approx(sum(Z.zero_sent_bytes(
            st["n_params"], n, 0).values()))  # stages 1 and 2: data parallelism's bytes
    torch_row = next(r for r in step_rows if r["kind"] == "torch")
    assert torch_row["max_param_diff"] < 1e-5


def test_ddp_step_tables_and_verdicts(step_rows):
    assert [r[0] for r in ddp_step.table(step_rows).rows] == list(ddp_step.VARIANTS)
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
            r[phase] = _steady(r[phase]["median_s"])
    assert not ddp_step.verdicts(quiet)["flat"].startswith("no verdict")
    assert "flat DDP launched 1 all-reduce instead of 21" in ddp_step.verdicts(quiet)["flat"]


def test_the_seeds_xl_run_predicted_from_its_own_all_reduce_table():
    rows = ddp_step.third_party_rows()
    assert rows[0]["n_tensors"] == 435 and rows[0]["grad_bytes"] == 4 * 1_998_235_200
    naive = next(r for r in rows if r["mode_flag"] == "naive")
    assert naive["predicted_naive_s"] == pytest.approx(naive["communication_s"], rel=0.05)
    assert naive["predicted_flat_s"] == pytest.approx(0.0521, abs=0.001)
    naive_run, flat_run = (r for r in rows if r["mode_flag"] == "naive")
    assert flat_run["communication_s"] / naive_run["communication_s"] == pytest.approx(1.0,
                                                                                      abs=0.001)
    assert third_party.CS336_STUDENT_DDP_CLAIMED_MB == pytest.approx(4 * 1_998_235_200 / 2**20,
                                                                     abs=0.01)
    table = ddp_step.third_party_table(rows)
    assert [row[1] for row in table.rows] == [r["mode_flag"] or "not shown" for r in rows]


def test_the_hand_written_ring_equals_all_reduce_and_sends_the_accounted_bytes():
    from mlsys.distributed import launch

    numel, n = 999, 3
    for out in launch.run(allreduce_bench.ring_check, n, args=(numel,), timeout_s=60):
        assert out["max_abs_diff"] < 1e-5
        assert out["ring_calls"] == {"isend": 2 * (n - 1), "recv": 2 * (n - 1)}
        assert out["ring_sent_bytes"] == out["all_reduce_sent_bytes"] == \
            C.collective_cost("all_reduce", 4 * numel, n).sent_bytes


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
    t["ours"], t["torch"] = _steady(1.04), _steady(1.0)
    assert ddp_step.torch_target(quiet).startswith("1.04x, within the target of 1.05x")
    t["ours"] = _steady(1.2)
    assert "above the target" in ddp_step.torch_target(quiet)
    t["torch"] = {**t["torch"], "samples_s": [1.0, 1.0, 3.0, 5.0, 5.0], "p20_s": 1.0,
                  "p80_s": 5.0}
    assert ddp_step.torch_target(quiet).startswith("no verdict")


def test_the_seeds_overlapped_runs_leave_more_than_the_tail_the_model_predicts():
    rows = ddp_step.third_party_rows()
    first = rows[0]
    assert first["mode_flag"] is None
    assert first["predicted_bucketed_s"] < first["communication_s"] < first["predicted_flat_s"]
    tail = C.collective_time_s("all_reduce", 10_000 * 1_600 * 4, 2,
                               alpha_s=allreduce_bench.third_party_fit().alpha_s,
                               bytes_per_s=allreduce_bench.third_party_fit().bytes_per_s)
    assert first["predicted_bucketed_s"] == pytest.approx(tail)  # the embedding, ready last
