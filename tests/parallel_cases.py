"""What the parallelism tests share: a tiny model, its data, one process's training as the
reference, and the tolerances (defined once, per dtype).

Imported by the test files and by their ranks (the tests directory is on the ranks' path).
"""

import functools

import torch
import torch.nn.functional as F

from mlsys.models.transformer import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=64, context_length=16, d_model=16, n_layers=4, n_heads=4,
                        d_ff=24)
"""4 blocks (2 pipeline stages of 2), 4 heads and d_ff 24 (TP over 2 or 4), d_head 4."""
BATCH, SEQ, STEPS, LR = 8, 8, 2, 1e-3
TOL = {
    "fp32": {"rtol": 1e-5, "atol": 2e-6},  # reduction order only (sums split over ranks)
    "bf16": {"rtol": 0.05, "atol": 0.03},  # weights and activations rounded to 8 bits
}
"""Tolerances against one fp32 process, by the dtype the parallel run computes in. AdamW's update
~ lr * g / sqrt(g^2) can turn a last-bit difference in a tiny g (another reduction order) into a
difference of a good part of lr: at lr = 1e-2 one weight of this model moves 3.4e-6 apart under
any FSDP (ours and PyTorch's alike); at lr = 1e-3, 10x less. A real bug (a gradient summed
instead of averaged is caught by the gradients; a missing or wrong update) moves weights by ~lr."""


def build(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CFG)


def tokens(step: int, batch: int = BATCH) -> torch.Tensor:
    """The global batch of `step`: (batch, SEQ + 1) token ids."""
    return torch.randint(CFG.vocab_size, (batch, SEQ + 1),
                         generator=torch.Generator().manual_seed(1_000 + step))


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)


@functools.cache
def reference() -> dict:
    """One process on the whole batch: the loss of every step, the first step's gradients and
    the weights after STEPS AdamW steps, by parameter name."""
    model = build()
    opt = optimizer(model.parameters())
    out = {"losses": []}
    for step in range(STEPS):
        batch = tokens(step)
        loss = loss_of(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        out["losses"].append(loss.item())
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def assert_matches(got: dict, want: dict, dtype: str = "fp32", what: str = "") -> None:
    """Every tensor of `want` in `got`, equal within TOL[dtype]."""
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for name, tensor in want.items():
        torch.testing.assert_close(got[name].float(), tensor, **TOL[dtype],
                                   msg=lambda m, n=name: f"{what} {n}: {m}")
