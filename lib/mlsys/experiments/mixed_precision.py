"""The mixed-precision chapter's live runs on the book's debug model: each cheap enough for a CPU.

- `gradient_underflow`: the real gradients of one batch computed by an fp16 backward (fp16 weights
  and activations) against an fp32 backward, tensor by tensor, for several loss scales: how many
  entries flush to zero, how many are subnormal, how many overflow, and the median relative error.
- `gradients`: the fp32 gradients of one batch, parameter by parameter (the histogram's data).
- `trace_loss_scale`: the hand-written fp16 recipe (fp16 weights, fp32 master, dynamic scaler)
  for hundreds of steps from a scale far too large: back-offs, skipped steps, then the sawtooth of
  growth and overflow, with the largest gradient the fp16 backward stored at each step.
- `gradscaler_scales`: the scale `torch.amp.GradScaler` uses at each step of a given sequence of
  finite and overflowing steps (the reference for the chapter's coding exercise).
- `amp_agreement`: PyTorch's autocast + `torch.amp.GradScaler` beside the same step with the
  book's scaler (identical, bit for bit) and beside hand-written fp16 copies with an fp32 master
  (close, not identical: every op runs in fp16 there, autocast keeps some in fp32).
- `stagnation`: AdamW with bf16-stored weights for N steps under each rounding of
  `mlsys.numerics.weight_updates` (nearest, master, Kahan, stochastic) against fp32: loss curves and
  how many weights moved.
- `fp8_linear_errors`: one linear layer's real input, weight and output gradient (from an fp32
  forward and backward of the model) through `mlsys.numerics.fp8.Fp8Linear`, against fp32.
- `norm_errors`: `norm_numerics.norm_errors` on the real inputs of the model's norms;
  `first_step_stalls`: the share of its initial bf16 weights AdamW's first step cannot move.
`sawtooth_summary` reads the trace; `underflow_table`, `norm_table`, `stagnation_table` and
`fp8_table` turn the rows into the chapter's tables; `STAGNATION_LABELS` names the runs of
`stagnation` in its figure. The module is longer than 300 lines because it is the one chapter's
runs with their tables, which share the model and batch they start from.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from mlsys import checks
from mlsys.book import Table
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.numerics import fp8, norm_numerics
from mlsys.numerics.loss_scaling import DynamicLossScaler, underflow
from mlsys.numerics.weight_updates import ROUNDINGS, RoundedAdamW, adam_first_step_stalls
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


def _fp32_backward(cfg: TransformerConfig, batch: int, seq: int,
                   seed: int) -> tuple[Transformer, torch.Tensor, dict[str, torch.Tensor]]:
    model, tokens = _model_and_batch(cfg, batch, seq, seed)
    next_token_loss(model, tokens).backward()
    return model, tokens, {n: p.grad.clone() for n, p in model.named_parameters()}


def gradients(cfg: TransformerConfig | None = None, *, batch: int = 8, seq: int = 64,
              seed: int = 0) -> dict[str, torch.Tensor]:
    """The fp32 gradient of every parameter for one batch of the freshly initialized model."""
    return _fp32_backward(cfg or TransformerConfig(), batch, seq, seed)[2]


def gradient_underflow(cfg: TransformerConfig | None = None, *, batch: int = 8, seq: int = 64,
                       scales: Sequence[float] = (1.0, 2.0**8, 2.0**16), fmt: str = "fp16",
                       seed: int = 0) -> list[dict[str, Any]]:
    """One row per (scale, parameter): `mlsys.numerics.loss_scaling.underflow` of the gradient that
    a backward in `fmt` (weights and activations cast to it) computes for the loss times `scale`,
    against the fp32 backward's gradient of the same batch. Entries whose fp32 gradient is 0
    (embedding rows of tokens not in the batch) are left out."""
    cfg = cfg or TransformerConfig()
    model, tokens, reference = _fp32_backward(cfg, batch, seq, seed)
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


def norm_errors(cfg: TransformerConfig | None = None, *, batch: int = 8, seq: int = 64,
                seed: int = 0) -> list[dict[str, Any]]:
    """`norm_numerics.norm_errors` over the rows of every norm's input, captured in a forward of
    one batch of the freshly initialized model."""
    model, tokens = _model_and_batch(cfg or TransformerConfig(), batch, seq, seed)
    inputs = norm_numerics.norm_inputs(model, tokens[:, :-1])
    return norm_numerics.norm_errors(torch.cat([t.flatten(0, -2) for t in inputs.values()]))


def first_step_stalls(cfg: TransformerConfig | None = None, *, lr: float, seed: int = 0) -> float:
    """`weight_updates.adam_first_step_stalls` of the model's initial weights rounded to bf16: the
    share that AdamW's first step (a move of lr each) leaves unchanged."""
    model, _ = _model_and_batch(cfg or TransformerConfig(), 1, 1, seed)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return adam_first_step_stalls(weights.to(torch.bfloat16).float(), lr)


def underflow_table(rows: list[dict[str, Any]]) -> Table:
    """Per loss scale of `gradient_underflow`'s rows: the shares of gradient entries flushed to 0,
    subnormal and overflowed (weighted by entries), and the worst tensor's median error."""
    out = []
    for scale in dict.fromkeys(r["scale"] for r in rows):
        mine = [r for r in rows if r["scale"] == scale]
        total = sum(r["numel"] for r in mine)
        out.append([f"{scale:g}", *(f"{sum(r[k] * r['numel'] for r in mine) / total:.3%}"
                                    for k in ("flushed", "subnormal", "overflowed")),
                    f"{max(r['median_rel_error'] for r in mine):.2%}"])
    return Table(["loss scale", "flushed to 0", "subnormal", "overflowed", "worst median error"],
                 out)


def trace_loss_scale(cfg: TransformerConfig | None = None, *, steps: int = 12,
                     init_scale: float = 2.0**24, growth_interval: int = 3, lr: float = 1e-3,
                     batch: int = 2, seq: int = 16, low: str = "fp16",
                     seed: int = 0) -> list[dict[str, Any]]:
    """Per step of the hand-written recipe `policy("bf16_mixed_adamw", low=low,
    loss_scale="dynamic")` on one fixed batch: the scale used, whether the gradients were finite,
    the action (skip and back off, grow, keep), the loss, and `grad_amax`, the largest |gradient|
    the `low` backward stored (still multiplied by the scale; inf or NaN where it overflowed)."""
    checks.positive_int(steps, "steps")
    model, tokens = _model_and_batch(cfg or TransformerConfig(), batch, seq, seed)
    scaler = DynamicLossScaler(init_scale, growth_interval=growth_interval)
    step = make_policy_step(model, tokens, policy("bf16_mixed_adamw", low=low,
                                                  loss_scale="dynamic"), lr=lr, scaler=scaler)
    losses, amax = [], []
    for _ in range(steps):
        losses.append(float(step()))
        with torch.no_grad():  # the low-precision gradients stay, scaled, until the next step
            amax.append(max(float(p.grad.abs().max()) for p in step.params))
    return [{"step": e.step, "scale": e.scale, "finite": e.finite, "action": e.action,
             "loss": loss, "grad_amax": a}
            for e, loss, a in zip(scaler.history, losses, amax, strict=True)]


SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_text(x: float) -> str:
    """`x` as "2¹⁹" (superscript digits, for prose) when it is a power of two, else as "%g"."""
    k = math.log2(checks.positive(x, "x"))
    return f"2{str(int(k)).translate(SUPERSCRIPTS)}" if k == int(k) else f"{x:g}"


def sawtooth_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """From `trace_loss_scale`'s rows: the overflowing steps before the first finite one
    ("settling"), log2 of the scale there ("settled") and at the last step ("final"), the steps
    skipped after settling ("skips") and their share of those steps in % ("skip_rate"); the
    scales as text ("2¹⁹", `power_text`)."""
    first = next((i for i, r in enumerate(rows) if r["finite"]), None)
    if first is None:
        raise ValueError("no step of the trace had finite gradients: start from a lower scale")
    skips = sum(not r["finite"] for r in rows[first:])
    return {"settling": first, "settled": power_text(rows[first]["scale"]),
            "final": power_text(rows[-1]["scale"]), "skips": skips,
            "skip_rate": 100 * skips / len(rows[first:])}


def gradscaler_scales(finite: Sequence[bool], *, init_scale: float = 2.0**16,
                      growth_interval: int = 2_000) -> list[float]:
    """The scale `torch.amp.GradScaler` (torch's defaults but `init_scale` and `growth_interval`)
    multiplies the loss by at each step, when step i's gradients are finite exactly where
    `finite[i]` is True (one parameter whose gradient is set to 1 or inf, on the CPU)."""
    checks.positive(init_scale, "init_scale")
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    used = []
    for i, ok in enumerate(finite):
        if not isinstance(ok, bool):
            raise TypeError(f"finite[{i}] must be a bool, got {ok!r}")
        scaler.scale(w.sum()).backward()
        used.append(scaler.get_scale())
        w.grad.fill_(1.0 if ok else math.inf)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return used


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


STAGNATION_LABELS = {"none": "fp32 weights", "nearest": "bf16, nearest", "master":
                     "bf16 + fp32 master", "kahan": "bf16 + Kahan", "stochastic":
                     "bf16, stochastic"}
"""How the figure names each rounding of `stagnation`."""


def stagnation_table(out: dict[str, dict[str, Any]]) -> Table:
    """Per rounding of `stagnation`: the loss drop, it against fp32's, the share of weights that
    ever moved, and the extra optimizer bytes per parameter."""
    drop = {k: v["losses"][0] - v["final_loss"] for k, v in out.items()}
    return Table(["stored as", "loss drop", "vs fp32's", "weights that ever moved",
                  "extra bytes/param"],
                 [[STAGNATION_LABELS.get(k, k), f"{drop[k]:.4f}", f"{drop[k] / drop['none']:.2f}",
                   f"{v['changed_fraction']:.1%}", v["extra_bytes_per_param"]]
                  for k, v in out.items()])


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


def fp8_table(rows: list[dict[str, Any]]) -> Table:
    """`fp8_linear_errors`'s rows: per scaling and tensor, the error, amax and flushed share."""
    return Table(["scaling", "tensor", "error vs fp32", "largest |value|",
                  "gradient entries flushed"],
                 [[r["scaling"], r["tensor"], f"{r['rel_error']:.2%}", f"{r['amax']:.3g}",
                   f"{r['grad_flushed']:.1%}"] for r in rows])


def norm_table(rows: list[dict[str, Any]]) -> Table:
    """`mlsys.numerics.norm_numerics.norm_errors`'s rows: per dtype and summation, the median and
    largest error of 1/rms, the rows whose sum of squares overflowed, the squares flushed to 0."""
    return Table(["dtype", "summed", "median error of 1/rms", "max error", "rows overflowed",
                  "squares flushed to 0"],
                 [[r["dtype"], r["accumulate"], f"{r['median_rel_error']:.2%}",
                   f"{r['max_rel_error']:.2%}", f"{r['overflowed_rows']:.1%}",
                   f"{r['squares_flushed']:.2%}"] for r in rows])
