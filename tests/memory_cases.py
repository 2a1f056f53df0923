"""What the tests of the memory timeline and the memory meter share
(tests/profiling/test_memory_timeline.py, test_memory_meter.py): the debug model's second training
step metered phase by phase, and a hand-made list of allocation events."""

import torch

from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import memory_meter
from mlsys.training import next_token_loss

BATCH, SEQ = 4, 64  # the logits (1 MB) outweigh the gradients (0.9 MB)


def metered_step():
    """The debug model's second training step (AdamW's state exists), metered phase by phase."""
    cfg = TransformerConfig.preset("debug")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(cfg.vocab_size, (BATCH, SEQ + 1),
                           generator=torch.Generator().manual_seed(0))
    meter = memory_meter.meter("cpu", model=model)
    for step in (1, 2):
        with meter.recording():
            with meter.phase("forward", step=step):
                loss = next_token_loss(model, tokens)
            with meter.phase("backward", step=step):
                loss.backward()
                del loss
            with meter.phase("optimizer", step=step):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return cfg, meter


def hand_made_events():
    """(t_ns, bytes, address, label): a 100-byte block freed, a 50-byte one kept, and the free of
    a block older than the recording."""
    return [(10, 100, 0xA, "x"), (20, 50, 0xB, "y"), (30, -100, 0xA, ""), (40, -8, 0xC, "")]
