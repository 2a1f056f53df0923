"""The mixed-precision chapter's live runs on the book's debug model: each cheap enough for a CPU.

- `gradient_underflow`: the real gradients of one batch computed by an fp16 backward (fp16 weights
  and activations) against an fp32 backward, tensor by tensor, for several loss scales: how many
  entries flush to zero, how many are subnormal, how many overflow, and the median relative error.
- `trace_loss_scale`: the hand-written fp16 recipe (fp16 weights, fp32 master, dynamic scaler)
  for a few steps from a scale far too large: back-offs, skipped steps, then growth.
- `amp_agreement`: PyTorch's autocast + `torch.amp.GradScaler` beside the same step with the
  book's scaler (identical, bit for bit) and beside hand-written fp16 copies with an fp32 master
  (close, not identical: every op runs in fp16 there, autocast keeps some in fp32).
- `stagnation`: AdamW with bf16-stored weights for N steps under each rounding of
  `mlsys.numerics.weight_updates` (nearest, master, Kahan, stochastic) against fp32: loss curves and
  how many weights moved.
- `fp8_linear_errors`: one linear layer's real input, weight and output gradient (from an fp32
  forward and backward of the model) through `mlsys.numerics.fp8.Fp8Linear`, against fp32.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mlsys import checks
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.numerics import fp8
from mlsys.numerics.loss_scaling import DynamicLossScaler, underflow
from mlsys.numerics.weight_updates import ROUNDINGS, RoundedAdamW
from mlsys.training import make_policy_step, make_train_step, next_token_loss, policy


def _model_and_batch(cfg: TransformerConfig, batch: int, seq: int,
                     seed: int) -> tuple[Transformer, torch.Tensor]:
    checks.positive_ints(batch=batch, seq=seq)
    checks.nonnegative_int(seed, "seed")
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
    model = Transformer(cfg)
    model.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    return model, torch.randint(cfg.vocab_size, (batch, seq + 1), generator=gen)


def gradient_underflow(cfg: TransformerConfig | None = None, *, batch: int = 8, seq: int = 64,
                       scales: Sequence[float] = (1.0, 2.0**8, 2.0**16), fmt: str = "fp16",
                       seed: int = 0) -> list[dict[str, Any]]:
    """One row per (scale, parameter): `mlsys.numerics.loss_scaling.underflow` of the gradient that
    a backward in `fmt` (weights and activations cast to it) computes for the loss times `scale`,
    against the fp32 backward's gradient of the same batch. Entries whose fp32 gradient is 0
    (embedding rows of tokens not in the batch) are left out."""
    cfg = cfg or TransformerConfig()
    model, tokens = _model_and_batch(cfg, batch, seq, seed)
    next_token_loss(model, tokens).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    low = Transformer(cfg)
    low.load_state_dict(model.state_dict())
    low.to(dtype=torch.float16 if fmt == "fp16" else torch.bfloat16)
    rows = []
    for scale in scales:
        checks.positive(scale, "scales[i]")
        low.zero_grad(set_to_none=True)
        (next_token_loss(low, tokens) * scale).backward()
        for name, p in low.named_parameters():
            u = underflow(reference[name], p.grad, fmt, scale=scale)
            rows.append({"scale": scale, "parameter": name, "layer": name.rsplit(".", 1)[0],
                         "numel": u.numel,
                         "flushed": u.flushed, "subnormal": u.subnormal,
                         "overflowed": u.overflowed, "median_rel_error": u.median_rel_error})
    return rows


def trace_loss_scale(cfg: TransformerConfig | None = None, *, steps: int = 12,
                     init_scale: float = 2.0**24, growth_interval: int = 3, lr: float = 1e-3,
                     batch: int = 2, seq: int = 16, low: str = "fp16",
                     seed: int = 0) -> list[dict[str, Any]]:
    """Per step of the hand-written recipe `policy("bf16_mixed_adamw", low=low,
    loss_scale="dynamic")`: the scale used, whether the gradients were finite, the action (skip
    and back off, grow, keep) and the loss."""
    checks.positive_int(steps, "steps")
    model, tokens = _model_and_batch(cfg or TransformerConfig(), batch, seq, seed)
    scaler = DynamicLossScaler(init_scale, growth_interval=growth_interval)
    step = make_policy_step(model, tokens, policy("bf16_mixed_adamw", low=low,
                                                  loss_scale="dynamic"), lr=lr, scaler=scaler)
    losses = [float(step()) for _ in range(steps)]
    return [{"step": e.step, "scale": e.scale, "finite": e.finite, "action": e.action,
             "loss": loss} for e, loss in zip(scaler.history, losses, strict=True)]


def amp_agreement(cfg: TransformerConfig | None = None, *, steps: int = 6,
                  init_scale: float = 2.0**24, growth_interval: int = 2, lr: float = 1e-3,
                  batch: int = 2, seq: int = 16, low: str = "fp16",
                  seed: int = 0) -> list[dict[str, Any]]:
    """Per step, three runs from the same weights and batch, all scaling the loss dynamically from
    `init_scale`: "torch" (fp32 weights, torch.autocast to `low`, torch.amp.GradScaler, AdamW),
    "book scaler" (the same with `DynamicLossScaler`, through `make_policy_step`) and
    "hand-written" (`low` weights, fp32 master, `DynamicLossScaler`). Each row: the run, the
    step, the scale it used, whether it skipped the update, its loss, and the largest difference
    of its fp32 weights (the master copy, for "hand-written") from "torch"'s after the step."""
    cfg = cfg or TransformerConfig()
    checks.positive_int(steps, "steps")
    runs: dict[str, Any] = {}
    models = {}
    for name in ("torch", "book scaler", "hand-written"):
        model, tokens = _model_and_batch(cfg, batch, seq, seed)
        models[name] = model
        if name == "torch":
            scaler = torch.amp.GradScaler("cpu" if tokens.device.type == "cpu" else "cuda",
                                          init_scale=init_scale, growth_interval=growth_interval)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            run = make_train_step(model, optimizer, tokens, autocast_dtype=low, grad_scaler=scaler)
            runs[name] = (run, scaler)
        else:
            chosen = (policy("fp32_adamw", autocast=low, loss_scale="dynamic")
                      if name == "book scaler"
                      else policy("bf16_mixed_adamw", low=low, loss_scale="dynamic"))
            ours = DynamicLossScaler(init_scale, growth_interval=growth_interval)
            runs[name] = (make_policy_step(model, tokens, chosen, lr=lr, scaler=ours), ours)
    rows = []
    for step in range(1, steps + 1):
        for name, (run, scaler) in runs.items():
            scale = scaler.get_scale() if name == "torch" else scaler.scale
            loss = float(run())
            skipped = (scaler.get_scale() < scale if name == "torch"
                       else not scaler.history[-1].finite)
            weights = run.master if name == "hand-written" else list(models[name].parameters())
            with torch.no_grad():
                diff = max(float((w.float() - q).abs().max()) for w, q in
                           zip(weights, models["torch"].parameters(), strict=True))
            rows.append({"run": name, "step": step, "scale": scale, "skipped": skipped,
                         "loss": loss, "max_weight_diff": diff})
    return rows


def stagnation(cfg: TransformerConfig | None = None, *, roundings: Sequence[str] = ROUNDINGS,
               steps: int = 40, lr: float = 1e-5, batch: int = 2, seq: int = 16,
               seed: int = 0) -> dict[str, dict[str, Any]]:
    """AdamW (`RoundedAdamW`) for `steps` steps on one fixed batch, per rounding: the weights
    start as the same bf16 values (fp32 for "none" too, so all start alike), the forward and
    backward run in fp32, and only how each update is stored differs. Returns, per rounding, the
    loss before each step, the fraction of weight entries that ever changed (among those with a
    gradient) and the extra optimizer bytes per parameter."""
    cfg = cfg or TransformerConfig()
    checks.positive_int(steps, "steps")
    for i, r in enumerate(roundings):
        checks.choice(r, f"roundings[{i}]", ROUNDINGS)
    out = {}
    for rounding in roundings:
        model, tokens = _model_and_batch(cfg, batch, seq, seed)
        with torch.no_grad():
            for p in model.parameters():  # bf16 values in fp32 storage, for every run alike
                p.copy_(p.to(torch.bfloat16))
        start = [p.detach().clone() for p in model.parameters()]
        gen = torch.Generator().manual_seed(seed)
        optimizer = RoundedAdamW(model.parameters(), lr=lr, rounding=rounding,
                                 generator=gen if rounding == "stochastic" else None)
        losses, touched = [], [torch.zeros_like(p, dtype=torch.bool) for p in start]
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = next_token_loss(model, tokens)
            losses.append(float(loss.detach()))
            loss.backward()
            for t, p in zip(touched, model.parameters(), strict=True):
                t |= p.grad != 0
            optimizer.step()
        changed = sum(int(((p != s) & t).sum()) for p, s, t in
                      zip(model.parameters(), start, touched, strict=True))
        with torch.no_grad():
            final = float(next_token_loss(model, tokens))
        out[rounding] = {"losses": losses, "final_loss": final,
                         "changed_fraction": changed / sum(int(t.sum()) for t in touched),
                         "extra_bytes_per_param": optimizer.extra_bytes_per_param()}
    return out


def fp8_linear_errors(cfg: TransformerConfig | None = None, *, layer: str = "blocks.0.ffn.w1",
                     scalings: Sequence[str] = ("current", "delayed", "none"), batch: int = 4,
                     seq: int = 32, seed: int = 0) -> list[dict[str, Any]]:
    """Per scaling: the relative error (Frobenius, against fp32) of the output, the input
    gradient and the weight gradient of `layer` (an `nn.Linear`) when its matmuls run in fp8
    (`fp8.Fp8Linear`: E4M3 forward, E5M2 gradients), on the tensors the fp32 model really sees
    there, and the fraction of the output gradient's non-zero entries that E5M2 flushes to 0.
    "delayed" has seen the same tensors once before (its history holds their amax)."""
    model, tokens = _model_and_batch(cfg or TransformerConfig(), batch, seq, seed)
    target = model.get_submodule(layer)
    if not isinstance(target, torch.nn.Linear) or target.bias is not None:
        raise ValueError(f"layer={layer!r} must name an nn.Linear without bias")
    seen: dict[str, torch.Tensor] = {}

    def capture(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        seen["x"] = args[0].detach()
        out.register_hook(lambda g: seen.__setitem__("g", g.detach()))

    handle = target.register_forward_hook(capture)
    next_token_loss(model, tokens).backward()
    handle.remove()
    x, g, w = seen["x"].flatten(0, -2), seen["g"].flatten(0, -2), target.weight.detach()
    exact = {"output": x @ w.t(), "input grad": g @ w, "weight grad": g.t() @ x}
    rows = []
    for scaling in scalings:
        lin = fp8.Fp8Linear(w, scaling=scaling)
        if scaling == "delayed":  # one earlier step of the same tensors fills the history
            xx = x.clone().requires_grad_()
            lin(xx).backward(g)
            lin.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        y = lin(xx)
        y.backward(g)
        got = {"output": y, "input grad": xx.grad, "weight grad": lin.weight.grad}
        g_scale = 1.0 if scaling == "none" else fp8.scale_for(float(g.abs().max()),
                                                                 fp8.BACKWARD_FORMAT)
        flushed = fp8.roundtrip(g, fp8.BACKWARD_FORMAT, g_scale).flushed
        rows += [{"layer": layer, "scaling": scaling, "tensor": k,
                  "rel_error": fp8.relative_error(got[k], exact[k]),
                  "amax": float(exact[k].abs().max()), "grad_flushed": flushed}
                 for k in exact]
    return rows
