"""The model's attention backends (`mlsys.models.attention`): the same model output and the
same training step whichever backend computes attention, and the shapes each backend checks."""

import pytest
import torch
from attention_cases import one_step_gradients
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped
from model_cases import DEBUG, build, random_tokens
from torch import Tensor

from mlsys.models import attention
from mlsys.models.config import ATTENTION_BACKENDS


def checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def _randn(*shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_naive_and_sdpa_attention_agree():
    naive = build(dtype=torch.float64, attention="naive")
    sdpa = build(dtype=torch.float64, attention="sdpa")
    assert (naive.blocks[0].attn.backend, sdpa.blocks[0].attn.backend) == ("naive", "sdpa")
    tokens = random_tokens(DEBUG, batch=3, seq=37)
    torch.testing.assert_close(naive(tokens), sdpa(tokens), rtol=1e-10, atol=1e-10)
    generator = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 2, 3, 37, 16, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(attention.naive_causal_attention(q, k, v),
                               attention.sdpa_causal_attention(q, k, v))


@pytest.fixture(scope="module")
def naive_step():
    return one_step_gradients("naive", torch.float64)


@pytest.mark.parametrize("name", ["sdpa", "flash_torch"])
def test_one_training_step_gives_the_same_gradients(name, naive_step):
    grads, params = one_step_gradients(name, torch.float64)
    for which, ref in zip((grads, params), naive_step, strict=True):
        assert which.keys() == ref.keys()
        for key in ref:
            torch.testing.assert_close(which[key], ref[key], rtol=1e-10, atol=1e-12, msg=key)
    assert set(ATTENTION_BACKENDS) == {"naive", "sdpa", "flash_torch", "flash_triton"}


def test_attention_checks_that_q_k_v_agree():
    attend = checked(attention.naive_causal_attention)
    q, k, v = _randn(2, 3, 5, 4), _randn(2, 3, 5, 4), _randn(2, 3, 5, 4)
    assert attend(q, k, v).shape == (2, 3, 5, 4)
    with pytest.raises(TypeCheckError, match="parameter 'v'"):
        attend(q, k, _randn(2, 3, 7, 4))  # seq 7 against 5
    with pytest.raises(TypeCheckError, match="parameter 'k'"):
        attend(q, _randn(1, 3, 5, 4), v)  # batch 1 against 2
