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


# --- the other shapes of `TransformerConfig`: GQA / MQA, GeLU and ReLU MLPs, LayerNorm, biases,
# learned positions, tied embeddings (each against a reference) ---------------------------------

SMALL = dict(vocab_size=37, context_length=23, d_model=40, n_layers=2, n_heads=10, d_ff=44)
"""Irregular sizes (d_head 4, d_ff not a multiple of d_model) for the references below."""
GPT = dict(norm="layernorm", positions="learned", bias=True, tie_embeddings=True, mlp="gelu")
"""GPT-2's shape: LayerNorm, learned positions, biases, a tied head, a GeLU MLP."""
KINDS = {
    "gqa": dict(n_kv_heads=5), "mqa": dict(n_kv_heads=1), "gelu": dict(mlp="gelu"),
    "relu": dict(mlp="relu"), "layernorm": dict(norm="layernorm"), "bias": dict(bias=True),
    "learned": dict(positions="learned"), "tied": dict(tie_embeddings=True), "gpt": GPT,
    "llama_gqa": dict(n_kv_heads=2), "gpt_mqa": {**GPT, "n_kv_heads": 1},
}
"""Each new field alone, then together."""


def small(seed: int = SEED, dtype: torch.dtype = torch.float64, **fields) -> Transformer:
    model = Transformer(TransformerConfig(**{**SMALL, **fields}))
    model.init_weights(seed=seed)
    return model.to(dtype)


def _perturb_(model: Transformer, seed: int = 1) -> None:
    """Zero-initialised biases and unit gains would hide a bias or a gain that is never read."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("kv_heads", [5, 2, 1])
@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash_torch"])
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_query_attention_is_mha_with_each_kv_head_repeated(kv_heads, attention, bias):
    """The reference: multi-head attention whose k and v weights (and biases) are the GQA ones
    repeated for the n_heads / kv_heads query heads of each group. Same logits in fp64."""
    gqa = small(n_kv_heads=kv_heads, attention=attention, bias=bias)
    _perturb_(gqa)
    mha = small(attention=attention, bias=bias)
    group, d_head = SMALL["n_heads"] // kv_heads, SMALL["d_model"] // SMALL["n_heads"]
    state = {}
    for name, tensor in gqa.state_dict().items():
        if any(f"attn.{p}_proj" in name for p in "kv"):  # rows (kv_heads d_head, ...) -> heads
            per_head = tensor.unflatten(0, (kv_heads, d_head))
            tensor = per_head.repeat_interleave(group, dim=0).flatten(0, 1)
        state[name] = tensor
    mha.load_state_dict(state)
    assert gqa.blocks[0].attn.k_proj.weight.shape == (kv_heads * d_head, SMALL["d_model"])
    tokens = random_tokens(gqa.config, batch=3, seq=19)
    torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-12, atol=1e-12)


def test_repeat_kv_gives_query_head_j_the_kv_head_j_over_group():
    x = _randn(2, 3, 5, 4)
    y = tm.repeat_kv(x, 4)
    assert y.shape == (2, 12, 5, 4)
    for j in range(12):
        assert torch.equal(y[:, j], x[:, j // 4])
    assert tm.repeat_kv(x, 1) is x


def _gelu_tanh(x: Tensor) -> Tensor:
    """Hendrycks & Gimpel (2016), §2, the tanh approximation, written out."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(("activation", "formula"), [
    ("gelu", _gelu_tanh), ("relu", lambda h: torch.where(h > 0, h, torch.zeros_like(h)))])
@pytest.mark.parametrize("bias", [False, True])
def test_mlp_equals_its_formula_forward_and_backward(activation, formula, bias):
    mlp = tm.MLP(12, 20, activation, bias=bias).double()
    _perturb_(mlp)
    x = torch.randn(3, 5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2),
                    requires_grad=True)
    y = mlp(x)
    h = x @ mlp.w1.weight.T + (mlp.w1.bias if bias else 0)
    reference = formula(h) @ mlp.w2.weight.T + (mlp.w2.bias if bias else 0)
    torch.testing.assert_close(y, reference, rtol=1e-14, atol=1e-14)
    upstream = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    params = [x, *mlp.parameters()]
    got = torch.autograd.grad(y, params, upstream)
    want = torch.autograd.grad(reference, params, upstream)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(lambda t: mlp(t), (x,))  # backward against finite differences


def test_gelu_is_the_tanh_form_gpt2_uses_within_5e_4_of_the_exact_one():
    x = torch.linspace(-8, 8, 16_001, dtype=torch.float64)
    assert tm.GELU_APPROXIMATION == "tanh"
    torch.testing.assert_close(F.gelu(x, approximate=tm.GELU_APPROXIMATION), _gelu_tanh(x),
                               rtol=1e-15, atol=1e-15)
    gap = (F.gelu(x) - _gelu_tanh(x)).abs()  # the exact x Phi(x), erf
    assert 4e-4 < gap.max() < 5e-4


def test_layernorm_and_biases_are_torch_own():
    model = small(**GPT)
    block = model.blocks[0]
    assert isinstance(block.attn_norm, torch.nn.LayerNorm) and block.attn_norm.bias is not None
    assert isinstance(model.final_norm, torch.nn.LayerNorm)
    linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 6 and all(m.bias is not None and not m.bias.any() for m in linears)
    assert model.lm_head.bias is None  # GPT-2's head has none
    assert torch.equal(block.attn_norm.weight, torch.ones(SMALL["d_model"], dtype=torch.float64))


def test_learned_positions_are_added_to_the_token_embedding():
    model = small(positions="learned")
    emb = model.token_embedding
    assert emb.position.shape == (SMALL["context_length"], SMALL["d_model"])
    tokens = random_tokens(model.config, batch=2, seq=9)
    torch.testing.assert_close(emb(tokens), emb.weight[tokens] + emb.position[:9], rtol=0, atol=0)
    # no RoPE: the attention alone cannot tell positions apart, the table does
    assert not model.blocks[0].attn.rotary
    same = torch.full((1, 6), 3)
    logits = model(same)
    assert (logits[0, 1:] - logits[0, :1]).abs().amax() > 1e-6
    with torch.no_grad():
        emb.position.zero_()
    flat = model(same)  # every position now sees the same token history: the same logits
    torch.testing.assert_close(flat[0, 1:], flat[0, :1].expand(5, -1), rtol=1e-12, atol=1e-12)


def test_tied_head_is_the_embedding_also_after_meta_and_to_empty():
    cfg = TransformerConfig(**SMALL, tie_embeddings=True)
    with torch.device("meta"):
        lazy = Transformer(cfg)
    lazy.to_empty(device="cpu")  # gives the head a storage of its own ...
    lazy.init_weights(seed=3)  # ... and init_weights ties it again
    assert lazy.lm_head.weight is lazy.token_embedding.weight
    eager = small(seed=3, dtype=torch.float32, tie_embeddings=True)
    for (name, a), (_, b) in zip(lazy.state_dict().items(), eager.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    logits = eager(random_tokens(cfg, batch=2, seq=7))
    logits.sum().backward()
    assert eager.token_embedding.weight.grad is eager.lm_head.weight.grad  # one gradient, both uses
    names = [n for n, _ in eager.named_parameters()]
    assert "lm_head.weight" not in names and "token_embedding.weight" in names


@pytest.mark.parametrize("kind", list(KINDS))
def test_num_params_is_the_accounting_for_every_kind(kind):
    """`num_params()` is `param_counts(cfg).total` (mlsys.accounting.params): it must equal what
    the module really holds, each shared Parameter once."""
    model = small(**KINDS[kind])
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    tables = model.token_embedding.weight.numel() + sum(
        p.numel() for n, p in model.named_parameters() if n in ("token_embedding.position",
                                                                "lm_head.weight"))
    assert model.num_params(non_embedding=True) == model.num_params() - tables


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_builds_on_meta_and_is_causal(kind):
    with torch.device("meta"):
        lazy = Transformer(TransformerConfig(**SMALL, **KINDS[kind]))
        assert lazy(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, SMALL["vocab_size"])
    model = small(**KINDS[kind])
    _perturb_(model)
    tokens = random_tokens(model.config, batch=2, seq=17)
    changed = tokens.clone()
    changed[:, 9] = (tokens[:, 9] + 1) % SMALL["vocab_size"]
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :9], after[:, :9], rtol=0, atol=1e-12)
    assert (before[:, 9:] - after[:, 9:]).abs().amax(dim=-1).min() > 1e-8


@pytest.mark.parametrize("fields", [GPT, dict(n_kv_heads=2)], ids=["gpt", "llama_gqa"])
def test_gpt_and_llama_shaped_tiny_models_train(fields):
    """Loss on one fixed batch falls from ~ln(vocab) far below it in 40 AdamW steps."""
    model = small(dtype=torch.float32, **fields)
    tokens = random_tokens(model.config, batch=4, seq=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(SMALL["vocab_size"]), abs=0.15)
    assert losses[-1] < 0.25 * losses[0], losses


def test_experts_are_refused_before_anything_is_allocated(monkeypatch):
    moe = TransformerConfig(**SMALL, n_experts=8, experts_per_token=2)

    def allocates(*args, **kwargs):
        raise AssertionError("a module was allocated before the refusal")

    for cls in (torch.nn.Embedding, torch.nn.Linear):
        monkeypatch.setattr(cls, "__init__", allocates)
    for build_it in (Transformer, tm.Block):
        with pytest.raises(ValueError, match="experts are costed by the planner, not built"):
            build_it(moe)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: tm.MLP(8, 16, "swish"), ValueError, "activation='swish' is not one of"),
        (lambda: tm.MLP(8, 0), ValueError, "d_ff must be a positive integer"),
        (lambda: tm.MLP(8, 16)(torch.ones(2, 3, 16)), ValueError, "MLP needs a last dim of 8"),
        (lambda: tm.repeat_kv(torch.ones(1, 2, 3, 4), 0), ValueError, "group must be a positive"),
        (lambda: tm.TokenPositionEmbedding(10, 8, 0), ValueError, "context_length must be"),
        (lambda: tm.TokenPositionEmbedding(10, 8, 4)(torch.zeros(1, 5, dtype=torch.long)),
         ValueError, r"seq \(5\) exceeds context_length \(4\)"),
    ],
)
def test_new_modules_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_jaxtyping_annotations_hold_for_the_gpt_shape(monkeypatch):
    monkeypatch.setattr(tm, "repeat_kv", checked(tm.repeat_kv))
    for cls in (tm.MLP, tm.TokenPositionEmbedding, tm.CausalSelfAttention, tm.Block):
        monkeypatch.setattr(cls, "forward", checked(cls.forward))
    model = small(**GPT, n_kv_heads=5)
    assert model(random_tokens(model.config, batch=2, seq=7)).shape == (2, 7, SMALL["vocab_size"])
