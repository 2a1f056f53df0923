"""The book's decoder-only language model, in one readable file.

A pre-norm transformer as in Stanford CS336 (2025) and the Llama family:

    tokens -> token embedding (no positional embedding; positions enter through RoPE)
           -> n_layers x Block:  x = x + attn(RMSNorm(x));  x = x + SwiGLU(RMSNorm(x))
           -> final RMSNorm -> lm_head (untied, d_model -> vocab) -> logits

No linear layer has a bias. Attention has separate q, k, v, o projections (each d_model x d_model),
rotary position embeddings (Su et al., 2021, "RoFormer") on q and k, and a causal mask. The
feed-forward is SwiGLU (Shazeer, 2020, "GLU Variants Improve Transformer"): w2(silu(w1 x) * w3 x).
RMSNorm is Zhang & Sennrich (2019). The attention backend is an explicit config field:
"naive" writes softmax(QK^T / sqrt(d_head) + mask) V out; "sdpa" calls PyTorch's fused
`scaled_dot_product_attention`; "flash_torch" is FlashAttention-2 tiled in PyTorch and
"flash_triton" its Triton kernels, which run only where Triton does (a CUDA GPU, or the CPU under
the interpreter) and raise a clear error elsewhere (`mlsys.models.config.ATTENTION_BACKENDS`).

The config's other fields build the other shapes real models have (the defaults are the above):
`n_kv_heads` grouped-query attention (Ainslie et al., 2023; 1 = multi-query, Shazeer, 2019): k and
v project to kv_heads x d_head, and each key/value head is repeated for the n_heads / kv_heads
query heads it serves before the backend, so every backend runs unchanged; `mlp` "gelu" or "relu"
for w2(act(w1 x)) (GPT-2, OPT); `norm` "layernorm" for `nn.LayerNorm` with its bias; `positions`
"learned" for GPT's context_length x d_model table added to the token embedding (the RoPE tables
stay, unused, so the model's pieces are called alike for every config); `tie_embeddings` for a head
whose weight is the embedding; `bias` for a bias on every linear but the head (GPT-2). A mixture
of experts (`n_experts > 0`) is costed by `mlsys.accounting`, not built: a ValueError.

The model builds on the meta device without allocating (`with torch.device("meta"):
Transformer(cfg)`); after `model.to_empty(device=...)`, call `model.init_weights(seed=...)` to
fill weights and RoPE tables (and tie the head to the embedding again: `to_empty` unties it).
Parameter counts come from `mlsys.accounting.params`, the one formula the tests check against
this module.

One module though over 300 lines: the whole model reads top to bottom in one file (as CS336's
and nanoGPT's do), and its pieces are only ever used together.

Used in: §sec-tensors-memory (chapter 02), the attention, precision and parallelism chapters, and
chapter 10's `python -m mlsys.train`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from mlsys import checks
from mlsys.accounting.params import count_params, param_counts
from mlsys.models.attention import backend as attention_backend
from mlsys.models.config import ATTENTION_BACKENDS, PRESETS, TransformerConfig
from mlsys.tensors import merge_heads, split_heads

__all__ = [
    "ATTENTION_BACKENDS", "PRESETS", "TransformerConfig", "RMSNorm", "RotaryEmbedding",
    "apply_rope", "repeat_kv", "CausalSelfAttention", "SwiGLU", "MLP", "Block",
    "GELU_APPROXIMATION", "TokenPositionEmbedding", "Transformer",
]  # fmt: skip

INIT_STD = 0.02  # std of the normal init of every Linear and Embedding weight (GPT-2's choice)


def _check_width(x: object, name: str, width: int, module: str) -> None:
    """`x` must be a floating-point tensor whose last dim is `width` (the module's d_model)."""
    if not isinstance(x, Tensor) or not torch.is_floating_point(x):
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point tensor, got {what}")
    if x.ndim == 0 or x.shape[-1] != width:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; {module} needs a last dim of {width}")


def _config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    return config


def _dense(config: TransformerConfig) -> TransformerConfig:
    """`config`, refused before anything is allocated when it is a mixture of experts."""
    if _config(config).n_experts > 0:
        raise ValueError(f"n_experts = {config.n_experts}: experts are costed by the planner, "
                         "not built (mlsys.accounting); the runnable model is dense "
                         "(n_experts = 0)")
    return config


def _norm(config: TransformerConfig) -> nn.Module:
    """The config's norm over d_model: RMSNorm (a gain) or `nn.LayerNorm` (a gain and a bias)."""
    if config.norm == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.norm_eps)
    return RMSNorm(config.d_model, config.norm_eps)


def check_tokens(tokens: object, config: TransformerConfig, *, ids: bool = True) -> None:
    """Type, shape and length of a batch of tokens and, with `ids`, that every id is in
    [0, vocab_size), before anything runs. Reading the ids costs a device sync on a GPU."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        what = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise TypeError(f"tokens must be an integer tensor (torch.int64 or int32), got {what}")
    if tokens.ndim != 2 or 0 in tokens.shape:
        raise ValueError(f"tokens must have shape (batch, seq) with batch, seq >= 1, "
                         f"got {tuple(tokens.shape)}")
    seq, vocab = tokens.shape[1], config.vocab_size
    if seq > config.context_length:
        raise ValueError(f"seq ({seq}) exceeds context_length ({config.context_length})")
    if ids and tokens.device.type != "meta":
        low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one device sync
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"tokens must be ids in [0, vocab_size) = [0, {vocab}), got {bad}")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain, computed in at least fp32 (x and the gain promoted) and
    rounded once to x's dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = checks.positive(eps, "eps")
        self.weight = nn.Parameter(torch.ones(checks.positive_int(d_model, "d_model")))

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.weight.shape[0], "RMSNorm")
        x_up = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 squares lose too many bits
        rms_inv = torch.rsqrt(x_up.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (batch, seq, 1)
        return (x_up * rms_inv * self.weight).to(x.dtype)  # the gain promoted too: one rounding

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class RotaryEmbedding(nn.Module):
    """cos/sin tables of RoPE: pair i of a head at position p rotates by p * theta**(-2i/d_head).

    The tables are non-persistent buffers (not in the state dict, no parameters), shape
    (context_length, d_head // 2). They follow `.to(device)`; on the meta device they hold no data,
    and `reset_parameters()` recomputes them after `to_empty`.
    """

    def __init__(self, d_head: int, context_length: int, theta: float = 10_000.0):
        super().__init__()
        if checks.positive_int(d_head, "d_head") % 2:
            raise ValueError(f"d_head ({d_head}) must be even: RoPE rotates pairs of dimensions")
        self.d_head = d_head
        self.context_length = checks.positive_int(context_length, "context_length")
        self.theta = checks.positive(theta, "theta")
        self.register_buffer("cos", torch.empty(context_length, d_head // 2), persistent=False)
        self.register_buffer("sin", torch.empty(context_length, d_head // 2), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        device = self.cos.device
        pairs = torch.arange(0, self.d_head, 2, device=device, dtype=torch.float64)
        inv_freq = self.theta ** (-pairs / self.d_head)
        positions = torch.arange(self.context_length, device=device, dtype=torch.float64)
        angles = torch.outer(positions, inv_freq)  # (context_length, d_head // 2), float64
        with torch.no_grad():
            self.cos.copy_(angles.cos())
            self.sin.copy_(angles.sin())

    def forward(self, seq: int) -> tuple[Float[Tensor, "seq half"], Float[Tensor, "seq half"]]:
        """(cos, sin) for positions 0 .. seq-1; 1 <= seq <= context_length."""
        if checks.positive_int(seq, "seq") > self.context_length:
            raise ValueError(f"seq ({seq}) exceeds context_length ({self.context_length})")
        return self.cos[:seq], self.sin[:seq]


def apply_rope(
    x: Float[Tensor, "batch heads seq d_head"],
    cos: Float[Tensor, "seq d_head//2"],
    sin: Float[Tensor, "seq d_head//2"],
) -> Float[Tensor, "batch heads seq d_head"]:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of every head by its position's angle.

    Rotations preserve length, and q(m) . k(n) after rotation depends only on m - n (RoPE's
    point). cos and sin have shape (seq, d_head // 2), from `RotaryEmbedding`.
    """
    if not all(isinstance(t, Tensor) for t in (x, cos, sin)):
        raise TypeError("x, cos and sin must be tensors")
    half = (x.shape[-2], x.shape[-1] // 2) if x.ndim >= 2 else None
    if x.ndim < 2 or x.shape[-1] % 2 or cos.shape != half or sin.shape != half:
        raise ValueError(f"x {tuple(x.shape)} needs an even d_head and cos, sin of shape "
                         f"(seq, d_head // 2) = {half}; got {tuple(cos.shape)}, {tuple(sin.shape)}")
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (batch, heads, seq, d_head // 2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2)  # interleave the pairs back: (batch, heads, seq, d_head)


def repeat_kv(
    x: Float[Tensor, "batch kv_heads seq d_head"], group: int
) -> Float[Tensor, "batch heads seq d_head"]:
    """Each key/value head repeated for the `group` consecutive query heads it serves: head j of
    the result is head j // group of `x` (a copy, contiguous; `group` 1 returns x itself)."""
    if checks.positive_int(group, "group") == 1:
        return x
    return x.repeat_interleave(group, dim=1)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with RoPE (or none, for learned positions) and grouped-query heads:
    q and o are d_model x d_model, k and v d_model x kv_heads d_head; biases when `config.bias`.

    `n_heads` is the local number of query heads (tensor parallelism divides it); the key/value
    heads are n_heads / group, `group` = n_heads / kv_heads query heads sharing each, which no
    split of the heads changes."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = _config(config).d_model
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.group = config.n_heads // config.kv_heads  # query heads per key/value head
        self.rotary = config.positions == "rope"
        self.backend = config.attention  # recorded: the implementation that actually runs
        self.attend = attention_backend(config.attention)
        kv = config.kv_heads * config.d_head
        self.q_proj = nn.Linear(d, d, bias=config.bias)
        self.k_proj = nn.Linear(d, kv, bias=config.bias)
        self.v_proj = nn.Linear(d, kv, bias=config.bias)
        self.o_proj = nn.Linear(d, d, bias=config.bias)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cos: Float[Tensor, "seq half"],
        sin: Float[Tensor, "seq half"],
    ) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.q_proj.in_features, "CausalSelfAttention")
        if x.ndim != 3:
            raise ValueError(f"x must have shape (batch, seq, d_model), got {tuple(x.shape)}")
        kv_heads = self.n_heads // self.group
        q = split_heads(self.q_proj(x), self.n_heads)  # (batch, heads, seq, d_head)
        k = split_heads(self.k_proj(x), kv_heads)  # (batch, kv_heads, seq, d_head)
        v = split_heads(self.v_proj(x), kv_heads)
        if self.rotary:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.attend(q, repeat_kv(k, self.group), repeat_kv(v, self.group))  # q's shape
        return self.o_proj(merge_heads(y))  # concatenate the heads: (batch, seq, d_model)


class SwiGLU(nn.Module):
    """Feed-forward w2(silu(w1 x) * w3 x); 3 d_model d_ff parameters (+ 2 d_ff + d_model biases)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        checks.positive_ints(d_model=d_model, d_ff=d_ff)
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # gate
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)  # value
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)  # back to the residual stream

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.w1.in_features, "SwiGLU")
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # hidden: (batch, seq, d_ff)


GELU_APPROXIMATION = "tanh"
"""GeLU as GPT-2 computes it: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Hendrycks &
Gimpel, 2016, §2; OpenAI's GPT-2 code, GPT-3 and Megatron-LM's fused bias-GeLU use it). The
exact x Phi(x) (erf) differs from it by less than 5e-4 (4.7e-4 at x = -2.70; tested): the GPT
models were trained with the tanh form, so it is the one their weights expect."""


class MLP(nn.Module):
    """Feed-forward w2(act(w1 x)) with act GeLU (tanh form, `GELU_APPROXIMATION`) or ReLU;
    2 d_model d_ff parameters (+ d_ff + d_model biases)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = False):
        super().__init__()
        checks.positive_ints(d_model=d_model, d_ff=d_ff)
        self.activation = checks.choice(activation, "activation", ("gelu", "relu"))
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # up
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)  # back to the residual stream

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.w1.in_features, "MLP")
        h = self.w1(x)  # (batch, seq, d_ff)
        if self.activation == "gelu":
            return self.w2(F.gelu(h, approximate=GELU_APPROXIMATION))
        return self.w2(F.relu(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        config = _dense(config)
        self.attn_norm = _norm(config)
        self.attn = CausalSelfAttention(config)
        self.ffn_norm = _norm(config)
        if config.mlp == "swiglu":
            self.ffn: nn.Module = SwiGLU(config.d_model, config.d_ff, bias=config.bias)
        else:
            self.ffn = MLP(config.d_model, config.d_ff, config.mlp, bias=config.bias)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cos: Float[Tensor, "seq half"],
        sin: Float[Tensor, "seq half"],
    ) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class TokenPositionEmbedding(nn.Embedding):
    """GPT's input: a token's embedding (`weight`, vocab x d_model) plus its position's learned
    vector (`position`, context_length x d_model). One module, so that whatever calls the model's
    `token_embedding` (a pipeline's first stage) adds the positions too."""

    def __init__(self, vocab_size: int, d_model: int, context_length: int):
        super().__init__(vocab_size, d_model)
        self.position = nn.Parameter(torch.empty(checks.positive_int(
            context_length, "context_length"), d_model))
        nn.init.normal_(self.position, mean=0.0, std=INIT_STD)

    def forward(self, tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, "batch seq d_model"]:
        seq = tokens.shape[-1]
        if seq > self.position.shape[0]:
            raise ValueError(f"seq ({seq}) exceeds context_length ({self.position.shape[0]})")
        return super().forward(tokens) + self.position[:seq]  # a slice: no index tensor saved


class Transformer(nn.Module):
    """Decoder-only LM: tokens (batch, seq) -> logits (batch, seq, vocab); see the module doc."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = _dense(config)
        if config.positions == "learned":
            self.token_embedding: nn.Embedding = TokenPositionEmbedding(
                config.vocab_size, config.d_model, config.context_length)
        else:
            self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        # the RoPE tables (unused by the blocks with learned positions)
        self.rope = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = _norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tie_weights()
        self.apply(self._init_weights)

    def tie_weights(self) -> None:
        """With `tie_embeddings`, make the head's weight the embedding's (one Parameter)."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    @staticmethod
    def _init_weights(module: nn.Module, generator: torch.Generator | None = None) -> None:
        """Normal(0, INIT_STD) for Linear and Embedding weights and learned positions; biases 0;
        gains 1 (LayerNorm's bias 0); RoPE tables rebuilt."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD, generator=generator)
        if isinstance(module, TokenPositionEmbedding):
            nn.init.normal_(module.position, mean=0.0, std=INIT_STD, generator=generator)
        elif isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, (RMSNorm, RotaryEmbedding, nn.LayerNorm)):
            module.reset_parameters()

    def init_weights(self, seed: int | None = None) -> None:
        """Re-initialize every weight and buffer in place (e.g. after `to_empty` from meta).

        With `seed`, the draw is reproducible on any device (a generator on the weights' device).
        A tied head is tied again first (`to_empty` gives the head a storage of its own).
        """
        self.tie_weights()
        if seed is not None:
            checks.nonnegative_int(seed, "seed")
        device = self.lm_head.weight.device
        generator = None
        if seed is not None and device.type != "meta":
            generator = torch.Generator(device=device).manual_seed(seed)
        for module in self.modules():
            self._init_weights(module, generator)

    def forward(self, tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, "batch seq vocab"]:
        """Logits of the next token at every position.

        tokens: int64 or int32, shape (batch, seq) with batch >= 1 and 1 <= seq <= context_length,
        every id in [0, vocab_size). On the CPU the id range is checked before the embedding; on
        an accelerator reading the ids would sync the device at every forward (and stall the
        timing of every step), so there `make_train_step` checks its batch once instead, and
        `check_tokens` does it on request. The meta device holds no values to check.
        """
        on_cpu = isinstance(tokens, Tensor) and tokens.device.type == "cpu"
        check_tokens(tokens, self.config, ids=on_cpu)
        cos, sin = self.rope(tokens.shape[1])  # (seq, d_head // 2) each
        x = self.token_embedding(tokens)  # (batch, seq, d_model)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.final_norm(x))  # (batch, seq, vocab)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count from `mlsys.accounting.params` (tests check it is sum(p.numel()))."""
        checks.choice(non_embedding, "non_embedding", (True, False))
        if non_embedding:
            return param_counts(self.config).non_embedding
        return count_params(self.config)

