"""What the tests of mlsys.train.checkpoint and .checkpoint_layout share (tests/train/
test_checkpoint.py, test_checkpoint_layout.py): the debug preset's model, AdamW, a training step
on a fixed batch (or a rank's part of it), and its weights and moments, whole, compared bitwise.

Imported by the test files and by their ranks (the tests directory is on the ranks' path).
"""

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from mlsys.models.transformer import Transformer, TransformerConfig

CFG = TransformerConfig.preset("debug")


def build(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CFG)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train_step(model, optimizer, step: int, rank: int = 0, world: int = 1) -> None:
    tokens = torch.randint(CFG.vocab_size, (4, 17), generator=torch.Generator().manual_seed(step))
    tokens = tokens.chunk(world)[rank]
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def weights_and_moments(model, optimizer) -> dict:
    """Every parameter and its AdamW state (exp_avg, exp_avg_sq, step), whole, by name."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = full(p)
        for key, value in optimizer.state[p].items():
            out[f"{name}/{key}"] = full(value)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def trained(seed: int = 0, steps: int = 2):
    model = build(seed)
    optimizer = adamw(model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
    for step in range(steps):
        train_step(model, optimizer, step)
        schedule.step()
    return model, optimizer, schedule
