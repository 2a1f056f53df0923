"""What the tests of mlsys.distributed.ddp and .zero share (tests/distributed/test_ddp.py,
test_zero.py): small models, their data and loss, and one process training on the whole batch.

The models cover a tied weight (one parameter used twice) and frozen parameters (a frozen weight
and a frozen bias). Imported by the test files and by their ranks (the tests directory is on the
ranks' path).
"""

import torch
import torch.nn.functional as F
from torch import nn

PER_RANK, STEPS, SMALL_BUCKET_MB = 4, 3, 0.0003  # 0.0003 MiB: buckets of a few tensors


class Tied(nn.Module):
    """An embedding whose weight is also the output layer's."""

    def __init__(self, vocab=11, width=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(self.embed(x))))


class Frozen(nn.Module):
    """Two layers with a frozen weight and a frozen bias."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(5, 7), nn.Linear(7, 3)
        self.first.weight.requires_grad_(False)
        self.second.bias.requires_grad_(False)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def mlp():
    return nn.Sequential(nn.Linear(5, 9), nn.ReLU(), nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 3))


MODELS = {"mlp": mlp, "tied": Tied, "frozen": Frozen}


def build(name, seed):
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(name, samples, step):
    g = torch.Generator().manual_seed(100 + step)
    if name == "tied":
        return torch.randint(11, (samples, 4), generator=g), torch.randint(11, (samples, 4),
                                                                           generator=g)
    return torch.randn(samples, 5, generator=g), torch.randn(samples, 3, generator=g)


def loss_of(name, out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten()) if name == "tied" else \
        F.mse_loss(out, y)


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def single_process(name, world, optimizer):
    """The reference: one process, the whole batch of every step."""
    model = build(name, 0)
    opt = optimizer(model.parameters())
    for step in range(STEPS):
        x, y = batch(name, PER_RANK * world, step)
        loss_of(name, model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def my_slice(rank, name, step):
    x, y = batch(name, PER_RANK * rank.world_size, step)
    return x.chunk(rank.world_size)[rank.rank], y.chunk(rank.world_size)[rank.rank]
