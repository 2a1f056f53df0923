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
  `first_step_stalls`: the share of its initial bf16 weights AdamW's first step cannot move;
  `first_overflow_rms`: the rms at which an fp16 mean square first comes out inf, written as a
  sum kept in fp16 and then divided (sqrt(65,504 / d)) or as torch's `x.pow(2).mean()`, which
  divides inside its fp32 accumulator (sqrt(65,504), whatever d).
- `tf32_matmul_errors`: a matmul with its inputs rounded as TF32 (`round_mantissa`, 10 bits),
  bf16 and fp16 read them, against float64; `tf32_defaults`: what torch does unless told.
- `fp8_amax_trace`: current against delayed scaling over steps whose input spikes once;
  `block_scaling_errors`: one power-of-two scale per tensor against one per block of 32 entries
  (`block_quantize`, MX's shared exponent) on an input with an outlier channel.
`sawtooth_summary` reads the trace and `agreement_summary` the agreement runs; the `*_table`
functions turn the rows into the chapter's tables and the `*_facts` functions into the numbers
its prose quotes; `STAGNATION_LABELS` names the runs of `stagnation` in its figure. The module is
longer than 300 lines because it is the one chapter's runs with their tables, which share the
model and batch they start from.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mlsys import checks, dtypes
from mlsys.book import Table
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.numerics import fp8, norm_numerics
from mlsys.numerics.loss_scaling import DynamicLossScaler, underflow
from mlsys.numerics.precision import FORMATS
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


def amp_agreement(cfg: TransformerConfig | None = None, *, steps: int = 10,
                  init_scale: float = 2.0**24, growth_interval: int = 2, lr: float = 1e-3,
                  batch: int = 2, seq: int = 16, low: str = "fp16",
                  seed: int = 0) -> list[dict[str, Any]]:
    """Per step, three runs from the same weights and batch, all scaling the loss dynamically from
    `init_scale`: "torch" (fp32 weights, torch.autocast to `low`, torch.amp.GradScaler, AdamW),
    "book scaler" (the same with `DynamicLossScaler`, through `make_policy_step`) and
    "hand-written" (`low` weights, fp32 master, `DynamicLossScaler`). Each row: the run, the
    step, the scale it used, whether it skipped the update, its loss, the updates it has taken,
    the largest difference of its fp32 weights (the master copy, for "hand-written") from
    "torch"'s after the same step, and `update_rel_diff`: how far its weights lie from torch's
    after the same number of updates, over how far torch's moved in them (||w - w_t|| / ||w_t -
    w_0||, Frobenius over every weight; None before the first update or while torch has taken
    fewer). A max difference says little (AdamW's first steps move every weight by about lr, so
    one update taken by one run and skipped by the other differs by lr everywhere); the relative
    distance after as many updates says how close two runs are."""
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

    def flat(name: str) -> torch.Tensor:
        run = runs[name][0]
        weights = run.master if name == "hand-written" else list(models[name].parameters())
        return torch.cat([w.detach().double().flatten() for w in weights])

    start = flat("torch")
    after = {0: start}  # torch's weights after n updates
    updates = dict.fromkeys(runs, 0)
    rows = []
    for step in range(1, steps + 1):
        for name, (run, scaler) in runs.items():
            scale = scaler.get_scale() if name == "torch" else scaler.scale
            loss = float(run())
            skipped = (scaler.get_scale() < scale if name == "torch"
                       else not scaler.history[-1].finite)
            updates[name] += not skipped
            mine = flat(name)
            if name == "torch":
                after[updates[name]] = mine
            ref = after.get(updates[name])
            moved = None if ref is None else float((ref - start).norm())
            rows.append({"run": name, "step": step, "scale": scale, "skipped": skipped,
                         "loss": loss, "updates": updates[name],
                         "max_weight_diff": float((mine - after[updates["torch"]]).abs().max()),
                         "update_rel_diff": float((mine - ref).norm()) / moved if moved else None})
    return rows


def agreement_summary(rows: list[dict[str, Any]], run: str = "hand-written") -> dict[str, Any]:
    """From `amp_agreement`'s rows, for `run` against "torch": the first scale at which `run`
    skipped a step that torch took ("sooner": None if never), the updates each took, the largest
    weight difference after the last step, and `update_rel_diff` after the most updates both
    took (None if `run` took none)."""
    mine = [r for r in rows if r["run"] == run]
    theirs = [r for r in rows if r["run"] == "torch"]
    if not mine or len(mine) != len(theirs):
        raise ValueError(f"rows must hold as many steps of run {run!r} as of 'torch'")
    sooner = next((m["scale"] for m, t in zip(mine, theirs, strict=True)
                   if m["skipped"] and not t["skipped"]), None)
    compared = [r for r in mine if r["update_rel_diff"] is not None]
    return {"sooner": sooner, "updates": mine[-1]["updates"],
            "torch_updates": theirs[-1]["updates"], "max_weight_diff": mine[-1]["max_weight_diff"],
            "compared_updates": compared[-1]["updates"] if compared else 0,
            "update_rel_diff": compared[-1]["update_rel_diff"] if compared else None}


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


# --- where an fp16 mean square overflows: two constructions --------------------------------------

OVERFLOW_CONSTRUCTIONS = {
    "sum kept in the format, then / d": lambda x: (x * x).sum(-1) / x.shape[-1],
    "x.pow(2).mean()": lambda x: x.pow(2).mean(-1),
}
"""Two ways to write the mean square of a 16-bit row x: the sum of the squares rounded to x's
dtype and then divided (what a kernel with a 16-bit result, or `x.pow(2).sum() / d`, does), and
torch's mean, which accumulates in fp32 and divides before it rounds once."""


def first_overflow_rms(d: int, fmt: str = "fp16") -> dict[str, float]:
    """Per construction of `OVERFLOW_CONSTRUCTIONS`: the smallest value r of `fmt` for which the
    mean square of a row of d entries all equal to r (rms r) comes out inf, found by bisection
    over the format's positive finite values with torch's own ops on this device."""
    checks.positive_int(d, "d")
    dt = dtypes.torch_dtype(checks.choice(fmt, "fmt", ("fp16", "bf16")))
    codes = torch.arange(1, 0x7F80 if fmt == "bf16" else 0x7C00, dtype=torch.int16)
    values = codes.view(dt)  # every positive finite value, in increasing order
    out = {}
    for name, mean_square in OVERFLOW_CONSTRUCTIONS.items():
        def overflows(i: int, mean_square=mean_square) -> bool:
            return bool(torch.isinf(mean_square(values[i].repeat(d))))

        lo, hi = 0, len(values) - 1
        if not overflows(hi):
            out[name] = math.inf
            continue
        while lo < hi:  # the first index that overflows
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if overflows(mid) else (mid + 1, hi)
        out[name] = float(values[lo])
    return out


# --- TF32: fp32 storage, 10 mantissa bits in the matrix units ------------------------------------

def round_mantissa(x: Tensor, bits: int) -> Tensor:
    """fp32 `x` with its mantissa rounded to nearest (ties to even) to `bits` bits, exponent kept:
    bits=10 is TF32's input rounding (fp32 range, fp16's precision), 7 bf16's."""
    if not isinstance(x, Tensor) or x.dtype != torch.float32:
        raise TypeError("x must be an fp32 tensor")
    if not 0 <= checks.integer(bits, "bits") <= 23:
        raise ValueError(f"bits must be in 0..23 (fp32 has 23), got {bits}")
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    i = x.view(torch.int32)
    half = (1 << (drop - 1)) - 1
    rounded = (i + half + ((i >> drop) & 1)) & ~((1 << drop) - 1)
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def tf32_matmul_errors(*, m: int = 256, k: int = 4_096, n: int = 256,
                       seed: int = 0) -> list[dict[str, Any]]:
    """An (m, k) @ (k, n) matmul of standard normal fp32 inputs with the inputs rounded as each
    matrix-unit format reads them (fp32: none; TF32: 10 mantissa bits; bf16: 7; fp16: 10, in
    fp16's range), products summed in fp32, against float64: the relative (Frobenius) error of
    the result and of one input's rounding."""
    checks.positive_ints(m=m, k=k, n=n)
    gen = torch.Generator().manual_seed(checks.nonnegative_int(seed, "seed"))
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    exact = a.double() @ b.double()
    read = {"fp32": lambda t: t, "tf32": lambda t: round_mantissa(t, 10),
            "bf16": lambda t: t.to(torch.bfloat16).float(),
            "fp16": lambda t: t.to(torch.float16).float()}
    return [{"format": name, "mantissa_bits": FORMATS[name].mantissa_bits,
             "input_rel_error": fp8.relative_error(r(a), a),
             "matmul_rel_error": fp8.relative_error(r(a) @ r(b), exact)}
            for name, r in read.items()]


def tf32_defaults() -> dict[str, Any]:
    """What this torch does with fp32 matmuls and convolutions unless told: the float32 matmul
    precision ("highest": no TF32) and cuDNN's TF32 switch for convolutions."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


# --- fp8: why a scale, when delayed scaling misses, and blocks -----------------------------------

def _layer_input(cfg: TransformerConfig, layer: str, batch: int, seq: int,
                 seed: int) -> tuple[Tensor, Tensor]:
    """The input (flattened to 2-D) that `layer` sees in a forward of one batch, and its weight."""
    model, tokens = _model_and_batch(cfg, batch, seq, seed)
    target = model.get_submodule(layer)
    if not isinstance(target, torch.nn.Linear) or target.bias is not None:
        raise ValueError(f"layer={layer!r} must name an nn.Linear without bias")
    seen: dict[str, Tensor] = {}
    handle = target.register_forward_hook(lambda m, args, out: seen.__setitem__("x", args[0]))
    with torch.no_grad():
        model(tokens[:, :-1])
    handle.remove()
    return seen["x"].detach().flatten(0, -2), target.weight.detach()


def fp8_amax_trace(cfg: TransformerConfig | None = None, *, layer: str = "blocks.0.ffn.w1",
                   factors: Sequence[float] = (1, 1, 1, 16, 1, 1), batch: int = 4, seq: int = 32,
                   seed: int = 0) -> list[dict[str, Any]]:
    """One `fp8.Fp8Linear` per scaling ("current", "delayed", "none"), kept across steps; at step
    t the layer's real input times `factors[t]` goes through each (a spike: one step whose amax
    jumps). Per step and scaling: the factor, the scale the input got, the share of the input's
    entries that saturated at E4M3's max, and the output's relative error against fp32. Delayed
    scaling takes its scale from the amax of earlier steps, so a spike saturates, and after it
    the remembered spike keeps the scale low for the length of the history."""
    x, w = _layer_input(cfg or TransformerConfig(), layer, batch, seq, seed)
    for i, f in enumerate(factors):
        checks.positive(f, f"factors[{i}]")
    layers = {s: fp8.Fp8Linear(w, scaling=s) for s in ("current", "delayed", "none")}
    rows = []
    for step, factor in enumerate(factors):
        xs = x * factor
        for scaling, lin in layers.items():
            if scaling == "none":
                scale = 1.0
            elif scaling == "delayed" and lin.histories["input"].amaxes:
                scale = lin.histories["input"].scale(fp8.FORWARD_FORMAT, margin=lin.margin)
            else:
                scale = fp8.scale_for(float(xs.abs().max()), fp8.FORWARD_FORMAT,
                                      margin=lin.margin)
            with torch.no_grad():
                y = lin(xs)
            rt = fp8.roundtrip(xs, fp8.FORWARD_FORMAT, scale)
            rows.append({"step": step, "factor": factor, "scaling": scaling, "scale": scale,
                         "saturated": rt.saturated,
                         "rel_error": fp8.relative_error(y, xs @ w.t())})
    return rows


def fp8_trace_table(rows: list[dict[str, Any]]) -> Table:
    """`fp8_amax_trace`'s rows: per step, the input's factor and each scaling's output error (and
    the saturated share where any entry saturated)."""
    steps = dict.fromkeys(r["step"] for r in rows)
    scalings = list(dict.fromkeys(r["scaling"] for r in rows))
    body = []
    for step in steps:
        mine = {r["scaling"]: r for r in rows if r["step"] == step}
        cells = [step, f"{mine[scalings[0]]['factor']:g}"]
        for s in scalings:
            r = mine[s]
            cells.append(f"{r['rel_error']:.1%}" + (f" ({r['saturated']:.0%} saturated)"
                                                     if r["saturated"] else ""))
        body.append(cells)
    return Table(["step", "input ×", *(f"{s} scaling: output error"
                                                           for s in scalings)], body)


def block_quantize(x: Tensor, block: int | None, fmt: str = fp8.FORWARD_FORMAT) -> Tensor:
    """`x` (2-D, fp32) quantized to `fmt` and back with one power-of-two scale per `block`
    consecutive entries of a row (MX's shared E8M0 exponent: 32), or per tensor (None): each
    scale the largest power of two that keeps the block's amax within the format's max."""
    if not isinstance(x, Tensor) or x.ndim != 2 or not x.is_floating_point():
        raise ValueError("x must be a 2-D floating-point tensor")
    if block is not None and (checks.positive_int(block, "block") > x.shape[1]
                              or x.shape[1] % block):
        raise ValueError(f"block={block} must divide the row length {x.shape[1]}")
    f = FORMATS[fmt]
    v = x.float().reshape(-1, block or x.numel())
    amax = v.abs().amax(dim=1, keepdim=True)
    scale = torch.exp2(torch.floor(torch.log2(f.max / amax.clamp_min(torch.finfo().tiny))))
    q = (v * scale).clamp(-f.max, f.max).to(f.dtype).float() / scale
    return q.reshape(x.shape)


def block_scaling_errors(cfg: TransformerConfig | None = None, *,
                         layer: str = "blocks.0.ffn.w1", outliers: Sequence[int] = (0, 10, 14),
                         blocks: Sequence[int | None] = (None, 32), channel: int = 3,
                         batch: int = 4, seq: int = 32, seed: int = 0) -> list[dict[str, Any]]:
    """The layer's real input with one channel multiplied by 2^k (an outlier feature), per k and
    block size (`block_quantize`; None: one scale per tensor): the relative error of the other
    entries and the share of them that flushed to 0."""
    x, _ = _layer_input(cfg or TransformerConfig(), layer, batch, seq, seed)
    rows = []
    for k in outliers:
        xo = x.clone()
        xo[:, checks.nonnegative_int(channel, "channel")] *= 2.0 ** checks.nonnegative_int(
            k, "outliers[i]")
        rest = torch.ones_like(xo, dtype=torch.bool)
        rest[:, channel] = False
        for block in blocks:
            q = block_quantize(xo, block)
            rows.append({"outlier_log2": k, "block": block,
                         "rel_error": fp8.relative_error(q[rest], xo[rest]),
                         "flushed": float(((q[rest] == 0) & (xo[rest] != 0)).double().mean())})
    return rows


def block_table(rows: list[dict[str, Any]]) -> Table:
    """`block_scaling_errors`'s rows: per outlier and block size, error and flushed share."""
    return Table(["outlier channel ×", "one scale per", "error of the other entries",
                  "flushed to 0"],
                 [[power_text(2.0 ** r["outlier_log2"]),
                   "tensor" if r["block"] is None else f"{r['block']} entries",
                   f"{r['rel_error']:.2%}", f"{r['flushed']:.2%}"] for r in rows])


# --- the numbers the chapter's prose quotes, from the rows above ---------------------------------

def eps_table(epsilons: Sequence[float], formats: Sequence[str] = ("fp16", "bf16", "fp32")
              ) -> Table:
    """`norm_numerics.eps_facts` of each epsilon in each format: stored value, kind, error and
    the mean square from which adding it changes nothing."""
    rows = []
    for eps in epsilons:
        for fmt in formats:
            f = norm_numerics.eps_facts(eps, fmt)
            rows.append([f"{eps:g}", fmt, f"{f.stored:.6g}", f.kind, f"{f.rel_error:.2%}",
                         f"{f.absorbed_from:g}"])
    return Table(["eps", "format", "stored as", "kind", "error", "absorbed by mean squares ≥"],
                 rows)


def underflow_facts(rows: list[dict[str, Any]], grads: Sequence[Tensor],
                    scales: Sequence[float]) -> dict[str, Any]:
    """From `gradient_underflow`'s rows and the fp32 gradients of the same batch, with
    `scales[0]` = 1 and `scales[1]` the scale the prose shows: the tensor with the most subnormal
    entries unscaled ("under_layer") and its share unscaled and scaled, the shares of all entries
    that would be subnormal or round to zero in fp16 at both scales ("hist_*"), and how many
    octaves the largest scaled entry stays below fp16's max ("hist_headroom")."""
    from mlsys.diagrams.precision import zone_shares  # numbers only; matplotlib stays unused

    one, shown = scales[0], scales[1]
    worst = max((r for r in rows if r["scale"] == one), key=lambda r: r["subnormal"])
    scaled = next(r for r in rows if r["scale"] == shown and r["parameter"] == worst["parameter"])
    shares = {s: zone_shares(list(grads), "fp16", scale=s) for s in (one, shown)}
    g_max = max(float(g.abs().max()) for g in grads)
    return {"under_layer": worst["parameter"], "under_scale": f"{shown:g}",
            "under_layer_sub": 100 * worst["subnormal"],
            "under_layer_scaled": 100 * scaled["subnormal"],
            "hist_sub1": 100 * shares[one]["subnormal"],
            "hist_under1": 100 * shares[one]["underflow"],
            "hist_sub8": 100 * shares[shown]["subnormal"],
            "hist_under8": 100 * shares[shown]["underflow"],
            "hist_headroom": math.log2(FORMATS["fp16"].max / (g_max * shown))}


def fp8_trace_facts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From `fp8_amax_trace`'s rows, at the spike (the step of the largest factor): the step and
    its factor, delayed scaling's saturated share and output error (%), current scaling's (%),
    and the step after: delayed's error over current's."""
    by = {(r["step"], r["scaling"]): r for r in rows}
    step = max(rows, key=lambda r: r["factor"])["step"]
    spike, cur = by[(step, "delayed")], by[(step, "current")]
    after = by.get((step + 1, "delayed")), by.get((step + 1, "current"))
    return {"f8_step": step, "f8_factor": f"{spike['factor']:g}",
            "f8_sat": 100 * spike["saturated"], "f8_spike": 100 * spike["rel_error"],
            "f8_cur": 100 * cur["rel_error"], "f8_cur_sat": 100 * cur["saturated"],
            "f8_after": (after[0]["rel_error"] / after[1]["rel_error"] if None not in after
                         else math.nan)}


def block_facts(rows: list[dict[str, Any]], *, outlier_log2: int | None = None,
                block: int = 32) -> dict[str, Any]:
    """From `block_scaling_errors`'s rows at one outlier (default: the largest): its factor as
    text, the block size, and the flushed share and error of the other entries (%) with one
    scale per tensor ("_t") and per `block` entries ("_b")."""
    by = {(r["outlier_log2"], r["block"]): r for r in rows}
    if outlier_log2 is None:
        outlier_log2 = max(r["outlier_log2"] for r in rows)
    t, b = by[(outlier_log2, None)], by[(outlier_log2, block)]
    return {"blk_outlier": power_text(2.0**outlier_log2), "blk_size": block,
            "blk_flush_t": 100 * t["flushed"], "blk_err_t": 100 * t["rel_error"],
            "blk_flush_b": 100 * b["flushed"], "blk_err_b": 100 * b["rel_error"]}


def tf32_facts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From `tf32_matmul_errors`'s rows and `tf32_defaults`: TF32's matmul error, bf16's over it,
    fp16's over it, and torch's defaults as prose."""
    err = {r["format"]: r["matmul_rel_error"] for r in rows}
    defaults = tf32_defaults()
    return {"tf32_err": err["tf32"], "tf32_vs_bf16": err["bf16"] / err["tf32"],
            "tf32_vs_fp16": err["fp16"] / err["tf32"],
            "tf32_default": f'"{defaults["float32_matmul_precision"]}"',
            "tf32_cudnn": f"`torch.backends.cudnn.allow_tf32` is {defaults['cudnn_allow_tf32']}"}


def tf32_table(rows: list[dict[str, Any]]) -> Table:
    """`tf32_matmul_errors`'s rows: per format, its mantissa bits, the error of one input's
    rounding and of the matmul against float64."""
    return Table(["inputs read as", "mantissa bits", "input error", "matmul error vs float64"],
                 [[r["format"], r["mantissa_bits"], f"{r['input_rel_error']:.1e}",
                   f"{r['matmul_rel_error']:.1e}"] for r in rows])


def stagnation_shares(out: dict[str, dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """From `stagnation`'s runs: per rounding, the share of weights that ever moved, and its loss
    drop over fp32's ("none")."""
    drop = {k: v["losses"][0] - v["final_loss"] for k, v in out.items()}
    return ({k: v["changed_fraction"] for k, v in out.items()},
            {k: d / drop["none"] for k, d in drop.items()})


def fp8_facts(rows: list[dict[str, Any]]) -> dict[str, float]:
    """From `fp8_linear_errors`'s rows: current scaling's output error (%) and the share of the
    output gradient's entries that E5M2 flushes unscaled (%)."""
    by = {(r["scaling"], r["tensor"]): r for r in rows}
    return {"fp8_out": 100 * by[("current", "output")]["rel_error"],
            "fp8_flushed": 100 * by[("none", "output")]["grad_flushed"]}
