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

The model builds on the meta device without allocating (`with torch.device("meta"):
Transformer(cfg)`); after `model.to_empty(device=...)`, call `model.init_weights(seed=...)` to
fill weights and RoPE tables. Parameter counts come from `mlsys.accounting.params`, the one
formula the tests check against this module.

Used in: §sec-tensors-memory (chapter 02) and the attention, precision and parallelism chapters.
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
    "apply_rope", "CausalSelfAttention", "SwiGLU", "Block", "Transformer",
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


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE; 4 d_model^2 parameters (q, k, v, o; no bias)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = _config(config).d_model
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.backend = config.attention  # recorded: the implementation that actually runs
        self.attend = attention_backend(config.attention)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cos: Float[Tensor, "seq half"],
        sin: Float[Tensor, "seq half"],
    ) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.q_proj.in_features, "CausalSelfAttention")
        if x.ndim != 3:
            raise ValueError(f"x must have shape (batch, seq, d_model), got {tuple(x.shape)}")
        q = split_heads(self.q_proj(x), self.n_heads)  # (batch, heads, seq, d_head)
        k = split_heads(self.k_proj(x), self.n_heads)
        v = split_heads(self.v_proj(x), self.n_heads)
        y = self.attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)  # q's shape
        return self.o_proj(merge_heads(y))  # concatenate the heads: (batch, seq, d_model)


class SwiGLU(nn.Module):
    """Feed-forward w2(silu(w1 x) * w3 x); 3 d_model d_ff parameters."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        checks.positive_ints(d_model=d_model, d_ff=d_ff)
        self.w1 = nn.Linear(d_model, d_ff, bias=False)  # gate
        self.w3 = nn.Linear(d_model, d_ff, bias=False)  # value
        self.w2 = nn.Linear(d_ff, d_model, bias=False)  # back to the residual stream

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        _check_width(x, "x", self.w1.in_features, "SwiGLU")
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # hidden: (batch, seq, d_ff)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.attn_norm = RMSNorm(_config(config).d_model, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cos: Float[Tensor, "seq half"],
        sin: Float[Tensor, "seq half"],
    ) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM: tokens (batch, seq) -> logits (batch, seq, vocab); see the module doc."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = _config(config)
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.rope = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module, generator: torch.Generator | None = None) -> None:
        """Normal(0, INIT_STD) for Linear and Embedding weights; gains of 1; RoPE tables rebuilt."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD, generator=generator)
        elif isinstance(module, (RMSNorm, RotaryEmbedding)):
            module.reset_parameters()

    def init_weights(self, seed: int | None = None) -> None:
        """Re-initialize every weight and buffer in place (e.g. after `to_empty` from meta).

        With `seed`, the draw is reproducible on any device (a generator on the weights' device).
        """
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

