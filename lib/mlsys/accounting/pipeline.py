"""The pipeline bubble: the order each stage runs its micro-batches (GPipe, 1F1B), a simulated
timeline of a step, and the idle share (p - 1) / (m + p - 1).

`pipeline_schedule` is the one source of the order: `mlsys.distributed.pp` runs it. GPipe (Huang
et al., 2019) runs every forward, then every backward; 1F1B (Narayanan et al., 2021,
PipeDream-Flush) runs p - 1 - stage warm-up forwards and then alternates, holding at most
p - stage micro-batches of activations instead of m. Both idle for (p - 1) (t_F + t_B) of a step
of (m + p - 1) (t_F + t_B), whatever t_B / t_F is: `pipeline_timeline` plays the dependencies out
and `simulated_bubble_fraction` measures the idle share on it. Two schedules shrink the bubble
itself, as formulas (`interleaved_bubble_fraction`, `zero_bubble_fraction`): interleaved 1F1B
(Narayanan et al., 2021, section 2.2) gives each device v chunks of the model, so the fill and
drain take (p - 1) / v of a micro-batch's time; zero-bubble (Qi et al., 2024, ZB-H1) splits the
backward into its input-gradient part B and its weight-gradient part W and fills the drain with
the W's, leaving (p - 1) (t_F + t_B - t_W). Pure: no torch.
Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

from mlsys import checks

SCHEDULES = ("gpipe", "1f1b")


def in_flight(stage: int, n_stages: int, microbatches: int, schedule: str) -> int:
    """Micro-batches whose activations a stage holds at once: all m under GPipe, at most
    p - stage under 1F1B (its warm-up forwards plus one)."""
    checks.choice(schedule, "schedule", SCHEDULES)
    if n_stages == 1:
        return 1  # micro-batches run one after another (gradient accumulation)
    return microbatches if schedule == "gpipe" else min(microbatches, n_stages - stage)


def bubble_fraction(n_stages: int, microbatches: int) -> float:
    """Idle share of a GPipe or 1F1B step: (p - 1) / (m + p - 1)."""
    p = checks.positive_int(n_stages, "n_stages")
    m = checks.positive_int(microbatches, "microbatches")
    return (p - 1) / (m + p - 1)


def interleaved_bubble_fraction(n_stages: int, microbatches: int, chunks: int) -> float:
    """Idle share of an interleaved 1F1B step with `chunks` (v) model chunks per device:
    (p - 1) / (v m + p - 1), the bubble (p - 1) / v of one micro-batch's time (Narayanan et al.,
    2021). v = 1 is plain 1F1B. Megatron-LM needs m to be a multiple of p."""
    p = checks.positive_int(n_stages, "n_stages")
    m = checks.positive_int(microbatches, "microbatches")
    v = checks.positive_int(chunks, "chunks")
    if v > 1 and m % p:
        raise ValueError(f"microbatches ({m}) must be a multiple of n_stages ({p}) for an "
                         "interleaved schedule (each round sends p micro-batches through a chunk)")
    return (p - 1) / (v * m + p - 1)


def zero_bubble_fraction(n_stages: int, microbatches: int, *, forward_s: float = 1.0,
                         input_grad_s: float = 1.0, weight_grad_s: float = 1.0) -> float:
    """Idle share of a ZB-H1 step (Qi et al., 2024): with the backward split into B (the input's
    gradient, on the critical path) and W (the weights', deferred into the drain), each stage idles
    (p - 1) (t_F + t_B - t_W) of m (t_F + t_B + t_W) + that; 1F1B idles (p - 1) (t_F + t_B + t_W).
    Needs t_W <= t_F + t_B; ZB-H2, with more micro-batches in flight, idles about none."""
    p = checks.positive_int(n_stages, "n_stages")
    m = checks.positive_int(microbatches, "microbatches")
    tf, tb = checks.positive(forward_s, "forward_s"), checks.positive(input_grad_s,
                                                                       "input_grad_s")
    tw = checks.positive(weight_grad_s, "weight_grad_s")
    if tw > tf + tb:
        raise ValueError(f"weight_grad_s ({tw}) must be <= forward_s + input_grad_s "
                         f"({tf + tb}): the deferred W's cannot fill more than the drain")
    idle = (p - 1) * (tf + tb - tw)
    return idle / (m * (tf + tb + tw) + idle)


def pipeline_schedule(stage: int, n_stages: int, microbatches: int,
                      schedule: str = "1f1b") -> tuple[tuple[str, int], ...]:
    """The order in which `stage` runs forwards ("F", i) and backwards ("B", i).

    GPipe: every forward, then every backward. 1F1B: p - 1 - stage warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards (at most p - stage micro-batches
    in flight, instead of m)."""
    p, m = checks.positive_int(n_stages, "n_stages"), checks.positive_int(microbatches,
                                                                          "microbatches")
    s = checks.integer(stage, "stage", minimum=0)
    if s >= p:
        raise ValueError(f"stage ({s}) must be < n_stages ({p})")
    if checks.choice(schedule, "schedule", SCHEDULES) == "gpipe":
        return tuple(("F", i) for i in range(m)) + tuple(("B", i) for i in range(m))
    warm = min(p - 1 - s, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return tuple(ops + [("B", i) for i in range(m - warm, m)])


def pipeline_timeline(n_stages: int, microbatches: int, schedule: str = "1f1b", *,
                      forward_s: float = 1.0, backward_s: float = 2.0):
    """Start and end of every op on every stage, each stage running its `pipeline_schedule` in
    order as soon as its inputs are ready (F after the previous stage's F; B after the next
    stage's B); sends take no time. Returns per stage a list of (op, i, start, end)."""
    tf, tb = checks.positive(forward_s, "forward_s"), checks.positive(backward_s, "backward_s")
    p = checks.positive_int(n_stages, "n_stages")
    orders = [list(pipeline_schedule(s, p, microbatches, schedule)) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    clock, pos = [0.0] * p, [0] * p
    out: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            op, i = orders[s][pos[s]]
            dep = (("F", i, s - 1) if s > 0 else None) if op == "F" else \
                (("B", i, s + 1) if s < p - 1 else ("F", i, s))
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done.get(dep, 0.0))
            clock[s] = done[(op, i, s)] = start + (tf if op == "F" else tb)
            out[s].append((op, i, start, clock[s]))
            pos[s] += 1
            moved = True
        if not moved:
            raise RuntimeError("the pipeline schedule deadlocks")  # cannot happen for SCHEDULES
    return out


def simulated_bubble_fraction(n_stages: int, microbatches: int, schedule: str = "1f1b",
                              **times: float) -> float:
    """Idle share of the step on the busiest stage, from `pipeline_timeline`."""
    timeline = pipeline_timeline(n_stages, microbatches, schedule, **times)
    total = max(ops[-1][3] for ops in timeline)
    busy = max(sum(end - start for _, _, start, end in ops) for ops in timeline)
    return 1 - busy / total
