"""The training step of `mlsys.training`: it learns, autocasts when asked, counts state, and runs
under every precision policy holding exactly its recipe's bytes."""

import pytest
import torch

from mlsys.accounting.memory import model_state_breakdown, model_state_bytes
from mlsys.accounting.params import count_params
from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.numerics.loss_scaling import DynamicLossScaler
from mlsys.profiling import memory_meter
from mlsys.training import (
    POLICIES,
    make_policy_step,
    make_train_step,
    next_token_loss,
    policy,
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


# --- precision policies: one name, the napkin bytes and the runnable step -------------------------

TINY = TransformerConfig(vocab_size=128, context_length=32, d_model=32, n_layers=1, n_heads=2,
                         d_ff=64)
POLICY_CASES = [*POLICIES, policy("bf16_mixed_adamw", low="fp16", loss_scale="dynamic"),
                policy("fp32_adamw", autocast="bf16"),
                policy("bf16_mixed_adamw_fp32_grads", low="fp16", loss_scale="dynamic")]


def _tiny_tokens(seed=0, batch=2, seq=8):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(TINY.vocab_size, (batch, seq + 1), generator=gen)


@pytest.mark.parametrize("chosen", POLICY_CASES, ids=lambda c: policy(c).label)
def test_every_policy_holds_exactly_its_recipe_bytes_in_the_allocator(chosen):
    """The allocator (CPU profiler events) after one step holds the recipe's model states plus the
    buffers and AdamW's scalar step counters: nothing more, nothing less."""
    tokens = _tiny_tokens()
    meter = memory_meter.meter("cpu")
    with meter.recording():
        with meter.phase("build"):
            model = Transformer(TINY)
            step = make_policy_step(model, tokens, chosen, lr=1e-3)
        with meter.phase("step"):
            step()
    name = step.policy.name
    n = count_params(TINY)
    held = step.state_bytes()
    counters = held.pop("step counters")
    assert held == model_state_breakdown(n, name)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    live = meter.rows[-1]["live_bytes"]
    assert live == model_state_bytes(n, name) + buffers + counters
    assert counters == (4 * len(step.params) if step.policy.optimizer == "adamw" else 0)


def test_a_policy_step_learns_and_keeps_its_dtypes():
    tokens = _tiny_tokens()
    for chosen in ("bf16_mixed_adamw", "bf16_mixed_adamw_fp32_grads", "fp32_sgd_momentum"):
        torch.manual_seed(0)
        model = Transformer(TINY)
        step = make_policy_step(model, tokens, chosen, lr=1e-2)
        losses = [float(step()) for _ in range(4)]
        assert losses[-1] < losses[0], chosen
        want = torch.bfloat16 if chosen.startswith("bf16") else torch.float32
        assert all(p.dtype == want for p in model.parameters())
        assert all(m.dtype == torch.float32 for m in step.master)
        for p, m in zip(step.params, step.master, strict=False):
            assert torch.equal(p, m.to(p.dtype))  # the weights are the master copy, rounded


def test_the_master_copy_starts_from_the_unrounded_weights():
    torch.manual_seed(0)
    model = Transformer(TINY)
    before = [p.detach().clone() for p in model.parameters()]
    step = make_policy_step(model, _tiny_tokens(), "bf16_mixed_adamw")
    assert all(torch.equal(b, m) for b, m in zip(before, step.master, strict=True))
    assert any(not torch.equal(b, p.float()) for b, p in zip(before, model.parameters(),
                                                               strict=True))


def test_make_train_step_with_a_grad_scaler_skips_an_overflowing_step():
    torch.manual_seed(0)
    model = Transformer(TINY)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    before = [p.detach().clone() for p in model.parameters()]
    make_train_step(model, optimizer, _tiny_tokens(), autocast_dtype="fp16",
                    grad_scaler=scaler)()
    assert scaler.get_scale() == 2.0**39  # the fp16 backward overflowed: backed off ...
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: make_train_step(MODEL, OPTIMIZER, TOKENS, grad_scaler="yes"), TypeError,
         "grad_scaler must be a torch.amp.GradScaler"),
        (lambda: make_policy_step(MODEL, TOKENS, "fp16_adamw"), ValueError,
         "name='fp16_adamw' is not one of"),
        (lambda: make_policy_step(MODEL, TOKENS, "fp32_adamw", lr=0), ValueError,
         "lr must be > 0"),
        (lambda: make_policy_step(MODEL, TOKENS, "fp32_adamw", scaler=DynamicLossScaler()),
         ValueError, "does not scale its loss"),
        (lambda: make_policy_step(MODEL, TOKENS, policy("fp32_adamw", loss_scale="dynamic"),
                                  scaler=2.0), TypeError, "scaler must be a DynamicLossScaler"),
        (lambda: make_policy_step(MODEL, TOKENS.float(), "fp32_adamw"), TypeError,
         "tokens must be an integer"),
        (lambda: make_policy_step(MODEL, TOKENS.to("meta"), "fp32_adamw"), ValueError,
         "move them to one device first"),
    ],
)
def test_invalid_policy_steps_raise_before_anything_is_cast(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert all(p.dtype == torch.float32 for p in MODEL.parameters())
