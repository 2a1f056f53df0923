"""What the tests of the book's transformer share (tests/models/test_transformer.py,
tests/models/test_attention.py): the debug preset built and initialised with a seed, and random
tokens for it."""

import torch

from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer

SEED = 0
DEBUG = TransformerConfig()


def build(seed: int = SEED, dtype: torch.dtype = torch.float32, **overrides) -> Transformer:
    model = Transformer(TransformerConfig.preset("debug", **overrides))
    model.init_weights(seed=seed)
    return model.to(dtype)


def random_tokens(cfg: TransformerConfig, batch: int, seq: int, seed: int = SEED) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=generator)
