"""mlsys.accounting.comms: bytes per rank of every collective, the alpha-beta model, algorithm vs
bus bandwidth, the fit, buckets and overlap, and the seed's formulas beside the right ones."""

import math

import pytest

from mlsys import hardware, third_party
from mlsys.accounting import comms as C

GB = 10**9


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_ring_all_reduce_is_a_reduce_scatter_then_an_all_gather(n):
    m = 24 * 2**20
    ar = C.collective_cost("all_reduce", m, n)
    rs, ag = C.collective_cost("reduce_scatter", m, n), C.collective_cost("all_gather", m, n)
    assert ar.sent_bytes == ar.received_bytes == rs.sent_bytes + ag.sent_bytes
    assert ar.sent_bytes == 2 * (n - 1) * m / n
    assert ar.steps == rs.steps + ag.steps == 2 * (n - 1)
    assert ar.bus_factor == pytest.approx(2 * (n - 1) / n)


def test_the_other_collectives():
    m, n = 3 * 2**20, 4
    cost = {c: C.collective_cost(c, m, n) for c in C.COLLECTIVES}
    for c in ("reduce_scatter", "all_gather", "all_to_all"):
        assert cost[c].sent_bytes == cost[c].bus_bytes == 3 * m / 4 and cost[c].steps == 3
    for c in ("broadcast", "reduce"):  # (n-1) M over all the wires; a chain's inner ranks move M
        assert cost[c].sent_bytes == 3 * m / 4 and cost[c].bus_bytes == m
    assert (cost["send_recv"].sent_bytes, cost["send_recv"].steps) == (m, 1)
    assert C.collective_cost("all_reduce", m, 1).sent_bytes == 0  # one rank: nothing moves
    tree = C.collective_cost("all_reduce", m, 8, algorithm="tree")
    ring = C.collective_cost("all_reduce", m, 8)
    assert (tree.sent_bytes, tree.steps, ring.steps) == (ring.sent_bytes, 6, 14)


def test_alpha_beta_time_and_the_two_bandwidths():
    m, n, alpha, beta = 2**30, 4, 5e-6, 100 * GB
    t = C.collective_time_s("all_reduce", m, n, alpha_s=alpha, bytes_per_s=beta)
    assert t == pytest.approx(6 * alpha + 1.5 * m / beta)
    assert C.algorithm_bandwidth(m, t) == pytest.approx(m / t)
    # for a large message the bus bandwidth approaches beta, whatever n is
    for ranks in (2, 4, 8):
        big = C.collective_time_s("all_reduce", 2**40, ranks, alpha_s=alpha, bytes_per_s=beta)
        assert C.bus_bandwidth("all_reduce", 2**40, big, ranks) == pytest.approx(beta, rel=1e-5)


def test_fit_recovers_alpha_and_beta():
    sizes = [2**k for k in range(10, 31, 4)]
    alpha, beta = 7e-6, 40 * GB
    times = [C.collective_time_s("all_reduce", m, 4, alpha_s=alpha, bytes_per_s=beta)
             for m in sizes]
    fit = C.fit_alpha_beta(sizes, times, n_ranks=4)
    assert fit.alpha_s == pytest.approx(alpha) and fit.bytes_per_s == pytest.approx(beta)
    assert fit.per_call_s == pytest.approx(6 * alpha)
    assert max(abs(e) for e in fit.relative_errors) < 1e-9
    assert fit.time_s(2**20) == pytest.approx(6 * alpha + 1.5 * 2**20 / beta)


def test_fit_refuses_what_has_no_bandwidth():
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        C.fit_alpha_beta([1e6, 1e6], [1e-3, 2e-3], n_ranks=2)
    with pytest.raises(ValueError, match="do not grow"):
        C.fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3], n_ranks=2)
    with pytest.raises(ValueError, match="n_ranks=1"):
        C.fit_alpha_beta([1e3, 1e6], [1e-3, 2e-3], n_ranks=1)


def test_the_seeds_bandwidths_are_bus_bandwidths_in_gib_per_s():
    for r in third_party.CS336_STUDENT_ALLREDUCE:
        claimed = C.claimed_effective_gb_per_s(r.message_bytes, r.mean_s, r.world_size)
        assert claimed == pytest.approx(r.claimed_gb_per_s, rel=6e-3)  # the times' rounding
    big = next(r for r in third_party.CS336_STUDENT_ALLREDUCE if r.world_size == 4)
    busbw = C.bus_bandwidth("all_reduce", big.message_bytes, big.mean_s, 4)
    assert busbw / 1e9 == pytest.approx(163.0, abs=0.1)  # "151.85 GB/s" is 163.0 GB/s
    assert C.algorithm_bandwidth(big.message_bytes, big.mean_s) / 1e9 == pytest.approx(108.7,
                                                                                       abs=0.1)


def test_the_seeds_ring_formulas_beside_the_right_one():
    m, alpha, beta = 2**30, 10e-6, 100 * GB
    for n in (2, 4, 8):
        right = C.collective_time_s("all_reduce", m, n, alpha_s=alpha, bytes_per_s=beta)
        claimed = C.claimed_ring_all_reduce_s(m, n, alpha_s=alpha, bytes_per_s=beta)
        assert right - claimed == pytest.approx((n - 1) * alpha)  # half the latency steps missed
    large = C.claimed_large_message_all_reduce_s(m, beta)
    at2 = C.collective_time_s("all_reduce", m, 2, alpha_s=0, bytes_per_s=beta)
    assert large / at2 == pytest.approx(2.0)  # "2 M / BW" is the large-n limit, 2x off at n = 2


def test_buckets_and_the_overlap_model():
    sizes = [4, 4, 4, 10, 1, 1]
    assert C.buckets(sizes, 8) == [[0, 1], [2], [3], [4, 5]]
    assert C.buckets(sizes, 100) == [[0, 1, 2, 3, 4, 5]]
    ab = {"alpha_s": 1e-3, "bytes_per_s": 1e3}
    # one bucket: nothing starts before the backward ends, so all of it is exposed
    one = C.overlap_exposed_s([1000], 5.0, 2, **ab)
    assert one == pytest.approx(C.collective_time_s("all_reduce", 1000, 2, **ab))
    # ten buckets over a long backward: only the last one is left
    ten = C.overlap_exposed_s([100] * 10, 50.0, 2, **ab)
    assert ten == pytest.approx(C.collective_time_s("all_reduce", 100, 2, **ab))
    # 100 tensors of 100 B over a 10 s backward, 0.1 s per call: tiny buckets queue up behind
    # their latency, one bucket waits for the whole backward; ten buckets leave 1 + 10 x 1.1 - 10
    slow = {"alpha_s": 0.05, "bytes_per_s": 1e3}
    cap, exposed = C.best_bucket_cap([100] * 100, 10.0, 2, caps_bytes=[100, 1_000, 10_000],
                                     **slow)
    assert cap == 1_000 and exposed == pytest.approx(2.0)
    assert C.overlap_exposed_s([100] * 100, 10.0, 2, **slow) == pytest.approx(10.1)


def test_a_bucket_sweep_gives_each_caps_buckets_bounds_and_exposed_time():
    sizes, slow = [100] * 100, {"alpha_s": 0.05, "bytes_per_s": 1e3}
    assert C.bucket_bytes([3, 4, 5, 8, 1, 2], 8) == [7, 5, 8, 3]
    points = C.bucket_sweep(sizes, 10.0, 2, caps_bytes=[100, 1_000, 10_000], **slow)
    assert [(p.cap_bytes, p.buckets) for p in points] == [(100, 100), (1_000, 10), (10_000, 1)]
    for p in points:
        groups = C.bucket_bytes(sizes, p.cap_bytes)
        assert p.exposed_s == pytest.approx(C.overlap_exposed_s(groups, 10.0, 2, **slow))
        assert (p.tail_s, p.queue_s) == pytest.approx(C.exposed_bounds_s(groups, 10.0, 2, **slow))
        assert p.exposed_s >= max(p.tail_s, p.queue_s) - 1e-12
    best = min(points, key=lambda p: p.exposed_s)
    assert C.best_bucket_cap(sizes, 10.0, 2, caps_bytes=[100, 1_000, 10_000], **slow) == (
        best.cap_bytes, best.exposed_s)
    ax = C.plot_bucket_sweeps({"slow": points}, _axes())
    assert len(ax.lines) == 3 and ax.get_xlabel() == "bucket cap (MiB)"


def _axes():
    from mlsys import plotting

    return plotting.subplots()[1]


def test_accumulation_sends_once_per_optimizer_step_with_no_sync():
    each = C.accumulation_sent_bytes(1e9, 4, 8, sync_each_micro_batch=True)
    once = C.accumulation_sent_bytes(1e9, 4, 8, sync_each_micro_batch=False)
    assert each == 8 * once == 8 * 1.5e9


def test_links_come_from_hardware():
    dgx = hardware.get_cluster("dgx-h100")
    assert dgx.ring_link(8) is hardware.LINKS["nvlink4"]
    assert dgx.ring_link(16).bytes_per_s == 50e9  # one 400 Gb/s port per GPU
    t8 = C.collective_time_s("all_reduce", 2**30, 8, alpha_s=0,
                             bytes_per_s=dgx.ring_link(8).bytes_per_s)
    t16 = C.collective_time_s("all_reduce", 2**30, 16, alpha_s=0,
                              bytes_per_s=dgx.ring_link(16).bytes_per_s)
    assert t16 / t8 == pytest.approx(9 * (15 / 16) / (7 / 8))  # 450 / 50 GB/s, and (n-1)/n


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: C.collective_cost("allreduce", 1, 2), ValueError, "collective='allreduce'"),
    (lambda: C.collective_cost("all_reduce", -1, 2), ValueError, "message_bytes must be >= 0"),
    (lambda: C.collective_cost("all_reduce", 1, 0), ValueError, "n_ranks must be a positive"),
    (lambda: C.collective_cost("broadcast", 1, 2, algorithm="tree"), ValueError, "all_reduce"),
    (lambda: C.time_s(3.0, alpha_s=0, bytes_per_s=1), TypeError, "cost must be a Collective"),
    (lambda: C.collective_time_s("all_reduce", 1, 2, alpha_s=0, bytes_per_s=0), ValueError,
     "bytes_per_s must be > 0"),
    (lambda: C.buckets([1, 2], 0), ValueError, "cap_bytes must be > 0"),
    (lambda: C.best_bucket_cap([1], 1, 2, alpha_s=0, bytes_per_s=1, caps_bytes=[]), ValueError,
     "at least one"),
    (lambda: hardware.get_cluster("dgx-v100"), ValueError, "cluster='dgx-v100'"),
    (lambda: hardware.get_cluster("tpu-v5p").ring_link(10_000), ValueError, "does not fit"),
])
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_ring_step_count_is_what_makes_small_messages_slow():
    alpha, beta = 20e-6, 150 * GB
    small = C.collective_time_s("all_reduce", 2**20, 8, alpha_s=alpha, bytes_per_s=beta)
    assert 14 * alpha / small > 0.5  # latency-bound: most of 1 MiB's time is the 14 steps
    assert math.isclose(C.bus_factor("all_reduce", 8), 1.75)


def test_exposed_time_is_the_larger_of_the_tail_and_the_queue():
    ab = {"alpha_s": 0.05, "bytes_per_s": 1e3}
    for count in (1, 4, 10, 25, 100):  # equal buckets: exactly the larger bound
        sizes = [10_000 / count] * count
        tail, queue = C.exposed_bounds_s(sizes, 10.0, 2, **ab)
        assert C.overlap_exposed_s(sizes, 10.0, 2, **ab) == pytest.approx(max(tail, queue))
    few, many = C.exposed_bounds_s([5_000] * 2, 20.0, 2, **ab), \
        C.exposed_bounds_s([100] * 100, 10.0, 2, **ab)
    assert few[0] > few[1] and many[1] > many[0]  # big buckets: the tail; small ones: the queue
    uneven = [300, 50, 2_000, 10, 640]  # otherwise a lower bound
    assert C.overlap_exposed_s(uneven, 1.0, 4, **ab) >= max(C.exposed_bounds_s(uneven, 1.0, 4,
                                                                                **ab))
    with pytest.raises(ValueError, match="at least one bucket"):
        C.exposed_bounds_s([], 1.0, 2, **ab)
