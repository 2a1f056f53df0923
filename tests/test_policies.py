"""Precision policies (`mlsys.policies`): one per memory recipe, holding exactly its bytes."""

import subprocess
import sys

import pytest

from mlsys.accounting.memory import RECIPES, recipe
from mlsys.policies import POLICIES, PrecisionPolicy, policy


def test_every_recipe_has_a_policy_of_the_same_name_and_bytes():
    assert list(POLICIES) == list(RECIPES)
    for name, chosen in POLICIES.items():
        assert chosen.name == name
        assert chosen.breakdown() == recipe(name).breakdown()
    mixed = POLICIES["bf16_mixed_adamw"]
    assert (mixed.param_dtype, mixed.grad_dtype, mixed.master_dtype) == ("bf16", "bf16", "fp32")
    assert mixed.update_dtype == "fp32" and not mixed.autocast
    assert sum(mixed.breakdown().values()) == 16  # ZeRO's 2 + 2 + 12


def test_variants_keep_their_recipe_bytes():
    fp16 = policy("bf16_mixed_adamw", low="fp16", loss_scale="dynamic")
    assert (fp16.param_dtype, fp16.compute_dtype, fp16.grad_dtype) == ("fp16",) * 3
    assert fp16.breakdown() == recipe("bf16_mixed_adamw").breakdown()
    assert fp16.label == "bf16_mixed_adamw (fp16) + dynamic loss scale"
    amp = policy("fp32_adamw", autocast="bf16")
    assert amp.autocast and amp.param_dtype == "fp32" and amp.compute_dtype == "bf16"
    assert amp.label == "fp32_adamw + bf16 autocast"
    grads = policy("bf16_mixed_adamw_fp32_grads", low="fp16")
    assert grads.grad_dtype == "fp32" and grads.param_dtype == "fp16"  # fp32 stays fp32
    assert policy(amp) == amp


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: policy("fp16_adamw"), ValueError, "name='fp16_adamw' is not one of"),
    (lambda: policy(3), TypeError, "name must be a policy name"),
    (lambda: policy("fp32_adamw", low="fp16"), ValueError, "holds nothing in low precision"),
    (lambda: policy("bf16_pure_adamw", autocast="fp16"), ValueError,
     "autocast runs from fp32 weights only"),
    (lambda: policy("fp32_adamw", autocast="fp8"), ValueError, "autocast='fp8'"),
    (lambda: policy("fp32_adamw", loss_scale="static"), ValueError, "loss_scale='static'"),
    (lambda: PrecisionPolicy("fp32_adamw", "bf16", "bf16", "bf16", None, "adamw"), ValueError,
     r"holds \{'weights': 2, 'grads': 2, 'master': 0, 'optimizer': 4\} bytes per parameter "
     r"\(8 in all\) but recipe 'fp32_adamw' says"),
    (lambda: PrecisionPolicy("fp32_adamw", "fp32", "fp32", "fp32", "fp32", "adamw"), ValueError,
     "would be the weights themselves"),
    (lambda: PrecisionPolicy("bf16_pure_adamw", "bf16", "bf16", "fp32", None, "adamw"),
     ValueError, "grad_dtype='fp32' must be param_dtype"),
    (lambda: PrecisionPolicy("fp32_sgd", "fp32", "fp32", "fp32", None, "lion"), ValueError,
     "optimizer='lion'"),
])
def test_invalid_policies_are_refused_with_the_rule(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_policies_are_pure_python():
    code = "import sys, mlsys.policies; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
