"""Napkin math of training at scale: checkpoint size and write time, how often to checkpoint, and
what the slowest rank costs a synchronous step.

- A checkpoint holds what training cannot rebuild: the weights the optimizer updates (the fp32
  master copy when there is one: the low-precision weights are its rounding) and the optimizer's
  state; gradients are not saved. Mixed-precision AdamW: 4 + 8 = 12 bytes per parameter.
- Young's interval (Young 1974, "A first order approximation to the optimum checkpoint interval")
  minimizes the expected time lost per unit of work, delta / tau + tau / (2 M), for a checkpoint
  that takes delta seconds and a job whose mean time between failures is M: tau = sqrt(2 delta M).
  Daly (2006, "A higher order estimate of the optimum checkpoint interval for restart dumps")
  adds the next terms: tau = sqrt(2 delta M) (1 + sqrt(delta / (2 M)) / 3 + delta / (18 M)) -
  delta, for delta < 2 M (else tau = M).
- A job of n GPUs, each failing at rate r per GPU-hour, fails at n r per hour: M = 1 / (n r).
- A synchronous step waits for the slowest of n ranks. With step times that vary normally, the
  expected maximum of n standard normals (`expected_max_of_normals`) times the spread is what
  each step loses; it grows like sqrt(2 ln n).
Pure Python. Used in: chapter 10 (§sec-cluster).
"""

from __future__ import annotations

import math

from mlsys import checks
from mlsys.accounting.memory import recipe

HOUR = 3600.0


def checkpoint_bytes_per_param(recipe_name: str) -> int:
    """Bytes a checkpoint holds per parameter under a recipe of `accounting.memory.RECIPES`:
    the updated weights (master if any, else the weights) plus the optimizer state."""
    r = recipe(recipe_name)
    updated = r.master_bytes or r.weight_bytes
    return updated + r.optimizer_bytes


def checkpoint_seconds(n_params: float, recipe_name: str, bytes_per_s: float) -> float:
    """Seconds to write one checkpoint of `n_params` at an aggregate storage bandwidth."""
    checks.positive(n_params, "n_params")
    checks.positive(bytes_per_s, "bytes_per_s")
    return n_params * checkpoint_bytes_per_param(recipe_name) / bytes_per_s


def job_mtbf_s(n_gpus: int, failures_per_gpu_hour: float) -> float:
    """Mean time between failures of a job on `n_gpus` (any GPU's failure stops the step)."""
    n = checks.positive_int(n_gpus, "n_gpus")
    rate = checks.positive(failures_per_gpu_hour, "failures_per_gpu_hour")
    return HOUR / (n * rate)


def lost_fraction(interval_s: float, checkpoint_s: float, mtbf_s: float) -> float:
    """First-order expected fraction of time lost: writing checkpoints, delta / tau, plus the
    work redone after a failure, on average half an interval per failure, tau / (2 M)."""
    for name, v in (("interval_s", interval_s), ("checkpoint_s", checkpoint_s),
                    ("mtbf_s", mtbf_s)):
        checks.positive(v, name)
    return checkpoint_s / interval_s + interval_s / (2 * mtbf_s)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum interval between checkpoints: sqrt(2 delta M)."""
    checks.positive(checkpoint_s, "checkpoint_s")
    checks.positive(mtbf_s, "mtbf_s")
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (the module docstring); M when delta >= 2 M."""
    delta, m = checks.positive(checkpoint_s, "checkpoint_s"), checks.positive(mtbf_s, "mtbf_s")
    if delta >= 2 * m:
        return m
    x = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals], by integrating 1 - F(x)^n (exact to ~1e-9):
    0 for n = 1, 0.564 for 2, 1.54 for 8, about sqrt(2 ln n) for large n."""
    k = checks.positive_int(n, "n")

    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    # E[max] = int_0^inf (1 - F^n) dx - int_-inf^0 F^n dx: the trapezoid rule on [0, 12] and
    # on [-12, 0] (the integrand jumps by 1 at 0, so each side keeps its own end point)
    h, steps, total = 1e-3, 12_000, 0.0
    for i in range(steps + 1):
        end = 0.5 if i in (0, steps) else 1.0
        total += end * ((1 - cdf(i * h) ** k) - cdf(-i * h) ** k)
    return total * h


def straggler_step_s(mean_s: float, std_s: float, n_ranks: int) -> float:
    """Expected synchronous step time when each rank's compute is normal(mean, std): the mean
    plus std times the expected maximum of n standard normals."""
    checks.positive(mean_s, "mean_s")
    if std_s < 0:
        raise ValueError(f"std_s must be >= 0, got {std_s}")
    return mean_s + std_s * expected_max_of_normals(n_ranks)
