"""The book's transformer (`mlsys.models.transformer`): forward, backward and the loss at init;
causality with every backend; RoPE; the tokens and arguments it refuses; building on the meta
device; its shape annotations checked at run time."""

import math

import pytest
import torch
import torch.nn.functional as F
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped
from model_cases import DEBUG, SEED, build, random_tokens
from torch import Tensor

from mlsys.models import attention, transformer
from mlsys.models import transformer as tm
from mlsys.models.config import ATTENTION_BACKENDS, PRESETS, TransformerConfig
from mlsys.models.transformer import Transformer, apply_rope


def checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def _randn(*shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_forward_backward_and_loss_at_init_is_near_ln_vocab():
    model = build()
    tokens = random_tokens(DEBUG, batch=4, seq=33)
    logits = model(tokens)
    assert logits.shape == (4, 33, DEBUG.vocab_size)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    # Uniform guessing costs ln(vocab) = 6.91 nats; with init std 0.02 the logits are nearly equal
    # (std ~0.02 sqrt(d_model) = 0.16), so the loss is within a tenth of a nat of it.
    assert logits.std().item() < 0.5
    assert loss.item() == pytest.approx(math.log(DEBUG.vocab_size), abs=0.1)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert model.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0  # reaches the first block


@pytest.mark.parametrize("attention", ATTENTION_BACKENDS)
def test_causality(attention):
    # the Triton kernels take fp16, bf16 and fp32 (masked keys still contribute exactly 0)
    dtype = torch.float32 if attention == "flash_triton" else torch.float64
    model = build(dtype=dtype, attention=attention)
    tokens = random_tokens(DEBUG, batch=2, seq=37)
    changed = tokens.clone()
    t = 20
    changed[:, t] = (tokens[:, t] + 1) % DEBUG.vocab_size
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :t], after[:, :t], rtol=0, atol=1e-12)
    assert (before[:, t:] - after[:, t:]).abs().amax(dim=-1).min() > 1e-6  # every later one sees it


def test_rope_scores_depend_only_on_position_difference():
    d_head, context = 16, 64
    rope = tm.RotaryEmbedding(d_head, context, theta=10_000.0).double()
    rope.reset_parameters()  # tables recomputed in float64
    cos, sin = rope(context)
    g = torch.Generator().manual_seed(SEED)
    q, k = torch.randn(2, d_head, dtype=torch.float64, generator=g)
    # The same q and k at every position: rotated[p] is q (or k) at position p.
    q_rot = apply_rope(q.expand(1, 1, context, d_head), cos, sin)[0, 0]
    k_rot = apply_rope(k.expand(1, 1, context, d_head), cos, sin)[0, 0]
    scores = q_rot @ k_rot.T  # scores[m, n] = <R_m q, R_n k>
    for offset in (0, 3, 17):
        for shift in (1, 5, 30):
            m, n = 10 + offset, 10
            shifted = scores[m + shift, n + shift]
            torch.testing.assert_close(scores[m, n], shifted, rtol=0, atol=1e-12)
    assert (scores[13, 10] - scores[27, 10]).abs() > 1e-3  # but it does depend on the difference
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm().expand(context))  # lengths are kept
    torch.testing.assert_close(q_rot[0], q)  # position 0 is not rotated


LONG = torch.long


@pytest.mark.parametrize(
    ("tokens", "error", "fragments"),
    [
        (torch.zeros(2, DEBUG.context_length + 1, dtype=LONG), ValueError, ["seq (129)", "(128)"]),
        (torch.zeros(2, 8), TypeError, ["tokens", "integer", "float32"]),
        (torch.zeros(8, dtype=LONG), ValueError, ["(batch, seq)"]),
        (torch.zeros(0, 8, dtype=LONG), ValueError, ["with batch, seq >= 1", "(0, 8)"]),
        (torch.zeros(2, 0, dtype=LONG), ValueError, ["batch, seq >= 1"]),
        ([[1, 2, 3]], TypeError, ["tokens must be an integer tensor", "list"]),
        (torch.tensor([[1, 2, 1000]]), ValueError, ["tokens", "[0, 1000)", "got 1000"]),
        (torch.tensor([[5, -1, 2]]), ValueError, ["tokens", "[0, 1000)", "got -1"]),
        (torch.tensor([[5, 2**40]]), ValueError, ["vocab_size", f"got {2**40}"]),
        (torch.tensor([[3, 2001]], dtype=torch.int32), ValueError, ["got 2001"]),
        (torch.zeros(2, 3, dtype=torch.uint8), TypeError, ["torch.int64 or int32", "uint8"]),
    ],
)
def test_forward_rejects_bad_tokens(tokens, error, fragments):
    model = build()
    with pytest.raises(error) as info:
        model(tokens)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_out_of_range_tokens_are_refused_before_the_embedding(monkeypatch):
    model = build()
    calls = []
    model.token_embedding.register_forward_pre_hook(lambda module, args: calls.append(args))
    with pytest.raises(ValueError, match="tokens must be ids in"):
        model(torch.tensor([[1, DEBUG.vocab_size]]))
    assert calls == []  # torch's own IndexError would come from inside the embedding
    model(torch.tensor([[0, DEBUG.vocab_size - 1]]))
    assert len(calls) == 1


def test_rmsnorm_rounds_once_to_the_input_dtype():
    norm = tm.RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(4, 5, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = norm(x)  # bf16 input, fp32 weight
    assert y.dtype == torch.bfloat16
    x32 = x.float()
    once = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight)
    assert torch.equal(y, once.to(torch.bfloat16))  # computed in fp32, rounded once
    assert norm(x.double()).dtype == torch.float64  # never narrower than the input


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: tm.RMSNorm(0), ValueError, "d_model must be a positive integer"),
        (lambda: tm.RMSNorm(8, eps=0.0), ValueError, "eps must be > 0"),
        (lambda: tm.RMSNorm(8, eps="1e-5"), TypeError, "eps must be a real number"),
        (lambda: tm.RMSNorm(8)(torch.ones(2, 3, 4)), ValueError, "RMSNorm needs a last dim of 8"),
        (lambda: tm.RMSNorm(8)(torch.ones(2, 8, dtype=torch.long)), TypeError,
         "x must be a floating-point tensor"),
        (lambda: tm.RotaryEmbedding(7, 16), ValueError, r"d_head \(7\) must be even"),
        (lambda: tm.RotaryEmbedding(8, 0), ValueError, "context_length must be a positive"),
        (lambda: tm.RotaryEmbedding(8, 16, theta=-1.0), ValueError, "theta must be > 0"),
        (lambda: tm.RotaryEmbedding(8, 16)(17), ValueError, r"seq \(17\) exceeds context_length"),
        (lambda: tm.RotaryEmbedding(8, 16)(0), ValueError, "seq must be a positive integer"),
        (lambda: apply_rope(torch.ones(1, 2, 5, 8), torch.ones(5, 8), torch.ones(5, 8)),
         ValueError, r"cos, sin of shape \(seq, d_head // 2\) = \(5, 4\)"),
        (lambda: apply_rope(torch.ones(1, 2, 5, 7), torch.ones(5, 3), torch.ones(5, 3)),
         ValueError, "needs an even d_head"),
        (lambda: apply_rope(torch.ones(1, 2, 5, 8), [1.0], torch.ones(5, 4)), TypeError,
         "x, cos and sin must be tensors"),
        (lambda: tm.SwiGLU(0, 16), ValueError, "d_model must be a positive integer"),
        (lambda: tm.SwiGLU(8, 16)(torch.ones(2, 3, 16)), ValueError, "SwiGLU needs a last dim"),
        (lambda: tm.CausalSelfAttention(dict(PRESETS["debug"])), TypeError,
         "config must be a TransformerConfig"),
        (lambda: tm.Block(None), TypeError, "config must be a TransformerConfig, got NoneType"),
        (lambda: build().blocks[0].attn(torch.ones(2, 64), torch.ones(2, 8), torch.ones(2, 8)),
         ValueError, r"x must have shape \(batch, seq, d_model\)"),
        (lambda: build().init_weights(seed=-1), ValueError, "seed must be an integer >= 0"),
        (lambda: build().init_weights(seed=1.5), TypeError, "seed must be an integer"),
        (lambda: build().num_params(non_embedding="yes"), ValueError, "non_embedding='yes'"),
    ],
)
def test_modules_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_constructor_needs_a_config():
    with pytest.raises(TypeError, match="TransformerConfig"):
        Transformer(dict(PRESETS["debug"]))


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_on_meta_without_data(name):
    with torch.device("meta"):
        model = Transformer(TransformerConfig.preset(name, attention="sdpa"))
        logits = model(torch.zeros(2, 16, dtype=torch.long))  # shapes propagate without any compute
    assert all(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert logits.shape == (2, 16, model.config.vocab_size)
    assert "rope.cos" not in model.state_dict()  # RoPE tables are derived, not saved


def test_meta_then_materialize_matches_direct_init():
    with torch.device("meta"):
        lazy = Transformer(DEBUG)
    lazy.to_empty(device="cpu")
    lazy.init_weights(seed=7)
    eager = build(seed=7)
    pairs = zip(lazy.state_dict().items(), eager.state_dict().items(), strict=True)
    for (name, a), (_, b) in pairs:
        assert torch.equal(a, b), name
    assert torch.equal(lazy.rope.cos, eager.rope.cos)
    other = build(seed=8)
    assert not torch.equal(other.lm_head.weight, eager.lm_head.weight)  # the seed matters


def test_jaxtyping_annotations_hold_at_runtime(monkeypatch):
    checked = lambda fn: jaxtyped(typechecker=beartype)(fn)  # noqa: E731
    monkeypatch.setattr(tm, "apply_rope", checked(tm.apply_rope))
    for name in ("naive", "sdpa"):  # resolved at build time
        monkeypatch.setitem(attention.BACKENDS, name, checked(attention.BACKENDS[name]))
    for cls in (tm.RMSNorm, tm.CausalSelfAttention, tm.SwiGLU, tm.Block, tm.Transformer):
        monkeypatch.setattr(cls, "forward", checked(cls.forward))
    model = build()
    logits = model(random_tokens(DEBUG, batch=2, seq=11))  # every annotated boundary is checked
    assert logits.shape == (2, 11, DEBUG.vocab_size)
    # Rejected by the annotations themselves (TypeCheckError), before the forward's own checks run.
    with pytest.raises(TypeCheckError):
        model(torch.zeros(2, 3, 11, dtype=torch.long))  # rank 3, but Int[Tensor, "batch seq"]
    with pytest.raises(TypeCheckError):
        model(torch.zeros(2, 11))  # float tokens violate Int[...]
    with pytest.raises(TypeCheckError):
        tm.apply_rope(torch.zeros(1, 2, 5, 16), torch.zeros(5, 7), torch.zeros(5, 7))  # 8, not 7


def test_symbolic_dimensions_are_evaluated():
    rope = checked(transformer.apply_rope)  # cos and sin are annotated (seq, d_head//2)
    x = _randn(2, 3, 5, 8)
    assert rope(x, torch.ones(5, 4), torch.zeros(5, 4)).shape == x.shape
    with pytest.raises(TypeCheckError, match="parameter 'cos'"):
        rope(x, torch.ones(5, 8), torch.zeros(5, 8))  # d_head, not d_head // 2
