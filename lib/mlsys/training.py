"""A next-token training step for the book's model, under an explicit precision policy.

`make_train_step` returns a no-argument callable that runs one step (forward, cross-entropy loss,
backward, optimizer step) and returns the loss: the shape `mlsys.bench.benchmark` times; it can
autocast and use `torch.amp.GradScaler`, PyTorch's own mixed precision. `make_policy_step` runs the
same step under a `PrecisionPolicy`: which dtype the weights, the matmuls, the gradients, a master
copy and the optimizer state are held in, and whether the loss is scaled. Policies are named like
the recipes of `mlsys.accounting.memory` (`POLICIES`, `policy(name)`), and each checks that it holds
exactly its recipe's bytes per parameter: one name gives the napkin bytes and the runnable step.
The master-weight policies are mixed precision written by hand (Micikevicius et al., 2018): low-
precision weights the forward and backward read, an fp32 copy the optimizer updates, and with
`loss_scale="dynamic"` the scaler of `mlsys.numerics.loss_scaling`. `training_state_bytes` adds
up the tensors training holds per parameter. Used in: §sec-tensors-memory, §sec-flops,
§sec-mixed-precision.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor, nn

from mlsys import checks, env
from mlsys.dtypes import torch_dtype
from mlsys.models.transformer import Transformer, check_tokens
from mlsys.numerics.loss_scaling import DynamicLossScaler
from mlsys.policies import AUTOCAST_DTYPES, POLICIES, PrecisionPolicy, policy

__all__ = [
    "AUTOCAST_DTYPES", "POLICIES", "PolicyStep", "PrecisionPolicy", "make_policy_step",
    "make_train_step", "next_token_loss", "policy", "state_after_one_step", "training_state_bytes",
]  # fmt: skip


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
    grad_scaler: torch.amp.GradScaler | None = None,
) -> Callable[[], Tensor]:
    """One training step on `tokens` as a no-argument callable: forward, backward, update; it
    returns the loss as a detached 0-d tensor (not a float, so the step does not wait for the
    device).

    `autocast_dtype="bf16"` (or "fp16") runs the forward under `torch.autocast` on the tokens'
    device; None trains in the parameters' own dtype. `grad_scaler` (a `torch.amp.GradScaler`)
    scales the loss, skips steps whose gradients overflow and adapts its scale: PyTorch's own
    loss scaling, the reference for `make_policy_step`'s. Arguments are checked here, before any
    step.
    """
    _check_model(model)
    _check_optimizer(optimizer)
    _check_batch(tokens)
    checks.choice(autocast_dtype, "autocast_dtype", (None, *AUTOCAST_DTYPES))
    if grad_scaler is not None and not isinstance(grad_scaler, torch.amp.GradScaler):
        raise TypeError(f"grad_scaler must be a torch.amp.GradScaler or None, "
                        f"got {type(grad_scaler).__name__}")
    config = getattr(model, "config", None)
    if config is not None:  # the book's models: every id in range, checked once for every step
        check_tokens(tokens[:, :-1], config)  # the inputs
        check_tokens(tokens[:, 1:], config)  # the targets
    device_type = tokens.device.type
    low = torch_dtype(autocast_dtype or "bf16")

    def step() -> Tensor:
        with torch.autocast(device_type=device_type, dtype=low, enabled=autocast_dtype is not None):
            loss = next_token_loss(model, tokens)
        if grad_scaler is None:
            loss.backward()
            optimizer.step()
        else:
            grad_scaler.scale(loss).backward()
            grad_scaler.step(optimizer)  # unscales; skipped if any gradient is inf or NaN
            grad_scaler.update()
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


# --- the step under a precision policy ------------------------------------------------------------


class PolicyStep:
    """One training step under a `PrecisionPolicy`, called with no argument (or new tokens); made
    by `make_policy_step`. Gradients are cleared at the start of the next step, so between steps
    every piece of training state exists: `state_bytes()` reads them. Where the policy keeps
    low-precision gradients beside an fp32 master, their fp32 copies exist only during the update
    (4 transient bytes per parameter; fp32-gradient policies accumulate into the master's
    gradients as each one is computed, through a post-accumulate-grad hook)."""

    def __init__(self, model: nn.Module, tokens: Tensor, chosen: PrecisionPolicy, *, lr: float,
                 weight_decay: float, scaler: DynamicLossScaler | None) -> None:
        self.model, self.tokens, self.policy, self.scaler = model, tokens, chosen, scaler
        self.device_type = tokens.device.type
        self.master: list[Tensor] = []
        if chosen.master_dtype is not None:  # an fp32 copy per weight, taken before any rounding
            self.master = [p.detach().to(torch.float32, copy=True)
                           for p in model.parameters() if p.requires_grad]
        model.to(dtype=torch_dtype(chosen.param_dtype))  # in place, floating buffers included
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._hooks = []
        if chosen.master_dtype is not None and chosen.grad_dtype == chosen.master_dtype:
            self._hooks = [p.register_post_accumulate_grad_hook(self._accumulate(m))
                           for p, m in zip(self.params, self.master, strict=True)]
        updated = self.master or self.params
        if chosen.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(updated, lr=lr, weight_decay=weight_decay)
        else:
            momentum = 0.9 if chosen.optimizer == "sgd_momentum" else 0.0
            self.optimizer = torch.optim.SGD(updated, lr=lr, momentum=momentum,
                                             weight_decay=weight_decay)
        self.skipped: list[bool] = []

    @staticmethod
    def _accumulate(master: Tensor) -> Callable[[Tensor], None]:
        """Hook: add the low-precision gradient just computed into the fp32 one, and free it."""
        def hook(p: Tensor) -> None:
            if master.grad is None:
                master.grad = p.grad.to(torch.float32)
            else:
                master.grad.add_(p.grad)
            p.grad = None
        return hook

    def _zero_grad(self) -> None:
        for t in (*self.params, *self.master):
            t.grad = None

    def __call__(self, tokens: Tensor | None = None) -> Tensor:
        """One step on `tokens` (default: the batch given at construction); returns the loss."""
        if tokens is None:
            tokens = self.tokens
        else:
            _check_batch(tokens)
        self._zero_grad()
        compute = torch_dtype(self.policy.compute_dtype)
        with torch.autocast(self.device_type, dtype=compute, enabled=self.policy.autocast):
            loss = next_token_loss(self.model, tokens)
        (loss if self.scaler is None else self.scaler.scale_loss(loss)).backward()
        to_master = bool(self.master) and self.policy.grad_dtype != self.policy.master_dtype
        if to_master:  # low-precision gradients, read by the update in fp32 (a transient copy)
            for p, m in zip(self.params, self.master, strict=True):
                m.grad = None if p.grad is None else p.grad.to(torch.float32)
        finite = True
        if self.scaler is not None:
            finite = self.scaler.unscale_([t.grad for t in (self.master or self.params)])
            self.scaler.update(finite)
        if finite:
            self.optimizer.step()
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=False):
                    p.copy_(m)  # the new weights, rounded once to the policy's dtype
        if to_master:
            for m in self.master:
                m.grad = None
        self.skipped.append(not finite)
        return loss.detach()

    def state_bytes(self) -> dict[str, int]:
        """Bytes held, by kind: weights, grads, master, optimizer (per-parameter state), step
        counters (smaller state, such as AdamW's scalar `step`); each storage counted once."""
        seen: set[int] = set()

        def nbytes(t: Tensor | None) -> int:
            if t is None or t.untyped_storage()._cdata in seen:
                return 0
            seen.add(t.untyped_storage()._cdata)
            return t.untyped_storage().nbytes()

        out = {"weights": sum(nbytes(p) for p in self.params),
               "grads": sum(nbytes(t.grad) for t in (*self.params, *self.master)),
               "master": sum(nbytes(m) for m in self.master), "optimizer": 0, "step counters": 0}
        for t in self.master or self.params:
            for value in self.optimizer.state.get(t, {}).values():
                if isinstance(value, Tensor):
                    out["optimizer" if value.shape == t.shape else "step counters"] += nbytes(value)
        return out


def make_policy_step(
    model: nn.Module,
    tokens: Int[Tensor, "batch seq_plus_1"],
    chosen: str | PrecisionPolicy,
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    scaler: DynamicLossScaler | None = None,
) -> PolicyStep:
    """A training step of `model` on `tokens` under the policy `chosen` (a name of `POLICIES` or
    a `PrecisionPolicy`): casts the model's weights to the policy's dtype in place, makes the
    master copy and the optimizer (AdamW or SGD, `lr`, `weight_decay`), and returns the step.

    With `loss_scale="dynamic"` the step uses `scaler` (default: a `DynamicLossScaler()`, torch's
    defaults). Arguments are checked here, before anything is cast.
    """
    _check_model(model)
    _check_batch(tokens)
    chosen = policy(chosen)
    checks.positive(lr, "lr")
    checks.nonnegative(weight_decay, "weight_decay")
    if scaler is not None and not isinstance(scaler, DynamicLossScaler):
        raise TypeError(f"scaler must be a DynamicLossScaler or None, got {type(scaler).__name__}")
    if scaler is not None and chosen.loss_scale == "none":
        raise ValueError(f"scaler given but policy {chosen.label!r} does not scale its loss "
                         "(use policy(..., loss_scale='dynamic'))")
    if chosen.loss_scale == "dynamic" and scaler is None:
        scaler = DynamicLossScaler()
    devices = {p.device for p in model.parameters()}
    if devices != {tokens.device}:
        raise ValueError(f"the model's parameters are on {sorted(map(str, devices))} but the "
                         f"tokens on {tokens.device}: move them to one device first")
    config = getattr(model, "config", None)
    if config is not None:
        check_tokens(tokens[:, :-1], config)
        check_tokens(tokens[:, 1:], config)
    return PolicyStep(model, tokens, chosen, lr=lr, weight_decay=weight_decay, scaler=scaler)
