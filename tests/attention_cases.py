"""What the tests of attention share (tests/ops/test_flash_attention.py, the PyTorch
FlashAttention-2; tests/kernels/test_flash_attention.py, the Triton kernels;
tests/models/test_attention.py, the model's backends): seeded random cases of irregular shapes,
each checked against the float64 reference, and one training step of a tiny model.
"""

import random

import torch

from mlsys.kernels._triton import ATTENTION_TOLERANCES
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.ops.attention import attention
from mlsys.training import next_token_loss

LENGTHS = (1, 2, 3, 5, 7, 11, 13, 16, 17, 23, 29, 31, 32, 33, 37, 40)
"""Sequence lengths drawn: 1, primes, and around the tile sizes (never only multiples of them)."""


OFFSETS = (-17, -16, -15, -1, 1, 15, 16, 17)
"""n_k - n_q drawn: the causal diagonal just before, on and after a tile boundary."""


def random_cases(seed, count, *, head_dims, dtypes, blocks, heads=(None, 1, 2, 3)):
    """`count` seeded random cases: shapes (3-D or 4-D); n_k = n_q, any length, or n_q + an
    offset of `OFFSETS`, a third of the time each; causal or not, a dtype, tile sizes, contiguous
    or strided inputs (as `split_heads` makes them)."""
    rng = random.Random(seed)
    for i in range(count):
        n_q = rng.choice(LENGTHS)
        n_k = rng.choice((n_q, rng.choice(LENGTHS), max(1, n_q + rng.choice(OFFSETS))))
        yield dict(
            batch=rng.choice((1, 2)), heads=rng.choice(heads), n_q=n_q, n_k=n_k,
            d=rng.choice(head_dims), causal=rng.random() < 0.6, dtype=rng.choice(dtypes),
            blocks=(rng.choice(blocks), rng.choice(blocks)), strided=rng.random() < 0.3,
            seed=seed * 1000 + i)


def make_qkv(case):
    """q (batch, [heads,] n_q, d), k and v (batch, [heads,] n_k, d), requiring grad; strided
    cases are (batch, seq, heads, d) buffers seen through a transpose."""
    gen = torch.Generator().manual_seed(case["seed"])
    batch, heads, d = case["batch"], case["heads"], case["d"]
    out = []
    for n in (case["n_q"], case["n_k"], case["n_k"]):
        if case["strided"]:
            shape = (batch, n, heads, d) if heads else (n, batch, d)
            x = torch.randn(shape, generator=gen).to(case["dtype"])
            x = x.transpose(1, 2) if heads else x.transpose(0, 1)
        else:
            shape = (batch, heads, n, d) if heads else (batch, n, d)
            x = torch.randn(shape, generator=gen).to(case["dtype"])
        out.append(x.requires_grad_())
    return out


def check_case(apply, case):
    """apply(q, k, v, case) -> O of an autograd Function saving (q, k, v, O, L): O, L and the
    gradients against the float64 reference, at `ATTENTION_TOLERANCES` of the case's dtype."""
    q, k, v = make_qkv(case)
    out = apply(q, k, v, case)
    saved = out.grad_fn.saved_tensors  # the Function's ctx: exactly (q, k, v, O, L)
    assert len(saved) == 5, case
    assert [t.shape for t in saved] == [q.shape, k.shape, v.shape, out.shape, q.shape[:-1]]
    lse = saved[4]
    wide = torch.float64 if case["dtype"] == torch.float64 else torch.float32
    assert out.dtype == q.dtype and lse.dtype == wide, case
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case["seed"] + 1))
    grad_out = grad_out.to(out.dtype)  # rounded to the inputs' dtype, then the same for both
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to(out.device))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out64, lse64 = attention(q64, k64, v64, is_causal=case["causal"], return_lse=True)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), grad_out.double())
    tol = ATTENTION_TOLERANCES[case["dtype"]]
    close = torch.testing.assert_close
    close(out.double().cpu(), out64, **tol["forward"], msg=lambda m: f"O {case} {m}")
    close(lse.double().cpu(), lse64, **tol["forward"], msg=lambda m: f"L {case} {m}")
    for name, g, g64 in zip(("dq", "dk", "dv"), grads, grads64, strict=True):
        assert g.shape == g64.shape and g.dtype == q.dtype
        close(g.double(), g64, **tol["grad"], msg=lambda m, name=name: f"{name} {case} {m}")


def one_step_gradients(attention_name, dtype, *, seed=0):
    """Gradients of the next-token loss and the parameters after one SGD step, tiny model."""
    cfg = TransformerConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=2,
                            d_ff=48, attention=attention_name)
    model = Transformer(cfg)
    model.init_weights(seed=seed)
    model = model.to(dtype)
    tokens = torch.randint(cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    next_token_loss(model, tokens).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}
