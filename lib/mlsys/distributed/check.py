"""Does a parallel run train like one process, and send what the accounting says? Checked live.

`against_one_process` launches `world_size` CPU ranks (gloo, `distributed.launch`), builds the
mesh of each case (`distributed.mesh`), trains a tiny copy of the book's model for a few AdamW
steps with `mesh.train_step`, and compares with one process training the same model on the whole
batch: the loss of every step, the first step's gradients and the final weights, gathered back to
full tensors (`mesh.full_state`). Every rank's bytes sent in the first step are counted by
wrapping the collectives (`distributed.comms.count_bytes`) and set beside
`accounting.parallel.sent_bytes`. One launch serves every case of one world size.
Used in: §sec-parallelism (chapter 09); the tests check the same in more cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mlsys import checks
from mlsys.models.config import TransformerConfig

TINY = TransformerConfig(vocab_size=64, context_length=16, d_model=16, n_layers=4, n_heads=4,
                         d_ff=24)
"""4 blocks (2 pipeline stages of 2), 4 heads and d_ff 24 (TP over 2 or 4 ranks), d_head 4."""


@dataclass(frozen=True)
class Setup:
    """The shared run: model, global batch, steps and learning rate (AdamW)."""

    cfg: TransformerConfig = TINY
    batch: int = 8
    seq: int = 8
    steps: int = 2
    lr: float = 1e-3
    microbatches: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        checks.positive_ints(batch=self.batch, seq=self.seq, steps=self.steps,
                             microbatches=self.microbatches)
        checks.positive(self.lr, "lr")

    def tokens(self, step: int) -> torch.Tensor:
        """The global batch of `step`: (batch, seq + 1) token ids, the same on every rank."""
        gen = torch.Generator().manual_seed(1_000 + step)
        return torch.randint(self.cfg.vocab_size, (self.batch, self.seq + 1), generator=gen)

    def model(self):
        from mlsys.models.transformer import Transformer

        torch.manual_seed(self.seed)
        return Transformer(self.cfg)


def one_process(s: Setup) -> dict[str, Any]:
    """The reference: losses per step, the first step's gradients, the final weights."""
    model = s.model()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    out: dict[str, Any] = {"losses": []}
    for step in range(s.steps):
        batch = s.tokens(step)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        out["losses"].append(loss.item())
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _train(rank, degrees: dict[str, int], sequence_parallel: bool, s: Setup) -> dict[str, Any]:
    from mlsys.accounting.parallel import ParallelDims
    from mlsys.distributed import comms, mesh

    dims = ParallelDims(**degrees, world_size=rank.world_size)
    where = mesh.build_mesh(dims)
    stage = mesh.parallelize(s.model(), where, seq=s.seq, sequence_parallel=sequence_parallel)
    opt = torch.optim.AdamW(stage.parameters(), lr=s.lr)
    out: dict[str, Any] = {"losses": []}
    for step in range(s.steps):
        with comms.count_bytes() as count:
            result = mesh.train_step(stage, where, s.tokens(step), microbatches=s.microbatches)
        out["losses"].append(result.loss)
        if step == 0:
            out["sent"] = count.sent_bytes
            out["grads"] = mesh.full_state(stage, where, grads=True)
        opt.step()
        opt.zero_grad()
    out["params"] = mesh.full_state(stage, where)
    return out


def _all(rank, cases: dict[str, tuple[dict[str, int], bool]], s: Setup) -> dict[str, Any]:
    return {name: _train(rank, degrees, sp, s) for name, (degrees, sp) in cases.items()}


def _max_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    if set(got) != set(want):
        raise RuntimeError(f"the ranks returned other tensors than one process: "
                           f"{sorted(set(got) ^ set(want))}")
    return max(float((got[n].float() - t).abs().max()) for n, t in want.items())


def against_one_process(cases: dict[str, tuple[dict[str, int], bool]], world_size: int,
                        setup: Setup | None = None, *, timeout_s: float = 120) -> list[dict]:
    """One row per case {name: (degrees of `ParallelDims`, sequence_parallel)}: the largest
    differences from one process (loss, gradients, weights) and, per rank, the bytes sent in the
    first step against `accounting.parallel.sent_bytes`."""
    from mlsys.accounting.parallel import ParallelDims, sent_bytes
    from mlsys.distributed import launch

    s = setup or Setup()
    checks.positive_int(world_size, "world_size")
    dims = {name: ParallelDims(**degrees, world_size=world_size)  # checked before any launch
            for name, (degrees, _) in cases.items()}
    ref = one_process(s)
    with launch.start(world_size, timeout_s=60, collective_timeout_s=30) as job:
        per_rank = job.run(_all, args=(cases, s), timeout_s=timeout_s)
    rows = []
    for name, (_, sp) in cases.items():
        d = dims[name]
        last = [r[name]["losses"] for i, r in enumerate(per_rank) if d.coords(i)["pp"] == d.pp - 1]
        losses = [sum(r[k] for r in last) / len(last) for k in range(s.steps)]
        grads, params = {}, {}
        for r in per_rank:  # the stages' names together make the whole model
            grads.update(r[name]["grads"])
            params.update(r[name]["params"])
        predicted = [sum(sent_bytes(s.cfg, d, i, batch=s.batch, seq=s.seq,
                                    microbatches=s.microbatches,
                                    sequence_parallel=sp).values()) for i in range(world_size)]
        rows.append({"case": name, "world_size": world_size, "degrees": dict(cases[name][0]),
                     "sequence_parallel": sp,
                     "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"],
                                                                 strict=True)),
                     "grad_diff": _max_diff(grads, ref["grads"]),
                     "param_diff": _max_diff(params, ref["params"]),
                     "sent_bytes": [r[name]["sent"] for r in per_rank],
                     "predicted_bytes": predicted})
    return rows
