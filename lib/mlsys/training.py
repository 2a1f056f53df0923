"""A plain next-token training step for the book's model, and the bytes of what training keeps.

`make_train_step` returns a no-argument callable that runs one step (forward, cross-entropy loss,
backward, optimizer step) and returns the loss: the shape `mlsys.bench.benchmark` times.
`training_state_bytes` adds up the tensors training holds per parameter (weights, gradients,
optimizer state), to check `mlsys.accounting.memory`. Used in: §sec-tensors-memory, §sec-flops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor, nn

from mlsys import checks
from mlsys.dtypes import torch_dtype

AUTOCAST_DTYPES = ("bf16", "fp16")
"""Dtypes `make_train_step` can autocast matmuls to (torch dtypes from `mlsys.dtypes`)."""


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def _check_optimizer(optimizer: object) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")


def _check_batch(tokens: object) -> None:
    """A (batch, seq + 1) integer tensor: inputs tokens[:, :-1], targets tokens[:, 1:]."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        what = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise TypeError(f"tokens must be an integer tensor (torch.int64 or int32), got {what}")
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must have shape (batch, seq + 1) with batch, seq >= 1, "
                         f"got {tuple(tokens.shape)}")


def next_token_loss(model: nn.Module, tokens: Int[Tensor, "batch seq_plus_1"]) -> Tensor:
    """Cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1] (the loss computed in fp32)."""
    _check_model(model)
    _check_batch(tokens)
    logits = model(tokens[:, :-1])  # (batch, seq, vocab)
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: Int[Tensor, "batch seq_plus_1"],
    *,
    autocast_dtype: str | None = None,
) -> Callable[[], Tensor]:
    """One training step on `tokens` as a no-argument callable: forward, backward, update; it
    returns the loss as a detached 0-d tensor (not a float, so the step does not wait for the
    device).

    `autocast_dtype="bf16"` (or "fp16") runs the forward under `torch.autocast` on the tokens'
    device; None trains in the parameters' own dtype. Arguments are checked here, before any step.
    """
    _check_model(model)
    _check_optimizer(optimizer)
    _check_batch(tokens)
    checks.choice(autocast_dtype, "autocast_dtype", (None, *AUTOCAST_DTYPES))
    config = getattr(model, "config", None)
    if config is not None:  # the book's models: every id in range, checked once for every step
        from mlsys.models.transformer import check_tokens

        check_tokens(tokens[:, :-1], config)  # the inputs
        check_tokens(tokens[:, 1:], config)  # the targets
    device_type = tokens.device.type
    low = torch_dtype(autocast_dtype or "bf16")

    def step() -> Tensor:
        with torch.autocast(device_type=device_type, dtype=low, enabled=autocast_dtype is not None):
            loss = next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def state_after_one_step(
    cfg,
    *,
    dtype: torch.dtype = torch.float32,
    batch: int,
    seq: int,
    seed: int,
    device: str | None = None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh `Transformer(cfg)` in `dtype` and its AdamW after one step on random tokens, so
    every piece of training state (gradients, both moments, the step counters) exists."""
    from mlsys import env
    from mlsys.models.transformer import Transformer

    checks.positive_ints(batch=batch, seq=seq)
    checks.nonnegative_int(seed, "seed")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    device = device or env.device()
    model = Transformer(cfg).to(device=device, dtype=dtype)
    model.init_weights(seed=seed)
    optimizer = torch.optim.AdamW(model.parameters())
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg.vocab_size, (batch, seq + 1), generator=generator).to(device)
    next_token_loss(model, tokens).backward()
    optimizer.step()
    return model, optimizer


def training_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the tensors training keeps, by kind: weights, grads, optimizer (per-parameter
    moments) and step counters (state smaller than its parameter, such as AdamW's scalar `step`)."""
    _check_model(model)
    _check_optimizer(optimizer)
    out = {"weights": 0, "grads": 0, "optimizer": 0, "step counters": 0}
    for p in model.parameters():
        out["weights"] += p.numel() * p.element_size()
        if p.grad is not None:
            out["grads"] += p.grad.numel() * p.grad.element_size()
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, Tensor):
                kind = "optimizer" if value.shape == p.shape else "step counters"
                out[kind] += value.numel() * value.element_size()
    return out
