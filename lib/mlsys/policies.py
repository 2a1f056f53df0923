"""Precision policies: which dtype each piece of training is held and computed in.

A policy names the dtype of the weights the forward and backward read, of the matmuls (different
only under `torch.autocast`), of the gradients, of an optional fp32 master copy that the optimizer
updates, and of the optimizer's state (the dtype it updates), plus whether the loss is scaled.
Each is named after a recipe of `mlsys.accounting.memory` and checked, when built, to hold exactly
that recipe's bytes per parameter: `policy("bf16_mixed_adamw")` gives the napkin bytes (2 + 2 + 4 +
8) and, through `mlsys.training.make_policy_step`, the runnable step. Pure Python, no torch.
References: Micikevicius et al. (2018), "Mixed Precision Training"; Rajbhandari et al. (2020),
ZeRO, section 3.1. Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.memory import RECIPES, recipe
from mlsys.dtypes import bytes_per_element

AUTOCAST_DTYPES = ("bf16", "fp16")
"""The low-precision dtypes: what autocast can run matmuls in and what `low=` may choose."""

POLICY_DTYPES = ("fp32", "bf16", "fp16")
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0, "sgd_momentum": 1}
"""Optimizer -> state tensors it keeps per parameter (AdamW: m and v; SGD with momentum: one)."""
LOSS_SCALES = ("none", "dynamic")


@dataclass(frozen=True)
class PrecisionPolicy:
    """The dtype of every piece of training, named after the `accounting.memory` recipe whose
    bytes per parameter it holds (checked here: weights, grads, master and optimizer bytes)."""

    name: str  # a recipe in mlsys.accounting.memory.RECIPES
    param_dtype: str  # the weights the forward and backward read (the model's parameters)
    compute_dtype: str  # the matmuls; differs from param_dtype only under torch.autocast
    grad_dtype: str  # gradients as held between backward and update (and as they would be reduced)
    master_dtype: str | None  # the copy the optimizer updates; None: it updates the weights
    optimizer: str  # "adamw", "sgd" or "sgd_momentum"; its state has the dtype it updates
    loss_scale: str = "none"  # "dynamic": `numerics.loss_scaling.DynamicLossScaler` (for fp16)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"a policy's name must be a recipe name (str), got {self.name!r}")
        checks.choice(self.name, "name", RECIPES)
        for field_name in ("param_dtype", "compute_dtype", "grad_dtype"):
            checks.choice(getattr(self, field_name), field_name, POLICY_DTYPES)
        checks.choice(self.master_dtype, "master_dtype", (None, "fp32"))
        checks.choice(self.optimizer, "optimizer", OPTIMIZER_STATES)
        checks.choice(self.loss_scale, "loss_scale", LOSS_SCALES)
        if self.autocast and self.param_dtype != "fp32":
            raise ValueError(f"compute_dtype={self.compute_dtype!r} differs from param_dtype="
                             f"{self.param_dtype!r}: autocast runs from fp32 weights only")
        if self.master_dtype is not None and self.param_dtype == "fp32":
            raise ValueError("master_dtype='fp32' with param_dtype='fp32': a master copy of fp32 "
                             "weights would be the weights themselves")
        if self.grad_dtype not in (self.param_dtype, self.master_dtype):
            raise ValueError(f"grad_dtype={self.grad_dtype!r} must be param_dtype "
                             f"({self.param_dtype!r}) or master_dtype ({self.master_dtype!r})")
        theirs = recipe(self.name).breakdown()
        mine = self.breakdown()
        if mine != theirs:
            raise ValueError(f"policy {self.name!r} holds {mine} bytes per parameter "
                             f"({sum(mine.values())} in all) but recipe {self.name!r} says "
                             f"{theirs} ({sum(theirs.values())})")

    @property
    def autocast(self) -> bool:
        """Whether the forward runs under `torch.autocast(dtype=compute_dtype)`."""
        return self.compute_dtype != self.param_dtype

    @property
    def update_dtype(self) -> str:
        """The dtype the optimizer updates (and keeps its state in): master copy, else weights."""
        return self.master_dtype or self.param_dtype

    def breakdown(self) -> dict[str, int]:
        """Bytes per parameter by kind, from the dtypes alone (as `TrainingRecipe.breakdown`)."""
        size = bytes_per_element
        return {"weights": size(self.param_dtype), "grads": size(self.grad_dtype),
                "master": size(self.master_dtype) if self.master_dtype else 0,
                "optimizer": OPTIMIZER_STATES[self.optimizer] * size(self.update_dtype)}

    @property
    def label(self) -> str:
        """`fp32_adamw + bf16 autocast`, `bf16_mixed_adamw (fp16) + dynamic loss scale`."""
        text = self.name
        if self.param_dtype == "fp16":
            text += " (fp16)"
        if self.autocast:
            text += f" + {self.compute_dtype} autocast"
        if self.loss_scale != "none":
            text += f" + {self.loss_scale} loss scale"
        return text


def _policies(*rows: tuple) -> dict[str, PrecisionPolicy]:
    return {row[0]: PrecisionPolicy(*row) for row in rows}


POLICIES: dict[str, PrecisionPolicy] = _policies(
    # name,                         weights  compute grads   master  optimizer
    ("fp32_adamw",                  "fp32", "fp32", "fp32", None,   "adamw"),
    ("bf16_mixed_adamw",            "bf16", "bf16", "bf16", "fp32", "adamw"),
    ("bf16_mixed_adamw_fp32_grads", "bf16", "bf16", "fp32", "fp32", "adamw"),
    ("bf16_pure_adamw",             "bf16", "bf16", "bf16", None,   "adamw"),
    ("fp32_sgd",                    "fp32", "fp32", "fp32", None,   "sgd"),
    ("fp32_sgd_momentum",           "fp32", "fp32", "fp32", None,   "sgd_momentum"),
)  # fmt: skip
"""One policy per recipe of `mlsys.accounting.memory.RECIPES`, under the same name."""


def policy(name: str | PrecisionPolicy, *, low: str | None = None, autocast: str | None = None,
           loss_scale: str | None = None) -> PrecisionPolicy:
    """The policy called `name`, varied without changing its bytes: `low="fp16"` holds its bf16
    pieces in fp16 instead; `autocast="bf16"` (or "fp16") runs the matmuls of an fp32 policy under
    torch.autocast; `loss_scale="dynamic"` scales the loss.

    `policy("bf16_mixed_adamw", low="fp16", loss_scale="dynamic")` is the classic fp16 recipe
    (fp16 weights and gradients, fp32 master and moments, dynamic loss scaling)."""
    if isinstance(name, PrecisionPolicy):
        chosen = name
    else:
        if not isinstance(name, str):
            raise TypeError(f"name must be a policy name such as 'bf16_mixed_adamw', got {name!r}")
        chosen = POLICIES[checks.choice(name, "name", POLICIES)]
    changes: dict[str, str] = {}
    if low is not None:
        checks.choice(low, "low", AUTOCAST_DTYPES)
        if chosen.param_dtype == "fp32":
            raise ValueError(f"low={low!r}: policy {chosen.name!r} holds nothing in low precision "
                             "(use autocast= for its matmuls)")
        changes = {f: low for f in ("param_dtype", "compute_dtype", "grad_dtype")
                   if getattr(chosen, f) in AUTOCAST_DTYPES}
    if autocast is not None:
        checks.choice(autocast, "autocast", AUTOCAST_DTYPES)
        changes["compute_dtype"] = autocast
    if loss_scale is not None:
        changes["loss_scale"] = loss_scale
    return dataclasses.replace(chosen, **changes)
