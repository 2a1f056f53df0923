"""mlsys.accounting.comms: bytes per rank of every collective, the alpha-beta model, algorithm vs
bus bandwidth, the fit, gradient accumulation, links from `mlsys.hardware`, and the seed's
formulas beside the right ones."""

import math

import pytest

from mlsys import hardware, third_party
from mlsys.accounting import comms as comms_cost

GB = 10**9


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_ring_all_reduce_is_a_reduce_scatter_then_an_all_gather(n):
    m = 24 * 2**20
    ar = comms_cost.collective_cost("all_reduce", m, n)
    rs = comms_cost.collective_cost("reduce_scatter", m, n)
    ag = comms_cost.collective_cost("all_gather", m, n)
    assert ar.sent_bytes == ar.received_bytes == rs.sent_bytes + ag.sent_bytes
    assert ar.sent_bytes == 2 * (n - 1) * m / n
    assert ar.steps == rs.steps + ag.steps == 2 * (n - 1)
    assert ar.bus_factor == pytest.approx(2 * (n - 1) / n)


def test_the_other_collectives():
    m, n = 3 * 2**20, 4
    cost = {c: comms_cost.collective_cost(c, m, n) for c in comms_cost.COLLECTIVES}
    for c in ("reduce_scatter", "all_gather", "all_to_all"):
        assert cost[c].sent_bytes == cost[c].bus_bytes == 3 * m / 4 and cost[c].steps == 3
    for c in ("broadcast", "reduce"):  # (n-1) M over all the wires; a chain's inner ranks move M
        assert cost[c].sent_bytes == 3 * m / 4 and cost[c].bus_bytes == m
    assert (cost["send_recv"].sent_bytes, cost["send_recv"].steps) == (m, 1)
    assert comms_cost.collective_cost("all_reduce", m, 1).sent_bytes == 0  # one rank: nothing moves
    tree = comms_cost.collective_cost("all_reduce", m, 8, algorithm="tree")
    ring = comms_cost.collective_cost("all_reduce", m, 8)
    assert (tree.sent_bytes, tree.steps, ring.steps) == (ring.sent_bytes, 6, 14)


def test_alpha_beta_time_and_the_two_bandwidths():
    m, n, alpha, beta = 2**30, 4, 5e-6, 100 * GB
    t = comms_cost.collective_time_s("all_reduce", m, n, alpha_s=alpha, bytes_per_s=beta)
    assert t == pytest.approx(6 * alpha + 1.5 * m / beta)
    assert comms_cost.algorithm_bandwidth(m, t) == pytest.approx(m / t)
    # for a large message the bus bandwidth approaches beta, whatever n is
    for ranks in (2, 4, 8):
        big = comms_cost.collective_time_s("all_reduce", 2**40, ranks, alpha_s=alpha,
                                           bytes_per_s=beta)
        assert comms_cost.bus_bandwidth("all_reduce", 2**40, big, ranks) == pytest.approx(
            beta, rel=1e-5)


def test_fit_recovers_alpha_and_beta():
    sizes = [2**k for k in range(10, 31, 4)]
    alpha, beta = 7e-6, 40 * GB
    times = [comms_cost.collective_time_s("all_reduce", m, 4, alpha_s=alpha, bytes_per_s=beta)
             for m in sizes]
    fit = comms_cost.fit_alpha_beta(sizes, times, n_ranks=4)
    assert fit.alpha_s == pytest.approx(alpha) and fit.bytes_per_s == pytest.approx(beta)
    assert fit.per_call_s == pytest.approx(6 * alpha)
    assert max(abs(e) for e in fit.relative_errors) < 1e-9
    assert fit.time_s(2**20) == pytest.approx(6 * alpha + 1.5 * 2**20 / beta)


def test_fit_refuses_what_has_no_bandwidth():
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        comms_cost.fit_alpha_beta([1e6, 1e6], [1e-3, 2e-3], n_ranks=2)
    with pytest.raises(ValueError, match="do not grow"):
        comms_cost.fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3], n_ranks=2)
    with pytest.raises(ValueError, match="n_ranks=1"):
        comms_cost.fit_alpha_beta([1e3, 1e6], [1e-3, 2e-3], n_ranks=1)


def test_the_seeds_bandwidths_are_bus_bandwidths_in_gib_per_s():
    for r in third_party.CS336_STUDENT_ALLREDUCE:
        claimed = comms_cost.claimed_effective_gb_per_s(r.message_bytes, r.mean_s, r.world_size)
        assert claimed == pytest.approx(r.claimed_gb_per_s, rel=6e-3)  # the times' rounding
    big = next(r for r in third_party.CS336_STUDENT_ALLREDUCE if r.world_size == 4)
    busbw = comms_cost.bus_bandwidth("all_reduce", big.message_bytes, big.mean_s, 4)
    assert busbw / 1e9 == pytest.approx(163.0, abs=0.1)  # "151.85 GB/s" is 163.0 GB/s
    assert comms_cost.algorithm_bandwidth(big.message_bytes, big.mean_s) / 1e9 == pytest.approx(
        108.7, abs=0.1)


def test_the_seeds_ring_formulas_beside_the_right_one():
    m, alpha, beta = 2**30, 10e-6, 100 * GB
    for n in (2, 4, 8):
        right = comms_cost.collective_time_s("all_reduce", m, n, alpha_s=alpha, bytes_per_s=beta)
        claimed = comms_cost.claimed_ring_all_reduce_s(m, n, alpha_s=alpha, bytes_per_s=beta)
        assert right - claimed == pytest.approx((n - 1) * alpha)  # half the latency steps missed
    large = comms_cost.claimed_large_message_all_reduce_s(m, beta)
    at2 = comms_cost.collective_time_s("all_reduce", m, 2, alpha_s=0, bytes_per_s=beta)
    assert large / at2 == pytest.approx(2.0)  # "2 M / BW" is the large-n limit, 2x off at n = 2


def test_accumulation_sends_once_per_optimizer_step_with_no_sync():
    each = comms_cost.accumulation_sent_bytes(1e9, 4, 8, sync_each_micro_batch=True)
    once = comms_cost.accumulation_sent_bytes(1e9, 4, 8, sync_each_micro_batch=False)
    assert each == 8 * once == 8 * 1.5e9


def test_links_come_from_hardware():
    """Two whole DGX H100 nodes cross at the node's egress, 8 ports of 50 GB/s (the Scaling
    Book, "How to Think About GPUs"), not at one port: about 1.2x one node's time, not 9.6x."""
    dgx = hardware.get_cluster("dgx-h100")
    assert dgx.ring_link(8) is hardware.LINKS["nvlink4"]
    assert dgx.ring_link(16).bytes_per_s == 8 * 50e9  # 8 rings, one per 400 Gb/s port
    t8, t16, t16_spread = (comms_cost.collective_time_s(
        "all_reduce", 2**30, n, alpha_s=0, bytes_per_s=dgx.ring_link(n, stride=s).bytes_per_s)
        for n, s in ((8, 1), (16, 1), (16, 8)))
    assert t16 / t8 == pytest.approx(450 / 400 * (15 / 16) / (7 / 8))  # 450 / 400 GB/s, (n-1)/n
    assert t16_spread / t16 == pytest.approx(8)  # one GPU in each of 16 nodes: one port each


def test_a_hierarchical_all_reduce_sends_the_shard_across_and_the_switch_halves_it():
    """Two levels: reduce-scatter in the node, all-reduce of 1/g of M across the nodes on each
    GPU's own port, all-gather in the node. Pipelined, it crosses at the node's egress like 8 flat
    rings (`hardware.Cluster.ring_link`), with 2(g-1) + 2(N-1) steps instead of 2(gN-1). In-network
    reduction (SHARP: Graham et al., COMHPC 2016) sends the shard once: 2(N-1)/N times less."""
    m, nodes, g, nv, port, alpha = 4e9, 16, 8, 450 * GB, 50 * GB, 20e-6
    ring = comms_cost.hierarchical_all_reduce_s(m, nodes, g, intra_bytes_per_s=nv,
                                                inter_bytes_per_s=port)
    assert ring["reduce_scatter"] == ring["all_gather"] == pytest.approx(7 / 8 * m / nv)
    assert ring["across"] == pytest.approx(2 * 15 / 16 * (m / g) / port)
    egress = hardware.get_cluster("dgx-h100").ring_link(nodes * g).bytes_per_s
    flat = comms_cost.collective_time_s("all_reduce", m, nodes * g, alpha_s=0, bytes_per_s=egress)
    assert max(ring.values()) / flat == pytest.approx((15 / 16) / (127 / 128))  # same bandwidth
    sharp = comms_cost.hierarchical_all_reduce_s(m, nodes, g, intra_bytes_per_s=nv,
                                                 inter_bytes_per_s=port, in_network=True)
    assert ring["across"] / sharp["across"] == pytest.approx(2 * 15 / 16)
    slow = comms_cost.hierarchical_all_reduce_s(m, nodes, g, intra_bytes_per_s=nv,
                                                inter_bytes_per_s=port, alpha_s=alpha)
    steps = (slow["reduce_scatter"] + slow["across"] + slow["all_gather"]
             - sum(ring.values())) / alpha
    assert steps == pytest.approx(2 * (g - 1) + 2 * (nodes - 1))  # 44, not 2 (128 - 1) = 254
    one = comms_cost.hierarchical_all_reduce_s(m, 1, g, intra_bytes_per_s=nv,
                                               inter_bytes_per_s=port, in_network=True)
    assert one["across"] == 0.0  # one node: nothing crosses


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: comms_cost.hierarchical_all_reduce_s(1e9, 0, 8, intra_bytes_per_s=1e9,
                                                  inter_bytes_per_s=1e9), ValueError,
     "nodes must be a positive"),
    (lambda: comms_cost.hierarchical_all_reduce_s(1e9, 2, 8, intra_bytes_per_s=1e9,
                                                  inter_bytes_per_s=0, in_network=True),
     ValueError, "inter_bytes_per_s must be > 0"),
    (lambda: comms_cost.hierarchical_all_reduce_s(-1, 2, 8, intra_bytes_per_s=1e9,
                                                  inter_bytes_per_s=1e9), ValueError,
     "message_bytes must be >= 0"),
    (lambda: comms_cost.collective_cost("allreduce", 1, 2), ValueError, "collective='allreduce'"),
    (lambda: comms_cost.collective_cost("all_reduce", -1, 2), ValueError,
     "message_bytes must be >= 0"),
    (lambda: comms_cost.collective_cost("all_reduce", 1, 0), ValueError,
     "n_ranks must be a positive"),
    (lambda: comms_cost.collective_cost("broadcast", 1, 2, algorithm="tree"), ValueError,
     "all_reduce"),
    (lambda: comms_cost.time_s(3.0, alpha_s=0, bytes_per_s=1), TypeError,
     "cost must be a Collective"),
    (lambda: comms_cost.collective_time_s("all_reduce", 1, 2, alpha_s=0, bytes_per_s=0), ValueError,
     "bytes_per_s must be > 0"),
])
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_ring_step_count_is_what_makes_small_messages_slow():
    alpha, beta = 20e-6, 150 * GB
    small = comms_cost.collective_time_s("all_reduce", 2**20, 8, alpha_s=alpha, bytes_per_s=beta)
    assert 14 * alpha / small > 0.5  # latency-bound: most of 1 MiB's time is the 14 steps
    assert math.isclose(comms_cost.bus_factor("all_reduce", 8), 1.75)
