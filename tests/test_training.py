"""The training step of `mlsys.training`: it learns, autocasts when asked, counts state."""

import pytest
import torch

from mlsys.accounting.memory import model_state_breakdown
from mlsys.accounting.params import count_params
from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.training import (
    make_train_step,
    next_token_loss,
    state_after_one_step,
    training_state_bytes,
)


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
    losses = [step() for _ in range(5)]
    assert all(isinstance(loss, torch.Tensor) and loss.ndim == 0 for loss in losses)
    assert not losses[0].requires_grad  # detached: returning it keeps no graph alive
    assert losses[-1] < losses[0]
    assert all(p.grad is None for p in model.parameters())  # set_to_none after the update


def _matmul_output_dtypes(autocast_dtype):
    """Run one step and return the dtypes of the first q projection's outputs inside it."""
    _, model, tokens = _setup()
    optimizer = torch.optim.AdamW(model.parameters())
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    loss = make_train_step(model, optimizer, tokens, autocast_dtype=autocast_dtype)()
    assert torch.isfinite(loss) and loss.dtype == torch.float32  # the loss is computed in fp32
    return seen


def test_autocast_step_runs_its_matmuls_in_bf16():
    # fails if autocast were silently off: the projection would then return fp32
    assert _matmul_output_dtypes("bf16") == [torch.bfloat16]
    assert _matmul_output_dtypes(None) == [torch.float32]


def test_state_bytes_are_zero_for_gradients_before_a_step():
    cfg, model, _ = _setup()
    assert training_state_bytes(model, torch.optim.AdamW(model.parameters()))["grads"] == 0


@pytest.mark.parametrize(
    ("dtype", "recipe"), [(torch.float32, "fp32_adamw"), (torch.bfloat16, "bf16_pure_adamw")]
)
def test_state_bytes_after_one_step_match_the_recipe(dtype, recipe):
    cfg = TransformerConfig()
    model, optimizer = state_after_one_step(cfg, dtype=dtype, batch=2, seq=16, seed=0, device="cpu")
    measured = training_state_bytes(model, optimizer)
    predicted = model_state_breakdown(count_params(cfg), recipe)
    for kind in ("weights", "grads", "optimizer"):
        assert measured[kind] == predicted[kind], kind
    assert measured["step counters"] == 4 * len(list(model.parameters()))  # one fp32 scalar each


_, MODEL, TOKENS = _setup()
OPTIMIZER = torch.optim.AdamW(MODEL.parameters())
CFG = TransformerConfig()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: next_token_loss(MODEL, TOKENS[:, :1]), ValueError, r"seq \+ 1\) with batch, seq"),
        (lambda: next_token_loss("model", TOKENS), TypeError, "model must be a torch.nn.Module"),
        (lambda: next_token_loss(MODEL, TOKENS.float()), TypeError, "tokens must be an integer"),
        (lambda: next_token_loss(MODEL, TOKENS[0]), ValueError, r"\(batch, seq \+ 1\)"),
        (lambda: next_token_loss(MODEL, TOKENS.tolist()), TypeError, "got list"),
        (lambda: make_train_step(MODEL, OPTIMIZER, TOKENS, autocast_dtype="fp8"), ValueError,
         "autocast_dtype='fp8'"),
        (lambda: make_train_step(MODEL, OPTIMIZER, TOKENS, autocast_dtype="fp32"), ValueError,
         "autocast_dtype='fp32' is not one of None, 'bf16', 'fp16'"),
        (lambda: make_train_step(MODEL, "adamw", TOKENS), TypeError,
         "optimizer must be a torch.optim.Optimizer, got str"),
        (lambda: make_train_step(None, OPTIMIZER, TOKENS), TypeError, "model must be a torch.nn"),
        (lambda: make_train_step(MODEL, OPTIMIZER, TOKENS[:, :1]), ValueError, "seq >= 1"),
        (lambda: state_after_one_step(CFG, batch=0, seq=8, seed=0), ValueError,
         "batch must be a positive integer"),
        (lambda: state_after_one_step(CFG, batch=1, seq=8, seed=-1), ValueError,
         "seed must be an integer >= 0"),
        (lambda: state_after_one_step(CFG, batch=1, seq=8.0, seed=0), TypeError,
         "seq must be an integer"),
        (lambda: state_after_one_step(CFG, dtype=torch.int64, batch=1, seq=8, seed=0), TypeError,
         "dtype must be a floating-point torch.dtype"),
        (lambda: state_after_one_step(CFG, dtype="bf16", batch=1, seq=8, seed=0), TypeError,
         "dtype must be a floating-point torch.dtype"),
        (lambda: state_after_one_step(dict(vocab_size=10), batch=1, seq=8, seed=0), TypeError,
         "config must be a TransformerConfig"),
        (lambda: training_state_bytes(MODEL, None), TypeError, "optimizer must be a torch.optim"),
        (lambda: training_state_bytes([], OPTIMIZER), TypeError, "model must be a torch.nn.Module"),
    ],
)
def test_invalid_calls_raise_before_any_step(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_train_step_checks_its_token_ids_once():
    cfg, model, tokens = _setup()
    bad = tokens.clone()
    bad[0, -1] = cfg.vocab_size  # a target out of range: caught before any step runs
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, vocab_size\)"):
        make_train_step(model, torch.optim.AdamW(model.parameters()), bad)
