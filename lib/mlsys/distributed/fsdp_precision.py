"""A chapter-07 precision policy as FSDP's dtypes: what the weights are gathered in, what the
gradients are reduced in, and what the shards (which the optimizer updates) are held in.

| policy field                        | fsdp.apply_fsdp    | FSDP2 (`MixedPrecisionPolicy`)  |
|-------------------------------------|--------------------|---------------------------------|
| param_dtype (weights the pass reads)| compute_dtype      | param_dtype                     |
| grad_dtype (grads held and reduced) | reduce_dtype       | reduce_dtype                    |
| update_dtype (master, else weights) | the shards' dtype  | the sharded parameters' dtype   |
| compute_dtype != param_dtype        | autocast: the caller's `torch.autocast`; weights fp32 |
| loss_scale="dynamic"                | refused, ValueError (see `check_policy`)             |
| optimizer                           | the caller's, built over the shards                  |

So bf16_mixed_adamw gathers and computes in bf16, reduces bf16 gradients and keeps fp32 master
shards (whose gradients, added after the reduction, are fp32 too); fp32 policies change nothing;
a policy without a master (bf16_pure_adamw) keeps bf16 shards. Outputs come out in the compute
dtype (cast logits with `.float()` before the loss); the module's floating-point inputs are cast
to it. `policy_dtypes` gives the three dtypes, `mixed_precision_policy` PyTorch's equivalent, and
`resolve_dtypes` reconciles a policy with dtypes given explicitly. Used in: chapter 09
(§sec-parallelism), chapter 10 (`train.parallelize`).
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from mlsys import checks
from mlsys.dtypes import torch_dtype
from mlsys.policies import POLICIES, PrecisionPolicy
from mlsys.policies import policy as named_policy


def check_policy(policy: object) -> PrecisionPolicy | None:
    """`policy` as a PrecisionPolicy (a name goes through `mlsys.policies.policy`), or None.

    Loss scaling is refused: `mlsys.numerics.loss_scaling.DynamicLossScaler` decides from the
    gradients it sees whether to skip a step, and under FSDP each rank sees only its shard of them,
    so ranks could decide differently and their shards drift apart (a sharded scaler would
    all-reduce the verdict first; there is none here). Use a bf16 policy, which needs no scaling."""
    if policy is None:
        return None
    if isinstance(policy, str):
        chosen = named_policy(checks.choice(policy, "policy", POLICIES))
    elif isinstance(policy, PrecisionPolicy):
        chosen = policy
    else:
        raise TypeError("policy must be a mlsys.policies.PrecisionPolicy, a policy name such as "
                        f"'bf16_mixed_adamw', or None; got {type(policy).__name__}")
    if chosen.loss_scale != "none":
        raise ValueError(f"policy {chosen.label!r} scales its loss, which FSDP cannot express: "
                         "each rank sees only its shard of the gradients, so ranks could disagree "
                         "on skipping a step; use a policy with loss_scale='none' (bf16)")
    return chosen


def policy_dtypes(policy: PrecisionPolicy | str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(gather, reduce, shard) torch dtypes of `policy`, the mapping of the module docstring:
    weights are gathered (and the forward and backward run) in `param_dtype`, gradients reduced in
    `grad_dtype` (the policy's "gradients as held and reduced"), and the shards, which the optimizer
    updates, held in `update_dtype` (the fp32 master if the policy has one, else the weights).
    `policy("bf16_mixed_adamw")` -> (bf16, bf16, fp32); "fp32_adamw" -> (fp32, fp32, fp32)."""
    chosen = check_policy(policy)
    if chosen is None:
        raise TypeError("policy must be a PrecisionPolicy or a policy name, got None")
    return (torch_dtype(chosen.param_dtype), torch_dtype(chosen.grad_dtype),
            torch_dtype(chosen.update_dtype))


def _check_dtype(dtype: object, name: str) -> None:
    floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
    if dtype is not None and not floating:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")


def resolve_dtypes(chosen: PrecisionPolicy | None, given: dict[str, torch.dtype | None]
                   ) -> tuple[torch.dtype | None, torch.dtype | None, torch.dtype | None]:
    """(gather, reduce, shard) dtypes from the policy and the explicit dtypes `given` (two, in
    that order, by argument name); an explicit dtype that contradicts the policy is a ValueError."""
    for name, dtype in given.items():
        _check_dtype(dtype, name)
    explicit = list(given.values())
    if chosen is None:
        return explicit[0], explicit[1], None
    implied = policy_dtypes(chosen)
    for (name, dtype), want in zip(given.items(), implied, strict=False):
        if dtype is not None and dtype != want:
            raise ValueError(f"{name}={dtype} contradicts policy {chosen.label!r}, which gives "
                             f"{name}={want}: pass the policy or the dtype, not both")
    return implied


def mixed_precision_policy(policy: PrecisionPolicy | str | None) -> MixedPrecisionPolicy:
    """PyTorch FSDP2's `MixedPrecisionPolicy` for a chapter-07 policy (the module docstring's
    mapping): `param_dtype` = policy.param_dtype (gathers, forward and backward),
    `reduce_dtype` = policy.grad_dtype, `output_dtype` = None (outputs come out in param_dtype,
    as `fsdp.apply_fsdp`'s do: cast logits with `.float()` before the loss), `cast_forward_inputs` =
    True (each unit's floating inputs cast to param_dtype). FSDP2 keeps the sharded parameters in
    the module's own dtype, so the module must already hold policy.update_dtype (fp32 for a policy
    with a master; `torch_strategies.apply_fully_shard(policy=...)` casts
    it). None: no mixed precision.
    Autocast policies: run the forward under `torch.autocast` yourself."""
    chosen = check_policy(policy)
    if chosen is None:
        return MixedPrecisionPolicy()
    param, reduce, _ = policy_dtypes(chosen)
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce, output_dtype=None,
                                cast_forward_inputs=True)
