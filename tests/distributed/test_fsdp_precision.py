"""mlsys.distributed.fsdp_precision: a chapter-07 precision policy gives FSDP its dtypes (gathered
weights, reduced gradients, shards) and FSDP2 its MixedPrecisionPolicy, for every policy."""

import pytest
import torch
from fsdp_cases import DTYPES

from mlsys.distributed.fsdp_precision import mixed_precision_policy, policy_dtypes
from mlsys.policies import POLICIES, policy


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_dtypes_and_mixed_precision_policy_follow_the_policy(name):
    chosen = POLICIES[name]
    gather, reduce, shard = policy_dtypes(name)
    assert (gather, reduce, shard) == (DTYPES[chosen.param_dtype], DTYPES[chosen.grad_dtype],
                                       DTYPES[chosen.master_dtype or chosen.param_dtype])
    mp = mixed_precision_policy(chosen)
    assert (mp.param_dtype, mp.reduce_dtype, mp.output_dtype, mp.cast_forward_inputs) == (
        gather, reduce, None, True)


def test_policy_mapping_in_words():
    assert policy_dtypes("bf16_mixed_adamw") == (torch.bfloat16, torch.bfloat16,
                                                      torch.float32)
    assert policy_dtypes("bf16_mixed_adamw_fp32_grads")[1] == torch.float32
    assert policy_dtypes(policy("bf16_mixed_adamw", low="fp16"))[0] == torch.float16
    # autocast: weights gathered in fp32, the matmuls' bf16 is the caller's torch.autocast
    assert policy_dtypes(policy("fp32_adamw", autocast="bf16")) == (torch.float32,) * 3
    assert mixed_precision_policy(None).param_dtype is None
