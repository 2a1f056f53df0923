import pytest
import torch

from mlsys.accounting.memory import model_state_breakdown
from mlsys.accounting.params import count_params
from mlsys.models.train import make_train_step, next_token_loss, state_after_one_step, training_state_bytes
from mlsys.models.transformer import Transformer, TransformerConfig


def _setup(seed=0):
    cfg = TransformerConfig()
    torch.manual_seed(seed)
    model = Transformer(cfg)
    tokens = torch.randint(cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))
    return cfg, model, tokens


def test_steps_reduce_the_loss_on_a_fixed_batch():
    cfg, model, tokens = _setup()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = make_train_step(model, optimizer, tokens)
    losses = [float(step()) for _ in range(5)]
    assert losses[-1] < losses[0]
    assert all(p.grad is None for p in model.parameters())  # zeroed with set_to_none after the update


def test_autocast_step_runs_in_bf16():
    cfg, model, tokens = _setup()
    optimizer = torch.optim.AdamW(model.parameters())
    loss = make_train_step(model, optimizer, tokens, autocast_dtype="bf16")()
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="autocast_dtype='fp8'"):
        make_train_step(model, optimizer, tokens, autocast_dtype="fp8")


def test_state_bytes_are_zero_for_gradients_before_a_step():
    cfg, model, _ = _setup()
    assert training_state_bytes(model, torch.optim.AdamW(model.parameters()))["grads"] == 0


@pytest.mark.parametrize(("dtype", "recipe"), [(torch.float32, "fp32_adamw"), (torch.bfloat16, "bf16_pure_adamw")])
def test_state_bytes_after_one_step_match_the_recipe(dtype, recipe):
    cfg = TransformerConfig()
    model, optimizer = state_after_one_step(cfg, dtype=dtype, batch=2, seq=16, seed=0, device="cpu")
    measured = training_state_bytes(model, optimizer)
    predicted = model_state_breakdown(count_params(cfg), recipe)
    for kind in ("weights", "grads", "optimizer"):
        assert measured[kind] == predicted[kind], kind
    assert measured["step counters"] == 4 * len(list(model.parameters()))  # one fp32 scalar per tensor


def test_loss_needs_a_next_token():
    _, model, tokens = _setup()
    with pytest.raises(ValueError, match="seq \\+ 1"):
        next_token_loss(model, tokens[:, :1])
