"""The one harness every parallel check runs: the library's (`check`) and the tests' alike.

A tiny copy of the book's model (`TINY`) and its data (`Setup.tokens`: the same global batch on
every rank), one process training it on the whole batch (`one_process`: the reference), and the
loop a rank runs (`train`): `Setup.steps` AdamW steps, the first step's bytes sent and collective
calls counted (`comms.count_bytes`), the first step's gradients and the final weights gathered
whole, by their names in the model. `combine` puts the ranks' results of one case together (the
losses of the last pipeline stage, every stage's tensors), `max_diff` measures them against the
reference, and `on_ranks` runs a function on fresh CPU ranks (gloo, `launch.start`).
Used by `mlsys.distributed.check` (chapter 09) and tests/test_{fsdp,tp,pp,cp,mesh}.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mlsys import checks
from mlsys.accounting.parallel import ParallelDims
from mlsys.distributed import comms, launch
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer

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

    def tokens(self, step: int) -> Tensor:
        """The global batch of `step`: (batch, seq + 1) token ids, the same on every rank."""
        gen = torch.Generator().manual_seed(1_000 + step)
        return torch.randint(self.cfg.vocab_size, (self.batch, self.seq + 1), generator=gen)

    def model(self) -> Transformer:
        """A fresh model, the same weights on every rank (seeded)."""
        torch.manual_seed(self.seed)
        return Transformer(self.cfg)

    def optimizer(self, params: Iterable[Tensor]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr)


def loss_of(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy in fp32: logits (batch, seq, vocab), targets (batch, seq)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def train(setup: Setup, params: Iterable[Tensor], step: Callable[[int], float | None],
          full: Callable[[bool], dict[str, Tensor]]) -> dict[str, Any]:
    """`setup.steps` AdamW steps over `params`. `step(i)` runs the forward and backward of step i
    and returns its loss (None on a rank that computes none); `full(grads)` gives the whole
    model's gradients (True) or weights (False) by name. Returns the losses, the first step's
    bytes sent and collective calls, its gradients, and the final weights."""
    opt = setup.optimizer(params)
    out: dict[str, Any] = {"losses": []}
    for i in range(setup.steps):
        with comms.count_bytes() as count:
            loss = step(i)
        out["losses"].append(loss)
        if i == 0:
            out["sent"], out["calls"] = count.sent_bytes, dict(count.calls)
            out["grads"] = full(True)
        opt.step()
        opt.zero_grad()
    out["params"] = full(False)
    return out


def one_process(s: Setup) -> dict[str, Any]:
    """The reference: `train` in this process on the whole batch of every step."""
    model = s.model()

    def step(i: int) -> float:
        batch = s.tokens(i)
        loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        return loss.item()

    def full(grads: bool) -> dict[str, Tensor]:
        return {n: (p.grad if grads else p.detach()).clone() for n, p in model.named_parameters()}

    return train(s, model.parameters(), step, full)


def combine(per_rank: list[dict[str, Any]], dims: ParallelDims) -> dict[str, Any]:
    """One case's results from every rank as one model's: the loss of each step averaged over
    the ranks of the last pipeline stage, and every rank's gradients and weights by name (the
    stages' names together make the whole model)."""
    last = [r["losses"] for i, r in enumerate(per_rank) if dims.coords(i)["pp"] == dims.pp - 1]
    steps = len(last[0])
    out: dict[str, Any] = {"losses": [sum(r[k] for r in last) / len(last) for k in range(steps)],
                           "grads": {}, "params": {}}
    for r in per_rank:
        out["grads"].update(r["grads"])
        out["params"].update(r["params"])
    return out


def max_diff(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    """The largest absolute difference between tensors of the same names (fp32)."""
    if set(got) != set(want):
        raise RuntimeError(f"the ranks returned other tensors than one process: "
                           f"{sorted(set(got) ^ set(want))}")
    return max(float((got[n].float() - t).abs().max()) for n, t in want.items())


def on_ranks(fn: Callable[..., Any], world_size: int, *, args: tuple = (),
             timeout_s: float = 120) -> list[Any]:
    """`fn(rank, *args)` on `world_size` fresh gloo ranks (60 s to start, 30 s per collective,
    `timeout_s` for the call); every rank's value."""
    with launch.start(world_size, timeout_s=60, collective_timeout_s=30) as job:
        return job.run(fn, args=args, timeout_s=timeout_s)
