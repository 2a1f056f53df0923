"""ZeRO (Rajbhandari et al., 2020, https://arxiv.org/abs/1910.02054): what each of n data-parallel
ranks holds and sends per step, stage by stage.

Model states per parameter follow a recipe of `accounting.memory` (weights, gradients, master copy,
optimizer state). Data parallelism (stage 0) replicates all of them; stage 1 shards the optimizer
state and master copy over the n ranks, stage 2 the gradients too, stage 3 the weights too.

Traffic per rank and step, Psi parameters (ZeRO's section 7, with the ring's (n-1)/n kept):
- stage 0: all-reduce the gradients, 2 (n-1)/n Psi g;
- stages 1 and 2: reduce-scatter the gradients ((n-1)/n Psi g: each rank needs only its shard's
  sum) and all-gather the updated weights ((n-1)/n Psi w): the same 2 (n-1)/n Psi as stage 0
  when g = w. Reducing each gradient to its owner and broadcasting each parameter from it (what
  `distributed.zero` does, one tensor at a time) moves the same bytes;
- stage 3: all-gather the weights before the forward and again before the backward (they were
  freed in between), and reduce-scatter the gradients: 3 (n-1)/n Psi, 1.5x stage 0.
Optimizer state never travels. `claimed_zero_sent_bytes` keeps the seed's figures (stage 1 above
DP, stage 2 half of DP, stage 3 growing with the layer count), to be shown beside these.
Pure: no torch. Used in: §sec-data-parallel (chapter 08) and the FSDP chapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlsys import checks
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.memory import TrainingRecipe
from mlsys.accounting.memory import recipe as _recipe
from mlsys.dtypes import bytes_per_element

STAGES = (0, 1, 2, 3)
SHARDED_FROM = {"master": 1, "optimizer": 1, "grads": 2, "weights": 3}
"""The first stage that shards each kind of model state."""


def assign_owners(numels: Sequence[int], n_ranks: int, *,
                  held: Sequence[int] | None = None) -> tuple[int, ...]:
    """The rank that owns each tensor: in order, each goes to the rank holding the fewest elements
    so far (the lowest such rank on a tie), counting from `held` (default: nothing held yet).
    Deterministic, so every rank computes the same owners."""
    sizes = checks.int_sequence(numels, "numels", minimum=0)
    n = checks.positive_int(n_ranks, "n_ranks")
    held = [0] * n if held is None else list(checks.int_sequence(held, "held", minimum=0))
    if len(held) != n:
        raise ValueError(f"held must have one count per rank ({n}), got {len(held)}")
    owners = []
    for size in sizes:
        rank = min(range(n), key=lambda r: (held[r], r))
        owners.append(rank)
        held[rank] += size
    return tuple(owners)


def shard_numels(numels: Sequence[int], n_ranks: int) -> tuple[int, ...]:
    """Elements each rank owns under `assign_owners`."""
    sizes = checks.int_sequence(numels, "numels", minimum=0)
    held = [0] * checks.positive_int(n_ranks, "n_ranks")
    for size, rank in zip(sizes, assign_owners(sizes, n_ranks), strict=True):
        held[rank] += size
    return tuple(held)


def _stage(stage: object) -> int:
    return checks.choice(checks.integer(stage, "stage"), "stage", STAGES)


def zero_memory_breakdown(n_params: int, n_ranks: int, stage: int,
                          recipe: str | TrainingRecipe = "fp32_adamw", *,
                          shard_params: float | None = None) -> dict[str, float]:
    """Bytes of weights, grads, master copy and optimizer state one rank holds at `stage`.

    A sharded state costs `shard_params` parameters' worth (default n_params / n_ranks, the
    ideal; pass a rank's real share, e.g. from `shard_numels`, to compare with what it holds).
    """
    n = checks.nonnegative_int(n_params, "n_params")
    ranks = checks.positive_int(n_ranks, "n_ranks")
    s = _stage(stage)
    shard = n / ranks if shard_params is None else checks.nonnegative(shard_params,
                                                                       "shard_params")
    per = _recipe(recipe).breakdown()
    return {kind: per[kind] * (shard if s >= SHARDED_FROM[kind] else n) for kind in per}


def zero_memory_bytes(n_params: int, n_ranks: int, stage: int,
                      recipe: str | TrainingRecipe = "fp32_adamw", *,
                      shard_params: float | None = None) -> float:
    """Model-state bytes per rank at `stage`: e.g. 16 Psi, 4 Psi + 12 Psi / n, 2 Psi + 14 Psi / n,
    16 Psi / n for stages 0-3 of mixed-precision AdamW (ZeRO's figure 1)."""
    return sum(zero_memory_breakdown(n_params, n_ranks, stage, recipe,
                                     shard_params=shard_params).values())


def zero_sent_bytes(n_params: int, n_ranks: int, stage: int, *, grad_dtype: str = "fp32",
                    param_dtype: str = "fp32") -> dict[str, float]:
    """Bytes each rank sends per step at `stage`, for the gradients and for the parameters
    (the module docstring derives them; received bytes are the same)."""
    n = checks.nonnegative_int(n_params, "n_params")
    ranks = checks.positive_int(n_ranks, "n_ranks")
    s = _stage(stage)
    grads = n * bytes_per_element(grad_dtype)
    weights = n * bytes_per_element(param_dtype)
    if s == 0:
        return {"gradients": collective_cost("all_reduce", grads, ranks).sent_bytes,
                "parameters": 0.0}
    gather = collective_cost("all_gather", weights, ranks).sent_bytes
    return {"gradients": collective_cost("reduce_scatter", grads, ranks).sent_bytes,
            "parameters": gather * (2 if s == 3 else 1)}


def claimed_zero_sent_bytes(stage: int, model_bytes: float, n_ranks: int, *, n_layers: int,
                            optimizer_bytes: float) -> float:
    """The seed's per-stage traffic, read as written: stage 1 "all-reduce grads 2 M + gather
    optimizer (N-1)/N O"; stage 2 "reduce-scatter grads M, no all-reduce"; stage 3 "all-gather
    params M/N x L times + reduce-scatter M"; and its data-parallel 2 (N-1)/N M as stage 0."""
    s = _stage(stage)
    m = checks.nonnegative(model_bytes, "model_bytes")
    n = checks.positive_int(n_ranks, "n_ranks")
    layers = checks.positive_int(n_layers, "n_layers")
    o = checks.nonnegative(optimizer_bytes, "optimizer_bytes")
    return {0: 2 * (n - 1) / n * m, 1: 2 * m + (n - 1) / n * o, 2: m,
            3: m / n * layers + m}[s]
