"""Bytes of tensors and of training "model states" (weights, gradients, master copy, optimizer).

Model states grow with the parameter count N alone: a training recipe fixes how many bytes each
parameter costs, `bytes_per_param`, and the states take N * bytes_per_param. Mixed-precision AdamW
costs 2 + 2 + 12 = 16 bytes per parameter (bf16/fp16 weights and gradients, plus fp32 master weights
and two fp32 Adam moments): the "16 N" of the ZeRO paper (Rajbhandari et al., 2020, section 3.1).
Activations, temporary buffers, allocator fragmentation and the CUDA context come on top and are
not counted here.

8-bit optimizers (Dettmers et al., 2022, "8-bit Optimizers via Block-wise Quantization") store each
state in one byte per value plus one fp32 scale (the block's absolute maximum) per block of 2,048
values: not a whole number of bytes per parameter, so `blockwise_state_bytes` counts them exactly
instead of a recipe.

Used in: §sec-tensors-memory (chapter 02), the mixed-precision and ZeRO/FSDP chapters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlsys import checks
from mlsys.dtypes import bytes_per_element


@dataclass(frozen=True)
class TrainingRecipe:
    """Bytes each parameter costs in model states under one precision/optimizer recipe."""

    name: str
    description: str
    weight_bytes: int  # the weights the forward and backward read
    grad_bytes: int  # one gradient per parameter
    master_bytes: int  # fp32 master copy the optimizer updates (0 when weights are already it)
    optimizer_bytes: int  # optimizer state, e.g. Adam's two moments

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a recipe's name must be a non-empty string, got {self.name!r}")
        for part in ("weight_bytes", "grad_bytes", "master_bytes", "optimizer_bytes"):
            checks.nonnegative_int(getattr(self, part), f"{part} of recipe {self.name!r}")

    @property
    def bytes_per_param(self) -> int:
        """Model-state bytes per parameter: weights + gradients + master copy + optimizer state."""
        return self.weight_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    def breakdown(self) -> dict[str, int]:
        """Bytes per parameter by kind of state; the values sum to `bytes_per_param`."""
        return {
            "weights": self.weight_bytes,
            "grads": self.grad_bytes,
            "master": self.master_bytes,
            "optimizer": self.optimizer_bytes,
        }


def _recipes(*recipes: TrainingRecipe) -> dict[str, TrainingRecipe]:
    return {r.name: r for r in recipes}


RECIPES: dict[str, TrainingRecipe] = _recipes(
    TrainingRecipe(
        "fp32_adamw", "fp32 weights and grads; AdamW moments m, v in fp32 (4 + 4 + 8)",
        4, 4, 0, 8,
    ),
    TrainingRecipe(
        "bf16_mixed_adamw",
        "bf16 weights and grads; fp32 master weights and AdamW moments "
        "(2 + 2 + 4 + 8, ZeRO's 2 + 2 + 12)",
        2, 2, 4, 8,
    ),
    TrainingRecipe(
        "bf16_mixed_adamw_fp32_grads",
        "bf16 weights; gradients accumulated in fp32; fp32 master weights and moments "
        "(2 + 4 + 4 + 8)",
        2, 4, 4, 8,
    ),
    TrainingRecipe(
        "bf16_pure_adamw", "bf16 weights, grads and AdamW moments; no master copy (2 + 2 + 4)",
        2, 2, 0, 4,
    ),
    TrainingRecipe(
        "fp32_sgd", "fp32 weights and grads; plain SGD keeps no optimizer state (4 + 4)",
        4, 4, 0, 0,
    ),
    TrainingRecipe(
        "fp32_sgd_momentum", "fp32 weights, grads and one momentum buffer (4 + 4 + 4)",
        4, 4, 0, 4,
    ),
)  # fmt: skip
"""Named training recipes: name -> TrainingRecipe."""


def recipe(name: str | TrainingRecipe) -> TrainingRecipe:
    """The recipe called `name` (a TrainingRecipe is returned as is); ValueError if unknown."""
    if isinstance(name, TrainingRecipe):
        return name
    if not isinstance(name, str):
        raise TypeError(f"recipe must be a name such as 'bf16_mixed_adamw' or a TrainingRecipe, "
                        f"got {name!r}")
    return RECIPES[checks.choice(name, "recipe", RECIPES)]


_resolve = recipe  # the functions below take an argument called `recipe`


def tensor_bytes(shape: Sequence[int], dtype: object) -> int:
    """Storage bytes of a dense tensor: prod(shape) * bytes_per_element(dtype).

    `tensor_bytes((1024, 1024), "bf16") == 2 * 2**20`. Shape entries must be non-negative integers.
    """
    return math.prod(checks.int_sequence(shape, "shape", minimum=0)) * bytes_per_element(dtype)


def model_state_breakdown(n_params: int, recipe: str | TrainingRecipe) -> dict[str, int]:
    """Bytes of weights, grads, master copy and optimizer state for `n_params` parameters."""
    n = checks.nonnegative_int(n_params, "n_params")
    return {kind: n * b for kind, b in _resolve(recipe).breakdown().items()}


def model_state_bytes(n_params: int, recipe: str | TrainingRecipe) -> int:
    """Model-state bytes of `n_params` parameters: n_params * bytes_per_param (16N, mixed AdamW)."""
    return checks.nonnegative_int(n_params, "n_params") * _resolve(recipe).bytes_per_param


def max_trainable_params(
    n_devices: int, device_memory_bytes: float, recipe: str | TrainingRecipe
) -> int:
    """Largest parameter count whose model states fit:
    floor(n_devices * device_memory_bytes / bytes_per_param).

    An upper bound from model states only: activations, temporary buffers, allocator fragmentation
    and the CUDA context are excluded, so the real limit is lower. It assumes the states are
    perfectly sharded across the devices (ZeRO stage 3 / FSDP), each device holding 1/n_devices of
    them; with plain data parallelism every device holds all of them (use n_devices=1).
    Example: 8 GPUs of 80 GB with "fp32_adamw" (16 B/param) fit at most 40e9 parameters.
    """
    n = checks.positive_int(n_devices, "n_devices")
    memory = checks.positive(device_memory_bytes, "device_memory_bytes")
    chosen = _resolve(recipe)
    if chosen.bytes_per_param == 0:
        raise ValueError(f"recipe {chosen.name!r} has 0 bytes per parameter; no limit to compute")
    if memory.is_integer():  # exact integer arithmetic for whole byte counts (ints stay exact)
        whole = int(device_memory_bytes) if isinstance(device_memory_bytes, int) else int(memory)
        return n * whole // chosen.bytes_per_param
    return math.floor(n * memory / chosen.bytes_per_param)


BLOCKWISE_BLOCK_SIZE = 2_048
"""Values per block of block-wise quantized optimizer state in Dettmers et al. (2022):
each block is scaled by its own absolute maximum, so an outlier degrades one block only.
bitsandbytes used 2,048 until version 0.44.0, which moved its 8-bit optimizers to blocks of 256
(bitsandbytes pull request #1365, 2024)."""


def blockwise_state_bytes(n_params: int, *, n_states: int, bits: int = 8,
                          block_size: int = BLOCKWISE_BLOCK_SIZE, scale_bytes: int = 4) -> int:
    """Bytes of `n_states` optimizer states of one tensor of `n_params` values, each quantized
    block-wise: n_states * (ceil(n_params * bits / 8) + ceil(n_params / block_size) * scale_bytes).

    8-bit AdamW keeps m and v (n_states=2) as one byte per value and one fp32 scale per block of
    2,048 values: 2 + 8 / 2,048 = 2.0039 bytes per parameter instead of fp32 Adam's 8. Blocks do
    not span tensors (the last block of a tensor is partial: ceil), so apply this per parameter
    tensor and sum. bitsandbytes also keeps tensors of fewer than 4,096 values (`min_8bit_size`,
    e.g. norm gains) in 32-bit state; that choice is the caller's. Used in: §sec-memory-onepager.
    """
    n = checks.nonnegative_int(n_params, "n_params")
    states = checks.positive_int(n_states, "n_states")
    width = checks.positive_int(bits, "bits")
    block = checks.positive_int(block_size, "block_size")
    scale = checks.nonnegative_int(scale_bytes, "scale_bytes")
    values = -(-n * width // 8)  # packed: ceil(n * bits / 8) bytes
    scales = -(-n // block) * scale
    return states * (values + scales)
