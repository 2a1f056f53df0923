"""Communication of collectives: bytes each rank sends and receives, and the alpha-beta time model.

A collective over n ranks is named by a message of M bytes, as nccl-tests names it: the buffer every
rank holds for all-reduce, broadcast and reduce; the whole input (n shards) of a reduce-scatter and
the whole output of an all-gather; the buffer each rank sends in an all-to-all (one piece per rank,
its own included); the message of a send/recv. The bandwidth-optimal algorithms move:

| collective | bytes sent per rank (= received) | bus factor | steps (ring) |
|---|---|---|---|
| all-reduce | 2 (n-1)/n M: reduce-scatter, then all-gather | 2 (n-1)/n | 2 (n-1) |
| reduce-scatter, all-gather, all-to-all | (n-1)/n M | (n-1)/n | n-1 |
| broadcast, reduce | (n-1)/n M on average; a pipelined chain's inner ranks M | 1 | n-1 |
| send/recv | M by the sender, M into the receiver | 1 | 1 |

`sent_bytes` is the average over ranks (the bytes on all the wires / n). The time is set by the
busiest rank: `bus_bytes` = bus factor x M, and the alpha-beta model is
time = steps * alpha + bus_bytes / beta, with alpha the latency of one step and beta the link's
bandwidth per direction. So a measured time gives two bandwidths: the *algorithm* bandwidth
M / time, which depends on n, and the *bus* bandwidth = algorithm bandwidth x bus factor, which
approaches beta for large M whatever n is (nccl-tests' definition, PERFORMANCE.md in
https://github.com/NVIDIA/nccl-tests). A tree all-reduce (NCCL's double binary tree) sends the
same bytes on average and needs only 2 ceil(log2 n) steps.

Seed corrections this module lets a chapter show: a ring all-reduce has 2 (n-1) latency steps,
not n-1 (`claimed_ring_all_reduce_s`); "time ~ 2 M / BW for large M" holds for large n, not
large M (it is 2x too slow at n = 2); and a bandwidth printed in "GB/s" that is a bus bandwidth in
GiB/s (`claimed_effective_gb_per_s`). `hierarchical_all_reduce_s` splits an all-reduce across
nodes into its three phases, with the switches' in-network reduction as an option. Gradient
buckets and their overlap with the backward are `accounting.buckets`. Pure: no torch. Used in:
§sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlsys import checks

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
               "send_recv")
ALGORITHMS = ("ring", "tree")
GIB = 2**30


@dataclass(frozen=True)
class CollectiveCost:
    """What one collective costs each rank (bytes) and how many sequential steps it takes."""

    collective: str
    algorithm: str
    n_ranks: int
    message_bytes: float  # M, as in the module's table
    sent_bytes: float  # per rank, averaged over the ranks
    received_bytes: float
    bus_bytes: float  # what the busiest rank sends: bus factor x M; sets the bandwidth term
    steps: int  # sequential message rounds: the latency term's multiplier

    @property
    def bus_factor(self) -> float:
        return self.bus_bytes / self.message_bytes if self.message_bytes else 0.0


def bus_factor(collective: str, n_ranks: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth: 2(n-1)/n for all-reduce, (n-1)/n for
    reduce-scatter, all-gather and all-to-all, 1 for broadcast, reduce and send/recv."""
    checks.choice(collective, "collective", COLLECTIVES)
    n = checks.positive_int(n_ranks, "n_ranks")
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0 if n > 1 or collective == "send_recv" else 0.0


def collective_cost(collective: str, message_bytes: float, n_ranks: int, *,
                    algorithm: str = "ring") -> CollectiveCost:
    """Bytes per rank and steps of one collective of `message_bytes` over `n_ranks` (table above).

    `algorithm="tree"` exists for all-reduce only: the same bytes, 2 ceil(log2 n) steps.
    """
    checks.choice(collective, "collective", COLLECTIVES)
    m = checks.nonnegative(message_bytes, "message_bytes")
    n = checks.positive_int(n_ranks, "n_ranks")
    checks.choice(algorithm, "algorithm", ALGORITHMS)
    if algorithm == "tree" and collective != "all_reduce":
        raise ValueError(f"algorithm='tree' is modelled for all_reduce only, got {collective!r}")
    if collective == "send_recv":  # one sender, one receiver: per pair, not averaged
        return CollectiveCost(collective, algorithm, n, m, m, m, m, 1)
    if n == 1:
        return CollectiveCost(collective, algorithm, 1, m, 0.0, 0.0, 0.0, 0)
    factor = bus_factor(collective, n)
    average = (n - 1) / n * m * (2 if collective == "all_reduce" else 1)
    if collective == "all_reduce":
        steps = 2 * (n - 1) if algorithm == "ring" else 2 * math.ceil(math.log2(n))
    else:
        steps = n - 1
    return CollectiveCost(collective, algorithm, n, m, average, average, factor * m, steps)


def time_s(cost: CollectiveCost, *, alpha_s: float, bytes_per_s: float) -> float:
    """The alpha-beta time: steps * alpha_s + bus_bytes / bytes_per_s (per-direction bandwidth)."""
    if not isinstance(cost, CollectiveCost):
        raise TypeError(f"cost must be a CollectiveCost, got {type(cost).__name__}")
    alpha = checks.nonnegative(alpha_s, "alpha_s")
    beta = checks.positive(bytes_per_s, "bytes_per_s")
    return cost.steps * alpha + cost.bus_bytes / beta


def collective_time_s(collective: str, message_bytes: float, n_ranks: int, *, alpha_s: float,
                      bytes_per_s: float, algorithm: str = "ring") -> float:
    """`time_s` of `collective_cost(collective, message_bytes, n_ranks)`."""
    cost = collective_cost(collective, message_bytes, n_ranks, algorithm=algorithm)
    return time_s(cost, alpha_s=alpha_s, bytes_per_s=bytes_per_s)


def algorithm_bandwidth(message_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: M / time (nccl-tests' "algbw")."""
    return checks.nonnegative(message_bytes, "message_bytes") / checks.positive(seconds, "seconds")


def bus_bandwidth(collective: str, message_bytes: float, seconds: float, n_ranks: int) -> float:
    """Bus bandwidth in bytes/s: algorithm bandwidth x `bus_factor` (nccl-tests' "busbw"), the
    figure to compare with a link's per-direction bandwidth."""
    return algorithm_bandwidth(message_bytes, seconds) * bus_factor(collective, n_ranks)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted alpha-beta model of one collective at one rank count."""

    collective: str
    n_ranks: int
    alpha_s: float  # latency per step
    bytes_per_s: float  # beta: the per-direction bandwidth the bus bytes cross at
    per_call_s: float  # the fitted fixed cost of one call: steps * alpha_s
    relative_errors: tuple[float, ...]  # (fit - measured) / measured, per point

    def time_s(self, message_bytes: float, algorithm: str = "ring") -> float:
        return collective_time_s(self.collective, message_bytes, self.n_ranks,
                                 alpha_s=self.alpha_s, bytes_per_s=self.bytes_per_s,
                                 algorithm=algorithm)


def fit_alpha_beta(message_bytes: Sequence[float], times_s: Sequence[float], *, n_ranks: int,
                   collective: str = "all_reduce") -> AlphaBeta:
    """Fit time = steps * alpha + bus_bytes / beta to measured (size, time) points.

    Least squares on *relative* errors (each point weighted by 1 / time^2), so a 1 KB point
    counts as much as a 1 GB one; the intercept is kept >= 0. Needs at least two sizes.
    """
    sizes = [checks.positive(m, f"message_bytes[{i}]") for i, m in enumerate(message_bytes)]
    times = [checks.positive(t, f"times_s[{i}]") for i, t in enumerate(times_s)]
    if len(sizes) != len(times) or len(set(sizes)) < 2:
        raise ValueError(f"need as many times as sizes and at least two distinct sizes, got "
                         f"{len(sizes)} sizes and {len(times)} times")
    n = checks.positive_int(n_ranks, "n_ranks")
    if n == 1:
        raise ValueError("n_ranks=1 moves no bytes: there is no bandwidth to fit")
    costs = [collective_cost(collective, m, n) for m in sizes]
    # minimize sum((a u + b x u - 1)^2), u = 1 / t, x = bus bytes: the 2 x 2 normal equations
    f1 = [1 / t for t in times]
    f2 = [c.bus_bytes / t for c, t in zip(costs, times, strict=True)]
    s11, s22 = sum(a * a for a in f1), sum(b * b for b in f2)
    s12, s1, s2 = sum(a * b for a, b in zip(f1, f2, strict=True)), sum(f1), sum(f2)
    det = s11 * s22 - s12 * s12
    a = (s1 * s22 - s2 * s12) / det if det > 0 else -1.0
    b = (s11 * s2 - s12 * s1) / det if det > 0 else 0.0
    if a < 0:  # a negative latency means nothing: refit through the origin
        a, b = 0.0, s2 / s22
    if b <= 0:
        raise ValueError("the times do not grow with the message size: no bandwidth to fit")
    errors = tuple((a + b * c.bus_bytes - t) / t for c, t in zip(costs, times, strict=True))
    return AlphaBeta(collective, n, a / costs[0].steps, 1 / b, a, errors)


def all_reduces_s(message_bytes: Sequence[float], n_ranks: int, *, alpha_s: float,
                  bytes_per_s: float) -> float:
    """Seconds of one ring all-reduce per message, one after another: naive DDP passes one per
    parameter, flat DDP one for all, bucketed DDP one per bucket."""
    return sum(collective_time_s("all_reduce", m, n_ranks, alpha_s=alpha_s,
                                 bytes_per_s=bytes_per_s) for m in message_bytes)


def accumulation_sent_bytes(grad_bytes: float, n_ranks: int, micro_batches: int, *,
                            sync_each_micro_batch: bool) -> float:
    """Bytes each rank sends per optimizer step with gradient accumulation over `micro_batches`:
    one all-reduce when the micro-batches before the last skip it (`no_sync`), one per
    micro-batch otherwise. The gradient buffers are the same size either way."""
    k = checks.positive_int(micro_batches, "micro_batches")
    per = collective_cost("all_reduce", grad_bytes, n_ranks).sent_bytes
    return per * (k if sync_each_micro_batch else 1)


def hierarchical_all_reduce_s(message_bytes: float, nodes: int, per_node: int, *,
                              intra_bytes_per_s: float, inter_bytes_per_s: float,
                              alpha_s: float = 0.0, in_network: bool = False) -> dict[str, float]:
    """Seconds of each phase of a two-level all-reduce of M bytes over `nodes` x `per_node` ranks:
    a reduce-scatter inside each node (its link, `intra_bytes_per_s`); across the nodes, an
    all-reduce of each rank's M / per_node shard among the ranks of the same local index, each on
    its own port (`inter_bytes_per_s`); an all-gather inside each node.

    Across the nodes a ring sends 2 (N-1)/N of the shard in 2 (N-1) steps. With `in_network`
    reduction the switches add the shards (NVIDIA SHARP; Graham et al., "Scalable Hierarchical
    Aggregation Protocol (SHArP)", COMHPC 2016): a rank sends its shard once and receives the sum
    once, 1x the shard in 2 steps (up the switch tree and down), whatever N is. NCCL pipelines
    the phases chunk by chunk, so for a large message the slowest phase sets the time, and for a
    small one their sum. Keys: "reduce_scatter", "across", "all_gather"."""
    m = checks.nonnegative(message_bytes, "message_bytes")
    n_nodes, g = checks.positive_int(nodes, "nodes"), checks.positive_int(per_node, "per_node")
    inside = {"alpha_s": alpha_s, "bytes_per_s": intra_bytes_per_s}
    shard = m / g
    if in_network and n_nodes > 1:
        across = 2 * checks.nonnegative(alpha_s, "alpha_s") + shard / checks.positive(
            inter_bytes_per_s, "inter_bytes_per_s")
    else:
        across = collective_time_s("all_reduce", shard, n_nodes, alpha_s=alpha_s,
                                   bytes_per_s=checks.positive(inter_bytes_per_s,
                                                               "inter_bytes_per_s"))
    return {"reduce_scatter": collective_time_s("reduce_scatter", m, g, **inside),
            "across": across, "all_gather": collective_time_s("all_gather", m, g, **inside)}


# --- the seed's formulas, kept to be set beside the right ones -----------------------------------


def claimed_ring_all_reduce_s(message_bytes: float, n_ranks: int, *, alpha_s: float,
                              bytes_per_s: float) -> float:
    """The seed's ring time, 2 (n-1)/n M / BW + alpha (n-1): its latency term counts n-1 steps
    where the ring takes 2 (n-1) (n-1 to reduce-scatter, n-1 to all-gather)."""
    n = checks.positive_int(n_ranks, "n_ranks")
    m = checks.nonnegative(message_bytes, "message_bytes")
    return 2 * (n - 1) / n * m / checks.positive(bytes_per_s, "bytes_per_s") + \
        checks.nonnegative(alpha_s, "alpha_s") * (n - 1)


def claimed_large_message_all_reduce_s(message_bytes: float, bytes_per_s: float) -> float:
    """The seed's "for large M, time ~ 2 M / BW": the limit of large n, not of large M."""
    return 2 * checks.nonnegative(message_bytes, "message_bytes") / \
        checks.positive(bytes_per_s, "bytes_per_s")


def claimed_effective_gb_per_s(message_bytes: float, seconds: float, n_ranks: int) -> float:
    """The seed's printed "Effective bandwidth ... GB/s": the bus bandwidth in GiB/s (2**30 B/s),
    which is 7.4% below the same figure in GB/s."""
    return bus_bandwidth("all_reduce", message_bytes, seconds, n_ranks) / GIB
