"""The allreduce_bench experiment (chapter 08, smoke sizes, 2 gloo ranks): both bandwidths and an
alpha-beta fit, verdicts that follow the numbers, the seed's table, and the hand-written ring."""

import pytest
from experiment_cases import allreduce_rows, steady

from mlsys import third_party
from mlsys.accounting import comms as comms_cost
from mlsys.experiments import allreduce_bench


@pytest.fixture(scope="module")
def bench_rows():
    """The smoke rows, run once per session (test_ddp_step.py reads them too)."""
    return allreduce_rows()


def test_allreduce_rows_carry_both_bandwidths_and_a_fit(bench_rows):
    s = allreduce_bench.SIZES["smoke"]
    points = [r for r in bench_rows if r["kind"] == "point"]
    assert [(r["world_size"], r["message_bytes"]) for r in points] == [
        (w, m) for w in s.world_sizes for m in s.message_bytes]
    for r in points:
        assert len(r["samples_s"]) == s.repeats and r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["algbw_bytes_per_s"] == pytest.approx(r["message_bytes"] / r["median_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(
            r["algbw_bytes_per_s"] * comms_cost.bus_factor("all_reduce", r["world_size"]))
    fit = allreduce_bench.fits(bench_rows)[2]
    assert fit.alpha_s >= 0 and fit.bytes_per_s > 0
    assert allreduce_bench.setup(bench_rows)["link"] is None  # loopback on a CPU: no spec
    assert len(allreduce_bench.table(bench_rows).rows) == len(points)
    assert set(allreduce_bench.verdicts(bench_rows)) == {"fit", "bandwidths"}


def test_allreduce_verdicts_follow_the_numbers():
    alpha, beta = 10e-6, 20e9
    rows = []
    for w in (2, 4):
        for m in (2**20, 2**26):
            t = comms_cost.collective_time_s("all_reduce", m, w, alpha_s=alpha, bytes_per_s=beta)
            rows.append({"kind": "point", "world_size": w, "message_bytes": m, **steady(t),
                         "algbw_bytes_per_s": comms_cost.algorithm_bandwidth(m, t),
                         "busbw_bytes_per_s": comms_cost.bus_bandwidth("all_reduce", m, t, w),
                         "problems": []})
        fit = comms_cost.fit_alpha_beta([2**20, 2**26], [r["median_s"] for r in rows[-2:]],
                                        n_ranks=w)
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


def _points(times, world_sizes=(2, 6), size=2**26):
    """Point rows at one size: `times` per world size as (p20, median, p80) seconds."""
    return [{"kind": "point", "world_size": w, "message_bytes": size, "p20_s": lo, "median_s": m,
             "p80_s": hi, "samples_s": [lo, m, hi],
             "algbw_bytes_per_s": comms_cost.algorithm_bandwidth(size, m),
             "busbw_bytes_per_s": comms_cost.bus_bandwidth("all_reduce", size, m, w),
             "problems": [f"{size} B: p80 / p20 = {hi / lo:.2f} (more than 1.5)"]}
            for w, (lo, m, hi) in zip(world_sizes, times, strict=True)]


def test_a_bus_bandwidth_that_falls_beyond_its_bands_is_said_and_its_cause_named():
    """Rows that contradict "too noisy": 6 gloo ranks on 2 cores whose bus bandwidth falls 1.75x,
    both p20-p80 bands apart (the cpu build's 0.75 and 0.43 GB/s); then bands that overlap."""
    setup = {"kind": "setup", "device": "cpu", "backend": "gloo", "link": None,
             "link_bytes_per_s": None, "cores": 2}
    # busbw = M / t x 2(n-1)/n: 2 ranks at 89 ms (67-104), 6 ranks at 260 ms (223-276)
    failed = [{"kind": "fit", "world_size": w, "error": "too noisy to fit"} for w in (2, 6)]
    rows = _points([(0.067, 0.089, 0.104), (0.223, 0.260, 0.276)]) + failed + [setup]
    text = allreduce_bench.verdicts(rows)
    assert text["bandwidths"].startswith("from 2 to 6 ranks at 64 MiB")
    assert "fell beyond both points' p20-p80 bands, so not noise" in text["bandwidths"]
    assert "6 gloo ranks shared 2 cores" in text["bandwidths"]
    assert text["fit"].startswith("no verdict") and "6 gloo ranks shared 2 cores" in text["fit"]
    overlapping = _points([(0.067, 0.089, 0.2), (0.1, 0.260, 0.276)]) + failed + [setup]
    assert allreduce_bench.verdicts(overlapping)["bandwidths"].startswith("no verdict")
    roomy = [*rows[:-1], {**setup, "cores": 8}]
    assert allreduce_bench.crowded(roomy) == "" and allreduce_bench.crowded(rows) != ""
    assert allreduce_bench.crowded([*rows[:-1], {**setup, "backend": "nccl"}]) == ""


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


def test_the_hand_written_ring_equals_all_reduce_and_sends_the_accounted_bytes():
    from mlsys.distributed import launch

    numel, n = 999, 3
    for out in launch.run(allreduce_bench.ring_check, n, args=(numel,), timeout_s=60):
        assert out["max_abs_diff"] < 1e-5
        assert out["ring_calls"] == {"isend": 2 * (n - 1), "recv": 2 * (n - 1)}
        assert out["ring_sent_bytes"] == out["all_reduce_sent_bytes"] == \
            comms_cost.collective_cost("all_reduce", 4 * numel, n).sent_bytes


def test_the_collectives_table_and_the_checked_ring_table():
    table = allreduce_bench.collectives_table(ranks=(2, 8))
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["all-reduce"] == ["1", "1.75", "1.75", "14"]
    assert rows["reduce-scatter"] == rows["all-gather"] == ["0.5", "0.875", "0.875", "7"]
    numel, n = 999, 3
    sent = comms_cost.collective_cost("all_reduce", 4 * numel, n).sent_bytes
    good = {"max_abs_diff": 1e-7, "ring_sent_bytes": sent, "all_reduce_sent_bytes": sent,
            "ring_calls": {"isend": 4, "recv": 4}}
    assert len(allreduce_bench.ring_table([good] * n, numel).rows) == n
    for bad in ({"max_abs_diff": 1e-3}, {"ring_sent_bytes": sent + 4},
                {"ring_calls": {"isend": 2, "recv": 2}}):
        with pytest.raises(AssertionError):
            allreduce_bench.ring_table([good, {**good, **bad}, good], numel)
