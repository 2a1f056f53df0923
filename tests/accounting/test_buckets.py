"""mlsys.accounting.buckets: gradient buckets, the overlap model of their all-reduces behind the
backward (against `accounting.comms`' time model), its two bounds, and a sweep of caps."""

import pytest

from mlsys import plotting
from mlsys.accounting import buckets
from mlsys.accounting import comms as comms_cost


def test_buckets_and_the_overlap_model():
    sizes = [4, 4, 4, 10, 1, 1]
    assert buckets.buckets(sizes, 8) == [[0, 1], [2], [3], [4, 5]]
    assert buckets.buckets(sizes, 100) == [[0, 1, 2, 3, 4, 5]]
    ab = {"alpha_s": 1e-3, "bytes_per_s": 1e3}
    # one bucket: nothing starts before the backward ends, so all of it is exposed
    one = buckets.overlap_exposed_s([1000], 5.0, 2, **ab)
    assert one == pytest.approx(comms_cost.collective_time_s("all_reduce", 1000, 2, **ab))
    # ten buckets over a long backward: only the last one is left
    ten = buckets.overlap_exposed_s([100] * 10, 50.0, 2, **ab)
    assert ten == pytest.approx(comms_cost.collective_time_s("all_reduce", 100, 2, **ab))
    # 100 tensors of 100 B over a 10 s backward, 0.1 s per call: tiny buckets queue up behind
    # their latency, one bucket waits for the whole backward; ten buckets leave 1 + 10 x 1.1 - 10
    slow = {"alpha_s": 0.05, "bytes_per_s": 1e3}
    cap, exposed = buckets.best_bucket_cap([100] * 100, 10.0, 2, caps_bytes=[100, 1_000, 10_000],
                                     **slow)
    assert cap == 1_000 and exposed == pytest.approx(2.0)
    assert buckets.overlap_exposed_s([100] * 100, 10.0, 2, **slow) == pytest.approx(10.1)


def test_a_bucket_sweep_gives_each_caps_buckets_bounds_and_exposed_time():
    sizes, slow = [100] * 100, {"alpha_s": 0.05, "bytes_per_s": 1e3}
    assert buckets.bucket_bytes([3, 4, 5, 8, 1, 2], 8) == [7, 5, 8, 3]
    points = buckets.bucket_sweep(sizes, 10.0, 2, caps_bytes=[100, 1_000, 10_000], **slow)
    assert [(p.cap_bytes, p.buckets) for p in points] == [(100, 100), (1_000, 10), (10_000, 1)]
    for p in points:
        groups = buckets.bucket_bytes(sizes, p.cap_bytes)
        assert p.exposed_s == pytest.approx(buckets.overlap_exposed_s(groups, 10.0, 2, **slow))
        assert (p.tail_s, p.queue_s) == pytest.approx(buckets.exposed_bounds_s(groups, 10.0, 2,
                                                                               **slow))
        assert p.exposed_s >= max(p.tail_s, p.queue_s) - 1e-12
    best = min(points, key=lambda p: p.exposed_s)
    assert buckets.best_bucket_cap(sizes, 10.0, 2, caps_bytes=[100, 1_000, 10_000], **slow) == (
        best.cap_bytes, best.exposed_s)
    ax = plotting.plot_bucket_sweeps({"slow": points}, _axes())
    assert len(ax.lines) == 3 and ax.get_xlabel() == "bucket cap (MiB)"


def _axes():
    return plotting.subplots()[1]


def test_exposed_time_is_the_larger_of_the_tail_and_the_queue():
    ab = {"alpha_s": 0.05, "bytes_per_s": 1e3}
    for count in (1, 4, 10, 25, 100):  # equal buckets: exactly the larger bound
        sizes = [10_000 / count] * count
        tail, queue = buckets.exposed_bounds_s(sizes, 10.0, 2, **ab)
        assert buckets.overlap_exposed_s(sizes, 10.0, 2, **ab) == pytest.approx(max(tail, queue))
    few, many = buckets.exposed_bounds_s([5_000] * 2, 20.0, 2, **ab), \
        buckets.exposed_bounds_s([100] * 100, 10.0, 2, **ab)
    assert few[0] > few[1] and many[1] > many[0]  # big buckets: the tail; small ones: the queue
    uneven = [300, 50, 2_000, 10, 640]  # otherwise a lower bound
    assert buckets.overlap_exposed_s(uneven, 1.0, 4, **ab) >= max(
        buckets.exposed_bounds_s(uneven, 1.0, 4, **ab))
    with pytest.raises(ValueError, match="at least one bucket"):
        buckets.exposed_bounds_s([], 1.0, 2, **ab)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: buckets.buckets([1, 2], 0), ValueError, "cap_bytes must be > 0"),
    (lambda: buckets.best_bucket_cap([1], 1, 2, alpha_s=0, bytes_per_s=1, caps_bytes=[]),
     ValueError, "at least one"),
])
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_overlap_schedule_runs_one_all_reduce_at_a_time_from_when_its_bucket_is_ready():
    ab = {"alpha_s": 1e-3, "bytes_per_s": 1e9}
    slots = buckets.overlap_schedule([4e6, 4e6, 2e6], 0.010, 2, **ab)
    # gradients at a steady rate: 10 MB over 10 ms, so buckets are ready at 4, 8 and 10 ms
    assert [s.ready_s for s in slots] == pytest.approx([0.004, 0.008, 0.010])
    # each all-reduce takes alpha-beta time: 2 (n-1) alpha + 2 (n-1)/n bytes / (bytes/s)
    took = [s.end_s - s.start_s for s in slots]
    assert took == pytest.approx([2e-3 + 4e-3, 2e-3 + 4e-3, 2e-3 + 2e-3])
    assert slots[1].start_s == pytest.approx(max(0.008, slots[0].end_s))  # waits for the first
    assert buckets.overlap_exposed_s([4e6, 4e6, 2e6], 0.010, 2, **ab) == pytest.approx(
        slots[-1].end_s - 0.010)
    assert buckets.overlap_exposed_s([], 0.010, 2, **ab) == 0.0
