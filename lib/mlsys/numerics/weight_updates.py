"""Weight updates stored in bf16: why small updates vanish, and three ways to keep them.

A weight w stored in bf16 changes only if the update u reaches half its spacing: |u| > ulp(w)/2 =
2^(floor(log2|w|) - 8). AdamW's first steps move every weight by about lr, so at lr = 1e-5 every
weight with |w| >= 2^-8 = 0.0039 rounds back to itself: the update is computed, then lost
("stagnation"; chapter 01's plateau of a running sum, with w as the sum and u as the addend).
Three remedies, each an option of `RoundedAdamW`:

- "master": keep an fp32 copy, update it, store its rounding (Micikevicius et al., 2018); 4 more
  bytes per parameter.
- "kahan": keep, per weight, what the last rounding lost, in bf16, and add it to the next update
  (Kahan summation; Zamirai et al., 2020, "Revisiting BFloat16 Training"); 2 more bytes.
- "stochastic": round up or down at random with probabilities that make the stored weight right
  on average (Gupta et al., 2015, "Deep Learning with Limited Numerical Precision"); no bytes.

"nearest" is plain round-to-nearest (the stall) and "none" keeps fp32 (the reference). The
arithmetic of the update is fp32 in every mode; only how its result is stored differs. The weights
may be bf16 tensors, or fp32 tensors that hold bf16 values (then the forward and backward run in
fp32 and the storage alone differs). Used in: §sec-mixed-precision
(`mlsys.experiments.mixed_precision` runs them on the book's model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from mlsys import checks
from mlsys.dtypes import torch_dtype
from mlsys.numerics.precision import get_format, ulp

ROUNDINGS = ("none", "nearest", "master", "kahan", "stochastic")
"""How an update is stored: fp32 reference, round to nearest, fp32 master copy, Kahan
compensation, stochastic rounding."""
PARAM_DTYPES = (torch.bfloat16, torch.float32)
"""The parameter dtypes `RoundedAdamW` takes: bf16, or fp32 holding bf16 values (or, with "none",
any fp32 values)."""


def stochastic_round_bf16(x: Float[Tensor, "*shape"], *,
                          generator: torch.Generator) -> Float[Tensor, "*shape"]:
    """fp32 -> bf16, rounding |x| up with probability (|x| - down) / (up - down), so that
    E[result] = x: add 16 random bits below bf16's last bit of the fp32 pattern, then cut them.

    Exact for every finite fp32 value (subnormals included); inf and NaN pass through. The random
    bits come from `generator` (CPU), so a seed gives the same result on every device.
    """
    if not isinstance(x, Tensor) or x.dtype != torch.float32:
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a float32 tensor, got {what}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32,
                          device=generator.device).to(x.device)
    rounded = ((bits + noise) & ~0xFFFF).view(torch.float32)  # carries into the exponent: fine
    return torch.where(torch.isfinite(x), rounded, x).to(torch.bfloat16)


def stall_threshold(weight: float, fmt: str = "bf16") -> float:
    """The smallest |update| that can change a weight of magnitude |weight| stored in `fmt`:
    half its spacing, ulp(w)/2 (a tie rounds to even, so exactly half may or may not move it)."""
    return ulp(checks.number(weight, "weight"), fmt) / 2


class RoundedAdamW(torch.optim.Optimizer):
    """AdamW whose update is computed in fp32 and stored by `rounding` (see `ROUNDINGS`).

    Moments m, v are fp32. Per parameter the state also holds "master" (fp32 copy) or
    "compensation" (bf16) where the rounding needs one. Parameters may be bf16 tensors or fp32
    tensors holding bf16 values; with "none" they stay plain fp32. Other dtypes are refused
    (`PARAM_DTYPES`) rather than rounded to their own: every remedy here is bf16's (the Kahan
    compensation is kept in bf16; stochastic rounding cuts the low 16 bits of an fp32 pattern,
    which leaves a bf16 and nothing else), so an fp16 parameter would silently get bf16's 8
    significant bits instead of its own 11. fp16 training keeps fp32 weights and scales the
    loss instead (`mlsys.numerics.loss_scaling`).
    Betas are in [0, 1), as torch.optim.AdamW requires: at beta = 1 the bias correction
    1 - beta^t is 0 and the first step divides 0 by 0 (NaN weights).
    """

    def __init__(self, params: Iterable[Tensor], *, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, rounding: str = "nearest",
                 generator: torch.Generator | None = None) -> None:
        checks.positive(lr, "lr")
        if isinstance(betas, (str, bytes)) or not isinstance(betas, Sequence) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2) such as (0.9, 0.999), "
                            f"got {betas!r}")
        for i, beta in enumerate(betas):
            if not checks.number(beta, f"betas[{i}]", minimum=0.0) < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1) (as torch.optim.AdamW requires: "
                                 f"at 1 the bias correction 1 - beta^t is 0), got {beta!r}")
        checks.positive(eps, "eps")
        checks.nonnegative(weight_decay, "weight_decay")
        checks.choice(rounding, "rounding", ROUNDINGS)
        if rounding == "stochastic" and not isinstance(generator, torch.Generator):
            raise TypeError("rounding='stochastic' needs generator=torch.Generator()")
        self.rounding, self.generator = rounding, generator
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def add_param_group(self, param_group: dict) -> None:
        """torch's, after checking that every parameter is bf16 or fp32 (`PARAM_DTYPES`)."""
        params = param_group["params"]
        if not isinstance(params, (Tensor, set)):  # a set: torch refuses it (unordered)
            params = list(params)  # a generator can be read once: keep what was read
            param_group = {**param_group, "params": params}
        for i, p in enumerate([params] if isinstance(params, Tensor) else params):
            if isinstance(p, Tensor) and p.dtype not in PARAM_DTYPES:
                raise TypeError(
                    f"params[{i}] is {p.dtype}: RoundedAdamW stores bf16, so parameters must be "
                    "torch.bfloat16 or torch.float32 (an fp16 one would be rounded through "
                    "bf16; train fp16 with fp32 weights and a loss scale)")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None) -> None:  # noqa: ARG002 - torch's signature
        bf16 = torch_dtype("bf16")
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p, dtype=torch.float32)
                    st["v"] = torch.zeros_like(p, dtype=torch.float32)
                    if self.rounding == "master":
                        st["master"] = p.detach().to(torch.float32, copy=True)
                    if self.rounding == "kahan":
                        st["compensation"] = torch.zeros_like(p, dtype=bf16)
                st["step"] += 1
                g = p.grad.to(torch.float32)
                st["m"].lerp_(g, 1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                m_hat = st["m"] / (1 - b1 ** st["step"])
                v_hat = st["v"] / (1 - b2 ** st["step"])
                w = st["master"] if self.rounding == "master" else p.to(torch.float32)
                update = -group["lr"] * (m_hat / (v_hat.sqrt() + group["eps"])
                                         + group["weight_decay"] * w)
                self._store(p, w, update, st)

    def _store(self, p: Tensor, w: Tensor, update: Tensor, st: dict) -> None:
        """p <- w + update, stored as `self.rounding` says (every sum computed in fp32)."""
        bf16 = torch_dtype("bf16")
        if self.rounding == "none":
            p.add_(update.to(p.dtype))
        elif self.rounding == "nearest":
            p.copy_((w + update).to(bf16))
        elif self.rounding == "master":
            w.add_(update)  # w is the fp32 master copy itself
            p.copy_(w.to(bf16))
        elif self.rounding == "kahan":
            y = update - st["compensation"].to(torch.float32)  # this update plus what was lost
            new = (w + y).to(bf16)
            st["compensation"].copy_((new.to(torch.float32) - w) - y)  # what this rounding lost
            p.copy_(new)
        else:
            p.copy_(stochastic_round_bf16(w + update, generator=self.generator))

    def extra_bytes_per_param(self) -> int:
        """State beyond AdamW's two fp32 moments: 4 (master), 2 (kahan) or 0."""
        return {"master": 4, "kahan": 2}.get(self.rounding, 0)


def adam_first_step_stalls(weights: Tensor, lr: float, fmt: str = "bf16") -> float:
    """Fraction of `weights` that AdamW's first step (a move of exactly lr each) leaves unchanged
    when stored in `fmt` with round-to-nearest: |w| with ulp(w)/2 >= lr."""
    if not isinstance(weights, Tensor) or not weights.is_floating_point():
        raise TypeError("weights must be a floating-point tensor")
    checks.positive(lr, "lr")
    f = get_format(fmt)
    mag = weights.detach().double().abs()
    exponent = torch.floor(torch.log2(mag.clamp_min(f.smallest_normal)))  # binade of each weight
    half_ulp = torch.exp2(exponent - f.mantissa_bits - 1)
    return float((half_ulp >= lr).double().mean()) if mag.numel() else math.nan
