"""Tensor and model-state byte accounting (`mlsys.accounting.memory`)."""

import math

import numpy as np
import pytest

from mlsys import hardware
from mlsys.accounting.memory import (
    BLOCKWISE_BLOCK_SIZE,
    RECIPES,
    TrainingRecipe,
    blockwise_state_bytes,
    max_trainable_params,
    model_state_breakdown,
    model_state_bytes,
    recipe,
    tensor_bytes,
)

EXPECTED_BYTES_PER_PARAM = {
    "fp32_adamw": 16,
    "bf16_mixed_adamw": 16,
    "bf16_mixed_adamw_fp32_grads": 18,
    "bf16_pure_adamw": 8,
    "fp32_sgd": 8,
    "fp32_sgd_momentum": 12,
}


@pytest.mark.parametrize("name", list(EXPECTED_BYTES_PER_PARAM))
def test_recipe_totals(name):
    r = recipe(name)
    assert r.name == name
    assert r.bytes_per_param == EXPECTED_BYTES_PER_PARAM[name]
    assert sum(r.breakdown().values()) == r.bytes_per_param


def test_registry_is_exactly_the_documented_recipes():
    assert set(RECIPES) == set(EXPECTED_BYTES_PER_PARAM)


def test_mixed_precision_is_zeros_2_plus_2_plus_12():
    parts = recipe("bf16_mixed_adamw").breakdown()
    assert (parts["weights"], parts["grads"], parts["master"] + parts["optimizer"]) == (2, 2, 12)


def test_model_state_bytes_and_breakdown():
    n = 1_234_567
    for name, per_param in EXPECTED_BYTES_PER_PARAM.items():
        assert model_state_bytes(n, name) == n * per_param
        parts = model_state_breakdown(n, name)
        assert list(parts) == ["weights", "grads", "master", "optimizer"]
        assert sum(parts.values()) == model_state_bytes(n, recipe(name))
    assert model_state_bytes(0, "fp32_adamw") == 0
    assert model_state_bytes(np.int64(10), "fp32_adamw") == 160


def test_custom_recipe_object():
    adafactor_like = TrainingRecipe("tiny", "fp32 weights, grads, 1 byte of state", 4, 4, 0, 1)
    assert model_state_bytes(100, adafactor_like) == 900
    with pytest.raises(ValueError, match="optimizer_bytes of recipe 'bad' must be an integer >= 0"):
        TrainingRecipe("bad", "negative", 4, 4, 0, -1)


def test_max_trainable_params_on_eight_h100s():
    hbm_bytes = hardware.H100_SXM.hbm_bytes
    n = max_trainable_params(8, hbm_bytes, "fp32_adamw")
    assert isinstance(n, int)
    assert n == math.floor(8 * hbm_bytes / 16)
    assert n == pytest.approx(40e9, rel=0.1)  # "8 x 80 GB / 16 B per parameter = 40B parameters"
    # The bound is tight: one more parameter's states would not fit.
    fits, too_many = model_state_bytes(n, "fp32_adamw"), model_state_bytes(n + 1, "fp32_adamw")
    assert fits <= 8 * hbm_bytes < too_many


def test_max_trainable_params_scales_with_devices_and_recipe():
    mem = 10_000
    assert max_trainable_params(1, mem, "bf16_pure_adamw") == 1_250
    assert max_trainable_params(3, mem, "bf16_mixed_adamw_fp32_grads") == 30_000 // 18
    assert max_trainable_params(2, 100.5, "fp32_sgd_momentum") == math.floor(201 / 12)
    assert max_trainable_params(3, 10**20 + 1, "fp32_adamw") == 3 * (10**20 + 1) // 16  # exact


def test_tensor_bytes():
    assert tensor_bytes((1024, 1024), "bf16") == 2 * 2**20
    assert tensor_bytes([3, 5, 7], "fp32") == 3 * 5 * 7 * 4
    assert tensor_bytes((), "fp64") == 8  # a scalar
    assert tensor_bytes((0, 128), "fp32") == 0


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: recipe("adam"), ValueError, "recipe='adam' is not one of 'fp32_adamw'"),
        (lambda: recipe(None), TypeError, "recipe must be a name"),
        (lambda: recipe(["fp32_adamw"]), TypeError, "recipe must be a name"),
        (lambda: TrainingRecipe("x", "d", True, 4, 0, 8), TypeError, "weight_bytes of recipe 'x'"),
        (lambda: TrainingRecipe("x", "d", 4, 4.0, 0, 8), TypeError, "grad_bytes of recipe 'x'"),
        (lambda: TrainingRecipe("x", "d", 4, 4, -4, 8), ValueError, "master_bytes of recipe 'x'"),
        (lambda: TrainingRecipe("", "d", 4, 4, 0, 8), TypeError, "name must be a non-empty string"),
        (lambda: tensor_bytes((4, 4), "fp12"), ValueError, "fp12"),
        (lambda: tensor_bytes((4, 4), None), TypeError, "dtype must be a name"),
        (lambda: tensor_bytes((4, -1), "fp32"), ValueError, r"shape\[1\]"),
        (lambda: tensor_bytes((4, 2.5), "fp32"), TypeError, r"shape\[1\]"),
        (lambda: tensor_bytes((True, 2), "fp32"), TypeError, r"shape\[0\] must be an integer"),
        (lambda: tensor_bytes(1024, "fp32"), TypeError, "shape"),
        (lambda: tensor_bytes("1024", "fp32"), TypeError, "shape must be a sequence"),
        (lambda: model_state_bytes(-1, "fp32_adamw"), ValueError, "n_params"),
        (lambda: model_state_bytes(1.5e9, "fp32_adamw"), TypeError, "n_params"),
        (lambda: model_state_bytes(True, "fp32_adamw"), TypeError, "n_params must be an integer"),
        (lambda: model_state_bytes(10, 16), TypeError, "recipe must be a name"),
        (lambda: model_state_breakdown(10, "sgd"), ValueError, "recipe='sgd' is not one of"),
        (lambda: model_state_breakdown(None, "fp32_adamw"), TypeError, "n_params must be an"),
        (lambda: max_trainable_params(0, 1e9, "fp32_adamw"), ValueError, "n_devices"),
        (lambda: max_trainable_params(True, 1e9, "fp32_adamw"), TypeError, "n_devices must be an"),
        (lambda: max_trainable_params(8, 0, "fp32_adamw"), ValueError, "device_memory_bytes"),
        (lambda: max_trainable_params(8, -1.0, "fp32_adamw"), ValueError, "device_memory_bytes"),
        (lambda: max_trainable_params(8, "80GB", "fp32_adamw"), TypeError, "device_memory_bytes"),
        (lambda: max_trainable_params(8, NAN, "fp32_adamw"), ValueError, "device_memory_bytes mus"),
        (lambda: max_trainable_params(8, INF, "fp32_adamw"), ValueError, "must be finite"),
        (lambda: max_trainable_params(8, 1e9, "adam"), ValueError, "recipe='adam'"),
        (lambda: max_trainable_params(8, 1e9, TrainingRecipe("zero", "d", 0, 0, 0, 0)),
         ValueError, "0 bytes per parameter"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- block-wise quantized optimizer state (8-bit AdamW) ------------------------------------------


def test_blockwise_block_size_is_the_papers():
    assert BLOCKWISE_BLOCK_SIZE == 2_048  # Dettmers et al. (2022); bitsandbytes < 0.44


@pytest.mark.parametrize(
    ("n", "kwargs", "expected"),
    [
        (0, dict(n_states=2), 0),
        (1, dict(n_states=2), 2 * (1 + 4)),  # one value still needs its block's scale
        (2_048, dict(n_states=2), 2 * (2_048 + 4)),
        (2_049, dict(n_states=2), 2 * (2_049 + 2 * 4)),  # a second, partial block
        (10_000, dict(n_states=1), 10_000 + 5 * 4),  # momentum SGD: one state
        (10_000, dict(n_states=2, block_size=256), 2 * (10_000 + 40 * 4)),  # bitsandbytes >= 0.44
        (3, dict(n_states=1, bits=4), 2 + 4),  # 12 bits packed into 2 bytes
        (1_000, dict(n_states=2, scale_bytes=0), 2_000),
        (4_096, dict(n_states=2, bits=32, scale_bytes=0), 8 * 4_096),  # fp32 Adam's moments
    ],
)
def test_blockwise_state_bytes_golden(n, kwargs, expected):
    assert blockwise_state_bytes(n, **kwargs) == expected


@pytest.mark.parametrize("n", [1, 255, 2_047, 2_048, 2_049, 100_003, 3 * 2_048])
def test_blockwise_state_bytes_equals_the_tensors_of_a_real_quantization(n):
    """Quantize a tensor block by block (absmax scaling to int8, as in Dettmers et al.): the int8
    values and the fp32 scales it keeps are exactly the bytes counted, and the bitsandbytes buffer
    rule (blocks = n // 2048, plus one for a remainder) gives the same number of scales."""
    import torch

    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    blocks = -(-n // BLOCKWISE_BLOCK_SIZE)
    padded = torch.zeros(blocks * BLOCKWISE_BLOCK_SIZE).index_copy(0, torch.arange(n), x)
    absmax = padded.view(blocks, BLOCKWISE_BLOCK_SIZE).abs().amax(dim=1)  # fp32, one per block
    scaled = padded.view(blocks, -1) / absmax[:, None]
    q = torch.round(scaled * 127).to(torch.int8).flatten()[:n]  # the stored state
    per_value_scale = absmax.repeat_interleave(BLOCKWISE_BLOCK_SIZE)[:n]
    restored = q.float() / 127 * per_value_scale
    assert torch.all((restored - x).abs() <= per_value_scale / 254 * (1 + 1e-5))  # half a step
    assert absmax.dtype == torch.float32 and q.dtype == torch.int8
    assert n // 2_048 + (n % 2_048 > 0) == absmax.numel()
    one_state = q.nbytes + absmax.nbytes
    assert blockwise_state_bytes(n, n_states=1) == one_state
    assert blockwise_state_bytes(n, n_states=2) == 2 * one_state


def test_blockwise_overhead_per_parameter_tends_to_scale_over_block():
    n = 2_048 * 1_000_000  # whole blocks: exactly 2 + 2 * 4 / 2048 bytes per parameter
    assert blockwise_state_bytes(n, n_states=2) == n * 2 + 2 * 4 * (n // 2_048)
    assert blockwise_state_bytes(n, n_states=2) / n == pytest.approx(2 + 8 / 2_048, rel=1e-15)
    # against fp32 AdamW's 8 bytes of moments: just over a quarter
    assert 0.25 < blockwise_state_bytes(n, n_states=2) / (8 * n) < 0.2505


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(n_params=-1, n_states=2), ValueError, "n_params must be an integer >= 0"),
        (dict(n_params=1.5e9, n_states=2), TypeError, "n_params must be an integer"),
        (dict(n_params=10, n_states=0), ValueError, "n_states must be a positive integer"),
        (dict(n_params=10, n_states=2, bits=0), ValueError, "bits must be a positive integer"),
        (dict(n_params=10, n_states=2, bits=True), TypeError, "bits must be an integer"),
        (dict(n_params=10, n_states=2, block_size=0), ValueError, "block_size must be a positive"),
        (dict(n_params=10, n_states=2, scale_bytes=-4), ValueError, "scale_bytes must be an int"),
        (dict(n_params=10, n_states=2, scale_bytes=4.0), TypeError, "scale_bytes must be an int"),
    ],
)
def test_blockwise_state_bytes_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        blockwise_state_bytes(**kwargs)
