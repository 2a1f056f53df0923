"""Does a parallel run train like one process, and send what the accounting says? Checked live.

`against_one_process` launches `world_size` CPU ranks (gloo, `harness.on_ranks`), builds the mesh
of each case (`distributed.mesh`), trains a tiny copy of the book's model for a few AdamW steps
with `mesh.train_step` (`train_on_mesh`, the harness's loop), and compares with one process
training the same model on the whole batch (`harness.one_process`): the loss of every step, the
first step's gradients and the final weights, gathered back to full tensors (`mesh.full_state`).
Every rank's bytes sent in the first step are counted by wrapping the collectives
(`distributed.comms.count_bytes`) and set beside `accounting.parallel_traffic.sent_bytes`. One
launch serves every case of one world size.
Used in: §sec-parallelism (chapter 09); the tests check the same in more cases.
"""

from __future__ import annotations

from typing import Any

from mlsys import checks
from mlsys.accounting.parallel import ParallelDims
from mlsys.accounting.parallel_traffic import sent_bytes
from mlsys.distributed import harness, mesh

Cases = dict[str, tuple[dict[str, int], bool]]
"""{name: (degrees of `ParallelDims`, sequence_parallel)}."""


def train_on_mesh(rank, degrees: dict[str, int], sequence_parallel: bool,
                  s: harness.Setup) -> dict[str, Any]:
    """On one rank of a launch: the model of `s` parallelized over the mesh of `degrees`, trained
    by `harness.train`; also `held`, the elements of the weights this rank holds."""
    dims = ParallelDims(**degrees, world_size=rank.world_size)
    where = mesh.build_mesh(dims)
    stage = mesh.parallelize(s.model(), where, seq=s.seq, sequence_parallel=sequence_parallel)
    held = sum(p.numel() for p in stage.parameters())

    def step(i: int) -> float | None:
        return mesh.train_step(stage, where, s.tokens(i), microbatches=s.microbatches).loss

    def full(grads: bool):
        return mesh.full_state(stage, where, grads=grads)

    return harness.train(s, stage.parameters(), step, full) | {"held": held}


def _all(rank, cases: Cases, s: harness.Setup) -> dict[str, Any]:
    return {name: train_on_mesh(rank, degrees, sp, s) for name, (degrees, sp) in cases.items()}


def against_one_process(cases: Cases, world_size: int, setup: harness.Setup | None = None, *,
                        timeout_s: float = 120) -> list[dict]:
    """One row per case {name: (degrees of `ParallelDims`, sequence_parallel)}: the largest
    differences from one process (loss, gradients, weights) and, per rank, the bytes sent in the
    first step against `accounting.parallel_traffic.sent_bytes`."""
    s = setup or harness.Setup()
    checks.positive_int(world_size, "world_size")
    dims = {name: ParallelDims(**degrees, world_size=world_size)  # checked before any launch
            for name, (degrees, _) in cases.items()}
    ref = harness.one_process(s)
    per_rank = harness.on_ranks(_all, world_size, args=(cases, s), timeout_s=timeout_s)
    rows = []
    for name, (_, sp) in cases.items():
        d = dims[name]
        got = harness.combine([r[name] for r in per_rank], d)
        predicted = [sum(sent_bytes(s.cfg, d, i, batch=s.batch, seq=s.seq,
                                    microbatches=s.microbatches,
                                    sequence_parallel=sp).values()) for i in range(world_size)]
        rows.append({"case": name, "world_size": world_size, "degrees": dict(cases[name][0]),
                     "sequence_parallel": sp,
                     "loss_diff": max(abs(a - b) for a, b in zip(got["losses"], ref["losses"],
                                                                 strict=True)),
                     "grad_diff": harness.max_diff(got["grads"], ref["grads"]),
                     "param_diff": harness.max_diff(got["params"], ref["params"]),
                     "sent_bytes": [r[name]["sent"] for r in per_rank],
                     "predicted_bytes": predicted})
    return rows
